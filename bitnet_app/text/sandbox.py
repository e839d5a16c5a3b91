"""Render an untrusted Jinja chat template with limits on time and size.

    env = LimitedEnvironment(max_chars=1 << 20, seconds=2.0)
    text = render_limited(env, source, variables)

Chat templates come with downloaded checkpoints, so they are untrusted code. Jinja's
ImmutableSandboxedEnvironment already forbids internals (`__class__`, ...) and mutation of the
arguments; this adds what it leaves open:
  - time: every loop iteration (each `for` iterable is wrapped by the code generator), call, filter and
    operator checks the clock, and the render stops past `seconds` (nested `range(100000)` loops would
    otherwise run for hours);
  - size: the output is counted as it streams; every value that can grow (`*`, `**`, `%`, `+`, `~`, the
    filters and str methods center, join, replace, indent, expandtabs, format..., namespace attributes)
    is checked BEFORE it is built, so `{{ 'a' * 10**10 }}` fails at once instead of allocating 10 GB;
  - no compile-time evaluation (optimized=False): constant folding would run filters while parsing.
Every violation raises TemplateLimitError (a ValueError) whose message says what the template did.
"""
import copy
import re
import time

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import Namespace
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_TEMPLATE_CHARS = 1 << 20   # a real chat template is a few kB
MAX_EXPONENT_BITS = 4096       # `a ** b` results beyond this many bits are refused
_CHECK_EVERY = 64              # loop iterations between two clock reads


class TemplateLimitError(ValueError):
    """The template ran too long or built too much text."""


def _length(x) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple, dict)) else 0


def _big_numbers_in_format(fmt: str, limit: int) -> bool:
    """True when a printf or str.format spec in fmt asks for a width/precision above limit (any number in
    the format string counts: a false alarm needs a literal over a million in a chat template)."""
    return any(len(n) > 12 or int(n) > limit for n in re.findall(r"\d+", fmt))


class _LimitedCodegen(CodeGenerator):
    """Compiles `a ~ b` to environment.checked_concat((a, b)) instead of a plain str join, and every
    `for x in it` to a loop over environment.loop_guard(it) (a call, so the sandbox checks it too)."""

    def visit_For(self, node, frame):
        node = copy.copy(node)
        guard = nodes.EnvironmentAttribute("loop_guard", lineno=node.lineno)
        node.iter = nodes.Call(guard, [node.iter], [], None, None, lineno=node.lineno)
        super().visit_For(node, frame)

    def visit_Concat(self, node, frame):
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with size checks on every operator, filter and call that can grow a string."""

    intercepted_binops = frozenset(["*", "**", "%", "+"])
    code_generator_class = _LimitedCodegen

    def __init__(self, max_chars: int, seconds: float = 2.0, **options):
        super().__init__(optimized=False, **options)
        self.max_chars = max_chars
        self.seconds = seconds
        self.deadline = float("inf")     # set by render_limited
        self.filters = {name: self._checked_filter(name, f) for name, f in self.filters.items()}
        env = self

        class CheckedNamespace(Namespace):
            """namespace(): the one mutable object a template has; every value stored is size-checked."""
            def __setitem__(self, name, value):
                env._check_result(value)
                if isinstance(value, int) and value.bit_length() > MAX_EXPONENT_BITS:
                    env._refuse(f"a number of {value.bit_length()} bits")
                super().__setitem__(name, value)

        self.globals["namespace"] = CheckedNamespace
        self.globals.pop("lipsum", None)   # lipsum(n) writes n paragraphs: no template needs it

    # ---- checks ------------------------------------------------------------------------------
    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the chat template ran for more than {self.seconds:g} s (a loop that never "
                                     "ends or is far too long). Use the checkpoint's original template.")

    def loop_guard(self, iterable):
        """The items of a for loop's iterable, with a clock check every _CHECK_EVERY items."""
        for i, item in enumerate(iterable):
            if i % _CHECK_EVERY == 0:
                self.tick()
            yield item

    def _refuse(self, what: str):
        raise TemplateLimitError(f"the chat template tried to build {what}, over the limit of {self.max_chars} "
                                 "characters. The template is broken or hostile: use the checkpoint's original "
                                 "template, or a checkpoint from a source you trust.")

    def _check_result(self, value):
        if _length(value) > self.max_chars:
            self._refuse(f"a value of {_length(value)} items")
        return value

    def _check_args(self, args, kwargs):
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.max_chars:
                self._refuse(f"something {a} long (a number that large as an argument)")

    def _check_growth(self, name: str, base, args, kwargs) -> None:
        """Refuse a str method or filter call whose result would be too long, before it runs."""
        limit = self.max_chars
        if name == "join" and isinstance(base, str) and args and hasattr(args[0], "__len__"):
            if len(base) * len(args[0]) > limit:      # str.join(seq): separators alone
                self._refuse(f"a join of {len(args[0])} items with a {len(base)}-character separator")
        elif name == "replace" and isinstance(base, str) and len(args) >= 2:
            old, new = str(args[0]), str(args[1])
            count = len(base) + 1 if not old else base.count(old)
            if len(base) + count * max(0, len(new) - len(old)) > limit:
                self._refuse(f"a replace growing {len(base)} characters by {count} x {len(new)}")
        elif name == "expandtabs" and isinstance(base, str):
            width = int(args[0]) if args and isinstance(args[0], int) else 8
            if len(base) + base.count("\t") * width > limit:
                self._refuse(f"tabs expanded to {base.count(chr(9))} x {width} characters")
        elif name in ("format", "format_map") and isinstance(base, str) and _big_numbers_in_format(base, limit):
            self._refuse("a format with a width or precision that large")

    def _checked_filter(self, name: str, f):
        """f wrapped: its arguments and (for the filters that can grow text) the result's size are checked
        before it runs, the result's size after."""
        env = self
        skip = 1 if hasattr(f, "jinja_pass_arg") else 0   # pass_context & co. get the context first

        def checked(*args, **kwargs):
            env.tick()
            head, rest = args[:skip], args[skip:]
            env._check_args(rest, kwargs)
            value = rest[0] if rest else None
            if name == "join" and rest and not isinstance(value, (str, bytes)):
                value = list(value)              # a generator: count it (its steps run under the clock)
                rest = (value,) + rest[1:]
                sep = rest[1] if len(rest) > 1 else kwargs.get("d", "")
                if isinstance(sep, str) and len(sep) * len(value) > env.max_chars:
                    env._refuse(f"a join of {len(value)} items with a {len(sep)}-character separator")
            elif name == "indent" and isinstance(value, str):
                width = rest[1] if len(rest) > 1 else kwargs.get("width", 4)
                width = len(width) if isinstance(width, str) else int(width)
                if len(value) + (value.count("\n") + 1) * width > env.max_chars:
                    env._refuse(f"{value.count(chr(10)) + 1} lines indented by {width}")
            elif name == "format" and isinstance(value, str) and _big_numbers_in_format(value, env.max_chars):
                env._refuse("a format with a width or precision that large")
            elif name == "replace" and isinstance(value, str):
                env._check_growth("replace", value, rest[1:], kwargs)
            return env._check_result(f(*head, *rest, **kwargs))

        if skip:
            checked.jinja_pass_arg = f.jinja_pass_arg
        return checked

    def checked_concat(self, parts) -> str:
        """`a ~ b ~ ...` (_LimitedCodegen routes every concatenation here)."""
        total = sum(len(p) if isinstance(p, str) else min(len(str(p)), self.max_chars + 1) for p in parts)
        if total > self.max_chars:
            self._refuse(f"a concatenation of {total} characters with `~`")
        return "".join(map(str, parts))

    # ---- sandbox hooks -----------------------------------------------------------------------
    def call_binop(self, context, operator, left, right):
        self.tick()
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(n, int) and not isinstance(seq, int) and _length(seq) * max(n, 0) > self.max_chars:
                self._refuse(f"{_length(seq)} x {n} items with `*`")
            if isinstance(left, int) and isinstance(right, int) and \
                    left.bit_length() + right.bit_length() > MAX_EXPONENT_BITS:
                self._refuse(f"a product of {left.bit_length() + right.bit_length()} bits")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                    right * max(1, abs(left).bit_length()) > MAX_EXPONENT_BITS:
                self._refuse(f"the number {left} ** {right}")
        elif operator == "%" and isinstance(left, str):
            if _big_numbers_in_format(left, self.max_chars):
                self._refuse("a %-format with a width or precision that large")
            self._check_args(right if isinstance(right, tuple) else (right,), {})
        elif operator == "+" and _length(left) + _length(right) > self.max_chars:
            self._refuse(f"a sum of {_length(left)} + {_length(right)} items")
        return self._check_result(super().call_binop(context, operator, left, right))

    def wrap_str_format(self, value):
        """str.format / format_map, which the sandbox wraps when the attribute is read (not in call)."""
        base = getattr(value, "__self__", None)
        if isinstance(base, str) and getattr(value, "__name__", "") in ("format", "format_map") and \
                _big_numbers_in_format(base, self.max_chars):
            self._refuse("a format with a width or precision that large")
        return super().wrap_str_format(value)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: B902 (jinja's own signature)
        __self.tick()
        base, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if isinstance(base, (str, list, tuple, dict)):
            __self._check_args(args, kwargs)
            __self._check_growth(name, base, args, kwargs)
        return __self._check_result(super().call(__context, __obj, *args, **kwargs))


def render_limited(env: LimitedEnvironment, source: str, variables: dict) -> str:
    """Compile and render `source` in `env`, stopping past env.seconds or env.max_chars of output."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateLimitError(f"the chat template is {len(source)} characters long, over the limit of "
                                 f"{MAX_TEMPLATE_CHARS}. Use the checkpoint's original template.")
    env.deadline = time.monotonic() + env.seconds
    compiled = env.from_string(source)
    parts, total = [], 0
    for piece in compiled.generate(**variables):
        env.tick()
        total += len(piece)
        if total > env.max_chars:
            env._refuse("an output")
        parts.append(piece)
    return "".join(parts)
