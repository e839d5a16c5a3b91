"""The decoders' clock: seconds of work summed over the spans a decoder times.

    work = Stopwatch()
    with work:
        logits = engine.forward(ids)   # timed
    yield Token(...)                   # never timed: a slow consumer does not change the figures
    work.seconds                       # the sum so far

One Stopwatch a figure (work, engine calls, steps); several may time the same span (`with work, engine:`).
"""
import time


class Stopwatch:
    def __init__(self):
        self.seconds = 0.0
        self._started = 0.0

    def __enter__(self):
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc_info):
        self.seconds += time.perf_counter() - self._started
        return False
