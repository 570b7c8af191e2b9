# The post-attention block: out-projection + residual -> RMSNorm -> SwiGLU MLP -> residual.
#
# One body (fused_mlp), four kernels at the end of this file: mega_fused_outproj_mlp_prefill_kernel
# (attn_out given, head-major) and mega_fused_mlp_prefill_kernel (token-major input), and their
# float-activation twins mega_fused_outproj_mlp_prefill_f32_kernel and
# mega_fused_mlp_prefill_f32_kernel.  Tokens go through in tiles of MF_MLP_TOKEN_TILE: a tile's
# gate/up products, silu(gate)*up and (int8 path) its quantization live in scratch
# (include/megafuse/mf_scratch.h) and w2 consumes them before the next tile: no [T, I] buffer.
# On the int8 path activations are quantized (Q8_0 / Q8_K) for every block-format weight and
# FP32/FP16/BF16 weights see float activations; on the float path every projection takes float
# activations (block-format weights dequantized as they are read) and the quantized regions of
# the scratch are not touched.

cdef void swiglu_block(
        Py_ssize_t i0,         # first intermediate index of the block
        const char *w1, Py_ssize_t w1_row, int dt, Py_ssize_t Ea,
        const float *b1,       # [2*Ia] or NULL
        const float *z, const char *z_q, Py_ssize_t z_q_row, Py_ssize_t nt,
        Py_ssize_t I, Py_ssize_t Ia,
        float *act,            # [nt, Ia]: columns i0 .. i0+63 = act(gate) * up
        int activation=0,      # MF_ACT_SILU (0) or MF_ACT_GELU_TANH
        bint apart=False) noexcept nogil:   # float rows: each token's bits as if alone
    """Gate rows i and up rows Ia + i of w1, for 64 intermediate indices, against the tile."""
    cdef float gate[MF_MLP_TOKEN_TILE * GEMM_ROWS]   # [nt, 64]
    cdef float up[MF_MLP_TOKEN_TILE * GEMM_ROWS]     # [nt, 64]
    cdef RowBlock g, u
    cdef Py_ssize_t r, j, i
    g.n = u.n = 0
    for r in range(GEMM_ROWS):
        i = i0 + r
        if i >= Ia:
            break
        if i >= I:                     # padding of the intermediate dim: activation 0
            zero_column(act + i, Ia, nt)
            continue
        g.w[g.n] = w1 + i * w1_row
        u.w[u.n] = w1 + (Ia + i) * w1_row
        g.bias[g.n] = b1[i] if b1 != NULL else 0.0
        u.bias[u.n] = b1[Ia + i] if b1 != NULL else 0.0
        g.add[g.n] = u.add[u.n] = NULL
        g.out[g.n] = gate + g.n
        u.out[u.n] = up + u.n
        g.n += 1
        u.n += 1
    if g.n == 0:
        return
    block_dot_tokens(&g, dt, Ea, z, Ea, z_q, z_q_row, nt, GEMM_ROWS, apart)
    block_dot_tokens(&u, dt, Ea, z, Ea, z_q, z_q_row, nt, GEMM_ROWS, apart)
    for j in range(nt):                # the block's columns of each token row, in place in act
        if activation == MF_ACT_GELU_TANH:
            mf_gelu_tanh_mul_f32(gate + j * GEMM_ROWS, up + j * GEMM_ROWS, act + j * Ia + i0, g.n)
        else:
            mf_silu_mul_f32(gate + j * GEMM_ROWS, up + j * GEMM_ROWS, act + j * Ia + i0, g.n)


cdef struct MlpJob:
    # what every phase of fused_mlp reads: its arguments and the scratch regions
    float *output              # [T, Ea]
    const float *attn_out      # [H, T, Da] or NULL
    const float *residual      # [T, Ea] or NULL
    const float *ln2_gamma     # [E]
    const float *h_rows        # [T, Ea]: the hidden state the MLP normalises
    const float *base_rows     # [T, Ea] or NULL: what the MLP output is added to
    const void *wo
    const float *bo
    const void *w1
    const float *b1
    const void *w2
    const float *b2
    int wo_dt, w1_dt, w2_dt
    Py_ssize_t E, Ea, T, H, Da, HDa, I, Ia, tile, wo_row, w1_row, w2_row, q_row, aq_row
    float eps
    float *rows                # [tile, max(HDa, Ea)]: attn rows, then z
    char *rows_q               # [tile, q_row] or NULL (float path)
    float *act                 # [tile, Ia]: silu(gate) * up
    char *act_q                # [tile, aq_row] or NULL


cdef inline Py_ssize_t mlp_tile_tokens(const MlpJob *c, Py_ssize_t t0) noexcept nogil:
    return min(c.tile, c.T - t0)


cdef void mlp_gather(const void *ctx, Py_ssize_t t0, Py_ssize_t j) noexcept nogil:
    """Token t0+j's attention row, gathered from the head-major layout."""
    cdef const MlpJob *c = <const MlpJob *>ctx
    cdef Py_ssize_t h
    for h in range(c.H):
        memcpy(c.rows + j * c.HDa + h * c.Da, c.attn_out + (h * c.T + t0 + j) * c.Da,
               c.Da * sizeof(float))


cdef void mlp_quantize_rows(const void *ctx, Py_ssize_t t0, Py_ssize_t j) noexcept nogil:
    cdef const MlpJob *c = <const MlpJob *>ctx
    quantize_activation_row(c.rows + j * c.HDa, c.rows_q + j * c.q_row, c.HDa,
                            activation_format(c.wo_dt))


cdef void mlp_outproj(const void *ctx, Py_ssize_t t0, Py_ssize_t blk) noexcept nogil:
    """output[t] = attn[t] @ wo.T + bo + residual[t], one block of rows."""
    cdef const MlpJob *c = <const MlpJob *>ctx
    linear_block(blk * GEMM_ROWS, <const char *>c.wo, c.wo_row, c.wo_dt, c.HDa, c.bo, c.E, c.Ea,
                 c.rows, c.HDa, c.rows_q, c.q_row, mlp_tile_tokens(c, t0), c.output + t0 * c.Ea,
                 c.residual + t0 * c.Ea if c.residual != NULL else NULL, c.Ea)


cdef void mlp_rmsnorm(const void *ctx, Py_ssize_t t0, Py_ssize_t j) noexcept nogil:
    cdef const MlpJob *c = <const MlpJob *>ctx
    rmsnorm_row(c.h_rows + (t0 + j) * c.Ea, c.ln2_gamma, c.E, c.Ea, c.eps, c.rows + j * c.Ea)


cdef void mlp_quantize_z(const void *ctx, Py_ssize_t t0, Py_ssize_t j) noexcept nogil:
    cdef const MlpJob *c = <const MlpJob *>ctx
    quantize_activation_row(c.rows + j * c.Ea, c.rows_q + j * c.q_row, c.Ea,
                            activation_format(c.w1_dt))


cdef void mlp_swiglu(const void *ctx, Py_ssize_t t0, Py_ssize_t blk) noexcept nogil:
    """act = silu(z @ Wg.T + bg) * (z @ Wu.T + bu): gate row i and up row Ia+i together."""
    cdef const MlpJob *c = <const MlpJob *>ctx
    swiglu_block(blk * GEMM_ROWS, <const char *>c.w1, c.w1_row, c.w1_dt, c.Ea, c.b1, c.rows,
                 c.rows_q, c.q_row, mlp_tile_tokens(c, t0), c.I, c.Ia, c.act)


cdef void mlp_quantize_act(const void *ctx, Py_ssize_t t0, Py_ssize_t j) noexcept nogil:
    cdef const MlpJob *c = <const MlpJob *>ctx
    quantize_activation_row(c.act + j * c.Ia, c.act_q + j * c.aq_row, c.Ia,
                            activation_format(c.w2_dt))


cdef void mlp_down(const void *ctx, Py_ssize_t t0, Py_ssize_t blk) noexcept nogil:
    """output[t] = base[t] + act[t] @ w2.T + b2, one block of rows."""
    cdef const MlpJob *c = <const MlpJob *>ctx
    linear_block(blk * GEMM_ROWS, <const char *>c.w2, c.w2_row, c.w2_dt, c.Ia, c.b2, c.E, c.Ea,
                 c.act, c.Ia, c.act_q, c.aq_row, mlp_tile_tokens(c, t0), c.output + t0 * c.Ea,
                 c.base_rows + t0 * c.Ea if c.base_rows != NULL else NULL, c.Ea)


cdef void fused_mlp(
        float *output,             # [T, Ea]: columns >= E written as 0
        const float *attn_out,     # [H, T, Da] head-major, or NULL (token-major entry)
        const float *input,        # [T, Ea] (token-major entry) or NULL
        const float *residual,     # [T, Ea] or NULL
        const float *ln2_gamma,    # [E]
        const void *wo, const float *bo, int wo_dt,   # [Ea, H*Da], [Ea]   (attn_out entry)
        const void *w1, const float *b1, int w1_dt,   # [2*Ia, Ea]: gate rows, then up rows
        const void *w2, const float *b2, int w2_dt,   # [Ea, Ia], [Ea]
        int tokens, int embed_dim, int aligned_embed_dim, int num_heads, int aligned_head_dim,
        int intermediate_dim, int aligned_intermediate_dim, float eps,
        void *scratch,             # mf_mlp_scratch_layout(...).total bytes
        int int8_path, mf_team *team, int num_threads) noexcept nogil:
    """Every MLP kernel: int8_path = 1 quantizes the activations of block-format weights,
    0 keeps them float32 (no quantized row exists: rows_q, act_q are NULL).  One job of the
    team (a few, for many token tiles): per tile, the phases below, each after the one before
    (the next tile's phases reuse the tile buffers after this tile's last phase)."""
    cdef Py_ssize_t T = tokens, Ea = aligned_embed_dim
    cdef Py_ssize_t HDa = <Py_ssize_t>num_heads * aligned_head_dim if attn_out != NULL else 0
    cdef Py_ssize_t Ia = aligned_intermediate_dim
    cdef mf_mlp_scratch layout = mf_mlp_scratch_layout(T, Ea, HDa, Ia)
    cdef char *base = <char *>scratch
    cdef Py_ssize_t t0, nt
    cdef Py_ssize_t n_be = (Ea + GEMM_ROWS - 1) // GEMM_ROWS    # blocks of output rows
    cdef Job job
    cdef MlpJob c

    c.output, c.attn_out, c.residual, c.ln2_gamma = output, attn_out, residual, ln2_gamma
    if attn_out != NULL:
        c.h_rows = output          # h1 = attn @ wo.T + bo + residual lands in output first
        c.base_rows = output
    else:
        c.h_rows = input
        c.base_rows = residual
    c.wo, c.bo, c.w1, c.b1, c.w2, c.b2 = wo, bo, w1, b1, w2, b2
    c.wo_dt, c.w1_dt, c.w2_dt = wo_dt, w1_dt, w2_dt
    c.E, c.Ea, c.T, c.H, c.Da, c.HDa = embed_dim, Ea, T, num_heads, aligned_head_dim, HDa
    c.I, c.Ia, c.tile, c.eps = intermediate_dim, Ia, layout.tile, eps
    c.wo_row = ck_dtype_row_bytes(wo_dt, HDa) if HDa else 0
    c.w1_row = ck_dtype_row_bytes(w1_dt, Ea)
    c.w2_row = ck_dtype_row_bytes(w2_dt, Ia)
    c.q_row, c.aq_row = layout.q_row, layout.aq_row
    c.rows = <float *>(base + layout.f)
    c.rows_q = base + layout.q if int8_path else NULL
    c.act = <float *>(base + layout.a)
    c.act_q = base + layout.aq if int8_path else NULL

    job_init(&job, team, num_threads)
    t0 = 0
    while t0 < T:
        nt = mlp_tile_tokens(&c, t0)
        if attn_out != NULL:
            job_add(&job, mlp_gather, &c, t0, nt, 0)
            if int8_path and uses_q8_activations(wo_dt):
                job_add(&job, mlp_quantize_rows, &c, t0, nt, 0)
            job_add(&job, mlp_outproj, &c, t0, n_be, 1)
        job_add(&job, mlp_rmsnorm, &c, t0, nt, 0)
        if int8_path and uses_q8_activations(w1_dt):
            job_add(&job, mlp_quantize_z, &c, t0, nt, 0)
        job_add(&job, mlp_swiglu, &c, t0, (Ia + GEMM_ROWS - 1) // GEMM_ROWS, 1)
        if int8_path and uses_q8_activations(w2_dt):
            job_add(&job, mlp_quantize_act, &c, t0, nt, 0)
        job_add(&job, mlp_down, &c, t0, n_be, 1)
        t0 += nt
    job_run(&job)


cdef void mega_fused_outproj_mlp_prefill_kernel(
        float *output,             # [T, Ea]
        const float *attn_out,     # [H, T, Da] head-major
        const float *residual,     # [T, Ea] or NULL
        const float *ln2_gamma,    # [E]
        const void *wo, const float *bo, CKDataType wo_dt,
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int num_heads, int aligned_head_dim,
        int intermediate_dim, int aligned_intermediate_dim, float eps, void *scratch,
        mf_team *team, int num_threads) noexcept nogil:
    fused_mlp(output, attn_out, NULL, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2,
              w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
              intermediate_dim, aligned_intermediate_dim, eps, scratch, 1, team, num_threads)


cdef void mega_fused_mlp_prefill_kernel(
        float *output,             # [T, Ea]
        const float *input,        # [T, Ea]
        const float *residual,     # [T, Ea] or NULL
        const float *ln2_gamma,    # [E]
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
        int aligned_intermediate_dim, float eps, void *scratch, mf_team *team,
        int num_threads) noexcept nogil:
    fused_mlp(output, NULL, input, residual, ln2_gamma, NULL, NULL, CK_DT_FP32, w1, b1, w1_dt,
              w2, b2, w2_dt, tokens, embed_dim, aligned_embed_dim, 0, 0, intermediate_dim,
              aligned_intermediate_dim, eps, scratch, 1, team, num_threads)


cdef void mega_fused_outproj_mlp_prefill_f32_kernel(
        float *output,             # [T, Ea]
        const float *attn_out,     # [H, T, Da] head-major
        const float *residual,     # [T, Ea] or NULL
        const float *ln2_gamma,    # [E]
        const void *wo, const float *bo, CKDataType wo_dt,
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int num_heads, int aligned_head_dim,
        int intermediate_dim, int aligned_intermediate_dim, float eps, void *scratch,
        mf_team *team, int num_threads) noexcept nogil:
    fused_mlp(output, attn_out, NULL, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2,
              w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
              intermediate_dim, aligned_intermediate_dim, eps, scratch, 0, team, num_threads)


cdef void mega_fused_mlp_prefill_f32_kernel(
        float *output,             # [T, Ea]
        const float *input,        # [T, Ea]
        const float *residual,     # [T, Ea] or NULL
        const float *ln2_gamma,    # [E]
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
        int aligned_intermediate_dim, float eps, void *scratch, mf_team *team,
        int num_threads) noexcept nogil:
    fused_mlp(output, NULL, input, residual, ln2_gamma, NULL, NULL, CK_DT_FP32, w1, b1, w1_dt,
              w2, b2, w2_dt, tokens, embed_dim, aligned_embed_dim, 0, 0, intermediate_dim,
              aligned_intermediate_dim, eps, scratch, 0, team, num_threads)
