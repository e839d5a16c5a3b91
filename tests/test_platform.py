"""bitnet_app/platform.py: the OS readings and actions, on this system and through each fallback (another OS, a
missing /proc file or call), and the C side's choice of kernel path by the CPU's features."""
import mmap
import os
import subprocess
import sys

import pytest

from bitnet_app import _engine, platform
from bitnet_app.engine import kernel_paths


def test_a_missing_or_odd_proc_file_reads_as_zero(tmp_path):
    assert platform._proc_kb(str(tmp_path / "absent"), "MemAvailable") == 0
    odd = tmp_path / "meminfo"
    odd.write_text("MemTotal: 100 kB\nMemAvailable: lots\n")
    assert platform._proc_kb(str(odd), "MemTotal") == 100 * 1024
    assert platform._proc_kb(str(odd), "MemAvailable") == 0


def test_cpu_features_are_read_from_x86_flags_or_aarch64_features(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse2 bmi2 fma f16c\nbugs\t\t: none\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd asimddp i8mm\nCPU part\t: 0xd40\n")
    assert platform._proc_cpu_features(str(x86)) == {"fpu", "sse2", "bmi2", "fma", "f16c"}
    assert platform._proc_cpu_features(str(arm)) == {"fp", "asimd", "asimddp", "i8mm"}
    assert platform._proc_cpu_features(str(tmp_path / "absent")) == set()


def test_peak_rss_units_differ_by_system():
    # getrusage's ru_maxrss: bytes on macOS, KiB on Linux (and the BSDs)
    assert platform.maxrss_bytes(1000, "darwin") == 1000
    assert platform.maxrss_bytes(1000, "linux") == 1000 * 1024
    assert platform.maxrss_bytes(1000, "freebsd13") == 1000 * 1024


def test_this_system_gives_its_figures():
    assert platform.total_ram() > 0
    assert platform.cpu_count() >= 1
    peak, now = platform.peak_rss(), platform.process_rss()
    assert peak > 0
    if platform.SYSTEM in ("linux", "darwin"):  # both have a call for the resident bytes now
        assert 0 < now <= 1.1 * peak
        assert 0 < platform.available_ram() <= platform.total_ram()
    if platform.SYSTEM == "linux":
        assert platform.cpu_features(), "Linux's /proc/cpuinfo lists the CPU's features"
        assert platform.performance_cores() is None  # a macOS reading


def test_another_posix_system_reads_as_unknown_not_as_an_error(monkeypatch):
    monkeypatch.setattr(platform, "SYSTEM", "plan9")
    assert platform.available_ram() == 0
    assert platform.process_rss() == 0
    assert platform.cpu_features() == set()
    assert platform._sysctl_int("hw.memsize") == 0  # sysctl is macOS's
    assert platform.total_ram() > 0  # POSIX sysconf still answers


def test_core_count_falls_back_without_an_affinity_call(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert platform.cpu_count() == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert platform.cpu_count() == 6


def test_huge_pages_and_page_release_are_advice_that_keeps_the_data(tmp_path, monkeypatch):
    path = tmp_path / "data"
    path.write_bytes(bytes(range(256)) * 64)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    platform.release_pages(m)  # the page cache keeps them: the next read faults them back
    assert m[:256] == bytes(range(256)) and m[-1] == 255
    area = mmap.mmap(-1, 1 << 21, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    platform.advise_huge_pages(area)
    area[:3] = b"abc"
    assert area[:3] == b"abc"
    assert platform.huge_pages() == hasattr(mmap, "MADV_HUGEPAGE")
    # an OS without the advice (macOS has no MADV_HUGEPAGE): nothing is asked, nothing fails
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)
    monkeypatch.delattr(mmap, "MADV_DONTNEED", raising=False)
    assert not platform.huge_pages()
    platform.advise_huge_pages(area)
    platform.release_pages(m)
    assert m[:256] == bytes(range(256))
    m.close()
    area.close()


def test_the_engine_picks_its_path_from_the_cpu_features():
    """The C dispatcher (platform.c's feature readings) and platform.cpu_features() agree: the automatic path is the
    first one, in the order of preference, whose features the CPU has (AMX also needs the OS's permission)."""
    features = platform.cpu_features()
    if not features:  # not Linux and not Apple Silicon: nothing to compare with (CI runs on Linux)
        if os.environ.get("CI"):
            pytest.fail("no CPU features read on the CI machine")
        pytest.skip("this system does not list the CPU's features")
    best = _engine.kernel_name("")
    if best == kernel_paths.AMX:
        assert kernel_paths.BY_NAME[best].cpu_flags <= features
        return
    expected = next(p.name for p in kernel_paths.PATHS
                    if not p.emulated and p.name != kernel_paths.AMX and p.cpu_flags <= features)
    assert best == expected


@pytest.mark.skipif(platform.SYSTEM != "linux", reason="VmHWM is Linux's; elsewhere peak_rss is ru_maxrss")
def test_peak_rss_is_the_programs_own_not_its_parents():
    # Linux carries ru_maxrss over fork and exec: a child of a process holding 300 MB read at least 300 MB as
    # its own peak (run_benchmarks reported 2059 MB for an engine whose peak was 783 MB). The parent here
    # holds 300 MB and starts a small child, whose peak must be its own.
    parent = ("import subprocess, sys\n"
              "held = bytearray(300 << 20)\n"
              "for i in range(0, len(held), 4096): held[i] = 1\n"
              "child = 'from bitnet_app import platform; print(platform.peak_rss())'\n"
              "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True, check=True).stdout)\n")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child_peak = int(out.stdout.split()[-1])
    assert 0 < child_peak < 200 << 20, child_peak
