"""Where the time of an N-row forward goes (issue 16.1), part by part, beside the int8 ceiling of this machine.

    python -m benchmarks.forward_breakdown [--model demo] [--threads 2] [--rows 1,2,4,8,16,32]
                                            [--repeats 5] [--iters 100] [--json out.json]

(run from the checkout, so that its bitnet_app and its built engine are the ones imported)

--model is anything bitnet_app.load_model takes: "demo" (the bundled demo model), an HF checkpoint folder,
an engine file or a Hub repo id, so a new demo model with other shapes needs no change here.

The workload is the one a denoising step runs: after a committed prefill of --pos tokens, one UNcommitted
forward of N tokens at position --pos (block attention, blocks of 32; --attention causal: causal, as a causal
checkpoint's steps run), logits of one row. Per N, each of
--repeats repetitions times --iters forwards three ways:
  python     Engine.forward (the product's call, with its argument checks), profiling off: "ms/forward"
  profiled   the same with the engine's development timer on (bn_engine_set_profile): per part, the
             calling thread's wall time, less its time in the thread pool (opening a parallel job and
             waiting for the workers that joined it), which is reported as "thread_dispatch+wait"
  cython     CEngine.forward called directly with ready arrays (no Python checks)
so "python wrapper" = python - cython and "cython wrapper" = cython - the C call's own total.
Each figure is the median over the repetitions (µs per forward), or with --stat best the fastest repetition.

The ceiling is the "int8 ceiling" of the path's tool (run_benchmarks.ceiling_tool): for the 256-bit paths
benchmarks/ceilings/int8_avx2.c (the faster of vpmaddubsw + vpmaddwd + vpaddd chains and the ternary kernels' own
step, vpmaddubsw + vpaddw, on registers), for the avx512 path benchmarks/ceilings/int8_vnni.c (vpdpbusd on zmm
registers), for the amx path benchmarks/ceilings/int8_amx.c (tdpbusd on tiles), built and run three times with the same number of threads before and after the forwards;
the best run counts. GMAC/s counts the multiply-adds the forward does (macs_of_forward): the ternary ones of
the N rows through every layer (q, k, v, o, gate, up, down), less the last layer's o, gate, up and down for the
rows without logits (the engine skips them), plus the int8 head's for the one row of logits.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks.run_benchmarks import build_ceiling, ceiling_tool
from benchmarks.timing import per_call

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BLOCK = 32

WRAPPER_KEYS = ("python", "profiled", "cython", "c_total_direct", "python_wrapper", "cython_wrapper",
                "python_spread", "total", "gmac_s", "ceiling_pct")


def macs_per_row(cfg: dict) -> int:
    """Ternary multiply-adds of one token row through every layer (q, k, v, o, gate, up, down)."""
    d, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg.get("head_dim") or cfg["hidden_size"] // cfg[
        "num_attention_heads"]
    kvd = cfg["num_key_value_heads"] * hd
    return cfg["num_hidden_layers"] * (d * (d + 2 * kvd) + d * d + 2 * i * d + i * d)


def macs_of_forward(cfg: dict, n: int, logit_rows: int = 1) -> int:
    """Multiply-adds an n-row forward does when it asks for the logits of `logit_rows` rows: every layer for
    every row, except the last layer's o, gate, up and down, which run only for the logit rows (the engine
    trims its last layer: _kernels/forward.c, trims_last_layer), plus the int8 head for the logit rows."""
    d, i = cfg["hidden_size"], cfg["intermediate_size"]
    tail = d * d + 2 * i * d + i * d
    return n * macs_per_row(cfg) - (n - logit_rows) * tail + logit_rows * cfg["vocab_size"] * d


def run_ceiling(exe: str, threads: int) -> float:
    out = subprocess.run([exe, str(threads)], check=True, capture_output=True, text=True).stdout
    return float(re.search(r"int8 ceiling GMAC/s ([\d.]+)", out).group(1))


def measure(engine, ids: np.ndarray, pos: int, n: int, repeats: int, iters: int, stat: str = "median",
            attention: str = "block") -> dict:
    """µs per forward (median over the repetitions, or the fastest repetition): the Python call, the Cython
    call, and the C parts."""
    c = engine._c
    batch = np.ascontiguousarray(ids[pos:pos + n], dtype=np.int32)
    rows = np.array([n - 1], dtype=np.int32)
    out = np.empty((1, engine.vocab_size), dtype=np.float32)
    block = attention == "block"

    def py():
        engine.forward(batch, start=pos, commit=False, attention=attention, block_size=BLOCK if block else 0)

    def cy():
        c.forward(batch, pos, pos + n, 1 if block else 0, BLOCK if block else 0, rows, out)

    for _ in range(max(10, iters // 5)):  # warm-up: caches, the pool's threads awake
        py()
    runs = []
    for _ in range(repeats):
        rep = {"python": per_call(py, iters)}
        c.set_profile(True)
        rep["profiled"] = per_call(py, iters)
        rep.update({k: v / iters for k, v in c.profile().items()})
        c.set_profile(True)
        rep["cython"] = per_call(cy, iters)
        rep["c_total_direct"] = c.profile()["total"] / iters
        c.set_profile(False)
        runs.append(rep)
    if stat == "best":  # the repetition with the fastest Python call, all its parts (a consistent set)
        out = {k: 1e6 * v for k, v in min(runs, key=lambda r: r["python"]).items()}
    else:
        out = {k: 1e6 * statistics.median(r[k] for r in runs) for k in runs[0]}
    out["python_wrapper"] = out["python"] - out["cython"]
    out["cython_wrapper"] = out["cython"] - out["c_total_direct"]
    out["python_spread"] = [1e6 * min(r["python"] for r in runs), 1e6 * max(r["python"] for r in runs)]
    return out


def table(res: dict) -> str:
    ns = sorted(res["rows"], key=int)
    col = lambda key, fmt="{:.1f}": " | ".join(fmt.format(res["rows"][n][key]) for n in ns)
    lines = ["| part (µs per forward) | " + " | ".join(f"N={n}" for n in ns) + " |",
             "|---|" + "---|" * len(ns)]
    for k in res["rows"][ns[0]]:  # the engine's parts, in its order (the order of a layer)
        if k not in WRAPPER_KEYS:
            lines.append(f"| {k} | {col(k)} |")
    lines.append(f"| C total (profiled) | {col('total')} |")
    lines.append(f"| cython wrapper | {col('cython_wrapper')} |")
    lines.append(f"| python wrapper (Engine.forward checks) | {col('python_wrapper')} |")
    lines.append(f"| **ms per forward (Engine.forward, profiling off)** | "
                 + " | ".join(f"**{res['rows'][n]['python'] / 1e3:.3f}**" for n in ns) + " |")
    lines.append(f"| x the 1-row forward | " + " | ".join(
        f"{res['rows'][n]['python'] / res['rows'][ns[0]]['python']:.2f}" for n in ns) + " |")
    lines.append(f"| GMAC/s | {col('gmac_s')} |")
    lines.append(f"| % of the int8 ceiling ({res['ceiling_gmac_s']:.0f} GMAC/s) | {col('ceiling_pct', '{:.0f}%')} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default=None)
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--pos", type=int, default=None, help="position of the block (default 128, or less if the "
                                                          "context is short)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--stat", choices=("median", "best"), default="median",
                    help="median over the repetitions (default), or the fastest repetition with all its parts: "
                         "the better estimate of a quiet machine's figures when other jobs share the CPU")
    ap.add_argument("--attention", choices=("block", "causal"), default="block",
                    help="the forwards' attention pattern (default: block, blocks of 32)")
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def run_header(eng, src: str, cfg: dict, pos: int, args) -> dict:
    """The run's record before any figure: when, which commit, CPU, model, engine settings, the load."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M UTC"),
            "commit": subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip(),
            "cpu": re.search(r"Model name:\s*(.+)", subprocess.run(["lscpu"], capture_output=True, text=True).stdout)
            .group(1).strip(), "model": os.path.abspath(eng.file.path) if hasattr(eng.file, "path") else src,
            "config": cfg, "isa": eng.isa, "threads": eng.threads, "lm_head": eng.lm_head, "kv": eng.kv,
            "pos": pos, "attention": args.attention, "repeats": args.repeats, "iters": args.iters, "stat": args.stat,
            "load_average": os.getloadavg(), "macs_per_row": macs_per_row(cfg), "rows": {},
            "ceiling_tool": ceiling_tool(eng.isa)}


def main(argv=None) -> int:
    args = parse_args(argv)
    import bitnet_app

    src = args.model
    if src == "demo":
        src = os.path.join(REPO, "assets", "demo-model")
    model = bitnet_app.load_model(src, threads=args.threads, isa=args.isa)
    eng = model.engine
    cfg = {k: int(v) for k, v in eng.file.config.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
           and k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size")}
    ns = [int(n) for n in args.rows.split(",")]
    pos = args.pos if args.pos is not None else min(128, (eng.ctx - max(ns)) // BLOCK * BLOCK)
    if pos < 0 or pos + max(ns) > eng.ctx:
        raise SystemExit(f"the context ({eng.ctx}) is too short for {max(ns)} rows at position {pos}")
    ids = np.random.default_rng(0).integers(0, eng.vocab_size, size=pos + max(ns))
    if pos:
        eng.forward(ids[:pos], start=0, commit=True)
    res = run_header(eng, src, cfg, pos, args)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_ceiling(ceiling_tool(eng.isa), tmp)
        ceil = [run_ceiling(exe, args.threads) for _ in range(3)]
        for n in ns:
            res["rows"][n] = measure(eng, ids, pos, n, args.repeats, args.iters, args.stat, args.attention)
        ceil += [run_ceiling(exe, args.threads) for _ in range(3)]
    res["ceiling_runs_gmac_s"] = ceil
    res["ceiling_gmac_s"] = max(ceil)
    for n, r in res["rows"].items():
        r["gmac_s"] = macs_of_forward(cfg, n) / (r["python"] * 1e-6) / 1e9
        r["ceiling_pct"] = 100 * r["gmac_s"] / res["ceiling_gmac_s"]
    print(f"{res['cpu']}, {res['threads']} threads, isa {res['isa']}, lm_head {res['lm_head']}, kv {res['kv']}; "
          f"{res['date']}, commit {res['commit']}")
    print(f"model {cfg}; N rows at position {pos}, {args.attention} attention, logits of 1 row; "
          f"{args.stat} of {args.repeats} x "
          f"{args.iters} forwards; int8 ceiling ({res['ceiling_tool']}) {ceil} GMAC/s (3 before, 3 after); load average "
          f"{res['load_average'][0]:.1f}")
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
