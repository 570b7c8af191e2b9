/*
 * mf_scratch.h -- the layout of the prefill scratch buffer, shared by the size helpers (the
 * Python boundary) and the kernels, so that the two can never disagree.
 *
 * Prefill runs in three phases; a region is reused once its phase is over.
 *   phase 1  RMSNorm + Q/K/V projection (+ RoPE):  xn -> region B, q -> region A,
 *            (int8 path) xn quantized -> region C; k, v go straight to the KV cache
 *   phase 2  flash attention:                      q (A) -> attention output (B)
 *   phase 3  out-projection + residual:            B -> output; (int8 path) B quantized -> A
 *
 *   region A  [T, H*Da] float32                       q, then the quantized attention rows
 *             (int8 variant: at least [T] x (Q8_0 / Q8_K row of H*Da), which is larger when
 *             H*Da = 32)
 *   region B  [T, max(Ea, H*Da)] float32              normalised input, then attention output
 *   region C  [T] x (Q8_0 row of Ea, if Ea % 32 == 0) then [T] x (Q8_K row of Ea, if Ea % 256
 *             == 0); the int8 variant only (the size helpers take no dtypes, so room is made for
 *             both activation formats any mix of weight formats can need)
 *   region D  T = 1 only: [H*Da] float32, the attention output.  One token runs phases 1 and 2
 *             as one queue of kv groups (a group's projections, then its attention, while the
 *             other threads project the next groups), so the attention output cannot reuse the
 *             normalised input's region B
 * Each region starts at a multiple of 64 bytes from the start of scratch.  Nothing in the
 * kernels depends on the previous content of scratch; nothing past the total is touched.
 */
#ifndef MEGAFUSE_MF_SCRATCH_H
#define MEGAFUSE_MF_SCRATCH_H

#include <stddef.h>

#include "ggml_blocks.h"
#include "mf_act_layout.h"

typedef struct {
    size_t a;          /* offset of region A (0) */
    size_t b;          /* offset of region B */
    size_t c_q8_0;     /* offset of the Q8_0 rows of region C (int8 variant) */
    size_t c_q8_k;     /* offset of the Q8_K rows of region C (int8 variant) */
    size_t d;          /* offset of region D (T = 1; 0 otherwise) */
    size_t q8_0_row;   /* bytes of one Q8_0 row of Ea values, 0 if Ea % 32 */
    size_t q8_k_row;   /* bytes of one Q8_K row of Ea values, 0 if Ea % 256 */
    size_t total;      /* bytes of scratch the kernel uses */
} mf_prefill_scratch;

static inline size_t mf_round_up_64(size_t n) { return (n + 63) / 64 * 64; }

/* Bytes of a Q8_0 / Q8_K activation row of n values (mf_act_layout.h); 0 when n is not whole
 * blocks. */
static inline size_t mf_q8_0_row_bytes(size_t n)
{
    return n % QK8_0 == 0 ? mf_act_q8_0_row_bytes(n) : 0;
}

static inline size_t mf_q8_K_row_bytes(size_t n)
{
    return n % QK_K == 0 ? mf_act_q8_K_row_bytes(n) : 0;
}

/* Bytes of the larger of a Q8_0 and a Q8_K activation row of n values (each where n is whole
 * blocks of it). */
static inline size_t mf_q8_row_bytes(size_t n)
{
    size_t q8_0 = mf_q8_0_row_bytes(n), q8_k = mf_q8_K_row_bytes(n);
    return q8_0 > q8_k ? q8_0 : q8_k;
}

static inline mf_prefill_scratch mf_prefill_scratch_layout(size_t T, size_t Ea, size_t H,
                                                           size_t Da, int int8_path)
{
    mf_prefill_scratch s;
    size_t hda = H * Da, widest = Ea > hda ? Ea : hda;
    size_t a_bytes = T * hda * sizeof(float);
    if (int8_path && T * mf_q8_row_bytes(hda) > a_bytes)    /* H*Da = 32: a Q8_0 row is 192 B */
        a_bytes = T * mf_q8_row_bytes(hda);
    s.a = 0;
    s.b = mf_round_up_64(a_bytes);
    s.c_q8_0 = mf_round_up_64(s.b + T * widest * sizeof(float));
    s.q8_0_row = int8_path ? mf_q8_0_row_bytes(Ea) : 0;
    s.q8_k_row = int8_path ? mf_q8_K_row_bytes(Ea) : 0;
    s.c_q8_k = mf_round_up_64(s.c_q8_0 + T * s.q8_0_row);
    s.total = int8_path ? s.c_q8_k + T * s.q8_k_row : s.b + T * widest * sizeof(float);
    s.d = 0;
    if (T == 1) {
        s.d = mf_round_up_64(s.total);
        s.total = s.d + hda * sizeof(float);
    }
    return s;
}

/*
 * The MLP kernels (mega_fused_outproj_mlp_prefill, mega_fused_mlp_prefill) work through the
 * tokens in tiles of MF_MLP_TOKEN_TILE; everything per tile lives in scratch, nothing per prompt:
 *   region F  [tile, max(H*Da, Ea)] float32   the tile's attention rows (gathered token-major
 *             from the head-major attn_out), then its normalised rows z
 *   region Q  [tile, q8 row of max(H*Da, Ea)]  those rows quantized (Q8_0 or Q8_K)
 *   region A  [tile, Ia] float32               silu(gate) * up
 *   region AQ [tile, q8 row of Ia]             that quantized
 * where "q8 row of n" is the larger of a Q8_0 row (n % 32 == 0) and a Q8_K row (n % 256 == 0).
 * h1 = attn @ wo.T + bo + residual is kept in `output` itself until the MLP adds to it.
 * hda = 0 for mega_fused_mlp_prefill (no out-projection).
 */
#define MF_MLP_TOKEN_TILE 128

typedef struct {
    size_t tile;       /* tokens a tile */
    size_t f, q, a, aq;
    size_t q_row;      /* bytes of a quantized row of region Q */
    size_t aq_row;     /* bytes of a quantized row of region AQ */
    size_t total;
} mf_mlp_scratch;

static inline mf_mlp_scratch mf_mlp_scratch_layout(size_t T, size_t Ea, size_t hda, size_t Ia)
{
    mf_mlp_scratch s;
    size_t widest = Ea > hda ? Ea : hda;
    s.tile = T < MF_MLP_TOKEN_TILE ? T : MF_MLP_TOKEN_TILE;
    s.q_row = mf_q8_row_bytes(Ea) > mf_q8_row_bytes(hda) ? mf_q8_row_bytes(Ea)
                                                          : mf_q8_row_bytes(hda);
    s.aq_row = mf_q8_row_bytes(Ia);
    s.f = 0;
    s.q = mf_round_up_64(s.tile * widest * sizeof(float));
    s.a = mf_round_up_64(s.q + s.tile * s.q_row);
    s.aq = mf_round_up_64(s.a + s.tile * Ia * sizeof(float));
    s.total = s.aq + s.tile * s.aq_row;
    return s;
}

#endif /* MEGAFUSE_MF_SCRATCH_H */
