"""Which SIMD levels a CPU gets (megafuse/kernels/simd.py): the levels of each architecture, the
features each needs, and how aarch64's features are read (Linux's AT_HWCAP / AT_HWCAP2 words,
macOS's sysctl names), checked on words made up here on any machine and, on aarch64, against
NumPy's own detection."""
import platform
import sys

import pytest

from megafuse.kernels import simd as _simd

ON_AARCH64 = platform.machine().lower() in ("aarch64", "arm64")


def test_levels_of_this_architecture():
    want = _simd.ARM_LEVELS if ON_AARCH64 else _simd.X86_LEVELS
    assert want == _simd.LEVELS
    assert _simd.LEVELS.index("generic") == 0
    assert set(_simd.REQUIRED_FEATURES) == set(_simd.X86_LEVELS) | set(_simd.ARM_LEVELS)
    # each level needs everything the one below it needs
    for levels in (_simd.X86_LEVELS, _simd.ARM_LEVELS):
        for lower, upper in zip(levels, levels[1:]):
            assert set(_simd.REQUIRED_FEATURES[lower]) <= set(_simd.REQUIRED_FEATURES[upper])


@pytest.mark.parametrize("hwcap, hwcap2, want", [
    (0x8fb, 0x0, ["generic", "neon"]),                          # qemu's cortex-a53: no dotprod
    (0x119ffb, 0x0, ["generic", "neon", "neon_dotprod"]),       # qemu's neoverse-n1
    (0xecfffffb, 0x7f877fff, ["generic", "neon", "neon_dotprod", "i8mm"]),   # qemu's max
    (0x2, 0x2000, ["generic", "neon"]),                         # i8mm without dotprod: no i8mm
    (0x0, 0x0, ["generic"]),                                    # no Advanced SIMD at all
])
def test_arm_levels_from_the_hwcap_words(monkeypatch, hwcap, hwcap2, want):
    """The hwcap words qemu-user reports for the CPUs tools/aarch64-emulated.sh runs on."""
    features = _simd.arm_features_from_hwcap(hwcap, hwcap2)
    monkeypatch.setattr(_simd, "LEVELS", _simd.ARM_LEVELS)
    monkeypatch.setattr(_simd, "cpu_features", lambda: features)
    monkeypatch.setattr(_simd, "built_levels", lambda: list(_simd.ARM_LEVELS))
    assert _simd.supported_levels() == want
    monkeypatch.delenv("MEGAFUSE_SIMD", raising=False)
    assert _simd.choose_level() == want[-1]
    if "i8mm" not in want:                   # refused as an ImportError, not an illegal instruction
        monkeypatch.setenv("MEGAFUSE_SIMD", "i8mm")
        with pytest.raises(ImportError, match="MEGAFUSE_SIMD=i8mm"):
            _simd.choose_level()


def test_hwcap_bits_are_linuxs():
    """<asm/hwcap.h>: HWCAP_ASIMD (1 << 1), HWCAP_ASIMDDP (1 << 20), HWCAP2_I8MM (1 << 13)."""
    assert _simd.arm_features_from_hwcap(1 << 1, 0) == {"ASIMD": True, "ASIMDDP": False,
                                                        "I8MM": False}
    assert _simd.arm_features_from_hwcap(1 << 20, 0)["ASIMDDP"]
    assert _simd.arm_features_from_hwcap(0, 1 << 13)["I8MM"]
    assert not _simd.arm_features_from_hwcap(1 << 13, 1 << 20)["I8MM"]    # words not swapped


def test_an_unknown_forced_level_names_this_architectures_levels(monkeypatch):
    monkeypatch.setenv("MEGAFUSE_SIMD", "sse9")
    with pytest.raises(ImportError, match=", ".join(_simd.LEVELS)):
        _simd.choose_level()


@pytest.mark.skipif(not (ON_AARCH64 and sys.platform.startswith("linux")),
                    reason="reads this aarch64 Linux CPU's features")
def test_linux_arm_features_agree_with_numpy():
    """getauxval through ctypes against NumPy's dispatcher (which reads the same words in C):
    ASIMD and ASIMDDP.  NumPy has no I8MM key, so I8MM is checked to imply ASIMDDP only."""
    from numpy._core._multiarray_umath import __cpu_features__ as numpy_features
    ours = _simd.cpu_features()
    assert ours["ASIMD"] == numpy_features["ASIMD"]
    assert ours["ASIMDDP"] == numpy_features["ASIMDDP"]
    assert not ours["I8MM"] or ours["ASIMDDP"]


def test_missing_features_name_what_a_level_needs():
    """What `megafuse info` prints for a level the CPU cannot run (selftest: 'not supported by
    this CPU (it lacks ...)')."""
    a53 = _simd.arm_features_from_hwcap(0x8fb, 0x0)
    assert _simd.missing_features("neon", a53) == []
    assert _simd.missing_features("neon_dotprod", a53) == ["ASIMDDP"]
    assert _simd.missing_features("i8mm", a53) == ["ASIMDDP", "I8MM"]
    assert _simd.missing_features("avx512", {"AVX2": True, "FMA3": True, "F16C": True}) == [
        "AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX512VNNI"]
    for level in _simd.supported_levels():
        assert _simd.missing_features(level) == []


def test_the_amx_level_needs_the_tiles_and_the_oss_permission():
    """amx: everything avx512 needs, the AMX-TILE and AMX-INT8 instructions, and an OS that saves
    the tile state and let this process use it (AMX_OS): without the permission the first tile
    instruction would kill the process."""
    avx512 = {f: True for f in _simd.REQUIRED_FEATURES["avx512"]}
    assert _simd.missing_features("amx", avx512) == ["AMX_TILE", "AMX_INT8", "AMX_OS"]
    assert _simd.missing_features("amx", {**avx512, "AMX_TILE": True, "AMX_INT8": True}) == [
        "AMX_OS"]
    assert _simd.missing_features("amx", {**avx512, "AMX_TILE": True, "AMX_INT8": True,
                                          "AMX_OS": True}) == []


@pytest.mark.skipif(ON_AARCH64 or not sys.platform.startswith("linux"),
                    reason="reads this x86-64 Linux CPU's AMX features")
def test_x86_amx_features_agree_with_the_kernel():
    """CPUID's AMX bits (megafuse._kernels._x86_amx_state) against the flags Linux shows in
    /proc/cpuinfo; the OS part only where the instructions are."""
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    ours = _simd.x86_amx_features()
    assert set(ours) == {"AMX_TILE", "AMX_INT8", "AMX_OS"}
    assert ours["AMX_TILE"] == ("amx_tile" in flags)
    assert ours["AMX_INT8"] == ("amx_int8" in flags)
    assert not ours["AMX_OS"] or ours["AMX_TILE"]
    assert _simd.x86_amx_features() == ours          # asking again changes nothing
    assert ("amx" in _simd.supported_levels()) == (
        "amx" in _simd.built_levels() and all(ours.values())
        and not _simd.missing_features("avx512"))
