/*
 * mf_q8_tiles.h -- the projections of the int8 path: mf_q8_rows_tokens, up to 4 weight rows
 * against any number of quantized activation rows, each (row, token) pair giving exactly the bits
 * of the one-row dot of mf_dot_q8.h (the canonical sequence described there).  Only the work is
 * shared:
 *
 *  - one token (decode, mf_dot4_*): the four weight rows stream side by side past one activation
 *    row, which is loaded (and its offset terms formed) once for the four, with software prefetch
 *    of the rows ahead;
 *  - two or more tokens (prefill, mf_q8_tile_*): the four rows are decoded once per MF_Q8_CHUNK
 *    weights into a stack buffer (L1) -- codes, and for the 32-weight formats the scales as
 *    floats -- and every token runs against them.
 *
 * A token's results therefore depend neither on the other tokens or rows of the call nor on the
 * thread count.  The NEON levels do the same in mf_neon_q8_tiles.h (with smmla at i8mm).  The
 * generic build (and the float formats) go pair by pair through the one-row dots.  Rows r >= nr
 * of out are unspecified.
 *
 * Depends on: mf_dot_q8.h (the canonical steps and one-row dots), mf_format_dispatch.h
 * (mf_dot_q8_for), mf_quant_common.h (levels, AVX2 building blocks, fp16 scales, Q6_K codes),
 * mf_act_layout.h (the activation rows), ckernel_dtype.h (CKDataType).
 */
#ifndef MEGAFUSE_MF_Q8_TILES_H
#define MEGAFUSE_MF_Q8_TILES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ckernel_dtype.h"
#include "ggml_blocks.h"
#include "mf_act_layout.h"
#include "mf_quant_common.h"
#include "mf_dot_q8.h"
#include "mf_format_dispatch.h"

#if defined(__GNUC__) && !defined(__clang__)
#  define MF_Q_NO_UNROLL _Pragma("GCC unroll 1")
#  define MF_Q_UNROLL4 _Pragma("GCC unroll 4")
#  define MF_Q_UNROLL8 _Pragma("GCC unroll 8")
#elif defined(__clang__)
#  define MF_Q_NO_UNROLL
#  define MF_Q_UNROLL4 _Pragma("unroll")
#  define MF_Q_UNROLL8 _Pragma("unroll")
#else
#  define MF_Q_NO_UNROLL
#  define MF_Q_UNROLL4
#  define MF_Q_UNROLL8
#endif
#define MF_Q8_TILE_TOKENS 64     /* tokens one tile call accumulates (its stack accumulators) */
#ifndef MF_Q8_TILE_ACT_BYTES
#  define MF_Q8_TILE_ACT_BYTES (192 * 1024)
#endif   /* activation rows a pass of the tiles keeps in L2 */
#define MF_Q8_CHUNK 1024         /* weights of each row decoded at once: 8 groups, 4 super-blocks */
#ifndef MF_Q8_FEW_TOKENS
#  define MF_Q8_FEW_TOKENS 4     /* up to this many tokens, one-token dots a token (rows in L1) */
#endif
#ifndef MF_Q_TILE_PF
#  define MF_Q_TILE_PF 1         /* tokens ahead whose activation groups the tiles prefetch to L1 */
#endif

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


/* ---- one token: 4 rows of a 32-weight format --------------------------------------------- */

/* Group g (nblk = 1..4 blocks, a constant where this is inlined) of rows w0..w3 against the Q8_0
 * activation row va: acc[r] + each row's canonical group step (mf_q_grp_step), the activation
 * group loaded once for the four. */
MF_ALWAYS_INLINE void mf_dot4_group32(int dt, const char *w0, const char *w1, const char *w2,
                                      const char *w3, const void *va, ptrdiff_t n, ptrdiff_t g,
                                      int nblk, __m256 acc[4])
{
    const ptrdiff_t o = g * 4 * mf_q_bsz(dt);
    const int np = (nblk + 1) / 2, kind = mf_q_kind(dt);
    mf_q_agrp A;
    mf_q_wgrp G;
    mf_q_agrp_load(va, n, g, mf_q_off(dt), &A);
    mf_q_dec(dt, w0 + o, nblk, &G);
    acc[0] = mf_q_grp_step(kind, &G, &A, np, acc[0]);
    mf_q_dec(dt, w1 + o, nblk, &G);
    acc[1] = mf_q_grp_step(kind, &G, &A, np, acc[1]);
    mf_q_dec(dt, w2 + o, nblk, &G);
    acc[2] = mf_q_grp_step(kind, &G, &A, np, acc[2]);
    mf_q_dec(dt, w3 + o, nblk, &G);
    acc[3] = mf_q_grp_step(kind, &G, &A, np, acc[3]);
}

#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
/* [Y of row a | Y of row b]: mf_q_y(ba / bb, bsz, 4, asym) side by side, gathered by word
 * permutes of vector loads instead of 8 scalar loads and their shifts and inserts (the heaviest
 * part of the Q4_0 loop).  The same fp16 values in the same lanes, the m lanes of a symmetric
 * format +0: the same floats.
 *  - Q4_0, Q4_1: a group's 4 scales lie in its first 64 bytes; one vpermt2w of the two rows'
 *    first 64 bytes gathers both rows (words 32.. are row b's);
 *  - Q5_0, Q5_1, Q8_0: one vpermt2w a row, of the group's first 64 bytes (xa0, xb0) and 64
 *    bytes from `tail` (xa1, xb1: the last 64 for Q5_0 / Q5_1, bytes 64..127 for Q8_0); every
 *    block size is even, so every scale starts on a word of both loads.
 * Every load lies inside the group. */
MF_ALWAYS_INLINE __m512 mf_q_y2(__m512i xa0, __m512i xa1, __m512i xb0, __m512i xb1,
                                ptrdiff_t bsz, int asym, ptrdiff_t tail)
{
    const __mmask32 keep = asym ? 0xFFFFu : 0x5555u;   /* the m lanes of a symmetric format: 0 */
    const int first64 = 3 * bsz + 2 + 2 * asym <= 64;  /* the last scale's end */
    MF_ALIGNED(64) short w[32] = {0};
    for (int i = 0; i < 8; i++) {   /* lane i of [d0, m0, d2, m2 | d1, m1, d3, m3] */
        const ptrdiff_t o = ((i & 4 ? 1 : 0) + (i & 2 ? 2 : 0)) * bsz + (i & 1) * 2;
        w[i] = (short)(o + 2 <= 64 ? o / 2 : 32 + (o - tail) / 2);
        w[8 + i] = (short)(w[i] + 32);                 /* (first64: row b's lanes) */
    }
    const __m512i idx = _mm512_load_si512((const void *)w);
    if (first64)
        return _mm512_cvtph_ps(_mm512_castsi512_si256(
            _mm512_maskz_permutex2var_epi16(keep, xa0, idx, xb0)));
    const __m512i ya = _mm512_maskz_permutex2var_epi16(keep & 0xFFu, xa0, idx, xa1);
    const __m512i yb = _mm512_maskz_permutex2var_epi16(keep & 0xFFu, xb0, idx, xb1);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm512_castsi512_si256(ya),
                                                   _mm512_castsi512_si128(yb), 1));
}

/* The packed nibbles of pair p (blocks 2p, 2p+1) of two rows, [a 2p | a 2p+1 | b 2p | b 2p+1]
 * (16 bytes each, qs at offset qs of a block), by one word permute: pair 0 of the rows' first 64
 * bytes xa0, xb0, pair 1 of their last 64 bytes xa1, xb1 (the group's bytes [4 * bsz - 64,
 * 4 * bsz)).  Both hold the whole pair, and qs and bsz are even, for every nibble format. */
MF_ALWAYS_INLINE __m512i mf_q_pair_qs2(int p, __m512i xa, __m512i xb, ptrdiff_t bsz, ptrdiff_t qs)
{
    const ptrdiff_t base = p ? 4 * bsz - 64 : 0;
    MF_ALIGNED(64) short w[32];
    for (int j = 0; j < 32; j++) {  /* word j: 16-byte lane j / 8 = (row j / 16, block j / 8 % 2) */
        const ptrdiff_t o = (2 * p + (j / 8) % 2) * bsz + qs + 2 * (j % 8) - base;
        w[j] = (short)(o / 2 + (j >= 16 ? 32 : 0));
    }
    return _mm512_permutex2var_epi16(xa, _mm512_load_si512((const void *)w), xb);
}

/* Two rows' whole groups (4 blocks) of a nibble format (Q4_0, Q4_1, Q5_0, Q5_1) decoded side by
 * side: U[p][0 / 1] = [row a | row b] of what mf_q_dec puts in G->u[p][0 / 1], Y = [a | b] of
 * G->Y.  The same bytes, half the instructions (the 5th bits: a bit test into a mask and a masked
 * add of 0x10 to the nibble, where AVX2 compares and ORs).  Each row's group is read as two
 * 64-byte loads, its first and its last 64 bytes, and word permutes pick the scales (mf_q_y2) and
 * the packed nibbles (mf_q_pair_qs2) out of them: 4 loads and 3-4 permutes where 16-byte loads,
 * inserts and scalar scale loads took ~35 instructions; bit for bit the same results.  Q8_0 the
 * same way (mf_q_dec2_q8_0). */
MF_ALWAYS_INLINE void mf_q_dec2_nib(int dt, const char *ba, const char *bb, __m512i U[2][2],
                                    __m512 *Y)
{
    const ptrdiff_t bsz = mf_q_bsz(dt);
    const int asym = dt == CK_DT_Q4_1 || dt == CK_DT_Q5_1, five = dt == CK_DT_Q5_0 || dt == CK_DT_Q5_1;
    const ptrdiff_t qs = dt == CK_DT_Q4_0 ? MF_Q_QS_Q4_0 : dt == CK_DT_Q4_1 ? MF_Q_QS_Q4_1
                       : dt == CK_DT_Q5_0 ? MF_Q_QS_Q5_0 : dt == CK_DT_IQ4_NL ? MF_Q_QS_IQ4_NL
                       : MF_Q_QS_Q5_1;
    const ptrdiff_t qh = dt == CK_DT_Q5_0 ? MF_Q_QH_Q5_0 : MF_Q_QH_Q5_1;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const ptrdiff_t tail = 4 * bsz - 64;
    const __m512i xa0 = _mm512_loadu_si512((const void *)ba);
    const __m512i xb0 = _mm512_loadu_si512((const void *)bb);
    const __m512i xa1 = _mm512_loadu_si512((const void *)(ba + tail));
    const __m512i xb1 = _mm512_loadu_si512((const void *)(bb + tail));
    *Y = mf_q_y2(xa0, xa1, xb0, xb1, bsz, asym, tail);
    for (int p = 0; p < 2; p++) {
        const char *pa = ba + 2 * p * bsz, *pb = bb + 2 * p * bsz;
        const __m512i v = p ? mf_q_pair_qs2(1, xa1, xb1, bsz, qs)
                            : mf_q_pair_qs2(0, xa0, xb0, bsz, qs);
        U[p][0] = _mm512_and_si512(v, m4);
        U[p][1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (five) {             /* as mf_q_hbits_pair with both blocks present */
            const char q = (char)qh, r = (char)(bsz + qh - 16);
            const __m512i shl = _mm512_broadcast_i64x4(_mm256_setr_epi8(
                q, q, q, q, q, q, q, q, q + 1, q + 1, q + 1, q + 1, q + 1, q + 1, q + 1, q + 1,
                r, r, r, r, r, r, r, r, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1));
            const __m512i shh = _mm512_add_epi8(shl, _mm512_set1_epi8(2));
            const __m512i bit = _mm512_set1_epi64((long long)0x8040201008040201ULL);
            const __m512i x10 = _mm512_set1_epi8(0x10);
            const __m512i h = mf_q_loadu2x256(pa, pb);
            const __mmask64 bl = _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, shl), bit);
            const __mmask64 bh = _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, shh), bit);
            U[p][0] = _mm512_mask_add_epi8(U[p][0], bl, U[p][0], x10);
            U[p][1] = _mm512_mask_add_epi8(U[p][1], bh, U[p][1], x10);
        }
    }
}

/* Two rows' whole groups (4 blocks, 136 bytes each) of Q8_0 side by side: S[p][0 / 1] = [row a |
 * row b] of what mf_q_dec_q8_0 puts in G->s[p][0 / 1] (signed codes), Y = [a | b] of G->Y.  Each
 * row is read as three 64-byte loads, at 0, 64 and 72 (its last 64 bytes); one word permute a row
 * and pair gathers the pair's two blocks as [lo | hi] (32 bytes each, mf_q_s8_pair's layout), and
 * one 128-bit shuffle a half joins the rows. */
MF_ALWAYS_INLINE void mf_q_dec2_q8_0(const char *ba, const char *bb, __m512i S[2][2], __m512 *Y)
{
    const ptrdiff_t bsz = MF_Q_BSZ_Q8_0, qs = MF_Q_QS_Q8_0;
    const __m512i xa0 = _mm512_loadu_si512((const void *)ba);
    const __m512i xa1 = _mm512_loadu_si512((const void *)(ba + 64));
    const __m512i xa2 = _mm512_loadu_si512((const void *)(ba + 4 * bsz - 64));
    const __m512i xb0 = _mm512_loadu_si512((const void *)bb);
    const __m512i xb1 = _mm512_loadu_si512((const void *)(bb + 64));
    const __m512i xb2 = _mm512_loadu_si512((const void *)(bb + 4 * bsz - 64));
    *Y = mf_q_y2(xa0, xa1, xb0, xb1, bsz, 0, 64);
    for (int p = 0; p < 2; p++) {
        /* sources: pair 0 from [0, 64) and [64, 128), pair 1 from [64, 128) and [72, 136) */
        const ptrdiff_t base0 = p ? 64 : 0, base1 = p ? 4 * bsz - 64 : 64;
        MF_ALIGNED(64) short w[32];
        for (int j = 0; j < 32; j++) {    /* 16-byte piece j / 8: block 2p + (j / 8) % 2, half j / 16 */
            const ptrdiff_t o = (2 * p + (j / 8) % 2) * bsz + qs + 16 * (j / 16) + 2 * (j % 8);
            w[j] = (short)(o + 2 <= base0 + 64 ? (o - base0) / 2 : 32 + (o - base1) / 2);
        }
        const __m512i idx = _mm512_load_si512((const void *)w);
        const __m512i ra = p ? _mm512_permutex2var_epi16(xa1, idx, xa2)
                             : _mm512_permutex2var_epi16(xa0, idx, xa1);
        const __m512i rb = p ? _mm512_permutex2var_epi16(xb1, idx, xb2)
                             : _mm512_permutex2var_epi16(xb0, idx, xb1);
        S[p][0] = _mm512_shuffle_i64x2(ra, rb, _MM_SHUFFLE(1, 0, 1, 0));
        S[p][1] = _mm512_shuffle_i64x2(ra, rb, _MM_SHUFFLE(3, 2, 3, 2));
    }
}

/* One token, a whole group of two rows of Q8_0 (kind 2) at the avx512 level, as
 * mf_q_grp_step_rows2: the signed codes s become unsigned s + 128 (s ^ 0x80), and the two
 * vpdpbusd start from o8 = -128 * the lane's activation sums (mf_q_offset_lanes), so that L =
 * sum (s + 128) a - 128 sum a = sum s a: the same exact int32 lanes as mf_q_lanes_s (and
 * mf_q_acc_pair's float steps), the same bits, in 2 operations a register where the sign of s
 * took 3 (mask, masked negation of a, |s|). */
MF_ALWAYS_INLINE __m512 mf_q_grp_step_rows2_s8(const __m512i S[2][2], __m512 Y,
                                               const __m512i al[2], const __m512i ah[2],
                                               const __m512i o8[2], __m512 f, __m512 acc)
{
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    __m512i L[2];
    for (int p = 0; p < 2; p++)
        L[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
            o8[p], _mm512_xor_si512(S[p][0], x80), al[p]), _mm512_xor_si512(S[p][1], x80), ah[p]);
    return mf_q_acc_group512(acc, L[0], L[1], Y, f, 0);
}

/* -off * the sums of each int32 lane's 4 + 4 activation codes of lo and hi (|sum| <= 8 * 127,
 * off <= 128: exact), where a pair's vpdpbusd start: mf_q_agrp's oo (Q4_0: off 8, Q5_0: 16) and
 * mf_q_grp_step_rows2_s8's (Q8_0: 128) in 3 operations, where the 256-bit oo and its broadcast
 * took 6; 0 for off = 0 (Q4_1, Q5_1). */
MF_ALWAYS_INLINE __m512i mf_q_offset_lanes(int off, __m512i al, __m512i ah)
{
    const __m512i z = _mm512_setzero_si512();
    if (!off)
        return z;
    const __m512i o = _mm512_set1_epi8((char)off);
    return _mm512_sub_epi32(z, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, o, al), o, ah));
}

/* One token, a whole group of two rows of a nibble format (kinds 0, 1) at the avx512 level: the
 * rows' decoded registers (mf_q_dec2_nib) side by side in the halves of 512-bit registers, against the
 * activation group broadcast to both halves (al, ah, oo, f).  Lane for lane the operations of
 * mf_q_grp_step with VNNI: the same bits. */
MF_ALWAYS_INLINE __m512 mf_q_grp_step_rows2(int kind, const __m512i U[2][2], __m512 Y,
                                            const __m512i al[2], const __m512i ah[2],
                                            const __m512i oo[2], __m512 f, __m512 acc)
{
    __m512i L[2];
    for (int p = 0; p < 2; p++)
        L[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
            kind == 0 ? oo[p] : _mm512_setzero_si512(), U[p][0], al[p]), U[p][1], ah[p]);
    return mf_q_acc_group512(acc, L[0], L[1], Y, f, kind == 1);
}
#endif

/* Rows w[0..3] of format dt against one Q8_0 activation row: each row's canonical sequence
 * (mf_q_dot_row), the activation group loaded once for the four.  A row whose block count is not
 * a multiple of 4 ends in a group of 1-3 blocks, inlined once for each count: with the count a
 * run-time value, that group alone costs more instructions than a whole one. */
MF_ALWAYS_INLINE void mf_dot4_row32(int dt, const void *const *vw, const void *va, ptrdiff_t n,
                                    float *out)
{
    const char *w0 = (const char *)vw[0], *w1 = (const char *)vw[1];   /* [n / 32] blocks each */
    const char *w2 = (const char *)vw[2], *w3 = (const char *)vw[3];
    const ptrdiff_t nb = n / QK8_0;
    const ptrdiff_t gb = 4 * mf_q_bsz(dt);                 /* bytes of a group of 4 blocks */
    const ptrdiff_t pf = mf_q_pf_dist(nb * mf_q_bsz(dt));
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    ptrdiff_t g = 0;
#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
    {                                        /* rows 0, 1 and 2, 3 in 512-bit registers */
        const int kind = mf_q_kind(dt);
        __m512 a01 = _mm512_setzero_ps(), a23 = _mm512_setzero_ps();
        for (; g < nb / 4; g++) {
            const ptrdiff_t o = g * gb;
            mf_q_agrp A;
            __m512i U[2][2], al[2], ah[2], oo[2];
            __m512 Y;
            mf_q_prefetch4(w0, nb * mf_q_bsz(dt), o, gb, pf);
            mf_q_prefetch4_near(w0, nb * mf_q_bsz(dt), o, gb, mf_q_pf_near(dt));
            mf_q_agrp_load(va, n, g, 0, &A);      /* the offsets' lanes: below, in 512 bits */
            for (int p = 0; p < 2; p++) {
                al[p] = _mm512_broadcast_i64x4(A.lo[p]);
                ah[p] = _mm512_broadcast_i64x4(A.hi[p]);
                oo[p] = mf_q_offset_lanes(kind == 2 ? 128 : mf_q_off(dt), al[p], ah[p]);
            }
            const __m512 f = _mm512_broadcast_f32x8(A.f);
            if (dt == CK_DT_Q8_0) {
                mf_q_dec2_q8_0(w0 + o, w1 + o, U, &Y);
                a01 = mf_q_grp_step_rows2_s8(U, Y, al, ah, oo, f, a01);
                mf_q_dec2_q8_0(w2 + o, w3 + o, U, &Y);
                a23 = mf_q_grp_step_rows2_s8(U, Y, al, ah, oo, f, a23);
                continue;
            }
            if (dt == CK_DT_IQ4_NL) {        /* the nibbles' values: Q8_0's signed step */
                const __m512i kv = _mm512_broadcast_i32x4(
                    _mm_loadu_si128((const __m128i *)(const void *)mf_kvalues_iq4nl));
                mf_q_dec2_nib(dt, w0 + o, w1 + o, U, &Y);
                for (int p = 0; p < 2; p++)
                    for (int i = 0; i < 2; i++)
                        U[p][i] = _mm512_shuffle_epi8(kv, U[p][i]);
                a01 = mf_q_grp_step_rows2_s8(U, Y, al, ah, oo, f, a01);
                mf_q_dec2_nib(dt, w2 + o, w3 + o, U, &Y);
                for (int p = 0; p < 2; p++)
                    for (int i = 0; i < 2; i++)
                        U[p][i] = _mm512_shuffle_epi8(kv, U[p][i]);
                a23 = mf_q_grp_step_rows2_s8(U, Y, al, ah, oo, f, a23);
                continue;
            }
            mf_q_dec2_nib(dt, w0 + o, w1 + o, U, &Y);
            a01 = mf_q_grp_step_rows2(kind, U, Y, al, ah, oo, f, a01);
            mf_q_dec2_nib(dt, w2 + o, w3 + o, U, &Y);
            a23 = mf_q_grp_step_rows2(kind, U, Y, al, ah, oo, f, a23);
        }
        acc[0] = _mm512_castps512_ps256(a01);
        acc[1] = _mm512_extractf32x8_ps(a01, 1);
        acc[2] = _mm512_castps512_ps256(a23);
        acc[3] = _mm512_extractf32x8_ps(a23, 1);
    }
#endif
    for (; g < nb / 4; g++) {                              /* whole groups */
        mf_q_prefetch4(w0, nb * mf_q_bsz(dt), g * gb, gb, pf);
        mf_q_prefetch4_near(w0, nb * mf_q_bsz(dt), g * gb, gb, mf_q_pf_near(dt));
        mf_dot4_group32(dt, w0, w1, w2, w3, va, n, g, 4, acc);
    }
    switch (nb % 4) {                                      /* a last group of 1..3 blocks */
    case 1: mf_dot4_group32(dt, w0, w1, w2, w3, va, n, g, 1, acc); break;
    case 2: mf_dot4_group32(dt, w0, w1, w2, w3, va, n, g, 2, acc); break;
    case 3: mf_dot4_group32(dt, w0, w1, w2, w3, va, n, g, 3, acc); break;
    default: break;
    }
    out[0] = mf_q_acc_result(acc[0]);
    out[1] = mf_q_acc_result(acc[1]);
    out[2] = mf_q_acc_result(acc[2]);
    out[3] = mf_q_acc_result(acc[3]);
}

#define MF_DOT4_ROW32(NAME, DT)                                                                \
static inline void NAME(const void *const *vw, const void *va, ptrdiff_t n, float *out)       \
{                                                                                              \
    mf_dot4_row32(DT, vw, va, n, out);                                                         \
}
MF_DOT4_ROW32(mf_dot4_q4_0_q8_0, CK_DT_Q4_0)
MF_DOT4_ROW32(mf_dot4_q4_1_q8_0, CK_DT_Q4_1)
MF_DOT4_ROW32(mf_dot4_q5_0_q8_0, CK_DT_Q5_0)
MF_DOT4_ROW32(mf_dot4_q5_1_q8_0, CK_DT_Q5_1)
MF_DOT4_ROW32(mf_dot4_q8_0_q8_0, CK_DT_Q8_0)
MF_DOT4_ROW32(mf_dot4_iq4_nl_q8_0, CK_DT_IQ4_NL)

/* ---- one token: 4 rows of Q4_K / Q5_K / Q6_K -------------------------------------------- */

/* mf_q_k4_scales_mins of four blocks at once, in vector registers: the same bits (the 32-bit
 * shifts and masks of the scalar unpacking, applied to the four rows side by side; reads the 16
 * bytes from each scales, whose last 4 are the block's next field).  As bytes: sc01 = [sc of row 0
 * | sc of row 1] (8 each), mn01 the mins of rows 0 and 1, sc23 / mn23 those of rows 2 and 3. */
static inline void mf_q_k4_scale_bytes4(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2,
                                        const uint8_t *s3, __m128i *sc01, __m128i *mn01,
                                        __m128i *sc23, __m128i *mn23)
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
    *sc01 = _mm_unpacklo_epi32(V0, V1);
    *mn01 = _mm_unpacklo_epi32(V2, V3);
    *sc23 = _mm_unpackhi_epi32(V0, V1);
    *mn23 = _mm_unpackhi_epi32(V2, V3);
}

/* As int16, one register a row: out[r] = mf_q_k4_scales_mins(row r's scales). */
static inline void mf_q_k4_scales_mins4(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2,
                                        const uint8_t *s3, __m256i out[4])
{
    __m128i a, b, c, d;
    mf_q_k4_scale_bytes4(s0, s1, s2, s3, &a, &b, &c, &d);
    out[0] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(a, b));
    out[1] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(a, b));
    out[2] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(c, d));
    out[3] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(c, d));
}

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

/* 4 rows: acc += (d_w d_a) sumi - (dmin_w d_a) summ per row, as mf_q_kterm.  Chunk c (64
 * weights, sub-blocks 2c and 2c+1) of two rows at a time runs against activation registers
 * loaded once; the two sub-blocks' int16 pair sums are interleaved (unpack) and the two halves
 * added as int16 (|sum| <= 2 * 2 * 31 * 127 = 15748), so that one pmaddwd applies both scales
 * (sc_2c, sc_2c+1: 32-bit element c of the scales, vpermd -- no shuffle-mask loads: vector
 * loads bound this loop otherwise).  The same integer sum as a pmaddwd per half, one multiply
 * less (vpmaddubsw and vpmaddwd share two pipes on AMD Zen 3; the unpacks and adds run beside
 * them).  A loop, not unrolled: GCC spills when it is. */
#define MF_Q_K45_ROW(CODES, b, hs, ms, sr)                                                     \
    {                                                                                          \
        __m256i lo, hi;                                                                        \
        CODES(b, c, hs, &lo, &hi);                                                             \
        const __m256i p1 = _mm256_maddubs_epi16(lo, alo), p2 = _mm256_maddubs_epi16(hi, ahi);  \
        const __m256i scv = _mm256_permutevar8x32_epi32(ms, idx);                              \
        sr = _mm256_add_epi32(sr, _mm256_madd_epi16(                                           \
            _mm256_add_epi16(_mm256_unpacklo_epi16(p1, p2), _mm256_unpackhi_epi16(p1, p2)), scv)); \
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

#if defined(MF_SIMD_AVX512)
/* The avx512 level: the same pass for rows a and b side by side in the halves of 512-bit
 * registers (codes of a | codes of b, the activation broadcast to both, scales by vpermd within
 * each half): lane for lane the operations of MF_Q_K45_PASS, the same integer sums. */
/* The nibbles of 32 bytes of qs of two rows: lo = low nibbles, hi = high. */
static inline void mf_q_nib2(const uint8_t *qa, const uint8_t *qb, __m512i *lo, __m512i *hi)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), q = mf_q_loadu2x256(qa, qb);
    *lo = _mm512_and_si512(q, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
}
static inline void mf_q_codes2_q4_K(const block_q4_K *ba, const block_q4_K *bb, int c, __m512i hs,
                                    __m512i *lo, __m512i *hi)
{
    (void)hs;
    mf_q_nib2(ba->qs + 32 * c, bb->qs + 32 * c, lo, hi);
}
static inline void mf_q_codes2_q5_K(const block_q5_K *ba, const block_q5_K *bb, int c, __m512i hs,
                                    __m512i *lo, __m512i *hi)
{
    /* the nibbles, then the 5th bits as mf_q_codes_q5_Kh adds them */
    mf_q_nib2(ba->qs + 32 * c, bb->qs + 32 * c, lo, hi);
    *lo = _mm512_or_si512(*lo, _mm512_slli_epi16(_mm512_and_si512(hs, _mm512_set1_epi8(1)), 4));
    *hi = _mm512_or_si512(*hi, _mm512_slli_epi16(_mm512_and_si512(hs, _mm512_set1_epi8(2)), 3));
}
#if defined(MF_Q_VNNI)
/* Chunk c of rows a and b side by side (their codes | the activation broadcast to both halves):
 * sub-blocks 2c and 2c+1 by one vpdpbusd each (int32 sums of 4 products, |sum| <= 4 * 31 * 127 =
 * 15748: exact as int16), packed to int16 (per 128-bit lane [2c x 4 | 2c+1 x 4]) and scaled by
 * one vpdpwssd against [sc_2c x 4 | sc_2c+1 x 4] (vpermw of sc by idx) into sab.  The same
 * integer sums as the AVX2 pass, 5 vector operations where vpmaddubsw, unpacks, pmaddwd and
 * adds took 8. */
#define MF_Q_K45_CHUNK2(CODES2, ba, bb, hs, sc, idx, alo, ahi, sab)                            \
    {                                                                                          \
        __m512i lo, hi;                                                                        \
        CODES2(ba, bb, c, hs, &lo, &hi);                                                       \
        const __m512i z = _mm512_setzero_si512();                                              \
        const __m512i pk = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, lo, alo),                 \
                                              _mm512_dpbusd_epi32(z, hi, ahi));                \
        sab = _mm512_dpwssd_epi32(sab, pk, _mm512_permutexvar_epi16(idx, sc));                 \
    }
/* vpermw indices of chunk 0 for rows r, r + 1: word k -> row r + k / 16, sub-block (k % 8) / 4
 * (MF_Q_K45_IDX_NEXT: those of the next chunk) */
#define MF_Q_K45_IDX0(r)                                                                       \
    _mm512_set_epi16(8 * (r) + 9, 8 * (r) + 9, 8 * (r) + 9, 8 * (r) + 9, 8 * (r) + 8, 8 * (r) + 8, \
                     8 * (r) + 8, 8 * (r) + 8, 8 * (r) + 9, 8 * (r) + 9, 8 * (r) + 9, 8 * (r) + 9, \
                     8 * (r) + 8, 8 * (r) + 8, 8 * (r) + 8, 8 * (r) + 8, 8 * (r) + 1, 8 * (r) + 1, \
                     8 * (r) + 1, 8 * (r) + 1, 8 * (r), 8 * (r), 8 * (r), 8 * (r), 8 * (r) + 1,   \
                     8 * (r) + 1, 8 * (r) + 1, 8 * (r) + 1, 8 * (r), 8 * (r), 8 * (r), 8 * (r))
#define MF_Q_K45_IDX_NEXT(i) _mm512_add_epi16(i, _mm512_set1_epi16(2))
#else
/* Chunk c of rows a and b side by side (their codes | the activation broadcast to both halves,
 * scales by vpermd): lane for lane the operations of MF_Q_K45_ROW, the same integer sums. */
#define MF_Q_K45_CHUNK2(CODES2, ba, bb, hs, sc, idx, alo, ahi, sab)                            \
    {                                                                                          \
        __m512i lo, hi;                                                                        \
        CODES2(ba, bb, c, hs, &lo, &hi);                                                       \
        const __m512i p1 = _mm512_maddubs_epi16(lo, alo), p2 = _mm512_maddubs_epi16(hi, ahi); \
        const __m512i scv = _mm512_permutexvar_epi32(idx, sc);                                 \
        sab = _mm512_add_epi32(sab, _mm512_madd_epi16(                                         \
            _mm512_add_epi16(_mm512_unpacklo_epi16(p1, p2), _mm512_unpackhi_epi16(p1, p2)), scv)); \
    }
/* vpermd indices of chunk 0 for rows r, r + 1: element 4r | 4(r + 1) (MF_Q_K45_IDX_NEXT: those
 * of the next chunk) */
#define MF_Q_K45_IDX0(r)                                                                       \
    _mm512_set_epi32(4 * (r) + 4, 4 * (r) + 4, 4 * (r) + 4, 4 * (r) + 4, 4 * (r) + 4, 4 * (r) + 4, \
                     4 * (r) + 4, 4 * (r) + 4, 4 * (r), 4 * (r), 4 * (r), 4 * (r), 4 * (r), 4 * (r), \
                     4 * (r), 4 * (r))
#define MF_Q_K45_IDX_NEXT(i) _mm512_add_epi32(i, _mm512_set1_epi32(1))
#endif

/* 4 rows, the avx512 level: acc_r += (d_r d_a) sumi_r - (dmin_r d_a) summ_r per super-block in
 * double, as MF_DOT4_K45 below, with the same integer sums and the same double operations.
 * - Chunk c's activation registers are loaded once for the four rows; rows 0|1 and 2|3 run side
 *   by side in the halves of two accumulators (MF_Q_K45_CHUNK2).
 * - The four rows' scales are one register (sc: [row 0 | 1 | 2 | 3] x 8 int16, row r's sc_j
 *   its word 8r + j, picked by vpermw -- with VNNI -- or as the pair (sc_2c, sc_2c+1), its
 *   32-bit element 4r + c, by vpermd), their mins another (mn).
 * - The mins term is one pmaddwd of mn with the pair sums of bsums in every 128-bit lane, and
 *   sumi and summ are reduced together: per lane r, [sumi_r, summ_r] as int32, then as double
 *   beside [d_r, dmin_r] (adjacent fields: 4 bytes a row, converted as one fp16 vector): the
 *   product's odd lanes are subtracted from its even lanes, and row r's sum is acc's lane 2r.
 *   (The super-block's fixed work, not the codes, is what this layout cuts.) */
MF_STATIC_ASSERT(offsetof(block_q4_K, dmin) == offsetof(block_q4_K, d) + 2, q4_K_dmin_after_d);
MF_STATIC_ASSERT(offsetof(block_q5_K, dmin) == offsetof(block_q5_K, d) + 2, q5_K_dmin_after_d);
#define MF_DOT4_K45(NAME, DT, BLOCK, CODES, CODES2, HBITS)                                     \
static inline void NAME(const void *const *vw, const void *va, ptrdiff_t n, float *out)       \
{                                                                                              \
    const BLOCK *w0 = (const BLOCK *)vw[0], *w1 = (const BLOCK *)vw[1];                        \
    const BLOCK *w2 = (const BLOCK *)vw[2], *w3 = (const BLOCK *)vw[3];                        \
    const block_q8_K *a = (const block_q8_K *)va;   /* [n / 256] */                            \
    const ptrdiff_t nb = n / QK_K;                                                             \
    const ptrdiff_t pf = mf_q_pf_dist(nb * (ptrdiff_t)sizeof(BLOCK));                          \
    __m512d acc = _mm512_setzero_pd();                 /* [row 0, -, row 1, -, ...] */          \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        const block_q8_K *ab = &a[ib];                                                         \
        mf_q_prefetch4(w0, nb * (ptrdiff_t)sizeof(BLOCK), ib * (ptrdiff_t)sizeof(BLOCK),            \
                       (ptrdiff_t)sizeof(BLOCK), pf);                                          \
        mf_q_prefetch4_near(w0, nb * (ptrdiff_t)sizeof(BLOCK), ib * (ptrdiff_t)sizeof(BLOCK),       \
                            (ptrdiff_t)sizeof(BLOCK), mf_q_pf_near(DT));                       \
        __m128i sc01, mn01, sc23, mn23;                                                        \
        mf_q_k4_scale_bytes4(w0[ib].scales, w1[ib].scales, w2[ib].scales, w3[ib].scales,        \
                             &sc01, &mn01, &sc23, &mn23);                                      \
        const __m512i sc = _mm512_cvtepu8_epi16(_mm256_set_m128i(sc23, sc01));  /* [4 x 8] */ \
        const __m512i mn = _mm512_cvtepu8_epi16(_mm256_set_m128i(mn23, mn01));                 \
        const __m512i ps = _mm512_broadcast_i32x4(_mm_hadd_epi16(                              \
            _mm_loadu_si128((const __m128i *)(const void *)ab->bsums),                         \
            _mm_loadu_si128((const __m128i *)(const void *)(ab->bsums + 8))));                 \
        const __m512i summ4 = _mm512_madd_epi16(mn, ps);        /* [4 x 4] partial summ */    \
        __m512i idx01 = MF_Q_K45_IDX0(0), idx23 = MF_Q_K45_IDX0(2);                            \
        __m512i hs01 = mf_q_join_i(HBITS(&w0[ib]), HBITS(&w1[ib]));                            \
        __m512i hs23 = mf_q_join_i(HBITS(&w2[ib]), HBITS(&w3[ib]));                            \
        __m512i s01 = _mm512_setzero_si512(), s23 = _mm512_setzero_si512();                    \
        MF_Q_NO_UNROLL                                                                         \
        for (int c = 0; c < 4; c++) {                                                          \
            const __m512i alo = _mm512_broadcast_i64x4(mf_q_loadu256(ab->qs + 64 * c));        \
            const __m512i ahi = _mm512_broadcast_i64x4(mf_q_loadu256(ab->qs + 64 * c + 32));   \
            MF_Q_K45_CHUNK2(CODES2, &w0[ib], &w1[ib], hs01, sc, idx01, alo, ahi, s01)          \
            MF_Q_K45_CHUNK2(CODES2, &w2[ib], &w3[ib], hs23, sc, idx23, alo, ahi, s23)          \
            idx01 = MF_Q_K45_IDX_NEXT(idx01);                                                  \
            idx23 = MF_Q_K45_IDX_NEXT(idx23);                                                  \
            hs01 = _mm512_srli_epi16(hs01, 2);                                                 \
            hs23 = _mm512_srli_epi16(hs23, 2);                                                 \
        }                                                                                      \
        /* lane r: 4 partial sumi of row r, beside summ4's 4 partial summ */                  \
        const __m512i sumi4 = _mm512_add_epi32(_mm512_shuffle_i32x4(s01, s23, 0x88),           \
                                               _mm512_shuffle_i32x4(s01, s23, 0xDD));          \
        __m512i z = _mm512_add_epi32(_mm512_unpacklo_epi32(sumi4, summ4),                      \
                                     _mm512_unpackhi_epi32(sumi4, summ4));                     \
        z = _mm512_add_epi32(z, _mm512_shuffle_epi32(z, _MM_PERM_BADC)); /* [sumi, summ] x 2 */ \
        const __m256i sm = _mm512_castsi512_si256(_mm512_permutexvar_epi64(                    \
            _mm512_set_epi64(6, 4, 2, 0, 6, 4, 2, 0), z));    /* [sumi_r, summ_r] r = 0..3 */ \
        const __m512d dd = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_cvtph_ps(_mm_setr_epi32(       \
            (int)mf_q_ld32(&w0[ib].d), (int)mf_q_ld32(&w1[ib].d), (int)mf_q_ld32(&w2[ib].d),       \
            (int)mf_q_ld32(&w3[ib].d)))), _mm512_set1_pd((double)ab->d)); /* [d_r, dmin_r] d_a */ \
        const __m512d p = _mm512_mul_pd(dd, _mm512_cvtepi32_pd(sm));                           \
        acc = _mm512_add_pd(acc, _mm512_sub_pd(p, _mm512_permute_pd(p, 0x55)));                \
    }                                                                                          \
    double r8[8];                                                                              \
    _mm512_storeu_pd(r8, acc);                                                                 \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = (float)r8[2 * r];                                                             \
}
#else
#define MF_DOT4_K45(NAME, DT, BLOCK, CODES, CODES2, HBITS)                                     \
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
        mf_q_prefetch4(w0, nb * (ptrdiff_t)sizeof(BLOCK), ib * (ptrdiff_t)sizeof(BLOCK),            \
                       (ptrdiff_t)sizeof(BLOCK), pf);                                          \
        mf_q_prefetch4_near(w0, nb * (ptrdiff_t)sizeof(BLOCK), ib * (ptrdiff_t)sizeof(BLOCK),       \
                            (ptrdiff_t)sizeof(BLOCK), mf_q_pf_near(DT));                       \
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
        MF_Q_K45_PASS(CODES, HBITS, &w0[ib], ms0, s0, &w1[ib], ms1, s1)                      \
        MF_Q_K45_PASS(CODES, HBITS, &w2[ib], ms2, s2, &w3[ib], ms3, s3)                      \
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

#endif

MF_DOT4_K45(mf_dot4_q4_K_q8_K, CK_DT_Q4_K, block_q4_K, mf_q_codes_q4_Kh, mf_q_codes2_q4_K,
            mf_q_hbits_q4_K)
MF_DOT4_K45(mf_dot4_q5_K_q8_K, CK_DT_Q5_K, block_q5_K, mf_q_codes_q5_Kh, mf_q_codes2_q5_K,
            mf_q_hbits_q5_K)

/* The pmaddwd scales of registers k, k+1 (k even) of half h once their int16 pair sums are
 * interleaved (unpacklo / unpackhi) and added: [s_{8h+2k}, s_{8h+2k+2} | s_{8h+2k+1}, s_{8h+2k+3}]
 * in each int32, from sch = the half's 8 scales as int16 in both lanes (each register's 128-bit
 * halves, 16 codes each, have their own scale). */
static inline __m256i mf_q_q6k_scsel(int k)
{
    const int b = 4 * k;        /* byte of s_{8h+2k} in sch */
    return _mm256_set_m128i(
        _mm_set1_epi32((b + 7) << 24 | (b + 6) << 16 | (b + 3) << 8 | (b + 2)),
        _mm_set1_epi32((b + 5) << 24 | (b + 4) << 16 | (b + 1) << 8 | b));
}

static inline __m256i mf_q_q6k_scv2(__m256i sch, int k)
{
    return _mm256_shuffle_epi8(sch, mf_q_q6k_scsel(k));
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
        for (int k = 0; k < 4; k += 2) {      /* registers k, k+1: one pmaddwd (|x| <= 2 * 16002) */
            const int8_t *a = ab->qs + 128 * h + 32 * k;
            const __m256i pl = _mm256_maddubs_epi16(q[k], mf_q_loadu256(a));
            const __m256i ph = _mm256_maddubs_epi16(q[k + 1], mf_q_loadu256(a + 32));
            const __m256i x = _mm256_add_epi16(_mm256_unpacklo_epi16(pl, ph),
                                               _mm256_unpackhi_epi16(pl, ph));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(x, mf_q_q6k_scv2(sch, k)));
        }
    }
    return s;
}

#if defined(MF_SIMD_AVX512)
/* mf_q_sumi_q6_K of rows a and b side by side in the halves of 512-bit registers (the avx512
 * level): lane for lane the same operations, the same integer lanes ([a | b]). */
static inline __m512i mf_q_sumi2_q6_K(const block_q6_K *ba, const block_q6_K *bb,
                                      const block_q8_K *ab, __m512i bs)
{
    const __m512i sc16 = mf_q_join_i(
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)ba->scales)),
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)bb->scales)));
    __m512i s = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_slli_epi32(_mm512_madd_epi16(sc16, bs), 5));
    for (int h = 0; h < 2; h++) {
        __m512i q[4];
        mf_q6k_codes2(ba, bb, h, q);
        /* each row's half-h scales in both 128-bit lanes of its half */
        const __m512i sch = h ? _mm512_shuffle_i64x2(sc16, sc16, 0xF5)
                              : _mm512_shuffle_i64x2(sc16, sc16, 0xA0);
        for (int k = 0; k < 4; k += 2) {
            const int8_t *a = ab->qs + 128 * h + 32 * k;
            const __m512i pl = _mm512_maddubs_epi16(q[k], _mm512_broadcast_i64x4(mf_q_loadu256(a)));
            const __m512i ph = _mm512_maddubs_epi16(q[k + 1],
                                                    _mm512_broadcast_i64x4(mf_q_loadu256(a + 32)));
            const __m512i x = _mm512_add_epi16(_mm512_unpacklo_epi16(pl, ph),
                                               _mm512_unpackhi_epi16(pl, ph));
            const __m512i sel = _mm512_broadcast_i64x4(mf_q_q6k_scsel(k));
            s = _mm512_add_epi32(s, _mm512_madd_epi16(x, _mm512_shuffle_epi8(sch, sel)));
        }
    }
    return s;
}
#endif

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
        mf_q_prefetch4(w[0], nb * (ptrdiff_t)sizeof(block_q6_K), ib * (ptrdiff_t)sizeof(block_q6_K),
                       (ptrdiff_t)sizeof(block_q6_K), pf);
        mf_q_prefetch4_near(w[0], nb * (ptrdiff_t)sizeof(block_q6_K),
                            ib * (ptrdiff_t)sizeof(block_q6_K), (ptrdiff_t)sizeof(block_q6_K),
                            mf_q_pf_near(CK_DT_Q6_K));
#if defined(MF_SIMD_AVX512)
        const __m512i bs2 = _mm512_broadcast_i64x4(bs);
        const __m512i s01 = mf_q_sumi2_q6_K(&w[0][ib], &w[1][ib], ab, bs2);
        const __m512i s23 = mf_q_sumi2_q6_K(&w[2][ib], &w[3][ib], ab, bs2);
        s[0] = _mm512_castsi512_si256(s01);
        s[1] = _mm512_extracti64x4_epi64(s01, 1);
        s[2] = _mm512_castsi512_si256(s23);
        s[3] = _mm512_extracti64x4_epi64(s23, 1);
#else
        for (int r = 0; r < 4; r++)
            s[r] = mf_q_sumi_q6_K(&w[r][ib], ab, bs);
#endif
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


/* ---- many tokens: 4 rows of a 32-weight format decoded once a chunk ---------------------- */

#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
/* One group of two tokens in the halves of 512-bit registers (the tiles at the avx512 level):
 * A2's codes and floats hold token t in the low half, t + 1 in the high half; G's registers are
 * broadcast to both.  Kinds 1 and 3 only (the tiles' kinds with VNNI), both pairs (whole
 * groups).  Lane for lane the operations of mf_q_grp_step: the same bits. */
typedef struct {
    __m512i lo[2], hi[2];       /* [pair]: [token t | token t + 1] */
    __m512 f;
} mf_q_agrp2;

static inline void mf_q_agrp2_load(const char *a0, const char *a1, ptrdiff_t n, ptrdiff_t g,
                                   int biased, mf_q_agrp2 *A)
{
    const int8_t *c0 = mf_act_q8_0_codes(a0, (size_t)g), *c1 = mf_act_q8_0_codes(a1, (size_t)g);
    const __m512i b = _mm512_set1_epi8((char)0x80);
    for (int p = 0; p < 2; p++) {
        A->lo[p] = mf_q_loadu2x256(c0 + 64 * p, c1 + 64 * p);
        A->hi[p] = mf_q_loadu2x256(c0 + 64 * p + 32, c1 + 64 * p + 32);
        if (biased) {
            A->lo[p] = _mm512_xor_si512(A->lo[p], b);
            A->hi[p] = _mm512_xor_si512(A->hi[p], b);
        }
    }
    A->f = mf_q_join_f(_mm256_loadu_ps(mf_act_q8_0_f(a0, (size_t)n, (size_t)g)),
                       _mm256_loadu_ps(mf_act_q8_0_f(a1, (size_t)n, (size_t)g)));
}

MF_ALWAYS_INLINE __m512 mf_q_grp_step2(int kind, const mf_q_wgrp *G, const mf_q_agrp2 *A,
                                       __m512 acc)
{
    const __m512 Y = _mm512_broadcast_f32x8(G->Y);
    __m512i L[2];
    for (int p = 0; p < 2; p++) {
        if (kind == 1)
            L[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                       _mm512_broadcast_i64x4(G->u[p][0]), A->lo[p]),
                                       _mm512_broadcast_i64x4(G->u[p][1]), A->hi[p]);
        else
            L[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_broadcast_i64x4(G->c[p]),
                                       A->lo[p], _mm512_broadcast_i64x4(G->s[p][0])),
                                       A->hi[p], _mm512_broadcast_i64x4(G->s[p][1]));
    }
    return mf_q_acc_group512(acc, L[0], L[1], Y, A->f, kind == 1);
}

#endif

/* acc[r] + the canonical group step of decoded rows W[0..3] against group g of one token's
 * activation row a, npairs (1 or 2) a constant where this is inlined. */
MF_ALWAYS_INLINE void mf_q8_tile_group32(int kind, int biased, const mf_q_wgrp W[4], const char *a,
                                         ptrdiff_t n, ptrdiff_t g, int npairs, __m256 acc[4])
{
    mf_q_agrp A;
    mf_q_agrp_load(a, n, g, 0, &A);
    if (biased)
        mf_q_agrp_bias(&A);
    for (int r = 0; r < 4; r++)
        acc[r] = mf_q_grp_step(kind, &W[r], &A, npairs, acc[r]);
}

/* nt (<= MF_Q8_TILE_TOKENS) tokens of Q8_0 activation rows at xq (stride xs) against rows
 * vw[0..3]: a chunk of 8 groups of each row is decoded into W (codes and scales, 9 KiB at most),
 * then each token runs every group of the chunk past the four rows, its 4 accumulators in
 * registers (acc, kept per token across chunks). */
MF_ALWAYS_INLINE void mf_q8_tile_row32(int dt, const void *const *vw, const char *xq,
                                       ptrdiff_t xs, int nt, ptrdiff_t n, float *out /* [nt][4] */)
{
    enum { CG = MF_Q8_CHUNK / MF_ACT_GROUP_CODE_BYTES };   /* groups a chunk */
    mf_q_wgrp W[CG][4];                                    /* [group][row] */
    __m256 acc[MF_Q8_TILE_TOKENS][4];                      /* [token][row] */
    const ptrdiff_t nb = n / QK8_0, ng = (ptrdiff_t)mf_act_q8_0_groups((size_t)n);
    const ptrdiff_t gb = 4 * mf_q_bsz(dt);
#if defined(MF_Q_VNNI)
    const int biased = mf_q_off(dt) != 0 || mf_q_kind(dt) == 2;   /* mf_q_lanes_b, mf_q_wgrp_bias */
#else
    const int biased = mf_q_off(dt) != 0;                  /* Q4_0 / Q5_0: mf_q_lanes_b */
#endif
    const int kind = biased ? 3 : mf_q_kind(dt);
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            acc[t][r] = _mm256_setzero_ps();
    for (ptrdiff_t c0 = 0; c0 < ng; c0 += CG) {
        const int nc = (int)(ng - c0 < CG ? ng - c0 : CG);
        const int full = (int)(nb / 4 - c0 < nc ? nb / 4 - c0 : nc);   /* whole groups */
        for (int c = 0; c < nc; c++)
            for (int r = 0; r < 4; r++) {
                mf_q_dec(dt, (const char *)vw[r] + (c0 + c) * gb, mf_q_grp_blocks(nb, c0 + c),
                         &W[c][r]);
                if (biased)
                    mf_q_wgrp_bias(&W[c][r], mf_q_off(dt));
            }
        int t = 0;
#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
        for (; t + 1 < nt; t += 2) {            /* two tokens a register (mf_q_grp_step2) */
            const char *a = xq + t * xs;
            __m512 a0 = mf_q_join_f(acc[t][0], acc[t + 1][0]), a1 = mf_q_join_f(acc[t][1], acc[t + 1][1]);
            __m512 a2 = mf_q_join_f(acc[t][2], acc[t + 1][2]), a3 = mf_q_join_f(acc[t][3], acc[t + 1][3]);
            const char *an = t + 2 * MF_Q_TILE_PF + 1 < nt ? a + 2 * MF_Q_TILE_PF * xs : a;
            for (int c = 0; c < full; c++) {
                mf_q_agrp2 A;
                for (int k = 0; k < 2; k++) {             /* the next pair's groups, into L1 */
                    const char *pc = (const char *)mf_act_q8_0_codes(an + k * xs, (size_t)(c0 + c));
                    _mm_prefetch(pc, _MM_HINT_T0);
                    _mm_prefetch(pc + 64, _MM_HINT_T0);
                    _mm_prefetch((const char *)mf_act_q8_0_f(an + k * xs, (size_t)n, (size_t)(c0 + c)),
                                 _MM_HINT_T0);
                }
                mf_q_agrp2_load(a, a + xs, n, c0 + c, biased, &A);
                a0 = mf_q_grp_step2(kind, &W[c][0], &A, a0);
                a1 = mf_q_grp_step2(kind, &W[c][1], &A, a1);
                a2 = mf_q_grp_step2(kind, &W[c][2], &A, a2);
                a3 = mf_q_grp_step2(kind, &W[c][3], &A, a3);
            }
            acc[t][0] = _mm512_castps512_ps256(a0); acc[t + 1][0] = _mm512_extractf32x8_ps(a0, 1);
            acc[t][1] = _mm512_castps512_ps256(a1); acc[t + 1][1] = _mm512_extractf32x8_ps(a1, 1);
            acc[t][2] = _mm512_castps512_ps256(a2); acc[t + 1][2] = _mm512_extractf32x8_ps(a2, 1);
            acc[t][3] = _mm512_castps512_ps256(a3); acc[t + 1][3] = _mm512_extractf32x8_ps(a3, 1);
            if (full < nc)          /* the row's last group, 1..3 blocks: token by token */
                for (int k = 0; k < 2; k++) {
                    if (mf_q_grp_blocks(nb, c0 + full) <= 2)
                        mf_q8_tile_group32(kind, biased, W[full], a + k * xs, n, c0 + full, 1, acc[t + k]);
                    else
                        mf_q8_tile_group32(kind, biased, W[full], a + k * xs, n, c0 + full, 2, acc[t + k]);
                }
        }
#endif
        for (; t < nt; t++) {
            const char *a = xq + t * xs;
            __m256 a0 = acc[t][0], a1 = acc[t][1], a2 = acc[t][2], a3 = acc[t][3];
            const char *an = t + MF_Q_TILE_PF < nt ? a + MF_Q_TILE_PF * xs : a;   /* into L1 */
            for (int c = 0; c < full; c++) {
                mf_q_agrp A;
                const char *pc = (const char *)mf_act_q8_0_codes(an, (size_t)(c0 + c));
                _mm_prefetch(pc, _MM_HINT_T0);
                _mm_prefetch(pc + 64, _MM_HINT_T0);
                _mm_prefetch((const char *)mf_act_q8_0_f(an, (size_t)n, (size_t)(c0 + c)), _MM_HINT_T0);
                mf_q_agrp_load(a, n, c0 + c, 0, &A);
                if (biased)
                    mf_q_agrp_bias(&A);
                a0 = mf_q_grp_step(kind, &W[c][0], &A, 2, a0);
                a1 = mf_q_grp_step(kind, &W[c][1], &A, 2, a1);
                a2 = mf_q_grp_step(kind, &W[c][2], &A, 2, a2);
                a3 = mf_q_grp_step(kind, &W[c][3], &A, 2, a3);
            }
            acc[t][0] = a0;
            acc[t][1] = a1;
            acc[t][2] = a2;
            acc[t][3] = a3;
            if (full < nc) {        /* the row's last group, 1..3 blocks: 1 or 2 pairs, constant */
                if (mf_q_grp_blocks(nb, c0 + full) <= 2)
                    mf_q8_tile_group32(kind, biased, W[full], a, n, c0 + full, 1, acc[t]);
                else
                    mf_q8_tile_group32(kind, biased, W[full], a, n, c0 + full, 2, acc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            out[4 * t + r] = mf_q_acc_result(acc[t][r]);
}

#define MF_Q8_TILE_ROW32(NAME, DT)                                                             \
static inline void NAME(const void *const *vw, const char *xq, ptrdiff_t xs, int nt, ptrdiff_t n, \
                        float *out)                                                            \
{                                                                                              \
    mf_q8_tile_row32(DT, vw, xq, xs, nt, n, out);                                              \
}
MF_Q8_TILE_ROW32(mf_q8_tile_q4_0, CK_DT_Q4_0)
MF_Q8_TILE_ROW32(mf_q8_tile_q4_1, CK_DT_Q4_1)
MF_Q8_TILE_ROW32(mf_q8_tile_q5_0, CK_DT_Q5_0)
MF_Q8_TILE_ROW32(mf_q8_tile_q5_1, CK_DT_Q5_1)
MF_Q8_TILE_ROW32(mf_q8_tile_q8_0, CK_DT_Q8_0)
MF_Q8_TILE_ROW32(mf_q8_tile_iq4_nl, CK_DT_IQ4_NL)

/* Q4_K / Q5_K / Q6_K: nt (even, <= MF_Q8_TILE_TOKENS) tokens of Q8_K rows.
 *
 * The one-token dots' pairing, with its shuffles moved out of the loop: the two registers of
 * codes of each 64 weights (Q4_K / Q5_K: sub-blocks 2c, 2c+1; Q6_K: registers k, k+1 of a half)
 * are interleaved by 16 bits once, when a chunk is decoded (UL = unpacklo, UH = unpackhi), and
 * the matching activation registers once a token.  Since vpmaddubsw works on byte pairs,
 * maddubs(unpacklo(u1, u2), unpacklo(a1, a2)) = unpacklo(maddubs(u1, a1), maddubs(u2, a2)): the
 * int16 sum of the two products is the one-token dots' x, whose one pmaddwd applies both
 * sub-blocks' scales (|x| <= 2 * 16002).  Per 64 weights, a row and a token: 2 vpmaddubsw, 1
 * vpmaddwd, 2 adds, against 2, 2 and 2 with a pmaddwd per register; vpmaddubsw and vpmaddwd share
 * two pipes on AMD Zen 3.  The same integer sums, so the same bits. */
static inline void mf_q8_tile_kq(int dt, const void *const *vw, const char *xq, ptrdiff_t xs,
                                 int nt, ptrdiff_t n, float *out /* [nt][4] */)
{
    enum { NS = MF_Q8_CHUNK / QK_K };
    __m256i ULb[4][NS][4];      /* [row][super-block][64 weights]: unpacklo of its code pair */
    __m256i UHb[4][NS][4];      /* [row][super-block][64 weights]: unpackhi */
    __m256i SCb[4][NS][4];      /* [row][super-block][64 weights]: x's int16 scale pairs */
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
                        for (int k = 0; k < 4; k += 2) {
                            ULb[r][s][2 * h + k / 2] = _mm256_unpacklo_epi16(q[k], q[k + 1]);
                            UHb[r][s][2 * h + k / 2] = _mm256_unpackhi_epi16(q[k], q[k + 1]);
                            SCb[r][s][2 * h + k / 2] = mf_q_q6k_scv2(sch, k);
                        }
                    }
                    Db[s][r] = mf_q_fp16(b->d);
                    DMb[s][r] = 0.0f;
                } else {
                    const block_q4_K *b4 = (const block_q4_K *)blk;   /* d, dmin, scales: */
                    const __m256i ms = mf_q_k4_scales_mins(b4->scales);    /* the same in Q5_K */
                    MNb[r][s] = _mm256_permute2x128_si256(ms, ms, 0x11);
                    for (int c = 0; c < 4; c++) {
                        __m256i lo, hi;
                        if (dt == CK_DT_Q4_K)
                            mf_q_codes_q4_K(b4, c, &lo, &hi);
                        else
                            mf_q_codes_q5_K((const block_q5_K *)blk, c, &lo, &hi);
                        ULb[r][s][c] = _mm256_unpacklo_epi16(lo, hi);
                        UHb[r][s][c] = _mm256_unpackhi_epi16(lo, hi);
                        SCb[r][s][c] = _mm256_permutevar8x32_epi32(ms, _mm256_set1_epi32(c));
                    }
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
            /* the next pair's super-blocks, into L1 while these compute */
            const int tn = t + 2 * MF_Q_TILE_PF + 1 < nt ? t + 2 * MF_Q_TILE_PF : t;
            for (int s = 0; s < ns; s++) {
                for (int k = 0; k < 2; k++) {
                    const char *pn = (const char *)((const block_q8_K *)(const void *)(xq + (tn + k) * xs) + s0 + s);
                    for (int o = 0; o < (int)sizeof(block_q8_K); o += 64)
                        _mm_prefetch(pn + o, _MM_HINT_T0);
                }
#if defined(MF_SIMD_AVX512)
                /* the two tokens side by side in the halves of 512-bit registers, each row's
                 * registers broadcast to both: the same operations lane for lane as below */
                __m512i q0 = _mm512_setzero_si512(), q1 = q0, q2 = q0, q3 = q0;
                MF_Q_NO_UNROLL
                for (int c = 0; c < 4; c++) {
                    const __m512i x = mf_q_loadu2x256(a0[s].qs + 64 * c, a1[s].qs + 64 * c);
                    const __m512i y = mf_q_loadu2x256(a0[s].qs + 64 * c + 32, a1[s].qs + 64 * c + 32);
                    const __m512i AL = _mm512_unpacklo_epi16(x, y), AH = _mm512_unpackhi_epi16(x, y);
#define MF_Q_KQ_ROW(r, pr)                                                                     \
                    {                                                                          \
                        const __m512i ul = _mm512_broadcast_i64x4(ULb[r][s][c]);               \
                        const __m512i uh = _mm512_broadcast_i64x4(UHb[r][s][c]);               \
                        const __m512i sc = _mm512_broadcast_i64x4(SCb[r][s][c]);               \
                        pr = _mm512_add_epi32(pr, _mm512_madd_epi16(_mm512_add_epi16(          \
                            _mm512_maddubs_epi16(ul, AL), _mm512_maddubs_epi16(uh, AH)), sc));  \
                    }
                    MF_Q_KQ_ROW(0, q0)
                    MF_Q_KQ_ROW(1, q1)
                    MF_Q_KQ_ROW(2, q2)
                    MF_Q_KQ_ROW(3, q3)
#undef MF_Q_KQ_ROW
                }
                P[s][0] = _mm512_castsi512_si256(q0); P[s][4] = _mm512_extracti64x4_epi64(q0, 1);
                P[s][1] = _mm512_castsi512_si256(q1); P[s][5] = _mm512_extracti64x4_epi64(q1, 1);
                P[s][2] = _mm512_castsi512_si256(q2); P[s][6] = _mm512_extracti64x4_epi64(q2, 1);
                P[s][3] = _mm512_castsi512_si256(q3); P[s][7] = _mm512_extracti64x4_epi64(q3, 1);
#else
                __m256i p00 = _mm256_setzero_si256(), p10 = p00, p20 = p00, p30 = p00;
                __m256i p01 = p00, p11 = p00, p21 = p00, p31 = p00;
                MF_Q_NO_UNROLL               /* unrolled, GCC spills the 8 accumulators */
                for (int c = 0; c < 4; c++) {
                    const __m256i x0 = mf_q_loadu256(a0[s].qs + 64 * c);
                    const __m256i y0 = mf_q_loadu256(a0[s].qs + 64 * c + 32);
                    const __m256i x1 = mf_q_loadu256(a1[s].qs + 64 * c);
                    const __m256i y1 = mf_q_loadu256(a1[s].qs + 64 * c + 32);
                    const __m256i AL0 = _mm256_unpacklo_epi16(x0, y0);
                    const __m256i AH0 = _mm256_unpackhi_epi16(x0, y0);
                    const __m256i AL1 = _mm256_unpacklo_epi16(x1, y1);
                    const __m256i AH1 = _mm256_unpackhi_epi16(x1, y1);
#define MF_Q_KQ_ROW(r, pr0, pr1)                                                               \
                    {                                                                          \
                        const __m256i ul = ULb[r][s][c], uh = UHb[r][s][c], sc = SCb[r][s][c]; \
                        pr0 = _mm256_add_epi32(pr0, _mm256_madd_epi16(_mm256_add_epi16(        \
                            _mm256_maddubs_epi16(ul, AL0), _mm256_maddubs_epi16(uh, AH0)), sc)); \
                        pr1 = _mm256_add_epi32(pr1, _mm256_madd_epi16(_mm256_add_epi16(        \
                            _mm256_maddubs_epi16(ul, AL1), _mm256_maddubs_epi16(uh, AH1)), sc)); \
                    }
                    MF_Q_KQ_ROW(0, p00, p01)
                    MF_Q_KQ_ROW(1, p10, p11)
                    MF_Q_KQ_ROW(2, p20, p21)
                    MF_Q_KQ_ROW(3, p30, p31)
#undef MF_Q_KQ_ROW
                }
                P[s][0] = p00; P[s][1] = p10; P[s][2] = p20; P[s][3] = p30;
                P[s][4] = p01; P[s][5] = p11; P[s][6] = p21; P[s][7] = p31;
#endif
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

/* ---- Q2_K, Q3_K, IQ4_XS (the K-quant scheme of mf_dot_q8.h): 4 rows, one token or many ------ */

/* One token, 4 rows: the super-block's activation registers loaded once (mf_q_kxact), each row's
 * partial sums (mf_q_row_<fmt>), the four rows' sumi (and summ) reduced side by side and scaled
 * by the one-row dot's double operations, lane by lane: the bits of the one-row dots.  The rows
 * stream side by side with prefetch of the rows ahead. */
MF_ALWAYS_INLINE void mf_dot4_kx(int dt, const void *const *vw, const void *va, ptrdiff_t n,
                                 float *out)
{
    const char *w[4] = {(const char *)vw[0], (const char *)vw[1], (const char *)vw[2],
                        (const char *)vw[3]};                         /* [n / 256] blocks each */
    const block_q8_K *a = (const block_q8_K *)va;                     /* [n / 256] */
    const ptrdiff_t nb = n / QK_K, bsz = (ptrdiff_t)ck_dtype_block_bytes((CKDataType)dt);
    const ptrdiff_t pf = mf_q_pf_dist(nb * bsz);
    /* where the fp16 d (and dmin) of a block sit */
    const ptrdiff_t od = dt == CK_DT_Q2_K ? (ptrdiff_t)offsetof(block_q2_K, d)
                       : dt == CK_DT_Q3_K ? (ptrdiff_t)offsetof(block_q3_K, d)
                                          : (ptrdiff_t)offsetof(block_iq4_xs, d);
    __m256d acc = _mm256_setzero_pd();
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        mf_q_prefetch4(w[0], nb * bsz, ib * bsz, bsz, pf);
        mf_q_kxact A;
        __m256i si[4], sm[4];
        mf_q_kxact_load(dt, &a[ib], &A);
#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
        if (dt == CK_DT_Q3_K) {                 /* rows 0 | 1 and 2 | 3 in 512-bit registers */
            mf_q_kxact2 B;
            mf_q_kxact2_from(&A, &B);
            for (int r = 0; r < 4; r += 2) {
                const block_q3_K *ba = (const block_q3_K *)(const void *)(w[r] + ib * bsz);
                const block_q3_K *bb = (const block_q3_K *)(const void *)(w[r + 1] + ib * bsz);
                const __m512i s2 = mf_q_row2_q3_K(ba, bb, &B);
                si[r] = _mm512_castsi512_si256(s2);
                si[r + 1] = _mm512_extracti64x4_epi64(s2, 1);
            }
        } else
#endif
        for (int r = 0; r < 4; r++) {
            const void *blk = w[r] + ib * bsz;
            if (dt == CK_DT_Q2_K)
                mf_q_row_q2_K((const block_q2_K *)blk, &A, &si[r], &sm[r]);
            else if (dt == CK_DT_Q3_K)
                si[r] = mf_q_row_q3_K((const block_q3_K *)blk, &A);
            else
                si[r] = mf_q_row_iq4_xs((const block_iq4_xs *)blk, &A);
        }
        const ptrdiff_t o = ib * bsz + od;
        const __m256d da = _mm256_set1_pd((double)a[ib].d);
        const __m256d dd = _mm256_mul_pd(_mm256_cvtps_pd(mf_q_fp16x4(
            mf_q_ld16(w[0] + o), mf_q_ld16(w[1] + o), mf_q_ld16(w[2] + o), mf_q_ld16(w[3] + o))), da);
        __m256d t = _mm256_mul_pd(dd, _mm256_cvtepi32_pd(mf_q_hsum4_epi32(si[0], si[1], si[2], si[3])));
        if (dt == CK_DT_Q2_K) {                 /* - (dmin_w d_a) summ */
            const __m256d dm = _mm256_mul_pd(_mm256_cvtps_pd(mf_q_fp16x4(
                mf_q_ld16(w[0] + o + 2), mf_q_ld16(w[1] + o + 2), mf_q_ld16(w[2] + o + 2),
                mf_q_ld16(w[3] + o + 2))), da);
            t = _mm256_sub_pd(t, _mm256_mul_pd(dm, _mm256_cvtepi32_pd(
                mf_q_hsum4_epi32(sm[0], sm[1], sm[2], sm[3]))));
        }
        acc = _mm256_add_pd(acc, t);
    }
    MF_ALIGNED(32) double r4[4];
    _mm256_store_pd(r4, acc);
    for (int r = 0; r < 4; r++)
        out[r] = (float)r4[r];
}
MF_STATIC_ASSERT(offsetof(block_q2_K, dmin) == offsetof(block_q2_K, d) + 2, q2_K_dmin_after_d);
#define MF_DOT4_KX(NAME, DT)                                                                   \
static inline void NAME(const void *const *vw, const void *va, ptrdiff_t n, float *out)       \
{                                                                                              \
    mf_dot4_kx(DT, vw, va, n, out);                                                            \
}
MF_DOT4_KX(mf_dot4_q2_K_q8_K, CK_DT_Q2_K)
MF_DOT4_KX(mf_dot4_q3_K_q8_K, CK_DT_Q3_K)
MF_DOT4_KX(mf_dot4_iq4_xs_q8_K, CK_DT_IQ4_XS)
#undef MF_DOT4_KX

/* Many tokens: a super-block of one row decoded for the tiles (into L1, once for every token of
 * the call), in the terms of the formats' sums: register c (weights 32c .. 32c + 31) gives
 * pmaddwd(pmaddubsw(u[c], a_c'), sc[c]), where a_c' is the activation register (IQ4_XS: with the
 * sign of its value s[c], as mf_q_sums_iq4_xs does), and the int16 pmaddwd against the 16 bsums
 * of m16 gives Q2_K's min term (summ) or Q3_K's offset term (sum_j s_j bsum_j, times -4). */
typedef struct {
    __m256i u[8], s[8], sc[8];
    __m256i m16;
    float d, dmin;
} mf_q_kxdec;

MF_ALWAYS_INLINE void mf_q_kx_decode(int dt, const void *blk, mf_q_kxdec *D)
{
    if (dt == CK_DT_IQ4_XS) {
        const block_iq4_xs *b = (const block_iq4_xs *)blk;
        const __m256i kv = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)mf_kvalues_iq4nl));
        for (int j = 0; j < 8; j++) {
            D->s[j] = _mm256_shuffle_epi8(kv, mf_q_nibbles32(b->qs + 16 * j));
            D->u[j] = _mm256_abs_epi8(D->s[j]);
        }
        const __m256i sc2 = _mm256_broadcastsi128_si256(mf_q_iq4xs_scales16(b));
        for (int j = 0; j < 8; j++)            /* word j in every position */
            D->sc[j] = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16((short)((2 * j + 1) << 8 | 2 * j)));
        D->m16 = _mm256_setzero_si256();
        D->d = mf_q_fp16(b->d);
        D->dmin = 0.0f;
        return;
    }
    __m256i sc16, hm = _mm256_setzero_si256();
    const uint8_t *qs;
    if (dt == CK_DT_Q2_K) {
        const block_q2_K *b = (const block_q2_K *)blk;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)b->scales);
        sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, _mm_set1_epi8(0x0F)));
        D->m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F)));
        qs = b->qs;
        D->d = mf_q_fp16(b->d);
        D->dmin = mf_q_fp16(b->dmin);
    } else {
        const block_q3_K *b = (const block_q3_K *)blk;
        sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(mf_q_q3k_scales16(b->scales)),
                                _mm256_set1_epi16(32));
        D->m16 = sc16;
        hm = mf_q_loadu256(b->hmask);
        qs = b->qs;
        D->d = mf_q_fp16(b->d);
        D->dmin = 0.0f;
    }
    for (int h = 0; h < 2; h++) {
        const __m256i q = mf_q_loadu256(qs + 32 * h), sch = mf_q_sc16_half(sc16, h);
        for (int k = 0; k < 4; k++) {
            __m256i u = mf_q_codes2(q, k);
            if (dt == CK_DT_Q3_K)
                u = _mm256_or_si256(u, mf_q_hbit4(hm, 4 * h + k));
            D->u[4 * h + k] = u;
            D->sc[4 * h + k] = mf_q_sc16_sel(sch, k);
        }
    }
}

/* nt (even, <= MF_Q8_TILE_TOKENS) tokens of Q8_K rows at xq (stride xs) against rows vw[0..3] of
 * Q2_K, Q3_K or IQ4_XS: MF_Q8_CHUNK weights of each row decoded at once (mf_q_kx_decode), then
 * every pair of tokens runs past them.  Each (row, token)'s integer sums equal its one-row dot's,
 * and its double steps are the same operations in the same order: the same bits. */
MF_ALWAYS_INLINE void mf_q8_tile_kx(int dt, const void *const *vw, const char *xq, ptrdiff_t xs,
                                   int nt, ptrdiff_t n, float *out /* [nt][4] */)
{
    enum { NS = MF_Q8_CHUNK / QK_K };
    mf_q_kxdec D[NS][4];                        /* [super-block][row] */
    double acc[MF_Q8_TILE_TOKENS][4];
    const int iq4 = dt == CK_DT_IQ4_XS, q3 = dt == CK_DT_Q3_K, q2 = dt == CK_DT_Q2_K;
    const ptrdiff_t bsz = (ptrdiff_t)ck_dtype_block_bytes((CKDataType)dt), nsb = n / QK_K;
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    for (ptrdiff_t s0 = 0; s0 < nsb; s0 += NS) {
        const int ns = (int)(nsb - s0 < NS ? nsb - s0 : NS);
        for (int s = 0; s < ns; s++)
            for (int r = 0; r < 4; r++)
                mf_q_kx_decode(dt, (const char *)vw[r] + (s0 + s) * bsz, &D[s][r]);
        for (int t = 0; t + 1 < nt; t += 2) {
            const block_q8_K *a0 = (const block_q8_K *)(const void *)(xq + t * xs) + s0;
            const block_q8_K *a1 = (const block_q8_K *)(const void *)(xq + (t + 1) * xs) + s0;
            const int tn = t + 2 * MF_Q_TILE_PF + 1 < nt ? t + 2 * MF_Q_TILE_PF : t;
            __m256d acc0 = _mm256_loadu_pd(acc[t]), acc1 = _mm256_loadu_pd(acc[t + 1]);
            for (int s = 0; s < ns; s++) {
                for (int k = 0; k < 2; k++) {           /* the next pair's blocks, into L1 */
                    const char *pn = (const char *)((const block_q8_K *)(const void *)(xq + (tn + k) * xs) + s0 + s);
                    for (int o = 0; o < (int)sizeof(block_q8_K); o += 64)
                        _mm_prefetch(pn + o, _MM_HINT_T0);
                }
                __m256i P[8];                           /* [row r, token 0 | row r, token 1] */
                for (int i = 0; i < 8; i++)
                    P[i] = _mm256_setzero_si256();
                MF_Q_NO_UNROLL
                for (int c = 0; c < 8; c++) {
                    const __m256i x0 = mf_q_loadu256(a0[s].qs + 32 * c);
                    const __m256i x1 = mf_q_loadu256(a1[s].qs + 32 * c);
                    for (int r = 0; r < 4; r++) {
                        const mf_q_kxdec *E = &D[s][r];
                        const __m256i y0 = iq4 ? _mm256_sign_epi8(x0, E->s[c]) : x0;
                        const __m256i y1 = iq4 ? _mm256_sign_epi8(x1, E->s[c]) : x1;
                        P[r] = _mm256_add_epi32(P[r], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(E->u[c], y0), E->sc[c]));
                        P[4 + r] = _mm256_add_epi32(P[4 + r], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(E->u[c], y1), E->sc[c]));
                    }
                }
                const __m256i bs0 = mf_q_loadu256(a0[s].bsums), bs1 = mf_q_loadu256(a1[s].bsums);
                __m256i M[8];
                for (int r = 0; r < 4; r++) {
                    M[r] = _mm256_madd_epi16(D[s][r].m16, bs0);
                    M[4 + r] = _mm256_madd_epi16(D[s][r].m16, bs1);
                    if (q3) {                           /* the offset: -4 sum_j s_j bsum_j */
                        P[r] = _mm256_sub_epi32(P[r], _mm256_slli_epi32(M[r], 2));
                        P[4 + r] = _mm256_sub_epi32(P[4 + r], _mm256_slli_epi32(M[4 + r], 2));
                    }
                }
                const __m256i S = mf_q_tree8(P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7]);
                const __m256d dw = _mm256_setr_pd((double)D[s][0].d, (double)D[s][1].d,
                                                  (double)D[s][2].d, (double)D[s][3].d);
                const __m256d da0 = _mm256_set1_pd((double)a0[s].d);
                const __m256d da1 = _mm256_set1_pd((double)a1[s].d);
                __m256d t0 = _mm256_mul_pd(_mm256_mul_pd(dw, da0),
                                           _mm256_cvtepi32_pd(_mm256_castsi256_si128(S)));
                __m256d t1 = _mm256_mul_pd(_mm256_mul_pd(dw, da1),
                                           _mm256_cvtepi32_pd(_mm256_extracti128_si256(S, 1)));
                if (q2) {                               /* - (dmin_w d_a) summ */
                    const __m256i Mt = mf_q_tree8(M[0], M[1], M[2], M[3], M[4], M[5], M[6], M[7]);
                    const __m256d dm = _mm256_setr_pd((double)D[s][0].dmin, (double)D[s][1].dmin,
                                                      (double)D[s][2].dmin, (double)D[s][3].dmin);
                    t0 = _mm256_sub_pd(t0, _mm256_mul_pd(_mm256_mul_pd(dm, da0),
                        _mm256_cvtepi32_pd(_mm256_castsi256_si128(Mt))));
                    t1 = _mm256_sub_pd(t1, _mm256_mul_pd(_mm256_mul_pd(dm, da1),
                        _mm256_cvtepi32_pd(_mm256_extracti128_si256(Mt, 1))));
                }
                acc0 = _mm256_add_pd(acc0, t0);
                acc1 = _mm256_add_pd(acc1, t1);
            }
            _mm256_storeu_pd(acc[t], acc0);
            _mm256_storeu_pd(acc[t + 1], acc1);
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            out[4 * t + r] = (float)acc[t][r];
}

#define MF_Q8_TILE_KX(NAME, DT)                                                                \
static inline void NAME(const void *const *vw, const char *xq, ptrdiff_t xs, int nt, ptrdiff_t n, \
                        float *out)                                                            \
{                                                                                              \
    mf_q8_tile_kx(DT, vw, xq, xs, nt, n, out);                                                 \
}
MF_Q8_TILE_KX(mf_q8_tile_q2_K, CK_DT_Q2_K)
MF_Q8_TILE_KX(mf_q8_tile_q3_K, CK_DT_Q3_K)
MF_Q8_TILE_KX(mf_q8_tile_iq4_xs, CK_DT_IQ4_XS)
#undef MF_Q8_TILE_KX

#endif /* MF_Q_AVX2 */

/* Tokens a caller hands mf_q8_rows_tokens at once, for activation rows of row_bytes: up to
 * MF_Q8_TILE_TOKENS, as many as keep their rows within MF_Q8_TILE_ACT_BYTES (every group of 4
 * weight rows reads all of them: from L2, not L3), an even number of at least 8. */
static inline int mf_q8_tile_tokens(size_t row_bytes)
{
    size_t t = row_bytes ? MF_Q8_TILE_ACT_BYTES / row_bytes : MF_Q8_TILE_TOKENS;
    t = t < 8 ? 8 : t > MF_Q8_TILE_TOKENS ? MF_Q8_TILE_TOKENS : t;
    return (int)(t & ~(size_t)1);
}

typedef void (*mf_dot4_fn)(const void *const *w, const void *a, ptrdiff_t n, float *out);
typedef void (*mf_q8_tile_fn)(const void *const *w, const char *xq, ptrdiff_t xs, int nt,
                              ptrdiff_t n, float *out);

#if defined(MF_Q_NEON)
#  include "mf_neon_q8_tiles.h"
#endif

/* The one-token dot of 4 rows of format dt (out[r] = mf_weight_row_dot_q8(w[r], dt, a, n), bit
 * for bit), or NULL: not a block format, or the generic level (mf_q8_rows_tokens goes row by
 * row there). */
static inline mf_dot4_fn mf_dot4_q8_for(int dt)
{
#if defined(MF_Q_AVX2)
    switch (dt) {
    case CK_DT_Q4_0: return mf_dot4_q4_0_q8_0;
    case CK_DT_Q4_1: return mf_dot4_q4_1_q8_0;
    case CK_DT_Q5_0: return mf_dot4_q5_0_q8_0;
    case CK_DT_Q5_1: return mf_dot4_q5_1_q8_0;
    case CK_DT_Q8_0: return mf_dot4_q8_0_q8_0;
    case CK_DT_Q4_K: return mf_dot4_q4_K_q8_K;
    case CK_DT_Q5_K: return mf_dot4_q5_K_q8_K;
    case CK_DT_Q6_K: return mf_dot4_q6_K_q8_K;
    case CK_DT_IQ4_NL: return mf_dot4_iq4_nl_q8_0;
    case CK_DT_Q2_K: return mf_dot4_q2_K_q8_K;
    case CK_DT_Q3_K: return mf_dot4_q3_K_q8_K;
    case CK_DT_IQ4_XS: return mf_dot4_iq4_xs_q8_K;
    default: return NULL;
    }
#elif defined(MF_Q_NEON)
    return mf_neon_dot4_q8_for(dt);
#else
    (void)dt;
    return NULL;
#endif
}

/* out[4 * t + r] = mf_weight_row_dot_q8(w[r], dt, a + t * a_stride, n) for r < nr, t < nt. */
static inline void mf_q8_rows_tokens(int dt, const void *const *w, int nr, const void *va,
                                     ptrdiff_t a_stride, int nt, ptrdiff_t n, float *out)
{
    const char *a = (const char *)va;
    const void *wp[4];
    for (int r = 0; r < 4; r++)
        wp[r] = w[r < nr ? r : nr - 1];       /* missing rows: the last one again (discarded) */
#if defined(MF_Q_AVX2)
    const mf_dot4_fn one = mf_dot4_q8_for(dt);
    mf_q8_tile_fn tile = NULL;
    const int kquant = dt == CK_DT_Q4_K || dt == CK_DT_Q5_K || dt == CK_DT_Q6_K;
    const int kx = dt == CK_DT_Q2_K || dt == CK_DT_Q3_K || dt == CK_DT_IQ4_XS;
    switch (dt) {
    case CK_DT_Q4_0: tile = mf_q8_tile_q4_0; break;
    case CK_DT_Q4_1: tile = mf_q8_tile_q4_1; break;
    case CK_DT_Q5_0: tile = mf_q8_tile_q5_0; break;
    case CK_DT_Q5_1: tile = mf_q8_tile_q5_1; break;
    case CK_DT_Q8_0: tile = mf_q8_tile_q8_0; break;
    case CK_DT_IQ4_NL: tile = mf_q8_tile_iq4_nl; break;
    case CK_DT_Q2_K: tile = mf_q8_tile_q2_K; break;
    case CK_DT_Q3_K: tile = mf_q8_tile_q3_K; break;
    case CK_DT_IQ4_XS: tile = mf_q8_tile_iq4_xs; break;
    default: break;
    }
    if (one != NULL && nt <= MF_Q8_FEW_TOKENS) {   /* a few tokens: the rows stay in L1 */
        for (int t = 0; t < nt; t++)
            one(wp, a + t * a_stride, n, out + 4 * t);
        return;
    }
    if (one != NULL) {
        int t = 0;
        while (nt - t >= 2) {
            int m = kquant || kx ? (nt - t) & ~1 : nt - t;  /* the K-quant tiles take token pairs */
            if (m > MF_Q8_TILE_TOKENS)
                m = MF_Q8_TILE_TOKENS;
            if (kquant)
                mf_q8_tile_kq(dt, wp, a + t * a_stride, a_stride, m, n, out + 4 * t);
            else
                tile(wp, a + t * a_stride, a_stride, m, n, out + 4 * t);
            t += m;
        }
        if (t < nt)
            one(wp, a + t * a_stride, n, out + 4 * t);
        return;
    }
#elif defined(MF_Q_NEON)
    if (mf_neon_rows_tokens(dt, wp, a, a_stride, nt, n, out))
        return;
#endif
    {
        mf_dot_q8_fn f = mf_dot_q8_for(dt);
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < 4; r++)
                out[4 * t + r] = (r < nr && f != NULL) ? f(wp[r], a + t * a_stride, n) : 0.0f;
    }
}

/* ---- many tokens, avx512 with VNNI: 16 rows of a 256-weight format in the lanes ------------ */

#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
/* A super-block of 16 rows of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS decoded for
 * mf_q8_tile16_kq: every register holds one 4-weight step of the 16 rows, lane r = row r, so that
 * vpdpbusd of a register against 4 activation codes broadcast from the Q8_K row ({1to16}) adds
 * each row's 4 products to its own lane.  A lane sums a whole sub-block in place (8 steps for 32
 * weights, 4 for 16: mf_q_kq16_steps), which is then scaled by vpmulld: no horizontal sums, no
 * shuffles of the activations.
 *   q[k]    unsigned codes of weights 4k .. 4k + 3: Q2_K 0..3, Q3_K 0..7 (its value + 4), Q4_K
 *           0..15, Q5_K 0..31, Q6_K 0..63 (value + 32), IQ4_XS kvalues + 128
 *   sc[j]   sub-block j's scale as int32 (Q2_K's 4-bit sc, Q3_K's sc - 32, Q4_K / Q5_K's 6-bit
 *           sc, Q6_K's int8, IQ4_XS's ls - 32)
 *   mp[i]   int16 pairs against dword i of bsums (bsums[2i], bsums[2i + 1]): the mins [m_2i,
 *           m_2i+1] (Q2_K), whose sum is summ, or the scales [sc_2i, sc_2i+1] (Q3_K, Q6_K), whose
 *           sum the offset multiplies; for the 32-weight sub-blocks (mf_q_kq16_paired: Q4_K /
 *           Q5_K's mins, IQ4_XS's scales) mp[k], k < 4, = [x_2k, x_2k+1] against dword k of
 *           the pair sums bsums[2i] + bsums[2i + 1] (sub-block i's code sum): 4 vpdpwssd a
 *           token, not 8
 *   d, dm   d and dmin of the 16 rows as double, rows 0..7 | 8..15 (dm 0 without mins) */
#ifndef MF_Q8_TILE16_NS
#  define MF_Q8_TILE16_NS 2     /* super-blocks of the 16 rows decoded at once (12 KiB) */
#endif
#ifndef MF_Q8_TILE16_TB
#  define MF_Q8_TILE16_TB 4     /* tokens that share each load of a code register */
#endif
typedef struct {
    __m512i q[64];
    __m512i sc[16];
    __m512i mp[8];
    __m512d d[2], dm[2];
} mf_q_kq16;
/* mf_q_kq16_decode reads 32 bytes of each block at offset 0 (Q4_K, Q5_K: d, dmin, scales), at
 * offsetof(scales) - 16 (Q6_K), offsetof(scales) - 20 (Q3_K) and sizeof - 32 (Q2_K): inside the
 * block. */
MF_STATIC_ASSERT(offsetof(block_q4_K, d) == 0 && offsetof(block_q4_K, dmin) == 2
                 && offsetof(block_q4_K, scales) == 4, q4_K_head);
MF_STATIC_ASSERT(offsetof(block_q5_K, d) == 0 && offsetof(block_q5_K, dmin) == 2
                 && offsetof(block_q5_K, scales) == 4, q5_K_head);
MF_STATIC_ASSERT(offsetof(block_q6_K, scales) >= 16
                 && offsetof(block_q6_K, scales) + 16 <= sizeof(block_q6_K), q6_K_scales);
MF_STATIC_ASSERT(offsetof(block_q3_K, scales) >= 20
                 && offsetof(block_q3_K, scales) + 12 <= sizeof(block_q3_K), q3_K_scales);
MF_STATIC_ASSERT(offsetof(block_q2_K, d) == sizeof(block_q2_K) - 4, q2_K_d_last);
MF_STATIC_ASSERT(offsetof(block_iq4_xs, scales_h) == 2 && offsetof(block_iq4_xs, scales_l) == 4
                 && offsetof(block_iq4_xs, qs) == 8, iq4_xs_head);

/* out[k] = [dword k of p[0] + o | ... | dword k of p[15] + o], k < 8: the 16 rows' 32 bytes at
 * byte offset o transposed in 4-byte steps (two unpack stages and a 128-bit shuffle; rows i and
 * i + 4 share a load, so that the lanes come out in row order). */
MF_ALWAYS_INLINE void mf_q_t16x8(const char *const p[16], ptrdiff_t o, __m512i out[8])
{
    __m512i X[8], T[8];
    for (int i = 0; i < 4; i++) {
        X[i] = mf_q_loadu2x256(p[i] + o, p[i + 4] + o);
        X[i + 4] = mf_q_loadu2x256(p[i + 8] + o, p[i + 12] + o);
    }
    for (int i = 0; i < 8; i += 2) {
        T[i] = _mm512_unpacklo_epi32(X[i], X[i + 1]);
        T[i + 1] = _mm512_unpackhi_epi32(X[i], X[i + 1]);
    }
    for (int h = 0; h < 2; h++) {           /* h = 0: X[0..3], h = 1: X[4..7] */
        const __m512i *t = T + 4 * h;
        const __m512i u0 = _mm512_unpacklo_epi64(t[0], t[2]), u1 = _mm512_unpackhi_epi64(t[0], t[2]);
        const __m512i u2 = _mm512_unpacklo_epi64(t[1], t[3]), u3 = _mm512_unpackhi_epi64(t[1], t[3]);
        X[4 * h + 0] = u0; X[4 * h + 1] = u1; X[4 * h + 2] = u2; X[4 * h + 3] = u3;
    }
    for (int k = 0; k < 4; k++) {           /* 128-bit lanes: [rows 0-3 | 4-7 | 8-11 | 12-15] */
        out[k] = _mm512_shuffle_i32x4(X[k], X[k + 4], _MM_SHUFFLE(2, 0, 2, 0));
        out[k + 4] = _mm512_shuffle_i32x4(X[k], X[k + 4], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* [lo | hi << 16]: the low words of two int32 vectors as the int16 pairs of vpdpwssd */
MF_ALWAYS_INLINE __m512i mf_q_pair16(__m512i lo, __m512i hi)
{
    return _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(hi, 16));
}

/* The fp16 at offset o of each row's block as floats, lane r = row r. */
MF_ALWAYS_INLINE __m512 mf_q_f16x16(const char *const p[16], ptrdiff_t o)
{
    MF_ALIGNED(32) uint16_t h[16];
    for (int r = 0; r < 16; r++)
        memcpy(&h[r], p[r] + o, 2);
    return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)h));
}

/* fp16 d of each row (at offset od of its block) as doubles, rows 0..7 | 8..15 */
MF_ALWAYS_INLINE void mf_q_kq16_d(const char *const p[16], ptrdiff_t od, __m512d d[2])
{
    const __m512 d16 = mf_q_f16x16(p, od);
    d[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(d16));
    d[1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(d16, 1));
}

/* Q2_K / Q3_K codes of weights 128h + 32k + 4q .. + 3 (register 32h + 8k + q): bits 2k, 2k + 1
 * of the transposed qs Q[8h + q] (and Q3_K's third bit, bit 4h + k of hmask Hm[q]) */
MF_ALWAYS_INLINE void mf_q_kq16_codes2(const __m512i Q[16], const __m512i *Hm, __m512i q[64])
{
    const __m512i m3 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 8; i++) {
                __m512i c = _mm512_and_si512(_mm512_srli_epi16(Q[8 * h + i], 2 * k), m3);
                if (Hm != NULL)
                    c = _mm512_mask_add_epi8(c, _mm512_test_epi8_mask(
                        Hm[i], _mm512_set1_epi8((char)(1 << (4 * h + k)))), c, _mm512_set1_epi8(4));
                q[32 * h + 8 * k + i] = c;
            }
}

MF_ALWAYS_INLINE void mf_q_kq16_decode(int dt, const char *const p[16], mf_q_kq16 *D)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (dt == CK_DT_Q2_K) {
        /* scales[16] at 0 (dwords 0..3: sc = low nibble, m = high), qs[64] at 16, d, dmin at 80 */
        __m512i S[8], Q[16];
        mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q2_K, qs), Q);
        mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q2_K, qs) + 32, Q + 8);
        mf_q_kq16_codes2(Q, NULL, D->q);
        mf_q_t16x8(p, 0, S);
        const __m512i kf = _mm512_set1_epi32(0x0F);
        for (int j = 0; j < 16; j++)
            D->sc[j] = _mm512_and_si512(_mm512_srli_epi32(S[j / 4], 8 * (j % 4)), kf);
        for (int i = 0; i < 8; i++) {   /* [m_2i, m_2i+1] */
            const __m512i y = _mm512_srli_epi32(S[i / 2], 16 * (i % 2));
            D->mp[i] = mf_q_pair16(_mm512_and_si512(_mm512_srli_epi32(y, 4), kf),
                                   _mm512_and_si512(_mm512_srli_epi32(y, 12), kf));
        }
        mf_q_t16x8(p, (ptrdiff_t)sizeof(block_q2_K) - 32, S);   /* dword 7: [d | dmin] */
        const __m512 d16 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(S[7]));
        const __m512 m16 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(S[7], 16)));
        D->d[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(d16));
        D->d[1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(d16, 1));
        D->dm[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(m16));
        D->dm[1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(m16, 1));
        return;
    }
    if (dt == CK_DT_Q3_K) {
        /* hmask[32] at 0, qs[64] at 32, scales[12] at 96 (dwords 5..7 of the 32 bytes at 76) */
        __m512i S[8], Q[16], Hm[8];
        mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q3_K, hmask), Hm);
        mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q3_K, qs), Q);
        mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q3_K, qs) + 32, Q + 8);
        mf_q_kq16_codes2(Q, Hm, D->q);
        mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q3_K, scales) - 20, S);
        const __m512i U0 = S[5], U1 = S[6], U2 = S[7];
        const __m512i k4 = _mm512_set1_epi32(0x0f0f0f0f), k2 = _mm512_set1_epi32(0x03030303);
        const __m512i kb = _mm512_set1_epi32(0xFF), k32 = _mm512_set1_epi32(32);
        const __m512i V[4] = {          /* bytes: sc 0..3, 4..7, 8..11, 12..15 (mf_q3k_scales) */
            _mm512_or_si512(_mm512_and_si512(U0, k4), _mm512_slli_epi32(_mm512_and_si512(U2, k2), 4)),
            _mm512_or_si512(_mm512_and_si512(U1, k4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(U2, 2), k2), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(U0, 4), k4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(U2, 4), k2), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(U1, 4), k4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(U2, 6), k2), 4))};
        for (int j = 0; j < 16; j++)    /* sc_j - 32 */
            D->sc[j] = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(V[j / 4], 8 * (j % 4)), kb), k32);
        for (int i = 0; i < 8; i++) {   /* [sc_2i - 32, sc_2i+1 - 32] */
            const __m512i y = _mm512_srli_epi32(V[i / 2], 16 * (i % 2));
            D->mp[i] = mf_q_pair16(_mm512_sub_epi32(_mm512_and_si512(y, kb), k32),
                                   _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(y, 8), kb), k32));
        }
        mf_q_kq16_d(p, (ptrdiff_t)offsetof(block_q3_K, d), D->d);
        D->dm[0] = D->dm[1] = _mm512_setzero_pd();
        return;
    }
    if (dt == CK_DT_IQ4_XS) {
        /* d, scales_h at 0 (dword 0), scales_l (dword 1); qs[128] at 8: sub-block j's 16 bytes are
         * dwords 4j .. 4j + 3, low nibbles weights 32j + 4i.., high 32j + 16 + 4i.. */
        __m512i S[8], P[32];
        mf_q_t16x8(p, 0, S);
        for (int m = 0; m < 4; m++)
            mf_q_t16x8(p, (ptrdiff_t)offsetof(block_iq4_xs, qs) + 32 * m, P + 8 * m);
        /* kvalues + 128 (1 .. 241): unsigned for vpdpbusd; the 128 sum a comes off below */
        const __m512i kv = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(
            (const __m128i *)(const void *)mf_kvalues_iq4nl)), _mm512_set1_epi8((char)0x80));
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) {
                const __m512i x = P[4 * j + i];
                D->q[8 * j + i] = _mm512_shuffle_epi8(kv, _mm512_and_si512(x, m4));
                D->q[8 * j + 4 + i] = _mm512_shuffle_epi8(kv, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
            }
        const __m512i kf = _mm512_set1_epi32(0x0F), k3 = _mm512_set1_epi32(3);
        for (int j = 0; j < 8; j++) {   /* ls_j - 32 (mf_iq4xs_scale) */
            const __m512i ls = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32(S[1], 4 * j), kf),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(S[0], 16 + 2 * j), k3), 4));
            D->sc[j] = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
        }
        for (int k = 0; k < 4; k++)     /* [ls_2k - 32, ls_2k+1 - 32] (mf_q_kq16_paired) */
            D->mp[k] = mf_q_pair16(D->sc[2 * k], D->sc[2 * k + 1]);
        const __m512 d16 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(S[0]));
        D->d[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(d16));
        D->d[1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(d16, 1));
        D->dm[0] = D->dm[1] = _mm512_setzero_pd();
        return;
    }
    if (dt == CK_DT_Q6_K) {
        __m512i L[32], H[16];
        for (int m = 0; m < 4; m++)
            mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q6_K, ql) + 32 * m, L + 8 * m);
        for (int h = 0; h < 2; h++)
            mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q6_K, qh) + 32 * h, H + 8 * h);
        const __m512i m2 = _mm512_set1_epi8(0x30);
        /* weight 128h + 32k + l: low 4 bits from ql[64h + 32(k & 1) + l] (k < 2: low nibble),
         * high 2 from bits 2k, 2k + 1 of qh[32h + l] */
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int q = 0; q < 8; q++) {
                    const __m512i l = L[8 * (2 * h + (k & 1)) + q], hb = H[8 * h + q];
                    const __m512i lo = k < 2 ? _mm512_and_si512(l, m4)
                                             : _mm512_and_si512(_mm512_srli_epi16(l, 4), m4);
                    const __m512i hi = k == 3 ? _mm512_srli_epi16(hb, 2)
                                              : _mm512_slli_epi16(hb, 4 - 2 * k);
                    D->q[32 * h + 8 * k + q] = _mm512_or_si512(lo, _mm512_and_si512(hi, m2));
                }
        /* the scales: bytes 16..31 of the 32 at 176 (dwords 4..7), sign-extended */
        __m512i S[8];
        mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q6_K, scales) - 16, S);
        for (int j = 0; j < 16; j++)
            D->sc[j] = _mm512_srai_epi32(_mm512_slli_epi32(S[4 + j / 4], 24 - 8 * (j % 4)), 24);
        for (int i = 0; i < 8; i++)     /* [sc_2i, sc_2i+1] */
            D->mp[i] = mf_q_pair16(D->sc[2 * i], D->sc[2 * i + 1]);
        mf_q_kq16_d(p, (ptrdiff_t)offsetof(block_q6_K, d), D->d);
        D->dm[0] = D->dm[1] = _mm512_setzero_pd();
        return;
    } else {
        const ptrdiff_t oqs = dt == CK_DT_Q4_K ? (ptrdiff_t)offsetof(block_q4_K, qs)
                                               : (ptrdiff_t)offsetof(block_q5_K, qs);
        __m512i H[8];
        if (dt == CK_DT_Q5_K)
            mf_q_t16x8(p, (ptrdiff_t)offsetof(block_q5_K, qh), H);
        for (int c = 0; c < 4; c++) {       /* qs[32c + l]: sub-block 2c (low nibble), 2c + 1 */
            __m512i P[8];
            mf_q_t16x8(p, oqs + 32 * c, P);
            for (int q = 0; q < 8; q++) {
                __m512i lo = _mm512_and_si512(P[q], m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(P[q], 4), m4);
                if (dt == CK_DT_Q5_K) {     /* bit j of qh[l]: 5th bit of weight l of sub-block j */
                    const __m512i x10 = _mm512_set1_epi8(0x10);
                    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(
                        H[q], _mm512_set1_epi8((char)(1 << (2 * c)))), lo, x10);
                    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(
                        H[q], _mm512_set1_epi8((char)(1 << (2 * c + 1)))), hi, x10);
                }
                D->q[8 * (2 * c) + q] = lo;
                D->q[8 * (2 * c + 1) + q] = hi;
            }
        }
        /* d, dmin, scales (the same in Q5_K): dword 0 = [d | dmin], dwords 1..3 = the 12 bytes
         * of scales, u0 u1 u2; sc and m unpacked as mf_q_k4_scale_bytes4 does, per lane */
        __m512i S[8];
        mf_q_t16x8(p, 0, S);
        const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f);
        const __m512i k3 = _mm512_set1_epi32(0x03030303), kb = _mm512_set1_epi32(0xFF);
        const __m512i U0 = S[1], U1 = S[2], U2 = S[3];
        const __m512i V[4] = {          /* bytes: sc 0..3, sc 4..7, m 0..3, m 4..7 */
            _mm512_and_si512(U0, k1),
            _mm512_or_si512(_mm512_and_si512(U2, k2),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(U0, 6), k3), 4)),
            _mm512_and_si512(U1, k1),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(U2, 4), k2),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(U1, 6), k3), 4))};
        for (int j = 0; j < 8; j++)
            D->sc[j] = _mm512_and_si512(_mm512_srli_epi32(V[j / 4], 8 * (j % 4)), kb);
        for (int k = 0; k < 4; k++)     /* [m_2k, m_2k+1]: bytes 2k % 4, 2k % 4 + 1 of V[2 + k / 2] */
            D->mp[k] = mf_q_pair16(
                _mm512_and_si512(_mm512_srli_epi32(V[2 + k / 2], 16 * (k % 2)), kb),
                _mm512_and_si512(_mm512_srli_epi32(V[2 + k / 2], 16 * (k % 2) + 8), kb));
        const __m512 d16 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(S[0]));
        const __m512 m16 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(S[0], 16)));
        D->d[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(d16));
        D->d[1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(d16, 1));
        D->dm[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(m16));
        D->dm[1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(m16, 1));
    }
}

/* 4 activation codes at p, as the broadcast operand of vpdpbusd / vpdpwssd */
MF_ALWAYS_INLINE __m512i mf_q_bc4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* 4-weight steps of a sub-block: 8 for the 32-weight sub-blocks of Q4_K, Q5_K and IQ4_XS, 4 for
 * the 16-weight ones of Q2_K, Q3_K and Q6_K */
MF_ALWAYS_INLINE int mf_q_kq16_steps(int dt)
{
    return dt == CK_DT_Q4_K || dt == CK_DT_Q5_K || dt == CK_DT_IQ4_XS ? 8 : 4;
}

/* The offset term: sumi = sum_j sc_j (code . a) - 2^sh sum_j sc_j bsum_j, for the formats whose
 * codes are their values + 2^sh (Q3_K: 4, Q6_K: 32, IQ4_XS: 128, its kvalues made unsigned);
 * 0 for the formats with mins (Q2_K, Q4_K, Q5_K: summ on its own). */
MF_ALWAYS_INLINE int mf_q_kq16_offset_shift(int dt)
{
    return dt == CK_DT_Q6_K ? 5 : dt == CK_DT_Q3_K ? 2 : dt == CK_DT_IQ4_XS ? 7 : 0;
}

/* True where a sub-block is 32 weights (two bsums) with one min or offset scale (Q4_K, Q5_K,
 * IQ4_XS): mp holds 4 pairs against the bsums' pair sums (mf_q_kq16). */
MF_ALWAYS_INLINE int mf_q_kq16_paired(int dt)
{
    return dt == CK_DT_Q4_K || dt == CK_DT_Q5_K || dt == CK_DT_IQ4_XS;
}

/* The exact int32 sums of one super-block of the 16 rows (lanes) against nb (a constant where
 * this is inlined, <= 4) tokens' Q8_K blocks a[u]: si[u] = sumi (with the offset term, as the
 * one-row dots), sm[u] = summ (Q2_K, Q4_K, Q5_K).  Each code register is loaded once for the nb
 * tokens. */
/* The min or offset term of one token's Q8_K block a against the 16 rows (lanes), before its
 * shift: sum_i mp[i] . (int16 pairs of bsums) by vpdpwssd -- over the pair sums bsums[2i] +
 * bsums[2i + 1] (sub-block i's code sum, |.| <= 32 * 128: int16) where a sub-block is 32
 * weights (mf_q_kq16_paired), else over bsums directly. */
MF_ALWAYS_INLINE __m512i mf_q_kq16_mins(int dt, const mf_q_kq16 *D, const block_q8_K *a)
{
    __m512i M = _mm512_setzero_si512();
    if (mf_q_kq16_paired(dt)) {
        MF_ALIGNED(16) int16_t ps[8];
        _mm_store_si128((__m128i *)(void *)ps, _mm_hadd_epi16(
            _mm_loadu_si128((const __m128i *)(const void *)a->bsums),
            _mm_loadu_si128((const __m128i *)(const void *)(a->bsums + 8))));
        for (int k = 0; k < 4; k++)
            M = _mm512_dpwssd_epi32(M, D->mp[k], mf_q_bc4(ps + 2 * k));
    } else {
        for (int i = 0; i < 8; i++)
            M = _mm512_dpwssd_epi32(M, D->mp[i], mf_q_bc4(a->bsums + 2 * i));
    }
    return M;
}

MF_ALWAYS_INLINE void mf_q_kq16_sums(int dt, const mf_q_kq16 *D, const block_q8_K *const *a,
                                     int nb, __m512i *si, __m512i *sm)
{
    const __m512i z = _mm512_setzero_si512();
    const int L = mf_q_kq16_steps(dt);          /* 4-weight steps a sub-block */
    const int sh = mf_q_kq16_offset_shift(dt);
    __m512i I[MF_Q8_TILE16_TB];
    for (int u = 0; u < nb; u++)
        I[u] = z;
    for (int j = 0; j < 64 / L; j++) {
        __m512i s[MF_Q8_TILE16_TB];
        for (int u = 0; u < nb; u++)
            s[u] = z;
        for (int i = 0; i < L; i++) {
            const __m512i q = D->q[L * j + i];
            for (int u = 0; u < nb; u++)
                s[u] = _mm512_dpbusd_epi32(s[u], q, mf_q_bc4(a[u]->qs + 4 * (L * j + i)));
        }
        for (int u = 0; u < nb; u++)
            I[u] = _mm512_add_epi32(I[u], _mm512_mullo_epi32(s[u], D->sc[j]));
    }
    for (int u = 0; u < nb; u++) {
        const __m512i M = mf_q_kq16_mins(dt, D, a[u]);
        si[u] = sh ? _mm512_sub_epi32(I[u], _mm512_slli_epi32(M, sh)) : I[u];
        sm[u] = sh ? z : M;
    }
}

/* acc[0 / 1] (rows 0..7 / 8..15, double) + the super-block's term, the one-row dots' double
 * operations lane by lane: with mins (d_w d_a) sumi - (dmin_w d_a) summ (mf_q_kterm), else
 * (d_w d_a) sumi (mf_q_kterm1). */
MF_ALWAYS_INLINE void mf_q_kq16_term(int dt, const mf_q_kq16 *D, float da, __m512i si, __m512i sm,
                                     __m512d acc[2])
{
    const __m512d dav = _mm512_set1_pd((double)da);
    for (int h = 0; h < 2; h++) {
        const __m256i sih = h ? _mm512_extracti64x4_epi64(si, 1) : _mm512_castsi512_si256(si);
        __m512d t = _mm512_mul_pd(_mm512_mul_pd(D->d[h], dav), _mm512_cvtepi32_pd(sih));
        if (!mf_q_kq16_offset_shift(dt)) {
            const __m256i smh = h ? _mm512_extracti64x4_epi64(sm, 1) : _mm512_castsi512_si256(sm);
            t = _mm512_sub_pd(t, _mm512_mul_pd(_mm512_mul_pd(D->dm[h], dav), _mm512_cvtepi32_pd(smh)));
        }
        acc[h] = _mm512_add_pd(acc[h], t);
    }
}


/* nt (any, <= MF_Q8_TILE_TOKENS) tokens of Q8_K rows at xq (stride xs) against the 16 rows
 * vw[0..15] of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS: out[(r / 4) * os + 4 * t + r % 4].  Each (row, token)'s
 * integer sums are its one-row dot's, and its double steps the same operations in the same
 * order: the same bits, whichever tokens and rows share the call. */
MF_ALWAYS_INLINE void mf_q8_tile16_kq(int dt, const void *const *vw, const char *xq,
                                      ptrdiff_t xs, int nt, ptrdiff_t n, float *out,
                                      ptrdiff_t os)
{
    mf_q_kq16 D[MF_Q8_TILE16_NS];
    MF_ALIGNED(64) double acc[MF_Q8_TILE_TOKENS][16];
    const ptrdiff_t bsz = (ptrdiff_t)ck_dtype_block_bytes((CKDataType)dt), nsb = n / QK_K;
    const char *p[16];
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    for (ptrdiff_t s0 = 0; s0 < nsb; s0 += MF_Q8_TILE16_NS) {
        const int ns = (int)(nsb - s0 < MF_Q8_TILE16_NS ? nsb - s0 : MF_Q8_TILE16_NS);
        for (int s = 0; s < ns; s++) {
            for (int r = 0; r < 16; r++)
                p[r] = (const char *)vw[r] + (s0 + s) * bsz;
            mf_q_kq16_decode(dt, p, &D[s]);
        }
        for (int t = 0; t < nt; t += MF_Q8_TILE16_TB) {
            const int nb = nt - t < MF_Q8_TILE16_TB ? nt - t : MF_Q8_TILE16_TB;
            for (int s = 0; s < ns; s++) {
                const block_q8_K *a[MF_Q8_TILE16_TB];
                __m512i si[MF_Q8_TILE16_TB], sm[MF_Q8_TILE16_TB];
                for (int u = 0; u < MF_Q8_TILE16_TB; u++)
                    a[u] = (const block_q8_K *)(const void *)(xq + (t + (u < nb ? u : 0)) * xs) + s0 + s;
                if (nb == MF_Q8_TILE16_TB)
                    mf_q_kq16_sums(dt, &D[s], a, MF_Q8_TILE16_TB, si, sm);
                else
                    for (int u = 0; u < nb; u++)
                        mf_q_kq16_sums(dt, &D[s], a + u, 1, si + u, sm + u);
                for (int u = 0; u < nb; u++) {
                    __m512d A[2] = {_mm512_load_pd(acc[t + u]), _mm512_load_pd(acc[t + u] + 8)};
                    mf_q_kq16_term(dt, &D[s], a[u]->d, si[u], sm[u], A);
                    _mm512_store_pd(acc[t + u], A[0]);
                    _mm512_store_pd(acc[t + u] + 8, A[1]);
                }
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 16; r++)
            out[(r / 4) * os + 4 * t + r % 4] = (float)acc[t][r];
}

/* ---- many tokens, avx512 with VNNI: 16 rows of a 32-weight format in the lanes ------------- */

/* mf_q8_tile16_b32: the layout of mf_q8_tile16_kq for the 32-weight formats (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, IQ4_NL) against Q8_0 activation rows.  A decoded block of the 16 rows is 8
 * registers, q[i] lane r = the unsigned codes u of weights 4i .. 4i + 3 of row r, so vpdpbusd
 * against 4 activation codes broadcast sums the block's 32 products in each row's lane:
 *     I = sum (u - o) a = sum u a - o sum a,
 * o the codes' offset (Q4_0 8, Q5_0 16, Q8_0 and IQ4_NL 128: their signed values + 128; Q4_1,
 * Q5_1 0: the codes themselves), the lane starting from -o sum a (sum a = s_a / d_a exactly: the
 * activation row's s is d times its code sum, exact in float).  |I| < 2^20, exact in int32 and
 * as float.  Then each (row, token) runs mf_q_acc_group's float steps on its own chains A_k
 * (k: the block's position in its group of 4): A_k = fma(float(I), d_w * d_a, A_k) (Q4_1 / Q5_1
 * then A_k = fma(m_w, s_a, A_k)), and the result is (A0 + A2) + (A1 + A3): the bits of the
 * one-row dot.  Blocks past the row's end are left out, where the one-row dot adds +0 terms
 * (A_k is never -0): the same bits. */
#define MF_Q8_B32_CHUNK 16       /* blocks of the 16 rows decoded at once (8 KiB of codes) */
#ifndef MF_Q8_B32_TB
#  define MF_Q8_B32_TB 4         /* tokens that share each load of a code register */
#endif

MF_ALWAYS_INLINE int mf_q8_tile16_b32_takes(int dt)
{
    return dt == CK_DT_Q4_0 || dt == CK_DT_Q4_1 || dt == CK_DT_Q5_0 || dt == CK_DT_Q5_1
        || dt == CK_DT_Q8_0 || dt == CK_DT_IQ4_NL;
}

typedef struct {
    __m512i q[MF_Q8_B32_CHUNK][8];
    __m512 dw[MF_Q8_B32_CHUNK], mw[MF_Q8_B32_CHUNK];
} mf_q_b32x16;

/* The tile's code offset: mf_q_off's (Q4_0, Q5_0), 128 for the signed formats (Q8_0, IQ4_NL) */
MF_ALWAYS_INLINE int mf_q_b32_offset(int dt)
{
    return mf_q_kind(dt) == 2 ? 128 : mf_q_off(dt);
}

/* out[k] = [dword k of p[0] + o | ... | dword k of p[15] + o], k < 4: the rows' 16 bytes at o
 * transposed in 4-byte steps (X[j] = rows j, j + 4, j + 8, j + 12 in its 128-bit lanes, then a
 * 4 x 4 transpose in each lane). */
MF_ALWAYS_INLINE void mf_q_t16x4(const char *const p[16], ptrdiff_t o, __m512i out[4])
{
    __m512i X[4];
    for (int j = 0; j < 4; j++) {
        __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(p[j] + o)));
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(const void *)(p[j + 4] + o)), 1);
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(const void *)(p[j + 8] + o)), 2);
        X[j] = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(const void *)(p[j + 12] + o)), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(X[0], X[1]), t1 = _mm512_unpackhi_epi32(X[0], X[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(X[2], X[3]), t3 = _mm512_unpackhi_epi32(X[2], X[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* Block b of the 16 rows p[r] (each at its block) into D's slot b. */
MF_ALWAYS_INLINE void mf_q_b32x16_decode(int dt, const char *const p[16], mf_q_b32x16 *D, int b)
{
    __m512i *q = D->q[b];
    D->dw[b] = mf_q_f16x16(p, 0);                  /* every 32-weight block starts with its d */
    D->mw[b] = (dt == CK_DT_Q4_1 || dt == CK_DT_Q5_1) ? mf_q_f16x16(p, 2) : _mm512_setzero_ps();
    if (dt == CK_DT_Q8_0) {
        mf_q_t16x8(p, MF_Q_QS_Q8_0, q);
        for (int i = 0; i < 8; i++)
            q[i] = _mm512_xor_si512(q[i], _mm512_set1_epi8((char)0x80));
        return;
    }
    const ptrdiff_t qs = dt == CK_DT_Q4_0 ? MF_Q_QS_Q4_0 : dt == CK_DT_Q4_1 ? MF_Q_QS_Q4_1
                       : dt == CK_DT_Q5_0 ? MF_Q_QS_Q5_0 : dt == CK_DT_Q5_1 ? MF_Q_QS_Q5_1
                       : MF_Q_QS_IQ4_NL;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i X[4];
    mf_q_t16x4(p, qs, X);                 /* byte j of qs: weight j (low nibble), j + 16 (high) */
    for (int k = 0; k < 4; k++) {
        q[k] = _mm512_and_si512(X[k], m4);
        q[4 + k] = _mm512_and_si512(_mm512_srli_epi16(X[k], 4), m4);
    }
    if (dt == CK_DT_Q5_0 || dt == CK_DT_Q5_1) {
        /* bit w of qh: the 5th bit of weight w; lane r's byte j of q[i] is weight 4i + j, whose
         * bit sits in byte i / 2 of qh (mask 1 << (4 (i % 2) + j)) */
        const ptrdiff_t qh = dt == CK_DT_Q5_0 ? MF_Q_QH_Q5_0 : MF_Q_QH_Q5_1;
        MF_ALIGNED(64) uint32_t h[16];
        for (int r = 0; r < 16; r++)
            memcpy(&h[r], p[r] + qh, 4);
        const __m512i H = _mm512_load_si512((const void *)h), x10 = _mm512_set1_epi8(0x10);
        for (int i = 0; i < 8; i++) {
            const char c = (char)(i / 2);
            const __m512i rep = _mm512_shuffle_epi8(H, _mm512_broadcast_i32x4(_mm_setr_epi8(
                c, c, c, c, c + 4, c + 4, c + 4, c + 4, c + 8, c + 8, c + 8, c + 8,
                c + 12, c + 12, c + 12, c + 12)));
            const int s = 4 * (i % 2);
            const __mmask64 m = _mm512_test_epi8_mask(rep, _mm512_set1_epi32(
                (int)(0x01u << s | 0x02u << (s + 8) | 0x04u << (s + 16) | 0x08u << (s + 24))));
            q[i] = _mm512_mask_add_epi8(q[i], m, q[i], x10);
        }
    }
    if (dt == CK_DT_IQ4_NL) {             /* the table's values + 128 (1 .. 241) */
        const __m512i kv = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(
            (const __m128i *)(const void *)mf_kvalues_iq4nl)), _mm512_set1_epi8((char)0x80));
        for (int i = 0; i < 8; i++)
            q[i] = _mm512_shuffle_epi8(kv, q[i]);
    }
}

/* cs[b] = -o * (the code sum of block b0 + b) of one activation row, b < nb (<= 16) blocks from
 * block b0 (a multiple of 4): s / d of the row's floats (exact), 0 where d = 0 (codes 0). */
MF_ALWAYS_INLINE void mf_q_b32_offsets(const char *a, ptrdiff_t n, ptrdiff_t b0, int nb, int o,
                                       int32_t *cs)
{
    /* [d, s] of block 4g + k at floats 8g + 2 slot(k) (mf_act_q8_0_f_slot): k -> 0, 4, 2, 6 */
    const __m512i di = _mm512_setr_epi32(0, 4, 2, 6, 8, 12, 10, 14, 16, 20, 18, 22, 24, 28, 26, 30);
    const float *f = mf_act_q8_0_f(a, (size_t)n, (size_t)(b0 / 4));
    const int nf = 2 * ((nb + 3) & ~3);            /* the floats of the chunk's groups */
    const __m512 f0 = _mm512_maskz_loadu_ps((__mmask16)(nf >= 16 ? 0xFFFF : (1u << nf) - 1), f);
    const __m512 f1 = _mm512_maskz_loadu_ps((__mmask16)(nf > 16 ? (1u << (nf - 16)) - 1 : 0), f + 16);
    const __m512 d = _mm512_permutex2var_ps(f0, di, f1);
    const __m512 s = _mm512_permutex2var_ps(f0, _mm512_add_epi32(di, _mm512_set1_epi32(1)), f1);
    const __m512i sum = _mm512_cvtps_epi32(_mm512_maskz_div_ps(
        _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ), s, d));
    _mm512_storeu_si512((void *)cs, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-o)));
}

/* The address of activation codes 4i .. 4i + 3 of block b of a row (mf_act_layout.h). */
MF_ALWAYS_INLINE const int8_t *mf_q_b32_codes(const char *a, ptrdiff_t b, int i)
{
    return mf_act_q8_0_codes(a, (size_t)(b / 4)) + 64 * ((b % 4) / 2) + 16 * (b % 2)
           + (i < 4 ? 4 * i : 32 + 4 * (i - 4));
}

/* A chunk of the 16-row tile of a 32-weight format: blocks b0 .. b0 + ncb - 1 of the rows vw
 * decoded into D, and (where the format has a code offset o) each of the nt tokens' offset terms
 * into cs[t] (mf_q_b32_offsets). */
MF_ALWAYS_INLINE void mf_q_b32x16_chunk(int dt, const void *const *vw, ptrdiff_t b0, int ncb,
                                        const char *xq, ptrdiff_t xs, int nt, ptrdiff_t n,
                                        mf_q_b32x16 *D, int32_t (*cs)[MF_Q8_B32_CHUNK])
{
    const ptrdiff_t bsz = mf_q_bsz(dt);
    const int o = mf_q_b32_offset(dt);
    const char *p[16];
    for (int b = 0; b < ncb; b++) {
        for (int r = 0; r < 16; r++)
            p[r] = (const char *)vw[r] + (b0 + b) * bsz;
        mf_q_b32x16_decode(dt, p, D, b);
    }
    if (o)
        for (int t = 0; t < nt; t++)
            mf_q_b32_offsets(xq + t * xs, n, b0, ncb, o, cs[t]);
}

/* The 32-weight tile's results: each token's chains added (A0 + A2) + (A1 + A3), row j to
 * out[(j / 4) * os + 4 * t + j % 4]. */
MF_ALWAYS_INLINE void mf_q_b32x16_out(const float (*acc)[4][16], int nt, float *out, ptrdiff_t os)
{
    for (int t = 0; t < nt; t++) {
        const __m512 r = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(acc[t][0]), _mm512_load_ps(acc[t][2])),
                                       _mm512_add_ps(_mm512_load_ps(acc[t][1]), _mm512_load_ps(acc[t][3])));
        MF_ALIGNED(64) float v[16];
        _mm512_store_ps(v, r);
        for (int j = 0; j < 16; j++)
            out[(j / 4) * os + 4 * t + j % 4] = v[j];
    }
}

/* nt (<= MF_Q8_TILE_TOKENS) tokens of Q8_0 activation rows at xq (stride xs) against the 16
 * rows vw[0..15] of a 32-weight format: out[(r / 4) * os + 4 * t + r % 4], each the bits of the
 * row's one-row dot.  MF_Q8_B32_TB tokens share each load of a code register; a token's 4
 * chains of the 16 rows stay in registers over a chunk and in acc between chunks. */
MF_ALWAYS_INLINE void mf_q8_tile16_b32(int dt, const void *const *vw, const char *xq,
                                       ptrdiff_t xs, int nt, ptrdiff_t n, float *out,
                                       ptrdiff_t os)
{
    enum { TB = MF_Q8_B32_TB, NC = MF_Q8_B32_CHUNK };
    mf_q_b32x16 D;
    /* by token, rows nt .. nt + TB - 1 the last group's spare tokens (computed, never read):
     * the chains A_k of the 16 rows, and the chunk's offset terms (mf_q_b32_offsets) */
    MF_ALIGNED(64) float acc[MF_Q8_TILE_TOKENS + TB][4][16];
    MF_ALIGNED(64) int32_t cs[MF_Q8_TILE_TOKENS + TB][NC];
    const ptrdiff_t nb = n / QK8_0;
    const int o = mf_q_b32_offset(dt), asym = dt == CK_DT_Q4_1 || dt == CK_DT_Q5_1;
    /* spare tokens' rows too: no stack garbage (denormals) in what they compute */
    memset(acc, 0, (size_t)(nt + TB) * sizeof acc[0]);
    memset(cs[nt], 0, TB * sizeof cs[0]);
    for (ptrdiff_t b0 = 0; b0 < nb; b0 += NC) {
        const int ncb = (int)(nb - b0 < NC ? nb - b0 : NC);
        mf_q_b32x16_chunk(dt, vw, b0, ncb, xq, xs, nt, n, &D, cs);
        for (int t = 0; t < nt; t += TB) {
            const int nu = nt - t < TB ? nt - t : TB;
            const char *a[TB];                   /* spare tokens read the group's first one */
            for (int u = 0; u < TB; u++)
                a[u] = xq + (t + (u < nu ? u : 0)) * xs;
            float (*const A)[4][16] = acc + t;   /* token u's chains A[u][k], in registers */
            const int32_t (*const C)[NC] = cs + t;
            __m512 c[TB][4];
            for (int u = 0; u < TB; u++)
                for (int k = 0; k < 4; k++)
                    c[u][k] = _mm512_load_ps(A[u][k]);
            for (int b4 = 0; b4 < ncb; b4 += 4)
                MF_Q_UNROLL4
                for (int k = 0; k < 4; k++) {   /* k: the block's place in its group */
                    const int b = b4 + k;
                    if (b >= ncb)
                        break;
                    const ptrdiff_t gb = b0 + b;
                    const size_t slot = mf_act_q8_0_f_slot((size_t)k);
                    /* the block's integer sum of each token in two chains (even, odd steps),
                     * 4 vpdpbusd deep each, then added: the same int32 */
                    __m512i I[TB], J[TB];
                    for (int u = 0; u < TB; u++) {
                        I[u] = o ? _mm512_set1_epi32(C[u][b]) : _mm512_setzero_si512();
                        J[u] = _mm512_setzero_si512();
                    }
                    MF_Q_UNROLL4
                    for (int i = 0; i < 8; i += 2) {
                        const __m512i qv = D.q[b][i], qw = D.q[b][i + 1];
                        for (int u = 0; u < TB; u++) {
                            I[u] = _mm512_dpbusd_epi32(I[u], qv, mf_q_bc4(mf_q_b32_codes(a[u], gb, i)));
                            J[u] = _mm512_dpbusd_epi32(J[u], qw, mf_q_bc4(mf_q_b32_codes(a[u], gb, i + 1)));
                        }
                    }
                    for (int u = 0; u < TB; u++)
                        I[u] = _mm512_add_epi32(I[u], J[u]);
                    for (int u = 0; u < TB; u++) {
                        const float *f = mf_act_q8_0_f(a[u], (size_t)n, (size_t)(gb / 4)) + slot;
                        const __m512 dd = _mm512_mul_ps(D.dw[b], _mm512_set1_ps(f[0]));
                        c[u][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[u]), dd, c[u][k]);
                        if (asym)
                            c[u][k] = _mm512_fmadd_ps(D.mw[b], _mm512_set1_ps(f[1]), c[u][k]);
                    }
                }
            for (int u = 0; u < TB; u++)
                for (int k = 0; k < 4; k++)
                    _mm512_store_ps(A[u][k], c[u][k]);
        }
    }
    mf_q_b32x16_out((const float (*)[4][16])acc, nt, out, os);
}

#include "mf_amx_tiles.h"

/* The 16-row tiles, each format's body compiled on its own (its steps, offsets and branches
 * constants): mf_q8_tile16_kq for the formats of Q8_K activations, mf_q8_tile16_b32 for the
 * 32-weight ones -- at the amx level their AMX forms (mf_amx_tiles.h), the same bits.  Other
 * formats are not theirs (mf_q8_tile16_takes). */
#if defined(MF_Q_AMX)
#  define mf_q8_tile16_kq_level mf_q8_tile16_kq_amx
#  define mf_q8_tile16_b32_level mf_q8_tile16_b32_amx
#else
#  define mf_q8_tile16_kq_level mf_q8_tile16_kq
#  define mf_q8_tile16_b32_level mf_q8_tile16_b32
#endif
#define MF_Q8_TILE16_CASE(BODY, DT) \
    case DT: BODY(DT, vw, xq, xs, nt, n, out, os); break;
static inline void mf_q8_tile16(int dt, const void *const *vw, const char *xq, ptrdiff_t xs,
                                int nt, ptrdiff_t n, float *out, ptrdiff_t os)
{
    switch (dt) {
    MF_Q8_TILE16_CASE(mf_q8_tile16_kq_level, CK_DT_Q2_K)
    MF_Q8_TILE16_CASE(mf_q8_tile16_kq_level, CK_DT_Q3_K)
    MF_Q8_TILE16_CASE(mf_q8_tile16_kq_level, CK_DT_Q4_K)
    MF_Q8_TILE16_CASE(mf_q8_tile16_kq_level, CK_DT_Q5_K)
    MF_Q8_TILE16_CASE(mf_q8_tile16_kq_level, CK_DT_Q6_K)
    MF_Q8_TILE16_CASE(mf_q8_tile16_kq_level, CK_DT_IQ4_XS)
    MF_Q8_TILE16_CASE(mf_q8_tile16_b32_level, CK_DT_Q4_0)
    MF_Q8_TILE16_CASE(mf_q8_tile16_b32_level, CK_DT_Q4_1)
    MF_Q8_TILE16_CASE(mf_q8_tile16_b32_level, CK_DT_Q5_0)
    MF_Q8_TILE16_CASE(mf_q8_tile16_b32_level, CK_DT_Q5_1)
    MF_Q8_TILE16_CASE(mf_q8_tile16_b32_level, CK_DT_Q8_0)
    MF_Q8_TILE16_CASE(mf_q8_tile16_b32_level, CK_DT_IQ4_NL)
    default: break;
    }
}
#undef MF_Q8_TILE16_CASE
#undef mf_q8_tile16_kq_level
#undef mf_q8_tile16_b32_level
#endif

/* The 16-row tiles take every block format at the avx512 level with VNNI: the formats of Q8_K
 * activations (mf_q8_tile16_kq) and the 32-weight ones (mf_q8_tile16_b32). */
static inline int mf_q8_tile16_takes(int dt)
{
#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
    return dt == CK_DT_Q4_K || dt == CK_DT_Q5_K || dt == CK_DT_Q6_K || dt == CK_DT_Q2_K
        || dt == CK_DT_Q3_K || dt == CK_DT_IQ4_XS || mf_q8_tile16_b32_takes(dt);
#else
    (void)dt;
    return 0;
#endif
}

/* Tokens a caller hands mf_q8_rows16_tokens at once: mf_q8_tile_tokens, but for the formats of
 * the 16-row tile up to 4 times the activation bytes -- their rows are read once every 16 weight
 * rows, not 4, so as often per weight row -- which amortizes each decoded chunk of 16 rows over
 * more tokens. */
static inline int mf_q8_rows16_tile_tokens(int dt, size_t row_bytes)
{
    return mf_q8_tile_tokens(mf_q8_tile16_takes(dt) ? row_bytes / 4 : row_bytes);
}

/* 16 rows (w[0..nr-1], nr <= 16) against nt tokens: out[g * os + 4 * t + r] = the int8 dot of
 * row w[4g + r] with activation row a + t * a_stride, as mf_q8_rows_tokens gives it for 4-row
 * group g (the same bits).  At the avx512 level with VNNI, past a few tokens the 16 rows run at
 * once: mf_q8_tile16_kq for the formats of Q8_K activations (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * IQ4_XS), mf_q8_tile16_b32 for the 32-weight ones; the rest goes 4 rows at a time. */
static inline void mf_q8_rows16_tokens(int dt, const void *const *w, int nr, const void *va,
                                       ptrdiff_t a_stride, int nt, ptrdiff_t n, float *out,
                                       ptrdiff_t os)
{
#if defined(MF_SIMD_AVX512) && defined(MF_Q_VNNI)
    if (mf_q8_tile16_takes(dt) && nt > MF_Q8_FEW_TOKENS) {
        const void *wp[16];
        for (int r = 0; r < 16; r++)
            wp[r] = w[r < nr ? r : nr - 1];   /* missing rows: the last one again (discarded) */
        mf_q8_tile16(dt, wp, (const char *)va, a_stride, nt, n, out, os);
        return;
    }
#endif
    for (int g = 0; 4 * g < nr; g++)
        mf_q8_rows_tokens(dt, w + 4 * g, nr - 4 * g < 4 ? nr - 4 * g : 4, va, a_stride, nt, n,
                          out + g * os);
}

#endif /* MEGAFUSE_MF_Q8_TILES_H */
