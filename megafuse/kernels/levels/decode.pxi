# The fused single-token layer: RMSNorm -> Q/K/V -> RoPE -> KV-cache write -> attention over the
# cache -> out-projection + bias + residual.  Float32 weights, float32 activations throughout.
# The attention itself is attend_one_token (attention.pxi): split-KV over long contexts.
#
# Kernel of mega_fused_attention_decode_workspace (and of mega_fused_attention_decode, whose
# boundary allocates the two workspaces): mega_fused_attention_decode_workspace_kernel.


cdef void outproj_rows_block(
        Py_ssize_t e0, const float *wo, const float *bo, const float *residual,
        const float *attn,     # [H*Da]
        float *output,         # [Ea]: rows e0 .. e0+3 written
        Py_ssize_t E, Py_ssize_t Ea, Py_ssize_t HDa) noexcept nogil:
    """output[e] = wo[e] . attn + bo[e] + residual[e] for 4 rows (0 for e >= E)."""
    cdef const float *rows[4]
    cdef float out4[4]
    cdef Py_ssize_t r, e
    for r in range(4):
        rows[r] = wo + min(e0 + r, E - 1) * HDa
    if e0 < E:
        mf_dot_1x4_f32(attn, rows, HDa, out4, wo + (e0 + 4) * HDa)   # next: the following 4 rows
    for r in range(4):
        e = e0 + r
        if e >= Ea:
            break
        if e >= E:
            output[e] = 0.0
        else:
            output[e] = out4[r] + (bo[e] if bo != NULL else 0.0) + (
                residual[e] if residual != NULL else 0.0)


cdef void mega_fused_attention_decode_workspace_kernel(
        float *output,             # [Ea]: columns >= E written as 0
        const float *input,        # [Ea]
        const float *residual,     # [Ea] or NULL
        const float *ln1_gamma,    # [E]
        const float *wq, const float *bq,   # [H*Da, Ea], [H*Da]
        const float *wk, const float *bk,   # [G*Da, Ea], [G*Da]
        const float *wv, const float *bv,   # [G*Da, Ea], [G*Da]
        const float *wo, const float *bo,   # [Ea, H*Da], [Ea]
        float *kv_cache_k,         # [G, cache_capacity, Da]
        float *kv_cache_v,         # [G, cache_capacity, Da]
        const float *rope_cos,     # [>pos, D/2] or NULL
        const float *rope_sin,     # [>pos, D/2] or NULL
        int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
        int head_dim, int aligned_head_dim, int cache_capacity, float eps,
        float *q_output_workspace,   # [2, H*Da]: q, then the attention output
        size_t q_output_workspace_bytes,   # (checked by the boundary; not needed here)
        float *kv_workspace,         # [2, G*Da]: k, then v
        size_t kv_workspace_bytes,
        int kv_tile, int num_threads) noexcept nogil:
    cdef Py_ssize_t E = embed_dim, Ea = aligned_embed_dim, H = num_heads, G = num_kv_heads
    cdef Py_ssize_t D = head_dim, Da = aligned_head_dim, C = cache_capacity, P = pos
    cdef Py_ssize_t HDa = H * Da
    cdef float *q = q_output_workspace          # [H, Da]
    cdef float *attn = q_output_workspace + HDa  # [H, Da]
    cdef float *k = kv_workspace                 # [G, Da]
    cdef float *v = kv_workspace + G * Da        # [G, Da]
    cdef float scale = 1.0 / sqrtf(<float>D)
    cdef Py_ssize_t g, blk

    project_qkv(input, ln1_gamma, rms_inverse(input, E, eps), wq, bq, wk, bk, wv, bv,
                q, k, v, E, Ea, H, G, D, Da, num_threads)
    if rope_cos != NULL:
        rope_rotate_heads(q, H, D, Da, rope_cos + P * (D // 2), rope_sin + P * (D // 2))
        rope_rotate_heads(k, G, D, Da, rope_cos + P * (D // 2), rope_sin + P * (D // 2))

    # The token's k, v go to row [g, pos] of the caches (padded dims are already 0).
    for g in range(G):
        memcpy(kv_cache_k + (g * C + P) * Da, k + g * Da, Da * sizeof(float))
        memcpy(kv_cache_v + (g * C + P) * Da, v + g * Da, Da * sizeof(float))

    # attention of the token's query heads over positions 0..pos (attention.pxi)
    attend_one_token(q, kv_cache_k, kv_cache_v, P, H, G, D, Da, C, scale, kv_tile, attn,
                     num_threads)

    # output = attn @ wo.T + bo + residual.  Row e of output reads only residual[e]: output may be
    # the residual (or the input, no longer needed) itself.
    for blk in prange((Ea + 3) // 4, num_threads=num_threads, schedule='static', nogil=True):
        outproj_rows_block(blk * 4, wo, bo, residual, attn, output, E, Ea, HDa)
