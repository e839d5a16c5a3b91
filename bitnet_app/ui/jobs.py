"""Long work (download, conversion) on a background thread that the page polls.

The worker never touches Streamlit: it stores the latest progress value, and the script thread redraws
from it a few times per second. Jobs live in this module (one per key, shared by reruns and tabs), so a
rerun while a download runs re-attaches to it instead of starting a second one.
"""
import threading
import traceback

_jobs: dict[str, "Job"] = {}
_lock = threading.Lock()


class Job:
    def __init__(self, key: str, fn):
        self.key = key
        self.progress = None      # the latest value handed to report()
        self.result = None
        self.error: BaseException | None = None
        self.trace = ""
        self._thread = threading.Thread(target=self._run, args=(fn,), name=f"job:{key}", daemon=True)

    def _run(self, fn):
        try:
            self.result = fn(self.report)
        except BaseException as exc:  # noqa: BLE001 - handed to the page, which explains it
            self.error = exc
            self.trace = traceback.format_exc()

    def report(self, *value):
        self.progress = value[0] if len(value) == 1 else value

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, seconds: float) -> bool:
        self._thread.join(seconds)
        return not self._thread.is_alive()


def run(key: str, fn) -> Job:
    """The job for `key`: the running or finished one (a failure stays until forget()), or a new one."""
    with _lock:
        job = _jobs.get(key)
        if job is None:
            job = _jobs[key] = Job(key, fn)
            job._thread.start()
        return job


def failed(key: str) -> Job | None:
    """The finished, failed job for `key` (kept until forget / forget_failed), or None."""
    with _lock:
        job = _jobs.get(key)
        return job if job is not None and not job.running and job.error is not None else None


def forget(key: str) -> None:
    with _lock:
        job = _jobs.get(key)
        if job is not None and not job.running:
            del _jobs[key]


def forget_failed() -> None:
    """Drop every finished job that failed, so the next run tries again (the Retry button)."""
    with _lock:
        for key in [k for k, j in _jobs.items() if j.error is not None and not j.running]:
            del _jobs[key]
