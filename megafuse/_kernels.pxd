# The cimportable C-level surface of megafuse: every function of the C header
# (include/megafuse/mega_fused_attention.h), same parameters, same order, as a noexcept nogil C
# function prefixed c_ (the unprefixed names are the Python defs).
#
#     from megafuse._kernels cimport c_mega_fused_attention_prefill
#     from megafuse._ckernel_dtype cimport CKDataType, CK_DT_Q8_0
#
# They run the SIMD level chosen when megafuse was imported, with megafuse.get_num_threads()
# threads and this CPU's tiles.  They do NOT validate: the caller vouches for every buffer size
# and dimension, exactly as for the C header; validated entry points are the Python functions of
# the same names.  The scratch-size functions return SIZE_MAX (an allocation that fails) for a
# dimension <= 0 or a scratch that does not fit 64-bit sizes, where the Python helpers raise.
# c_mega_fuse_report_stats takes the GIL to print to sys.stdout.
# (megafuse/kernels/capi.pxi holds the definitions.)

from megafuse._ckernel_dtype cimport CKDataType

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

cdef void c_mega_fused_attention_prefill(
    float *output, const float *input, const float *residual, const float *ln1_gamma,
    const void *wq, const float *bq, CKDataType wq_dt,
    const void *wk, const float *bk, CKDataType wk_dt,
    const void *wv, const float *bv, CKDataType wv_dt,
    const void *wo, const float *bo, CKDataType wo_dt,
    float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
    int start_pos, int tokens, int cache_capacity, int embed_dim, int aligned_embed_dim,
    int num_heads, int num_kv_heads, int head_dim, int aligned_head_dim, float eps,
    void *scratch) noexcept nogil

cdef void c_mega_fused_attention_prefill_q8_0(
    float *output, const float *input, const float *residual, const float *ln1_gamma,
    const void *wq, const float *bq, CKDataType wq_dt,
    const void *wk, const float *bk, CKDataType wk_dt,
    const void *wv, const float *bv, CKDataType wv_dt,
    const void *wo, const float *bo, CKDataType wo_dt,
    float *kv_cache_k, float *kv_cache_v, const float *rope_cos, const float *rope_sin,
    int start_pos, int tokens, int cache_capacity, int embed_dim, int aligned_embed_dim,
    int num_heads, int num_kv_heads, int head_dim, int aligned_head_dim, float eps,
    void *scratch) noexcept nogil

cdef size_t c_mega_fused_attention_prefill_scratch_size(
    int tokens, int aligned_embed_dim, int num_heads, int aligned_head_dim) noexcept nogil

cdef size_t c_mega_fused_attention_prefill_q8_0_scratch_size(
    int tokens, int aligned_embed_dim, int num_heads, int aligned_head_dim) noexcept nogil

cdef void c_mega_fused_outproj_mlp_prefill(
    float *output, const float *attn_out, const float *residual, const float *ln2_gamma,
    const void *wo, const float *bo, CKDataType wo_dt,
    const void *w1, const float *b1, CKDataType w1_dt,
    const void *w2, const float *b2, CKDataType w2_dt,
    int tokens, int embed_dim, int aligned_embed_dim, int num_heads, int aligned_head_dim,
    int intermediate_dim, int aligned_intermediate_dim, float eps, void *scratch) noexcept nogil

cdef size_t c_mega_fused_outproj_mlp_prefill_scratch_size(
    int tokens, int aligned_embed_dim, int num_heads, int aligned_head_dim,
    int aligned_intermediate_dim) noexcept nogil

cdef void c_mega_fused_mlp_prefill(
    float *output, const float *input, const float *residual, const float *ln2_gamma,
    const void *w1, const float *b1, CKDataType w1_dt,
    const void *w2, const float *b2, CKDataType w2_dt,
    int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
    int aligned_intermediate_dim, float eps, void *scratch) noexcept nogil

cdef size_t c_mega_fused_mlp_prefill_scratch_size(
    int tokens, int aligned_embed_dim, int aligned_intermediate_dim) noexcept nogil

cdef void c_mega_fused_outproj_mlp_prefill_f32(
    float *output, const float *attn_out, const float *residual, const float *ln2_gamma,
    const void *wo, const float *bo, CKDataType wo_dt,
    const void *w1, const float *b1, CKDataType w1_dt,
    const void *w2, const float *b2, CKDataType w2_dt,
    int tokens, int embed_dim, int aligned_embed_dim, int num_heads, int aligned_head_dim,
    int intermediate_dim, int aligned_intermediate_dim, float eps, void *scratch) noexcept nogil

cdef void c_mega_fused_mlp_prefill_f32(
    float *output, const float *input, const float *residual, const float *ln2_gamma,
    const void *w1, const float *b1, CKDataType w1_dt,
    const void *w2, const float *b2, CKDataType w2_dt,
    int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
    int aligned_intermediate_dim, float eps, void *scratch) noexcept nogil

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

cdef void c_mega_fuse_report_stats(int hidden, int num_layers, int seq_len) noexcept nogil
