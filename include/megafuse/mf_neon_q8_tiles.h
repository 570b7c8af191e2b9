/*
 * mf_neon_q8_tiles.h -- the int8 projections of mf_q8_tiles.h on AArch64 Advanced SIMD (the
 * neon, neon_dotprod and i8mm levels): up to 4 weight rows against any number of quantized
 * activation rows, each (row, token) pair giving exactly the bits of its one-row dot
 * (mf_neon_dot_q8.h's sequence for the 32-weight formats, mf_dot_q8.h's for the K-quants and
 * IQ4_XS).
 *
 *  - one token (decode, mf_neon_dot4_*): the four rows stream side by side past the activation
 *    row, loaded once for the four, the rows ahead prefetched;
 *  - two or more tokens (prefill, mf_neon_tile_*): a chunk of the four rows (MF_Q8_CHUNK weights
 *    each) is decoded once into a stack buffer -- int8 codes and float scales -- and every token
 *    runs against it.  The integer sums come from sdot (neon_dotprod), vmull + vpadal (neon) or,
 *    at the i8mm level, smmla: one instruction multiplies 8 codes of two rows by 8 codes of two
 *    tokens into the four sums of the 2 x 2 block, so a chunk's rows are kept interleaved in
 *    pairs ([row r | row r + 1], 8 codes each) and a pair of tokens is interleaved the same way
 *    as it is loaded.  The sums are the same exact integers whichever instruction forms them, so
 *    the tiles give the one-token dots' bits at every NEON level.
 *
 * Included by mf_q8_tiles.h only.
 */
#ifndef MEGAFUSE_MF_NEON_Q8_TILES_H
#define MEGAFUSE_MF_NEON_Q8_TILES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <arm_neon.h>

#if defined(__ARM_FEATURE_MATMUL_INT8)
#  define MF_NEON_I8MM 1
#endif

/* ---- one token: 4 rows ------------------------------------------------------------------------ */

/* Rows vw[0..3] of a 32-weight format dt against one Q8_0 activation row: each row's
 * mf_neon_dot_row_q8_0 sequence, the activation group loaded once for the four. */
MF_ALWAYS_INLINE void mf_neon_dot4_row32(int dt, const void *const *vw, const void *va,
                                         ptrdiff_t n, float *out)
{
    const char *w[4] = {(const char *)vw[0], (const char *)vw[1], (const char *)vw[2],
                        (const char *)vw[3]};                       /* [n / 32] blocks each */
    const ptrdiff_t nb = n / QK8_0, gb = 4 * mf_neon_bsz(dt), rb = nb * mf_neon_bsz(dt);
    const ptrdiff_t pf = mf_q_pf_dist(rb);
    const int asym = mf_neon_asym(dt);
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),
                          vdupq_n_f32(0.0f)};
    ptrdiff_t g = 0;
    for (; g < nb / 4; g++) {
        mf_neon_agrp A;
        mf_q_prefetch4(w[0], rb, g * gb, gb, pf);
        mf_neon_agrp_load(va, n, g, &A);
        for (int r = 0; r < 4; r++) {
            mf_neon_wgrp W;
            mf_neon_wgrp_dec(dt, w[r] + g * gb, 4, &W);
            acc[r] = mf_neon_grp_step(asym, &W, &A, acc[r]);
        }
    }
    if (g * 4 < nb) {
        mf_neon_agrp A;
        mf_neon_agrp_load(va, n, g, &A);
        for (int r = 0; r < 4; r++) {
            mf_neon_wgrp W;
            mf_neon_wgrp_dec(dt, w[r] + g * gb, (int)(nb - 4 * g), &W);
            acc[r] = mf_neon_grp_step(asym, &W, &A, acc[r]);
        }
    }
    for (int r = 0; r < 4; r++)
        out[r] = vaddvq_f32(acc[r]);
}

#define MF_NEON_DOT4_ROW32(NAME, DT)                                                           \
static inline void NAME(const void *const *vw, const void *va, ptrdiff_t n, float *out)       \
{                                                                                              \
    mf_neon_dot4_row32(DT, vw, va, n, out);                                                    \
}
MF_NEON_DOT4_ROW32(mf_neon_dot4_q4_0_q8_0, CK_DT_Q4_0)
MF_NEON_DOT4_ROW32(mf_neon_dot4_q4_1_q8_0, CK_DT_Q4_1)
MF_NEON_DOT4_ROW32(mf_neon_dot4_q5_0_q8_0, CK_DT_Q5_0)
MF_NEON_DOT4_ROW32(mf_neon_dot4_q5_1_q8_0, CK_DT_Q5_1)
MF_NEON_DOT4_ROW32(mf_neon_dot4_q8_0_q8_0, CK_DT_Q8_0)
MF_NEON_DOT4_ROW32(mf_neon_dot4_iq4_nl_q8_0, CK_DT_IQ4_NL)
#undef MF_NEON_DOT4_ROW32

/* K-quants and IQ4_XS: acc + a super-block's term of one row, as its one-row dot adds it. */
MF_ALWAYS_INLINE double mf_neon_q4_K_step(double acc, const block_q4_K *b, const block_q8_K *ab)
{
    int32_t sumi, summ;
    mf_q_k45_sums(b->scales, b->qs, NULL, ab, &sumi, &summ);
    return acc + mf_q_kterm(b->d, b->dmin, ab->d, sumi, summ);
}

MF_ALWAYS_INLINE double mf_neon_q5_K_step(double acc, const block_q5_K *b, const block_q8_K *ab)
{
    int32_t sumi, summ;
    mf_q_k45_sums(b->scales, b->qs, b->qh, ab, &sumi, &summ);
    return acc + mf_q_kterm(b->d, b->dmin, ab->d, sumi, summ);
}

/* Q6_K: sum_j sc_j bsum_j (the offset 32's term) and mf_neon_sumi_q6_K, as mf_dot_q6_K_q8_K. */
MF_ALWAYS_INLINE double mf_neon_q6_K_step(double acc, const block_q6_K *b, const block_q8_K *ab)
{
    int32_t sumo = 0;
    for (int j = 0; j < 16; j++)
        sumo += b->scales[j] * ab->bsums[j];
    const int32_t sumi = mf_neon_sumi_q6_K(b, ab->qs);
    const double dd = (double)mf_q_fp16(b->d) * (double)ab->d;          /* exact */
    return acc + mf_mul_nc_d(dd, (double)(sumi - 32 * sumo));
}

MF_ALWAYS_INLINE double mf_neon_q2_K_step(double acc, const block_q2_K *b, const block_q8_K *ab)
{
    int32_t sumi, summ;
    mf_q_sums_q2_K(b, ab, &sumi, &summ);
    return acc + mf_q_kterm(b->d, b->dmin, ab->d, sumi, summ);
}

MF_ALWAYS_INLINE double mf_neon_q3_K_step(double acc, const block_q3_K *b, const block_q8_K *ab)
{
    return mf_q_kterm1(acc, b->d, ab->d, mf_q_sums_q3_K(b, ab));
}

MF_ALWAYS_INLINE double mf_neon_iq4_xs_step(double acc, const block_iq4_xs *b,
                                            const block_q8_K *ab)
{
    return mf_q_kterm1(acc, b->d, ab->d, mf_q_sums_iq4_xs(b, ab));
}

/* 4 rows x one Q8_K row: super-block by super-block, each row's step into its accumulator. */
#define MF_NEON_DOT4_KX(NAME, BLOCK, STEP)                                                     \
static inline void NAME(const void *const *vw, const void *va, ptrdiff_t n, float *out)       \
{                                                                                              \
    const BLOCK *w[4] = {(const BLOCK *)vw[0], (const BLOCK *)vw[1], (const BLOCK *)vw[2],     \
                         (const BLOCK *)vw[3]};                         /* [n / 256] each */   \
    const block_q8_K *a = (const block_q8_K *)va;                       /* [n / 256] */        \
    const ptrdiff_t nb = n / QK_K, bsz = (ptrdiff_t)sizeof(BLOCK);                             \
    const ptrdiff_t pf = mf_q_pf_dist(nb * bsz);                                               \
    double acc[4] = {0.0, 0.0, 0.0, 0.0};                                                      \
    for (ptrdiff_t ib = 0; ib < nb; ib++) {                                                    \
        mf_q_prefetch4(w[0], nb * bsz, ib * bsz, bsz, pf);                                     \
        for (int r = 0; r < 4; r++)                                                            \
            acc[r] = STEP(acc[r], &w[r][ib], &a[ib]);                                          \
    }                                                                                          \
    for (int r = 0; r < 4; r++)                                                                \
        out[r] = (float)acc[r];                                                                \
}
MF_NEON_DOT4_KX(mf_neon_dot4_q4_K_q8_K, block_q4_K, mf_neon_q4_K_step)
MF_NEON_DOT4_KX(mf_neon_dot4_q5_K_q8_K, block_q5_K, mf_neon_q5_K_step)
MF_NEON_DOT4_KX(mf_neon_dot4_q6_K_q8_K, block_q6_K, mf_neon_q6_K_step)
MF_NEON_DOT4_KX(mf_neon_dot4_q2_K_q8_K, block_q2_K, mf_neon_q2_K_step)
MF_NEON_DOT4_KX(mf_neon_dot4_q3_K_q8_K, block_q3_K, mf_neon_q3_K_step)
MF_NEON_DOT4_KX(mf_neon_dot4_iq4_xs_q8_K, block_iq4_xs, mf_neon_iq4_xs_step)
#undef MF_NEON_DOT4_KX

/* ---- many tokens: 32-weight formats ------------------------------------------------------------ */

enum { MF_NEON_CG = MF_Q8_CHUNK / MF_ACT_GROUP_CODE_BYTES };     /* groups a chunk (8) */

#if defined(MF_NEON_I8MM)
/* Two rows' decoded group, interleaved for smmla: c[k][j] = [row a | row b] of the 8 codes
 * 8j .. 8j + 7 of block k; dw / mw as mf_neon_wgrp's, one a row. */
typedef struct {
    int8x16_t c[4][4];
    float32x4_t dw[2], mw[2];
} mf_neon_wgrp2;

MF_ALWAYS_INLINE void mf_neon_wgrp2_make(const mf_neon_wgrp *Wa, const mf_neon_wgrp *Wb,
                                         mf_neon_wgrp2 *W2)
{
    for (int k = 0; k < 4; k++) {
        const int64x2_t la = vreinterpretq_s64_s8(Wa->lo[k]), lb = vreinterpretq_s64_s8(Wb->lo[k]);
        const int64x2_t ha = vreinterpretq_s64_s8(Wa->hi[k]), hb = vreinterpretq_s64_s8(Wb->hi[k]);
        W2->c[k][0] = vreinterpretq_s8_s64(vzip1q_s64(la, lb));
        W2->c[k][1] = vreinterpretq_s8_s64(vzip2q_s64(la, lb));
        W2->c[k][2] = vreinterpretq_s8_s64(vzip1q_s64(ha, hb));
        W2->c[k][3] = vreinterpretq_s8_s64(vzip2q_s64(ha, hb));
    }
    W2->dw[0] = Wa->dw;
    W2->dw[1] = Wb->dw;
    W2->mw[0] = Wa->mw;
    W2->mw[1] = Wb->mw;
}

/* Two tokens' group interleaved the same way: t[k][j] = [token a | token b] codes 8j .. 8j + 7
 * of block k. */
MF_ALWAYS_INLINE void mf_neon_agrp2_make(const mf_neon_agrp *Aa, const mf_neon_agrp *Ab,
                                         int8x16_t t[4][4])
{
    for (int k = 0; k < 4; k++) {
        const int64x2_t la = vreinterpretq_s64_s8(Aa->lo[k]), lb = vreinterpretq_s64_s8(Ab->lo[k]);
        const int64x2_t ha = vreinterpretq_s64_s8(Aa->hi[k]), hb = vreinterpretq_s64_s8(Ab->hi[k]);
        t[k][0] = vreinterpretq_s8_s64(vzip1q_s64(la, lb));
        t[k][1] = vreinterpretq_s8_s64(vzip2q_s64(la, lb));
        t[k][2] = vreinterpretq_s8_s64(vzip1q_s64(ha, hb));
        t[k][3] = vreinterpretq_s8_s64(vzip2q_s64(ha, hb));
    }
}

/* The integer sums of a group of rows (a, b) x tokens (a, b): I[0] = (row a, token a), I[1] =
 * (a, b), I[2] = (b, a), I[3] = (b, b), each in lane order [block 0, 2, 1, 3]. */
MF_ALWAYS_INLINE void mf_neon_mmla_grp(const mf_neon_wgrp2 *W2, int8x16_t t[4][4], int32x4_t I[4])
{
    int32x4_t M[4];
    for (int k = 0; k < 4; k++) {
        int32x4_t m = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++)
            m = vmmlaq_s32(m, W2->c[k][j], t[k][j]);
        M[k] = m;                                      /* [aa, ab, ba, bb] of block k */
    }
    const int32x4_t t0 = vtrn1q_s32(M[0], M[2]), t1 = vtrn2q_s32(M[0], M[2]);
    const int32x4_t t2 = vtrn1q_s32(M[1], M[3]), t3 = vtrn2q_s32(M[1], M[3]);
    I[0] = vreinterpretq_s32_s64(vtrn1q_s64(vreinterpretq_s64_s32(t0), vreinterpretq_s64_s32(t2)));
    I[1] = vreinterpretq_s32_s64(vtrn1q_s64(vreinterpretq_s64_s32(t1), vreinterpretq_s64_s32(t3)));
    I[2] = vreinterpretq_s32_s64(vtrn2q_s64(vreinterpretq_s64_s32(t0), vreinterpretq_s64_s32(t2)));
    I[3] = vreinterpretq_s32_s64(vtrn2q_s64(vreinterpretq_s64_s32(t1), vreinterpretq_s64_s32(t3)));
}
#endif

/* nt (<= MF_Q8_TILE_TOKENS) tokens of Q8_0 activation rows at xq (stride xs) against rows
 * vw[0..3]: a chunk of MF_NEON_CG groups of each row decoded into W, then every token through
 * it, its 4 accumulators kept across chunks. */
static inline void mf_neon_tile_row32(int dt, const void *const *vw, const char *xq,
                                      ptrdiff_t xs, int nt, ptrdiff_t n, float *out)
{
    float32x4_t acc[MF_Q8_TILE_TOKENS][4];                   /* [token][row] */
#if defined(MF_NEON_I8MM)
    mf_neon_wgrp2 W2[MF_NEON_CG][2];                         /* [group][rows 0|1, 2|3] */
#else
    mf_neon_wgrp W[MF_NEON_CG][4];                           /* [group][row] */
#endif
    const ptrdiff_t nb = n / QK8_0, ng = (ptrdiff_t)mf_act_q8_0_groups((size_t)n);
    const ptrdiff_t gb = 4 * mf_neon_bsz(dt);
    const int asym = mf_neon_asym(dt);
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            acc[t][r] = vdupq_n_f32(0.0f);
    for (ptrdiff_t c0 = 0; c0 < ng; c0 += MF_NEON_CG) {
        const int nc = (int)(ng - c0 < MF_NEON_CG ? ng - c0 : MF_NEON_CG);
        for (int c = 0; c < nc; c++) {
            const ptrdiff_t g = c0 + c;
            const int nblk = (int)(nb - 4 * g < 4 ? nb - 4 * g : 4);
#if defined(MF_NEON_I8MM)
            mf_neon_wgrp Wr[4];
            for (int r = 0; r < 4; r++)
                mf_neon_wgrp_dec(dt, (const char *)vw[r] + g * gb, nblk, &Wr[r]);
            mf_neon_wgrp2_make(&Wr[0], &Wr[1], &W2[c][0]);
            mf_neon_wgrp2_make(&Wr[2], &Wr[3], &W2[c][1]);
#else
            for (int r = 0; r < 4; r++)
                mf_neon_wgrp_dec(dt, (const char *)vw[r] + g * gb, nblk, &W[c][r]);
#endif
        }
#if defined(MF_NEON_I8MM)
        for (int t = 0; t < nt; t += 2) {                    /* an odd last token: with itself */
            const int t1 = t + 1 < nt ? t + 1 : t;
            const char *aa = xq + t * xs, *ab = xq + t1 * xs;
            float32x4_t a[2][4];
            for (int r = 0; r < 4; r++) {
                a[0][r] = acc[t][r];
                a[1][r] = acc[t1][r];
            }
            for (int c = 0; c < nc; c++) {
                mf_neon_agrp Aa, Ab;
                int8x16_t tk[4][4];
                mf_neon_agrp_load(aa, n, c0 + c, &Aa);
                mf_neon_agrp_load(ab, n, c0 + c, &Ab);
                mf_neon_agrp2_make(&Aa, &Ab, tk);
                for (int p = 0; p < 2; p++) {                /* rows 2p, 2p + 1 */
                    const mf_neon_wgrp2 *Wp = &W2[c][p];
                    int32x4_t I[4];
                    mf_neon_mmla_grp(Wp, tk, I);
                    a[0][2 * p] = mf_neon_grp_acc(asym, I[0], Wp->dw[0], Wp->mw[0], &Aa, a[0][2 * p]);
                    a[1][2 * p] = mf_neon_grp_acc(asym, I[1], Wp->dw[0], Wp->mw[0], &Ab, a[1][2 * p]);
                    a[0][2 * p + 1] = mf_neon_grp_acc(asym, I[2], Wp->dw[1], Wp->mw[1], &Aa,
                                                      a[0][2 * p + 1]);
                    a[1][2 * p + 1] = mf_neon_grp_acc(asym, I[3], Wp->dw[1], Wp->mw[1], &Ab,
                                                      a[1][2 * p + 1]);
                }
            }
            for (int r = 0; r < 4; r++) {
                acc[t][r] = a[0][r];
                if (t1 != t)
                    acc[t1][r] = a[1][r];
            }
        }
#else
        for (int t = 0; t < nt; t++) {
            const char *a = xq + t * xs;
            float32x4_t a0 = acc[t][0], a1 = acc[t][1], a2 = acc[t][2], a3 = acc[t][3];
            for (int c = 0; c < nc; c++) {
                mf_neon_agrp A;
                mf_neon_agrp_load(a, n, c0 + c, &A);
                a0 = mf_neon_grp_step(asym, &W[c][0], &A, a0);
                a1 = mf_neon_grp_step(asym, &W[c][1], &A, a1);
                a2 = mf_neon_grp_step(asym, &W[c][2], &A, a2);
                a3 = mf_neon_grp_step(asym, &W[c][3], &A, a3);
            }
            acc[t][0] = a0;
            acc[t][1] = a1;
            acc[t][2] = a2;
            acc[t][3] = a3;
        }
#endif
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            out[4 * t + r] = vaddvq_f32(acc[t][r]);
}

/* ---- many tokens: K-quants and IQ4_XS ----------------------------------------------------------- */

enum { MF_NEON_NS = MF_Q8_CHUNK / QK_K };                         /* super-blocks a chunk (4) */

/* A decoded super-block of one row: its 256 codes in weight order (Q4_K / Q5_K 0..31, Q6_K
 * 0..63, Q2_K 0..3, Q3_K its values -4..3, IQ4_XS its values), the scales (8 of 32 weights:
 * Q4_K, Q5_K, IQ4_XS's ls - 32; or 16 of 16: Q6_K, Q2_K, Q3_K's sc - 32) and mins (Q4_K, Q5_K:
 * 8; Q2_K: 16), d and dmin (Q2_K, Q4_K, Q5_K; else d). */
typedef struct {
    int8x16_t q[16];
    int sc[16], m[16];
    mf_fp16_t d, dmin;
} mf_neon_ksb;

/* The formats whose sub-blocks hold 16 weights (one register each), the others 32 (two). */
MF_ALWAYS_INLINE int mf_neon_sub16(int dt)
{
    return dt == CK_DT_Q6_K || dt == CK_DT_Q2_K || dt == CK_DT_Q3_K;
}

MF_ALWAYS_INLINE void mf_neon_ksb_dec(int dt, const void *blk, mf_neon_ksb *S)
{
    if (dt == CK_DT_Q2_K || dt == CK_DT_Q3_K) {
        for (int h = 0; h < 2; h++) {
            int8x16_t q[4][2];
            if (dt == CK_DT_Q2_K)
                mf_neon_codes_q2_K((const block_q2_K *)blk, h, q);
            else
                mf_neon_codes_q3_K((const block_q3_K *)blk, h, q);
            for (int k = 0; k < 4; k++) {
                S->q[8 * h + 2 * k] = q[k][0];
                S->q[8 * h + 2 * k + 1] = q[k][1];
            }
        }
        if (dt == CK_DT_Q2_K) {
            const block_q2_K *b = (const block_q2_K *)blk;
            for (int j = 0; j < 16; j++) {
                S->sc[j] = b->scales[j] & 0x0F;
                S->m[j] = b->scales[j] >> 4;
            }
            S->d = b->d;
            S->dmin = b->dmin;
        } else {
            mf_neon_q3_K_scales((const block_q3_K *)blk, S->sc);
            S->d = ((const block_q3_K *)blk)->d;
            S->dmin = 0;
        }
        return;
    }
    if (dt == CK_DT_IQ4_XS) {
        const block_iq4_xs *b = (const block_iq4_xs *)blk;
        for (int j = 0; j < 8; j++)
            mf_neon_codes_iq4_xs(b, j, &S->q[2 * j], &S->q[2 * j + 1]);
        mf_neon_iq4_xs_scales(b, S->sc);
        S->d = b->d;
        S->dmin = 0;
        return;
    }
    if (dt == CK_DT_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)blk;
        for (int h = 0; h < 2; h++) {
            int8x16_t q[4][2];
            mf_neon_codes_q6_K(b, h, q);
            for (int k = 0; k < 4; k++) {
                S->q[8 * h + 2 * k] = q[k][0];
                S->q[8 * h + 2 * k + 1] = q[k][1];
            }
        }
        for (int j = 0; j < 16; j++)
            S->sc[j] = b->scales[j];
        S->d = b->d;
        S->dmin = 0;
        return;
    }
    const block_q4_K *b4 = (const block_q4_K *)blk;          /* d, dmin, scales: as in Q5_K */
    const uint8_t *qh = dt == CK_DT_Q5_K ? ((const block_q5_K *)blk)->qh : NULL;
    const uint8_t *qs = dt == CK_DT_Q5_K ? ((const block_q5_K *)blk)->qs : b4->qs;
    for (int c = 0; c < 4; c++) {
        int8x16_t s0[2], s1[2];
        mf_neon_codes_k45(qs, qh, c, s0, s1);
        S->q[4 * c] = s0[0];
        S->q[4 * c + 1] = s0[1];
        S->q[4 * c + 2] = s1[0];
        S->q[4 * c + 3] = s1[1];
    }
    mf_q_unpack_sc_m(b4->scales, S->sc, S->m);
    S->d = b4->d;
    S->dmin = b4->dmin;
}

/* The double term of a (row, token) super-block from its exact sums, as the one-row dots (added
 * to the accumulator: Q3_K's and IQ4_XS's mf_q_kterm1). */
MF_ALWAYS_INLINE double mf_neon_kterm(int dt, const mf_neon_ksb *S, const block_q8_K *ab,
                                      int32_t sumi)
{
    if (dt == CK_DT_Q3_K || dt == CK_DT_IQ4_XS) {
        const double dd = (double)mf_q_fp16(S->d) * (double)ab->d;      /* exact */
        return mf_mul_nc_d(dd, (double)sumi);
    }
    if (dt == CK_DT_Q2_K) {
        int32_t summ = 0;
        for (int j = 0; j < 16; j++)
            summ += S->m[j] * ab->bsums[j];
        return mf_q_kterm(S->d, S->dmin, ab->d, sumi, summ);
    }
    if (dt == CK_DT_Q6_K) {
        int32_t sumo = 0;
        for (int j = 0; j < 16; j++)
            sumo += S->sc[j] * ab->bsums[j];
        const double dd = (double)mf_q_fp16(S->d) * (double)ab->d;      /* exact */
        return mf_mul_nc_d(dd, (double)(sumi - 32 * sumo));
    }
    int32_t summ = 0;
    for (int j = 0; j < 8; j++)
        summ += S->m[j] * (ab->bsums[2 * j] + ab->bsums[2 * j + 1]);
    return mf_q_kterm(S->d, S->dmin, ab->d, sumi, summ);
}

/* sumi of a decoded super-block against a token's codes: sub-blocks of 32 (two registers) with
 * the 8 scales, or 16 of 16 (Q6_K, Q2_K, Q3_K) with the 16. */
MF_ALWAYS_INLINE int32_t mf_neon_ksb_sumi(int dt, const mf_neon_ksb *S, const int8_t *aq)
{
    int32x4_t s = vdupq_n_s32(0);
    if (mf_neon_sub16(dt)) {
        for (int j = 0; j < 16; j++)
            s = vmlaq_n_s32(s, mf_neon_dot_s8(vdupq_n_s32(0), S->q[j], vld1q_s8(aq + 16 * j)),
                            S->sc[j]);
    } else {
        for (int j = 0; j < 8; j++)
            s = vmlaq_n_s32(s, mf_neon_dot32_s8(S->q[2 * j], S->q[2 * j + 1],
                                                vld1q_s8(aq + 32 * j), vld1q_s8(aq + 32 * j + 16)),
                            S->sc[j]);
    }
    return vaddvq_s32(s);
}

#if defined(MF_NEON_I8MM)
/* [sumi (row a, token a), (a, b), (b, a), (b, b)] of two decoded super-blocks (rows a, b) and two
 * tokens' codes, by smmla on 8-code pieces: each sub-block's 2 x 2 block of sums times [sc_a,
 * sc_a, sc_b, sc_b]. */
MF_ALWAYS_INLINE int32x4_t mf_neon_ksb_sumi2(int dt, const mf_neon_ksb *Sa, const mf_neon_ksb *Sb,
                                             const int8_t *aa, const int8_t *ab)
{
    int32x4_t s = vdupq_n_s32(0);
    const int nsub = mf_neon_sub16(dt) ? 16 : 8, regs = mf_neon_sub16(dt) ? 1 : 2;
    for (int j = 0; j < nsub; j++) {
        int32x4_t m = vdupq_n_s32(0);
        for (int i = 0; i < regs; i++) {
            const int q = regs * j + i;                      /* register q: codes 16q .. 16q + 15 */
            const int64x2_t wa = vreinterpretq_s64_s8(Sa->q[q]), wb = vreinterpretq_s64_s8(Sb->q[q]);
            const int64x2_t ta = vreinterpretq_s64_s8(vld1q_s8(aa + 16 * q));
            const int64x2_t tb = vreinterpretq_s64_s8(vld1q_s8(ab + 16 * q));
            m = vmmlaq_s32(m, vreinterpretq_s8_s64(vzip1q_s64(wa, wb)),
                           vreinterpretq_s8_s64(vzip1q_s64(ta, tb)));
            m = vmmlaq_s32(m, vreinterpretq_s8_s64(vzip2q_s64(wa, wb)),
                           vreinterpretq_s8_s64(vzip2q_s64(ta, tb)));
        }
        const int32_t scv[4] = {Sa->sc[j], Sa->sc[j], Sb->sc[j], Sb->sc[j]};
        s = vmlaq_s32(s, m, vld1q_s32(scv));
    }
    return s;
}
#endif

/* nt (<= MF_Q8_TILE_TOKENS) tokens of Q8_K rows at xq (stride xs) against the 256-weight rows
 * vw[0..3]: a chunk of MF_NEON_NS super-blocks of each row decoded, then every token. */
static inline void mf_neon_tile_kq(int dt, const void *const *vw, const char *xq, ptrdiff_t xs,
                                   int nt, ptrdiff_t n, float *out)
{
    mf_neon_ksb S[4][MF_NEON_NS];                            /* [row][super-block] */
    double acc[MF_Q8_TILE_TOKENS][4];
    const ptrdiff_t bsz = (ptrdiff_t)ck_dtype_block_bytes((CKDataType)dt);
    const ptrdiff_t nsb = n / QK_K;
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    for (ptrdiff_t s0 = 0; s0 < nsb; s0 += MF_NEON_NS) {
        const int ns = (int)(nsb - s0 < MF_NEON_NS ? nsb - s0 : MF_NEON_NS);
        for (int r = 0; r < 4; r++)
            for (int s = 0; s < ns; s++)
                mf_neon_ksb_dec(dt, (const char *)vw[r] + (s0 + s) * bsz, &S[r][s]);
#if defined(MF_NEON_I8MM)
        for (int t = 0; t < nt; t += 2) {                    /* an odd last token: with itself */
            const int t1 = t + 1 < nt ? t + 1 : t;
            const block_q8_K *aa = (const block_q8_K *)(const void *)(xq + t * xs) + s0;
            const block_q8_K *ab = (const block_q8_K *)(const void *)(xq + t1 * xs) + s0;
            for (int s = 0; s < ns; s++)
                for (int p = 0; p < 2; p++) {
                    const int32x4_t sm = mf_neon_ksb_sumi2(dt, &S[2 * p][s], &S[2 * p + 1][s],
                                                           aa[s].qs, ab[s].qs);
                    acc[t][2 * p] += mf_neon_kterm(dt, &S[2 * p][s], &aa[s], vgetq_lane_s32(sm, 0));
                    acc[t][2 * p + 1] += mf_neon_kterm(dt, &S[2 * p + 1][s], &aa[s],
                                                       vgetq_lane_s32(sm, 2));
                    if (t1 != t) {
                        acc[t1][2 * p] += mf_neon_kterm(dt, &S[2 * p][s], &ab[s],
                                                        vgetq_lane_s32(sm, 1));
                        acc[t1][2 * p + 1] += mf_neon_kterm(dt, &S[2 * p + 1][s], &ab[s],
                                                            vgetq_lane_s32(sm, 3));
                    }
                }
        }
#else
        for (int t = 0; t < nt; t++) {
            const block_q8_K *a = (const block_q8_K *)(const void *)(xq + t * xs) + s0;
            for (int s = 0; s < ns; s++)
                for (int r = 0; r < 4; r++)
                    acc[t][r] += mf_neon_kterm(dt, &S[r][s], &a[s],
                                               mf_neon_ksb_sumi(dt, &S[r][s], a[s].qs));
        }
#endif
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            out[4 * t + r] = (float)acc[t][r];
}

/* ---- the dispatch ------------------------------------------------------------------------------ */

static inline mf_dot4_fn mf_neon_dot4_q8_for(int dt)
{
    switch (dt) {
    case CK_DT_Q4_0: return mf_neon_dot4_q4_0_q8_0;
    case CK_DT_Q4_1: return mf_neon_dot4_q4_1_q8_0;
    case CK_DT_Q5_0: return mf_neon_dot4_q5_0_q8_0;
    case CK_DT_Q5_1: return mf_neon_dot4_q5_1_q8_0;
    case CK_DT_Q8_0: return mf_neon_dot4_q8_0_q8_0;
    case CK_DT_IQ4_NL: return mf_neon_dot4_iq4_nl_q8_0;
    case CK_DT_Q4_K: return mf_neon_dot4_q4_K_q8_K;
    case CK_DT_Q5_K: return mf_neon_dot4_q5_K_q8_K;
    case CK_DT_Q6_K: return mf_neon_dot4_q6_K_q8_K;
    case CK_DT_Q2_K: return mf_neon_dot4_q2_K_q8_K;
    case CK_DT_Q3_K: return mf_neon_dot4_q3_K_q8_K;
    case CK_DT_IQ4_XS: return mf_neon_dot4_iq4_xs_q8_K;
    default: return NULL;
    }
}

/* mf_q8_rows_tokens for the block formats (wp: 4 rows, repeats past nr); 0 for any other dt
 * (the caller goes pair by pair). */
static inline int mf_neon_rows_tokens(int dt, const void *const *wp, const char *a,
                                      ptrdiff_t a_stride, int nt, ptrdiff_t n, float *out)
{
    const mf_dot4_fn one = mf_neon_dot4_q8_for(dt);
    if (one == NULL)
        return 0;
    const int kquant = ck_dtype_block_size((CKDataType)dt) == QK_K;
    if (nt <= MF_Q8_FEW_TOKENS) {                     /* a few tokens: the rows stay in L1 */
        for (int t = 0; t < nt; t++)
            one(wp, a + t * a_stride, n, out + 4 * t);
        return 1;
    }
    for (int t = 0; t < nt; t += MF_Q8_TILE_TOKENS) {
        const int m = nt - t < MF_Q8_TILE_TOKENS ? nt - t : MF_Q8_TILE_TOKENS;
        if (kquant)
            mf_neon_tile_kq(dt, wp, a + t * a_stride, a_stride, m, n, out + 4 * t);
        else
            mf_neon_tile_row32(dt, wp, a + t * a_stride, a_stride, m, n, out + 4 * t);
    }
    return 1;
}

#endif /* MEGAFUSE_MF_NEON_Q8_TILES_H */
