/*
 * mf_q8_tiles.h -- the projections of the int8 path: mf_q8_rows_tokens, up to 4 weight rows
 * against any number of quantized activation rows (decode: the 4 rows stream side by side with
 * software prefetch; prefill: the rows decoded once into L1 and 4 x 2 register blocks of
 * (row, token)), the same bits as the one-row dots of mf_dot_q8.h for every pair (see below).
 *
 * Depends on: mf_dot_q8.h (the per-block integer sums, the one-row dots the generic build and the
 * other formats use), mf_format_dispatch.h (mf_dot_q8_for), mf_quant_common.h (levels, AVX2
 * building blocks, fp16 scales, Q6_K codes), ckernel_dtype.h (CKDataType).
 */
#ifndef MEGAFUSE_MF_Q8_TILES_H
#define MEGAFUSE_MF_Q8_TILES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ckernel_dtype.h"
#include "ggml_blocks.h"
#include "mf_quant_common.h"
#include "mf_dot_q8.h"
#include "mf_format_dispatch.h"

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
    const ptrdiff_t nb = n / QK8_0;                                                            \
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
    const ptrdiff_t nb = n / QK8_0;
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

#endif /* MEGAFUSE_MF_Q8_TILES_H */
