/*
 * mf_neon_dot_q8.h -- the int8 dots of mf_dot_q8.h on AArch64 Advanced SIMD (the neon,
 * neon_dotprod and i8mm levels), and the canonical sequence their multi-row kernels
 * (mf_neon_q8_tiles.h) repeat for every (weight row, activation row) pair.
 *
 * 32-weight formats x a Q8_0 activation row, group by group (4 blocks, mf_act_layout.h):
 *   - I = the 4 blocks' exact integer sums q_w . q_a (q_w the signed code: c - 8 for Q4_0, c - 16
 *     for Q5_0, the code for Q4_1 / Q5_1, q for Q8_0, the table's value for IQ4_NL), in the lane order of the activation's
 *     floats [block 0, 2, 1, 3] (|I| < 2^17: exact as float);
 *   - P = d_w * d_a in the same lanes (exact: two fp16 values);
 *   - acc = fma(float(I), P, acc), then for Q4_1 / Q5_1 acc = fma(m_w, s_a, acc) (s_a = d_a * the
 *     block's code sum);
 *   - a group past the row's last block has zero codes and scales there (+0 terms: acc starts at
 *     +0 and never holds -0);
 *   - the result is acc's lanes summed pairwise, (l0 + l1) + (l2 + l3).
 * Every term is exact before it is added, and the integer sums are the same integers at each
 * NEON level (mf_neon_quant.h), so the three levels give the same bits; against generic and x86,
 * within the int8 tolerance (the accumulation order differs).
 *
 * K-quants and IQ4_XS (x a Q8_K row): the exact integer sums of mf_dot_q8.h (sumi, and summ from
 * the bsums for Q2_K / Q4_K / Q5_K) and the same double arithmetic (mf_q_kterm, mf_q_kterm1): the
 * same bits as every other level.  sumi is sum_j sc_j (code_j . a_j) over the sub-blocks, each
 * (code_j . a_j) from the 8-bit products (mf_neon_dot_s8), scaled in int32 lanes, the lanes
 * summed at the end: a lane's partial sum is bounded as sumi is (< 2^31), so every order gives
 * the same integer.  Q3_K's codes are its signed values u - 4, whose dot is mf_dot_q8.h's
 * (u . a) - 4 bsum exactly.
 *
 * Included by mf_dot_q8.h only.
 */
#ifndef MEGAFUSE_MF_NEON_DOT_Q8_H
#define MEGAFUSE_MF_NEON_DOT_Q8_H

#include <stddef.h>
#include <stdint.h>
#include <arm_neon.h>

/* ---- 32-weight formats ----------------------------------------------------------------------- */

/* One group of a Q8_0 activation row in registers: lo[k] / hi[k] the codes 0..15 / 16..31 of
 * block k (natural order), d / s the blocks' [d_a] / [s_a] in lane order [0, 2, 1, 3]. */
typedef struct {
    int8x16_t lo[4], hi[4];
    float32x4_t d, s;
} mf_neon_agrp;

MF_ALWAYS_INLINE void mf_neon_agrp_load(const void *a, ptrdiff_t n, ptrdiff_t g, mf_neon_agrp *A)
{
    const int8_t *c = mf_act_q8_0_codes(a, (size_t)g);       /* [2][64] */
    for (int k = 0; k < 4; k++) {
        A->lo[k] = vld1q_s8(c + (k >> 1) * 64 + (k & 1) * 16);
        A->hi[k] = vld1q_s8(c + (k >> 1) * 64 + (k & 1) * 16 + 32);
    }
    const float32x4x2_t f = vld2q_f32(mf_act_q8_0_f(a, (size_t)n, (size_t)g));
    A->d = f.val[0];
    A->s = f.val[1];
}

/* A decoded group of one weight row: lo[k] / hi[k] the signed codes of block k, dw / mw its d
 * (and m: Q4_1 / Q5_1, else 0) in lane order [0, 2, 1, 3]; blocks past nblk: codes and scales 0. */
typedef struct {
    int8x16_t lo[4], hi[4];
    float32x4_t dw, mw;
} mf_neon_wgrp;

MF_ALWAYS_INLINE int mf_neon_asym(int dt) { return dt == CK_DT_Q4_1 || dt == CK_DT_Q5_1; }

MF_ALWAYS_INLINE ptrdiff_t mf_neon_bsz(int dt)
{
    switch (dt) {
    case CK_DT_Q4_0: return (ptrdiff_t)sizeof(block_q4_0);
    case CK_DT_Q4_1: return (ptrdiff_t)sizeof(block_q4_1);
    case CK_DT_Q5_0: return (ptrdiff_t)sizeof(block_q5_0);
    case CK_DT_Q5_1: return (ptrdiff_t)sizeof(block_q5_1);
    case CK_DT_IQ4_NL: return (ptrdiff_t)sizeof(block_iq4_nl);
    default: return (ptrdiff_t)sizeof(block_q8_0);
    }
}

/* Block b's codes (format dt, a constant where this is inlined), its d and m bits. */
MF_ALWAYS_INLINE void mf_neon_block_codes(int dt, const char *b, int8x16_t *lo, int8x16_t *hi,
                                          mf_fp16_t *d, mf_fp16_t *m)
{
    switch (dt) {
    case CK_DT_Q4_0: mf_neon_codes_q4_0((const block_q4_0 *)(const void *)b, lo, hi); break;
    case CK_DT_Q4_1: mf_neon_codes_q4_1((const block_q4_1 *)(const void *)b, lo, hi); break;
    case CK_DT_Q5_0: mf_neon_codes_q5_0((const block_q5_0 *)(const void *)b, lo, hi); break;
    case CK_DT_Q5_1: mf_neon_codes_q5_1((const block_q5_1 *)(const void *)b, lo, hi); break;
    case CK_DT_IQ4_NL: mf_neon_codes_iq4_nl((const block_iq4_nl *)(const void *)b, lo, hi); break;
    default: mf_neon_codes_q8_0((const block_q8_0 *)(const void *)b, lo, hi); break;
    }
    /* every 32-weight block starts with its fp16 d; Q4_1 / Q5_1 with m after it */
    memcpy(d, b, sizeof *d);
    if (mf_neon_asym(dt))
        memcpy(m, b + 2, sizeof *m);
    else
        *m = 0;
}

/* Decode nblk (1..4) blocks of format dt at b into W. */
MF_ALWAYS_INLINE void mf_neon_wgrp_dec(int dt, const char *b, int nblk, mf_neon_wgrp *W)
{
    mf_fp16_t d[4] = {0, 0, 0, 0}, m[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; k++) {
        if (k < nblk) {
            mf_neon_block_codes(dt, b + k * mf_neon_bsz(dt), &W->lo[k], &W->hi[k], &d[k], &m[k]);
        } else {
            W->lo[k] = W->hi[k] = vdupq_n_s8(0);
        }
    }
    W->dw = mf_neon_fp16x4(d[0], d[2], d[1], d[3]);
    W->mw = mf_neon_asym(dt) ? mf_neon_fp16x4(m[0], m[2], m[1], m[3]) : vdupq_n_f32(0.0f);
}

/* The float step of a group, once its integer sums I (lane order [0, 2, 1, 3]) are known. */
MF_ALWAYS_INLINE float32x4_t mf_neon_grp_acc(int asym, int32x4_t I, float32x4_t dw,
                                             float32x4_t mw, const mf_neon_agrp *A,
                                             float32x4_t acc)
{
    acc = vfmaq_f32(acc, vcvtq_f32_s32(I), vmulq_f32(dw, A->d));
    if (asym)
        acc = vfmaq_f32(acc, mw, A->s);
    return acc;
}

/* acc + the group's terms of one decoded weight row against one activation group. */
MF_ALWAYS_INLINE float32x4_t mf_neon_grp_step(int asym, const mf_neon_wgrp *W,
                                              const mf_neon_agrp *A, float32x4_t acc)
{
    int32x4_t v[4];
    for (int k = 0; k < 4; k++)
        v[k] = mf_neon_dot32_s8(W->lo[k], W->hi[k], A->lo[k], A->hi[k]);
    return mf_neon_grp_acc(asym, mf_neon_totals4(v[0], v[2], v[1], v[3]), W->dw, W->mw, A, acc);
}

/* One weight row of format dt x one Q8_0 activation row. */
MF_ALWAYS_INLINE float mf_neon_dot_row_q8_0(int dt, const void *vw, const void *va, ptrdiff_t n)
{
    const char *w = (const char *)vw;                   /* [n / 32] blocks */
    const ptrdiff_t nb = n / QK8_0, gb = 4 * mf_neon_bsz(dt);
    float32x4_t acc = vdupq_n_f32(0.0f);
    ptrdiff_t g = 0;
    for (; g < nb / 4; g++) {
        mf_neon_agrp A;
        mf_neon_wgrp W;
        mf_neon_agrp_load(va, n, g, &A);
        mf_neon_wgrp_dec(dt, w + g * gb, 4, &W);
        acc = mf_neon_grp_step(mf_neon_asym(dt), &W, &A, acc);
    }
    if (g * 4 < nb) {                                   /* a last group of 1..3 blocks */
        mf_neon_agrp A;
        mf_neon_wgrp W;
        mf_neon_agrp_load(va, n, g, &A);
        mf_neon_wgrp_dec(dt, w + g * gb, (int)(nb - 4 * g), &W);
        acc = mf_neon_grp_step(mf_neon_asym(dt), &W, &A, acc);
    }
    return vaddvq_f32(acc);
}

/* ---- K-quants: the exact integer sums ---------------------------------------------------------- */

/* sum_j sc_j (code_j . a_j) of a Q4_K / Q5_K super-block (qh = NULL: Q4_K), exactly. */
MF_ALWAYS_INLINE int32_t mf_neon_sumi_k45(const int sc[8], const uint8_t *qs, const uint8_t *qh,
                                          const int8_t *aq /* [256] */)
{
    int32x4_t s = vdupq_n_s32(0);
    for (int c = 0; c < 4; c++) {
        int8x16_t s0[2], s1[2];
        mf_neon_codes_k45(qs, qh, c, s0, s1);
        const int8_t *a = aq + 64 * c;
        const int32x4_t t0 = mf_neon_dot32_s8(s0[0], s0[1], vld1q_s8(a), vld1q_s8(a + 16));
        const int32x4_t t1 = mf_neon_dot32_s8(s1[0], s1[1], vld1q_s8(a + 32), vld1q_s8(a + 48));
        s = vmlaq_n_s32(s, t0, sc[2 * c]);
        s = vmlaq_n_s32(s, t1, sc[2 * c + 1]);
    }
    return vaddvq_s32(s);
}

/* sum_j scales_j (code_j . a_j) over the 16 sub-blocks of a Q6_K super-block (codes 0..63). */
MF_ALWAYS_INLINE int32_t mf_neon_sumi_q6_K(const block_q6_K *b, const int8_t *aq /* [256] */)
{
    int32x4_t s = vdupq_n_s32(0);
    for (int h = 0; h < 2; h++) {
        int8x16_t q[4][2];
        mf_neon_codes_q6_K(b, h, q);
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 2; i++) {
                const int j = 8 * h + 2 * k + i;              /* weights 16 j .. 16 j + 15 */
                const int32x4_t t = mf_neon_dot_s8(vdupq_n_s32(0), q[k][i], vld1q_s8(aq + 16 * j));
                s = vmlaq_n_s32(s, t, b->scales[j]);
            }
    }
    return vaddvq_s32(s);
}

/* ---- Q2_K, Q3_K, IQ4_XS: the exact integer sums of mf_dot_q8.h ---------------------------------- */

/* sum_j sc_j (code_j . a_j) over the 16 sub-blocks of 16 of a Q2_K / Q3_K super-block, from its
 * codes (CODES: mf_neon_codes_q2_K's 0..3 or mf_neon_codes_q3_K's signed values) and scales. */
#define MF_NEON_SUMI16(NAME, BLOCK, CODES)                                                     \
MF_ALWAYS_INLINE int32_t NAME(const BLOCK *b, const int sc[16], const int8_t *aq /* [256] */) \
{                                                                                              \
    int32x4_t s = vdupq_n_s32(0);                                                              \
    for (int h = 0; h < 2; h++) {                                                              \
        int8x16_t q[4][2];                                                                     \
        CODES(b, h, q);                                                                        \
        for (int k = 0; k < 4; k++)                                                            \
            for (int i = 0; i < 2; i++) {                                                      \
                const int j = 8 * h + 2 * k + i;              /* weights 16 j .. 16 j + 15 */  \
                const int32x4_t t = mf_neon_dot_s8(vdupq_n_s32(0), q[k][i], vld1q_s8(aq + 16 * j)); \
                s = vmlaq_n_s32(s, t, sc[j]);                                                  \
            }                                                                                  \
    }                                                                                          \
    return vaddvq_s32(s);                                                                      \
}
MF_NEON_SUMI16(mf_neon_sumi_q2_K, block_q2_K, mf_neon_codes_q2_K)
MF_NEON_SUMI16(mf_neon_sumi_q3_K, block_q3_K, mf_neon_codes_q3_K)
#undef MF_NEON_SUMI16

/* Q2_K's scales (low nibbles) and mins (high nibbles) as ints, and summ = sum_j m_j bsum_j. */
MF_ALWAYS_INLINE int32_t mf_neon_q2_K_scales(const block_q2_K *b, const int16_t *bsums,
                                             int sc[16], int m[16])
{
    int32_t summ = 0;
    for (int j = 0; j < 16; j++) {
        sc[j] = b->scales[j] & 0x0F;
        m[j] = b->scales[j] >> 4;
        summ += m[j] * bsums[j];
    }
    return summ;
}

/* Q3_K's factors sc_j - 32 (-32..31). */
MF_ALWAYS_INLINE void mf_neon_q3_K_scales(const block_q3_K *b, int sc[16])
{
    uint8_t u[16];
    mf_q3k_scales(b->scales, u);
    for (int j = 0; j < 16; j++)
        sc[j] = (int)u[j] - 32;
}

/* IQ4_XS's factors ls_j - 32 (-32..31) of its 8 sub-blocks of 32. */
MF_ALWAYS_INLINE void mf_neon_iq4_xs_scales(const block_iq4_xs *b, int sc[8])
{
    for (int j = 0; j < 8; j++)
        sc[j] = mf_iq4xs_scale(b->scales_l, b->scales_h, j) - 32;
}

/* sum_j (ls_j - 32) (v_j . a_j) over the 8 sub-blocks of 32 of an IQ4_XS super-block. */
MF_ALWAYS_INLINE int32_t mf_neon_sumi_iq4_xs(const block_iq4_xs *b, const int sc[8],
                                             const int8_t *aq /* [256] */)
{
    int32x4_t s = vdupq_n_s32(0);
    for (int j = 0; j < 8; j++) {
        int8x16_t lo, hi;
        mf_neon_codes_iq4_xs(b, j, &lo, &hi);
        const int8_t *a = aq + 32 * j;
        s = vmlaq_n_s32(s, mf_neon_dot32_s8(lo, hi, vld1q_s8(a), vld1q_s8(a + 16)), sc[j]);
    }
    return vaddvq_s32(s);
}

#endif /* MEGAFUSE_MF_NEON_DOT_Q8_H */
