"""Everything of the Python side that depends on the operating system: one function per reading or action, each with
a path for Linux, for macOS and for other POSIX systems (where a figure that has no portable call is 0 or None, and
an action that has none does nothing). No other module of the package reads /proc, calls sysctl or asks for a
Linux-only mmap advice (tests/test_layout.py checks it); _kernels/platform.c is the C side's counterpart.

    SYSTEM                 "linux", "darwin" or another sys.platform-like name
    cpu_features()         the CPU's feature names as Linux's /proc/cpuinfo spells them: x86 "flags" (avx2,
                           avx512_vnni ...) or aarch64 "Features" (asimd, asimddp, i8mm); on macOS from sysctl
                           (hw.optional.arm.FEAT_DotProd -> asimddp, FEAT_I8MM -> i8mm); empty if unknown
    cpu_count()            the CPUs this process may run on (Linux: its affinity mask), at least 1
    performance_cores()    macOS: the performance cores (hw.perflevel0.physicalcpu); None elsewhere
    total_ram()            bytes of physical memory, 0 if unknown
    available_ram()        bytes the OS can still give (Linux MemAvailable; macOS free + speculative + inactive pages),
                           0 if unknown
    process_rss()          bytes this process holds resident now (Linux VmRSS; macOS task_info), 0 if unknown
    peak_rss()             the most bytes this process has held resident (Linux: VmHWM, of this program alone;
                           elsewhere ru_maxrss: KiB on the BSDs, bytes on macOS)
    huge_pages()           whether anonymous memory can be advised onto huge pages (Linux MADV_HUGEPAGE)
    advise_huge_pages(m)   that advice for the mmap m (nothing where there are none)
    release_pages(m)       drops the pages of the read-only file mapping m from this process (MADV_DONTNEED; the OS
                           keeps them in its page cache); nothing where the OS has no such advice
"""
import ctypes
import ctypes.util
import mmap
import os
import sys

SYSTEM = sys.platform if sys.platform != "linux2" else "linux"


def _proc_kb(path: str, key: str) -> int:
    """The `key:` line of a Linux /proc file in kB, as bytes; 0 where there is none (another OS, an odd line)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _proc_cpu_features(path: str = "/proc/cpuinfo") -> set:
    """The first "flags" (x86) or "Features" (aarch64) line of a Linux /proc/cpuinfo, as a set; empty if none."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("flags", "Features") and ":" in line:
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_libc = None


def _sysctl_int(name: str) -> int:
    """macOS: an integer sysctl by name (hw.memsize, hw.optional.arm.FEAT_DotProd ...); 0 if unknown or not macOS."""
    global _libc
    if SYSTEM != "darwin":
        return 0
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        value, size = ctypes.c_int64(0), ctypes.c_size_t(8)
        if _libc.sysctlbyname(name.encode(), ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
            return 0
        return value.value if size.value == 8 else ctypes.c_int32(value.value & 0xFFFFFFFF).value
    except (OSError, AttributeError, TypeError):
        return 0


def cpu_features() -> set:
    if SYSTEM == "linux":
        return _proc_cpu_features()
    if SYSTEM == "darwin" and os.uname().machine == "arm64":
        out = {"asimd"}   # every Apple Silicon core
        if _sysctl_int("hw.optional.arm.FEAT_DotProd"):
            out.add("asimddp")
        if _sysctl_int("hw.optional.arm.FEAT_I8MM"):
            out.add("i8mm")
        return out
    return set()


def cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):   # Linux: the CPUs this process may use (containers, taskset)
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def performance_cores():
    n = _sysctl_int("hw.perflevel0.physicalcpu")
    return n if n > 0 else None


def total_ram() -> int:
    if SYSTEM == "darwin":
        return max(0, _sysctl_int("hw.memsize"))
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def available_ram() -> int:
    if SYSTEM == "linux":
        return _proc_kb("/proc/meminfo", "MemAvailable")
    if SYSTEM == "darwin":
        pages = sum(max(0, _sysctl_int(f"vm.page_{kind}_count")) for kind in ("free", "speculative", "inactive"))
        return pages * mmap.PAGESIZE
    return 0


class _MachTaskBasicInfo(ctypes.Structure):   # <mach/task_info.h> struct mach_task_basic_info
    _fields_ = [("virtual_size", ctypes.c_uint64), ("resident_size", ctypes.c_uint64),
                ("resident_size_max", ctypes.c_uint64), ("user_time", ctypes.c_int32 * 2),
                ("system_time", ctypes.c_int32 * 2), ("policy", ctypes.c_int32), ("suspend_count", ctypes.c_int32)]


def _darwin_rss() -> int:
    """macOS: task_info(mach_task_self(), MACH_TASK_BASIC_INFO).resident_size; 0 if the call fails."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        info = _MachTaskBasicInfo()
        count = ctypes.c_uint32(ctypes.sizeof(info) // 4)
        task = ctypes.c_uint32.in_dll(libc, "mach_task_self_")
        if libc.task_info(task, 20, ctypes.byref(info), ctypes.byref(count)) != 0:   # 20: MACH_TASK_BASIC_INFO
            return 0
        return int(info.resident_size)
    except (OSError, AttributeError, ValueError, TypeError):
        return 0


def process_rss() -> int:
    if SYSTEM == "linux":
        return _proc_kb("/proc/self/status", "VmRSS")
    if SYSTEM == "darwin":
        return _darwin_rss()
    return 0


def maxrss_bytes(ru_maxrss: int, system: str = SYSTEM) -> int:
    """getrusage's ru_maxrss in bytes: macOS gives bytes, Linux and the BSDs KiB."""
    return int(ru_maxrss) if system == "darwin" else int(ru_maxrss) * 1024


def peak_rss() -> int:
    if SYSTEM == "linux":
        # Not ru_maxrss: Linux carries it over fork and exec, so a child started by a process holding 2 GB
        # reports at least 2 GB (run_benchmarks' children read 2059 MB for an engine whose peak is 783 MB).
        # VmHWM belongs to this program's own address space.
        hwm = _proc_kb("/proc/self/status", "VmHWM")
        if hwm:
            return hwm
    try:
        import resource
    except ImportError:   # not POSIX
        return 0
    return maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def huge_pages() -> bool:
    return hasattr(mmap, "MADV_HUGEPAGE")


def advise_huge_pages(m: mmap.mmap) -> None:
    if huge_pages():
        m.madvise(mmap.MADV_HUGEPAGE)   # advice only: where refused, the pages stay small


def release_pages(m: mmap.mmap) -> None:
    if hasattr(mmap, "MADV_DONTNEED"):
        m.madvise(mmap.MADV_DONTNEED)
