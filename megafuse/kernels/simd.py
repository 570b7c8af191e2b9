"""Which SIMD level of the kernels this process runs, and what the CPU offers.

megafuse builds the same kernel sources once per SIMD level (``megafuse.kernels.levels.generic``,
``.avx2``, ``.avx512``; only ``generic`` off x86-64).  At import the best level the CPU
supports is chosen, once megafuse.kernels.selftest has proven it against ``generic``;
``MEGAFUSE_SIMD=generic|avx2|avx512`` forces a level (a level above what the CPU supports is
refused with an ImportError rather than crashing on an illegal instruction).
"""
import importlib.util
import os

LEVELS = ("generic", "avx2", "avx512")  # lowest first

# CPU features each level's build flags assume (numpy's names, see setup.py for the flags).
REQUIRED_FEATURES = {
    "generic": (),
    "avx2": ("AVX2", "FMA3", "F16C"),
    "avx512": ("AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX512VNNI", "AVX2", "FMA3", "F16C"),
}


def cpu_features():
    """{feature: bool} of this CPU, as numpy's runtime dispatcher detected it."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__
    return dict(__cpu_features__)


def built_levels():
    """The levels compiled into this installation, lowest first."""
    return [lv for lv in LEVELS
            if importlib.util.find_spec(f"megafuse.kernels.levels.{lv}") is not None]


def supported_levels():
    """Levels that are both built and runnable on this CPU, lowest first."""
    features = cpu_features()
    return [lv for lv in built_levels()
            if all(features.get(f, False) for f in REQUIRED_FEATURES[lv])]


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
