"""megafuse.reference -- the executable form of docs/contract.md.

A plain NumPy implementation of every kernel in ``mega_fused_attention.h``, written to be
read, not to be fast.  Tests compare each compiled kernel with the function of the same name
here.

Conventions (the same for every function):

* One function per header function, same name, same parameter names in the same order.
  ``mega_fuse_get_optimal_tiles(head_dim)`` returns ``(q_tile, kv_tile)`` instead of writing
  through two ``int *``.
* Buffers are NumPy arrays of any shape: only the element count matters, each function
  reshapes internally.  Outputs and KV caches are written IN PLACE (as the C kernel does), so
  they must be C-contiguous and writeable.  ``None`` stands for NULL.
* All the math is done in float64; results are stored as float32.  Everything an output
  depends on is read before the output is written, so ``output`` may be the same array as
  ``input`` or ``residual``.
* Weights are dequantized exactly as GGML does (bit for bit, in float32), then used in float64.
* Validation (docs/contract.md §5) is NOT done here: the only ``assert``s are there to make a
  mistake in a test obvious.

This module imports NumPy, the standard library and, of megafuse, only ``megafuse.kernels.dtype``
(the one definition of ``CKDataType``, plain Python): none of its math comes from the compiled
modules.

Dimension letters used throughout (docs/contract.md §3):

    E  = embed_dim           Ea = aligned_embed_dim
    D  = head_dim            Da = aligned_head_dim
    H  = num_heads           G  = num_kv_heads
    T  = tokens              C  = cache_capacity
    I  = intermediate_dim    Ia = aligned_intermediate_dim
"""
import functools
import glob
import math
import os
import sys

import numpy as np

from megafuse.kernels.dtype import CKDataType, kv_cache_dtype

DT = CKDataType

#: The float weight formats: activations stay float for them, even on the int8 path.
FLOAT_FORMATS = (DT.FP32, DT.FP16, DT.BF16)
#: Block formats of 32 weights: their activations are quantized to Q8_0 on the int8 path.
BLOCK32_FORMATS = (DT.Q4_0, DT.Q4_1, DT.Q5_0, DT.Q5_1, DT.Q8_0, DT.IQ4_NL)
#: Super-blocks of 256 (the K-quants, and IQ4_XS, which llama.cpp pairs with them): their
#: activations are quantized to Q8_K on the int8 path.
KQUANT_FORMATS = (DT.Q2_K, DT.Q3_K, DT.Q4_K, DT.Q5_K, DT.Q6_K, DT.IQ4_XS)

#: (weights per block, bytes per block) of the GGML block formats (Q8_K: activations only).
BLOCK_LAYOUT = {
    DT.Q4_0: (32, 18),    # d fp16, qs[16]
    DT.Q4_1: (32, 20),    # d fp16, m fp16, qs[16]
    DT.Q5_0: (32, 22),    # d fp16, qh u32, qs[16]
    DT.Q5_1: (32, 24),    # d fp16, m fp16, qh u32, qs[16]
    DT.Q8_0: (32, 34),    # d fp16, qs int8[32]
    DT.IQ4_NL: (32, 18),  # d fp16, qs[16] (indices into KVALUES_IQ4NL)
    DT.Q2_K: (256, 84),   # scales[16], qs[64], d fp16, dmin fp16
    DT.Q3_K: (256, 110),  # hmask[32], qs[64], scales[12], d fp16
    DT.Q4_K: (256, 144),  # d fp16, dmin fp16, scales[12], qs[128]
    DT.Q5_K: (256, 176),  # d fp16, dmin fp16, scales[12], qh[32], qs[128]
    DT.Q6_K: (256, 210),  # ql[128], qh[64], scales int8[16], d fp16
    DT.IQ4_XS: (256, 136),  # d fp16, scales_h u16, scales_l[4], qs[128]
    DT.Q8_K: (256, 292),  # d f32, qs int8[256], bsums int16[16]
}


def ck_dtype_row_bytes(dt, n):
    """Bytes of one row of ``n`` values stored as ``dt`` (docs/contract.md §2)."""
    dt = DT(int(dt))
    if dt == DT.FP32:
        return 4 * n
    if dt in (DT.FP16, DT.BF16):
        return 2 * n
    if dt in BLOCK_LAYOUT:
        block, nbytes = BLOCK_LAYOUT[dt]
        assert n % block == 0, f'{dt.name} row of {n} values is not whole blocks of {block}'
        return n // block * nbytes
    raise ValueError(f'{dt.name} is not a storage format with a row size')


# ---------------------------------------------------------------------------------------------
# Comparing with the reference
# ---------------------------------------------------------------------------------------------

def rel_err(got, want):
    """max |got - want| / max |want|, in float64 over every element: the error measure of every
    comparison with this reference (the tests, ``megafuse bench``).  The scale is 1 where
    ``want`` is all zeros; a NaN in either array gives NaN (which fails any ``<`` bound).
    """
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(want)))
    return float(np.max(np.abs(got - want))) / (scale if scale != 0 else 1.0)


# ---------------------------------------------------------------------------------------------
# Small array helpers
# ---------------------------------------------------------------------------------------------

def _f64(arr, shape):
    """A float64 copy of ``arr`` (any shape, right element count) reshaped to ``shape``."""
    a = np.asarray(arr)
    assert a.size == math.prod(shape), f'expected {math.prod(shape)} elements, got {a.size}'
    return a.reshape(shape).astype(np.float64)


def _out_view(arr, shape):
    """A writeable view of output buffer ``arr`` as ``shape`` (writes reach the caller)."""
    assert isinstance(arr, np.ndarray), 'outputs must be numpy arrays'
    assert arr.flags.c_contiguous and arr.flags.writeable, 'outputs must be C-contiguous, writeable'
    assert arr.size == math.prod(shape), f'expected {math.prod(shape)} elements, got {arr.size}'
    view = arr.reshape(shape)
    assert np.shares_memory(view, arr)
    return view


def _store(dst, values):
    """Store float64 ``values`` into the float32 buffer ``dst`` in place."""
    view = _out_view(dst, values.shape)
    view[...] = values.astype(np.float32)


def _bias(b, n):
    """A bias of ``n`` values as float64, or zeros for None (NULL: no bias)."""
    return np.zeros(n) if b is None else _f64(b, (n,))


def _fp16_to_f32(two_byte_columns):
    """Little-endian IEEE half-precision numbers stored as 2 uint8 columns -> float32 (n, 1)."""
    return np.ascontiguousarray(two_byte_columns).view('<f2').astype(np.float32)


def _round_half_away(v):
    """C ``roundf``: round to nearest, halfway cases away from zero.

    Done in float64 so that ``|v| + 0.5`` is exact for any float32 ``v``
    (``0.49999997 + 0.5`` would round up to 1.0 in float32).
    """
    v = np.asarray(v, dtype=np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def float_to_bf16_bits(x):
    """float32 values -> uint16 bfloat16 bits, round to nearest even (GGML's conversion)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet_nan = (bits >> 16) | 0x40
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


# ---------------------------------------------------------------------------------------------
# Weights: dequantization (GGML byte layouts, written from their definitions)
# ---------------------------------------------------------------------------------------------

def _blocks(blob, dt, rows, cols):
    """The bytes of a quantized [rows, cols] matrix as an (n_blocks, bytes_per_block) array.

    Rows are stored one after another, each as cols/block blocks, so the blocks of the whole
    matrix are simply consecutive.
    """
    block, nbytes = BLOCK_LAYOUT[dt]
    assert cols % block == 0, f'{dt.name}: {cols} columns is not whole blocks of {block}'
    raw = np.ascontiguousarray(blob).reshape(-1).view(np.uint8)
    n_blocks = rows * (cols // block)
    assert raw.size == n_blocks * nbytes, \
        f'{dt.name} [{rows}, {cols}]: expected {n_blocks * nbytes} bytes, got {raw.size}'
    return raw.reshape(n_blocks, nbytes)


def _nibbles(qs):
    """16 bytes -> 32 values: byte j gives weight j (low nibble) and weight j+16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits_32(qh_bytes):
    """Q5_0/Q5_1: bit 4 of each of the 32 weights, from the 4-byte little-endian qh.

    For j < 16: weight j takes bit j of qh, weight j+16 takes bit j+16 (GGML writes the
    second one as ``(qh >> (j + 12)) & 0x10``, the same bit moved to position 4).
    """
    qh = np.ascontiguousarray(qh_bytes).view('<u4')              # (n, 1)
    j = np.arange(32, dtype=np.uint32)
    return (((qh >> j) & 1) << 4).astype(np.uint8)               # (n, 32): 0 or 16


def _dequant_q4_0(b):
    # Q4_0 (18 B / 32): d fp16, qs[16].  x = d * (nibble - 8).
    d = _fp16_to_f32(b[:, 0:2])
    q = _nibbles(b[:, 2:18]).astype(np.int8) - 8
    return d * q.astype(np.float32)


def _dequant_q4_1(b):
    # Q4_1 (20 B / 32): d fp16, m fp16, qs[16].  x = d * nibble + m.
    d = _fp16_to_f32(b[:, 0:2])
    m = _fp16_to_f32(b[:, 2:4])
    q = _nibbles(b[:, 4:20])
    return d * q.astype(np.float32) + m


def _dequant_q5_0(b):
    # Q5_0 (22 B / 32): d fp16, qh u32, qs[16].  x = d * ((nibble | high bit << 4) - 16).
    d = _fp16_to_f32(b[:, 0:2])
    q = (_nibbles(b[:, 6:22]) | _high_bits_32(b[:, 2:6])).astype(np.int8) - 16
    return d * q.astype(np.float32)


def _dequant_q5_1(b):
    # Q5_1 (24 B / 32): d fp16, m fp16, qh u32, qs[16].  x = d * (nibble | high bit << 4) + m.
    d = _fp16_to_f32(b[:, 0:2])
    m = _fp16_to_f32(b[:, 2:4])
    q = _nibbles(b[:, 8:24]) | _high_bits_32(b[:, 4:8])
    return d * q.astype(np.float32) + m


def _dequant_q8_0(b):
    # Q8_0 (34 B / 32): d fp16, qs int8[32].  x = d * q.
    d = _fp16_to_f32(b[:, 0:2])
    q = np.ascontiguousarray(b[:, 2:34]).view(np.int8)
    return d * q.astype(np.float32)


def _scale_min_k4(scales):
    """GGML ``get_scale_min_k4``: the 6-bit scale and min of each of the 8 sub-blocks.

    scales: (n, 12) uint8 -> (sc, m), each (n, 8) uint8.
    Sub-blocks 0..3 keep their low 6 bits in bytes 0..3 (scale) and 4..7 (min); sub-blocks
    4..7 keep their low 4 bits in bytes 8..11 and their top 2 bits in the top bits of
    bytes 0..3 (scale) and 4..7 (min).
    """
    sc = np.empty((scales.shape[0], 8), dtype=np.uint8)
    m = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[:, j] = scales[:, j] & 63
            m[:, j] = scales[:, j + 4] & 63
        else:
            sc[:, j] = (scales[:, j + 4] & 0x0F) | ((scales[:, j - 4] >> 6) << 4)
            m[:, j] = (scales[:, j + 4] >> 4) | ((scales[:, j] >> 6) << 4)
    return sc, m


def _kquant_scales(b):
    """Q4_K/Q5_K: per sub-block d*sc and dmin*m, in float32 as GGML computes them. (n, 8, 1)."""
    d = _fp16_to_f32(b[:, 0:2])
    dmin = _fp16_to_f32(b[:, 2:4])
    sc, m = _scale_min_k4(b[:, 4:16])
    d_sc = d * sc.astype(np.float32)         # float32, exact (11-bit d times 6-bit sc)
    dmin_m = dmin * m.astype(np.float32)
    return d_sc[:, :, None], dmin_m[:, :, None]


def _dequant_q4_k(b):
    # Q4_K (144 B / 256): d, dmin fp16, scales[12], qs[128].  8 sub-blocks of 32.
    # The 128 qs bytes are 4 chunks of 32; chunk c holds sub-block 2c in its low nibbles and
    # sub-block 2c+1 in its high nibbles.  x = (d*sc) * q - (dmin*m).
    n = b.shape[0]
    d_sc, dmin_m = _kquant_scales(b)
    qs = b[:, 16:144].reshape(n, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    return (d_sc * q.astype(np.float32) - dmin_m).reshape(n, 256)


def _dequant_q5_k(b):
    # Q5_K (176 B / 256): d, dmin fp16, scales[12], qh[32], qs[128].  As Q4_K, plus a 5th bit:
    # in chunk c, the low nibble of qs[32c+l] gets bit 2c of qh[l], the high nibble bit 2c+1.
    n = b.shape[0]
    d_sc, dmin_m = _kquant_scales(b)
    qh = b[:, 16:48].reshape(n, 1, 32)
    qs = b[:, 48:176].reshape(n, 4, 32)
    two_c = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 4, 1)
    low = (qs & 0x0F) | (((qh >> two_c) & 1) << 4)
    high = (qs >> 4) | (((qh >> (two_c + 1)) & 1) << 4)
    q = np.stack([low, high], axis=2).reshape(n, 8, 32)
    return (d_sc * q.astype(np.float32) - dmin_m).reshape(n, 256)


def _dequant_q6_k(b):
    # Q6_K (210 B / 256): ql[128], qh[64], scales int8[16], d fp16 (at the end).
    # Two halves of 128 weights (ql offset 64n, qh offset 32n, scales offset 8n); for l < 32:
    #   q1 = (ql[l]    & 0xF) | ((qh[l] >> 0) & 3) << 4   -> weight l
    #   q2 = (ql[l+32] & 0xF) | ((qh[l] >> 2) & 3) << 4   -> weight l+32
    #   q3 = (ql[l]    >> 4)  | ((qh[l] >> 4) & 3) << 4   -> weight l+64
    #   q4 = (ql[l+32] >> 4)  | ((qh[l] >> 6) & 3) << 4   -> weight l+96
    # each minus 32; weight i of the half uses scale i // 16.  x = (d * scale) * q.
    n = b.shape[0]
    d = _fp16_to_f32(b[:, 208:210])                                  # (n, 1)
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8)      # (n, 16)
    out = np.empty((n, 256), dtype=np.float32)
    for half in range(2):
        ql = b[:, 64 * half: 64 * half + 64]
        qh = b[:, 128 + 32 * half: 128 + 32 * half + 32]
        q1 = (ql[:, 0:32] & 0x0F) | (((qh >> 0) & 3) << 4)
        q2 = (ql[:, 32:64] & 0x0F) | (((qh >> 2) & 3) << 4)
        q3 = (ql[:, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
        q4 = (ql[:, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
        q = np.concatenate([q1, q2, q3, q4], axis=1).astype(np.int8) - 32   # (n, 128)
        sc = scales[:, 8 * half: 8 * half + 8].astype(np.float32)           # (n, 8)
        d_sc = (d * sc)[:, :, None]                                         # (n, 8, 1)
        y = d_sc * q.reshape(n, 8, 16).astype(np.float32)
        out[:, 128 * half: 128 * half + 128] = y.reshape(n, 128)
    return out


#: GGML's kvalues_iq4nl: the value of each 4-bit index of IQ4_NL and IQ4_XS.
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         dtype=np.int8)


def _two_bit_codes(qs):
    """Q2_K / Q3_K: the 2-bit codes of a super-block in weight order, (n, 256) uint8.

    qs (n, 64): two halves of 32 bytes; in half h, bits 2k..2k+1 of byte l are weight
    128h + 32k + l.
    """
    n = qs.shape[0]
    halves = qs.reshape(n, 2, 1, 32)
    shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    return ((halves >> shifts) & 3).reshape(n, 256)


def _dequant_q2_k(b):
    # Q2_K (84 B / 256): scales[16] (low nibble: scale, high: min), qs[64], d, dmin fp16.
    # 16 sub-blocks of 16: x = (d*sc) * q - (dmin*m), q the 2-bit code.
    n = b.shape[0]
    d = _fp16_to_f32(b[:, 80:82])
    dmin = _fp16_to_f32(b[:, 82:84])
    d_sc = (d * (b[:, 0:16] & 0x0F).astype(np.float32))[:, :, None]     # exact
    dmin_m = (dmin * (b[:, 0:16] >> 4).astype(np.float32))[:, :, None]
    q = _two_bit_codes(b[:, 16:80]).reshape(n, 16, 16).astype(np.float32)
    return (d_sc * q - dmin_m).reshape(n, 256)


def _q3k_scales(scales):
    """Q3_K: the 16 6-bit scales (0..63) of (n, 12) scale bytes.  Scale j keeps its low 4 bits
    in the low (j < 8) or high (j >= 8) nibble of byte j % 8 and its top 2 bits in bits
    2(j // 4), 2(j // 4) + 1 of byte 8 + j % 4."""
    j = np.arange(16)
    low = (scales[:, j % 8] >> np.where(j < 8, 0, 4).astype(np.uint8)) & 0x0F
    high = (scales[:, 8 + j % 4] >> (2 * (j // 4)).astype(np.uint8)) & 3
    return low | (high << 4)


def _dequant_q3_k(b):
    # Q3_K (110 B / 256): hmask[32], qs[64], scales[12], d fp16.  16 sub-blocks of 16:
    # x = (d * (sc - 32)) * (q - 4 + 4h), q the 2-bit code, h bit k of hmask[l] for weight
    # 32k + l.
    n = b.shape[0]
    d = _fp16_to_f32(b[:, 108:110])
    sc = _q3k_scales(b[:, 96:108]).astype(np.int8) - 32
    dl = (d * sc.astype(np.float32))[:, :, None]                         # exact
    hbit = (b[:, 0:32].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = (_two_bit_codes(b[:, 32:96]).astype(np.int8) - 4 + 4 * hbit.reshape(n, 256).astype(np.int8))
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


def _dequant_iq4_nl(b):
    # IQ4_NL (18 B / 32): d fp16, qs[16].  x = d * KVALUES_IQ4NL[nibble].
    d = _fp16_to_f32(b[:, 0:2])
    return d * KVALUES_IQ4NL[_nibbles(b[:, 2:18])].astype(np.float32)


def _dequant_iq4_xs(b):
    # IQ4_XS (136 B / 256): d fp16, scales_h u16, scales_l[4], qs[128].  8 sub-blocks of 32:
    # ls_j = (4 bits of scales_l[j // 2], low nibble for even j) | (bits 2j, 2j+1 of scales_h) << 4,
    # x = (d * (ls_j - 32)) * KVALUES_IQ4NL[nibble]; qs[16j + l] holds weights 32j + l (low
    # nibble) and 32j + 16 + l (high).
    n = b.shape[0]
    d = _fp16_to_f32(b[:, 0:2])
    scales_h = np.ascontiguousarray(b[:, 2:4]).view('<u2')                # (n, 1)
    j = np.arange(8)
    low = (b[:, 4 + j // 2] >> (4 * (j % 2)).astype(np.uint8)) & 0x0F
    high = ((scales_h >> (2 * j).astype(np.uint16)) & 3).astype(np.uint8)
    ls = (low | (high << 4)).astype(np.int8) - 32
    dl = (d * ls.astype(np.float32))[:, :, None]                         # exact
    qs = b[:, 8:136].reshape(n * 8, 16)
    v = KVALUES_IQ4NL[_nibbles(qs)].astype(np.float32).reshape(n, 8, 32)
    return (dl * v).reshape(n, 256)


_DEQUANT_BLOCKS = {
    DT.Q4_0: _dequant_q4_0, DT.Q4_1: _dequant_q4_1,
    DT.Q5_0: _dequant_q5_0, DT.Q5_1: _dequant_q5_1, DT.Q8_0: _dequant_q8_0,
    DT.Q4_K: _dequant_q4_k, DT.Q5_K: _dequant_q5_k, DT.Q6_K: _dequant_q6_k,
    DT.Q2_K: _dequant_q2_k, DT.Q3_K: _dequant_q3_k, DT.IQ4_NL: _dequant_iq4_nl,
    DT.IQ4_XS: _dequant_iq4_xs,
}


def dequantize(blob, dtype, shape):
    """The weights of a [rows, cols] matrix stored as ``dtype``, as a float64 array of ``shape``.

    * FP32: a float32 array.
    * FP16: a float16 array, or uint16 holding fp16 bits.
    * BF16: uint16 holding bfloat16 bits (the top 16 bits of a float32).
    * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: uint8 bytes,
      ``rows`` rows of ``cols / block`` blocks (GGML layouts).  The values are computed in
      float32 exactly as GGML's ``dequantize_row_*`` does, so they equal
      ``gguf.quants.dequantize`` bit for bit; float64 of those float32 values is returned.
    """
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    rows, cols = (1, shape[0]) if len(shape) == 1 else (math.prod(shape[:-1]), shape[-1])
    dt = DT(int(dtype))
    a = np.asarray(blob)
    if dt == DT.FP32:
        w = a.reshape(-1).view(np.float32) if a.dtype == np.uint8 else a.reshape(-1)
        assert w.dtype == np.float32, f'FP32 weights must be float32, got {w.dtype}'
    elif dt == DT.FP16:
        w = a.reshape(-1)
        if w.dtype != np.float16:                        # uint16 (or bytes) holding fp16 bits
            w = np.ascontiguousarray(w).view(np.float16)
    elif dt == DT.BF16:
        bits = np.ascontiguousarray(a).reshape(-1).view(np.uint16)
        w = (bits.astype(np.uint32) << 16).view(np.float32)
    elif dt in _DEQUANT_BLOCKS:
        with np.errstate(invalid='ignore', over='ignore'):   # Inf/NaN scales just propagate
            w = _DEQUANT_BLOCKS[dt](_blocks(a, dt, rows, cols))
        assert w.dtype == np.float32
    else:
        raise ValueError(f'{dt.name} is not a weight format')
    assert w.size == rows * cols, f'{dt.name}: expected {rows * cols} weights, got {w.size}'
    return w.astype(np.float64).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Weights: K-quant quantization (GGML's quantize_row_q{4,5,6}_K_ref, byte for byte)
# ---------------------------------------------------------------------------------------------
# A port of GGML's reference quantizers (ggml-quants.c), vectorised over groups of weights:
# every function below handles all the blocks of its input at once, and loops only where GGML's
# C loops carry a value from one element to the next.
#
# Bit-exactness rests on three rules, kept throughout:
# * Every value is float32, and every C expression is evaluated in C's order, one rounding per
#   operation (``a*b + c`` is two roundings: GGML's reference build does not fuse them).
# * A C reduction (``s += t`` over a loop) is summed here column by column in the same order
#   (``_sum_in_order``), never with ``np.sum`` (pairwise summation rounds differently); a C
#   running max / min (``if (x[i] < min) min = x[i]``) is a column-by-column ``np.where``, which
#   also keeps C's answer when a NaN is compared (the comparison is false, nothing changes).
# * Rounding to an integer is GGML's ``nearest_int``, done on the bits as GGML does (below), and
#   C's conversions of an int to ``uint8_t`` / ``int8_t`` keep its low byte.
#
# Non-finite input.  The arithmetic is IEEE's, so Inf and NaN give what GGML's C gives wherever
# that is decided by IEEE rules.  What ``nearest_int`` makes of a NaN is decided by the NaN's
# mantissa bits: a NaN without payload (``np.nan``, ``-np.nan``, and the NaN that 0 * Inf or
# Inf - Inf produce on x86 and ARM) gives 0, so the result is fixed.  A NaN that carries a
# payload gives another integer, and which operand's payload survives an operation between two
# NaNs depends on how the C compiler ordered the operands; such input has no defined bytes.

_F32 = np.float32
_GROUP_MAX_EPS = _F32(1e-15)               # GGML's GROUP_MAX_EPS
_NEAREST_INT_MAGIC = _F32(12582912.0)      # 1.5 * 2^23


def nearest_int(v):
    """GGML's ``nearest_int``: float32 -> int32, round to nearest, ties to even.

    GGML adds 1.5 * 2^23 and reads the low 23 bits of the sum: for |v| <= 2^22 that is
    round-half-even.  Beyond that range, and for Inf and NaN, the same bit operations give some
    integer (Inf: -2^22; a NaN without payload: 0); it is reproduced exactly, never assumed.
    """
    shifted = np.asarray(v, dtype=_F32) + _NEAREST_INT_MAGIC
    return (shifted.view(np.int32) & 0x007FFFFF) - 0x00400000


def _low_byte(v):
    """C's conversion of an int to ``uint8_t``: the value modulo 256."""
    return (np.asarray(v) & 0xFF).astype(np.uint8)


def _sum_in_order(terms):
    """``float s = 0; for (i...) s += terms[i];`` for each row of ``terms`` (m, n) -> (m,)."""
    total = np.zeros(terms.shape[0], dtype=_F32)
    for i in range(terms.shape[1]):
        total = total + terms[:, i]
    return total


def _fp32_to_fp16_bits(v):
    """``GGML_FP32_TO_FP16``: round to nearest even (subnormals included, >= 65520 -> Inf).

    NumPy's float16 cast rounds the same way.  Returns the uint16 bits and their float32 value
    (``GGML_FP16_TO_FP32`` of the stored half, which GGML re-reads before requantizing).
    """
    with np.errstate(over='ignore'):
        half = np.asarray(v, dtype=_F32).astype(np.float16)
    return half.view(np.uint16), half.astype(_F32)


def _store_fp16(dst_two_columns, bits):
    """Write uint16 ``bits`` (n,) little-endian into the (n, 2) uint8 columns of the blocks."""
    dst_two_columns[...] = bits.astype('<u2').view(np.uint8).reshape(-1, 2)


def make_qkx2_quants(x, weights, nmax, rmin, rdelta, nstep):
    """GGML's ``make_qkx2_quants`` (``use_mad = false``) on m groups of n weights at once.

    x, weights: (m, n) float32.  Finds codes L in 0..nmax, a scale and a min so that
    ``scale * L + min`` fits x in the weighted least-squares sense: first from the group's range
    (min clamped to <= 0), then over ``nstep + 1`` trial scales ``(rmin + rdelta*is + nmax) /
    (max - min)``, keeping a trial whose weighted squared error is smaller.  As in GGML, a kept
    trial's min replaces ``min`` for the trials after it.  A group whose max equals its clamped
    min gets scale 0, L = 0.

    Returns (scale (m,) float32, the_min = -min (m,) float32, L (m, n) uint8).
    """
    f = _F32
    x = np.asarray(x, dtype=f)
    weights = np.asarray(weights, dtype=f)
    with np.errstate(all='ignore'):                       # Inf / NaN just propagate, as in C
        lo = x[:, 0].copy()
        hi = x[:, 0].copy()
        sum_w = weights[:, 0].copy()
        sum_x = sum_w * x[:, 0]
        for i in range(1, x.shape[1]):
            xi, w = x[:, i], weights[:, i]
            lo = np.where(xi < lo, xi, lo)
            hi = np.where(xi > hi, xi, hi)
            sum_w = sum_w + w
            sum_x = sum_x + w * xi
        lo = np.where(lo > 0, f(0), lo)
        flat = hi == lo                                   # C returns here: L = 0, scale 0
        flat_min = lo

        def codes(iscale, lo):
            """nearest_int(iscale * (x - min)) clamped to 0..nmax: (m, n) uint8."""
            q = nearest_int(iscale[:, None] * (x - lo[:, None]))
            return np.clip(q, 0, nmax).astype(np.uint8)

        def weighted_error(scale, lo, L):
            """sum_i w_i * (scale * L_i + min - x_i)^2, in C's order."""
            diff = scale[:, None] * L.astype(f) + lo[:, None] - x
            return _sum_in_order(weights * (diff * diff))

        iscale = f(nmax) / (hi - lo)
        scale = f(1) / iscale
        L = codes(iscale, lo)
        if nstep >= 1:
            best_error = weighted_error(scale, lo, L)
            for step in range(nstep + 1):
                iscale = (f(rmin) + f(rdelta) * f(step) + f(nmax)) / (hi - lo)
                Laux = codes(iscale, lo)
                lf = Laux.astype(f)
                wl = weights * lf
                sum_l = _sum_in_order(wl)
                sum_l2 = _sum_in_order(wl * lf)
                sum_xl = _sum_in_order(wl * x)
                D = sum_w * sum_l2 - sum_l * sum_l
                this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
                this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
                positive_min = this_min > 0
                this_min = np.where(positive_min, f(0), this_min)
                this_scale = np.where(positive_min, sum_xl / sum_l2, this_scale)
                cur_error = weighted_error(this_scale, this_min, Laux)
                better = ~flat & (D > 0) & (cur_error < best_error)
                L = np.where(better[:, None], Laux, L)
                best_error = np.where(better, cur_error, best_error)
                scale = np.where(better, this_scale, scale)
                lo = np.where(better, this_min, lo)
        L[flat] = 0
        scale = np.where(flat, f(0), scale)
        lo = np.where(flat, flat_min, lo)
        return scale, -lo, L


def make_qx_quants_rmse1(x, nmax):
    """GGML's ``make_qx_quants`` with ``rmse_type = 1`` and no importance weights (Q6_K's call),
    on m groups of n weights at once.

    x: (m, n) float32.  Codes l in -nmax..nmax-1 against ``max`` (the value of largest |x|, first
    occurrence), scale by weighted least squares (weights x^2), then 18 trial scales
    ``-(nmax + 0.1*is) / max`` (is = -9..9, not 0), keeping one that increases
    ``sumlx^2 / suml2``.  A group with max |x| < 1e-15 gets scale 0 and L = 0.

    Returns (scale (m,) float32, L = l + nmax (m, n) int8).
    """
    f = _F32
    x = np.asarray(x, dtype=f)
    with np.errstate(all='ignore'):
        amax = np.zeros(x.shape[0], dtype=f)
        vmax = np.zeros(x.shape[0], dtype=f)
        for i in range(x.shape[1]):
            ax = np.abs(x[:, i])
            larger = ax > amax
            amax = np.where(larger, ax, amax)
            vmax = np.where(larger, x[:, i], vmax)
        all_zero = amax < _GROUP_MAX_EPS
        w = x * x

        def trial(iscale):
            """(q, sumlx, suml2) of the codes q = l in -nmax..nmax-1 that ``iscale`` gives."""
            q = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
            qf = q.astype(f)
            return q, _sum_in_order((w * x) * qf), _sum_in_order((w * qf) * qf)

        q, sumlx, suml2 = trial(f(-nmax) / vmax)
        scale = np.where(suml2 != 0, sumlx / suml2, f(0))
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            q_step, sumlx, suml2 = trial(-(f(nmax) + f(0.1) * f(step)) / vmax)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            q = np.where(better[:, None], q_step, q)
            scale = np.where(better, sumlx / suml2, scale)
            best = np.where(better, scale * sumlx, best)
        L = (q + nmax).astype(np.int8)
        L[all_zero] = 0
        return np.where(all_zero, f(0), scale), L


def _pack_scale_min_k4(ls, lm):
    """The inverse of ``_scale_min_k4``: 6-bit scales ``ls`` and mins ``lm`` of the 8 sub-blocks,
    (n, 8) uint8 each -> the 12 ``scales`` bytes (n, 12) uint8."""
    out = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4]
    out[:, 4:8] = lm[:, 0:4]
    out[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    out[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    out[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    return out


def _running_max(values):
    """``float m = 0; for (j...) if (v[j] > m) m = v[j];`` per row of (n, k) -> (n,)."""
    best = np.zeros(values.shape[0], dtype=_F32)
    for j in range(values.shape[1]):
        best = np.where(values[:, j] > best, values[:, j], best)
    return best


def _kquant_scales_codes(xb, nmax, rmin, rdelta, nstep):
    """The part Q4_K and Q5_K share, for super-blocks xb (n, 256) float32.

    Per sub-block of 32: ``make_qkx2_quants`` with weights ``sqrt(mean(x^2)) + |x|``.  The scales
    and mins are then coded in 6 bits against the largest of each (d = max_scale / 63,
    dmin = max_min / 63, both stored as fp16), and every weight is coded again against the scale
    and min it will be decoded with: ``nearest_int((x + dmin*m) / (d*sc))`` clamped to 0..nmax
    (a sub-block whose d*sc is 0 keeps the codes of make_qkx2_quants).

    Returns (d bits (n,) uint16, dmin bits (n,) uint16, scales (n, 12) uint8, L (n, 256) uint8).
    """
    f = _F32
    n = xb.shape[0]
    sub = xb.reshape(n * 8, 32)                                     # [n*8 sub-blocks, 32]
    with np.errstate(all='ignore'):
        av_x = np.sqrt(_sum_in_order(sub * sub) / f(32))
        weights = av_x[:, None] + np.abs(sub)
        scale, the_min, L = make_qkx2_quants(sub, weights, nmax, rmin, rdelta, nstep)
        scales = scale.reshape(n, 8)
        mins = the_min.reshape(n, 8)
        max_scale = _running_max(scales)
        max_min = _running_max(mins)
        inv_scale = np.where(max_scale > 0, f(63) / max_scale, f(0))
        inv_min = np.where(max_min > 0, f(63) / max_min, f(0))
        ls = np.minimum(_low_byte(nearest_int(inv_scale[:, None] * scales)), 63)
        lm = np.minimum(_low_byte(nearest_int(inv_min[:, None] * mins)), 63)
        packed = _pack_scale_min_k4(ls, lm)
        d_bits, d = _fp32_to_fp16_bits(max_scale / f(63))
        dmin_bits, dmin = _fp32_to_fp16_bits(max_min / f(63))
        sc, m = _scale_min_k4(packed)                               # as the decoder reads them
        d_sc = d[:, None] * sc.astype(f)                            # (n, 8)
        dmin_m = dmin[:, None] * m.astype(f)
        xs = xb.reshape(n, 8, 32)
        q = nearest_int((xs + dmin_m[:, :, None]) / d_sc[:, :, None])
        q = np.clip(q, 0, nmax).astype(np.uint8)
        L = np.where((d_sc == 0)[:, :, None], L.reshape(n, 8, 32), q)
    return d_bits, dmin_bits, packed, L.reshape(n, 256)


def _superblocks(x):
    """float32 rows [..., k] (k a multiple of 256) -> (super-blocks (n, 256), output shape)."""
    x = np.asarray(x, dtype=np.float32)
    assert x.ndim >= 1 and x.shape[-1] % 256 == 0, 'K-quant rows are whole blocks of 256'
    return np.ascontiguousarray(x).reshape(-1, 256), x.shape[:-1], x.shape[-1] // 256


def quantize_q4_K(x):
    """GGML ``quantize_row_q4_K_ref`` on float32 rows [..., k] -> uint8 [..., k/256 * 144].

    Block (144 B / 256): d fp16, dmin fp16, scales[12] (6-bit scale and min of 8 sub-blocks of
    32), qs[128]: 4 chunks of 32 bytes, chunk c holding sub-block 2c in its low nibbles and
    sub-block 2c+1 in its high nibbles.  Weight = d*sc * q - dmin*m.
    """
    xb, lead, nblk = _superblocks(x)
    d, dmin, scales, L = _kquant_scales_codes(xb, 15, -1.0, 0.1, 20)
    out = np.empty((xb.shape[0], 144), dtype=np.uint8)
    _store_fp16(out[:, 0:2], d)
    _store_fp16(out[:, 2:4], dmin)
    out[:, 4:16] = scales
    chunks = L.reshape(-1, 4, 2, 32)                    # [block, chunk c, sub-block 2c + k, 32]
    out[:, 16:144] = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(-1, 128)
    return out.reshape(lead + (nblk * 144,))


def quantize_q5_K(x):
    """GGML ``quantize_row_q5_K_ref`` on float32 rows [..., k] -> uint8 [..., k/256 * 176].

    Block (176 B / 256): d, dmin fp16, scales[12], qh[32], qs[128].  Codes 0..31: their low 4
    bits are packed as Q4_K's; bit 4 of weight l of sub-block 2c goes to bit 2c of qh[l], of
    sub-block 2c+1 to bit 2c+1.
    """
    xb, lead, nblk = _superblocks(x)
    d, dmin, scales, L = _kquant_scales_codes(xb, 31, -0.5, 0.1, 15)
    out = np.empty((xb.shape[0], 176), dtype=np.uint8)
    _store_fp16(out[:, 0:2], d)
    _store_fp16(out[:, 2:4], dmin)
    out[:, 4:16] = scales
    sub = L.reshape(-1, 8, 32)                                  # [block, sub-block, 32]
    bit = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)         # sub-block j -> qh bit j
    out[:, 16:48] = np.bitwise_or.reduce((sub >> 4) << bit, axis=1)
    low = (sub & 0x0F).reshape(-1, 4, 2, 32)
    out[:, 48:176] = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    return out.reshape(lead + (nblk * 176,))


def quantize_q6_K(x):
    """GGML ``quantize_row_q6_K_ref`` on float32 rows [..., k] -> uint8 [..., k/256 * 210].

    Per sub-block of 16: ``make_qx_quants`` (nmax 32).  The 16 scales are coded as int8 against
    the one of largest magnitude (iscale = -128 / max_scale, d = 1 / iscale stored as fp16), and
    every weight is coded again against d * scale: ``nearest_int(x / (d*sc))`` clamped to
    -32..31, plus 32.  A super-block whose scales are all below 1e-15 is all zero bytes.
    Block (210 B / 256): ql[128], qh[64], scales int8[16], d fp16 -- packed as
    ``_dequant_q6_k`` reads them.
    """
    f = _F32
    xb, lead, nblk = _superblocks(x)
    n = xb.shape[0]
    with np.errstate(all='ignore'):
        scale, L = make_qx_quants_rmse1(xb.reshape(n * 16, 16), 32)
        scales = scale.reshape(n, 16)
        max_abs = np.zeros(n, dtype=f)
        max_scale = np.zeros(n, dtype=f)
        for j in range(16):
            a = np.abs(scales[:, j])
            larger = a > max_abs
            max_abs = np.where(larger, a, max_abs)
            max_scale = np.where(larger, scales[:, j], max_scale)
        zero_block = max_abs < _GROUP_MAX_EPS
        iscale = f(-128) / max_scale
        d_bits, d = _fp32_to_fp16_bits(f(1) / iscale)
        sc = _low_byte(np.minimum(127, nearest_int(iscale[:, None] * scales))).view(np.int8)
        d_sc = d[:, None] * sc.astype(f)                                   # (n, 16)
        xs = xb.reshape(n, 16, 16)
        q = np.clip(nearest_int(xs / d_sc[:, :, None]), -32, 31) + 32
        L = np.where((d_sc == 0)[:, :, None], L.reshape(n, 16, 16), q).reshape(n, 2, 4, 32)
    L = L.astype(np.uint8)                               # [block, half, quarter, 32], 0..63
    low = L & 0x0F
    ql = np.stack([low[:, :, 0] | (low[:, :, 2] << 4),   # ql[64h + l]:      quarters 0 and 2
                   low[:, :, 1] | (low[:, :, 3] << 4)],  # ql[64h + 32 + l]: quarters 1 and 3
                  axis=2)                                 # [block, half, run, 32]
    shift = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    qh = np.bitwise_or.reduce((L >> 4) << shift, axis=2) # [block, half, 32]: 2 bits a quarter
    out = np.empty((n, 210), dtype=np.uint8)
    out[:, 0:128] = ql.reshape(n, 128)
    out[:, 128:192] = qh.reshape(n, 64)
    out[:, 192:208] = sc.view(np.uint8)
    _store_fp16(out[:, 208:210], d_bits)
    out[zero_block] = 0
    return out.reshape(lead + (nblk * 210,))


#: The K-quant weight quantizers by format.
KQUANT_QUANTIZERS = {DT.Q4_K: quantize_q4_K, DT.Q5_K: quantize_q5_K, DT.Q6_K: quantize_q6_K}


# ---------------------------------------------------------------------------------------------
# Q4_0, Q4_1, Q5_0, Q5_1 weights: gguf.quants.quantize, its float -> uint8 cast made explicit
# ---------------------------------------------------------------------------------------------
# gguf's quantizers (NumPy ports of GGML's quantize_row_q{4,5}_{0,1}_ref) end in NumPy's float32
# -> uint8 cast, which is C's: undefined for NaN, +-Inf and values out of range.  Those values
# occur only in blocks that hold NaN or Inf or whose 1/d overflows (0 < |d| < 1 / FLT_MAX: the
# subnormal blocks).  megafuse defines them as x86-64 does (x86_cast_u8), on every platform.

def x86_cast_u8(v):
    """NumPy's float32 -> uint8 cast as on x86-64 (cvttss2si, then the low byte): NaN, +-Inf and
    |v| >= 2**31 give 0, anything else its truncation modulo 256."""
    v = np.asarray(v, dtype=_F32)
    inside = np.abs(v) < _F32(2 ** 31)                       # false for NaN
    return _low_byte(np.trunc(np.where(inside, v, _F32(0))).astype(np.int64))


def legacy_cast_inputs(x, dt):
    """The float32 values gguf's Q4_0 / Q4_1 / Q5_0 / Q5_1 quantizer casts to uint8, (blocks, 32),
    and the block's fp16 fields as float32: ([d], or [d, min])."""
    x = np.asarray(x, dtype=_F32)
    assert x.shape[-1] % 32 == 0, 'rows are whole blocks of 32'
    b = x.reshape(-1, 32)
    rows = np.arange(b.shape[0])
    with np.errstate(all='ignore'):
        if dt in (DT.Q4_0, DT.Q5_0):                       # d = max / -2^(bits-1)
            half = _F32(8 if dt == DT.Q4_0 else 16)
            mx = b[rows, np.abs(b).argmax(axis=1)]           # argmax: the first NaN wins
            d = mx / -half
            inv = np.where(d == 0, _F32(0), _F32(1) / d)
            return b * inv[:, None] + (half + _F32(0.5)), [d]
        top = _F32(15 if dt == DT.Q4_1 else 31)             # d = (max - min) / top
        nan = np.isnan(b).any(axis=1)                        # NumPy's max / min: the default NaN
        mx = np.where(nan, _F32(np.nan), b.max(axis=1)).astype(_F32)
        mn = np.where(nan, _F32(np.nan), b.min(axis=1)).astype(_F32)
        d = (mx - mn) / top
        inv = np.where(d == 0, _F32(0), _F32(1) / d)
        return (b - mn[:, None]) * inv[:, None] + _F32(0.5), [d, mn]


def quantize_legacy(x, dt):
    """gguf.quants.quantize for dt = Q4_0, Q4_1, Q5_0, Q5_1 on float32 rows [..., k] -> uint8
    [..., k/32 * block bytes], with x86_cast_u8 for its cast.  Blocks: fp16 d (Q4_1 / Q5_1: then
    fp16 min), Q5: qh[4] (the 5th bits, little-endian), qs[16] (weight j in the low nibble of
    qs[j], weight j + 16 in the high one)."""
    x = np.asarray(x, dtype=_F32)
    values, heads = legacy_cast_inputs(x, dt)
    top = 15 if dt in (DT.Q4_0, DT.Q4_1) else 31
    q = np.minimum(x86_cast_u8(values), np.uint8(top))
    parts = [_fp32_to_fp16_bits(h)[0].astype('<u2').view(np.uint8).reshape(-1, 2) for h in heads]
    if top == 31:
        parts.append(np.packbits(q >> 4, axis=1, bitorder='little'))
    parts.append((q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4))
    out = np.concatenate(parts, axis=1)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // 32 * out.shape[1],))


LEGACY_QUANTIZERS = {dt: functools.partial(quantize_legacy, dt=dt)
                     for dt in (DT.Q4_0, DT.Q4_1, DT.Q5_0, DT.Q5_1)}


# ---------------------------------------------------------------------------------------------
# Activations: Q8_0 / Q8_K quantization (emulates the int8 path, docs/contract.md §4)
# ---------------------------------------------------------------------------------------------
# A block holding NaN or Inf gets d = NaN (and q = 0): it dequantizes to NaN, so non-finite
# activations propagate to the output (docs/contract.md §5).  GGML's own result there depends on
# the order of its comparisons; this is the reference's definition.

def quantize_q8_0(x):
    """GGML ``quantize_row_q8_0_ref`` on float32 rows (last dim a multiple of 32).

    Per block of 32: amax = max |x|, d = amax / 127, id = 1/d (0 if d == 0 or if 1/d
    overflows, amax < 127 / FLT_MAX: there GGML converts roundf(x * inf) to int8, which C leaves
    undefined), q = roundf(x * id) (half away from zero), all in float32; d is stored as fp16.
    Returns (q int8 [..., n], d float32 [..., n/32]) with d = float32(float16(d)).
    """
    x = np.asarray(x, dtype=np.float32)
    assert x.shape[-1] % 32 == 0, 'Q8_0 rows are whole blocks of 32'
    blocks = x.reshape(-1, 32)
    finite = np.isfinite(blocks).all(axis=1)
    safe = np.where(finite[:, None], blocks, np.float32(0))
    with np.errstate(over='ignore'):
        amax = np.abs(safe).max(axis=1)
        d = amax / np.float32(127)
        nz = d != 0
        inv_d = np.zeros_like(d)
        inv_d[nz] = np.float32(1) / d[nz]
        inv_d[~np.isfinite(inv_d)] = 0                  # 1/d overflows: codes 0, |q| <= 127
        q = _round_half_away(safe * inv_d[:, None]).astype(np.int8)    # float32 product
        d16 = d.astype(np.float16).astype(np.float32)
    d16[~finite] = np.nan
    return q.reshape(x.shape), d16.reshape(x.shape[:-1] + (x.shape[-1] // 32,))


def quantize_q8_K(x):
    """GGML ``quantize_row_q8_K_ref`` on float32 rows (last dim a multiple of 256).

    Per block of 256: ``max`` = the value of largest |x| (sign kept, first occurrence).
    If it is 0: d = 0, q = 0.  Else iscale = -127 / max, q = min(127, nearest_int(iscale*x)),
    d = 1 / iscale, all float32 (d is NOT rounded to fp16).  Where iscale overflows
    (0 < |max| < 127 / FLT_MAX): q = 0 (GGML's nearest_int(+-inf) = -2**22 stored as int8) and
    d = 1 / iscale = -+0.  nearest_int is GGML's
    magic-number rounding (x + 12582912.f), i.e. round half to even.
    bsums[16] = sums of q over groups of 16.
    Returns (q int8 [..., n], d float32 [..., n/256], bsums int16 [..., n/16]).
    """
    x = np.asarray(x, dtype=np.float32)
    assert x.shape[-1] % 256 == 0, 'Q8_K rows are whole blocks of 256'
    blocks = x.reshape(-1, 256)
    n = blocks.shape[0]
    finite = np.isfinite(blocks).all(axis=1)
    safe = np.where(finite[:, None], blocks, np.float32(0))
    first_max = np.argmax(np.abs(safe), axis=1)               # argmax: first occurrence
    vmax = safe[np.arange(n), first_max]
    nz = vmax != 0
    iscale = np.zeros(n, dtype=np.float32)
    with np.errstate(over='ignore'):
        iscale[nz] = np.float32(-127) / vmax[nz]
    tiny = ~np.isfinite(iscale)                               # codes 0, d = -+0
    v = np.rint(np.where(tiny, np.float32(0), iscale)[:, None] * safe)  # float32, half to even
    q = np.minimum(v, 127).astype(np.int8)
    d = np.zeros(n, dtype=np.float32)
    d[nz] = np.float32(1) / iscale[nz]
    d[~finite] = np.nan
    bsums = q.reshape(n, 16, 16).astype(np.int32).sum(axis=2).astype(np.int16)
    lead = x.shape[:-1]
    return (q.reshape(x.shape), d.reshape(lead + (x.shape[-1] // 256,)),
            bsums.reshape(lead + (x.shape[-1] // 16,)))


def dequantize_q8_0(q, d):
    """x = d * q per block of 32, float64 (exact: d is fp16-valued, q int8)."""
    q = np.asarray(q)
    blocks = q.reshape(-1, 32).astype(np.float64) * np.asarray(d, np.float64).reshape(-1, 1)
    return blocks.reshape(q.shape)


def dequantize_q8_K(q, d):
    """x = d * q per block of 256, float64 (exact: d float32, q int8)."""
    q = np.asarray(q)
    blocks = q.reshape(-1, 256).astype(np.float64) * np.asarray(d, np.float64).reshape(-1, 1)
    return blocks.reshape(q.shape)


def quantized_activations(x_rows, dt):
    """What the int8 path multiplies weights of format ``dt`` with, for activations x_rows.

    The rows are first rounded to float32 (the kernel holds its activations in float32), then
    quantized to Q8_0 (32-weight formats) or Q8_K (the 256-weight ones) and dequantized.  Float
    weight formats keep the float activations.  Returns float64 of the same shape.
    """
    dt = DT(int(dt))
    x32 = np.asarray(x_rows, dtype=np.float64).astype(np.float32)
    if dt in BLOCK32_FORMATS:
        return dequantize_q8_0(*quantize_q8_0(x32))
    if dt in KQUANT_FORMATS:
        q, d, _bsums = quantize_q8_K(x32)
        return dequantize_q8_K(q, d)
    return np.asarray(x_rows, dtype=np.float64)


def _project(x_rows, w, dt, rows, cols, quantize_activations):
    """y = x @ W.T for a weight W of [rows, cols] stored as ``dt`` (the torch Linear layout).

    x_rows: [T, cols] float64 (padding columns already 0).  With ``quantize_activations``
    (the int8 path) the rows are quantized as the kernel does (``quantized_activations``);
    the integer dot products of the kernel equal this up to float summation order.
    Returns [T, rows] float64.
    """
    W = dequantize(w, dt, (rows, cols))
    x = np.asarray(x_rows, dtype=np.float64).reshape(-1, cols)
    if quantize_activations:
        x = quantized_activations(x, dt)
    return x @ W.T


# ---------------------------------------------------------------------------------------------
# The building blocks: RMSNorm, RoPE, attention, SwiGLU
# ---------------------------------------------------------------------------------------------

def rmsnorm(x, gamma, eps):
    """y = x / sqrt(mean(x**2) + eps) * gamma, over the last axis (unpadded values only)."""
    x = np.asarray(x, dtype=np.float64)
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * rstd * np.asarray(gamma, dtype=np.float64)


def _rmsnorm_padded(x_rows, gamma, E, Ea, eps):
    """RMSNorm of the first E columns of [T, Ea] rows, padded back to Ea with zeros."""
    y = np.zeros((x_rows.shape[0], Ea))
    y[:, :E] = rmsnorm(x_rows[:, :E], _f64(gamma, (E,)), eps)
    return y


def rope(x_heads, cos_row, sin_row):
    """Rotate-half RoPE (Llama / Qwen2 in HF transformers) of the last axis (length D).

    For i < D/2:  x'[i]     = x[i] * cos[i] - x[i+D/2] * sin[i]
                  x'[i+D/2] = x[i] * sin[i] + x[i+D/2] * cos[i]
    cos_row / sin_row hold D/2 angles and broadcast against x_heads[..., :D/2]
    (e.g. x_heads [T, heads, D] with cos [T, 1, D/2]).  Returns a new float64 array.
    """
    x = np.asarray(x_heads, dtype=np.float64)
    half = x.shape[-1] // 2
    cos = np.asarray(cos_row, dtype=np.float64)
    sin = np.asarray(sin_row, dtype=np.float64)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def rope_tables_rows(rope_cos, rope_sin, positions, D):
    """Rows ``positions`` of the [rows, D/2] rope tables, float64, or (None, None)."""
    if rope_cos is None and rope_sin is None:
        return None, None
    assert rope_cos is not None and rope_sin is not None, 'rope_cos/rope_sin: both or neither'
    cos = np.asarray(rope_cos).reshape(-1, D // 2).astype(np.float64)
    sin = np.asarray(rope_sin).reshape(-1, D // 2).astype(np.float64)
    return cos[positions], sin[positions]


def attention(q, k, v, positions, *, scale=None, window=0, softcap=0.0):
    """Causal multi-head attention with GQA, by absolute position.

    q: [T, H, D] (queries at absolute ``positions`` [T]); k, v: [G, P, D] (keys and values of
    positions 0..P-1, P > max(positions)).  Query head h reads kv head h // (H // G).
    Row t of head h: softmax(q·k * scale) over positions 0..positions[t], times v; scale
    defaults to 1 / sqrt(D).  window > 0: only the keys positions[t] - window < j are visible
    (a sliding window).  softcap > 0: each scaled score s becomes softcap * tanh(s / softcap).
    Returns [T, H, D] float64.  (The kernel uses tiled flash attention; same math.)
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    T, H, D = q.shape
    G, P, _ = k.shape
    group = H // G
    positions = np.asarray(positions)
    # mask[t, j]: key position j is visible to query row t (j <= its position; in its window).
    visible = np.arange(P)[None, :] <= positions[:, None]
    if window > 0:
        visible &= np.arange(P)[None, :] > positions[:, None] - window
    out = np.empty((T, H, D))
    for h in range(H):
        g = h // group
        scores = q[:, h, :] @ k[g].T                                 # [T, P]
        scores = scores / math.sqrt(D) if scale is None else scores * float(scale)
        if softcap > 0:
            scores = softcap * np.tanh(scores / softcap)
        scores = np.where(visible, scores, -np.inf)
        scores = scores - scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        p = p / p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ v[g]
    return out


def silu(x):
    """silu(x) = x / (1 + exp(-x))."""
    with np.errstate(over='ignore'):
        return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    """GELU in its tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


#: The gate activations of the MLP, by the name megafuse.llm.arch uses.
GATES = {"silu": silu, "gelu_tanh": gelu_tanh}


def _swiglu_mlp(h_rows, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt, E, Ea, I, Ia, eps,
                quantize_activations):
    """The MLP branch on [T, Ea] rows: (silu(z@Wg.T+bg) * (z@Wu.T+bu)) @ w2.T + b2.

    z = rmsnorm(h[:, :E], ln2_gamma) padded to Ea.  w1 is [2*Ia, Ea] (gate rows first, then
    up rows), b1 [2*Ia], w2 [Ea, Ia], b2 [Ea].  The activation's padding columns I..Ia-1 are
    forced to 0, so the result never depends on the padding of w1/b1.  Returns [T, Ea].
    """
    z = _rmsnorm_padded(h_rows, ln2_gamma, E, Ea, eps)                         # [T, Ea]
    gate_up = _project(z, w1, w1_dt, 2 * Ia, Ea, quantize_activations) + _bias(b1, 2 * Ia)
    gate, up = gate_up[:, :Ia], gate_up[:, Ia:]                               # [T, Ia] each
    act = silu(gate) * up
    act[:, I:] = 0.0
    return _project(act, w2, w2_dt, Ea, Ia, quantize_activations) + _bias(b2, Ea)


# ---------------------------------------------------------------------------------------------
# The attention layer, shared by decode and both prefills
# ---------------------------------------------------------------------------------------------

def _qkv_rows(x_rows, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
              rope_cos, rope_sin, positions, E, Ea, H, G, D, Da, eps, quantize_activations):
    """RMSNorm -> Q/K/V projections -> RoPE for [T, Ea] rows at absolute ``positions``.

    Returns q [T, H, D], k [T, G, D], v [T, G, D] (float64, only the unpadded head dims).
    """
    T = x_rows.shape[0]
    y = _rmsnorm_padded(x_rows, ln1_gamma, E, Ea, eps)                        # [T, Ea]
    qa = quantize_activations
    q = _project(y, wq, wq_dt, H * Da, Ea, qa) + _bias(bq, H * Da)
    k = _project(y, wk, wk_dt, G * Da, Ea, qa) + _bias(bk, G * Da)
    v = _project(y, wv, wv_dt, G * Da, Ea, qa) + _bias(bv, G * Da)
    q = q.reshape(T, H, Da)[:, :, :D]
    k = k.reshape(T, G, Da)[:, :, :D]
    v = v.reshape(T, G, Da)[:, :, :D]
    cos, sin = rope_tables_rows(rope_cos, rope_sin, positions, D)
    if cos is not None:
        q = rope(q, cos[:, None, :], sin[:, None, :])
        k = rope(k, cos[:, None, :], sin[:, None, :])
    return q, k, v


def _attention_layer(output, input, residual, ln1_gamma,
                     wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt, wo, bo, wo_dt,
                     kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, T, C,
                     E, Ea, H, G, D, Da, eps, quantize_activations):
    """RMSNorm -> QKV -> RoPE -> KV-cache write -> causal attention -> out-proj + residual."""
    positions = start_pos + np.arange(T)
    x = _f64(input, (T, Ea))
    res = None if residual is None else _f64(residual, (T, Ea))

    q, k, v = _qkv_rows(x, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
                        rope_cos, rope_sin, positions, E, Ea, H, G, D, Da, eps,
                        quantize_activations)

    # KV cache [G, C, Da]: row [g, p] = k (v) of kv head g at position p; dims D..Da-1 = 0.
    cache_k = _out_view(kv_cache_k, (G, C, Da))
    cache_v = _out_view(kv_cache_v, (G, C, Da))
    cache_k[:, positions, :D] = k.transpose(1, 0, 2).astype(np.float32)
    cache_v[:, positions, :D] = v.transpose(1, 0, 2).astype(np.float32)
    cache_k[:, positions, D:] = 0.0
    cache_v[:, positions, D:] = 0.0

    # Attention reads keys and values back from the cache (float32 as the kernel stores them,
    # or a model's float16 cache: the assignment above rounds them to nearest-even float16):
    # positions < start_pos come from earlier calls, the others were just written.
    P = start_pos + T
    attn = attention(q, cache_k[:, :P, :D], cache_v[:, :P, :D], positions)   # [T, H, D]

    # Token-major [T, H*Da] for the out-projection; head dims D..Da-1 are 0.
    attn_rows = np.zeros((T, H, Da))
    attn_rows[:, :, :D] = attn
    out = _project(attn_rows.reshape(T, H * Da), wo, wo_dt, Ea, H * Da, quantize_activations)
    out += _bias(bo, Ea)
    if res is not None:
        out += res
    out[:, E:] = 0.0
    _store(output, out)        # every input was read above: output may alias input/residual


# ---------------------------------------------------------------------------------------------
# The header's functions
# ---------------------------------------------------------------------------------------------

def mega_fused_attention_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv,
                                wo, bo, kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos,
                                embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                                head_dim, aligned_head_dim, cache_capacity, eps):
    """One token at position ``pos``: RMSNorm -> QKV -> RoPE -> k, v into the cache at pos ->
    attention over positions 0..pos -> out-projection + bo + residual.

    input, residual, output: [Ea]; FP32 weights wq [H*Da, Ea], wk/wv [G*Da, Ea],
    wo [Ea, H*Da]; caches [G, C, Da] (updated in place at ``pos``).
    """
    _attention_layer(output, input, residual, ln1_gamma,
                     wq, bq, DT.FP32, wk, bk, DT.FP32, wv, bv, DT.FP32, wo, bo, DT.FP32,
                     kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, 1, cache_capacity,
                     embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                     head_dim, aligned_head_dim, eps, quantize_activations=False)


def mega_fused_attention_decode_workspace(output, input, residual, ln1_gamma, wq, bq, wk, bk,
                                          wv, bv, wo, bo, kv_cache_k, kv_cache_v, rope_cos,
                                          rope_sin, pos, embed_dim, aligned_embed_dim,
                                          num_heads, num_kv_heads, head_dim, aligned_head_dim,
                                          cache_capacity, eps, q_output_workspace,
                                          q_output_workspace_bytes, kv_workspace,
                                          kv_workspace_bytes):
    """Same math as ``mega_fused_attention_decode``.

    The workspaces' contents after the call are unspecified; the reference leaves them alone.
    """
    mega_fused_attention_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv,
                                wo, bo, kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos,
                                embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                                head_dim, aligned_head_dim, cache_capacity, eps)


def mega_fused_attention_prefill(output, input, residual, ln1_gamma,
                                 wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt, wo, bo, wo_dt,
                                 kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
                                 cache_capacity, embed_dim, aligned_embed_dim, num_heads,
                                 num_kv_heads, head_dim, aligned_head_dim, eps, scratch):
    """T = tokens rows at absolute positions start_pos .. start_pos+T-1.

    Their k, v are written to the cache; row t attends over cache positions
    0..start_pos+t (positions < start_pos are read from the cache as earlier calls left it).
    Weights in any weight format (``dequantize``); activations stay float.
    ``scratch`` is not used by the reference.
    """
    _attention_layer(output, input, residual, ln1_gamma,
                     wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt, wo, bo, wo_dt,
                     kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
                     cache_capacity, embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                     head_dim, aligned_head_dim, eps, quantize_activations=False)


def mega_fused_attention_prefill_q8_0(output, input, residual, ln1_gamma,
                                      wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
                                      wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos,
                                      rope_sin, start_pos, tokens, cache_capacity, embed_dim,
                                      aligned_embed_dim, num_heads, num_kv_heads, head_dim,
                                      aligned_head_dim, eps, scratch):
    """The int8 path: as ``mega_fused_attention_prefill``, but for block-quantized weights the
    activations are quantized first (docs/contract.md §4): the normalised input rows for the Q/K/V
    projections and the attention output rows for the out-projection, to Q8_0 (32-weight
    formats) or Q8_K (K-quants).  FP32/FP16/BF16 weights keep float activations, so with only
    float weights this equals the plain prefill.
    """
    _attention_layer(output, input, residual, ln1_gamma,
                     wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt, wo, bo, wo_dt,
                     kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
                     cache_capacity, embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                     head_dim, aligned_head_dim, eps, quantize_activations=True)


def mega_fused_attention_prefill_scratch_size(tokens, aligned_embed_dim, num_heads,
                                              aligned_head_dim):
    """0: the reference needs no scratch.

    The kernel's own scratch layout (and its size) is documented in the kernel; tests take
    the kernel's figure from the compiled module, never from here.
    """
    return 0


def mega_fused_attention_prefill_q8_0_scratch_size(tokens, aligned_embed_dim, num_heads,
                                                   aligned_head_dim):
    """0: the reference needs no scratch (see ``mega_fused_attention_prefill_scratch_size``)."""
    return 0


def mega_fused_outproj_mlp_prefill(output, attn_out, residual, ln2_gamma,
                                   wo, bo, wo_dt, w1, b1, w1_dt, w2, b2, w2_dt,
                                   tokens, embed_dim, aligned_embed_dim, num_heads,
                                   aligned_head_dim, intermediate_dim, aligned_intermediate_dim,
                                   eps, scratch, *, quantize_activations=True):
    """Out-projection + residual, then RMSNorm2 + SwiGLU MLP + residual.

    attn_out: head-major [H, T, Da] (as attention produces it), transposed here to
    token-major [T, H*Da];  h1 = attn @ wo.T + bo + residual (residual None: not added);
    z = rmsnorm(h1[:, :E], ln2_gamma);
    output = h1 + (silu(z@Wg.T+bg) * (z@Wu.T+bu)) @ w2.T + b2, columns E..Ea-1 written as 0.
    With ``quantize_activations`` (the default: the kernel quantizes per docs/contract.md §4), every
    projection whose weight is block-quantized gets Q8_0/Q8_K activations (the attention
    rows, z, and the SwiGLU activation).  ``scratch`` is not used by the reference.
    Note: the header gives no head_dim here, so attn_out's head padding dims (D..Da-1) are
    used as given (they meet wo's zero padding columns).
    """
    T, E, Ea, H, Da = tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim
    I, Ia = intermediate_dim, aligned_intermediate_dim
    attn = _f64(attn_out, (H, T, Da)).transpose(1, 0, 2).reshape(T, H * Da)
    res = None if residual is None else _f64(residual, (T, Ea))

    h1 = _project(attn, wo, wo_dt, Ea, H * Da, quantize_activations) + _bias(bo, Ea)
    if res is not None:
        h1 += res
    h1[:, E:] = 0.0
    out = h1 + _swiglu_mlp(h1, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt, E, Ea, I, Ia, eps,
                           quantize_activations)
    out[:, E:] = 0.0
    _store(output, out)


def mega_fused_outproj_mlp_prefill_scratch_size(tokens, aligned_embed_dim, num_heads,
                                                aligned_head_dim, aligned_intermediate_dim):
    """0: the reference needs no scratch (see ``mega_fused_attention_prefill_scratch_size``)."""
    return 0


def mega_fused_mlp_prefill(output, input, residual, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt,
                           tokens, embed_dim, aligned_embed_dim, intermediate_dim,
                           aligned_intermediate_dim, eps, scratch, *, quantize_activations=True):
    """(Beyond the header.)  Token-major MLP block: z = rmsnorm(input[:, :E], ln2_gamma);
    output = residual + (silu(z@Wg.T+bg) * (z@Wu.T+bu)) @ w2.T + b2
    (residual None: nothing added).  input, residual, output [T, Ea]; columns E..Ea-1 of the
    output written as 0.  ``quantize_activations`` as in ``mega_fused_outproj_mlp_prefill``.
    """
    T, E, Ea = tokens, embed_dim, aligned_embed_dim
    x = _f64(input, (T, Ea))
    res = None if residual is None else _f64(residual, (T, Ea))
    out = _swiglu_mlp(x, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt, E, Ea,
                      intermediate_dim, aligned_intermediate_dim, eps, quantize_activations)
    if res is not None:
        out += res
    out[:, E:] = 0.0
    _store(output, out)


def mega_fused_mlp_prefill_scratch_size(tokens, aligned_embed_dim, aligned_intermediate_dim):
    """0: the reference needs no scratch (see ``mega_fused_attention_prefill_scratch_size``)."""
    return 0


def mega_fused_outproj_mlp_prefill_f32(output, attn_out, residual, ln2_gamma,
                                       wo, bo, wo_dt, w1, b1, w1_dt, w2, b2, w2_dt,
                                       tokens, embed_dim, aligned_embed_dim, num_heads,
                                       aligned_head_dim, intermediate_dim,
                                       aligned_intermediate_dim, eps, scratch):
    """(Beyond the header.)  ``mega_fused_outproj_mlp_prefill`` with float activations
    throughout: the same math with ``quantize_activations=False``."""
    mega_fused_outproj_mlp_prefill(output, attn_out, residual, ln2_gamma, wo, bo, wo_dt, w1, b1,
                                   w1_dt, w2, b2, w2_dt, tokens, embed_dim, aligned_embed_dim,
                                   num_heads, aligned_head_dim, intermediate_dim,
                                   aligned_intermediate_dim, eps, scratch,
                                   quantize_activations=False)


def mega_fused_mlp_prefill_f32(output, input, residual, ln2_gamma, w1, b1, w1_dt, w2, b2,
                               w2_dt, tokens, embed_dim, aligned_embed_dim, intermediate_dim,
                               aligned_intermediate_dim, eps, scratch):
    """(Beyond the header.)  ``mega_fused_mlp_prefill`` with float activations throughout:
    the same math with ``quantize_activations=False``."""
    mega_fused_mlp_prefill(output, input, residual, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt,
                           tokens, embed_dim, aligned_embed_dim, intermediate_dim,
                           aligned_intermediate_dim, eps, scratch, quantize_activations=False)


def _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin, pos,
                 hidden, H, G, D, eps):
    """RMSNorm -> one fused [(H+2G)*D, hidden] projection -> split (-> RoPE) for one token."""
    y = rmsnorm(_f64(input, (hidden,)), _f64(gamma, (hidden,)), eps)
    n = (H + 2 * G) * D
    qkv = _f64(W_qkv, (n, hidden)) @ y + _bias(b_qkv, n)
    q = qkv[:H * D].reshape(H, D)
    k = qkv[H * D:(H + G) * D].reshape(G, D)
    v = qkv[(H + G) * D:].reshape(G, D)
    cos, sin = rope_tables_rows(rope_cos, rope_sin, pos, D)
    if cos is not None:
        q = rope(q, cos, sin)
        k = rope(k, cos, sin)
    _store(q_out, q.reshape(-1))
    _store(k_out, k.reshape(-1))
    _store(v_out, v.reshape(-1))


def mega_fuse_rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, hidden, num_heads,
                          num_kv_heads, head_dim, eps):
    """One token, unaligned: y = rmsnorm(input, gamma); [q; k; v] = W_qkv @ y + b_qkv.

    W_qkv [(H+2G)*D, hidden] (q rows, then k rows, then v rows); b_qkv [(H+2G)*D] or None;
    q_out [H*D], k_out, v_out [G*D].
    """
    _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, None, None, None,
                 hidden, num_heads, num_kv_heads, head_dim, eps)


def mega_fuse_rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos,
                               rope_sin, pos, hidden, num_heads, num_kv_heads, head_dim,
                               max_seq, eps):
    """``mega_fuse_rmsnorm_qkv`` plus rotate-half RoPE of q and k at position ``pos``
    (tables [max_seq, D/2]; None for both: no rotation)."""
    assert rope_cos is None or pos < max_seq, 'pos beyond the rope tables'
    _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin, pos,
                 hidden, num_heads, num_kv_heads, head_dim, eps)


# ---------------------------------------------------------------------------------------------
# Tiles from the CPU's caches
# ---------------------------------------------------------------------------------------------

CPU0_CACHE_DIR = '/sys/devices/system/cpu/cpu0/cache'


def _parse_cache_size(text):
    """'32K' -> 32768, '1M' -> 1048576, '512' -> 512 (bytes)."""
    text = text.strip().upper()
    units = {'K': 1024, 'M': 1024 ** 2, 'G': 1024 ** 3}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def cpu_cache_sizes(cache_dir=CPU0_CACHE_DIR):
    """(L1d bytes, L2 bytes) of cpu0 from sysfs, or 0 for a size that cannot be read.

    L1d: the level-1 cache of type "Data" (or "Unified"); L2: the level-2 cache (not
    "Instruction").  Any unreadable sysfs gives (0, 0).
    """
    l1d = l2 = 0
    try:
        for index in sorted(glob.glob(os.path.join(cache_dir, 'index*'))):
            def read(name, index=index):
                with open(os.path.join(index, name), encoding='ascii') as f:
                    return f.read().strip()
            level, kind, size = int(read('level')), read('type'), _parse_cache_size(read('size'))
            if level == 1 and kind in ('Data', 'Unified') and not l1d:
                l1d = size
            elif level == 2 and kind != 'Instruction' and not l2:
                l2 = size
    except (OSError, ValueError):
        return 0, 0
    return l1d, l2


def floor_pow2(n):
    """The largest power of two <= n (1 for n < 1)."""
    n = int(n)
    return 1 if n < 1 else 1 << (n.bit_length() - 1)


def optimal_tiles_from_cache_sizes(l1d_bytes, l2_bytes, head_dim):
    """The documented tile formula; (64, 64) (the header defaults) if a size is unknown.

    kv_tile = floor_pow2((L1d / 2) / (head_dim * 4 B)), clamped to [16, 256]:
      a K tile of kv_tile rows fills at most half of L1d;
    q_tile  = floor_pow2((L2 / 2) / ((2*head_dim + kv_tile) * 4 B)), clamped to [16, 128]:
      per query row, q and its accumulator (2*head_dim floats) plus a row of scores (kv_tile)
      fill at most half of L2.
    (/ is integer division.)
    """
    if not l1d_bytes or not l2_bytes:
        return 64, 64
    kv_tile = min(max(floor_pow2((l1d_bytes // 2) // (head_dim * 4)), 16), 256)
    q_tile = min(max(floor_pow2((l2_bytes // 2) // ((2 * head_dim + kv_tile) * 4)), 16), 128)
    return q_tile, kv_tile


def mega_fuse_get_optimal_tiles(head_dim):
    """(q_tile, kv_tile) for this CPU: ``optimal_tiles_from_cache_sizes(*cpu_cache_sizes(), D)``."""
    l1d, l2 = cpu_cache_sizes()
    return optimal_tiles_from_cache_sizes(l1d, l2, head_dim)


# ---------------------------------------------------------------------------------------------
# Memory report
# ---------------------------------------------------------------------------------------------

def mega_fuse_report_stats(hidden, num_layers, seq_len):
    """Memory traffic of an unfused vs a fused attention layer; printed and returned as a dict.

    Floats of 4 bytes, per token per layer.  The unfused pipeline materialises in memory the
    normed input, q, k, v, the attention output and the out-projection result (hidden floats
    each) and the attention scores (seq_len floats):
        unfused_intermediate_bytes_per_token = 4 * (6*hidden + seq_len)
    each written once and read once, plus reading the input and writing the output:
        unfused_traffic_bytes_per_token = 2 * intermediates + 2 * 4 * hidden
    Fused, only the input and the output cross memory:
        fused_traffic_bytes_per_token = 2 * 4 * hidden
    Per layer (whole sequence): times seq_len; per model: times num_layers as well.
    reduction = unfused traffic / fused traffic.
    """
    assert hidden > 0 and num_layers > 0 and seq_len > 0
    float_bytes = 4
    intermediates = float_bytes * (6 * hidden + seq_len)
    io_bytes = 2 * float_bytes * hidden
    unfused_token = 2 * intermediates + io_bytes
    fused_token = io_bytes
    stats = {
        'hidden': hidden,
        'num_layers': num_layers,
        'seq_len': seq_len,
        'unfused_intermediate_bytes_per_token': intermediates,
        'unfused_traffic_bytes_per_token': unfused_token,
        'fused_traffic_bytes_per_token': fused_token,
        'unfused_traffic_bytes_per_layer': unfused_token * seq_len,
        'fused_traffic_bytes_per_layer': fused_token * seq_len,
        'unfused_traffic_bytes_model': unfused_token * seq_len * num_layers,
        'fused_traffic_bytes_model': fused_token * seq_len * num_layers,
        'reduction': unfused_token / fused_token,
    }
    out = sys.stdout
    out.write('mega-fusion memory report (float32, per layer = whole sequence)\n')
    width = max(len(key) for key in stats)
    for key, value in stats.items():
        text = f'{value:.3f}' if isinstance(value, float) else f'{value:d}'
        out.write(f'  {key:<{width}}  {text:>20}\n')
    out.write('  formula: unfused/token = 2*4*(6*hidden + seq_len) + 2*4*hidden bytes, '
              'fused/token = 2*4*hidden bytes; x seq_len per layer, x num_layers per model\n')
    return stats



# ---------------------------------------------------------------------------------------------
# The whole model (megafuse.Model): embedding -> layers -> final norm -> head
# ---------------------------------------------------------------------------------------------

def layer_forward(x, ly, embed_dim, num_heads, num_kv_heads, head_dim, intermediate_dim, eps,
                  rope_cos, rope_sin, *, quantize_activations=False, kv_dtype="float32",
                  attn_scale=None, attn_softcap=0.0, gate="silu"):
    """One decoder layer on the rows x [T, E] at positions 0 .. T-1 (an empty cache), float64
    math; returns its output [T, E] float32 (the residual stream after it).

    ly: the layer's arrays (ln1_gamma, wq, bq, ... w2, b2, ln2_gamma) and formats (wq_dt ...
    w2_dt), and its features (megafuse.llm.arch), each optional: q_norm / k_norm [D] (RMSNorm
    of each q / k head before RoPE), post_attn_norm / post_ffn_norm [E] (sandwich norms: each
    block's output normalised before the residual add), window (sliding-window attention),
    rope_cos / rope_sin (the layer's own tables, else the model's).  attn_scale (default
    1/sqrt(D)), attn_softcap and gate (``GATES``) are the model's.  quantize_activations: the
    int8 path's emulation (each projection's input quantized for its weight); kv_dtype
    "float16": k and v rounded to float16 as they are cached.
    """
    E, H, G, D, I = embed_dim, num_heads, num_kv_heads, head_dim, intermediate_dim
    qa = quantize_activations
    x = np.asarray(x, dtype=np.float32).reshape(-1, E)
    T = x.shape[0]
    positions = np.arange(T)

    def get(name, default=None):
        value = ly.get(name, default)
        return default if value is None else value

    xn = rmsnorm(x, ly["ln1_gamma"], eps)
    q = (_project(xn, ly["wq"], ly["wq_dt"], H * D, E, qa) + _bias(get("bq"), H * D))
    k = (_project(xn, ly["wk"], ly["wk_dt"], G * D, E, qa) + _bias(get("bk"), G * D))
    v = (_project(xn, ly["wv"], ly["wv_dt"], G * D, E, qa) + _bias(get("bv"), G * D))
    q, k, v = q.reshape(T, H, D), k.reshape(T, G, D), v.reshape(T, G, D)
    if get("q_norm") is not None:
        q = rmsnorm(q, ly["q_norm"], eps)
    if get("k_norm") is not None:
        k = rmsnorm(k, ly["k_norm"], eps)
    cos, sin = rope_tables_rows(get("rope_cos", rope_cos), get("rope_sin", rope_sin), positions,
                                D)
    if cos is not None:
        q, k = rope(q, cos[:, None, :], sin[:, None, :]), rope(k, cos[:, None, :], sin[:, None, :])
    cache = kv_cache_dtype(kv_dtype)
    k = k.astype(np.float32).astype(cache).astype(np.float64)
    v = v.astype(np.float32).astype(cache).astype(np.float64)
    att = attention(q, k.transpose(1, 0, 2), v.transpose(1, 0, 2), positions, scale=attn_scale,
                    window=int(get("window", 0)), softcap=float(attn_softcap))
    o = _project(att.reshape(T, H * D), ly["wo"], ly["wo_dt"], E, H * D, qa) + _bias(get("bo"), E)
    if get("post_attn_norm") is not None:
        o = rmsnorm(o, ly["post_attn_norm"], eps)
    h = (x + o).astype(np.float32)
    z = rmsnorm(h, ly["ln2_gamma"], eps)
    gate_up = _project(z, ly["w1"], ly["w1_dt"], 2 * I, E, qa) + _bias(get("b1"), 2 * I)
    act = GATES[gate](gate_up[:, :I]) * gate_up[:, I:]
    d = _project(act, ly["w2"], ly["w2_dt"], E, I, qa) + _bias(get("b2"), E)
    if get("post_ffn_norm") is not None:
        d = rmsnorm(d, ly["post_ffn_norm"], eps)
    return (h + d).astype(np.float32)


def model_forward(layers, embedding, embedding_dt, out_norm, head, head_dt, token_ids,
                  embed_dim, num_heads, num_kv_heads, head_dim, intermediate_dim, vocab_size,
                  eps, rope_cos, rope_sin, *, quantize_activations=False, kv_dtype="float32",
                  embed_scale=1.0, attn_scale=None, attn_softcap=0.0, final_softcap=0.0,
                  gate="silu"):
    """A decoder-only model on token_ids [T] (positions 0 .. T-1, an empty cache), the way
    megafuse.Model runs it.  Returns (logits [T, V], hidden [L, T, E]), float32: hidden[l] is
    layer l's output (the residual stream after it).

    layers: one dict a layer (``layer_forward``: its arrays, formats and features); embedding /
    head [V, E] in embedding_dt / head_dt (only the rows of token_ids are dequantized);
    out_norm [E]; rope tables [>= T, D/2] or None.  quantize_activations: the int8 path's
    emulation (False: pure float math).  kv_dtype: what the KV cache holds, "float32" or
    "float16".  The model's features (megafuse.llm.arch): embed_scale multiplies the embedding
    rows (in float32), attn_scale / attn_softcap / gate as in ``layer_forward``, final_softcap
    > 0 caps the logits (softcap * tanh(z / softcap)).
    """
    E, V = embed_dim, vocab_size
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    T = ids.size
    row_bytes = ck_dtype_row_bytes(embedding_dt, E)
    emb = np.asarray(embedding).reshape(V, -1)
    x = dequantize(np.ascontiguousarray(emb[ids]), embedding_dt, (T, E)).astype(np.float32)
    assert emb.shape[1] * emb.dtype.itemsize == row_bytes
    if embed_scale != 1.0:
        x = x * np.float32(embed_scale)
    hidden = np.zeros((len(layers), T, E), np.float32)
    for n, ly in enumerate(layers):
        hidden[n] = layer_forward(x, ly, E, num_heads, num_kv_heads, head_dim, intermediate_dim,
                                  eps, rope_cos, rope_sin,
                                  quantize_activations=quantize_activations, kv_dtype=kv_dtype,
                                  attn_scale=attn_scale, attn_softcap=attn_softcap, gate=gate)
        x = hidden[n]
    z = rmsnorm(x, out_norm, eps)
    logits = _project(z, head, head_dt, V, E, quantize_activations)
    if final_softcap > 0:
        logits = final_softcap * np.tanh(logits / final_softcap)
    return logits.astype(np.float32), hidden


__all__ = [
    'CKDataType', 'FLOAT_FORMATS', 'BLOCK32_FORMATS', 'KQUANT_FORMATS', 'BLOCK_LAYOUT',
    'ck_dtype_row_bytes', 'float_to_bf16_bits', 'rel_err',
    'dequantize', 'quantize_q8_0', 'quantize_q8_K', 'dequantize_q8_0', 'dequantize_q8_K',
    'quantized_activations',
    'rmsnorm', 'rope', 'rope_tables_rows', 'attention', 'silu', 'gelu_tanh', 'GATES',
    'mega_fused_attention_decode', 'mega_fused_attention_decode_workspace',
    'mega_fused_attention_prefill', 'mega_fused_attention_prefill_q8_0',
    'mega_fused_attention_prefill_scratch_size', 'mega_fused_attention_prefill_q8_0_scratch_size',
    'mega_fused_outproj_mlp_prefill', 'mega_fused_outproj_mlp_prefill_scratch_size',
    'mega_fused_mlp_prefill', 'mega_fused_mlp_prefill_scratch_size',
    'mega_fused_outproj_mlp_prefill_f32', 'mega_fused_mlp_prefill_f32',
    'mega_fuse_rmsnorm_qkv', 'mega_fuse_rmsnorm_qkv_rope',
    'mega_fuse_get_optimal_tiles', 'optimal_tiles_from_cache_sizes', 'cpu_cache_sizes',
    'floor_pow2', 'mega_fuse_report_stats', 'layer_forward', 'model_forward',
]
