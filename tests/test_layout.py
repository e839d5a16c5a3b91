"""The package's shape: data flows one way between its stages, decode defaults live in one place, and so do the
kernel paths' names; the one DecodeParams of a reply is built at an edge (page, CLI, API) only.

Read from the source text (ast), so the checks see every import, including the lazy ones inside functions.
"""
import ast
import os
import re

import pytest

from bitnet_app.engine import kernel_paths
from bitnet_app.params import KNOBS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "bitnet_app")

# stage (a module or a subpackage of bitnet_app) -> stages it must never import
FORBIDDEN = {
    # the page draws; it calls source, model, params, catalog, decode events (the machine through catalog and model)
    "ui": {"checkpoint", "engine", "_engine", "machine"},
    "engine": {"checkpoint", "source", "model", "decode", "text", "ui", "params"},
    # checkpoint may call text's checks: a tokenizer or chat template is refused at conversion by the code that
    # uses it; a checkpoint knows no decode settings
    "checkpoint": {"source", "model", "decode", "ui", "params"},
    "text": {"checkpoint", "engine", "source", "model", "decode", "ui", "params", "catalog"},  # a leaf: text alone
    "decode": {"checkpoint", "engine", "source", "model", "text", "ui"},
    "params": {"checkpoint", "engine", "source", "model", "decode", "text", "ui", "units", "demo"},
    "source": {"model", "decode", "text", "ui"},
    "model": {"source", "ui", "checkpoint"},  # the model reads engine files, never checkpoint folders
    # what each model needs here: shapes and arithmetic, and the machine's figures through machine.py
    "catalog": {"engine", "_engine", "source", "model", "decode", "text", "ui", "bench"},
    # this computer: it reads the OS and the C engine's read roof, and nothing of the package above them
    "machine": {"checkpoint", "engine", "source", "model", "decode", "text", "ui", "params", "catalog", "units",
                "demo", "bench"},
}
# the kernels' entry points for the tests (engine_testing.pyx): no module of the package imports them
TEST_ONLY = {"_engine_testing"}

# (module, name) pairs outside decode/ and params.py that share a knob's name but are not decode knobs
NOT_KNOBS = {
    ("bench.py", "seed"),                   # the random weights of a synthetic model
    ("checkpoint/synthetic.py", "seed"),    # the same
    ("engine/file.py", "mode"),             # np.memmap's file mode
    ("checkpoint/safetensors_reader.py", "mode"),
    ("engine/runtime.py", "attention"),     # one forward's own pattern (causal unless told), not a decode knob
    ("engine/runtime.py", "block_size"),
}


def _modules():
    """(path relative to bitnet_app/, its dotted name, parsed tree) of every module, plus app.py as "ui"."""
    out = []
    for folder, _dirs, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
                dotted = "bitnet_app." + rel[:-3].replace("/", ".").removesuffix(".__init__")
                with open(path, encoding="utf-8") as f:
                    out.append((rel, dotted, ast.parse(f.read(), path)))
    with open(os.path.join(REPO, "app.py"), encoding="utf-8") as f:
        out.append(("ui/../app.py", "bitnet_app.ui.app", ast.parse(f.read())))
    return out


def _imports(dotted: str, is_package: bool, tree) -> set[str]:
    """Every bitnet_app module the tree imports, relative imports resolved."""
    here = dotted.split(".") if is_package else dotted.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (here[:len(here) - node.level + 1] if node.level else []) + (node.module or "").split(".")
            base = ".".join(p for p in base if p)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m == "bitnet_app" or m.startswith("bitnet_app.")}


def _stage(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("rel, dotted, tree", _modules(), ids=lambda v: v if isinstance(v, str) else "")
def test_data_flows_one_way(rel, dotted, tree):
    stage = _stage(dotted)
    bad = {m for m in _imports(dotted, rel.endswith("__init__.py"), tree)
           if _stage(m) in FORBIDDEN.get(stage, set()) | TEST_ONLY}
    assert not bad, f"{rel} ({stage}) imports {sorted(bad)}"


def test_the_import_check_sees_lazy_and_relative_imports():
    tree = ast.parse("def f():\n    from ..engine.file import EngineFile\n    from . import jobs\n")
    assert _imports("bitnet_app.ui.loading", False, tree) == {
        "bitnet_app.engine.file", "bitnet_app.engine.file.EngineFile", "bitnet_app.ui", "bitnet_app.ui.jobs"}


def _constant(node) -> bool:
    """A literal other than None (None means "the default, from elsewhere")."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant) and node.value is not None


def _knob_literals(tree):
    """(line, knob name) wherever a literal value is given to a name that is a decode knob: a parameter
    default, a dict entry, a keyword argument, or an assignment to the name or to DEFAULT_<NAME>."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            yield from ((node.lineno, arg.arg) for arg, d in pairs if arg.arg in KNOBS and _constant(d))
        elif isinstance(node, ast.Dict):
            yield from ((node.lineno, k.value) for k, v in zip(node.keys, node.values)
                        if isinstance(k, ast.Constant) and k.value in KNOBS and _constant(v))
        elif isinstance(node, ast.Call):
            yield from ((node.lineno, kw.arg) for kw in node.keywords if kw.arg in KNOBS and _constant(kw.value))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _constant(node.value):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                name = getattr(target, "id", None) or getattr(target, "attr", None) or ""
                knob = name.lower().removeprefix("default_")
                if knob in KNOBS and (name.lower() == knob or name.startswith("DEFAULT_")):
                    yield node.lineno, knob


def test_decode_defaults_live_in_params_and_decode_only():
    found = []
    for rel, _dotted, tree in _modules():
        if rel.startswith("decode/") or rel == "params.py":
            continue
        found += [f"{rel}:{line} {name}" for line, name in _knob_literals(tree) if (rel, name) not in NOT_KNOBS]
    assert not found, "decode defaults outside bitnet_app/params.py: " + ", ".join(found)


def test_the_default_check_finds_each_form():
    src = ("def f(threshold=0.9): pass\nx = {'top_p': 0.9}\ng(seed=0)\nDEFAULT_THRESHOLD = 0.9\n"
           "ss.temperature = 0.6\nok = {'seed': None}\n")
    assert sorted(n for _, n in _knob_literals(ast.parse(src))) == ["seed", "temperature", "threshold",
                                                                    "threshold", "top_p"]


# Where a DecodeParams may be built: the three edges (the page, the CLI, the API in model.py) and params.py itself.
# Everything below them takes the object whole (bitnet_app/params.py).
DECODE_PARAMS_EDGES = {"params.py", "model.py", "__main__.py", "ui/state.py"}


def _builds_decode_params(tree) -> list[int]:
    """Lines that construct a DecodeParams: DecodeParams(...) or one of its constructors (DecodeParams.from_kwargs)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                f = f.value
            if isinstance(f, ast.Name) and f.id == "DecodeParams":
                lines.append(node.lineno)
    return lines


def test_decode_params_are_built_only_at_the_edges():
    found = [f"{rel}:{line}" for rel, _dotted, tree in _modules() if rel not in DECODE_PARAMS_EDGES
             for line in _builds_decode_params(tree)]
    assert not found, "DecodeParams built below the page, the CLI and the API: " + ", ".join(found)


def test_the_edge_check_finds_each_form():
    src = "p = DecodeParams(mode='ar')\nq = DecodeParams.from_kwargs(**kw)\nr = p.resolve({}, vocab_size=3)\n"
    assert _builds_decode_params(ast.parse(src)) == [1, 2]


# the folders whose code the repeat check reads (tests/ repeat set-up on purpose: each test reads alone)
CODE_FOLDERS = ("bitnet_app", "_kernels", "benchmarks", "tools")
# repeats known today, by file pair: the x86 products' shared loops, which issue 44's kernel split gives one home
# The int8 head loop of the AVX2 and AVX-VNNI files: the same walk over groups and token blocks around a different
# product (maddubs/madd against vpdpbusd); one shared walk would put a function pointer or macro in the hot loop.
KNOWN_REPEATS = {("_kernels/kernels_avx2.c", "_kernels/kernels_avxvnni.c")}


def _sources(tops, endings):
    """Paths relative to the repository of the files under the folders `tops` whose names end in `endings`; a C
    file that Cython writes from the .pyx beside it is no source."""
    out = []
    for top in tops:
        for folder, _dirs, files in sorted(os.walk(os.path.join(REPO, top))):
            for name in sorted(files):
                generated = name.endswith(".c") and os.path.exists(os.path.join(folder, name[:-2] + ".pyx"))
                if name.endswith(endings) and not generated:
                    out.append(os.path.relpath(os.path.join(folder, name), REPO).replace(os.sep, "/"))
    return out


def _code_lines(path):
    """(line number, text) of the lines that carry code: no blanks, comments, docstring-only or import lines (C:
    no comment, #include or lone-bracket lines)."""
    c = path.endswith((".c", ".h"))
    skip = ("//", "/*", "*", "#include") if c else ("#", "import ", "from ")
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = " ".join(line.split())
            if c and not text.strip("{}()[];,"):
                continue
            if text and not text.startswith(skip) and text not in ('"""', "'''"):
                out.append((number, text))
    return out


def _repeats(files):
    """"first ~ again" for every block of six code lines (white space folded, at least 120 characters: six short
    lines, closing brackets and else:, say nothing) that stands in two places of `files` (repository paths)."""
    seen, repeats = {}, []
    for rel in files:
        lines = _code_lines(os.path.join(REPO, rel))
        for i in range(len(lines) - 5):
            window = tuple(t for _, t in lines[i:i + 6])
            if sum(len(t) for t in window) < 120:
                continue
            where = (rel, lines[i][0])
            first = seen.setdefault(window, where)
            if first != where and (first[0] != rel or lines[i][0] - first[1] >= 6):
                if (first[0], rel) not in KNOWN_REPEATS:
                    repeats.append(f"{first[0]}:{first[1]} ~ {rel}:{lines[i][0]}")
    return repeats


def test_no_block_of_six_lines_is_written_twice():
    """The same six code lines (white space folded) in two places of bitnet_app/, _kernels/, benchmarks/ or
    tools/ mean one piece of logic written twice: give it one home."""
    repeats = _repeats(_sources(CODE_FOLDERS, (".py", ".pyx", ".c", ".h")))
    assert not repeats, "repeated blocks: " + "; ".join(repeats)


def test_the_repeat_check_finds_a_copied_block(tmp_path, monkeypatch):
    block = "".join(f"value_{i} = compute_something_long(argument_{i}, other_argument_{i})\n" for i in range(6))
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("# a comment\n" + block)
    (tmp_path / "c.c").write_text("#include <x.h>\n{\n" + block.replace("\n", ";\n") + "}\n")
    monkeypatch.setitem(globals(), "REPO", str(tmp_path))
    assert _repeats(["a.py", "b.py"]) == ["a.py:2 ~ b.py:2"]
    assert _repeats(["c.c"]) == [] and _code_lines(str(tmp_path / "c.c"))[0] == (3, block.splitlines()[0] + ";")


def _path_names(tree):
    """(line, name) of every string literal that is a kernel path's name (exactly: prose that mentions one is fine)."""
    names = set(kernel_paths.names())
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            yield node.lineno, node.value


def _sources_outside_the_registry():
    """(path relative to the repository, parsed tree) of the Python files of the package, app.py, setup.py,
    benchmarks/, tests/ and tools/, engine/kernel_paths.py excepted."""
    registry = os.path.join(PACKAGE, "engine", "kernel_paths.py")
    paths = [os.path.join(REPO, "app.py"), os.path.join(REPO, "setup.py")]
    for top in ("bitnet_app", "benchmarks", "tests", "tools"):
        for folder, _dirs, files in os.walk(os.path.join(REPO, top)):
            paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    for path in paths:
        if path != registry:
            with open(path, encoding="utf-8") as f:
                yield os.path.relpath(path, REPO), ast.parse(f.read(), path)


def test_kernel_paths_are_named_in_the_registry_only():
    """Each kernel path's name is written once on the Python side, in bitnet_app/engine/kernel_paths.py (the C
    side names them in _kernels/dispatch.c; tests/test_kernels.py checks that the two lists agree). The CLI, the
    page, the benchmarks and the tests take the names from the registry; a literal elsewhere is a second list."""
    found = [f"{rel}:{line} {name!r}" for rel, tree in _sources_outside_the_registry()
             for line, name in _path_names(tree)]
    assert not found, "kernel path names outside bitnet_app/engine/kernel_paths.py: " + ", ".join(found)


def test_the_path_name_check_finds_literals():
    src = 'isa = "avx2"\nchoices = ("amx", "portable")\nf(isa="avx512")\ndoc = "the avx2 path"\n'
    kp = kernel_paths
    assert sorted(n for _, n in _path_names(ast.parse(src))) == sorted([kp.AMX, kp.AVX2, kp.AVX512, kp.PORTABLE])


SCRIPT_FOLDERS = ("benchmarks", "tools")


def _scripts():
    """The dotted name of every module under benchmarks/ and tools/ (found, not listed)."""
    return [rel[:-3].replace("/", ".") for rel in _sources(SCRIPT_FOLDERS, (".py",))
            if not rel.endswith("__init__.py")]


@pytest.mark.parametrize("name", _scripts())
def test_scripts_are_modules_of_the_checkout(name):
    """`python -m benchmarks.<name>` (or tools.<name>) from the repository root: importable as it stands; a
    benchmark that runs as a script does it through a main()."""
    import importlib
    import inspect

    module = importlib.import_module(name)
    if name.startswith("benchmarks.") and '__name__ == "__main__"' in inspect.getsource(module):
        assert callable(getattr(module, "main", None)), f"{name} has no main()"


def test_every_benchmark_and_tool_is_found():
    found = _scripts()
    assert "benchmarks.run_benchmarks" in found and "tools.train_demo_model" in found
    assert not [n for n in found if n.endswith("__init__")]


def _python_files():
    """Every Python file of the repository: the package, app.py, setup.py, tests/, benchmarks/, tools/."""
    return ["app.py", "setup.py"] + _sources(("bitnet_app", "tests", "benchmarks", "tools"), (".py",))


SYS_PATH_CODE = re.compile(r"sys\.path\.(insert|append|extend)\(")


def _sys_path_edits(tree) -> list[int]:
    """Lines that touch sys.path: the attribute itself, or code in a string (python -c) that does."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            lines.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SYS_PATH_CODE.search(node.value):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_module_edits_sys_path():
    """Each module imports what its place gives it: the package from the checkout (or the install), a test
    helper from tests/ (pytest puts that folder first), a script's siblings by their package name."""
    found = []
    for rel in _python_files():
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
            found += [f"{rel}:{line}" for line in _sys_path_edits(ast.parse(f.read(), rel))]
    assert not found, "sys.path edits: " + ", ".join(found)


def test_the_sys_path_check_finds_each_form():
    edit = "sys.path" + ".insert(0, 'x')"  # written in two pieces, or this file would hold one
    src = f'import sys\n{edit}\nfrom sys import path\ncode = "import sys; {edit}"\nprint(sys.argv)\n'
    assert _sys_path_edits(ast.parse(src)) == [2, 4]


def _test_modules_imported(tree) -> set[str]:
    """The test modules (test_*.py, also as tests.test_*) a tree imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom):  # from . import x
            names |= {a.name for a in node.names}
    return {n for n in names if n.split(".")[-1].startswith("test_")}


def test_no_test_module_imports_another():
    """What several tests share lives in a helper module of tests/ (support.py, checkpoints.py, ...), never in a
    test module: a test module is read, run and changed alone."""
    found = []
    for rel in _sources(("tests",), (".py",)):
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
            found += [f"{rel} imports {m}" for m in sorted(_test_modules_imported(ast.parse(f.read(), rel)))]
    assert not found, "; ".join(found)


def test_the_test_import_check_finds_each_form():
    src = ("import test_a\nfrom test_b import X\nfrom tests.test_c import Y\nfrom tests import test_d\n"
           "from support import PATHS\nimport checkpoints\n")
    assert _test_modules_imported(ast.parse(src)) == {"test_a", "test_b", "tests.test_c", "tests.test_d"}


def _import_graph() -> dict[str, set[str]]:
    """bitnet_app module -> the bitnet_app modules it imports (lazy imports too; `from pkg import name` is an edge
    to pkg.name when that is a module, else to the package)."""
    modules = {dotted: (rel, tree) for rel, dotted, tree in _modules() if not rel.endswith("app.py")}
    graph = {}
    for dotted, (rel, tree) in modules.items():
        edges = set()
        for name in _imports(dotted, rel.endswith("__init__.py"), tree):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != dotted:
                edges.add(name)
        graph[dotted] = edges
    # `from pkg import module` also names pkg: keep only the module's edge, the package's own imports count apart
    for dotted, edges in graph.items():
        graph[dotted] = {m for m in edges if not any(o.startswith(m + ".") for o in edges)}
    return graph


def _cycle(graph) -> list[str]:
    """One import cycle of the graph as [a, b, ..., a], or [] when there is none (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycle_among_the_package_modules():
    """Every module of bitnet_app can be read knowing only the ones it imports (lazy imports inside functions
    count too)."""
    cycle = _cycle(_import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_only_the_platform_layer_asks_the_operating_system():
    """Everything that depends on the OS is in bitnet_app/platform.py and _kernels/platform.c (issue 45): no other
    module of the package reads /proc or calls an OS-specific function (Linux's or macOS's), and no other C file of
    the engine calls one or includes its header. Python is read as code (ast: calls and attributes by name, strings
    that open a /proc path), C without its comments."""
    import re

    os_names = {"madvise", "sched_setaffinity", "sched_getaffinity", "sysconf", "getrusage", "ru_maxrss",
                "sysctlbyname", "getauxval", "task_info"}
    found = []
    for root, _dirs, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(root, name)
            if not name.endswith(".py") or path == os.path.join(PACKAGE, "platform.py"):
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                word = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
                if word in os_names or word.startswith("MADV_"):
                    found.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {word}")
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/proc"):
                    found.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {node.value}")
                if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                        and str(node.values[0].value).startswith("/proc"):
                    found.append(f"{os.path.relpath(path, REPO)}:{node.lineno} f-string /proc")
    c_words = re.compile(r"/proc|\b(getauxval|sched_setaffinity|sched_getaffinity|pthread_setaffinity_np|madvise|"
                         r"MADV_\w+|syscall|sysctlbyname|sysconf|getrusage|__linux__|__APPLE__)\b|"
                         r"<(sys/auxv|sys/mman|sys/syscall|sys/sysctl|asm/hwcap|sched)\.h>")
    kernels = os.path.join(REPO, "_kernels")
    for name in sorted(os.listdir(kernels)):
        if not name.endswith((".c", ".h", ".pyx", ".pxi", ".pxd")) or name.startswith("platform."):
            continue
        if name.endswith(".c") and os.path.exists(os.path.join(kernels, name[:-2] + ".pyx")):
            continue  # Cython's output
        with open(os.path.join(kernels, name), encoding="utf-8") as f:
            text = f.read()
        if name.endswith((".c", ".h")):
            text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
        else:
            text = re.sub(r"#[^\n]*", " ", text)
        found += [f"_kernels/{name}: {m.group(0)}" for m in c_words.finditer(text)]
    assert not found, "OS-specific calls outside the platform layer (move them to platform.py / platform.c):\n" + \
        "\n".join(found)
