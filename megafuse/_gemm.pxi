# Projections: one weight row, in any weight format, against a tile of token rows.
#
# These are the inner loops of every prefill and MLP projection (out[t, r] = x[t] . w[r] + b[r]):
# the kernels parallelise over weight rows r and hand each row all tokens of a tile, so a weight
# row is read (and dequantized) once per tile of PROJ_TOKEN_TILE tokens, while the tile's
# activations stay in cache.  Every output element is one fixed-order reduction, whatever the
# thread count.
#
# Float activations (the plain prefill): the row is dequantized PROJ_CHUNK columns at a time into a
# small stack buffer (L1), and each chunk is dotted with every token of the tile; FP32 rows are
# used in place.  Int8 activations (the _q8_0 prefill, the MLP): the token rows were quantized to
# the activation format of the weight (Q8_0 for 32-weight blocks, Q8_K for K-quants) and each
# (row, token) is one integer dot product from the format layer.

cdef extern from "megafuse/ckernel_dtype.h" nogil:
    size_t ck_dtype_row_bytes(int dt, size_t n)
    size_t ck_dtype_block_size(int dt)

cdef enum:
    PROJ_CHUNK = 512          # columns dequantized at once: a multiple of every block size
    PROJ_TOKEN_TILE = 32      # tokens sharing one pass over a weight row
    DT_FP32 = 0


cdef inline bint uses_q8_activations(int dt) noexcept nogil:
    """The int8 path quantizes activations for the block formats only (FP32/FP16/BF16 stay
    float)."""
    return ck_dtype_block_size(dt) > 1


cdef void row_dot_tokens_f32(
        const char *w_row,     # one weight row: K values in format dt
        int dt, Py_ssize_t K,
        const float *x,        # [T, ldx]: token rows (K values each)
        Py_ssize_t ldx, Py_ssize_t T,
        float bias,
        const float *add,      # [T, ld_out] or NULL: added to each result (the residual)
        float *out,            # [T, ld_out] out: one column of the projection
        Py_ssize_t ld_out) noexcept nogil:
    """out[t * ld_out] = x[t, :K] . w_row + bias (+ add[t * ld_out]), for t < T."""
    cdef float chunk[PROJ_CHUNK]
    cdef float acc[PROJ_TOKEN_TILE]
    cdef Py_ssize_t t0, nt, j, k0, n
    cdef float value
    t0 = 0
    while t0 < T:
        nt = min(<Py_ssize_t>PROJ_TOKEN_TILE, T - t0)
        if dt == DT_FP32:
            for j in range(nt):
                acc[j] = mf_dot_f32(<const float *>w_row, x + (t0 + j) * ldx, K)
        else:
            for j in range(nt):
                acc[j] = 0.0
            k0 = 0
            while k0 < K:
                n = min(<Py_ssize_t>PROJ_CHUNK, K - k0)
                dequantize_row(w_row + ck_dtype_row_bytes(dt, k0), chunk, n, dt)
                for j in range(nt):
                    acc[j] = acc[j] + mf_dot_f32(chunk, x + (t0 + j) * ldx + k0, n)
                k0 += n
        for j in range(nt):
            value = acc[j] + bias
            if add != NULL:
                value = value + add[(t0 + j) * ld_out]
            out[(t0 + j) * ld_out] = value
        t0 += nt


cdef void row_dot_tokens_q8(
        const char *w_row,     # one weight row: K values in block format dt
        int dt, Py_ssize_t K,
        const char *xq,        # [T, xq_row_bytes]: token rows quantized to dt's activation format
        Py_ssize_t xq_row_bytes, Py_ssize_t T,
        float bias,
        const float *add,      # [T, ld_out] or NULL
        float *out,            # [T, ld_out] out
        Py_ssize_t ld_out) noexcept nogil:
    """out[t * ld_out] = int8 dot(w_row, xq[t]) + bias (+ add[t * ld_out]), for t < T."""
    cdef Py_ssize_t t
    cdef float value
    for t in range(T):
        value = weight_row_dot_q8(w_row, dt, xq + t * xq_row_bytes, K) + bias
        if add != NULL:
            value = value + add[t * ld_out]
        out[t * ld_out] = value


cdef inline void zero_column(float *out, Py_ssize_t ld_out, Py_ssize_t T) noexcept nogil:
    cdef Py_ssize_t t
    for t in range(T):
        out[t * ld_out] = 0.0
