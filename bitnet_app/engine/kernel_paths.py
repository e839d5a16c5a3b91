"""The engine's kernel paths: one name per path, with its label for people. The one list of them on the Python side:
the CLI's --isa, the page's "Kernel path", the benchmarks and the tests read it; the C engine knows the same names in
the same order (_kernels/dispatch.c PATHS, bitnet_app._engine.kernel_paths(); tests/test_kernels.py checks both).

A name is what BITNET_ISA, `bench --isa` and Engine(isa=...) take to force a path, and what Engine.isa reports.

    PATHS              every path, in the dispatcher's order of preference: the automatic choice is the first one
                       the CPU supports, the emulated ones (for the tests) excepted
    BY_NAME[name]      its KernelPath
    names()            every name (emulated=False: the paths a CPU can be given by itself)
    label(name)        its words for people ("AVX512-VNNI")
    supported()        the names of the paths this CPU (and this build) can run
    preferred_packing()  the ternary tiles' layout this CPU's automatic path decodes fastest (what the converter
                       writes unless told: engine/packing.py packing_for)
"""
from dataclasses import dataclass

AMX = "amx"
AVX512 = "avx512"
AVXVNNI = "avxvnni"
AVX2 = "avx2"
NEON_I8MM = "neon-i8mm"
NEON_DOTPROD = "neon-dotprod"
NEON = "neon"
PORTABLE = "portable"
AVXVNNI_EMULATED = "avxvnni-emulated"
AMX_EMULATED = "amx-emulated"

_AVX2_FLAGS = frozenset({"avx2", "fma", "f16c"})
_AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"})
# aarch64: the "Features" of Linux's /proc/cpuinfo (macOS: hw.optional.arm.FEAT_DotProd / FEAT_I8MM, platform.py)
_NEON_FLAGS = frozenset({"asimd"})


@dataclass(frozen=True)
class KernelPath:
    name: str
    label: str
    cpu_flags: frozenset   # the /proc/cpuinfo flags (x86) or Features (aarch64) it needs (Linux lists AMX's only when
    #                        it saves the tile state)
    emulated: bool = False  # another path's code with its special instructions written in AVX2 or plain C: the
    #                         tests' way to run that code on every AVX2 CPU; never the automatic choice
    simd: bool = True       # False: plain C, the path of CPUs without AVX2 (correct, but slow)
    # True: it decodes 1.6-bit tiles (5 codes a byte) for about the compute of 2-bit ones, so their fewer bytes make
    # decode faster (two vpdpbusd per digit, no codes formed: kernels_avx512.c). The AVX2 decode forms each code with
    # compares, ~1.8x the 2-bit kernel's work (slower where decode is not bound by memory alone), so CPUs whose best
    # path is AVX2 or plain C get 2-bit tiles. The NEON paths likewise: a 1.6-bit digit costs a multiply, two compares
    # and two subtractions before its sdot, ~3x the 2-bit group's instructions (_kernels/kernels_neon.h).
    trit_tiles: bool = False


PATHS = (
    KernelPath(AMX, "AMX + AVX512-VNNI", _AVX512_FLAGS | {"amx_tile", "amx_int8"}, trit_tiles=True),
    KernelPath(AVX512, "AVX512-VNNI", _AVX512_FLAGS, trit_tiles=True),
    KernelPath(AVXVNNI, "AVX-VNNI", _AVX2_FLAGS | {"avx_vnni"}, trit_tiles=True),
    KernelPath(AVX2, "AVX2", _AVX2_FLAGS),
    KernelPath(NEON_I8MM, "NEON + i8mm (ARMv8.6)", _NEON_FLAGS | {"asimddp", "i8mm"}),
    KernelPath(NEON_DOTPROD, "NEON + dot product (ARMv8.2)", _NEON_FLAGS | {"asimddp"}),
    KernelPath(NEON, "NEON (ARMv8.0)", _NEON_FLAGS),
    KernelPath(PORTABLE, "portable C", frozenset(), simd=False),
    KernelPath(AVXVNNI_EMULATED, "AVX-VNNI (emulated in AVX2)", _AVX2_FLAGS, emulated=True),
    KernelPath(AMX_EMULATED, "AMX (emulated in C)", _AVX2_FLAGS, emulated=True),
)
BY_NAME = {p.name: p for p in PATHS}


def names(emulated: bool = True) -> tuple[str, ...]:
    return tuple(p.name for p in PATHS if emulated or not p.emulated)


def label(name: str) -> str:
    return BY_NAME[name].label


def supported(emulated: bool = True) -> list[str]:
    """The names of the paths this CPU and this build can run, in PATHS order (the compiled engine says)."""
    from .. import _engine

    out = []
    for name in names(emulated):
        try:
            _engine.kernel_name(name)
            out.append(name)
        except ValueError:
            pass
    return out


def preferred_packing() -> str:
    """"1.6bit" when the path this CPU runs by itself has trit_tiles, else "2bit" (packing.PACKINGS)."""
    from .. import _engine

    return "1.6bit" if BY_NAME[_engine.kernel_name("")].trit_tiles else "2bit"
