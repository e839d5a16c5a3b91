"""Two builds of the engine timed in alternation: the only fair comparison on a machine whose speed drifts.

    python -m benchmarks.ab_builds --build old=/tmp/old-checkout --build new=. --isa avx512,avx2 --rounds 3
    python -m benchmarks.ab_builds --build old=/tmp/old@old.bitnet --build new=.@new.bitnet --rows 1 \
        --attention causal --pos 64        # decode, each build on its own file (e.g. 2-bit format 3 vs 1.6-bit)

Each --build is a checkout whose engine is built in place (`python setup.py build_ext --inplace`; `git worktree
add /tmp/old <commit>` gives an old one beside this one). For every ISA and round, each build runs in its own
Python process (so each imports its own bitnet_app) and times Engine.forward of N rows (block attention, or causal
with --attention causal) at a fixed position on
a model (default: the bundled demo model), best of --repeats x --iters calls. The builds alternate within every
round, so a
drift of the machine (the Zen 4 guests here have fast and slow phases ~2x apart) hits both alike: compare within
a round, not across rounds. The output is one line per (ISA, round, build) and, with --json, every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bitnet_app.engine.kernel_paths import AVX2

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs inside each build's process: prints {rows: best ms} for one ISA.
TIMER = r"""
import json, sys, time
import numpy as np
import bitnet_app
model, isa, rows, pos, repeats, iters = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
pattern = dict(attention="block", block_size=32) if sys.argv[7] == "block" else dict(attention="causal")
engine = bitnet_app.load_model(model, threads=2, isa=isa).engine
ns = [int(n) for n in rows.split(",")]
ids = np.random.default_rng(0).integers(0, engine.vocab_size, size=pos + max(ns))
if pos:
    engine.forward(ids[:pos], start=0, commit=True)
best = {}
for n in ns:
    batch = np.ascontiguousarray(ids[pos:pos + n], dtype=np.int32)
    for _ in range(max(10, iters // 2)):  # warm-up
        engine.forward(batch, start=pos, commit=False, **pattern)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            engine.forward(batch, start=pos, commit=False, **pattern)
        times.append((time.perf_counter() - t) / iters)
    best[n] = 1e3 * min(times)
print(json.dumps(best))
"""


def time_build(path: str, model: str, isa: str, rows: str, pos: int, repeats: int, iters: int,
               attention: str = "block") -> dict:
    """{rows: best ms per forward} of the build at `path` (its own process, its own bitnet_app)."""
    out = subprocess.run([sys.executable, "-c", TIMER, model, isa, rows, str(pos), str(repeats), str(iters), attention],
                         cwd=path, env={**os.environ, "PYTHONPATH": os.path.abspath(path)},
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"build {path} failed on {isa}:\n{out.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="append", required=True, metavar="NAME=PATH[@MODEL]",
                    help="a checkout with its engine built in place (give two or more); @MODEL: its own model "
                         "instead of --model (an older build cannot read a newer engine file format)")
    ap.add_argument("--model", default=os.path.join(REPO, "assets", "demo-model"))
    ap.add_argument("--isa", default=AVX2, help="comma-separated kernel paths")
    ap.add_argument("--rows", default="8,16,32")
    ap.add_argument("--pos", type=int, default=128, help="position of the block (the cache holds pos tokens)")
    ap.add_argument("--attention", default="block", choices=("block", "causal"),
                    help="the forwards' attention pattern (block: 32-slot blocks)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args(argv)
    builds = []
    for spec in a.build:
        name, sep, path = spec.partition("=")
        path, _, model = path.partition("@")
        if not sep or not os.path.isdir(path):
            raise SystemExit(f"--build {spec!r}: give NAME=PATH[@MODEL] with PATH a checkout")
        builds.append((name, path, os.path.abspath(model or a.model)))
    results = []
    for isa in a.isa.split(","):
        for rnd in range(a.rounds):
            for name, path, model in builds:
                ms = time_build(path, model, isa, a.rows, a.pos, a.repeats, a.iters, a.attention)
                results.append({"isa": isa, "round": rnd, "build": name, "ms": ms})
                print(f"{isa:8s} round {rnd}  {name:10s} " + "  ".join(f"{n} rows {t:.3f} ms" for n, t in ms.items()),
                      flush=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"model": a.model, "pos": a.pos, "rows": a.rows, "attention": a.attention, "results": results},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
