/*
 * mf_act_layout.h -- the byte layout of the int8 path's activation rows, shared by the quantizer
 * (mf_act_quant.h), the integer dots (mf_dot_q8.h, mf_q8_tiles.h) and the scratch layouts
 * (mf_scratch.h), so that none of them can disagree on a size or an offset.
 *
 * Q8_0 activation row (the partner of every 32-weight format: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
 * Its values are exactly GGML's Q8_0 (quantize_row_q8_0_ref: int8 codes, one fp16 scale per block
 * of 32), stored the way the dots read them.  n values, nb = n / 32 blocks, ng = ceil(nb / 4)
 * groups of 4 blocks:
 *
 *   codes  int8  [ng][2][64]   group g, pair p holds blocks i = 4g + 2p and j = i + 1 as
 *                              [i 0..15 | j 0..15 | i 16..31 | j 16..31]: two 32-byte registers
 *                              ("lo", "hi") whose 128-bit lanes are blocks i and j
 *   f      float [ng][8]       per block [d, s] -- d = the fp16 scale as float32, s = d * sum of
 *                              the block's codes (exact in float32: an 11-bit scale times |sum| <
 *                              2^12) -- in the order [d0 s0 d2 s2 d1 s1 d3 s3] of the group's
 *                              blocks 0..3 (128-bit lanes: blocks 0, 2 | 1, 3)
 *   zeros up to a multiple of 64 bytes
 *
 * Blocks nb .. 4ng - 1 (a row whose block count is not a multiple of 4) are zero blocks: codes 0,
 * d = s = 0.  A row starting at a 64-byte boundary keeps every register-sized load aligned, and
 * the next row of a [T, row bytes] array starts at one too.
 *
 * Q8_K activation row (the partner of the K-quants): GGML's block_q8_K, [n / 256] blocks.
 *
 * Depends on: ggml_blocks.h (QK8_0, QK_K, block_q8_K).
 */
#ifndef MEGAFUSE_MF_ACT_LAYOUT_H
#define MEGAFUSE_MF_ACT_LAYOUT_H

#include <stddef.h>

#include "ggml_blocks.h"

#define MF_ACT_GROUP_BLOCKS 4                           /* blocks of 32 a group */
#define MF_ACT_GROUP_CODE_BYTES (MF_ACT_GROUP_BLOCKS * QK8_0)       /* 128 */
#define MF_ACT_GROUP_F_FLOATS (2 * MF_ACT_GROUP_BLOCKS)             /* 8: [d, s] x 4 */

/* Groups of 4 blocks in a Q8_0 activation row of n values (n a multiple of 32). */
static inline size_t mf_act_q8_0_groups(size_t n)
{
    return (n / QK8_0 + MF_ACT_GROUP_BLOCKS - 1) / MF_ACT_GROUP_BLOCKS;
}

/* Bytes of a Q8_0 activation row of n values (n a multiple of 32). */
static inline size_t mf_act_q8_0_row_bytes(size_t n)
{
    const size_t ng = mf_act_q8_0_groups(n);
    const size_t used = ng * (MF_ACT_GROUP_CODE_BYTES + MF_ACT_GROUP_F_FLOATS * sizeof(float));
    return (used + 63) / 64 * 64;
}

/* The codes of group g of a row: [2][64] int8. */
static inline const int8_t *mf_act_q8_0_codes(const void *a, size_t g)
{
    return (const int8_t *)a + g * MF_ACT_GROUP_CODE_BYTES;
}

/* The [d, s] floats of group g of a row of n values: [8]. */
static inline const float *mf_act_q8_0_f(const void *a, size_t n, size_t g)
{
    return (const float *)(const void *)((const char *)a +
                                         mf_act_q8_0_groups(n) * MF_ACT_GROUP_CODE_BYTES) +
           g * MF_ACT_GROUP_F_FLOATS;
}

/* Where block k (0..3) of a group keeps its [d, s] among the group's 8 floats. */
static inline size_t mf_act_q8_0_f_slot(size_t k)
{
    return 2 * ((k & 1) * 2 + (k >> 1));
}

/* Bytes of a Q8_K activation row of n values (n a multiple of 256). */
static inline size_t mf_act_q8_K_row_bytes(size_t n)
{
    return n / QK_K * sizeof(block_q8_K);
}

#endif /* MEGAFUSE_MF_ACT_LAYOUT_H */
