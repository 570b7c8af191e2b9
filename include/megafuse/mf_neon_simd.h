/*
 * mf_neon_simd.h -- the float32 vector primitives of mf_simd.h on AArch64 Advanced SIMD (NEON),
 * for the neon, neon_dotprod and i8mm levels (the same float bodies: those levels differ in their
 * integer products only).  mf_simd.h's functions call these under MF_SIMD_NEON.
 *
 * 128-bit registers, 4 floats; fused multiply-adds (vfmaq) as the AVX2 bodies use them.  Every
 * reduction has a fixed order that depends only on n: a horizontal sum is vaddvq_f32 (pairwise:
 * (l0 + l1) + (l2 + l3)), partial sums are added in the order written.  Included by mf_simd.h
 * only (after arm_neon.h).
 */
#ifndef MEGAFUSE_MF_NEON_SIMD_H
#define MEGAFUSE_MF_NEON_SIMD_H

#include <stddef.h>
#include <math.h>
#include <arm_neon.h>

/* sum_i a[i] * b[i]: four chains of 4 lanes over 16 floats, then 4 at a time into the first. */
static inline float mf_neon_dot_f32(const float *a, const float *b, ptrdiff_t n)
{
    ptrdiff_t i = 0;
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++)
        s = fmaf(a[i], b[i], s);
    return s;
}

/* sum_i w[i] * (x[i] * g[i]) */
static inline float mf_neon_dot3_f32(const float *w, const float *x, const float *g, ptrdiff_t n)
{
    ptrdiff_t i = 0;
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0;
    for (; i + 8 <= n; i += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(w + i), vmulq_f32(vld1q_f32(x + i), vld1q_f32(g + i)));
        s1 = vfmaq_f32(s1, vld1q_f32(w + i + 4),
                       vmulq_f32(vld1q_f32(x + i + 4), vld1q_f32(g + i + 4)));
    }
    if (i + 4 <= n) {
        s0 = vfmaq_f32(s0, vld1q_f32(w + i), vmulq_f32(vld1q_f32(x + i), vld1q_f32(g + i)));
        i += 4;
    }
    float s = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < n; i++)
        s = fmaf(w[i], x[i] * g[i], s);
    return s;
}

/* y[i] += a * x[i] (fused) */
static inline void mf_neon_axpy_f32(float *y, float a, const float *x, ptrdiff_t n)
{
    ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

/* exp of 4 lanes: Cephes' expf polynomial, the operations of mf_exp256 (AVX2) lane for lane, so
 * the same bits: NaN stays NaN, arguments below -87.3 give exactly 0. */
static inline float32x4_t mf_neon_exp(float32x4_t x)
{
    const float32x4_t lo = vdupq_n_f32(-87.3365447505f), hi = vdupq_n_f32(88.3762626647f);
    const uint32x4_t not_nan = vceqq_f32(x, x);
    const uint32x4_t under = vcltq_f32(x, lo);
    const float32x4_t xc = vminq_f32(vmaxq_f32(x, lo), hi);
    const float32x4_t fx = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(xc, fx, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, fx, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t y = vdupq_n_f32(1.9875691500e-4f);
    y = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), y, r);
    y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, r);
    y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, r);
    y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, r);
    y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), y, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(fx), vdupq_n_s32(127)), 23);
    y = vmulq_f32(y, vreinterpretq_f32_s32(e));
    y = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), under));
    return vbslq_f32(not_nan, y, x);
}

/* s[j] = exp(s[j] - m), returning the sum of the new s[j]: 4 lanes, then the ragged end through
 * the same exp, summed after in order (mf_simd.h's AVX2 body, 4 lanes wide). */
static inline float mf_neon_exp_shift_sum_f32(float *s, float m, ptrdiff_t n)
{
    ptrdiff_t j = 0;
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (; j + 4 <= n; j += 4) {
        const float32x4_t p = mf_neon_exp(vsubq_f32(vld1q_f32(s + j), vm));
        vst1q_f32(s + j, p);
        acc = vaddq_f32(acc, p);
    }
    float total = vaddvq_f32(acc);
    if (j < n) {
        float tail[4] = {0, 0, 0, 0};
        for (ptrdiff_t k = j; k < n; k++)
            tail[k - j] = s[k] - m;
        vst1q_f32(tail, mf_neon_exp(vld1q_f32(tail)));
        for (ptrdiff_t k = j; k < n; k++) {
            s[k] = tail[k - j];
            total += s[k];
        }
    }
    return total;
}

/* out[i] = g[i] / (1 + exp(-g[i])) * u[i], exp(-g) = +inf past float range (as libm's expf):
 * 4 lanes, then libm for the tail (mf_silu_mul_f32's AVX2 body, 4 lanes wide). */
static inline ptrdiff_t mf_neon_silu_mul_f32(const float *g, const float *u, float *out,
                                             ptrdiff_t n)
{
    ptrdiff_t i = 0;
    const float32x4_t one = vdupq_n_f32(1.0f), inf = vdupq_n_f32(INFINITY);
    const float32x4_t hi = vdupq_n_f32(88.3762626647f);
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i), nx = vnegq_f32(x);
        const float32x4_t e = vbslq_f32(vcgtq_f32(nx, hi), inf, mf_neon_exp(nx));
        vst1q_f32(out + i, vmulq_f32(vdivq_f32(x, vaddq_f32(one, e)), vld1q_f32(u + i)));
    }
    return i;
}

/* The same for GELU's tanh form, g / (1 + exp(-2z)), z = sqrt(2/pi) (g + 0.044715 g^3). */
static inline ptrdiff_t mf_neon_gelu_tanh_mul_f32(const float *g, const float *u, float *out,
                                                  ptrdiff_t n, float c2)
{
    ptrdiff_t i = 0;
    const float32x4_t one = vdupq_n_f32(1.0f), inf = vdupq_n_f32(INFINITY);
    const float32x4_t hi = vdupq_n_f32(88.3762626647f), vc = vdupq_n_f32(-c2);
    const float32x4_t k = vdupq_n_f32(0.044715f);
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t x3 = vmulq_f32(vmulq_f32(x, x), x);
        const float32x4_t nz = vmulq_f32(vc, vaddq_f32(x, vmulq_f32(k, x3)));      /* -2z */
        const float32x4_t e = vbslq_f32(vcgtq_f32(nz, hi), inf, mf_neon_exp(nz));
        vst1q_f32(out + i, vmulq_f32(vdivq_f32(x, vaddq_f32(one, e)), vld1q_f32(u + i)));
    }
    return i;
}

/* out[r] = sum_k x[k] * w[r][k] for 4 rows (x * g[k] when g != NULL: the normalised input): two
 * chains a row over 8 columns, x (and x * g) formed once for the four rows; `ahead` prefetched into
 * L2 as mf_simd.h's MF__PREFETCH_AHEAD does (128 bytes for each 8 columns). */
MF_ALWAYS_INLINE void mf_neon_dot_1x4_f32(const float *x, const float *g,
                                          const float *const w[4], ptrdiff_t n, float out[4],
                                          const void *ahead)
{
    ptrdiff_t k = 0;
    float32x4_t a[4][2];
    for (int r = 0; r < 4; r++)
        a[r][0] = a[r][1] = vdupq_n_f32(0.0f);
    for (; k + 8 <= n; k += 8) {
        __builtin_prefetch((const char *)ahead + 16 * k, 0, 2);
        __builtin_prefetch((const char *)ahead + 16 * k + 64, 0, 2);
        float32x4_t x0 = vld1q_f32(x + k), x1 = vld1q_f32(x + k + 4);
        if (g) {
            x0 = vmulq_f32(x0, vld1q_f32(g + k));
            x1 = vmulq_f32(x1, vld1q_f32(g + k + 4));
        }
        for (int r = 0; r < 4; r++) {
            a[r][0] = vfmaq_f32(a[r][0], x0, vld1q_f32(w[r] + k));
            a[r][1] = vfmaq_f32(a[r][1], x1, vld1q_f32(w[r] + k + 4));
        }
    }
    for (int r = 0; r < 4; r++) {
        float v = vaddvq_f32(vaddq_f32(a[r][0], a[r][1]));
        for (ptrdiff_t j = k; j < n; j++)
            v = fmaf(g ? x[j] * g[j] : x[j], w[r][j], v);
        out[r] = v;
    }
}

/* The 3 x 4 register block of mf_dot_3x4_f32: 12 chains of 4 lanes, 3 x and 4 w loads a step. */
static inline void mf_neon_dot_3x4_f32(const float *const x[3], const float *const w[4],
                                       ptrdiff_t n, float out[3][4])
{
    ptrdiff_t k = 0;
    float32x4_t a[3][4];
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++)
            a[t][r] = vdupq_n_f32(0.0f);
    for (; k + 4 <= n; k += 4) {
        const float32x4_t x0 = vld1q_f32(x[0] + k), x1 = vld1q_f32(x[1] + k);
        const float32x4_t x2 = vld1q_f32(x[2] + k);
        for (int r = 0; r < 4; r++) {
            const float32x4_t wr = vld1q_f32(w[r] + k);
            a[0][r] = vfmaq_f32(a[0][r], x0, wr);
            a[1][r] = vfmaq_f32(a[1][r], x1, wr);
            a[2][r] = vfmaq_f32(a[2][r], x2, wr);
        }
    }
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++) {
            float s = vaddvq_f32(a[t][r]);
            for (ptrdiff_t j = k; j < n; j++)
                s = fmaf(x[t][j], w[r][j], s);
            out[t][r] = s;
        }
}

#endif /* MEGAFUSE_MF_NEON_SIMD_H */
