/*
 * mf_simd.h -- the float32 vector primitives every megafuse kernel is built on.
 *
 * One source, compiled once per SIMD level: the extension module of each level is built with its
 * own flags (baseline / -mavx2 -mfma -mf16c / -mavx512f ... / -DMF_NEON -march=armv8...), and the
 * #if ladder below picks the matching body (the NEON ones live in mf_neon_simd.h).  Every reduction has a fixed order that depends only on n -- never on threads --
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
#elif defined(MF_NEON) && defined(__aarch64__) && defined(__ARM_NEON)
#  define MF_SIMD_NEON 1                   /* the neon, neon_dotprod and i8mm levels */
#  include <arm_neon.h>
#endif

/* Compiler spellings: forced inlining (register blocks whose loops must unroll into registers)
 * and the alignment of stack buffers (a prefix of the declaration). */
#if defined(__GNUC__) || defined(__clang__)
#  define MF_ALWAYS_INLINE static inline __attribute__((always_inline))
#  define MF_ALIGNED(n) __attribute__((aligned(n)))
#elif defined(_MSC_VER)
#  define MF_ALWAYS_INLINE static __forceinline
#  define MF_ALIGNED(n) __declspec(align(n))
#else
#  define MF_ALWAYS_INLINE static inline
#  define MF_ALIGNED(n)
#endif

#if defined(MF_SIMD_AVX512) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#  define MF_SIMD_NAME "amx"              /* avx512 + the AMX-INT8 prefill tiles */
#elif defined(MF_SIMD_AVX512)
#  define MF_SIMD_NAME "avx512"
#elif defined(MF_SIMD_AVX2)
#  define MF_SIMD_NAME "avx2"
#elif defined(MF_SIMD_NEON) && defined(__ARM_FEATURE_DOTPROD) && defined(__ARM_FEATURE_MATMUL_INT8)
#  define MF_SIMD_NAME "i8mm"
#elif defined(MF_SIMD_NEON) && defined(__ARM_FEATURE_DOTPROD)
#  define MF_SIMD_NAME "neon_dotprod"
#elif defined(MF_SIMD_NEON)
#  define MF_SIMD_NAME "neon"
#else
#  define MF_SIMD_NAME "generic"
#endif

#if defined(MF_SIMD_NEON)
#  include "mf_neon_simd.h"
#endif

/* Sum of 8 partial sums in the generic bodies' fixed order. */
static inline float mf_sum8(const float s[8])
{
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

#if defined(__AVX2__)
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
#elif defined(MF_SIMD_NEON)
    (void)i;
    return mf_neon_dot_f32(a, b, n);
#else
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += a[i + k] * b[i + k];
    float r = mf_sum8(s);
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
#elif defined(MF_SIMD_NEON)
    (void)i;
    return mf_neon_dot3_f32(w, x, g, n);
#else
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += w[i + k] * (x[i + k] * g[i + k]);
    float r = mf_sum8(s);
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
#elif defined(MF_SIMD_NEON)
    (void)i;
    mf_neon_axpy_f32(y, a, x, n);
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

/*
 * The softmax step of a row of scores: s[j] = exp(s[j] - m) in place, returning the sum of the
 * new s[j] (in a fixed order).  exp is Cephes' expf polynomial (max relative error ~1e-7) on
 * AVX2 -- also at the avx512 level, whose builds include AVX2 -- and on NEON (mf_neon_exp, the
 * same operations 4 lanes wide), libm's expf elsewhere.
 * NaN stays NaN; arguments below -87.3 give exactly 0 (so a score of -inf weighs nothing).
 */
#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 mf_exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3365447505f), hi = _mm256_set1_ps(88.3762626647f);
    __m256 nan_mask = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(under, y);
    return _mm256_blendv_ps(y, x, nan_mask);
}
#endif

static inline float mf_exp_shift_sum_f32(float *s, float m, ptrdiff_t n)
{
    ptrdiff_t j = 0;
    float total;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m256 p = mf_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, p);
        acc = _mm256_add_ps(acc, p);
    }
    total = mf_hsum256(acc);
    if (j < n) {                       /* the ragged end: same exp, summed after, in order */
        float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (ptrdiff_t k = j; k < n; k++)
            tail[k - j] = s[k] - m;
        _mm256_storeu_ps(tail, mf_exp256(_mm256_loadu_ps(tail)));
        for (ptrdiff_t k = j; k < n; k++) {
            s[k] = tail[k - j];
            total += s[k];
        }
    }
#elif defined(MF_SIMD_NEON)
    (void)j;
    total = mf_neon_exp_shift_sum_f32(s, m, n);
#else
    float part[4] = {0, 0, 0, 0};
    for (; j < n; j++) {
        s[j] = expf(s[j] - m);
        part[j & 3] += s[j];
    }
    total = (part[0] + part[2]) + (part[1] + part[3]);
#endif
    return total;
}

/* out[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i]: SwiGLU's activation.  exp as in
 * mf_exp_shift_sum_f32 (AVX2: Cephes, ~1e-7 relative), and exp(-g) = +inf past float range as
 * libm's expf gives it, so that silu(-inf) is NaN and silu(g) for g < -88.4 is -0 either way. */
static inline void mf_silu_mul_f32(const float *g, const float *u, float *out, ptrdiff_t n)
{
    ptrdiff_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f), inf = _mm256_set1_ps(INFINITY);
    const __m256 hi = _mm256_set1_ps(88.3762626647f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i), nx = _mm256_xor_ps(x, sign);
        __m256 e = _mm256_blendv_ps(mf_exp256(nx), inf, _mm256_cmp_ps(nx, hi, _CMP_GT_OQ));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)),
                                                _mm256_loadu_ps(u + i)));
    }
#elif defined(MF_SIMD_NEON)
    i = mf_neon_silu_mul_f32(g, u, out, n);
#endif
    for (; i < n; i++)
        out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* out[i] = gelu_tanh(g[i]) * u[i]: GELU in its tanh form, 0.5 g (1 + tanh(z)) with
 * z = sqrt(2/pi) (g + 0.044715 g^3), computed as g / (1 + exp(-2 z)) (the same function:
 * 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z))), the sigmoid form silu uses. */
static inline void mf_gelu_tanh_mul_f32(const float *g, const float *u, float *out, ptrdiff_t n)
{
    const float c2 = 1.5957691216057308f;          /* 2 sqrt(2/pi) */
    ptrdiff_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f), inf = _mm256_set1_ps(INFINITY);
    const __m256 hi = _mm256_set1_ps(88.3762626647f), vc = _mm256_set1_ps(-c2);
    const __m256 k = _mm256_set1_ps(0.044715f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        __m256 nz = _mm256_mul_ps(vc, _mm256_add_ps(x, _mm256_mul_ps(k, x3)));   /* -2z */
        __m256 e = _mm256_blendv_ps(mf_exp256(nz), inf, _mm256_cmp_ps(nz, hi, _CMP_GT_OQ));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)),
                                                _mm256_loadu_ps(u + i)));
    }
#elif defined(MF_SIMD_NEON)
    i = mf_neon_gelu_tanh_mul_f32(g, u, out, n, c2);
#endif
    for (; i < n; i++) {
        float x = g[i];
        out[i] = x / (1.0f + expf(-c2 * (x + 0.044715f * (x * x * x)))) * u[i];
    }
}

/* Decode's weight streams read 4 rows side by side; `ahead` is where the next block of rows
 * starts (4 rows further: the next block of the thread's share), prefetched into L2 in step with
 * the reading -- 128 bytes for each 8 columns of the 4 rows -- so that by the end of this block
 * the next is on its way.  A prefetch never faults: past the end of the weights it does nothing. */
#if defined(__GNUC__)
#  define MF__PREFETCH_AHEAD(ahead, k)                                                           \
    do {                                                                                         \
        __builtin_prefetch((const char *)(ahead) + 16 * (k), 0, 2);                              \
        __builtin_prefetch((const char *)(ahead) + 16 * (k) + 64, 0, 2);                         \
    } while (0)
#else
#  define MF__PREFETCH_AHEAD(ahead, k) ((void)0)
#endif

/* out[r] = sum_k x[k] * w[r][k] for 4 rows: decode's out-projection (see MF__PREFETCH_AHEAD
 * for `ahead`). */
static inline void mf_dot_1x4_f32(const float *x, const float *const w[4], ptrdiff_t n,
                                  float out[4], const void *ahead)
{
#if defined(MF_SIMD_AVX2) || defined(MF_SIMD_AVX512)
    ptrdiff_t k = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (; k + 8 <= n; k += 8) {
        MF__PREFETCH_AHEAD(ahead, k);
        __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[0] + k), a0);
        a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[1] + k), a1);
        a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[2] + k), a2);
        a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[3] + k), a3);
    }
    __m256 a[4] = {a0, a1, a2, a3};
    for (int r = 0; r < 4; r++) {
        float v = mf_hsum256(a[r]);
        for (ptrdiff_t j = k; j < n; j++)
            v = fmaf(x[j], w[r][j], v);
        out[r] = v;
    }
#elif defined(MF_SIMD_NEON)
    mf_neon_dot_1x4_f32(x, NULL, w, n, out, ahead);
#else
    (void)ahead;
    for (int r = 0; r < 4; r++)
        out[r] = mf_dot_f32(x, w[r], n);
#endif
}

/* out[r] = sum_k w[r][k] * (x[k] * g[k]) for 4 rows: decode's normalised-input projection, with
 * x * gamma formed once per k step for all four rows (see MF__PREFETCH_AHEAD for `ahead`). */
static inline void mf_dot3_1x4_f32(const float *x, const float *g, const float *const w[4],
                                   ptrdiff_t n, float out[4], const void *ahead)
{
#if defined(MF_SIMD_AVX2) || defined(MF_SIMD_AVX512)
    ptrdiff_t k = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (; k + 8 <= n; k += 8) {
        MF__PREFETCH_AHEAD(ahead, k);
        __m256 xv = _mm256_mul_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(g + k));
        a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[0] + k), a0);
        a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[1] + k), a1);
        a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[2] + k), a2);
        a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[3] + k), a3);
    }
    __m256 a[4] = {a0, a1, a2, a3};
    for (int r = 0; r < 4; r++) {
        float v = mf_hsum256(a[r]);
        for (ptrdiff_t j = k; j < n; j++)
            v = fmaf(x[j] * g[j], w[r][j], v);
        out[r] = v;
    }
#elif defined(MF_SIMD_NEON)
    mf_neon_dot_1x4_f32(x, g, w, n, out, ahead);
#else
    (void)ahead;
    for (int r = 0; r < 4; r++)
        out[r] = mf_dot3_f32(w[r], x, g, n);
#endif
}

/*
 * The register block of every float projection: 3 token rows x 4 weight rows.
 *
 * out[t][r] = sum_k x[t][k] * w[r][k] for t < 3, r < 4 (x rows and w rows each of n floats, K
 * contiguous: the "NT" layout of activations [T, K] against a torch Linear weight [R, K]).
 * 12 vector accumulators stay in registers; each k step loads 3 x vectors and 4 w vectors once
 * for 12 FMAs.  Callers with fewer rows pass repeated pointers and drop the extra results.  Each
 * out[t][r] is the same fixed-order reduction whatever the other rows are: results do not depend
 * on how rows are grouped into blocks, or blocks onto threads.
 */
static inline void mf_dot_3x4_f32(const float *const x[3], const float *const w[4], ptrdiff_t n,
                                  float out[3][4])
{
    ptrdiff_t k = 0;
#if defined(MF_SIMD_AVX512)
    __m512 a[3][4];
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++)
            a[t][r] = _mm512_setzero_ps();
    for (; k + 16 <= n; k += 16) {
        __m512 x0 = _mm512_loadu_ps(x[0] + k), x1 = _mm512_loadu_ps(x[1] + k);
        __m512 x2 = _mm512_loadu_ps(x[2] + k);
        for (int r = 0; r < 4; r++) {
            __m512 wr = _mm512_loadu_ps(w[r] + k);
            a[0][r] = _mm512_fmadd_ps(x0, wr, a[0][r]);
            a[1][r] = _mm512_fmadd_ps(x1, wr, a[1][r]);
            a[2][r] = _mm512_fmadd_ps(x2, wr, a[2][r]);
        }
    }
    if (k < n) {
        __mmask16 m = (__mmask16)((1u << (n - k)) - 1u);
        __m512 x0 = _mm512_maskz_loadu_ps(m, x[0] + k), x1 = _mm512_maskz_loadu_ps(m, x[1] + k);
        __m512 x2 = _mm512_maskz_loadu_ps(m, x[2] + k);
        for (int r = 0; r < 4; r++) {
            __m512 wr = _mm512_maskz_loadu_ps(m, w[r] + k);
            a[0][r] = _mm512_fmadd_ps(x0, wr, a[0][r]);
            a[1][r] = _mm512_fmadd_ps(x1, wr, a[1][r]);
            a[2][r] = _mm512_fmadd_ps(x2, wr, a[2][r]);
        }
    }
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++)
            out[t][r] = _mm512_reduce_add_ps(a[t][r]);
#elif defined(MF_SIMD_AVX2)
    __m256 a[3][4];
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++)
            a[t][r] = _mm256_setzero_ps();
    for (; k + 8 <= n; k += 8) {
        __m256 x0 = _mm256_loadu_ps(x[0] + k), x1 = _mm256_loadu_ps(x[1] + k);
        __m256 x2 = _mm256_loadu_ps(x[2] + k);
        for (int r = 0; r < 4; r++) {
            __m256 wr = _mm256_loadu_ps(w[r] + k);
            a[0][r] = _mm256_fmadd_ps(x0, wr, a[0][r]);
            a[1][r] = _mm256_fmadd_ps(x1, wr, a[1][r]);
            a[2][r] = _mm256_fmadd_ps(x2, wr, a[2][r]);
        }
    }
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++) {
            float s = mf_hsum256(a[t][r]);
            for (ptrdiff_t j = k; j < n; j++)
                s = fmaf(x[t][j], w[r][j], s);
            out[t][r] = s;
        }
#elif defined(MF_SIMD_NEON)
    (void)k;
    mf_neon_dot_3x4_f32(x, w, n, out);
#else
    float a[3][4][4];
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 4; l++)
                a[t][r][l] = 0.0f;
    for (; k + 4 <= n; k += 4)
        for (int t = 0; t < 3; t++)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 4; l++)
                    a[t][r][l] += x[t][k + l] * w[r][k + l];
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++) {
            float s = (a[t][r][0] + a[t][r][2]) + (a[t][r][1] + a[t][r][3]);
            for (ptrdiff_t j = k; j < n; j++)
                s += x[t][j] * w[r][j];
            out[t][r] = s;
        }
#endif
}

#endif /* MEGAFUSE_MF_SIMD_H */
