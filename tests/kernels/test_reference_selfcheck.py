"""Self-consistency of megafuse.reference alone (no compiled code involved).

The reference is what every kernel is compared with, so it is checked here against
independent computations: gguf's dequantizers and Q8_0 quantizer, small hand-written
formulas, and the identities docs/contract.md §4 states (decode after prefill equals a longer
prefill, split prefills equal one prefill, RoPE is a rotation, ...).
"""
import ast
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REFERENCE_FILE = HERE.parent.parent / 'megafuse' / 'reference.py'
DTYPE_FILE = HERE.parent.parent / 'megafuse' / 'kernels' / 'dtype.py'


def _load_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _load_reference():
    """``megafuse.reference`` if importable, else the file of this checkout loaded directly
    (the compiled package may not be built: the reference must not need it), with the one
    module of megafuse it imports, ``megafuse.kernels.dtype`` (plain Python), loaded the same
    way."""
    try:
        from megafuse import reference
        return reference
    except Exception:  # noqa: BLE001 -- any failure of the package import
        _load_file('megafuse.kernels.dtype', DTYPE_FILE)
        return _load_file('_megafuse_reference_selfcheck', REFERENCE_FILE)


ref = _load_reference()
DT = ref.CKDataType

# Named tolerances (float32 storage of float64 results; different BLAS summation orders).
TOL_SAME_MATH = dict(rtol=2e-6, atol=2e-6)      # one computation done two ways in float64
TOL_Q8_VS_FLOAT = dict(rtol=0.1, atol=0.1)      # int8 activations vs float activations


# ------------------------------------------------------------------------------------------
# Test data
# ------------------------------------------------------------------------------------------

# Byte offsets of the fp16 fields (d, m, dmin) inside each block.
FP16_FIELDS = {
    DT.Q4_0: (0,), DT.Q4_1: (0, 2), DT.Q5_0: (0,), DT.Q5_1: (0, 2), DT.Q8_0: (0,),
    DT.Q4_K: (0, 2), DT.Q5_K: (0, 2), DT.Q6_K: (208,), DT.IQ4_NL: (0,), DT.Q2_K: (80, 82),
    DT.Q3_K: (108,), DT.IQ4_XS: (0,),
}
BLOCK_FORMATS = list(FP16_FIELDS)


def finite_fp16_bits(rng, n):
    """Random fp16 bit patterns with every exponent but the inf/NaN one."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    inf_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_nan] &= np.uint16(0xBFFF)          # clear one exponent bit: finite
    return bits


def random_blob(dt, rows, cols, rng, scale=None):
    """A random [rows, cols] weight of block format ``dt``: random bytes, finite fp16 fields.

    scale=None: the fp16 fields take any finite value (subnormals, huge, negative);
    else they are |normal| * scale (weights of a sensible magnitude).
    """
    block, nbytes = ref.BLOCK_LAYOUT[dt]
    n_blocks = rows * cols // block
    blob = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for offset in FP16_FIELDS[dt]:
        if scale is None:
            bits = finite_fp16_bits(rng, n_blocks)
        else:
            values = np.abs(rng.standard_normal(n_blocks)) * scale
            bits = values.astype(np.float16).view(np.uint16)
        blob[:, offset:offset + 2] = bits.view(np.uint8).reshape(n_blocks, 2)
    return blob.reshape(rows, -1)


def sensible_blob(dt, rows, cols, rng):
    """A weight of format ``dt`` whose values are of order 0.1 (for the layer tests)."""
    if dt == DT.FP32:
        return (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    if dt == DT.FP16:
        return (rng.standard_normal((rows, cols)) * 0.1).astype(np.float16)
    if dt == DT.BF16:
        return ref.float_to_bf16_bits(rng.standard_normal((rows, cols)) * 0.1)
    # Divide by the largest |q * scale| of the format so weights are ~0.1.
    per_format = {DT.Q4_0: 8, DT.Q4_1: 15, DT.Q5_0: 16, DT.Q5_1: 31, DT.Q8_0: 127,
                  DT.Q4_K: 63 * 15, DT.Q5_K: 63 * 31, DT.Q6_K: 127 * 32, DT.IQ4_NL: 127,
                  DT.Q2_K: 15 * 3, DT.Q3_K: 32 * 4, DT.IQ4_XS: 32 * 127}
    return random_blob(dt, rows, cols, rng, scale=0.1 / per_format[dt])


def rope_tables(rows, D, base=10000.0):
    inv_freq = base ** (-np.arange(0, D, 2) / D)
    angles = np.arange(rows)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def make_layer(rng, E=24, Ea=32, H=4, G=2, D=6, Da=8, C=16, bias=True, rope=True):
    """An FP32 attention layer with zero padding rows/columns, as docs/contract.md §3 expects."""
    def weight(heads, rows_per_head, cols, rows_used, cols_used):
        w = np.zeros((heads, rows_per_head, cols), dtype=np.float32)
        w[:, :rows_used, :cols_used] = rng.standard_normal((heads, rows_used, cols_used)) * 0.3
        return w.reshape(heads * rows_per_head, cols)

    def bias_of(heads, per_head, used):
        if not bias:
            return None
        b = np.zeros((heads, per_head), dtype=np.float32)
        b[:, :used] = rng.standard_normal((heads, used)) * 0.1
        return b.reshape(-1)

    wo = np.zeros((Ea, H, Da), dtype=np.float32)
    wo[:E, :, :D] = rng.standard_normal((E, H, D)) * 0.3
    bo = None
    if bias:
        bo = np.zeros(Ea, dtype=np.float32)
        bo[:E] = rng.standard_normal(E) * 0.1
    cos, sin = rope_tables(C, D) if rope else (None, None)
    return dict(
        dims=dict(E=E, Ea=Ea, H=H, G=G, D=D, Da=Da, C=C),
        ln1_gamma=(1.0 + 0.1 * rng.standard_normal(E)).astype(np.float32),
        wq=weight(H, Da, Ea, D, E), bq=bias_of(H, Da, D),
        wk=weight(G, Da, Ea, D, E), bk=bias_of(G, Da, D),
        wv=weight(G, Da, Ea, D, E), bv=bias_of(G, Da, D),
        wo=wo.reshape(Ea, H * Da), bo=bo,
        rope_cos=cos, rope_sin=sin,
    )


def empty_cache(L):
    d = L['dims']
    return (np.zeros((d['G'], d['C'], d['Da']), dtype=np.float32),
            np.zeros((d['G'], d['C'], d['Da']), dtype=np.float32))


def rows(rng, T, Ea):
    return rng.standard_normal((T, Ea)).astype(np.float32)


def run_prefill(L, x, residual, cache, start_pos, fn=None, weights=None, eps=1e-5):
    """Run a prefill reference function on layer L; returns the output [T, Ea]."""
    fn = fn or ref.mega_fused_attention_prefill
    d = L['dims']
    T = x.shape[0]
    w = weights or {name: (L[name], DT.FP32) for name in ('wq', 'wk', 'wv', 'wo')}
    out = np.empty((T, d['Ea']), dtype=np.float32)
    fn(out, x, residual, L['ln1_gamma'],
       w['wq'][0], L['bq'], w['wq'][1], w['wk'][0], L['bk'], w['wk'][1],
       w['wv'][0], L['bv'], w['wv'][1], w['wo'][0], L['bo'], w['wo'][1],
       cache[0], cache[1], L['rope_cos'], L['rope_sin'], start_pos, T, d['C'],
       d['E'], d['Ea'], d['H'], d['G'], d['D'], d['Da'], eps, None)
    return out


def run_decode(L, x, residual, cache, pos, eps=1e-5):
    d = L['dims']
    out = np.empty(d['Ea'], dtype=np.float32)
    ref.mega_fused_attention_decode(
        out, x, residual, L['ln1_gamma'], L['wq'], L['bq'], L['wk'], L['bk'], L['wv'], L['bv'],
        L['wo'], L['bo'], cache[0], cache[1], L['rope_cos'], L['rope_sin'], pos,
        d['E'], d['Ea'], d['H'], d['G'], d['D'], d['Da'], d['C'], eps)
    return out


# ------------------------------------------------------------------------------------------
# The module itself
# ------------------------------------------------------------------------------------------

def test_imports_only_numpy_stdlib_and_the_dtype_enum():
    """The reference's math is its own: of megafuse it imports megafuse.kernels.dtype (the one
    CKDataType) and nothing else; megafuse.kernels.dtype itself imports only the standard
    library."""
    def imports(path):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, 'no relative imports (they would reach compiled megafuse)'
                found.add(node.module)
        return {name for name in found if name.split('.')[0] not in sys.stdlib_module_names}
    assert imports(REFERENCE_FILE) == {'numpy', 'megafuse.kernels.dtype'}
    assert imports(DTYPE_FILE) == set()


def test_ckdatatype_values():
    assert [(m.name, int(m)) for m in DT] == [
        ('FP32', 0), ('BF16', 1), ('FP16', 2), ('INT8', 3), ('INT4', 4), ('Q4_0', 5),
        ('Q4_1', 6), ('Q4_K', 7), ('Q6_K', 8), ('Q8_0', 9), ('Q8_K', 10), ('Q5_0', 11),
        ('Q5_1', 12), ('Q5_K', 13), ('Q2_K', 14), ('Q3_K', 15), ('IQ4_NL', 16), ('IQ4_XS', 17),
        ('COUNT', 18)]


def test_scratch_sizes_are_zero():
    assert ref.mega_fused_attention_prefill_scratch_size(8, 64, 4, 16) == 0
    assert ref.mega_fused_attention_prefill_q8_0_scratch_size(8, 64, 4, 16) == 0
    assert ref.mega_fused_outproj_mlp_prefill_scratch_size(8, 64, 4, 16, 128) == 0
    assert ref.mega_fused_mlp_prefill_scratch_size(8, 64, 128) == 0


# ------------------------------------------------------------------------------------------
# Weights: dequantizers against gguf, bit for bit
# ------------------------------------------------------------------------------------------

def _bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize('dt', BLOCK_FORMATS, ids=lambda dt: dt.name)
def test_block_dequantizers_match_gguf(dt):
    gguf = pytest.importorskip('gguf')
    rng = np.random.default_rng(int(dt))
    block = ref.BLOCK_LAYOUT[dt][0]
    R, C = 8, 8 * block                     # 64 blocks of every byte pattern
    blob = random_blob(dt, R, C, rng)
    mine = ref.dequantize(blob, dt, (R, C))
    theirs = gguf.quants.dequantize(blob, getattr(gguf.GGMLQuantizationType, dt.name))
    assert mine.dtype == np.float64 and mine.shape == (R, C)
    assert theirs.shape == (R, C)
    np.testing.assert_array_equal(_bits(mine), _bits(theirs))
    # A flat byte array (any shape: only the count matters) gives the same weights.
    np.testing.assert_array_equal(ref.dequantize(blob.reshape(-1), dt, (R, C)), mine)
    # Fully random bytes (Inf/NaN scales too): still the same bits, NaN payloads included.
    raw = rng.integers(0, 256, size=blob.shape, dtype=np.uint8)
    with np.errstate(invalid='ignore', over='ignore'):   # gguf's own Inf*0 on the way
        theirs = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, dt.name))
    np.testing.assert_array_equal(_bits(ref.dequantize(raw, dt, (R, C))), _bits(theirs))


def test_fp16_bf16_fp32_match_gguf():
    gguf = pytest.importorskip('gguf')
    rng = np.random.default_rng(7)
    R, C = 4, 64
    fp16 = finite_fp16_bits(rng, R * C).reshape(R, C)
    want = gguf.quants.dequantize(fp16.view(np.uint8), gguf.GGMLQuantizationType.F16)
    np.testing.assert_array_equal(_bits(ref.dequantize(fp16, DT.FP16, (R, C))), _bits(want))
    np.testing.assert_array_equal(
        _bits(ref.dequantize(fp16.view(np.float16), DT.FP16, (R, C))), _bits(want))

    bf16 = rng.integers(0, 1 << 16, size=(R, C), dtype=np.uint16)
    nan = (bf16 & 0x7F80) == 0x7F80
    bf16[nan] &= np.uint16(0xBFFF)
    want = gguf.quants.dequantize(bf16.view(np.uint8), gguf.GGMLQuantizationType.BF16)
    np.testing.assert_array_equal(_bits(ref.dequantize(bf16, DT.BF16, (R, C))), _bits(want))

    fp32 = rng.standard_normal((R, C)).astype(np.float32)
    np.testing.assert_array_equal(ref.dequantize(fp32, DT.FP32, (R, C)), fp32.astype(np.float64))


def test_bf16_rounding_helper():
    x = np.array([1.0, -2.5, 1.00390625, 1.01171875, np.inf], dtype=np.float32)
    # 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0;
    # 1 + 3*2^-8 is halfway between 1.0078125 and 1.015625: ties to even -> 1.015625.
    back = ref.dequantize(ref.float_to_bf16_bits(x), DT.BF16, x.size)
    np.testing.assert_array_equal(back, [1.0, -2.5, 1.0, 1.015625, np.inf])


def test_ck_dtype_row_bytes():
    assert ref.ck_dtype_row_bytes(DT.FP32, 64) == 256
    assert ref.ck_dtype_row_bytes(DT.BF16, 64) == 128
    assert ref.ck_dtype_row_bytes(DT.Q4_0, 64) == 36
    assert ref.ck_dtype_row_bytes(DT.Q6_K, 512) == 420
    assert ref.ck_dtype_row_bytes(int(DT.Q8_K), 256) == 292


# ------------------------------------------------------------------------------------------
# Activations: Q8_0 and Q8_K
# ------------------------------------------------------------------------------------------

def test_quantize_q8_0_matches_gguf_bytes():
    gguf = pytest.importorskip('gguf')
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 128)) * rng.uniform(0.01, 10, size=(6, 1))).astype(np.float32)
    x[1, 32:64] = 0.0                                  # an all-zero block: d = 0, q = 0
    # A block where d == 1 exactly, with halfway cases: roundf rounds them away from zero.
    x[2, 0:32] = np.array([127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5] + [0.25] * 24,
                          dtype=np.float32)
    q, d = ref.quantize_q8_0(x)
    assert q.dtype == np.int8 and q.shape == x.shape
    assert d.dtype == np.float32 and d.shape == (6, 4)
    assert list(q[2, :8]) == [127, 3, -3, 1, -1, 2, -2, 127]
    packed = np.concatenate([d.reshape(-1, 1).astype(np.float16).view(np.uint8),
                             q.reshape(-1, 32).view(np.uint8)], axis=1).reshape(6, -1)
    want = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(packed, want)
    # ... and dequantizing those bytes with the Q8_0 weight dequantizer gives d*q.
    np.testing.assert_array_equal(ref.dequantize(packed, DT.Q8_0, x.shape),
                                  ref.dequantize_q8_0(q, d))
    assert np.max(np.abs(ref.dequantize_q8_0(q, d) - x)) < 0.51 * np.max(d) + 1e-7


def _nearest_int(f):
    """GGML nearest_int, literally: the float32 magic-number trick."""
    val = np.array(np.float32(f) + np.float32(12582912.0), dtype=np.float32)
    i = int(val.view(np.int32))
    return (i & 0x007FFFFF) - 0x00400000


def _quantize_row_q8_K_scalar(block):
    """quantize_row_q8_K_ref for one block of 256 float32 values, one scalar at a time."""
    amax, vmax = np.float32(0), np.float32(0)
    for v in block:
        if abs(v) > amax:
            amax, vmax = abs(v), v
    if amax == 0:
        return np.zeros(256, np.int8), np.float32(0), np.zeros(16, np.int16)
    iscale = np.float32(-127.0) / vmax
    q = np.array([min(127, _nearest_int(np.float32(iscale * v))) for v in block], np.int8)
    bsums = q.astype(np.int32).reshape(16, 16).sum(axis=1).astype(np.int16)
    return q, np.float32(np.float32(1.0) / iscale), bsums


def test_quantize_q8_K_matches_scalar_ggml_ref():
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((2, 512)) * 3).astype(np.float32)
    x[0, 256:512] = 0.0                                 # zero block
    # max = -127 (first of the two largest |x|): iscale = -127/max = 1, ties go to even.
    x[1, 0:8] = [-127.0, 2.5, 3.5, -2.5, 0.5, 1.5, 127.0, 126.5]
    x[1, 8:256] = np.clip(x[1, 8:256], -100, 100)
    q, d, bsums = ref.quantize_q8_K(x)
    assert q.dtype == np.int8 and d.dtype == np.float32 and bsums.dtype == np.int16
    assert q.shape == (2, 512) and d.shape == (2, 2) and bsums.shape == (2, 32)
    assert list(q[1, :8]) == [-127, 2, 4, -2, 0, 2, 127, 126]
    for r in range(2):
        for b in range(2):
            wq, wd, wb = _quantize_row_q8_K_scalar(x[r, 256 * b:256 * (b + 1)])
            np.testing.assert_array_equal(q[r, 256 * b:256 * (b + 1)], wq)
            assert _bits(d[r, b]) == _bits(wd)
            np.testing.assert_array_equal(bsums[r, 16 * b:16 * (b + 1)], wb)
    back = ref.dequantize_q8_K(q, d)
    np.testing.assert_allclose(back, x, rtol=0, atol=0.51 * float(np.max(np.abs(d))))


def test_nonfinite_activation_block_propagates_nan():
    x = np.ones((1, 768), dtype=np.float32)
    x[0, 3] = np.nan
    x[0, 300] = np.inf
    back = ref.dequantize_q8_0(*ref.quantize_q8_0(x)).reshape(-1, 32)
    bad = np.isnan(back).all(axis=1)
    assert list(np.flatnonzero(bad)) == [0, 300 // 32]          # whole blocks, only those
    np.testing.assert_allclose(back[~bad], 1.0, rtol=1e-3)
    q, d, _ = ref.quantize_q8_K(x)
    back = ref.dequantize_q8_K(q, d).reshape(-1, 256)
    assert np.isnan(back[0]).all() and np.isnan(back[1]).all()
    np.testing.assert_allclose(back[2], 1.0, rtol=1e-6)


@pytest.mark.parametrize('dt', [DT.Q8_0, DT.Q5_1, DT.Q4_K, DT.Q6_K], ids=lambda dt: dt.name)
def test_project_equals_integer_dot_products(dt):
    """The quantized _project equals GGML's scheme: per block, an integer dot product of the
    weight's and the activation's q's, scaled (exact up to float summation order)."""
    rng = np.random.default_rng(int(dt) + 100)
    R, C, T = 5, 512, 3
    blob = sensible_blob(dt, R, C, rng)
    x = rng.standard_normal((T, C))
    got = ref._project(x, blob, dt, R, C, True)
    W = ref.dequantize(blob, dt, (R, C))
    if dt == DT.Q8_0:
        # Both sides Q8_0: y = sum_blocks dw * dx * sum(qw * qx), in integers per block.
        qx, dx = ref.quantize_q8_0(x.astype(np.float32))
        wb = blob.reshape(R, C // 32, 34)
        dw = wb[:, :, 0:2].copy().view(np.float16).astype(np.float64)[..., 0]      # (R, nb)
        qw = wb[:, :, 2:].copy().view(np.int8).astype(np.int64)                    # (R, nb, 32)
        isum = np.einsum('rbk,tbk->trb', qw, qx.reshape(T, C // 32, 32).astype(np.int64))
        want = np.einsum('trb,rb,tb->tr', isum.astype(np.float64), dw, dx.astype(np.float64))
    else:
        xq = ref.quantized_activations(x, dt)
        want = xq @ W.T
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # Activations are really quantized: different from the float product.
    assert not np.allclose(got, x @ W.T, rtol=1e-6, atol=0)
    np.testing.assert_allclose(got, x @ W.T, rtol=0.05, atol=0.05 * np.abs(x @ W.T).max())


def test_dequantize_speed_10M_weights():
    import time
    rng = np.random.default_rng(0)
    blob = random_blob(DT.Q4_K, 1024, 2048, rng)          # 2M weights: keep the suite fast
    t0 = time.perf_counter()
    ref.dequantize(blob, DT.Q4_K, (1024, 2048))
    assert time.perf_counter() - t0 < 2.0                 # so ~10M in a few seconds


# ------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------

def test_rope_is_a_rotation():
    rng = np.random.default_rng(5)
    D = 16
    cos, sin = rope_tables(40, D)
    q = rng.standard_normal((3, 4, D))
    rotated = ref.rope(q, cos[[5, 17, 39]][:, None, :], sin[[5, 17, 39]][:, None, :])
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(q, axis=-1),
                               rtol=1e-6)   # tables are float32: |cos|^2+|sin|^2 = 1 +- 1e-7
    np.testing.assert_array_equal(ref.rope(q, cos[0], sin[0]), q)   # position 0: identity
    # Rotate-half pairs dim i with dim i + D/2.
    x = np.zeros(4)
    x[0] = 1.0
    theta = 0.3
    c, s = np.array([np.cos(theta), 1.0]), np.array([np.sin(theta), 0.0])
    np.testing.assert_allclose(ref.rope(x, c, s), [np.cos(theta), 0, np.sin(theta), 0])


def test_rmsnorm():
    x = np.array([3.0, 4.0])
    np.testing.assert_allclose(ref.rmsnorm(x, [1.0, 2.0], 0.0), x / math.sqrt(12.5) * [1, 2])


def test_attention_is_causal_and_grouped():
    rng = np.random.default_rng(9)
    T, H, G, D, P = 3, 4, 2, 5, 6
    q = rng.standard_normal((T, H, D))
    k = rng.standard_normal((G, P, D))
    v = rng.standard_normal((G, P, D))
    positions = np.array([0, 2, 5])
    out = ref.attention(q, k, v, positions)
    for t, p in enumerate(positions):
        for h in range(H):
            g = h // (H // G)                       # GQA: consecutive query heads share
            s = np.array([q[t, h] @ k[g, j] for j in range(p + 1)]) / math.sqrt(D)
            w = np.exp(s - s.max())
            np.testing.assert_allclose(out[t, h], (w / w.sum()) @ v[g, :p + 1], rtol=1e-12)


# ------------------------------------------------------------------------------------------
# The attention layer
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('bias,rope,with_residual', [(True, True, True), (False, False, False)])
def test_decode_at_pos0_attends_to_its_own_v(bias, rope, with_residual):
    rng = np.random.default_rng(1)
    L = make_layer(rng, bias=bias, rope=rope)
    d = L['dims']
    E, Ea, H, G, D, Da = (d[k] for k in ('E', 'Ea', 'H', 'G', 'D', 'Da'))
    x = rng.standard_normal(Ea).astype(np.float32)
    residual = rng.standard_normal(Ea).astype(np.float32) if with_residual else None
    cache = empty_cache(L)
    out = run_decode(L, x, residual, cache, 0, eps=1e-5)

    # Independently: one key, so softmax = 1 and attention output = v of its kv head.
    xe = x[:E].astype(np.float64)
    y = np.zeros(Ea)
    y[:E] = xe / np.sqrt(np.mean(xe ** 2) + 1e-5) * L['ln1_gamma']
    v = L['wv'].astype(np.float64) @ y + (L['bv'] if bias else 0)
    v = v.reshape(G, Da).astype(np.float32).astype(np.float64)     # as stored in the cache
    attn = np.zeros((H, Da))
    for h in range(H):
        attn[h, :D] = v[h // (H // G), :D]
    want = L['wo'].astype(np.float64) @ attn.reshape(-1)
    if bias:
        want += L['bo']
    if with_residual:
        want += residual
    want[E:] = 0.0
    np.testing.assert_allclose(out, want, **TOL_SAME_MATH)
    assert np.all(out[E:] == 0)
    np.testing.assert_array_equal(cache[1][:, 0, :], v.astype(np.float32) * (np.arange(Da) < D))
    assert np.all(cache[0][:, 1:, :] == 0) and np.all(cache[1][:, 1:, :] == 0)


@pytest.mark.parametrize('N', [1, 5])
def test_prefill_then_decode_equals_longer_prefill(N):
    rng = np.random.default_rng(2)
    L = make_layer(rng)
    Ea = L['dims']['Ea']
    x = rows(rng, N + 1, Ea)
    res = rows(rng, N + 1, Ea)

    cache_a = empty_cache(L)
    run_prefill(L, x[:N], res[:N], cache_a, 0)
    out_decode = run_decode(L, x[N], res[N], cache_a, N)

    cache_b = empty_cache(L)
    out_prefill = run_prefill(L, x, res, cache_b, 0)

    np.testing.assert_allclose(out_decode, out_prefill[N], **TOL_SAME_MATH)
    for a, b in zip(cache_a, cache_b):
        np.testing.assert_allclose(a, b, **TOL_SAME_MATH)
    # the workspace variant is the same math
    cache_c = empty_cache(L)
    run_prefill(L, x[:N], res[:N], cache_c, 0)
    d = L['dims']
    out_ws = np.empty(Ea, dtype=np.float32)
    qws = np.zeros(2 * d['H'] * d['Da'], dtype=np.float32)
    kvws = np.zeros(2 * d['G'] * d['Da'], dtype=np.float32)
    ref.mega_fused_attention_decode_workspace(
        out_ws, x[N], res[N], L['ln1_gamma'], L['wq'], L['bq'], L['wk'], L['bk'], L['wv'],
        L['bv'], L['wo'], L['bo'], cache_c[0], cache_c[1], L['rope_cos'], L['rope_sin'], N,
        d['E'], Ea, d['H'], d['G'], d['D'], d['Da'], d['C'], 1e-5,
        qws, qws.nbytes, kvws, kvws.nbytes)
    np.testing.assert_array_equal(out_ws, out_decode)


def test_split_prefill_equals_one_prefill():
    rng = np.random.default_rng(4)
    L = make_layer(rng, H=6, G=3)
    Ea = L['dims']['Ea']
    N, M = 4, 7
    x = rows(rng, N + M, Ea)

    cache_a = empty_cache(L)
    out_1 = run_prefill(L, x[:N], None, cache_a, 0)
    out_2 = run_prefill(L, x[N:], None, cache_a, N)
    cache_b = empty_cache(L)
    out_all = run_prefill(L, x, None, cache_b, 0)

    np.testing.assert_allclose(np.concatenate([out_1, out_2]), out_all, **TOL_SAME_MATH)
    for a, b in zip(cache_a, cache_b):
        np.testing.assert_allclose(a, b, **TOL_SAME_MATH)
    # positions beyond the prompt were never written
    assert np.all(cache_b[0][:, N + M:, :] == 0)


def test_prefill_reads_earlier_cache_positions_as_they_are():
    rng = np.random.default_rng(12)
    L = make_layer(rng)
    Ea = L['dims']['Ea']
    x = rows(rng, 3, Ea)
    cache = empty_cache(L)
    run_prefill(L, rows(rng, 2, Ea), None, cache, 0)
    before = run_prefill(L, x, None, tuple(c.copy() for c in cache), 2)
    cache[1][:, 1, :6] += 1.0                       # change what position 1 holds
    after = run_prefill(L, x, None, cache, 2)
    assert not np.allclose(before, after)


def test_padding_and_aliasing():
    rng = np.random.default_rng(6)
    L = make_layer(rng)
    E, Ea, D = L['dims']['E'], L['dims']['Ea'], L['dims']['D']
    x = rows(rng, 4, Ea)
    res = rows(rng, 4, Ea)
    cache = empty_cache(L)
    cache[0][...] = 9.0                              # stale data is overwritten, pads too
    cache[1][...] = 9.0
    base = run_prefill(L, x, res, cache, 0)
    assert np.all(base[:, E:] == 0)
    assert np.all(cache[0][:, :4, D:] == 0) and np.all(cache[1][:, :4, D:] == 0)

    # The caller's padding columns of input and residual do not matter.
    x2, res2 = x.copy(), res.copy()
    x2[:, E:] = 1e6
    res2[:, E:] = -1e6
    np.testing.assert_array_equal(run_prefill(L, x2, res2, empty_cache(L), 0), base)

    # docs/contract.md §3 expects zero weight padding; the reference does not even depend on it
    # (it zeroes the padding of every activation: normed input, q/k/v head dims, attention
    # output).
    Lg = dict(L)
    H, G, Da = L['dims']['H'], L['dims']['G'], L['dims']['Da']
    for name, heads in (('wq', H), ('wk', G), ('wv', G)):
        w = L[name].copy().reshape(heads, Da, Ea)
        w[:, D:, :] = 3.0                                 # rows of head dims D..Da-1
        w[:, :, E:] = -2.0                                # columns E..Ea-1
        Lg[name] = w.reshape(heads * Da, Ea)
        b = L['b' + name[1]].copy().reshape(heads, Da)
        b[:, D:] = 4.0
        Lg['b' + name[1]] = b.reshape(-1)
    wo = L['wo'].copy().reshape(Ea, H, Da)
    wo[E:] = 5.0
    wo[:, :, D:] = 6.0
    Lg['wo'] = wo.reshape(Ea, H * Da)
    bo = L['bo'].copy()
    bo[E:] = 7.0
    Lg['bo'] = bo
    np.testing.assert_array_equal(run_prefill(Lg, x2, res2, empty_cache(L), 0), base)

    # output may be the input or the residual array (in-place residual stream update).
    d = L['dims']
    for alias in ('input', 'residual'):
        buf_x, buf_r = x.copy(), res.copy()
        target = buf_x if alias == 'input' else buf_r
        c = empty_cache(L)
        ref.mega_fused_attention_prefill(
            target, buf_x, buf_r, L['ln1_gamma'], L['wq'], L['bq'], 0, L['wk'], L['bk'], 0,
            L['wv'], L['bv'], 0, L['wo'], L['bo'], 0, c[0], c[1], L['rope_cos'],
            L['rope_sin'], 0, 4, d['C'], E, Ea, d['H'], d['G'], D, d['Da'], 1e-5, None)
        np.testing.assert_array_equal(target, base)


def test_prefill_with_low_precision_and_quantized_weights():
    rng = np.random.default_rng(8)
    L = make_layer(rng, E=64, Ea=64, H=2, G=1, D=32, Da=32, C=8)
    x = rows(rng, 5, 64)
    # FP32 weights: the int8 path keeps float activations -> identical to the plain prefill.
    plain = run_prefill(L, x, x, empty_cache(L), 0)
    q8 = run_prefill(L, x, x, empty_cache(L), 0, fn=ref.mega_fused_attention_prefill_q8_0)
    np.testing.assert_array_equal(plain, q8)

    for dt in (DT.FP16, DT.BF16, DT.Q8_0, DT.Q4_1):
        weights = {name: (sensible_blob(dt, *L[name].shape, rng), dt)
                   for name in ('wq', 'wk', 'wv', 'wo')}
        # The float reference for those weights: the same layer with dequantized FP32 weights.
        Lf = dict(L, **{name: ref.dequantize(w, dt, L[name].shape).astype(np.float32)
                        for name, (w, _) in weights.items()})
        want = run_prefill(Lf, x, x, empty_cache(L), 0)
        got = run_prefill(L, x, x, empty_cache(L), 0, weights=weights)
        np.testing.assert_allclose(got, want, **TOL_SAME_MATH)
        got_q8 = run_prefill(L, x, x, empty_cache(L), 0, fn=ref.mega_fused_attention_prefill_q8_0,
                             weights=weights)
        if dt in (DT.FP16, DT.BF16):
            np.testing.assert_array_equal(got_q8, got)
        else:
            assert not np.array_equal(got_q8, got)
            np.testing.assert_allclose(got_q8, got, **TOL_Q8_VS_FLOAT)


# ------------------------------------------------------------------------------------------
# RMSNorm + QKV (+ RoPE) for one token
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('with_rope', [True, False])
def test_rmsnorm_qkv_matches_decode(with_rope):
    rng = np.random.default_rng(10)
    L = make_layer(rng, E=32, Ea=32, D=8, Da=8, rope=with_rope)
    d = L['dims']
    H, G, D = d['H'], d['G'], d['D']
    pos = 3
    cache = empty_cache(L)
    run_prefill(L, rows(rng, pos, 32), None, cache, 0)
    x = rng.standard_normal(32).astype(np.float32)
    run_decode(L, x, None, cache, pos)

    W_qkv = np.concatenate([L['wq'], L['wk'], L['wv']])
    b_qkv = np.concatenate([L['bq'], L['bk'], L['bv']])
    q_out = np.empty(H * D, np.float32)
    k_out = np.empty(G * D, np.float32)
    v_out = np.empty(G * D, np.float32)
    if with_rope:
        ref.mega_fuse_rmsnorm_qkv_rope(q_out, k_out, v_out, x, L['ln1_gamma'], W_qkv, b_qkv,
                                       L['rope_cos'], L['rope_sin'], pos, 32, H, G, D,
                                       d['C'], 1e-5)
    else:
        ref.mega_fuse_rmsnorm_qkv(q_out, k_out, v_out, x, L['ln1_gamma'], W_qkv, b_qkv,
                                  32, H, G, D, 1e-5)
    # k and v: what decode wrote into the cache at pos.
    np.testing.assert_allclose(k_out, cache[0][:, pos, :].reshape(-1), **TOL_SAME_MATH)
    np.testing.assert_allclose(v_out, cache[1][:, pos, :].reshape(-1), **TOL_SAME_MATH)
    # q: the decode's own q.
    q, _, _ = ref._qkv_rows(x[None, :].astype(np.float64), L['ln1_gamma'],
                            L['wq'], L['bq'], 0, L['wk'], L['bk'], 0, L['wv'], L['bv'], 0,
                            L['rope_cos'], L['rope_sin'], np.array([pos]),
                            32, 32, H, G, D, D, 1e-5, False)
    np.testing.assert_allclose(q_out, q.reshape(-1), **TOL_SAME_MATH)


# ------------------------------------------------------------------------------------------
# MLP
# ------------------------------------------------------------------------------------------

def _mlp_weights(rng, E, Ea, I, Ia, dt=DT.FP32):
    w1 = np.zeros((2, Ia, Ea))
    w1[:, :I, :E] = rng.standard_normal((2, I, E)) * 0.3
    b1 = np.zeros((2, Ia), np.float32)
    b1[:, :I] = rng.standard_normal((2, I)) * 0.1
    w2 = np.zeros((Ea, Ia))
    w2[:E, :I] = rng.standard_normal((E, I)) * 0.3
    b2 = np.zeros(Ea, np.float32)
    b2[:E] = rng.standard_normal(E) * 0.1
    gamma = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
    return gamma, w1.reshape(2 * Ia, Ea).astype(np.float32), b1.reshape(-1), \
        w2.astype(np.float32), b2


def test_outproj_mlp_independent_formula_and_mlp_consistency():
    rng = np.random.default_rng(13)
    T, E, Ea, H, Da, I, Ia = 3, 20, 32, 2, 16, 40, 64
    gamma, w1, b1, w2, b2 = _mlp_weights(rng, E, Ea, I, Ia)
    wo = (rng.standard_normal((Ea, H * Da)) * 0.3).astype(np.float32)
    wo[E:] = 0
    bo = (rng.standard_normal(Ea) * 0.1).astype(np.float32)
    attn = rng.standard_normal((H, T, Da)).astype(np.float32)          # head-major
    res = rows(rng, T, Ea)
    eps = 1e-6
    out = np.empty((T, Ea), np.float32)
    ref.mega_fused_outproj_mlp_prefill(out, attn, res, gamma, wo, bo, 0, w1, b1, 0, w2, b2, 0,
                                       T, E, Ea, H, Da, I, Ia, eps, None)

    # Independently.
    a = attn.astype(np.float64).transpose(1, 0, 2).reshape(T, H * Da)
    h1 = a @ wo.T.astype(np.float64) + bo + res
    h1[:, E:] = 0
    he = h1[:, :E]
    z = np.zeros((T, Ea))
    z[:, :E] = he / np.sqrt(np.mean(he ** 2, axis=1, keepdims=True) + eps) * gamma
    gate = z @ w1[:Ia].T.astype(np.float64) + b1[:Ia]
    up = z @ w1[Ia:].T.astype(np.float64) + b1[Ia:]
    act = gate / (1 + np.exp(-gate)) * up
    want = h1 + act @ w2.T.astype(np.float64) + b2
    want[:, E:] = 0
    np.testing.assert_allclose(out, want, **TOL_SAME_MATH)
    assert np.all(out[:, E:] == 0)

    # Garbage in the intermediate padding of b1 (and w2's padding columns) changes nothing.
    b1_bad = b1.copy().reshape(2, Ia)
    b1_bad[:, I:] = 5.0
    w2_bad = w2.copy()
    w2_bad[:, I:] = 7.0
    out_bad = np.empty_like(out)
    ref.mega_fused_outproj_mlp_prefill(out_bad, attn, res, gamma, wo, bo, 0, w1,
                                       b1_bad.reshape(-1), 0, w2_bad, b2, 0,
                                       T, E, Ea, H, Da, I, Ia, eps, None)
    np.testing.assert_array_equal(out_bad, out)

    # mega_fused_mlp_prefill(input=h1, residual=h1) is the MLP half of the same block.
    h1_32 = h1.astype(np.float32)
    out_mlp = np.empty_like(out)
    ref.mega_fused_mlp_prefill(out_mlp, h1_32, h1_32, gamma, w1, b1, 0, w2, b2, 0,
                               T, E, Ea, I, Ia, eps, None)
    np.testing.assert_allclose(out_mlp, out, **TOL_SAME_MATH)
    # residual None adds nothing
    out_nores = np.empty_like(out)
    ref.mega_fused_mlp_prefill(out_nores, h1_32, None, gamma, w1, b1, 0, w2, b2, 0,
                               T, E, Ea, I, Ia, eps, None)
    np.testing.assert_allclose(out_nores, out - h1_32, **TOL_SAME_MATH)


@pytest.mark.parametrize('dt', [DT.Q8_0, DT.Q4_K], ids=lambda dt: dt.name)
def test_mlp_quantize_activations_switch(dt):
    rng = np.random.default_rng(14)
    T, E, Ea, I, Ia = 3, 256, 256, 512, 512
    gamma, _, b1, _, b2 = _mlp_weights(rng, E, Ea, I, Ia)
    w1 = sensible_blob(dt, 2 * Ia, Ea, rng)
    w2 = sensible_blob(dt, Ea, Ia, rng)
    x = rows(rng, T, Ea)
    outs = {}
    for quantize in (False, True):
        out = np.empty((T, Ea), np.float32)
        ref.mega_fused_mlp_prefill(out, x, x, gamma, w1, b1, dt, w2, b2, dt,
                                   T, E, Ea, I, Ia, 1e-5, None, quantize_activations=quantize)
        outs[quantize] = out
    default = np.empty((T, Ea), np.float32)
    ref.mega_fused_mlp_prefill(default, x, x, gamma, w1, b1, dt, w2, b2, dt,
                               T, E, Ea, I, Ia, 1e-5, None)
    np.testing.assert_array_equal(default, outs[True])          # the kernel quantizes
    assert not np.array_equal(outs[True], outs[False])
    np.testing.assert_allclose(outs[True], outs[False], **TOL_Q8_VS_FLOAT)


# ------------------------------------------------------------------------------------------
# Tiles and the report
# ------------------------------------------------------------------------------------------

def test_tile_formula():
    f = ref.optimal_tiles_from_cache_sizes
    assert f(32 * 1024, 512 * 1024, 64) == (128, 64)
    assert f(32 * 1024, 512 * 1024, 128) == (128, 32)
    # 24576 // 512 = 48 -> 32;  131072 // ((256 + 32) * 4) = 113 -> 64
    assert f(48 * 1024, 256 * 1024, 128) == (64, 32)
    assert f(1024 * 1024, 64 * 1024 * 1024, 16) == (128, 256)   # clamped above
    assert f(1024, 1024, 256) == (16, 16)                       # clamped below
    assert f(0, 512 * 1024, 64) == (64, 64) and f(32768, None, 64) == (64, 64)
    assert [ref.floor_pow2(n) for n in (0, 1, 2, 3, 127, 128)] == [1, 1, 2, 2, 64, 128]


def test_cpu_cache_sizes_from_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate([(1, 'Data', '48K'), (1, 'Instruction', '32K'),
                                             (2, 'Unified', '1M'), (3, 'Unified', '32768K')]):
        d = tmp_path / f'index{i}'
        d.mkdir()
        (d / 'level').write_text(f'{level}\n')
        (d / 'type').write_text(f'{kind}\n')
        (d / 'size').write_text(f'{size}\n')
    assert ref.cpu_cache_sizes(str(tmp_path)) == (48 * 1024, 1024 * 1024)
    assert ref.cpu_cache_sizes(str(tmp_path / 'missing')) == (0, 0)
    (tmp_path / 'index0' / 'size').write_text('garbage\n')
    assert ref.cpu_cache_sizes(str(tmp_path)) == (0, 0)

    q_tile, kv_tile = ref.mega_fuse_get_optimal_tiles(64)
    assert (q_tile, kv_tile) == ref.optimal_tiles_from_cache_sizes(*ref.cpu_cache_sizes(), 64)
    assert 16 <= q_tile <= 128 and 16 <= kv_tile <= 256
    assert q_tile & (q_tile - 1) == 0 and kv_tile & (kv_tile - 1) == 0


def test_report_stats(capsys):
    stats = ref.mega_fuse_report_stats(4096, 32, 2048)
    assert stats == {
        'hidden': 4096, 'num_layers': 32, 'seq_len': 2048,
        'unfused_intermediate_bytes_per_token': 4 * (6 * 4096 + 2048),
        'unfused_traffic_bytes_per_token': 245760,
        'fused_traffic_bytes_per_token': 32768,
        'unfused_traffic_bytes_per_layer': 245760 * 2048,
        'fused_traffic_bytes_per_layer': 32768 * 2048,
        'unfused_traffic_bytes_model': 245760 * 2048 * 32,
        'fused_traffic_bytes_model': 32768 * 2048 * 32,
        'reduction': 7.5,
    }
    printed = capsys.readouterr().out
    for key, value in stats.items():
        line = next(ln for ln in printed.splitlines() if ln.split()[:1] == [key])
        assert float(line.split()[1]) == pytest.approx(value)
    assert 'formula' in printed
