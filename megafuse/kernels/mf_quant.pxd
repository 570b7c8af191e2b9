# include/megafuse/mf_quant.h for Cython: the format layer's row functions (one declaration,
# cimported by the kernels' megafuse/kernels/levels/quant.pxi and by the boundary's format API).
#
# Shapes: w = one weight row, ck_dtype_row_bytes(dt, n) bytes; x, y [n] float32; a = one
# activation row, mf_activation_row_bytes(dt, n) bytes.

cdef extern from "megafuse/mf_quant.h" nogil:
    void mf_dequantize_row(const void *w, float *y, Py_ssize_t n, int dt)
    void mf_quantize_row(const float *x, void *w, Py_ssize_t n, int dt)
    float mf_weight_row_dot_f32(const void *w, int dt, const float *x, Py_ssize_t n)
    float mf_weight_row_dot_q8(const void *w, int dt, const void *a, Py_ssize_t n)
    void mf_quantize_activation_row(const float *x, void *a, Py_ssize_t n, int dt)
    # a Q8_0 activation row piece by piece: blocks b0 .. b1-1 of x[n], and the bytes of no block
    # (zero blocks, padding); together the same bytes as mf_quantize_activation_row
    void mf_quantize_blocks_q8_0_act(const float *x, void *a, Py_ssize_t n, Py_ssize_t b0,
                                     Py_ssize_t b1)
    void mf_q8_0_act_pad(void *a, Py_ssize_t n)
    size_t mf_activation_row_bytes(int dt, size_t n)
    int mf_activation_dtype(int dt)     # Q8_0 / Q8_K / FP32: the int8 path's activations
    # out[4 * t + r] = the int8 dot of weight row w[r] (r < nr <= 4) with activation row
    # a + t * a_stride (t < nt), bit for bit weight_row_dot_q8's; rows decoded once for all tokens
    void mf_q8_rows_tokens(int dt, const void **w, int nr, const void *a, Py_ssize_t a_stride,
                           int nt, Py_ssize_t n, float *out)
    # the same for up to 16 rows: out[g * os + 4 * t + r] for row w[4 * g + r] (r + 4 * g < nr
    # <= 16), the bits of mf_q8_rows_tokens for each 4-row group g
    void mf_q8_rows16_tokens(int dt, const void **w, int nr, const void *a, Py_ssize_t a_stride,
                             int nt, Py_ssize_t n, float *out, Py_ssize_t os)
    # out[r] = the int8 dot of weight row w[r] (r < 4) with one activation row a, bit for bit
    # weight_row_dot_q8's; NULL for non-block formats and at the generic level
    ctypedef void (*mf_dot4_q8_fn "mf_dot4_fn")(const void **w, const void *a, Py_ssize_t n,
                                                float *out)
    mf_dot4_q8_fn mf_dot4_q8_for(int dt)
    enum: MF_Q8_TILE_TOKENS             # tokens worth a call of mf_q8_rows_tokens
    int mf_q8_tile_tokens(size_t row_bytes)     # tokens a call, for activation rows that long
    int mf_q8_rows16_tile_tokens(int dt, size_t row_bytes)   # the same for mf_q8_rows16_tokens
    # out[r] = the float dot of weight row w[r] (r < 4) with x, bit for bit weight_row_dot_f32's;
    # NULL for FP32 (mf_dot_1x4_f32) and non-formats
    ctypedef void (*mf_dot4_f32_fn)(const void **w, const float *x, Py_ssize_t n, float *out)
    mf_dot4_f32_fn mf_dot4_f32_for(int dt)
    # out0[r] / out1[r] = mf_dot4_f32_for(dt)'s results for x0 / x1, bit for bit, each block's
    # weights decoded once for both tokens; NULL where the level has none
    ctypedef void (*mf_dot4x2_f32_fn)(const void **w, const float *x0, const float *x1,
                                      Py_ssize_t n, float *out0, float *out1)
    mf_dot4x2_f32_fn mf_dot4x2_f32_for(int dt)
    # fills the fp16 -> float table the avx512 float dots read their scales from (a no-op at the
    # other levels); each SIMD level's module calls it once, as it loads
    void mf_q_fp16_table_init()
