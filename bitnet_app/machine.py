"""This computer as the app reads it (nothing here changes it): its memory, the read roof a decode step runs against,
and what this process holds. Every reading of the machine the app shows lives here (the OS-specific calls behind
them are platform.py's); a figure that cannot be read is 0 (or an error for the roof, which is measured).

    read_roof_gb_s(threads)  GB/s the engine's threads reach reading memory (the C engine's roof.c; ~1 s)
    available_ram()          bytes the OS can still give (Linux MemAvailable, macOS free pages), 0 if unknown
    total_ram()              bytes of physical memory, 0 if unknown
    process_rss()            bytes this process holds resident now, 0 if unknown

The page does not import it (tests/test_layout.py): it reads these through catalog.py (what each model needs here)
and Model.info() (what the running one uses).
"""
from . import platform


def read_roof_gb_s(threads: int) -> float:
    """The read roof the engine's threads reach now (best of 1 thread and `threads`: on a busy machine a
    descheduled worker can make the shared figure lower than one thread's). MemoryError or ValueError when it cannot
    be measured."""
    from . import _engine
    return max(_engine.read_roof_gb_s(t, megabytes=128, passes=2) for t in sorted({1, max(1, threads)}))


def available_ram() -> int:
    return platform.available_ram()


def process_rss() -> int:
    return platform.process_rss()


def total_ram() -> int:
    return platform.total_ram()
