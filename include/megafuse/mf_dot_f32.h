/*
 * mf_dot_f32.h -- the dot of one weight row with float32 activations, the weights decoded in
 * registers: mf_dot_<dt>_f32(const void *w, const float *x, n) = sum_i w_i x_i for every weight
 * format dt (w: one row, ck_dtype_row_bytes(dt, n) bytes; x [n]).
 *
 * Float dots accumulate per block, then scale by the block's factors; the order is fixed by n
 * alone, so results do not depend on threads (they differ in the last bits between SIMD levels,
 * as any float reduction does).
 *
 * Depends on: mf_quant_common.h (levels, fp16 scales, K-quant scales, Q6_K codes), mf_simd.h
 * (mf_dot_f32, mf_hsum256, mf_sum8), ggml_blocks.h (block structs, fp16 / bf16 conversions).
 */
#ifndef MEGAFUSE_MF_DOT_F32_H
#define MEGAFUSE_MF_DOT_F32_H

#include <stddef.h>
#include <stdint.h>

#include "ckernel_dtype.h"
#include "ggml_blocks.h"
#include "mf_simd.h"
#include "mf_quant_common.h"
#if defined(MF_Q_NEON)
#  include "mf_neon_dot_f32.h"
#endif

/* ============================================================================================ */
/* Dot of a weight row with float32 activations: sum_i w_i x_i, the weights decoded in          */
/* registers.  Per block: s = sum q_j x_j (and sum x_j where there is a min), then               */
/* acc += d * s (- m * sum x).                                                                   */
/* ============================================================================================ */

#if defined(MF_Q_AVX2)

/* the 8 lanes of v summed in mf_simd.h's fixed order */
static inline float mf_q_hsum_ps(__m256 v) { return mf_hsum256(v); }

/* The float path's code -> float conversion.  The 32 codes of a block arrive as two registers
 * that each repeat 16 unsigned codes in both 128-bit lanes: lo = codes 0..15, hi = codes 16..31
 * (a vbroadcasti128 load, or a nibble mask of one).  vpshufb puts each code in the low byte of a
 * 32-bit lane, OR 0x4B000000 makes the float 2^23 + c exactly, and subtracting 2^23 + off gives
 * c - off exactly -- cheaper than sign-extending bytes to dwords and converting.
 * *sa, *sb = 8 lanes of partial sums of (c_j - off) * x[j] over j < 16 and 16 <= j < 32. */
static inline void mf_q_u8x32_dot2(__m256i lo, __m256i hi, __m256 off, const float *x,
                                   __m256 *sa, __m256 *sb)
{
    const __m256i s0 = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                        4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i s1 = _mm256_add_epi8(s0, _mm256_setr_epi8(
        8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0));
    const __m256i magic = _mm256_set1_epi32(0x4B000000);
    const __m256 bias = _mm256_add_ps(_mm256_set1_ps(8388608.0f), off);     /* exact */
    __m256 f0 = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_shuffle_epi8(lo, s0), magic)), bias);
    __m256 f1 = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_shuffle_epi8(lo, s1), magic)), bias);
    __m256 f2 = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_shuffle_epi8(hi, s0), magic)), bias);
    __m256 f3 = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_shuffle_epi8(hi, s1), magic)), bias);
    *sa = _mm256_fmadd_ps(f1, _mm256_loadu_ps(x + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(x)));
    *sb = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x + 24), _mm256_mul_ps(f2, _mm256_loadu_ps(x + 16)));
}

/* mf_q_u8x32_dot2 with no offset, each code made a float by vcvtdq2ps (exact: the same floats). */
static inline void mf_q_u8x32_dot2_0(__m256i lo, __m256i hi, const float *x, __m256 *sa, __m256 *sb)
{
    const __m256i s0 = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                        4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i s1 = _mm256_add_epi8(s0, _mm256_setr_epi8(
        8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0));
    const __m256 f0 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, s0));
    const __m256 f1 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, s1));
    const __m256 f2 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, s0));
    const __m256 f3 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, s1));
    *sa = _mm256_fmadd_ps(f1, _mm256_loadu_ps(x + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(x)));
    *sb = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x + 24), _mm256_mul_ps(f2, _mm256_loadu_ps(x + 16)));
}

static inline __m256 mf_q_u8x32_dot(__m256i lo, __m256i hi, __m256 off, const float *x)
{
    __m256 sa, sb;
    mf_q_u8x32_dot2(lo, hi, off, x, &sa, &sb);
    return _mm256_add_ps(sa, sb);
}

/* mf_q_u8x32_dot with no offset, each code made a float by vcvtdq2ps (exact, the same floats as
 * 2^23 + c - 2^23): one instruction a register less. */
static inline __m256 mf_q_u8x32_dot0(__m256i lo, __m256i hi, const float *x)
{
    const __m256i s0 = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                        4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i s1 = _mm256_add_epi8(s0, _mm256_setr_epi8(
        8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0));
    const __m256 f0 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, s0));
    const __m256 f1 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, s1));
    const __m256 f2 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, s0));
    const __m256 f3 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, s1));
    const __m256 sa = _mm256_fmadd_ps(f1, _mm256_loadu_ps(x + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(x)));
    const __m256 sb = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x + 24), _mm256_mul_ps(f2, _mm256_loadu_ps(x + 16)));
    return _mm256_add_ps(sa, sb);
}

/* 16 bytes at p repeated in both 128-bit lanes. */
static inline __m256i mf_q_bcast16(const uint8_t *p)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* The 5th bits of a Q5_0 / Q5_1 block in the same layout: 0x10 where bit j of qh is set, for
 * j = 16 * half + 0..15, repeated in both lanes. */
static inline __m256i mf_q_bits16_x10(const uint8_t *qh4, int half)
{
    const __m256i shuf = _mm256_set_epi64x(0x0101010101010101LL, 0x0000000000000000LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_set1_epi16((short)(mf_le32(qh4) >> (16 * half)));
    v = _mm256_shuffle_epi8(v, shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Both halves of mf_q_bits16_x10 from one broadcast of the block's qh: *lo = half 0 (weights
 * 0..15), *hi = half 1 (16..31), the same bytes. */
static inline void mf_q_bits16x2_x10(const uint8_t *qh4, __m256i *lo, __m256i *hi)
{
    const __m256i shl = _mm256_set_epi64x(0x0101010101010101LL, 0x0000000000000000LL,
                                          0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i shh = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                          0x0303030303030303LL, 0x0202020202020202LL);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i x10 = _mm256_set1_epi8(0x10);
    const __m256i v = _mm256_set1_epi32((int)mf_le32(qh4));
    *lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, shl), sel), sel), x10);
    *hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, shh), sel), sel), x10);
}

/* x[0..31] summed into 8 lanes. */
static inline __m256 mf_q_sum32(const float *x)
{
    return _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                         _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
}

/* The 8 sub-block sums of a super-block's x: sx[j] = mf_q_sum32(xb + 32 j).  Q4_K / Q5_K rows
 * dotted with the same x share them (the 4-row dots form them once for the four rows). */
static inline void mf_q_sums8(const float *xb /* [256] */, __m256 sx[8])
{
    for (int j = 0; j < 8; j++)
        sx[j] = mf_q_sum32(xb + 32 * j);
}

#endif /* MF_Q_AVX2 */

static inline float mf_dot_fp32_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    return mf_dot_f32((const float *)vw, x, n);
}

static inline float mf_dot_fp16_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const mf_fp16_t *w = (const mf_fp16_t *)vw;
    ptrdiff_t i = 0;
#if defined(MF_SIMD_AVX512)
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(w + i)));
        __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(w + i + 16)));
        s0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), s1);
    }
    float r = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    for (; i < n; i++)
        r += mf_fp16_to_fp32(w[i]) * x[i];
    return r;
#elif defined(MF_Q_F16C)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(w + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(w + i + 8)));
        s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), s1);
    }
    float r = mf_q_hsum_ps(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        r += mf_fp16_to_fp32(w[i]) * x[i];
    return r;
#elif defined(MF_Q_NEON)
    (void)i;
    return mf_neon_dot_fp16_f32(w, x, n);
#else
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += mf_fp16_to_fp32_lanes(w[i + k]) * x[i + k];
    float r = mf_sum8(s);
    for (; i < n; i++)
        r += mf_fp16_to_fp32(w[i]) * x[i];
    return r;
#endif
}

static inline float mf_dot_bf16_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const mf_bf16_t *w = (const mf_bf16_t *)vw;
    ptrdiff_t i = 0;
#if defined(MF_SIMD_AVX512)
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        __m512i b0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(w + i)));
        __m512i b1 = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(w + i + 16)));
        s0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(b0, 16)), _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(b1, 16)), _mm512_loadu_ps(x + i + 16), s1);
    }
    float r = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    for (; i < n; i++)
        r += mf_bf16_to_fp32(w[i]) * x[i];
    return r;
#elif defined(MF_Q_AVX2)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256i b0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(w + i)));
        __m256i b1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(w + i + 8)));
        s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(b0, 16)), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(b1, 16)), _mm256_loadu_ps(x + i + 8), s1);
    }
    float r = mf_q_hsum_ps(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        r += mf_bf16_to_fp32(w[i]) * x[i];
    return r;
#elif defined(MF_Q_NEON)
    (void)i;
    return mf_neon_dot_bf16_f32(w, x, n);
#else
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += mf_bf16_to_fp32(w[i + k]) * x[i + k];
    float r = mf_sum8(s);
    for (; i < n; i++)
        r += mf_bf16_to_fp32(w[i]) * x[i];
    return r;
#endif
}

#if !defined(MF_Q_AVX2)
/* Generic helpers: 8 lanes of partial sums of q[j] * x[j] (and of x[j]) over 32 values. */
static inline void mf_q_lanes_qx32(const int8_t q[32], const float *x, float s[8])
{
    for (int k = 0; k < 8; k++)
        s[k] = (float)q[k] * x[k];
    for (int j = 8; j < 32; j += 8)
        for (int k = 0; k < 8; k++)
            s[k] += (float)q[j + k] * x[j + k];
}

static inline void mf_q_lanes_x32(const float *x, float s[8])
{
    for (int k = 0; k < 8; k++)
        s[k] = (x[k] + x[k + 8]) + (x[k + 16] + x[k + 24]);
}
#endif

#if defined(MF_Q_AVX2)
/* The dword codes route: 8 bytes zero-extended to 8 dwords (one load-and-extend), nibbles split
 * by a mask and a 32-bit shift, each code c made a float by OR-ing the exponent of 2^23 and
 * subtracting 2^23 + off (exact: c - off), or by vcvtdq2ps where there is no offset. */
static inline __m256i mf_q_u8x8_epi32(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

static inline __m256 mf_q_code_off_ps(__m256i c, __m256 bias /* 2^23 + off */)
{
    return _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(c, _mm256_set1_epi32(0x4B000000))),
                         bias);
}

/* sum_j (c_j - off) x[j] over the 32 codes of 16 nibble bytes at q (weight j: the low nibble of
 * byte j for j < 16, the high nibble of byte j - 16), as 8 lanes: one product chain. */
static inline __m256 mf_q_nib32_dot(const uint8_t *q, float off, const float *x)
{
    const __m256i m4 = _mm256_set1_epi32(0x0F);
    const __m256 bias = _mm256_set1_ps(8388608.0f + off);                /* exact */
    const __m256i v0 = mf_q_u8x8_epi32(q), v1 = mf_q_u8x8_epi32(q + 8);
    __m256 s = _mm256_mul_ps(mf_q_code_off_ps(_mm256_and_si256(v0, m4), bias), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(mf_q_code_off_ps(_mm256_and_si256(v1, m4), bias), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(mf_q_code_off_ps(_mm256_srli_epi32(v0, 4), bias), _mm256_loadu_ps(x + 16), s);
    return _mm256_fmadd_ps(mf_q_code_off_ps(_mm256_srli_epi32(v1, 4), bias), _mm256_loadu_ps(x + 24), s);
}

/* mf_q_nib32_dot with no offset (Q4_1): each code made a float by vcvtdq2ps, exact, the same
 * floats. */
static inline __m256 mf_q_nib32_dot0(const uint8_t *q, const float *x)
{
    const __m256i m4 = _mm256_set1_epi32(0x0F);
    const __m256i v0 = mf_q_u8x8_epi32(q), v1 = mf_q_u8x8_epi32(q + 8);
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m4)), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, m4)), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), _mm256_loadu_ps(x + 16), s);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), _mm256_loadu_ps(x + 24), s);
}
#endif

#if defined(MF_Q_AVX2)
/* One 32-weight block against x[0..31]: acc + d * (q . x) (+ m * sum x). */
static inline __m256 mf_q_fblk_q4_0(const block_q4_0 *b, const float *x, __m256 acc)
{
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16_table[b->d]), mf_q_nib32_dot(b->qs, 8.0f, x),
                           acc);
}

static inline __m256 mf_q_fblk_q4_1(const block_q4_1 *b, const float *x, __m256 acc)
{
    __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16_table[b->d]), mf_q_nib32_dot0(b->qs, x),
                               acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16_table[b->m]), mf_q_sum32(x), a);
}

static inline __m256 mf_q_fblk_q5_0(const block_q5_0 *b, const float *x, __m256 acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), v = mf_q_bcast16(b->qs);
    __m256i blo, bhi;
    mf_q_bits16x2_x10(b->qh, &blo, &bhi);
    __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), blo);
    __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), bhi);
    __m256 s = mf_q_u8x32_dot(lo, hi, _mm256_set1_ps(16.0f), x);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16_table[b->d]), s, acc);
}

static inline __m256 mf_q_fblk_q5_1(const block_q5_1 *b, const float *x, __m256 acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), v = mf_q_bcast16(b->qs);
    __m256i blo, bhi;
    mf_q_bits16x2_x10(b->qh, &blo, &bhi);
    __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), blo);
    __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), bhi);
    __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16_table[b->d]), mf_q_u8x32_dot0(lo, hi, x),
                               acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16_table[b->m]), mf_q_sum32(x), a);
}

static inline __m256 mf_q_fblk_q8_0(const block_q8_0 *b, const float *x, __m256 acc)
{
    const int8_t *q = b->qs;
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64((const __m128i *)(const void *)q))), _mm256_loadu_ps(x));
    for (int k = 1; k < 4; k++)
        s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)(const void *)(q + 8 * k)))), _mm256_loadu_ps(x + 8 * k), s);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16_table[b->d]), s, acc);
}

#if defined(MF_SIMD_AVX512)
/* The avx512 level's float dots of the 32-weight formats: a row's block in 16 lanes.  Weight j
 * of the block (its code c_j) meets x[j] in lane j % 16; per block s = lo * x[0..15] + hi *
 * x[16..31] (lo, hi: the codes of weights 0..15 and 16..31 as floats, c - off), then acc +=
 * d s; Q5_1 adds m (x[0..15] + x[16..31]) into a second accumulator (Q4_1: its table holds its
 * weights, below).  The row's result is mf_q_hsum16(acc[0] + acc[1]).  A code becomes its
 * float in one permute of a 16-entry table (the 4-bit formats: vpermps reads an index's low 4
 * bits, so a nibble needs no mask), a scale is a load from mf_q_fp16_table that the FMA
 * broadcasts: 7 vector operations a row's block of Q4_0 where two rows in the halves of a
 * register (each half avx2's operations) took about 17, most of them on the shuffle port.  The
 * one-row dots and the four-row dots run the same operations for each row: the same bits. */

/* A block's activations: x0 = x[0..15], x1 = x[16..31], sx = x0 + x1 (the mins' term). */
typedef struct {
    __m512 x0, x1, sx;
} mf_q_fx16;

MF_ALWAYS_INLINE mf_q_fx16 mf_q_fx16_load(const float *xb /* [32] */)
{
    mf_q_fx16 X;
    X.x0 = _mm512_loadu_ps(xb);
    X.x1 = _mm512_loadu_ps(xb + 16);
    X.sx = _mm512_add_ps(X.x0, X.x1);
    return X;
}

/* The 16-entry code table: entry c = c - off. */
MF_ALWAYS_INLINE __m512 mf_q_ftab16(float off)
{
    return _mm512_sub_ps(_mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f,
                                        9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f),
                         _mm512_set1_ps(off));
}

/* A scale (fp16 bits) in 16 lanes: a table load, broadcast by the instruction that uses it. */
#define MF_Q_FS16(h) _mm512_set1_ps(mf_q_fp16_table[(h)])

/* The 16 bytes at qs, one a dword: byte j in lane j (its low nibble = weight j's code, its high
 * nibble = weight j + 16's). */
MF_ALWAYS_INLINE __m512i mf_q_qs16_epi32(const uint8_t *qs)
{
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)qs));
}

/* acc += d * (lo . x0 + hi . x1), lane by lane. */
MF_ALWAYS_INLINE __m512 mf_q_fblk16_acc(__m512 lo, __m512 hi, const mf_q_fx16 *X, mf_fp16_t d,
                                        __m512 acc)
{
    const __m512 s = _mm512_fmadd_ps(hi, X->x1, _mm512_mul_ps(lo, X->x0));
    return _mm512_fmadd_ps(s, MF_Q_FS16(d), acc);
}

/* One block of each format into acc[0] (and acc[1]: the mins); T = mf_q_ftab16(the offset). */
MF_ALWAYS_INLINE void mf_q_fblk16_q4_0(const block_q4_0 *b, const mf_q_fx16 *X, __m512 T,
                                       __m512 acc[2])
{
    const __m512i v = mf_q_qs16_epi32(b->qs);
    acc[0] = mf_q_fblk16_acc(_mm512_permutexvar_ps(v, T),
                             _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), T), X, b->d, acc[0]);
}
/* Q4_1: the block's table holds its weights themselves, d c + m (one FMA, d c exact: GGML's
 * dequantized values), so a permute gives 16 weights and one FMA a register takes them in:
 * acc[0] the first 16, acc[1] the last: fewer operations a block than codes, then d and m as
 * terms of their own. */
MF_ALWAYS_INLINE void mf_q_fblk16_q4_1(const block_q4_1 *b, const mf_q_fx16 *X, __m512 T,
                                       __m512 acc[2])
{
    const __m512i v = mf_q_qs16_epi32(b->qs);
    const __m512 tw = _mm512_fmadd_ps(T, MF_Q_FS16(b->d), MF_Q_FS16(b->m));
    acc[0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, tw), X->x0, acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tw), X->x1, acc[1]);
}
/* Q5_0 / Q5_1: the nibble's float from the table, + 16 where the block's 5th bit is set (bit j of
 * qh for weight j: a mask register, no unpacking). */
MF_ALWAYS_INLINE void mf_q_fblk16_q5(const uint8_t *qs, const uint8_t *qh4, const mf_q_fx16 *X,
                                     __m512 T, mf_fp16_t d, __m512 *acc)
{
    const __m512i v = mf_q_qs16_epi32(qs);
    const uint32_t qh = mf_le32(qh4);
    const __m512 c16 = _mm512_set1_ps(16.0f);
    __m512 lo = _mm512_permutexvar_ps(v, T), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), T);
    lo = _mm512_mask_add_ps(lo, (__mmask16)(qh & 0xFFFFu), lo, c16);
    hi = _mm512_mask_add_ps(hi, (__mmask16)(qh >> 16), hi, c16);
    *acc = mf_q_fblk16_acc(lo, hi, X, d, *acc);
}
MF_ALWAYS_INLINE void mf_q_fblk16_q5_0(const block_q5_0 *b, const mf_q_fx16 *X, __m512 T,
                                       __m512 acc[2])
{
    mf_q_fblk16_q5(b->qs, b->qh, X, T, b->d, &acc[0]);
}
MF_ALWAYS_INLINE void mf_q_fblk16_q5_1(const block_q5_1 *b, const mf_q_fx16 *X, __m512 T,
                                       __m512 acc[2])
{
    mf_q_fblk16_q5(b->qs, b->qh, X, T, b->d, &acc[0]);
    acc[1] = _mm512_fmadd_ps(X->sx, MF_Q_FS16(b->m), acc[1]);
}
MF_ALWAYS_INLINE void mf_q_fblk16_q8_0(const block_q8_0 *b, const mf_q_fx16 *X, __m512 T,
                                       __m512 acc[2])
{
    (void)T;
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128((const __m128i *)(const void *)b->qs)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128((const __m128i *)(const void *)(b->qs + 16))));
    acc[0] = mf_q_fblk16_acc(lo, hi, X, b->d, acc[0]);
}

/* A row's 16 lanes (and its mins' lanes) summed in a fixed order. */
MF_ALWAYS_INLINE float mf_q_hsum16(const __m512 acc[2])
{
    const __m512 t = _mm512_add_ps(acc[0], acc[1]);
    return mf_hsum256(_mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1)));
}

/* The one-row dot of a 32-weight format (TAB: its code table, mf_q_ftab16(the code offset)). */
#define MF_Q_FDOT16(BLOCK_FN, TAB)                                                             \
    const __m512 T = (TAB);                                                                    \
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};                                \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        const mf_q_fx16 X = mf_q_fx16_load(x + 32 * ib);                                       \
        BLOCK_FN(&w[ib], &X, T, acc);                                                          \
    }                                                                                          \
    return mf_q_hsum16(acc);

/* The K-quants in 16 lanes a row, the same way.  Q4_K, Q5_K: each sub-block of 32 gets a
 * 16-entry table of its weights themselves (mf_q_fsb16_k45), so the mins need no term of their
 * own; Q6_K: its 6-bit codes c - 32 in bytes, then vpmovsxbd + vcvtdq2ps, each sub-block of 16
 * scaled once by d * sc (the FMA's broadcast of a float on the stack).  acc[0] / acc[1] take
 * alternate sub-blocks; the row's result is mf_q_hsum16(acc).  (Q5_K's fifth bits, a mask test
 * and a masked add each 16 weights, keep it the slowest.) */

/* The 8 scales and 8 mins of a Q4_K / Q5_K super-block times d, dmin: out[j] = d * sc_j, out[8 +
 * j] = dmin * m_j, j < 8 (exact products, as mf_kquant_scales8's), the 6-bit fields unpacked in
 * one 128-bit register: bytes [sc0..sc3 | sc4..sc7 | m0..m3 | m4..m7] are s[0..3] & 63, (s[8..11]
 * & 15) | (s[0..3] >> 6) << 4, s[4..7] & 63, (s[8..11] >> 4) | (s[4..7] >> 6) << 4.  Reads the 16
 * bytes at scales (the 12 of the field and 4 of the codes after it). */
MF_ALWAYS_INLINE void mf_q_kscales16(const uint8_t *scales, mf_fp16_t d, mf_fp16_t dmin,
                                     float out[16])
{
    const __m128i sv = _mm_loadu_si128((const __m128i *)(const void *)scales);
    const __m128i p = _mm_shuffle_epi8(sv, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7,
                                                         8, 9, 10, 11));
    const __m128i q = _mm_shuffle_epi8(sv, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1,
                                                         4, 5, 6, 7));
    const __m128i a = _mm_and_si128(p, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63,
                                                     0, 0, 0, 0));
    const __m128i b = _mm_and_si128(_mm_srli_epi16(p, 4), _mm_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i c = _mm_srli_epi16(_mm_and_si128(q, _mm_set1_epi8((char)0xC0)), 2);
    const __m128i r = _mm_or_si128(_mm_or_si128(a, b), c);
    const __m512 f = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(mf_q_fp16_table[d]),
                                          _mm512_set1_ps(mf_q_fp16_table[dmin]));
    _mm512_storeu_ps(out, _mm512_mul_ps(f, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(r))));
}

/* Q4_K (qh = NULL) and Q5_K: one super-block of a row into acc[0] (low nibbles' sub-blocks) and
 * acc[1] (high); T = mf_q_ftab16(0).  Each sub-block's 16-entry table holds its weights
 * themselves, d sc c - dmin m for c < 16 (one FMA: the rounding of GGML's dequantization), so a
 * permute gives 16 weights and one FMA a register takes them into the sum; Q5_K adds d sc 16
 * where the fifth bit is set. */
MF_ALWAYS_INLINE void mf_q_fsb16_k45(const uint8_t *scales, mf_fp16_t d, mf_fp16_t dmin,
                                     const uint8_t *qs /* [128] */, const uint8_t *qh /* [32] */,
                                     const float *xb, __m512 T, __m512 acc[2])
{
    MF_ALIGNED(64) float ks[24];           /* [d sc_0..7 | dmin m_0..7 | (Q5_K) 16 d sc_0..7] */
    mf_q_kscales16(scales, d, dmin, ks);
    __m128i h0 = _mm_setzero_si128(), h1 = _mm_setzero_si128();
    if (qh) {
        h0 = _mm_loadu_si128((const __m128i *)(const void *)qh);
        h1 = _mm_loadu_si128((const __m128i *)(const void *)(qh + 16));
        _mm256_store_ps(ks + 16, _mm256_mul_ps(_mm256_load_ps(ks), _mm256_set1_ps(16.0f)));
    }
    for (int c = 0; c < 4; c++) {          /* sub-blocks 2c (low nibbles), 2c + 1 (high) */
        const __m512i v0 = mf_q_qs16_epi32(qs + 32 * c), v1 = mf_q_qs16_epi32(qs + 32 * c + 16);
        const __m512 ta = _mm512_fmsub_ps(T, _mm512_set1_ps(ks[2 * c]),
                                          _mm512_set1_ps(ks[8 + 2 * c]));
        const __m512 tb = _mm512_fmsub_ps(T, _mm512_set1_ps(ks[2 * c + 1]),
                                          _mm512_set1_ps(ks[8 + 2 * c + 1]));
        __m512 a0 = _mm512_permutexvar_ps(v0, ta), a1 = _mm512_permutexvar_ps(v1, ta);
        __m512 b0 = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), tb);
        __m512 b1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), tb);
        if (qh) {
            const __m128i ba = _mm_set1_epi8((char)(1 << (2 * c)));
            const __m128i bb = _mm_set1_epi8((char)(1 << (2 * c + 1)));
            const __m512 ha = _mm512_set1_ps(ks[16 + 2 * c]);            /* exact */
            const __m512 hb = _mm512_set1_ps(ks[16 + 2 * c + 1]);
            a0 = _mm512_mask_add_ps(a0, _mm_test_epi8_mask(h0, ba), a0, ha);
            a1 = _mm512_mask_add_ps(a1, _mm_test_epi8_mask(h1, ba), a1, ha);
            b0 = _mm512_mask_add_ps(b0, _mm_test_epi8_mask(h0, bb), b0, hb);
            b1 = _mm512_mask_add_ps(b1, _mm_test_epi8_mask(h1, bb), b1, hb);
        }
        const float *xs = xb + 64 * c;
        acc[0] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(xs), acc[0]);
        acc[1] = _mm512_fmadd_ps(b0, _mm512_loadu_ps(xs + 32), acc[1]);
        acc[0] = _mm512_fmadd_ps(a1, _mm512_loadu_ps(xs + 16), acc[0]);
        acc[1] = _mm512_fmadd_ps(b1, _mm512_loadu_ps(xs + 48), acc[1]);
    }
}
MF_ALWAYS_INLINE void mf_q_fsb16_q4_K(const block_q4_K *b, const float *xb, __m512 T,
                                      __m512 acc[2])
{
    mf_q_fsb16_k45(b->scales, b->d, b->dmin, b->qs, NULL, xb, T, acc);
}
MF_ALWAYS_INLINE void mf_q_fsb16_q5_K(const block_q5_K *b, const float *xb, __m512 T,
                                      __m512 acc[2])
{
    mf_q_fsb16_k45(b->scales, b->d, b->dmin, b->qs, b->qh, xb, T, acc);
}

/* Q6_K: one super-block of a row into acc[0] / acc[1] (its 16 sub-blocks of 16: even / odd). */
MF_ALWAYS_INLINE void mf_q_fsb16_q6_K(const block_q6_K *b, const float *xb, __m512 T,
                                      __m512 acc[2])
{
    (void)T;
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)b->scales);
    MF_ALIGNED(64) float ds[16];      /* d * sc[j]: exact (|sc| <= 128, d an fp16) */
    _mm512_store_ps(ds, _mm512_mul_ps(MF_Q_FS16(b->d),
                                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8))));
    const __m256i x20 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        mf_q6k_codes(b, h, q);               /* q[k]: weights 128h + 32k .. + 31, codes 0..63 */
        for (int k = 0; k < 4; k++) {
            const int j = 8 * h + 2 * k;     /* sub-blocks j (weights 0..15 of q[k]), j + 1 */
            const __m256i c = _mm256_sub_epi8(q[k], x20);
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(c)));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm256_extracti128_si256(c, 1)));
            const float *xs = xb + 128 * h + 32 * k;
            acc[0] = _mm512_fmadd_ps(_mm512_mul_ps(lo, _mm512_loadu_ps(xs)), _mm512_set1_ps(ds[j]),
                                     acc[0]);
            acc[1] = _mm512_fmadd_ps(_mm512_mul_ps(hi, _mm512_loadu_ps(xs + 16)),
                                     _mm512_set1_ps(ds[j + 1]), acc[1]);
        }
    }
}

/* The one-row dot of a K-quant (SB_FN: mf_q_fsb16_*). */
#define MF_Q_FDOT16_K(SB_FN)                                                                   \
    const __m512 T = mf_q_ftab16(0.0f);                                                        \
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};                                \
    for (ptrdiff_t ib = 0; ib < nb; ib++)                                                      \
        SB_FN(&w[ib], x + ib * QK_K, T, acc);                                                  \
    return mf_q_hsum16(acc);
#endif /* MF_SIMD_AVX512 */

/* Blocks alternate between two accumulators (register-resident, independent chains). */
#define MF_Q_FDOT_LOOP(BLOCK_FN, QK)                                                           \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                             \
    ptrdiff_t ib = 0;                                                                          \
    for (; ib + 2 <= nb; ib += 2) {                                                            \
        acc0 = BLOCK_FN(&w[ib], x + ib * QK, acc0);                                            \
        acc1 = BLOCK_FN(&w[ib + 1], x + (ib + 1) * QK, acc1);                                  \
    }                                                                                          \
    if (ib < nb)                                                                               \
        acc0 = BLOCK_FN(&w[ib], x + ib * QK, acc0);                                            \
    return mf_q_hsum_ps(_mm256_add_ps(acc0, acc1));
#endif

static inline float mf_dot_q4_0_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q4_0 *w = (const block_q4_0 *)vw;   /* [n / 32] */
    const ptrdiff_t nb = n / QK4_0;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16(mf_q_fblk16_q4_0, mf_q_ftab16(8.0f))
#elif defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q4_0, QK4_0)
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q4_0_f32(w, x, nb * QK4_0);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        int8_t q[32];
        float s[8];
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((w[ib].qs[j] & 0x0F) - 8);
            q[j + 16] = (int8_t)((w[ib].qs[j] >> 4) - 8);
        }
        mf_q_lanes_qx32(q, x + ib * QK4_0, s);
        const float d = mf_q_fp16(w[ib].d);
        for (int k = 0; k < 8; k++)
            acc[k] += d * s[k];
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q4_1_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q4_1 *w = (const block_q4_1 *)vw;   /* [n / 32] */
    const ptrdiff_t nb = n / QK4_1;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16(mf_q_fblk16_q4_1, mf_q_ftab16(0.0f))
#elif defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q4_1, QK4_1)
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q4_1_f32(w, x, nb * QK4_1);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        int8_t q[32];
        float s[8], sx[8];
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(w[ib].qs[j] & 0x0F);
            q[j + 16] = (int8_t)(w[ib].qs[j] >> 4);
        }
        mf_q_lanes_qx32(q, x + ib * QK4_1, s);
        mf_q_lanes_x32(x + ib * QK4_1, sx);
        const float d = mf_q_fp16(w[ib].d), m = mf_q_fp16(w[ib].m);
        for (int k = 0; k < 8; k++)
            acc[k] += d * s[k] + m * sx[k];
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q5_0_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q5_0 *w = (const block_q5_0 *)vw;   /* [n / 32] */
    const ptrdiff_t nb = n / QK5_0;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16(mf_q_fblk16_q5_0, mf_q_ftab16(16.0f))
#elif defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q5_0, QK5_0)
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q5_0_f32(w, x, nb * QK5_0);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        int8_t q[32];
        float s[8];
        const uint32_t qh = mf_le32(w[ib].qh);
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(((w[ib].qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4)) - 16);
            q[j + 16] = (int8_t)(((w[ib].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4)) - 16);
        }
        mf_q_lanes_qx32(q, x + ib * QK5_0, s);
        const float d = mf_q_fp16(w[ib].d);
        for (int k = 0; k < 8; k++)
            acc[k] += d * s[k];
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q5_1_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q5_1 *w = (const block_q5_1 *)vw;   /* [n / 32] */
    const ptrdiff_t nb = n / QK5_1;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16(mf_q_fblk16_q5_1, mf_q_ftab16(0.0f))
#elif defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q5_1, QK5_1)
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q5_1_f32(w, x, nb * QK5_1);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        int8_t q[32];
        float s[8], sx[8];
        const uint32_t qh = mf_le32(w[ib].qh);
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((w[ib].qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4));
            q[j + 16] = (int8_t)((w[ib].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4));
        }
        mf_q_lanes_qx32(q, x + ib * QK5_1, s);
        mf_q_lanes_x32(x + ib * QK5_1, sx);
        const float d = mf_q_fp16(w[ib].d), m = mf_q_fp16(w[ib].m);
        for (int k = 0; k < 8; k++)
            acc[k] += d * s[k] + m * sx[k];
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q8_0_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q8_0 *w = (const block_q8_0 *)vw;   /* [n / 32] */
    const ptrdiff_t nb = n / QK8_0;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16(mf_q_fblk16_q8_0, mf_q_ftab16(0.0f))
#elif defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q8_0, QK8_0)
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q8_0_f32(w, x, nb * QK8_0);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        float s[8];
        mf_q_lanes_qx32(w[ib].qs, x + ib * QK8_0, s);
        const float d = mf_q_fp16(w[ib].d);
        for (int k = 0; k < 8; k++)
            acc[k] += d * s[k];
    }
    return mf_sum8(acc);
#endif
}

#if defined(MF_Q_AVX2)
/* Super-block b of a Q4_K row against xb[0..255] (sx: mf_q_sums8 of xb): acc[0] (even
 * sub-blocks), acc[1] (odd) += the sub-blocks' d * sc * (q . x) - dmin * m * sum x.  The one-row
 * and the 4-row dots share it. */
static inline void mf_q_fsb_q4_K(const block_q4_K *b, const float *xb, const __m256 sx[8],
                                 __m256 acc[2])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    MF_ALIGNED(32) float dsc[8], dm[8];
    mf_kquant_scales8(b->scales, b->d, b->dmin, dsc, dm);
    for (int c = 0; c < 4; c++) {
        const __m256i v0 = mf_q_bcast16(b->qs + 32 * c), v1 = mf_q_bcast16(b->qs + 32 * c + 16);
        const float *x1 = xb + 64 * c, *x2 = x1 + 32;
        __m256 s1 = mf_q_u8x32_dot0(_mm256_and_si256(v0, m4), _mm256_and_si256(v1, m4), x1);
        __m256 s2 = mf_q_u8x32_dot0(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), x2);
        __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c]), s1, acc[0]);
        acc[0] = _mm256_fnmadd_ps(_mm256_set1_ps(dm[2 * c]), sx[2 * c], a);
        __m256 t = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c + 1]), s2, acc[1]);
        acc[1] = _mm256_fnmadd_ps(_mm256_set1_ps(dm[2 * c + 1]), sx[2 * c + 1], t);
    }
}

/* The same for Q5_K. */
static inline void mf_q_fsb_q5_K(const block_q5_K *b, const float *xb, const __m256 sx[8],
                                 __m256 acc[2])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), x10 = _mm256_set1_epi8(0x10);
    MF_ALIGNED(32) float dsc[8], dm[8];
    mf_kquant_scales8(b->scales, b->d, b->dmin, dsc, dm);
    const __m256i h0 = mf_q_bcast16(b->qh), h1 = mf_q_bcast16(b->qh + 16);
    for (int c = 0; c < 4; c++) {
        const __m256i b1 = _mm256_set1_epi8((char)(1 << (2 * c)));
        const __m256i b2 = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
        const __m256i v0 = mf_q_bcast16(b->qs + 32 * c), v1 = mf_q_bcast16(b->qs + 32 * c + 16);
        __m256i lo1 = _mm256_or_si256(_mm256_and_si256(v0, m4), _mm256_and_si256(
            _mm256_cmpeq_epi8(_mm256_and_si256(h0, b1), b1), x10));
        __m256i hi1 = _mm256_or_si256(_mm256_and_si256(v1, m4), _mm256_and_si256(
            _mm256_cmpeq_epi8(_mm256_and_si256(h1, b1), b1), x10));
        __m256i lo2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), _mm256_and_si256(
            _mm256_cmpeq_epi8(_mm256_and_si256(h0, b2), b2), x10));
        __m256i hi2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), _mm256_and_si256(
            _mm256_cmpeq_epi8(_mm256_and_si256(h1, b2), b2), x10));
        const float *x1 = xb + 64 * c, *x2 = x1 + 32;
        __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c]), mf_q_u8x32_dot0(lo1, hi1, x1), acc[0]);
        acc[0] = _mm256_fnmadd_ps(_mm256_set1_ps(dm[2 * c]), sx[2 * c], a);
        __m256 t = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c + 1]), mf_q_u8x32_dot0(lo2, hi2, x2), acc[1]);
        acc[1] = _mm256_fnmadd_ps(_mm256_set1_ps(dm[2 * c + 1]), sx[2 * c + 1], t);
    }
}

/* The same for Q6_K: acc[0] / acc[1] take the even / odd sub-blocks of 16. */
static inline void mf_q_fsb_q6_K(const block_q6_K *b, const float *xb, __m256 acc[2])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const __m256 off = _mm256_set1_ps(32.0f);
    const __m256 d = _mm256_set1_ps(mf_q_fp16_table[b->d]);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)b->scales);
    MF_ALIGNED(32) float ds[16];      /* d * sc[j]: exact (|sc| <= 128, d an fp16) */
    _mm256_storeu_ps(ds, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8))));
    _mm256_storeu_ps(ds + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_unpackhi_epi64(sc8, sc8)))));
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qhp = b->qh + 32 * h;
        /* codes of weights l and l + 16 (l < 16) of each quarter k, in the broadcast layout */
        const __m256i a0 = mf_q_bcast16(ql), a1 = mf_q_bcast16(ql + 16);
        const __m256i b0 = mf_q_bcast16(ql + 32), b1 = mf_q_bcast16(ql + 48);
        const __m256i h0 = mf_q_bcast16(qhp), h1 = mf_q_bcast16(qhp + 16);
        __m256i lo[4], hi[4];
        lo[0] = _mm256_or_si256(_mm256_and_si256(a0, m4), _mm256_slli_epi16(_mm256_and_si256(h0, m2), 4));
        hi[0] = _mm256_or_si256(_mm256_and_si256(a1, m4), _mm256_slli_epi16(_mm256_and_si256(h1, m2), 4));
        lo[1] = _mm256_or_si256(_mm256_and_si256(b0, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h0, 2), m2), 4));
        hi[1] = _mm256_or_si256(_mm256_and_si256(b1, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h1, 2), m2), 4));
        lo[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h0, 4), m2), 4));
        hi[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h1, 4), m2), 4));
        lo[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h0, 6), m2), 4));
        hi[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h1, 6), m2), 4));
        for (int k = 0; k < 4; k++) {
            const int j = 8 * h + 2 * k;         /* sub-blocks j (codes 0..15), j+1 (16..31) */
            __m256 sa, sb;
            mf_q_u8x32_dot2(lo[k], hi[k], off, xb + 128 * h + 32 * k, &sa, &sb);
            acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(ds[j]), sa, acc[0]);
            acc[1] = _mm256_fmadd_ps(_mm256_set1_ps(ds[j + 1]), sb, acc[1]);
        }
    }
}

#endif /* MF_Q_AVX2 */

#if !defined(MF_Q_AVX2)
/* The generic Q4_K / Q5_K float dot's part of one super-block, added to acc's 8 lanes.  qh:
 * Q5_K's 5th bits, or NULL for Q4_K (a literal at every call site). */
MF_ALWAYS_INLINE void mf_q_fsb_k45_generic(const uint8_t *scales, mf_fp16_t d, mf_fp16_t dmin,
                                           const uint8_t *qs, const uint8_t *qh,
                                           const float *xb, float acc[8])
{
    float dsc[8], dm[8];
    mf_kquant_scales(scales, d, dmin, dsc, dm);
    for (int j = 0; j < 8; j++) {
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        const float *xj = xb + 32 * j;
        int8_t c[32];
        float s[8], sx[8];
        for (int l = 0; l < 32; l++)
            c[l] = (int8_t)(((q[l] >> shift) & 0x0F) | (qh ? ((qh[l] >> j) & 1) << 4 : 0));
        mf_q_lanes_qx32(c, xj, s);
        mf_q_lanes_x32(xj, sx);
        for (int k = 0; k < 8; k++)
            acc[k] += dsc[j] * s[k] - dm[j] * sx[k];
    }
}
#endif

static inline float mf_dot_q4_K_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q4_K *w = (const block_q4_K *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16_K(mf_q_fsb16_q4_K)
#elif defined(MF_Q_AVX2)
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        __m256 sx[8];
        mf_q_sums8(x + ib * QK_K, sx);
        mf_q_fsb_q4_K(&w[ib], x + ib * QK_K, sx, acc);
    }
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q4_K_f32(w, x, nb * QK_K);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++)
        mf_q_fsb_k45_generic(w[ib].scales, w[ib].d, w[ib].dmin, w[ib].qs, NULL, x + ib * QK_K,
                             acc);
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q5_K_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q5_K *w = (const block_q5_K *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16_K(mf_q_fsb16_q5_K)
#elif defined(MF_Q_AVX2)
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        __m256 sx[8];
        mf_q_sums8(x + ib * QK_K, sx);
        mf_q_fsb_q5_K(&w[ib], x + ib * QK_K, sx, acc);
    }
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q5_K_f32(w, x, nb * QK_K);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++)
        mf_q_fsb_k45_generic(w[ib].scales, w[ib].d, w[ib].dmin, w[ib].qs, w[ib].qh,
                             x + ib * QK_K, acc);
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q6_K_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q6_K *w = (const block_q6_K *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16_K(mf_q_fsb16_q6_K)
#elif defined(MF_Q_AVX2)
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++)
        mf_q_fsb_q6_K(&w[ib], x + ib * QK_K, acc);
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q6_K_f32(w, x, nb * QK_K);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_q_fp16(w[ib].d);
        uint8_t codes[256];
        mf_q6k_codes_all(&w[ib], codes);
        for (int j = 0; j < 16; j++) {               /* sub-blocks of 16 */
            const float *xj = x + ib * QK_K + 16 * j;
            const float ds = d * (float)w[ib].scales[j];
            float s[8];
            for (int k = 0; k < 8; k++)
                s[k] = (float)(codes[16 * j + k] - 32) * xj[k] +
                       (float)(codes[16 * j + 8 + k] - 32) * xj[8 + k];
            for (int k = 0; k < 8; k++)
                acc[k] += ds * s[k];
        }
    }
    return mf_sum8(acc);
#endif
}

/* ============================================================================================ */
/* Q2_K, Q3_K, IQ4_NL, IQ4_XS with float32 activations.  Per (sub-)block: s = sum code_j x_j (and */
/* for Q2_K the sub-block's sum x), then acc += dl * s (- ml * sum x); IQ4_NL as the 32-weight   */
/* formats above (a block a step into alternate accumulators).  avx512: the weights themselves   */
/* from 16-entry vpermps tables (dl * value, or Q2_K's dl * c - ml: GGML's dequantized weights), */
/* one FMA a 16 weights.                                                                         */
/* ============================================================================================ */

#if defined(MF_Q_AVX2)
/* kvalues_iq4nl + 128 as unsigned bytes in both 128-bit lanes: vpshufb of 4-bit indices gives
 * value + 128, which mf_q_u8x32_dot with off 128 turns into the exact value. */
static inline __m256i mf_q_kvalues_u8(void)
{
    return _mm256_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153,
                            (char)166, (char)181, (char)197, (char)217, (char)241,
                            1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153,
                            (char)166, (char)181, (char)197, (char)217, (char)241);
}

/* sum_j v_j x[j] over the 32 weights of 16 index bytes at qs (weight j: the low nibble of byte j
 * for j < 16, the high nibble of byte j - 16) as 8 lanes; kv = mf_q_kvalues_u8(). */
static inline __m256 mf_q_iq4_dot32(const uint8_t *qs, __m256i kv, const float *x)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), v = mf_q_bcast16(qs);
    const __m256i lo = _mm256_shuffle_epi8(kv, _mm256_and_si256(v, m4));
    const __m256i hi = _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    return mf_q_u8x32_dot(lo, hi, _mm256_set1_ps(128.0f), x);
}

static inline __m256 mf_q_fblk_iq4_nl(const block_iq4_nl *b, const float *x, __m256 acc)
{
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16_table[b->d]),
                           mf_q_iq4_dot32(b->qs, mf_q_kvalues_u8(), x), acc);
}

/* The 16 sub-block sums of a super-block's x for Q2_K's mins: sx[j] = x[16j..16j+7] +
 * x[16j+8..16j+15] (8 lanes).  The 4-row dot forms them once for the four rows. */
static inline void mf_q_sums16(const float *xb /* [256] */, __m256 sx[16])
{
    for (int j = 0; j < 16; j++)
        sx[j] = _mm256_add_ps(_mm256_loadu_ps(xb + 16 * j), _mm256_loadu_ps(xb + 16 * j + 8));
}

/* Super-block b of a Q2_K row against xb[0..255] (sx: mf_q_sums16 of xb): acc[0] (even
 * sub-blocks), acc[1] (odd) += dl * (c . x) - ml * sum x of each sub-block of 16. */
static inline void mf_q_fsb_q2_K(const block_q2_K *b, const float *xb, const __m256 sx[16],
                                 __m256 acc[2])
{
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)b->scales);
    const __m256 d = _mm256_set1_ps(mf_q_fp16_table[b->d]);
    const __m256 dmin = _mm256_set1_ps(mf_q_fp16_table[b->dmin]);
    const __m128i s_lo = _mm_and_si128(sc8, _mm_set1_epi8(0x0F));
    const __m128i s_hi = _mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F));
    MF_ALIGNED(32) float dl[16], ml[16];           /* d * sc, dmin * m: exact */
    _mm256_store_ps(dl, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s_lo))));
    _mm256_store_ps(dl + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_srli_si128(s_lo, 8)))));
    _mm256_store_ps(ml, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s_hi))));
    _mm256_store_ps(ml + 8, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_srli_si128(s_hi, 8)))));
    for (int h = 0; h < 2; h++) {
        const __m256i v0 = mf_q_bcast16(b->qs + 32 * h), v1 = mf_q_bcast16(b->qs + 32 * h + 16);
        for (int k = 0; k < 4; k++) {              /* sub-blocks j (bytes 0..15), j + 1 */
            const int j = 8 * h + 2 * k;
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v0, 2 * k), m3);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v1, 2 * k), m3);
            __m256 sa, sb;
            mf_q_u8x32_dot2_0(lo, hi, xb + 128 * h + 32 * k, &sa, &sb);
            acc[0] = _mm256_fnmadd_ps(_mm256_set1_ps(ml[j]), sx[j],
                                      _mm256_fmadd_ps(_mm256_set1_ps(dl[j]), sa, acc[0]));
            acc[1] = _mm256_fnmadd_ps(_mm256_set1_ps(ml[j + 1]), sx[j + 1],
                                      _mm256_fmadd_ps(_mm256_set1_ps(dl[j + 1]), sb, acc[1]));
        }
    }
}

/* The same for Q3_K: acc[0] / acc[1] += dl * ((code - 4) . x) of the even / odd sub-blocks. */
static inline void mf_q_fsb_q3_K(const block_q3_K *b, const float *xb, __m256 acc[2])
{
    const __m256i m3 = _mm256_set1_epi8(3), x4 = _mm256_set1_epi8(4);
    const __m256 off = _mm256_set1_ps(4.0f);
    MF_ALIGNED(32) float dl[16];                   /* d * (sc - 32): exact */
    const __m256 d = _mm256_set1_ps(mf_q_fp16_table[b->d]);
    const __m128i s8 = _mm_sub_epi8(mf_q_q3k_scales16(b->scales), _mm_set1_epi8(32));
    _mm256_store_ps(dl, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8))));
    _mm256_store_ps(dl + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8)))));
    const __m256i h0 = mf_q_bcast16(b->hmask), h1 = mf_q_bcast16(b->hmask + 16);
    for (int h = 0; h < 2; h++) {
        const __m256i v0 = mf_q_bcast16(b->qs + 32 * h), v1 = mf_q_bcast16(b->qs + 32 * h + 16);
        for (int k = 0; k < 4; k++) {
            const int j = 8 * h + 2 * k;
            const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + k)));
            __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v0, 2 * k), m3);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v1, 2 * k), m3);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h0, bit), bit), x4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h1, bit), bit), x4));
            __m256 sa, sb;
            mf_q_u8x32_dot2(lo, hi, off, xb + 128 * h + 32 * k, &sa, &sb);
            acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(dl[j]), sa, acc[0]);
            acc[1] = _mm256_fmadd_ps(_mm256_set1_ps(dl[j + 1]), sb, acc[1]);
        }
    }
}

/* The same for IQ4_XS: acc[0] / acc[1] += dl * (value . x) of the even / odd sub-blocks of 32. */
static inline void mf_q_fsb_iq4_xs(const block_iq4_xs *b, const float *xb, __m256 acc[2])
{
    const __m256i kv = mf_q_kvalues_u8();
    MF_ALIGNED(32) float dl[8];                    /* d * (ls - 32): exact */
    _mm256_store_ps(dl, _mm256_mul_ps(_mm256_set1_ps(mf_q_fp16_table[b->d]),
                                      _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(mf_q_iq4xs_scales16(b)))));
    for (int j = 0; j < 8; j++)
        acc[j & 1] = _mm256_fmadd_ps(_mm256_set1_ps(dl[j]), mf_q_iq4_dot32(b->qs + 16 * j, kv,
                                                                           xb + 32 * j), acc[j & 1]);
}
#endif /* MF_Q_AVX2 */

#if defined(MF_SIMD_AVX512)
/* The float values of kvalues_iq4nl: IQ4_NL's table (its blocks then run as Q4_0's). */
MF_ALWAYS_INLINE __m512 mf_q_ftab16_iq4(void)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128((const __m128i *)(const void *)mf_kvalues_iq4nl)));
}

MF_ALWAYS_INLINE void mf_q_fblk16_iq4_nl(const block_iq4_nl *b, const mf_q_fx16 *X, __m512 T,
                                         __m512 acc[2])
{
    const __m512i v = mf_q_qs16_epi32(b->qs);
    acc[0] = mf_q_fblk16_acc(_mm512_permutexvar_ps(v, T),
                             _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), T), X, b->d, acc[0]);
}

/* IQ4_XS: each sub-block's table holds its weights dl * value (exact: GGML's dequantized values),
 * a permute gives 16 weights and one FMA takes them; acc[0] the first 16 of each sub-block,
 * acc[1] the last 16. */
MF_ALWAYS_INLINE void mf_q_fsb16_iq4_xs(const block_iq4_xs *b, const float *xb, __m512 T0,
                                        __m512 acc[2])
{
    (void)T0;
    const __m512 T = mf_q_ftab16_iq4();
    MF_ALIGNED(32) float dl[8];                    /* d * (ls - 32): exact */
    _mm256_store_ps(dl, _mm256_mul_ps(_mm256_set1_ps(mf_q_fp16_table[b->d]),
                                      _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(mf_q_iq4xs_scales16(b)))));
    for (int j = 0; j < 8; j++) {
        const __m512 tw = _mm512_mul_ps(T, _mm512_set1_ps(dl[j]));
        const __m512i v = mf_q_qs16_epi32(b->qs + 16 * j);
        acc[0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, tw), _mm512_loadu_ps(xb + 32 * j), acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tw),
                                 _mm512_loadu_ps(xb + 32 * j + 16), acc[1]);
    }
}

/* Q2_K: a 16-entry table holds the 4 weights dl * c - dmin * m (c = 0..3: GGML's dequantized
 * values, one rounding) of 4 sub-blocks; a 16-weight sub-block's codes (bits 2k of its bytes,
 * as dwords) ORed with 4 * (its place among the four) index it: one vpternlogd, one permute,
 * one FMA a 16 weights.  acc[0] takes the first sub-block of each pair, acc[1] the second. */
MF_ALWAYS_INLINE void mf_q_fsb16_q2_K(const block_q2_K *b, const float *xb, __m512 T,
                                      __m512 acc[2])
{
    (void)T;
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)b->scales));
    const __m512 dl = _mm512_mul_ps(_mm512_set1_ps(mf_q_fp16_table[b->d]),
                                    _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15))));
    const __m512 ml = _mm512_mul_ps(_mm512_set1_ps(mf_q_fp16_table[b->dmin]),
                                    _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4)));
    const __m512 c4 = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i three = _mm512_set1_epi32(3);
    for (int h = 0; h < 2; h++) {
        const __m512i v0 = mf_q_qs16_epi32(b->qs + 32 * h), v1 = mf_q_qs16_epi32(b->qs + 32 * h + 16);
        for (int k = 0; k < 4; k += 2) {           /* sub-blocks j .. j + 3 */
            const int j = 8 * h + 2 * k;
            const __m512i idx = _mm512_add_epi32(quad, _mm512_set1_epi32(j));
            const __m512 tw = _mm512_fmsub_ps(c4, _mm512_permutexvar_ps(idx, dl),
                                              _mm512_permutexvar_ps(idx, ml));
            for (int kk = 0; kk < 2; kk++) {
                const int s = 2 * (k + kk);
                /* (v >> s) & 3 | 4 * place: vpternlogd 0xEA = (a & b) | c */
                const __m512i i0 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v0, s), three,
                                                             _mm512_set1_epi32(8 * kk), 0xEA);
                const __m512i i1 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v1, s), three,
                                                             _mm512_set1_epi32(8 * kk + 4), 0xEA);
                const float *xs = xb + 128 * h + 32 * (k + kk);
                acc[0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(i0, tw), _mm512_loadu_ps(xs), acc[0]);
                acc[1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(i1, tw), _mm512_loadu_ps(xs + 16),
                                         acc[1]);
            }
        }
    }
}

/* Q3_K: a 16-entry table holds the 8 weights dl * (u - 4) (u = 0..7) of 2 sub-blocks; a
 * sub-block's index is its 2 low bits, bit 2 from hmask (a mask test and a masked OR), bit 3 its
 * place among the two. */
MF_ALWAYS_INLINE void mf_q_fsb16_q3_K(const block_q3_K *b, const float *xb, __m512 T,
                                      __m512 acc[2])
{
    (void)T;
    const __m512i s32 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(mf_q_q3k_scales16(b->scales)),
                                         _mm512_set1_epi32(32));
    const __m512 dl = _mm512_mul_ps(_mm512_set1_ps(mf_q_fp16_table[b->d]), _mm512_cvtepi32_ps(s32));
    const __m512 c8 = _mm512_setr_ps(-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3);
    const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i three = _mm512_set1_epi32(3), four = _mm512_set1_epi32(4);
    const __m256i hm = mf_q_loadu256(b->hmask);
    for (int h = 0; h < 2; h++) {
        const __m512i v0 = mf_q_qs16_epi32(b->qs + 32 * h), v1 = mf_q_qs16_epi32(b->qs + 32 * h + 16);
        for (int k = 0; k < 4; k++) {              /* sub-blocks j, j + 1 */
            const int j = 8 * h + 2 * k;
            const __m512 tw = _mm512_mul_ps(c8, _mm512_permutexvar_ps(
                _mm512_add_epi32(pair, _mm512_set1_epi32(j)), dl));
            const __mmask32 hb = _mm256_test_epi8_mask(hm, _mm256_set1_epi8((char)(1 << (4 * h + k))));
            __m512i i0 = _mm512_and_si512(_mm512_srli_epi32(v0, 2 * k), three);
            __m512i i1 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v1, 2 * k), three,
                                                   _mm512_set1_epi32(8), 0xEA);
            i0 = _mm512_mask_or_epi32(i0, (__mmask16)(hb & 0xFFFFu), i0, four);
            i1 = _mm512_mask_or_epi32(i1, (__mmask16)(hb >> 16), i1, four);
            const float *xs = xb + 128 * h + 32 * k;
            acc[0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(i0, tw), _mm512_loadu_ps(xs), acc[0]);
            acc[1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(i1, tw), _mm512_loadu_ps(xs + 16), acc[1]);
        }
    }
}
#endif /* MF_SIMD_AVX512 */

#if !defined(MF_Q_AVX2)
/* Generic: acc[k] += dl * (sum over 16 weights of c x, lane k takes weights k and 8 + k)
 * (- ml * the same sum of x). */
static inline void mf_q_facc16(const int8_t c[16], const float *x, float dl, float ml,
                               float acc[8])
{
    for (int k = 0; k < 8; k++) {
        const float s = (float)c[k] * x[k] + (float)c[8 + k] * x[8 + k];
        const float sx = x[k] + x[8 + k];
        acc[k] += dl * s - ml * sx;
    }
}
#endif

static inline float mf_dot_q2_K_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q2_K *w = (const block_q2_K *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16_K(mf_q_fsb16_q2_K)
#elif defined(MF_Q_AVX2)
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        __m256 sx[16];
        mf_q_sums16(x + ib * QK_K, sx);
        mf_q_fsb_q2_K(&w[ib], x + ib * QK_K, sx, acc);
    }
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q2_K_f32(w, x, nb * QK_K);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_q_fp16(w[ib].d), dmin = mf_q_fp16(w[ib].dmin);
        for (int j = 0; j < 16; j++) {              /* sub-block j: half j / 8, k = (j % 8) / 2 */
            const uint8_t *q = w[ib].qs + 32 * (j / 8) + 16 * (j % 2);
            const int shift = 2 * ((j % 8) / 2);
            int8_t c[16];
            for (int l = 0; l < 16; l++)
                c[l] = (int8_t)((q[l] >> shift) & 3);
            const float dl = d * (float)(w[ib].scales[j] & 0x0F);
            const float ml = dmin * (float)(w[ib].scales[j] >> 4);
            mf_q_facc16(c, x + ib * QK_K + 16 * j, dl, ml, acc);
        }
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q3_K_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q3_K *w = (const block_q3_K *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16_K(mf_q_fsb16_q3_K)
#elif defined(MF_Q_AVX2)
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++)
        mf_q_fsb_q3_K(&w[ib], x + ib * QK_K, acc);
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
#elif defined(MF_Q_NEON)
    return mf_neon_dot_q3_K_f32(w, x, nb * QK_K);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_q_fp16(w[ib].d);
        uint8_t sc[16];
        mf_q3k_scales(w[ib].scales, sc);
        for (int j = 0; j < 16; j++) {
            const int h = j / 8, k = (j % 8) / 2, bit = 4 * h + k;
            const uint8_t *q = w[ib].qs + 32 * h + 16 * (j % 2);
            const uint8_t *hm = w[ib].hmask + 16 * (j % 2);
            int8_t c[16];
            for (int l = 0; l < 16; l++)
                c[l] = (int8_t)(((q[l] >> (2 * k)) & 3) - ((hm[l] >> bit) & 1 ? 0 : 4));
            mf_q_facc16(c, x + ib * QK_K + 16 * j, d * (float)((int)sc[j] - 32), 0.0f, acc);
        }
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_iq4_nl_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                      ptrdiff_t n)
{
    const block_iq4_nl *w = (const block_iq4_nl *)vw;   /* [n / 32] */
    const ptrdiff_t nb = n / QK4_NL;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16(mf_q_fblk16_iq4_nl, mf_q_ftab16_iq4())
#elif defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_iq4_nl, QK4_NL)
#elif defined(MF_Q_NEON)
    return mf_neon_dot_iq4_nl_f32(w, x, nb * QK4_NL);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        int8_t q[32];
        float s[8];
        for (int j = 0; j < 16; j++) {
            q[j] = mf_kvalues_iq4nl[w[ib].qs[j] & 0x0F];
            q[j + 16] = mf_kvalues_iq4nl[w[ib].qs[j] >> 4];
        }
        mf_q_lanes_qx32(q, x + ib * QK4_NL, s);
        const float d = mf_q_fp16(w[ib].d);
        for (int k = 0; k < 8; k++)
            acc[k] += d * s[k];
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_iq4_xs_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                      ptrdiff_t n)
{
    const block_iq4_xs *w = (const block_iq4_xs *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_SIMD_AVX512)
    MF_Q_FDOT16_K(mf_q_fsb16_iq4_xs)
#elif defined(MF_Q_AVX2)
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++)
        mf_q_fsb_iq4_xs(&w[ib], x + ib * QK_K, acc);
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
#elif defined(MF_Q_NEON)
    return mf_neon_dot_iq4_xs_f32(w, x, nb * QK_K);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_q_fp16(w[ib].d);
        for (int j = 0; j < 8; j++) {
            int8_t q[32];
            float s[8];
            for (int l = 0; l < 16; l++) {
                q[l] = mf_kvalues_iq4nl[w[ib].qs[16 * j + l] & 0x0F];
                q[l + 16] = mf_kvalues_iq4nl[w[ib].qs[16 * j + l] >> 4];
            }
            mf_q_lanes_qx32(q, x + ib * QK_K + 32 * j, s);
            const float dl = d * (float)(mf_iq4xs_scale(w[ib].scales_l, w[ib].scales_h, j) - 32);
            for (int k = 0; k < 8; k++)
                acc[k] += dl * s[k];
        }
    }
    return mf_sum8(acc);
#endif
}

/* ============================================================================================ */
/* Four weight rows against one float32 activation row (decode's float path): each row's result */
/* is exactly its one-row dot above -- the same blocks into the same accumulators in the same    */
/* order -- while x is loaded once for the four rows and the rows ahead are prefetched.          */
/* ============================================================================================ */

typedef void (*mf_dot4_f32_fn)(const void *const *w, const float *x, ptrdiff_t n, float *out);

/* Four one-row dots: the generic level's 4-row dots. */
#define MF_DOT4_F32_ROWS(NAME, ONE)                                                            \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,       \
                        float *out)                                                            \
{                                                                                              \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = ONE(vw[r], x, n);                                                             \
}

#if defined(MF_Q_AVX2) && defined(MF_SIMD_AVX512)
/* 32-weight formats at avx512: each row's blocks as in its one-row dot (MF_Q_FDOT16: BLOCK_FN16,
 * its code table TAB), x's block loaded once for the four rows. */
#define MF_DOT4_F32_32(NAME, BLOCK, BLOCK_FN, BLOCK_FN16, TAB)                                 \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,       \
                        float *out)                                                            \
{                                                                                              \
    const BLOCK *w[4] = {(const BLOCK *)vw[0], (const BLOCK *)vw[1], (const BLOCK *)vw[2],     \
                         (const BLOCK *)vw[3]};                          /* [n / 32] each */   \
    const ptrdiff_t nb = n / 32, bsz = (ptrdiff_t)sizeof(BLOCK);                               \
    const ptrdiff_t pf = mf_q_pf_dist(nb * bsz);                                               \
    const __m512 T = (TAB);                                                                    \
    __m512 acc[4][2];                                                                          \
    for (int r = 0; r < 4; r++)                                                                \
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();                                           \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        if ((ib & 1) == 0)                                                                     \
            mf_q_prefetch4(w[0], nb * bsz, ib * bsz, 2 * bsz, pf);                             \
        const mf_q_fx16 X = mf_q_fx16_load(x + 32 * ib);                                       \
        for (int r = 0; r < 4; r++)                                                            \
            BLOCK_FN16(&w[r][ib], &X, T, acc[r]);                                              \
    }                                                                                          \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = mf_q_hsum16(acc[r]);                                                          \
}
#elif defined(MF_Q_AVX2)
/* 32-weight formats: block ib of each row into accumulator (ib % 2) of that row, as
 * MF_Q_FDOT_LOOP (BLOCK_FN16, TAB: the avx512 level's). */
#define MF_DOT4_F32_32(NAME, BLOCK, BLOCK_FN, BLOCK_FN16, TAB)                                 \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,       \
                        float *out)                                                            \
{                                                                                              \
    const BLOCK *w0 = (const BLOCK *)vw[0], *w1 = (const BLOCK *)vw[1];   /* [n / 32] each */  \
    const BLOCK *w2 = (const BLOCK *)vw[2], *w3 = (const BLOCK *)vw[3];                        \
    const ptrdiff_t nb = n / 32;                                                               \
    const ptrdiff_t pf = mf_q_pf_dist(nb * (ptrdiff_t)sizeof(BLOCK));                          \
    const ptrdiff_t pb = 2 * (ptrdiff_t)sizeof(BLOCK);                                         \
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;                         \
    __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;                                         \
    ptrdiff_t ib = 0;                                                                          \
    for (; ib + 2 <= nb; ib += 2) {                                                            \
        const float *xb = x + ib * 32;                                                         \
        mf_q_prefetch4(w0, nb * (ptrdiff_t)sizeof(BLOCK), ib * (ptrdiff_t)sizeof(BLOCK), pb, pf); \
        a00 = BLOCK_FN(&w0[ib], xb, a00);                                                      \
        a10 = BLOCK_FN(&w1[ib], xb, a10);                                                      \
        a20 = BLOCK_FN(&w2[ib], xb, a20);                                                      \
        a30 = BLOCK_FN(&w3[ib], xb, a30);                                                      \
        a01 = BLOCK_FN(&w0[ib + 1], xb + 32, a01);                                             \
        a11 = BLOCK_FN(&w1[ib + 1], xb + 32, a11);                                             \
        a21 = BLOCK_FN(&w2[ib + 1], xb + 32, a21);                                             \
        a31 = BLOCK_FN(&w3[ib + 1], xb + 32, a31);                                             \
    }                                                                                          \
    if (ib < nb) {                                                                             \
        a00 = BLOCK_FN(&w0[ib], x + ib * 32, a00);                                             \
        a10 = BLOCK_FN(&w1[ib], x + ib * 32, a10);                                             \
        a20 = BLOCK_FN(&w2[ib], x + ib * 32, a20);                                             \
        a30 = BLOCK_FN(&w3[ib], x + ib * 32, a30);                                             \
    }                                                                                          \
    out[0] = mf_q_hsum_ps(_mm256_add_ps(a00, a01));                                            \
    out[1] = mf_q_hsum_ps(_mm256_add_ps(a10, a11));                                            \
    out[2] = mf_q_hsum_ps(_mm256_add_ps(a20, a21));                                            \
    out[3] = mf_q_hsum_ps(_mm256_add_ps(a30, a31));                                            \
}
#endif

#if defined(MF_Q_AVX2)
MF_DOT4_F32_32(mf_dot4_q4_0_f32, block_q4_0, mf_q_fblk_q4_0, mf_q_fblk16_q4_0,
               mf_q_ftab16(8.0f))
MF_DOT4_F32_32(mf_dot4_q4_1_f32, block_q4_1, mf_q_fblk_q4_1, mf_q_fblk16_q4_1,
               mf_q_ftab16(0.0f))
MF_DOT4_F32_32(mf_dot4_q5_0_f32, block_q5_0, mf_q_fblk_q5_0, mf_q_fblk16_q5_0,
               mf_q_ftab16(16.0f))
MF_DOT4_F32_32(mf_dot4_q5_1_f32, block_q5_1, mf_q_fblk_q5_1, mf_q_fblk16_q5_1,
               mf_q_ftab16(0.0f))
MF_DOT4_F32_32(mf_dot4_q8_0_f32, block_q8_0, mf_q_fblk_q8_0, mf_q_fblk16_q8_0,
               mf_q_ftab16(0.0f))
MF_DOT4_F32_32(mf_dot4_iq4_nl_f32, block_iq4_nl, mf_q_fblk_iq4_nl, mf_q_fblk16_iq4_nl,
               mf_q_ftab16_iq4())

/* K-quants: super-block by super-block, each row's two accumulators as in its one-row dot
 * (avx512: rows 0 | 1 and 2 | 3 in the halves of 512-bit registers, SB_FN##_rows2). */
#if defined(MF_SIMD_AVX512)
/* K-quants at avx512: each row's super-blocks as in its one-row dot (MF_Q_FDOT16_K; SB_FN16
 * the format's mf_q_fsb16_*), x's loads shared by the four rows. */
#define MF_DOT4_F32_K(NAME, BLOCK, SB_FN, SB_FN16)                                             \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,       \
                        float *out)                                                            \
{                                                                                              \
    const BLOCK *w[4] = {(const BLOCK *)vw[0], (const BLOCK *)vw[1], (const BLOCK *)vw[2],     \
                         (const BLOCK *)vw[3]};                         /* [n / 256] each */   \
    const ptrdiff_t nb = n / QK_K;                                                             \
    const ptrdiff_t pf = mf_q_pf_dist(nb * (ptrdiff_t)sizeof(BLOCK));                          \
    const __m512 T = mf_q_ftab16(0.0f);                                                        \
    __m512 acc[4][2];                                                                          \
    for (int r = 0; r < 4; r++)                                                                \
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();                                           \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        mf_q_prefetch4(w[0], nb * (ptrdiff_t)sizeof(BLOCK), ib * (ptrdiff_t)sizeof(BLOCK),        \
                       (ptrdiff_t)sizeof(BLOCK), pf);                                          \
        for (int r = 0; r < 4; r++)                                                            \
            SB_FN16(&w[r][ib], x + ib * QK_K, T, acc[r]);                                      \
    }                                                                                          \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = mf_q_hsum16(acc[r]);                                                          \
}
#else
/* The four rows' super-blocks ib (SB_FN##_rows4 of MF_DOT4_F32_K): each row's SB_FN, the Q4_K /
 * Q5_K sums of x formed once for the four. */
#define MF_Q_FSB_K45_ROWS4(NAME, BLOCK, SB_FN)                                                 \
static inline void NAME(const BLOCK *const w[4], ptrdiff_t ib, const float *xb,                \
                        __m256 acc[4][2])                                                      \
{                                                                                              \
    __m256 sx[8];                                                                              \
    mf_q_sums8(xb, sx);                                                                        \
    for (int r = 0; r < 4; r++)                                                                \
        SB_FN(&w[r][ib], xb, sx, acc[r]);                                                      \
}
MF_Q_FSB_K45_ROWS4(mf_q_fsb_q4_K_rows4, block_q4_K, mf_q_fsb_q4_K)
MF_Q_FSB_K45_ROWS4(mf_q_fsb_q5_K_rows4, block_q5_K, mf_q_fsb_q5_K)
#undef MF_Q_FSB_K45_ROWS4

static inline void mf_q_fsb_q6_K_rows4(const block_q6_K *const w[4], ptrdiff_t ib,
                                       const float *xb, __m256 acc[4][2])
{
    for (int r = 0; r < 4; r++)
        mf_q_fsb_q6_K(&w[r][ib], xb, acc[r]);
}

static inline void mf_q_fsb_q2_K_rows4(const block_q2_K *const w[4], ptrdiff_t ib,
                                       const float *xb, __m256 acc[4][2])
{
    __m256 sx[16];
    mf_q_sums16(xb, sx);                   /* once for the four rows */
    for (int r = 0; r < 4; r++)
        mf_q_fsb_q2_K(&w[r][ib], xb, sx, acc[r]);
}

static inline void mf_q_fsb_q3_K_rows4(const block_q3_K *const w[4], ptrdiff_t ib,
                                       const float *xb, __m256 acc[4][2])
{
    for (int r = 0; r < 4; r++)
        mf_q_fsb_q3_K(&w[r][ib], xb, acc[r]);
}

static inline void mf_q_fsb_iq4_xs_rows4(const block_iq4_xs *const w[4], ptrdiff_t ib,
                                         const float *xb, __m256 acc[4][2])
{
    for (int r = 0; r < 4; r++)
        mf_q_fsb_iq4_xs(&w[r][ib], xb, acc[r]);
}
#define MF_DOT4_F32_K(NAME, BLOCK, SB_FN, SB_FN16)                                             \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,       \
                        float *out)                                                            \
{                                                                                              \
    const BLOCK *w[4] = {(const BLOCK *)vw[0], (const BLOCK *)vw[1], (const BLOCK *)vw[2],     \
                         (const BLOCK *)vw[3]};                         /* [n / 256] each */   \
    const ptrdiff_t nb = n / QK_K;                                                             \
    const ptrdiff_t pf = mf_q_pf_dist(nb * (ptrdiff_t)sizeof(BLOCK));                          \
    __m256 acc[4][2];                                                                          \
    for (int r = 0; r < 4; r++)                                                                \
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();                                           \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        mf_q_prefetch4(w[0], nb * (ptrdiff_t)sizeof(BLOCK), ib * (ptrdiff_t)sizeof(BLOCK),        \
                       (ptrdiff_t)sizeof(BLOCK), pf);                                          \
        SB_FN##_rows4(w, ib, x + ib * QK_K, acc);                                              \
    }                                                                                          \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = mf_q_hsum_ps(_mm256_add_ps(acc[r][0], acc[r][1]));                            \
}
#endif
MF_DOT4_F32_K(mf_dot4_q4_K_f32, block_q4_K, mf_q_fsb_q4_K, mf_q_fsb16_q4_K)
MF_DOT4_F32_K(mf_dot4_q5_K_f32, block_q5_K, mf_q_fsb_q5_K, mf_q_fsb16_q5_K)
MF_DOT4_F32_K(mf_dot4_q6_K_f32, block_q6_K, mf_q_fsb_q6_K, mf_q_fsb16_q6_K)
MF_DOT4_F32_K(mf_dot4_q2_K_f32, block_q2_K, mf_q_fsb_q2_K, mf_q_fsb16_q2_K)
MF_DOT4_F32_K(mf_dot4_q3_K_f32, block_q3_K, mf_q_fsb_q3_K, mf_q_fsb16_q3_K)
MF_DOT4_F32_K(mf_dot4_iq4_xs_f32, block_iq4_xs, mf_q_fsb_iq4_xs, mf_q_fsb16_iq4_xs)

#elif defined(MF_Q_NEON)     /* mf_neon_dot_f32.h: each row's one-row sequence, x shared */

#define MF_DOT4_F32_NEON(NAME, NEON4)                                                          \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,       \
                        float *out)                                                            \
{                                                                                              \
    NEON4(vw, x, n, out);                                                                      \
}
MF_DOT4_F32_NEON(mf_dot4_q4_0_f32, mf_neon_dot4_q4_0_f32)
MF_DOT4_F32_NEON(mf_dot4_q4_1_f32, mf_neon_dot4_q4_1_f32)
MF_DOT4_F32_NEON(mf_dot4_q5_0_f32, mf_neon_dot4_q5_0_f32)
MF_DOT4_F32_NEON(mf_dot4_q5_1_f32, mf_neon_dot4_q5_1_f32)
MF_DOT4_F32_NEON(mf_dot4_q8_0_f32, mf_neon_dot4_q8_0_f32)
MF_DOT4_F32_NEON(mf_dot4_q4_K_f32, mf_neon_dot4_q4_K_f32)
MF_DOT4_F32_NEON(mf_dot4_q5_K_f32, mf_neon_dot4_q5_K_f32)
MF_DOT4_F32_NEON(mf_dot4_q6_K_f32, mf_neon_dot4_q6_K_f32)
MF_DOT4_F32_NEON(mf_dot4_q2_K_f32, mf_neon_dot4_q2_K_f32)
MF_DOT4_F32_NEON(mf_dot4_q3_K_f32, mf_neon_dot4_q3_K_f32)
MF_DOT4_F32_NEON(mf_dot4_iq4_nl_f32, mf_neon_dot4_iq4_nl_f32)
MF_DOT4_F32_NEON(mf_dot4_iq4_xs_f32, mf_neon_dot4_iq4_xs_f32)
#undef MF_DOT4_F32_NEON

#else /* generic: four one-row dots */

MF_DOT4_F32_ROWS(mf_dot4_q4_0_f32, mf_dot_q4_0_f32)
MF_DOT4_F32_ROWS(mf_dot4_q4_1_f32, mf_dot_q4_1_f32)
MF_DOT4_F32_ROWS(mf_dot4_q5_0_f32, mf_dot_q5_0_f32)
MF_DOT4_F32_ROWS(mf_dot4_q5_1_f32, mf_dot_q5_1_f32)
MF_DOT4_F32_ROWS(mf_dot4_q8_0_f32, mf_dot_q8_0_f32)
MF_DOT4_F32_ROWS(mf_dot4_q4_K_f32, mf_dot_q4_K_f32)
MF_DOT4_F32_ROWS(mf_dot4_q5_K_f32, mf_dot_q5_K_f32)
MF_DOT4_F32_ROWS(mf_dot4_q6_K_f32, mf_dot_q6_K_f32)
MF_DOT4_F32_ROWS(mf_dot4_q2_K_f32, mf_dot_q2_K_f32)
MF_DOT4_F32_ROWS(mf_dot4_q3_K_f32, mf_dot_q3_K_f32)
MF_DOT4_F32_ROWS(mf_dot4_iq4_nl_f32, mf_dot_iq4_nl_f32)
MF_DOT4_F32_ROWS(mf_dot4_iq4_xs_f32, mf_dot_iq4_xs_f32)

#endif /* MF_Q_AVX2 */
#undef MF_DOT4_F32_ROWS

/* FP16 / BF16 rows.  256-bit levels: the four rows side by side, each row's two accumulators
 * and tail exactly as in its one-row dot (so the same bits), x loaded once for the four, and the
 * region ahead prefetched as the block formats do (mf_q_prefetch4): one row at a time, the rows
 * streamed from DRAM below FP32's rate.  AVX-512 and generic: four one-row dots. */
#if defined(MF_Q_AVX2) && defined(MF_Q_F16C) && !defined(MF_SIMD_AVX512)
/* w_lo, w_hi: a row's 16 weights from element i on, as floats (WIDEN: the format's widening) */
#define MF_DOT4_F32_HALF(NAME, TYPE, WIDEN, SCALAR)                                             \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x, ptrdiff_t n,       \
                        float *out)                                                            \
{                                                                                              \
    const TYPE *w[4] = {(const TYPE *)vw[0], (const TYPE *)vw[1], (const TYPE *)vw[2],         \
                        (const TYPE *)vw[3]};                                 /* [n] each */   \
    const ptrdiff_t rb = n * (ptrdiff_t)sizeof(TYPE), pf = mf_q_pf_dist(rb);                   \
    __m256 acc[4][2];                                                                          \
    ptrdiff_t i = 0;                                                                           \
    for (int r = 0; r < 4; r++)                                                                \
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();                                           \
    for (; i + 16 <= n; i += 16) {                                                             \
        mf_q_prefetch4(w[0], rb, i * (ptrdiff_t)sizeof(TYPE), 16 * (ptrdiff_t)sizeof(TYPE), pf); \
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);             \
        for (int r = 0; r < 4; r++) {                                                          \
            acc[r][0] = _mm256_fmadd_ps(WIDEN(w[r] + i), x0, acc[r][0]);                       \
            acc[r][1] = _mm256_fmadd_ps(WIDEN(w[r] + i + 8), x1, acc[r][1]);                   \
        }                                                                                      \
    }                                                                                          \
    for (int r = 0; r < 4; r++) {                                                              \
        float v = mf_q_hsum_ps(_mm256_add_ps(acc[r][0], acc[r][1]));                           \
        for (ptrdiff_t j = i; j < n; j++)                                                      \
            v += SCALAR(w[r][j]) * x[j];                                                       \
        out[r] = v;                                                                            \
    }                                                                                          \
}
static inline __m256 mf__widen_fp16(const mf_fp16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
static inline __m256 mf__widen_bf16(const mf_bf16_t *p)
{
    const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
}
MF_DOT4_F32_HALF(mf_dot4_fp16_f32, mf_fp16_t, mf__widen_fp16, mf_fp16_to_fp32)
MF_DOT4_F32_HALF(mf_dot4_bf16_f32, mf_bf16_t, mf__widen_bf16, mf_bf16_to_fp32)
#undef MF_DOT4_F32_HALF
#else
static inline void mf_dot4_fp16_f32(const void *const *vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n, float *out)
{
    for (int r = 0; r < 4; r++)
        out[r] = mf_dot_fp16_f32(vw[r], x, n);
}

static inline void mf_dot4_bf16_f32(const void *const *vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n, float *out)
{
    for (int r = 0; r < 4; r++)
        out[r] = mf_dot_bf16_f32(vw[r], x, n);
}
#endif

/* ============================================================================================ */
/* Four weight rows against two float32 activation rows (a batched step's decode tokens, one a   */
/* sequence): out0 / out1 are exactly mf_dot4_f32_for(dt)'s results for x0 / x1 -- each token's  */
/* blocks into its own accumulators in the one-token dot's order, the same block functions --    */
/* while each block's weights are loaded and decoded once for both (the compiler shares the     */
/* decoding of the two inlined calls).  NULL where a level has none: the caller runs the 4-row   */
/* dot a token.                                                                                  */
/* ============================================================================================ */

typedef void (*mf_dot4x2_f32_fn)(const void *const *w, const float *x0, const float *x1,
                                 ptrdiff_t n, float *out0, float *out1);

#if defined(MF_Q_AVX2) && defined(MF_SIMD_AVX512)
#define MF_DOT4X2_F32_32(NAME, BLOCK, BLOCK_FN16, TAB)                                         \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x0,                   \
                        const float *MF_RESTRICT x1, ptrdiff_t n, float *out0, float *out1)    \
{                                                                                              \
    const BLOCK *w[4] = {(const BLOCK *)vw[0], (const BLOCK *)vw[1], (const BLOCK *)vw[2],     \
                         (const BLOCK *)vw[3]};                          /* [n / 32] each */   \
    const ptrdiff_t nb = n / 32, bsz = (ptrdiff_t)sizeof(BLOCK);                               \
    const ptrdiff_t pf = mf_q_pf_dist(nb * bsz);                                               \
    const __m512 T = (TAB);                                                                    \
    __m512 a0[4][2], a1[4][2];                                                                 \
    for (int r = 0; r < 4; r++)                                                                \
        a0[r][0] = a0[r][1] = a1[r][0] = a1[r][1] = _mm512_setzero_ps();                       \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        if ((ib & 1) == 0)                                                                     \
            mf_q_prefetch4(w[0], nb * bsz, ib * bsz, 2 * bsz, pf);                             \
        const mf_q_fx16 X0 = mf_q_fx16_load(x0 + 32 * ib);                                     \
        const mf_q_fx16 X1 = mf_q_fx16_load(x1 + 32 * ib);                                     \
        for (int r = 0; r < 4; r++) {                                                          \
            BLOCK_FN16(&w[r][ib], &X0, T, a0[r]);                                              \
            BLOCK_FN16(&w[r][ib], &X1, T, a1[r]);                                              \
        }                                                                                      \
    }                                                                                          \
    for (int r = 0; r < 4; r++) {                                                              \
        out0[r] = mf_q_hsum16(a0[r]);                                                          \
        out1[r] = mf_q_hsum16(a1[r]);                                                          \
    }                                                                                          \
}
MF_DOT4X2_F32_32(mf_dot4x2_q4_0_f32, block_q4_0, mf_q_fblk16_q4_0, mf_q_ftab16(8.0f))
MF_DOT4X2_F32_32(mf_dot4x2_q4_1_f32, block_q4_1, mf_q_fblk16_q4_1, mf_q_ftab16(0.0f))
MF_DOT4X2_F32_32(mf_dot4x2_q5_0_f32, block_q5_0, mf_q_fblk16_q5_0, mf_q_ftab16(16.0f))
MF_DOT4X2_F32_32(mf_dot4x2_q5_1_f32, block_q5_1, mf_q_fblk16_q5_1, mf_q_ftab16(0.0f))
MF_DOT4X2_F32_32(mf_dot4x2_q8_0_f32, block_q8_0, mf_q_fblk16_q8_0, mf_q_ftab16(0.0f))
MF_DOT4X2_F32_32(mf_dot4x2_iq4_nl_f32, block_iq4_nl, mf_q_fblk16_iq4_nl, mf_q_ftab16_iq4())
#undef MF_DOT4X2_F32_32

#define MF_DOT4X2_F32_K(NAME, BLOCK, SB_FN16)                                                  \
static inline void NAME(const void *const *vw, const float *MF_RESTRICT x0,                   \
                        const float *MF_RESTRICT x1, ptrdiff_t n, float *out0, float *out1)    \
{                                                                                              \
    const BLOCK *w[4] = {(const BLOCK *)vw[0], (const BLOCK *)vw[1], (const BLOCK *)vw[2],     \
                         (const BLOCK *)vw[3]};                         /* [n / 256] each */   \
    const ptrdiff_t nb = n / QK_K;                                                             \
    const ptrdiff_t pf = mf_q_pf_dist(nb * (ptrdiff_t)sizeof(BLOCK));                          \
    const __m512 T = mf_q_ftab16(0.0f);                                                        \
    __m512 a0[4][2], a1[4][2];                                                                 \
    for (int r = 0; r < 4; r++)                                                                \
        a0[r][0] = a0[r][1] = a1[r][0] = a1[r][1] = _mm512_setzero_ps();                       \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        mf_q_prefetch4(w[0], nb * (ptrdiff_t)sizeof(BLOCK), ib * (ptrdiff_t)sizeof(BLOCK),        \
                       (ptrdiff_t)sizeof(BLOCK), pf);                                          \
        for (int r = 0; r < 4; r++) {                                                          \
            SB_FN16(&w[r][ib], x0 + ib * QK_K, T, a0[r]);                                      \
            SB_FN16(&w[r][ib], x1 + ib * QK_K, T, a1[r]);                                      \
        }                                                                                      \
    }                                                                                          \
    for (int r = 0; r < 4; r++) {                                                              \
        out0[r] = mf_q_hsum16(a0[r]);                                                          \
        out1[r] = mf_q_hsum16(a1[r]);                                                          \
    }                                                                                          \
}
MF_DOT4X2_F32_K(mf_dot4x2_q4_K_f32, block_q4_K, mf_q_fsb16_q4_K)
MF_DOT4X2_F32_K(mf_dot4x2_q5_K_f32, block_q5_K, mf_q_fsb16_q5_K)
MF_DOT4X2_F32_K(mf_dot4x2_q6_K_f32, block_q6_K, mf_q_fsb16_q6_K)
MF_DOT4X2_F32_K(mf_dot4x2_q2_K_f32, block_q2_K, mf_q_fsb16_q2_K)
MF_DOT4X2_F32_K(mf_dot4x2_q3_K_f32, block_q3_K, mf_q_fsb16_q3_K)
MF_DOT4X2_F32_K(mf_dot4x2_iq4_xs_f32, block_iq4_xs, mf_q_fsb16_iq4_xs)
#undef MF_DOT4X2_F32_K

static inline mf_dot4x2_f32_fn mf_dot4x2_f32_for(int dt)
{
    switch (dt) {
    case CK_DT_Q4_0: return mf_dot4x2_q4_0_f32;
    case CK_DT_Q4_1: return mf_dot4x2_q4_1_f32;
    case CK_DT_Q5_0: return mf_dot4x2_q5_0_f32;
    case CK_DT_Q5_1: return mf_dot4x2_q5_1_f32;
    case CK_DT_Q8_0: return mf_dot4x2_q8_0_f32;
    case CK_DT_IQ4_NL: return mf_dot4x2_iq4_nl_f32;
    case CK_DT_Q4_K: return mf_dot4x2_q4_K_f32;
    case CK_DT_Q5_K: return mf_dot4x2_q5_K_f32;
    case CK_DT_Q6_K: return mf_dot4x2_q6_K_f32;
    case CK_DT_Q2_K: return mf_dot4x2_q2_K_f32;
    case CK_DT_Q3_K: return mf_dot4x2_q3_K_f32;
    case CK_DT_IQ4_XS: return mf_dot4x2_iq4_xs_f32;
    default: return NULL;
    }
}
#else
static inline mf_dot4x2_f32_fn mf_dot4x2_f32_for(int dt) { (void)dt; return NULL; }
#endif

/* The 4-row float dot of a block or half-precision format (NULL for FP32, which has its own:
 * mf_dot_1x4_f32, and for anything else). */
static inline mf_dot4_f32_fn mf_dot4_f32_for(int dt)
{
    switch (dt) {
    case CK_DT_FP16: return mf_dot4_fp16_f32;
    case CK_DT_BF16: return mf_dot4_bf16_f32;
    case CK_DT_Q4_0: return mf_dot4_q4_0_f32;
    case CK_DT_Q4_1: return mf_dot4_q4_1_f32;
    case CK_DT_Q5_0: return mf_dot4_q5_0_f32;
    case CK_DT_Q5_1: return mf_dot4_q5_1_f32;
    case CK_DT_Q8_0: return mf_dot4_q8_0_f32;
    case CK_DT_Q4_K: return mf_dot4_q4_K_f32;
    case CK_DT_Q5_K: return mf_dot4_q5_K_f32;
    case CK_DT_Q6_K: return mf_dot4_q6_K_f32;
    case CK_DT_Q2_K: return mf_dot4_q2_K_f32;
    case CK_DT_Q3_K: return mf_dot4_q3_K_f32;
    case CK_DT_IQ4_NL: return mf_dot4_iq4_nl_f32;
    case CK_DT_IQ4_XS: return mf_dot4_iq4_xs_f32;
    default: return NULL;
    }
}

#endif /* MEGAFUSE_MF_DOT_F32_H */
