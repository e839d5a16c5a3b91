"""Builds the C engine (_kernels/) into the extension bitnet_app._engine (engine.pyx), and the same C code with the
kernels' entry points for the tests into bitnet_app._engine_testing (engine_testing.pyx).

The target is the compiler's (`CC -dumpmachine`: a cross compiler builds for its target, whatever the host), and each
kernel file is compiled with its own instruction-set flags, the best path being chosen at run time:
  x86-64   kernels_avx2.c with AVX2+FMA, kernels_avx512.c with AVX512-VNNI, kernels_avxvnni.c and kernels_amx.c with
           AVX-VNNI and AMX where the compiler knows them: one build runs on any x86-64 CPU
  aarch64  kernels_neon.c and kernels_neon_attention.c for ARMv8.0, kernels_neon_dotprod.c with the dot product
           (ARMv8.2), kernels_neon_i8mm.c with i8mm (ARMv8.6) where the compiler knows them (gcc and clang, Apple's
           included: the same -march spelling)
  others   the portable C path
No OpenMP: the engine has its own pthread pool.
"""
import os
import platform
import shutil
import subprocess
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from distutils.errors import CCompilerError, CompileError, DistutilsExecError  # noqa: E402 (setuptools' copy)

KERNELS = "_kernels"
COMMON = ["-O3", "-std=gnu11", "-pthread", "-fno-math-errno", "-Wall", "-Wno-unknown-pragmas"]
COMMON += os.environ.get("BITNET_CFLAGS", "").split()  # development knob, e.g. BITNET_CFLAGS=-march=native
ISA_FLAGS = {
    "kernels_avx2.c": ["-mavx2", "-mfma", "-mf16c"],
    "kernels_avx2_vector.c": ["-mavx2", "-mfma", "-mf16c"],
    "kernels_x86_attention.c": ["-mavx2", "-mfma", "-mf16c"],
    "kernels_x86_sampler.c": ["-mavx2", "-mfma", "-mf16c"],
    "kernels_avx512.c": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"],
    "kernels_avx512_vector.c": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"],
    "kernels_avxvnni.c": ["-mavx2", "-mfma", "-mf16c", "-mavxvnni"],   # gcc >= 11, clang >= 12
    "kernels_avxvnni_emulated.c": ["-mavx2", "-mfma", "-mf16c"],
    "kernels_amx.c": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mamx-tile", "-mamx-int8"],  # gcc >= 11
    "kernels_amx_emulated.c": ["-mavx2", "-mfma", "-mf16c"],
}
AVXVNNI = "kernels_avxvnni.c"
AMX = "kernels_amx.c"
# ARM: the baseline file needs no flag (ASIMD is in every aarch64 CPU); the other two are only called after the
# run-time check (platform.c) says the CPU has the feature.
ARM_FLAGS = {
    "kernels_neon.c": [],
    "kernels_neon_attention.c": [],
    "kernels_neon_dotprod.c": ["-march=armv8.2-a+dotprod"],
    "kernels_neon_i8mm.c": ["-march=armv8.6-a+dotprod+i8mm"],
}
ARM_MACRO_IF_MISSING = {"kernels_neon_dotprod.c": "BN_NO_NEON_DOTPROD", "kernels_neon_i8mm.c": "BN_NO_NEON_I8MM"}
# Off x86 the C compilers fuse a * b + c into one rounding (FMA) by default (gcc's -ffp-contract=fast): off, so that
# every file rounds as the x86 build's plain C does and the portable path gives the same numbers on both.
NO_CONTRACT = ["-ffp-contract=off"]
GENERIC = ["engine_api.c", "schedule.c", "forward.c", "layer.c", "pool.c", "dispatch.c", "kernels_portable.c",
           "roof.c", "greedy.c", "sample.c", "rows_job.c", "tiles5.c", "thread_buffer.c", "trit5_windows.c",
           "kernels_fallback.c", "platform.c"]
# macOS: a universal2 Python (python.org's installer) compiles for arm64 and x86_64 at once unless ARCHFLAGS says
# otherwise, and each kernel file is for one architecture: build for this Mac's (setuptools reads ARCHFLAGS).
if sys.platform == "darwin" and "ARCHFLAGS" not in os.environ:
    os.environ["ARCHFLAGS"] = "-arch " + platform.machine()
NO_COMPILER = ("A C compiler is needed to build the BitNet engine. Install one (Debian/Ubuntu: "
               "`apt-get install gcc`, Fedora: `dnf install gcc`, macOS: `xcode-select --install`) and retry.")


class BuildEngine(build_ext):
    """Compiles the engine's C files (each with its flags) once and links them into each Cython module."""

    def build_extension(self, ext):
        if not hasattr(self, "_engine_objects"):
            self._engine_objects = self._compile_engine()
        ext.extra_objects = self._engine_objects
        super().build_extension(ext)

    def _compile_engine(self) -> list:
        """Every C file of the engine compiled with its flags (the ISA files with theirs); the object files."""
        cc = self.compiler.compiler_so[0] if getattr(self.compiler, "compiler_so", None) else None
        if cc and not shutil.which(cc):
            sys.exit(f"error: compiler '{cc}' not found. {NO_COMPILER}")
        target = self._target(cc)
        macros, isa_files, common = [], {}, list(COMMON)
        if target == "x86":
            macros.append(("BN_HAVE_X86", "1"))
            isa_files = dict(ISA_FLAGS)
            if not self._compiles_with(ISA_FLAGS[AVXVNNI]):  # an older compiler: no AVX-VNNI path
                del isa_files[AVXVNNI]
                macros.append(("BN_NO_AVXVNNI", "1"))
            if not self._compiles_with(ISA_FLAGS[AMX]):  # an older compiler: no AMX path
                del isa_files[AMX]
                macros.append(("BN_NO_AMX", "1"))
        elif target == "aarch64":
            macros.append(("BN_HAVE_NEON", "1"))
            common += NO_CONTRACT
            isa_files = dict(ARM_FLAGS)
            for name, macro in ARM_MACRO_IF_MISSING.items():
                if not self._compiles_with(ARM_FLAGS[name]):  # an older compiler: no such path
                    del isa_files[name]
                    macros.append((macro, "1"))
        else:
            common += NO_CONTRACT
        files = [(f, []) for f in GENERIC] + list(isa_files.items())
        objects = []
        try:
            for name, flags in files:
                objects += self.compiler.compile([os.path.join(KERNELS, name)], output_dir=self.build_temp,
                                                 macros=macros, include_dirs=[KERNELS],
                                                 extra_postargs=common + flags, depends=self._headers())
        except (CCompilerError, CompileError, DistutilsExecError) as exc:
            sys.exit(f"error: building the engine failed: {exc}\n{NO_COMPILER if 'not found' in str(exc) else ''}")
        return objects

    def _target(self, cc) -> str:
        """"x86", "aarch64" or "other": the CPU the compiler builds for. Asked of the compiler itself (gcc and clang:
        -dumpmachine, e.g. x86_64-linux-gnu, aarch64-linux-gnu, arm64-apple-darwin23.4.0), so that a cross build
        (setuptools' compiler from the target's sysconfig data) gets the target's flags; the host's machine where the
        compiler does not say (MSVC has no such option, and no build here)."""
        machine = ""
        if cc:
            try:
                argv = []  # the command before its first option: "gcc", "ccache gcc", "aarch64-linux-gnu-gcc"
                for word in self.compiler.compiler_so:
                    if word.startswith("-"):
                        break
                    argv.append(word)
                argv.append("-dumpmachine")
                machine = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                machine = ""
        arch = (machine.split("-")[0] if machine else platform.machine()).lower()
        if arch in ("x86_64", "amd64", "i686", "i586", "i386", "x86"):
            return "x86"
        if arch in ("aarch64", "arm64"):
            return "aarch64"
        return "other"

    def _compiles_with(self, flags) -> bool:
        """Whether the compiler accepts these flags (on an empty C file)."""
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as f:
                f.write("int bn_probe;\n")
            try:
                self.compiler.compile([src], output_dir=tmp, extra_postargs=flags)
                return True
            except (CCompilerError, CompileError, DistutilsExecError):
                return False

    @staticmethod
    def _headers():
        return [os.path.join(KERNELS, f) for f in os.listdir(KERNELS) if f.endswith(".h")]


def cython_module(name: str, pyx: str) -> Extension:
    """The extension `name` from _kernels/`pyx`, linked with the engine's C objects (BuildEngine)."""
    return Extension(
        name,
        sources=[os.path.join(KERNELS, pyx)],
        include_dirs=[KERNELS, np.get_include()],
        # every C file, header and include: the module is relinked when any changes (its objects are compiled above)
        depends=sorted(os.path.join(KERNELS, f) for f in os.listdir(KERNELS) if f.endswith((".c", ".h", ".pxi"))),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O2"],
        extra_link_args=["-pthread", "-lm"],
    )


MODULES = [cython_module("bitnet_app._engine", "engine.pyx"),                  # the product's engine
           cython_module("bitnet_app._engine_testing", "engine_testing.pyx")]  # single kernels, for the tests
setup(ext_modules=cythonize(MODULES, language_level=3, quiet=True), cmdclass={"build_ext": BuildEngine})
