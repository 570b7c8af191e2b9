/*
 * mf_dot_q8.h -- the int8 dots of one weight row with one quantized activation row:
 * mf_dot_{q4_0,q4_1,q5_0,q5_1,q8_0,iq4_nl}_q8_0(const void *w, const void *a, n) against a Q8_0
 * activation row and mf_dot_{q4_K,q5_K,q6_K,q2_K,q3_K,iq4_xs}_q8_K against Q8_K blocks (a: from
 * mf_act_quant.h, in the layouts of mf_act_layout.h).
 *
 * GGML's vec_dot_*_q8_0 / *_q8_K scheme: the products of the 8-bit codes are summed exactly in
 * int32, per block (32-weight formats) or super-block (K-quants), then scaled in floating point.
 * Each dot is ONE fixed sequence of operations per (weight row, activation row) at a given SIMD
 * level, and the multi-row kernels of mf_q8_tiles.h (one token: 4 rows streaming side by side;
 * many tokens: rows decoded once into L1) run exactly that sequence for every pair, so a result
 * never depends on the rows or tokens it was computed with, nor on the thread count.
 * Precondition of every integer dot: activation codes lie in [-127, 127] (the quantizers of
 * mf_act_quant.h never produce -128).
 *
 * 32-weight formats, AVX2 (per-lane float accumulation, as ggml does).  The row goes in
 * groups of 4 blocks (the activation row's groups, mf_act_layout.h); a group is two pairs of
 * blocks (i, i+1), and a pair is two 32-byte registers whose 128-bit lanes are the two blocks.
 *   - L = 8 int32 lanes, exact: lane k < 4 sums the products of weights 4k..4k+3 and
 *     16+4k..16+4k+3 of block i, lane 4 + k the same of block i+1 (q_w the signed weight code for
 *     Q4_0 / Q5_0 / Q8_0, the unsigned code for Q4_1 / Q5_1);
 *   - Y = the group's fp16 scales as floats [d0, m0, d2, m2 | d1, m1, d3, m3] (m = 0 for the
 *     symmetric formats, m the min for Q4_1 / Q5_1), A = the activation's [d, s] floats in the
 *     same order (s = d * sum of the codes), P = Y * A (one rounding a lane: d_w * d_a in the
 *     even lanes);
 *   - acc = fma(float(L_pair0), [P0 x 4 | P4 x 4], acc), then the same for pair 1 with
 *     [P2 x 4 | P6 x 4] (a pair whose blocks are both past the row end is skipped; a pair with
 *     one block has zero codes and scales in the other);
 *   - Q4_1 / Q5_1: then acc = acc + (Y & odd lanes) * A (the mins times the activation sums:
 *     m_w * s_a in the odd lanes);
 *   - the result is the sum of acc's 8 lanes in mf_hsum256's order.
 * acc starts at +0, so it never holds -0 and adding a zero lane never changes it.
 *
 * 32-weight formats, AVX-512 with VNNI (MF_Q_BLOCK_SUMS) and the NEON levels (neon, neon_dotprod,
 * i8mm): one float chain A_k for each place k of a block in its group of 4, fed once a block:
 *   - I = the block's exact integer sum q_w . q_a (AVX-512: the 4 lanes of L that hold it, added
 *     in int32; |I| < 2^20, exact as float);
 *   - A_k = fma(float(I), d_w * d_a, A_k) (the product one rounding, as P above), then for Q4_1 /
 *     Q5_1 A_k = fma(m_w, s_a, A_k);
 *   - the result is (A0 + A2) + (A1 + A3).
 * A block past the row end adds +0 or is left out: the same bits.  The 16-row tile of AVX-512
 * (mf_q8_tile16_b32) keeps the 16 rows' chains in the lanes of a register, each lane summing a
 * whole block in place.  mf_neon_dot_q8.h runs the same sequence on 4-lane registers.
 *
 * 32-weight formats, generic level: per block the integer sum, its contribution d_w * d_a * isum
 * (+ m_w * s_a) formed in double, where it is exact, added to one of 4 double accumulators (block
 * b -> accumulator b % 4), combined as (a0 + a1) + (a2 + a3) and rounded once to float.
 *
 * K-quants, every level: per super-block the exact integer sum of the scaled sub-block products
 * and of the min (offset) term from the activation's bsums, then acc += (d_w d_a) sumi -
 * (dmin_w d_a) summ in double (one accumulator), rounded once to float.
 *
 * Depends on: mf_act_layout.h (the activation rows), mf_quant_common.h (levels, AVX2 byte
 * products and horizontal sums, fp16 scales, Q6_K codes, mf_mul_nc_d), mf_simd.h (mf_hsum256),
 * ggml_blocks.h (block structs, mf_get_scale_min_k4).
 */
#ifndef MEGAFUSE_MF_DOT_Q8_H
#define MEGAFUSE_MF_DOT_Q8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ckernel_dtype.h"
#include "ggml_blocks.h"
#include "mf_act_layout.h"
#include "mf_quant_common.h"
#include "mf_simd.h"
#if defined(MF_Q_NEON)
#  include "mf_neon_dot_q8.h"
#endif

#if defined(MF_Q_AVX2)
static inline int32_t mf_q_hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
#endif /* MF_Q_AVX2 */

/* The fp16 at p (any alignment). */
static inline mf_fp16_t mf_q_ld16(const void *p)
{
    mf_fp16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* The little-endian uint32 at p (any alignment). */
static inline uint32_t mf_q_ld32(const void *p)
{
    uint32_t u;
    memcpy(&u, p, sizeof u);
    return u;
}

/* ============================================================================================ */
/* 32-weight formats x a Q8_0 activation row                                                    */
/* ============================================================================================ */

/* The codes of block ib of a Q8_0 activation row: lo = values 0..15, hi = values 16..31. */
static inline const int8_t *mf_act_lo(const void *a, ptrdiff_t ib)
{
    return (const int8_t *)a + (ib >> 1) * 64 + (ib & 1) * 16;
}

#if defined(MF_Q_AVX2)

/* Block format parameters: bytes a block, where its fp16 d (and m) sit, the nibbles, the 5th
 * bits (Q5_0 / Q5_1). */
#define MF_Q_BSZ_Q4_0 ((ptrdiff_t)sizeof(block_q4_0))
#define MF_Q_BSZ_Q4_1 ((ptrdiff_t)sizeof(block_q4_1))
#define MF_Q_BSZ_Q5_0 ((ptrdiff_t)sizeof(block_q5_0))
#define MF_Q_BSZ_Q5_1 ((ptrdiff_t)sizeof(block_q5_1))
#define MF_Q_BSZ_Q8_0 ((ptrdiff_t)sizeof(block_q8_0))
#define MF_Q_BSZ_IQ4_NL ((ptrdiff_t)sizeof(block_iq4_nl))
#define MF_Q_QS_Q4_0 ((ptrdiff_t)offsetof(block_q4_0, qs))
#define MF_Q_QS_Q4_1 ((ptrdiff_t)offsetof(block_q4_1, qs))
#define MF_Q_QS_Q5_0 ((ptrdiff_t)offsetof(block_q5_0, qs))
#define MF_Q_QS_Q5_1 ((ptrdiff_t)offsetof(block_q5_1, qs))
#define MF_Q_QS_Q8_0 ((ptrdiff_t)offsetof(block_q8_0, qs))
#define MF_Q_QS_IQ4_NL ((ptrdiff_t)offsetof(block_iq4_nl, qs))
#define MF_Q_QH_Q5_0 ((ptrdiff_t)offsetof(block_q5_0, qh))
#define MF_Q_QH_Q5_1 ((ptrdiff_t)offsetof(block_q5_1, qh))

/* One group of a Q8_0 activation row in registers (mf_act_layout.h). */
typedef struct {
    __m256i lo[2], hi[2];       /* the codes of pairs 0 and 1 */
    __m256i oo[2];              /* Q4_0 / Q5_0: off * (a_lo + a_hi) as int16 pair sums; with
                                 * VNNI their int32 lane sums, negated (mf_q_lanes_uo) */
    __m256 f;                   /* [d0, s0, d2, s2 | d1, s1, d3, s3] */
} mf_q_agrp;

/* Group g of the activation row a (n values); off: the weight codes' offset (8 for Q4_0, 16 for
 * Q5_0), 0 for none. */
static inline void mf_q_agrp_load(const void *a, ptrdiff_t n, ptrdiff_t g, int off, mf_q_agrp *A)
{
    const int8_t *c = mf_act_q8_0_codes(a, (size_t)g);
    A->lo[0] = _mm256_loadu_si256((const __m256i *)(const void *)c);
    A->hi[0] = _mm256_loadu_si256((const __m256i *)(const void *)(c + 32));
    A->lo[1] = _mm256_loadu_si256((const __m256i *)(const void *)(c + 64));
    A->hi[1] = _mm256_loadu_si256((const __m256i *)(const void *)(c + 96));
    A->f = _mm256_loadu_ps(mf_act_q8_0_f(a, (size_t)n, (size_t)g));
    if (off) {
        const __m256i o = _mm256_set1_epi8((char)off);
        for (int p = 0; p < 2; p++) {
            A->oo[p] = _mm256_add_epi16(_mm256_maddubs_epi16(o, A->lo[p]),
                                        _mm256_maddubs_epi16(o, A->hi[p]));
#if defined(MF_Q_VNNI)
            A->oo[p] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_madd_epi16(A->oo[p], _mm256_set1_epi16(1)));
#endif
        }
    } else {
        A->oo[0] = A->oo[1] = _mm256_setzero_si256();
    }
}

/* L of a pair (see the top of the file).  Unsigned codes u (0..31) with offset: (u - off) . a
 * = pmaddwd(maddubs(u_lo, a_lo) + maddubs(u_hi, a_hi) - off * (a_lo + a_hi), 1), exact in int16
 * (|maddubs| <= 2*31*127 each, their sum <= 15748, the difference <= 4*16*127). */
static inline __m256i mf_q_lanes_uo(__m256i ulo, __m256i uhi, __m256i alo, __m256i ahi, __m256i oo)
{
#if defined(MF_Q_VNNI)          /* oo: the negated int32 sums; the same L in two vpdpbusd */
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(oo, ulo, alo), uhi, ahi);
#else
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(ulo, alo), _mm256_maddubs_epi16(uhi, ahi));
    return _mm256_madd_epi16(_mm256_sub_epi16(p, oo), _mm256_set1_epi16(1));
#endif
}

/* Unsigned codes without offset (Q4_1, Q5_1). */
static inline __m256i mf_q_lanes_u(__m256i ulo, __m256i uhi, __m256i alo, __m256i ahi)
{
#if defined(MF_Q_VNNI)
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ulo, alo), uhi, ahi);
#else
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(ulo, alo), _mm256_maddubs_epi16(uhi, ahi));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

/* Signed codes s (Q8_0) with u = |s|: the sign trick, one pmaddwd per register (two int16 pairs
 * of 127 * 127 would overflow). */
static inline __m256i mf_q_lanes_s(__m256i ulo, __m256i slo, __m256i uhi, __m256i shi, __m256i alo,
                                   __m256i ahi)
{
    return mf_q_dot_u8s8(mf_q_dot_u8s8(_mm256_setzero_si256(), ulo, _mm256_sign_epi8(alo, slo)),
                         uhi, _mm256_sign_epi8(ahi, shi));
}

/* The same L as mf_q_lanes_uo, another way (the tiles of Q4_0 / Q5_0, where the weights are
 * decoded once for many tokens): signed codes s = u - off against the activation codes biased to
 * unsigned, a + 128 (alo, ahi here), minus c = 128 * (the pair sums of s_lo + s_hi), which the
 * decoding computes once.  No per-token offset term; exact in int16 (|maddubs| <= 2*255*16,
 * their sum <= 16320, c <= 4*128*16). */
static inline __m256i mf_q_lanes_b(__m256i slo, __m256i shi, __m256i c, __m256i alo, __m256i ahi)
{
#if defined(MF_Q_VNNI)          /* c: the negated int32 sums (mf_q_wgrp_bias) */
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(c, alo, slo), ahi, shi);
#else
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(alo, slo), _mm256_maddubs_epi16(ahi, shi));
    return _mm256_madd_epi16(_mm256_sub_epi16(p, c), _mm256_set1_epi16(1));
#endif
}

/* acc = fma(float(L), D, acc), D = [dd_i x 4 | dd_i+1 x 4]: P's element 0 (pair 0) or 2 (pair
 * 1) of each 128-bit lane (the group's lane order puts blocks 0, 2 in lane 0 and 1, 3 in lane 1). */
static inline __m256 mf_q_acc_pair(__m256 acc, __m256i L, __m256 P, int pair)
{
    const __m256 D = pair ? _mm256_permute_ps(P, 0xAA) : _mm256_permute_ps(P, 0x00);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(L), D, acc);
}

/* Q4_1 / Q5_1: acc + (Y & odd lanes) * A.f, the mins times the activation sums. */
static inline __m256 mf_q_acc_mins(__m256 acc, __m256 Y, __m256 f)
{
    const __m256 odd = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1));
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_and_ps(Y, odd), f));
}

#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
/* The avx512 level's sequence: exact block sums, then one fused step a group (the NEON levels'
 * sequence, see the top of the file). */
#  define MF_Q_BLOCK_SUMS 1

/* The exact integer sums of a group's 4 blocks from its pairs' lanes L0 (blocks 0 | 1) and L1
 * (blocks 2 | 3), as [I0, I2, I0, I2 | I1, I3, I1, I3]: per 128-bit lane the block of the even
 * pair, then the odd pair's, twice.  Integer additions, so any order gives the same sums. */
static inline __m256i mf_q_block_sums(__m256i L0, __m256i L1)
{
    const __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(L0, L1), _mm256_unpackhi_epi32(L0, L1));
    return _mm256_add_epi32(a, _mm256_shuffle_epi32(a, _MM_SHUFFLE(1, 0, 3, 2)));
}

/* acc + a group's float step, lanes [A0, A2, -, - | A1, A3, -, -] (A_k: the chain of the blocks
 * at position k of their group; the other lanes repeat them): acc = fma(float(I), d_w * d_a, acc),
 * then Q4_1 / Q5_1 (asym) acc = fma(m_w, s_a, acc).  Y, f: the group's weight and activation
 * floats (mf_q_y, mf_act_layout.h). */
static inline __m256 mf_q_acc_group(__m256 acc, __m256i L0, __m256i L1, __m256 Y, __m256 f,
                                    int asym)
{
    const __m256 D = _mm256_permute_ps(_mm256_mul_ps(Y, f), _MM_SHUFFLE(2, 0, 2, 0));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mf_q_block_sums(L0, L1)), D, acc);
    if (asym)
        acc = _mm256_fmadd_ps(_mm256_permute_ps(Y, _MM_SHUFFLE(3, 1, 3, 1)),
                              _mm256_permute_ps(f, _MM_SHUFFLE(3, 1, 3, 1)), acc);
    return acc;
}

/* The 512-bit form: two rows or two tokens in the halves, each half mf_q_acc_group's lanes. */
static inline __m512 mf_q_acc_group512(__m512 acc, __m512i L0, __m512i L1, __m512 Y, __m512 f,
                                       int asym)
{
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(L0, L1), _mm512_unpackhi_epi32(L0, L1));
    const __m512i I = _mm512_add_epi32(a, _mm512_shuffle_epi32(a, _MM_PERM_BADC));
    const __m512 D = _mm512_permute_ps(_mm512_mul_ps(Y, f), _MM_SHUFFLE(2, 0, 2, 0));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), D, acc);
    if (asym)
        acc = _mm512_fmadd_ps(_mm512_permute_ps(Y, _MM_SHUFFLE(3, 1, 3, 1)),
                              _mm512_permute_ps(f, _MM_SHUFFLE(3, 1, 3, 1)), acc);
    return acc;
}

/* The result of a row's accumulator: (A0 + A2) + (A1 + A3). */
static inline float mf_q_acc_result(__m256 acc)
{
    MF_ALIGNED(32) float l[8];
    _mm256_store_ps(l, acc);
    return (l[0] + l[1]) + (l[4] + l[5]);
}
#else
/* The result of a row's accumulator: its 8 lanes summed (mf_hsum256). */
static inline float mf_q_acc_result(__m256 acc) { return mf_hsum256(acc); }
#endif

/* ---- decoding a group of weight blocks (shared by the one-token kernels and the tiles) ------ */

/* Y of nblk (1..4) blocks at b (stride bsz): the fp16 d at offset 0 of each block (symmetric
 * formats: the m lanes 0) or d, m at offsets 0, 2 (asym), as floats in the group's lane order
 * [d0, m0, d2, m2 | d1, m1, d3, m3]; blocks past nblk are 0.  Gathered in general registers (the
 * empty asm keeps GCC from turning the gather into a chain of vector shuffles). */
static inline __m256 mf_q_y(const char *b, ptrdiff_t bsz, int nblk, int asym)
{
    uint64_t u[4] = {0, 0, 0, 0};
    for (int k = 0; k < nblk; k++)
        u[k] = asym ? mf_q_ld32(b + k * bsz) : mf_q_ld16(b + k * bsz);
    uint64_t lo = u[0] | u[2] << 32, hi = u[1] | u[3] << 32;
#if defined(__GNUC__)
    __asm__("" : "+r"(lo), "+r"(hi));
#endif
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

/* Nibbles of blocks i, i+1 (qs at q0, q1) -> unsigned codes lo = [i 0..15 | i+1 0..15], hi = [i
 * 16..31 | i+1 16..31].  q1 == NULL: block i alone (the other lane 0). */
static inline void mf_q_nib_pair(const uint8_t *q0, const uint8_t *q1, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m128i v0 = _mm_loadu_si128((const __m128i *)(const void *)q0);
    const __m256i v = q1 ? _mm256_inserti128_si256(_mm256_castsi128_si256(v0),
                                                   _mm_loadu_si128((const __m128i *)(const void *)q1), 1)
                         : _mm256_zextsi128_si256(v0);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
}

/* The 5th bits of blocks i, i+1 of Q5_0 / Q5_1 (blocks of bsz bytes at b, qh at offset qho) as
 * 0x10 bytes in the layout of mf_q_nib_pair, ORed into lo, hi.  Pair: one 32-byte load from block
 * i holds both qh (i's in lane 0, i+1's in lane 1: qho + 4 <= 16 and bsz + qho + 4 <= 32); one
 * block: from its qh alone (the load would pass the row end). */
static inline void mf_q_hbits_pair(const char *b, ptrdiff_t bsz, ptrdiff_t qho, int two,
                                   __m256i *lo, __m256i *hi)
{
    const __m256i sel = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL), ones = _mm256_set1_epi64x(-1LL);
    const __m256i x10 = _mm256_set1_epi8(0x10);
    __m256i v, shl, shh;
    if (two) {
        const char q = (char)qho, r = (char)(bsz + qho - 16);
        v = _mm256_loadu_si256((const __m256i *)(const void *)b);
        shl = _mm256_setr_epi8(q, q, q, q, q, q, q, q, q + 1, q + 1, q + 1, q + 1, q + 1, q + 1, q + 1, q + 1,
                               r, r, r, r, r, r, r, r, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1);
    } else {
        v = _mm256_zextsi128_si256(_mm_cvtsi32_si128((int)mf_q_ld32(b + qho)));
        shl = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                               -128, -128, -128, -128, -128, -128, -128, -128,
                               -128, -128, -128, -128, -128, -128, -128, -128);
    }
    shh = _mm256_add_epi8(shl, _mm256_set1_epi8(2));       /* bytes 2, 3 of each qh; -126: 0 */
    const __m256i bl = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_shuffle_epi8(v, shl), sel), ones);
    const __m256i bh = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_shuffle_epi8(v, shh), sel), ones);
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(bl, x10));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(bh, x10));
}

/* Signed codes of Q8_0 blocks i, i+1 (the same layout). */
static inline void mf_q_s8_pair(const int8_t *q0, const int8_t *q1, __m256i *lo, __m256i *hi)
{
    if (q1) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)q0);
        const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)q1);
        *lo = _mm256_permute2x128_si256(a, b, 0x20);
        *hi = _mm256_permute2x128_si256(a, b, 0x31);
    } else {
        *lo = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)q0));
        *hi = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(q0 + 16)));
    }
}

/* A decoded group of one weight row: what the tiles keep in L1 and the one-token kernels in
 * registers.  u: unsigned codes (Q8_0: |w|), s: Q8_0's signed codes (the tiles' Q4_0 / Q5_0:
 * u - off), c: the tiles' Q4_0 / Q5_0 bias terms (mf_q_lanes_b), Y: the scales. */
typedef struct {
    __m256i u[2][2];            /* [pair][lo, hi] */
    __m256i s[2][2];
    __m256i c[2];
    __m256 Y;
} mf_q_wgrp;

/* Decode nblk (1..4) blocks of format dt starting at b into G. */
#define MF_Q_DEC_NIB(BSZ, QS)                                                                      for (int p = 0; 2 * p < nblk; p++) {                                                               const char *bp = b + 2 * p * (BSZ);                                                            mf_q_nib_pair((const uint8_t *)bp + (QS),                                                                    2 * p + 1 < nblk ? (const uint8_t *)bp + (BSZ) + (QS) : NULL,                                  &G->u[p][0], &G->u[p][1]);                                                   }
#define MF_Q_DEC_HB(BSZ, QH)                                                                       for (int p = 0; 2 * p < nblk; p++)                                                                 mf_q_hbits_pair(b + 2 * p * (BSZ), BSZ, QH, 2 * p + 1 < nblk, &G->u[p][0], &G->u[p][1]);

MF_ALWAYS_INLINE void mf_q_dec_q4_0(const char *b, int nblk, mf_q_wgrp *G)
{
    G->Y = mf_q_y(b, MF_Q_BSZ_Q4_0, nblk, 0);
    MF_Q_DEC_NIB(MF_Q_BSZ_Q4_0, MF_Q_QS_Q4_0)
}

MF_ALWAYS_INLINE void mf_q_dec_q4_1(const char *b, int nblk, mf_q_wgrp *G)
{
    G->Y = mf_q_y(b, MF_Q_BSZ_Q4_1, nblk, 1);
    MF_Q_DEC_NIB(MF_Q_BSZ_Q4_1, MF_Q_QS_Q4_1)
}

MF_ALWAYS_INLINE void mf_q_dec_q5_0(const char *b, int nblk, mf_q_wgrp *G)
{
    G->Y = mf_q_y(b, MF_Q_BSZ_Q5_0, nblk, 0);
    MF_Q_DEC_NIB(MF_Q_BSZ_Q5_0, MF_Q_QS_Q5_0)
    MF_Q_DEC_HB(MF_Q_BSZ_Q5_0, MF_Q_QH_Q5_0)
}

MF_ALWAYS_INLINE void mf_q_dec_q5_1(const char *b, int nblk, mf_q_wgrp *G)
{
    G->Y = mf_q_y(b, MF_Q_BSZ_Q5_1, nblk, 1);
    MF_Q_DEC_NIB(MF_Q_BSZ_Q5_1, MF_Q_QS_Q5_1)
    MF_Q_DEC_HB(MF_Q_BSZ_Q5_1, MF_Q_QH_Q5_1)
}

MF_ALWAYS_INLINE void mf_q_dec_q8_0(const char *b, int nblk, mf_q_wgrp *G)
{
    G->Y = mf_q_y(b, MF_Q_BSZ_Q8_0, nblk, 0);
    for (int p = 0; 2 * p < nblk; p++) {
        const char *bp = b + 2 * p * MF_Q_BSZ_Q8_0;
        mf_q_s8_pair((const int8_t *)bp + MF_Q_QS_Q8_0,
                     2 * p + 1 < nblk ? (const int8_t *)bp + MF_Q_BSZ_Q8_0 + MF_Q_QS_Q8_0 : NULL,
                     &G->s[p][0], &G->s[p][1]);
        G->u[p][0] = _mm256_sign_epi8(G->s[p][0], G->s[p][0]);
        G->u[p][1] = _mm256_sign_epi8(G->s[p][1], G->s[p][1]);
    }
}

/* IQ4_NL: the nibbles as Q4_0's, then their values by vpshufb: signed codes s (as Q8_0's, kind
 * 2; |s| <= 127), u = |s|.  A pair's missing second block gets codes 0. */
MF_ALWAYS_INLINE void mf_q_dec_iq4_nl(const char *b, int nblk, mf_q_wgrp *G)
{
    const __m256i kv = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(const void *)mf_kvalues_iq4nl));
    const __m256i lane0 = _mm256_setr_epi64x(-1, -1, 0, 0);
    G->Y = mf_q_y(b, MF_Q_BSZ_IQ4_NL, nblk, 0);
    MF_Q_DEC_NIB(MF_Q_BSZ_IQ4_NL, MF_Q_QS_IQ4_NL)
    for (int p = 0; 2 * p < nblk; p++)
        for (int i = 0; i < 2; i++) {
            __m256i v = _mm256_shuffle_epi8(kv, G->u[p][i]);
            if (2 * p + 1 == nblk)
                v = _mm256_and_si256(v, lane0);
            G->s[p][i] = v;
            G->u[p][i] = _mm256_abs_epi8(v);
        }
}

/* The canonical group step of one (weight row, activation row): acc + the group's terms (see the
 * top of the file).  kind: 0 unsigned with offset (Q4_0, Q5_0), 1 unsigned with mins (Q4_1,
 * Q5_1), 2 signed (Q8_0), 3 Q4_0 / Q5_0 as the tiles hold them (mf_q_lanes_b: G from
 * mf_q_wgrp_bias, A's codes biased by mf_q_agrp_bias); npairs: 1 or 2. */
MF_ALWAYS_INLINE __m256 mf_q_grp_step(int kind, const mf_q_wgrp *G, const mf_q_agrp *A, int npairs,
                                      __m256 acc)
{
#if !defined(MF_Q_BLOCK_SUMS)
    const __m256 P = _mm256_mul_ps(G->Y, A->f);
#endif
    __m256i Ls[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int p = 0; p < npairs; p++) {
        __m256i L;
        if (kind == 0)
            L = mf_q_lanes_uo(G->u[p][0], G->u[p][1], A->lo[p], A->hi[p], A->oo[p]);
        else if (kind == 1)
            L = mf_q_lanes_u(G->u[p][0], G->u[p][1], A->lo[p], A->hi[p]);
        else if (kind == 3)
            L = mf_q_lanes_b(G->s[p][0], G->s[p][1], G->c[p], A->lo[p], A->hi[p]);
        else
            L = mf_q_lanes_s(G->u[p][0], G->s[p][0], G->u[p][1], G->s[p][1], A->lo[p], A->hi[p]);
#if defined(MF_Q_BLOCK_SUMS)
        Ls[p] = L;
#else
        acc = mf_q_acc_pair(acc, L, P, p);
#endif
    }
#if defined(MF_Q_BLOCK_SUMS)
    return mf_q_acc_group(acc, Ls[0], Ls[1], G->Y, A->f, kind == 1);
#else
    (void)Ls;
    if (kind == 1)
        acc = mf_q_acc_mins(acc, G->Y, A->f);
    return acc;
#endif
}

/* Groups for kind 3: the signed codes (Q4_0 / Q5_0: from the unsigned codes) and the bias
 * terms.  With VNNI the Q8_0 tiles take kind 3 too (off 0): vpdpbusd sums (a + 128) * s in int32,
 * where vpmaddubsw's int16 pairs could saturate (2 * 255 * 128 for a code -128). */
static inline void mf_q_wgrp_bias(mf_q_wgrp *G, int off)
{
    const __m256i o = _mm256_set1_epi8((char)off), b = _mm256_set1_epi8((char)0x80);
    for (int p = 0; p < 2; p++) {
        if (off) {              /* Q8_0 (off 0, VNNI only): s holds its signed codes already */
            G->s[p][0] = _mm256_sub_epi8(G->u[p][0], o);
            G->s[p][1] = _mm256_sub_epi8(G->u[p][1], o);
        }
#if defined(MF_Q_VNNI)          /* as int32 lane sums, negated (mf_q_lanes_b) */
        G->c[p] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), b, G->s[p][0]), b, G->s[p][1]));
#else
        G->c[p] = _mm256_add_epi16(_mm256_maddubs_epi16(b, G->s[p][0]),
                                   _mm256_maddubs_epi16(b, G->s[p][1]));
#endif
    }
}

/* An activation group's codes for kind 3: a + 128 as unsigned bytes (|a| <= 127). */
static inline void mf_q_agrp_bias(mf_q_agrp *A)
{
    const __m256i b = _mm256_set1_epi8((char)0x80);
    for (int p = 0; p < 2; p++) {
        A->lo[p] = _mm256_xor_si256(A->lo[p], b);
        A->hi[p] = _mm256_xor_si256(A->hi[p], b);
    }
}

/* The per-format constants of the 32-weight steps, by CKDataType (constant-folded: every caller
 * passes a literal dt). */
MF_ALWAYS_INLINE int mf_q_off(int dt) { return dt == CK_DT_Q4_0 ? 8 : dt == CK_DT_Q5_0 ? 16 : 0; }
MF_ALWAYS_INLINE int mf_q_kind(int dt)
{
    return (dt == CK_DT_Q4_1 || dt == CK_DT_Q5_1) ? 1
         : (dt == CK_DT_Q8_0 || dt == CK_DT_IQ4_NL) ? 2 : 0;
}
MF_ALWAYS_INLINE ptrdiff_t mf_q_bsz(int dt)
{
    switch (dt) {
    case CK_DT_Q4_0: return MF_Q_BSZ_Q4_0;
    case CK_DT_Q4_1: return MF_Q_BSZ_Q4_1;
    case CK_DT_Q5_0: return MF_Q_BSZ_Q5_0;
    case CK_DT_Q5_1: return MF_Q_BSZ_Q5_1;
    case CK_DT_IQ4_NL: return MF_Q_BSZ_IQ4_NL;
    default: return MF_Q_BSZ_Q8_0;
    }
}
MF_ALWAYS_INLINE void mf_q_dec(int dt, const char *b, int nblk, mf_q_wgrp *G)
{
    switch (dt) {
    case CK_DT_Q4_0: mf_q_dec_q4_0(b, nblk, G); break;
    case CK_DT_Q4_1: mf_q_dec_q4_1(b, nblk, G); break;
    case CK_DT_Q5_0: mf_q_dec_q5_0(b, nblk, G); break;
    case CK_DT_Q5_1: mf_q_dec_q5_1(b, nblk, G); break;
    case CK_DT_IQ4_NL: mf_q_dec_iq4_nl(b, nblk, G); break;
    default: mf_q_dec_q8_0(b, nblk, G); break;
    }
}

/* Blocks of group g of a row of nb blocks (1..4). */
MF_ALWAYS_INLINE int mf_q_grp_blocks(ptrdiff_t nb, ptrdiff_t g)
{
    return (int)(nb - 4 * g < 4 ? nb - 4 * g : 4);
}

/* One weight row of format dt x one activation row. */
MF_ALWAYS_INLINE float mf_q_dot_row(int dt, const void *vw, const void *va, ptrdiff_t n)
{
    const char *w = (const char *)vw;                   /* [n / 32] blocks */
    const ptrdiff_t nb = n / QK8_0, ng = (ptrdiff_t)mf_act_q8_0_groups((size_t)n);
    __m256 acc = _mm256_setzero_ps();
    for (ptrdiff_t g = 0; g < ng; g++) {
        const int nblk = mf_q_grp_blocks(nb, g);
        mf_q_agrp A;
        mf_q_wgrp G;
        mf_q_agrp_load(va, n, g, mf_q_off(dt), &A);
        mf_q_dec(dt, w + 4 * g * mf_q_bsz(dt), nblk, &G);
        acc = mf_q_grp_step(mf_q_kind(dt), &G, &A, (nblk + 1) / 2, acc);
    }
    return mf_q_acc_result(acc);
}

#define MF_DOT_Q8_0(NAME, DT)                                                                  \
static inline float NAME(const void *MF_RESTRICT vw, const void *MF_RESTRICT va, ptrdiff_t n)  \
{                                                                                              \
    return mf_q_dot_row(DT, vw, va, n);                                                        \
}
MF_DOT_Q8_0(mf_dot_q4_0_q8_0, CK_DT_Q4_0)
MF_DOT_Q8_0(mf_dot_q4_1_q8_0, CK_DT_Q4_1)
MF_DOT_Q8_0(mf_dot_q5_0_q8_0, CK_DT_Q5_0)
MF_DOT_Q8_0(mf_dot_q5_1_q8_0, CK_DT_Q5_1)
MF_DOT_Q8_0(mf_dot_q8_0_q8_0, CK_DT_Q8_0)
MF_DOT_Q8_0(mf_dot_iq4_nl_q8_0, CK_DT_IQ4_NL)

#elif defined(MF_Q_NEON)      /* mf_neon_dot_q8.h: the NEON levels' canonical sequence */

#define MF_DOT_Q8_0_NEON(NAME, DT)                                                             \
static inline float NAME(const void *MF_RESTRICT vw, const void *MF_RESTRICT va, ptrdiff_t n)  \
{                                                                                              \
    return mf_neon_dot_row_q8_0(DT, vw, va, n);                                                \
}
MF_DOT_Q8_0_NEON(mf_dot_q4_0_q8_0, CK_DT_Q4_0)
MF_DOT_Q8_0_NEON(mf_dot_q4_1_q8_0, CK_DT_Q4_1)
MF_DOT_Q8_0_NEON(mf_dot_q5_0_q8_0, CK_DT_Q5_0)
MF_DOT_Q8_0_NEON(mf_dot_q5_1_q8_0, CK_DT_Q5_1)
MF_DOT_Q8_0_NEON(mf_dot_q8_0_q8_0, CK_DT_Q8_0)
MF_DOT_Q8_0_NEON(mf_dot_iq4_nl_q8_0, CK_DT_IQ4_NL)
#undef MF_DOT_Q8_0_NEON

#else /* generic */

/* Integer sums of one block against activation block ib (generic): 4-bit codes (Q4_0 / Q4_1)
 * or 4-bit codes with a 5th bit from qh (Q5_0 / Q5_1), minus off (8 / 16 for the symmetric
 * formats, 0 for Q4_1 / Q5_1, whose m * sum(a) term the caller adds). */
static inline int32_t mf__isum_nibbles(const uint8_t *qs, int off, const void *a, ptrdiff_t ib)
{
    const int8_t *lo = mf_act_lo(a, ib), *hi = lo + 32;
    int32_t s = 0;
    for (int j = 0; j < 16; j++)
        s += ((qs[j] & 0x0F) - off) * lo[j] + ((qs[j] >> 4) - off) * hi[j];
    return s;
}

static inline int32_t mf__isum_nibbles5(const uint8_t *qs, const uint8_t qh4[4], int off,
                                        const void *a, ptrdiff_t ib)
{
    const int8_t *lo = mf_act_lo(a, ib), *hi = lo + 32;
    const uint32_t qh = mf_le32(qh4);
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        const int q0 = ((qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4)) - off;
        const int q1 = ((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4)) - off;
        s += q0 * lo[j] + q1 * hi[j];
    }
    return s;
}

static inline int32_t mf_isum_q4_0(const block_q4_0 *w, const void *a, ptrdiff_t ib)
{
    return mf__isum_nibbles(w->qs, 8, a, ib);
}

static inline int32_t mf_isum_q5_0(const block_q5_0 *w, const void *a, ptrdiff_t ib)
{
    return mf__isum_nibbles5(w->qs, w->qh, 16, a, ib);
}

static inline int32_t mf_isum_q8_0(const block_q8_0 *w, const void *a, ptrdiff_t ib)
{
    const int8_t *lo = mf_act_lo(a, ib), *hi = lo + 32;
    int32_t s = 0;
    for (int j = 0; j < 16; j++)
        s += w->qs[j] * lo[j] + w->qs[j + 16] * hi[j];
    return s;
}

static inline int32_t mf_isum_iq4_nl(const block_iq4_nl *w, const void *a, ptrdiff_t ib)
{
    const int8_t *lo = mf_act_lo(a, ib), *hi = lo + 32;
    int32_t s = 0;
    for (int j = 0; j < 16; j++)
        s += mf_kvalues_iq4nl[w->qs[j] & 0x0F] * lo[j] + mf_kvalues_iq4nl[w->qs[j] >> 4] * hi[j];
    return s;
}

/* Q4_1 / Q5_1: the sum of q_w * q_a, q_w the unsigned codes. */
static inline int32_t mf_isum_q4_1(const block_q4_1 *w, const void *a, ptrdiff_t ib)
{
    return mf__isum_nibbles(w->qs, 0, a, ib);
}

static inline int32_t mf_isum_q5_1(const block_q5_1 *w, const void *a, ptrdiff_t ib)
{
    return mf__isum_nibbles5(w->qs, w->qh, 0, a, ib);
}

/* Block ib's contribution d_w * d_a * isum (+ m_w * s_a), exact in double: d_w * d_a is exact in
 * float (11 x 11 bits), times |isum| < 2^16 (IQ4_NL: < 2^19); m_w * s_a is 11 x 23 bits. */
#define MF_DOT_Q8_0_GENERIC(NAME, BLOCK, ISUM, MINS)                                           \
static inline float NAME(const void *MF_RESTRICT vw, const void *MF_RESTRICT va, ptrdiff_t n)  \
{                                                                                              \
    const BLOCK *w = (const BLOCK *)vw;                 /* [n / 32] */                         \
    const float *f = mf_act_q8_0_f(va, (size_t)n, 0);   /* [groups][8] */                      \
    const ptrdiff_t nb = n / QK8_0;                                                            \
    double acc[4] = {0.0, 0.0, 0.0, 0.0};                                                      \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        const float *fb = f + ib / 4 * 8 + mf_act_q8_0_f_slot((size_t)(ib % 4));   /* [d, s] */  \
        const double t = (double)(mf_q_fp16(w[ib].d) * fb[0]) * (double)ISUM(&w[ib], va, ib); \
        acc[ib & 3] += MINS(t);                                                                \
    }                                                                                          \
    return (float)((acc[0] + acc[1]) + (acc[2] + acc[3]));                                     \
}
#define MF_Q_NO_MINS(t) (t)
#define MF_Q_MINS(t) ((t) + (double)mf_q_fp16(w[ib].m) * (double)fb[1])
MF_DOT_Q8_0_GENERIC(mf_dot_q4_0_q8_0, block_q4_0, mf_isum_q4_0, MF_Q_NO_MINS)
MF_DOT_Q8_0_GENERIC(mf_dot_q4_1_q8_0, block_q4_1, mf_isum_q4_1, MF_Q_MINS)
MF_DOT_Q8_0_GENERIC(mf_dot_q5_0_q8_0, block_q5_0, mf_isum_q5_0, MF_Q_NO_MINS)
MF_DOT_Q8_0_GENERIC(mf_dot_q5_1_q8_0, block_q5_1, mf_isum_q5_1, MF_Q_MINS)
MF_DOT_Q8_0_GENERIC(mf_dot_q8_0_q8_0, block_q8_0, mf_isum_q8_0, MF_Q_NO_MINS)
MF_DOT_Q8_0_GENERIC(mf_dot_iq4_nl_q8_0, block_iq4_nl, mf_isum_iq4_nl, MF_Q_NO_MINS)

#endif /* MF_Q_AVX2 */

/* ============================================================================================ */
/* K-quants x Q8_K                                                                              */
/* ============================================================================================ */

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

/* The Q4_K / Q5_K int8 dot's part of one super-block: sum_j sc_j (code . a) (the exact int32
 * sumi) and sum_j m_j bsum_j (summ).  qh: Q5_K's 5th bits, or NULL for Q4_K (a literal at every
 * call site: the 5th-bit work folds away). */
MF_ALWAYS_INLINE void mf_q_k45_sums(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                                    const block_q8_K *a, int32_t *sumi_out, int32_t *summ_out)
{
    int sc[8], m[8];
    mf_q_unpack_sc_m(scales, sc, m);
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++)
        summ += m[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
#if defined(MF_Q_AVX2)
    const __m256i m4 = _mm256_set1_epi8(0x0F), x10 = _mm256_set1_epi8(0x10);
    const __m256i h = qh ? mf_q_loadu256(qh) : _mm256_setzero_si256();
    __m256i s = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i q = mf_q_loadu256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh) {      /* chunk c: low nibbles get bit 2c of qh, high nibbles bit 2c+1 */
            const __m256i b1 = _mm256_set1_epi8((char)(1 << (2 * c)));
            const __m256i b2 = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, b1), b1), x10));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, b2), b2), x10));
        }
        __m256i p1 = _mm256_maddubs_epi16(lo, mf_q_loadu256(a->qs + 64 * c));
        __m256i p2 = _mm256_maddubs_epi16(hi, mf_q_loadu256(a->qs + 64 * c + 32));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p1, _mm256_set1_epi16((short)sc[2 * c])));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p2, _mm256_set1_epi16((short)sc[2 * c + 1])));
    }
    sumi = mf_q_hsum_epi32(s);
#elif defined(MF_Q_NEON)
    sumi = mf_neon_sumi_k45(sc, qs, qh, a->qs);
#else
    for (int j = 0; j < 8; j++) {
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        const int8_t *aj = a->qs + 32 * j;
        int32_t t = 0;
        for (int l = 0; l < 32; l++)
            t += (((q[l] >> shift) & 0x0F) | (qh ? ((qh[l] >> j) & 1) << 4 : 0)) * aj[l];
        sumi += sc[j] * t;
    }
#endif
    *sumi_out = sumi;
    *summ_out = summ;
}

static inline float mf_dot_q4_K_q8_K(const void *MF_RESTRICT vw, const void *MF_RESTRICT va,
                                     ptrdiff_t n)
{
    const block_q4_K *w = (const block_q4_K *)vw;   /* [n / 256] */
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */
    double acc = 0.0;
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        int32_t sumi, summ;
        mf_q_k45_sums(w[ib].scales, w[ib].qs, NULL, &a[ib], &sumi, &summ);
        acc += mf_q_kterm(w[ib].d, w[ib].dmin, a[ib].d, sumi, summ);
    }
    return (float)acc;
}

static inline float mf_dot_q5_K_q8_K(const void *MF_RESTRICT vw, const void *MF_RESTRICT va,
                                     ptrdiff_t n)
{
    const block_q5_K *w = (const block_q5_K *)vw;   /* [n / 256] */
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */
    double acc = 0.0;
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        int32_t sumi, summ;
        mf_q_k45_sums(w[ib].scales, w[ib].qs, w[ib].qh, &a[ib], &sumi, &summ);
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
#elif defined(MF_Q_NEON)
        sumi = mf_neon_sumi_q6_K(&w[ib], a[ib].qs);
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

/* ---- Q2_K, Q3_K, IQ4_XS x Q8_K: the K-quant scheme (exact integer sums per super-block, then
 * double).
 *   Q2_K   sumi = sum_j sc_j (c_j . a_j), summ = sum_j m_j bsum_j (16 sub-blocks of 16):
 *          acc += (d_w d_a) sumi - (dmin_w d_a) summ;
 *   Q3_K   sumi = sum_j (sc_j - 32) ((u_j . a_j) - 4 bsum_j), u = the 2 low bits + 4 * the
 *          hmask bit (the value is u - 4): acc += (d_w d_a) sumi;
 *   IQ4_XS sumi = sum_j (ls_j - 32) (v_j . a_j), v the kvalues_iq4nl value (8 sub-blocks of
 *          32): acc += (d_w d_a) sumi.
 * |sumi| < 2^31 everywhere (IQ4_XS: 8 * 32 * 32 * 127 * 127 = 1.3e8).  At the SIMD levels a
 * super-block's activation registers are loaded once (mf_q_kxact) for every row that meets them,
 * and each row leaves 8 int32 lanes of partial sums (mf_q_row_<fmt>) whose total is sumi (and
 * summ): the one-row dot, the 4-row one-token dot and the tiles form the same integers, so
 * the same double steps give the same bits.  The NEON levels form the same integers from their
 * own registers (mf_neon_dot_q8.h). */

#if defined(MF_Q_AVX2)
/* The int16 scale pairs of pmaddwd for register k (0..3) of a half of 128 weights whose 8 scales
 * (int16) sch holds in both lanes: [s_2k x 8 | s_2k+1 x 8] (a register's lanes are two
 * sub-blocks of 16). */
static inline __m256i mf_q_sc16_sel(__m256i sch, int k)
{
    const int b = 4 * k;
    return _mm256_shuffle_epi8(sch, _mm256_set_m128i(
        _mm_set1_epi16((short)((b + 3) << 8 | (b + 2))),
        _mm_set1_epi16((short)((b + 1) << 8 | b))));
}

/* sch of half h from the 16 int16 scales sc16: its 8 scales in both 128-bit lanes. */
static inline __m256i mf_q_sc16_half(__m256i sc16, int h)
{
    return h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
             : _mm256_permute2x128_si256(sc16, sc16, 0x00);
}

/* The 2-bit codes of register k of half h of a Q2_K / Q3_K super-block (weights 128h + 32k +
 * 0..31), from the half's 32 qs bytes q. */
static inline __m256i mf_q_codes2(__m256i q, int k)
{
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), _mm256_set1_epi8(3));
}

#if defined(MF_Q_VNNI)
/* With VNNI, registers k and k + 1 of a half (sub-blocks j .. j + 3, j = 8h + 2k) in 4 operations: vpdpbusd of each (int32 lanes of 4 products: <= 4 * 7 * 127, exact as
 * int16), packed to int16 per 128-bit lane ([j x 4 | j + 2 x 4], and j + 1, j + 3 in the high
 * lane) and scaled by one vpdpwssd.  The same integer sums as the pmaddubsw / pmaddwd pair of a
 * register. */
static inline __m256i mf_q_k2_pair(__m256i s, __m256i u0, __m256i a0, __m256i u1, __m256i a1,
                                   __m256i sch, int k)
{
    const int b = 4 * k;                     /* byte of word 2k (scale of sub-block j) in sch */
    const __m256i sel = _mm256_set_m128i(
        _mm_setr_epi8((char)(b + 2), (char)(b + 3), (char)(b + 2), (char)(b + 3), (char)(b + 2),
                      (char)(b + 3), (char)(b + 2), (char)(b + 3), (char)(b + 6), (char)(b + 7),
                      (char)(b + 6), (char)(b + 7), (char)(b + 6), (char)(b + 7), (char)(b + 6),
                      (char)(b + 7)),
        _mm_setr_epi8((char)b, (char)(b + 1), (char)b, (char)(b + 1), (char)b, (char)(b + 1),
                      (char)b, (char)(b + 1), (char)(b + 4), (char)(b + 5), (char)(b + 4),
                      (char)(b + 5), (char)(b + 4), (char)(b + 5), (char)(b + 4), (char)(b + 5)));
    const __m256i z = _mm256_setzero_si256();
    const __m256i pk = _mm256_packs_epi32(_mm256_dpbusd_epi32(z, u0, a0), _mm256_dpbusd_epi32(z, u1, a1));
    return _mm256_dpwssd_epi32(s, pk, _mm256_shuffle_epi8(sch, sel));
}
#endif

/* Q3_K's third bit of weights 32 bit + 0..31 (bit = 4h + k) as 4 or 0 a byte, from hmask hm. */
static inline __m256i mf_q_hbit4(__m256i hm, int bit)
{
    const __m256i t = bit >= 2 ? _mm256_srli_epi16(hm, bit - 2) : _mm256_slli_epi16(hm, 2 - bit);
    return _mm256_and_si256(t, _mm256_set1_epi8(4));
}

/* A Q8_K block's codes as the rows' registers read them, and its bsums.  Q2_K / Q3_K: a[c] =
 * values 32c .. 32c + 31.  IQ4_XS: a[2j] = [values 0..15 of sub-block 2j | 0..15 of 2j + 1],
 * a[2j + 1] = the same of values 16..31 (the low and the high nibbles of 32 qs bytes). */
typedef struct {
    __m256i a[8];
    __m256i bs;
} mf_q_kxact;

MF_ALWAYS_INLINE void mf_q_kxact_load(int dt, const block_q8_K *a, mf_q_kxact *A)
{
    if (dt == CK_DT_IQ4_XS) {
        for (int j = 0; j < 4; j++) {
            const __m256i x0 = mf_q_loadu256(a->qs + 64 * j), x1 = mf_q_loadu256(a->qs + 64 * j + 32);
            A->a[2 * j] = _mm256_permute2x128_si256(x0, x1, 0x20);
            A->a[2 * j + 1] = _mm256_permute2x128_si256(x0, x1, 0x31);
        }
    } else {
        for (int c = 0; c < 8; c++)
            A->a[c] = mf_q_loadu256(a->qs + 32 * c);
    }
    A->bs = mf_q_loadu256(a->bsums);
}

/* One row's super-block against A: *si = 8 int32 lanes summing to sumi, *sm to summ (Q2_K). */
MF_ALWAYS_INLINE void mf_q_row_q2_K(const block_q2_K *b, const mf_q_kxact *A, __m256i *si,
                                    __m256i *sm)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)b->scales);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4));
    *sm = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4)), A->bs);
    __m256i s = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i q = mf_q_loadu256(b->qs + 32 * h), sch = mf_q_sc16_half(sc16, h);
#if defined(MF_Q_VNNI)
        for (int k = 0; k < 4; k += 2)
            s = mf_q_k2_pair(s, mf_q_codes2(q, k), A->a[4 * h + k], mf_q_codes2(q, k + 1),
                             A->a[4 * h + k + 1], sch, k);
#else
        for (int k = 0; k < 4; k++) {
            const __m256i p = _mm256_maddubs_epi16(mf_q_codes2(q, k), A->a[4 * h + k]);
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, mf_q_sc16_sel(sch, k)));
        }
#endif
    }
    *si = s;
}

MF_ALWAYS_INLINE __m256i mf_q_row_q3_K(const block_q3_K *b, const mf_q_kxact *A)
{
    const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(mf_q_q3k_scales16(b->scales)),
                                          _mm256_set1_epi16(32));
    const __m256i hm = mf_q_loadu256(b->hmask);
    __m256i s = _mm256_sub_epi32(_mm256_setzero_si256(),           /* -4 sum_j s_j bsum_j */
                                 _mm256_slli_epi32(_mm256_madd_epi16(sc16, A->bs), 2));
    for (int h = 0; h < 2; h++) {
        const __m256i q = mf_q_loadu256(b->qs + 32 * h), sch = mf_q_sc16_half(sc16, h);
#if defined(MF_Q_VNNI)
        for (int k = 0; k < 4; k += 2)
            s = mf_q_k2_pair(s, _mm256_or_si256(mf_q_codes2(q, k), mf_q_hbit4(hm, 4 * h + k)),
                             A->a[4 * h + k],
                             _mm256_or_si256(mf_q_codes2(q, k + 1), mf_q_hbit4(hm, 4 * h + k + 1)),
                             A->a[4 * h + k + 1], sch, k);
#else
        for (int k = 0; k < 4; k++) {
            const __m256i u = _mm256_or_si256(mf_q_codes2(q, k), mf_q_hbit4(hm, 4 * h + k));
            const __m256i p = _mm256_maddubs_epi16(u, A->a[4 * h + k]);
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, mf_q_sc16_sel(sch, k)));
        }
#endif
    }
    return s;
}

MF_ALWAYS_INLINE __m256i mf_q_row_iq4_xs(const block_iq4_xs *b, const mf_q_kxact *A)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m128i s8 = mf_q_iq4xs_scales16(b);                     /* ls_j - 32, int16 */
    __m256i s = _mm256_setzero_si256();
#if defined(MF_Q_VNNI)
    /* values + 128 (unsigned) by vpshufb, vpdpbusd against the codes: exact int32 lanes of 4
     * products, times ls_j - 32 by vpmulld; minus 128 sum_j (ls_j - 32) (bsum_2j + bsum_2j+1) */
    const __m256i kvu = _mm256_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141,
                                         (char)153, (char)166, (char)181, (char)197, (char)217,
                                         (char)241, 1, 24, 45, 63, 79, 93, 106, 118, (char)129,
                                         (char)141, (char)153, (char)166, (char)181, (char)197,
                                         (char)217, (char)241);
    const __m256i s32 = _mm256_cvtepi16_epi32(s8);
    const __m256i s16x2 = _mm256_set_m128i(_mm_unpackhi_epi16(s8, s8), _mm_unpacklo_epi16(s8, s8));
    s = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(s16x2, A->bs), 7));
    for (int j = 0; j < 4; j++) {
        const __m256i q = mf_q_loadu256(b->qs + 32 * j);
        const __m256i lo = _mm256_shuffle_epi8(kvu, _mm256_and_si256(q, m4));
        const __m256i hi = _mm256_shuffle_epi8(kvu, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        const __m256i t = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo,
                                                                  A->a[2 * j]), hi, A->a[2 * j + 1]);
        const __m256i scv = _mm256_permutevar8x32_epi32(s32, _mm256_setr_epi32(
            2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1));
        s = _mm256_add_epi32(s, _mm256_mullo_epi32(t, scv));
    }
#else
    /* values v (|v| <= 127): |v| x (a with v's sign), int16 pairs <= 2 * 127 * 127 */
    const __m256i kv = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(const void *)mf_kvalues_iq4nl));
    const __m256i sc2 = _mm256_broadcastsi128_si256(s8);
    for (int j = 0; j < 4; j++) {
        const __m256i q = mf_q_loadu256(b->qs + 32 * j);
        const __m256i lo = _mm256_shuffle_epi8(kv, _mm256_and_si256(q, m4));
        const __m256i hi = _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        const __m256i scv = mf_q_sc16_sel(sc2, j);                 /* [s_2j x 8 | s_2j+1 x 8] */
        const __m256i pl = _mm256_maddubs_epi16(_mm256_abs_epi8(lo), _mm256_sign_epi8(A->a[2 * j], lo));
        const __m256i ph = _mm256_maddubs_epi16(_mm256_abs_epi8(hi),
                                                _mm256_sign_epi8(A->a[2 * j + 1], hi));
        s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(pl, scv),
                                                 _mm256_madd_epi16(ph, scv)));
    }
#endif
    return s;
}
#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
/* The avx512 level's 4-row one-token dot of Q3_K: rows a and b side by side in the halves of
 * 512-bit registers ([a | b]), the activation registers broadcast to both (mf_q_kxact2): lane
 * for lane the operations of mf_q_row_q3_K, the same int32 partial sums a row.  Q3_K only: with
 * more operations a weight than Q2_K and IQ4_XS, it gains from the halved instruction count,
 * where those two measured slower on AMD Zen 4 (whose 512-bit operations take two cycles of a
 * 256-bit pipe); the figures are in benchmarks/README.md. */
typedef struct {
    __m512i a[8];
    __m512i bs;
} mf_q_kxact2;

MF_ALWAYS_INLINE void mf_q_kxact2_from(const mf_q_kxact *A, mf_q_kxact2 *B)
{
    for (int c = 0; c < 8; c++)
        B->a[c] = _mm512_broadcast_i64x4(A->a[c]);
    B->bs = _mm512_broadcast_i64x4(A->bs);
}

/* [row a's 8 scales of half h in both lanes | row b's], from sc16 = [a's 16 | b's 16] int16 */
MF_ALWAYS_INLINE __m512i mf_q_sc16_half2(__m512i sc16, int h)
{
    return h ? _mm512_shuffle_i64x2(sc16, sc16, 0xF5) : _mm512_shuffle_i64x2(sc16, sc16, 0xA0);
}

MF_ALWAYS_INLINE __m512i mf_q_k2_pair2(__m512i s, __m512i u0, __m512i a0, __m512i u1, __m512i a1,
                                       __m512i sch, int k)
{
    const int b = 4 * k;
    const __m512i sel = _mm512_broadcast_i64x4(_mm256_set_m128i(
        _mm_setr_epi8((char)(b + 2), (char)(b + 3), (char)(b + 2), (char)(b + 3), (char)(b + 2),
                      (char)(b + 3), (char)(b + 2), (char)(b + 3), (char)(b + 6), (char)(b + 7),
                      (char)(b + 6), (char)(b + 7), (char)(b + 6), (char)(b + 7), (char)(b + 6),
                      (char)(b + 7)),
        _mm_setr_epi8((char)b, (char)(b + 1), (char)b, (char)(b + 1), (char)b, (char)(b + 1),
                      (char)b, (char)(b + 1), (char)(b + 4), (char)(b + 5), (char)(b + 4),
                      (char)(b + 5), (char)(b + 4), (char)(b + 5), (char)(b + 4), (char)(b + 5))));
    const __m512i z = _mm512_setzero_si512();
    const __m512i pk = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, u0, a0), _mm512_dpbusd_epi32(z, u1, a1));
    return _mm512_dpwssd_epi32(s, pk, _mm512_shuffle_epi8(sch, sel));
}

MF_ALWAYS_INLINE __m512i mf_q_codes2x2(__m512i q, int k)
{
    return _mm512_and_si512(_mm512_srli_epi16(q, 2 * k), _mm512_set1_epi8(3));
}

MF_ALWAYS_INLINE __m512i mf_q_row2_q3_K(const block_q3_K *ba, const block_q3_K *bb,
                                        const mf_q_kxact2 *B)
{
    const __m512i sc16 = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm256_set_m128i(
        mf_q_q3k_scales16(bb->scales), mf_q_q3k_scales16(ba->scales))), _mm512_set1_epi16(32));
    const __m512i hm = mf_q_loadu2x256(ba->hmask, bb->hmask), x4 = _mm512_set1_epi8(4);
    __m512i s = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_slli_epi32(_mm512_madd_epi16(sc16, B->bs), 2));
    for (int h = 0; h < 2; h++) {
        const __m512i q = mf_q_loadu2x256(ba->qs + 32 * h, bb->qs + 32 * h);
        const __m512i sch = mf_q_sc16_half2(sc16, h);
        for (int k = 0; k < 4; k += 2) {
            const int b0 = 4 * h + k, b1 = b0 + 1;        /* the hmask bits of k, k + 1 */
            const __m512i h0 = _mm512_and_si512(b0 >= 2 ? _mm512_srli_epi16(hm, b0 - 2)
                                                        : _mm512_slli_epi16(hm, 2 - b0), x4);
            const __m512i h1 = _mm512_and_si512(b1 >= 2 ? _mm512_srli_epi16(hm, b1 - 2)
                                                        : _mm512_slli_epi16(hm, 2 - b1), x4);
            s = mf_q_k2_pair2(s, _mm512_or_si512(mf_q_codes2x2(q, k), h0), B->a[4 * h + k],
                              _mm512_or_si512(mf_q_codes2x2(q, k + 1), h1), B->a[4 * h + k + 1],
                              sch, k);
        }
    }
    return s;
}

#endif

#endif /* MF_Q_AVX2 */

/* A super-block's sumi (and summ) of one row: the one-row dots' (and the generic level's) step. */
static inline void mf_q_sums_q2_K(const block_q2_K *b, const block_q8_K *a, int32_t *sumi,
                                  int32_t *summ)
{
#if defined(MF_Q_AVX2)
    mf_q_kxact A;
    __m256i si, sm;
    mf_q_kxact_load(CK_DT_Q2_K, a, &A);
    mf_q_row_q2_K(b, &A, &si, &sm);
    *sumi = mf_q_hsum_epi32(si);
    *summ = mf_q_hsum_epi32(sm);
#elif defined(MF_Q_NEON)
    int sc[16], m[16];
    *summ = mf_neon_q2_K_scales(b, a->bsums, sc, m);
    *sumi = mf_neon_sumi_q2_K(b, sc, a->qs);
#else
    int32_t si = 0, sm = 0;
    for (int j = 0; j < 16; j++) {
        const uint8_t *q = b->qs + 32 * (j / 8) + 16 * (j % 2);
        const int shift = 2 * ((j % 8) / 2);
        int32_t t = 0;
        for (int l = 0; l < 16; l++)
            t += ((q[l] >> shift) & 3) * a->qs[16 * j + l];
        si += (b->scales[j] & 0x0F) * t;
        sm += (b->scales[j] >> 4) * a->bsums[j];
    }
    *sumi = si;
    *summ = sm;
#endif
}

static inline int32_t mf_q_sums_q3_K(const block_q3_K *b, const block_q8_K *a)
{
#if defined(MF_Q_AVX2)
    mf_q_kxact A;
    mf_q_kxact_load(CK_DT_Q3_K, a, &A);
    return mf_q_hsum_epi32(mf_q_row_q3_K(b, &A));
#elif defined(MF_Q_NEON)
    int sc[16];
    mf_neon_q3_K_scales(b, sc);
    return mf_neon_sumi_q3_K(b, sc, a->qs);
#else
    uint8_t sc[16];
    mf_q3k_scales(b->scales, sc);
    int32_t si = 0;
    for (int j = 0; j < 16; j++) {
        const int h = j / 8, k = (j % 8) / 2, bit = 4 * h + k;
        const uint8_t *q = b->qs + 32 * h + 16 * (j % 2), *hm = b->hmask + 16 * (j % 2);
        int32_t t = 0;
        for (int l = 0; l < 16; l++)
            t += (((q[l] >> (2 * k)) & 3) | (((hm[l] >> bit) & 1) << 2)) * a->qs[16 * j + l];
        si += ((int)sc[j] - 32) * (t - 4 * a->bsums[j]);
    }
    return si;
#endif
}

static inline int32_t mf_q_sums_iq4_xs(const block_iq4_xs *b, const block_q8_K *a)
{
#if defined(MF_Q_AVX2)
    mf_q_kxact A;
    mf_q_kxact_load(CK_DT_IQ4_XS, a, &A);
    return mf_q_hsum_epi32(mf_q_row_iq4_xs(b, &A));
#elif defined(MF_Q_NEON)
    int sc[8];
    mf_neon_iq4_xs_scales(b, sc);
    return mf_neon_sumi_iq4_xs(b, sc, a->qs);
#else
    int32_t si = 0;
    for (int j = 0; j < 8; j++) {
        int32_t t = 0;
        for (int l = 0; l < 16; l++)
            t += mf_kvalues_iq4nl[b->qs[16 * j + l] & 0x0F] * a->qs[32 * j + l] +
                 mf_kvalues_iq4nl[b->qs[16 * j + l] >> 4] * a->qs[32 * j + 16 + l];
        si += (mf_iq4xs_scale(b->scales_l, b->scales_h, j) - 32) * t;
    }
    return si;
#endif
}

/* acc + (d_w d_a) sumi, d_w an fp16, in double (d_w d_a exact): Q3_K's, IQ4_XS's (and Q6_K's)
 * step of a super-block. */
static inline double mf_q_kterm1(double acc, mf_fp16_t d, float da, int32_t sumi)
{
    const double dd = (double)mf_q_fp16(d) * (double)da;          /* exact */
    return acc + mf_mul_nc_d(dd, (double)sumi);
}

static inline float mf_dot_q2_K_q8_K(const void *MF_RESTRICT vw, const void *MF_RESTRICT va,
                                     ptrdiff_t n)
{
    const block_q2_K *w = (const block_q2_K *)vw;   /* [n / 256] */
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */
    double acc = 0.0;
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++) {
        int32_t sumi, summ;
        mf_q_sums_q2_K(&w[ib], &a[ib], &sumi, &summ);
        acc += mf_q_kterm(w[ib].d, w[ib].dmin, a[ib].d, sumi, summ);
    }
    return (float)acc;
}

static inline float mf_dot_q3_K_q8_K(const void *MF_RESTRICT vw, const void *MF_RESTRICT va,
                                     ptrdiff_t n)
{
    const block_q3_K *w = (const block_q3_K *)vw;   /* [n / 256] */
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */
    double acc = 0.0;
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++)
        acc = mf_q_kterm1(acc, w[ib].d, a[ib].d, mf_q_sums_q3_K(&w[ib], &a[ib]));
    return (float)acc;
}

static inline float mf_dot_iq4_xs_q8_K(const void *MF_RESTRICT vw, const void *MF_RESTRICT va,
                                       ptrdiff_t n)
{
    const block_iq4_xs *w = (const block_iq4_xs *)vw;   /* [n / 256] */
    const block_q8_K *a = (const block_q8_K *)va;       /* [n / 256] */
    double acc = 0.0;
    for (ptrdiff_t ib = 0; ib < n / QK_K; ib++)
        acc = mf_q_kterm1(acc, w[ib].d, a[ib].d, mf_q_sums_iq4_xs(&w[ib], &a[ib]));
    return (float)acc;
}

#endif /* MEGAFUSE_MF_DOT_Q8_H */

