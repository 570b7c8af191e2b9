/*
 * amx_tiles_check.c -- the amx level's prefill tiles (include/megafuse/mf_amx_tiles.h) against
 * the avx512 level's and the one-row dots, bit for bit, and so the projections' entry
 * (mf_q8_rows16_tokens, which picks the tile of the level built): every block format, 16 rows of
 * random blocks against token counts around the 16-token groups (5, 16, 17, 35, 64), rows of one
 * chunk and of several.  Its entry is test_main(): tools/amx-emulated.sh boots it bare metal in an
 * emulated Sapphire Rapids (no AMX on the host needed).  On a host that has AMX-INT8 (and the
 * tile permission) it also builds as a program, `-Dtest_main=main`; with -DMF_CHECK_NO_AMX only
 * the avx512 tiles run against the one-row dots, on any AVX-512 VNNI host: a check of the check.
 * The last line is `RESULT PASS` or `RESULT FAIL`; the exit status 0 or 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "megafuse/mf_act_quant.h"
#include "megafuse/mf_q8_tiles.h"

#define mf_check_printf printf

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rng_unit(void) { return (float)(rng() & 0xFFFFFF) / 8388608.0f - 1.0f; }

static const char *format_name(int dt)
{
    switch (dt) {
    case CK_DT_Q4_0: return "Q4_0"; case CK_DT_Q4_1: return "Q4_1"; case CK_DT_Q5_0: return "Q5_0";
    case CK_DT_Q5_1: return "Q5_1"; case CK_DT_Q8_0: return "Q8_0"; case CK_DT_IQ4_NL: return "IQ4_NL";
    case CK_DT_Q2_K: return "Q2_K"; case CK_DT_Q3_K: return "Q3_K"; case CK_DT_Q4_K: return "Q4_K";
    case CK_DT_Q5_K: return "Q5_K"; case CK_DT_Q6_K: return "Q6_K"; case CK_DT_IQ4_XS: return "IQ4_XS";
    default: return "?";
    }
}

static uint16_t fp16_of(float x) { return (uint16_t)_cvtss_sh(x, 0); }

/* A random row of nblk blocks of format dt: random codes, fp16 scales in [2^-9, 2^-6). */
static void random_row(int dt, char *row, ptrdiff_t nblk)
{
    const size_t bsz = ck_dtype_block_bytes((CKDataType)dt);
    for (ptrdiff_t b = 0; b < nblk; b++) {
        char *blk = row + b * bsz;
        for (size_t i = 0; i < bsz; i++)
            blk[i] = (char)rng();
        const uint16_t d = fp16_of(0.001953125f * (1.0f + 7.0f * (float)(rng() & 0xFFFF) / 65536.0f));
        const uint16_t m = fp16_of(0.001953125f * (1.0f + 7.0f * (float)(rng() & 0xFFFF) / 65536.0f));
        switch (dt) {
        case CK_DT_Q4_0: case CK_DT_Q5_0: case CK_DT_IQ4_NL: memcpy(blk, &d, 2); break;
        case CK_DT_Q4_1: case CK_DT_Q5_1: memcpy(blk, &d, 2); memcpy(blk + 2, &m, 2); break;
        case CK_DT_Q8_0:
            memcpy(blk, &d, 2);
            for (int i = 0; i < 32; i++)
                if (blk[2 + i] == (char)-128)
                    blk[2 + i] = -127;
            break;
        case CK_DT_Q4_K: memcpy(blk + offsetof(block_q4_K, d), &d, 2);
                         memcpy(blk + offsetof(block_q4_K, dmin), &m, 2); break;
        case CK_DT_Q5_K: memcpy(blk + offsetof(block_q5_K, d), &d, 2);
                         memcpy(blk + offsetof(block_q5_K, dmin), &m, 2); break;
        case CK_DT_Q6_K: memcpy(blk + offsetof(block_q6_K, d), &d, 2); break;
        case CK_DT_Q2_K: memcpy(blk + offsetof(block_q2_K, d), &d, 2);
                         memcpy(blk + offsetof(block_q2_K, dmin), &m, 2); break;
        case CK_DT_Q3_K: memcpy(blk + offsetof(block_q3_K, d), &d, 2); break;
        case CK_DT_IQ4_XS: memcpy(blk + offsetof(block_iq4_xs, d), &d, 2); break;
        default: break;
        }
    }
}

enum { NROWS = 16, MAXT = MF_Q8_TILE_TOKENS, MAXN = 2048 };
static char W[NROWS][MAXN / 32 * 40];                   /* >= any format's row of MAXN */
static char X[MAXT][MAXN / 256 * sizeof(block_q8_K) + MAXN + 256];
static float out_ref[4 * MAXT * 4], out_vnni[4 * MAXT * 4], out_amx[4 * MAXT * 4],
    out_level[4 * MAXT * 4];

static int check(int dt, ptrdiff_t n, int nt)
{
    const int kq = !mf_q8_tile16_b32_takes(dt);
    const ptrdiff_t os = 4 * MAXT;
    const ptrdiff_t nblk = n / (kq ? QK_K : QK8_0);
    const void *vw[NROWS];
    float x[MAXN];
    for (int r = 0; r < NROWS; r++) {
        random_row(dt, W[r], nblk);
        vw[r] = W[r];
    }
    for (int t = 0; t < nt; t++) {
        for (ptrdiff_t i = 0; i < n; i++)
            x[i] = rng_unit() * (t % 3 == 2 ? 0.0f : 1.0f + (float)t);   /* all-zero rows too */
        if (kq)
            mf_quantize_row_q8_K(x, X[t], n);
        else
            mf_quantize_row_q8_0_act(x, X[t], n);
    }
    const char *xq = X[0];
    const ptrdiff_t stride = (ptrdiff_t)sizeof X[0];
    mf_dot_q8_fn one = mf_dot_q8_for(dt);
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < NROWS; r++)
            out_ref[(r / 4) * os + 4 * t + r % 4] = one(vw[r], xq + t * stride, n);
    memset(out_vnni, 0, sizeof out_vnni);
    memset(out_amx, 0, sizeof out_amx);
    /* the projections' entry (mf_q8_rows16_tokens): this build's level picks the tile */
    mf_q8_rows16_tokens(dt, vw, NROWS, xq, stride, nt, n, out_level, os);
    switch (dt) {
#define CASE(DT)                                                                                \
    case DT:                                                                                    \
        if (kq) mf_q8_tile16_kq(DT, vw, xq, stride, nt, n, out_vnni, os);                       \
        else mf_q8_tile16_b32(DT, vw, xq, stride, nt, n, out_vnni, os);                          \
        AMX_CALL(DT)                                                                            \
        break;
#if defined(MF_CHECK_NO_AMX)
#  define AMX_CALL(DT)
#else
#  define AMX_CALL(DT)                                                                          \
        if (kq) mf_q8_tile16_kq_amx(DT, vw, xq, stride, nt, n, out_amx, os);                    \
        else mf_q8_tile16_b32_amx(DT, vw, xq, stride, nt, n, out_amx, os);
#endif
    CASE(CK_DT_Q4_0) CASE(CK_DT_Q4_1) CASE(CK_DT_Q5_0) CASE(CK_DT_Q5_1) CASE(CK_DT_Q8_0)
    CASE(CK_DT_IQ4_NL) CASE(CK_DT_Q2_K) CASE(CK_DT_Q3_K) CASE(CK_DT_Q4_K) CASE(CK_DT_Q5_K)
    CASE(CK_DT_Q6_K) CASE(CK_DT_IQ4_XS)
    default: return 1;
    }
    int bad_vnni = 0, bad_amx = 0, bad_level = 0;
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < NROWS; r++) {
            const ptrdiff_t i = (r / 4) * os + 4 * t + r % 4;
            bad_vnni += memcmp(&out_ref[i], &out_vnni[i], 4) != 0;
            bad_level += memcmp(&out_ref[i], &out_level[i], 4) != 0;
#if !defined(MF_CHECK_NO_AMX)
            bad_amx += memcmp(&out_ref[i], &out_amx[i], 4) != 0;
#endif
        }
    mf_check_printf("%s n=%d nt=%d: rows16 %s, avx512 tile %s, amx tile %s\n", format_name(dt),
                    (int)n, nt, bad_level ? "DIFFERS" : "same bits",
                    bad_vnni ? "DIFFERS" : "same bits",
#if defined(MF_CHECK_NO_AMX)
                    "not run"
#else
                    bad_amx ? "DIFFERS" : "same bits"
#endif
                    );
    return bad_vnni || bad_amx || bad_level;
}

int test_main(void)
{
    static const int formats[] = {CK_DT_Q4_0, CK_DT_Q4_1, CK_DT_Q5_0, CK_DT_Q5_1, CK_DT_Q8_0,
                                  CK_DT_IQ4_NL, CK_DT_Q2_K, CK_DT_Q3_K, CK_DT_Q4_K, CK_DT_Q5_K,
                                  CK_DT_Q6_K, CK_DT_IQ4_XS};
    static const int tokens[] = {5, 16, 17, 35, 64};
    int failed = 0, cases = 0;
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        const int dt = formats[f];
        const int kq = !mf_q8_tile16_b32_takes(dt);
        const ptrdiff_t ns[2] = {kq ? 256 : 96, kq ? 1280 : 800};   /* one chunk / several */
        for (int i = 0; i < 2; i++)
            for (size_t k = 0; k < sizeof tokens / sizeof tokens[0]; k++) {
                failed += check(dt, ns[i], tokens[k]);
                cases++;
            }
    }
    mf_check_printf("%d of %d cases differ\n", failed, cases);
    mf_check_printf(failed ? "RESULT FAIL\n" : "RESULT PASS\n");
    return failed != 0;
}
