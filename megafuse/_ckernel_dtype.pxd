# include/megafuse/ckernel_dtype.h for Cython: the CKDataType enum, its mask and its helpers, as
# the header spells them (one declaration, cimported by the boundary and by the kernels; the
# Python IntEnum megafuse.CKDataType lives in megafuse/kernels/dtype.py and is checked against these
# values when megafuse._kernels is imported).
#
# The helpers take a CKDataType in C; they are declared here with an int parameter because the
# kernels pass formats around as ints (C converts an int to the enum implicitly; Cython would
# want a cast at every call).

cdef extern from "megafuse/ckernel_dtype.h" nogil:
    ctypedef enum CKDataType:
        CK_DT_FP32
        CK_DT_BF16
        CK_DT_FP16
        CK_DT_INT8
        CK_DT_INT4
        CK_DT_Q4_0
        CK_DT_Q4_1
        CK_DT_Q4_K
        CK_DT_Q6_K
        CK_DT_Q8_0
        CK_DT_Q8_K
        CK_DT_Q5_0
        CK_DT_Q5_1
        CK_DT_Q5_K
        CK_DT_Q2_K
        CK_DT_Q3_K
        CK_DT_IQ4_NL
        CK_DT_IQ4_XS
        CK_DT_COUNT

    ctypedef unsigned int CKDataTypeMask         # uint32_t
    CKDataTypeMask CK_DT_WEIGHT_FORMATS          # every format a `w, w_dt` argument accepts
    CKDataTypeMask CK_DT_MASK(int dt)

    int ck_dtype_is_quantized(int dt)
    size_t ck_dtype_bytes(int dt)
    size_t ck_dtype_block_size(int dt)
    size_t ck_dtype_block_bytes(int dt)
    size_t ck_dtype_row_bytes(int dt, size_t n_elements)
    int ck_dtype_supported(CKDataTypeMask mask, int dt)
