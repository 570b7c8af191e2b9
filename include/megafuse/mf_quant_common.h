/*
 * mf_quant_common.h -- what several roles of the weight formats share: the SIMD level switches
 * of the quant headers, scalar arithmetic helpers (products that never fuse, GGML's rounding),
 * the software prefetch of the multi-row kernels, the AVX2 building blocks of the integer paths,
 * and the block pieces that dequantize, the float dots and the int8 dots all decode the same way
 * (fp16 scales, K-quant sub-block scales, Q6_K codes).  A helper only one role uses lives in that
 * role's header.
 *
 * SIMD levels.  One source, compiled once per level with the #if ladder of mf_simd.h
 * (MF_SIMD_AVX512 / MF_SIMD_AVX2 / MF_SIMD_NEON / generic).  MF_Q_AVX2 selects the 256-bit integer
 * + FMA bodies of every quant header; the AVX-512 level uses them too (its flags include AVX2, FMA
 * and F16C), with AVX-512 VNNI (vpdpbusd, MF_Q_VNNI) for the 8-bit products.  MF_Q_F16C: fp16
 * scales through F16C.  Each function keeps its scalar and SIMD bodies side by side under one #if.
 * MF_Q_NEON (the neon, neon_dotprod and i8mm levels of aarch64): the NEON bodies live in files of
 * their own (mf_neon_quant.h, mf_neon_dot_f32.h, mf_neon_dot_q8.h, mf_neon_q8_tiles.h), which the
 * #if ladders here and in the role headers call.
 *
 * Depends on: ckernel_dtype.h (the format ids), mf_simd.h (the level, immintrin.h, mf_hsum256),
 * ggml_blocks.h (block structs, fp16 / bf16 conversions, mf_get_scale_min_k4).
 */
#ifndef MEGAFUSE_MF_QUANT_COMMON_H
#define MEGAFUSE_MF_QUANT_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ckernel_dtype.h"
#include "mf_simd.h"
#include "ggml_blocks.h"

#if defined(MF_SIMD_AVX512) || defined(MF_SIMD_AVX2)
#  define MF_Q_AVX2 1                      /* 256-bit integer + FMA bodies */
#endif
#if defined(MF_Q_AVX2) && defined(__F16C__)
#  define MF_Q_F16C 1
#endif
#if defined(MF_SIMD_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#  define MF_Q_VNNI 1
#endif
#if defined(MF_Q_VNNI) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#  define MF_Q_AMX 1                       /* the amx level: AMX-INT8 prefill tiles (mf_amx_tiles.h) */
#endif
#if defined(MF_SIMD_NEON)
#  define MF_Q_NEON 1                      /* AArch64 Advanced SIMD bodies: mf_neon_*.h */
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

/* ============================================================================================ */
/* Scalar helpers                                                                               */
/* ============================================================================================ */

/* The index of the lowest set bit of v (v != 0). */
#if defined(_MSC_VER) && !defined(__clang__)
#  include <intrin.h>
static inline int mf_ctz32(uint32_t v)
{
    unsigned long i;
    _BitScanForward(&i, v);
    return (int)i;
}
#else
static inline int mf_ctz32(uint32_t v) { return __builtin_ctz(v); }
#endif

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

/* The little-endian uint32 stored in qh[0..3] (the 5th bits of Q5_0 / Q5_1: bit j -> weight j). */
static inline uint32_t mf_le32(const uint8_t *qh)
{
    return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) |
           ((uint32_t)qh[3] << 24);
}

#if defined(MF_Q_NEON)
#  include "mf_neon_quant.h"
#endif

/* ============================================================================================ */
/* Prefetch of the weight rows ahead                                                            */
/* ============================================================================================ */

/* Software prefetch of the weight streams of the one-token multi-row kernels (int8 and float).
 * They read four rows side by side with little load traffic per instruction, so the out-of-order
 * window alone keeps too few DRAM misses in flight, and the hardware prefetchers do not run far
 * enough ahead either.
 *
 * The four rows are consecutive rows of a matrix -- the projections hand a weight's rows in
 * order -- so they are one contiguous region of 4 * row_bytes, and the next group of rows of this
 * thread follows it.  As each row advances by `bytes` (from offset `done`), the same share of the
 * region `dist` bytes further on is prefetched in address order: one stream, which the memory
 * controller reads page by page, rather than four streams a row apart.  The lead is
 * MF_Q_PF_ROWS rows, and at least MF_Q_PF_MIN_BYTES: the region's last row is prefetched late in
 * the call before its own, so a lead of one group of very short rows would leave it too little
 * time ahead.  A longer lead is slower: the lines arrive early enough to be evicted from L2
 * before use.  A prefetch past the end of the array is harmless. */
#ifndef MF_Q_PF_ROWS
#  define MF_Q_PF_ROWS 4
#endif
#ifndef MF_Q_PF_MIN_BYTES
#  define MF_Q_PF_MIN_BYTES 4096
#endif
/* How far ahead four rows of row_bytes prefetch: MF_Q_PF_ROWS rows, a whole number of 4-row
 * groups at least MF_Q_PF_MIN_BYTES ahead (short rows need more rows of lead). */
static inline ptrdiff_t mf_q_pf_dist(ptrdiff_t row_bytes)
{
    ptrdiff_t rows = MF_Q_PF_ROWS;
    if (rows * row_bytes < MF_Q_PF_MIN_BYTES)      /* the least multiple of 4 rows that reaches it */
        rows = (MF_Q_PF_MIN_BYTES + 4 * row_bytes - 1) / (4 * row_bytes) * 4;
    return rows * row_bytes;
}
#ifndef MF_Q_PF_LOCALITY
#  define MF_Q_PF_LOCALITY 2                /* _MM_HINT_T1, into L2: long rows would thrash L1 */
#endif
static inline void mf_q_prefetch(const void *p, ptrdiff_t bytes, ptrdiff_t dist)
{
#if defined(__GNUC__)
    const char *c = (const char *)p + dist;
    for (ptrdiff_t o = 0; o < bytes; o += 64)
        __builtin_prefetch(c + o, 0, MF_Q_PF_LOCALITY);
#else
    (void)p; (void)bytes; (void)dist;
#endif
}

/* Four rows from row0 (contiguous) have read `done` bytes each and go on by `bytes`: prefetch
 * 4 * bytes of the region dist = mf_q_pf_dist(row bytes) ahead, in address order. */
static inline void mf_q_prefetch4(const void *row0, ptrdiff_t row_bytes, ptrdiff_t done,
                                  ptrdiff_t bytes, ptrdiff_t dist)
{
#if defined(MF_Q_PF_PERROW)
    for (int r = 0; r < 4; r++)
        mf_q_prefetch((const char *)row0 + r * row_bytes + done, bytes, dist);
#else
    (void)row_bytes;
    mf_q_prefetch((const char *)row0 + 4 * done, 4 * bytes, dist);
#endif
}

/* A second, near prefetch of the one-token int8 dots: each of the four rows' next bytes, `near`
 * bytes ahead of where that row reads, into L1 (_MM_HINT_T0), beside the far one into L2 above.
 * Where the dot does much work per weight byte (the 4- and 5-bit formats unpack nibbles and
 * scales), its loads wait on L2 often enough to keep the out-of-order window from running ahead
 * to the next misses; lines already in L1 let it.  Q8_0 and Q6_K lose with it, so they keep the
 * far prefetch alone.  One prefetch per line exactly would need a data-dependent loop count,
 * whose branches mispredict.  0 = none.  The avx512 level only: at avx2 the same dots are bound
 * by their arithmetic, to which these prefetches only add instructions. */
#ifndef MF_Q_PF_NEAR_NIBBLES
#  if defined(MF_SIMD_AVX512)
#    define MF_Q_PF_NEAR_NIBBLES 512        /* Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K */
#  else
#    define MF_Q_PF_NEAR_NIBBLES 0
#  endif
#endif
#ifndef MF_Q_PF_NEAR_BYTES
#  define MF_Q_PF_NEAR_BYTES 0              /* Q8_0, Q6_K */
#endif
/* The near lead of format dt's one-token int8 dot, in bytes (0: no near prefetch). */
static inline ptrdiff_t mf_q_pf_near(int dt)
{
    switch (dt) {
    case CK_DT_Q4_0: case CK_DT_Q4_1: case CK_DT_Q5_0: case CK_DT_Q5_1: case CK_DT_Q4_K:
    case CK_DT_Q5_K:
        return MF_Q_PF_NEAR_NIBBLES;
    case CK_DT_Q8_0: case CK_DT_Q6_K:
        return MF_Q_PF_NEAR_BYTES;
    default: return 0;
    }
}
/* Four rows from row0 (row_bytes apart) have read `done` bytes each and go on by `bytes`:
 * prefetch each row's next `bytes` from `near` bytes ahead (mf_q_pf_near(format)) into L1. */
static inline void mf_q_prefetch4_near(const void *row0, ptrdiff_t row_bytes, ptrdiff_t done,
                                       ptrdiff_t bytes, ptrdiff_t near)
{
#if defined(__GNUC__)
    if (near <= 0)
        return;
    for (int r = 0; r < 4; r++) {
        const char *c = (const char *)row0 + r * row_bytes + done + near;
        for (ptrdiff_t o = 0; o < bytes; o += 64)
            __builtin_prefetch(c + o, 0, 3);
    }
#else
    (void)row0; (void)row_bytes; (void)done; (void)bytes; (void)near;
#endif
}


/* ============================================================================================ */
/* AVX2 building blocks                                                                         */
/* ============================================================================================ */
#if defined(MF_Q_AVX2)

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

#if defined(MF_SIMD_AVX512)
/* [lo | hi]: two 256-bit registers as the halves of one 512-bit register (the avx512 level runs
 * two weight rows, or two tokens, side by side this way: each half the 256-bit sequence). */
static inline __m512i mf_q_join_i(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static inline __m512 mf_q_join_f(__m256 lo, __m256 hi)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

/* [32 bytes at pa | 32 bytes at pb]. */
static inline __m512i mf_q_loadu2x256(const void *pa, const void *pb)
{
    return mf_q_join_i(mf_q_loadu256(pa), mf_q_loadu256(pb));
}
#endif

#endif /* MF_Q_AVX2 */

/* ============================================================================================ */
/* Block pieces decoded the same way by dequantize, the float dots and the int8 dots            */
/* ============================================================================================ */

/* fp16 scales inside the dot products: F16C where the build has it.  Equal to mf_fp16_to_fp32
 * except for the payload of a NaN (which only ever yields a NaN result). */
static inline float mf_q_fp16(mf_fp16_t h)
{
#if defined(MF_Q_F16C)
    return _cvtsh_ss(h);
#elif defined(MF_Q_NEON)
    return mf_neon_fp16(h);
#else
    return mf_fp16_to_fp32(h);
#endif
}

/* mf_q_fp16 of every float16 bit pattern, for the float dots of the avx2 and avx512 levels
 * (mf_dot_f32.h): a block's scale is then one 4-byte load, which vbroadcastss or the FMA using it
 * ({1to16}) broadcasts from memory, where converting it took three vector operations (vmovd,
 * vcvtph2ps, vbroadcastss), on the shuffle port at avx512 that the codes' permutes need.  The
 * same values, so the same bits.  Filled by mf_q_fp16_table_init() when the level's module loads
 * (kernels/levels/level.pxi), before any kernel runs; 256 KiB, of which the scales of a model touch a
 * few KiB.  (ggml's CPU backend keeps the same table.) */
#if defined(MF_Q_AVX2)
static float mf_q_fp16_table[65536];
#endif
static inline void mf_q_fp16_table_init(void)
{
#if defined(MF_Q_AVX2)
    for (uint32_t h = 0; h < 65536u; h++)
        mf_q_fp16_table[h] = mf_q_fp16((mf_fp16_t)h);
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

#if defined(MF_Q_AVX2)
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

/* mf_kquant_scales in vector registers: the same 16 exact products (|sc|, |m| < 64 and d, dmin
 * fp16 fit in float32's significand), stored to dsc, dm for broadcasts. */
static inline void mf_kquant_scales8(const uint8_t *scales /* [12] */, mf_fp16_t d16,
                                     mf_fp16_t dmin16, float dsc[8], float dm[8])
{
    const __m256i ms = mf_q_k4_scales_mins(scales);                  /* [sc0..sc7 | m0..m7] */
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(ms)));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(ms, 1)));
    _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(mf_q_fp16_table[d16]), sc));
    _mm256_storeu_ps(dm, _mm256_mul_ps(_mm256_set1_ps(mf_q_fp16_table[dmin16]), mn));
}
#endif

#if defined(MF_Q_AVX2)
/* The 8 sub-block factors ls_j - 32 of an IQ4_XS super-block as int16 (mf_iq4xs_scale, for the
 * 8 at once): the low 4 bits from the nibbles of scales_l, bits 4 and 5 from bit pairs of
 * scales_h. */
static inline __m128i mf_q_iq4xs_scales16(const block_iq4_xs *b)
{
    uint32_t l;
    memcpy(&l, b->scales_l, 4);
    const __m128i m4 = _mm_set1_epi8(0x0F), v = _mm_cvtsi32_si128((int)l);
    const __m128i lo = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    /* byte j: the byte of scales_h holding ls_j's top bits (j / 4), tested at bits 2 (j % 4), +1 */
    const __m128i hb = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)b->scales_h),
                                        _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, -1, -1, -1, -1, -1,
                                                      -1, -1, -1));
    const __m128i b0 = _mm_setr_epi8(1, 4, 16, 64, 1, 4, 16, 64, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i b1 = _mm_setr_epi8(2, 8, 32, -128, 2, 8, 32, -128, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i h0 = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(hb, b0), b0), _mm_set1_epi8(16));
    const __m128i h1 = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(hb, b1), b1), _mm_set1_epi8(32));
    const __m128i ls = _mm_or_si128(lo, _mm_or_si128(h0, h1));     /* bytes 0..7 */
    return _mm_sub_epi16(_mm_cvtepu8_epi16(ls), _mm_set1_epi16(32));
}

/* The 16 6-bit scales (0..63) of a Q3_K super-block in one register (mf_q3k_scales' bytes, in
 * registers: no store and reload).  Reads the 12 bytes at scales only. */
static inline __m128i mf_q_q3k_scales16(const uint8_t *scales /* [12] */)
{
    uint32_t t;
    memcpy(&t, scales + 8, 4);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i a = _mm_loadl_epi64((const __m128i *)(const void *)scales);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(a, m4),
                                          _mm_and_si128(_mm_srli_epi16(a, 4), m4));
    /* top bits: scales[8 + j % 4] >> 2 (j / 4), each 4-byte group of t shifted by 0, 2, 4, 6 */
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)t), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    return _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
}

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
#if defined(MF_SIMD_AVX512)
/* mf_q6k_codes of two super-blocks side by side: q[k] = [a's q[k] | b's q[k]]. */
static inline void mf_q6k_codes2(const block_q6_K *ba, const block_q6_K *bb, int h, __m512i q[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i ql0 = mf_q_loadu2x256(ba->ql + 64 * h, bb->ql + 64 * h);
    const __m512i ql1 = mf_q_loadu2x256(ba->ql + 64 * h + 32, bb->ql + 64 * h + 32);
    const __m512i qh = mf_q_loadu2x256(ba->qh + 32 * h, bb->qh + 32 * h);
    q[0] = _mm512_or_si512(_mm512_and_si512(ql0, m4),
                           _mm512_slli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(0x03)), 4));
    q[1] = _mm512_or_si512(_mm512_and_si512(ql1, m4),
                           _mm512_slli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(0x0C)), 2));
    q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql0, 4), m4),
                           _mm512_and_si512(qh, _mm512_set1_epi8(0x30)));
    q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql1, 4), m4),
                           _mm512_srli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8((char)0xC0)), 2));
}
#endif
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

#endif /* MEGAFUSE_MF_QUANT_COMMON_H */
