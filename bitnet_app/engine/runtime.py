"""The in-process engine: a converted model (EngineFile) plus a KV cache, driven by one C call per forward.

    eng = Engine(EngineFile(path), lm_head="int8", threads=None, isa=None, kv=None)
    logits = eng.forward(ids, commit=True)            # (1, vocab): logits of the last token
    logits = eng.forward(ids, rows=range(len(ids)))   # (len(ids), vocab)

forward(tokens, *, start=None, commit=True, attention="causal", block_size=0, kv_end=None, rows=None)
    tokens      ids placed at positions start, start+1, ...; start defaults to n_past (the committed length)
    commit      True: start <= n_past (rewrites from start), afterwards n_past = start + len(tokens).
                False: start >= n_past; the K/V written for these tokens are scratch beyond n_past,
                       the committed cache is unchanged.
    attention   "causal": query at position q sees keys k <= q;
                "block": sees keys with k // block_size <= q // block_size (bidirectional inside an
                aligned block, causal across blocks).
    kv_end      keys are read from positions [0, kv_end); default start + len(tokens). A larger value
                reuses scratch K/V written by an earlier uncommitted call (DualCache).
    rows        batch indices whose logits are returned (default: the last one); [] returns (0, vocab).
Returns float32 (len(rows), vocab). Bad ids or positions raise ValueError; the C call releases the GIL. Logits that
are not all finite (a damaged file: NaN or infinity in its weights) raise NonFiniteLogits (an EngineFileError naming
the file), and the positions the call wrote are forgotten.

lm_head "int8" (default; per-row scales, half the bytes of bf16) or "exact" (the bf16 embedding).
kv "f16" (default with the int8 head: half the memory and attention traffic of float32), "f32" (default with the
exact head, so that "exact" reproduces the fp32 reference), or "i8" (int8 with a scale per head and position,
absmax / 127: about half fp16's bytes again, for long conversations; its agreement with f16 is measured in
benchmarks/BENCHMARKS.md).
"""
import errno
import numbers
import os
import threading
from types import SimpleNamespace

import numpy as np

from .. import platform
from .file import EngineFile
from .packing import PACKING_16BIT
from .resident import huge_pages_available, shared_resident, streamed_names, translate_trit5_tiles
from .validate import MAX_CONTEXT, NonFiniteLogits

# forces a kernel path: a name of kernel_paths.py (else the dispatcher takes the best one the CPU has)
ISA_ENV = "BITNET_ISA"
# the KV cache's element types, in the order of _kernels/bitnet.h enum bn_kv
KV_TYPES = ("f32", "f16", "i8")
LM_HEADS = ("int8", "exact")
MAX_THREADS = 256      # _kernels/pool.h BN_POOL_MAX_THREADS (the C engine refuses more, and checks it again)
C_INT_MAX = 2**31 - 1  # block_size and top_k reach the C code as C ints


def one_of(name: str, value, choices: tuple) -> str:
    """value when it is one of `choices` exactly as written (a str: no other case, no other type; "" is no choice),
    else ValueError "name must be one of ...": the rule, and the words, of params.one_of for the decode knobs."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, not {value!r}")
    return value


def banned_array(banned) -> np.ndarray:
    """Ids to ban as greedy_rows takes them: int32, ascending, distinct (an int32 array is taken as it is; the
    kernel checks it)."""
    if isinstance(banned, np.ndarray) and banned.dtype == np.int32:
        return banned
    return np.array(sorted({int(i) for i in banned}), dtype=np.int32)


def whole_number(name: str, value, low: int, high: int, what: str, noun: str = "") -> int:
    """value as an int once it is a whole number in [low, high] (what: where the bound comes from; noun: what the
    value is, in words), else a ValueError that starts with the argument's name as the caller wrote it: values
    reach C as C ints, where a larger one would overflow, and a fraction or a bool is refused, never truncated."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a whole number from {low} to {high}, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name}: {noun + ' ' if noun else ''}{value} is out of range: use {low} to {high} ({what})")
    return int(value)


def _env_threads() -> int | None:
    """BITNET_THREADS, when set: a thread count for every engine."""
    text = os.environ.get("BITNET_THREADS", "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"the environment variable BITNET_THREADS is {text!r}; it must be a whole number of "
                         f"threads (1 to {MAX_THREADS}), or unset") from None


def _int64s(values, what: str) -> np.ndarray:
    """values as an int64 array; a value beyond int64 is refused as out of range (numpy's OverflowError)."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        raise ValueError(f"{what} must fit a 64-bit integer; got {str(values)[:80]}, which does not") from None


def _int32s_in_range(values, end: int):
    """values as an int32 array when they are a list of plain ints, all in [0, end); else None (then the caller's
    full checks run, with their messages). The decoders' calls: no int64 copy, no numpy reductions (~5 us a step)."""
    if type(values) is not list or not values or not all(type(v) is int for v in values):
        return None
    if min(values) < 0 or max(values) >= end:
        return None
    return np.array(values, dtype=np.int32)


def _min_max(a: np.ndarray) -> tuple[int, int]:
    """The smallest and largest entry of a non-empty 1-D integer array: through a list when it is short (a decode
    token, a diffusion step's rows), where numpy's two reductions cost ~3 us, more than the rest of the checks."""
    if len(a) <= 64:
        v = a.tolist()
        return min(v), max(v)
    return int(a.min()), int(a.max())


def _checked_rows(rows, n: int) -> np.ndarray:
    """Any iterable of logit rows -> int32, or the ValueError that says they must lie in [0, n)."""
    rows = _int64s(list(rows), "logit rows")
    row_lo, row_hi = _min_max(rows) if len(rows) else (0, 0)
    if row_lo < 0 or row_hi >= n:
        raise ValueError(f"logit rows must lie in [0, {n})")
    return rows.astype(np.int32)


class Engine:
    def __init__(self, ef: EngineFile, *, lm_head: str = "int8", threads: int | None = None,
                 isa: str | None = None, ctx: int | None = None, kv: str | None = None):
        from .. import _engine  # the compiled extension (built from _kernels/ by setup.py)

        one_of("lm_head", lm_head, LM_HEADS)
        kv = one_of("kv", ("f32" if lm_head == "exact" else "f16") if kv is None else kv, KV_TYPES)
        cfg = ef.config
        self.file = ef
        self.lm_head = lm_head
        self.kv = kv
        self.vocab_size = int(cfg["vocab_size"])
        self.ctx = cfg["max_position_embeddings"] if ctx is None else \
            whole_number("ctx", ctx, 1, MAX_CONTEXT, "the longest context the engine takes")
        if threads is None:
            threads = _env_threads() or min(platform.cpu_count(), MAX_THREADS)   # a 384-core machine: the pool's most
        threads = whole_number("threads", threads, 1, MAX_THREADS, "the number of CPU cores is a good choice",
                               noun="thread count")
        if isa is not None and not isinstance(isa, str):
            raise ValueError(f"isa must be the name of a kernel path or None, not {isa!r}")
        isa = isa or os.environ.get(ISA_ENV) or None
        weights = SimpleNamespace(config=cfg, tensors=dict(ef.tensors), packing=ef.packing)
        # A kernel path that reads 1.6-bit tiles in the window code (_kernels/trit5_windows.c) gets them translated.
        windows = ef.packing == PACKING_16BIT and _engine.reads_trit5_windows(isa or "")
        streamed = streamed_names(ef.tensors, lm_head)
        translated = False
        if huge_pages_available():  # the streamed tensors from 2 MB pages: engine/resident.py says why
            try:
                weights.resident = shared_resident(ef, streamed, windows)  # kept by the engine
                weights.tensors.update(weights.resident.arrays)
                translated = windows
            except (MemoryError, OSError) as exc:  # no room for the copy: read the mmap instead
                if isinstance(exc, OSError) and exc.errno != errno.ENOMEM:
                    raise  # e.g. the file shrank since it was opened: reading its mmap would crash later
        if windows and not translated:  # the tiles from the mmap: a translated copy of them alone
            codes = [name for name in streamed if name.endswith(".codes")]
            weights.tensors.update({name: np.array(weights.tensors[name]) for name in codes})
            translate_trit5_tiles(weights.tensors, codes)
        self._weights = weights  # the arrays the C engine points into
        self._c = _engine.CEngine(weights, lm_head == "exact", KV_TYPES.index(kv), int(threads), isa, self.ctx)
        self.isa = self._c.isa
        self.threads = self._c.threads
        self.n_past = 0
        self._written = 0  # positions [0, _written) hold K/V some forward wrote (committed, then scratch)
        self._lock = threading.Lock()

    def reset(self) -> None:
        self.n_past = self._written = 0

    def truncate(self, n: int) -> None:
        """Forget committed positions from n on (regenerate, diffusion)."""
        self.n_past = self._written = max(0, min(self.n_past, int(n)))

    def keep_scratch(self, end: int) -> None:
        """Commit the scratch K/V that uncommitted forwards wrote for positions [n_past, end), without running
        them again. The caller vouches that they were computed from the final ids under causal attention (where
        a position's K/V depends only on the ids up to it); the engine checks only that they were written."""
        end = int(end)
        if not self.n_past <= end <= self._written:
            raise ValueError(f"only written positions can be kept: {end} is outside [{self.n_past}, {self._written}]")
        self.n_past = end

    def greedy_rows(self, rows: np.ndarray, banned=()) -> tuple[np.ndarray, np.ndarray]:
        """(R, V) float32 logits -> argmax ids (R,) int64 and their softmax probabilities (R,) float64 with
        this engine's kernel path, the `banned` ids taken as -inf (decode/sampling.py greedy_rows is the numpy
        reference; rows are left alone: no copy to ban them)."""
        x = np.ascontiguousarray(rows, dtype=np.float32)
        with self._lock:  # the rows run on the engine's threads, which a forward must not be using
            return self._c.greedy_rows(x, banned_array(banned))

    def sample_rows(self, rows: np.ndarray, temperature: float, top_k: int, top_p: float, uniforms: np.ndarray,
                    banned=()) -> tuple[np.ndarray, np.ndarray]:
        """(R, V) float32 logits, the `banned` ids taken as -inf -> one draw per row after temperature, top-k and
        top-p with the uniforms (R,) in [0, 1): ids (R,) int64 and their probabilities (R,) float64
        (_kernels/sample.c; decode/sampling.py Sampler._draw is the numpy reference; rows are left alone)."""
        x, u = np.ascontiguousarray(rows, dtype=np.float32), np.ascontiguousarray(uniforms, dtype=np.float64)
        top_k = whole_number("top_k", top_k, 0, C_INT_MAX, "what a C int holds")
        with self._lock:  # as greedy_rows
            return self._c.sample_rows(x, float(temperature), top_k, float(top_p), u, banned_array(banned))

    def _checked_tokens(self, tokens) -> np.ndarray:
        """Any sequence of token ids -> int32 (n,), or the ValueError that names what is wrong."""
        toks = np.ascontiguousarray(_int64s(tokens, "token ids").reshape(-1))
        if len(toks) == 0:
            raise ValueError("forward needs at least one token")
        lo, hi = _min_max(toks)
        if lo < 0 or hi >= self.vocab_size:
            bad = int(toks[(toks < 0) | (toks >= self.vocab_size)][0])
            raise ValueError(f"token id {bad} is out of range for this model (vocabulary {self.vocab_size})")
        return toks.astype(np.int32)

    def forward(self, tokens, *, start: int | None = None, commit: bool = True, attention: str = "causal",
                block_size: int = 0, kv_end: int | None = None, rows=None) -> np.ndarray:
        toks = _int32s_in_range(tokens, self.vocab_size)
        if toks is None:
            toks = self._checked_tokens(tokens)
        n = len(toks)
        start = self.n_past if start is None else int(start)
        if start < 0 or start + n > self.ctx:
            raise ValueError(f"positions {start}..{start + n - 1} do not fit the context of {self.ctx} tokens")
        if commit and start > self.n_past:
            raise ValueError(f"commit at {start} would leave a gap after the {self.n_past} committed positions")
        if not commit and start < self.n_past:
            raise ValueError(f"an uncommitted forward at {start} would overwrite committed positions (< {self.n_past})")
        one_of("attention", attention, ("causal", "block"))
        if attention == "block":
            block_size = whole_number("block_size", block_size, 1, C_INT_MAX, "what a C int holds")
        kv_end = start + n if kv_end is None else int(kv_end)
        if kv_end < start + n or kv_end > self.ctx:
            raise ValueError(f"kv_end {kv_end} must lie in [{start + n}, {self.ctx}]")
        rows = [n - 1] if rows is None else rows
        row_ids = _int32s_in_range(rows, n)
        if row_ids is None:
            row_ids = _checked_rows(rows, n)
        out = np.empty((len(row_ids), self.vocab_size), dtype=np.float32)
        with self._lock:
            finite = self._c.forward(toks, start, kv_end, 1 if attention == "block" else 0,
                                     block_size if attention == "block" else 0, row_ids, out)
            if not finite:  # garbage never goes out quietly
                self.n_past, self._written = min(self.n_past, start), min(self._written, start)
                raise NonFiniteLogits(f"{self.file.path} is damaged: the engine computed logits that are not finite "
                                      "numbers (NaN or infinity), so its weights hold values no real model has. "
                                      "Convert the checkpoint again (download it again if that does not help).")
            if commit:
                self.n_past = self._written = start + n
            elif start <= self._written:
                self._written = max(self._written, start + n)
        return out
