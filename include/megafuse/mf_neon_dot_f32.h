/*
 * mf_neon_dot_f32.h -- the float-activation dots of mf_dot_f32.h on AArch64 Advanced SIMD (the
 * neon, neon_dotprod and i8mm levels: the same float bodies), one weight row or four.
 *
 * Per block of a 32-weight format: its 32 codes as int8 lanes (mf_neon_codes_*, offsets applied;
 * IQ4_NL's table values), widened to floats (exact), s = sum c_j x_j in two chains of 4 lanes
 * (weights 0..15 and 16..31) added, then acc + d * s (fused) -- and acc + m * sum x for Q4_1 /
 * Q5_1; blocks alternate between two accumulators (block parity), whose lanes are summed at the
 * end in a fixed order.  The K-quants and IQ4_XS go sub-block by sub-block the same way: acc +
 * (d sc) s - (dmin m) sum x (Q4_K, Q5_K; Q2_K in sub-blocks of 16), acc + (d sc) s (IQ4_XS; Q6_K
 * and Q3_K in sub-blocks of 16, sc their signed factor), sub-blocks alternating between the two
 * accumulators; d sc and dmin m are exact floats.
 * The 4-row dots run each row's exact sequence, the activations loaded once for the four: each
 * row's result is its one-row dot's bits.  Included by mf_dot_f32.h only.
 */
#ifndef MEGAFUSE_MF_NEON_DOT_F32_H
#define MEGAFUSE_MF_NEON_DOT_F32_H

#include <stddef.h>
#include <stdint.h>
#include <arm_neon.h>

/* sum_j c_j x[j] over 16 codes (4 lanes: sa), exact products of the widened codes. */
MF_ALWAYS_INLINE float32x4_t mf_neon_c16_dot(int8x16_t c, const float *x)
{
    const int16x8_t c0 = vmovl_s8(vget_low_s8(c)), c1 = vmovl_high_s8(c);
    float32x4_t s = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(c0))), vld1q_f32(x));
    s = vfmaq_f32(s, vcvtq_f32_s32(vmovl_high_s16(c0)), vld1q_f32(x + 4));
    s = vfmaq_f32(s, vcvtq_f32_s32(vmovl_s16(vget_low_s16(c1))), vld1q_f32(x + 8));
    return vfmaq_f32(s, vcvtq_f32_s32(vmovl_high_s16(c1)), vld1q_f32(x + 12));
}

/* sum_j c_j x[j] over a block's 32 codes: two chains (codes 0..15, 16..31), added. */
MF_ALWAYS_INLINE float32x4_t mf_neon_c32_dot(int8x16_t lo, int8x16_t hi, const float *x)
{
    return vaddq_f32(mf_neon_c16_dot(lo, x), mf_neon_c16_dot(hi, x + 16));
}

/* x[0..31] summed into 4 lanes: ((x0..3 + x8..11) + (x16..19 + x24..27)) + the same from 4. */
MF_ALWAYS_INLINE float32x4_t mf_neon_sum32(const float *x)
{
    const float32x4_t a = vaddq_f32(vaddq_f32(vld1q_f32(x), vld1q_f32(x + 8)),
                                    vaddq_f32(vld1q_f32(x + 16), vld1q_f32(x + 24)));
    const float32x4_t b = vaddq_f32(vaddq_f32(vld1q_f32(x + 4), vld1q_f32(x + 12)),
                                    vaddq_f32(vld1q_f32(x + 20), vld1q_f32(x + 28)));
    return vaddq_f32(a, b);
}

/* One 32-weight block against x[0..31]: acc + d * (c . x) (+ m * sum x). */
#define MF_NEON_FBLK_SYM(NAME, BLOCK, CODES)                                                   \
MF_ALWAYS_INLINE float32x4_t NAME(const BLOCK *b, const float *x, float32x4_t acc)            \
{                                                                                              \
    int8x16_t lo, hi;                                                                          \
    CODES(b, &lo, &hi);                                                                        \
    return vfmaq_n_f32(acc, mf_neon_c32_dot(lo, hi, x), mf_neon_fp16(b->d));                   \
}
#define MF_NEON_FBLK_ASYM(NAME, BLOCK, CODES)                                                  \
MF_ALWAYS_INLINE float32x4_t NAME(const BLOCK *b, const float *x, float32x4_t acc)            \
{                                                                                              \
    int8x16_t lo, hi;                                                                          \
    CODES(b, &lo, &hi);                                                                        \
    acc = vfmaq_n_f32(acc, mf_neon_c32_dot(lo, hi, x), mf_neon_fp16(b->d));                    \
    return vfmaq_n_f32(acc, mf_neon_sum32(x), mf_neon_fp16(b->m));                             \
}
MF_NEON_FBLK_SYM(mf_neon_fblk_q4_0, block_q4_0, mf_neon_codes_q4_0)
MF_NEON_FBLK_ASYM(mf_neon_fblk_q4_1, block_q4_1, mf_neon_codes_q4_1)
MF_NEON_FBLK_SYM(mf_neon_fblk_q5_0, block_q5_0, mf_neon_codes_q5_0)
MF_NEON_FBLK_ASYM(mf_neon_fblk_q5_1, block_q5_1, mf_neon_codes_q5_1)
MF_NEON_FBLK_SYM(mf_neon_fblk_q8_0, block_q8_0, mf_neon_codes_q8_0)
MF_NEON_FBLK_SYM(mf_neon_fblk_iq4_nl, block_iq4_nl, mf_neon_codes_iq4_nl)
#undef MF_NEON_FBLK_SYM
#undef MF_NEON_FBLK_ASYM

/* The one-row and the 4-row dots of a 32-weight format: block ib into accumulator ib % 2. */
#define MF_NEON_DOT_F32_32(NAME, NAME4, BLOCK, BLK)                                            \
static inline float NAME(const void *MF_RESTRICT vw, const float *MF_RESTRICT x, ptrdiff_t n)  \
{                                                                                              \
    const BLOCK *w = (const BLOCK *)vw;                                 /* [n / 32] */         \
    const ptrdiff_t nb = n / 32;                                                               \
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;                                               \
    ptrdiff_t ib = 0;                                                                          \
    for (; ib + 2 <= nb; ib += 2) {                                                            \
        a0 = BLK(&w[ib], x + 32 * ib, a0);                                                     \
        a1 = BLK(&w[ib + 1], x + 32 * ib + 32, a1);                                            \
    }                                                                                          \
    if (ib < nb)                                                                               \
        a0 = BLK(&w[ib], x + 32 * ib, a0);                                                     \
    return vaddvq_f32(vaddq_f32(a0, a1));                                                      \
}                                                                                              \
static inline void NAME4(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,      \
                         float *out)                                                           \
{                                                                                              \
    const BLOCK *w[4] = {(const BLOCK *)vw[0], (const BLOCK *)vw[1], (const BLOCK *)vw[2],     \
                         (const BLOCK *)vw[3]};                          /* [n / 32] each */   \
    const ptrdiff_t nb = n / 32, bsz = (ptrdiff_t)sizeof(BLOCK);                               \
    const ptrdiff_t pf = mf_q_pf_dist(nb * bsz);                                               \
    float32x4_t a[4][2];                                                                       \
    for (int r = 0; r < 4; r++)                                                                \
        a[r][0] = a[r][1] = vdupq_n_f32(0.0f);                                                 \
    ptrdiff_t ib = 0;                                                                          \
    for (; ib + 2 <= nb; ib += 2) {                                                            \
        mf_q_prefetch4(w[0], nb * bsz, ib * bsz, 2 * bsz, pf);                                 \
        for (int r = 0; r < 4; r++) {                                                          \
            a[r][0] = BLK(&w[r][ib], x + 32 * ib, a[r][0]);                                    \
            a[r][1] = BLK(&w[r][ib + 1], x + 32 * ib + 32, a[r][1]);                           \
        }                                                                                      \
    }                                                                                          \
    if (ib < nb)                                                                               \
        for (int r = 0; r < 4; r++)                                                            \
            a[r][0] = BLK(&w[r][ib], x + 32 * ib, a[r][0]);                                    \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = vaddvq_f32(vaddq_f32(a[r][0], a[r][1]));                                      \
}
MF_NEON_DOT_F32_32(mf_neon_dot_q4_0_f32, mf_neon_dot4_q4_0_f32, block_q4_0, mf_neon_fblk_q4_0)
MF_NEON_DOT_F32_32(mf_neon_dot_q4_1_f32, mf_neon_dot4_q4_1_f32, block_q4_1, mf_neon_fblk_q4_1)
MF_NEON_DOT_F32_32(mf_neon_dot_q5_0_f32, mf_neon_dot4_q5_0_f32, block_q5_0, mf_neon_fblk_q5_0)
MF_NEON_DOT_F32_32(mf_neon_dot_q5_1_f32, mf_neon_dot4_q5_1_f32, block_q5_1, mf_neon_fblk_q5_1)
MF_NEON_DOT_F32_32(mf_neon_dot_q8_0_f32, mf_neon_dot4_q8_0_f32, block_q8_0, mf_neon_fblk_q8_0)
MF_NEON_DOT_F32_32(mf_neon_dot_iq4_nl_f32, mf_neon_dot4_iq4_nl_f32, block_iq4_nl,
                   mf_neon_fblk_iq4_nl)
#undef MF_NEON_DOT_F32_32

/* Q4_K (qh = NULL) / Q5_K: super-block b against xb[0..255] into acc[0] (sub-blocks 2c) and
 * acc[1] (2c + 1): acc + (d sc_j) (c . x) - (dmin m_j) sum x over each sub-block j. */
MF_ALWAYS_INLINE void mf_neon_fsb_k45(const uint8_t *scales, mf_fp16_t d, mf_fp16_t dmin,
                                      const uint8_t *qs, const uint8_t *qh, const float *xb,
                                      float32x4_t acc[2])
{
    float dsc[8], dm[8];
    mf_kquant_scales(scales, d, dmin, dsc, dm);
    for (int c = 0; c < 4; c++) {
        int8x16_t s0[2], s1[2];
        mf_neon_codes_k45(qs, qh, c, s0, s1);
        const float *x0 = xb + 64 * c, *x1 = x0 + 32;
        acc[0] = vfmaq_n_f32(acc[0], mf_neon_c32_dot(s0[0], s0[1], x0), dsc[2 * c]);
        acc[0] = vfmsq_n_f32(acc[0], mf_neon_sum32(x0), dm[2 * c]);
        acc[1] = vfmaq_n_f32(acc[1], mf_neon_c32_dot(s1[0], s1[1], x1), dsc[2 * c + 1]);
        acc[1] = vfmsq_n_f32(acc[1], mf_neon_sum32(x1), dm[2 * c + 1]);
    }
}

MF_ALWAYS_INLINE void mf_neon_fsb_q4_K(const block_q4_K *b, const float *xb, float32x4_t acc[2])
{
    mf_neon_fsb_k45(b->scales, b->d, b->dmin, b->qs, NULL, xb, acc);
}

MF_ALWAYS_INLINE void mf_neon_fsb_q5_K(const block_q5_K *b, const float *xb, float32x4_t acc[2])
{
    mf_neon_fsb_k45(b->scales, b->d, b->dmin, b->qs, b->qh, xb, acc);
}

/* Q6_K: acc[0] / acc[1] take the even / odd sub-blocks of 16: acc + (d sc_j) ((c - 32) . x). */
MF_ALWAYS_INLINE void mf_neon_fsb_q6_K(const block_q6_K *b, const float *xb, float32x4_t acc[2])
{
    const float d = mf_neon_fp16(b->d);
    const int8x16_t x20 = vdupq_n_s8(32);
    for (int h = 0; h < 2; h++) {
        int8x16_t q[4][2];
        mf_neon_codes_q6_K(b, h, q);
        for (int k = 0; k < 4; k++) {
            const int j = 8 * h + 2 * k;         /* sub-blocks j (q[k][0]), j + 1 (q[k][1]) */
            const float *xs = xb + 128 * h + 32 * k;
            acc[0] = vfmaq_n_f32(acc[0], mf_neon_c16_dot(vsubq_s8(q[k][0], x20), xs),
                                 d * (float)b->scales[j]);
            acc[1] = vfmaq_n_f32(acc[1], mf_neon_c16_dot(vsubq_s8(q[k][1], x20), xs + 16),
                                 d * (float)b->scales[j + 1]);
        }
    }
}

/* x[0..15] summed into 4 lanes: (x0..3 + x8..11) + (x4..7 + x12..15). */
MF_ALWAYS_INLINE float32x4_t mf_neon_sum16(const float *x)
{
    return vaddq_f32(vaddq_f32(vld1q_f32(x), vld1q_f32(x + 8)),
                     vaddq_f32(vld1q_f32(x + 4), vld1q_f32(x + 12)));
}

/* Q2_K: acc[0] / acc[1] take the even / odd sub-blocks of 16: acc + (d sc_j) (c . x) - (dmin m_j)
 * sum x, c the 2-bit codes. */
MF_ALWAYS_INLINE void mf_neon_fsb_q2_K(const block_q2_K *b, const float *xb, float32x4_t acc[2])
{
    const float d = mf_neon_fp16(b->d), dmin = mf_neon_fp16(b->dmin);
    for (int h = 0; h < 2; h++) {
        int8x16_t q[4][2];
        mf_neon_codes_q2_K(b, h, q);
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 2; i++) {
                const int j = 8 * h + 2 * k + i;             /* weights 16 j .. 16 j + 15 */
                const float *xs = xb + 16 * j;
                acc[i] = vfmaq_n_f32(acc[i], mf_neon_c16_dot(q[k][i], xs),
                                     d * (float)(b->scales[j] & 0x0F));
                acc[i] = vfmsq_n_f32(acc[i], mf_neon_sum16(xs), dmin * (float)(b->scales[j] >> 4));
            }
    }
}

/* Q3_K: the same without mins: acc + (d (sc_j - 32)) (v . x), v the values -4..3. */
MF_ALWAYS_INLINE void mf_neon_fsb_q3_K(const block_q3_K *b, const float *xb, float32x4_t acc[2])
{
    const float d = mf_neon_fp16(b->d);
    uint8_t sc[16];
    mf_q3k_scales(b->scales, sc);
    for (int h = 0; h < 2; h++) {
        int8x16_t q[4][2];
        mf_neon_codes_q3_K(b, h, q);
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 2; i++) {
                const int j = 8 * h + 2 * k + i;
                acc[i] = vfmaq_n_f32(acc[i], mf_neon_c16_dot(q[k][i], xb + 16 * j),
                                     d * (float)((int)sc[j] - 32));
            }
    }
}

/* IQ4_XS: acc[0] / acc[1] take the even / odd sub-blocks of 32: acc + (d (ls_j - 32)) (v . x). */
MF_ALWAYS_INLINE void mf_neon_fsb_iq4_xs(const block_iq4_xs *b, const float *xb,
                                         float32x4_t acc[2])
{
    const float d = mf_neon_fp16(b->d);
    for (int j = 0; j < 8; j++) {
        int8x16_t lo, hi;
        mf_neon_codes_iq4_xs(b, j, &lo, &hi);
        acc[j & 1] = vfmaq_n_f32(acc[j & 1], mf_neon_c32_dot(lo, hi, xb + 32 * j),
                                 d * (float)(mf_iq4xs_scale(b->scales_l, b->scales_h, j) - 32));
    }
}

#define MF_NEON_DOT_F32_K(NAME, NAME4, BLOCK, SB)                                              \
static inline float NAME(const void *MF_RESTRICT vw, const float *MF_RESTRICT x, ptrdiff_t n)  \
{                                                                                              \
    const BLOCK *w = (const BLOCK *)vw;                                 /* [n / 256] */        \
    float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};                               \
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++)                                                \
        SB(&w[ib], x + ib * QK_K, acc);                                                        \
    return vaddvq_f32(vaddq_f32(acc[0], acc[1]));                                              \
}                                                                                              \
static inline void NAME4(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,      \
                         float *out)                                                           \
{                                                                                              \
    const BLOCK *w[4] = {(const BLOCK *)vw[0], (const BLOCK *)vw[1], (const BLOCK *)vw[2],     \
                         (const BLOCK *)vw[3]};                         /* [n / 256] each */   \
    const ptrdiff_t nb = n / QK_K, bsz = (ptrdiff_t)sizeof(BLOCK);                             \
    const ptrdiff_t pf = mf_q_pf_dist(nb * bsz);                                               \
    float32x4_t acc[4][2];                                                                     \
    for (int r = 0; r < 4; r++)                                                                \
        acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);                                             \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        mf_q_prefetch4(w[0], nb * bsz, ib * bsz, bsz, pf);                                     \
        for (int r = 0; r < 4; r++)                                                            \
            SB(&w[r][ib], x + ib * QK_K, acc[r]);                                              \
    }                                                                                          \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = vaddvq_f32(vaddq_f32(acc[r][0], acc[r][1]));                                  \
}
MF_NEON_DOT_F32_K(mf_neon_dot_q4_K_f32, mf_neon_dot4_q4_K_f32, block_q4_K, mf_neon_fsb_q4_K)
MF_NEON_DOT_F32_K(mf_neon_dot_q5_K_f32, mf_neon_dot4_q5_K_f32, block_q5_K, mf_neon_fsb_q5_K)
MF_NEON_DOT_F32_K(mf_neon_dot_q6_K_f32, mf_neon_dot4_q6_K_f32, block_q6_K, mf_neon_fsb_q6_K)
MF_NEON_DOT_F32_K(mf_neon_dot_q2_K_f32, mf_neon_dot4_q2_K_f32, block_q2_K, mf_neon_fsb_q2_K)
MF_NEON_DOT_F32_K(mf_neon_dot_q3_K_f32, mf_neon_dot4_q3_K_f32, block_q3_K, mf_neon_fsb_q3_K)
MF_NEON_DOT_F32_K(mf_neon_dot_iq4_xs_f32, mf_neon_dot4_iq4_xs_f32, block_iq4_xs,
                  mf_neon_fsb_iq4_xs)
#undef MF_NEON_DOT_F32_K

/* FP16 / BF16 rows: two chains of 4 lanes over 8 weights (fcvtl; bf16: the bits << 16), the
 * scalar tail after; the 4-row dots are four one-row dots. */
MF_ALWAYS_INLINE float32x4_t mf_neon_widen_fp16(const mf_fp16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

MF_ALWAYS_INLINE float32x4_t mf_neon_widen_bf16(const mf_bf16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

#define MF_NEON_DOT_F32_HALF(NAME, TYPE, WIDEN, SCALAR)                                        \
static inline float NAME(const void *MF_RESTRICT vw, const float *MF_RESTRICT x, ptrdiff_t n)  \
{                                                                                              \
    const TYPE *w = (const TYPE *)vw;                                   /* [n] */              \
    ptrdiff_t i = 0;                                                                           \
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0;                                               \
    for (; i + 8 <= n; i += 8) {                                                               \
        s0 = vfmaq_f32(s0, WIDEN(w + i), vld1q_f32(x + i));                                    \
        s1 = vfmaq_f32(s1, WIDEN(w + i + 4), vld1q_f32(x + i + 4));                            \
    }                                                                                          \
    float r = vaddvq_f32(vaddq_f32(s0, s1));                                                   \
    for (; i < n; i++)                                                                         \
        r += SCALAR(w[i]) * x[i];                                                              \
    return r;                                                                                  \
}
MF_NEON_DOT_F32_HALF(mf_neon_dot_fp16_f32, mf_fp16_t, mf_neon_widen_fp16, mf_fp16_to_fp32)
MF_NEON_DOT_F32_HALF(mf_neon_dot_bf16_f32, mf_bf16_t, mf_neon_widen_bf16, mf_bf16_to_fp32)
#undef MF_NEON_DOT_F32_HALF

#endif /* MEGAFUSE_MF_NEON_DOT_F32_H */
