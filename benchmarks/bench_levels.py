"""Each SIMD level this CPU runs against the generic level, on the same kernels and shapes.

    pytest benchmarks/bench_levels.py --benchmark-only

The kernels: the one-token row dots (decode's inner loop; both paths: float activations and
int8 activations) of Q4_0, Q8_0 and Q4_K, and the int8 prefill tiles of Q8_0 (the MLP block's
projections at T = 32: mega_fused_mlp_prefill).  Small, cache-resident shapes (a 2048 x 1024
weight; the MLP at E = 512, I = 1536), so that the rows measure the kernels' arithmetic and run in
seconds even under emulation: on aarch64 under qemu-user (tools/aarch64-emulated.sh) the
ratios say which instructions each level saves, not what hardware would run.
The table at the end gives each row's median and its speed-up over generic.  The results of each
level are checked against generic's within the test suite's tolerances.
"""
import numpy as np
import pytest

import megafuse as mf
from megafuse import _kernels
from megafuse.kernels import simd as _simd

DT = mf.CKDataType
LEVELS = _simd.supported_levels()
ROWS, COLS = 2048, 1024
E, I, T = 512, 1536, 32
RESULTS = {}          # (kernel, level) -> median seconds


def _weights(dt, rows, cols, seed):
    w = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32) * 0.05
    return mf.quantize(w, dt)


@pytest.fixture
def level(request):
    before = mf.simd_level()
    _kernels._load_level(request.param)
    try:
        yield request.param
    finally:
        _kernels._load_level(before)


_CACHE = {}


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def _generic(run):
    """run() on the generic kernels (the level the others are checked against)."""
    before = mf.simd_level()
    _kernels._load_level("generic")
    try:
        return run()
    finally:
        _kernels._load_level(before)


def _median(benchmark):
    return benchmark.stats.stats.median


@pytest.mark.parametrize("level", LEVELS, indirect=True)
@pytest.mark.parametrize("path", ["float", "int8"])
@pytest.mark.parametrize("dt", [DT.Q4_0, DT.Q8_0, DT.Q4_K], ids=lambda d: d.name)
def test_row_dot(benchmark, level, dt, path):
    w = _cached(("w", dt), lambda: _weights(dt, ROWS, COLS, 1))
    x = _cached("x", lambda: np.random.default_rng(2).standard_normal(COLS, dtype=np.float32))
    benchmark.group = f"row dot {dt.name} {path} ({ROWS} x {COLS})"
    out = benchmark.pedantic(_kernels._rows_dot, args=(w, dt, x, path == "int8"),
                             rounds=5, iterations=3, warmup_rounds=1)
    want = _cached(("dot", dt, path),
                   lambda: _generic(lambda: _kernels._rows_dot(w, dt, x, path == "int8")))
    scale = np.abs(mf.dequantize(w, dt, (ROWS, COLS))) @ np.abs(x)
    assert np.all(np.abs(out - want) <= 1e-4 * scale)
    RESULTS[(f"row dot {dt.name} {path}", level)] = _median(benchmark)


def _mlp_case():
    rng = np.random.default_rng(3)
    f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)   # noqa: E731
    return dict(input=f32(T, E), residual=f32(T, E), ln2_gamma=1 + 0.1 * f32(E),
                w1=_weights(DT.Q8_0, 2 * I, E, 4), b1=None, w1_dt=DT.Q8_0,
                w2=_weights(DT.Q8_0, E, I, 5), b2=None, w2_dt=DT.Q8_0,
                tokens=T, embed_dim=E, aligned_embed_dim=E, intermediate_dim=I,
                aligned_intermediate_dim=I, eps=1e-5,
                scratch=np.empty(mf.mega_fused_mlp_prefill_scratch_size(T, E, I), np.uint8))


@pytest.mark.parametrize("level", LEVELS, indirect=True)
def test_q8_0_prefill_tile(benchmark, level):
    case = _cached("mlp", _mlp_case)
    out = np.empty((T, E), dtype=np.float32)
    benchmark.group = f"Q8_0 int8 tiles: mega_fused_mlp_prefill T={T} E={E} I={I}"
    benchmark.pedantic(lambda: mf.mega_fused_mlp_prefill(output=out, **case),
                       rounds=5, iterations=1, warmup_rounds=1)
    def generic_out():
        ref = np.empty_like(out)
        mf.mega_fused_mlp_prefill(output=ref, **case)
        return ref
    want = _cached("mlp out", lambda: _generic(generic_out))
    assert np.all(np.abs(out - want) <= 1e-2 * (1 + np.abs(want)))
    RESULTS[("Q8_0 prefill tiles (MLP T=32)", level)] = _median(benchmark)


@pytest.fixture(scope="module", autouse=True)
def summary_table(request):
    yield
    if not RESULTS:
        return
    lines = [f"megafuse {mf.__version__}: each level against generic (median ms, speed-up)",
             f"{'kernel':<32} " + " ".join(f"{lv:>20}" for lv in LEVELS)]
    for kernel in dict.fromkeys(k for k, _ in RESULTS):
        base = RESULTS.get((kernel, "generic"))
        cells = []
        for lv in LEVELS:
            t = RESULTS.get((kernel, lv))
            cells.append(f"{t * 1e3:9.3f} ms {base / t:6.1f}x" if t and base else f"{'-':>20}")
        lines.append(f"{kernel:<32} " + " ".join(f"{c:>20}" for c in cells))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + "\n".join(lines))
