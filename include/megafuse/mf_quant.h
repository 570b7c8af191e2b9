/*
 * mf_quant.h -- the weight formats of megafuse: dequantize, dot products and quantizers.
 *
 * One source, compiled once per SIMD level with the #if ladder of mf_simd.h (MF_SIMD_AVX512 /
 * MF_SIMD_AVX2 / generic).  The AVX2 bodies below are also used by the AVX-512 level (its build
 * flags include AVX2, FMA and F16C); there the 8-bit products of the 32-weight formats go through
 * AVX-512 VNNI (vpdpbusd) and the FP16 / BF16 (and, in mf_simd.h, FP32) dots use 512-bit
 * registers.  The AVX-512 level cannot be run on the machine this was written on: its bodies are
 * kept to those few, small differences from the AVX2 ones, which the tests run.
 *
 * What is here, for every weight format dt (FP32, FP16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
 * Q5_K, Q6_K) -- a "row" is n weights (n a multiple of the block size; the caller checks it).
 * Shapes: w = one weight row, [n / block] blocks (ck_dtype_row_bytes(dt, n) bytes); x, y [n]
 * float32; a = one activation row, [n / 32] block_q8_0 or [n / 256] block_q8_K.
 *
 *   mf_dequantize_row_<dt>(const void *w, float *y, n)       y[n] = the weights, bit-exact with
 *                                                            GGML / gguf.quants.dequantize
 *   mf_dot_<dt>_f32(const void *w, const float *x, n)        sum_i w_i x_i, float activations
 *                                                            (weights decoded in registers)
 *   mf_quantize_row_<dt>(const float *x, void *w, n)         the weight quantizers (see below)
 *
 * and, for the integer path, the activation quantizers mf_quantize_row_q8_0_act and
 * mf_quantize_row_q8_K (GGML's quantize_row_q8_0_ref / quantize_row_q8_K_ref) and the dots
 * mf_dot_{q4_0,q4_1,q5_0,q5_1,q8_0}_q8_0 and mf_dot_{q4_K,q5_K,q6_K}_q8_K; and what the
 * projections call, mf_q8_rows_tokens: up to 4 weight rows against any number of activation rows
 * (decode: the 4 rows stream side by side with software prefetch; prefill: the rows decoded once
 * into L1 and 4 x 2 register blocks of (row, token)), the same bits as one-row dots per pair.
 *
 * Integer dots (GGML's vec_dot_*_q8_0 / *_q8_K scheme).  Per block (32) or sub-block (K-quants),
 * the products of the 8-bit codes are summed exactly in int32; each block's contribution
 * d_w * d_a * isum (plus the min term) is then formed in double, where it is exact for the
 * 32-weight formats, and added to one of 4 double accumulators (block b -> accumulator b % 4; the
 * K-quants use one), combined as (a0 + a1) + (a2 + a3) and rounded once to float.  That float part
 * is the same sequence of operations at every SIMD level, so an integer dot gives the same bits
 * on generic, AVX2 and AVX-512.  Q4_1 / Q5_1 need the activation block sum s = d_a * sum(q_a)
 * (GGML keeps it in a separate block_q8_1, rounded to fp16): here it is computed on the fly from
 * the Q8_0 block, exactly (d_a * isum in double), so the result is the exact emulation
 * sum_b (d_w q_w + m_w) . (d_a q_a) up to the final roundings.  Precondition of every integer dot:
 * activation codes lie in [-127, 127] (the quantizers here never produce -128).
 *
 * Float dots (weights x float32 activations) accumulate per block, then scale by the block's
 * factors; the order is fixed by n alone, so results do not depend on threads (they differ in
 * the last bits between SIMD levels, as any float reduction does).
 *
 * Dequantization is GGML's float32 arithmetic, so it equals gguf.quants.dequantize bit for bit --
 * for NaN and Inf scales too, on x86 (NaN bits follow x86's first-operand rule, as NumPy's).
 *
 * Quantizers.  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 give the bytes of gguf.quants.quantize (the NumPy
 * port of GGML's quantize_row_*_ref; on finite data that is GGML's output too), including what
 * NumPy does on x86-64 where only non-finite or subnormal blocks go: its float -> uint8/int8 cast
 * (NaN/Inf -> 0, others modulo 256) and its max/min reductions (any NaN -> the default NaN).
 * FP16 is NumPy's float16 cast (round to nearest even), BF16 gguf's / GGML's rounding.  Q4_K, Q5_K, Q6_K follow GGML's
 * quantize_row_q{4,5,6}_K_ref (make_qkx2_quants / make_qx_quants) with every float operation of
 * the C source rounded as written (no fused multiply-add: see MF_OPT_BARRIER).  The activation
 * quantizers give a block that holds NaN or Inf d = NaN and all codes 0 (it dequantizes to NaN,
 * so non-finite activations propagate); otherwise they are GGML's reference functions exactly.
 *
 * No function here allocates, fails or reads outside [w, w + row bytes) and [x, x + n).
 */
#ifndef MEGAFUSE_MF_QUANT_H
#define MEGAFUSE_MF_QUANT_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mf_simd.h"
#include "ggml_blocks.h"
#include "ckernel_dtype.h"

#if defined(MF_SIMD_AVX512) || defined(MF_SIMD_AVX2)
#  define MF_Q_AVX2 1                      /* 256-bit integer + FMA bodies */
#endif
#if defined(MF_Q_AVX2) && defined(__F16C__)
#  define MF_Q_F16C 1
#endif
#if defined(MF_SIMD_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#  define MF_Q_VNNI 1
#endif

#if defined(__cplusplus)
#  define MF_RESTRICT __restrict
#elif defined(_MSC_VER)
#  define MF_RESTRICT __restrict
#else
#  define MF_RESTRICT restrict
#endif

/* Where exactness needs "round this product, then add" (the quantizers), the product goes through
 * an empty asm that the compiler cannot see into, so it cannot fuse it into an FMA: GCC contracts
 * a*b+c by default (-ffp-contract=fast) whenever FMA is enabled, as in the AVX2 build. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
#  if defined(__AVX512F__)
#    define MF_OPT_BARRIER(v) __asm__("" : "+v"(v))
#  else
#    define MF_OPT_BARRIER(v) __asm__("" : "+x"(v))
#  endif
#elif defined(__GNUC__) && defined(__aarch64__)
#  define MF_OPT_BARRIER(v) __asm__("" : "+w"(v))
#elif defined(__GNUC__)
#  define MF_OPT_BARRIER(v) __asm__("" : "+m"(v))
#else
#  define MF_OPT_BARRIER(v) ((void)0)      /* MSVC contracts only under /fp:fast or /fp:contract */
#endif

#define MF_GROUP_MAX_EPS 1e-15f            /* GGML's GROUP_MAX_EPS */

/* ============================================================================================ */
/* Scalar helpers                                                                               */
/* ============================================================================================ */

/* a * b rounded to float, never fused with a following add. */
static inline float mf_mul_nc(float a, float b)
{
    float p = a * b;
    MF_OPT_BARRIER(p);
    return p;
}

static inline double mf_mul_nc_d(double a, double b)
{
    double p = a * b;
    MF_OPT_BARRIER(p);
    return p;
}

static inline int mf_imin(int a, int b) { return a < b ? a : b; }
static inline int mf_imax(int a, int b) { return a > b ? a : b; }

/* GGML's nearest_int: round to nearest, ties to even, for |fval| <= 2^22 (bit operations only,
 * so any input -- NaN, Inf -- gives some int without undefined behaviour). */
static inline int mf_nearest_int(float fval)
{
    float val = fval + 12582912.f;
    return (int)(mf_f32_bits(val) & 0x007fffffu) - 0x00400000;
}

/* C roundf (halves away from zero) of a finite |v| < 2^23, as an int:
 * trunc(v + copysign(0.5 - 2^-25, v)) -- the sum never rounds up past the next integer. */
static inline int32_t mf_round_away(float v)
{
    return (int32_t)(v + copysignf(0.4999999701976776f, v));
}

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

static inline float mf_sum8(const float s[8])
{
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* The little-endian uint32 stored in qh[0..3] (the 5th bits of Q5_0 / Q5_1: bit j -> weight j). */
static inline uint32_t mf_le32(const uint8_t *qh)
{
    return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) |
           ((uint32_t)qh[3] << 24);
}

/* ============================================================================================ */
/* AVX2 building blocks                                                                         */
/* ============================================================================================ */
#if defined(MF_Q_AVX2)

/* the 8 lanes of v summed in mf_simd.h's fixed order */
static inline float mf_q_hsum_ps(__m256 v) { return mf_hsum256(v); }

static inline int32_t mf_q_hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* [sum(s0), sum(s1), sum(s2), sum(s3)] of four vectors of 8 int32. */
static inline __m128i mf_q_hsum4_epi32(__m256i s0, __m256i s1, __m256i s2, __m256i s3)
{
    __m256i h01 = _mm256_hadd_epi32(s0, s1);
    __m256i h23 = _mm256_hadd_epi32(s2, s3);
    __m256i h = _mm256_hadd_epi32(h01, h23);
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

static inline __m256i mf_q_loadu256(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* 16 bytes of nibbles -> 32 bytes 0..15: [low nibbles (weights 0..15) | high (16..31)]. */
static inline __m256i mf_q_nibbles32(const uint8_t *qs)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)qs);
    __m128i lo = _mm_and_si128(v, m4);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* The 32 bits of a little-endian uint32 -> 32 bytes, 0x10 where bit i is set, else 0. */
static inline __m256i mf_q_bits32_x10(const uint8_t *qh4)
{
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)mf_le32(qh4)), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Per int32 lane: acc + the sum of 4 products u8 * s8.  AVX2 forms pairs in int16 (vpmaddubsw
 * saturates): the operands here keep u <= 128 and |s| <= 127, so no pair exceeds 32512 and both
 * paths give the same exact sums. */
static inline __m256i mf_q_dot_u8s8(__m256i acc, __m256i u, __m256i s)
{
#if defined(MF_Q_VNNI)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    __m256i p = _mm256_maddubs_epi16(u, s);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

/* Per int32 lane: sum of 4 products w * a of signed bytes (|a| <= 127). */
static inline __m256i mf_q_dot_s8s8(__m256i w, __m256i a)
{
    return mf_q_dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

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

static inline __m256 mf_q_u8x32_dot(__m256i lo, __m256i hi, __m256 off, const float *x)
{
    __m256 sa, sb;
    mf_q_u8x32_dot2(lo, hi, off, x, &sa, &sb);
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

/* x[0..31] summed into 8 lanes. */
static inline __m256 mf_q_sum32(const float *x)
{
    return _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                         _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
}

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

#endif /* MF_Q_AVX2 */

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

/* ============================================================================================ */
/* Dequantize a row of blocks: y[n] = the weights, exactly as GGML computes them in float32.    */
/* Every product below is exact (an 11-bit fp16 scale times a code of <= 8 bits, or a 6/8-bit   */
/* sub-block scale), so fusing it with the following add would not change a bit.  NaN scales   */
/* give NumPy's NaN bits too (x86: the first operand's NaN, see mf_q_store_scaled_addsub).      */
/* ============================================================================================ */

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

/* Sub-block scales of a Q4_K / Q5_K super-block as GGML multiplies them out:
 * dsc[j] = d * sc[j], dm[j] = dmin * m[j] (float32, exact). */
static inline void mf_kquant_scales(const uint8_t *scales /* [12] */, mf_fp16_t d16,
                                    mf_fp16_t dmin16, float dsc[8], float dm[8])
{
    const float d = mf_fp16_to_fp32(d16), dmin = mf_fp16_to_fp32(dmin16);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        mf_get_scale_min_k4(j, scales, &sc, &m);
        dsc[j] = d * (float)sc;
        dm[j] = dmin * (float)m;
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

#if defined(MF_Q_AVX2)
/* The four 32-byte registers of 6-bit codes (0..63) of half h of a Q6_K super-block:
 * q[k] holds weights 128h + 32k .. 128h + 32k + 31. */
static inline void mf_q6k_codes(const block_q6_K *b, int h, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i ql0 = mf_q_loadu256(b->ql + 64 * h), ql1 = mf_q_loadu256(b->ql + 64 * h + 32);
    const __m256i qh = mf_q_loadu256(b->qh + 32 * h);
    q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                           _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                           _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                           _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8((char)0xC0)), 2));
}
#else
/* The 256 codes (0..63) of a Q6_K super-block, in weight order. */
static inline void mf_q6k_codes_all(const block_q6_K *b, uint8_t q[256])
{
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        uint8_t *qq = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            qq[l] = (uint8_t)((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4));
            qq[l + 32] = (uint8_t)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
            qq[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            qq[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}
#endif

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

/* ============================================================================================ */
/* Dot of a weight row with float32 activations: sum_i w_i x_i, the weights decoded in          */
/* registers.  Per block: s = sum q_j x_j (and sum x_j where there is a min), then               */
/* acc += d * s (- m * sum x).                                                                   */
/* ============================================================================================ */

/* fp16 scales inside the dot products: F16C where the build has it.  Equal to mf_fp16_to_fp32
 * except for the payload of a NaN (which only ever yields a NaN result). */
static inline float mf_q_fp16(mf_fp16_t h)
{
#if defined(MF_Q_F16C)
    return _cvtsh_ss(h);
#else
    return mf_fp16_to_fp32(h);
#endif
}

#if defined(MF_Q_AVX2)
static inline __m128 mf_q_fp16x4(mf_fp16_t h0, mf_fp16_t h1, mf_fp16_t h2, mf_fp16_t h3)
{
#if defined(MF_Q_F16C)
    return _mm_cvtph_ps(_mm_setr_epi16((short)h0, (short)h1, (short)h2, (short)h3, 0, 0, 0, 0));
#else
    return _mm_setr_ps(mf_fp16_to_fp32(h0), mf_fp16_to_fp32(h1), mf_fp16_to_fp32(h2),
                       mf_fp16_to_fp32(h3));
#endif
}
#endif

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
/* One 32-weight block against x[0..31]: acc + d * (q . x) (+ m * sum x). */
static inline __m256 mf_q_fblk_q4_0(const block_q4_0 *b, const float *x, __m256 acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), v = mf_q_bcast16(b->qs);
    __m256 s = mf_q_u8x32_dot(_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                              _mm256_set1_ps(8.0f), x);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16(b->d)), s, acc);
}

static inline __m256 mf_q_fblk_q4_1(const block_q4_1 *b, const float *x, __m256 acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), v = mf_q_bcast16(b->qs);
    __m256 s = mf_q_u8x32_dot(_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                              _mm256_setzero_ps(), x);
    __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16(b->d)), s, acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16(b->m)), mf_q_sum32(x), a);
}

static inline __m256 mf_q_fblk_q5_0(const block_q5_0 *b, const float *x, __m256 acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), v = mf_q_bcast16(b->qs);
    __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), mf_q_bits16_x10(b->qh, 0));
    __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                 mf_q_bits16_x10(b->qh, 1));
    __m256 s = mf_q_u8x32_dot(lo, hi, _mm256_set1_ps(16.0f), x);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16(b->d)), s, acc);
}

static inline __m256 mf_q_fblk_q5_1(const block_q5_1 *b, const float *x, __m256 acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), v = mf_q_bcast16(b->qs);
    __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), mf_q_bits16_x10(b->qh, 0));
    __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                 mf_q_bits16_x10(b->qh, 1));
    __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16(b->d)),
                               mf_q_u8x32_dot(lo, hi, _mm256_setzero_ps(), x), acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16(b->m)), mf_q_sum32(x), a);
}

static inline __m256 mf_q_fblk_q8_0(const block_q8_0 *b, const float *x, __m256 acc)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);     /* int8 q -> unsigned q + 128 */
    __m256i lo = _mm256_xor_si256(mf_q_bcast16((const uint8_t *)b->qs), flip);
    __m256i hi = _mm256_xor_si256(mf_q_bcast16((const uint8_t *)b->qs + 16), flip);
    return _mm256_fmadd_ps(_mm256_set1_ps(mf_q_fp16(b->d)),
                           mf_q_u8x32_dot(lo, hi, _mm256_set1_ps(128.0f), x), acc);
}

/* Blocks alternate between two accumulators (register-resident, independent chains). */
#define MF_Q_FDOT_LOOP(BLOCK_FN)                                                               \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                             \
    ptrdiff_t ib = 0;                                                                          \
    for (; ib + 2 <= nb; ib += 2) {                                                            \
        acc0 = BLOCK_FN(&w[ib], x + ib * 32, acc0);                                            \
        acc1 = BLOCK_FN(&w[ib + 1], x + (ib + 1) * 32, acc1);                                  \
    }                                                                                          \
    if (ib < nb)                                                                               \
        acc0 = BLOCK_FN(&w[ib], x + ib * 32, acc0);                                            \
    return mf_q_hsum_ps(_mm256_add_ps(acc0, acc1));
#endif

static inline float mf_dot_q4_0_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q4_0 *w = (const block_q4_0 *)vw;   /* [n / 32] */
    const ptrdiff_t nb = n / QK4_0;
#if defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q4_0)
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
#if defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q4_1)
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
#if defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q5_0)
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
#if defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q5_1)
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
#if defined(MF_Q_AVX2)
    MF_Q_FDOT_LOOP(mf_q_fblk_q8_0)
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

static inline float mf_dot_q4_K_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q4_K *w = (const block_q4_K *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_Q_AVX2)
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256 zero = _mm256_setzero_ps();
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        float dsc[8], dm[8];
        mf_kquant_scales(w[ib].scales, w[ib].d, w[ib].dmin, dsc, dm);
        const float *xb = x + ib * QK_K;
        for (int c = 0; c < 4; c++) {
            const __m256i v0 = mf_q_bcast16(w[ib].qs + 32 * c), v1 = mf_q_bcast16(w[ib].qs + 32 * c + 16);
            const float *x1 = xb + 64 * c, *x2 = x1 + 32;
            __m256 s1 = mf_q_u8x32_dot(_mm256_and_si256(v0, m4), _mm256_and_si256(v1, m4), zero, x1);
            __m256 s2 = mf_q_u8x32_dot(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), zero, x2);
            __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c]), s1, acc[0]);
            acc[0] = _mm256_fnmadd_ps(_mm256_set1_ps(dm[2 * c]), mf_q_sum32(x1), a);
            __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c + 1]), s2, acc[1]);
            acc[1] = _mm256_fnmadd_ps(_mm256_set1_ps(dm[2 * c + 1]), mf_q_sum32(x2), b);
        }
    }
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        float dsc[8], dm[8];
        mf_kquant_scales(w[ib].scales, w[ib].d, w[ib].dmin, dsc, dm);
        for (int j = 0; j < 8; j++) {                /* sub-block j: chunk j/2, nibble j%2 */
            const uint8_t *qs = w[ib].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            const float *xj = x + ib * QK_K + 32 * j;
            int8_t q[32];
            float s[8], sx[8];
            for (int l = 0; l < 32; l++)
                q[l] = (int8_t)((qs[l] >> shift) & 0x0F);
            mf_q_lanes_qx32(q, xj, s);
            mf_q_lanes_x32(xj, sx);
            for (int k = 0; k < 8; k++)
                acc[k] += dsc[j] * s[k] - dm[j] * sx[k];
        }
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q5_K_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q5_K *w = (const block_q5_K *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_Q_AVX2)
    const __m256i m4 = _mm256_set1_epi8(0x0F), x10 = _mm256_set1_epi8(0x10);
    const __m256 zero = _mm256_setzero_ps();
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        float dsc[8], dm[8];
        mf_kquant_scales(w[ib].scales, w[ib].d, w[ib].dmin, dsc, dm);
        const float *xb = x + ib * QK_K;
        const __m256i h0 = mf_q_bcast16(w[ib].qh), h1 = mf_q_bcast16(w[ib].qh + 16);
        for (int c = 0; c < 4; c++) {
            const __m256i b1 = _mm256_set1_epi8((char)(1 << (2 * c)));
            const __m256i b2 = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
            const __m256i v0 = mf_q_bcast16(w[ib].qs + 32 * c), v1 = mf_q_bcast16(w[ib].qs + 32 * c + 16);
            __m256i lo1 = _mm256_or_si256(_mm256_and_si256(v0, m4), _mm256_and_si256(
                _mm256_cmpeq_epi8(_mm256_and_si256(h0, b1), b1), x10));
            __m256i hi1 = _mm256_or_si256(_mm256_and_si256(v1, m4), _mm256_and_si256(
                _mm256_cmpeq_epi8(_mm256_and_si256(h1, b1), b1), x10));
            __m256i lo2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), _mm256_and_si256(
                _mm256_cmpeq_epi8(_mm256_and_si256(h0, b2), b2), x10));
            __m256i hi2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), _mm256_and_si256(
                _mm256_cmpeq_epi8(_mm256_and_si256(h1, b2), b2), x10));
            const float *x1 = xb + 64 * c, *x2 = x1 + 32;
            __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c]), mf_q_u8x32_dot(lo1, hi1, zero, x1), acc[0]);
            acc[0] = _mm256_fnmadd_ps(_mm256_set1_ps(dm[2 * c]), mf_q_sum32(x1), a);
            __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c + 1]), mf_q_u8x32_dot(lo2, hi2, zero, x2), acc[1]);
            acc[1] = _mm256_fnmadd_ps(_mm256_set1_ps(dm[2 * c + 1]), mf_q_sum32(x2), b);
        }
    }
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        float dsc[8], dm[8];
        mf_kquant_scales(w[ib].scales, w[ib].d, w[ib].dmin, dsc, dm);
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = w[ib].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            const float *xj = x + ib * QK_K + 32 * j;
            int8_t q[32];
            float s[8], sx[8];
            for (int l = 0; l < 32; l++)
                q[l] = (int8_t)(((qs[l] >> shift) & 0x0F) | (((w[ib].qh[l] >> j) & 1) << 4));
            mf_q_lanes_qx32(q, xj, s);
            mf_q_lanes_x32(xj, sx);
            for (int k = 0; k < 8; k++)
                acc[k] += dsc[j] * s[k] - dm[j] * sx[k];
        }
    }
    return mf_sum8(acc);
#endif
}

static inline float mf_dot_q6_K_f32(const void *MF_RESTRICT vw, const float *MF_RESTRICT x,
                                    ptrdiff_t n)
{
    const block_q6_K *w = (const block_q6_K *)vw;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
#if defined(MF_Q_AVX2)
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const __m256 off = _mm256_set1_ps(32.0f);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float d = mf_q_fp16(w[ib].d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[ib].ql + 64 * h, *qhp = w[ib].qh + 32 * h;
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
                mf_q_u8x32_dot2(lo[k], hi[k], off, x + ib * QK_K + 128 * h + 32 * k, &sa, &sb);
                acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)w[ib].scales[j]), sa, acc[0]);
                acc[1] = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)w[ib].scales[j + 1]), sb, acc[1]);
            }
        }
    }
    return mf_q_hsum_ps(_mm256_add_ps(acc[0], acc[1]));
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
/* Activation quantizers (the int8 path)                                                        */
/* ============================================================================================ */

/* x[n] -> Q8_0 blocks: GGML's quantize_row_q8_0_ref.  Per block of 32: amax = max |x|,
 * d = amax / 127, id = 1/d (0 when d = 0), q = roundf(x * id); d stored as fp16.
 * A block holding NaN or Inf: d = NaN, q = 0. */
static inline void mf_quantize_row_q8_0_act(const float *MF_RESTRICT x, void *MF_RESTRICT vy,
                                            ptrdiff_t n)
{
    block_q8_0 *y = (block_q8_0 *)vy;               /* [n / 32] */
    const ptrdiff_t nb = n / QK8_0;
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float *xb = x + ib * QK8_0;
        float amax = 0.0f;
        int finite = 1;
        for (int j = 0; j < QK8_0; j++) {
            const float a = fabsf(xb[j]);
            finite &= a <= FLT_MAX;
            amax = a > amax ? a : amax;
        }
        if (!finite) {
            y[ib].d = 0x7e00;                         /* fp16 NaN */
            memset(y[ib].qs, 0, QK8_0);
            continue;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = mf_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++)
            y[ib].qs[j] = (int8_t)mf_round_away(mf_mul_nc(xb[j], id));
    }
}

/* x[n] -> Q8_K blocks: GGML's quantize_row_q8_K_ref.  Per block of 256: max = the value of the
 * largest |x| (first occurrence, sign kept); max == 0: d = 0, q = 0; else iscale = -127 / max,
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
        for (int j = 0; j < QK_K; j++) {
            const float a = fabsf(xb[j]);
            finite &= a <= FLT_MAX;
            if (a > amax) {
                amax = a;
                max = xb[j];
            }
        }
        if (!finite || amax == 0.0f) {
            y[ib].d = finite ? 0.0f : mf_bits_f32(0x7fc00000u);
            memset(y[ib].qs, 0, QK_K);
            memset(y[ib].bsums, 0, sizeof y[ib].bsums);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++)
            y[ib].qs[j] = (int8_t)mf_imin(127, mf_nearest_int(mf_mul_nc(iscale, xb[j])));
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y[ib].qs[16 * g + l];
            y[ib].bsums[g] = (int16_t)sum;
        }
        y[ib].d = 1.0f / iscale;
    }
}

/* ============================================================================================ */
/* Integer dots: weights x quantized activations (see the top of this file)                     */
/* ============================================================================================ */

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
    const ptrdiff_t nb = n / 32;                                                               \
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
    const ptrdiff_t nb = n / 32;                                                               \
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
    const ptrdiff_t nb = n / 32;                                                               \
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
 * (0x7fc00000, whatever the sign or payload of the NaN it met) when any element is NaN. */
static inline void mf_np_min_max(const float *x, int n, float *mn, float *mx)
{
    float lo = x[0], hi = x[0];
    for (int j = 0; j < n; j++) {
        if (x[j] != x[j]) {
            *mn = *mx = mf_bits_f32(0x7fc00000u);
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
            amax = mf_bits_f32(0x7fc00000u);        /* NumPy's max: the default NaN */
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
/* Dispatch by CKDataType (the caller has checked that dt is a weight format and n a multiple   */
/* of its block size).                                                                          */
/* ============================================================================================ */

typedef void (*mf_dequantize_row_fn)(const void *w, float *y, ptrdiff_t n);
typedef void (*mf_quantize_row_fn)(const float *x, void *w, ptrdiff_t n);
typedef float (*mf_dot_f32_fn)(const void *w, const float *x, ptrdiff_t n);
typedef float (*mf_dot_q8_fn)(const void *w, const void *a, ptrdiff_t n);

static inline mf_dequantize_row_fn mf_dequantize_row_for(int dt)
{
    switch (dt) {
    case CK_DT_FP32: return mf_dequantize_row_fp32;
    case CK_DT_FP16: return mf_dequantize_row_fp16;
    case CK_DT_BF16: return mf_dequantize_row_bf16;
    case CK_DT_Q4_0: return mf_dequantize_row_q4_0;
    case CK_DT_Q4_1: return mf_dequantize_row_q4_1;
    case CK_DT_Q5_0: return mf_dequantize_row_q5_0;
    case CK_DT_Q5_1: return mf_dequantize_row_q5_1;
    case CK_DT_Q8_0: return mf_dequantize_row_q8_0;
    case CK_DT_Q4_K: return mf_dequantize_row_q4_K;
    case CK_DT_Q5_K: return mf_dequantize_row_q5_K;
    case CK_DT_Q6_K: return mf_dequantize_row_q6_K;
    default: return NULL;
    }
}

static inline mf_quantize_row_fn mf_quantize_row_for(int dt)
{
    switch (dt) {
    case CK_DT_FP32: return mf_quantize_row_fp32;
    case CK_DT_FP16: return mf_quantize_row_fp16;
    case CK_DT_BF16: return mf_quantize_row_bf16;
    case CK_DT_Q4_0: return mf_quantize_row_q4_0;
    case CK_DT_Q4_1: return mf_quantize_row_q4_1;
    case CK_DT_Q5_0: return mf_quantize_row_q5_0;
    case CK_DT_Q5_1: return mf_quantize_row_q5_1;
    case CK_DT_Q8_0: return mf_quantize_row_q8_0;
    case CK_DT_Q4_K: return mf_quantize_row_q4_K;
    case CK_DT_Q5_K: return mf_quantize_row_q5_K;
    case CK_DT_Q6_K: return mf_quantize_row_q6_K;
    default: return NULL;
    }
}

static inline mf_dot_f32_fn mf_dot_f32_for(int dt)
{
    switch (dt) {
    case CK_DT_FP32: return mf_dot_fp32_f32;
    case CK_DT_FP16: return mf_dot_fp16_f32;
    case CK_DT_BF16: return mf_dot_bf16_f32;
    case CK_DT_Q4_0: return mf_dot_q4_0_f32;
    case CK_DT_Q4_1: return mf_dot_q4_1_f32;
    case CK_DT_Q5_0: return mf_dot_q5_0_f32;
    case CK_DT_Q5_1: return mf_dot_q5_1_f32;
    case CK_DT_Q8_0: return mf_dot_q8_0_f32;
    case CK_DT_Q4_K: return mf_dot_q4_K_f32;
    case CK_DT_Q5_K: return mf_dot_q5_K_f32;
    case CK_DT_Q6_K: return mf_dot_q6_K_f32;
    default: return NULL;
    }
}

/* The dot of the int8 path.  For the float formats the "quantized activations" are the float32
 * activations themselves (mf_quantize_activation_row copies them), so one call sequence serves
 * every weight format. */
static inline mf_dot_q8_fn mf_dot_q8_for(int dt)
{
    switch (dt) {
    case CK_DT_FP32: return (mf_dot_q8_fn)(void (*)(void))mf_dot_fp32_f32;
    case CK_DT_FP16: return (mf_dot_q8_fn)(void (*)(void))mf_dot_fp16_f32;
    case CK_DT_BF16: return (mf_dot_q8_fn)(void (*)(void))mf_dot_bf16_f32;
    case CK_DT_Q4_0: return mf_dot_q4_0_q8_0;
    case CK_DT_Q4_1: return mf_dot_q4_1_q8_0;
    case CK_DT_Q5_0: return mf_dot_q5_0_q8_0;
    case CK_DT_Q5_1: return mf_dot_q5_1_q8_0;
    case CK_DT_Q8_0: return mf_dot_q8_0_q8_0;
    case CK_DT_Q4_K: return mf_dot_q4_K_q8_K;
    case CK_DT_Q5_K: return mf_dot_q5_K_q8_K;
    case CK_DT_Q6_K: return mf_dot_q6_K_q8_K;
    default: return NULL;
    }
}

/* The activation format the int8 path pairs with weights of dt: Q8_0 for the 32-weight block
 * formats, Q8_K for the K-quants, FP32 (no quantization) for the float formats; -1 otherwise.
 * dt may also be an activation format itself (Q8_0, Q8_K), which maps to itself. */
static inline int mf_activation_dtype(int dt)
{
    switch (dt) {
    case CK_DT_Q4_0: case CK_DT_Q4_1: case CK_DT_Q5_0: case CK_DT_Q5_1: case CK_DT_Q8_0:
        return CK_DT_Q8_0;
    case CK_DT_Q4_K: case CK_DT_Q5_K: case CK_DT_Q6_K: case CK_DT_Q8_K:
        return CK_DT_Q8_K;
    case CK_DT_FP32: case CK_DT_FP16: case CK_DT_BF16:
        return CK_DT_FP32;
    default:
        return -1;
    }
}

/* Bytes of one activation row of n values for weights of dt (0 for a non-weight dt). */
static inline size_t mf_activation_row_bytes(int dt, size_t n)
{
    const int adt = mf_activation_dtype(dt);
    return adt < 0 ? 0 : ck_dtype_row_bytes((CKDataType)adt, n);
}

/* x[n] -> the activation row for weights of dt, mf_activation_row_bytes(dt, n) bytes at a. */
static inline void mf_quantize_activation_row(const float *MF_RESTRICT x, void *MF_RESTRICT a,
                                              ptrdiff_t n, int dt)
{
    switch (mf_activation_dtype(dt)) {
    case CK_DT_Q8_0: mf_quantize_row_q8_0_act(x, a, n); break;
    case CK_DT_Q8_K: mf_quantize_row_q8_K(x, a, n); break;
    case CK_DT_FP32: memcpy(a, x, (size_t)n * sizeof(float)); break;
    default: break;
    }
}

static inline void mf_dequantize_row(const void *w, float *y, ptrdiff_t n, int dt)
{
    mf_dequantize_row_fn f = mf_dequantize_row_for(dt);
    if (f != NULL)
        f(w, y, n);
}

static inline void mf_quantize_row(const float *x, void *w, ptrdiff_t n, int dt)
{
    mf_quantize_row_fn f = mf_quantize_row_for(dt);
    if (f != NULL)
        f(x, w, n);
}

/* sum_i w_i x_i of one weight row (NaN for a dt that is not a weight format). */
static inline float mf_weight_row_dot_f32(const void *w, int dt, const float *x, ptrdiff_t n)
{
    mf_dot_f32_fn f = mf_dot_f32_for(dt);
    return f != NULL ? f(w, x, n) : NAN;
}

/* The int8 path's dot of one weight row with an activation row from mf_quantize_activation_row. */
static inline float mf_weight_row_dot_q8(const void *w, int dt, const void *a, ptrdiff_t n)
{
    mf_dot_q8_fn f = mf_dot_q8_for(dt);
    return f != NULL ? f(w, a, n) : NAN;
}


/* ============================================================================================ */
/* Blocks of weight rows x token rows: the projections of the int8 path                         */
/* ============================================================================================ */
/*
 * mf_q8_rows_tokens(dt, w, nr, a, a_stride, nt, n, out)
 *     out[4 * t + r] = mf_weight_row_dot_q8(w[r], dt, a + t * a_stride, n)    r < nr <= 4, t < nt
 *
 * bit for bit, whatever nr, nt and the SIMD level: every integer sum is exact, and each (row,
 * token) pair goes through the float operations of the one-row dot in the same order (a fused
 * multiply-add only where the product is exact, so it rounds as the separate multiply and add
 * do).  A token's results therefore depend neither on the other tokens or rows of the call nor
 * on the thread count.  Only the work is shared:
 *
 *  - one token (decode, mf_dot4_*): the four weight rows stream side by side past one activation
 *    row; the integer sums of four rows x two blocks are reduced by one horizontal-add tree, and
 *    the K-quants unpack their 6-bit scales with vector operations, apply them in int32
 *    (pmaddwd), and take the min / offset terms from the activation's bsums.
 *  - two or more tokens (prefill, mf_q8_tile_*): the four rows are decoded once per
 *    MF_Q8_CHUNK weights into int8 codes in a stack buffer (L1), and every pair of tokens runs
 *    against them: a 4 x 2 register block of (row, token) sums, reduced once per block (32-weight
 *    formats) or once per super-block (K-quants).
 *
 * Q4_1, Q5_1 and the float formats (and every format in the generic build) go pair by pair
 * through the one-row dots.  Rows r >= nr of out are unspecified.
 */
#if defined(__GNUC__) && !defined(__clang__)
#  define MF_Q_NO_UNROLL _Pragma("GCC unroll 1")
#else
#  define MF_Q_NO_UNROLL
#endif
#define MF_Q8_TILE_TOKENS 64     /* tokens one tile call accumulates (its stack accumulators) */
#define MF_Q8_CHUNK 1024         /* weights of each row decoded at once: 32 blocks, 4 super-blocks */

#if defined(MF_Q_AVX2)

/* [sum p0, sum p1, sum p2, sum p3 | sum p4, ..., sum p7] of eight vectors of 8 int32.
 * Unpacks and adds (vphaddd costs two cycles of both shuffle ports on AMD Zen 3). */
static inline __m256i mf_q_tree8(__m256i p0, __m256i p1, __m256i p2, __m256i p3, __m256i p4,
                                 __m256i p5, __m256i p6, __m256i p7)
{
    const __m256i a01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
    const __m256i a23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
    const __m256i a45 = _mm256_add_epi32(_mm256_unpacklo_epi32(p4, p5), _mm256_unpackhi_epi32(p4, p5));
    const __m256i a67 = _mm256_add_epi32(_mm256_unpacklo_epi32(p6, p7), _mm256_unpackhi_epi32(p6, p7));
    /* per 128-bit lane: [p0, p1, p2, p3] and [p4, p5, p6, p7] lane sums */
    const __m256i b0 = _mm256_add_epi32(_mm256_unpacklo_epi64(a01, a23), _mm256_unpackhi_epi64(a01, a23));
    const __m256i b1 = _mm256_add_epi32(_mm256_unpacklo_epi64(a45, a67), _mm256_unpackhi_epi64(a45, a67));
    /* [b0.lo | b1.hi] + [b0.hi | b1.lo] */
    return _mm256_add_epi32(_mm256_blend_epi32(b0, b1, 0xF0), _mm256_permute2x128_si256(b0, b1, 0x21));
}

/* Per 128-bit lane: [sum p0, sum p1, sum p2, sum p3] of that lane's 4 int32 of each vector. */
static inline __m256i mf_q_tree4x2(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
    const __m256i a01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
    const __m256i a23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a01, a23), _mm256_unpackhi_epi64(a01, a23));
}

/* Four fp16 in one uint64 (lane k = bits 16k..16k+15). */
static inline uint64_t mf_q_pack4(mf_fp16_t h0, mf_fp16_t h1, mf_fp16_t h2, mf_fp16_t h3)
{
    return (uint64_t)h0 | ((uint64_t)h1 << 16) | ((uint64_t)h2 << 32) | ((uint64_t)h3 << 48);
}

/* The 8 fp16 of lo (lanes 0..3) and hi (lanes 4..7) as floats. */
static inline __m256 mf_q_fp16x8_u64(uint64_t lo, uint64_t hi)
{
#if defined(MF_Q_F16C)
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
#else
    return _mm256_setr_ps(mf_fp16_to_fp32((mf_fp16_t)lo), mf_fp16_to_fp32((mf_fp16_t)(lo >> 16)),
                          mf_fp16_to_fp32((mf_fp16_t)(lo >> 32)), mf_fp16_to_fp32((mf_fp16_t)(lo >> 48)),
                          mf_fp16_to_fp32((mf_fp16_t)hi), mf_fp16_to_fp32((mf_fp16_t)(hi >> 16)),
                          mf_fp16_to_fp32((mf_fp16_t)(hi >> 32)), mf_fp16_to_fp32((mf_fp16_t)(hi >> 48)));
#endif
}

/* [f(h0) x 4 | f(h1) x 4] */
static inline __m256 mf_q_fp16_2x4(mf_fp16_t h0, mf_fp16_t h1)
{
    return mf_q_fp16x8_u64((uint64_t)h0 * 0x0001000100010001ULL, (uint64_t)h1 * 0x0001000100010001ULL);
}

/* The fp16 at p (any alignment). */
static inline mf_fp16_t mf_q_ld16(const void *p)
{
    mf_fp16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* 16 bytes of nibbles -> 32 bytes 0..15 (weights 0..15 the low nibbles, 16..31 the high):
 * a broadcast load, one shift, a blend (shifts and lane inserts share the shuffle ports). */
static inline __m256i mf_q_nib32(const uint8_t *qs)
{
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)qs));
    return _mm256_and_si256(_mm256_blend_epi32(v, _mm256_srli_epi16(v, 4), 0xF0),
                            _mm256_set1_epi8(0x0F));
}

/* Byte j = 0xFF where bit j of the little-endian uint32 at qh is set, else 0. */
static inline __m256i mf_q_bitmask32(const uint8_t *qh)
{
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)mf_le32(qh)), shuf);
    return _mm256_cmpeq_epi8(_mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL)),
                             _mm256_set1_epi64x(-1LL));
}

/* The signed codes of one Q8_0 block. */
static inline __m256i mf_q_s8_q8_0(const void *blk)
{
    return mf_q_loadu256(((const block_q8_0 *)blk)->qs);
}

/* The unsigned codes q (0..15, 0..31) of one Q4_0 / Q5_0 block: the weight is q - 8 / q - 16. */
static inline __m256i mf_q_u8_q4_0(const void *blk)
{
    return mf_q_nib32(((const block_q4_0 *)blk)->qs);
}

static inline __m256i mf_q_u8_q5_0(const void *blk)
{
    const block_q5_0 *b = (const block_q5_0 *)blk;
    return _mm256_or_si256(mf_q_nib32(b->qs), _mm256_and_si256(mf_q_bitmask32(b->qh),
                                                               _mm256_set1_epi8(0x10)));
}

/* Two consecutive blocks i, i+1 of a Q4_0 / Q5_0 row as two registers of unsigned codes:
 * lo = [weights 0..15 of i | weights 0..15 of i+1], hi = [16..31 of i | 16..31 of i+1] (one
 * 128-bit lane each block: the integer sums of the two blocks stay apart, in lanes 0-3 / 4-7
 * after pmaddwd).  The activation blocks go in the same layout (mf_q_act2). */
static inline void mf_q_u8x2_q4_0(const block_q4_0 *b, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)b[0].qs)),
        _mm_loadu_si128((const __m128i *)(const void *)b[1].qs), 1);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
}

static inline void mf_q_u8x2_q5_0(const block_q5_0 *b, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), x10 = _mm256_set1_epi8(0x10);
    const __m256i sel = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL), ones = _mm256_set1_epi64x(-1LL);
    /* 32 bytes from block i: qh of i at bytes 2-5 (lane 0), qh of i+1 at 24-27 (lane 1, 8-11);
     * byte j of the 5th-bit masks = bit j of the 16 bits a lane selects */
    const __m256i l0 = mf_q_loadu256(b);
    const __m256i shl = _mm256_set_epi64x(0x0909090909090909LL, 0x0808080808080808LL,
                                          0x0303030303030303LL, 0x0202020202020202LL);
    const __m256i shh = _mm256_set_epi64x(0x0b0b0b0b0b0b0b0bLL, 0x0a0a0a0a0a0a0a0aLL,
                                          0x0505050505050505LL, 0x0404040404040404LL);
    const __m256i bl = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_shuffle_epi8(l0, shl), sel), ones);
    const __m256i bh = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_shuffle_epi8(l0, shh), sel), ones);
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)b[0].qs)),
        _mm_loadu_si128((const __m128i *)(const void *)b[1].qs), 1);
    *lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(bl, x10));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_and_si256(bh, x10));
}

/* Activation blocks i, i+1 (Q8_0) in the layout of mf_q_u8x2_*, and oo = the int16 pair sums of
 * off * (a_lo + a_hi): what the offset takes off (q - off) . a in int16. */
static inline void mf_q_act2(const block_q8_0 *a, int off, __m256i *alo, __m256i *ahi, __m256i *oo)
{
    const __m256i a0 = mf_q_loadu256(a[0].qs), a1 = mf_q_loadu256(a[1].qs);
    const __m256i o = _mm256_set1_epi8((char)off);
    *alo = _mm256_permute2x128_si256(a0, a1, 0x20);
    *ahi = _mm256_permute2x128_si256(a0, a1, 0x31);
    *oo = _mm256_add_epi16(_mm256_maddubs_epi16(o, *alo), _mm256_maddubs_epi16(o, *ahi));
}

/* 8 int32: lanes 0-3 sum to (q - off) . a of block i, lanes 4-7 of block i+1.  int16 stays
 * exact: |maddubs| <= 2*31*127 each, |oo| <= 2*2*16*127. */
static inline __m256i mf_q_p2(__m256i lo, __m256i hi, __m256i alo, __m256i ahi, __m256i oo)
{
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
    return _mm256_madd_epi16(_mm256_sub_epi16(p, oo), _mm256_set1_epi16(1));
}

/* Software prefetch of the weight streams of the one-token kernels.  They read four rows side
 * by side with little load traffic per instruction, so the out-of-order window alone keeps too
 * few DRAM misses in flight (measured here: ~10 GB/s a core from DRAM against ~25 from L3); the
 * hardware prefetchers do not run far enough ahead either.  Each row prefetches what it will
 * read MF_Q_PF_ROWS rows further on -- the projections hand the rows of a weight in order, and
 * row r + 4 is where the next register block of this thread reads (rows of a matrix are
 * contiguous; a prefetch past the end of the array is harmless). */
#ifndef MF_Q_PF_ROWS
#  define MF_Q_PF_ROWS 4
#endif
#ifndef MF_Q_PF_MIN_BYTES
#  define MF_Q_PF_MIN_BYTES 16384
#endif
/* How far ahead a row of row_bytes prefetches: MF_Q_PF_ROWS rows, a whole number of 4-row blocks
 * at least MF_Q_PF_MIN_BYTES ahead (short rows need more rows of lead). */
static inline ptrdiff_t mf_q_pf_dist(ptrdiff_t row_bytes)
{
    ptrdiff_t rows = MF_Q_PF_ROWS;
    while (rows * row_bytes < MF_Q_PF_MIN_BYTES)
        rows += 4;
    return rows * row_bytes;
}
#ifndef MF_Q_PF_HINT
#  define MF_Q_PF_HINT _MM_HINT_T1          /* into L2: long rows (w2) would thrash L1 */
#endif
static inline void mf_q_prefetch(const void *p, ptrdiff_t bytes, ptrdiff_t dist)
{
    const char *c = (const char *)p + dist;
    for (ptrdiff_t o = 0; o < bytes; o += 64)
        _mm_prefetch(c + o, MF_Q_PF_HINT);
}

/* ---- one token: 4 rows of a symmetric 32-weight format (Q4_0, Q5_0, Q8_0) ----------------- */
/* The 8 int32 lanes summing to the integer dot of one block with activation block A.
 * Q4_0 / Q5_0: unsigned codes q, the offset folded in int16 before the pair sums:
 * (q - off) . a = sum of pmaddwd(maddubs(q, a) - maddubs(off, a), 1)  (no int16 overflow: the
 * pairs are <= 2*31*127 and 2*16*127 in size).  Q8_0: the sign trick (mf_q_dot_s8s8). */
#define MF_Q_P_OFF(U, A, OA) _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(U, A), OA), _mm256_set1_epi16(1))

/* Blocks i, i+1 of the four rows: the 8 integer sums, then acc_i += dd * isum (exact). */
#define MF_DOT4_SYM_FINISH(S, i, accA, accB)                                                   \
        const __m256 dd = _mm256_mul_ps(                                                       \
            mf_q_fp16x8_u64(mf_q_pack4(w0[i].d, w1[i].d, w2[i].d, w3[i].d),                    \
                            mf_q_pack4(w0[(i) + 1].d, w1[(i) + 1].d, w2[(i) + 1].d, w3[(i) + 1].d)), \
            mf_q_fp16_2x4(a[i].d, a[(i) + 1].d));                                              \
        accA = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(dd)),                    \
                               _mm256_cvtepi32_pd(_mm256_castsi256_si128(S)), accA);           \
        accB = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(dd, 1)),                  \
                               _mm256_cvtepi32_pd(_mm256_extracti128_si256(S, 1)), accB);

/* Q4_0 / Q5_0: blocks i, i+1 in the two-block layout; one 4-vector tree for both. */
#define MF_DOT4_SYM_STEP_U2(U8X2, OFF, i, accA, accB)                                          \
    {                                                                                          \
        __m256i alo, ahi, oo, l0, h0, l1, h1, l2, h2, l3, h3;                                  \
        mf_q_act2(&a[i], OFF, &alo, &ahi, &oo);                                                \
        U8X2(&w0[i], &l0, &h0);                                                                \
        U8X2(&w1[i], &l1, &h1);                                                                \
        U8X2(&w2[i], &l2, &h2);                                                                \
        U8X2(&w3[i], &l3, &h3);                                                                \
        const __m256i S = mf_q_tree4x2(mf_q_p2(l0, h0, alo, ahi, oo), mf_q_p2(l1, h1, alo, ahi, oo), \
                                       mf_q_p2(l2, h2, alo, ahi, oo), mf_q_p2(l3, h3, alo, ahi, oo)); \
        MF_DOT4_SYM_FINISH(S, i, accA, accB)                                                   \
    }

#define MF_DOT4_SYM_STEP_S(S8, OFF, i, accA, accB)                                             \
    {                                                                                          \
        const __m256i A0 = mf_q_loadu256(a[i].qs), A1 = mf_q_loadu256(a[(i) + 1].qs);          \
        const __m256i S = mf_q_tree8(                                                          \
            mf_q_dot_s8s8(S8(&w0[i]), A0), mf_q_dot_s8s8(S8(&w1[i]), A0),                      \
            mf_q_dot_s8s8(S8(&w2[i]), A0), mf_q_dot_s8s8(S8(&w3[i]), A0),                      \
            mf_q_dot_s8s8(S8(&w0[(i) + 1]), A1), mf_q_dot_s8s8(S8(&w1[(i) + 1]), A1),          \
            mf_q_dot_s8s8(S8(&w2[(i) + 1]), A1), mf_q_dot_s8s8(S8(&w3[(i) + 1]), A1));         \
        MF_DOT4_SYM_FINISH(S, i, accA, accB)                                                   \
    }

#define MF_DOT4_SYM(NAME, BLOCK, STEP, CODES, OFF, ISUM)                                       \
static inline void NAME(const void *const *vw, const void *va, ptrdiff_t n, float *out)       \
{                                                                                              \
    const BLOCK *w0 = (const BLOCK *)vw[0], *w1 = (const BLOCK *)vw[1];                        \
    const BLOCK *w2 = (const BLOCK *)vw[2], *w3 = (const BLOCK *)vw[3];                        \
    const block_q8_0 *a = (const block_q8_0 *)va;   /* [n / 32] */                             \
    const ptrdiff_t nb = n / 32;                                                               \
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();                            \
    __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();                            \
    const ptrdiff_t pf = mf_q_pf_dist(nb * (ptrdiff_t)sizeof(BLOCK));                          \
    ptrdiff_t ib = 0;                                                                          \
    for (; ib + 4 <= nb; ib += 4) {                                                            \
        mf_q_prefetch(w0 + ib, 4 * (ptrdiff_t)sizeof(BLOCK), pf);                              \
        mf_q_prefetch(w1 + ib, 4 * (ptrdiff_t)sizeof(BLOCK), pf);                              \
        mf_q_prefetch(w2 + ib, 4 * (ptrdiff_t)sizeof(BLOCK), pf);                              \
        mf_q_prefetch(w3 + ib, 4 * (ptrdiff_t)sizeof(BLOCK), pf);                              \
        STEP(CODES, OFF, ib, acc0, acc1)                                                       \
        STEP(CODES, OFF, ib + 2, acc2, acc3)                                                   \
    }                                                                                          \
    double acc[4][4];                              /* [block % 4][row] */                      \
    _mm256_storeu_pd(acc[0], acc0);                                                            \
    _mm256_storeu_pd(acc[1], acc1);                                                            \
    _mm256_storeu_pd(acc[2], acc2);                                                            \
    _mm256_storeu_pd(acc[3], acc3);                                                            \
    const BLOCK *wr[4] = {w0, w1, w2, w3};                                                     \
    for (; ib < nb; ib++)                                                                      \
        for (int r = 0; r < 4; r++) {                                                          \
            const float dd = mf_q_fp16(wr[r][ib].d) * mf_q_fp16(a[ib].d);                      \
            acc[ib & 3][r] += (double)dd * (double)ISUM(&wr[r][ib], &a[ib]);                   \
        }                                                                                      \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = (float)((acc[0][r] + acc[1][r]) + (acc[2][r] + acc[3][r]));                   \
}

MF_DOT4_SYM(mf_dot4_q4_0_q8_0, block_q4_0, MF_DOT4_SYM_STEP_U2, mf_q_u8x2_q4_0, 8, mf_isum_q4_0)
MF_DOT4_SYM(mf_dot4_q5_0_q8_0, block_q5_0, MF_DOT4_SYM_STEP_U2, mf_q_u8x2_q5_0, 16, mf_isum_q5_0)
MF_DOT4_SYM(mf_dot4_q8_0_q8_0, block_q8_0, MF_DOT4_SYM_STEP_S, mf_q_s8_q8_0, 0, mf_isum_q8_0)

/* ---- one token: 4 rows of Q4_K / Q5_K / Q6_K -------------------------------------------- */

/* The 8 scales and 8 mins of a Q4_K / Q5_K super-block as int16: [sc0..sc7 | m0..m7]. */
static inline __m256i mf_q_k4_scales_mins(const uint8_t *scales /* [12] */)
{
    const uint32_t kmask1 = 0x3f3f3f3fu, kmask2 = 0x0f0f0f0fu, kmask3 = 0x03030303u;
    uint32_t u[4];
    memcpy(u, scales, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = uaux;
    u[0] &= kmask1;
    return _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
}

/* mf_q_k4_scales_mins of four blocks at once, in vector registers: the same bits (the 32-bit
 * shifts and masks of the scalar unpacking, applied to the four rows side by side; reads the 16
 * bytes from each scales, whose last 4 are the block's next field). */
static inline void mf_q_k4_scales_mins4(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2,
                                        const uint8_t *s3, __m256i out[4])
{
    const __m128i r0 = _mm_loadu_si128((const __m128i *)(const void *)s0);   /* u0 u1 u2 - */
    const __m128i r1 = _mm_loadu_si128((const __m128i *)(const void *)s1);
    const __m128i r2 = _mm_loadu_si128((const __m128i *)(const void *)s2);
    const __m128i r3 = _mm_loadu_si128((const __m128i *)(const void *)s3);
    const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
    const __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
    const __m128i U0 = _mm_unpacklo_epi64(t0, t1);          /* u0 of rows 0..3 */
    const __m128i U1 = _mm_unpackhi_epi64(t0, t1);          /* u1 */
    const __m128i U2 = _mm_unpacklo_epi64(t2, t3);          /* u2 */
    const __m128i k1 = _mm_set1_epi32(0x3f3f3f3f), k2 = _mm_set1_epi32(0x0f0f0f0f);
    const __m128i k3 = _mm_set1_epi32(0x03030303);
    const __m128i V3 = _mm_or_si128(_mm_and_si128(_mm_srli_epi32(U2, 4), k2),
                                    _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(U1, 6), k3), 4));
    const __m128i V1 = _mm_or_si128(_mm_and_si128(U2, k2),
                                    _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(U0, 6), k3), 4));
    const __m128i V2 = _mm_and_si128(U1, k1), V0 = _mm_and_si128(U0, k1);
    const __m128i a = _mm_unpacklo_epi32(V0, V1), b = _mm_unpacklo_epi32(V2, V3);
    const __m128i c = _mm_unpackhi_epi32(V0, V1), d = _mm_unpackhi_epi32(V2, V3);
    out[0] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(a, b));
    out[1] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(a, b));
    out[2] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(c, d));
    out[3] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(c, d));
}

/* int16 element k (0..7) of each 128-bit lane of v, in all 8 int16 of that lane. */
#define MF_Q_SEL16(v, k)                                                                       \
    _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * (k) + 1) << 8) | (2 * (k)))))

/* The codes of chunk c (sub-blocks 2c, 2c+1) of a Q4_K / Q5_K super-block. */
static inline void mf_q_codes_q4_K(const block_q4_K *b, int c, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), q = mf_q_loadu256(b->qs + 32 * c);
    *lo = _mm256_and_si256(q, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
}

static inline void mf_q_codes_q5_K(const block_q5_K *b, int c, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i q = mf_q_loadu256(b->qs + 32 * c), h = mf_q_loadu256(b->qh);
    /* bit 2c (2c+1) of each qh byte, moved to bit 4: srli_epi16 keeps bits within their byte
     * once masked to bit 0 */
    const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * c), one), 4);
    const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * c + 1), one), 4);
    *lo = _mm256_or_si256(_mm256_and_si256(q, m4), h1);
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h2);
}

/* 4 rows: acc += (d_w d_a) sumi - (dmin_w d_a) summ per row, as mf_q_kterm. */
/* 4 rows: acc += (d_w d_a) sumi - (dmin_w d_a) summ per row, as mf_q_kterm.  Chunk c (64
 * weights, sub-blocks 2c and 2c+1) of two rows at a time runs against activation registers
 * loaded once; the two sub-blocks' int16 pair sums are interleaved (unpack) so that one pmaddwd
 * applies both scales (sc_2c, sc_2c+1: 32-bit element c of the scales, vpermd -- no shuffle-mask
 * loads: vector loads bound this loop otherwise).  A loop, not unrolled: GCC spills when it is. */
#define MF_Q_K45_ROW(CODES, b, hs, ms, sr)                                                     \
    {                                                                                          \
        __m256i lo, hi;                                                                        \
        CODES(b, c, hs, &lo, &hi);                                                             \
        const __m256i p1 = _mm256_maddubs_epi16(lo, alo), p2 = _mm256_maddubs_epi16(hi, ahi);  \
        const __m256i scv = _mm256_permutevar8x32_epi32(ms, idx);                              \
        sr = _mm256_add_epi32(sr, _mm256_add_epi32(                                            \
            _mm256_madd_epi16(_mm256_unpacklo_epi16(p1, p2), scv),                             \
            _mm256_madd_epi16(_mm256_unpackhi_epi16(p1, p2), scv)));                           \
    }
/* hs: Q5_K's 5th bits, qh >> 2c (bit 0 of each byte: chunk c's low codes, bit 1: its high) */
#define MF_Q_K45_PASS(CODES, HBITS, ba, msa, sa, bb, msb, sb)                                  \
    {                                                                                          \
        __m256i idx = _mm256_setzero_si256(), hsa = HBITS(ba), hsb = HBITS(bb);                \
        MF_Q_NO_UNROLL                                                                         \
        for (int c = 0; c < 4; c++) {                                                          \
            const __m256i alo = mf_q_loadu256(ab->qs + 64 * c);                                \
            const __m256i ahi = mf_q_loadu256(ab->qs + 64 * c + 32);                           \
            MF_Q_K45_ROW(CODES, ba, hsa, msa, sa)                                              \
            MF_Q_K45_ROW(CODES, bb, hsb, msb, sb)                                              \
            idx = _mm256_add_epi32(idx, _mm256_set1_epi32(1));                                 \
            hsa = _mm256_srli_epi16(hsa, 2);                                                   \
            hsb = _mm256_srli_epi16(hsb, 2);                                                   \
        }                                                                                      \
    }
static inline __m256i mf_q_hbits_q4_K(const block_q4_K *b) { (void)b; return _mm256_setzero_si256(); }
static inline __m256i mf_q_hbits_q5_K(const block_q5_K *b) { return mf_q_loadu256(b->qh); }
static inline void mf_q_codes_q4_Kh(const block_q4_K *b, int c, __m256i hs, __m256i *lo, __m256i *hi)
{
    (void)hs;
    mf_q_codes_q4_K(b, c, lo, hi);
}
static inline void mf_q_codes_q5_Kh(const block_q5_K *b, int c, __m256i hs, __m256i *lo, __m256i *hi)
{
    /* bits 0 / 1 of each byte of hs, moved to bit 4 (masked to the byte first: the 16-bit
     * shifts of the caller leak the next byte's bits into bits 6-7) */
    const __m256i m4 = _mm256_set1_epi8(0x0F), q = mf_q_loadu256(b->qs + 32 * c);
    const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(hs, _mm256_set1_epi8(1)), 4);
    const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(hs, _mm256_set1_epi8(2)), 3);
    *lo = _mm256_or_si256(_mm256_and_si256(q, m4), h1);
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h2);
}

#define MF_DOT4_K45(NAME, BLOCK, CODES, HBITS)                                                      \
static inline void NAME(const void *const *vw, const void *va, ptrdiff_t n, float *out)       \
{                                                                                              \
    const BLOCK *w0 = (const BLOCK *)vw[0], *w1 = (const BLOCK *)vw[1];                        \
    const BLOCK *w2 = (const BLOCK *)vw[2], *w3 = (const BLOCK *)vw[3];                        \
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */                            \
    const ptrdiff_t nb = n / QK_K;                                                             \
    const ptrdiff_t pf = mf_q_pf_dist(nb * (ptrdiff_t)sizeof(BLOCK));                          \
    __m256d acc = _mm256_setzero_pd();                                                         \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        const block_q8_K *ab = &a[ib];                                                         \
        mf_q_prefetch(&w0[ib], (ptrdiff_t)sizeof(BLOCK), pf);                                  \
        mf_q_prefetch(&w1[ib], (ptrdiff_t)sizeof(BLOCK), pf);                                  \
        mf_q_prefetch(&w2[ib], (ptrdiff_t)sizeof(BLOCK), pf);                                  \
        mf_q_prefetch(&w3[ib], (ptrdiff_t)sizeof(BLOCK), pf);                                  \
        const __m128i ps = _mm_hadd_epi16(                                                     \
            _mm_loadu_si128((const __m128i *)(const void *)ab->bsums),                         \
            _mm_loadu_si128((const __m128i *)(const void *)(ab->bsums + 8)));                  \
        __m256i ms[4];                                            /* [sc | mins] int16 */     \
        mf_q_k4_scales_mins4(w0[ib].scales, w1[ib].scales, w2[ib].scales, w3[ib].scales, ms);  \
        const __m256i ms0 = ms[0], ms1 = ms[1], ms2 = ms[2], ms3 = ms[3];                       \
        const __m128i summ = _mm_hadd_epi32(                                                   \
            _mm_hadd_epi32(_mm_madd_epi16(_mm256_extracti128_si256(ms0, 1), ps),               \
                           _mm_madd_epi16(_mm256_extracti128_si256(ms1, 1), ps)),              \
            _mm_hadd_epi32(_mm_madd_epi16(_mm256_extracti128_si256(ms2, 1), ps),               \
                           _mm_madd_epi16(_mm256_extracti128_si256(ms3, 1), ps)));             \
        __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;                        \
        MF_Q_K45_PASS(CODES, HBITS, &w0[ib], ms0, s0, &w1[ib], ms1, s1)                        \
        MF_Q_K45_PASS(CODES, HBITS, &w2[ib], ms2, s2, &w3[ib], ms3, s3)                        \
        const __m128i sumi = mf_q_hsum4_epi32(s0, s1, s2, s3);                                 \
        const __m256d da = _mm256_set1_pd((double)ab->d);                                      \
        const __m256d dd = _mm256_mul_pd(_mm256_cvtps_pd(mf_q_fp16x4(                          \
            w0[ib].d, w1[ib].d, w2[ib].d, w3[ib].d)), da);                                     \
        const __m256d dm = _mm256_mul_pd(_mm256_cvtps_pd(mf_q_fp16x4(                          \
            w0[ib].dmin, w1[ib].dmin, w2[ib].dmin, w3[ib].dmin)), da);                         \
        acc = _mm256_add_pd(acc, _mm256_sub_pd(_mm256_mul_pd(dd, _mm256_cvtepi32_pd(sumi)),    \
                                               _mm256_mul_pd(dm, _mm256_cvtepi32_pd(summ))));  \
    }                                                                                          \
    double r4[4];                                                                              \
    _mm256_storeu_pd(r4, acc);                                                                 \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = (float)r4[r];                                                                 \
}

MF_DOT4_K45(mf_dot4_q4_K_q8_K, block_q4_K, mf_q_codes_q4_Kh, mf_q_hbits_q4_K)
MF_DOT4_K45(mf_dot4_q5_K_q8_K, block_q5_K, mf_q_codes_q5_Kh, mf_q_hbits_q5_K)

/* Q6_K: the pmaddwd scale vector of the k-th 32 codes of half h: [s_{8h+2k} x 8 | s_{8h+2k+1} x 8],
 * from sch = the half's 8 scales as int16 in both lanes. */
static inline __m256i mf_q_q6k_scv(__m256i sch, int k)
{
    const __m256i sel = _mm256_set_m128i(_mm_set1_epi16((short)(((4 * k + 3) << 8) | (4 * k + 2))),
                                         _mm_set1_epi16((short)(((4 * k + 1) << 8) | (4 * k))));
    return _mm256_shuffle_epi8(sch, sel);
}

/* 8 int32 lanes summing to sumi - 32 * sumo of one Q6_K super-block (see mf_dot_q6_K_q8_K). */
static inline __m256i mf_q_sumi_q6_K(const block_q6_K *b, const block_q8_K *ab, __m256i bs)
{
    const __m256i sc16 = _mm256_cvtepi8_epi16(
        _mm_loadu_si128((const __m128i *)(const void *)b->scales));
    __m256i s = _mm256_sub_epi32(_mm256_setzero_si256(),
                                 _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        mf_q6k_codes(b, h, q);
        const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                              : _mm256_permute2x128_si256(sc16, sc16, 0x00);
        for (int k = 0; k < 4; k++) {
            const __m256i p = _mm256_maddubs_epi16(q[k], mf_q_loadu256(ab->qs + 128 * h + 32 * k));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, mf_q_q6k_scv(sch, k)));
        }
    }
    return s;
}

static inline void mf_dot4_q6_K_q8_K(const void *const *vw, const void *va, ptrdiff_t n,
                                     float *out)
{
    const block_q6_K *w[4] = {(const block_q6_K *)vw[0], (const block_q6_K *)vw[1],
                              (const block_q6_K *)vw[2], (const block_q6_K *)vw[3]};
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */
    const ptrdiff_t nb = n / QK_K;
    const ptrdiff_t pf = mf_q_pf_dist(nb * (ptrdiff_t)sizeof(block_q6_K));
    __m256d acc = _mm256_setzero_pd();
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const block_q8_K *ab = &a[ib];
        const __m256i bs = mf_q_loadu256(ab->bsums);
        __m256i s[4];
        for (int r = 0; r < 4; r++) {
            mf_q_prefetch(&w[r][ib], (ptrdiff_t)sizeof(block_q6_K), pf);
            s[r] = mf_q_sumi_q6_K(&w[r][ib], ab, bs);
        }
        const __m128i sumi = mf_q_hsum4_epi32(s[0], s[1], s[2], s[3]);
        const __m256d dd = _mm256_mul_pd(_mm256_cvtps_pd(mf_q_fp16x4(
            w[0][ib].d, w[1][ib].d, w[2][ib].d, w[3][ib].d)), _mm256_set1_pd((double)ab->d));
        acc = _mm256_add_pd(acc, _mm256_mul_pd(dd, _mm256_cvtepi32_pd(sumi)));
    }
    double r4[4];
    _mm256_storeu_pd(r4, acc);
    for (int r = 0; r < 4; r++)
        out[r] = (float)r4[r];
}

/* ---- two or more tokens: 4 rows x 2 tokens against rows decoded once a chunk ------------- */

/* The fp16 scales d of blocks 0..n-1 (stride bsz bytes, d the first field) as doubles. */
static inline void mf_q_scales_pd(const char *blk, ptrdiff_t bsz, int n, double *out)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const char *p = blk + i * bsz;
        const __m256 f = mf_q_fp16x8_u64(
            mf_q_pack4(mf_q_ld16(p), mf_q_ld16(p + bsz), mf_q_ld16(p + 2 * bsz), mf_q_ld16(p + 3 * bsz)),
            mf_q_pack4(mf_q_ld16(p + 4 * bsz), mf_q_ld16(p + 5 * bsz), mf_q_ld16(p + 6 * bsz),
                       mf_q_ld16(p + 7 * bsz)));
        _mm256_storeu_pd(out + i, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
        _mm256_storeu_pd(out + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
    }
    for (; i < n; i++)
        out[i] = (double)mf_q_fp16(mf_q_ld16(blk + i * bsz));
}

/* Q4_0 / Q5_0 / Q8_0: nt (even, <= MF_Q8_TILE_TOKENS) tokens of Q8_0 rows at xq (stride xs).
 * The rows are decoded once a chunk: Q4_0 / Q5_0 into unsigned codes in the two-block layout of
 * mf_q_u8x2_* (the offset taken off in int16), Q8_0 into |w| and w (the sign trick); the block
 * scales into doubles.  Per 4 rows x 2 tokens: the integer sums of two blocks reduced by one
 * 4-vector tree a token (Q8_0: one 8-vector tree a block), dd = d_w * d_a exactly in double,
 * acc[token][block % 4][row] += dd * isum (an exact product). */
#define MF_Q_TILE_ACC(accp, k, dw, da, isum4)                                                  \
    _mm256_storeu_pd((accp) + 4 * (k), _mm256_fmadd_pd(_mm256_mul_pd(dw, _mm256_broadcast_sd(da)), \
                     _mm256_cvtepi32_pd(isum4), _mm256_loadu_pd((accp) + 4 * (k))))

static inline void mf_q8_tile_sym(int dt, const void *const *vw, const char *xq, ptrdiff_t xs,
                                  int nt, ptrdiff_t n, float *out /* [nt][4] */)
{
    enum { CH = MF_Q8_CHUNK / 32 };
    __m256i Ub[4][CH];      /* Q4_0 / Q5_0: [b], [b+1] = lo, hi of blocks b, b+1 (b even; a last
                               odd block alone, mf_q_u8_*); Q8_0: |w| of Wb */
    __m256i Wb[4][CH];      /* Q8_0: the signed codes, the same two-block layout */
    double DW[CH][4];                          /* [block][row] weight scales */
    double DA[2][CH];                          /* [token of the pair][block] activation scales */
    double acc[MF_Q8_TILE_TOKENS][4][4];       /* [token][block % 4][row] */
    const int q8 = dt == CK_DT_Q8_0;
    const int offv = dt == CK_DT_Q4_0 ? 8 : 16;
    const ptrdiff_t bsz = dt == CK_DT_Q4_0 ? (ptrdiff_t)sizeof(block_q4_0)
                        : dt == CK_DT_Q5_0 ? (ptrdiff_t)sizeof(block_q5_0)
                                           : (ptrdiff_t)sizeof(block_q8_0);
    const __m256i off = _mm256_set1_epi8((char)offv);
    const ptrdiff_t nb = n / 32;
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    for (ptrdiff_t c0 = 0; c0 < nb; c0 += CH) {       /* CH even: block pairs stay in a chunk */
        const int nc = (int)(nb - c0 < CH ? nb - c0 : CH);
        for (int r = 0; r < 4; r++) {
            const char *wr = (const char *)vw[r] + c0 * bsz;
            int b = 0;
            if (dt == CK_DT_Q4_0) {
                for (; b + 1 < nc; b += 2)
                    mf_q_u8x2_q4_0((const block_q4_0 *)(const void *)(wr + b * bsz), &Ub[r][b], &Ub[r][b + 1]);
                if (b < nc)
                    Ub[r][b] = mf_q_u8_q4_0(wr + b * bsz);
            } else if (dt == CK_DT_Q5_0) {
                for (; b + 1 < nc; b += 2)
                    mf_q_u8x2_q5_0((const block_q5_0 *)(const void *)(wr + b * bsz), &Ub[r][b], &Ub[r][b + 1]);
                if (b < nc)
                    Ub[r][b] = mf_q_u8_q5_0(wr + b * bsz);
            } else {
                for (; b + 1 < nc; b += 2) {
                    const block_q8_0 *q = (const block_q8_0 *)(const void *)(wr + b * bsz);
                    const __m256i w0 = mf_q_loadu256(q[0].qs), w1 = mf_q_loadu256(q[1].qs);
                    Wb[r][b] = _mm256_permute2x128_si256(w0, w1, 0x20);
                    Wb[r][b + 1] = _mm256_permute2x128_si256(w0, w1, 0x31);
                }
                if (b < nc)
                    Wb[r][b] = mf_q_s8_q8_0(wr + b * bsz);
                for (b = 0; b < nc; b++)
                    Ub[r][b] = _mm256_sign_epi8(Wb[r][b], Wb[r][b]);
            }
            double dw[CH];
            mf_q_scales_pd(wr, bsz, nc, dw);
            for (b = 0; b < nc; b++)
                DW[b][r] = dw[b];
        }
        for (int t = 0; t + 1 < nt; t += 2) {
            const block_q8_0 *a0 = (const block_q8_0 *)(const void *)(xq + t * xs) + c0;
            const block_q8_0 *a1 = (const block_q8_0 *)(const void *)(xq + (t + 1) * xs) + c0;
            double *acc0 = &acc[t][0][0], *acc1 = &acc[t + 1][0][0];
            mf_q_scales_pd((const char *)a0, (ptrdiff_t)sizeof(block_q8_0), nc, DA[0]);
            mf_q_scales_pd((const char *)a1, (ptrdiff_t)sizeof(block_q8_0), nc, DA[1]);
            int b = 0;
            if (q8) {
                for (; b + 1 < nc; b += 2) {
                    const __m256i x0 = mf_q_loadu256(a0[b].qs), y0 = mf_q_loadu256(a0[b + 1].qs);
                    const __m256i x1 = mf_q_loadu256(a1[b].qs), y1 = mf_q_loadu256(a1[b + 1].qs);
                    const __m256i l0 = _mm256_permute2x128_si256(x0, y0, 0x20), h0 = _mm256_permute2x128_si256(x0, y0, 0x31);
                    const __m256i l1 = _mm256_permute2x128_si256(x1, y1, 0x20), h1 = _mm256_permute2x128_si256(x1, y1, 0x31);
#define MF_Q_P8(r, L, H) mf_q_dot_u8s8(mf_q_dot_u8s8(_mm256_setzero_si256(), Ub[r][b], _mm256_sign_epi8(L, Wb[r][b])), \
                                       Ub[r][b + 1], _mm256_sign_epi8(H, Wb[r][b + 1]))
                    const __m256i S0 = mf_q_tree4x2(MF_Q_P8(0, l0, h0), MF_Q_P8(1, l0, h0), MF_Q_P8(2, l0, h0), MF_Q_P8(3, l0, h0));
                    const __m256i S1 = mf_q_tree4x2(MF_Q_P8(0, l1, h1), MF_Q_P8(1, l1, h1), MF_Q_P8(2, l1, h1), MF_Q_P8(3, l1, h1));
#undef MF_Q_P8
                    const int k = (int)((c0 + b) & 3);            /* 0 or 2 */
                    const __m256d dw0 = _mm256_loadu_pd(DW[b]), dw1 = _mm256_loadu_pd(DW[b + 1]);
                    MF_Q_TILE_ACC(acc0, k, dw0, &DA[0][b], _mm256_castsi256_si128(S0));
                    MF_Q_TILE_ACC(acc0, k + 1, dw1, &DA[0][b + 1], _mm256_extracti128_si256(S0, 1));
                    MF_Q_TILE_ACC(acc1, k, dw0, &DA[1][b], _mm256_castsi256_si128(S1));
                    MF_Q_TILE_ACC(acc1, k + 1, dw1, &DA[1][b + 1], _mm256_extracti128_si256(S1, 1));
                }
            } else {
                for (; b + 1 < nc; b += 2) {
                    __m256i l0, h0, o0, l1, h1, o1;
                    mf_q_act2(&a0[b], offv, &l0, &h0, &o0);
                    mf_q_act2(&a1[b], offv, &l1, &h1, &o1);
                    const __m256i S0 = mf_q_tree4x2(
                        mf_q_p2(Ub[0][b], Ub[0][b + 1], l0, h0, o0), mf_q_p2(Ub[1][b], Ub[1][b + 1], l0, h0, o0),
                        mf_q_p2(Ub[2][b], Ub[2][b + 1], l0, h0, o0), mf_q_p2(Ub[3][b], Ub[3][b + 1], l0, h0, o0));
                    const __m256i S1 = mf_q_tree4x2(
                        mf_q_p2(Ub[0][b], Ub[0][b + 1], l1, h1, o1), mf_q_p2(Ub[1][b], Ub[1][b + 1], l1, h1, o1),
                        mf_q_p2(Ub[2][b], Ub[2][b + 1], l1, h1, o1), mf_q_p2(Ub[3][b], Ub[3][b + 1], l1, h1, o1));
                    const int k = (int)((c0 + b) & 3);            /* 0 or 2 */
                    const __m256d dw0 = _mm256_loadu_pd(DW[b]), dw1 = _mm256_loadu_pd(DW[b + 1]);
                    MF_Q_TILE_ACC(acc0, k, dw0, &DA[0][b], _mm256_castsi256_si128(S0));
                    MF_Q_TILE_ACC(acc0, k + 1, dw1, &DA[0][b + 1], _mm256_extracti128_si256(S0, 1));
                    MF_Q_TILE_ACC(acc1, k, dw0, &DA[1][b], _mm256_castsi256_si128(S1));
                    MF_Q_TILE_ACC(acc1, k + 1, dw1, &DA[1][b + 1], _mm256_extracti128_si256(S1, 1));
                }
            }
            for (; b < nc; b++) {          /* Q8_0; a last odd block of Q4_0 / Q5_0 */
                const __m256i A0 = mf_q_loadu256(a0[b].qs), A1 = mf_q_loadu256(a1[b].qs);
                __m256i S;
                if (q8) {
#define MF_Q_PS(r, A) mf_q_dot_u8s8(_mm256_setzero_si256(), Ub[r][b], _mm256_sign_epi8(A, Wb[r][b]))
                    S = mf_q_tree8(MF_Q_PS(0, A0), MF_Q_PS(1, A0), MF_Q_PS(2, A0), MF_Q_PS(3, A0),
                                   MF_Q_PS(0, A1), MF_Q_PS(1, A1), MF_Q_PS(2, A1), MF_Q_PS(3, A1));
#undef MF_Q_PS
                } else {
                    const __m256i O0 = _mm256_maddubs_epi16(off, A0), O1 = _mm256_maddubs_epi16(off, A1);
                    S = mf_q_tree8(MF_Q_P_OFF(Ub[0][b], A0, O0), MF_Q_P_OFF(Ub[1][b], A0, O0),
                                   MF_Q_P_OFF(Ub[2][b], A0, O0), MF_Q_P_OFF(Ub[3][b], A0, O0),
                                   MF_Q_P_OFF(Ub[0][b], A1, O1), MF_Q_P_OFF(Ub[1][b], A1, O1),
                                   MF_Q_P_OFF(Ub[2][b], A1, O1), MF_Q_P_OFF(Ub[3][b], A1, O1));
                }
                const __m256d dw = _mm256_loadu_pd(DW[b]);
                const int k = (int)((c0 + b) & 3);
                MF_Q_TILE_ACC(acc0, k, dw, &DA[0][b], _mm256_castsi256_si128(S));
                MF_Q_TILE_ACC(acc1, k, dw, &DA[1][b], _mm256_extracti128_si256(S, 1));
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            out[4 * t + r] = (float)((acc[t][0][r] + acc[t][1][r]) + (acc[t][2][r] + acc[t][3][r]));
}

/* Q4_K / Q5_K / Q6_K: nt (even, <= MF_Q8_TILE_TOKENS) tokens of Q8_K rows. */
static inline void mf_q8_tile_kq(int dt, const void *const *vw, const char *xq, ptrdiff_t xs,
                                 int nt, ptrdiff_t n, float *out /* [nt][4] */)
{
    enum { NS = MF_Q8_CHUNK / QK_K };
    __m256i Ub[4][NS][8];       /* codes of each 32 weights */
    __m256i SCb[4][NS][8];      /* their int16 scales for pmaddwd */
    __m256i MNb[4][NS];         /* Q4_K / Q5_K: [mins | mins] int16; Q6_K: the 16 scales int16 */
    float Db[NS][4], DMb[NS][4];
    double acc[MF_Q8_TILE_TOKENS][4];
    const int k6 = dt == CK_DT_Q6_K;
    const ptrdiff_t bsz = dt == CK_DT_Q4_K ? (ptrdiff_t)sizeof(block_q4_K)
                        : dt == CK_DT_Q5_K ? (ptrdiff_t)sizeof(block_q5_K)
                                           : (ptrdiff_t)sizeof(block_q6_K);
    const ptrdiff_t nsb = n / QK_K;
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    for (ptrdiff_t s0 = 0; s0 < nsb; s0 += NS) {
        const int ns = (int)(nsb - s0 < NS ? nsb - s0 : NS);
        for (int r = 0; r < 4; r++)
            for (int s = 0; s < ns; s++) {
                const void *blk = (const char *)vw[r] + (s0 + s) * bsz;
                if (k6) {
                    const block_q6_K *b = (const block_q6_K *)blk;
                    const __m256i sc16 = _mm256_cvtepi8_epi16(
                        _mm_loadu_si128((const __m128i *)(const void *)b->scales));
                    MNb[r][s] = sc16;
                    for (int h = 0; h < 2; h++) {
                        __m256i q[4];
                        mf_q6k_codes(b, h, q);
                        const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                              : _mm256_permute2x128_si256(sc16, sc16, 0x00);
                        for (int k = 0; k < 4; k++) {
                            Ub[r][s][4 * h + k] = q[k];
                            SCb[r][s][4 * h + k] = mf_q_q6k_scv(sch, k);
                        }
                    }
                    Db[s][r] = mf_q_fp16(b->d);
                    DMb[s][r] = 0.0f;
                } else {
                    const block_q4_K *b4 = (const block_q4_K *)blk;   /* d, dmin, scales: */
                    const __m256i ms = mf_q_k4_scales_mins(b4->scales);    /* the same in Q5_K */
                    const __m256i sc = _mm256_permute2x128_si256(ms, ms, 0x00);
                    MNb[r][s] = _mm256_permute2x128_si256(ms, ms, 0x11);
                    for (int c = 0; c < 4; c++) {
                        if (dt == CK_DT_Q4_K)
                            mf_q_codes_q4_K(b4, c, &Ub[r][s][2 * c], &Ub[r][s][2 * c + 1]);
                        else
                            mf_q_codes_q5_K((const block_q5_K *)blk, c, &Ub[r][s][2 * c],
                                            &Ub[r][s][2 * c + 1]);
                    }
                    SCb[r][s][0] = MF_Q_SEL16(sc, 0);
                    SCb[r][s][1] = MF_Q_SEL16(sc, 1);
                    SCb[r][s][2] = MF_Q_SEL16(sc, 2);
                    SCb[r][s][3] = MF_Q_SEL16(sc, 3);
                    SCb[r][s][4] = MF_Q_SEL16(sc, 4);
                    SCb[r][s][5] = MF_Q_SEL16(sc, 5);
                    SCb[r][s][6] = MF_Q_SEL16(sc, 6);
                    SCb[r][s][7] = MF_Q_SEL16(sc, 7);
                    Db[s][r] = mf_q_fp16(b4->d);
                    DMb[s][r] = mf_q_fp16(b4->dmin);
                }
            }
        for (int t = 0; t + 1 < nt; t += 2) {
            const block_q8_K *a0 = (const block_q8_K *)(const void *)(xq + t * xs) + s0;
            const block_q8_K *a1 = (const block_q8_K *)(const void *)(xq + (t + 1) * xs) + s0;
            /* the integer sums of the chunk's super-blocks first (long independent chains), then
             * their reductions and float terms (which would otherwise stall each next chain) */
            __m256i P[NS][8];               /* [super-block][row r, token 0 | row r, token 1] */
            for (int s = 0; s < ns; s++) {
                __m256i p00 = _mm256_setzero_si256(), p10 = p00, p20 = p00, p30 = p00;
                __m256i p01 = p00, p11 = p00, p21 = p00, p31 = p00;
                MF_Q_NO_UNROLL               /* unrolled, GCC spills the 8 accumulators */
                for (int j = 0; j < 8; j++) {
                    const __m256i A0 = mf_q_loadu256(a0[s].qs + 32 * j);
                    const __m256i A1 = mf_q_loadu256(a1[s].qs + 32 * j);
#define MF_Q_KQ_ROW(r, pr0, pr1)                                                               \
                    {                                                                          \
                        const __m256i u = Ub[r][s][j], sc = SCb[r][s][j];                      \
                        pr0 = _mm256_add_epi32(pr0, _mm256_madd_epi16(_mm256_maddubs_epi16(u, A0), sc)); \
                        pr1 = _mm256_add_epi32(pr1, _mm256_madd_epi16(_mm256_maddubs_epi16(u, A1), sc)); \
                    }
                    MF_Q_KQ_ROW(0, p00, p01)
                    MF_Q_KQ_ROW(1, p10, p11)
                    MF_Q_KQ_ROW(2, p20, p21)
                    MF_Q_KQ_ROW(3, p30, p31)
#undef MF_Q_KQ_ROW
                }
                P[s][0] = p00; P[s][1] = p10; P[s][2] = p20; P[s][3] = p30;
                P[s][4] = p01; P[s][5] = p11; P[s][6] = p21; P[s][7] = p31;
            }
            __m256d acc0 = _mm256_loadu_pd(acc[t]), acc1 = _mm256_loadu_pd(acc[t + 1]);
            for (int s = 0; s < ns; s++) {
                const __m256d da0 = _mm256_set1_pd((double)a0[s].d);
                const __m256d da1 = _mm256_set1_pd((double)a1[s].d);
                const __m256d dw = _mm256_cvtps_pd(_mm_loadu_ps(Db[s]));
                if (k6) {
                    const __m256i bs0 = mf_q_loadu256(a0[s].bsums), bs1 = mf_q_loadu256(a1[s].bsums);
                    __m256i q[8];
                    for (int r = 0; r < 4; r++) {
                        q[r] = _mm256_sub_epi32(P[s][r], _mm256_slli_epi32(_mm256_madd_epi16(MNb[r][s], bs0), 5));
                        q[4 + r] = _mm256_sub_epi32(P[s][4 + r], _mm256_slli_epi32(_mm256_madd_epi16(MNb[r][s], bs1), 5));
                    }
                    const __m256i S = mf_q_tree8(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]);
                    acc0 = _mm256_add_pd(acc0, _mm256_mul_pd(_mm256_mul_pd(dw, da0),
                        _mm256_cvtepi32_pd(_mm256_castsi256_si128(S))));
                    acc1 = _mm256_add_pd(acc1, _mm256_mul_pd(_mm256_mul_pd(dw, da1),
                        _mm256_cvtepi32_pd(_mm256_extracti128_si256(S, 1))));
                } else {
                    const __m256i S = mf_q_tree8(P[s][0], P[s][1], P[s][2], P[s][3], P[s][4], P[s][5],
                                                 P[s][6], P[s][7]);
                    const __m128i ps0 = _mm_hadd_epi16(
                        _mm_loadu_si128((const __m128i *)(const void *)a0[s].bsums),
                        _mm_loadu_si128((const __m128i *)(const void *)(a0[s].bsums + 8)));
                    const __m128i ps1 = _mm_hadd_epi16(
                        _mm_loadu_si128((const __m128i *)(const void *)a1[s].bsums),
                        _mm_loadu_si128((const __m128i *)(const void *)(a1[s].bsums + 8)));
                    const __m256i ps = _mm256_set_m128i(ps1, ps0);
                    const __m256i M = mf_q_tree4x2(
                        _mm256_madd_epi16(MNb[0][s], ps), _mm256_madd_epi16(MNb[1][s], ps),
                        _mm256_madd_epi16(MNb[2][s], ps), _mm256_madd_epi16(MNb[3][s], ps));
                    const __m256d dm = _mm256_cvtps_pd(_mm_loadu_ps(DMb[s]));
                    acc0 = _mm256_add_pd(acc0, _mm256_sub_pd(
                        _mm256_mul_pd(_mm256_mul_pd(dw, da0), _mm256_cvtepi32_pd(_mm256_castsi256_si128(S))),
                        _mm256_mul_pd(_mm256_mul_pd(dm, da0), _mm256_cvtepi32_pd(_mm256_castsi256_si128(M)))));
                    acc1 = _mm256_add_pd(acc1, _mm256_sub_pd(
                        _mm256_mul_pd(_mm256_mul_pd(dw, da1), _mm256_cvtepi32_pd(_mm256_extracti128_si256(S, 1))),
                        _mm256_mul_pd(_mm256_mul_pd(dm, da1), _mm256_cvtepi32_pd(_mm256_extracti128_si256(M, 1)))));
                }
            }
            _mm256_storeu_pd(acc[t], acc0);
            _mm256_storeu_pd(acc[t + 1], acc1);
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            out[4 * t + r] = (float)acc[t][r];
}

#endif /* MF_Q_AVX2 */

typedef void (*mf_dot4_fn)(const void *const *w, const void *a, ptrdiff_t n, float *out);

/* out[4 * t + r] = mf_weight_row_dot_q8(w[r], dt, a + t * a_stride, n) for r < nr, t < nt. */
static inline void mf_q8_rows_tokens(int dt, const void *const *w, int nr, const void *va,
                                     ptrdiff_t a_stride, int nt, ptrdiff_t n, float *out)
{
    const char *a = (const char *)va;
    const void *wp[4];
    for (int r = 0; r < 4; r++)
        wp[r] = w[r < nr ? r : nr - 1];       /* missing rows: the last one again (discarded) */
#if defined(MF_Q_AVX2)
    mf_dot4_fn one = NULL;
    int kquant = 0;
    switch (dt) {
    case CK_DT_Q4_0: one = mf_dot4_q4_0_q8_0; break;
    case CK_DT_Q5_0: one = mf_dot4_q5_0_q8_0; break;
    case CK_DT_Q8_0: one = mf_dot4_q8_0_q8_0; break;
    case CK_DT_Q4_K: one = mf_dot4_q4_K_q8_K; kquant = 1; break;
    case CK_DT_Q5_K: one = mf_dot4_q5_K_q8_K; kquant = 1; break;
    case CK_DT_Q6_K: one = mf_dot4_q6_K_q8_K; kquant = 1; break;
    default: break;
    }
    if (one != NULL) {
        int t = 0;
        while (nt - t >= 2) {
            int m = (nt - t) & ~1;
            if (m > MF_Q8_TILE_TOKENS)
                m = MF_Q8_TILE_TOKENS;
            if (kquant)
                mf_q8_tile_kq(dt, wp, a + t * a_stride, a_stride, m, n, out + 4 * t);
            else
                mf_q8_tile_sym(dt, wp, a + t * a_stride, a_stride, m, n, out + 4 * t);
            t += m;
        }
        if (t < nt)
            one(wp, a + t * a_stride, n, out + 4 * t);
        return;
    }
#endif
    {
        mf_dot_q8_fn f = mf_dot_q8_for(dt);
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < 4; r++)
                out[4 * t + r] = (r < nr && f != NULL) ? f(wp[r], a + t * a_stride, n) : 0.0f;
    }
}

#endif /* MEGAFUSE_MF_QUANT_H */
