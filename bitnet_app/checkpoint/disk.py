"""Free disk space, checked before a download or a conversion writes gigabytes."""
import errno
import os
import shutil

from ..units import format_bytes


class DiskFull(OSError):
    """Not enough free space for what is about to be written; `.kind` as the Hub errors have it."""
    kind = "disk_full"

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


def free_bytes(path: str) -> int:
    """Free space of the file system that holds `path` (or its nearest existing parent)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return shutil.disk_usage(path).free


def ensure_free_space(path: str, needed: int, what: str) -> None:
    free = free_bytes(path)
    if free < needed:
        raise DiskFull(f"Not enough disk space for {what}: it needs {format_bytes(needed)} but only "
                       f"{format_bytes(free)} is free at {path}. Free some space (or set HF_HUB_CACHE "
                       "to a bigger disk) and try again.")
