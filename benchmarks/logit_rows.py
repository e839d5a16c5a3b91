"""One engine call of a 32-token block, by how many logit rows it asks for (the last layer runs on those alone).

    python -m benchmarks.logit_rows [--model demo] [--isa ISA] [--threads 2]

The block (block attention, block size 32) sits at position 128 of a random context and is not committed;
each case asks for other rows: all 32 (no trim), 7 (a denoising step's masked slots), 1 (a block commit), 8
in the tail; and one single-token call beside them. Prints the fastest of 5 x 300 calls per case, in ms. To
compare two builds run it once per build with PYTHONPATH set to each checkout, alternating (HISTORY.md,
"The last layer for the logit rows only").
"""
import argparse
import time

BLOCK, POS = 32, 128
CASES = {"32 rows, all logits": list(range(32)), "32 rows, 7 logits": [8, 9, 11, 12, 13, 14, 15],
         "32 rows, 1 logit": [31], "32 rows, 8 logits (tail split)": list(range(16, 24))}


def best_ms(call, calls: int = 300, rounds: int = 5) -> float:
    """The fastest mean time of `calls` calls, over `rounds` rounds, in ms."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e3


def main(argv=None) -> int:
    import numpy as np

    import bitnet_app

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo", help="engine file, checkpoint folder, or 'demo' (the bundled model)")
    ap.add_argument("--isa", help="force a kernel path")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)

    engine = bitnet_app.load_model(a.model, threads=a.threads, isa=a.isa).engine
    ids = np.random.default_rng(0).integers(10, engine.vocab_size, size=POS + BLOCK + 40)
    engine.forward(ids[:POS], start=0, commit=True)
    block = np.ascontiguousarray(ids[POS:POS + BLOCK], dtype=np.int32)
    for name, rows in CASES.items():
        ms = best_ms(lambda: engine.forward(block, start=POS, commit=False, attention="block", block_size=BLOCK,
                                            rows=rows))
        print(f"{name:34s} {ms:.3f} ms", flush=True)
    one = np.ascontiguousarray(ids[POS:POS + 1], dtype=np.int32)
    print(f"{'1 row':34s} {best_ms(lambda: engine.forward(one, start=POS, commit=False)):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
