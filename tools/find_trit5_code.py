"""Finds the window code of 1.6-bit tiles (_kernels/trit5_windows.c): prints its three tables as C arrays.

    pip install python-sat      # the SAT solver of step 2 (a development tool; the engine does not need it)
    python -m tools.find_trit5_code [--seed 0]

The code maps each of the 3^5 = 243 tuples of five codes (c0 .. c4 in {0, 1, 2}) to a byte q so that
    c0, c1 = PAIRS_LOW[q & 127] / 3, % 3      c2, c3 = PAIRS_HIGH[q >> 1] / 3, % 3      c4 = LAST[q without bit 2]
(every code a lookup of 7 of the 8 bits). Write q = b0 + 2m + 128 b7 (m = bits 1..6): the four bytes of one m share
PAIRS_LOW between b7 = 0 and 1, and PAIRS_HIGH between b0 = 0 and 1, so they cover a 2 x 2 block of the 9 x 9 cells
(c0 c1, c2 c3). Then
  1. a random search (simulated annealing from `seed`) gives each m its block so that every cell holds >= 3 bytes;
  2. a SAT problem gives LAST: each cell's bytes take all three values of c4, and LAST never sees bit 2.
Seed 0 gives the tables in trit5_windows.c (LAST leaving out bit 1 has no solution for it; bit 2 has one).
"""
from __future__ import annotations

import argparse
import itertools
import math
import random

CELLS = 9


def blocks(seed: int, max_moves: int = 2_000_000):
    """low[m][b0], high[m][b7] in 0..8 (the pair index c0 * 3 + c1, c2 * 3 + c3) with every cell >= 3 bytes, or None."""
    rnd = random.Random(seed)
    low = [[rnd.randrange(CELLS) for _ in range(2)] for _ in range(64)]
    high = [[rnd.randrange(CELLS) for _ in range(2)] for _ in range(64)]
    count = [[0] * CELLS for _ in range(CELLS)]
    for m in range(64):
        for a in low[m]:
            for b in high[m]:
                count[a][b] += 1

    def short(c):  # how far a cell is below three bytes
        return max(0, 3 - c)
    deficit = sum(short(c) for row in count for c in row)
    temperature = 1.0
    for _ in range(max_moves):
        if deficit == 0:
            return low, high
        m, s, side, new = rnd.randrange(64), rnd.randrange(2), rnd.randrange(2), rnd.randrange(CELLS)
        table = low if side == 0 else high
        old = table[m][s]
        if old == new:
            continue
        other = high[m] if side == 0 else low[m]
        cells_old = [(old, o) if side == 0 else (o, old) for o in other]
        cells_new = [(new, o) if side == 0 else (o, new) for o in other]
        change = 0
        for a, b in cells_old:
            change += short(count[a][b] - 1) - short(count[a][b])
            count[a][b] -= 1
        for a, b in cells_new:
            change += short(count[a][b] + 1) - short(count[a][b])
            count[a][b] += 1
        if change <= 0 or rnd.random() < math.exp(-change / temperature):
            deficit += change
            table[m][s] = new
        else:
            for a, b in cells_new:
                count[a][b] -= 1
            for a, b in cells_old:
                count[a][b] += 1
        temperature = max(0.05, temperature * 0.99999)
    return None


def last_digit(low, high, left_out: int):
    """LAST (128 entries, by q without bit left_out) so that each cell's bytes take all three values, or None."""
    from pysat.formula import IDPool
    from pysat.solvers import Cadical153
    drop = lambda q: ((q >> (left_out + 1)) << left_out) | (q & ((1 << left_out) - 1))  # noqa: E731
    cell = lambda q: (low[(q >> 1) & 63][q & 1], high[(q >> 1) & 63][q >> 7])  # noqa: E731
    pool, solver = IDPool(), Cadical153()
    var = lambda h, c: pool.id((h, c))  # noqa: E731
    for h in range(128):
        solver.add_clause([var(h, c) for c in range(3)])
        for c1, c2 in itertools.combinations(range(3), 2):
            solver.add_clause([-var(h, c1), -var(h, c2)])
    by_cell = {}
    for q in range(256):
        by_cell.setdefault(cell(q), []).append(q)
    for qs in by_cell.values():
        for c in range(3):
            solver.add_clause([var(drop(q), c) for q in qs])
    if not solver.solve():
        return None
    model = {v for v in solver.get_model() if v > 0}
    return [next(c for c in range(3) if var(h, c) in model) for h in range(128)]


def c_array(name: str, values: list[int]) -> str:
    rows = [", ".join(str(v) for v in values[i:i + 32]) for i in range(0, 128, 32)]
    return f"const uint8_t {name}[128] = {{\n    " + ",\n    ".join(rows) + "};"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    found = blocks(a.seed)
    if found is None:
        raise SystemExit(f"seed {a.seed}: no blocks found; try another seed")
    low, high = found
    last = last_digit(low, high, 2)
    if last is None:
        raise SystemExit(f"seed {a.seed}: no LAST table leaving out bit 2; try another seed")
    pairs_low = [low[w >> 1][w & 1] for w in range(128)]      # w = q & 127 = b0 + 2m
    pairs_high = [high[v & 63][v >> 6] for v in range(128)]   # v = q >> 1 = m + 64 b7
    tuples = {(pairs_low[q & 127] // 3, pairs_low[q & 127] % 3, pairs_high[q >> 1] // 3, pairs_high[q >> 1] % 3,
               last[(q & 3) | (q >> 3) << 2]) for q in range(256)}
    assert len(tuples) == 243, "every tuple has a byte"
    print(c_array("bn_trit5_pairs_low", pairs_low))
    print(c_array("bn_trit5_pairs_high", pairs_high))
    print(c_array("bn_trit5_last", last))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
