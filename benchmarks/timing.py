"""The benchmarks' clock: the wall time of a piece of work, one call or a loop of calls, and the best of several
loops (a machine shared with other work only ever slows a loop down, so the fastest loop is the work's own time).

    seconds(fn)                          one call of fn()
    per_call(fn, iters)                  seconds per call over one loop of `iters` calls of fn()
    best_per_call(fn, iters, repeats)    the fastest of `repeats` such loops

Warm-up calls, rounds that interleave configurations and the unit of the figure stay with each script.
"""
import time


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def per_call(fn, iters: int = 1) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def best_per_call(fn, iters: int = 1, repeats: int = 1) -> float:
    return min(per_call(fn, iters) for _ in range(repeats))
