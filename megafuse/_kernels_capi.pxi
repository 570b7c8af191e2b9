# The C API (included by megafuse/_kernels.pyx): the header's functions as noexcept nogil C
# functions c_<name>, declared for other Cython modules in megafuse/_kernels.pxd.  No validation:
# the caller vouches for every buffer size and dimension, exactly as for the C header
# (include/megafuse/mega_fused_attention.h).  Each calls the same kernel-table slot as the def of
# the same name, with this module's thread count and tiles.


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
    _K.mega_fused_attention_decode_workspace(
        output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo, kv_cache_k,
        kv_cache_v, rope_cos, rope_sin, pos, embed_dim, aligned_embed_dim, num_heads,
        num_kv_heads, head_dim, aligned_head_dim, cache_capacity, eps, q_output_workspace,
        q_output_workspace_bytes, kv_workspace, kv_workspace_bytes, kv_tile, _num_threads)


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
    _K.mega_fuse_rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, hidden,
                             num_heads, num_kv_heads, head_dim, eps, _num_threads)


cdef void c_mega_fuse_rmsnorm_qkv_rope(
        float *q_out, float *k_out, float *v_out, const float *input, const float *gamma,
        const float *W_qkv, const float *b_qkv, const float *rope_cos, const float *rope_sin,
        int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, int max_seq,
        float eps) noexcept nogil:
    _K.mega_fuse_rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos,
                                  rope_sin, pos, hidden, num_heads, num_kv_heads, head_dim,
                                  max_seq, eps, _num_threads)


cdef void c_mega_fuse_get_optimal_tiles(int *q_tile, int *kv_tile, int head_dim) noexcept nogil:
    _tiles(head_dim, q_tile, kv_tile)
