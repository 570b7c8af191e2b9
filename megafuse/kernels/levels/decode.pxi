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


cdef struct DecodeJob:
    # the steps of mega_fused_attention_decode_workspace_kernel that are not projections or
    # attention (RoPE and the cache write; the out-projection)
    float *q                   # [H, Da]
    float *k                   # [G, Da]
    const float *v             # [G, Da]
    float *kv_cache_k          # [G, C, Da]
    float *kv_cache_v
    const float *cos_p         # [D/2]: the rows of position P, or NULL
    const float *sin_p
    const float *wo            # [Ea, H*Da]
    const float *bo            # [Ea] or NULL
    const float *residual      # [Ea] or NULL
    const float *attn          # [H, Da]
    float *output              # [Ea]
    Py_ssize_t E, Ea, H, G, D, Da, C, P


cdef void decode_job_rope_store(const void *ctx, Py_ssize_t arg, Py_ssize_t i) noexcept nogil:
    """RoPE of q and k, then the token's k, v to row [g, P] of the caches (padded dims are
    already 0)."""
    cdef const DecodeJob *c = <const DecodeJob *>ctx
    cdef Py_ssize_t g
    if c.cos_p != NULL:
        rope_rotate_heads(c.q, c.H, c.D, c.Da, c.cos_p, c.sin_p)
        rope_rotate_heads(c.k, c.G, c.D, c.Da, c.cos_p, c.sin_p)
    for g in range(c.G):
        memcpy(c.kv_cache_k + (g * c.C + c.P) * c.Da, c.k + g * c.Da, c.Da * sizeof(float))
        memcpy(c.kv_cache_v + (g * c.C + c.P) * c.Da, c.v + g * c.Da, c.Da * sizeof(float))


cdef void decode_job_outproj(const void *ctx, Py_ssize_t arg, Py_ssize_t blk) noexcept nogil:
    cdef const DecodeJob *c = <const DecodeJob *>ctx
    outproj_rows_block(blk * 4, c.wo, c.bo, c.residual, c.attn, c.output, c.E, c.Ea,
                       c.H * c.Da)


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
        int kv_tile, mf_team *team, int num_threads) noexcept nogil:
    """One job of the team: the projections, RoPE and the cache write, the attention, the
    out-projection, each phase after the one before."""
    cdef Py_ssize_t E = embed_dim, Ea = aligned_embed_dim, H = num_heads, G = num_kv_heads
    cdef Py_ssize_t D = head_dim, Da = aligned_head_dim, C = cache_capacity, P = pos
    cdef Py_ssize_t HDa = H * Da
    cdef float *q = q_output_workspace          # [H, Da]
    cdef float *attn = q_output_workspace + HDa  # [H, Da]
    cdef float *k = kv_workspace                 # [G, Da]
    cdef float *v = kv_workspace + G * Da        # [G, Da]
    cdef float scale = 1.0 / sqrtf(<float>D)
    cdef Job job
    cdef QkvJob qkv
    cdef OneTokenJob att
    cdef DecodeJob dec
    job_init(&job, team, num_threads)
    project_qkv_phase(&job, &qkv, input, ln1_gamma, rms_inverse(input, E, eps), wq, bq, wk, bk,
                      wv, bv, q, k, v, E, Ea, H, G, D, Da)

    dec.q, dec.k, dec.v, dec.kv_cache_k, dec.kv_cache_v = q, k, v, kv_cache_k, kv_cache_v
    dec.cos_p = rope_cos + P * (D // 2) if rope_cos != NULL else NULL
    dec.sin_p = rope_sin + P * (D // 2) if rope_cos != NULL else NULL
    dec.wo, dec.bo, dec.residual, dec.attn, dec.output = wo, bo, residual, attn, output
    dec.E, dec.Ea, dec.H, dec.G, dec.D, dec.Da, dec.C, dec.P = E, Ea, H, G, D, Da, C, P
    job_add(&job, decode_job_rope_store, &dec, 0, 1, 1)

    # attention of the token's query heads over positions 0..pos (attention.pxi)
    attend_one_token_phases(&job, &att, q, kv_cache_k, kv_cache_v, P, H, G, D, Da, C, scale,
                            kv_tile, attn)

    # output = attn @ wo.T + bo + residual.  Row e of output reads only residual[e]: output may be
    # the residual (or the input, no longer needed) itself.
    job_add(&job, decode_job_outproj, &dec, 0, (Ea + 3) // 4, 0)
    job_run(&job)
