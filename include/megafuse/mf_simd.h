/*
 * mf_simd.h -- the float32 vector primitives every megafuse kernel is built on.
 *
 * One source, compiled once per SIMD level: the extension module of each level is built with its
 * own flags (baseline / -mavx2 -mfma -mf16c / -mavx512f ...), and the #if ladder below picks the
 * matching body.  Every reduction has a fixed order that depends only on n -- never on threads --
 * so a kernel that gives each output element to one call is bitwise deterministic.
 *
 * No -ffast-math anywhere: GCC will not reassociate a float sum by itself, so the reductions here
 * carry several independent accumulators explicitly.
 */
#ifndef MEGAFUSE_MF_SIMD_H
#define MEGAFUSE_MF_SIMD_H

#include <stddef.h>
#include <math.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
#  define MF_SIMD_AVX512 1
#  include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#  define MF_SIMD_AVX2 1
#  include <immintrin.h>
#endif

#if defined(MF_SIMD_AVX512)
#  define MF_SIMD_NAME "avx512"
#elif defined(MF_SIMD_AVX2)
#  define MF_SIMD_NAME "avx2"
#else
#  define MF_SIMD_NAME "generic"
#endif

#if defined(MF_SIMD_AVX2)
/* Sum of the 8 lanes of v, in a fixed order. */
static inline float mf_hsum256(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 0x55));
    return _mm_cvtss_f32(lo);
}
#endif

/* sum_i a[i] * b[i] */
static inline float mf_dot_f32(const float *a, const float *b, ptrdiff_t n)
{
    ptrdiff_t i = 0;
#if defined(MF_SIMD_AVX512)
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    __m512 s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
#elif defined(MF_SIMD_AVX2)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = mf_hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
#else
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
#endif
}

/* sum_i w[i] * (x[i] * g[i]): a weight row times an input scaled elementwise by gamma. */
static inline float mf_dot3_f32(const float *w, const float *x, const float *g, ptrdiff_t n)
{
    ptrdiff_t i = 0;
#if defined(MF_SIMD_AVX512)
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(g + i));
        __m512 x1 = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(g + i + 16));
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), x0, s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), x1, s1);
    }
    if (i + 16 <= n) {
        __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(g + i));
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), x0, s0);
        i += 16;
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 x0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, g + i));
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), x0, s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#elif defined(MF_SIMD_AVX2)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(g + i));
        __m256 x1 = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(g + i + 8));
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), x0, s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), x1, s1);
    }
    if (i + 8 <= n) {
        __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(g + i));
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), x0, s0);
        i += 8;
    }
    float s = mf_hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += w[i] * (x[i] * g[i]);
    return s;
#else
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += w[i + k] * (x[i + k] * g[i + k]);
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++)
        r += w[i] * (x[i] * g[i]);
    return r;
#endif
}

/* y[i] += a * x[i] */
static inline void mf_axpy_f32(float *y, float a, const float *x, ptrdiff_t n)
{
    ptrdiff_t i = 0;
#if defined(MF_SIMD_AVX512)
    __m512 va = _mm512_set1_ps(a);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i),
                                                        _mm512_maskz_loadu_ps(m, y + i)));
    }
#elif defined(MF_SIMD_AVX2)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
#else
    for (; i < n; i++)
        y[i] += a * x[i];
#endif
}

/* y[i] *= a */
static inline void mf_scale_f32(float *y, float a, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++)
        y[i] *= a;
}

#endif /* MEGAFUSE_MF_SIMD_H */
