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
from libc.stdlib cimport calloc, malloc, free
from libc.math cimport NAN

import importlib
import os
import sys

import numpy as np

from megafuse import _simd
from megafuse._kernel_table cimport (
    KernelTable, KERNEL_TABLE_VERSION, MF_MAX_KV_TILE, MF_MAX_Q_TILE)

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


# The generic kernels until megafuse._selftest.select_level() -- called by megafuse/__init__.py as
# soon as this module is complete -- has proven the best level against them and loads it.
_load_level("generic")


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
    q_tile[0] = <int>_clamp(_floor_pow2((l2 // 2) // ((2 * d + kv) * 4)), 16, MF_MAX_Q_TILE)


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
    if not (1 <= int(kv_tile) <= MF_MAX_KV_TILE and 1 <= int(q_tile) <= MF_MAX_Q_TILE):
        raise ValueError(f"tiles: expected q_tile in 1..{MF_MAX_Q_TILE} and kv_tile in "
                         f"1..{MF_MAX_KV_TILE}, got {q_tile}, {kv_tile}")
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


cdef inline bint _dtype_ok(cnp.ndarray a, tuple dtypes):
    cdef int tn = cnp.PyArray_TYPE(a)
    cdef cnp.dtype d
    if cnp.PyArray_ISBYTESWAPPED(a):
        return False
    for d in dtypes:
        if d.type_num == tn:
            return True
    return False


cdef object _array(object arr, str name, tuple dtypes, Py_ssize_t count, str shape,
                   bint writeable=False, bint at_least=False):
    """arr, checked: an ndarray of one of `dtypes`, C-contiguous, aligned, of `count` elements
    (at least `count` when at_least), writeable when asked.  `shape` spells the expected shape.
    The checks are C-level (this runs on every call of every kernel); messages are built only
    on failure."""
    cdef cnp.ndarray a
    cdef Py_ssize_t size
    if not cnp.PyArray_Check(arr):
        raise TypeError(f"{name}: expected a numpy.ndarray of {_dtype_names(dtypes)}, got "
                        f"{type(arr).__name__}")
    a = <cnp.ndarray>arr
    if not _dtype_ok(a, dtypes):
        raise TypeError(f"{name}: expected dtype {_dtype_names(dtypes)} (native byte order), "
                        f"got {arr.dtype.str} ({arr.dtype})")
    if not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {arr.strides} "
                         f"for shape {arr.shape}")
    if not cnp.PyArray_ISALIGNED(a):
        raise ValueError(f"{name}: expected an array aligned to its dtype, got address "
                         f"{_addr(a):#x}")
    size = cnp.PyArray_SIZE(a)
    if at_least and size < count:
        raise ValueError(f"{name}: expected at least {shape} = {count} elements, got {size} "
                         f"(shape {arr.shape})")
    if not at_least and size != count:
        raise ValueError(f"{name}: expected {shape} = {count} elements, got {size} "
                         f"(shape {arr.shape})")
    if writeable and not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError(f"{name}: expected a writeable array, got a read-only one")
    return arr


def _dtype_name(int value):
    from megafuse._dtype import CKDataType
    return CKDataType(value).name


def _dtype_names(tuple dtypes):
    return " or ".join(str(d) for d in dtypes)


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


cdef enum:
    MAX_BUFFERS = 32


cdef object _no_overlap(tuple written, tuple read, tuple may_alias=()):
    """No written buffer may overlap another buffer, except `output` being exactly one of the
    buffers named in may_alias (an in-place update, SPEC section 4).  (name, array) pairs; None
    arrays are skipped.  The interval test runs in C; names are looked at only on a hit."""
    cdef Py_ssize_t lo[MAX_BUFFERS]
    cdef Py_ssize_t hi[MAX_BUFFERS]
    cdef bint w[MAX_BUFFERS]
    cdef Py_ssize_t idx[MAX_BUFFERS]       # position in written + read
    cdef Py_ssize_t n = 0, i, j, k = 0
    cdef tuple items = written + read
    cdef Py_ssize_t n_written = len(written)
    for k in range(len(items)):
        arr = (<tuple>items[k])[1]
        if arr is None:
            continue
        lo[n] = _addr(arr)
        hi[n] = lo[n] + cnp.PyArray_NBYTES(<cnp.ndarray>arr)
        w[n] = k < n_written
        idx[n] = k
        n += 1
    for i in range(n):
        for j in range(i + 1, n):
            if not (w[i] or w[j]) or lo[i] >= hi[j] or lo[j] >= hi[i]:
                continue
            name_a = items[idx[i]][0]
            name_b = items[idx[j]][0]
            if lo[i] == lo[j] and hi[i] == hi[j] and (
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
# Prefill: T tokens through the fused block, weights in any format
# --------------------------------------------------------------------------------------------

cdef extern from "megafuse/mf_scratch.h" nogil:
    ctypedef struct mf_prefill_scratch:
        size_t total
    mf_prefill_scratch mf_prefill_scratch_layout(size_t T, size_t Ea, size_t H, size_t Da,
                                                 int int8_path)

_FP16_ARRAYS = (np.dtype(np.float16), np.dtype(np.uint16))
_BF16_ARRAYS = (np.dtype(np.uint16),)
_BLOCK_ARRAYS = (np.dtype(np.uint8),)


cdef int _weight(object arr, str name, object dt, Py_ssize_t rows, Py_ssize_t cols,
                 str shape) except -1:
    """Check a `const void *w, CKDataType w_dt` pair: a weight of [rows, cols] in format dt.
    Returns the format's value."""
    cdef int value = _weight_dtype_arg(dt, name + "_dt")
    cdef Py_ssize_t block = ck_dtype_block_size_c(value)
    cdef Py_ssize_t row_bytes
    if cols % block:
        raise ValueError(f"{name}: {_dtype_name(value)} stores rows in whole blocks of {block} "
                         f"weights, but {shape} has {cols} columns")
    if value == 0:
        _array(arr, name, _F32, rows * cols, shape)
    elif value == 2:
        _array(arr, name, _FP16_ARRAYS, rows * cols, shape)
    elif value == 1:
        _array(arr, name, _BF16_ARRAYS, rows * cols, shape)
    else:
        row_bytes = ck_dtype_row_bytes_c(value, cols)
        try:
            _array(arr, name, _BLOCK_ARRAYS, rows * row_bytes, "")
        except ValueError as e:
            if "elements" not in str(e):
                raise
            raise ValueError(f"{name}: expected {shape} in {_dtype_name(value)} = {rows} rows of "
                             f"{row_bytes} bytes = {rows * row_bytes} bytes, got "
                             f"{arr.nbytes} bytes (shape {arr.shape})") from None
    return value


cdef object _scratch(object scratch, Py_ssize_t need, str name="scratch"):
    """Any-dtype, C-contiguous, writeable, 4-byte aligned, at least `need` bytes."""
    if not isinstance(scratch, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray (any dtype), got "
                        f"{type(scratch).__name__}")
    if not scratch.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {scratch.strides}")
    if not scratch.flags.writeable:
        raise ValueError(f"{name}: expected a writeable array, got a read-only one")
    if scratch.nbytes < need:
        raise ValueError(f"{name}: expected at least {need} bytes (the *_scratch_size helper), "
                         f"got {scratch.nbytes}")
    if _addr(scratch) % 4:
        raise ValueError(f"{name}: expected an address aligned to 4 bytes, got "
                         f"{_addr(scratch):#x}")
    return scratch


cdef Py_ssize_t _prefill_scratch_bytes(tokens, aligned_embed_dim, num_heads, aligned_head_dim,
                                       bint int8_path) except -1:
    tokens = _int_arg(tokens, "tokens")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    num_heads = _int_arg(num_heads, "num_heads")
    aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
    for name, value in (("tokens", tokens), ("aligned_embed_dim", aligned_embed_dim),
                        ("num_heads", num_heads), ("aligned_head_dim", aligned_head_dim)):
        _positive(value, name)
    return mf_prefill_scratch_layout(tokens, aligned_embed_dim, num_heads, aligned_head_dim,
                                     int8_path).total


def mega_fused_attention_prefill_scratch_size(tokens, aligned_embed_dim, num_heads,
                                              aligned_head_dim):
    """Bytes of scratch mega_fused_attention_prefill uses (exactly: it touches no byte past).

    Layout (include/megafuse/mf_scratch.h), regions at 64-byte offsets:
      A [T, H*Da] float32      q;
      B [T, max(Ea, H*Da)] f32 the normalised input, then the attention output.
    k and v go straight into the KV cache; no [T, T] or [T, cache] array exists.
    """
    return _prefill_scratch_bytes(tokens, aligned_embed_dim, num_heads, aligned_head_dim, False)


def mega_fused_attention_prefill_q8_0_scratch_size(tokens, aligned_embed_dim, num_heads,
                                                   aligned_head_dim):
    """Bytes of scratch mega_fused_attention_prefill_q8_0 uses (exactly).

    The regions A and B of the float prefill (A later holds the quantized attention rows), then
    C: the normalised input quantized to Q8_0 ([T] rows of Ea/32 blocks of 34 bytes, when
    Ea % 32 == 0) and to Q8_K ([T] rows of Ea/256 blocks of 292 bytes, when Ea % 256 == 0) -- the
    helper takes no dtypes, so room is made for both formats a mix of weights can need.
    """
    return _prefill_scratch_bytes(tokens, aligned_embed_dim, num_heads, aligned_head_dim, True)


cdef object _prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv,
                     wv_dt, wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin,
                     start_pos, tokens, cache_capacity, embed_dim, aligned_embed_dim,
                     num_heads, num_kv_heads, head_dim, aligned_head_dim, float eps, scratch,
                     bint int8_path):
    """Validate every argument of either prefill variant (SPEC section 5), then run it."""
    start_pos = _int_arg(start_pos, "start_pos")
    tokens = _int_arg(tokens, "tokens")
    cache_capacity = _int_arg(cache_capacity, "cache_capacity")
    embed_dim = _int_arg(embed_dim, "embed_dim")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
    cdef Py_ssize_t E = embed_dim, Ea = aligned_embed_dim, H = num_heads, G = num_kv_heads
    cdef Py_ssize_t D = head_dim, Da = aligned_head_dim, C = cache_capacity, T = tokens
    _positive(tokens, "tokens")
    _check_aligned(aligned_embed_dim, embed_dim, "aligned_embed_dim", "embed_dim")
    _check_heads(num_heads, num_kv_heads)
    _check_aligned(aligned_head_dim, head_dim, "aligned_head_dim", "head_dim")
    _positive(cache_capacity, "cache_capacity")
    if start_pos < 0:
        raise ValueError(f"start_pos: expected a position >= 0, got {start_pos}")
    if start_pos + T > C:
        raise ValueError(f"start_pos: expected start_pos + tokens <= cache_capacity = {C}, got "
                         f"{start_pos} + {T} = {start_pos + T}")
    rows = "[tokens, aligned_embed_dim]"
    _array(output, "output", _F32, T * Ea, rows, True)
    _array(input, "input", _F32, T * Ea, rows)
    _optional(residual, "residual", _F32, T * Ea, rows)
    _array(ln1_gamma, "ln1_gamma", _F32, E, "[embed_dim]")
    cdef int q_dt = _weight(wq, "wq", wq_dt, H * Da, Ea,
                            "[num_heads*aligned_head_dim, aligned_embed_dim]")
    cdef int k_dt = _weight(wk, "wk", wk_dt, G * Da, Ea,
                            "[num_kv_heads*aligned_head_dim, aligned_embed_dim]")
    cdef int v_dt = _weight(wv, "wv", wv_dt, G * Da, Ea,
                            "[num_kv_heads*aligned_head_dim, aligned_embed_dim]")
    cdef int o_dt = _weight(wo, "wo", wo_dt, Ea, H * Da,
                            "[aligned_embed_dim, num_heads*aligned_head_dim]")
    _optional(bq, "bq", _F32, H * Da, "[num_heads*aligned_head_dim]")
    _optional(bk, "bk", _F32, G * Da, "[num_kv_heads*aligned_head_dim]")
    _optional(bv, "bv", _F32, G * Da, "[num_kv_heads*aligned_head_dim]")
    _optional(bo, "bo", _F32, Ea, "[aligned_embed_dim]")
    cache_shape = "[num_kv_heads, cache_capacity, aligned_head_dim]"
    _array(kv_cache_k, "kv_cache_k", _F32, G * C * Da, cache_shape, True)
    _array(kv_cache_v, "kv_cache_v", _F32, G * C * Da, cache_shape, True)
    _rope_tables(rope_cos, rope_sin, D, start_pos + T - 1)
    _scratch(scratch, mf_prefill_scratch_layout(T, Ea, H, Da, int8_path).total)
    _no_overlap((("output", output), ("kv_cache_k", kv_cache_k), ("kv_cache_v", kv_cache_v),
                 ("scratch", scratch)),
                (("input", input), ("residual", residual), ("ln1_gamma", ln1_gamma),
                 ("wq", wq), ("bq", bq), ("wk", wk), ("bk", bk), ("wv", wv), ("bv", bv),
                 ("wo", wo), ("bo", bo), ("rope_cos", rope_cos), ("rope_sin", rope_sin)),
                may_alias=("input", "residual"))

    cdef int q_tile, kv_tile
    c_mega_fuse_get_optimal_tiles(&q_tile, &kv_tile, head_dim)
    cdef float *p_out = _wp(output)
    cdef const float *p_in = _fp(input)
    cdef const float *p_res = _fp(residual)
    cdef const float *p_g = _fp(ln1_gamma)
    cdef const void *p_wq = cnp.PyArray_DATA(<cnp.ndarray>wq)
    cdef const void *p_wk = cnp.PyArray_DATA(<cnp.ndarray>wk)
    cdef const void *p_wv = cnp.PyArray_DATA(<cnp.ndarray>wv)
    cdef const void *p_wo = cnp.PyArray_DATA(<cnp.ndarray>wo)
    cdef const float *p_bq = _fp(bq)
    cdef const float *p_bk = _fp(bk)
    cdef const float *p_bv = _fp(bv)
    cdef const float *p_bo = _fp(bo)
    cdef float *p_kc = _wp(kv_cache_k)
    cdef float *p_vc = _wp(kv_cache_v)
    cdef const float *p_cos = _fp(rope_cos)
    cdef const float *p_sin = _fp(rope_sin)
    cdef void *p_scratch = cnp.PyArray_DATA(<cnp.ndarray>scratch)
    cdef int sp = start_pos, nt = tokens, cap = cache_capacity, e_ = embed_dim
    cdef int ea = aligned_embed_dim, h_ = num_heads, g_ = num_kv_heads, d_ = head_dim
    cdef int da = aligned_head_dim, threads = _num_threads
    with nogil:
        _K.attention_prefill(p_out, p_in, p_res, p_g, p_wq, p_bq, q_dt, p_wk, p_bk, k_dt, p_wv,
                             p_bv, v_dt, p_wo, p_bo, o_dt, p_kc, p_vc, p_cos, p_sin, sp, nt,
                             cap, e_, ea, h_, g_, d_, da, eps, p_scratch, int8_path, q_tile,
                             kv_tile, threads)


def mega_fused_attention_prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk,
                                 wk_dt, wv, bv, wv_dt, wo, bo, wo_dt, kv_cache_k, kv_cache_v,
                                 rope_cos, rope_sin, start_pos, tokens, cache_capacity,
                                 embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                                 head_dim, aligned_head_dim, float eps, scratch):
    """T = tokens rows through the fused attention block, every activation in float32.

    Row t is the token at absolute position start_pos + t: its k, v are written to row
    [g, start_pos + t] of the caches, and it attends over positions 0..start_pos+t (causal
    flash attention in tiles of mega_fuse_get_optimal_tiles(head_dim); no [T, T] array).
    Layouts: input, residual, output [T, Ea]; wq [H*Da, Ea], wk/wv [G*Da, Ea], wo [Ea, H*Da],
    each in its own format (w*_dt: FP32 float32, FP16 float16/uint16, BF16 uint16, the GGML
    block formats uint8), dequantized in registers; biases float32 or None; caches
    [G, cache_capacity, Da]; rope tables [>= start_pos+T rows, D/2] or both None.
    scratch: any writeable array of at least mega_fused_attention_prefill_scratch_size(...)
    bytes.  output may be input or residual itself.
    """
    _prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
             wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
             cache_capacity, embed_dim, aligned_embed_dim, num_heads, num_kv_heads, head_dim,
             aligned_head_dim, eps, scratch, False)


def mega_fused_attention_prefill_q8_0(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk,
                                      bk, wk_dt, wv, bv, wv_dt, wo, bo, wo_dt, kv_cache_k,
                                      kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
                                      cache_capacity, embed_dim, aligned_embed_dim, num_heads,
                                      num_kv_heads, head_dim, aligned_head_dim, float eps,
                                      scratch):
    """mega_fused_attention_prefill on the int8 path.

    The normalised input rows (for the Q/K/V projections) and the attention output rows (for
    the out-projection) are quantized to the activation format of each weight -- Q8_0 for
    Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q8_K for Q4_K/Q5_K/Q6_K -- and multiplied with integer dot
    products (GGML's vec_dot scheme); FP32/FP16/BF16 weights stay float.  Same layouts;
    scratch: mega_fused_attention_prefill_q8_0_scratch_size(...) bytes.
    """
    _prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
             wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
             cache_capacity, embed_dim, aligned_embed_dim, num_heads, num_kv_heads, head_dim,
             aligned_head_dim, eps, scratch, True)


# --------------------------------------------------------------------------------------------
# The post-attention block: out-projection + residual -> RMSNorm -> SwiGLU MLP -> residual
# --------------------------------------------------------------------------------------------

cdef extern from "megafuse/mf_scratch.h" nogil:
    ctypedef struct mf_mlp_scratch:
        size_t total
    mf_mlp_scratch mf_mlp_scratch_layout(size_t T, size_t Ea, size_t hda, size_t Ia)


def mega_fused_outproj_mlp_prefill_scratch_size(tokens, aligned_embed_dim, num_heads,
                                                aligned_head_dim, aligned_intermediate_dim):
    """Bytes of scratch mega_fused_outproj_mlp_prefill uses (exactly).

    Per tile of up to 128 tokens (include/megafuse/mf_scratch.h): the tile's attention rows,
    then its normalised rows [tile, max(H*Da, Ea)] float32 and their quantized copy; the SwiGLU
    activation [tile, Ia] float32 and its quantized copy.  Nothing grows with the prompt beyond
    one tile: no [T, I] buffer.
    """
    values = [_int_arg(v, n) for v, n in ((tokens, "tokens"),
              (aligned_embed_dim, "aligned_embed_dim"), (num_heads, "num_heads"),
              (aligned_head_dim, "aligned_head_dim"),
              (aligned_intermediate_dim, "aligned_intermediate_dim"))]
    for value, name in zip(values, ("tokens", "aligned_embed_dim", "num_heads",
                                    "aligned_head_dim", "aligned_intermediate_dim")):
        _positive(value, name)
    T, Ea, H, Da, Ia = values
    return mf_mlp_scratch_layout(T, Ea, H * Da, Ia).total


def mega_fused_mlp_prefill_scratch_size(tokens, aligned_embed_dim, aligned_intermediate_dim):
    """Bytes of scratch mega_fused_mlp_prefill uses (exactly): the tile buffers of
    mega_fused_outproj_mlp_prefill_scratch_size without the attention rows."""
    values = [_int_arg(v, n) for v, n in ((tokens, "tokens"),
              (aligned_embed_dim, "aligned_embed_dim"),
              (aligned_intermediate_dim, "aligned_intermediate_dim"))]
    for value, name in zip(values, ("tokens", "aligned_embed_dim", "aligned_intermediate_dim")):
        _positive(value, name)
    T, Ea, Ia = values
    return mf_mlp_scratch_layout(T, Ea, 0, Ia).total


cdef object _mlp(output, attn_out, input, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2,
                 b2, w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
                 intermediate_dim, aligned_intermediate_dim, float eps, scratch,
                 bint with_outproj):
    """Validate either MLP entry (SPEC section 5), then run the one kernel behind both."""
    tokens = _int_arg(tokens, "tokens")
    embed_dim = _int_arg(embed_dim, "embed_dim")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    intermediate_dim = _int_arg(intermediate_dim, "intermediate_dim")
    aligned_intermediate_dim = _int_arg(aligned_intermediate_dim, "aligned_intermediate_dim")
    if with_outproj:
        num_heads = _int_arg(num_heads, "num_heads")
        aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
        _positive(num_heads, "num_heads")
        _positive(aligned_head_dim, "aligned_head_dim")
    else:
        num_heads, aligned_head_dim = 0, 0
    cdef Py_ssize_t T = tokens, E = embed_dim, Ea = aligned_embed_dim
    cdef Py_ssize_t I = intermediate_dim, Ia = aligned_intermediate_dim
    cdef Py_ssize_t HDa = <Py_ssize_t>num_heads * aligned_head_dim
    _positive(tokens, "tokens")
    _check_aligned(aligned_embed_dim, embed_dim, "aligned_embed_dim", "embed_dim")
    _check_aligned(aligned_intermediate_dim, intermediate_dim, "aligned_intermediate_dim",
                   "intermediate_dim")
    rows = "[tokens, aligned_embed_dim]"
    _array(output, "output", _F32, T * Ea, rows, True)
    if with_outproj:
        _array(attn_out, "attn_out", _F32, HDa * T, "[num_heads, tokens, aligned_head_dim]")
    else:
        _array(input, "input", _F32, T * Ea, rows)
    _optional(residual, "residual", _F32, T * Ea, rows)
    _array(ln2_gamma, "ln2_gamma", _F32, E, "[embed_dim]")
    cdef int o_dt = 0
    if with_outproj:
        o_dt = _weight(wo, "wo", wo_dt, Ea, HDa, "[aligned_embed_dim, num_heads*aligned_head_dim]")
        _optional(bo, "bo", _F32, Ea, "[aligned_embed_dim]")
    cdef int g_dt = _weight(w1, "w1", w1_dt, 2 * Ia, Ea,
                            "[2*aligned_intermediate_dim, aligned_embed_dim]")
    _optional(b1, "b1", _F32, 2 * Ia, "[2*aligned_intermediate_dim]")
    cdef int d_dt = _weight(w2, "w2", w2_dt, Ea, Ia,
                            "[aligned_embed_dim, aligned_intermediate_dim]")
    _optional(b2, "b2", _F32, Ea, "[aligned_embed_dim]")
    _scratch(scratch, mf_mlp_scratch_layout(T, Ea, HDa, Ia).total)
    reads = (("residual", residual), ("ln2_gamma", ln2_gamma), ("w1", w1), ("b1", b1),
             ("w2", w2), ("b2", b2))
    if with_outproj:
        reads += (("attn_out", attn_out), ("wo", wo), ("bo", bo))
    else:
        reads += (("input", input),)
    _no_overlap((("output", output), ("scratch", scratch)), reads,
                may_alias=("residual",) if with_outproj else ("input", "residual"))

    cdef float *p_out = _wp(output)
    cdef const float *p_attn = _fp(attn_out) if with_outproj else NULL
    cdef const float *p_in = NULL if with_outproj else _fp(input)
    cdef const float *p_res = _fp(residual)
    cdef const float *p_g = _fp(ln2_gamma)
    cdef const void *p_wo = cnp.PyArray_DATA(<cnp.ndarray>wo) if with_outproj else NULL
    cdef const float *p_bo = _fp(bo) if with_outproj else NULL
    cdef const void *p_w1 = cnp.PyArray_DATA(<cnp.ndarray>w1)
    cdef const float *p_b1 = _fp(b1)
    cdef const void *p_w2 = cnp.PyArray_DATA(<cnp.ndarray>w2)
    cdef const float *p_b2 = _fp(b2)
    cdef void *p_scratch = cnp.PyArray_DATA(<cnp.ndarray>scratch)
    cdef int nt = tokens, e_ = embed_dim, ea = aligned_embed_dim, h_ = num_heads
    cdef int da = aligned_head_dim, i_ = intermediate_dim, ia = aligned_intermediate_dim
    cdef int threads = _num_threads
    with nogil:
        _K.mlp_prefill(p_out, p_attn, p_in, p_res, p_g, p_wo, p_bo, o_dt, p_w1, p_b1, g_dt, p_w2,
                       p_b2, d_dt, nt, e_, ea, h_, da, i_, ia, eps, p_scratch, threads)


def mega_fused_outproj_mlp_prefill(output, attn_out, residual, ln2_gamma, wo, bo, wo_dt, w1,
                                   b1, w1_dt, w2, b2, w2_dt, tokens, embed_dim,
                                   aligned_embed_dim, num_heads, aligned_head_dim,
                                   intermediate_dim, aligned_intermediate_dim, float eps,
                                   scratch):
    """Everything after attention, for T tokens.

    h1 = attn @ wo.T + bo + residual (attn_out head-major [H, T, Da], as attention produces
    it); z = rmsnorm(h1, ln2_gamma); output = h1 + (silu(z @ Wg.T + bg) * (z @ Wu.T + bu))
    @ w2.T + b2.  w1 [2*Ia, Ea] holds the gate rows, then the up rows; w2 [Ea, Ia]; each weight
    in its own format.  Activations are quantized to Q8_0 (32-weight formats) or Q8_K
    (K-quants) for integer dot products; FP32/FP16/BF16 weights see float activations.
    residual and biases may be None; output may be residual itself.  scratch:
    mega_fused_outproj_mlp_prefill_scratch_size(...) bytes.
    """
    _mlp(output, attn_out, None, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2,
         w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
         intermediate_dim, aligned_intermediate_dim, eps, scratch, True)


def mega_fused_mlp_prefill(output, input, residual, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt,
                           tokens, embed_dim, aligned_embed_dim, intermediate_dim,
                           aligned_intermediate_dim, float eps, scratch):
    """The MLP block on token-major hidden states (a megafuse addition to the header):
    output = residual + (silu(z @ Wg.T + bg) * (z @ Wu.T + bu)) @ w2.T + b2 with
    z = rmsnorm(input, ln2_gamma).  The same kernel as mega_fused_outproj_mlp_prefill, so a
    whole layer is mega_fused_attention_prefill (or _decode) followed by this, usually with
    residual = input = output.  scratch: mega_fused_mlp_prefill_scratch_size(...) bytes.
    """
    _mlp(output, None, input, residual, ln2_gamma, None, None, 0, w1, b1, w1_dt, w2, b2, w2_dt,
         tokens, embed_dim, aligned_embed_dim, 0, 0, intermediate_dim, aligned_intermediate_dim,
         eps, scratch, False)


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


# --------------------------------------------------------------------------------------------
# ---- Block formats: quantize / dequantize (issue 3) ----
# --------------------------------------------------------------------------------------------
# The storage of each weight format (SPEC section 2) and the public quantize / dequantize; the
# kernels are megafuse/_quant.pxi over include/megafuse/mf_quant.h.  R = rows (the product of
# the leading dimensions), C = the last dimension, RB = ck_dtype_row_bytes(dtype, C).

cdef extern from "megafuse/mf_quant.h" nogil:
    size_t mf_activation_row_bytes(int dt, size_t n)

_Q_F32 = (np.dtype(np.float32),)
_Q_FP16 = (np.dtype(np.float16), np.dtype(np.uint16))
_Q_BF16 = (np.dtype(np.uint16),)
_Q_BLOCKS = (np.dtype(np.uint8),)


cdef tuple _q_storage(int dt):
    """The array dtypes that may hold weights of format dt."""
    if dt == 0:
        return _Q_F32
    if dt == 2:
        return _Q_FP16
    if dt == 1:
        return _Q_BF16
    return _Q_BLOCKS


cdef str _q_name(int dt):
    from megafuse._dtype import CKDataType as _E
    return _E(dt).name


cdef object _q_float_rows(object x, str name, int dt):
    """x: a float32 array whose last dimension is a positive multiple of dt's block size; returned
    C-contiguous and aligned (a copy when it is not)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of float32, got {type(x).__name__}")
    if x.dtype != np.dtype(np.float32):
        raise TypeError(f"{name}: expected dtype float32 (native byte order), got "
                        f"{x.dtype.str} ({x.dtype})")
    if x.ndim == 0:
        raise ValueError(f"{name}: expected an array with at least one dimension (the rows are "
                         f"its last one), got a 0-d array")
    cdef Py_ssize_t block = ck_dtype_block_size_c(dt)
    cdef Py_ssize_t cols = x.shape[x.ndim - 1]
    if cols <= 0 or cols % block:
        raise ValueError(f"{name}: expected a last dimension that is a positive multiple of the "
                         f"{_q_name(dt)} block size {block}, got {cols} (shape {x.shape})")
    if x.flags.c_contiguous and x.flags.aligned:
        return x
    return np.require(x, requirements=("C", "A"))


cdef tuple _q_shape(object shape, int dt):
    """`shape` as a tuple of ints: at least one dimension, none negative, the last a positive
    multiple of dt's block size."""
    if isinstance(shape, np.ndarray) and shape.ndim == 1:
        shape = tuple(shape.tolist())
    if hasattr(shape, "__index__") and not isinstance(shape, (bool, np.ndarray)):
        dims = (shape.__index__(),)
    elif isinstance(shape, np.ndarray):
        raise TypeError(f"shape: expected an int or a tuple of ints, got an array of shape "
                        f"{shape.shape}")
    else:
        try:
            items = tuple(shape)
        except TypeError:
            raise TypeError(f"shape: expected an int or a tuple of ints, got "
                            f"{type(shape).__name__}") from None
        for d in items:
            if not hasattr(d, "__index__") or isinstance(d, bool):
                raise TypeError(f"shape: expected a tuple of ints, got an element of type "
                                f"{type(d).__name__} in {shape!r}")
        dims = tuple(d.__index__() for d in items)
    if not dims:
        raise ValueError("shape: expected at least one dimension (the rows are the last one), "
                         "got ()")
    if any(d < 0 for d in dims):
        raise ValueError(f"shape: expected dimensions >= 0, got {dims}")
    block = ck_dtype_block_size_c(dt)
    last = dims[len(dims) - 1]              # (no negative indices: wraparound is off)
    if last <= 0 or last % block:
        raise ValueError(f"shape: expected a last dimension that is a positive multiple of the "
                         f"{_q_name(dt)} block size {block}, got {last} (shape {dims})")
    return dims


cdef object _q_blob(object blob, str name, int dt, Py_ssize_t rows, Py_ssize_t cols):
    """A weight blob of [rows, cols] in format dt (any shape, C-contiguous, right element or
    byte count, read-only fine); copied when its address does not suit its dtype."""
    cdef bint blocks = ck_dtype_block_size_c(dt) > 1
    cdef Py_ssize_t count = rows * <Py_ssize_t>ck_dtype_row_bytes_c(dt, cols) if blocks \
        else rows * cols
    if (isinstance(blob, np.ndarray) and blob.dtype in _q_storage(dt)
            and blob.flags.c_contiguous):
        if not blob.flags.aligned:
            blob = blob.copy()
        if blob.size == count:
            return blob                                   # the common case: no message built
    fmt = _q_name(dt)
    if blocks:
        rb = ck_dtype_row_bytes_c(dt, cols)
        _array(blob, name, _q_storage(dt), count,
               f"{rows} rows x {cols} columns in {fmt} = {rows} x {rb} bytes, a byte count of")
    else:
        _array(blob, name, _q_storage(dt), count,
               f"{rows} rows x {cols} columns of {fmt}, an element count of")
    return blob


def quantize(x, dtype):
    """Quantize float32 weights to a weight format, row by row (the last dimension is a row).

    x: a float32 array of any shape (C-contiguous or not, read-only is fine) whose last
    dimension C is a positive multiple of the format's block size (32 for Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0; 256 for Q4_K, Q5_K, Q6_K; 1 for FP32, FP16, BF16).
    dtype: a weight format (megafuse.CKDataType or its int value).

    Returns, for the block formats, a uint8 array of shape x.shape[:-1] + (RB,) with
    RB = ck_dtype_row_bytes(dtype, C): each row is C / block GGML blocks.  For FP16 a uint16 array
    of x.shape holding the float16 bits, for BF16 a uint16 array of x.shape holding the bfloat16
    bits, for FP32 a float32 copy of x.

    The bytes equal gguf.quants.quantize for every format gguf implements (Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0, F16, BF16); Q4_K, Q5_K, Q6_K follow GGML's quantize_row_q*_K_ref.  NaN / Inf in
    x are not errors.  Parallel over rows (and chunks of long rows); the GIL is released.
    """
    cdef int dt = _weight_dtype_arg(dtype, "dtype")
    x = _q_float_rows(x, "x", dt)
    cdef Py_ssize_t cols = x.shape[x.ndim - 1]
    cdef Py_ssize_t rows = x.size // cols
    if dt == 0:
        out = np.empty(x.shape, dtype=np.float32)
    elif dt in (1, 2):
        out = np.empty(x.shape, dtype=np.uint16)
    else:
        out = np.empty(x.shape[:x.ndim - 1] + (ck_dtype_row_bytes_c(dt, cols),),
                       dtype=np.uint8)
    cdef const float *px = <const float *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void *pout = cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int nt = _num_threads
    with nogil:
        _K.quantize_rows(px, pout, rows, cols, dt, nt)
    return out


def dequantize(blob, dtype, shape):
    """The float32 weights held in `blob`, as an array of `shape`.

    dtype: the weight format of blob.  shape: the shape of the weights (an int or a tuple; the
    last dimension C is a row and a positive multiple of the format's block size).
    blob: a C-contiguous array (any shape; a read-only memmap is fine) holding R rows of C weights,
    R the product of shape[:-1]: uint8 with R * ck_dtype_row_bytes(dtype, C) bytes for the block
    formats; float16 or uint16 (fp16 bits) for FP16, uint16 (bfloat16 bits) for BF16, float32 for
    FP32, with R * C elements.

    Bit-exact with gguf.quants.dequantize (GGML's dequantize_row_*).  Parallel over rows; the GIL
    is released.
    """
    cdef int dt = _weight_dtype_arg(dtype, "dtype")
    dims = _q_shape(shape, dt)
    cdef Py_ssize_t cols = dims[len(dims) - 1]
    rows_py = 1
    for d in dims[:len(dims) - 1]:
        rows_py *= d
    cdef Py_ssize_t rows = rows_py
    blob = _q_blob(blob, "blob", dt, rows, cols)
    out = np.empty(dims, dtype=np.float32)
    cdef const void *pb = cnp.PyArray_DATA(<cnp.ndarray>blob)
    cdef float *pout = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int nt = _num_threads
    with nogil:
        _K.dequantize_rows(pb, pout, rows, cols, dt, nt)
    return out


def _row_dot(w_row_blob, dtype, x, quantized_activations=False):
    """Testing hook: one weight row dotted with float32 activations x (n = x.size values).

    quantized_activations=False: the float path (the weights decoded in registers, x as is);
    True: the int8 path (x quantized to Q8_0 for the 32-weight formats, Q8_K for the K-quants, then
    GGML's integer dot; FP32/FP16/BF16 stay float).  w_row_blob: one row of n weights stored as
    dequantize expects.  Returns a Python float.
    """
    return float(_rows_dot(w_row_blob, dtype, x, quantized_activations, 1)[0])


def _rows_dot(w_blob, dtype, x, quantized_activations=False, rows=None):
    """Testing / benchmark hook: out[r] = w[r] . x for every row of a weight matrix w_blob of
    `rows` rows (default: as many whole rows of x.size weights as it holds), by the float or the
    int8 path (see _row_dot).  Parallel over rows.  Returns float32 [rows]."""
    cdef int dt = _weight_dtype_arg(dtype, "dtype")
    x = _q_float_rows(x, "x", dt)
    if x.ndim != 1:
        x = x.reshape(-1)
    cdef Py_ssize_t n = x.size
    cdef Py_ssize_t rb = ck_dtype_row_bytes_c(dt, n)
    if rows is None:
        if not isinstance(w_blob, np.ndarray):
            raise TypeError(f"w_blob: expected a numpy.ndarray, got {type(w_blob).__name__}")
        rows = max(1, w_blob.nbytes // rb)
    _positive(rows, "rows")
    cdef Py_ssize_t R = rows
    w_blob = _q_blob(w_blob, "w_row_blob" if R == 1 else "w_blob", dt, R, n)
    cdef int quantized = 1 if quantized_activations else 0
    scratch = np.empty(max(1, <Py_ssize_t>mf_activation_row_bytes(dt, n)), dtype=np.uint8)
    out = np.empty(R, dtype=np.float32)
    cdef const void *pw = cnp.PyArray_DATA(<cnp.ndarray>w_blob)
    cdef const float *px = <const float *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void *ps = cnp.PyArray_DATA(<cnp.ndarray>scratch)
    cdef float *po = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int nt = _num_threads
    with nogil:
        _K.row_dot(pw, dt, px, R, n, quantized, ps, po, nt)
    return out


def _quantize_activations(x, dtype):
    """Testing hook: the activation rows the int8 path makes from float32 rows x (last dimension
    C) for weights of format dtype -- Q8_0 blocks (32-weight formats), Q8_K blocks (K-quants) or
    the float32 bytes (FP32/FP16/BF16) -- as a uint8 array of shape x.shape[:-1] + (row bytes,)."""
    cdef int dt = _weight_dtype_arg(dtype, "dtype")
    x = _q_float_rows(x, "x", dt)
    cdef Py_ssize_t cols = x.shape[x.ndim - 1]
    cdef Py_ssize_t rows = x.size // cols
    out = np.empty(x.shape[:x.ndim - 1] + (<Py_ssize_t>mf_activation_row_bytes(dt, cols),),
                   dtype=np.uint8)
    cdef const float *px = <const float *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void *pout = cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int nt = _num_threads
    with nogil:
        _K.quantize_activations(px, pout, rows, cols, dt, nt)
    return out


# --------------------------------------------------------------------------------------------
# The whole-model step (megafuse.Model, megafuse.DecoderLayer)
# --------------------------------------------------------------------------------------------

include "_model_api.pxi"
