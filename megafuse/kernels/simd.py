"""Which SIMD level of the kernels this process runs, and what the CPU offers.

megafuse builds the same kernel sources once per SIMD level: ``megafuse.kernels.levels.generic``
everywhere, ``.avx2``, ``.avx512`` and (Linux) ``.amx`` on x86-64, ``.neon``, ``.neon_dotprod``
and ``.i8mm`` on aarch64.  At import the best level the CPU supports is chosen, once
megafuse.kernels.selftest has proven it against ``generic``; ``MEGAFUSE_SIMD=<level>`` forces a
level (a level above what the CPU supports is refused with an ImportError rather than crashing on
an illegal instruction).

The CPU's features: on x86-64, NumPy's runtime dispatcher (``__cpu_features__``), and for AMX
(which NumPy does not report, and which also needs the OS's permission) CPUID, XCR0 and Linux's
``arch_prctl(ARCH_REQ_XCOMP_PERM)`` through ``megafuse._kernels._x86_amx_state``; on aarch64, the
kernel's own words for it -- ``getauxval(AT_HWCAP / AT_HWCAP2)`` on Linux, ``sysctlbyname
("hw.optional.arm.FEAT_*")`` on macOS -- read through ctypes.  (NumPy's ``__cpu_features__``
has ASIMD and ASIMDDP on arm64 but no I8MM key in the NumPy releases megafuse supports, and
reports what NumPy was built to dispatch on rather than the instructions each level of megafuse
was compiled for; it is the fallback where neither call is available.)
"""
import ctypes
import ctypes.util
import importlib.util
import os
import platform
import sys

X86_LEVELS = ("generic", "avx2", "avx512", "amx")
ARM_LEVELS = ("generic", "neon", "neon_dotprod", "i8mm")


def _machine():
    return platform.machine().lower()


IS_AARCH64 = _machine() in ("aarch64", "arm64")
LEVELS = ARM_LEVELS if IS_AARCH64 else X86_LEVELS      # lowest first

# CPU features each level's build flags assume (see setup.py for the flags).  x86-64: numpy's
# names.  aarch64: ASIMD (Advanced SIMD: every aarch64 CPU), ASIMDDP (sdot / udot, ARMv8.2
# FEAT_DotProd), I8MM (smmla, FEAT_I8MM), as Linux's HWCAP bits name them.
REQUIRED_FEATURES = {
    "generic": (),
    "avx2": ("AVX2", "FMA3", "F16C"),
    "avx512": ("AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX512VNNI", "AVX2", "FMA3", "F16C"),
    # AMX_OS: the OS saves the tile state and granted this process the tile data
    "amx": ("AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX512VNNI", "AVX2", "FMA3", "F16C",
            "AMX_TILE", "AMX_INT8", "AMX_OS"),
    "neon": ("ASIMD",),
    "neon_dotprod": ("ASIMD", "ASIMDDP"),
    "i8mm": ("ASIMD", "ASIMDDP", "I8MM"),
}

# Linux aarch64: <asm/hwcap.h>
AT_HWCAP, AT_HWCAP2 = 16, 26
HWCAP_ASIMD, HWCAP_ASIMDDP = 1 << 1, 1 << 20
HWCAP2_I8MM = 1 << 13
# macOS arm64: sysctl names of the same features
MACOS_SYSCTL = {"ASIMD": "hw.optional.AdvSIMD", "ASIMDDP": "hw.optional.arm.FEAT_DotProd",
                "I8MM": "hw.optional.arm.FEAT_I8MM"}


def arm_features_from_hwcap(hwcap, hwcap2):
    """{ASIMD, ASIMDDP, I8MM: bool} from Linux's AT_HWCAP and AT_HWCAP2 words."""
    return {"ASIMD": bool(hwcap & HWCAP_ASIMD), "ASIMDDP": bool(hwcap & HWCAP_ASIMDDP),
            "I8MM": bool(hwcap2 & HWCAP2_I8MM)}


def _linux_arm_features():
    libc = ctypes.CDLL(None, use_errno=True)
    getauxval = libc.getauxval
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return arm_features_from_hwcap(getauxval(AT_HWCAP), getauxval(AT_HWCAP2))


def _macos_sysctl_flag(name):
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    value, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
    if libc.sysctlbyname(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return False                       # an unknown name: a macOS or CPU without the feature
    return value.value != 0


def _numpy_cpu_features():
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__
    return dict(__cpu_features__)


def x86_amx_features():
    """{AMX_TILE, AMX_INT8, AMX_OS: bool}: the AMX instructions, and whether the OS lets this
    process run them (asking Linux for the tile data permission on the way)."""
    from megafuse import _kernels          # the baseline module: it runs no AMX instruction
    state = _kernels._x86_amx_state()
    return {"AMX_TILE": bool(state & 1), "AMX_INT8": bool(state & 2), "AMX_OS": bool(state & 4)}


def cpu_features():
    """{feature: bool} of this CPU: numpy's runtime dispatcher's (and x86_amx_features') on
    x86-64, the OS's on aarch64 (see the module docstring)."""
    if not IS_AARCH64:
        return {**_numpy_cpu_features(), **x86_amx_features()}
    try:
        if sys.platform.startswith("linux"):
            return _linux_arm_features()
        if sys.platform == "darwin":
            return {key: _macos_sysctl_flag(name) for key, name in MACOS_SYSCTL.items()}
    except (OSError, AttributeError):      # no getauxval / sysctlbyname: numpy's view below
        pass
    features = _numpy_cpu_features()
    return {"ASIMD": features.get("ASIMD", False), "ASIMDDP": features.get("ASIMDDP", False),
            "I8MM": features.get("I8MM", False)}


def built_levels():
    """The levels compiled into this installation, lowest first."""
    return [lv for lv in LEVELS
            if importlib.util.find_spec(f"megafuse.kernels.levels.{lv}") is not None]


def missing_features(level, features=None):
    """The CPU features ``level`` needs that this CPU lacks (REQUIRED_FEATURES' names), in order."""
    features = cpu_features() if features is None else features
    return [f for f in REQUIRED_FEATURES[level] if not features.get(f, False)]


def supported_levels():
    """Levels that are both built and runnable on this CPU, lowest first."""
    features = cpu_features()
    return [lv for lv in built_levels() if not missing_features(lv, features)]


def forced_level():
    """The level MEGAFUSE_SIMD asks for ('' or unset: None)."""
    return os.environ.get("MEGAFUSE_SIMD", "").strip().lower() or None


def choose_level():
    """The level to try first: MEGAFUSE_SIMD's if set, else the best supported one.
    (megafuse.kernels.selftest.select_level proves it before it is used.)"""
    supported = supported_levels()
    if not supported:
        raise ImportError("megafuse: no kernel module is built "
                          "(expected megafuse.kernels.levels.generic)")
    wanted = forced_level()
    if not wanted:
        return supported[-1]
    if wanted not in LEVELS:
        raise ImportError(f"MEGAFUSE_SIMD: expected one of {', '.join(LEVELS)}, got {wanted!r}")
    if wanted not in supported:
        raise ImportError(f"MEGAFUSE_SIMD={wanted}: this CPU or build supports only "
                          f"{', '.join(supported)}")
    return wanted


def cache_sizes():
    """(L1 data, L2) cache sizes of this CPU in bytes, or (0, 0) where the OS does not tell."""
    l1d = l2 = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            d = os.path.join(base, entry)
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size = _parse_size(f.read().strip())
            if level == 1 and kind in ("Data", "Unified"):
                l1d = size
            elif level == 2 and kind in ("Data", "Unified"):
                l2 = size
    except (OSError, ValueError):
        pass
    if not (l1d and l2) and hasattr(os, "sysconf"):
        try:
            l1d = l1d or max(0, os.sysconf("SC_LEVEL1_DCACHE_SIZE"))
            l2 = l2 or max(0, os.sysconf("SC_LEVEL2_CACHE_SIZE"))
        except (ValueError, OSError):
            pass
    return (l1d, l2) if (l1d and l2) else (0, 0)


def _parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)
