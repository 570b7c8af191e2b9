# Data types at the boundary (included by megafuse/_kernels.pyx): the helpers of
# include/megafuse/ckernel_dtype.h callable from Python, how a CKDataType argument is read, and
# which NumPy dtypes may hold a weight of each format (docs/contract.md §2).  One table of
# storage dtypes and one name lookup serve every check (the kernels' weight arguments and the
# format API alike).

from megafuse cimport _ckernel_dtype as ckdt

from megafuse.kernels.dtype import CKDataType as _CKDataType

# NumPy dtypes that may hold each kind of buffer
_F32 = (np.dtype(np.float32),)                          # activations, caches, biases, FP32
_KV_CACHE = (np.dtype(np.float32), np.dtype(np.float16))   # a model's KV caches
_FP16_ARRAYS = (np.dtype(np.float16), np.dtype(np.uint16))   # FP16 values or their bits
_BF16_ARRAYS = (np.dtype(np.uint16),)                   # bfloat16 bits
_BLOCK_ARRAYS = (np.dtype(np.uint8),)                   # the bytes of GGML blocks


# megafuse.CKDataType is defined once, in Python (kernels/dtype.py: the reference imports it
# without the compiled modules); here, at import, it is held against the header's enum.
_HEADER_DTYPES = {
    "FP32": ckdt.CK_DT_FP32, "BF16": ckdt.CK_DT_BF16, "FP16": ckdt.CK_DT_FP16,
    "INT8": ckdt.CK_DT_INT8, "INT4": ckdt.CK_DT_INT4, "Q4_0": ckdt.CK_DT_Q4_0,
    "Q4_1": ckdt.CK_DT_Q4_1, "Q4_K": ckdt.CK_DT_Q4_K, "Q6_K": ckdt.CK_DT_Q6_K,
    "Q8_0": ckdt.CK_DT_Q8_0, "Q8_K": ckdt.CK_DT_Q8_K, "Q5_0": ckdt.CK_DT_Q5_0,
    "Q5_1": ckdt.CK_DT_Q5_1, "Q5_K": ckdt.CK_DT_Q5_K, "Q2_K": ckdt.CK_DT_Q2_K,
    "Q3_K": ckdt.CK_DT_Q3_K, "IQ4_NL": ckdt.CK_DT_IQ4_NL, "IQ4_XS": ckdt.CK_DT_IQ4_XS,
    "COUNT": ckdt.CK_DT_COUNT,
}
if {m.name: int(m) for m in _CKDataType} != _HEADER_DTYPES:
    raise ImportError(f"kernels/dtype.py: CKDataType {dict(_CKDataType.__members__)} differs "
                      f"from include/megafuse/ckernel_dtype.h {_HEADER_DTYPES}")


cdef tuple _storage_dtypes(int dt):
    """The NumPy dtypes that may hold weights of format dt."""
    if dt == ckdt.CK_DT_FP32:
        return _F32
    if dt == ckdt.CK_DT_FP16:
        return _FP16_ARRAYS
    if dt == ckdt.CK_DT_BF16:
        return _BF16_ARRAYS
    return _BLOCK_ARRAYS


def _weight_storage(dt):
    """The NumPy dtypes that may hold weights of format dt (megafuse.llm.layer checks a layer's
    weights with this table when it is built)."""
    return _storage_dtypes(_weight_dtype_arg(dt, "dt"))


cdef str _dtype_name(int dt):
    """The name of a CKDataType value ("Q8_0"), for messages."""
    return _CKDataType(dt).name


cdef int _dtype_arg(object dt, str name) except -1:
    """A CKDataType argument (the IntEnum or a plain int) as its value; any enum member is fine
    here (COUNT excluded): callers that need a weight format check that separately."""
    cdef int overflow = 0
    cdef long long v
    if PyLong_Check(dt) and not PyBool_Check(dt):    # fast path: an int or an IntEnum member
        v = PyLong_AsLongLongAndOverflow(dt, &overflow)
        if not overflow and 0 <= v < ckdt.CK_DT_COUNT:
            return <int>v
    if isinstance(dt, (bool, float)) or not hasattr(dt, "__index__"):
        raise TypeError(f"{name}: expected a megafuse.CKDataType or an int, got "
                        f"{type(dt).__name__}")
    value = dt.__index__()
    if not 0 <= value < ckdt.CK_DT_COUNT:
        raise ValueError(f"{name}: expected a CKDataType value in 0..{ckdt.CK_DT_COUNT - 1}, "
                         f"got {value}")
    return value


cdef int _weight_dtype_arg(object dt, str name) except -1:
    """A CKDataType that is a weight format (docs/contract.md §2)."""
    cdef int value = _dtype_arg(dt, name)
    if not ckdt.ck_dtype_supported(ckdt.CK_DT_WEIGHT_FORMATS, value):
        raise ValueError(f"{name}: expected a weight format (FP32, FP16, BF16, Q4_0, Q4_1, "
                         f"Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS), got "
                         f"{_dtype_name(value)}")
    return value


def CK_DT_MASK(dt):
    """The bit of dtype dt in a CKDataTypeMask: 1 << dt.

    Kernel: none; include/megafuse/ckernel_dtype.h (CK_DT_MASK).
    """
    return ckdt.CK_DT_MASK(_dtype_arg(dt, "dt"))


def ck_dtype_is_quantized(dt):
    """True for the block formats (Q4_0 ... Q8_K), whose scales live inside each block.

    Kernel: none; include/megafuse/ckernel_dtype.h (ck_dtype_is_quantized).
    """
    return bool(ckdt.ck_dtype_is_quantized(_dtype_arg(dt, "dt")))


def ck_dtype_bytes(dt):
    """Bytes of one storage element: 4 (FP32), 2 (FP16, BF16), 1 (INT8; INT4 and the block
    formats, stored in uint8 arrays).

    Kernel: none; include/megafuse/ckernel_dtype.h (ck_dtype_bytes).
    """
    return ckdt.ck_dtype_bytes(_dtype_arg(dt, "dt"))


def ck_dtype_block_size(dt):
    """Weights per block: 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), 256 (Q2_K, Q3_K, Q4_K,
    Q5_K, Q6_K, IQ4_XS, Q8_K), 2 (INT4: a byte), 1 (FP32, FP16, BF16, INT8).

    Kernel: none; include/megafuse/ckernel_dtype.h (ck_dtype_block_size).
    """
    return ckdt.ck_dtype_block_size(_dtype_arg(dt, "dt"))


def ck_dtype_block_bytes(dt):
    """Bytes per block (GGML's byte counts); bytes per element for the plain types.

    Kernel: none; include/megafuse/ckernel_dtype.h (ck_dtype_block_bytes).
    """
    return ckdt.ck_dtype_block_bytes(_dtype_arg(dt, "dt"))


def ck_dtype_row_bytes(dt, n_elements):
    """Bytes of a row of n_elements weights; n_elements must be a positive multiple of the
    block size.

    Kernel: none; include/megafuse/ckernel_dtype.h (ck_dtype_row_bytes).
    """
    cdef int value = _dtype_arg(dt, "dt")
    n = n_elements.__index__() if hasattr(n_elements, "__index__") else None
    if n is None or isinstance(n_elements, bool):
        raise TypeError(f"n_elements: expected an int, got {type(n_elements).__name__}")
    if n <= 0:
        raise ValueError(f"n_elements: expected a positive value, got {n}")
    block = ckdt.ck_dtype_block_size(value)
    if n % block:
        raise ValueError(f"n_elements: expected a multiple of the block size {block}, got {n}")
    if n // block * ckdt.ck_dtype_block_bytes(value) > PY_SSIZE_T_MAX:     # (Python ints: exact)
        raise ValueError(f"n_elements: a row of {n} weights in {_dtype_name(value)} overflows a "
                         f"64-bit size (expected a row whose bytes fit)")
    return ckdt.ck_dtype_row_bytes(value, n)


def ck_dtype_supported(mask, dt):
    """True when dtype dt is in the CKDataTypeMask `mask` (an OR of CK_DT_MASK(...)).

    Kernel: none; include/megafuse/ckernel_dtype.h (ck_dtype_supported).
    """
    if not hasattr(mask, "__index__") or isinstance(mask, bool):
        raise TypeError(f"mask: expected an int, got {type(mask).__name__}")
    if not 0 <= mask.__index__() < (1 << 32):
        raise ValueError(f"mask: expected a 32-bit mask, got {mask}")
    return bool(ckdt.ck_dtype_supported(mask.__index__(), _dtype_arg(dt, "dt")))


WEIGHT_FORMATS_MASK = ckdt.CK_DT_WEIGHT_FORMATS
