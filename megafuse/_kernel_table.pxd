# The C-level interface between the Python boundary (megafuse/_kernels.pyx) and the kernels of one
# SIMD level (megafuse/_simd_<level>.pyx).  Each level module fills one KernelTable with pointers
# to its own compiled kernels and hands it out in a capsule; _kernels.pyx calls through it.
#
# Kernels take the header's parameters (already validated: they cannot fail) plus the tiles and
# the thread count, which the boundary decides.  Dimension letters: E = embed_dim, Ea = aligned,
# D = head_dim, Da = aligned, H = num_heads, G = num_kv_heads.

cdef extern from "megafuse/mf_simd.h" nogil:
    const char *MF_SIMD_NAME

# Bump when a field is added or a signature changes: a level module of another version is refused.
cdef enum:
    KERNEL_TABLE_VERSION = 1
    MF_MAX_KV_TILE = 256      # upper bound of the KV tile (decode keeps one tile of scores on the stack)

ctypedef void (*attention_decode_fn)(
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
    float *kv_workspace,          # [2, G*Da]: k, then v
    int kv_tile, int num_threads) noexcept nogil

ctypedef void (*rmsnorm_qkv_rope_fn)(
    float *q_out,                 # [H*D]
    float *k_out,                 # [G*D]
    float *v_out,                 # [G*D]
    const float *input,           # [hidden]
    const float *gamma,           # [hidden]
    const float *W_qkv,           # [(H+2G)*D, hidden]
    const float *b_qkv,           # [(H+2G)*D] or NULL
    const float *rope_cos,        # [>pos, D/2] or NULL (then no rotation)
    const float *rope_sin,
    int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, float eps,
    int num_threads) noexcept nogil

ctypedef struct KernelTable:
    int version
    const char *simd_level
    attention_decode_fn attention_decode
    rmsnorm_qkv_rope_fn rmsnorm_qkv_rope
