"""The GGML block-format layer (issue 3): megafuse.quantize / dequantize, the row dot products of
both activation paths, and the activation quantizers.

Independent references: the `gguf` package (gguf.quants.quantize / dequantize, NumPy), megafuse's
own NumPy reference (megafuse.reference: activation quantization and the K-quant quantizers),
ggml's own K-quant bytes (tests/data/kquant_fixtures.npz, made once with ggml-python by
tests/data/make_kquant_fixtures.py), llama.cpp's tests/test-quantize-fns.cpp methodology and
exact integer arithmetic.  Nothing here skips for a missing package: gguf is in the `test` extra.

Kernel tests take the `simd_level` fixture (tests/conftest.py): they run once per SIMD level
this CPU supports.
"""
import functools
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GQ
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

import megafuse as mf
from megafuse import _kernels
from megafuse.kernels import simd as _simd
from megafuse import reference as ref

import helpers
from helpers import DT, block_bytes, block_size

# the format groups of tests/helpers.py, as CKDataType members (the tests here run on them)
FLOAT_FORMATS = [DT[f] for f in helpers.FLOAT_FORMATS]
BLOCK32_FORMATS = [DT[f] for f in helpers.BLOCK32_FORMATS]
KQUANT_FORMATS = [DT[f] for f in helpers.KQUANT_FORMATS]
BLOCK_FORMATS = BLOCK32_FORMATS + KQUANT_FORMATS
WEIGHT_FORMATS = FLOAT_FORMATS + BLOCK_FORMATS
# what gguf.quants.quantize implements; the other block formats only megafuse and ggml quantize
GGUF_QUANTIZES = [DT[f] for f in helpers.GGUF_QUANTIZES] + [DT.FP16, DT.BF16]
OWN_QUANTIZES = [dt for dt in BLOCK_FORMATS if dt not in GGUF_QUANTIZES]
GGUF_TYPE = {
    DT.FP32: GQ.F32, DT.FP16: GQ.F16, DT.BF16: GQ.BF16, DT.Q4_0: GQ.Q4_0, DT.Q4_1: GQ.Q4_1,
    DT.Q5_0: GQ.Q5_0, DT.Q5_1: GQ.Q5_1, DT.Q8_0: GQ.Q8_0, DT.Q4_K: GQ.Q4_K, DT.Q5_K: GQ.Q5_K,
    DT.Q6_K: GQ.Q6_K, DT.Q2_K: GQ.Q2_K, DT.Q3_K: GQ.Q3_K, DT.IQ4_NL: GQ.IQ4_NL,
    DT.IQ4_XS: GQ.IQ4_XS,
}
NON_WEIGHT_DTYPES = [DT.INT8, DT.INT4, DT.Q8_K, DT.COUNT, 18, -1, 99]

# Byte offsets of the fp16 scale fields of each block (GGML layouts).
SCALE_FIELDS = {
    DT.Q4_0: [0], DT.Q4_1: [0, 2], DT.Q5_0: [0], DT.Q5_1: [0, 2], DT.Q8_0: [0],
    DT.Q4_K: [0, 2], DT.Q5_K: [0, 2], DT.Q6_K: [208], DT.IQ4_NL: [0], DT.Q2_K: [80, 82],
    DT.Q3_K: [108], DT.IQ4_XS: [0],
}

# Named tolerances.
TOL = {
    "llama_total_error": 0.002,   # llama.cpp MAX_QUANTIZATION_TOTAL_ERROR (round-trip)
    "llama_total_error_2bits": 0.0075,   # ... _2BITS (Q2_K)
    "llama_total_error_3bits": 0.0040,   # ... _3BITS (Q3_K)
    "llama_dot_error": 0.02,      # llama.cpp MAX_DOT_PRODUCT_ERROR
    "llama_dot_error_lowbit": 0.04,      # ... _LOWBIT (Q2_K)
    "float_dot": 1e-5,            # float-activation dot vs float64, relative to sum |w_i x_i|
    "int8_dot": 1e-6,             # int8 dot vs its float64 emulation, relative to sum |w_i a_i|
}


def storage(blob, dt):
    """gguf's output as megafuse stores it (FP16, BF16: uint16 bits)."""
    if dt in (DT.FP16, DT.BF16):
        return np.ascontiguousarray(blob).view(np.uint16)
    return blob


def g_quantize(x, dt):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")            # NumPy's "invalid value in cast"
        return storage(gguf_quantize(x, GGUF_TYPE[dt]), dt)


def g_dequantize(blob, dt):
    """gguf.quants.dequantize of a blob stored as megafuse stores it."""
    if dt == DT.FP16:
        blob = blob.view(np.float16)
    elif dt == DT.BF16:
        blob = blob.view(np.uint8)
    with np.errstate(all="ignore"):
        return np.asarray(gguf_dequantize(blob, GGUF_TYPE[dt]), dtype=np.float32)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        a.view(np.uint8), b.view(np.uint8))


# The fp16 NaN rule of the contract (§2), in integer arithmetic: a NaN keeps its sign and payload
# both ways, a signalling NaN stays signalling.  NumPy's float16 casts agree where they convert in
# software (x86-64); where they use the hardware instruction (aarch64) they quiet signalling NaNs,
# so NaNs are compared with these, every other value with NumPy.

def fp16_nan(h):
    h = np.asarray(h, dtype=np.uint16)
    return ((h & 0x7FFF) > 0x7C00)


def fp16_to_fp32_bits(h):
    """The float32 bits of fp16 bits h, NaNs by the contract's rule and the rest by NumPy."""
    h = np.asarray(h, dtype=np.uint16)
    with np.errstate(all="ignore"):
        out = h.view(np.float16).astype(np.float32).view(np.uint32).copy()
    hn = h[fp16_nan(h)].astype(np.uint32)
    out[fp16_nan(h)] = ((hn & 0x8000) << 16) | 0x7F800000 | ((hn & 0x03FF) << 13)
    return out


def fp32_to_fp16_bits(f):
    """The fp16 bits of float32 bits f (round to nearest even by NumPy; NaNs keep the sign and the
    top 10 payload bits, a payload that would vanish becoming 1)."""
    f = np.asarray(f, dtype=np.uint32)
    with np.errstate(all="ignore"):
        out = f.view(np.float32).astype(np.float16).view(np.uint16).copy()
    nan = (f & 0x7FFFFFFF) > 0x7F800000
    m = (f[nan] & 0x007FFFFF) >> 13
    out[nan] = (((f[nan] >> 16) & 0x8000) | 0x7C00 | np.where(m != 0, m, 1)).astype(np.uint16)
    return out


def test_fp16_nan_rule_in_integers():
    h = np.array([0x7C01, 0xFC01, 0x7E00, 0x7FFF, 0x7D55, 0x7C00, 0x3C00], np.uint16)
    assert fp16_to_fp32_bits(h).tolist() == [0x7F802000, 0xFF802000, 0x7FC00000, 0x7FFFE000,
                                             0x7FAAA000, 0x7F800000, 0x3F800000]
    f = np.array([0x7F800001, 0xFF801FFF, 0x7FC00000, 0x7F802000, 0x7FFFFFFF, 0x3F800000],
                 np.uint32)
    assert fp32_to_fp16_bits(f).tolist() == [0x7C01, 0xFC01, 0x7E00, 0x7C01, 0x7FFF, 0x3C00]


def finite_fp16(rng, n):
    """n finite fp16 scales: normal values of many magnitudes and signs, subnormals, zeros."""
    mag = np.exp2(rng.uniform(-14, 15, n)) * rng.choice([-1.0, 1.0], n)
    v = mag.astype(np.float16)
    v[rng.random(n) < 0.05] = np.float16(0)
    sub = rng.random(n) < 0.05
    v[sub] = (rng.integers(1, 1024, sub.sum()) * 2.0 ** -24).astype(np.float16)
    assert np.isfinite(v).all()
    return v.view(np.uint16)


def random_blocks(rng, dt, rows, cols, scale_value=None):
    """rows x cols weights of format dt: random bytes, fp16 scale fields finite (or all set to
    scale_value)."""
    bb = mf.ck_dtype_block_bytes(dt)
    nb = rows * cols // block_size(dt)
    raw = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
    for off in SCALE_FIELDS[dt]:
        if scale_value is None:
            bits = finite_fp16(rng, nb)
        else:
            bits = np.full(nb, np.float16(scale_value).view(np.uint16), dtype=np.uint16)
        raw[:, off:off + 2] = bits.view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, cols // block_size(dt) * bb)


def llama_data(offset, n):
    """llama.cpp generate_data: dst[i] = 0.1 + 2*cosf(i + offset) (cosf in float, + 0.1 in
    double)."""
    c = np.cos(np.arange(n, dtype=np.float32) + np.float32(offset))
    return (0.1 + 2.0 * c.astype(np.float64)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_block_layout_matches_ggml(dt):
    block, nbytes = GGML_QUANT_SIZES[GGUF_TYPE[dt]]
    assert (mf.ck_dtype_block_size(dt), mf.ck_dtype_block_bytes(dt)) == (block, nbytes)
    x = np.zeros((3, 2 * block), dtype=np.float32)
    assert mf.quantize(x, dt).shape == (3, 2 * nbytes)
    assert mf.quantize(x, dt).dtype == np.uint8


def test_public_surface():
    assert "quantize" in mf.__all__ and "dequantize" in mf.__all__
    assert mf.quantize is _kernels.quantize and mf.dequantize is _kernels.dequantize


# ---------------------------------------------------------------------------------------------
# dequantize == gguf.quants.dequantize, bit for bit
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_dequantize_random_blocks_bit_exact(simd_level, dt):
    rng = np.random.default_rng(int(dt))
    cols = 8 * block_size(dt)
    blob = random_blocks(rng, dt, 37, cols)
    got = mf.dequantize(blob, dt, (37, cols))
    assert same_bits(got, g_dequantize(blob, dt))
    # Any leading shape, and a flat blob: only the byte count matters.
    got3 = mf.dequantize(blob.reshape(-1), dt, (37, 1, cols))
    assert same_bits(got3.reshape(37, cols), got)


@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_dequantize_every_scale_value_bit_exact(simd_level, dt):
    """Scale fields taking every fp16 value -- subnormals, Inf and NaN payloads included: every
    non-NaN value is gguf's bit for bit, NaN where gguf's is, with a payload the contract allows
    (which NaN operand d * q + m passes on is the CPU's and NumPy's choice: NumPy 2.2 and 2.4
    differ on x86)."""
    rng = np.random.default_rng(100 + int(dt))
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    nb = 65536 if block_size(dt) == 32 else 4096
    raw = rng.integers(0, 256, (nb, mf.ck_dtype_block_bytes(dt)), dtype=np.uint8)
    for i, off in enumerate(SCALE_FIELDS[dt]):
        bits = every if nb == 65536 else rng.choice(every, nb)
        bits = rng.permutation(bits) if i else bits
        raw[:, off:off + 2] = bits.view(np.uint8).reshape(nb, 2)
    raw[:16, SCALE_FIELDS[dt][0]:SCALE_FIELDS[dt][0] + 2] = np.array(
        [0x7c00, 0xfc00, 0x7c01, 0xfe00, 0x7e00, 0x7fff, 0xffff, 0x0001, 0x8001, 0x03ff, 0x0400,
         0x7bff, 0xfbff, 0x0000, 0x8000, 0x3c00], np.uint16).view(np.uint8).reshape(16, 2)
    n = nb * block_size(dt)
    got = mf.dequantize(raw, dt, n).reshape(nb, -1)
    want = g_dequantize(raw, dt).reshape(nb, -1)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert same_bits(got[~nan], want[~nan])
    # A NaN result is one of its block's NaN scale fields, quieted (d * q + m: which one the
    # CPU's NaN propagation picks), or, in a block with an infinite field, the default NaN of
    # Inf * 0 or Inf - Inf (x86: negative, aarch64: positive).
    fields = np.stack([raw[:, off:off + 2].copy().view(np.uint16)[:, 0]
                       for off in SCALE_FIELDS[dt]], axis=1)                  # [nb, fields]
    cand = np.where(fp16_nan(fields), fp16_to_fp32_bits(fields) | 0x00400000, 0)
    inf = ((fields & 0x7FFF) == 0x7C00).any(axis=1, keepdims=True)
    cand = np.concatenate([cand, np.where(inf, 0x7FC00000, 0), np.where(inf, 0xFFC00000, 0)],
                          axis=1).astype(np.uint32)
    gotb = got.view(np.uint32)
    hit = (gotb[:, :, None] == cand[:, None, :]).any(axis=2)
    assert hit[nan].all()


def test_dequantize_fp16_every_value(simd_level):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(2, 32768)
    want = fp16_to_fp32_bits(bits).view(np.float32)
    assert fp16_nan(bits).sum() == 2 * 1023                      # NaNs, signalling ones too
    finite = ~fp16_nan(bits)
    with np.errstate(invalid="ignore"):   # aarch64's NumPy casts by fcvt: a signalling NaN
        cast = bits.view(np.float16).astype(np.float32)   # raises the invalid flag there
    assert same_bits(want[finite], cast[finite])                  # gguf's
    assert same_bits(mf.dequantize(bits, DT.FP16, bits.shape), want)
    assert same_bits(mf.dequantize(bits.view(np.float16), DT.FP16, bits.shape), want)
    tail = np.ascontiguousarray(bits[:, :1001])                   # an odd length: scalar tail
    assert same_bits(mf.dequantize(tail, DT.FP16, (2, 1001)), want[:, :1001])


def test_dequantize_bf16_every_value_and_fp32(simd_level):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(4, 16384)
    assert same_bits(mf.dequantize(bits, DT.BF16, bits.shape), g_dequantize(bits, DT.BF16))
    rng = np.random.default_rng(3)
    f = rng.integers(0, 2**32, (5, 77), dtype=np.uint32).view(np.float32)
    got = mf.dequantize(f, DT.FP32, f.shape)
    assert same_bits(got, f) and not np.shares_memory(got, f)


@pytest.mark.parametrize("dt", [dt for dt in BLOCK32_FORMATS if dt in GGUF_QUANTIZES])
def test_dequantize_gguf_quantized_data(simd_level, dt):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((16, 4096)) * rng.uniform(0.01, 10, (16, 1))).astype(np.float32)
    blob = g_quantize(x, dt)
    assert same_bits(mf.dequantize(blob, dt, x.shape), g_dequantize(blob, dt))


@pytest.mark.parametrize("dt", OWN_QUANTIZES)
def test_gguf_dequantizes_our_blocks_like_us(simd_level, dt):
    rng = np.random.default_rng(7)
    rows = [llama_data(0, 1024), rng.standard_normal(1024), np.zeros(1024),
            rng.uniform(-3, 1, 1024), rng.standard_normal(1024) * 1e-3,
            np.where(np.arange(1024) == 5, 100.0, rng.standard_normal(1024))]
    x = np.stack(rows).astype(np.float32)
    blob = mf.quantize(x, dt)
    ours = mf.dequantize(blob, dt, x.shape)
    assert same_bits(ours, g_dequantize(blob, dt))
    assert same_bits(ours, ref.dequantize(blob, dt, x.shape).astype(np.float32))
    assert np.all(ours[2] == 0)


# ---------------------------------------------------------------------------------------------
# quantize == gguf.quants.quantize, bit for bit
# ---------------------------------------------------------------------------------------------

def _quantize_cases():
    rng = np.random.default_rng(11)
    n = 256
    normal = rng.standard_normal(n)
    cases = {
        "normal": normal,
        "scaled": normal * np.repeat(np.exp2(rng.uniform(-20, 20, n // 32)), 32),
        "zeros": np.zeros(n),
        "negative_zeros": -np.zeros(n),
        "constant": np.full(n, -2.5),
        "integers": rng.integers(-1000, 1000, n) / 8.0,
        "tiny": normal * 1e-30,
        "subnormal": normal * 1e-39,
        "deep_subnormal": normal * 1e-44,
        "huge": normal * 1e38,
        "max_float": np.full(n, 3.4e38) * np.sign(normal),
        "fp16_overflow": normal * 7e4,
        "one_outlier": np.where(np.arange(n) % 32 == 7, 1e20, normal * 1e-20),
    }
    nonfinite = normal.copy()
    nonfinite[[3, 40, 77, 200]] = [np.nan, np.inf, -np.inf, -np.nan]
    nonfinite[96:128] = np.nan
    nonfinite[128:130] = [np.inf, -np.inf]
    cases["nan_inf"] = nonfinite
    return {k: np.asarray(v, dtype=np.float32) for k, v in cases.items()}


QUANTIZE_CASES = _quantize_cases()


def _numpy_casts_as_x86():
    """Whether this NumPy's float32 -> uint8 cast gives x86-64's bytes where C leaves it undefined
    (NaN, +-Inf, out of range -> 0); aarch64's saturates (+Inf -> 255)."""
    probe = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, -1.5, 300.5], dtype=np.float32)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.array_equal(probe.astype(np.uint8), ref.x86_cast_u8(probe))


NUMPY_CASTS_AS_X86 = _numpy_casts_as_x86()


def test_x86_cast_u8():
    v = np.array([np.nan, -np.nan, np.inf, -np.inf, 2.0 ** 31, -2.0 ** 31, 2.0 ** 31 - 128,
                  -1.5, -0.5, 0.0, 255.9, 256.0, 300.5, -300.5], dtype=np.float32)
    want = [0, 0, 0, 0, 0, 0, 0x80, 255, 0, 0, 255, 0, 44, 212]
    assert ref.x86_cast_u8(v).tolist() == want


@pytest.mark.parametrize("dt", GGUF_QUANTIZES)
def test_quantize_matches_gguf(simd_level, dt):
    """Bytes of gguf.quants.quantize.  Q4_0 / Q4_1 / Q5_0 / Q5_1: the reference (gguf's arithmetic
    with x86-64's cast, what the contract promises on every platform) on every case, and gguf's
    own bytes wherever this NumPy's cast is defined (every block, where it casts as x86 does)."""
    for name, row in QUANTIZE_CASES.items():
        x = row.reshape(2, -1)
        got = mf.quantize(x, dt)
        want = g_quantize(x, dt)
        if dt not in ref.LEGACY_QUANTIZERS:
            assert same_bits(got, want), f"{dt.name}, case {name!r}"
            continue
        assert same_bits(got, ref.LEGACY_QUANTIZERS[dt](x)), f"{dt.name}, case {name!r}"
        values, _ = ref.legacy_cast_inputs(x, dt)
        defined = ((values >= 0) & (values < 256)).all(axis=1)      # NaN: not defined
        if NUMPY_CASTS_AS_X86:
            defined[:] = True
        nbytes = block_bytes(dt)
        got_b, want_b = got.reshape(-1, nbytes), want.reshape(-1, nbytes)
        assert same_bits(got_b[defined], want_b[defined]), f"{dt.name}, case {name!r}"


def test_legacy_quantizers_subnormal_blocks(simd_level):
    """Blocks whose 1/d overflows (subnormal d): every cast input is +-Inf or NaN, so the codes are
    what the contract defines (x86-64's cast: 0), not this platform's NumPy's; d is 0 in fp16."""
    for name in ("subnormal", "deep_subnormal"):
        x = QUANTIZE_CASES[name].reshape(2, -1)
        for dt, quantize in ref.LEGACY_QUANTIZERS.items():
            values, heads = ref.legacy_cast_inputs(x, dt)
            assert not np.isfinite(values).any() and (heads[0] != 0).all()
            got = mf.quantize(x, dt).reshape(-1, block_bytes(dt))
            fp16 = np.ascontiguousarray(got[:, :2 * len(heads)]).view("<u2")
            assert not (fp16 & 0x7FFF).any()                           # d (and min): +-0 in fp16
            assert not got[:, -16:].any()                              # qs: codes 0
            assert same_bits(got, quantize(x).reshape(got.shape))


@pytest.mark.parametrize("dt", GGUF_QUANTIZES)
def test_quantize_bulk_matches_gguf(simd_level, dt):
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((64, 2048)) * rng.uniform(1e-3, 1e3, (64, 1))).astype(np.float32)
    assert same_bits(mf.quantize(x, dt), g_quantize(x, dt))


def test_fp16_rounding_of_arbitrary_floats(simd_level):
    """fp32 -> fp16 on random bit patterns (every exponent, NaN payloads, subnormals): NumPy's
    float16 cast, bit for bit -- the vector (F16C) and the scalar paths alike."""
    rng = np.random.default_rng(17)
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint32)
    bits[:64] = [0x7f800001, 0xff800001, 0x7fc00000, 0xffc00000, 0x7f801fff, 0x7fbfffff,
                 0x33000000, 0x33000001, 0xb3000000, 0x387fc000, 0x387fe000, 0x38800000,
                 0x477fefff, 0x477ff000, 0x477fe000, 0x7f7fffff, 0x00000001, 0x80000000] + \
        list(range(0x38000000, 0x38000000 + 46 * 0x1000, 0x1000))
    x = bits.view(np.float32).reshape(256, -1)
    want = fp32_to_fp16_bits(bits).reshape(x.shape)
    assert same_bits(mf.quantize(x, DT.FP16), want)
    nan = np.isnan(x)
    assert nan.sum() > 1000 and (bits.reshape(x.shape)[nan] & 0x00400000 == 0).sum() > 500
    with np.errstate(all="ignore"):
        numpy = x.astype(np.float16).view(np.uint16)
    assert same_bits(want[~nan], numpy[~nan])
    assert fp16_nan(numpy[nan]).all()
    want_bf16 = g_quantize(x, DT.BF16)
    assert same_bits(mf.quantize(x, DT.BF16), want_bf16)


def test_quantize_accepts_any_layout(simd_level):
    rng = np.random.default_rng(19)
    base = rng.standard_normal((4, 3, 512)).astype(np.float32)
    want = mf.quantize(base, DT.Q4_K)
    assert want.shape == (4, 3, 2 * 144)
    strided = np.zeros((4, 3, 1024), dtype=np.float32)
    strided[..., ::2] = base
    assert same_bits(mf.quantize(strided[..., ::2], DT.Q4_K), want)      # not contiguous
    ro = base.copy()
    ro.flags.writeable = False
    assert same_bits(mf.quantize(ro, DT.Q4_K), want)                      # read-only
    fortran = np.asfortranarray(base)
    assert same_bits(mf.quantize(fortran, DT.Q4_K), want)
    copy = mf.quantize(base, DT.FP32)
    assert same_bits(copy, base) and not np.shares_memory(copy, base)
    assert mf.quantize(base, DT.FP16).dtype == np.uint16
    assert mf.quantize(base, DT.FP16).shape == base.shape
    empty = mf.quantize(np.zeros((0, 64), np.float32), DT.Q8_0)
    assert empty.shape == (0, 68)
    assert mf.dequantize(empty, DT.Q8_0, (0, 64)).shape == (0, 64)


def test_quantize_identical_across_levels():
    rng = np.random.default_rng(23)
    x = rng.standard_normal((8, 1024)).astype(np.float32)
    x[0, 5] = np.nan
    x[1, 300] = np.inf
    before = mf.simd_level()
    try:
        results = {}
        for level in _simd.supported_levels():
            _kernels._load_level(level)
            results[level] = {dt: mf.quantize(x, dt) for dt in WEIGHT_FORMATS}
    finally:
        _kernels._load_level(before)
    first = next(iter(results.values()))
    for level, res in results.items():
        for dt in WEIGHT_FORMATS:
            assert same_bits(res[dt], first[dt]), (level, dt.name)


# ---------------------------------------------------------------------------------------------
# llama.cpp tests/test-quantize-fns.cpp, mirrored
# ---------------------------------------------------------------------------------------------

def llama_array_rmse(a1, a2):
    """sqrtf(sum (double)(a1[i] - a2[i])^2) / n, the difference taken in float."""
    diff = (a1.astype(np.float32) - a2.astype(np.float32)).astype(np.float64)
    total = float(np.sum(diff * diff))
    return float(np.float32(np.sqrt(np.float32(total))) / np.float32(a1.size))


def llama_dot_product(a1, a2):
    """sum += a1[i] * a2[i]: float products, double sum, returned as float."""
    return float(np.float32(np.sum((a1 * a2).astype(np.float64))))


@pytest.mark.parametrize("dt", WEIGHT_FORMATS)
def test_llama_cpp_quantize_fns(simd_level, dt):
    n = 32 * 128
    w = llama_data(0.0, n)
    a = llama_data(1.0, n)
    blob = mf.quantize(w, dt)
    total_error = llama_array_rmse(w, mf.dequantize(blob, dt, n))
    total_tol = {DT.Q2_K: "llama_total_error_2bits", DT.Q3_K: "llama_total_error_3bits"}
    assert total_error < TOL[total_tol.get(dt, "llama_total_error")], total_error
    dot_ref = llama_dot_product(w, a)
    dot_tol = TOL["llama_dot_error_lowbit" if dt == DT.Q2_K else "llama_dot_error"]
    for quantized in (True, False):
        result = np.float32(_kernels._row_dot(blob, dt, a, quantized))
        dot_error = float(np.abs(result - np.float32(dot_ref)) / np.float32(n))
        assert dot_error < dot_tol, (quantized, dot_error)


# ---------------------------------------------------------------------------------------------
# Dot products
# ---------------------------------------------------------------------------------------------

def _dot_sizes(dt):
    b = block_size(dt)
    return [1, 7, 8, 15, 16, 33, 100, 1000, 4096] if b == 1 else [b, 3 * b, 4096 + b]


@pytest.mark.parametrize("dt", WEIGHT_FORMATS)
def test_float_dot_matches_float64(simd_level, dt):
    rng = np.random.default_rng(29 + int(dt))
    for n in _dot_sizes(dt):
        for trial in range(3):
            w = (rng.standard_normal(n) * np.exp(rng.uniform(-3, 3))).astype(np.float32)
            x = (rng.standard_normal(n) * np.exp(rng.uniform(-3, 3))).astype(np.float32)
            if trial == 2 and dt in BLOCK_FORMATS:                     # random blocks too
                blob = random_blocks(rng, dt, 1, n).reshape(-1)
            else:
                blob = mf.quantize(w, dt)
            wd = mf.dequantize(blob, dt, n).astype(np.float64)
            exact = math.fsum(wd * x.astype(np.float64))
            scale = float(np.sum(np.abs(wd * x)))
            got = _kernels._row_dot(blob, dt, x, False)
            assert abs(got - exact) <= TOL["float_dot"] * scale + 1e-30, (n, got, exact)


def activation_emulation(x, dt):
    """The int8 path's activations as float64 (megafuse.reference's quantizers)."""
    if dt in BLOCK32_FORMATS:
        q, d = ref.quantize_q8_0(x)
        return q.reshape(-1, 32).astype(np.float64) * d.astype(np.float64).reshape(-1, 1)
    if dt in KQUANT_FORMATS:
        q, d, _ = ref.quantize_q8_K(x)
        return q.reshape(-1, 256).astype(np.float64) * d.astype(np.float64).reshape(-1, 1)
    return x.astype(np.float64)


@pytest.mark.parametrize("dt", WEIGHT_FORMATS)
def test_int8_dot_matches_emulation(simd_level, dt):
    """weights (dequantized, gguf) . activations (quantized as the reference emulates) in
    float64 -- the kernel's integer sums are exact, so only float rounding is left."""
    rng = np.random.default_rng(31 + int(dt))
    tol = TOL["int8_dot"] if dt in BLOCK_FORMATS else TOL["float_dot"]
    for n in _dot_sizes(dt):
        for trial in range(3):
            x = (rng.standard_normal(n) * np.exp(rng.uniform(-3, 3))).astype(np.float32)
            if trial == 2 and dt in BLOCK_FORMATS:
                blob = random_blocks(rng, dt, 1, n).reshape(-1)
            else:
                blob = mf.quantize(rng.standard_normal(n).astype(np.float32), dt)
            wd = g_dequantize(blob, dt).reshape(-1).astype(np.float64)
            xa = activation_emulation(x, dt).reshape(-1)
            exact = math.fsum(wd * xa)
            scale = float(np.sum(np.abs(wd * xa)))
            got = _kernels._row_dot(blob, dt, x, True)
            assert abs(got - exact) <= tol * scale + 1e-30, (n, got, exact)


def _integer_case(rng, dt, n):
    """A weight row whose scales are exactly 1 (so every weight is an integer) and activations
    that quantize to integers with scale +-1: the dot is an exact integer."""
    blob = random_blocks(rng, dt, 1, n, scale_value=1.0).reshape(-1)
    if dt in (DT.Q4_1, DT.Q5_1):                       # m: a small integer too
        nb = n // 32
        blocks = blob.reshape(nb, -1)
        m = rng.integers(-8, 8, nb).astype(np.float16).view(np.uint16)
        blocks[:, 2:4] = m.view(np.uint8).reshape(nb, 2)
    group = 32 if dt in BLOCK32_FORMATS else 256
    x = rng.integers(-126, 127, n).astype(np.float32)
    x[::group] = 127.0                                  # amax 127: d = 1 (Q8_0), iscale -1 (Q8_K)
    return blob, x


@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_int8_dot_integer_parts_are_exact(simd_level, dt):
    rng = np.random.default_rng(37 + int(dt))
    for n in (block_size(dt), 4096):
        blob, x = _integer_case(rng, dt, n)
        w = mf.dequantize(blob, dt, n).astype(np.float64)
        assert np.array_equal(w, np.round(w))                 # integer weights
        xa = activation_emulation(x, dt).reshape(-1)
        assert np.array_equal(xa, x)                          # activations quantize exactly
        exact = int(sum(int(a) * int(b) for a, b in zip(w, x)))
        assert _kernels._row_dot(blob, dt, x, True) == float(np.float32(exact))


def test_int8_dot_across_levels():
    """K-quants: the same bits at every level (exact integer sums, then the same double
    arithmetic), one row (_row_dot) or six at once (_rows_dot: the 4-row kernels of AVX-512 pair
    rows in 512-bit registers).  32-weight formats: each level has its own float sequence (AVX2
    per int32 lane, AVX-512 per block as the NEON levels, generic in double), each within
    int8_dot of the exact value, so within twice that of the others."""
    rng = np.random.default_rng(41)
    before = mf.simd_level()
    cases = []
    for dt in BLOCK_FORMATS:
        for n in (block_size(dt), 5 * block_size(dt), 4096 + 3 * 32 * (dt in BLOCK32_FORMATS)):
            w = random_blocks(rng, dt, 6, n)
            x = rng.standard_normal(n).astype(np.float32)
            wd = g_dequantize(w[0], dt).reshape(-1).astype(np.float64)
            scale = float(np.sum(np.abs(wd * activation_emulation(x, dt).reshape(-1))))
            cases.append((dt, w, x, scale))
    try:
        results = {}
        for level in _simd.supported_levels():
            _kernels._load_level(level)
            results[level] = [(_kernels._row_dot(b[0], dt, x, True),
                               _kernels._rows_dot(b, dt, x, True)) for dt, b, x, _ in cases]
    finally:
        _kernels._load_level(before)
    first = next(iter(results.values()))
    simd = [lv for lv in results if lv != "generic"]
    for level, res in results.items():
        for (dt, _, _, scale), (got, _), (want, _) in zip(cases, res, first):
            if dt in KQUANT_FORMATS:
                assert got == want, (level, dt.name)
            else:
                assert abs(got - want) <= 2 * TOL["int8_dot"] * scale, (level, dt.name)
    if len(simd) > 1:
        for (dt, _, _, _), a, b in zip(cases, results[simd[0]], results[simd[-1]]):
            if dt in KQUANT_FORMATS:
                assert a[0] == b[0] and same_bits(a[1], b[1]), (simd, dt.name)


def _block32_codes(w, dt, n):
    """The signed codes q_w [nb, 32] of one row of a 32-weight format (Q4_1 / Q5_1: the unsigned
    codes) and its d, m [nb] as float32 (m = 0 for the symmetric formats)."""
    b = w.reshape(n // 32, -1)
    d = ref._fp16_to_f32(b[:, 0:2]).reshape(-1)
    m = np.zeros_like(d)
    if dt in (DT.Q4_1, DT.Q5_1):
        m = ref._fp16_to_f32(b[:, 2:4]).reshape(-1)
    if dt == DT.Q8_0:
        return np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.int64), d, m
    qs = {DT.Q4_0: 2, DT.Q4_1: 4, DT.Q5_0: 6, DT.Q5_1: 8, DT.IQ4_NL: 2}[dt]
    q = ref._nibbles(b[:, qs:qs + 16]).astype(np.int64)
    if dt in (DT.Q5_0, DT.Q5_1):
        q |= ref._high_bits_32(b[:, qs - 4:qs]).astype(np.int64)
    if dt == DT.IQ4_NL:
        return ref.KVALUES_IQ4NL[q].astype(np.int64), d, m
    return q - {DT.Q4_0: 8, DT.Q5_0: 16}.get(dt, 0), d, m


def _block_sums_dot(w, dt, x):
    """The int8 dot of the AVX-512 and NEON levels for the 32-weight formats (mf_dot_q8.h), op by
    op: per block the exact sum I = q_w . q_a, the chain of its place k in its group of 4
    A_k = fma(float(I), d_w * d_a, A_k) (then fma(m_w, s_a, A_k) for Q4_1 / Q5_1), the result
    (A0 + A2) + (A1 + A3), all in float32 (each fma exact in long double, then rounded once)."""
    n = x.size
    qw, dw, mw = _block32_codes(w, dt, n)
    qa, da = ref.quantize_q8_0(x)
    qa = qa.reshape(-1, 32).astype(np.int64)
    sums = (qw * qa).sum(axis=1)
    sa = (da * qa.sum(axis=1).astype(np.float32)).astype(np.float32)      # exact
    acc = [np.float32(0)] * 4

    def fma(a, b, c):
        return np.float32(np.longdouble(a) * np.longdouble(b) + np.longdouble(c))

    for blk in range(n // 32):
        k = blk % 4
        acc[k] = fma(np.float32(sums[blk]), np.float32(dw[blk] * da[blk]), acc[k])
        if dt in (DT.Q4_1, DT.Q5_1):
            acc[k] = fma(mw[blk], sa[blk], acc[k])
    return np.float32(np.float32(acc[0] + acc[2]) + np.float32(acc[1] + acc[3]))


@pytest.mark.parametrize("dt", BLOCK32_FORMATS)
def test_int8_dot_of_block_sums(dt):
    """The 32-weight formats' int8 dot at the levels of the block-sum sequence (avx512, neon,
    neon_dotprod, i8mm: those this CPU has) is _block_sums_dot bit for bit, one row and six,
    for rows of 1..3 whole groups and a last group of 1, 2 or 3 blocks."""
    levels = [lv for lv in _simd.supported_levels()
              if lv in ("avx512", "neon", "neon_dotprod", "i8mm")]
    if not levels:
        pytest.skip("this CPU has none of avx512, neon, neon_dotprod, i8mm")
    rng = np.random.default_rng(71 + int(dt))
    cases = []
    for n in (32, 64, 96, 128, 160, 4096 + 96):
        w = random_blocks(rng, dt, 6, n)
        x = (rng.standard_normal(n) * np.exp(rng.uniform(-2, 2))).astype(np.float32)
        cases.append((w, x, np.array([_block_sums_dot(w[r], dt, x) for r in range(6)])))
    before = mf.simd_level()
    try:
        for level in levels:
            _kernels._load_level(level)
            for w, x, want in cases:
                one = np.array([_kernels._row_dot(w[r], dt, x, True) for r in range(6)],
                               np.float32)
                assert same_bits(one, want), (level, x.size)
                assert same_bits(_kernels._rows_dot(w, dt, x, True), want), (level, x.size)
    finally:
        _kernels._load_level(before)


@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_int8_multirow_dot_is_the_one_row_dot(simd_level, dt):
    """The one-token kernel of the projections (4 rows side by side, _rows_dot) gives every row
    the bits of its one-row dot (_row_dot): rows in groups of 4 and a last group of 1..3, row
    lengths with a last group of 1, 2 or 3 blocks and several chunks.  (The multi-token tiles are
    pinned to the one-token kernel by the prefill and MLP tests at the end of this file.)"""
    rng = np.random.default_rng(67 + int(dt))
    b = block_size(dt)
    sizes = [b, 2 * b, 3 * b, 4 * b, 5 * b, 43 * b, 33 * b] if b == 32 else [b, 2 * b, 5 * b, 9 * b]
    for n in sizes:
        for rows in (1, 3, 4, 6, 9):
            w = random_blocks(rng, dt, rows, n)
            x = (rng.standard_normal(n) * np.exp(rng.uniform(-2, 2))).astype(np.float32)
            many = _kernels._rows_dot(w, dt, x, True)
            one = np.array([_kernels._row_dot(w[r], dt, x, True) for r in range(rows)],
                           np.float32)
            assert same_bits(many, one), (n, rows)


@pytest.mark.parametrize("dt", [DT.FP16, DT.BF16] + list(BLOCK_FORMATS))
def test_float_multirow_dot_is_the_one_row_dot(simd_level, dt):
    """The float path's one-token kernel (4 rows side by side) gives every row the bits of its
    one-row dot: FP16 / BF16 rows with a tail past the last 16 values, the block formats over
    several blocks; rows in groups of 4 and a last group of 1..3."""
    rng = np.random.default_rng(71 + int(dt))
    b = block_size(dt)
    sizes = [1, 15, 16, 17, 40, 895, 2048] if b == 1 else [b, 3 * b, 9 * b]
    for n in sizes:
        for rows in (1, 3, 4, 6, 9):
            x = rng.standard_normal((rows, n)).astype(np.float32)
            w = mf.quantize(x, dt)                          # [rows, row storage]
            a = (rng.standard_normal(n) * np.exp(rng.uniform(-2, 2))).astype(np.float32)
            many = _kernels._rows_dot(w, dt, a, False)
            one = np.array([_kernels._row_dot(w[r], dt, a, False) for r in range(rows)],
                           np.float32)
            assert same_bits(many, one), (n, rows)


def test_float_dot_of_block_formats_across_levels():
    """The float path of the block formats runs a row in 16 lanes at avx512 and in 8 at avx2, so
    the two levels agree within float32 rounding (of the sum of |w_i x_i|), each bitwise with its
    own one-row dot (the test above).  One row and six (a group of 4 side by side, then 2), rows
    of 1, 9 and 64 blocks."""
    levels = [lv for lv in ("avx2", "avx512") if lv in _simd.supported_levels()]
    if len(levels) < 2:
        pytest.skip("needs both the avx2 and the avx512 level")
    rng = np.random.default_rng(73)
    cases = []
    for dt in BLOCK_FORMATS:
        for blocks in (1, 9, 64):
            n = blocks * block_size(dt)
            cases.append((dt, random_blocks(rng, dt, 6, n),
                          rng.standard_normal(n).astype(np.float32)))
    before = mf.simd_level()
    results = {}
    try:
        for level in levels:
            _kernels._load_level(level)
            results[level] = [(_kernels._row_dot(w[0], dt, x, False),
                               _kernels._rows_dot(w, dt, x, False)) for dt, w, x in cases]
    finally:
        _kernels._load_level(before)
    for (dt, w, x), a, b in zip(cases, *results.values()):
        wf = mf.dequantize(w, dt, (6, x.size)).astype(np.float64)      # [6, n]
        bound = 1e-5 * (np.abs(wf) @ np.abs(x.astype(np.float64)))     # [6]
        assert abs(a[0] - b[0]) <= bound[0], (dt.name, x.size)
        assert np.all(np.abs(a[1].astype(np.float64) - b[1]) <= bound), (dt.name, x.size)


@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_int8_dot_extreme_codes_are_exact(simd_level, dt):
    """Every code at its largest (all code bits set), scales 1 (Q6_K: its int8 scales 127),
    activations all +127, all -127 or alternating: the int16 sums inside the dots sit at their
    bounds (the K-quant dots add two registers' pair sums before one pmaddwd: up to 2 * 16002),
    and the result is an exact integer.  The one-row and 4-row dots must both give it.  IQ4_NL
    and IQ4_XS also with every index 0 (the value -127; IQ4_XS's scales 0: the factor -32)."""
    n, rows = 2 * block_size(dt) if dt in KQUANT_FORMATS else 512, 5
    fills = (0xFF, 0x00) if dt in (DT.IQ4_NL, DT.IQ4_XS) else (0xFF,)
    for fill in fills:
        _extreme_codes_case(dt, n, rows, fill)


def _extreme_codes_case(dt, n, rows, fill):
    raw = np.full((rows * n // block_size(dt), mf.ck_dtype_block_bytes(dt)), fill, np.uint8)
    for off in SCALE_FIELDS[dt]:
        raw[:, off:off + 2] = np.array([np.float16(1.0)]).view(np.uint8)
    if dt == DT.Q6_K:
        raw[:, 192:208] = 127
    w = raw.reshape(rows, -1)
    wd = mf.dequantize(w, dt, (rows, n)).astype(np.float64)  # [rows, n], integers
    for x in (np.full(n, 127.0), np.full(n, -127.0), np.where(np.arange(n) % 2, 127.0, -127.0)):
        x = x.astype(np.float32)
        assert np.array_equal(activation_emulation(x, dt).reshape(-1), x)   # codes +-127, d = 1
        exact = np.array([float(np.float32(int(sum(int(a) * int(b) for a, b in zip(r, x)))))
                          for r in wd], np.float32)
        many = _kernels._rows_dot(w, dt, x, True)
        one = np.array([_kernels._row_dot(w[r], dt, x, True) for r in range(rows)], np.float32)
        assert same_bits(one, exact), (dt.name, one, exact)
        assert same_bits(many, exact), (dt.name, many, exact)


# ---------------------------------------------------------------------------------------------
# Activation quantizers == megafuse.reference (GGML's quantize_row_q8_0_ref / q8_K_ref)
# ---------------------------------------------------------------------------------------------

def decode_q8_0(raw, n):
    """(codes [R * n], d [R * n / 32], s [R * n / 32]) of Q8_0 activation rows of n values
    (include/megafuse/mf_act_layout.h): per group of 4 blocks 128 code bytes, two pairs of blocks
    (i, j) as [i 0..15 | j 0..15 | i 16..31 | j 16..31]; then per group 8 floats, [d, s] of blocks
    0, 2, 1, 3; then zeros to a multiple of 64 bytes.  Blocks past n / 32 must be zero."""
    nb = n // 32
    ng = -(-nb // 4)
    rows = raw.reshape(-1, raw.shape[-1])
    assert rows.shape[1] == -(-ng * 160 // 64) * 64
    codes = rows[:, :ng * 128].reshape(-1, ng * 2, 2, 2, 16)      # [R, pair, lo/hi, block, 16]
    codes = codes.transpose(0, 1, 3, 2, 4).reshape(-1, ng * 4, 32).view(np.int8)
    f = np.ascontiguousarray(rows[:, ng * 128:ng * 160]).view(np.float32).reshape(-1, ng, 2, 2, 2)
    f = f.transpose(0, 1, 3, 2, 4).reshape(-1, ng * 4, 2)       # [R, block, (d, s)]
    assert not rows[:, ng * 160:].any()
    assert not codes[:, nb:].any() and not f[:, nb:].any()
    return (codes[:, :nb].reshape(-1), np.ascontiguousarray(f[:, :nb, 0]).reshape(-1),
            np.ascontiguousarray(f[:, :nb, 1]).reshape(-1))


def decode_q8_K(raw):
    b = raw.reshape(-1, block_bytes(DT.Q8_K))
    return (np.ascontiguousarray(b[:, 4:260]).view(np.int8).reshape(-1),
            np.ascontiguousarray(b[:, :4]).view(np.float32).reshape(-1),
            np.ascontiguousarray(b[:, 260:]).view(np.int16).reshape(-1))


def _activation_rows():
    rng = np.random.default_rng(43)
    rows = [rng.standard_normal(512) * 3, np.zeros(512), rng.standard_normal(512) * 1e-30,
            rng.standard_normal(512) * 1e30]
    ties = np.zeros(512)
    ties[:32] = np.arange(32) - 15.5           # Q8_0: amax 15.5 -> q = x * 127/15.5, no ties;
    ties[32] = 127.0                            # block 1: d = 1, x + .5 halves: away from zero
    ties[33:64] = np.arange(31) - 14.5
    ties[256] = -127.0                          # Q8_K block 1: max = -127 -> iscale 1, halves even
    ties[257:512] = (np.arange(255) % 40 - 19.5)
    rows.append(ties)
    signs = rng.standard_normal(512)
    signs[10], signs[20] = -50.0, 50.0          # first occurrence of the largest |x| is negative
    rows.append(signs)
    bad = rng.standard_normal(512)
    bad[[3, 300]] = [np.nan, np.inf]
    rows.append(bad)
    rows.extend(_tiny_activation_rows())
    return np.stack(rows).astype(np.float32)


def _inverse_overflow_edge(inverse):
    """The least float32 a > 0 whose inverse(a) is finite (the tiny blocks lie below it)."""
    f32 = np.float32
    a = f32(127) / np.finfo(np.float32).max
    with np.errstate(over="ignore"):
        while np.isfinite(inverse(a)):
            a = np.nextafter(a, f32(0))
        while not np.isfinite(inverse(a)):
            a = np.nextafter(a, f32(1))
    return a


def _q8_0_inverse(amax):
    return np.float32(1) / (amax / np.float32(127))         # 1 / d


def _q8_K_inverse(vmax):
    return np.float32(-127) / vmax                           # iscale


def _tiny_activation_rows():
    """Rows of blocks whose inverse scale overflows float32 (max |x| < 127 / FLT_MAX, ~3.7e-37),
    subnormal ones among them, and blocks one float either side of that edge."""
    rng = np.random.default_rng(47)
    e0, ek = _inverse_overflow_edge(_q8_0_inverse), _inverse_overflow_edge(_q8_K_inverse)
    below0, belowk = np.nextafter(e0, np.float32(0)), np.nextafter(ek, np.float32(0))
    tiny = rng.standard_normal(512) * 1e-38
    tiny[256:] = np.linspace(-1, 1, 256) * 3e-37
    subnormal = rng.standard_normal(512) * 1e-41
    subnormal[300] = -np.float32(1e-45)                      # the least subnormal, alone
    subnormal[301:] = 0
    edge = rng.uniform(-1, 1, 512)
    for b, amax in enumerate([e0, below0, -e0, -below0]):   # Q8_0 blocks 0..3 at the edge
        edge[32 * b:32 * b + 32] *= np.float64(abs(amax)) / np.abs(edge[32 * b:32 * b + 32]).max()
        edge[32 * b + 5] = amax
    edge[128:256] *= np.float64(below0) / 2                  # below the edge blocks
    edge[256:512] *= np.float64(ek) / np.abs(edge[256:512]).max()
    edge[300] = ek                                           # Q8_K block 1: iscale just finite
    edge2 = edge.copy()
    edge2[256:512] *= np.float64(belowk) / np.float64(ek)
    edge2[300] = belowk                                      # just overflowing, max > 0: d = -0
    return [tiny, subnormal, edge, edge2]


def test_activation_quantizers_tiny_blocks(simd_level):
    """Blocks too small for their inverse scale get codes 0 at every level (their float -> int
    conversions were out of range: undefined in C, -128 at avx2, 0 at generic, saturated on
    aarch64), Q8_0 d = s = 0, Q8_K d = 1 / iscale = -+0; one float above the edge they are
    quantized as any block."""
    x = np.stack(_tiny_activation_rows()).astype(np.float32)
    assert x.dtype == np.float32 and np.isfinite(x).all()
    e0, ek = _inverse_overflow_edge(_q8_0_inverse), _inverse_overflow_edge(_q8_K_inverse)
    q, d, s = decode_q8_0(_kernels._quantize_activations(x, DT.Q8_0), x.shape[1])
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1)
    over = amax < e0
    assert over.sum() > 0 and (~over).sum() >= 2                # both sides of the edge occur
    q = q.reshape(-1, 32)
    assert not q[over].any() and not d[over].any() and not s[over].any()
    assert (np.abs(q[~over]).max(axis=1) == 127).all()          # the largest |x| -> +-127
    rq, rd = ref.quantize_q8_0(x)
    assert np.array_equal(q, rq.reshape(-1, 32)) and same_bits(d, rd.reshape(-1))
    q, d, bs = decode_q8_K(_kernels._quantize_activations(x, DT.Q4_K))
    blocks = x.reshape(-1, 256)
    first = np.argmax(np.abs(blocks), axis=1)
    vmax = blocks[np.arange(len(blocks)), first]
    over = (vmax != 0) & (np.abs(vmax) < ek)
    assert over.sum() >= 2 and (~over).sum() >= 1
    q = q.reshape(-1, 256)
    assert not q[over].any() and not bs.reshape(-1, 16)[over].any()
    want_d = np.where(vmax[over] > 0, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    assert same_bits(d[over], want_d)                           # 1 / iscale = -+0
    assert (np.abs(q[~over]).max(axis=1) == 127).all()
    rq, rd, rbs = ref.quantize_q8_K(x)
    assert np.array_equal(q, rq.reshape(-1, 256)) and same_bits(d, rd.reshape(-1))
    assert np.array_equal(bs, rbs.reshape(-1))


def test_activation_quantizers_match_reference(simd_level):
    x = _activation_rows()
    for n in (x.shape[1], 32, 64, 96, 160):           # whole groups of 4 blocks, and 1, 2, 3
        q, d, sums = decode_q8_0(_kernels._quantize_activations(np.ascontiguousarray(x[:, :n]),
                                                                DT.Q4_0), n)
        rq, rd = ref.quantize_q8_0(x[:, :n])
        assert np.array_equal(q, rq.reshape(-1))
        assert same_bits(d, rd.reshape(-1).astype(np.float32)) or np.array_equal(
            d, rd.reshape(-1), equal_nan=True)
        want = d.astype(np.float64) * q.reshape(-1, 32).sum(axis=1)    # d * sum(q), exact
        assert np.array_equal(sums, want.astype(np.float32), equal_nan=True)
        assert np.array_equal(sums.astype(np.float64), want, equal_nan=True)
        assert np.abs(q).max() <= 127
    q, d, bs = decode_q8_K(_kernels._quantize_activations(x, DT.Q6_K))
    rq, rd, rbs = ref.quantize_q8_K(x)
    assert np.array_equal(q, rq.reshape(-1))
    nan = np.isnan(d)
    assert np.array_equal(nan, np.isnan(rd.reshape(-1)))
    assert same_bits(d[~nan], rd.reshape(-1)[~nan])                # -0 too
    assert np.array_equal(bs, rbs.reshape(-1))
    assert np.abs(q).max() <= 127
    # Every 32-weight format uses Q8_0, every K-quant Q8_K, float formats the float32 bytes.
    for dt in BLOCK32_FORMATS:
        assert same_bits(_kernels._quantize_activations(x, dt),
                         _kernels._quantize_activations(x, DT.Q8_0))
    for dt in KQUANT_FORMATS:
        assert same_bits(_kernels._quantize_activations(x, dt),
                         _kernels._quantize_activations(x, DT.Q4_K))
    assert same_bits(_kernels._quantize_activations(x, DT.FP16).view(np.float32), x)


# ---------------------------------------------------------------------------------------------
# NaN / Inf, threads, memmaps
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", WEIGHT_FORMATS)
def test_nan_and_inf_propagate(simd_level, dt):
    rng = np.random.default_rng(47)
    n = 512
    w = rng.standard_normal((2, n)).astype(np.float32)
    w[1, 7] = np.nan
    w[1, 300] = np.inf
    blob = mf.quantize(w, dt)                                   # no crash on NaN / Inf rows
    assert blob.shape[0] == 2
    y = mf.dequantize(blob, dt, w.shape)
    assert np.isfinite(y[0]).all()
    x = rng.standard_normal(n).astype(np.float32)
    x_bad = x.copy()
    x_bad[9] = np.nan
    for quantized in (False, True):
        assert np.isfinite(_kernels._row_dot(blob[0], dt, x, quantized))
        assert math.isnan(_kernels._row_dot(blob[0], dt, x_bad, quantized))
        x_inf = x.copy()
        x_inf[100] = np.inf
        assert not np.isfinite(_kernels._row_dot(blob[0], dt, x_inf, quantized))
    if dt in BLOCK_FORMATS:                                     # a NaN scale in a block
        bad = blob[0].copy()
        bad[SCALE_FIELDS[dt][0]:SCALE_FIELDS[dt][0] + 2] = np.array(
            [np.float16(np.nan)]).view(np.uint8)
        yb = mf.dequantize(bad, dt, n)
        bs = block_size(dt)
        assert np.isnan(yb[:bs]).all() and np.isfinite(yb[bs:]).all()
        assert math.isnan(_kernels._row_dot(bad, dt, x, False))
        assert math.isnan(_kernels._row_dot(bad, dt, x, True))


@pytest.mark.parametrize("dt", [DT.FP16, DT.Q4_0, DT.Q5_1, DT.IQ4_NL, DT.Q3_K, DT.Q4_K, DT.Q6_K,
                                DT.IQ4_XS])
def test_results_do_not_depend_on_threads(simd_level, threads, dt):
    rng = np.random.default_rng(53)
    x = rng.standard_normal((7, 3 * 8192 + 256)).astype(np.float32)   # several chunks a row
    out = {}
    for nt in (1, 2, 3):
        mf.set_num_threads(nt)
        blob = mf.quantize(x, dt)
        out[nt] = (blob, mf.dequantize(blob, dt, x.shape))
    for nt in (2, 3):
        assert same_bits(out[nt][0], out[1][0]) and same_bits(out[nt][1], out[1][1])
    w = out[1][0]
    a = x[0]
    for quantized in (False, True):                     # one fixed-order dot per row
        dots = {}
        for nt in (1, 2, 3):
            mf.set_num_threads(nt)
            dots[nt] = _kernels._rows_dot(w, dt, a, quantized)
        assert same_bits(dots[2], dots[1]) and same_bits(dots[3], dots[1])
        assert dots[1][0] == _kernels._row_dot(w[0], dt, a, quantized)


def test_readonly_memmap_at_any_offset(simd_level, tmp_path):
    rng = np.random.default_rng(59)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    for dt in (DT.Q4_K, DT.Q8_0, DT.FP16, DT.BF16):
        blob = mf.quantize(x, dt)
        want = mf.dequantize(blob, dt, x.shape)
        for offset in (0, 1, 3, 64):
            path = tmp_path / f"{dt.name}_{offset}.bin"
            path.write_bytes(b"\0" * offset + blob.tobytes())
            mm = np.memmap(path, dtype=blob.dtype, mode="r", offset=offset, shape=blob.shape)
            assert not mm.flags.writeable
            assert same_bits(mf.dequantize(mm, dt, x.shape), want), (dt.name, offset)
    path = tmp_path / "x.f32"
    path.write_bytes(x.tobytes())
    xm = np.memmap(path, dtype=np.float32, mode="r", shape=x.shape)
    assert same_bits(mf.quantize(xm, DT.Q5_K), mf.quantize(x, DT.Q5_K))


# ---------------------------------------------------------------------------------------------
# Validation: every error names its argument
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", NON_WEIGHT_DTYPES)
def test_non_weight_dtypes_are_rejected(bad):
    x = np.zeros((2, 256), np.float32)
    with pytest.raises(ValueError, match="dtype"):
        mf.quantize(x, bad)
    with pytest.raises(ValueError, match="dtype"):
        mf.dequantize(np.zeros(10, np.uint8), bad, (2, 256))
    with pytest.raises(ValueError, match="dtype"):
        _kernels._row_dot(np.zeros(10, np.uint8), bad, x[0], True)


@pytest.mark.parametrize("bad", ["Q4_0", 2.0, None, True])
def test_dtype_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match="dtype"):
        mf.quantize(np.zeros(32, np.float32), bad)
    with pytest.raises(TypeError, match="dtype"):
        mf.dequantize(np.zeros(18, np.uint8), bad, 32)


def test_quantize_validation():
    with pytest.raises(TypeError, match="x"):
        mf.quantize([0.0] * 32, DT.Q4_0)
    with pytest.raises(TypeError, match="x.*float32"):
        mf.quantize(np.zeros(32, np.float64), DT.Q4_0)
    with pytest.raises(TypeError, match="x"):
        mf.quantize(np.zeros(32, ">f4"), DT.Q4_0)
    with pytest.raises(ValueError, match="x.*multiple"):
        mf.quantize(np.zeros((2, 48), np.float32), DT.Q4_0)
    with pytest.raises(ValueError, match="x.*multiple.*256"):
        mf.quantize(np.zeros((2, 32), np.float32), DT.Q4_K)
    with pytest.raises(ValueError, match="x"):
        mf.quantize(np.zeros((2, 0), np.float32), DT.FP16)
    with pytest.raises(ValueError, match="x"):
        mf.quantize(np.array(1.0, dtype=np.float32), DT.FP32)      # 0-d: no row


def test_dequantize_validation():
    good = mf.quantize(np.zeros((2, 64), np.float32), DT.Q4_0)       # (2, 36) uint8
    with pytest.raises(ValueError, match="blob.*contiguous"):
        mf.dequantize(good[:, ::2], DT.Q4_0, (2, 32))                # not contiguous
    with pytest.raises(ValueError, match="blob.*72"):
        mf.dequantize(good.reshape(-1)[:70], DT.Q4_0, (2, 64))       # wrong byte count
    with pytest.raises(ValueError, match="blob"):
        mf.dequantize(good, DT.Q4_0, (3, 64))
    with pytest.raises(TypeError, match="blob.*uint8"):
        mf.dequantize(good.view(np.uint16), DT.Q4_0, (2, 64))
    with pytest.raises(TypeError, match="blob.*uint8"):
        mf.dequantize(np.zeros(18, np.int8), DT.Q4_0, 32)
    with pytest.raises(TypeError, match="blob"):
        mf.dequantize(bytes(72), DT.Q4_0, (2, 64))
    with pytest.raises(TypeError, match="blob.*float32"):
        mf.dequantize(np.zeros(64, np.float64), DT.FP32, 64)
    with pytest.raises(TypeError, match="blob"):
        mf.dequantize(np.zeros(128, np.uint8), DT.FP16, 64)          # bytes are not fp16
    with pytest.raises(TypeError, match="blob"):
        mf.dequantize(np.zeros(64, np.float16), DT.BF16, 64)
    with pytest.raises(ValueError, match="blob"):
        mf.dequantize(np.zeros(63, np.uint16), DT.BF16, 64)
    with pytest.raises(ValueError, match="shape.*multiple"):
        mf.dequantize(good, DT.Q4_0, (3, 48))
    with pytest.raises(ValueError, match="shape"):
        mf.dequantize(good, DT.Q4_0, (-2, 64))
    with pytest.raises(ValueError, match="shape"):
        mf.dequantize(good, DT.Q4_0, ())
    with pytest.raises(ValueError, match="shape"):
        mf.dequantize(good, DT.Q4_0, (2, 0))
    with pytest.raises(TypeError, match="shape"):
        mf.dequantize(good, DT.Q4_0, "2,64")
    with pytest.raises(TypeError, match="shape"):
        mf.dequantize(good, DT.Q4_0, (2, 64.0))
    with pytest.raises(TypeError, match="shape"):
        mf.dequantize(good, DT.Q4_0, None)
    assert mf.dequantize(good, int(DT.Q4_0), np.array([2, 64])).shape == (2, 64)


def test_row_dot_validation():
    x = np.zeros(64, np.float32)
    w = mf.quantize(x, DT.Q8_0)
    with pytest.raises(ValueError, match="w_row_blob"):
        _kernels._row_dot(w[:-1], DT.Q8_0, x, True)
    with pytest.raises(ValueError, match="x.*multiple"):
        _kernels._row_dot(w, DT.Q8_0, x[:48], True)
    with pytest.raises(TypeError, match="x"):
        _kernels._row_dot(w, DT.Q8_0, x.astype(np.float64), True)


# ---------------------------------------------------------------------------------------------
# The quantizers gguf lacks, byte for byte: ggml's own bytes (tests/data/kquant_fixtures.npz,
# made by tests/data/make_kquant_fixtures.py) == the kernels (Q2_K ... Q6_K, IQ4_NL, IQ4_XS) ==
# megafuse.reference's NumPy port (Q4_K, Q5_K, Q6_K)
# ---------------------------------------------------------------------------------------------
# NaN: GGML's nearest_int reads the mantissa bits of its float, so what a NaN weight becomes is
# decided by the NaN's payload.  A NaN without payload (np.nan, -np.nan, and every NaN that
# arithmetic on them or 0 * Inf produces on x86) always gives code 0; those are tested here
# (the fixtures hold two NaN rows).  A NaN with a payload has no defined bytes: which operand's
# payload survives an operation between two NaNs depends on how the compiler ordered them.

KQUANT_FIXTURES = Path(__file__).parent.parent / "data" / "kquant_fixtures.npz"
PORTED = [dt for dt in KQUANT_FORMATS if dt in ref.KQUANT_QUANTIZERS]   # the reference's ports


@functools.cache
def kquant_fixtures():
    with np.load(KQUANT_FIXTURES) as f:
        return {k: f[k] for k in f.files}


def kquant_rows(cols=512):
    """Several hundred float32 rows of `cols` weights: many distributions and every corner of
    the K-quant quantizers (zero, tiny, subnormal, huge and constant blocks, ties, NaN / Inf)."""
    rng = np.random.default_rng(71)
    n = cols

    def normal(k):
        return rng.standard_normal((k, n))

    def sub16(k, lo, hi):
        """k rows of magnitudes 2^uniform(lo, hi), one for each 16 weights."""
        return np.repeat(np.exp2(rng.uniform(lo, hi, (k, n // 16))), 16, axis=1)

    groups = [
        normal(48),
        normal(40) * np.exp2(rng.uniform(-20, 20, (40, 1))),       # a magnitude per row
        normal(40) * sub16(40, -10, 10),                           # a magnitude per 16 weights
        rng.uniform(-1, 1, (24, n)),
        rng.uniform(0.1, 3, (12, n)),                              # one sign per row
        -rng.uniform(0.1, 3, (12, n)),
        rng.standard_t(2, (24, n)),                                # heavy tails
        np.where(rng.random((16, n)) < 0.9, 0.0, normal(16)),      # sparse
        np.where(rng.random((16, n)) < 1 / 64, 1e3, 1.0) * normal(16),   # outliers
        rng.integers(-8, 8, (16, n)) / 2.0,                        # on a grid: rounding ties
        np.repeat(rng.uniform(-3, 3, (16, n // 256)), 256, axis=1),   # constant super-blocks
        np.repeat(rng.uniform(-3, 3, (8, n // 32)), 32, axis=1),      # constant sub-blocks
        np.where((np.arange(n) // 16) % 4 == 1, 0.0, normal(8)),   # zero sub-blocks
        np.zeros((4, n)), -np.zeros((2, n)),
        normal(8) * 1e-30, normal(4) * 1e-40, normal(4) * 1e-44,   # tiny, subnormal
        normal(8) * 1e30, np.sign(normal(4)) * 3.4e38,             # huge
        normal(6) * 1e5, normal(6) * 1e-6,                         # d beyond / below fp16's range
        normal(8) * sub16(8, -100, 100),                           # huge next to tiny
    ]
    bad = normal(12)                                               # NaN / Inf without payload
    bad[0, [3, 40]] = np.nan
    bad[1, ::32] = np.nan                                          # x[0] of a sub-block
    bad[2, 16:32] = np.nan                                         # a whole Q6_K sub-block
    bad[3, :256] = np.nan
    bad[4, [7, 300]] = [np.inf, -np.inf]
    bad[5, :256] = np.inf
    bad[6, 100] = -np.nan
    bad[7, [0, 1]] = [np.inf, -np.inf]
    bad[8:12, rng.integers(0, n, 4)] = [np.nan, np.inf, -np.inf, -np.nan]
    groups.append(bad)
    return np.ascontiguousarray(np.concatenate(groups), dtype=np.float32)


@functools.cache
def kquant_reference_blocks(dt):
    x = kquant_rows()
    return x, ref.KQUANT_QUANTIZERS[dt](x)


def test_kquant_fixtures_cover_the_corners():
    f = kquant_fixtures()
    assert str(f["ggml_python_version"])                            # where the bytes came from
    x = f["x"]
    assert x.dtype == np.float32 and x.shape[1] == 256
    names = list(f["case"])
    for needed in ("zeros", "tiny_1e-30", "huge_1e30", "mixed_signs", "constant_positive",
                   "constant_negative", "normal", "one_outlier", "nan_inf"):
        assert needed in names, needed
    for needed in ("iq4_grid", "grid_2bit", "grid_3bit", "nan_sub_block", "magnitude_per_16"):
        assert needed in names, needed
    for dt in OWN_QUANTIZES:
        blob = f[dt.name]
        assert blob.dtype == np.uint8
        assert blob.shape == (x.shape[0], mf.ck_dtype_row_bytes(dt, 256))
        assert blob[names.index("normal")].any()                    # real blocks, not zeros
    assert not f["Q6_K"][names.index("zeros")].any()                 # a zero block is 0 bytes


@pytest.mark.parametrize("dt", PORTED)
def test_kquant_reference_is_ggml_byte_for_byte(dt):
    f = kquant_fixtures()
    got = ref.KQUANT_QUANTIZERS[dt](f["x"])
    want = f[dt.name]
    wrong = [str(name) for name, a, b in zip(f["case"], got, want) if not np.array_equal(a, b)]
    assert not wrong, f"{dt.name}: the port differs from ggml on {wrong}"
    assert same_bits(got, want)


@pytest.mark.parametrize("dt", OWN_QUANTIZES)
def test_kquant_kernels_are_ggml_byte_for_byte(simd_level, dt):
    f = kquant_fixtures()
    got = mf.quantize(f["x"], dt)
    wrong = [str(name) for name, a, b in zip(f["case"], got, f[dt.name])
             if not np.array_equal(a, b)]
    assert not wrong, f"{dt.name}: the kernels differ from ggml on {wrong}"
    assert same_bits(got, f[dt.name])


@pytest.mark.parametrize("dt", PORTED)
def test_kquant_kernels_match_reference(simd_level, dt):
    """Several hundred rows of many distributions (kquant_rows), each super-block compared."""
    x, want = kquant_reference_blocks(dt)
    assert x.shape[0] >= 300
    got = mf.quantize(x, dt)
    assert got.shape == want.shape
    bb = mf.ck_dtype_block_bytes(dt)
    differ = np.flatnonzero((got.reshape(-1, bb) != want.reshape(-1, bb)).any(axis=1))
    assert differ.size == 0, f"{dt.name}: {differ.size} super-blocks differ, first {differ[:8]}"


@pytest.mark.parametrize("dt", PORTED)
def test_kquant_reference_layout(dt):
    """Any leading shape; each super-block's bytes depend on its own 256 values only (a NaN or
    Inf super-block leaves its neighbours as they are alone); the bytes decode close to x."""
    rng = np.random.default_rng(73)
    x = rng.standard_normal((2, 3, 768)).astype(np.float32)
    quantize = ref.KQUANT_QUANTIZERS[dt]
    blob = quantize(x)
    assert blob.shape == (2, 3, 3 * mf.ck_dtype_block_bytes(dt)) and blob.dtype == np.uint8
    alone = quantize(x.reshape(-1, 256)).reshape(blob.shape)
    assert same_bits(blob, alone)
    y = x.copy()
    y[0, 1, 256:512] = np.nan
    y[1, 2, 300] = np.inf
    bb = mf.ck_dtype_block_bytes(dt)
    blocks, blocks_y = blob.reshape(-1, bb), quantize(y).reshape(-1, bb)
    changed = np.flatnonzero((blocks != blocks_y).any(axis=1))
    assert list(changed) == [4, 16]
    rmse = np.sqrt(np.mean((ref.dequantize(blob, dt, x.shape) - x) ** 2))
    assert 0 < rmse < {DT.Q4_K: 0.1, DT.Q5_K: 0.05, DT.Q6_K: 0.025}[dt]


def test_nearest_int_is_ggml_bit_trick():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.49999997, 4194303.0, -4194304.0, 1e30,
                  np.inf, -np.inf, np.nan, -np.nan, -0.0], dtype=np.float32)
    got = ref.nearest_int(v)
    assert got.dtype == np.int32
    assert list(got[:7]) == [0, 2, 2, 0, -2, 0, 4194303]           # ties to even
    assert got[7] == -4194304
    assert list(got[9:]) == [-4194304, -4194304, 0, 0, 0]          # Inf; NaN without payload
    big = np.float32(1e30) + np.float32(12582912)                 # beyond 2^22: the bits' answer
    assert got[8] == (int(big.view(np.int32)) & 0x7FFFFF) - 0x400000
    r = np.random.default_rng(79).uniform(-4e6, 4e6, 100000).astype(np.float32)
    assert np.array_equal(ref.nearest_int(r), np.rint(r).astype(np.int32))


def test_scale_min_packing_round_trips():
    """The 6-bit packing of the port is what the decoder (ggml's get_scale_min_k4) reads, for
    every scale and min value."""
    ls = np.repeat(np.arange(64, dtype=np.uint8), 64)
    lm = np.tile(np.arange(64, dtype=np.uint8), 64)
    for j in range(8):
        sc_in = np.zeros((4096, 8), np.uint8)
        m_in = np.zeros((4096, 8), np.uint8)
        sc_in[:, j], m_in[:, j] = ls, lm
        sc_in[:, (j + 3) % 8] = lm                                   # a neighbour, not in the way
        sc, m = ref._scale_min_k4(ref._pack_scale_min_k4(sc_in, m_in))
        assert np.array_equal(sc, sc_in) and np.array_equal(m, m_in), j


# ---------------------------------------------------------------------------------------------
# The int8 projections (4 weight rows x many tokens, rows decoded once): a token's results are
# the one-row dot's bits, so they do not depend on how many tokens share the call
# ---------------------------------------------------------------------------------------------

def _proj_dims(dt):
    """(E, I): row lengths with a partial chunk of MF_Q8_CHUNK (1024) weights, and for the
    32-weight formats a block count that is not a multiple of 4."""
    return (1280, 768) if dt in KQUANT_FORMATS else (1376, 1056)


def _proj_weight(rng, dt, rows, cols):
    w = (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32)
    return mf.quantize(w, dt)


@pytest.mark.parametrize("padded", [False, True], ids=["aligned", "padded"])
@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_mlp_token_results_do_not_depend_on_tokens(simd_level, dt, padded):
    """mega_fused_mlp_prefill over T = 133 tokens (token tiles of 128 and 5; int8 tiles of 64,
    64 and 5: register blocks of 2 tokens and one odd token) == the same tokens one call each,
    bit for bit.  padded: embed_dim 6 below the aligned one, so the last register block of w2
    has 2 rows (and of w1 the activation columns E..Ea-1 are 0)."""
    rng = np.random.default_rng(59 + int(dt))
    E, I = _proj_dims(dt)
    E_used = E - 6 if padded else E
    T = 133
    w1 = _proj_weight(rng, dt, 2 * I, E)
    w2 = _proj_weight(rng, dt, E, I)
    b1 = (0.1 * rng.standard_normal(2 * I)).astype(np.float32)
    b2 = (0.1 * rng.standard_normal(E)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
    x = rng.standard_normal((T, E)).astype(np.float32)
    res = rng.standard_normal((T, E)).astype(np.float32)

    def run(rows):
        n = len(rows)
        out = np.zeros((n, E), np.float32)
        scratch = np.zeros(mf.mega_fused_mlp_prefill_scratch_size(n, E, I), np.uint8)
        mf.mega_fused_mlp_prefill(out, np.ascontiguousarray(x[rows]),
                                  np.ascontiguousarray(res[rows]), gamma[:E_used], w1, b1, dt, w2,
                                  b2, dt, n, E_used, E, I, I, 1e-5, scratch)
        return out

    full = run(list(range(T)))
    assert np.isfinite(full).all()
    for t in (0, 1, 30, 31, 32, 35, 36):
        assert same_bits(run([t])[0], full[t]), t
    assert same_bits(run([4, 5, 6])[1], full[5])


@pytest.mark.parametrize("T", [6, 7, 70, 71])
@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_mlp_tile_tails_do_not_depend_on_tokens(simd_level, dt, T):
    """The int8 tiles' tails: calls of 6 and 7 tokens (and 64 + 6, 64 + 7), so a tile's last
    tokens do not fill a group sharing the code loads (the 16-row K-quant tile takes 4 tokens at a
    time); embed_dim 1265, so w2's last 64-row block has 49 rows (a last 16-row group of one
    row), and the K-quants' w1 rows have 5 super-blocks (decoded 2, 2, then 1): each token == its
    own call, bit for bit."""
    rng = np.random.default_rng(67 + int(dt) + T)
    E, I = _proj_dims(dt)
    E_used = E - 15
    w1 = _proj_weight(rng, dt, 2 * I, E)
    w2 = _proj_weight(rng, dt, E, I)
    gamma = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
    x = rng.standard_normal((T, E)).astype(np.float32)

    def run(rows):
        n = len(rows)
        out = np.zeros((n, E), np.float32)
        scratch = np.zeros(mf.mega_fused_mlp_prefill_scratch_size(n, E, I), np.uint8)
        mf.mega_fused_mlp_prefill(out, np.ascontiguousarray(x[rows]), None, gamma[:E_used], w1,
                                  None, dt, w2, None, dt, n, E_used, E, I, I, 1e-5, scratch)
        return out

    full = run(list(range(T)))
    assert np.isfinite(full).all()
    for t in sorted({0, T - 7, T - 3, T - 2, T - 1}):
        assert same_bits(run([t])[0], full[t]), t


@pytest.mark.parametrize("dt", BLOCK_FORMATS)
def test_prefill_q8_projections_do_not_depend_on_tokens(simd_level, dt):
    """The int8 prefill's v projection (written straight to the cache) over T = 67 tokens
    (token tiles of 64 and 3) == each token's own prefill call, bit for bit."""
    rng = np.random.default_rng(61 + int(dt))
    E = _proj_dims(dt)[0]
    H, G, D = 4, 2, 64
    T, C = 67, 80
    wq = _proj_weight(rng, dt, H * D, E)
    wk = _proj_weight(rng, dt, G * D, E)
    wv = _proj_weight(rng, dt, G * D, E)
    wo = (_proj_weight(rng, dt, E, H * D) if (H * D) % block_size(dt) == 0
          else None)
    wo_dt = dt if wo is not None else DT.FP32
    if wo is None:
        wo = (rng.standard_normal((E, H * D)) / 16).astype(np.float32)
    bv = (0.1 * rng.standard_normal(G * D)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
    x = rng.standard_normal((T, E)).astype(np.float32)

    def run(start, n):
        out = np.zeros((n, E), np.float32)
        ck = np.zeros((G, C, D), np.float32)
        cv = np.zeros((G, C, D), np.float32)
        scratch = np.zeros(mf.mega_fused_attention_prefill_q8_0_scratch_size(n, E, H, D),
                           np.uint8)
        mf.mega_fused_attention_prefill_q8_0(
            out, np.ascontiguousarray(x[start:start + n]), None, gamma, wq, None, dt, wk, None,
            dt, wv, bv, dt, wo, None, wo_dt, ck, cv, None, None, start, n, C, E, E, H, G, D, D,
            1e-5, scratch)
        return ck, cv

    ck, cv = run(0, T)
    assert np.isfinite(cv[:, :T]).all()
    for t in (0, 1, 62, 63, 64, 65, 66):
        k1, v1 = run(t, 1)
        assert same_bits(v1[:, t], cv[:, t]) and same_bits(k1[:, t], ck[:, t]), t
