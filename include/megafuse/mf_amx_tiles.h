/*
 * mf_amx_tiles.h -- the 16-row prefill tiles of the amx level: mf_q8_tile16_b32 and
 * mf_q8_tile16_kq (mf_q8_tiles.h) with their integer sums taken by AMX-INT8 tile products
 * (tdpbsud: signed activation codes x unsigned weight codes, int32 sums) instead of vpdpbusd.
 *
 * The decoded weights are the avx512 tiles' own: a register q[i] of the 16 rows holds weights
 * 4i .. 4i + 3 of row r in its dword r, which is AMX's B layout (K / 4 rows of N = 16 columns of
 * 4 bytes).  So a block's (or a sub-block's) steps, stored side by side, are a B tile, and the
 * activation codes of 16 tokens (stride: the activation row's) are an A tile: C[t][r] = the
 * block's integer sum of token t and row r.  Integer sums are exact in any order, so every
 * (row, token) gets the int32 of the avx512 tile, and from there the same float (b32) or double
 * (kq) operations in the same order: the bits of the one-row dot (contract §7), whichever level.
 *
 * Tiles (palette 1, configured at each call and released before it returns, so no tile state
 * outlives a call on the calling thread): 0 = C (16 tokens x 16 int32), 4 and 5 = A (16 tokens x
 * K bytes), 6 and 7 = B (K / 4 rows x 64 bytes).  Token groups of fewer than 16 read their codes
 * from a zero-padded copy: no tile row reads past the activation rows the caller gave.
 *
 * The OS must have granted this process the tile data state (Linux: arch_prctl
 * ARCH_REQ_XCOMP_PERM) before any of this runs: mf_cpu_x86.h's mf_x86_amx_state() asks for it,
 * and megafuse.kernels.simd offers the amx level only where it was granted.
 *
 * Depends on: mf_q8_tiles.h (included from there, after the avx512 tiles it reuses).
 */
#ifndef MEGAFUSE_MF_AMX_TILES_H
#define MEGAFUSE_MF_AMX_TILES_H

#if defined(MF_Q_AMX)

/* The 64-byte tile configuration of palette 1 (Intel SDM, LDTILECFG). */
typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} mf_amx_config;

/* Tiles 0 (C: 16 x 16 int32), 4 and 5 (A: 16 rows of ka bytes), 6 and 7 (B: kb rows of 64
 * bytes), loaded on this thread. */
MF_ALWAYS_INLINE void mf_amx_configure(int ka, int kb)
{
    MF_ALIGNED(64) mf_amx_config c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    c.rows[0] = 16;
    c.colsb[0] = 64;
    c.rows[4] = c.rows[5] = 16;
    c.colsb[4] = c.colsb[5] = (uint16_t)ka;
    c.rows[6] = c.rows[7] = (uint8_t)kb;
    c.colsb[6] = c.colsb[7] = 64;
    _tile_loadconfig(&c);
}

/* mf_q8_tile16_b32 with AMX: nt (<= MF_Q8_TILE_TOKENS) tokens of Q8_0 activation rows at xq
 * (stride xs) against the 16 rows vw[0..15] of a 32-weight format: out[(r / 4) * os + 4 * t +
 * r % 4].  A block's 32 activation codes sit as two runs of 16, 32 bytes apart
 * (mf_act_layout.h): two products of K = 16 into C, against the block's steps 0..3 and 4..7. */
MF_ALWAYS_INLINE void mf_q8_tile16_b32_amx(int dt, const void *const *vw, const char *xq,
                                           ptrdiff_t xs, int nt, ptrdiff_t n, float *out,
                                           ptrdiff_t os)
{
    enum { NC = MF_Q8_B32_CHUNK, TG = 16 };
    mf_q_b32x16 D;
    MF_ALIGNED(64) float acc[MF_Q8_TILE_TOKENS][4][16];   /* token t's chains A_k, k < 4 */
    MF_ALIGNED(64) int32_t cs[MF_Q8_TILE_TOKENS][NC];     /* the chunk's offset terms */
    MF_ALIGNED(64) int32_t sums[4][TG][16];                /* C of a group's 4 blocks */
    MF_ALIGNED(64) int8_t pad[TG][64];                     /* a short token group's codes */
    const ptrdiff_t nb = n / QK8_0;
    const int o = mf_q_b32_offset(dt), asym = dt == CK_DT_Q4_1 || dt == CK_DT_Q5_1;
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    memset(pad, 0, sizeof pad);
    mf_amx_configure(16, 4);
    for (ptrdiff_t b0 = 0; b0 < nb; b0 += NC) {
        const int ncb = (int)(nb - b0 < NC ? nb - b0 : NC);
        mf_q_b32x16_chunk(dt, vw, b0, ncb, xq, xs, nt, n, &D, cs);
        for (int g0 = 0; g0 < nt; g0 += TG) {
            const int ng = nt - g0 < TG ? nt - g0 : TG;
            for (int b4 = 0; b4 < ncb; b4 += 4) {
                const int nk = ncb - b4 < 4 ? ncb - b4 : 4;
                for (int k = 0; k < nk; k++) {
                    const ptrdiff_t gb = b0 + b4 + k;
                    const int8_t *codes = mf_q_b32_codes(xq + g0 * xs, gb, 0);
                    ptrdiff_t stride = xs;
                    if (ng < TG) {               /* rows ng .. 15 stay zero */
                        for (int u = 0; u < ng; u++) {
                            memcpy(pad[u], codes + u * xs, 16);
                            memcpy(pad[u] + 32, codes + u * xs + 32, 16);
                        }
                        codes = pad[0];
                        stride = 64;
                    }
                    _tile_loadd(6, &D.q[b4 + k][0], 64);
                    _tile_loadd(7, &D.q[b4 + k][4], 64);
                    _tile_loadd(4, codes, stride);
                    _tile_loadd(5, codes + 32, stride);
                    _tile_zero(0);
                    _tile_dpbsud(0, 4, 6);
                    _tile_dpbsud(0, 5, 7);
                    _tile_stored(0, sums[k], 64);
                }
                for (int u = 0; u < ng; u++) {
                    const char *a = xq + (g0 + u) * xs;
                    const float *f = mf_act_q8_0_f(a, (size_t)n, (size_t)((b0 + b4) / 4));
                    float (*const A)[16] = acc[g0 + u];
                    for (int k = 0; k < nk; k++) {   /* k: the block's place in its group */
                        const int b = b4 + k;
                        __m512i I = _mm512_load_si512((const void *)sums[k][u]);
                        if (o)
                            I = _mm512_add_epi32(_mm512_set1_epi32(cs[g0 + u][b]), I);
                        const float *fk = f + mf_act_q8_0_f_slot((size_t)k);
                        const __m512 dd = _mm512_mul_ps(D.dw[b], _mm512_set1_ps(fk[0]));
                        __m512 c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), dd, _mm512_load_ps(A[k]));
                        if (asym)
                            c = _mm512_fmadd_ps(D.mw[b], _mm512_set1_ps(fk[1]), c);
                        _mm512_store_ps(A[k], c);
                    }
                }
            }
        }
    }
    _tile_release();
    mf_q_b32x16_out((const float (*)[4][16])acc, nt, out, os);
}

/* The exact int32 sums of one super-block of the 16 rows against 16 Q8_K blocks at a0 + u * as
 * (u < 16; the first ng are tokens): si[u], sm[u] as mf_q_kq16_sums gives them, each sub-block's
 * code sums by one product of K = 4 L (L: its 4-weight steps), then scaled by vpmulld; the min or
 * offset term mf_q_kq16_mins'. */
MF_ALWAYS_INLINE void mf_q_kq16_sums_amx(int dt, const mf_q_kq16 *D, const char *a0, ptrdiff_t as,
                                         int ng, __m512i *si, __m512i *sm)
{
    const __m512i z = _mm512_setzero_si512();
    const int L = mf_q_kq16_steps(dt);
    const int sh = mf_q_kq16_offset_shift(dt);
    MF_ALIGNED(64) int32_t s[16][16];
    for (int u = 0; u < ng; u++)
        si[u] = z;
    for (int j = 0; j < 64 / L; j++) {
        _tile_loadd(6, &D->q[L * j], 64);
        _tile_loadd(4, a0 + offsetof(block_q8_K, qs) + 4 * L * j, as);
        _tile_zero(0);
        _tile_dpbsud(0, 4, 6);
        _tile_stored(0, s, 64);
        for (int u = 0; u < ng; u++)
            si[u] = _mm512_add_epi32(si[u], _mm512_mullo_epi32(
                _mm512_load_si512((const void *)s[u]), D->sc[j]));
    }
    for (int u = 0; u < ng; u++) {
        const __m512i M = mf_q_kq16_mins(dt, D, (const block_q8_K *)(const void *)(a0 + u * as));
        sm[u] = sh ? z : M;
        if (sh)
            si[u] = _mm512_sub_epi32(si[u], _mm512_slli_epi32(M, sh));
    }
}

/* mf_q8_tile16_kq with AMX: nt (<= MF_Q8_TILE_TOKENS) tokens of Q8_K rows at xq (stride xs)
 * against the 16 rows vw[0..15] of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS:
 * out[(r / 4) * os + 4 * t + r % 4].  Each super-block of the 16 rows is decoded once for all
 * the tokens. */
MF_ALWAYS_INLINE void mf_q8_tile16_kq_amx(int dt, const void *const *vw, const char *xq,
                                          ptrdiff_t xs, int nt, ptrdiff_t n, float *out,
                                          ptrdiff_t os)
{
    enum { TG = 16 };
    mf_q_kq16 D;
    MF_ALIGNED(64) double acc[MF_Q8_TILE_TOKENS][16];
    MF_ALIGNED(64) block_q8_K pad[TG];                    /* a short token group's blocks */
    const ptrdiff_t bsz = (ptrdiff_t)ck_dtype_block_bytes((CKDataType)dt), nsb = n / QK_K;
    const int L = mf_q_kq16_steps(dt);
    const char *p[16];
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    memset(pad, 0, sizeof pad);
    mf_amx_configure(4 * L, L);
    for (ptrdiff_t sb = 0; sb < nsb; sb++) {
        for (int r = 0; r < 16; r++)
            p[r] = (const char *)vw[r] + sb * bsz;
        mf_q_kq16_decode(dt, p, &D);
        for (int g0 = 0; g0 < nt; g0 += TG) {
            const int ng = nt - g0 < TG ? nt - g0 : TG;
            const char *a0 = xq + g0 * xs + sb * (ptrdiff_t)sizeof(block_q8_K);
            ptrdiff_t as = xs;
            if (ng < TG) {                       /* blocks ng .. 15 stay zero */
                for (int u = 0; u < ng; u++)
                    memcpy(&pad[u], a0 + u * xs, sizeof(block_q8_K));
                a0 = (const char *)pad;
                as = (ptrdiff_t)sizeof(block_q8_K);
            }
            __m512i si[TG], sm[TG];
            mf_q_kq16_sums_amx(dt, &D, a0, as, ng, si, sm);
            for (int u = 0; u < ng; u++) {
                const block_q8_K *a = (const block_q8_K *)(const void *)(a0 + u * as);
                __m512d A[2] = {_mm512_load_pd(acc[g0 + u]), _mm512_load_pd(acc[g0 + u] + 8)};
                mf_q_kq16_term(dt, &D, a->d, si[u], sm[u], A);
                _mm512_store_pd(acc[g0 + u], A[0]);
                _mm512_store_pd(acc[g0 + u] + 8, A[1]);
            }
        }
    }
    _tile_release();
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 16; r++)
            out[(r / 4) * os + 4 * t + r % 4] = (float)acc[t][r];
}

#endif /* MF_Q_AMX */
#endif /* MEGAFUSE_MF_AMX_TILES_H */
