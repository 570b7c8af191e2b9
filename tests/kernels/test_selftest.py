"""The SIMD self-test (megafuse/kernels/selftest.py): a level above generic is proven against the
generic kernels at import, and a level that disagrees is replaced by the next one down.

The levels are this architecture's (x86-64: generic, avx2, avx512; aarch64: generic, neon,
neon_dotprod, i8mm): TOP is the best, NEXT the one below it, FIRST the lowest above generic.  On a
CPU without TOP its path runs with another level's kernels standing in
(select_level(stand_in=...)); the fault hook (MEGAFUSE_SELFTEST_FAULT, or faults=) perturbs one
family's results as a broken kernel would."""
import os
import subprocess
import sys
import time
import tracemalloc
import warnings

import pytest

import megafuse
from megafuse import _kernels
from megafuse.kernels import selftest as _selftest, simd as _simd

from helpers import fork_child_status

SUPPORTED = _simd.supported_levels()
ABOVE_GENERIC = [lv for lv in SUPPORTED if lv != "generic"]
TOP, NEXT, FIRST = _simd.LEVELS[-1], _simd.LEVELS[-2], _simd.LEVELS[1]


def fresh_env(**env):
    """This process's environment for a child that imports this megafuse, without
    MEGAFUSE_SIMD and the fault hook, plus these variables."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("MEGAFUSE_SIMD", _selftest.FAULT_ENV)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(megafuse.__file__)))
    full["PYTHONPATH"] = os.pathsep.join(p for p in (root, full.get("PYTHONPATH")) if p)
    full.update(env)
    return full


def run_python(code, **env):
    """Run code in a fresh interpreter (RuntimeWarnings shown) with these variables."""
    return subprocess.run([sys.executable, "-W", "always::RuntimeWarning", "-c", code],
                          env=fresh_env(**env), capture_output=True, text=True, timeout=300)


@pytest.fixture
def restore_selection():
    """Put back the level, the thread count and RESULTS after a test that reselects."""
    level, threads = megafuse.simd_level(), megafuse.get_num_threads()
    results, total = dict(_selftest.RESULTS), _selftest.TOTAL_SECONDS
    yield
    _kernels._load_level(level)
    megafuse.set_num_threads(threads)
    _selftest.RESULTS.clear()
    _selftest.RESULTS.update(results)
    _selftest.TOTAL_SECONDS = total


def stand_ins():
    """Each level's kernels, or generic's where this CPU cannot run it."""
    return {lv: (lv if lv in SUPPORTED else "generic") for lv in _simd.LEVELS}


def pretend_every_level_is_supported(monkeypatch):
    monkeypatch.setattr(_simd, "supported_levels", lambda: list(_simd.LEVELS))
    monkeypatch.setattr(_simd, "built_levels", lambda: list(_simd.LEVELS))


# ---- the self-test passes where it should ---------------------------------------------------

@pytest.mark.parametrize("level", ABOVE_GENERIC or [pytest.param(
    FIRST, marks=pytest.mark.skip(reason="no level above generic on this CPU"))])
def test_every_supported_level_passes(level):
    result = _selftest.run_level(level)
    assert result.status == "passed", result.summary()
    assert set(result.ratios) == set(_selftest.FAMILIES)
    assert all(0.0 <= r <= 1.0 for r in result.ratios.values()), result.ratios
    assert result.level == level and result.seconds > 0


def test_import_chose_the_best_level_after_its_self_test():
    results = _selftest.RESULTS
    assert list(results) == list(_simd.LEVELS)
    assert results["generic"].status == "reference"
    assert "known answer passed" in results["generic"].note
    if os.environ.get("MEGAFUSE_SIMD"):
        pytest.skip("MEGAFUSE_SIMD forces the level of this run")
    assert megafuse.simd_level() == SUPPORTED[-1]
    if SUPPORTED[-1] != "generic":
        assert results[SUPPORTED[-1]].status == "passed"
    for level in _simd.LEVELS:
        if level not in SUPPORTED:
            assert results[level].status in ("not supported by this CPU", "not built")
    for level in ABOVE_GENERIC[:-1]:                  # below the best: not needed
        assert results[level].status == "not run"


def test_tolerances_are_the_test_suites():
    import helpers
    import test_quant
    for name in ("float", "q8_emulated"):
        assert _selftest.TOL[name] == helpers.TOL[name]
    for name in ("float_dot", "int8_dot"):
        assert _selftest.TOL[name] == test_quant.TOL[name]


# ---- every family's comparison can fail -----------------------------------------------------

@pytest.mark.parametrize("family", _selftest.FAMILIES)
def test_a_fault_in_one_family_fails_that_family_only(family):
    level = ABOVE_GENERIC[-1] if ABOVE_GENERIC else FIRST
    result = _selftest.run_level(level, faults={(level, family)},
                                 kernels=level if ABOVE_GENERIC else "generic")
    assert result.status == "failed"
    assert [f for f, _ in result.failures] == [family], result.summary()
    assert family in result.summary()


def test_a_kernel_that_raises_fails_its_family(monkeypatch):
    def broken(*args, **kwargs):
        raise MemoryError("a kernel that raises")
    monkeypatch.setattr(_kernels, "mega_fused_mlp_prefill", broken)
    result = _selftest.run_level(FIRST, kernels="generic")
    assert [f for f, _ in result.failures] == ["mlp"]
    assert "MemoryError" in result.summary()


# ---- the fallback ---------------------------------------------------------------------------

@pytest.mark.skipif(not ABOVE_GENERIC, reason="no level above generic on this CPU")
def test_import_falls_back_when_every_level_above_generic_fails():
    """At import, in a fresh process: the attention decode of every supported level above
    generic perturbed -> generic, with a RuntimeWarning naming the level and the family; megafuse
    info shows it."""
    code = ("import megafuse; print('LEVEL', megafuse.simd_level()); megafuse.show_config()")
    faults = ",".join(f"{level}:attention_decode" for level in ABOVE_GENERIC)
    out = run_python(code, **{_selftest.FAULT_ENV: faults})
    assert out.returncode == 0, out.stderr
    assert "LEVEL generic" in out.stdout
    assert "RuntimeWarning" in out.stderr
    for level in ABOVE_GENERIC:
        assert f"the {level} kernels fail their self-test" in out.stderr
        assert f"{level}: failed in" in out.stdout
    assert "attention_decode" in out.stderr and "using generic instead" in out.stderr
    assert "generic used instead" in out.stdout


def test_the_best_level_falls_back_to_the_next(monkeypatch, restore_selection):
    pretend_every_level_is_supported(monkeypatch)
    monkeypatch.delenv("MEGAFUSE_SIMD", raising=False)
    monkeypatch.setenv(_selftest.FAULT_ENV, f"{TOP}:int8_dot")
    with pytest.warns(RuntimeWarning) as record:
        chosen = _selftest.select_level(stand_in=stand_ins())
    assert chosen == NEXT
    assert len(record) == 1
    message = str(record[0].message)
    assert TOP in message and "int8_dot" in message and f"using {NEXT} instead" in message
    assert _selftest.RESULTS[TOP].status == "failed"
    assert _selftest.RESULTS[NEXT].status == "passed"
    assert megafuse.simd_level() == stand_ins()[NEXT]


def test_every_level_failing_in_turn_ends_at_generic(monkeypatch, restore_selection):
    pretend_every_level_is_supported(monkeypatch)
    monkeypatch.delenv("MEGAFUSE_SIMD", raising=False)
    above = list(reversed(_simd.LEVELS[1:]))              # TOP first, FIRST last
    families = ("mlp", "model_step", "int8_tiles")
    monkeypatch.setenv(_selftest.FAULT_ENV, ",".join(
        f"{level}:{families[i % 3]}" for i, level in enumerate(above)))
    with pytest.warns(RuntimeWarning) as record:
        chosen = _selftest.select_level(stand_in=stand_ins())
    assert chosen == "generic" and megafuse.simd_level() == "generic"
    messages = [str(r.message) for r in record]
    assert len(messages) == len(above)
    for i, (level, message) in enumerate(zip(above, messages)):
        below = above[i + 1] if i + 1 < len(above) else "generic"
        assert level in message and families[i % 3] in message and f"using {below}" in message
    summary = _selftest.summary()
    assert all(summary[level].startswith("failed") for level in above)


def test_a_forced_level_that_fails_is_kept_with_a_warning(monkeypatch, restore_selection):
    pretend_every_level_is_supported(monkeypatch)
    monkeypatch.setenv("MEGAFUSE_SIMD", TOP)
    monkeypatch.setenv(_selftest.FAULT_ENV, f"{TOP}:attention_prefill")
    with pytest.warns(RuntimeWarning, match=f"MEGAFUSE_SIMD={TOP} keeps them") as record:
        chosen = _selftest.select_level(stand_in=stand_ins())
    assert chosen == TOP
    assert "attention_prefill" in str(record[0].message)
    assert _selftest.RESULTS[TOP].status == "failed"
    assert _selftest.RESULTS[NEXT].status == "not run"      # a forced level: no other tried


@pytest.mark.skipif(FIRST not in SUPPORTED, reason=f"this CPU cannot run the {FIRST} kernels")
def test_forced_level_runs_its_self_test_at_import():
    code = "import megafuse; print('LEVEL', megafuse.simd_level()); megafuse.show_config()"
    out = run_python(code, MEGAFUSE_SIMD=FIRST)
    assert out.returncode == 0 and "RuntimeWarning" not in out.stderr, out.stderr
    assert f"LEVEL {FIRST}" in out.stdout and f"{FIRST}: passed in" in out.stdout
    out = run_python(code, MEGAFUSE_SIMD=FIRST, **{_selftest.FAULT_ENV: f"{FIRST}:float_dot"})
    assert out.returncode == 0, out.stderr
    assert f"LEVEL {FIRST}" in out.stdout
    assert f"MEGAFUSE_SIMD={FIRST} keeps them" in out.stderr and "float_dot" in out.stderr


def test_forcing_generic_runs_only_its_known_answer(monkeypatch, restore_selection):
    monkeypatch.setenv("MEGAFUSE_SIMD", "generic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _selftest.select_level() == "generic"
    assert _selftest.RESULTS["generic"].status == "reference"
    for level in ABOVE_GENERIC:
        assert _selftest.RESULTS[level].status == "not run"


def test_generic_known_answer_can_fail(monkeypatch, restore_selection):
    monkeypatch.setenv("MEGAFUSE_SIMD", "generic")
    monkeypatch.setenv(_selftest.FAULT_ENV, "generic:known_answer")
    with pytest.warns(RuntimeWarning, match="generic kernels disagree with a float64 known"):
        _selftest.select_level()
    assert "FAILED" in _selftest.summary()["generic"]


def test_fault_hook_rejects_what_it_does_not_know():
    assert _selftest.parse_faults(f" {FIRST}:mlp, {TOP}:int8_dot ,") == {
        (FIRST, "mlp"), (TOP, "int8_dot")}
    other = "neon" if FIRST == "avx2" else "avx2"         # a level of the other architecture
    for bad in (FIRST, "sse:mlp", f"{FIRST}:everything", f"{other}:mlp"):
        with pytest.raises(ImportError, match=_selftest.FAULT_ENV):
            _selftest.parse_faults(bad)


# ---- cheap and harmless ---------------------------------------------------------------------

def test_thread_count_and_level_are_left_alone(threads, restore_selection):
    megafuse.set_num_threads(3)
    before = megafuse.simd_level()
    _selftest.select_level()
    assert megafuse.get_num_threads() == 3
    assert megafuse.simd_level() == before
    _selftest.run_level(ABOVE_GENERIC[-1] if ABOVE_GENERIC else FIRST,
                        kernels=None if ABOVE_GENERIC else "generic")
    assert megafuse.get_num_threads() == 3 and megafuse.simd_level() == before


def test_import_keeps_omp_num_threads():
    out = run_python("import megafuse; print(megafuse.get_num_threads())", OMP_NUM_THREADS="3")
    assert out.returncode == 0 and out.stdout.split()[-1] == "3", out.stderr


def test_import_leaves_a_forked_child_able_to_run_threads():
    """The self-test runs on one thread, so import starts no OpenMP team: a fork()ed child can
    still run a kernel on two threads (after a parallel kernel in the parent it would hang:
    the libgomp caveat of the README)."""
    out = fork_child_status("import numpy as np\nimport megafuse\n", """
        megafuse.set_num_threads(2)
        megafuse.quantize(np.ones((64, 4096), np.float32), megafuse.CKDataType.Q8_0)
    """, env=fresh_env())
    assert "CHILD 0" in out.stdout, (out.stdout, out.stderr)


def test_self_test_is_quick_and_small(restore_selection):
    """Milliseconds and about a MiB (a loose bound: the machine may be busy)."""
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        _selftest.select_level()
        best.append(time.perf_counter() - t0)
    assert min(best) < 0.5, best
    tracemalloc.start()
    try:
        _selftest.select_level()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


# ---- megafuse info --------------------------------------------------------------------------

def test_megafuse_info_shows_each_levels_self_test():
    out = subprocess.run([sys.executable, "-m", "megafuse", "info"], capture_output=True,
                         text=True, timeout=300, env=fresh_env())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("simd_selftest"))
    block = "\n".join(lines[start:start + len(_simd.LEVELS) + 1])
    assert "generic: the reference, not tested against itself" in block
    assert "known answer passed" in block
    for level in _simd.LEVELS:
        if level == SUPPORTED[-1] and level != "generic":
            assert f"{level}: passed in" in block and "ms" in block
        elif level not in SUPPORTED:
            assert f"{level}: not supported by this CPU" in block or \
                f"{level}: not built" in block
        elif level != "generic":
            assert f"{level}: not run" in block
    assert "total:" in block


def test_show_config_returns_the_self_test(capsys):
    config = megafuse.show_config()
    assert set(config["simd_selftest"]) == set(_simd.LEVELS) | {"total"}
    assert config["simd_selftest"] == _selftest.summary()
    assert "simd_selftest" in capsys.readouterr().out
