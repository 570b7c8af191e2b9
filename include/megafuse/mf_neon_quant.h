/*
 * mf_neon_quant.h -- the AArch64 Advanced SIMD building blocks of the quant headers (the neon,
 * neon_dotprod and i8mm levels; MF_Q_NEON): fp16 scales through the hardware conversion, the
 * exact 8-bit products of the integer dots, and the decoding of a block's codes into int8 lanes.
 *
 * The levels differ only in how the exact integer sums are formed:
 *   neon          vmull_s8 + vpadal (ARMv8.0): 16 products a register, summed in int16 pairs into
 *                 int32 lanes;
 *   neon_dotprod  vdotq_s32 (sdot, FEAT_DotProd): each int32 lane + 4 products;
 *   i8mm          sdot, and smmla (FEAT_I8MM) in the multi-token tiles (mf_neon_q8_tiles.h).
 * The lanes hold different partial sums, but every caller only uses a register's total (or sums
 * of whole registers), which is the same exact integer at each level: every NEON level gives the
 * same bits.  Included by mf_quant_common.h only.
 */
#ifndef MEGAFUSE_MF_NEON_QUANT_H
#define MEGAFUSE_MF_NEON_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <arm_neon.h>

/* acc + the products a[i] * b[i] of 16 int8 pairs (|a b| <= 2^14), in int32 lanes: only the
 * register's total is defined (see above). */
static inline int32x4_t mf_neon_dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    return vpadalq_s16(vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b))),
                       vmull_high_s8(a, b));
#endif
}

/* The sum of the 32 products of two 32-code halves: (a0 . b0) + (a1 . b1), as int32 lanes. */
static inline int32x4_t mf_neon_dot32_s8(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1)
{
    return mf_neon_dot_s8(mf_neon_dot_s8(vdupq_n_s32(0), a0, b0), a1, b1);
}

/* [total(v0), total(v1), total(v2), total(v3)] of four registers of int32 lanes. */
static inline int32x4_t mf_neon_totals4(int32x4_t v0, int32x4_t v1, int32x4_t v2, int32x4_t v3)
{
    return vpaddq_s32(vpaddq_s32(v0, v1), vpaddq_s32(v2, v3));
}

/* An fp16 scale as float: the hardware conversion (fcvt), equal to mf_fp16_to_fp32 except for
 * the payload of a signalling NaN, which comes out quiet (and only ever yields a NaN result). */
static inline float mf_neon_fp16(mf_fp16_t h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* Four fp16 values as 4 floats (lane i: h[i]). */
static inline float32x4_t mf_neon_fp16x4(mf_fp16_t h0, mf_fp16_t h1, mf_fp16_t h2, mf_fp16_t h3)
{
    const uint16_t h[4] = {h0, h1, h2, h3};
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* The 16 low nibbles and the 16 high nibbles of 16 bytes at qs (weights j and j + 16 of a
 * 32-weight block). */
static inline void mf_neon_nibbles(const uint8_t *qs, uint8x16_t *lo, uint8x16_t *hi)
{
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vandq_u8(v, vdupq_n_u8(0x0F));
    *hi = vshrq_n_u8(v, 4);
}

/* The 5th bits of a Q5_0 / Q5_1 block as 0x10 bytes: *lo for weights 0..15 (bits 0..15 of the
 * little-endian qh), *hi for weights 16..31. */
static inline void mf_neon_bits5(const uint8_t *qh4, uint8x16_t *lo, uint8x16_t *hi)
{
    static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint32_t qh = mf_le32(qh4);
    const uint8x16_t bit = vld1q_u8(sel), x10 = vdupq_n_u8(0x10);
    /* byte j of the bit pattern: qh byte j / 8 of the half */
    const uint8x16_t b01 = vcombine_u8(vdup_n_u8((uint8_t)qh), vdup_n_u8((uint8_t)(qh >> 8)));
    const uint8x16_t b23 = vcombine_u8(vdup_n_u8((uint8_t)(qh >> 16)), vdup_n_u8((uint8_t)(qh >> 24)));
    *lo = vandq_u8(vtstq_u8(b01, bit), x10);
    *hi = vandq_u8(vtstq_u8(b23, bit), x10);
}

/* The 32 signed codes of a 32-weight block, as the int8 dots and the float dots take them:
 * lo = weights 0..15, hi = 16..31; c - 8 (Q4_0), c - 16 (Q5_0), c (Q4_1 0..15, Q5_1 0..31), q
 * (Q8_0). */
static inline void mf_neon_codes_q4_0(const block_q4_0 *b, int8x16_t *lo, int8x16_t *hi)
{
    uint8x16_t l, h;
    mf_neon_nibbles(b->qs, &l, &h);
    *lo = vsubq_s8(vreinterpretq_s8_u8(l), vdupq_n_s8(8));
    *hi = vsubq_s8(vreinterpretq_s8_u8(h), vdupq_n_s8(8));
}

/* IQ4_NL: each nibble indexes GGML's 16 signed values (mf_kvalues_iq4nl), by a table lookup. */
static inline void mf_neon_codes_iq4_nl(const block_iq4_nl *b, int8x16_t *lo, int8x16_t *hi)
{
    const int8x16_t values = vld1q_s8(mf_kvalues_iq4nl);
    uint8x16_t l, h;
    mf_neon_nibbles(b->qs, &l, &h);
    *lo = vqtbl1q_s8(values, l);
    *hi = vqtbl1q_s8(values, h);
}

static inline void mf_neon_codes_q4_1(const block_q4_1 *b, int8x16_t *lo, int8x16_t *hi)
{
    uint8x16_t l, h;
    mf_neon_nibbles(b->qs, &l, &h);
    *lo = vreinterpretq_s8_u8(l);
    *hi = vreinterpretq_s8_u8(h);
}

static inline void mf_neon_codes_q5_0(const block_q5_0 *b, int8x16_t *lo, int8x16_t *hi)
{
    uint8x16_t l, h, bl, bh;
    mf_neon_nibbles(b->qs, &l, &h);
    mf_neon_bits5(b->qh, &bl, &bh);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l, bl)), vdupq_n_s8(16));
    *hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(h, bh)), vdupq_n_s8(16));
}

static inline void mf_neon_codes_q5_1(const block_q5_1 *b, int8x16_t *lo, int8x16_t *hi)
{
    uint8x16_t l, h, bl, bh;
    mf_neon_nibbles(b->qs, &l, &h);
    mf_neon_bits5(b->qh, &bl, &bh);
    *lo = vreinterpretq_s8_u8(vorrq_u8(l, bl));
    *hi = vreinterpretq_s8_u8(vorrq_u8(h, bh));
}

static inline void mf_neon_codes_q8_0(const block_q8_0 *b, int8x16_t *lo, int8x16_t *hi)
{
    *lo = vld1q_s8(b->qs);
    *hi = vld1q_s8(b->qs + 16);
}

/* The codes of sub-blocks 2c (low nibbles) and 2c + 1 (high) of a Q4_K / Q5_K super-block, 32
 * each as two registers: s0[0..1] = weights 64c + 0..31, s1[0..1] = 64c + 32..63 (codes 0..15,
 * or 0..31 with Q5_K's 5th bits from qh: bit 2c of qh[l] for the low nibble of qs[32c + l], bit
 * 2c + 1 for its high nibble).  qh = NULL: Q4_K. */
static inline void mf_neon_codes_k45(const uint8_t *qs, const uint8_t *qh, int c, int8x16_t s0[2],
                                     int8x16_t s1[2])
{
    for (int k = 0; k < 2; k++) {
        uint8x16_t lo, hi;
        mf_neon_nibbles(qs + 32 * c + 16 * k, &lo, &hi);
        if (qh) {
            const uint8x16_t h = vld1q_u8(qh + 16 * k), one = vdupq_n_u8(1);
            const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * c));        /* right shift by 2c */
            const uint8x16_t hb = vshlq_u8(h, sh);
            lo = vorrq_u8(lo, vshlq_n_u8(vandq_u8(hb, one), 4));
            hi = vorrq_u8(hi, vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 1), one), 4));
        }
        s0[k] = vreinterpretq_s8_u8(lo);
        s1[k] = vreinterpretq_s8_u8(hi);
    }
}

/* The 6-bit codes (0..63) of half h of a Q6_K super-block: q[k][0..1] = weights 128h + 32k +
 * 0..31 (mf_q6k_codes_all's order), two registers each. */
static inline void mf_neon_codes_q6_K(const block_q6_K *b, int h, int8x16_t q[4][2])
{
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(0x03);
    for (int k = 0; k < 2; k++) {
        const uint8x16_t ql0 = vld1q_u8(b->ql + 64 * h + 16 * k);
        const uint8x16_t ql1 = vld1q_u8(b->ql + 64 * h + 32 + 16 * k);
        const uint8x16_t qh = vld1q_u8(b->qh + 32 * h + 16 * k);
        q[0][k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(ql0, m4), vshlq_n_u8(vandq_u8(qh, m3), 4)));
        q[1][k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(ql1, m4),
                                               vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 2), m3), 4)));
        q[2][k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(ql0, 4),
                                               vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 4), m3), 4)));
        q[3][k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(ql1, 4), vshlq_n_u8(vshrq_n_u8(qh, 6), 4)));
    }
}

/* The 2-bit codes (0..3) of a half of a Q2_K / Q3_K super-block from its 32 qs bytes q:
 * c[k][0..1] = weights 32k + 0..31 of the half (bits 2k, 2k + 1 of q[0..31]), two registers each
 * (the half's sub-blocks 2k, 2k + 1 of 16). */
static inline void mf_neon_codes2(const uint8_t *q, int8x16_t c[4][2])
{
    const uint8x16_t m3 = vdupq_n_u8(0x03);
    const uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
    c[0][0] = vreinterpretq_s8_u8(vandq_u8(q0, m3));
    c[0][1] = vreinterpretq_s8_u8(vandq_u8(q1, m3));
    c[1][0] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q0, 2), m3));
    c[1][1] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q1, 2), m3));
    c[2][0] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q0, 4), m3));
    c[2][1] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q1, 4), m3));
    c[3][0] = vreinterpretq_s8_u8(vshrq_n_u8(q0, 6));
    c[3][1] = vreinterpretq_s8_u8(vshrq_n_u8(q1, 6));
}

/* The codes (0..3) of half h of a Q2_K super-block: q[k][0..1] = weights 128h + 32k + 0..31,
 * sub-blocks 8h + 2k and 8h + 2k + 1. */
static inline void mf_neon_codes_q2_K(const block_q2_K *b, int h, int8x16_t q[4][2])
{
    mf_neon_codes2(b->qs + 32 * h, q);
}

/* The signed values (-4..3: the 2-bit code, minus 4 where the hmask bit is clear) of half h of a
 * Q3_K super-block, laid out as mf_neon_codes_q2_K's (the third bit of weight 128h + 32k + l:
 * bit 4h + k of hmask[l]).  v . a = (u . a) - 4 bsum with u = v + 4: the sums of mf_dot_q8.h. */
static inline void mf_neon_codes_q3_K(const block_q3_K *b, int h, int8x16_t q[4][2])
{
    const uint8x16_t hm0 = vld1q_u8(b->hmask), hm1 = vld1q_u8(b->hmask + 16);
    const uint8x16_t x4 = vdupq_n_u8(4);
    mf_neon_codes2(b->qs + 32 * h, q);
    for (int k = 0; k < 4; k++) {
        const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + k)));
        q[k][0] = vsubq_s8(q[k][0], vreinterpretq_s8_u8(vbicq_u8(x4, vtstq_u8(hm0, bit))));
        q[k][1] = vsubq_s8(q[k][1], vreinterpretq_s8_u8(vbicq_u8(x4, vtstq_u8(hm1, bit))));
    }
}

/* IQ4_XS sub-block j (0..7): lo / hi = the values of weights 32j + 0..15 / 16..31 (the low / high
 * nibbles of qs[16j + 0..15] through GGML's table, as IQ4_NL's codes). */
static inline void mf_neon_codes_iq4_xs(const block_iq4_xs *b, int j, int8x16_t *lo, int8x16_t *hi)
{
    const int8x16_t values = vld1q_s8(mf_kvalues_iq4nl);
    uint8x16_t l, h;
    mf_neon_nibbles(b->qs + 16 * j, &l, &h);
    *lo = vqtbl1q_s8(values, l);
    *hi = vqtbl1q_s8(values, h);
}

#endif /* MEGAFUSE_MF_NEON_QUANT_H */
