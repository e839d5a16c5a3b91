"""The weights a forward streams, copied into memory backed by transparent huge pages.

A decode step reads every ternary tile and the whole head once. Read from the engine file's mmap (the page
cache: 4 KB pages) that stream walks a new page every 4 KB and misses the TLB; from 2 MB pages it rarely does.
So decode runs faster, and the read roof itself is higher with 2 MB pages (benchmarks/ceilings/readbw.c measures
both; the figures are in benchmarks/HISTORY.md).

What it costs: the copied bytes in RAM next to the file's page cache (which the OS may drop), and one read of
them when the engine opens (~0.3 s per GB from the page cache). They are read from the file (not copied from
its mmap), so the file's pages are not also counted in the process's resident set.

    streamed_names(tensors, lm_head) -> the tensors a forward reads whole (not the embedding, read a row a token)
    resident_tensors(ef, names, trit5_windows)
                                     -> {name: array}, read from the engine file into one anonymous mapping
                                        advised for huge pages (1.6-bit tiles translated when trit5_windows)
    shared_resident(ef, names, trit5_windows)
                                     -> a Resident holding those arrays, shared by every engine of the same file
                                        (and tile code) in this process (the app's Compare view opens a second
                                        engine: one copy)
    translate_trit5_tiles(tensors, names)
                                     -> a 1.6-bit file's ternary tiles, in place, in the window code that the
                                        AVX-512 kernels with VBMI and GFNI read (_kernels/trit5_windows.c)

Where the OS has no huge-page advice (platform.huge_pages(): not Linux) nothing is copied and the engine reads the mmap as before.
BITNET_WEIGHTS=mapped also keeps the mmap (for measuring the difference).
"""
import mmap
import os
import threading
import weakref

import numpy as np

from .. import platform

WEIGHTS_ENV = "BITNET_WEIGHTS"   # "resident" (default) or "mapped"
ALIGN = 64                       # every copy starts on a cache line, like the tensors in the file


def streamed_names(tensors: dict, lm_head: str) -> list[str]:
    """Names of the tensors one forward reads whole: every layer's tiles, scales and norms, the final norm, and
    the head the engine uses ("head.*" for the int8 head; the bf16 lm_head, or the tied embedding, when exact)."""
    names = [n for n in tensors if n not in ("embed", "lm_head")]
    if lm_head == "exact":
        names.append("lm_head" if "lm_head" in tensors else "embed")
    return names


def huge_pages_available() -> bool:
    return platform.huge_pages() and os.environ.get(WEIGHTS_ENV, "resident") != "mapped"


def translate_trit5_tiles(tensors: dict, names: list[str]) -> None:
    """The 1.6-bit ternary tiles among `names` (writable arrays of `tensors`) translated in place into the window
    code that the AVX-512 kernels with VBMI and GFNI read (_kernels/trit5_windows.c)."""
    from .. import _engine
    for name in names:
        if name.endswith(".codes"):
            _engine.translate_trit5(tensors[name].reshape(-1))


def resident_tensors(ef, names: list[str], trit5_windows: bool = False) -> dict[str, np.ndarray]:
    """The tensors `names` of EngineFile `ef` (same dtypes and shapes as ef.tensors) read from its file into one
    private anonymous mapping, each at a multiple of ALIGN bytes; the mapping lives as long as any array does.
    trit5_windows: a 1.6-bit file's ternary tiles translated into the window code (translate_trit5_tiles)."""
    offsets, total = {}, 0
    for name in names:
        offsets[name] = total
        total += -(-ef.tensors[name].nbytes // ALIGN) * ALIGN
    if total == 0:
        return {}
    area = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    platform.advise_huge_pages(area)   # advice only: without huge pages the copy still works
    buf = np.frombuffer(area, dtype=np.uint8)
    out = {}
    with open(ef.path, "rb", buffering=0) as f:
        for name in names:
            src, entry = ef.tensors[name], ef.meta["tensors"][name]
            dst = buf[offsets[name]:offsets[name] + src.nbytes]
            f.seek(entry["offset"])
            got = f.readinto(memoryview(dst))
            while got < src.nbytes:   # a read may return less than asked (files over 2 GB, signals)
                more = f.readinto(memoryview(dst)[got:])
                if not more:
                    raise OSError(f"{ef.path} ended while reading {name}: the file changed after it was opened")
                got += more
            out[name] = dst.view(src.dtype).reshape(src.shape)
            if trit5_windows:  # each tensor as soon as it is read, while its last megabytes are still in cache
                translate_trit5_tiles(out, [name])
    return out


class Resident:
    """The resident arrays of one engine file; engines keep this object, and the copy lives while one does."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays


_shared = weakref.WeakValueDictionary()   # (file identity, names, tile code) -> Resident
_shared_lock = threading.Lock()


def shared_resident(ef, names: list[str], trit5_windows: bool = False) -> Resident:
    """resident_tensors(ef, names, trit5_windows), made once per file, set of names and tile code while any engine
    still holds it. The file is told apart by device, inode, size and modification time, so a file converted again
    gets a new copy."""
    st = os.stat(ef.path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, tuple(names), trit5_windows)
    with _shared_lock:
        held = _shared.get(key)
        if held is None:
            held = Resident(resident_tensors(ef, names, trit5_windows))
            _shared[key] = held
        return held
