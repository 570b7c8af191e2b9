"""Fixtures shared by every test file: the SIMD level and the thread count under test."""
import pytest

import megafuse
from megafuse import _kernels, _simd

SUPPORTED_LEVELS = _simd.supported_levels()


@pytest.fixture(params=_simd.LEVELS)
def simd_level(request):
    """Run the test once per SIMD level of the kernels (skipped where the CPU lacks it)."""
    level = request.param
    if level not in SUPPORTED_LEVELS:
        pytest.skip(f"this CPU or build does not support the {level} kernels")
    before = megafuse.simd_level()
    _kernels._load_level(level)
    try:
        yield level
    finally:
        _kernels._load_level(before)


@pytest.fixture
def threads():
    """Restore the thread count after a test that changes it."""
    before = megafuse.get_num_threads()
    yield
    megafuse.set_num_threads(before)
