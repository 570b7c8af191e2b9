# The Python boundary of megafuse: one thin def per function of the C header
# (include/megafuse/mega_fused_attention.h), with the header's names and parameter order.
#
# Each def checks every argument (SPEC section 5) before anything is written, then releases the
# GIL once and calls a kernel of the SIMD level chosen at import through its KernelTable
# (megafuse/_kernel_table.pxd).  Kernels cannot fail; every failure is an exception raised here.
#
# Dimension letters: E = embed_dim, Ea = aligned_embed_dim, D = head_dim, Da = aligned_head_dim,
# H = num_heads, G = num_kv_heads.

cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdlib cimport malloc, free
from libc.math cimport NAN

import importlib
import os
import sys

import numpy as np

from megafuse import _simd
from megafuse._kernel_table cimport KernelTable, KERNEL_TABLE_VERSION, MF_MAX_KV_TILE

cnp.import_array()


# --------------------------------------------------------------------------------------------
# The SIMD level in use
# --------------------------------------------------------------------------------------------

cdef const KernelTable *_K = NULL
_level_module = None


def _load_level(str level):
    """Point the boundary at the kernels of `level` (one of megafuse._simd.LEVELS)."""
    global _K, _level_module
    module = importlib.import_module(f"megafuse._simd_{level}")
    cdef const KernelTable *table = <const KernelTable *>PyCapsule_GetPointer(
        module.kernel_table(), b"megafuse.KernelTable")
    if table.version != KERNEL_TABLE_VERSION:
        raise ImportError(f"megafuse._simd_{level}: kernel table version {table.version}, "
                          f"expected {KERNEL_TABLE_VERSION} (a stale build: reinstall megafuse)")
    _K = table
    _level_module = module


_load_level(_simd.choose_level())


def simd_level():
    """The SIMD level whose kernels run: 'generic', 'avx2' or 'avx512'."""
    return (<bytes>_K.simd_level).decode()


# --------------------------------------------------------------------------------------------
# Threads: one module-level count, passed as num_threads= to every prange (SPEC section 7)
# --------------------------------------------------------------------------------------------

def _default_num_threads():
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


cdef int _num_threads = _default_num_threads()


def set_num_threads(n):
    """Set how many threads the kernels use (for every later call, from any Python thread)."""
    global _num_threads
    try:
        value = int(n.__index__())
    except AttributeError:
        raise TypeError(f"n: expected an int, got {type(n).__name__}") from None
    if value < 1 or value > 4096:
        raise ValueError(f"n: expected a thread count in 1..4096, got {value}")
    _num_threads = value


def get_num_threads():
    """The number of threads the kernels use."""
    return _num_threads


# --------------------------------------------------------------------------------------------
# Tiles (mega_fuse_get_optimal_tiles): from this CPU's cache sizes, read once at import
# --------------------------------------------------------------------------------------------

cdef Py_ssize_t _l1d_bytes = 0, _l2_bytes = 0
_l1d_bytes, _l2_bytes = _simd.cache_sizes()
cdef int _q_tile_override = 0, _kv_tile_override = 0


cdef inline Py_ssize_t _floor_pow2(Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t p = 1
    while p * 2 <= n:
        p *= 2
    return p


cdef inline Py_ssize_t _clamp(Py_ssize_t n, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    return lo if n < lo else (hi if n > hi else n)


cdef void _tiles_from_cache_sizes(Py_ssize_t l1d, Py_ssize_t l2, int head_dim, int *q_tile,
                                  int *kv_tile) noexcept nogil:
    """The tiles for caches of l1d / l2 bytes.

    kv_tile: one K tile (kv_tile rows of head_dim floats) fills half of L1d, so a tile of K (then
      of V) stays in L1 while the queries stream over it;
    q_tile: a query tile, its accumulators (2 * head_dim floats a row) and a row of kv_tile scores
      fill half of L2.
    Both rounded down to a power of two, kv_tile in [16, 256], q_tile in [16, 128].  Where the OS
    does not tell the cache sizes: the header's defaults MEGA_FUSE_Q_TILE = MEGA_FUSE_KV_TILE = 64.
    """
    cdef Py_ssize_t d = head_dim if head_dim > 0 else 1
    cdef Py_ssize_t kv
    if l1d <= 0 or l2 <= 0:
        q_tile[0] = 64
        kv_tile[0] = 64
        return
    kv = _clamp(_floor_pow2((l1d // 2) // (d * 4)), 16, MF_MAX_KV_TILE)
    kv_tile[0] = <int>kv
    q_tile[0] = <int>_clamp(_floor_pow2((l2 // 2) // ((2 * d + kv) * 4)), 16, 128)


cdef void c_mega_fuse_get_optimal_tiles(int *q_tile, int *kv_tile, int head_dim) noexcept nogil:
    """The tiles for this CPU (its cache sizes, read once at import); a test override wins."""
    if _q_tile_override > 0:
        q_tile[0] = _q_tile_override
        kv_tile[0] = _kv_tile_override
        return
    _tiles_from_cache_sizes(_l1d_bytes, _l2_bytes, head_dim, q_tile, kv_tile)


def _optimal_tiles_for(l1d_bytes, l2_bytes, head_dim):
    """Testing hook: the tile formula for any cache sizes (0 = unknown)."""
    cdef int q_tile = 0, kv_tile = 0
    _tiles_from_cache_sizes(l1d_bytes, l2_bytes, _int_arg(head_dim, "head_dim"), &q_tile,
                            &kv_tile)
    return q_tile, kv_tile


def _set_tile_override(q_tile=None, kv_tile=None):
    """Testing hook: force the tiles every kernel uses (None, None: back to the CPU's)."""
    global _q_tile_override, _kv_tile_override
    if q_tile is None and kv_tile is None:
        _q_tile_override = _kv_tile_override = 0
        return
    if not (1 <= int(kv_tile) <= MF_MAX_KV_TILE and int(q_tile) >= 1):
        raise ValueError(f"kv_tile: expected 1..{MF_MAX_KV_TILE}, got {kv_tile}")
    _q_tile_override, _kv_tile_override = int(q_tile), int(kv_tile)


def mega_fuse_get_optimal_tiles(head_dim):
    """Tile sizes for this CPU: returns (q_tile, kv_tile).

    Derived from the L1d / L2 cache sizes the OS reports (see megafuse.show_config()); the
    attention kernels use exactly these tiles.  The C header writes them through two int
    pointers; here they are the return value (SPEC section 1).
    """
    head_dim = _int_arg(head_dim, "head_dim")
    _positive(head_dim, "head_dim")
    cdef int q_tile = 0, kv_tile = 0
    c_mega_fuse_get_optimal_tiles(&q_tile, &kv_tile, head_dim)
    return q_tile, kv_tile


# --------------------------------------------------------------------------------------------
# Data types (include/megafuse/ckernel_dtype.h): the helpers of the C header, callable from Python
# --------------------------------------------------------------------------------------------

cdef extern from "megafuse/ckernel_dtype.h" nogil:
    ctypedef int CKDataType
    ctypedef unsigned int CKDataTypeMask
    CKDataType CK_DT_COUNT
    CKDataTypeMask CK_DT_WEIGHT_FORMATS
    CKDataTypeMask CK_DT_MASK_C "CK_DT_MASK"(CKDataType dt)
    int ck_dtype_is_quantized_c "ck_dtype_is_quantized"(CKDataType dt)
    size_t ck_dtype_bytes_c "ck_dtype_bytes"(CKDataType dt)
    size_t ck_dtype_block_size_c "ck_dtype_block_size"(CKDataType dt)
    size_t ck_dtype_block_bytes_c "ck_dtype_block_bytes"(CKDataType dt)
    size_t ck_dtype_row_bytes_c "ck_dtype_row_bytes"(CKDataType dt, size_t n)
    int ck_dtype_supported_c "ck_dtype_supported"(CKDataTypeMask mask, CKDataType dt)


cdef int _dtype_arg(object dt, str name) except -1:
    """A CKDataType argument (the IntEnum or a plain int) as its value; any enum member is fine
    here (COUNT excluded): callers that need a weight format check that separately."""
    if isinstance(dt, (bool, float)) or not hasattr(dt, "__index__"):
        raise TypeError(f"{name}: expected a megafuse.CKDataType or an int, got "
                        f"{type(dt).__name__}")
    value = dt.__index__()
    if not 0 <= value < CK_DT_COUNT:
        raise ValueError(f"{name}: expected a CKDataType value in 0..{CK_DT_COUNT - 1}, got "
                         f"{value}")
    return value


cdef int _weight_dtype_arg(object dt, str name) except -1:
    """A CKDataType that is a weight format (SPEC section 2)."""
    cdef int value = _dtype_arg(dt, name)
    if not ck_dtype_supported_c(CK_DT_WEIGHT_FORMATS, value):
        from megafuse._dtype import CKDataType as _E
        raise ValueError(f"{name}: expected a weight format (FP32, FP16, BF16, Q4_0, Q4_1, "
                         f"Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), got {_E(value).name}")
    return value


def CK_DT_MASK(dt):
    """The bit of dtype dt in a CKDataTypeMask: 1 << dt."""
    return CK_DT_MASK_C(_dtype_arg(dt, "dt"))


def ck_dtype_is_quantized(dt):
    """True for the block formats (Q4_0 ... Q8_K), whose scales live inside each block."""
    return bool(ck_dtype_is_quantized_c(_dtype_arg(dt, "dt")))


def ck_dtype_bytes(dt):
    """Bytes of one storage element: 4 (FP32), 2 (FP16, BF16), 1 (INT8; INT4 and the block
    formats, stored in uint8 arrays)."""
    return ck_dtype_bytes_c(_dtype_arg(dt, "dt"))


def ck_dtype_block_size(dt):
    """Weights per block: 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), 256 (Q4_K, Q5_K, Q6_K, Q8_K),
    2 (INT4: a byte), 1 (FP32, FP16, BF16, INT8)."""
    return ck_dtype_block_size_c(_dtype_arg(dt, "dt"))


def ck_dtype_block_bytes(dt):
    """Bytes per block (GGML's byte counts); bytes per element for the plain types."""
    return ck_dtype_block_bytes_c(_dtype_arg(dt, "dt"))


def ck_dtype_row_bytes(dt, n_elements):
    """Bytes of a row of n_elements weights; n_elements must be a positive multiple of the
    block size."""
    cdef int value = _dtype_arg(dt, "dt")
    n = n_elements.__index__() if hasattr(n_elements, "__index__") else None
    if n is None or isinstance(n_elements, bool):
        raise TypeError(f"n_elements: expected an int, got {type(n_elements).__name__}")
    if n <= 0:
        raise ValueError(f"n_elements: expected a positive value, got {n}")
    block = ck_dtype_block_size_c(value)
    if n % block:
        raise ValueError(f"n_elements: expected a multiple of the block size {block}, got {n}")
    return ck_dtype_row_bytes_c(value, n)


def ck_dtype_supported(mask, dt):
    """True when dtype dt is in the CKDataTypeMask `mask` (an OR of CK_DT_MASK(...))."""
    if not hasattr(mask, "__index__") or isinstance(mask, bool):
        raise TypeError(f"mask: expected an int, got {type(mask).__name__}")
    if not 0 <= mask.__index__() < (1 << 32):
        raise ValueError(f"mask: expected a 32-bit mask, got {mask}")
    return bool(ck_dtype_supported_c(mask.__index__(), _dtype_arg(dt, "dt")))


WEIGHT_FORMATS_MASK = CK_DT_WEIGHT_FORMATS


# --------------------------------------------------------------------------------------------
# Validation helpers: every message names the parameter, what was expected and what was got
# --------------------------------------------------------------------------------------------

_F32 = (np.dtype(np.float32),)


cdef object _int_arg(object value, str name):
    """An int argument of the C signature: any integer (not a float: TypeError), within the
    range of a C int (else OverflowError)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    value = value.__index__()
    if not -2**31 <= value < 2**31:
        raise OverflowError(f"{name}: expected a value in the range of a C int, got {value}")
    return value


cdef object _size_arg(object value, str name):
    """A size_t argument: a non-negative integer below 2**64 (else OverflowError)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    value = value.__index__()
    if not 0 <= value < 2**64:
        raise OverflowError(f"{name}: expected a value in the range of a C size_t, got {value}")
    return value


cdef inline void _positive(long long value, str name) except *:
    if value <= 0:
        raise ValueError(f"{name}: expected a positive value, got {value}")


cdef object _array(object arr, str name, tuple dtypes, Py_ssize_t count, str shape,
                   bint writeable=False, bint at_least=False):
    """arr, checked: an ndarray of one of `dtypes`, C-contiguous, aligned, of `count` elements
    (at least `count` when at_least), writeable when asked.  `shape` spells the expected shape."""
    names = " or ".join(str(d) for d in dtypes)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of {names}, got {type(arr).__name__}")
    if arr.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {names} (native byte order), got {arr.dtype.str}"
                        f" ({arr.dtype})")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {arr.strides} "
                         f"for shape {arr.shape}")
    if not arr.flags.aligned:
        raise ValueError(f"{name}: expected an array aligned to its dtype, got address "
                         f"{arr.__array_interface__['data'][0]:#x}")
    if at_least and arr.size < count:
        raise ValueError(f"{name}: expected at least {shape} = {count} elements, got {arr.size} "
                         f"(shape {arr.shape})")
    if not at_least and arr.size != count:
        raise ValueError(f"{name}: expected {shape} = {count} elements, got {arr.size} "
                         f"(shape {arr.shape})")
    if writeable and not arr.flags.writeable:
        raise ValueError(f"{name}: expected a writeable array, got a read-only one")
    return arr


cdef object _optional(object arr, str name, tuple dtypes, Py_ssize_t count, str shape):
    return None if arr is None else _array(arr, name, dtypes, count, shape)


cdef object _rope_tables(object rope_cos, object rope_sin, Py_ssize_t D, Py_ssize_t last_pos):
    """Check the RoPE tables (both or neither; whole rows of D/2 covering last_pos)."""
    if (rope_cos is None) != (rope_sin is None):
        raise ValueError(f"rope_cos, rope_sin: expected both arrays or both None, got "
                         f"rope_cos={'None' if rope_cos is None else 'an array'}, "
                         f"rope_sin={'None' if rope_sin is None else 'an array'}")
    if rope_cos is None:
        return
    if D % 2:
        raise ValueError(f"head_dim: expected an even value with RoPE tables, got {D}")
    for name, table in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
        _array(table, name, _F32, 0, "", False, True)
        if table.size % (D // 2):
            raise ValueError(f"{name}: expected whole rows of head_dim/2 = {D // 2} values, got "
                             f"{table.size} elements")
        rows = table.size // (D // 2)
        if rows <= last_pos:
            raise ValueError(f"{name}: expected a table covering position {last_pos} (at least "
                             f"{last_pos + 1} rows of {D // 2}), got {rows} rows")


cdef inline Py_ssize_t _addr(object arr):
    return <Py_ssize_t>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef object _no_overlap(tuple written, tuple read, tuple may_alias=()):
    """No written buffer may overlap another buffer, except `output` being exactly one of the
    buffers named in may_alias (an in-place update, SPEC section 4)."""
    cdef list spans = []
    for name, arr in written + read:
        if arr is not None:
            spans.append((name, arr, name in [w[0] for w in written]))
    for i in range(len(spans)):
        name_a, a, a_written = spans[i]
        for j in range(i + 1, len(spans)):
            name_b, b, b_written = spans[j]
            if not (a_written or b_written):
                continue
            lo_a, lo_b = _addr(a), _addr(b)
            if lo_a >= lo_b + b.nbytes or lo_b >= lo_a + a.nbytes:
                continue
            if lo_a == lo_b and a.nbytes == b.nbytes and (
                    (name_a == "output" and name_b in may_alias) or
                    (name_b == "output" and name_a in may_alias)):
                continue
            raise ValueError(f"{name_a}: expected memory of its own, got an array that overlaps "
                             f"{name_b}" + (f" (output may only be exactly "
                                            f"{' or '.join(may_alias)})" if may_alias else ""))


cdef inline const float *_fp(object arr):
    return NULL if arr is None else <const float *>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef inline float *_wp(object arr):
    return <float *>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef void _check_heads(long long num_heads, long long num_kv_heads) except *:
    _positive(num_heads, "num_heads")
    _positive(num_kv_heads, "num_kv_heads")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads: expected a multiple of num_kv_heads = {num_kv_heads}, "
                         f"got {num_heads}")


cdef void _check_aligned(long long aligned, long long unaligned, str aligned_name,
                         str name) except *:
    _positive(unaligned, name)
    _positive(aligned, aligned_name)
    if aligned < unaligned:
        raise ValueError(f"{aligned_name}: expected at least {name} = {unaligned}, got {aligned}")


# --------------------------------------------------------------------------------------------
# Decode: one token through RMSNorm -> QKV -> RoPE -> cache -> attention -> out-proj + residual
# --------------------------------------------------------------------------------------------

cdef object _check_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                         kv_cache_k, kv_cache_v, rope_cos, rope_sin, int pos, int embed_dim,
                         int aligned_embed_dim, int num_heads, int num_kv_heads, int head_dim,
                         int aligned_head_dim, int cache_capacity, tuple workspaces):
    """Every check of the decode entry points; returns nothing, raises on the first problem."""
    cdef Py_ssize_t E = embed_dim, Ea = aligned_embed_dim, H = num_heads, G = num_kv_heads
    cdef Py_ssize_t D = head_dim, Da = aligned_head_dim, C = cache_capacity
    _check_aligned(aligned_embed_dim, embed_dim, "aligned_embed_dim", "embed_dim")
    _check_heads(num_heads, num_kv_heads)
    _check_aligned(aligned_head_dim, head_dim, "aligned_head_dim", "head_dim")
    _positive(cache_capacity, "cache_capacity")
    if pos < 0 or pos >= cache_capacity:
        raise ValueError(f"pos: expected a position in 0..cache_capacity-1 = {C - 1}, got {pos}")
    _array(output, "output", _F32, Ea, "[aligned_embed_dim]", True)
    _array(input, "input", _F32, Ea, "[aligned_embed_dim]")
    _optional(residual, "residual", _F32, Ea, "[aligned_embed_dim]")
    _array(ln1_gamma, "ln1_gamma", _F32, E, "[embed_dim]")
    _array(wq, "wq", _F32, H * Da * Ea, "[num_heads*aligned_head_dim, aligned_embed_dim]")
    _optional(bq, "bq", _F32, H * Da, "[num_heads*aligned_head_dim]")
    _array(wk, "wk", _F32, G * Da * Ea, "[num_kv_heads*aligned_head_dim, aligned_embed_dim]")
    _optional(bk, "bk", _F32, G * Da, "[num_kv_heads*aligned_head_dim]")
    _array(wv, "wv", _F32, G * Da * Ea, "[num_kv_heads*aligned_head_dim, aligned_embed_dim]")
    _optional(bv, "bv", _F32, G * Da, "[num_kv_heads*aligned_head_dim]")
    _array(wo, "wo", _F32, Ea * H * Da, "[aligned_embed_dim, num_heads*aligned_head_dim]")
    _optional(bo, "bo", _F32, Ea, "[aligned_embed_dim]")
    cache_shape = "[num_kv_heads, cache_capacity, aligned_head_dim]"
    _array(kv_cache_k, "kv_cache_k", _F32, G * C * Da, cache_shape, True)
    _array(kv_cache_v, "kv_cache_v", _F32, G * C * Da, cache_shape, True)
    _rope_tables(rope_cos, rope_sin, D, pos)
    _no_overlap((("output", output), ("kv_cache_k", kv_cache_k), ("kv_cache_v", kv_cache_v))
                + workspaces,
                (("input", input), ("residual", residual), ("ln1_gamma", ln1_gamma),
                 ("wq", wq), ("bq", bq), ("wk", wk), ("bk", bk), ("wv", wv), ("bv", bv),
                 ("wo", wo), ("bo", bo), ("rope_cos", rope_cos), ("rope_sin", rope_sin)),
                may_alias=("input", "residual"))


cdef void _run_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                      kv_cache_k, kv_cache_v, rope_cos, rope_sin, int pos, int embed_dim,
                      int aligned_embed_dim, int num_heads, int num_kv_heads, int head_dim,
                      int aligned_head_dim, int cache_capacity, float eps,
                      q_output_workspace, kv_workspace):
    cdef int q_tile, kv_tile
    c_mega_fuse_get_optimal_tiles(&q_tile, &kv_tile, head_dim)
    cdef float *p_out = _wp(output)
    cdef const float *p_in = _fp(input)
    cdef const float *p_res = _fp(residual)
    cdef const float *p_g = _fp(ln1_gamma)
    cdef const float *p_wq = _fp(wq)
    cdef const float *p_bq = _fp(bq)
    cdef const float *p_wk = _fp(wk)
    cdef const float *p_bk = _fp(bk)
    cdef const float *p_wv = _fp(wv)
    cdef const float *p_bv = _fp(bv)
    cdef const float *p_wo = _fp(wo)
    cdef const float *p_bo = _fp(bo)
    cdef float *p_kc = _wp(kv_cache_k)
    cdef float *p_vc = _wp(kv_cache_v)
    cdef const float *p_cos = _fp(rope_cos)
    cdef const float *p_sin = _fp(rope_sin)
    cdef float *p_qws = _wp(q_output_workspace)
    cdef float *p_kvws = _wp(kv_workspace)
    cdef int nt = _num_threads
    with nogil:
        _K.attention_decode(p_out, p_in, p_res, p_g, p_wq, p_bq, p_wk, p_bk, p_wv, p_bv, p_wo,
                            p_bo, p_kc, p_vc, p_cos, p_sin, pos, embed_dim, aligned_embed_dim,
                            num_heads, num_kv_heads, head_dim, aligned_head_dim, cache_capacity,
                            eps, p_qws, p_kvws, kv_tile, nt)


def mega_fused_attention_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv,
                                wo, bo, kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos,
                                embed_dim, aligned_embed_dim, num_heads,
                                num_kv_heads, head_dim, aligned_head_dim,
                                cache_capacity, float eps):
    """One token through the fused attention block (float32 weights).

    output[Ea] = attention(rope(rmsnorm(input) @ W.T + b)) @ wo.T + bo + residual, with the
    token's k, v written to row [g, pos] of the caches first and attention over positions
    0..pos.  Layouts (SPEC section 3): input, residual, output [Ea]; ln1_gamma [E];
    wq [H*Da, Ea]; wk, wv [G*Da, Ea]; bq [H*Da]; bk, bv [G*Da]; wo [Ea, H*Da]; bo [Ea];
    kv_cache_k, kv_cache_v [G, cache_capacity, Da]; rope_cos, rope_sin [rows > pos, D/2].
    residual, biases and the rope tables (both or neither) may be None.  output may be input or
    residual itself.  Query head h reads kv head h // (H // G).
    """
    pos = _int_arg(pos, "pos")
    embed_dim = _int_arg(embed_dim, "embed_dim")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
    cache_capacity = _int_arg(cache_capacity, "cache_capacity")
    _check_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                  kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim,
                  aligned_embed_dim, num_heads, num_kv_heads, head_dim, aligned_head_dim,
                  cache_capacity, ())
    q_ws = np.empty(2 * num_heads * aligned_head_dim, dtype=np.float32)    # [2, H*Da]
    kv_ws = np.empty(2 * num_kv_heads * aligned_head_dim, dtype=np.float32)  # [2, G*Da]
    _run_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim, aligned_embed_dim,
                num_heads, num_kv_heads, head_dim, aligned_head_dim, cache_capacity, eps,
                q_ws, kv_ws)


def mega_fused_attention_decode_workspace(output, input, residual, ln1_gamma, wq, bq, wk, bk,
                                          wv, bv, wo, bo, kv_cache_k, kv_cache_v, rope_cos,
                                          rope_sin, pos, embed_dim,
                                          aligned_embed_dim, num_heads,
                                          num_kv_heads, head_dim, aligned_head_dim,
                                          cache_capacity, float eps, q_output_workspace,
                                          q_output_workspace_bytes, kv_workspace,
                                          kv_workspace_bytes):
    """mega_fused_attention_decode without any allocation: every intermediate lives in the two
    caller-owned float32 workspaces.

    q_output_workspace: at least 2*H*Da floats (q, then the attention output);
    kv_workspace: at least 2*G*Da floats (k, then v).  The *_bytes arguments are the sizes the
    caller vouches for: each must cover what the kernel needs and fit inside its array.
    The result is bitwise that of mega_fused_attention_decode.
    """
    pos = _int_arg(pos, "pos")
    embed_dim = _int_arg(embed_dim, "embed_dim")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
    cache_capacity = _int_arg(cache_capacity, "cache_capacity")
    q_output_workspace_bytes = _size_arg(q_output_workspace_bytes, "q_output_workspace_bytes")
    kv_workspace_bytes = _size_arg(kv_workspace_bytes, "kv_workspace_bytes")
    cdef Py_ssize_t q_need = 2 * <Py_ssize_t>num_heads * aligned_head_dim
    cdef Py_ssize_t kv_need = 2 * <Py_ssize_t>num_kv_heads * aligned_head_dim
    _check_heads(num_heads, num_kv_heads)
    _check_aligned(aligned_head_dim, head_dim, "aligned_head_dim", "head_dim")
    for name, ws, nbytes, need, shape in (
            ("q_output_workspace", q_output_workspace, q_output_workspace_bytes, q_need,
             "[2, num_heads*aligned_head_dim]"),
            ("kv_workspace", kv_workspace, kv_workspace_bytes, kv_need,
             "[2, num_kv_heads*aligned_head_dim]")):
        _array(ws, name, _F32, need, shape, True, True)
        _positive(nbytes, f"{name}_bytes")
        if nbytes < need * 4:
            raise ValueError(f"{name}_bytes: expected at least {shape} = {need} floats = "
                             f"{need * 4} bytes, got {nbytes}")
        if nbytes > ws.nbytes:
            raise ValueError(f"{name}_bytes: expected at most the {ws.nbytes} bytes of "
                             f"{name}, got {nbytes}")
    _check_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                  kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim,
                  aligned_embed_dim, num_heads, num_kv_heads, head_dim, aligned_head_dim,
                  cache_capacity, (("q_output_workspace", q_output_workspace),
                                   ("kv_workspace", kv_workspace)))
    _run_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim, aligned_embed_dim,
                num_heads, num_kv_heads, head_dim, aligned_head_dim, cache_capacity, eps,
                q_output_workspace, kv_workspace)


# --------------------------------------------------------------------------------------------
# RMSNorm + QKV (+ RoPE), the unaligned layout of the header's "phase" functions
# --------------------------------------------------------------------------------------------

cdef void _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin,
                       int pos, int hidden, int num_heads, int num_kv_heads, int head_dim,
                       int max_seq, bint has_pos, float eps) except *:
    cdef Py_ssize_t E = hidden, H = num_heads, G = num_kv_heads, D = head_dim
    _positive(hidden, "hidden")
    _check_heads(num_heads, num_kv_heads)
    _positive(head_dim, "head_dim")
    if has_pos:
        _positive(max_seq, "max_seq")
        if pos < 0 or pos >= max_seq:
            raise ValueError(f"pos: expected a position in 0..max_seq-1 = {max_seq - 1}, "
                             f"got {pos}")
    _array(q_out, "q_out", _F32, H * D, "[num_heads*head_dim]", True)
    _array(k_out, "k_out", _F32, G * D, "[num_kv_heads*head_dim]", True)
    _array(v_out, "v_out", _F32, G * D, "[num_kv_heads*head_dim]", True)
    _array(input, "input", _F32, E, "[hidden]")
    _array(gamma, "gamma", _F32, E, "[hidden]")
    _array(W_qkv, "W_qkv", _F32, (H + 2 * G) * D * E,
           "[(num_heads+2*num_kv_heads)*head_dim, hidden]")
    _optional(b_qkv, "b_qkv", _F32, (H + 2 * G) * D, "[(num_heads+2*num_kv_heads)*head_dim]")
    _rope_tables(rope_cos, rope_sin, D, pos)
    _no_overlap((("q_out", q_out), ("k_out", k_out), ("v_out", v_out)),
                (("input", input), ("gamma", gamma), ("W_qkv", W_qkv), ("b_qkv", b_qkv),
                 ("rope_cos", rope_cos), ("rope_sin", rope_sin)))
    cdef float *p_q = _wp(q_out)
    cdef float *p_k = _wp(k_out)
    cdef float *p_v = _wp(v_out)
    cdef const float *p_in = _fp(input)
    cdef const float *p_g = _fp(gamma)
    cdef const float *p_w = _fp(W_qkv)
    cdef const float *p_b = _fp(b_qkv)
    cdef const float *p_cos = _fp(rope_cos)
    cdef const float *p_sin = _fp(rope_sin)
    cdef int nt = _num_threads
    with nogil:
        _K.rmsnorm_qkv_rope(p_q, p_k, p_v, p_in, p_g, p_w, p_b, p_cos, p_sin, pos, hidden,
                            num_heads, num_kv_heads, head_dim, eps, nt)


def mega_fuse_rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, hidden,
                          num_heads, num_kv_heads, head_dim, float eps):
    """q, k, v of one token: rmsnorm(input) @ W_qkv.T + b_qkv, split into q_out [H*D],
    k_out [G*D], v_out [G*D].  W_qkv is [(H+2G)*D, hidden] (q rows, then k, then v), b_qkv
    [(H+2G)*D] or None; no padding anywhere."""
    hidden = _int_arg(hidden, "hidden")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, None, None, 0, hidden,
                 num_heads, num_kv_heads, head_dim, 0, False, eps)


def mega_fuse_rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos,
                               rope_sin, pos, hidden, num_heads, num_kv_heads,
                               head_dim, max_seq, float eps):
    """mega_fuse_rmsnorm_qkv, then rotate-half RoPE of q and k at position pos
    (0 <= pos < max_seq; rope_cos / rope_sin [rows > pos, D/2], or both None: no rotation)."""
    pos = _int_arg(pos, "pos")
    hidden = _int_arg(hidden, "hidden")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    max_seq = _int_arg(max_seq, "max_seq")
    _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin, pos,
                 hidden, num_heads, num_kv_heads, head_dim, max_seq, True, eps)


# --------------------------------------------------------------------------------------------
# mega_fuse_report_stats: memory traffic of the unfused vs the fused layer
# --------------------------------------------------------------------------------------------

def mega_fuse_report_stats(hidden, num_layers, seq_len):
    """Print, and return as a dict, the memory traffic an unfused attention block spends on
    intermediates against the fused one.  Every figure comes from these formulas (float32,
    per token per layer):

      unfused intermediates = normed input, q, k, v, attention output, out-projection result
                              (hidden floats each) + one row of attention scores (seq_len floats)
                            = 4 * (6 * hidden + seq_len) bytes, each written once and read once;
      unfused traffic       = 2 * intermediates + input read + output written (2 * 4 * hidden);
      fused traffic         = input read + output written = 2 * 4 * hidden
                              (every intermediate stays in registers, L1 or L2);
    per layer: times seq_len tokens; per model: times num_layers; reduction = unfused / fused.
    """
    hidden = _int_arg(hidden, "hidden")
    num_layers = _int_arg(num_layers, "num_layers")
    seq_len = _int_arg(seq_len, "seq_len")
    _positive(hidden, "hidden")
    _positive(num_layers, "num_layers")
    _positive(seq_len, "seq_len")
    cdef long long h = hidden, layers = num_layers, t = seq_len
    inter = 4 * (6 * h + t)
    unfused = 2 * inter + 2 * 4 * h
    fused = 2 * 4 * h
    stats = {
        "hidden": hidden,
        "num_layers": num_layers,
        "seq_len": seq_len,
        "unfused_intermediate_bytes_per_token": inter,
        "unfused_traffic_bytes_per_token": unfused,
        "fused_traffic_bytes_per_token": fused,
        "unfused_traffic_bytes_per_layer": unfused * t,
        "fused_traffic_bytes_per_layer": fused * t,
        "unfused_traffic_bytes_model": unfused * t * layers,
        "fused_traffic_bytes_model": fused * t * layers,
        "reduction": unfused / fused,
    }
    out = sys.stdout
    out.write(f"megafuse: memory traffic of the attention block, hidden={hidden}, "
              f"layers={num_layers}, seq_len={seq_len}\n")
    out.write("  (float32; unfused = 2 x 4*(6*hidden + seq_len) B of intermediates + 2 x "
              "4*hidden B in/out per token; fused = 2 x 4*hidden B)\n")
    width = max(len(k) for k in stats)
    for key, value in stats.items():
        shown = f"{value:.2f}x" if key == "reduction" else f"{value:,}"
        out.write(f"  {key:<{width}}  {shown}\n")
    return stats


# --------------------------------------------------------------------------------------------
# The C-level surface (megafuse/_kernels.pxd): no validation, the caller vouches for the sizes
# --------------------------------------------------------------------------------------------

cdef void c_mega_fused_attention_decode_workspace(
        float *output, const float *input, const float *residual, const float *ln1_gamma,
        const float *wq, const float *bq, const float *wk, const float *bk,
        const float *wv, const float *bv, const float *wo, const float *bo,
        float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
        int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
        int head_dim, int aligned_head_dim, int cache_capacity, float eps,
        float *q_output_workspace, size_t q_output_workspace_bytes,
        float *kv_workspace, size_t kv_workspace_bytes) noexcept nogil:
    cdef int q_tile, kv_tile
    c_mega_fuse_get_optimal_tiles(&q_tile, &kv_tile, head_dim)
    _K.attention_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                        kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim,
                        aligned_embed_dim, num_heads, num_kv_heads, head_dim, aligned_head_dim,
                        cache_capacity, eps, q_output_workspace, kv_workspace, kv_tile,
                        _num_threads)


cdef void c_mega_fused_attention_decode(
        float *output, const float *input, const float *residual, const float *ln1_gamma,
        const float *wq, const float *bq, const float *wk, const float *bk,
        const float *wv, const float *bv, const float *wo, const float *bo,
        float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
        int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
        int head_dim, int aligned_head_dim, int cache_capacity, float eps) noexcept nogil:
    """Allocates the two workspaces; if that fails, output is filled with NaN (nothing else
    is written)."""
    cdef size_t q_bytes = 2 * <size_t>num_heads * aligned_head_dim * sizeof(float)
    cdef size_t kv_bytes = 2 * <size_t>num_kv_heads * aligned_head_dim * sizeof(float)
    cdef float *ws = <float *>malloc(q_bytes + kv_bytes)
    cdef Py_ssize_t e
    if ws == NULL:
        for e in range(aligned_embed_dim):
            output[e] = NAN
        return
    c_mega_fused_attention_decode_workspace(
        output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo, kv_cache_k,
        kv_cache_v, rope_cos, rope_sin, pos, embed_dim, aligned_embed_dim, num_heads,
        num_kv_heads, head_dim, aligned_head_dim, cache_capacity, eps, ws, q_bytes,
        ws + q_bytes // sizeof(float), kv_bytes)
    free(ws)


cdef void c_mega_fuse_rmsnorm_qkv(
        float *q_out, float *k_out, float *v_out, const float *input, const float *gamma,
        const float *W_qkv, const float *b_qkv, int hidden, int num_heads, int num_kv_heads,
        int head_dim, float eps) noexcept nogil:
    _K.rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, NULL, NULL, 0,
                        hidden, num_heads, num_kv_heads, head_dim, eps, _num_threads)


cdef void c_mega_fuse_rmsnorm_qkv_rope(
        float *q_out, float *k_out, float *v_out, const float *input, const float *gamma,
        const float *W_qkv, const float *b_qkv, const float *rope_cos, const float *rope_sin,
        int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, int max_seq,
        float eps) noexcept nogil:
    _K.rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin,
                        pos, hidden, num_heads, num_kv_heads, head_dim, eps, _num_threads)
