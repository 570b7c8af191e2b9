"""Build of megafuse's compiled modules.

- `megafuse._kernels`: the Python boundary (validation, one thin def per header function),
  compiled once with the baseline flags.
- `megafuse.kernels.levels.<level>`: the kernels, one module per SIMD level, each the same
  sources (`megafuse/kernels/levels/level.pxi` and the family files it includes) compiled with
  its own flags.  On x86-64: generic (baseline x86-64), avx2 (AVX2 + FMA + F16C) and avx512
  (F/BW/DQ/VL/VNNI + FMA + F16C), and on Linux amx (avx512 + AMX-TILE / AMX-INT8: its prefill
  tiles); on aarch64: generic (the portable C), neon (ARMv8.0 Advanced
  SIMD), neon_dotprod (ARMv8.2 sdot / udot) and i8mm (sdot + smmla); elsewhere only generic.
  `megafuse/kernels/simd.py` picks one at import from the CPU's features.
- `megafuse.llm._runner`: the boundary of the whole-model step (ModelRunner), compiled once with
  the baseline flags; it runs the step of the level `megafuse._kernels` has chosen.
- `megafuse._build_info`: the build configuration (flags, OpenMP, debug, levels) compiled in, for
  `megafuse.show_config()`.  It comes from a header generated in the build directory (never in the
  source tree), so it describes the binaries that are actually imported, installed or in place.

Environment switches:
  MEGAFUSE_DEBUG=1     bounds/wraparound/initialized checks on, -O0 -g (for chasing a crash)
  MEGAFUSE_NO_OPENMP=1 build without OpenMP even where the compiler has it (kernels run serially)
  MEGAFUSE_BUILD_JOBS=N compile N extension modules at once (build_ext --parallel N)
Neither native-CPU tuning (march=native) nor fast-math (online softmax relies on real
infinities): a wheel runs on any CPU of its architecture.
"""
import glob
import json
import os
import platform
import shutil
import sys
import tempfile
import textwrap

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("MEGAFUSE_DEBUG", "") not in ("", "0")
IS_X86_64 = platform.machine().lower() in ("x86_64", "amd64", "x64")
IS_MSVC = sys.platform == "win32"
IS_AARCH64 = platform.machine().lower() in ("aarch64", "arm64") and not IS_MSVC

SIMD_LEVELS = {
    "generic": [],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512vnni",
               "-mfma", "-mf16c", "-mavx2"],
}
if IS_MSVC:
    SIMD_LEVELS = {"generic": [], "avx2": ["/arch:AVX2"], "avx512": ["/arch:AVX512"]}
if IS_AARCH64:
    # MF_NEON selects the NEON bodies of the headers (Advanced SIMD is in every aarch64 build, the
    # generic level included, so the flag, not the compiler, tells the levels apart); -march
    # says which instructions each level may use.
    SIMD_LEVELS = {
        "generic": [],
        "neon": ["-march=armv8-a", "-DMF_NEON=1"],
        "neon_dotprod": ["-march=armv8.2-a+dotprod", "-DMF_NEON=1"],
        "i8mm": ["-march=armv8.2-a+dotprod+i8mm", "-DMF_NEON=1"],
    }
elif not IS_X86_64:
    SIMD_LEVELS = {"generic": []}
# amx: the avx512 level with the AMX-INT8 prefill tiles.  Linux only (the tile data state needs
# the kernel's permission, arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+), and only where the
# compiler knows the instructions (GCC 11+, clang 12+; probed below).
AMX_FLAGS = ["-mamx-tile", "-mamx-int8"]


def openmp_flags():
    """(compile, link) flags for OpenMP, or ([], []) when the compiler cannot build with it."""
    if os.environ.get("MEGAFUSE_NO_OPENMP", "") not in ("", "0"):
        return [], []
    if IS_MSVC:
        return ["/openmp"], []
    if sys.platform == "darwin":
        candidates = [(["-Xpreprocessor", "-fopenmp"], ["-lomp"])]
    else:
        candidates = [(["-fopenmp"], ["-fopenmp"])]
    from setuptools._distutils import ccompiler, sysconfig as du_sysconfig
    for cflags, lflags in candidates:
        compiler = ccompiler.new_compiler()
        du_sysconfig.customize_compiler(compiler)
        tmp = tempfile.mkdtemp()
        try:
            src = os.path.join(tmp, "omp_probe.c")
            with open(src, "w") as f:
                f.write(textwrap.dedent("""\
                    #include <omp.h>
                    int main(void) { int n = 0;
                    #pragma omp parallel reduction(+:n)
                      n += 1;
                      return omp_get_max_threads() > 0 && n > 0 ? 0 : 1; }
                    """))
            objs = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
            compiler.link_executable(objs, os.path.join(tmp, "omp_probe"), extra_postargs=lflags)
            return cflags, lflags
        except Exception:  # noqa: BLE001 -- any failure means: build without OpenMP
            continue
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print("megafuse: OpenMP not available; kernels will run on one thread", file=sys.stderr)
    return [], []


OMP_COMPILE, OMP_LINK = openmp_flags()


def compiler_accepts(flags, source):
    """Whether the C compiler compiles `source` with `flags`."""
    from setuptools._distutils import ccompiler, sysconfig as du_sysconfig
    compiler = ccompiler.new_compiler()
    du_sysconfig.customize_compiler(compiler)
    tmp = tempfile.mkdtemp()
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(source)
        compiler.compile([src], output_dir=tmp, extra_postargs=flags)
        return True
    except Exception:  # noqa: BLE001 -- any failure means: the compiler cannot
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if IS_X86_64 and not IS_MSVC and sys.platform.startswith("linux") and compiler_accepts(
        SIMD_LEVELS["avx512"] + AMX_FLAGS, textwrap.dedent("""\
            #include <immintrin.h>
            void probe(const void *cfg, void *c, const void *a, const void *b) {
                _tile_loadconfig(cfg); _tile_loadd(4, a, 64); _tile_loadd(6, b, 64);
                _tile_zero(0); _tile_dpbsud(0, 4, 6); _tile_stored(0, c, 64); _tile_release(); }
            """)):
    SIMD_LEVELS["amx"] = SIMD_LEVELS["avx512"] + AMX_FLAGS
if IS_MSVC:
    BASE_FLAGS = ["/O2"] if not DEBUG else ["/Od", "/Zi"]
else:
    # -g0 last: Python's sysconfig adds -g, which doubles each .so.
    BASE_FLAGS = (["-O0", "-g"] if DEBUG else ["-O3", "-g0"]) + [
        "-ffp-contract=off",  # no silent a*b+c fusion: exact dequantization, same bits per level
        "-fno-math-errno", "-Wno-unused-function", "-Wno-unreachable-code"]
BUILD_CONFIG = {
    "compile_flags": " ".join(BASE_FLAGS),
    "simd_flags": {level: " ".join(flags) for level, flags in SIMD_LEVELS.items()},
    "openmp": bool(OMP_COMPILE),
    "debug": DEBUG,
    "simd_levels": list(SIMD_LEVELS),
}
INCLUDE_DIRS = [os.path.join("include"), numpy.get_include()]
MACROS = [("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")]

# headers and Cython includes: a change to any of them rebuilds the modules (build_ext compares
# times of the generated C file's sources, so these are listed by hand)
DEPENDS = sorted(os.path.relpath(p, HERE) for p in
                 glob.glob(os.path.join(HERE, "include", "megafuse", "*.h"))
                 + glob.glob(os.path.join(HERE, "megafuse", "**", "*.pxi"), recursive=True)
                 + glob.glob(os.path.join(HERE, "megafuse", "**", "*.pxd"), recursive=True))

extensions = [
    Extension(
        "megafuse._kernels",
        ["megafuse/_kernels.pyx"],
        depends=DEPENDS,
        include_dirs=INCLUDE_DIRS,
        define_macros=MACROS,
        extra_compile_args=BASE_FLAGS,
    )
]
extensions.append(Extension(
    "megafuse.llm._runner",
    ["megafuse/llm/_runner.pyx"],
    depends=DEPENDS,
    include_dirs=INCLUDE_DIRS,
    define_macros=MACROS,
    extra_compile_args=BASE_FLAGS,
))
extensions.append(Extension(
    "megafuse._build_info",
    ["megafuse/_build_info.pyx"],
    extra_compile_args=BASE_FLAGS,      # its include dir: BuildExtWithConfig adds it
))
for level, flags in SIMD_LEVELS.items():
    extensions.append(Extension(
        f"megafuse.kernels.levels.{level}",
        [f"megafuse/kernels/levels/{level}.pyx"],
        depends=DEPENDS,
        include_dirs=INCLUDE_DIRS,
        define_macros=MACROS + [("MF_SIMD_MODULE", level)],
        extra_compile_args=BASE_FLAGS + flags + OMP_COMPILE,
        extra_link_args=OMP_LINK,
    ))

DIRECTIVES = {
    "language_level": 3,
    "binding": True,
    "embedsignature": True,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "nonecheck": DEBUG,
}


class BuildPyWithHeaders(build_py):
    """Ship include/megafuse/*.h inside the package (megafuse/include/megafuse/)."""

    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "megafuse", "include", "megafuse")
        os.makedirs(dst, exist_ok=True)
        src = os.path.join(HERE, "include", "megafuse")
        for name in os.listdir(src):
            if name.endswith(".h"):
                shutil.copy2(os.path.join(src, name), os.path.join(dst, name))


CONFIG_HEADER = "megafuse_build_config.h"


def config_header_text(config):
    """A C header defining MF_BUILD_CONFIG_JSON: the configuration as a JSON string literal,
    every byte a hex escape (valid C whatever the flags contain)."""
    data = json.dumps(config, sort_keys=True).encode("utf-8")
    literal = "".join(f"\\x{b:02x}" for b in data)
    readable = data.decode("utf-8").replace("*/", "*\\/")
    return (f"/* Generated by megafuse's setup.py: the build configuration, {readable} */\n"
            f"#define MF_BUILD_CONFIG_JSON \"{literal}\"\n")


class BuildExtWithConfig(build_ext):
    """Compile the build configuration into megafuse._build_info: the header goes to the build
    directory (build_temp), not the source tree, and is rewritten only when it changes (so an
    unchanged configuration rebuilds nothing)."""

    def finalize_options(self):
        super().finalize_options()
        jobs = os.environ.get("MEGAFUSE_BUILD_JOBS", "").strip()
        if jobs and not self.parallel:
            self.parallel = int(jobs)

    def build_extensions(self):
        folder = os.path.join(os.path.abspath(self.build_temp), "megafuse_config")
        os.makedirs(folder, exist_ok=True)
        header = os.path.join(folder, CONFIG_HEADER)
        text = config_header_text(BUILD_CONFIG)
        try:
            with open(header) as f:
                current = f.read()
        except OSError:
            current = None
        if current != text:
            with open(header, "w") as f:
                f.write(text)
        for ext in self.extensions:
            if ext.name == "megafuse._build_info":
                ext.include_dirs = [folder] + list(ext.include_dirs)
                ext.depends = list(ext.depends) + [header]
        super().build_extensions()


setup(
    ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES,
                          include_path=["megafuse"], quiet=True),
    cmdclass={"build_py": BuildPyWithHeaders, "build_ext": BuildExtWithConfig},
)
