/*
 * mf_weight_quant.h -- the weight quantizers: mf_quantize_row_<dt>(const float *x, void *w, n),
 * a float32 row x[n] -> one weight row of dt (ck_dtype_row_bytes(dt, n) bytes at w), for
 * dt = FP32, FP16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL,
 * IQ4_XS.
 *
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 give the bytes of gguf.quants.quantize (the NumPy port of GGML's
 * quantize_row_*_ref; on finite data that is GGML's output too), including what NumPy does on
 * x86-64 where only non-finite or subnormal blocks go: its float -> uint8/int8 cast (NaN/Inf -> 0,
 * others modulo 256) and its max/min reductions (any NaN -> the default NaN).  Those are written
 * out here (mf_np_cast_u8), so the bytes are x86-64's on every platform.  FP16 is NumPy's
 * float16 cast (round to nearest even), BF16 gguf's / GGML's rounding.  Q4_K, Q5_K, Q6_K follow
 * GGML's quantize_row_q{4,5,6}_K_ref (make_qkx2_quants / make_qx_quants) with every float
 * operation of the C source rounded as written (no fused multiply-add: see MF_OPT_BARRIER in
 * mf_quant_common.h); Q2_K and Q3_K likewise GGML's quantize_row_q{2,3}_K_ref, IQ4_NL and IQ4_XS
 * GGML's quantize_iq4_nl / quantize_iq4_xs without an importance matrix (what
 * ggml_quantize_chunk runs for them; not quantize_row_iq4_nl_ref, which tries fewer scales).
 * The same bytes at every SIMD level.
 *
 * Depends on: mf_quant_common.h (mf_mul_nc, mf_nearest_int, mf_imin / mf_imax, mf_le32, levels),
 * ggml_blocks.h (block structs, fp16 / bf16 conversions, MF_F32_DEFAULT_NAN_BITS).
 */
#ifndef MEGAFUSE_MF_WEIGHT_QUANT_H
#define MEGAFUSE_MF_WEIGHT_QUANT_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"
#include "mf_quant_common.h"

#define MF_GROUP_MAX_EPS 1e-15f            /* GGML's GROUP_MAX_EPS */

/* ============================================================================================ */
/* FP16, BF16, FP32 rows                                                                        */
/* ============================================================================================ */

/* fp16 bits of x[n] (NumPy's float16 cast). */
static inline void mf_quantize_row_fp16(const float *MF_RESTRICT x, void *MF_RESTRICT vh,
                                        ptrdiff_t n)
{
    mf_fp16_t *h = (mf_fp16_t *)vh;
    ptrdiff_t i = 0;
#if defined(MF_Q_F16C)
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            for (int k = 0; k < 8; k++)          /* NaN payloads: the scalar (NumPy) rule */
                h[i + k] = mf_fp32_to_fp16(x[i + k]);
        } else {
            _mm_storeu_si128((__m128i *)(void *)(h + i),
                             _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
    }
#endif
    for (; i < n; i++)
        h[i] = mf_fp32_to_fp16(x[i]);
}

static inline void mf_quantize_row_bf16(const float *MF_RESTRICT x, void *MF_RESTRICT vh,
                                        ptrdiff_t n)
{
    mf_bf16_t *h = (mf_bf16_t *)vh;
    for (ptrdiff_t i = 0; i < n; i++)
        h[i] = mf_fp32_to_bf16(x[i]);
}

static inline void mf_quantize_row_fp32(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    memcpy(vy, x, (size_t)n * sizeof(float));
}

/* ============================================================================================ */
/* NumPy's float -> integer casts on x86-64 (where gguf's quantizers rely on them)              */
/* ============================================================================================ */

/* NumPy's float32 -> uint8 cast on x86-64 (cvttss2si, then the low byte): NaN, +-Inf and
 * |v| >= 2^31 give 0, anything else its truncation modulo 256. */
static inline uint8_t mf_np_cast_u8(float v)
{
    if (!(fabsf(v) < 2147483648.0f))
        return 0;
    return (uint8_t)(uint32_t)(int32_t)v;
}

/* An int as int8 modulo 256 (what C does on every platform megafuse builds for). */
static inline int8_t mf_wrap_i8(int v)
{
    return (int8_t)(uint8_t)((unsigned)v & 0xffu);
}

/* ============================================================================================ */
/* Weight quantizers, 32-weight formats: gguf.quants.quantize bit for bit                       */
/* ============================================================================================ */

/* NumPy's argmax of |x|: the first largest; a NaN counts as largest (the first NaN wins). */
static inline int mf_np_argmax_abs(const float *x, int n)
{
    int best = 0;
    float amax = fabsf(x[0]);
    if (amax != amax)
        return 0;
    for (int j = 1; j < n; j++) {
        const float a = fabsf(x[j]);
        if (a != a)
            return j;
        if (a > amax) {
            amax = a;
            best = j;
        }
    }
    return best;
}

/* NumPy's max / min along a 32-wide axis: its SIMD reduction returns the default NaN
 * (MF_F32_DEFAULT_NAN_BITS, whatever the sign or payload of the NaN it met) when any element
 * is NaN. */
static inline void mf_np_min_max(const float *x, int n, float *mn, float *mx)
{
    float lo = x[0], hi = x[0];
    for (int j = 0; j < n; j++) {
        if (x[j] != x[j]) {
            *mn = *mx = mf_bits_f32(MF_F32_DEFAULT_NAN_BITS);
            return;
        }
        if (x[j] < lo)
            lo = x[j];
        if (x[j] > hi)
            hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

/* Symmetric 4/5-bit: d = max / -(2^(bits-1)), q = min(top, u8(x * id + offset)). */
static inline void mf_q_sym_codes(const float *xb, float div, float offset, int top,
                                  float *d_out, uint8_t q[32])
{
    const float max = xb[mf_np_argmax_abs(xb, 32)];
    const float d = max / div;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++)
        q[j] = (uint8_t)mf_imin(top, mf_np_cast_u8(mf_mul_nc(xb[j], id) + offset));
    *d_out = d;
}

/* Asymmetric 4/5-bit: d = (max - min) / top, q = min(top, u8((x - min) * id + 0.5)). */
static inline void mf_q_asym_codes(const float *xb, int top, float *d_out, float *min_out,
                                   uint8_t q[32])
{
    float min, max;
    mf_np_min_max(xb, 32, &min, &max);
    const float d = (max - min) / (float)top;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++)
        q[j] = (uint8_t)mf_imin(top, mf_np_cast_u8(mf_mul_nc(xb[j] - min, id) + 0.5f));
    *d_out = d;
    *min_out = min;
}

static inline void mf_q_pack_qh(const uint8_t q[32], uint8_t qh[4])
{
    uint32_t h = 0;
    for (int j = 0; j < 32; j++)
        h |= (uint32_t)((q[j] >> 4) & 1u) << j;
    qh[0] = (uint8_t)h;
    qh[1] = (uint8_t)(h >> 8);
    qh[2] = (uint8_t)(h >> 16);
    qh[3] = (uint8_t)(h >> 24);
}

static inline void mf_quantize_row_q4_0(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q4_0 *y = (block_q4_0 *)vy;               /* [n / 32] */
    for (ptrdiff_t ib = 0; ib < n / QK4_0; ib++) {
        uint8_t q[32];
        float d;
        mf_q_sym_codes(x + ib * QK4_0, -8.0f, 8.5f, 15, &d, q);
        y[ib].d = mf_fp32_to_fp16(d);
        for (int j = 0; j < 16; j++)
            y[ib].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

static inline void mf_quantize_row_q4_1(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q4_1 *y = (block_q4_1 *)vy;               /* [n / 32] */
    for (ptrdiff_t ib = 0; ib < n / QK4_1; ib++) {
        uint8_t q[32];
        float d, min;
        mf_q_asym_codes(x + ib * QK4_1, 15, &d, &min, q);
        y[ib].d = mf_fp32_to_fp16(d);
        y[ib].m = mf_fp32_to_fp16(min);
        for (int j = 0; j < 16; j++)
            y[ib].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

static inline void mf_quantize_row_q5_0(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q5_0 *y = (block_q5_0 *)vy;               /* [n / 32] */
    for (ptrdiff_t ib = 0; ib < n / QK5_0; ib++) {
        uint8_t q[32];
        float d;
        mf_q_sym_codes(x + ib * QK5_0, -16.0f, 16.5f, 31, &d, q);
        y[ib].d = mf_fp32_to_fp16(d);
        mf_q_pack_qh(q, y[ib].qh);
        for (int j = 0; j < 16; j++)
            y[ib].qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    }
}

static inline void mf_quantize_row_q5_1(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q5_1 *y = (block_q5_1 *)vy;               /* [n / 32] */
    for (ptrdiff_t ib = 0; ib < n / QK5_1; ib++) {
        uint8_t q[32];
        float d, min;
        mf_q_asym_codes(x + ib * QK5_1, 31, &d, &min, q);
        y[ib].d = mf_fp32_to_fp16(d);
        y[ib].m = mf_fp32_to_fp16(min);
        mf_q_pack_qh(q, y[ib].qh);
        for (int j = 0; j < 16; j++)
            y[ib].qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    }
}

/* Q8_0 weights: d = max|x| / 127 (NaN if any NaN), q = int8(roundf(x * id)) with NumPy's cast
 * (a NaN or infinite product gives 0).  Equal to GGML's quantize_row_q8_0_ref on finite data. */
static inline void mf_quantize_row_q8_0(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q8_0 *y = (block_q8_0 *)vy;               /* [n / 32] */
    for (ptrdiff_t ib = 0; ib < n / QK8_0; ib++) {
        const float *xb = x + ib * QK8_0;
        float amax = fabsf(xb[mf_np_argmax_abs(xb, QK8_0)]);
        if (amax != amax)
            amax = mf_bits_f32(MF_F32_DEFAULT_NAN_BITS);   /* NumPy's max: the default NaN */
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = mf_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) {
            const float v = xb[j] * id;
            const float r = fabsf(v) <= FLT_MAX ? roundf(v) : v;   /* np_roundf(inf) is NaN */
            y[ib].qs[j] = (int8_t)mf_np_cast_u8(r);
        }
    }
}

/* ============================================================================================ */
/* Weight quantizers, K-quants: GGML's quantize_row_q{4,5,6}_K_ref, every float operation of     */
/* the C source rounded as written (products through mf_mul_nc: never fused into an add).        */
/* ============================================================================================ */

/* GGML's make_qkx2_quants: codes L[n] in 0..nmax and (scale, -min) minimising the weighted
 * error of scale * L + min over a grid of nstep+1 trial scales. */
static inline float mf_make_qkx2_quants(int n, int nmax, const float *x, const float *weights,
                                        uint8_t *L, float *the_min, uint8_t *Laux, float rmin,
                                        float rdelta, int nstep, int use_mad)
{
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = mf_mul_nc(sum_w, x[0]);
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += mf_mul_nc(w, x[i]);
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = mf_nearest_int(mf_mul_nc(iscale, x[i] - min));
        L[i] = (uint8_t)mf_imax(0, mf_imin(nmax, l));
        float diff = mf_mul_nc(scale, (float)L[i]) + min - x[i];
        diff = use_mad ? fabsf(diff) : mf_mul_nc(diff, diff);
        best_error += mf_mul_nc(weights[i], diff);
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + mf_mul_nc(rdelta, (float)is) + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = mf_nearest_int(mf_mul_nc(iscale, x[i] - min));
            l = mf_imax(0, mf_imin(nmax, l));
            Laux[i] = (uint8_t)l;
            const float wl = mf_mul_nc(weights[i], (float)l);
            sum_l += wl;
            sum_l2 += mf_mul_nc(wl, (float)l);
            sum_xl += mf_mul_nc(wl, x[i]);
        }
        const float D = mf_mul_nc(sum_w, sum_l2) - mf_mul_nc(sum_l, sum_l);
        if (D > 0) {
            float this_scale = (mf_mul_nc(sum_w, sum_xl) - mf_mul_nc(sum_x, sum_l)) / D;
            float this_min = (mf_mul_nc(sum_l2, sum_x) - mf_mul_nc(sum_l, sum_xl)) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = mf_mul_nc(this_scale, (float)Laux[i]) + this_min - x[i];
                diff = use_mad ? fabsf(diff) : mf_mul_nc(diff, diff);
                cur_error += mf_mul_nc(weights[i], diff);
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* GGML's make_qx_quants with rmse_type = 1 and no importance weights (w = x^2): codes
 * L[n] = l + nmax, l in [-nmax, nmax-1], and the scale, best of 19 trial scales. */
static inline float mf_make_qx_quants_rmse1(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < MF_GROUP_MAX_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = mf_nearest_int(mf_mul_nc(iscale, x[i]));
        l = mf_imax(-nmax, mf_imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = mf_mul_nc(x[i], x[i]);
        sumlx += mf_mul_nc(mf_mul_nc(w, x[i]), (float)l);
        suml2 += mf_mul_nc(mf_mul_nc(w, (float)l), (float)l);
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = mf_mul_nc(scale, sumlx);
    for (int is = -9; is <= 9; ++is) {
        if (is == 0)
            continue;
        iscale = -((float)nmax + mf_mul_nc(0.1f, (float)is)) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = mf_nearest_int(mf_mul_nc(iscale, x[i]));
            l = mf_imax(-nmax, mf_imin(nmax - 1, l));
            const float w = mf_mul_nc(x[i], x[i]);
            sumlx += mf_mul_nc(mf_mul_nc(w, x[i]), (float)l);
            suml2 += mf_mul_nc(mf_mul_nc(w, (float)l), (float)l);
        }
        if (suml2 > 0 && mf_mul_nc(sumlx, sumlx) > mf_mul_nc(best, suml2)) {
            for (int i = 0; i < n; ++i) {
                const int l = mf_nearest_int(mf_mul_nc(iscale, x[i]));
                L[i] = (int8_t)(nmax + mf_imax(-nmax, mf_imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = mf_mul_nc(scale, sumlx);
        }
    }
    return scale;
}

/* The common part of Q4_K and Q5_K: per sub-block of 32, make_qkx2_quants with weights
 * av_x + |x|; 6-bit scales and mins against the super-block maxima; then the codes L[256]
 * requantized against the stored (fp16-rounded) scales.  Fills d, dmin, scales[12]. */
static inline void mf_q_kquant_scales_codes(const float *x /* [256] */, int nmax, float rmin,
                                            float rdelta, int nstep, mf_fp16_t *d16,
                                            mf_fp16_t *dmin16, uint8_t scales_out[12],
                                            uint8_t L[256])
{
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l)
            sum_x2 += mf_mul_nc(x[32 * j + l], x[32 * j + l]);
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l)
            weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = mf_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                        rmin, rdelta, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = (uint8_t)(unsigned)mf_nearest_int(mf_mul_nc(inv_scale, scales[j]));
        uint8_t lm = (uint8_t)(unsigned)mf_nearest_int(mf_mul_nc(inv_min, mins[j]));
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (uint8_t)((ls & 0x0F) | ((lm & 0x0F) << 4));
            scales_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales_out[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d16 = mf_fp32_to_fp16(max_scale / 63.f);
    *dmin16 = mf_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        mf_get_scale_min_k4(j, scales_out, &sc, &m);
        const float d = mf_fp16_to_fp32(*d16) * (float)sc;
        if (d == 0.0f)
            continue;
        const float dm = mf_fp16_to_fp32(*dmin16) * (float)m;
        for (int ii = 0; ii < 32; ++ii) {
            const int l = mf_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)mf_imax(0, mf_imin(nmax, l));
        }
    }
}

static inline void mf_quantize_row_q4_K(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q4_K *y = (block_q4_K *)vy;               /* [n / 256] */
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        uint8_t L[QK_K];
        mf_fp16_t d, dmin;
        mf_q_kquant_scales_codes(x + ib * QK_K, 15, -1.f, 0.1f, 20, &d, &dmin, y[ib].scales, L);
        y[ib].d = d;
        y[ib].dmin = dmin;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; ++l)
                y[ib].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + l + 32] << 4));
    }
}

static inline void mf_quantize_row_q5_K(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q5_K *y = (block_q5_K *)vy;               /* [n / 256] */
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        uint8_t L[QK_K];
        mf_fp16_t d, dmin;
        mf_q_kquant_scales_codes(x + ib * QK_K, 31, -0.5f, 0.1f, 15, &d, &dmin, y[ib].scales, L);
        y[ib].d = d;
        y[ib].dmin = dmin;
        memset(y[ib].qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int c = 0; c < 4; c++) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[64 * c + j], l2 = L[64 * c + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    y[ib].qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    y[ib].qh[j] |= m2;
                }
                y[ib].qs[32 * c + j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

static inline void mf_quantize_row_q6_K(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q6_K *y = (block_q6_K *)vy;               /* [n / 256] */
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        int8_t L[QK_K];
        float scales[QK_K / 16];
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            const float scale = mf_make_qx_quants_rmse1(16, 32, xb + 16 * j, L + 16 * j);
            scales[j] = scale;
            const float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < MF_GROUP_MAX_EPS) {
            memset(&y[ib], 0, sizeof(block_q6_K));
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[ib].d = mf_fp32_to_fp16(1 / iscale);
        for (int j = 0; j < QK_K / 16; ++j)
            y[ib].scales[j] = mf_wrap_i8(mf_imin(127, mf_nearest_int(mf_mul_nc(iscale, scales[j]))));
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = mf_fp16_to_fp32(y[ib].d) * (float)y[ib].scales[j];
            if (d == 0.0f)
                continue;
            for (int ii = 0; ii < 16; ++ii) {
                const int l = mf_nearest_int(xb[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(mf_imax(-32, mf_imin(31, l)) + 32);
            }
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = y[ib].ql + 64 * h, *qh = y[ib].qh + 32 * h;
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = (uint8_t)(Lh[l + 0] & 0xF), q2 = (uint8_t)(Lh[l + 32] & 0xF);
                const uint8_t q3 = (uint8_t)(Lh[l + 64] & 0xF), q4 = (uint8_t)(Lh[l + 96] & 0xF);
                ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)(((Lh[l] >> 4) & 3) | (((Lh[l + 32] >> 4) & 3) << 2) |
                                  (((Lh[l + 64] >> 4) & 3) << 4) | (((Lh[l + 96] >> 4) & 3) << 6));
            }
        }
    }
}

/* ============================================================================================ */
/* Q2_K, Q3_K: GGML's quantize_row_q{2,3}_K_ref, every float operation as the C source writes it */
/* ============================================================================================ */

/* The 2-bit codes of a super-block (L[256]: weight 128h + 32k + l of half h) packed into qs[64]:
 * byte 32h + l holds weights 128h + l, + 32, + 64, + 96 in bits 0-1, 2-3, 4-5, 6-7. */
static inline void mf_q_pack_2bit(const uint8_t *L /* [256] */, uint8_t *qs /* [64] */)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; ++l) {
            const uint8_t *Lh = L + 128 * h;
            qs[32 * h + l] = (uint8_t)(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) |
                                       (Lh[l + 96] << 6));
        }
}

static inline void mf_quantize_row_q2_K(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q2_K *y = (block_q2_K *)vy;               /* [n / 256] */
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        uint8_t L[QK_K], Laux[16];
        float weights[16], mins[16], scales[16];
        float max_scale = 0, max_min = 0;          /* as the min is taken off: scales >= 0 */
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l)
                weights[l] = fabsf(xb[16 * j + l]);
            scales[j] = mf_make_qkx2_quants(16, 3, xb + 16 * j, weights, L + 16 * j, &mins[j],
                                            Laux, -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < 16; ++j)
                y[ib].scales[j] = (uint8_t)(unsigned)mf_nearest_int(mf_mul_nc(iscale, scales[j]));
            y[ib].d = mf_fp32_to_fp16(max_scale / 15.f);
        } else {
            for (int j = 0; j < 16; ++j) y[ib].scales[j] = 0;
            y[ib].d = mf_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < 16; ++j) {
                const int l = mf_nearest_int(mf_mul_nc(iscale, mins[j]));
                y[ib].scales[j] |= (uint8_t)((unsigned)l << 4);
            }
            y[ib].dmin = mf_fp32_to_fp16(max_min / 15.f);
        } else {
            y[ib].dmin = mf_fp32_to_fp16(0.f);
        }
        for (int j = 0; j < 16; ++j) {
            const float d = mf_fp16_to_fp32(y[ib].d) * (float)(y[ib].scales[j] & 0x0F);
            if (d == 0.0f)
                continue;
            const float dm = mf_fp16_to_fp32(y[ib].dmin) * (float)(y[ib].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) {
                const int l = mf_nearest_int((xb[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)mf_imax(0, mf_imin(3, l));
            }
        }
        mf_q_pack_2bit(L, y[ib].qs);
    }
}

/* GGML's make_q3_quants with do_rmse (weights x^2): codes L[n] = l + nmax, l in [-nmax, nmax-1],
 * refined by up to 5 passes of single-code changes that lower the weighted error; the scale. */
static inline float mf_make_q3_quants_rmse(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < MF_GROUP_MAX_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    const float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = mf_nearest_int(mf_mul_nc(iscale, x[i]));
        l = mf_imax(-nmax, mf_imin(nmax - 1, l));
        L[i] = (int8_t)l;
        const float w = mf_mul_nc(x[i], x[i]);
        sumlx += mf_mul_nc(mf_mul_nc(w, x[i]), (float)l);
        suml2 += mf_mul_nc(mf_mul_nc(w, (float)l), (float)l);
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = mf_mul_nc(x[i], x[i]);
            float slx = sumlx - mf_mul_nc(mf_mul_nc(w, x[i]), (float)L[i]);
            if (slx > 0) {
                float sl2 = suml2 - mf_mul_nc(mf_mul_nc(w, (float)L[i]), (float)L[i]);
                int new_l = mf_nearest_int(mf_mul_nc(x[i], sl2) / slx);
                new_l = mf_imax(-nmax, mf_imin(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += mf_mul_nc(mf_mul_nc(w, x[i]), (float)new_l);
                    sl2 += mf_mul_nc(mf_mul_nc(w, (float)new_l), (float)new_l);
                    if (sl2 > 0 && mf_mul_nc(mf_mul_nc(slx, slx), suml2) >
                                   mf_mul_nc(mf_mul_nc(sumlx, sumlx), sl2)) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed)
            break;
    }
    for (int i = 0; i < n; ++i)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static inline void mf_quantize_row_q3_K(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                        ptrdiff_t n)
{
    block_q3_K *y = (block_q3_K *)vy;               /* [n / 256] */
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        int8_t L[QK_K];
        float scales[16];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = mf_make_q3_quants_rmse(16, 4, xb + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[ib].scales, 0, 12);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; ++j) {
                /* the int8 of the rounded value (GGML stores it in an int8_t), then clamped */
                int l = mf_wrap_i8(mf_nearest_int(mf_mul_nc(iscale, scales[j])));
                l = mf_imax(-32, mf_imin(31, l)) + 32;
                if (j < 8)
                    y[ib].scales[j] = (uint8_t)(l & 0xF);
                else
                    y[ib].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[ib].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[ib].d = mf_fp32_to_fp16(1 / iscale);
        } else {
            y[ib].d = mf_fp32_to_fp16(0.f);
        }
        uint8_t sc[16];
        mf_q3k_scales(y[ib].scales, sc);
        for (int j = 0; j < 16; ++j) {
            const float d = mf_fp16_to_fp32(y[ib].d) * (float)((int)sc[j] - 32);
            if (d == 0.0f)
                continue;
            for (int ii = 0; ii < 16; ++ii) {
                const int l = mf_nearest_int(xb[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(mf_imax(-4, mf_imin(3, l)) + 4);
            }
        }
        /* the third bit of weight 32k + l goes to bit k of hmask[l]; L keeps the low 2 bits */
        uint8_t L2[QK_K];
        memset(y[ib].hmask, 0, QK_K / 8);
        for (int j = 0; j < QK_K; ++j) {
            int l = L[j];
            if (l > 3) {
                y[ib].hmask[j % 32] |= (uint8_t)(1u << (j / 32));
                l -= 4;
            }
            L2[j] = (uint8_t)l;
        }
        mf_q_pack_2bit(L2, y[ib].qs);
    }
}

/* ============================================================================================ */
/* IQ4_NL, IQ4_XS: GGML's quantize_iq4_nl / quantize_iq4_xs, no importance matrix (ntry = 7)     */
/* ============================================================================================ */

/* GGML's best_index_int8 over the 16 values of mf_kvalues_iq4nl: the index of the value nearest
 * x (the upper one on a tie); a NaN gives 15, as GGML's bisection ends there.  GGML bisects for
 * the ml with val[ml] <= x < val[ml + 1]; counting the values <= x finds the same ml without
 * branches (the bisection's mispredicted branches were most of the IQ4 quantizers' time), and
 * the same float comparison of the two distances decides. */
static inline int mf_iq4_best_index(float x)
{
    const int8_t *val = mf_kvalues_iq4nl;
    if (x != x) return 15;
    if (x <= (float)val[0]) return 0;
    if (x >= (float)val[15]) return 15;
    int ml = 0;
    for (int k = 1; k < 15; k++)
        ml += x >= (float)val[k];
    return x - (float)val[ml] < (float)val[ml + 1] - x ? ml : ml + 1;
}

/* The scale of one block of 32 (GGML's quantize_row_iq4_nl_impl, weights x^2, ntry = 7): the
 * first fit from d = max / 127, then the best of 15 trial scales (itry - 127) / max; 0 for a
 * block with max |x| < GROUP_MAX_EPS.
 * A block with an Inf, or whose x^2 overflows, can get the NaN of Inf - Inf or Inf / Inf: the
 * CPU's default NaN, whose sign is the platform's (x86-64: set, aarch64: clear).  Where no NaN of
 * the block can have been carried into it, that NaN is written out as x86-64's (0xffc00000), so
 * the bytes are ggml's on x86-64 on every platform (a NaN of the data propagates alike on both). */
static inline float mf_iq4_block_scale(const float *xb /* [32] */)
{
    const int ntry = 7;
    float weight[32];
    float amax = 0, max = 0;
    int has_nan = 0;
    for (int j = 0; j < 32; ++j) {
        weight[j] = mf_mul_nc(xb[j], xb[j]);
        has_nan |= xb[j] != xb[j];
        const float ax = fabsf(xb[j]);
        if (ax > amax) {
            amax = ax;
            max = xb[j];
        }
    }
    if (amax < MF_GROUP_MAX_EPS)
        return 0;
    float d = -max / (float)mf_kvalues_iq4nl[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
        const float q = (float)mf_kvalues_iq4nl[mf_iq4_best_index(mf_mul_nc(id, xb[j]))];
        const float wq = mf_mul_nc(weight[j], q);
        sumqx += mf_mul_nc(wq, xb[j]);
        sumq2 += mf_mul_nc(wq, q);
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = mf_mul_nc(d, sumqx);
    for (int itry = -ntry; itry <= ntry; ++itry) {
        id = (float)(itry + mf_kvalues_iq4nl[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            const float q = (float)mf_kvalues_iq4nl[mf_iq4_best_index(mf_mul_nc(id, xb[j]))];
            const float wq = mf_mul_nc(weight[j], q);
            sumqx += mf_mul_nc(wq, xb[j]);
            sumq2 += mf_mul_nc(wq, q);
        }
        if (sumq2 > 0 && mf_mul_nc(sumqx, sumqx) > mf_mul_nc(best, sumq2)) {
            d = sumqx / sumq2;
            best = mf_mul_nc(d, sumqx);
        }
    }
    if (d != d && !has_nan)
        d = mf_bits_f32(0xffc00000u);                /* x86-64's default NaN (see above) */
    return d;
}

/* 32 indices (weight j: the best index of id * x[j]) packed: qs[j] = L[j] | L[j + 16] << 4. */
static inline void mf_iq4_pack32(const float *xb, float id, uint8_t *qs /* [16] */)
{
    for (int j = 0; j < 16; ++j)
        qs[j] = (uint8_t)(mf_iq4_best_index(mf_mul_nc(id, xb[j])) |
                          (mf_iq4_best_index(mf_mul_nc(id, xb[j + 16])) << 4));
}

static inline void mf_quantize_row_iq4_nl(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                          ptrdiff_t n)
{
    block_iq4_nl *y = (block_iq4_nl *)vy;           /* [n / 32] */
    for (ptrdiff_t ib = 0; ib < n / QK4_NL; ib++) {
        const float *xb = x + ib * QK4_NL;
        const float d = mf_iq4_block_scale(xb);
        y[ib].d = mf_fp32_to_fp16(d);
        mf_iq4_pack32(xb, d != 0 ? 1 / d : 0.f, y[ib].qs);   /* against the unrounded d */
    }
}

static inline void mf_quantize_row_iq4_xs(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                          ptrdiff_t n)
{
    block_iq4_xs *y = (block_iq4_xs *)vy;           /* [n / 256] */
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        float scales[8];
        float max_scale = 0, amax_scale = 0;
        for (int j = 0; j < 8; ++j) {
            scales[j] = mf_iq4_block_scale(xb + 32 * j);
            const float abs_d = fabsf(scales[j]);
            if (abs_d > amax_scale) {
                amax_scale = abs_d;
                max_scale = scales[j];
            }
        }
        const float d = -max_scale / 32;
        const float id = d != 0 ? 1 / d : 0.f;
        uint16_t scales_h = 0;
        y[ib].d = mf_fp32_to_fp16(d);
        for (int j = 0; j < 8; ++j) {
            int l = mf_nearest_int(mf_mul_nc(id, scales[j]));
            l = mf_imax(-32, mf_imin(31, l));
            const float dl = d * (float)l;           /* against the unrounded d */
            mf_iq4_pack32(xb + 32 * j, dl != 0 ? 1 / dl : 0.f, y[ib].qs + 16 * j);
            l += 32;
            if (j % 2 == 0)
                y[ib].scales_l[j / 2] = (uint8_t)(l & 0x0F);
            else
                y[ib].scales_l[j / 2] |= (uint8_t)((l & 0x0F) << 4);
            scales_h |= (uint16_t)((l >> 4) << (2 * j));
        }
        y[ib].scales_h = scales_h;
    }
}

#endif /* MEGAFUSE_MF_WEIGHT_QUANT_H */
