# The cimportable C-level surface of megafuse: the header's functions (same parameters, same
# order) as noexcept nogil C functions, prefixed c_ (the unprefixed names are the Python defs).
#
#     from megafuse._kernels cimport c_mega_fused_attention_decode_workspace
#
# They run the SIMD level chosen when megafuse was imported, with megafuse.get_num_threads()
# threads.  They do NOT validate: the caller vouches for every buffer size and dimension, exactly
# as for the C header (include/megafuse/mega_fused_attention.h); validated entry points are the
# Python functions of the same names.

cdef void c_mega_fused_attention_decode(
    float *output, const float *input, const float *residual, const float *ln1_gamma,
    const float *wq, const float *bq, const float *wk, const float *bk,
    const float *wv, const float *bv, const float *wo, const float *bo,
    float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
    int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
    int head_dim, int aligned_head_dim, int cache_capacity, float eps) noexcept nogil

cdef void c_mega_fused_attention_decode_workspace(
    float *output, const float *input, const float *residual, const float *ln1_gamma,
    const float *wq, const float *bq, const float *wk, const float *bk,
    const float *wv, const float *bv, const float *wo, const float *bo,
    float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
    int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
    int head_dim, int aligned_head_dim, int cache_capacity, float eps,
    float *q_output_workspace, size_t q_output_workspace_bytes,
    float *kv_workspace, size_t kv_workspace_bytes) noexcept nogil

cdef void c_mega_fuse_rmsnorm_qkv(
    float *q_out, float *k_out, float *v_out, const float *input, const float *gamma,
    const float *W_qkv, const float *b_qkv, int hidden, int num_heads, int num_kv_heads,
    int head_dim, float eps) noexcept nogil

cdef void c_mega_fuse_rmsnorm_qkv_rope(
    float *q_out, float *k_out, float *v_out, const float *input, const float *gamma,
    const float *W_qkv, const float *b_qkv, const float *rope_cos, const float *rope_sin,
    int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, int max_seq,
    float eps) noexcept nogil

cdef void c_mega_fuse_get_optimal_tiles(int *q_tile, int *kv_tile, int head_dim) noexcept nogil
