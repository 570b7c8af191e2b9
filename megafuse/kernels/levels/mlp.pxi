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


cdef void quantize_rows_for(int dt, const float *x, Py_ssize_t ldx, char *xq, Py_ssize_t xq_row,
                            Py_ssize_t n, Py_ssize_t nt, int num_threads) noexcept nogil:
    """Quantize nt rows of n floats to the activation format of weight format dt (if any; not
    at all on the float path, xq = NULL)."""
    cdef Py_ssize_t t
    if xq == NULL or not uses_q8_activations(dt):
        return
    for t in prange(nt, num_threads=num_threads, schedule='static', nogil=True):
        quantize_activation_row(x + t * ldx, xq + t * xq_row, n, activation_format(dt))


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
        int int8_path, int num_threads) noexcept nogil:
    """Every MLP kernel: int8_path = 1 quantizes the activations of block-format weights,
    0 keeps them float32 (no quantized row exists: rows_q, act_q are NULL)."""
    cdef Py_ssize_t E = embed_dim, Ea = aligned_embed_dim, T = tokens
    cdef Py_ssize_t H = num_heads, Da = aligned_head_dim
    cdef Py_ssize_t HDa = H * Da if attn_out != NULL else 0
    cdef Py_ssize_t I = intermediate_dim, Ia = aligned_intermediate_dim
    cdef mf_mlp_scratch layout = mf_mlp_scratch_layout(T, Ea, HDa, Ia)
    cdef char *base = <char *>scratch
    cdef float *rows = <float *>(base + layout.f)     # [tile, max(HDa, Ea)]: attn rows, then z
    cdef char *rows_q = base + layout.q if int8_path else NULL    # [tile, q_row]
    cdef float *act = <float *>(base + layout.a)      # [tile, Ia]: silu(gate) * up
    cdef char *act_q = base + layout.aq if int8_path else NULL    # [tile, aq_row]
    cdef Py_ssize_t wo_row = ck_dtype_row_bytes(wo_dt, HDa) if HDa else 0
    cdef Py_ssize_t w1_row = ck_dtype_row_bytes(w1_dt, Ea), w2_row = ck_dtype_row_bytes(w2_dt, Ia)
    cdef Py_ssize_t t0, nt, t, j, h, e, i, blk
    cdef Py_ssize_t n_be = (Ea + GEMM_ROWS - 1) // GEMM_ROWS    # blocks of output rows
    cdef const float *h_rows        # [T, Ea]: the hidden state the MLP normalises
    cdef const float *base_rows     # [T, Ea] or NULL: what the MLP output is added to

    if attn_out != NULL:
        h_rows = output            # h1 = attn @ wo.T + bo + residual lands in output first
        base_rows = output
    else:
        h_rows = input
        base_rows = residual

    t0 = 0
    while t0 < T:
        nt = min(<Py_ssize_t>layout.tile, T - t0)

        # ---- out-projection: output[t] = attn[t] @ wo.T + bo + residual[t] -------------------
        if attn_out != NULL:
            for j in prange(nt, num_threads=num_threads, schedule='static', nogil=True):
                for h in range(H):     # gather token t0+j's row from the head-major layout
                    memcpy(rows + j * HDa + h * Da, attn_out + (h * T + t0 + j) * Da,
                           Da * sizeof(float))
            quantize_rows_for(wo_dt, rows, HDa, rows_q, layout.q_row, HDa, nt, num_threads)
            for blk in prange(n_be, num_threads=num_threads, schedule='guided', nogil=True):
                linear_block(blk * GEMM_ROWS, <const char *>wo, wo_row, wo_dt, HDa, bo, E, Ea,
                             rows, HDa, rows_q, layout.q_row, nt, output + t0 * Ea,
                             residual + t0 * Ea if residual != NULL else NULL, Ea)

        # ---- z = rmsnorm(h) -------------------------------------------------------------------
        for j in prange(nt, num_threads=num_threads, schedule='static', nogil=True):
            rmsnorm_row(h_rows + (t0 + j) * Ea, ln2_gamma, E, Ea, eps, rows + j * Ea)
        quantize_rows_for(w1_dt, rows, Ea, rows_q, layout.q_row, Ea, nt, num_threads)

        # ---- act = silu(z @ Wg.T + bg) * (z @ Wu.T + bu): gate row i and up row Ia+i together --
        for blk in prange((Ia + GEMM_ROWS - 1) // GEMM_ROWS, num_threads=num_threads,
                          schedule='guided', nogil=True):
            swiglu_block(blk * GEMM_ROWS, <const char *>w1, w1_row, w1_dt, Ea, b1, rows, rows_q,
                         layout.q_row, nt, I, Ia, act)
        quantize_rows_for(w2_dt, act, Ia, act_q, layout.aq_row, Ia, nt, num_threads)

        # ---- output[t] = base[t] + act[t] @ w2.T + b2 ------------------------------------------
        for blk in prange(n_be, num_threads=num_threads, schedule='guided', nogil=True):
            linear_block(blk * GEMM_ROWS, <const char *>w2, w2_row, w2_dt, Ia, b2, E, Ea, act, Ia,
                         act_q, layout.aq_row, nt, output + t0 * Ea,
                         base_rows + t0 * Ea if base_rows != NULL else NULL, Ea)
        t0 += nt


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
        int num_threads) noexcept nogil:
    fused_mlp(output, attn_out, NULL, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2,
              w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
              intermediate_dim, aligned_intermediate_dim, eps, scratch, 1, num_threads)


cdef void mega_fused_mlp_prefill_kernel(
        float *output,             # [T, Ea]
        const float *input,        # [T, Ea]
        const float *residual,     # [T, Ea] or NULL
        const float *ln2_gamma,    # [E]
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
        int aligned_intermediate_dim, float eps, void *scratch, int num_threads) noexcept nogil:
    fused_mlp(output, NULL, input, residual, ln2_gamma, NULL, NULL, CK_DT_FP32, w1, b1, w1_dt,
              w2, b2, w2_dt, tokens, embed_dim, aligned_embed_dim, 0, 0, intermediate_dim,
              aligned_intermediate_dim, eps, scratch, 1, num_threads)


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
        int num_threads) noexcept nogil:
    fused_mlp(output, attn_out, NULL, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2,
              w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
              intermediate_dim, aligned_intermediate_dim, eps, scratch, 0, num_threads)


cdef void mega_fused_mlp_prefill_f32_kernel(
        float *output,             # [T, Ea]
        const float *input,        # [T, Ea]
        const float *residual,     # [T, Ea] or NULL
        const float *ln2_gamma,    # [E]
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
        int aligned_intermediate_dim, float eps, void *scratch, int num_threads) noexcept nogil:
    fused_mlp(output, NULL, input, residual, ln2_gamma, NULL, NULL, CK_DT_FP32, w1, b1, w1_dt,
              w2, b2, w2_dt, tokens, embed_dim, aligned_embed_dim, 0, 0, intermediate_dim,
              aligned_intermediate_dim, eps, scratch, 0, num_threads)
