# The C API (included by megafuse/_kernels.pyx): every function of the header as a noexcept nogil
# C function c_<name>, declared for other Cython modules in megafuse/_kernels.pxd.  No validation:
# the caller vouches for every buffer size and dimension, exactly as for the C header
# (include/megafuse/mega_fused_attention.h).  Each calls the same kernel-table slot as the def of
# the same name, with this module's thread count and tiles, on the shared thread team when no
# other call holds it (else on threads of no team: _team_take).


cdef void c_mega_fused_attention_decode_workspace(
        float *output, const float *input, const float *residual, const float *ln1_gamma,
        const float *wq, const float *bq, const float *wk, const float *bk,
        const float *wv, const float *bv, const float *wo, const float *bo,
        float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
        int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
        int head_dim, int aligned_head_dim, int cache_capacity, float eps,
        float *q_output_workspace, size_t q_output_workspace_bytes,
        float *kv_workspace, size_t kv_workspace_bytes) noexcept nogil:
    cdef int q_tile, kv_tile
    _tiles(head_dim, &q_tile, &kv_tile)
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fused_attention_decode_workspace(
        output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo, kv_cache_k,
        kv_cache_v, rope_cos, rope_sin, pos, embed_dim, aligned_embed_dim, num_heads,
        num_kv_heads, head_dim, aligned_head_dim, cache_capacity, eps, q_output_workspace,
        q_output_workspace_bytes, kv_workspace, kv_workspace_bytes, kv_tile, team, nt)
    _team_give(team)


cdef void c_mega_fused_attention_decode(
        float *output, const float *input, const float *residual, const float *ln1_gamma,
        const float *wq, const float *bq, const float *wk, const float *bk,
        const float *wv, const float *bv, const float *wo, const float *bo,
        float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
        int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
        int head_dim, int aligned_head_dim, int cache_capacity, float eps) noexcept nogil:
    """Allocates the two workspaces; if that fails, output is filled with NaN (nothing else
    is written)."""
    cdef size_t q_bytes = 2 * <size_t>num_heads * aligned_head_dim * sizeof(float)
    cdef size_t kv_bytes = 2 * <size_t>num_kv_heads * aligned_head_dim * sizeof(float)
    cdef float *ws = <float *>malloc(q_bytes + kv_bytes)
    cdef Py_ssize_t e
    if ws == NULL:
        for e in range(aligned_embed_dim):
            output[e] = NAN
        return
    c_mega_fused_attention_decode_workspace(
        output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo, kv_cache_k,
        kv_cache_v, rope_cos, rope_sin, pos, embed_dim, aligned_embed_dim, num_heads,
        num_kv_heads, head_dim, aligned_head_dim, cache_capacity, eps, ws, q_bytes,
        ws + q_bytes // sizeof(float), kv_bytes)
    free(ws)


cdef void c_mega_fuse_rmsnorm_qkv(
        float *q_out, float *k_out, float *v_out, const float *input, const float *gamma,
        const float *W_qkv, const float *b_qkv, int hidden, int num_heads, int num_kv_heads,
        int head_dim, float eps) noexcept nogil:
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fuse_rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, hidden,
                             num_heads, num_kv_heads, head_dim, eps, team, nt)
    _team_give(team)


cdef void c_mega_fuse_rmsnorm_qkv_rope(
        float *q_out, float *k_out, float *v_out, const float *input, const float *gamma,
        const float *W_qkv, const float *b_qkv, const float *rope_cos, const float *rope_sin,
        int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, int max_seq,
        float eps) noexcept nogil:
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fuse_rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos,
                                  rope_sin, pos, hidden, num_heads, num_kv_heads, head_dim,
                                  max_seq, eps, team, nt)
    _team_give(team)


cdef void c_mega_fuse_get_optimal_tiles(int *q_tile, int *kv_tile, int head_dim) noexcept nogil:
    _tiles(head_dim, q_tile, kv_tile)


# ---- prefill -----------------------------------------------------------------------------------

cdef void c_mega_fused_attention_prefill(
        float *output, const float *input, const float *residual, const float *ln1_gamma,
        const void *wq, const float *bq, CKDataType wq_dt,
        const void *wk, const float *bk, CKDataType wk_dt,
        const void *wv, const float *bv, CKDataType wv_dt,
        const void *wo, const float *bo, CKDataType wo_dt,
        float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
        int start_pos, int tokens, int cache_capacity, int embed_dim, int aligned_embed_dim,
        int num_heads, int num_kv_heads, int head_dim, int aligned_head_dim, float eps,
        void *scratch) noexcept nogil:
    cdef int q_tile, kv_tile
    _tiles(head_dim, &q_tile, &kv_tile)
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fused_attention_prefill(
        output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt, wo, bo,
        wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens, cache_capacity,
        embed_dim, aligned_embed_dim, num_heads, num_kv_heads, head_dim, aligned_head_dim, eps,
        scratch, q_tile, kv_tile, team, nt)
    _team_give(team)


cdef void c_mega_fused_attention_prefill_q8_0(
        float *output, const float *input, const float *residual, const float *ln1_gamma,
        const void *wq, const float *bq, CKDataType wq_dt,
        const void *wk, const float *bk, CKDataType wk_dt,
        const void *wv, const float *bv, CKDataType wv_dt,
        const void *wo, const float *bo, CKDataType wo_dt,
        float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
        int start_pos, int tokens, int cache_capacity, int embed_dim, int aligned_embed_dim,
        int num_heads, int num_kv_heads, int head_dim, int aligned_head_dim, float eps,
        void *scratch) noexcept nogil:
    cdef int q_tile, kv_tile
    _tiles(head_dim, &q_tile, &kv_tile)
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fused_attention_prefill_q8_0(
        output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt, wo, bo,
        wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens, cache_capacity,
        embed_dim, aligned_embed_dim, num_heads, num_kv_heads, head_dim, aligned_head_dim, eps,
        scratch, q_tile, kv_tile, team, nt)
    _team_give(team)


cdef size_t _c_prefill_scratch_size(int T, int Ea, int H, int Da, int int8_path) noexcept nogil:
    """The layout's total, or SIZE_MAX for a dimension <= 0 or a bound past 64-bit sizes."""
    if T <= 0 or Ea <= 0 or H <= 0 or Da <= 0:
        return SIZE_MAX
    if _prefill_scratch_bound(T, Ea, _mul(H, Da)) < 0:
        return SIZE_MAX
    return scr.mf_prefill_scratch_layout(T, Ea, H, Da, int8_path).total


cdef size_t c_mega_fused_attention_prefill_scratch_size(
        int tokens, int aligned_embed_dim, int num_heads, int aligned_head_dim) noexcept nogil:
    return _c_prefill_scratch_size(tokens, aligned_embed_dim, num_heads, aligned_head_dim, 0)


cdef size_t c_mega_fused_attention_prefill_q8_0_scratch_size(
        int tokens, int aligned_embed_dim, int num_heads, int aligned_head_dim) noexcept nogil:
    return _c_prefill_scratch_size(tokens, aligned_embed_dim, num_heads, aligned_head_dim, 1)


# ---- the MLP blocks ----------------------------------------------------------------------------

cdef void c_mega_fused_outproj_mlp_prefill(
        float *output, const float *attn_out, const float *residual, const float *ln2_gamma,
        const void *wo, const float *bo, CKDataType wo_dt,
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int num_heads, int aligned_head_dim,
        int intermediate_dim, int aligned_intermediate_dim, float eps,
        void *scratch) noexcept nogil:
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fused_outproj_mlp_prefill(
        output, attn_out, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2, w2_dt,
        tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim, intermediate_dim,
        aligned_intermediate_dim, eps, scratch, team, nt)
    _team_give(team)


cdef void c_mega_fused_outproj_mlp_prefill_f32(
        float *output, const float *attn_out, const float *residual, const float *ln2_gamma,
        const void *wo, const float *bo, CKDataType wo_dt,
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int num_heads, int aligned_head_dim,
        int intermediate_dim, int aligned_intermediate_dim, float eps,
        void *scratch) noexcept nogil:
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fused_outproj_mlp_prefill_f32(
        output, attn_out, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2, w2_dt,
        tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim, intermediate_dim,
        aligned_intermediate_dim, eps, scratch, team, nt)
    _team_give(team)


cdef size_t c_mega_fused_outproj_mlp_prefill_scratch_size(
        int tokens, int aligned_embed_dim, int num_heads, int aligned_head_dim,
        int aligned_intermediate_dim) noexcept nogil:
    """The layout's total, or SIZE_MAX for a dimension <= 0 or a bound past 64-bit sizes."""
    cdef Py_ssize_t HDa = _mul(num_heads, aligned_head_dim)
    if (tokens <= 0 or aligned_embed_dim <= 0 or num_heads <= 0 or aligned_head_dim <= 0
            or aligned_intermediate_dim <= 0):
        return SIZE_MAX
    if _mlp_scratch_bound(tokens, aligned_embed_dim, HDa, aligned_intermediate_dim) < 0:
        return SIZE_MAX
    return scr.mf_mlp_scratch_layout(tokens, aligned_embed_dim, HDa,
                                     aligned_intermediate_dim).total


cdef void c_mega_fused_mlp_prefill(
        float *output, const float *input, const float *residual, const float *ln2_gamma,
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
        int aligned_intermediate_dim, float eps, void *scratch) noexcept nogil:
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fused_mlp_prefill(output, input, residual, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt,
                              tokens, embed_dim, aligned_embed_dim, intermediate_dim,
                              aligned_intermediate_dim, eps, scratch, team, nt)
    _team_give(team)


cdef void c_mega_fused_mlp_prefill_f32(
        float *output, const float *input, const float *residual, const float *ln2_gamma,
        const void *w1, const float *b1, CKDataType w1_dt,
        const void *w2, const float *b2, CKDataType w2_dt,
        int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
        int aligned_intermediate_dim, float eps, void *scratch) noexcept nogil:
    cdef int nt = _num_threads
    cdef mf_team *team = _team_take(nt)
    _K.mega_fused_mlp_prefill_f32(output, input, residual, ln2_gamma, w1, b1, w1_dt, w2, b2,
                                  w2_dt, tokens, embed_dim, aligned_embed_dim, intermediate_dim,
                                  aligned_intermediate_dim, eps, scratch, team, nt)
    _team_give(team)


cdef size_t c_mega_fused_mlp_prefill_scratch_size(
        int tokens, int aligned_embed_dim, int aligned_intermediate_dim) noexcept nogil:
    """The layout's total, or SIZE_MAX for a dimension <= 0 or a bound past 64-bit sizes."""
    if tokens <= 0 or aligned_embed_dim <= 0 or aligned_intermediate_dim <= 0:
        return SIZE_MAX
    if _mlp_scratch_bound(tokens, aligned_embed_dim, 0, aligned_intermediate_dim) < 0:
        return SIZE_MAX
    return scr.mf_mlp_scratch_layout(tokens, aligned_embed_dim, 0, aligned_intermediate_dim).total


# ---- the report --------------------------------------------------------------------------------

cdef void c_mega_fuse_report_stats(int hidden, int num_layers, int seq_len) noexcept nogil:
    """Prints through the def (taking the GIL); an argument <= 0 prints the ValueError as an
    unraisable exception instead (a void function of the header cannot report it)."""
    with gil:
        mega_fuse_report_stats(hidden, num_layers, seq_len)
