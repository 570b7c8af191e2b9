# Block formats (GGML): row-parallel quantize / dequantize, and the row building blocks every
# projection calls -- the dot of one weight row, in any weight format, with float32 activations
# (decode) or with quantized activations (the int8 path of prefill and the MLP).
#
# The work is done by include/megafuse/mf_quant.h (static inline C, compiled here once per SIMD
# level, declared in megafuse/kernels/mf_quant.pxd); this file adds the parallel drivers and the
# dispatchers: the kernels of the format API (quantize_kernel, dequantize_kernel) and of its two
# test hooks (rows_dot_kernel, quantize_activations_kernel).  Formats and their layouts:
# include/megafuse/ggml_blocks.h.
#
# Letters: R = rows, C = columns (weights a row, a multiple of the format's block size),
# RB = ck_dtype_row_bytes(dt, C), AB = the bytes of one activation row (mf_activation_row_bytes).

cdef enum:
    # values a work item of quantize_kernel / dequantize_kernel (a multiple of every block
    # size): a single long row still spreads over threads
    QUANT_CHUNK = 8192


# ---- the building blocks later kernels call (all noexcept nogil, no validation) ---------------

cdef inline void dequantize_row(const void *src, float *dst, Py_ssize_t n, int dt) noexcept nogil:
    """dst[n] = the n weights at src (format dt), bit-exact with gguf.quants.dequantize."""
    mf_dequantize_row(src, dst, n, dt)


cdef inline float weight_row_dot_f32(const void *w_row, int dt, const float *x,
                                     Py_ssize_t n) noexcept nogil:
    """sum_i w_i * x[i] of one weight row (n weights in format dt; x [n] float32).

    The weights are decoded in registers, never stored; the reduction order depends on n only.
    """
    return mf_weight_row_dot_f32(w_row, dt, x, n)


cdef inline float weight_row_dot_q8(const void *w_row, int dt, const void *a_row_q8,
                                    Py_ssize_t n) noexcept nogil:
    """The int8 path: one weight row (format dt) against an activation row that
    quantize_activation_row made for dt (a Q8_0 activation row for the 32-weight formats, Q8_K
    blocks for the K-quants, plain float32 for FP32/FP16/BF16).  Integer sums per (sub-)block,
    GGML's scheme: one fixed sequence of operations per (row, activation row) at each SIMD level,
    which rows_tokens_dot_q8 reproduces bit for bit."""
    return mf_weight_row_dot_q8(w_row, dt, a_row_q8, n)


cdef inline void rows_dot_f32(const void **w_rows, int dt, const float *x, Py_ssize_t n,
                              float *out) noexcept nogil:
    """out[r] = weight_row_dot_f32(w_rows[r], dt, x, n) for r < 4 -- the same bits, the four rows
    streaming side by side past x (with prefetch of the rows ahead).  dt: any weight format but
    FP32 (its 4-row dot is mf_dot_1x4_f32)."""
    cdef mf_dot4_f32_fn f = mf_dot4_f32_for(dt)
    f(w_rows, x, n, out)


cdef inline void quantize_activation_row(const float *x, void *dst, Py_ssize_t n,
                                         int dt_of_weight) noexcept nogil:
    """x[n] -> dst[activation_row_bytes(dt_of_weight, n)]: the activation row the int8 dot of a
    weight of format dt_of_weight reads.  dt_of_weight may also name the activation format itself
    (Q8_0 or Q8_K)."""
    mf_quantize_activation_row(x, dst, n, dt_of_weight)


cdef inline void rows_tokens_dot_q8(const void **w_rows, int nr, int dt, const void *a_rows,
                                    Py_ssize_t a_row_bytes, int nt, Py_ssize_t n,
                                    float *out) noexcept nogil:
    """out[4 * t + r] = weight_row_dot_q8(w_rows[r], dt, a_rows + t * a_row_bytes, n) for
    r < nr <= 4, t < nt -- the same bits, but each weight row is decoded once for all the tokens
    (and four rows share the reductions).  out holds 4 * nt floats; entries r >= nr are junk."""
    mf_q8_rows_tokens(dt, w_rows, nr, a_rows, a_row_bytes, nt, n, out)


cdef inline void rows16_tokens_dot_q8(const void **w_rows, int nr, int dt, const void *a_rows,
                                      Py_ssize_t a_row_bytes, int nt, Py_ssize_t n, float *out,
                                      Py_ssize_t group_stride) noexcept nogil:
    """rows_tokens_dot_q8 of the 4-row groups of w_rows[0..nr-1] (nr <= 16), group g's results at
    out + g * group_stride -- the same bits.  Every block format at the avx512 level runs the 16
    rows at once, in the lanes of the VNNI products (mf_q8_tile16_kq, mf_q8_tile16_b32)."""
    mf_q8_rows16_tokens(dt, w_rows, nr, a_rows, a_row_bytes, nt, n, out, group_stride)


cdef inline size_t activation_row_bytes(int dt_of_weight, Py_ssize_t n) noexcept nogil:
    """Bytes of one activation row of n values for weights of dt_of_weight (0: not a format)."""
    return mf_activation_row_bytes(dt_of_weight, <size_t>n)


# ---- row-parallel drivers ---------------------------------------------------------------------

cdef inline int team_size(Py_ssize_t items, int num_threads) noexcept nogil:
    """No more threads than work items (a team of idle threads only costs barrier time)."""
    if items < 1:
        return 1
    return <int>items if items < num_threads else num_threads


cdef void quantize_kernel(const float *x, void *dst, Py_ssize_t rows, Py_ssize_t cols, int dt,
                          int num_threads) noexcept nogil:
    """x [R, C] float32 -> dst [R, RB] in weight format dt (FP32: a copy; FP16/BF16: 2-byte bits).

    Work items are (row, QUANT_CHUNK columns); blocks are independent, so the bytes do not depend
    on the thread count.
    """
    cdef Py_ssize_t RB = <Py_ssize_t>ck_dtype_row_bytes(dt, <size_t>cols)
    cdef Py_ssize_t per_row = (cols + QUANT_CHUNK - 1) // QUANT_CHUNK
    cdef Py_ssize_t item, r, c0, n
    cdef int nt = team_size(rows * per_row, num_threads)
    for item in prange(rows * per_row, num_threads=nt, schedule='static', nogil=True):
        r = item // per_row
        c0 = (item - r * per_row) * QUANT_CHUNK
        n = min(<Py_ssize_t>QUANT_CHUNK, cols - c0)
        mf_quantize_row(x + r * cols + c0,
                        <char *>dst + r * RB + <Py_ssize_t>ck_dtype_row_bytes(dt, <size_t>c0),
                        n, dt)


cdef void dequantize_kernel(const void *src, float *dst, Py_ssize_t rows, Py_ssize_t cols,
                            int dt, int num_threads) noexcept nogil:
    """src [R, RB] in weight format dt -> dst [R, C] float32 (gguf.quants.dequantize's bits)."""
    cdef Py_ssize_t RB = <Py_ssize_t>ck_dtype_row_bytes(dt, <size_t>cols)
    cdef Py_ssize_t per_row = (cols + QUANT_CHUNK - 1) // QUANT_CHUNK
    cdef Py_ssize_t item, r, c0, n
    cdef int nt = team_size(rows * per_row, num_threads)
    for item in prange(rows * per_row, num_threads=nt, schedule='static', nogil=True):
        r = item // per_row
        c0 = (item - r * per_row) * QUANT_CHUNK
        n = min(<Py_ssize_t>QUANT_CHUNK, cols - c0)
        mf_dequantize_row(<const char *>src + r * RB
                          + <Py_ssize_t>ck_dtype_row_bytes(dt, <size_t>c0),
                          dst + r * cols + c0, n, dt)


# ---- test hooks (KernelTable.rows_dot, KernelTable.quantize_activations) ------------------

cdef inline void dot_row_group(const char *w, Py_ssize_t RB, Py_ssize_t nr, int dt,
                               const void *a, Py_ssize_t cols, float *out) noexcept nogil:
    """out[r] = int8 dot of weight row w + r * RB with a, r < nr <= 4."""
    cdef const void *rows[4]
    cdef float res[4]
    cdef Py_ssize_t r
    for r in range(nr):
        rows[r] = w + r * RB
    rows_tokens_dot_q8(rows, <int>nr, dt, a, 0, 1, cols, res)
    for r in range(nr):
        out[r] = res[r]


cdef inline void float_row_group(const char *w, Py_ssize_t RB, Py_ssize_t nr, int dt,
                                 const float *x, Py_ssize_t cols, float *out) noexcept nogil:
    """out[r] = float-path dot of weight row w + r * RB with x, r < nr <= 4: four rows by the
    4-row dot (as a one-token projection takes them), fewer one by one."""
    cdef const void *rows[4]
    cdef Py_ssize_t r
    if nr < 4:
        for r in range(nr):
            out[r] = weight_row_dot_f32(w + r * RB, dt, x, cols)
        return
    for r in range(4):
        rows[r] = w + r * RB
    rows_dot_f32(rows, dt, x, cols, out)


cdef void rows_dot_kernel(const void *w, int dt, const float *x, Py_ssize_t rows,
                          Py_ssize_t cols, int quantized, void *act_scratch, float *out,
                          int num_threads) noexcept nogil:
    """out[r] = w[r] . x for r < R: weight rows w [R, RB] (format dt) against x [C], by the float
    path (quantized = 0) or the int8 path (x quantized once into act_scratch [AB]); rows in
    groups of 4, as the projections take them (FP32 on the float path: one dot per row).  Rows
    spread over threads.  One row (R = 1): the one-row dot itself (weight_row_dot_q8 /
    weight_row_dot_f32), which the multi-row kernels must reproduce."""
    cdef Py_ssize_t RB = <Py_ssize_t>ck_dtype_row_bytes(dt, <size_t>cols)
    cdef Py_ssize_t r, g, n_groups = (rows + 3) // 4
    cdef int nt
    if quantized and rows == 1:
        quantize_activation_row(x, act_scratch, cols, dt)
        out[0] = weight_row_dot_q8(w, dt, act_scratch, cols)
    elif quantized:                   # as the projections do it: 4 rows a call
        nt = team_size(n_groups, num_threads)
        quantize_activation_row(x, act_scratch, cols, dt)
        for g in prange(n_groups, num_threads=nt, schedule='static', nogil=True):
            dot_row_group(<const char *>w + 4 * g * RB, RB, min(<Py_ssize_t>4, rows - 4 * g), dt,
                          act_scratch, cols, out + 4 * g)
    elif dt != CK_DT_FP32:
        nt = team_size(n_groups, num_threads)
        for g in prange(n_groups, num_threads=nt, schedule='static', nogil=True):
            float_row_group(<const char *>w + 4 * g * RB, RB, min(<Py_ssize_t>4, rows - 4 * g),
                            dt, x, cols, out + 4 * g)
    else:
        nt = team_size(rows, num_threads)
        for r in prange(rows, num_threads=nt, schedule='static', nogil=True):
            out[r] = weight_row_dot_f32(<const char *>w + r * RB, dt, x, cols)


cdef void quantize_activations_kernel(const float *x, void *dst, Py_ssize_t rows,
                                      Py_ssize_t cols, int dt_of_weight,
                                      int num_threads) noexcept nogil:
    """x [R, C] -> dst [R, AB]: the activation rows the int8 path makes for weights of
    dt_of_weight."""
    cdef Py_ssize_t AB = <Py_ssize_t>activation_row_bytes(dt_of_weight, cols)
    cdef Py_ssize_t r
    cdef int nt = team_size(rows, num_threads)
    for r in prange(rows, num_threads=nt, schedule='static', nogil=True):
        quantize_activation_row(x + r * cols, <char *>dst + r * AB, cols, dt_of_weight)
