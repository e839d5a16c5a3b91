"""Builds the C engine (_kernels/) into the extension bitnet_app._engine (engine.pyx), and the same C code with the
kernels' entry points for the tests into bitnet_app._engine_testing (engine_testing.pyx).

Each kernel file is compiled with its own instruction-set flags (kernels_avx2.c with AVX2+FMA,
kernels_avx512.c with AVX512-VNNI, kernels_avxvnni.c and kernels_amx.c with AVX-VNNI and AMX where the compiler
knows them) and the best path is chosen at run time, so one build runs on any x86-64 CPU; other CPUs get the portable
C path. No OpenMP: the engine has its own pthread pool.
"""
import os
import platform
import shutil
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from distutils.errors import CCompilerError, CompileError, DistutilsExecError  # noqa: E402 (setuptools' copy)

KERNELS = "_kernels"
IS_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386", "x86")
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
GENERIC = ["engine_api.c", "schedule.c", "forward.c", "layer.c", "pool.c", "dispatch.c", "kernels_portable.c", "roof.c", "greedy.c",
           "sample.c", "rows_job.c", "tiles5.c", "thread_buffer.c", "trit5_windows.c", "kernels_fallback.c"]
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
        macros = [("BN_HAVE_X86", "1")] if IS_X86 else []
        isa_files = dict(ISA_FLAGS) if IS_X86 else {}
        if IS_X86 and not self._compiles_with(ISA_FLAGS[AVXVNNI]):  # an older compiler: no AVX-VNNI path
            del isa_files[AVXVNNI]
            macros.append(("BN_NO_AVXVNNI", "1"))
        if IS_X86 and not self._compiles_with(ISA_FLAGS[AMX]):  # an older compiler: no AMX path
            del isa_files[AMX]
            macros.append(("BN_NO_AMX", "1"))
        files = [(f, []) for f in GENERIC] + list(isa_files.items())
        objects = []
        try:
            for name, flags in files:
                objects += self.compiler.compile([os.path.join(KERNELS, name)], output_dir=self.build_temp,
                                                 macros=macros, include_dirs=[KERNELS],
                                                 extra_postargs=COMMON + flags, depends=self._headers())
        except (CCompilerError, CompileError, DistutilsExecError) as exc:
            sys.exit(f"error: building the engine failed: {exc}\n{NO_COMPILER if 'not found' in str(exc) else ''}")
        return objects

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
