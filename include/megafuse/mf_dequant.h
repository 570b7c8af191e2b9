/*
 * mf_dequant.h -- dequantize one weight row: mf_dequantize_row_<dt>(const void *w, float *y, n),
 * y[n] = the weights, for dt = FP32, FP16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
 * Q2_K, Q3_K, IQ4_NL, IQ4_XS (w: one row, [n / block] blocks, ck_dtype_row_bytes(dt, n) bytes;
 * n a multiple of the block size, which the caller checks).
 *
 * Dequantization is GGML's float32 arithmetic, so it equals gguf.quants.dequantize bit for bit --
 * for NaN and Inf scales too, on x86 (NaN bits follow x86's first-operand rule, as NumPy's).
 * The same bits at every SIMD level.
 *
 * Depends on: mf_quant_common.h (levels, AVX2 loads and nibble / high-bit unpacking, K-quant
 * scales, Q6_K codes), ggml_blocks.h (block structs, fp16 / bf16 conversions).
 */
#ifndef MEGAFUSE_MF_DEQUANT_H
#define MEGAFUSE_MF_DEQUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"
#include "mf_quant_common.h"

/* ============================================================================================ */
/* FP32, FP16, BF16 rows                                                                        */
/* ============================================================================================ */

/* y[n] = fp16 bits h[n] as float (NumPy's bits: NaN payloads kept). */
static inline void mf_dequantize_row_fp16(const void *MF_RESTRICT vh, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const mf_fp16_t *h = (const mf_fp16_t *)vh;
    ptrdiff_t i = 0;
#if defined(MF_Q_F16C)
    /* vcvtph2ps sets the quiet bit of a signalling NaN; NumPy does not: clear it back there. */
    const __m256i nan_lim = _mm256_set1_epi32(0x7c00), abs16 = _mm256_set1_epi32(0x7fff);
    const __m256i qbit = _mm256_set1_epi32(0x00400000);
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(h + i));
        __m256i r = _mm256_castps_si256(_mm256_cvtph_ps(v));
        __m256i w = _mm256_cvtepu16_epi32(v);
        __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, abs16), nan_lim);
        __m256i was_quiet = _mm256_and_si256(_mm256_slli_epi32(w, 13), qbit);
        __m256i fix = _mm256_andnot_si256(was_quiet, _mm256_and_si256(is_nan, qbit));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_xor_si256(r, fix)));
    }
#endif
    for (; i < n; i++)
        y[i] = mf_fp16_to_fp32_lanes(h[i]);
}

static inline void mf_dequantize_row_bf16(const void *MF_RESTRICT vh, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const mf_bf16_t *h = (const mf_bf16_t *)vh;
    for (ptrdiff_t i = 0; i < n; i++)
        y[i] = mf_bf16_to_fp32(h[i]);
}

static inline void mf_dequantize_row_fp32(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    memcpy(y, vx, (size_t)n * sizeof(float));
}

/* ============================================================================================ */
/* Dequantize a row of blocks: y[n] = the weights, exactly as GGML computes them in float32.    */
/* Every product below is exact (an 11-bit fp16 scale times a code of <= 8 bits, or a 6/8-bit   */
/* sub-block scale), so fusing it with the following add would not change a bit.  NaN scales   */
/* give NumPy's NaN bits too (x86: the first operand's NaN, see mf_q_store_scaled_addsub).      */
/* ============================================================================================ */

#if defined(MF_Q_AVX2)

/* 32 int8 codes -> y[0..31] = d * code (exact products). */
static inline void mf_q_store_scaled(__m256i q, __m256 d, float *y)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

/* The same with scale da for codes 0..15 and db for codes 16..31 (Q6_K's sub-blocks of 16). */
static inline void mf_q_store_scaled2(__m256i q, __m256 da, __m256 db, float *y)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(da, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(da, _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(db, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(db, _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

/* y = d * code + m, or d * code - m (sub = 1).  The product is exact, so the sum rounds once
 * whether fused or not.  NaN scales: NumPy (gguf) evaluates (d * q) + m with the product as first
 * operand, and x86 returns the first operand's NaN when both are NaN; the compiler may commute or
 * fuse the add, so where the product is NaN it is taken explicitly. */
static inline void mf_q_store_scaled_addsub(__m256i q, __m256 d, __m256 m, int sub, float *y)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i part[4];
    part[0] = lo;
    part[1] = _mm_srli_si128(lo, 8);
    part[2] = hi;
    part[3] = _mm_srli_si128(hi, 8);
    for (int k = 0; k < 4; k++) {
        __m256 p = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])));
        __m256 r = sub ? _mm256_sub_ps(p, m) : _mm256_add_ps(p, m);
        _mm256_storeu_ps(y + 8 * k, _mm256_blendv_ps(r, p, _mm256_cmp_ps(p, p, _CMP_UNORD_Q)));
    }
}

/* Q2_K's two sub-blocks of 16: y = da * code - ma for codes 0..15, db * code - mb for 16..31 (the
 * NaN rule of mf_q_store_scaled_addsub). */
static inline void mf_q_store_scaled_sub2(__m256i q, __m256 da, __m256 ma, __m256 db, __m256 mb,
                                          float *y)
{
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i part[4];
    part[0] = lo;
    part[1] = _mm_srli_si128(lo, 8);
    part[2] = hi;
    part[3] = _mm_srli_si128(hi, 8);
    for (int k = 0; k < 4; k++) {
        __m256 p = _mm256_mul_ps(k < 2 ? da : db, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])));
        __m256 r = _mm256_sub_ps(p, k < 2 ? ma : mb);
        _mm256_storeu_ps(y + 8 * k, _mm256_blendv_ps(r, p, _mm256_cmp_ps(p, p, _CMP_UNORD_Q)));
    }
}

/* The 16 values of IQ4_NL / IQ4_XS in both 128-bit lanes, for vpshufb of 4-bit indices. */
static inline __m256i mf_q_kvalues256(void)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)
                                                       mf_kvalues_iq4nl));
}

#endif /* MF_Q_AVX2 */

static inline void mf_dequantize_row_q4_0(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q4_0 *x = (const block_q4_0 *)vx;   /* [n / 32] */
    const ptrdiff_t nb = n / QK4_0;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        float *yb = y + ib * QK4_0;
#if defined(MF_Q_AVX2)
        __m256i q = _mm256_sub_epi8(mf_q_nibbles32(x[ib].qs), _mm256_set1_epi8(8));
        mf_q_store_scaled(q, _mm256_set1_ps(d), yb);
#else
        for (int j = 0; j < QK4_0 / 2; j++) {
            yb[j] = d * (float)((x[ib].qs[j] & 0x0F) - 8);
            yb[j + QK4_0 / 2] = d * (float)((x[ib].qs[j] >> 4) - 8);
        }
#endif
    }
}

static inline void mf_dequantize_row_q4_1(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q4_1 *x = (const block_q4_1 *)vx;   /* [n / 32] */
    const ptrdiff_t nb = n / QK4_1;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        const float m = mf_fp16_to_fp32(x[ib].m);
        float *yb = y + ib * QK4_1;
#if defined(MF_Q_AVX2)
        mf_q_store_scaled_addsub(mf_q_nibbles32(x[ib].qs), _mm256_set1_ps(d), _mm256_set1_ps(m), 0,
                                 yb);
#else
        for (int j = 0; j < QK4_1 / 2; j++) {
            const float p0 = d * (float)(x[ib].qs[j] & 0x0F), p1 = d * (float)(x[ib].qs[j] >> 4);
            yb[j] = p0 != p0 ? p0 : p0 + m;              /* NaN: the product's, as NumPy */
            yb[j + QK4_1 / 2] = p1 != p1 ? p1 : p1 + m;
        }
#endif
    }
}

static inline void mf_dequantize_row_q5_0(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q5_0 *x = (const block_q5_0 *)vx;   /* [n / 32] */
    const ptrdiff_t nb = n / QK5_0;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        float *yb = y + ib * QK5_0;
#if defined(MF_Q_AVX2)
        __m256i q = _mm256_or_si256(mf_q_nibbles32(x[ib].qs), mf_q_bits32_x10(x[ib].qh));
        mf_q_store_scaled(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), _mm256_set1_ps(d), yb);
#else
        const uint32_t qh = mf_le32(x[ib].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1u) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1u) << 4;
            yb[j] = d * (float)(((x[ib].qs[j] & 0x0F) | h0) - 16);
            yb[j + QK5_0 / 2] = d * (float)(((x[ib].qs[j] >> 4) | h1) - 16);
        }
#endif
    }
}

static inline void mf_dequantize_row_q5_1(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q5_1 *x = (const block_q5_1 *)vx;   /* [n / 32] */
    const ptrdiff_t nb = n / QK5_1;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        const float m = mf_fp16_to_fp32(x[ib].m);
        float *yb = y + ib * QK5_1;
#if defined(MF_Q_AVX2)
        __m256i q = _mm256_or_si256(mf_q_nibbles32(x[ib].qs), mf_q_bits32_x10(x[ib].qh));
        mf_q_store_scaled_addsub(q, _mm256_set1_ps(d), _mm256_set1_ps(m), 0, yb);
#else
        const uint32_t qh = mf_le32(x[ib].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1u) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1u) << 4;
            const float p0 = d * (float)((x[ib].qs[j] & 0x0F) | h0);
            const float p1 = d * (float)((x[ib].qs[j] >> 4) | h1);
            yb[j] = p0 != p0 ? p0 : p0 + m;              /* NaN: the product's, as NumPy */
            yb[j + QK5_1 / 2] = p1 != p1 ? p1 : p1 + m;
        }
#endif
    }
}

static inline void mf_dequantize_row_q8_0(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q8_0 *x = (const block_q8_0 *)vx;   /* [n / 32] */
    const ptrdiff_t nb = n / QK8_0;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        float *yb = y + ib * QK8_0;
#if defined(MF_Q_AVX2)
        mf_q_store_scaled(mf_q_loadu256(x[ib].qs), _mm256_set1_ps(d), yb);
#else
        for (int j = 0; j < QK8_0; j++)
            yb[j] = d * (float)x[ib].qs[j];
#endif
    }
}

static inline void mf_dequantize_row_q4_K(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q4_K *x = (const block_q4_K *)vx;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        float dsc[8], dm[8];
        mf_kquant_scales(x[ib].scales, x[ib].d, x[ib].dmin, dsc, dm);
        float *yb = y + ib * QK_K;
        for (int c = 0; c < 4; c++) {                /* chunk c: sub-blocks 2c (low), 2c+1 (high) */
            const uint8_t *q = x[ib].qs + 32 * c;
            const float d1 = dsc[2 * c], m1 = dm[2 * c], d2 = dsc[2 * c + 1], m2 = dm[2 * c + 1];
            float *y1 = yb + 64 * c, *y2 = yb + 64 * c + 32;
#if defined(MF_Q_AVX2)
            const __m256i m4 = _mm256_set1_epi8(0x0F), v = mf_q_loadu256(q);
            mf_q_store_scaled_addsub(_mm256_and_si256(v, m4), _mm256_set1_ps(d1),
                                     _mm256_set1_ps(m1), 1, y1);
            mf_q_store_scaled_addsub(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                     _mm256_set1_ps(d2), _mm256_set1_ps(m2), 1, y2);
#else
            for (int l = 0; l < 32; l++) {
                y1[l] = d1 * (float)(q[l] & 0x0F) - m1;
                y2[l] = d2 * (float)(q[l] >> 4) - m2;
            }
#endif
        }
    }
}

static inline void mf_dequantize_row_q5_K(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q5_K *x = (const block_q5_K *)vx;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        float dsc[8], dm[8];
        mf_kquant_scales(x[ib].scales, x[ib].d, x[ib].dmin, dsc, dm);
        float *yb = y + ib * QK_K;
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = x[ib].qs + 32 * c;
            const uint8_t *qh = x[ib].qh;
            const float d1 = dsc[2 * c], m1 = dm[2 * c], d2 = dsc[2 * c + 1], m2 = dm[2 * c + 1];
            float *y1 = yb + 64 * c, *y2 = yb + 64 * c + 32;
#if defined(MF_Q_AVX2)
            const __m256i m4 = _mm256_set1_epi8(0x0F), x10 = _mm256_set1_epi8(0x10);
            const __m256i b1 = _mm256_set1_epi8((char)(1 << (2 * c)));
            const __m256i b2 = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
            const __m256i v = mf_q_loadu256(q), hv = mf_q_loadu256(qh);
            __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, b1), b1), x10);
            __m256i h2 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, b2), b2), x10);
            mf_q_store_scaled_addsub(_mm256_or_si256(_mm256_and_si256(v, m4), h1),
                                     _mm256_set1_ps(d1), _mm256_set1_ps(m1), 1, y1);
            mf_q_store_scaled_addsub(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), h2),
                                     _mm256_set1_ps(d2), _mm256_set1_ps(m2), 1, y2);
#else
            for (int l = 0; l < 32; l++) {
                const int h1 = ((qh[l] >> (2 * c)) & 1) << 4;
                const int h2 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
                y1[l] = d1 * (float)((q[l] & 0x0F) | h1) - m1;
                y2[l] = d2 * (float)((q[l] >> 4) | h2) - m2;
            }
#endif
        }
    }
}

static inline void mf_dequantize_row_q6_K(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q6_K *x = (const block_q6_K *)vx;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        float ds[16];                                /* d * scale of each sub-block of 16: exact */
        for (int j = 0; j < 16; j++)
            ds[j] = d * (float)x[ib].scales[j];
#if defined(MF_Q_AVX2)
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            mf_q6k_codes(&x[ib], h, q);
            for (int k = 0; k < 4; k++)                /* q[k]: sub-blocks 8h+2k, 8h+2k+1 */
                mf_q_store_scaled2(_mm256_sub_epi8(q[k], _mm256_set1_epi8(32)),
                                   _mm256_set1_ps(ds[8 * h + 2 * k]),
                                   _mm256_set1_ps(ds[8 * h + 2 * k + 1]),
                                   y + ib * QK_K + 128 * h + 32 * k);
        }
#else
        uint8_t codes[256];
        mf_q6k_codes_all(&x[ib], codes);
        for (int j = 0; j < 16; j++)                 /* sub-blocks of 16 */
            for (int l = 0; l < 16; l++)
                y[ib * QK_K + 16 * j + l] = ds[j] * (float)(codes[16 * j + l] - 32);
#endif
    }
}

static inline void mf_dequantize_row_q2_K(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q2_K *x = (const block_q2_K *)vx;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d), dmin = mf_fp16_to_fp32(x[ib].dmin);
        float dl[16], ml[16];                        /* d * sc, dmin * m: exact */
        for (int j = 0; j < 16; j++) {
            dl[j] = d * (float)(x[ib].scales[j] & 0x0F);
            ml[j] = dmin * (float)(x[ib].scales[j] >> 4);
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = x[ib].qs + 32 * h;
            for (int k = 0; k < 4; k++) {            /* weights 128h + 32k + l: sub-blocks j, j+1 */
                const int j = 8 * h + 2 * k;
                float *yk = y + ib * QK_K + 128 * h + 32 * k;
#if defined(MF_Q_AVX2)
                const __m256i c = _mm256_and_si256(_mm256_srli_epi16(mf_q_loadu256(q), 2 * k),
                                                   _mm256_set1_epi8(3));
                mf_q_store_scaled_sub2(c, _mm256_set1_ps(dl[j]), _mm256_set1_ps(ml[j]),
                                       _mm256_set1_ps(dl[j + 1]), _mm256_set1_ps(ml[j + 1]), yk);
#else
                for (int l = 0; l < 32; l++) {
                    const int jj = j + l / 16;
                    yk[l] = dl[jj] * (float)((q[l] >> (2 * k)) & 3) - ml[jj];
                }
#endif
            }
        }
    }
}

static inline void mf_dequantize_row_q3_K(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                          ptrdiff_t n)
{
    const block_q3_K *x = (const block_q3_K *)vx;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        uint8_t sc[16];
        float dl[16];                                /* d * (sc - 32): exact */
        mf_q3k_scales(x[ib].scales, sc);
        for (int j = 0; j < 16; j++)
            dl[j] = d * (float)((int)sc[j] - 32);
#if defined(MF_Q_AVX2)
        const __m256i hm = mf_q_loadu256(x[ib].hmask);
#endif
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = x[ib].qs + 32 * h;
            for (int k = 0; k < 4; k++) {            /* weights 32 (4h + k) + l */
                const int j = 8 * h + 2 * k, bit = 4 * h + k;
                float *yk = y + ib * QK_K + 128 * h + 32 * k;
#if defined(MF_Q_AVX2)
                /* code - 4 + 4 h: the low bits, minus 4 where the hmask bit is clear */
                const __m256i b = _mm256_set1_epi8((char)(1 << bit));
                const __m256i c = _mm256_and_si256(_mm256_srli_epi16(mf_q_loadu256(q), 2 * k),
                                                   _mm256_set1_epi8(3));
                const __m256i off = _mm256_andnot_si256(
                    _mm256_cmpeq_epi8(_mm256_and_si256(hm, b), b), _mm256_set1_epi8(4));
                mf_q_store_scaled2(_mm256_sub_epi8(c, off), _mm256_set1_ps(dl[j]),
                                   _mm256_set1_ps(dl[j + 1]), yk);
#else
                for (int l = 0; l < 32; l++) {
                    const int c = ((q[l] >> (2 * k)) & 3) - ((x[ib].hmask[l] >> bit) & 1 ? 0 : 4);
                    yk[l] = dl[j + l / 16] * (float)c;
                }
#endif
            }
        }
    }
}

static inline void mf_dequantize_row_iq4_nl(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                            ptrdiff_t n)
{
    const block_iq4_nl *x = (const block_iq4_nl *)vx;   /* [n / 32] */
    const ptrdiff_t nb = n / QK4_NL;
#if defined(MF_Q_AVX2)
    const __m256i kv = mf_q_kvalues256();
#endif
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        float *yb = y + ib * QK4_NL;
#if defined(MF_Q_AVX2)
        mf_q_store_scaled(_mm256_shuffle_epi8(kv, mf_q_nibbles32(x[ib].qs)), _mm256_set1_ps(d), yb);
#else
        for (int j = 0; j < QK4_NL / 2; j++) {
            yb[j] = d * (float)mf_kvalues_iq4nl[x[ib].qs[j] & 0x0F];
            yb[j + QK4_NL / 2] = d * (float)mf_kvalues_iq4nl[x[ib].qs[j] >> 4];
        }
#endif
    }
}

static inline void mf_dequantize_row_iq4_xs(const void *MF_RESTRICT vx, float *MF_RESTRICT y,
                                            ptrdiff_t n)
{
    const block_iq4_xs *x = (const block_iq4_xs *)vx;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_Q_AVX2)
    const __m256i kv = mf_q_kvalues256();
#endif
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_fp16_to_fp32(x[ib].d);
        for (int j = 0; j < QK_K / 32; j++) {        /* sub-blocks of 32 */
            const float dl = d * (float)(mf_iq4xs_scale(x[ib].scales_l, x[ib].scales_h, j) - 32);
            const uint8_t *qs = x[ib].qs + 16 * j;
            float *yj = y + ib * QK_K + 32 * j;
#if defined(MF_Q_AVX2)
            mf_q_store_scaled(_mm256_shuffle_epi8(kv, mf_q_nibbles32(qs)), _mm256_set1_ps(dl), yj);
#else
            for (int l = 0; l < 16; l++) {
                yj[l] = dl * (float)mf_kvalues_iq4nl[qs[l] & 0x0F];
                yj[l + 16] = dl * (float)mf_kvalues_iq4nl[qs[l] >> 4];
            }
#endif
        }
    }
}

#endif /* MEGAFUSE_MF_DEQUANT_H */
