"""Engine speed figures, llama-bench style: tg128 (decode), pp128 (prefill), block forwards, bytes per token.

    python -m bitnet_app bench --synthetic 2b4t --json --threads 2
    run_bench(path, threads=2, isa=None, lm_head="int8", repeats=5) -> dict

Every figure is the median of `repeats` timed runs after one untimed warm-up run; `*_spread` holds
[min, max] of the same runs. Token ids are fixed pseudo-random ids (the speed does not depend on them).
    decode_tok_s   tg128: 128 single-token committed forwards from an empty cache; 128 / seconds
    prefill_tok_s  pp128: one committed forward of 128 tokens from an empty cache; 128 / seconds
    block_ms       {n: ms} for n in 1, 4, 8, 16, 32: one UNcommitted forward of n tokens at position 128
                   (after a 128-token prefill), logits of the last row (the forward's own cost)
    block_ms_all_rows  the same with logits for all n rows (more than a diffusion step asks for: it needs
                   the masked slots of one sub-block, at most 8 rows)
    bytes_per_token  weight bytes one decode step streams: every ternary tile tensor (*.codes) plus the
                   head (head.i8 for lm_head int8, the bf16 head for exact: lm_head when untied, else the embedding)
    weight_gb_s    bytes_per_token * decode_tok_s / 1e9: the weight stream rate decode achieved
"""
import contextlib
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from .engine.file import EngineFile, EngineFileError
from .engine.runtime import Engine

TG, PP, BLOCK_POS = 128, 128, 128
BLOCK_SIZES = (1, 4, 8, 16, 32)


def bytes_per_token(ef: EngineFile, lm_head: str) -> int:
    tiles = sum(int(t.nbytes) for name, t in ef.tensors.items() if name.endswith(".codes"))
    head = ef.tensors["head.i8"] if lm_head == "int8" else ef.tensors.get("lm_head", ef.tensors["embed"])
    return tiles + int(head.nbytes)


@contextlib.contextmanager
def synthetic_file(shape: str, seed: int = 0, keep: bool = False, layout: str | None = None):
    """A random engine file of a named shape, as a context: `with synthetic_file("2b4t") as path: ...`; its
    ternary tiles in `layout` (engine/packing.py PACKINGS; None: what the converter writes on this CPU).

    keep=False (the default): the file (1.5 GB for 2b4t) is written into a temporary folder of the cache and
    deleted at the end, unless a kept copy already exists, which is used as it is. keep=True: the file is
    written once into the cache folder (cache/synthetic/) and stays there for the next run."""
    from .checkpoint.synthetic import write_synthetic_engine_file
    from .engine.cache import cache_dir

    from .engine.kernel_paths import preferred_packing

    layout = layout or preferred_packing()
    suffix = "" if layout == preferred_packing() else f"-{layout}"
    kept = os.path.join(cache_dir(), "synthetic", f"{shape}-seed{seed}{suffix}.bitnet")
    if os.path.isfile(kept):
        try:
            if EngineFile(kept).packing == layout:  # (a file kept before the 1.6-bit tiles has 2-bit ones)
                yield kept
                return
        except EngineFileError:
            pass
    if keep:
        yield write_synthetic_engine_file(kept, shape=shape, seed=seed, layout=layout)
        return
    os.makedirs(cache_dir(), exist_ok=True)
    folder = tempfile.mkdtemp(prefix="synthetic-", dir=cache_dir())
    try:
        yield write_synthetic_engine_file(os.path.join(folder, os.path.basename(kept)), shape=shape, seed=seed,
                                          layout=layout)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _timed_runs(run, repeats: int) -> list[float]:
    run()  # warm-up: page in the weights, settle the thread pool
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return times


def run_bench(path: str, *, threads: int | None = None, isa: str | None = None, lm_head: str = "int8", kv: str | None = None,
              repeats: int = 5, progress=None) -> dict:
    say = progress or (lambda msg: None)
    ef = EngineFile(path)
    eng = Engine(ef, lm_head=lm_head, threads=threads, isa=isa, kv=kv)
    if eng.ctx < BLOCK_POS + max(BLOCK_SIZES):
        raise ValueError(f"the model's context ({eng.ctx}) is too short for the benchmark "
                         f"(needs {BLOCK_POS + max(BLOCK_SIZES)} positions)")
    ids = np.random.default_rng(0).integers(0, eng.vocab_size, size=BLOCK_POS + max(BLOCK_SIZES))

    def tg():
        eng.reset()
        for i in range(TG):
            eng.forward(ids[i:i + 1], start=i, commit=True)

    def pp():
        eng.reset()
        eng.forward(ids[:PP], start=0, commit=True)

    say("tg128 (decode)")
    tg_times = _timed_runs(tg, repeats)
    say("pp128 (prefill)")
    pp_times = _timed_runs(pp, repeats)
    block_times, block_all = {}, {}
    eng.reset()
    eng.forward(ids[:BLOCK_POS], start=0, commit=True)
    for n in BLOCK_SIZES:
        say(f"block forward of {n}")
        batch = ids[BLOCK_POS:BLOCK_POS + n]
        block_times[n] = _timed_runs(lambda: eng.forward(batch, start=BLOCK_POS, commit=False), repeats)
        block_all[n] = _timed_runs(
            lambda: eng.forward(batch, start=BLOCK_POS, commit=False, rows=range(n)), repeats)

    bpt = bytes_per_token(ef, lm_head)
    decode = TG / statistics.median(tg_times)
    return {
        "decode_tok_s": decode,
        "decode_tok_s_spread": [TG / max(tg_times), TG / min(tg_times)],
        "prefill_tok_s": PP / statistics.median(pp_times),
        "prefill_tok_s_spread": [PP / max(pp_times), PP / min(pp_times)],
        "block_ms": {n: 1e3 * statistics.median(t) for n, t in block_times.items()},
        "block_ms_spread": {n: [1e3 * min(t), 1e3 * max(t)] for n, t in block_times.items()},
        "block_ms_all_rows": {n: 1e3 * statistics.median(t) for n, t in block_all.items()},
        "bytes_per_token": bpt,
        "weight_gb_s": bpt * decode / 1e9,
        "isa": eng.isa,
        "threads": eng.threads,
        "lm_head": lm_head,
        "kv": eng.kv,
        "repeats": repeats,
        "model": os.path.abspath(path),
        "layers": ef.config.get("num_hidden_layers"),
        "hidden_size": ef.config.get("hidden_size"),
        "vocab_size": eng.vocab_size,
    }


def format_report(r: dict) -> str:
    lines = [f"model {r['model']} ({r['layers']} layers, hidden {r['hidden_size']}, vocab {r['vocab_size']})",
             f"isa {r['isa']}, {r['threads']} threads, lm_head {r['lm_head']}, median of {r['repeats']} runs",
             f"decode  tg{TG}: {r['decode_tok_s']:8.2f} tok/s  [{r['decode_tok_s_spread'][0]:.2f} .. "
             f"{r['decode_tok_s_spread'][1]:.2f}]",
             f"prefill pp{PP}: {r['prefill_tok_s']:8.2f} tok/s  [{r['prefill_tok_s_spread'][0]:.2f} .. "
             f"{r['prefill_tok_s_spread'][1]:.2f}]",
             f"weights per decode token: {r['bytes_per_token'] / 1e6:.1f} MB -> {r['weight_gb_s']:.2f} GB/s"]
    for n, ms in r["block_ms"].items():
        lo, hi = r["block_ms_spread"][n]
        lines.append(f"block forward of {n:2d} tokens: {ms:8.2f} ms  ({ms / r['block_ms'][1]:.2f}x one token)"
                     f"  [{lo:.2f} .. {hi:.2f}]")
    return "\n".join(lines)
