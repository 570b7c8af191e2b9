# The checks of the boundary (included by megafuse/_kernels.pyx): every rule of
# docs/contract.md §5 that more than one def applies, as small functions that raise on the
# first problem.  Each message names the parameter, says what was expected and what was got.
# The common path (a valid call) runs at C level; messages are built only on failure.
#
# Fast paths: each check first tests its rule in C on the argument as it is now (type, flags,
# dtype number, element count, address) and returns at once when it holds; only an argument it
# refuses goes on to the Python-level code below it, which finds the problem again and names it.
# Nothing is remembered between calls: every call checks every argument afresh, so an array that
# was swapped, resized, made read-only or freed since the last call is caught like any other.
#
# Sizes: every element or byte count a check computes is a product of dimensions, and every
# product is checked (_mul, _count): past PY_SSIZE_T_MAX -- which no array can reach -- it is a
# ValueError naming the parameters, so a count can never wrap around to match a small buffer.
# The scratch layouts of include/megafuse/mf_scratch.h compute in unchecked size_t: they are
# only called once a bound of their total is proven to fit (_prefill_scratch_bound,
# _mlp_scratch_bound).


from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.long cimport PyLong_Check, PyLong_CheckExact, PyLong_AsLongLongAndOverflow
from cpython.bool cimport PyBool_Check
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_GET_ITEM
from cpython.ref cimport PyObject

from megafuse.kernels cimport mf_scratch as scr


# ---- sizes -------------------------------------------------------------------------------------

cdef inline Py_ssize_t _mul(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """a * b for a, b >= 0; -1 when it passes PY_SSIZE_T_MAX (and for a -1 factor: chains)."""
    if a < 0 or b < 0 or (b != 0 and a > PY_SSIZE_T_MAX // b):
        return -1
    return a * b


cdef Py_ssize_t _count(str name, str shape, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c=1,
                       Py_ssize_t d=1) except -1:
    """a * b * c * d (factors >= 0): the element or byte count of `name`, whose `shape` spells
    the product in parameters.  ValueError when it passes PY_SSIZE_T_MAX."""
    cdef Py_ssize_t n = _mul(_mul(_mul(a, b), c), d)
    if n < 0:
        given = [a, b] + ([c] if c != 1 or d != 1 else []) + ([d] if d != 1 else [])
        factors = " x ".join(str(f) for f in given)
        raise ValueError(f"{name}: {shape} = {factors} overflows a 64-bit size (expected "
                         f"dimensions whose product fits)")
    return n


cdef Py_ssize_t _bytes_per_value(int dt) noexcept nogil:
    """Bytes a value of format dt takes, rounded up: block bytes / block size."""
    cdef Py_ssize_t block = ckdt.ck_dtype_block_size(dt)
    return (<Py_ssize_t>ckdt.ck_dtype_block_bytes(dt) + block - 1) // block


# bytes a value of an int8-path activation row takes at most (a Q8_0 or a Q8_K row)
cdef Py_ssize_t _ACT_BYTES = max(_bytes_per_value(ckdt.CK_DT_Q8_0),
                                 _bytes_per_value(ckdt.CK_DT_Q8_K))


cdef Py_ssize_t _prefill_scratch_bound(Py_ssize_t T, Py_ssize_t Ea, Py_ssize_t HDa) noexcept nogil:
    """A bound of mf_prefill_scratch_layout(T, Ea, H, Da, *).total for HDa = H * Da, or -1 when
    the bound passes PY_SSIZE_T_MAX.  The layout (include/megafuse/mf_scratch.h): regions A
    [T, H*Da] and B [T, max(Ea, H*Da)] of float32, region C, a Q8_0 and a Q8_K row of Ea values
    a token, and (T = 1) region D, [H*Da] float32, each starting at a multiple of 64; every size
    it computes on the way is at most its total, so when this bound fits its size_t arithmetic
    cannot wrap."""
    cdef Py_ssize_t widest = Ea if Ea > HDa else HDa
    cdef Py_ssize_t n = _mul(_mul(T, widest), 3 * <Py_ssize_t>sizeof(float) + 2 * _ACT_BYTES)
    return -1 if n < 0 or n > PY_SSIZE_T_MAX - 256 else n + 256


cdef Py_ssize_t _mlp_scratch_bound(Py_ssize_t T, Py_ssize_t Ea, Py_ssize_t HDa,
                                   Py_ssize_t Ia) noexcept nogil:
    """A bound of mf_mlp_scratch_layout(T, Ea, HDa, Ia).total, or -1 when it passes
    PY_SSIZE_T_MAX.  The layout: per tile of min(T, MF_MLP_TOKEN_TILE) tokens, region F
    [tile, max(HDa, Ea)] and region A [tile, Ia] of float32, regions Q and AQ the same rows
    quantized, each starting at a multiple of 64."""
    cdef Py_ssize_t tile = T if T < scr.MF_MLP_TOKEN_TILE else scr.MF_MLP_TOKEN_TILE
    cdef Py_ssize_t widest = Ea if Ea > HDa else HDa
    cdef Py_ssize_t n = _mul(_mul(tile, widest + Ia), <Py_ssize_t>sizeof(float) + _ACT_BYTES)
    return -1 if n < 0 or n > PY_SSIZE_T_MAX - 256 else n + 256


cdef Py_ssize_t _prefill_scratch_total(Py_ssize_t T, Py_ssize_t Ea, Py_ssize_t H, Py_ssize_t Da,
                                       bint int8_path) except -1:
    """mf_prefill_scratch_layout(...).total, once its bound is proven to fit (else ValueError
    naming the parameters)."""
    cdef Py_ssize_t HDa = _count("num_heads*aligned_head_dim", "num_heads x aligned_head_dim",
                                 H, Da)
    if _prefill_scratch_bound(T, Ea, HDa) < 0:
        raise ValueError(f"tokens, aligned_embed_dim, num_heads, aligned_head_dim: the scratch of "
                         f"{T} tokens x max({Ea}, {H} x {Da}) values a row overflows a 64-bit "
                         f"size (expected dimensions whose product fits)")
    return scr.mf_prefill_scratch_layout(T, Ea, H, Da, int8_path).total


cdef Py_ssize_t _mlp_scratch_total(Py_ssize_t T, Py_ssize_t Ea, Py_ssize_t HDa,
                                   Py_ssize_t Ia) except -1:
    """mf_mlp_scratch_layout(...).total, once its bound is proven to fit (else ValueError)."""
    if _mlp_scratch_bound(T, Ea, HDa, Ia) < 0:
        raise ValueError(f"tokens, aligned_embed_dim, num_heads, aligned_head_dim, "
                         f"aligned_intermediate_dim: the scratch of a tile of "
                         f"min({T}, {scr.MF_MLP_TOKEN_TILE}) tokens x (max({Ea}, {HDa}) + {Ia}) "
                         f"values overflows a 64-bit size (expected dimensions whose product "
                         f"fits)")
    return scr.mf_mlp_scratch_layout(T, Ea, HDa, Ia).total


# ---- scalar arguments --------------------------------------------------------------------------

cdef object _int_arg(object value, str name):
    """An int argument of the C signature: any integer (not a float: TypeError), within the
    range of a C int (else OverflowError)."""
    cdef int overflow = 0
    cdef long long v
    if PyLong_CheckExact(value):                  # fast path: a plain int in range
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow and -2147483648 <= v <= 2147483647:
            return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    value = value.__index__()
    if not -2**31 <= value < 2**31:
        raise OverflowError(f"{name}: expected a value in the range of a C int, got {value}")
    return value


cdef object _size_arg(object value, str name):
    """A size_t argument: a non-negative integer below 2**64 (else OverflowError)."""
    cdef int overflow = 0
    if PyLong_CheckExact(value) and PyLong_AsLongLongAndOverflow(value, &overflow) >= 0 \
            and not overflow:                     # fast path: a plain int in 0 .. 2**63-1
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    value = value.__index__()
    if not 0 <= value < 2**64:
        raise OverflowError(f"{name}: expected a value in the range of a C size_t, got {value}")
    return value


cdef inline void _positive(long long value, str name) except *:
    if value <= 0:
        raise ValueError(f"{name}: expected a positive value, got {value}")


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


# ---- arrays ------------------------------------------------------------------------------------

cdef inline Py_ssize_t _addr(object arr):
    return <Py_ssize_t>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef inline const float *_fp(object arr):
    """The data of a checked float32 array, NULL for None."""
    return NULL if arr is None else <const float *>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef inline float *_wp(object arr):
    """The data of a checked, writeable float32 array."""
    return <float *>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef inline bint _dtype_ok(cnp.ndarray a, tuple dtypes):
    cdef int tn = cnp.PyArray_TYPE(a)
    cdef cnp.dtype d
    if cnp.PyArray_ISBYTESWAPPED(a):
        return False
    for d in dtypes:
        if d.type_num == tn:
            return True
    return False


cdef inline bint _array_ok(object arr, tuple dtypes, Py_ssize_t count, bint writeable,
                           bint at_least):
    """Whether _array accepts arr, decided in C (its fast path): an ndarray of one of `dtypes`
    in native byte order, C-contiguous, aligned, writeable when asked, of `count` elements (at
    least `count` when at_least)."""
    cdef int need = cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED
    cdef Py_ssize_t size
    if not cnp.PyArray_Check(arr):
        return False
    if writeable:
        need |= cnp.NPY_ARRAY_WRITEABLE
    if (cnp.PyArray_FLAGS(<cnp.ndarray>arr) & need) != need:
        return False
    size = cnp.PyArray_SIZE(<cnp.ndarray>arr)
    if size != count and not (at_least and size > count):
        return False
    return _dtype_ok(<cnp.ndarray>arr, dtypes)


def _dtype_names(tuple dtypes):
    return " or ".join(str(d) for d in dtypes)


cdef object _array(object arr, str name, tuple dtypes, Py_ssize_t count, str shape,
                   bint writeable=False, bint at_least=False):
    """arr, checked: an ndarray of one of `dtypes`, C-contiguous, aligned, of `count` elements
    (at least `count` when at_least), writeable when asked.  `shape` spells the expected shape."""
    if _array_ok(arr, dtypes, count, writeable, at_least):
        return arr
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


cdef object _optional(object arr, str name, tuple dtypes, Py_ssize_t count, str shape):
    return None if arr is None else _array(arr, name, dtypes, count, shape)


cdef int _weight(object arr, str name, object dt, Py_ssize_t rows, Py_ssize_t cols,
                 str shape) except -1:
    """Check a `const void *w, CKDataType w_dt` pair: a weight of [rows, cols] in format dt.
    Returns the format's value."""
    cdef int overflow = 0
    cdef long long v = -1
    cdef int value
    if PyLong_Check(dt) and not PyBool_Check(dt):    # fast path: no message name is built
        v = PyLong_AsLongLongAndOverflow(dt, &overflow)
    if (not overflow and 0 <= v < ckdt.CK_DT_COUNT
            and ckdt.ck_dtype_supported(ckdt.CK_DT_WEIGHT_FORMATS, <int>v)):
        value = <int>v
    else:
        value = _weight_dtype_arg(dt, name + "_dt")
    _weight_array(arr, name, value, rows, cols, shape)
    return value


cdef int _weight_array(object arr, str name, int dt, Py_ssize_t rows, Py_ssize_t cols,
                       str shape) except -1:
    """A weight of [rows, cols] in format dt (a value _weight_dtype_arg accepted): its storage
    dtype (_storage_dtypes), C-contiguous, aligned, holding exactly rows whole rows (element
    count for FP32/FP16/BF16, byte count for the block formats).  `shape` spells [rows, cols]."""
    cdef Py_ssize_t block = ckdt.ck_dtype_block_size(dt)
    cdef Py_ssize_t row_bytes, count
    if cols % block:
        raise ValueError(f"{name}: {_dtype_name(dt)} stores rows in whole blocks of {block} "
                         f"weights, but {shape} has {cols} columns")
    if block == 1:
        _array(arr, name, _storage_dtypes(dt), _count(name, shape, rows, cols), shape)
        return 0
    if _mul(cols, _bytes_per_value(dt)) < 0:      # a row's bytes, before ck_dtype_row_bytes
        _count(name, f"{shape} in {_dtype_name(dt)} (columns x bytes a weight)", cols,
               _bytes_per_value(dt))
    row_bytes = ckdt.ck_dtype_row_bytes(dt, cols)
    count = _mul(rows, row_bytes)
    if count < 0:
        _count(name, f"{shape} in {_dtype_name(dt)} (rows x bytes a row)", rows, row_bytes)
    try:
        _array(arr, name, _BLOCK_ARRAYS, count, "")
    except ValueError as e:
        if "elements" not in str(e):
            raise
        raise ValueError(f"{name}: expected {shape} in {_dtype_name(dt)} = {rows} rows of "
                         f"{row_bytes} bytes = {rows * row_bytes} bytes, got "
                         f"{arr.nbytes} bytes (shape {arr.shape})") from None
    return 0


cdef object _scratch(object scratch, Py_ssize_t need, str name="scratch"):
    """Any-dtype, C-contiguous, writeable, 4-byte aligned, at least `need` bytes."""
    cdef int flags = cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_WRITEABLE
    if (cnp.PyArray_Check(scratch)
            and (cnp.PyArray_FLAGS(<cnp.ndarray>scratch) & flags) == flags
            and cnp.PyArray_NBYTES(<cnp.ndarray>scratch) >= need and _addr(scratch) % 4 == 0):
        return scratch                            # fast path
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


cdef object _rope_tables(object rope_cos, object rope_sin, Py_ssize_t D, Py_ssize_t last_pos,
                         Py_ssize_t max_seq=0):
    """Check the RoPE tables (both or neither; whole rows of D/2 covering last_pos, and at least
    max_seq rows when the function has a max_seq: a [max_seq, D/2] table whatever pos is)."""
    cdef Py_ssize_t half, n_cos, n_sin
    if rope_cos is None and rope_sin is None:
        return
    if (rope_cos is not None and rope_sin is not None and D % 2 == 0
            and _array_ok(rope_cos, _F32, 0, False, True)
            and _array_ok(rope_sin, _F32, 0, False, True)):   # fast path, in C
        half = D // 2
        n_cos = cnp.PyArray_SIZE(<cnp.ndarray>rope_cos)
        n_sin = cnp.PyArray_SIZE(<cnp.ndarray>rope_sin)
        if (half > 0 and n_cos % half == 0 and n_sin % half == 0
                and n_cos // half >= max_seq and n_sin // half >= max_seq
                and n_cos // half > last_pos and n_sin // half > last_pos):
            return
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
        if rows < max_seq:
            raise ValueError(f"{name}: expected [max_seq, head_dim/2] = {max_seq} rows of "
                             f"{D // 2} values (at least), got {rows} rows")
        if rows <= last_pos:
            raise ValueError(f"{name}: expected a table covering position {last_pos} (at least "
                             f"{last_pos + 1} rows of {D // 2}), got {rows} rows")


# ---- buffers that must not overlap --------------------------------------------------------------

cdef enum:
    MAX_BUFFERS = 32


cdef object _no_overlap_flat(tuple names, tuple arrays, Py_ssize_t n_written,
                             tuple may_alias=()):
    """_no_overlap for arrays[i] named names[i], the first n_written of them written: the same
    rule, decided in C without building (name, array) pairs; on a hit that is not an allowed
    alias, _no_overlap itself names the buffers.  `names` is a constant tuple of the call site."""
    cdef Py_ssize_t lo[MAX_BUFFERS]
    cdef Py_ssize_t hi[MAX_BUFFERS]
    cdef Py_ssize_t idx[MAX_BUFFERS]       # position in names / arrays
    cdef Py_ssize_t n = 0, i, j, k, a, b, total = PyTuple_GET_SIZE(arrays)
    cdef PyObject *arr
    for k in range(total):
        arr = PyTuple_GET_ITEM(arrays, k)
        if <object>arr is None:
            continue
        lo[n] = _addr(<object>arr)
        hi[n] = lo[n] + cnp.PyArray_NBYTES(<cnp.ndarray>arr)
        idx[n] = k
        n += 1
    for i in range(n):
        for j in range(i + 1, n):
            a, b = idx[i], idx[j]
            if not (a < n_written or b < n_written) or lo[i] >= hi[j] or lo[j] >= hi[i]:
                continue
            if lo[i] == lo[j] and hi[i] == hi[j] and (
                    (names[a] == "output" and names[b] in may_alias) or
                    (names[b] == "output" and names[a] in may_alias)):
                continue
            _no_overlap(tuple(zip(names[:n_written], arrays[:n_written])),
                        tuple(zip(names[n_written:], arrays[n_written:])), may_alias)


cdef object _no_overlap(tuple written, tuple read, tuple may_alias=()):
    """No written buffer may overlap another buffer, except `output` being exactly one of the
    buffers named in may_alias (an in-place update, docs/contract.md §4).  (name, array) pairs;
    None arrays are skipped.  The interval test runs in C; names are looked at only on a hit."""
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
