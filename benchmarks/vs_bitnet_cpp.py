"""Our engine beside bitnet.cpp (microsoft/BitNet), same machine, same sitting, 2B-4T shape (issue 11, item 5).

    python -m benchmarks.vs_bitnet_cpp --anchor ~/anchors/bitnet.cpp [--rounds 3] [--repeats 2]
        [--tests tg64,pp8,pp32,pp128] [--threads 2] [--json out.json] [--bitnet-git BARE_GIT_DIR]
    (--anchor defaults to $BITNET_CPP_ANCHOR, then ~/anchors/bitnet.cpp)

The anchor is a bitnet.cpp build made outside this repository by the recipe in shared/tools/bitnet_cpp/
(build.sh, steps `deps src-new build-new-i2s models-i2s`). This script uses from it:
    build-new-i2s/bin/llama-bench
    models/bitnet2b4t-dummy-i2_s.gguf         I2_S ternary tiles + F16 token_embd = tied lm_head (the official layout)
    models/bitnet2b4t-dummy-i2_s-embq6k.gguf  the same with a Q6_K lm_head (used when present)
    build-new-tl2/bin/llama-bench + models/bitnet2b4t-dummy-tl2.gguf   TL2, bitnet.cpp's x86 AVX2 lookup-table kernels
                                              (1.67 bits a weight; steps src-new-tl2 build-new-tl2 model-tl2; used when
                                              present, for tgN only: its batched forwards are wrong upstream, see the
                                              recipe's README)
Ours: the random 2B-4T engine file of `python -m bitnet_app bench --synthetic 2b4t`, with the int8 head (the
default) and the exact bf16 head, fp16 KV cache (llama-bench's default KV type is f16 too).
The two engines hold different random weights of the same shape: neither's speed depends on the values.

Tests, named and run as llama-bench runs them: tgN = N single-token forwards from an empty cache (warm-up: one
token); ppN = one N-token forward from an empty cache, logits of the last token only (warm-up: one such forward).
tok/s = N / seconds of one run.

How the sitting goes: `rounds` times, for each test, each configuration runs once (`repeats` timed runs after its
warm-up), ours and theirs alternating, the order reversed every other round, so drift and noise hit both alike.
Each run is a fresh process (ours: a Python child; theirs: llama-bench), so each figure includes nothing of the
other's state; the files stay in the page cache. Beside every invocation the load is recorded: the 1-minute load
average before it and `other` = CPU cores used by everything else during it (from /proc/stat minus the child's
own CPU time; 0.00 = quiet; on 2 cores, > 0.1 contaminates a 2-thread figure).

The read roof (GB/s that the threads reach reading a buffer: decode's ceiling) is measured at the start and the
end of the sitting with benchmarks/ceilings/readbw.c (AVX2 loads + prefetch: the figure the
other sections of BENCHMARKS.md quote) and with the engine's own roof.c (plain C, what the model picker uses).

Other processes are waited for: before each invocation, up to --quiet-wait seconds until they use at most
--max-other cores (measured over 1 s); an invocation they disturbed anyway is run again, up to RETRIES times. The summary drops invocations still disturbed where undisturbed ones of the same figure exist.

Prints a markdown table (and the ratios ours / theirs per test); --json writes every sample; --report JSON prints
the tables of a saved sitting again. A sitting of the defaults takes ~5 min on a quiet machine (longer while it
waits for other jobs). Exit status 2, with what to run, when the anchor is missing or incomplete; 1 when a
measurement fails: no figure is ever made up.
"""
import argparse
import datetime
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from benchmarks.run_benchmarks import build_ceiling
from benchmarks.timing import seconds

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RETRIES = 1      # runs again of an invocation that other processes disturbed

LLAMA_BENCH = "build-new-i2s/bin/llama-bench"


@dataclass(frozen=True)
class Variant:
    """A bitnet.cpp configuration: its model file and llama-bench build under the anchor."""
    model: str
    head: str                  # the lm_head's format, for the tables
    required: bool = False     # the sitting refuses to start without it
    bench: str = LLAMA_BENCH
    decode_only: bool = False  # its ppN figures are not to be trusted: run only tgN


THEIRS = {
    "bitnet.cpp I2_S, F16 head": Variant("models/bitnet2b4t-dummy-i2_s.gguf", "F16 (tied token_embd)", required=True),
    "bitnet.cpp I2_S, Q6_K head": Variant("models/bitnet2b4t-dummy-i2_s-embq6k.gguf", "Q6_K (6.56 bits, tied)"),
    "bitnet.cpp TL2, F16 head": Variant("models/bitnet2b4t-dummy-tl2.gguf", "F16 (tied token_embd)",
                                        bench="build-new-tl2/bin/llama-bench", decode_only=True),
}
# our settings: name -> (lm_head argument of Engine, lm_head format)
OURS = {
    "ours, int8 head": ("int8", "int8 + fp32 row scale (default)"),
    "ours, exact bf16 head": ("exact", "bf16 (exact)"),
}
RECIPE_STEPS = "deps src-new build-new-i2s models-i2s"


class AnchorMissing(Exception):
    """The bitnet.cpp build this comparison needs is not there; the message says what to run."""


def default_anchor() -> str:
    return os.environ.get("BITNET_CPP_ANCHOR") or os.path.expanduser("~/anchors/bitnet.cpp")


def check_anchor(anchor: str) -> dict:
    """{variant name: (llama-bench path, model path)} of the bitnet.cpp variants present under `anchor` (a variant
    is present when both its files are). Raises AnchorMissing naming every missing part of the required variants
    and the commands that build them."""
    anchor = os.path.abspath(os.path.expanduser(anchor))
    found, missing = {}, []
    for name, v in THEIRS.items():
        bench, model = os.path.join(anchor, v.bench), os.path.join(anchor, v.model)
        lacks = ([] if os.path.isfile(bench) and os.access(bench, os.X_OK) else [bench]) \
            + ([] if os.path.isfile(model) else [model])
        if not lacks:
            found[name] = (bench, model)
        elif v.required:
            missing += [p for p in lacks if p not in missing]
    if missing:
        raise AnchorMissing(
            f"bitnet.cpp anchor not found or incomplete at {anchor}: missing\n"
            + "".join(f"  {m}\n" for m in missing)
            + "Build it (once per machine, ~10-20 min on 2 cores, ~8 GB of disk) with the recipe in "
              "shared/tools/bitnet_cpp/ (README.md there):\n"
              "  1. fetch the snapshots github:ygqdan/BitNet-linux and github:Eddie-Wang1120/llama.cpp (bare git dirs)\n"
              f"  2. ANCHOR={anchor} BITNET_LINUX_GIT=<BitNet-linux git dir> LLAMACPP_GIT=<llama.cpp git dir> \\\n"
              f"       nice -n 10 shared/tools/bitnet_cpp/build.sh {RECIPE_STEPS}\n"
              "then run this again with --anchor (or BITNET_CPP_ANCHOR) set to that folder.")
    return found


def parse_test(test: str) -> tuple[int, int]:
    """'tg64' -> (n_prompt 0, n_gen 64); 'pp128' -> (128, 0): llama-bench's -p / -n."""
    kind, n = test[:2], test[2:]
    if kind not in ("tg", "pp") or not n.isdigit() or int(n) < 1:
        raise ValueError(f"test {test!r}: expected tgN (decode N tokens) or ppN (prefill N tokens), e.g. tg64, pp128")
    return (0, int(n)) if kind == "tg" else (int(n), 0)


def llama_bench_command(bench: str, model: str, test: str, threads: int, repeats: int) -> list[str]:
    n_prompt, n_gen = parse_test(test)
    return [bench, "-m", model, "-t", str(threads), "-r", str(repeats), "-p", str(n_prompt), "-n", str(n_gen),
            "-o", "json"]


def parse_llama_bench_json(text: str) -> list[dict]:
    """llama-bench `-o json` output (a list with one object per test) -> one dict per test: the test name
    (tgN / ppN), samples_ts (tok/s of each timed run) and the fields that identify the run."""
    try:
        runs = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"llama-bench output is not the JSON list `-o json` writes: {e}") from None
    if not isinstance(runs, list) or not runs:
        raise ValueError("llama-bench output holds no test")
    out = []
    for r in runs:
        n_prompt, n_gen = int(r["n_prompt"]), int(r["n_gen"])
        if (n_prompt > 0) == (n_gen > 0):
            raise ValueError(f"llama-bench test with n_prompt {n_prompt} and n_gen {n_gen}: expected exactly one")
        samples = [float(x) for x in r["samples_ts"]]
        if not samples or min(samples) <= 0:
            raise ValueError(f"llama-bench test without valid samples_ts: {r['samples_ts']!r}")
        out.append({"test": f"pp{n_prompt}" if n_prompt else f"tg{n_gen}", "samples_ts": samples,
                    "avg_ts": float(r["avg_ts"]), "threads": int(r["n_threads"]), "model_type": r["model_type"],
                    "model_size": int(r["model_size"]), "type_k": r.get("type_k"), "build_commit": r["build_commit"]})
    return out


def measure_ours(path: str, test: str, lm_head: str, threads: int, repeats: int) -> dict:
    """One configuration of our engine, in this process: tok/s of `repeats` timed runs of `test` after
    llama-bench's warm-up (one token for tgN, one full forward for ppN). Called in a child process."""
    import numpy as np

    from bitnet_app.bench import bytes_per_token
    from bitnet_app.engine import Engine, EngineFile

    n_prompt, n_gen = parse_test(test)
    ef = EngineFile(path)
    eng = Engine(ef, lm_head=lm_head, kv="f16", threads=threads)
    ids = np.random.default_rng(0).integers(0, eng.vocab_size, size=max(n_prompt, n_gen))

    def run(n_tokens: int):
        eng.reset()
        if n_prompt:
            eng.forward(ids[:n_prompt], start=0)  # logits of the last row only, as llama-bench
        else:
            for i in range(n_tokens):
                eng.forward(ids[i:i + 1], start=i)

    run(1 if n_gen else n_prompt)
    samples = []
    for _ in range(repeats):
        samples.append((n_prompt or n_gen) / seconds(lambda: run(n_gen)))
    return {"test": test, "samples_ts": samples, "isa": eng.isa, "threads": eng.threads, "kv": eng.kv,
            "bytes_per_token": bytes_per_token(ef, lm_head)}


def measure_engine_roof(threads: int) -> dict:
    """The read roof (GB/s) of `threads` engine threads, in this process (roof.c, 512 MB buffer, best of 3)."""
    from bitnet_app import _engine

    return {"engine_roof_gb_s": _engine.read_roof_gb_s(threads, megabytes=512, passes=3)}


def parse_readbw(text: str) -> float:
    """readbw's "threads=N read GB/s X" -> X."""
    m = re.search(r"threads=\d+ read GB/s ([\d.]+)", text)
    if not m:
        raise ValueError(f"readbw printed no 'read GB/s' figure: {text[-200:]!r}")
    return float(m.group(1))


def head_agreement(path: str, threads: int, positions: int = 32) -> dict:
    """int8 head against the exact bf16 head on the same file (fp16 KV both): top-1 agreement and the largest
    logit difference relative to the largest logit, over `positions` rows of random ids."""
    import numpy as np

    from bitnet_app.engine import Engine, EngineFile

    ef = EngineFile(path)
    ids = np.random.default_rng(1).integers(0, ef.config["vocab_size"], positions)
    a, b = (Engine(ef, lm_head=h, kv="f16", threads=threads).forward(ids, rows=range(positions))
            for h in ("int8", "exact"))
    err = np.abs(a - b).max(axis=1) / np.abs(b).max()
    return {"positions": positions, "top1": float(np.mean(a.argmax(1) == b.argmax(1))),
            "median_err": float(np.median(err)), "max_err": float(err.max())}


def python_child(call: str) -> list[str]:
    """A command that runs `call` (an expression over this module) in a fresh interpreter and prints its JSON."""
    return [sys.executable, "-c", f"import json\nfrom benchmarks import vs_bitnet_cpp as v\nprint(json.dumps(v.{call}))"]


# ---- load accounting and one invocation ------------------------------------------------------------------------

def cpu_busy_s() -> float:
    """Seconds of CPU the whole machine has been busy (user+nice+system+irq+softirq of /proc/stat's cpu line)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(max_other: float, timeout_s: float) -> float:
    """Wait (at most timeout_s) until the machine's other processes use <= max_other cores over 1 s; the last such
    figure."""
    t_end = time.monotonic() + timeout_s
    while True:
        b0 = cpu_busy_s()
        time.sleep(1.0)
        other = other_cores(cpu_busy_s() - b0, 0.0, 1.0)
        if other <= max_other or time.monotonic() >= t_end:
            return other


def other_cores(busy_s: float, child_cpu_s: float, wall_s: float) -> float:
    """CPU cores used by everything but the measured child during its run (never negative: clock ticks are coarse)."""
    return max(0.0, (busy_s - child_cpu_s) / wall_s)


def invoke(cmd: list[str]) -> tuple[str, dict]:
    """Run one measurement process; its stdout and the load around it."""
    load1 = os.getloadavg()[0]
    r0, b0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_busy_s(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    r1, b1, t1 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_busy_s(), time.perf_counter()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    child = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return proc.stdout, {"load1_before": load1, "other_cores": round(other_cores(b1 - b0, child, t1 - t0), 3),
                         "wall_s": round(t1 - t0, 2)}


# ---- the sitting -----------------------------------------------------------------------------------------------

def invoke_quietly(cmd: list[str], max_other: float, quiet_wait_s: float, say) -> tuple[str, dict]:
    """invoke once the machine is quiet (wait_for_quiet); again (up to RETRIES times) if others disturbed it."""
    for attempt in range(RETRIES + 1):
        before = wait_for_quiet(max_other, quiet_wait_s)
        out, load = invoke(cmd)
        if load["other_cores"] <= max_other or attempt == RETRIES:
            return out, dict(load, other_before=round(before, 3), retries=attempt)
        say(f"  (other processes used {load['other_cores']:.2f} cores during it: again)")


def interleaved(ours: list[str], theirs: list[str]) -> list[str]:
    """[ours0, theirs0, ours1, theirs1, ...] (the longer list's rest at the end)."""
    out = []
    for i in range(max(len(ours), len(theirs))):
        out += ours[i:i + 1] + theirs[i:i + 1]
    return out


def run_sitting(ours_path: str, theirs: dict, tests: list[str], rounds: int, repeats: int, threads: int,
                max_other: float, quiet_wait_s: float, say=print) -> dict:
    """Every (configuration, test) `rounds` times, interleaved; returns the raw records and the read roofs."""
    configs = interleaved(list(OURS), [n for n in THEIRS if n in theirs])

    def runs(test: str, order: list[str]) -> list[str]:  # the configurations that run `test`, in this order
        return [n for n in order if n in OURS or not (THEIRS[n].decode_only and test.startswith("pp"))]

    records, roofs = [], []
    tmp = tempfile.TemporaryDirectory(prefix="vs-bitnet-cpp-")  # the compiled readbw
    readbw = build_ceiling("readbw", tmp.name)

    def roof(when):
        out, load = invoke_quietly([readbw, str(threads)], max_other, quiet_wait_s, say)
        out2, load2 = invoke_quietly(python_child(f"measure_engine_roof({threads})"), max_other, quiet_wait_s,
                                    say)
        roofs.append(dict(json.loads(out2.strip().splitlines()[-1]), readbw_gb_s=parse_readbw(out), when=when,
                          other_cores=max(load["other_cores"], load2["other_cores"])))
        say(f"read roof ({when}): readbw.c {roofs[-1]['readbw_gb_s']:.1f} GB/s, "
            f"engine roof.c {roofs[-1]['engine_roof_gb_s']:.1f} GB/s")

    roof("start")
    for rnd in range(rounds):
        for test in tests:
            for name in runs(test, configs if rnd % 2 == 0 else configs[::-1]):
                if name in OURS:
                    cmd = python_child(f"measure_ours({ours_path!r}, {test!r}, {OURS[name][0]!r}, {threads}, {repeats})")
                else:
                    cmd = llama_bench_command(*theirs[name], test, threads, repeats)
                out, load = invoke_quietly(cmd, max_other, quiet_wait_s, say)
                if name in OURS:
                    rec = json.loads(out.strip().splitlines()[-1])
                else:
                    (rec,) = parse_llama_bench_json(out)
                    if rec["test"] != test:
                        raise RuntimeError(f"llama-bench ran {rec['test']}, asked for {test}")
                records.append(dict(rec, config=name, round=rnd, **load))
                say(f"round {rnd + 1}/{rounds} {test:6s} {name:28s} "
                    + " ".join(f"{x:7.2f}" for x in rec["samples_ts"])
                    + f" tok/s  (load1 {load['load1_before']:.2f}, other {load['other_cores']:.2f})")
    roof("end")
    tmp.cleanup()
    return {"records": records, "roofs": roofs}


def summarize(records: list[dict], tests: list[str], max_other: float) -> dict:
    """{test: {config: {median, min, max, n, dropped, other_max, load1_max}}} over the samples of every round.
    Invocations that other processes disturbed (other_cores > max_other even after their retries) are dropped
    where the same configuration and test has undisturbed ones (`dropped` counts them), else kept (other_max
    then shows it)."""
    out = {}
    for test in tests:
        for name in list(OURS) + list(THEIRS):
            every = [r for r in records if r["test"] == test and r["config"] == name]
            recs = [r for r in every if r["other_cores"] <= max_other] or every
            if not recs:
                continue
            s = [x for r in recs for x in r["samples_ts"]]
            out.setdefault(test, {})[name] = {
                "median": statistics.median(s), "min": min(s), "max": max(s), "n": len(s),
                "dropped": len(every) - len(recs), "other_max": max(r["other_cores"] for r in recs),
                "load1_max": max(r["load1_before"] for r in recs)}
    return out


def ratios(summary: dict) -> dict:
    """{test: {label: ours median / theirs median}} for the pairs worth stating."""
    pairs = [("ours int8 / theirs F16", "ours, int8 head", "bitnet.cpp I2_S, F16 head"),
             ("ours int8 / theirs Q6_K", "ours, int8 head", "bitnet.cpp I2_S, Q6_K head"),
             ("ours int8 / theirs TL2", "ours, int8 head", "bitnet.cpp TL2, F16 head"),
             ("ours bf16 / theirs F16 (both 16-bit heads)", "ours, exact bf16 head", "bitnet.cpp I2_S, F16 head")]
    out = {}
    for test, by in summary.items():
        out[test] = {label: by[a]["median"] / by[b]["median"] for label, a, b in pairs if a in by and b in by}
        best = max((n for n in by if n in THEIRS), key=lambda n: by[n]["median"], default=None)
        if best and "ours, int8 head" in by:  # issue 34's bar: against bitnet.cpp's fastest variant of the sitting
            out[test]["ours int8 / theirs' best variant"] = by["ours, int8 head"]["median"] / by[best]["median"]
    return out


def markdown(result: dict) -> str:
    s, rt, roofs = result["summary"], result["ratios"], result["roofs"]
    heads = {name: fmt for name, (_h, fmt) in OURS.items()} | {name: v.head for name, v in THEIRS.items()}
    bpt = result["bytes_per_token"]
    roof = max(r["readbw_gb_s"] for r in roofs)
    lines = [f"Machine: {result['machine']}; {result['threads']} threads; {result['date']}.",
             f"Ours: commit {result['commit']} ({result['isa']} path), file {result['ours_file_bytes'] / 1e6:.0f} MB. "
             f"bitnet.cpp: {result['bitnet_cpp']}.",
             f"Read roof ({result['threads']} threads), readbw.c / engine roof.c: " + ", ".join(
                 f"{r['readbw_gb_s']:.1f} / {r['engine_roof_gb_s']:.1f} GB/s at the {r['when']}" for r in roofs) + ".",
             f"{result['rounds']} rounds x {result['repeats']} timed runs per configuration and test, interleaved; "
             "tok/s median [min-max] of the runs kept; runs = timed runs kept (invocations dropped because other "
             f"processes used more than {result['max_other']} cores during them); other = most CPU cores used by "
             "anything else during a kept invocation; L = largest 1-min load average before one. Bytes per decode "
             "token: ours = ternary tiles + head (bitnet_app.bench.bytes_per_token); bitnet.cpp = the whole GGUF "
             f"(tiles + the tied head, read whole each token); decode GB/s = bytes x tok/s, % of the better readbw.c "
             f"roof ({roof:.1f} GB/s).", "",
             "| test | engine, lm_head | bytes per decode token | tok/s | decode GB/s (of roof) | runs | load |",
             "|---|---|---|---|---|---|---|"]
    for test, by in s.items():
        for name, f in by.items():
            gb_s = bpt[name] * f["median"] / 1e9
            stream = f"{gb_s:.1f} ({100 * gb_s / roof:.0f}%)" if test.startswith("tg") else "-"
            lines.append(f"| {test} | {name}: {heads[name]} | {bpt[name] / 1e6:.0f} MB | {f['median']:.2f} "
                         f"[{f['min']:.2f}-{f['max']:.2f}] | {stream} | {f['n']} ({f['dropped']} dropped) "
                         f"| other {f['other_max']:.2f}, L {f['load1_max']:.2f} |")
    labels = list(dict.fromkeys(label for by in rt.values() for label in by))
    lines += ["", "| ratio (median / median) | " + " | ".join(rt) + " |", "|---|" + "---|" * len(rt)]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(f"{rt[t][label]:.2f}x" if label in rt[t] else "-" for t in rt) + " |")
    a = result["agreement"]
    lines += ["", f"Agreement (ours, same file): int8 head vs exact bf16 head, {a['positions']} positions of random ids: "
              f"top-1 {100 * a['top1']:.1f}%, logit error median {100 * a['median_err']:.3f}% / max "
              f"{100 * a['max_err']:.3f}% of the largest logit. The two engines hold different random weights, so "
              "their logits are not compared."]
    return "\n".join(lines)


def bytes_per_decode_token(records: list[dict], theirs: dict) -> dict:
    """{configuration: weight bytes one decode step reads}: ours from the measuring child (tiles + head);
    bitnet.cpp's = its GGUF's size (every tensor is read once per token, the tied token_embd as the head)."""
    out = {r["config"]: r["bytes_per_token"] for r in records if r["config"] in OURS}
    return out | {name: os.path.getsize(theirs[name][1]) for name in THEIRS if name in theirs}


def git_commit(git_dir: str | None) -> str:
    if not git_dir:
        return "snapshot commit unknown (pass --bitnet-git or set BITNET_LINUX_GIT)"
    try:
        sha = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"snapshot commit unknown ({git_dir} is not a git dir)"
    return f"ygqdan/BitNet-linux snapshot {sha[:12]}"


def our_commit() -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=REPO).stdout.strip()
    return (sha or "unknown") + (" + uncommitted changes" if dirty else "")


def describe_machine() -> str:
    from benchmarks.run_benchmarks import machine

    m = machine()
    return f"{m['cpu']}, {m['cpus']} CPUs, flags {' '.join(m['flags'])}"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor", default=default_anchor(),
                    help="bitnet.cpp anchor folder made by shared/tools/bitnet_cpp/build.sh "
                         "(default: $BITNET_CPP_ANCHOR, else ~/anchors/bitnet.cpp)")
    ap.add_argument("--tests", default="tg64,pp8,pp32,pp128", help="comma-separated tgN / ppN")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each configuration once per test)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per invocation, after one warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-other", type=float, default=0.15,
                    help="wait for, and run again an invocation disturbed by, other processes using more cores")
    ap.add_argument("--quiet-wait", type=float, default=30,
                    help="seconds to wait at most, before each invocation, for other processes to go quiet")
    ap.add_argument("--bitnet-git", default=os.environ.get("BITNET_LINUX_GIT"),
                    help="the bare git dir the anchor was built from, to record its commit (default: $BITNET_LINUX_GIT)")
    ap.add_argument("--json", help="write the summary and every sample here")
    ap.add_argument("--report", metavar="JSON", help="print the tables of a sitting saved with --json; measure nothing")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        with open(args.report) as f:
            print(markdown(json.load(f)))
        return 0
    try:
        tests = [t.strip() for t in args.tests.split(",") if t.strip()]
        for t in tests:
            parse_test(t)
        if args.rounds < 1 or args.repeats < 1 or args.threads < 1:
            raise ValueError("--rounds, --repeats and --threads must be at least 1")
        theirs = check_anchor(args.anchor)
    except (AnchorMissing, ValueError) as e:
        print(f"vs_bitnet_cpp: {e}", file=sys.stderr)
        return 2

    from bitnet_app.bench import synthetic_file

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with synthetic_file("2b4t") as path:  # a kept copy in the cache is used as it is
        say(f"ours: {path}; theirs: " + ", ".join(f"{n}: {m}" for n, (_b, m) in theirs.items()))
        t0 = time.time()
        result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                  "machine": describe_machine(), "threads": args.threads, "commit": our_commit(),
                  "bitnet_cpp": git_commit(args.bitnet_git), "tests": tests, "rounds": args.rounds,
                  "repeats": args.repeats, "max_other": args.max_other, "anchor": os.path.abspath(args.anchor)}
        try:
            result.update(run_sitting(path, theirs, tests, args.rounds, args.repeats, args.threads,
                                      args.max_other, args.quiet_wait, say=say))
        except (RuntimeError, ValueError) as e:  # a child failed, or llama-bench printed no result
            print(f"vs_bitnet_cpp: {e}", file=sys.stderr)
            return 1
        result["seconds"] = round(time.time() - t0, 1)
        result["agreement"] = json.loads(subprocess.run(
            python_child(f"head_agreement({path!r}, {args.threads})"), capture_output=True, text=True, check=True,
            cwd=REPO).stdout.strip().splitlines()[-1])
        result["isa"] = next(r["isa"] for r in result["records"] if r["config"] in OURS)
        result["ours_file_bytes"] = os.path.getsize(path)
        result["bytes_per_token"] = bytes_per_decode_token(result["records"], theirs)
        theirs_recs = [r for r in result["records"] if r["config"] in THEIRS]
        result["bitnet_cpp"] += f"; llama-bench build {theirs_recs[0]['build_commit']}"
    result["summary"] = summarize(result["records"], tests, args.max_other)
    result["ratios"] = ratios(result["summary"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
