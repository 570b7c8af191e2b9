# The C-level interface between the Python boundary (megafuse/_kernels.pyx) and the kernels of one
# SIMD level (kernels/levels/<level>.pyx).  Each level module fills one KernelTable with pointers
# to its own compiled kernels and hands it out in a capsule; _kernels.pyx calls through it.
#
# One slot per function of include/megafuse/mega_fused_attention.h that runs a kernel, named
# after it, holding the kernel <name>_kernel: the def <name> (and c_<name>) calls slot <name>,
# which is <name>_kernel in one of the family files (docs/design.md's source map lists them).  A
# slot takes the header function's parameters, in its order (already validated: kernels cannot
# fail), then what the boundary decides: the attention tiles where the kernel has attention, the
# thread team its parallel work runs on (the shared team the boundary holds for the call, or NULL:
# then a team-less job, mf_team_run_detached, of num_threads threads) and the thread count.  The
# format layer's slots are named after the defs of
# megafuse/kernels/formats.pxi.
#
# Dimension letters: E = embed_dim, Ea = aligned, D = head_dim, Da = aligned, H = num_heads,
# G = num_kv_heads, T = tokens, I / Ia = (aligned) intermediate_dim.

from megafuse._ckernel_dtype cimport CKDataType

from libc.stddef cimport ptrdiff_t
from libc.stdint cimport int32_t, int64_t, uint32_t

cdef extern from "megafuse/mf_simd.h" nogil:
    const char *MF_SIMD_NAME

# The whole-model step (include/megafuse/mf_model.h, kernels/levels/model_step.pxi) and the thread
# team it runs on (include/megafuse/mf_team.h).
cdef extern from "megafuse/mf_team.h" nogil:
    ctypedef struct mf_team:
        int n_threads
    ctypedef void (*mf_team_fn)(void *ctx, mf_team *team, int thread_id,
                                uint32_t gen) noexcept nogil
    uint32_t mf_atomic_load32(uint32_t *p)
    void mf_atomic_store32(uint32_t *p, uint32_t v)
    void MF_TEAM_PAUSE()
    uint32_t mf_atomic_add32(uint32_t *p, uint32_t v)
    mf_team *mf_team_create(int n_threads)
    void mf_team_destroy(mf_team *t)
    int64_t mf_team_claim_gen(mf_team *t, uint32_t gen)
    void mf_team_wait_done(mf_team *t, uint32_t target)
    void mf_team_chunk_done(mf_team *t)
    void mf_team_run(mf_team *t, uint32_t total, mf_team_fn fn, void *ctx)
    void mf_team_run_detached(int n_threads, uint32_t total, mf_team_fn fn, void *ctx)
    ctypedef struct mf_team_slot:
        mf_team *team
    mf_team *mf_team_slot_acquire(mf_team_slot *s, int n_threads)
    void mf_team_slot_release(mf_team_slot *s)

cdef extern from "megafuse/mf_model.h" nogil:
    enum: MF_STEP_TOKENS
    enum: MF_STEP_SPLIT_FLOATS
    enum: MF_ACT_SILU
    enum: MF_ACT_GELU_TANH
    ctypedef struct mf_model_layer:
        const float *ln1_gamma
        const float *ln2_gamma
        const void *wq
        const void *wk
        const void *wv
        const void *wo
        const void *w1
        const void *w2
        const float *bq
        const float *bk
        const float *bv
        const float *bo
        const float *b1
        const float *b2
        int wq_dt, wk_dt, wv_dt, wo_dt, w1_dt, w2_dt
        void *k_cache
        void *v_cache
        int cache_rows
        int window
        const float *rope_cos
        const float *rope_sin
        const float *q_norm
        const float *k_norm
        const float *post_attn_norm
        const float *post_ffn_norm
    ctypedef struct mf_model:
        int n_layers, E, H, G, D, F, V, C
        float eps
        int int8
        int kv_f16
        int q_tile, kv_tile
        const mf_model_layer *layers
        const void *embedding
        int embedding_dt
        const float *out_norm
        const void *head
        int head_dt
        float embed_scale
        float attn_scale
        float attn_softcap
        float final_softcap
        int activation
    ctypedef struct mf_one_token_plan:
        int kind
        ptrdiff_t first_key, tasks, n_chunks, n_seg, seg_len, max_seg
    ctypedef struct mf_step_scratch:
        size_t x, xn, xq, xqk, q, attn, attnq, act, actq, parts, kv, y
        size_t xq_row, xqk_row, attnq_row, actq_row
        size_t total
    mf_step_scratch mf_step_scratch_layout(size_t E, size_t HD, size_t F, size_t xq_row,
                                           size_t xqk_row, size_t attnq_row, size_t actq_row,
                                           size_t kv_floats, size_t y_floats,
                                           size_t max_segments)
    ctypedef struct mf_lane:
        uint32_t start
        uint32_t end
    ctypedef struct mf_phase:
        int kind
        int layer
        uint32_t base
        uint32_t n
        int n_lanes
        mf_lane lanes[8]
    void mf_phase_cut_lanes(mf_phase *ph, int n_threads)
    uint32_t mf_phase_take(mf_phase *ph, int lane)
    size_t mf_step_max_phases(size_t n_layers)
    enum: MF_STEP_MAX_SEGMENTS
    ctypedef struct mf_segment:
        int t0, n, pos
        void *const *k_cache
        void *const *v_cache
        float *logits
        int all_logits
        float *x_out
        mf_one_token_plan att[2]
        uint32_t att_chunks[2]
        int r0
    ctypedef struct mf_step:
        const mf_model *m
        char *scratch
        mf_step_scratch layout
        mf_phase *phases
        int n_phases
        int n_threads
        const int32_t *tokens
        const float *x_in
        float *hidden
        size_t hidden_layer_stride
        int T
        int R
        mf_segment *segs
        int n_segs
        int row_seg[128]
        int row_pos[128]
        int logit_row[128]
        size_t solo_bytes
    enum: MF_STEP_SOLO_BYTES

cdef extern from "megafuse/mf_attention.h" nogil:
    enum: MF_ATT_MAX_KV_TILE          # upper bound of the KV tile (a tile of scores on the stack)
    enum: MF_ATT_MAX_HEAD_DIM         # head_dim of the attention kernels (larger: a simpler loop)

# Bump when a slot is added or a signature changes: a level module of another version is refused.
cdef enum:
    KERNEL_TABLE_VERSION = 9
    MF_MAX_Q_TILE = 128       # upper bound of the query tile (its softmax state lives on the stack)

ctypedef void (*mega_fused_attention_decode_workspace_fn)(
    float *output,                # [Ea]
    const float *input,           # [Ea]
    const float *residual,        # [Ea] or NULL
    const float *ln1_gamma,       # [E]
    const float *wq, const float *bq,   # [H*Da, Ea], [H*Da] or NULL
    const float *wk, const float *bk,   # [G*Da, Ea], [G*Da] or NULL
    const float *wv, const float *bv,   # [G*Da, Ea], [G*Da] or NULL
    const float *wo, const float *bo,   # [Ea, H*Da], [Ea] or NULL
    float *kv_cache_k,            # [G, cache_capacity, Da]
    float *kv_cache_v,            # [G, cache_capacity, Da]
    const float *rope_cos,        # [>pos, D/2] or NULL
    const float *rope_sin,        # [>pos, D/2] or NULL
    int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
    int head_dim, int aligned_head_dim, int cache_capacity, float eps,
    float *q_output_workspace,    # [2, H*Da]: q, then the attention output
    size_t q_output_workspace_bytes,
    float *kv_workspace,          # [2, G*Da]: k, then v
    size_t kv_workspace_bytes,
    int kv_tile, mf_team *team, int num_threads) noexcept nogil

ctypedef void (*mega_fuse_rmsnorm_qkv_fn)(
    float *q_out,                 # [H*D]
    float *k_out,                 # [G*D]
    float *v_out,                 # [G*D]
    const float *input,           # [hidden]
    const float *gamma,           # [hidden]
    const float *W_qkv,           # [(H+2G)*D, hidden]
    const float *b_qkv,           # [(H+2G)*D] or NULL
    int hidden, int num_heads, int num_kv_heads, int head_dim, float eps,
    mf_team *team, int num_threads) noexcept nogil

ctypedef void (*mega_fuse_rmsnorm_qkv_rope_fn)(
    float *q_out,                 # [H*D]
    float *k_out,                 # [G*D]
    float *v_out,                 # [G*D]
    const float *input,           # [hidden]
    const float *gamma,           # [hidden]
    const float *W_qkv,           # [(H+2G)*D, hidden]
    const float *b_qkv,           # [(H+2G)*D] or NULL
    const float *rope_cos,        # [max_seq, D/2] or NULL (then no rotation)
    const float *rope_sin,
    int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, int max_seq, float eps,
    mf_team *team, int num_threads) noexcept nogil

# mega_fused_attention_prefill and mega_fused_attention_prefill_q8_0
ctypedef void (*mega_fused_attention_prefill_fn)(
    float *output,                # [T, Ea]
    const float *input,           # [T, Ea]
    const float *residual,        # [T, Ea] or NULL
    const float *ln1_gamma,       # [E]
    const void *wq, const float *bq, CKDataType wq_dt,   # [H*Da, Ea] in wq_dt, [H*Da] or NULL
    const void *wk, const float *bk, CKDataType wk_dt,   # [G*Da, Ea] in wk_dt, [G*Da] or NULL
    const void *wv, const float *bv, CKDataType wv_dt,   # [G*Da, Ea] in wv_dt, [G*Da] or NULL
    const void *wo, const float *bo, CKDataType wo_dt,   # [Ea, H*Da] in wo_dt, [Ea] or NULL
    float *kv_cache_k, float *kv_cache_v,         # [G, cache_capacity, Da]
    const float *rope_cos, const float *rope_sin,  # [>= start_pos+T, D/2] or NULL
    int start_pos, int tokens, int cache_capacity, int embed_dim, int aligned_embed_dim,
    int num_heads, int num_kv_heads, int head_dim, int aligned_head_dim, float eps,
    void *scratch,                # include/megafuse/mf_scratch.h layout
    int q_tile, int kv_tile, mf_team *team, int num_threads) noexcept nogil

# mega_fused_outproj_mlp_prefill and mega_fused_outproj_mlp_prefill_f32
ctypedef void (*mega_fused_outproj_mlp_prefill_fn)(
    float *output,                # [T, Ea]
    const float *attn_out,        # [H, T, Da] head-major
    const float *residual,        # [T, Ea] or NULL
    const float *ln2_gamma,       # [E]
    const void *wo, const float *bo, CKDataType wo_dt,   # [Ea, H*Da], [Ea] or NULL
    const void *w1, const float *b1, CKDataType w1_dt,   # [2*Ia, Ea], [2*Ia] or NULL
    const void *w2, const float *b2, CKDataType w2_dt,   # [Ea, Ia], [Ea] or NULL
    int tokens, int embed_dim, int aligned_embed_dim, int num_heads, int aligned_head_dim,
    int intermediate_dim, int aligned_intermediate_dim, float eps,
    void *scratch,                # include/megafuse/mf_scratch.h layout
    mf_team *team, int num_threads) noexcept nogil

# mega_fused_mlp_prefill and mega_fused_mlp_prefill_f32
ctypedef void (*mega_fused_mlp_prefill_fn)(
    float *output,                # [T, Ea]
    const float *input,           # [T, Ea]
    const float *residual,        # [T, Ea] or NULL
    const float *ln2_gamma,       # [E]
    const void *w1, const float *b1, CKDataType w1_dt,   # [2*Ia, Ea], [2*Ia] or NULL
    const void *w2, const float *b2, CKDataType w2_dt,   # [Ea, Ia], [Ea] or NULL
    int tokens, int embed_dim, int aligned_embed_dim, int intermediate_dim,
    int aligned_intermediate_dim, float eps,
    void *scratch,                # include/megafuse/mf_scratch.h layout
    mf_team *team, int num_threads) noexcept nogil

# The format layer (kernels/levels/quant.pxi).  R = rows, C = columns,
# RB = ck_dtype_row_bytes(dt, C), AB = mf_activation_row_bytes(dt, C).
ctypedef void (*quantize_fn)(
    const float *x,               # [R, C] float32
    void *dst,                    # [R, RB] in weight format dt
    Py_ssize_t rows, Py_ssize_t cols, int dt, int num_threads) noexcept nogil

ctypedef void (*dequantize_fn)(
    const void *src,              # [R, RB] in weight format dt
    float *dst,                   # [R, C] float32
    Py_ssize_t rows, Py_ssize_t cols, int dt, int num_threads) noexcept nogil

ctypedef void (*rows_dot_fn)(     # test hook: out[r] = w[r] . x, float (0) or int8 (1) path
    const void *w,                # [R, RB]
    int dt,
    const float *x,               # [C]
    Py_ssize_t rows, Py_ssize_t cols, int quantized,
    void *act_scratch,            # [AB]: x quantized for dt (int8 path)
    float *out,                   # [R]
    int num_threads) noexcept nogil

ctypedef void (*quantize_activations_fn)(   # test hook: the int8 path's activation rows
    const float *x,               # [R, C] float32
    void *dst,                    # [R, AB]
    Py_ssize_t rows, Py_ssize_t cols, int dt_of_weight, int num_threads) noexcept nogil

ctypedef void (*model_forward_fn)(   # megafuse/kernels/levels/model_step.pxi
    mf_step *st,                  # the model (st.m), its scratch and phase table
    mf_team *team,
    const int32_t *tokens,        # [T] token ids, or NULL (then x_in)
    const float *x_in,            # [T, E] or NULL
    int tokens_n, int start_pos,
    float *logits,                # [T, V] (all_logits) or [V], or NULL
    int all_logits,
    float *x_out,                 # [T, E] or NULL
    float *hidden,                # [L, T, E] or NULL
    int num_threads) noexcept nogil

ctypedef void (*model_batch_fn)(   # megafuse/kernels/levels/model_step.pxi
    mf_step *st,                  # st.segs[:n_segs]: each sequence's n, pos, caches, outputs
    mf_team *team,
    const int32_t *tokens,        # [T] every sequence's token ids, in order
    int n_segs, int num_threads) noexcept nogil

ctypedef struct KernelTable:
    int version
    const char *simd_level
    # the header's functions (megafuse/_kernels.pyx)
    mega_fused_attention_decode_workspace_fn mega_fused_attention_decode_workspace
    mega_fuse_rmsnorm_qkv_fn mega_fuse_rmsnorm_qkv
    mega_fuse_rmsnorm_qkv_rope_fn mega_fuse_rmsnorm_qkv_rope
    mega_fused_attention_prefill_fn mega_fused_attention_prefill
    mega_fused_attention_prefill_fn mega_fused_attention_prefill_q8_0
    mega_fused_outproj_mlp_prefill_fn mega_fused_outproj_mlp_prefill
    mega_fused_mlp_prefill_fn mega_fused_mlp_prefill
    mega_fused_outproj_mlp_prefill_fn mega_fused_outproj_mlp_prefill_f32
    mega_fused_mlp_prefill_fn mega_fused_mlp_prefill_f32
    # the format API (megafuse/kernels/formats.pxi)
    quantize_fn quantize
    dequantize_fn dequantize
    rows_dot_fn rows_dot
    quantize_activations_fn quantize_activations
    # the whole-model step (megafuse/llm/_runner.pyx)
    model_forward_fn model_forward
    model_batch_fn model_batch

# What megafuse._kernels shares with megafuse's other compiled modules (the model runner,
# megafuse/llm/_runner.pyx), in the capsule "megafuse.boundary": where it keeps the table of the
# SIMD level in use and the thread count, so that a call reads them as they are then, and the
# thread team every step and header call shares (include/megafuse/mf_team.h, mf_team_slot).
ctypedef struct mf_boundary:
    const KernelTable **table
    const int *num_threads
    mf_team_slot *team_slot
