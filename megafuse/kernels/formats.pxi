# The format API (included by megafuse/_kernels.pyx): quantize / dequantize of the weight formats
# of docs/contract.md §2, and the test hooks of the format layer (_row_dot, _rows_dot,
# _quantize_activations).  The kernels are kernels/levels/quant.pxi over
# include/megafuse/mf_quant.h.
# R = rows (the product of the leading dimensions), C = the last dimension,
# RB = ck_dtype_row_bytes(dtype, C).

from megafuse.kernels.mf_quant cimport mf_activation_row_bytes


cdef object _float_rows(object x, str name, int dt):
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
    cdef Py_ssize_t block = ckdt.ck_dtype_block_size(dt)
    cdef Py_ssize_t cols = x.shape[x.ndim - 1]
    if cols <= 0 or cols % block:
        raise ValueError(f"{name}: expected a last dimension that is a positive multiple of the "
                         f"{_dtype_name(dt)} block size {block}, got {cols} (shape {x.shape})")
    if x.flags.c_contiguous and x.flags.aligned:
        return x
    return np.require(x, requirements=("C", "A"))


cdef tuple _shape_arg(object shape, int dt):
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
    block = ckdt.ck_dtype_block_size(dt)
    last = dims[len(dims) - 1]              # (no negative indices: wraparound is off)
    if last <= 0 or last % block:
        raise ValueError(f"shape: expected a last dimension that is a positive multiple of the "
                         f"{_dtype_name(dt)} block size {block}, got {last} (shape {dims})")
    return dims


cdef object _weight_blob(object blob, str name, int dt, Py_ssize_t rows, Py_ssize_t cols):
    """A weight blob of [rows, cols] in format dt, checked as every weight argument is
    (_weight_array: any shape, C-contiguous, right element or byte count, read-only fine), except
    that an array whose address does not suit its dtype is copied instead of refused."""
    if (isinstance(blob, np.ndarray) and blob.dtype in _storage_dtypes(dt)
            and blob.flags.c_contiguous and not blob.flags.aligned):
        blob = blob.copy()
    _weight_array(blob, name, dt, rows, cols, f"[{rows}, {cols}]")
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

    Kernel: megafuse/kernels/levels/quant.pxi (quantize_kernel), include/megafuse/mf_quant.h.
    """
    cdef int dt = _weight_dtype_arg(dtype, "dtype")
    x = _float_rows(x, "x", dt)
    cdef Py_ssize_t cols = x.shape[x.ndim - 1]
    cdef Py_ssize_t rows = x.size // cols
    if dt == ckdt.CK_DT_FP32:
        out = np.empty(x.shape, dtype=np.float32)
    elif dt == ckdt.CK_DT_FP16 or dt == ckdt.CK_DT_BF16:
        out = np.empty(x.shape, dtype=np.uint16)
    else:
        out = np.empty(x.shape[:x.ndim - 1] + (ckdt.ck_dtype_row_bytes(dt, cols),),
                       dtype=np.uint8)
    cdef const float *px = <const float *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void *pout = cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int nt = _num_threads
    with nogil:
        _K.quantize(px, pout, rows, cols, dt, nt)
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

    Kernel: megafuse/kernels/levels/quant.pxi (dequantize_kernel), include/megafuse/mf_quant.h.
    """
    cdef int dt = _weight_dtype_arg(dtype, "dtype")
    dims = _shape_arg(shape, dt)
    cdef Py_ssize_t cols = dims[len(dims) - 1]
    rows_py = 1
    for d in dims[:len(dims) - 1]:
        rows_py *= d
    if rows_py * cols > PY_SSIZE_T_MAX // sizeof(float):     # (Python ints: exact)
        raise ValueError(f"shape: {dims} = {rows_py} x {cols} weights overflows a 64-bit size "
                         f"(expected dimensions whose product fits)")
    cdef Py_ssize_t rows = rows_py
    blob = _weight_blob(blob, "blob", dt, rows, cols)
    out = np.empty(dims, dtype=np.float32)
    cdef const void *pb = cnp.PyArray_DATA(<cnp.ndarray>blob)
    cdef float *pout = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int nt = _num_threads
    with nogil:
        _K.dequantize(pb, pout, rows, cols, dt, nt)
    return out


def _row_dot(w_row_blob, dtype, x, quantized_activations=False):
    """Testing hook: one weight row dotted with float32 activations x (n = x.size values).

    quantized_activations=False: the float path (the weights decoded in registers, x as is);
    True: the int8 path (x quantized to Q8_0 for the 32-weight formats, Q8_K for the K-quants, then
    GGML's integer dot; FP32/FP16/BF16 stay float).  w_row_blob: one row of n weights stored as
    dequantize expects.  Returns a Python float.

    Kernel: megafuse/kernels/levels/quant.pxi (rows_dot_kernel), include/megafuse/mf_quant.h.
    """
    return float(_rows_dot(w_row_blob, dtype, x, quantized_activations, 1)[0])


def _rows_dot(w_blob, dtype, x, quantized_activations=False, rows=None):
    """Testing / benchmark hook: out[r] = w[r] . x for every row of a weight matrix w_blob of
    `rows` rows (default: as many whole rows of x.size weights as it holds), by the float or the
    int8 path (see _row_dot).  Parallel over rows.  Returns float32 [rows].

    Kernel: megafuse/kernels/levels/quant.pxi (rows_dot_kernel), include/megafuse/mf_quant.h.
    """
    cdef int dt = _weight_dtype_arg(dtype, "dtype")
    x = _float_rows(x, "x", dt)
    if x.ndim != 1:
        x = x.reshape(-1)
    cdef Py_ssize_t n = x.size
    cdef Py_ssize_t rb = ckdt.ck_dtype_row_bytes(dt, n)
    if rows is None:
        if not isinstance(w_blob, np.ndarray):
            raise TypeError(f"w_blob: expected a numpy.ndarray, got {type(w_blob).__name__}")
        rows = max(1, w_blob.nbytes // rb)
    if rows > PY_SSIZE_T_MAX:
        raise ValueError(f"rows: expected a count below 2**63, got {rows}")
    _positive(rows, "rows")
    cdef Py_ssize_t R = rows
    w_blob = _weight_blob(w_blob, "w_row_blob" if R == 1 else "w_blob", dt, R, n)
    cdef int quantized = 1 if quantized_activations else 0
    scratch = np.empty(max(1, <Py_ssize_t>mf_activation_row_bytes(dt, n)), dtype=np.uint8)
    out = np.empty(R, dtype=np.float32)
    cdef const void *pw = cnp.PyArray_DATA(<cnp.ndarray>w_blob)
    cdef const float *px = <const float *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void *ps = cnp.PyArray_DATA(<cnp.ndarray>scratch)
    cdef float *po = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int nt = _num_threads
    with nogil:
        _K.rows_dot(pw, dt, px, R, n, quantized, ps, po, nt)
    return out


def _quantize_activations(x, dtype):
    """Testing hook: the activation rows the int8 path makes from float32 rows x (last dimension
    C) for weights of format dtype -- Q8_0 blocks (32-weight formats), Q8_K blocks (K-quants) or
    the float32 bytes (FP32/FP16/BF16) -- as a uint8 array of shape x.shape[:-1] + (row bytes,).

    Kernel: kernels/levels/quant.pxi (quantize_activations_kernel), include/megafuse/mf_quant.h.
    """
    cdef int dt = _weight_dtype_arg(dtype, "dtype")
    x = _float_rows(x, "x", dt)
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
