# The checks of the boundary (included by megafuse/_kernels.pyx): every rule of
# docs/contract.md §5 that more than one def applies, as small functions that raise on the
# first problem.  Each message names the parameter, says what was expected and what was got.
# The common path (a valid call) runs at C level; messages are built only on failure.


# ---- scalar arguments --------------------------------------------------------------------------

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


def _dtype_names(tuple dtypes):
    return " or ".join(str(d) for d in dtypes)


cdef object _array(object arr, str name, tuple dtypes, Py_ssize_t count, str shape,
                   bint writeable=False, bint at_least=False):
    """arr, checked: an ndarray of one of `dtypes`, C-contiguous, aligned, of `count` elements
    (at least `count` when at_least), writeable when asked.  `shape` spells the expected shape."""
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
    cdef int value = _weight_dtype_arg(dt, name + "_dt")
    _weight_array(arr, name, value, rows, cols, shape)
    return value


cdef int _weight_array(object arr, str name, int dt, Py_ssize_t rows, Py_ssize_t cols,
                       str shape) except -1:
    """A weight of [rows, cols] in format dt (a value _weight_dtype_arg accepted): its storage
    dtype (_storage_dtypes), C-contiguous, aligned, holding exactly rows whole rows (element
    count for FP32/FP16/BF16, byte count for the block formats).  `shape` spells [rows, cols]."""
    cdef Py_ssize_t block = ckdt.ck_dtype_block_size(dt)
    cdef Py_ssize_t row_bytes
    if cols % block:
        raise ValueError(f"{name}: {_dtype_name(dt)} stores rows in whole blocks of {block} "
                         f"weights, but {shape} has {cols} columns")
    if block == 1:
        _array(arr, name, _storage_dtypes(dt), rows * cols, shape)
        return 0
    row_bytes = ckdt.ck_dtype_row_bytes(dt, cols)
    try:
        _array(arr, name, _BLOCK_ARRAYS, rows * row_bytes, "")
    except ValueError as e:
        if "elements" not in str(e):
            raise
        raise ValueError(f"{name}: expected {shape} in {_dtype_name(dt)} = {rows} rows of "
                         f"{row_bytes} bytes = {rows * row_bytes} bytes, got "
                         f"{arr.nbytes} bytes (shape {arr.shape})") from None
    return 0


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


# ---- buffers that must not overlap --------------------------------------------------------------

cdef enum:
    MAX_BUFFERS = 32


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
