/*
 * mf_act_quant.h -- the activation quantizers of the int8 path: a float32 row x[n] -> a Q8_0
 * activation row (mf_quantize_row_q8_0_act: GGML's quantize_row_q8_0_ref, stored in the layout of
 * mf_act_layout.h) for the 32-weight formats, -> Q8_K blocks (mf_quantize_row_q8_K, GGML's
 * quantize_row_q8_K_ref) for the K-quants.
 *
 * On finite data the codes and scales are GGML's reference functions exactly.  A block that holds
 * NaN or Inf gets d = NaN and all codes 0 (it dequantizes to NaN, so non-finite activations
 * propagate).  Codes lie in [-127, 127] (never -128): the precondition of the int8 dots of
 * mf_dot_q8.h.
 *
 * Blocks too small for their inverse scale: no float -> int conversion here sees an out-of-range
 * value, so every level on every platform gives the same bytes.
 * - Q8_0: where 1 / d overflows (0 < max |x| < 127 / FLT_MAX, about 3.7e-37) id = 0, so the
 *   codes are 0 (GGML converts roundf(x * inf) to int8 there: undefined in C; x86's scalar
 *   conversion gives 0, its vector one -128, aarch64 saturates).  d is 0 in fp16 either way.
 * - Q8_K: where iscale = -127 / max overflows (0 < |max| < 127 / FLT_MAX) the codes and bsums are
 *   0 and d = 1 / iscale = -+0: GGML's bits, since its nearest_int(+-inf) = -2^22 stored as int8
 *   is 0 (the vector packs would saturate it to -128).
 *
 * Depends on: mf_act_layout.h (the Q8_0 activation row), mf_quant_common.h (mf_mul_nc,
 * mf_round_away, mf_nearest_int, mf_imin), ggml_blocks.h (block_q8_K, fp16 conversion).
 */
#ifndef MEGAFUSE_MF_ACT_QUANT_H
#define MEGAFUSE_MF_ACT_QUANT_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"
#include "mf_act_layout.h"
#include "mf_quant_common.h"

/* ============================================================================================ */
/* Activation quantizers (the int8 path)                                                        */
/* ============================================================================================ */

#if defined(MF_Q_AVX2)
/* The AVX2 bodies below do, lane by lane, the scalar bodies' float operations (a product never
 * fused, the same adds, truncation as the C cast), so they give the same bytes. */

/* |x| of 8 floats, and whether any is NaN or Inf (as integers: |x| bits > FLT_MAX's). */
static inline __m256 mf_q_abs8(__m256 v, __m256i *nonfinite)
{
    const __m256i bits = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff));
    *nonfinite = _mm256_or_si256(*nonfinite, _mm256_cmpgt_epi32(bits, _mm256_set1_epi32(0x7f7fffff)));
    return _mm256_castsi256_ps(bits);
}

/* The largest of 8 non-NaN floats. */
static inline float mf_q_hmax8(__m256 m)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 0x55));
    return _mm_cvtss_f32(h);
}

/* 4 x 8 int32 in [-128, 127] -> 32 int8 in order. */
static inline __m256i mf_q_pack32_epi8(__m256i q0, __m256i q1, __m256i q2, __m256i q3)
{
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

/* The bytes of a Q8_0 activation row of n values that belong to no block of x: the zero blocks
 * nb .. 4ng-1 (codes 0, d = s = 0) and the zeros up to the row's 64-byte end.  Touches no byte of
 * blocks 0 .. nb-1, so it may run before, after or beside mf_quantize_blocks_q8_0_act. */
static inline void mf_q8_0_act_pad(void *va, ptrdiff_t n)
{
    const ptrdiff_t nb = n / QK8_0;
    const size_t ng = mf_act_q8_0_groups((size_t)n);
    int8_t *codes = (int8_t *)va;                                         /* [ng][2][64] */
    float *f = (float *)(void *)((char *)va + ng * MF_ACT_GROUP_CODE_BYTES);  /* [ng][4][2] */
    const size_t used = ng * (MF_ACT_GROUP_CODE_BYTES + MF_ACT_GROUP_F_FLOATS * sizeof(float));
    for (size_t k = (size_t)nb; k < ng * MF_ACT_GROUP_BLOCKS; k++) {     /* zero blocks */
        int8_t *lo = codes + (k >> 1) * 64 + (k & 1) * 16;
        memset(lo, 0, 16);
        memset(lo + 32, 0, 16);
        f[k / 4 * 8 + mf_act_q8_0_f_slot(k % 4)] = f[k / 4 * 8 + mf_act_q8_0_f_slot(k % 4) + 1] = 0.0f;
    }
    memset((char *)va + used, 0, mf_act_q8_0_row_bytes((size_t)n) - used);
}

/* Blocks b0 .. b1-1 (of n / 32) of the Q8_0 activation row of x[n]: their codes and [d, s] only,
 * each block from its own 32 values (see mf_quantize_row_q8_0_act), so that a row may be
 * quantized piece by piece, by different threads, into the same bytes as in one call. */
static inline void mf_quantize_blocks_q8_0_act(const float *MF_RESTRICT x, void *MF_RESTRICT va,
                                               ptrdiff_t n, ptrdiff_t b0, ptrdiff_t b1)
{
    const size_t ng = mf_act_q8_0_groups((size_t)n);
    int8_t *codes = (int8_t *)va;                                         /* [ng][2][64] */
    float *f = (float *)(void *)((char *)va + ng * MF_ACT_GROUP_CODE_BYTES);  /* [ng][4][2] */
    for (ptrdiff_t ib = b0; ib < b1; ib++) {
        const float *xb = x + ib * QK8_0;
        /* block ib = 4g + 2p + h: lo half at pair offset 16h, hi half at 32 + 16h */
        int8_t *lo = codes + (ib >> 1) * 64 + (ib & 1) * 16, *hi = lo + 32;
        float *fb = f + ib / 4 * 8 + mf_act_q8_0_f_slot((size_t)(ib % 4));      /* [d, s] */
        float amax = 0.0f;
        int finite = 1;
#if defined(MF_Q_AVX2)
        __m256 v[4], m = _mm256_setzero_ps();
        __m256i bad = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            m = _mm256_max_ps(m, mf_q_abs8(v[k], &bad));
        }
        finite = _mm256_testz_si256(bad, bad);
        if (finite)
            amax = mf_q_hmax8(m);
#else
        for (int j = 0; j < QK8_0; j++) {
            const float a = fabsf(xb[j]);
            finite &= a <= FLT_MAX;
            amax = a > amax ? a : amax;
        }
#endif
        if (!finite) {
            memset(lo, 0, 16);
            memset(hi, 0, 16);
            fb[0] = fb[1] = mf_bits_f32(MF_F32_DEFAULT_NAN_BITS);
            continue;
        }
        const float d = amax / 127.0f, inv = 1.0f / d;
        const float id = d != 0.0f && inv <= FLT_MAX ? inv : 0.0f;     /* |x * id| <= 127 */
        int sum = 0;
#if defined(MF_Q_AVX2)
        {
            const __m256 idv = _mm256_set1_ps(id), half = _mm256_set1_ps(0.4999999701976776f);
            const __m256 sign = _mm256_set1_ps(-0.0f);
            __m256i q[4];
            for (int k = 0; k < 4; k++) {                  /* mf_round_away(mf_mul_nc(x, id)) */
                const __m256 p = _mm256_mul_ps(v[k], idv);
                q[k] = _mm256_cvttps_epi32(_mm256_add_ps(p, _mm256_or_ps(_mm256_and_ps(p, sign), half)));
            }
            const __m256i t = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
            sum = _mm_cvtsi128_si32(h);
            const __m256i b = mf_q_pack32_epi8(q[0], q[1], q[2], q[3]);
            _mm_storeu_si128((__m128i *)(void *)lo, _mm256_castsi256_si128(b));
            _mm_storeu_si128((__m128i *)(void *)hi, _mm256_extracti128_si256(b, 1));
        }
#else
        for (int j = 0; j < QK8_0; j++) {
            const int q = (int)mf_round_away(mf_mul_nc(xb[j], id));
            if (j < 16)
                lo[j] = (int8_t)q;
            else
                hi[j - 16] = (int8_t)q;
            sum += q;
        }
#endif
        const float d16 = mf_fp16_to_fp32(mf_fp32_to_fp16(d));
        fb[0] = d16;
        fb[1] = d16 * (float)sum;                          /* exact */
    }
}

/* x[n] -> a Q8_0 activation row (mf_act_layout.h; mf_act_q8_0_row_bytes(n) bytes, all written).
 * Per block of 32, GGML's quantize_row_q8_0_ref: amax = max |x|, d = amax / 127, id = 1/d (0 when
 * d = 0 or 1/d overflows), q = roundf(x * id); d rounded to fp16, then stored as float with s = d * sum(q).
 * A block holding NaN or Inf: d = s = NaN, q = 0. */
static inline void mf_quantize_row_q8_0_act(const float *MF_RESTRICT x, void *MF_RESTRICT va,
                                            ptrdiff_t n)
{
    mf_q8_0_act_pad(va, n);
    mf_quantize_blocks_q8_0_act(x, va, n, 0, n / QK8_0);
}

/* x[n] -> Q8_K blocks: GGML's quantize_row_q8_K_ref.  Per block of 256: max = the value of the
 * largest |x| (first occurrence, sign kept); max == 0: d = 0, q = 0; -127 / max overflowing:
 * d = 1 / iscale = -+0, q = 0; else iscale = -127 / max,
 * q = min(127, nearest_int(iscale * x)), d = 1 / iscale (float32).  bsums[16] = sums of q over 16.
 * A block holding NaN or Inf: d = NaN, q = 0, bsums = 0. */
static inline void mf_quantize_row_q8_K(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q8_K *y = (block_q8_K *)vy;               /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float *xb = x + ib * QK_K;
        float amax = 0.0f, max = 0.0f;
        int finite = 1;
#if defined(MF_Q_AVX2)
        {
            __m256 m = _mm256_setzero_ps();
            __m256i bad = _mm256_setzero_si256();
            for (int k = 0; k < QK_K / 8; k++)
                m = _mm256_max_ps(m, mf_q_abs8(_mm256_loadu_ps(xb + 8 * k), &bad));
            finite = _mm256_testz_si256(bad, bad);
            if (finite) {
                amax = mf_q_hmax8(m);
                const __m256 am = _mm256_set1_ps(amax);    /* max: the first x with |x| = amax */
                for (int k = 0; k < QK_K / 8; k++) {
                    const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(xb + 8 * k));
                    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(a, am, _CMP_EQ_OQ));
                    if (hit) {
                        max = xb[8 * k + mf_ctz32((uint32_t)hit)];
                        break;
                    }
                }
            }
        }
#else
        for (int j = 0; j < QK_K; j++) {
            const float a = fabsf(xb[j]);
            finite &= a <= FLT_MAX;
            if (a > amax) {
                amax = a;
                max = xb[j];
            }
        }
#endif
        const float iscale = -127.0f / max;      /* -+Inf when amax == 0 or amax < 127 / FLT_MAX */
        if (!finite || !(fabsf(iscale) <= FLT_MAX)) {
            y[ib].d = !finite ? mf_bits_f32(MF_F32_DEFAULT_NAN_BITS)
                    : amax == 0.0f ? 0.0f : 1.0f / iscale;                  /* tiny: -+0 */
            memset(y[ib].qs, 0, QK_K);
            memset(y[ib].bsums, 0, sizeof y[ib].bsums);
            continue;
        }
#if defined(MF_Q_AVX2)
        {
            const __m256 isv = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f);
            const __m256i m23 = _mm256_set1_epi32(0x007fffff), b22 = _mm256_set1_epi32(0x00400000);
            const __m256i c127 = _mm256_set1_epi32(127);
            for (int k = 0; k < QK_K / 32; k++) {          /* min(127, mf_nearest_int(...)) */
                __m256i q[4];
                for (int l = 0; l < 4; l++) {
                    const __m256 val = _mm256_add_ps(_mm256_mul_ps(isv, _mm256_loadu_ps(xb + 32 * k + 8 * l)), magic);
                    q[l] = _mm256_min_epi32(c127, _mm256_sub_epi32(
                        _mm256_and_si256(_mm256_castps_si256(val), m23), b22));
                }
                _mm256_storeu_si256((__m256i *)(void *)(y[ib].qs + 32 * k),
                                    mf_q_pack32_epi8(q[0], q[1], q[2], q[3]));
            }
        }
#else
        for (int j = 0; j < QK_K; j++)
            y[ib].qs[j] = (int8_t)mf_imin(127, mf_nearest_int(mf_mul_nc(iscale, xb[j])));
#endif
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y[ib].qs[16 * g + l];
            y[ib].bsums[g] = (int16_t)sum;
        }
        y[ib].d = 1.0f / iscale;
    }
}

#endif /* MEGAFUSE_MF_ACT_QUANT_H */
