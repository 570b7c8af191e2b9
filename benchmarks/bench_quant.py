"""Benchmarks of the GGML block-format layer (issue 3).

    pytest benchmarks/bench_quant.py --benchmark-only

1. Dequantize throughput: megafuse.dequantize against gguf.quants.dequantize (NumPy), per weight
   format, on a [1024, 4096] matrix (4 Mi weights, a 16 MiB float32 result: bound by the DRAM
   write bandwidth) and on a [128, 2048] one (256 Ki weights, 1 MiB: cache-resident).  Goal:
   >= 50x faster (gguf's FP32 "dequantize" is a zero-copy view and its FP16 / BF16 ones are single
   NumPy casts, so those three are reference points rather than targets).
2. The row-dot kernels (decode's inner loop): every row of a weight matrix of >= 3x the L3 -- more
   than the caches, so each pass streams it from DRAM -- dotted with one activation vector, by the
   float path (weights decoded in registers) and by the int8 path (activations quantized to
   Q8_0 / Q8_K once, integer dots; rows in register blocks of 4, as the projections run them:
   the multi-row kernels of mf_q8_rows_tokens, with their software prefetch).  Reported in GB/s
   of weight bytes, on one thread and on megafuse's default thread count.  The weight sits on
   2 MiB pages where the OS grants them (MEGAFUSE_BENCH_PAGES=4k: plain numpy memory), as a
   model loader would place it; DRAM bandwidth on 4 KiB pages is much lower on this kind of VM.
   The same dots also run on a weight of DOT_CACHED_BYTES (4 MiB) read again every call, so that
   it stays in the caches: the kernel's compute ceiling on this CPU.  Where the cached rate is
   not above the DRAM rate, the dot is bound by its arithmetic, not by memory (issue 13's T = 1
   rows: benchmarks/README.md).
A summary table is printed at the end of the run.
"""
import numpy as np
import pytest

import megafuse as mf
from megafuse import _kernels

from _buffers import placed
from _config import DECODE_MIN_BYTES, PAGES

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GQ  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402

DT = mf.CKDataType
FORMATS = [DT.FP32, DT.FP16, DT.BF16, DT.Q4_0, DT.Q4_1, DT.Q5_0, DT.Q5_1, DT.Q8_0, DT.IQ4_NL,
           DT.Q2_K, DT.Q3_K, DT.Q4_K, DT.Q5_K, DT.Q6_K, DT.IQ4_XS]
GGUF_TYPE = {
    DT.FP32: GQ.F32, DT.FP16: GQ.F16, DT.BF16: GQ.BF16, DT.Q4_0: GQ.Q4_0, DT.Q4_1: GQ.Q4_1,
    DT.Q5_0: GQ.Q5_0, DT.Q5_1: GQ.Q5_1, DT.Q8_0: GQ.Q8_0, DT.Q4_K: GQ.Q4_K, DT.Q5_K: GQ.Q5_K,
    DT.Q6_K: GQ.Q6_K, DT.IQ4_NL: GQ.IQ4_NL, DT.Q2_K: GQ.Q2_K, DT.Q3_K: GQ.Q3_K,
    DT.IQ4_XS: GQ.IQ4_XS,
}
SCALE_FIELDS = {DT.Q4_0: [0], DT.Q4_1: [0, 2], DT.Q5_0: [0], DT.Q5_1: [0, 2], DT.Q8_0: [0],
                DT.Q4_K: [0, 2], DT.Q5_K: [0, 2], DT.Q6_K: [208], DT.IQ4_NL: [0],
                DT.Q2_K: [80, 82], DT.Q3_K: [108], DT.IQ4_XS: [0]}

DEQ_SHAPES = {"dram": (1024, 4096), "cache": (128, 2048)}
DOT_COLS = 4096                     # a row: a typical hidden size
DOT_MIN_BYTES = DECODE_MIN_BYTES    # the weight streamed by the row-dot benchmark
DOT_CACHED_BYTES = 4 << 20          # its cache-resident variant: in L3 (and on 2 cores' L2s)
DOT_WEIGHTS = {"dram": DOT_MIN_BYTES, "cached": DOT_CACHED_BYTES}   # bytes of each variant
RESULTS = {}                        # (what, dt, variant) -> median seconds


def random_weights(dt, rows, cols, seed=0):
    """rows x cols weights of format dt with realistic scales, built directly as bytes (cheap
    for a weight of 3x the L3): normal values for the float formats; random codes and finite
    scales of about 1/64 for the block formats."""
    rng = np.random.default_rng(seed)
    if dt == DT.FP32:
        return rng.standard_normal((rows, cols), dtype=np.float32)
    if dt == DT.FP16:
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        return x.astype(np.float16).view(np.uint16)
    if dt == DT.BF16:
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    nb = rows * cols // mf.ck_dtype_block_size(dt)
    raw = rng.integers(0, 256, (nb, mf.ck_dtype_block_bytes(dt)), dtype=np.uint8)
    for off in SCALE_FIELDS[dt]:
        scale = (rng.uniform(0.5, 1.5, nb) / 64).astype(np.float16).view(np.uint8).reshape(nb, 2)
        raw[:, off:off + 2] = scale
    return raw.reshape(rows, -1)


def gguf_view(blob, dt):
    if dt == DT.FP16:
        return blob.view(np.float16)
    if dt == DT.BF16:
        return blob.view(np.uint8)
    return blob


def median(benchmark):
    stats = getattr(benchmark, "stats", None)
    return None if stats is None else stats.stats.median


_DEQ = {}


def deq_blob(dt, size):
    if (dt, size) not in _DEQ:
        _DEQ.clear()
        _DEQ[(dt, size)] = random_weights(dt, *DEQ_SHAPES[size])
    return _DEQ[(dt, size)]


@pytest.mark.parametrize("size", list(DEQ_SHAPES))
@pytest.mark.parametrize("dt", FORMATS, ids=lambda d: d.name)
def test_dequantize_megafuse(benchmark, dt, size):
    shape = DEQ_SHAPES[size]
    blob = deq_blob(dt, size)
    benchmark.group = f"dequantize {dt.name} {shape}"
    out = benchmark(mf.dequantize, blob, dt, shape)
    assert out.shape == shape
    RESULTS[("deq", dt, size, "megafuse")] = median(benchmark)


@pytest.mark.parametrize("size", list(DEQ_SHAPES))
@pytest.mark.parametrize("dt", FORMATS, ids=lambda d: d.name)
def test_dequantize_gguf(benchmark, dt, size):
    shape = DEQ_SHAPES[size]
    blob = deq_blob(dt, size)
    benchmark.group = f"dequantize {dt.name} {shape}"
    out = benchmark.pedantic(gguf_dequantize, args=(gguf_view(blob, dt), GGUF_TYPE[dt]),
                             rounds=5, iterations=1, warmup_rounds=1)
    assert np.array_equal(np.asarray(out).view(np.uint32).reshape(shape),
                          mf.dequantize(blob, dt, shape).view(np.uint32))
    RESULTS[("deq", dt, size, "gguf")] = median(benchmark)


_DOT = {}


def dot_weight(dt, where):
    """(weight [R, row bytes] of at least DOT_WEIGHTS[where] bytes, activations [DOT_COLS])."""
    if (dt, where) not in _DOT:
        _DOT.clear()                                   # one weight alive at a time
        rb = mf.ck_dtype_row_bytes(dt, DOT_COLS)
        rows = -(-DOT_WEIGHTS[where] // rb)
        x = np.random.default_rng(1).standard_normal(DOT_COLS, dtype=np.float32)
        _DOT[(dt, where)] = (placed(random_weights(dt, rows, DOT_COLS, seed=2)), x)
    return _DOT[(dt, where)]


@pytest.mark.parametrize("threads", ["1 thread", "all threads"])
@pytest.mark.parametrize("where", list(DOT_WEIGHTS))
@pytest.mark.parametrize("path", ["float", "int8"])
@pytest.mark.parametrize("dt", FORMATS, ids=lambda d: d.name)
def test_row_dot(benchmark, dt, path, where, threads):
    w, x = dot_weight(dt, where)
    before = mf.get_num_threads()
    if threads == "1 thread":
        mf.set_num_threads(1)
    try:
        benchmark.group = f"row dot {dt.name} ({w.nbytes >> 20} MiB weight, {where})"
        out = benchmark(_kernels._rows_dot, w, dt, x, path == "int8")
    finally:
        mf.set_num_threads(before)
    assert out.shape == (w.shape[0],) and np.isfinite(out).all()
    RESULTS[("dot", dt, path, where, threads)] = (median(benchmark), w.nbytes)


@pytest.fixture(scope="module", autouse=True)
def summary_table(request):
    yield
    if not RESULTS:
        return
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            _print_table(print)
    else:
        _print_table(print)


def _print_table(write):
    write("")
    write(f"megafuse {mf.__version__}, SIMD level {mf.simd_level()}, "
          f"{mf.get_num_threads()} threads by default, row-dot weights on "
          f"{'4 KiB' if PAGES == '4k' else '2 MiB'} pages")
    sizes = list(DEQ_SHAPES)
    head = " | ".join(f"{'dequantize ' + 'x'.join(map(str, DEQ_SHAPES[z])):>31}" for z in sizes)
    dot_cols = [(path, where) for path in ("float", "int8") for where in DOT_WEIGHTS]
    write(f"{'format':<6} | {head} | row dot GB/s of weights (1 thread / all): "
          f"dram = a {DOT_MIN_BYTES >> 20} MiB weight, cached = {DOT_CACHED_BYTES >> 20} MiB")
    sub = " | ".join(f"{'ms':>8} {'gguf ms':>9} {'speed-up':>9}" + " " * 3 for z in sizes)
    write(f"{'':<6} | {sub} | " + " ".join(f"{p + ' ' + w:>13}" for p, w in dot_cols))
    for dt in FORMATS:
        cells = []
        for z in sizes:
            ours = RESULTS.get(("deq", dt, z, "megafuse"))
            theirs = RESULTS.get(("deq", dt, z, "gguf"))
            c = f"{ours * 1e3:8.3f}" if ours else f"{'-':>8}"
            c += f" {theirs * 1e3:9.3f}" if theirs else f" {'-':>9}"
            c += f" {theirs / ours:8.0f}x" if ours and theirs else f" {'-':>9}"
            cells.append(c + " " * 3)
        dots = []
        for path, where in dot_cols:
            pair = []
            for threads in ("1 thread", "all threads"):
                r = RESULTS.get(("dot", dt, path, where, threads))
                pair.append(f"{r[1] / r[0] / 1e9:5.1f}" if r and r[0] else f"{'-':>5}")
            dots.append(" / ".join(pair))
        write(f"{dt.name:<6} | {' | '.join(cells)} | " + " ".join(f"{d:>13}" for d in dots))
