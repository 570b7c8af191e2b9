/*
 * megafuse/mega_fused_attention.h -- the C contract megafuse mirrors.
 *
 * The prototypes below are those of upstream's mega_fused_attention.h, unchanged (same names,
 * parameters and order).  megafuse exposes each as a Python function of the same name
 * (`megafuse.<name>`, see docs/contract.md §1 for how the arguments map) and, for other Cython
 * modules, as the nogil C-level function `c_<name>` in `megafuse/_kernels.pxd` (same parameters;
 * no validation: the caller vouches for every size).  What the header leaves open -- layouts,
 * math, bad input -- is fixed by megafuse's contract, docs/contract.md; in particular `wo` is
 * [Ea, H*Da] for decode and prefill alike and GQA maps query head h to kv head h / (H / G).
 */
#ifndef MEGA_FUSED_ATTENTION_H
#define MEGA_FUSED_ATTENTION_H
 
#include <stddef.h>
#include <stdint.h>
 
#include "megafuse/ckernel_dtype.h"
 
/*============================================================================
 * Configuration
 *============================================================================*/
 
/* Tile sizes for streaming through cache hierarchy */
#ifndef MEGA_FUSE_Q_TILE
#define MEGA_FUSE_Q_TILE 64
#endif
 
#ifndef MEGA_FUSE_KV_TILE
#define MEGA_FUSE_KV_TILE 64
#endif
 
/*============================================================================
 * Mega-Fused Attention API
 *============================================================================*/
 
/**
 * @brief Mega-fused attention for decode mode (single token)
 *
 * This is the "holy grail" - all operations fused, no intermediates to DRAM.
 *
 * @param output           Output [aligned_embed_dim] (includes residual add)
 * @param input            Input [aligned_embed_dim]
 * @param residual         Residual input [aligned_embed_dim] (or NULL)
 * @param ln1_gamma        RMSNorm gamma [embed_dim]
 * @param wq               Q weights (quantized) [num_heads * aligned_head_dim * aligned_embed_dim]
 * @param bq               Q bias [num_heads * aligned_head_dim] (or NULL)
 * @param wq_dt            Q weight dtype (CK_DT_Q5_0/CK_DT_Q8_0/CK_DT_FP32)
 * @param wk               K weights (quantized) [num_kv_heads * aligned_head_dim * aligned_embed_dim]
 * @param bk               K bias [num_kv_heads * aligned_head_dim] (or NULL)
 * @param wk_dt            K weight dtype (CK_DT_Q5_0/CK_DT_Q8_0/CK_DT_FP32)
 * @param wv               V weights (quantized) [num_kv_heads * aligned_head_dim * aligned_embed_dim]
 * @param bv               V bias [num_kv_heads * aligned_head_dim] (or NULL)
 * @param wv_dt            V weight dtype (CK_DT_Q5_0/CK_DT_Q8_0/CK_DT_FP32)
 * @param wo               Output projection weights (quantized) [aligned_embed_dim * aligned_embed_dim]
 * @param bo               Output bias [aligned_embed_dim] (or NULL)
 * @param wo_dt            Output weight dtype (CK_DT_Q5_0/CK_DT_FP32)
 * @param kv_cache_k       KV cache for K [num_kv_heads * cache_capacity * aligned_head_dim]
 * @param kv_cache_v       KV cache for V [num_kv_heads * cache_capacity * aligned_head_dim]
 * @param rope_cos         RoPE cos [max_seq, head_dim/2]
 * @param rope_sin         RoPE sin [max_seq, head_dim/2]
 * @param pos              Current position in sequence
 * @param embed_dim        Model hidden dimension (unpadded)
 * @param aligned_embed_dim Aligned hidden dimension
 * @param num_heads        Number of attention heads
 * @param num_kv_heads     Number of KV heads (for GQA)
 * @param head_dim         Head dimension (unpadded)
 * @param aligned_head_dim Aligned head dimension
 * @param cache_capacity   KV cache capacity (stride in tokens)
 * @param eps              RMSNorm epsilon
 * @param scratch          Scratch buffer from mega_fused_attention_prefill_scratch_size()
 */
void mega_fused_attention_decode(
    float *output,
    const float *input,
    const float *residual,
    const float *ln1_gamma,
    const float *wq, const float *bq,
    const float *wk, const float *bk,
    const float *wv, const float *bv,
    const float *wo, const float *bo,
    float *kv_cache_k,
    float *kv_cache_v,
    const float *rope_cos,
    const float *rope_sin,
    int pos,
    int embed_dim,
    int aligned_embed_dim,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    int aligned_head_dim,
    int cache_capacity,
    float eps
);
 
/**
 * Allocation-free decode entry point used by generated runtimes.
 * q_output_workspace holds 2 * num_heads * aligned_head_dim floats.
 * kv_workspace holds 2 * num_kv_heads * aligned_head_dim floats.
 */
void mega_fused_attention_decode_workspace(
    float *output,
    const float *input,
    const float *residual,
    const float *ln1_gamma,
    const float *wq, const float *bq,
    const float *wk, const float *bk,
    const float *wv, const float *bv,
    const float *wo, const float *bo,
    float *kv_cache_k,
    float *kv_cache_v,
    const float *rope_cos,
    const float *rope_sin,
    int pos,
    int embed_dim,
    int aligned_embed_dim,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    int aligned_head_dim,
    int cache_capacity,
    float eps,
    float *q_output_workspace,
    size_t q_output_workspace_bytes,
    float *kv_workspace,
    size_t kv_workspace_bytes
);
 
/**
 * @brief Mega-fused attention for prefill mode (multiple tokens)
 *
 * @param output           Output [tokens, aligned_embed_dim] (includes residual add)
 * @param input            Input [tokens, aligned_embed_dim]
 * @param residual         Residual input [tokens, aligned_embed_dim] (or NULL)
 * @param ln1_gamma        RMSNorm gamma [embed_dim]
 * @param wq               Q weights [num_heads * aligned_head_dim * aligned_embed_dim]
 * @param bq               Q bias [num_heads * aligned_head_dim] (or NULL)
 * @param wk               K weights [num_kv_heads * aligned_head_dim * aligned_embed_dim]
 * @param bk               K bias [num_kv_heads * aligned_head_dim] (or NULL)
 * @param wv               V weights [num_kv_heads * aligned_head_dim * aligned_embed_dim]
 * @param bv               V bias [num_kv_heads * aligned_head_dim] (or NULL)
 * @param wo               Output projection weights [num_heads * aligned_embed_dim * aligned_head_dim]
 * @param bo               Output bias [aligned_embed_dim] (or NULL)
 * @param kv_cache_k       KV cache for K [num_kv_heads * cache_capacity * aligned_head_dim]
 * @param kv_cache_v       KV cache for V [num_kv_heads * cache_capacity * aligned_head_dim]
 * @param rope_cos         RoPE cos [max_seq, head_dim/2]
 * @param rope_sin         RoPE sin [max_seq, head_dim/2]
 * @param start_pos        Starting position in KV cache
 * @param tokens           Number of tokens to process
 * @param cache_capacity   KV cache capacity (stride in tokens)
 * @param embed_dim        Model hidden dimension (unpadded)
 * @param aligned_embed_dim Aligned hidden dimension
 * @param num_heads        Number of attention heads
 * @param num_kv_heads     Number of KV heads
 * @param head_dim         Head dimension (unpadded)
 * @param aligned_head_dim Aligned head dimension
 * @param eps              RMSNorm epsilon
 */
void mega_fused_attention_prefill(
    float *output,
    const float *input,
    const float *residual,
    const float *ln1_gamma,
    const void *wq, const float *bq, CKDataType wq_dt,
    const void *wk, const float *bk, CKDataType wk_dt,
    const void *wv, const float *bv, CKDataType wv_dt,
    const void *wo, const float *bo, CKDataType wo_dt,
    float *kv_cache_k,
    float *kv_cache_v,
    const float *rope_cos,
    const float *rope_sin,
    int start_pos,
    int tokens,
    int cache_capacity,
    int embed_dim,
    int aligned_embed_dim,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    int aligned_head_dim,
    float eps,
    void *scratch
);
 
/**
 * @brief Mega-fused prefill attention kernel (Q8_0 out-proj)
 *
 * Same layout and scratch requirements as mega_fused_attention_prefill.
 */
void mega_fused_attention_prefill_q8_0(
    float *output,
    const float *input,
    const float *residual,
    const float *ln1_gamma,
    const void *wq, const float *bq, CKDataType wq_dt,
    const void *wk, const float *bk, CKDataType wk_dt,
    const void *wv, const float *bv, CKDataType wv_dt,
    const void *wo, const float *bo, CKDataType wo_dt,
    float *kv_cache_k,
    float *kv_cache_v,
    const float *rope_cos,
    const float *rope_sin,
    int start_pos,
    int tokens,
    int cache_capacity,
    int embed_dim,
    int aligned_embed_dim,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    int aligned_head_dim,
    float eps,
    void *scratch
);
 
/** @brief Get scratch buffer size for mega_fused_attention_prefill */
size_t mega_fused_attention_prefill_scratch_size(int tokens,
                                                 int aligned_embed_dim,
                                                 int num_heads,
                                                 int aligned_head_dim);
 
/** @brief Get scratch buffer size for mega_fused_attention_prefill_q8_0 */
size_t mega_fused_attention_prefill_q8_0_scratch_size(int tokens,
                                                      int aligned_embed_dim,
                                                      int num_heads,
                                                      int aligned_head_dim);
 
/**
 * @brief Mega-fused post-attention block (out-proj + RMSNorm2 + MLP) for prefill
 *
 * Uses head-major attention output and quantized out-proj (Q5_0/Q8_0 weights).
 */
void mega_fused_outproj_mlp_prefill(
    float *output,
    const float *attn_out,
    const float *residual,
    const float *ln2_gamma,
    const void *wo, const float *bo, CKDataType wo_dt,
    const void *w1, const float *b1, CKDataType w1_dt,
    const void *w2, const float *b2, CKDataType w2_dt,
    int tokens,
    int embed_dim,
    int aligned_embed_dim,
    int num_heads,
    int aligned_head_dim,
    int intermediate_dim,
    int aligned_intermediate_dim,
    float eps,
    void *scratch
);
 
/** @brief Get scratch buffer size for mega_fused_outproj_mlp_prefill */
size_t mega_fused_outproj_mlp_prefill_scratch_size(int tokens,
                                                   int aligned_embed_dim,
                                                   int num_heads,
                                                   int aligned_head_dim,
                                                   int aligned_intermediate_dim);
 
/**
 * @brief megafuse addition: the MLP block for token-major hidden states
 *
 * output = residual + (silu(z @ Wg.T + bg) * (z @ Wu.T + bu)) @ w2.T + b2, z = RMSNorm(input),
 * with w1 = [Wg; Wu] ([2 * aligned_intermediate_dim, aligned_embed_dim]) and w2
 * [aligned_embed_dim, aligned_intermediate_dim].  The same kernel as
 * mega_fused_outproj_mlp_prefill without the out-projection, so that a whole layer composes from
 * mega_fused_attention_prefill (which adds its own out-projection and residual) and this.
 * residual may be NULL (nothing added).
 */
void mega_fused_mlp_prefill(
    float *output,
    const float *input,
    const float *residual,
    const float *ln2_gamma,
    const void *w1, const float *b1, CKDataType w1_dt,
    const void *w2, const float *b2, CKDataType w2_dt,
    int tokens,
    int embed_dim,
    int aligned_embed_dim,
    int intermediate_dim,
    int aligned_intermediate_dim,
    float eps,
    void *scratch
);

/** @brief megafuse addition: scratch bytes for mega_fused_mlp_prefill */
size_t mega_fused_mlp_prefill_scratch_size(int tokens,
                                           int aligned_embed_dim,
                                           int aligned_intermediate_dim);

/**
 * @brief megafuse addition: mega_fused_outproj_mlp_prefill with float32 activations
 *
 * The same parameters, layouts, math and scratch (mega_fused_outproj_mlp_prefill_scratch_size)
 * as mega_fused_outproj_mlp_prefill, but every projection multiplies float32 activations:
 * block-format weights are dequantized as they are read (as mega_fused_attention_prefill does),
 * never met with quantized activations.  The quantized regions of the scratch are not touched.
 */
void mega_fused_outproj_mlp_prefill_f32(
    float *output,
    const float *attn_out,
    const float *residual,
    const float *ln2_gamma,
    const void *wo, const float *bo, CKDataType wo_dt,
    const void *w1, const float *b1, CKDataType w1_dt,
    const void *w2, const float *b2, CKDataType w2_dt,
    int tokens,
    int embed_dim,
    int aligned_embed_dim,
    int num_heads,
    int aligned_head_dim,
    int intermediate_dim,
    int aligned_intermediate_dim,
    float eps,
    void *scratch
);

/**
 * @brief megafuse addition: mega_fused_mlp_prefill with float32 activations
 *
 * The same parameters and scratch (mega_fused_mlp_prefill_scratch_size) as
 * mega_fused_mlp_prefill; activations stay float32 as in mega_fused_outproj_mlp_prefill_f32.
 * A layer of float activations is mega_fused_attention_prefill followed by this.
 */
void mega_fused_mlp_prefill_f32(
    float *output,
    const float *input,
    const float *residual,
    const float *ln2_gamma,
    const void *w1, const float *b1, CKDataType w1_dt,
    const void *w2, const float *b2, CKDataType w2_dt,
    int tokens,
    int embed_dim,
    int aligned_embed_dim,
    int intermediate_dim,
    int aligned_intermediate_dim,
    float eps,
    void *scratch
);

/**
 * @brief Phase 1: Fused RMSNorm + QKV (intermediates in registers)
 *
 * Simpler step: Just fuse RMSNorm with QKV projection.
 * Q/K/V stay in stack buffers, not DRAM.
 */
void mega_fuse_rmsnorm_qkv(
    float *q_out,           // [num_heads * head_dim]
    float *k_out,           // [num_kv_heads * head_dim]
    float *v_out,           // [num_kv_heads * head_dim]
    const float *input,     // [hidden]
    const float *gamma,     // [hidden]
    const float *W_qkv,
    const float *b_qkv,
    int hidden,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    float eps
);
 
/**
 * @brief Phase 2: Fused RMSNorm + QKV + RoPE
 *
 * Q/K stay in output buffers, RoPE applied in-place.
 */
void mega_fuse_rmsnorm_qkv_rope(
    float *q_out,
    float *k_out,
    float *v_out,
    const float *input,
    const float *gamma,
    const float *W_qkv,
    const float *b_qkv,
    const float *rope_cos,
    const float *rope_sin,
    int pos,
    int hidden,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    int max_seq,
    float eps
);
 
/**
 * @brief Get optimal tile sizes for current CPU
 */
void mega_fuse_get_optimal_tiles(
    int *q_tile,            // Output: Q tile size
    int *kv_tile,           // Output: KV tile size
    int head_dim
);
 
/**
 * @brief Report memory savings from mega-fusion
 */
void mega_fuse_report_stats(
    int hidden,
    int num_layers,
    int seq_len
);
 
#endif /* MEGA_FUSED_ATTENTION_H */
