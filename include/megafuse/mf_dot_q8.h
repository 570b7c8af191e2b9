/*
 * mf_dot_q8.h -- the int8 dots of one weight row with one quantized activation row:
 * mf_dot_{q4_0,q4_1,q5_0,q5_1,q8_0}_q8_0(const void *w, const void *a, n) against Q8_0 blocks and
 * mf_dot_{q4_K,q5_K,q6_K}_q8_K against Q8_K blocks (a: from mf_act_quant.h, [n / 32] block_q8_0
 * or [n / 256] block_q8_K).
 *
 * GGML's vec_dot_*_q8_0 / *_q8_K scheme.  Per block (32) or sub-block (K-quants), the products of
 * the 8-bit codes are summed exactly in int32; each block's contribution d_w * d_a * isum (plus
 * the min term) is then formed in double, where it is exact for the 32-weight formats, and added
 * to one of 4 double accumulators (block b -> accumulator b % 4; the K-quants use one), combined
 * as (a0 + a1) + (a2 + a3) and rounded once to float.  That float part is the same sequence of
 * operations at every SIMD level, so an integer dot gives the same bits on generic, AVX2 and
 * AVX-512.  Q4_1 / Q5_1 need the activation block sum s = d_a * sum(q_a) (GGML keeps it in a
 * separate block_q8_1, rounded to fp16): here it is computed on the fly from the Q8_0 block,
 * exactly (d_a * isum in double), so the result is the exact emulation
 * sum_b (d_w q_w + m_w) . (d_a q_a) up to the final roundings.  Precondition of every integer dot:
 * activation codes lie in [-127, 127] (the quantizers of mf_act_quant.h never produce -128).
 *
 * The per-block integer sums (mf_isum_*) are also the tails of the multi-row kernels of
 * mf_q8_tiles.h.
 *
 * Depends on: mf_quant_common.h (levels, AVX2 byte products and horizontal sums, fp16 scales,
 * Q6_K codes, mf_mul_nc_d), ggml_blocks.h (block structs, mf_get_scale_min_k4).
 */
#ifndef MEGAFUSE_MF_DOT_Q8_H
#define MEGAFUSE_MF_DOT_Q8_H

#include <stddef.h>
#include <stdint.h>

#include "ggml_blocks.h"
#include "mf_quant_common.h"

/* ============================================================================================ */
/* Integer dots: weights x quantized activations (the scheme: see the top of this file)         */
/* ============================================================================================ */

#if defined(MF_Q_AVX2)
static inline int32_t mf_q_hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
#endif /* MF_Q_AVX2 */

/* Block b of a 32-weight row adds its exact double contribution to acc[b % 4]. */
static inline float mf_q_combine4(const double acc[4])
{
    return (float)((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

#if defined(MF_Q_AVX2)
/* d_w * d_a of blocks ib..ib+3 (float: an exact product of two fp16 values) as doubles. */
static inline __m256d mf_q_dd4(mf_fp16_t w0, mf_fp16_t w1, mf_fp16_t w2, mf_fp16_t w3,
                               const block_q8_0 *a)
{
    __m128 dw = mf_q_fp16x4(w0, w1, w2, w3);
    __m128 da = mf_q_fp16x4(a[0].d, a[1].d, a[2].d, a[3].d);
    return _mm256_cvtps_pd(_mm_mul_ps(dw, da));
}
#endif

/* Integer sum of one Q4_0 / Q5_0 / Q8_0 block against one Q8_0 block (generic). */
static inline int32_t mf_isum_q4_0(const block_q4_0 *w, const block_q8_0 *a)
{
    int32_t s = 0;
    for (int j = 0; j < 16; j++)
        s += ((w->qs[j] & 0x0F) - 8) * a->qs[j] + ((w->qs[j] >> 4) - 8) * a->qs[j + 16];
    return s;
}

static inline int32_t mf_isum_q5_0(const block_q5_0 *w, const block_q8_0 *a)
{
    const uint32_t qh = mf_le32(w->qh);
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        const int q0 = ((w->qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4)) - 16;
        const int q1 = ((w->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4)) - 16;
        s += q0 * a->qs[j] + q1 * a->qs[j + 16];
    }
    return s;
}

static inline int32_t mf_isum_q8_0(const block_q8_0 *w, const block_q8_0 *a)
{
    int32_t s = 0;
    for (int j = 0; j < QK8_0; j++)
        s += w->qs[j] * a->qs[j];
    return s;
}

/* Sum of q_w * q_a (q_w the unsigned codes) and of q_a, for Q4_1 / Q5_1 (generic). */
static inline void mf_isum_q4_1(const block_q4_1 *w, const block_q8_0 *a, int32_t *sqa,
                                int32_t *sa)
{
    int32_t s = 0, t = 0;
    for (int j = 0; j < 16; j++) {
        s += (w->qs[j] & 0x0F) * a->qs[j] + (w->qs[j] >> 4) * a->qs[j + 16];
        t += a->qs[j] + a->qs[j + 16];
    }
    *sqa = s;
    *sa = t;
}

static inline void mf_isum_q5_1(const block_q5_1 *w, const block_q8_0 *a, int32_t *sqa,
                                int32_t *sa)
{
    const uint32_t qh = mf_le32(w->qh);
    int32_t s = 0, t = 0;
    for (int j = 0; j < 16; j++) {
        const int q0 = (w->qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
        const int q1 = (w->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        s += q0 * a->qs[j] + q1 * a->qs[j + 16];
        t += a->qs[j] + a->qs[j + 16];
    }
    *sqa = s;
    *sa = t;
}

#if defined(MF_Q_AVX2)
static inline __m256i mf_q_vec_q4_0(const block_q4_0 *w, const block_q8_0 *a)
{
    __m256i q = _mm256_sub_epi8(mf_q_nibbles32(w->qs), _mm256_set1_epi8(8));
    return mf_q_dot_s8s8(q, mf_q_loadu256(a->qs));
}

static inline __m256i mf_q_vec_q5_0(const block_q5_0 *w, const block_q8_0 *a)
{
    __m256i q = _mm256_or_si256(mf_q_nibbles32(w->qs), mf_q_bits32_x10(w->qh));
    return mf_q_dot_s8s8(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), mf_q_loadu256(a->qs));
}

static inline __m256i mf_q_vec_q8_0(const block_q8_0 *w, const block_q8_0 *a)
{
    return mf_q_dot_s8s8(mf_q_loadu256(w->qs), mf_q_loadu256(a->qs));
}
#endif

/* Q4_0 / Q5_0 / Q8_0 weights: sum_b (d_w d_a) * isum_b. */
#if defined(MF_Q_AVX2)
#define MF_DOT_SYMMETRIC_Q8_0(NAME, BLOCK, VEC, ISUM)                                          \
static inline float NAME(const void *MF_RESTRICT vw, const void *MF_RESTRICT va, ptrdiff_t n)  \
{                                                                                              \
    const BLOCK *w = (const BLOCK *)vw;             /* [n / 32] */                             \
    const block_q8_0 *a = (const block_q8_0 *)va;   /* [n / 32] */                             \
    const ptrdiff_t nb = n / QK8_0;                                                            \
    double acc[4] = {0.0, 0.0, 0.0, 0.0};                                                      \
    ptrdiff_t ib = 0;                                                                          \
    __m256d acc4 = _mm256_setzero_pd();                                                        \
    for (; ib + 4 <= nb; ib += 4) {                                                            \
        __m128i is = mf_q_hsum4_epi32(VEC(&w[ib], &a[ib]), VEC(&w[ib + 1], &a[ib + 1]),        \
                                      VEC(&w[ib + 2], &a[ib + 2]), VEC(&w[ib + 3], &a[ib + 3]));\
        __m256d dd = mf_q_dd4(w[ib].d, w[ib + 1].d, w[ib + 2].d, w[ib + 3].d, &a[ib]);         \
        acc4 = _mm256_add_pd(acc4, _mm256_mul_pd(dd, _mm256_cvtepi32_pd(is)));                 \
    }                                                                                          \
    _mm256_storeu_pd(acc, acc4);                                                               \
    for (; ib < nb; ib++) {                                                                    \
        const float dd = mf_q_fp16(w[ib].d) * mf_q_fp16(a[ib].d);                  \
        acc[ib & 3] += (double)dd * (double)ISUM(&w[ib], &a[ib]);                              \
    }                                                                                          \
    return mf_q_combine4(acc);                                                                 \
}
#else
#define MF_DOT_SYMMETRIC_Q8_0(NAME, BLOCK, VEC, ISUM)                                          \
static inline float NAME(const void *MF_RESTRICT vw, const void *MF_RESTRICT va, ptrdiff_t n)  \
{                                                                                              \
    const BLOCK *w = (const BLOCK *)vw;             /* [n / 32] */                             \
    const block_q8_0 *a = (const block_q8_0 *)va;   /* [n / 32] */                             \
    const ptrdiff_t nb = n / QK8_0;                                                            \
    double acc[4] = {0.0, 0.0, 0.0, 0.0};                                                      \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        const float dd = mf_q_fp16(w[ib].d) * mf_q_fp16(a[ib].d);                  \
        acc[ib & 3] += (double)dd * (double)ISUM(&w[ib], &a[ib]);                              \
    }                                                                                          \
    return mf_q_combine4(acc);                                                                 \
}
#endif

MF_DOT_SYMMETRIC_Q8_0(mf_dot_q4_0_q8_0, block_q4_0, mf_q_vec_q4_0, mf_isum_q4_0)
MF_DOT_SYMMETRIC_Q8_0(mf_dot_q5_0_q8_0, block_q5_0, mf_q_vec_q5_0, mf_isum_q5_0)
MF_DOT_SYMMETRIC_Q8_0(mf_dot_q8_0_q8_0, block_q8_0, mf_q_vec_q8_0, mf_isum_q8_0)

/* Q4_1 / Q5_1 weights: sum_b (d_w d_a) * isum_qa + m_w * (d_a * isum_a). */
#if defined(MF_Q_AVX2)
static inline void mf_q_vec_q4_1(const block_q4_1 *w, const block_q8_0 *a, __m256i *sqa,
                                 __m256i *sa)
{
    const __m256i av = mf_q_loadu256(a->qs);
    *sqa = mf_q_dot_u8s8(_mm256_setzero_si256(), mf_q_nibbles32(w->qs), av);
    *sa = mf_q_dot_u8s8(_mm256_setzero_si256(), _mm256_set1_epi8(1), av);
}

static inline void mf_q_vec_q5_1(const block_q5_1 *w, const block_q8_0 *a, __m256i *sqa,
                                 __m256i *sa)
{
    const __m256i av = mf_q_loadu256(a->qs);
    __m256i q = _mm256_or_si256(mf_q_nibbles32(w->qs), mf_q_bits32_x10(w->qh));
    *sqa = mf_q_dot_u8s8(_mm256_setzero_si256(), q, av);
    *sa = mf_q_dot_u8s8(_mm256_setzero_si256(), _mm256_set1_epi8(1), av);
}

#define MF_DOT_ASYM_AVX2_BODY(VEC, ISUM)                                                       \
    __m256d acc4 = _mm256_setzero_pd();                                                        \
    for (; ib + 4 <= nb; ib += 4) {                                                            \
        __m256i s0, s1, s2, s3, t0, t1, t2, t3;                                                \
        VEC(&w[ib], &a[ib], &s0, &t0);                                                         \
        VEC(&w[ib + 1], &a[ib + 1], &s1, &t1);                                                 \
        VEC(&w[ib + 2], &a[ib + 2], &s2, &t2);                                                 \
        VEC(&w[ib + 3], &a[ib + 3], &s3, &t3);                                                 \
        __m256d iqa = _mm256_cvtepi32_pd(mf_q_hsum4_epi32(s0, s1, s2, s3));                    \
        __m256d ia = _mm256_cvtepi32_pd(mf_q_hsum4_epi32(t0, t1, t2, t3));                     \
        __m128 da = mf_q_fp16x4(a[ib].d, a[ib + 1].d, a[ib + 2].d, a[ib + 3].d);               \
        __m128 dw = mf_q_fp16x4(w[ib].d, w[ib + 1].d, w[ib + 2].d, w[ib + 3].d);               \
        __m128 mw = mf_q_fp16x4(w[ib].m, w[ib + 1].m, w[ib + 2].m, w[ib + 3].m);               \
        __m256d t = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm_mul_ps(dw, da)), iqa),     \
                                  _mm256_mul_pd(_mm256_cvtps_pd(_mm_mul_ps(mw, da)), ia));     \
        acc4 = _mm256_add_pd(acc4, t);                                                         \
    }                                                                                          \
    _mm256_storeu_pd(acc, acc4);
#else
#define MF_DOT_ASYM_AVX2_BODY(VEC, ISUM)
#endif

#define MF_DOT_ASYM_Q8_0(NAME, BLOCK, VEC, ISUM)                                               \
static inline float NAME(const void *MF_RESTRICT vw, const void *MF_RESTRICT va, ptrdiff_t n)  \
{                                                                                              \
    const BLOCK *w = (const BLOCK *)vw;             /* [n / 32] */                             \
    const block_q8_0 *a = (const block_q8_0 *)va;   /* [n / 32] */                             \
    const ptrdiff_t nb = n / QK8_0;                                                            \
    double acc[4] = {0.0, 0.0, 0.0, 0.0};                                                      \
    ptrdiff_t ib = 0;                                                                          \
    MF_DOT_ASYM_AVX2_BODY(VEC, ISUM)                                                           \
    for (; ib < nb; ib++) {                                                                    \
        int32_t sqa, sa;                                                                       \
        ISUM(&w[ib], &a[ib], &sqa, &sa);                                                       \
        const float da = mf_q_fp16(a[ib].d);                                             \
        const float dd = mf_q_fp16(w[ib].d) * da;                                        \
        const float md = mf_q_fp16(w[ib].m) * da;                                        \
        acc[ib & 3] += (double)dd * (double)sqa + (double)md * (double)sa;                     \
    }                                                                                          \
    return mf_q_combine4(acc);                                                                 \
}

MF_DOT_ASYM_Q8_0(mf_dot_q4_1_q8_0, block_q4_1, mf_q_vec_q4_1, mf_isum_q4_1)
MF_DOT_ASYM_Q8_0(mf_dot_q5_1_q8_0, block_q5_1, mf_q_vec_q5_1, mf_isum_q5_1)

/* K-quants x Q8_K, per super-block: sumi = sum_j sc_j * (q_j . a_j) exactly, the min term from
 * the activation's bsums; acc += (d_w d_a) sumi - (dmin_w d_a) summ in double. */
static inline double mf_q_kterm(mf_fp16_t d, mf_fp16_t dmin, float da, int32_t sumi,
                                int32_t summ)
{
    const double dd = (double)mf_q_fp16(d) * (double)da;        /* exact */
    const double dm = (double)mf_q_fp16(dmin) * (double)da;     /* exact */
    return mf_mul_nc_d(dd, (double)sumi) - mf_mul_nc_d(dm, (double)summ);
}

static inline void mf_q_unpack_sc_m(const uint8_t *scales, int sc[8], int m[8])
{
    for (int j = 0; j < 8; j++) {
        uint8_t s, mm;
        mf_get_scale_min_k4(j, scales, &s, &mm);
        sc[j] = s;
        m[j] = mm;
    }
}

static inline float mf_dot_q4_K_q8_K(const void *MF_RESTRICT vw, const void *MF_RESTRICT va,
                                     ptrdiff_t n)
{
    const block_q4_K *w = (const block_q4_K *)vw;   /* [n / 256] */
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    double acc = 0.0;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        int sc[8], m[8];
        mf_q_unpack_sc_m(w[ib].scales, sc, m);
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++)
            summ += m[j] * (a[ib].bsums[2 * j] + a[ib].bsums[2 * j + 1]);
#if defined(MF_Q_AVX2)
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        __m256i s = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = mf_q_loadu256(w[ib].qs + 32 * c);
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            __m256i p1 = _mm256_maddubs_epi16(lo, mf_q_loadu256(a[ib].qs + 64 * c));
            __m256i p2 = _mm256_maddubs_epi16(hi, mf_q_loadu256(a[ib].qs + 64 * c + 32));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p1, _mm256_set1_epi16((short)sc[2 * c])));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p2, _mm256_set1_epi16((short)sc[2 * c + 1])));
        }
        sumi = mf_q_hsum_epi32(s);
#else
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = w[ib].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            const int8_t *aj = a[ib].qs + 32 * j;
            int32_t t = 0;
            for (int l = 0; l < 32; l++)
                t += ((qs[l] >> shift) & 0x0F) * aj[l];
            sumi += sc[j] * t;
        }
#endif
        acc += mf_q_kterm(w[ib].d, w[ib].dmin, a[ib].d, sumi, summ);
    }
    return (float)acc;
}

static inline float mf_dot_q5_K_q8_K(const void *MF_RESTRICT vw, const void *MF_RESTRICT va,
                                     ptrdiff_t n)
{
    const block_q5_K *w = (const block_q5_K *)vw;   /* [n / 256] */
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    double acc = 0.0;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        int sc[8], m[8];
        mf_q_unpack_sc_m(w[ib].scales, sc, m);
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++)
            summ += m[j] * (a[ib].bsums[2 * j] + a[ib].bsums[2 * j + 1]);
#if defined(MF_Q_AVX2)
        const __m256i m4 = _mm256_set1_epi8(0x0F), x10 = _mm256_set1_epi8(0x10);
        const __m256i qh = mf_q_loadu256(w[ib].qh);
        __m256i s = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i b1 = _mm256_set1_epi8((char)(1 << (2 * c)));
            const __m256i b2 = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
            __m256i q = mf_q_loadu256(w[ib].qs + 32 * c);
            __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), x10);
            __m256i h2 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b2), b2), x10);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), h1);
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h2);
            __m256i p1 = _mm256_maddubs_epi16(lo, mf_q_loadu256(a[ib].qs + 64 * c));
            __m256i p2 = _mm256_maddubs_epi16(hi, mf_q_loadu256(a[ib].qs + 64 * c + 32));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p1, _mm256_set1_epi16((short)sc[2 * c])));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p2, _mm256_set1_epi16((short)sc[2 * c + 1])));
        }
        sumi = mf_q_hsum_epi32(s);
#else
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = w[ib].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            const int8_t *aj = a[ib].qs + 32 * j;
            int32_t t = 0;
            for (int l = 0; l < 32; l++)
                t += (((qs[l] >> shift) & 0x0F) | (((w[ib].qh[l] >> j) & 1) << 4)) * aj[l];
            sumi += sc[j] * t;
        }
#endif
        acc += mf_q_kterm(w[ib].d, w[ib].dmin, a[ib].d, sumi, summ);
    }
    return (float)acc;
}

static inline float mf_dot_q6_K_q8_K(const void *MF_RESTRICT vw, const void *MF_RESTRICT va,
                                     ptrdiff_t n)
{
    const block_q6_K *w = (const block_q6_K *)vw;   /* [n / 256] */
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    double acc = 0.0;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        /* sum_j sc_j * sum_l (code - 32) a  =  sum_j sc_j * (code . a)  -  32 * sum_j sc_j bsum_j */
        int32_t sumi = 0, sumo = 0;
        for (int j = 0; j < 16; j++)
            sumo += w[ib].scales[j] * a[ib].bsums[j];
#if defined(MF_Q_AVX2)
        __m256i s = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            mf_q6k_codes(&w[ib], h, q);
            for (int k = 0; k < 4; k++) {
                const int j = 8 * h + 2 * k;
                const __m256i scv = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_set1_epi16((short)w[ib].scales[j])),
                    _mm_set1_epi16((short)w[ib].scales[j + 1]), 1);
                __m256i p = _mm256_maddubs_epi16(q[k], mf_q_loadu256(a[ib].qs + 128 * h + 32 * k));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, scv));
            }
        }
        sumi = mf_q_hsum_epi32(s);
#else
        uint8_t codes[256];
        mf_q6k_codes_all(&w[ib], codes);
        for (int j = 0; j < 16; j++) {
            int32_t t = 0;
            for (int l = 0; l < 16; l++)
                t += codes[16 * j + l] * a[ib].qs[16 * j + l];
            sumi += w[ib].scales[j] * t;
        }
#endif
        const double dd = (double)mf_q_fp16(w[ib].d) * (double)a[ib].d;   /* exact */
        acc += mf_mul_nc_d(dd, (double)(sumi - 32 * sumo));
    }
    return (float)acc;
}

#endif /* MEGAFUSE_MF_DOT_Q8_H */
