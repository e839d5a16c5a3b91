"""Pausing the background training job for a timing (SIGSTOP / SIGCONT), safely: the benchmarks that time on a
machine the training shares (forward_breakdown --pause-training, vs_bitnet_cpp) use this one mechanism.

    with TrainingPause(training_pid()):   # training_pid(): None when there is nothing to pause
        ...                               # timed work

The job is resumed on the way out of the block (also on an exception; install raise_on_signal for SIGTERM/SIGHUP
so those unwind through it too), and by a detached watchdog after WATCHDOG_S seconds if this process dies
without doing so (SIGKILL).
"""
import os
import signal
import subprocess

TRAIN_PID_FILE = "/tmp/demo-train.pid"
WATCHDOG_S = 100  # a pause never outlives this, even if the pausing script is killed with SIGKILL


def training_pid() -> int | None:
    """The pid in TRAIN_PID_FILE if it names a running process that is not already stopped (by someone else,
    who will resume it: we leave it alone then), else None."""
    try:
        with open(TRAIN_PID_FILE) as f:
            pid = int(f.read().split()[0])
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return pid if state not in ("T", "t", "Z", "X") else None


class TrainingPause:
    """`with TrainingPause(pid):` stops the process for the block and resumes it after; a detached watchdog
    resumes it after WATCHDOG_S seconds if this process dies without doing so. pid None: does nothing."""

    def __init__(self, pid: int | None):
        self.pid, self.watchdog = pid, None

    def __enter__(self):
        if self.pid is not None:
            self.watchdog = subprocess.Popen(["sh", "-c", f"sleep {WATCHDOG_S}; kill -CONT {self.pid}"],
                                             start_new_session=True, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)
            os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            os.killpg(self.watchdog.pid, signal.SIGTERM)  # its own session: the sh and its sleep
            self.watchdog.wait()
        return False


def raise_on_signal(signum, _frame):
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through every `with TrainingPause` (resumes)
