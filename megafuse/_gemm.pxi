# Projections: a block of up to 4 weight rows, in any weight format, against a tile of tokens.
#
# These are the inner loops of every prefill and MLP projection (out[t, r] = x[t] . w[r] + b[r]):
# the kernels parallelise over blocks of GEMM_ROWS weight rows and hand each block every token of
# the call, PROJ_TOKEN_TILE tokens at a time, so a weight row is read (and dequantized) once per
# tile while the tile's activations stay in L1/L2.  Every output element is one fixed-order
# reduction: results do not depend on the thread count, nor on how rows fall into blocks.
#
# Float activations: the register block is mf_dot_3x4_f32 (3 tokens x 4 rows, include/megafuse/
# mf_simd.h).  FP32 rows are used in place; other formats are dequantized PROJ_CHUNK columns at a
# time into a stack buffer (L1) and each chunk serves every token of the tile.  With fewer than 3
# tokens a block-format row is instead dotted directly, decoded in registers (decode's path).
# Int8 activations (the _q8_0 prefill, the MLP): the token rows were quantized to the activation
# format of the weight (Q8_0 for 32-weight blocks, Q8_K for K-quants); each (row, token) is one
# integer dot product from the format layer, computed 4 weight rows x up to 64 tokens at a time
# by mf_q8_rows_tokens (rows decoded once into L1; bit-identical to one-row dots per pair).

cdef extern from "megafuse/ckernel_dtype.h" nogil:
    size_t ck_dtype_row_bytes(int dt, size_t n)
    size_t ck_dtype_block_size(int dt)

cdef enum:
    GEMM_ROWS = 4             # weight rows a register block
    GEMM_TOKENS = 3           # token rows a register block
    PROJ_CHUNK = 512          # columns dequantized at once: a multiple of every block size
    PROJ_TOKEN_TILE = 48      # tokens sharing one pass over a block of weight rows (16 x 3)
    DT_FP32 = 0


cdef inline bint uses_q8_activations(int dt) noexcept nogil:
    """The int8 path quantizes activations for the block formats only (FP32/FP16/BF16 stay
    float)."""
    return ck_dtype_block_size(dt) > 1


cdef struct RowBlock:
    # up to GEMM_ROWS weight rows and where their results go
    int n                                 # rows in the block (1..4)
    const char *w[GEMM_ROWS]              # each row: K values in the block's format
    float bias[GEMM_ROWS]
    const float *add[GEMM_ROWS]           # [T, ld] columns added to the results, or NULL
    float *out[GEMM_ROWS]                 # [T, ld] result columns


cdef void block_dot_tokens_f32(
        const RowBlock *b, int dt, Py_ssize_t K,
        const float *x,        # [T, ldx] token rows, K values each
        Py_ssize_t ldx, Py_ssize_t T, Py_ssize_t ld) noexcept nogil:
    """b.out[r][t * ld] = x[t] . w_r + b.bias[r] (+ b.add[r][t * ld]) for r < b.n, t < T."""
    cdef float chunk[GEMM_ROWS * PROJ_CHUNK]     # the block's rows, dequantized, chunk by chunk
    cdef float acc[PROJ_TOKEN_TILE * GEMM_ROWS]  # [tile, 4] sums over the chunks so far
    cdef float res[GEMM_TOKENS][GEMM_ROWS]
    cdef const float *wp[GEMM_ROWS]
    cdef const float *xp[GEMM_TOKENS]
    cdef Py_ssize_t t0, nt, tg, j, r, k0, n
    cdef float value
    cdef bint direct = dt == DT_FP32
    if not direct and T < GEMM_TOKENS:           # one or two tokens: decode in registers
        for r in range(b.n):
            for j in range(T):
                value = weight_row_dot_f32(b.w[r], dt, x + j * ldx, K) + b.bias[r]
                if b.add[r] != NULL:
                    value = value + b.add[r][j * ld]
                b.out[r][j * ld] = value
        return
    t0 = 0
    while t0 < T:
        nt = min(<Py_ssize_t>PROJ_TOKEN_TILE, T - t0)
        for j in range(nt * GEMM_ROWS):
            acc[j] = 0.0
        k0 = 0
        while k0 < K:
            n = K if direct else min(<Py_ssize_t>PROJ_CHUNK, K - k0)
            for r in range(GEMM_ROWS):
                if direct:
                    wp[r] = <const float *>b.w[min(r, b.n - 1)]
                else:
                    wp[r] = chunk + min(r, b.n - 1) * PROJ_CHUNK
                    if r < b.n:
                        dequantize_row(b.w[r] + ck_dtype_row_bytes(dt, k0), chunk + r * PROJ_CHUNK,
                                       n, dt)
            tg = 0
            while tg < nt:
                for j in range(GEMM_TOKENS):
                    xp[j] = x + (t0 + min(tg + j, nt - 1)) * ldx + k0
                mf_dot_3x4_f32(xp, wp, n, res)
                for j in range(min(<Py_ssize_t>GEMM_TOKENS, nt - tg)):
                    for r in range(GEMM_ROWS):
                        acc[(tg + j) * GEMM_ROWS + r] += res[j][r]
                tg += GEMM_TOKENS
            k0 += n
        for r in range(b.n):
            for j in range(nt):
                value = acc[j * GEMM_ROWS + r] + b.bias[r]
                if b.add[r] != NULL:
                    value = value + b.add[r][(t0 + j) * ld]
                b.out[r][(t0 + j) * ld] = value
        t0 += nt


cdef void block_dot_tokens_q8(
        const RowBlock *b, int dt, Py_ssize_t K,
        const char *xq,        # [T, xq_row_bytes]: token rows quantized to dt's activation format
        Py_ssize_t xq_row_bytes, Py_ssize_t T, Py_ssize_t ld) noexcept nogil:
    """b.out[r][t * ld] = int8 dot(w_r, xq[t]) + b.bias[r] (+ b.add[r][t * ld]).

    MF_Q8_TILE_TOKENS tokens at a time, the block's rows decoded once for all of them
    (rows_tokens_dot_q8: the bits of one weight_row_dot_q8 per pair)."""
    cdef float res[MF_Q8_TILE_TOKENS * GEMM_ROWS]     # [tokens, 4] dot products
    cdef Py_ssize_t r, j, t0, nt
    cdef float value
    t0 = 0
    while t0 < T:
        nt = min(<Py_ssize_t>MF_Q8_TILE_TOKENS, T - t0)
        rows_tokens_dot_q8(<const void **>b.w, b.n, dt, xq + t0 * xq_row_bytes, xq_row_bytes,
                           <int>nt, K, res)
        for j in range(nt):
            for r in range(b.n):
                value = res[j * GEMM_ROWS + r] + b.bias[r]
                if b.add[r] != NULL:
                    value = value + b.add[r][(t0 + j) * ld]
                b.out[r][(t0 + j) * ld] = value
        t0 += nt


cdef inline void block_dot_tokens(
        const RowBlock *b, int dt, Py_ssize_t K,
        const float *x, Py_ssize_t ldx,          # [T, ldx] float rows
        const char *xq, Py_ssize_t xq_row,       # [T, xq_row] the same rows quantized, or NULL
        Py_ssize_t T, Py_ssize_t ld) noexcept nogil:
    """The int8 dots when the rows were quantized (xq given) and dt is a block format; float
    dots otherwise."""
    if xq != NULL and uses_q8_activations(dt):
        block_dot_tokens_q8(b, dt, K, xq, xq_row, T, ld)
    else:
        block_dot_tokens_f32(b, dt, K, x, ldx, T, ld)


cdef inline void zero_column(float *out, Py_ssize_t ld_out, Py_ssize_t T) noexcept nogil:
    cdef Py_ssize_t t
    for t in range(T):
        out[t * ld_out] = 0.0


cdef void linear_block(
        Py_ssize_t e0,         # first weight row of the block
        const char *w, Py_ssize_t w_row_bytes, int dt, Py_ssize_t K,
        const float *bias,     # [R] or NULL
        Py_ssize_t n_valid,    # rows >= n_valid (padding) are written as 0
        Py_ssize_t n_rows,     # R: rows of the weight
        const float *x, Py_ssize_t ldx,          # [T, ldx]
        const char *xq, Py_ssize_t xq_row,       # [T, xq_row] or NULL
        Py_ssize_t T,
        float *out,            # [T, ld]: column e receives row e's results
        const float *add,      # [T, ld] or NULL: added column by column (a residual)
        Py_ssize_t ld) noexcept nogil:
    """Columns e0 .. e0+3 of out = x @ w.T + bias (+ add), the register block of one thread."""
    cdef RowBlock rb
    cdef Py_ssize_t r, e
    rb.n = 0
    for r in range(GEMM_ROWS):
        e = e0 + r
        if e >= n_rows:
            break
        if e >= n_valid:
            zero_column(out + e, ld, T)
            continue
        rb.w[rb.n] = w + e * w_row_bytes
        rb.bias[rb.n] = bias[e] if bias != NULL else 0.0
        rb.add[rb.n] = add + e if add != NULL else NULL
        rb.out[rb.n] = out + e
        rb.n += 1
    if rb.n > 0:
        block_dot_tokens(&rb, dt, K, x, ldx, xq, xq_row, T, ld)
