"""The ternary matmul kernels alone, 2-bit against 1.6-bit tiles, on one thread, in one process, interleaved.

    python -m benchmarks.ternary5_kernels [--isa PATH] [--tokens 1,8,32] [--layers 3] [--rounds 3]

The matrices of `--layers` layers of the 2B-4T shape (q, k, v, o, gate, up, down: 41.5 M weights a layer; three
layers are ~56 MB of tiles in all, more than the L3 here, so the weights stream from memory as in a forward), random
ternary weights and int8 activations; each figure is the best over the rounds of ms per layer, the two packings
taken in turn. Before timing, both packings' outputs are checked to be equal bit for bit. No engine, no threads, no
attention: where a forward's time goes inside the kernels (forward_breakdown and ab_builds time whole forwards).
"""
from __future__ import annotations

import argparse

import numpy as np

from bitnet_app import _engine_testing
from bitnet_app.engine import kernel_paths
from bitnet_app.engine.packing import PACKING_2BIT, PACKING_16BIT, pack_tiles
from benchmarks.timing import seconds

# (N, K) of one 2B-4T layer's ternary matrices: q, k, v, o, gate, up, down
LAYER_SHAPES = ((2560, 2560), (640, 2560), (640, 2560), (2560, 2560), (6912, 2560), (6912, 2560), (2560, 6912))


def layer_matrices(layers: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """(2-bit tiles, 1.6-bit tiles, row scales, K) of each matrix of `layers` layers."""
    rng = np.random.default_rng(seed)
    mats = []
    for _ in range(layers):
        for n, k in LAYER_SHAPES:
            w = rng.integers(-1, 2, size=(n, k), dtype=np.int8)
            mats.append((pack_tiles(w, PACKING_2BIT), pack_tiles(w, PACKING_16BIT), np.ones(n, np.float32), k))
    return mats


def time_layers(isa: str, mats, x: dict, five: bool) -> float:
    """ms per layer of one pass over the matrices, in either packing (the 1.6-bit tiles already in the bytes the
    path reads: main() translates them once, as the engine does when it loads a file)."""
    def one_pass():
        for tiles2, tiles5, scale, k in mats:
            if five:
                _engine_testing.kernel_ternary5(isa, tiles5, scale, x[k], as_read=True)
            else:
                _engine_testing.kernel_ternary(isa, tiles2, scale, x[k])
    return seconds(one_pass) * 1e3 / (len(mats) // len(LAYER_SHAPES))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", default=kernel_paths.supported()[0], help="a kernel path (default: this CPU's best)")
    ap.add_argument("--tokens", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    mats = [(t2, _engine_testing.codes_as_read(a.isa, t5), scale, k) for t2, t5, scale, k in layer_matrices(a.layers)]
    rng = np.random.default_rng(1)
    for T in (int(t) for t in a.tokens.split(",")):
        x = {k: rng.integers(-128, 128, size=(T, k), dtype=np.int8) for k in {k for _, _, _, k in mats}}
        for tiles2, tiles5, scale, k in mats[:len(LAYER_SHAPES)]:
            same = np.array_equal(_engine_testing.kernel_ternary(a.isa, tiles2, scale, x[k]).view(np.uint32),
                                  _engine_testing.kernel_ternary5(a.isa, tiles5, scale, x[k], as_read=True)
                                  .view(np.uint32))
            if not same:
                raise SystemExit(f"{a.isa}: the 1.6-bit kernel's output differs from the 2-bit one's ({T} tokens)")
        best = {False: float("inf"), True: float("inf")}
        for _ in range(a.rounds):
            for five in (False, True):
                for _ in range(3 if T > 1 else 10):
                    best[five] = min(best[five], time_layers(a.isa, mats, x, five))
        print(f"{a.isa:8s} {T:3d} tokens  2-bit {best[False]:7.3f}  1.6-bit {best[True]:7.3f} ms/layer  "
              f"1.6-bit / 2-bit {best[True] / best[False]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
