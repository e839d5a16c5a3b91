"""Download progress as plain numbers: a DownloadProgress snapshot, and the byte counter that makes them.

huggingface_hub reports bytes through a tqdm object; tqdm_class(counter) is a silent tqdm that forwards
every update to a ByteCounter, which keeps running totals and a speed over the last five seconds and
calls back with a DownloadProgress (no Streamlit here: the callback may run on a worker thread).
"""
import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable

import tqdm as _tqdm


@dataclass(frozen=True)
class DownloadProgress:
    done: int            # bytes of needed files present so far (including files already cached)
    total: int           # bytes of all needed files
    speed: float         # bytes per second over the last few seconds (0 while unknown)
    eta: float | None    # seconds left at that speed, None while unknown
    file: str            # file being fetched ("" once finished)
    files_done: int
    files_total: int

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0


class ByteCounter:
    """Thread-safe running totals; turns byte counts into DownloadProgress callbacks."""

    def __init__(self, total: int, files_total: int, callback: Callable | None):
        self.total, self.files_total, self.callback = total, files_total, callback
        self.done, self.files_done, self.file = 0, 0, ""
        self._window = collections.deque()  # (time, bytes moved by this process)
        self._moved = 0
        self._lock = threading.Lock()

    def mark(self) -> None:
        """A reference point for the speed (start of a file), so the first chunk counts too."""
        with self._lock:
            self._window.append((time.monotonic(), self._moved))

    def add(self, n: int, *, moved: bool = True) -> None:
        with self._lock:
            self.done += n
            if moved:
                self._moved += n
                now = time.monotonic()
                self._window.append((now, self._moved))
                while len(self._window) > 2 and now - self._window[0][0] > 5.0:
                    self._window.popleft()
        self.report()

    def snapshot(self) -> DownloadProgress:
        with self._lock:
            now = time.monotonic()
            while len(self._window) > 1 and now - self._window[0][0] > 5.0:
                self._window.popleft()  # a stalled download shows its speed falling to 0
            speed = 0.0
            if len(self._window) >= 2:
                t0, b0 = self._window[0]
                speed = (self._window[-1][1] - b0) / (now - t0) if now - t0 >= 0.2 else 0.0
            left = max(0, self.total - self.done)
            eta = left / speed if speed > 0 else (0.0 if left == 0 else None)
            return DownloadProgress(self.done, self.total, speed, eta, self.file, self.files_done, self.files_total)

    def report(self) -> None:
        if self.callback is not None:
            self.callback(self.snapshot())


def tqdm_class(counter: ByteCounter):
    """A silent tqdm that forwards every byte update to `counter` (huggingface_hub calls update(n))."""

    class ByteTqdm(_tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            kwargs.pop("name", None)
            initial = int(kwargs.get("initial") or 0)
            super().__init__(*args, **kwargs)
            if initial:  # bytes already on disk from an earlier attempt
                counter.add(initial, moved=False)

        def update(self, n=1):
            counter.add(int(n or 0))
            return super().update(n)

    return ByteTqdm
