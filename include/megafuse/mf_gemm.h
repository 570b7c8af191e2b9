/*
 * mf_gemm.h -- the float GEMM of prefill projections: packed weight panels and the register block.
 *
 * out[t][r] = sum_k x[t][k] * w[r][k]: activations x [T, K] (K contiguous) against weight rows
 * w [R, K] (a torch Linear weight).  Weight rows are taken MF_PANEL_ROWS at a time and
 * MF_PANEL_K columns at a time and packed into a panel, column-interleaved:
 *
 *     panel[k * 16 + j] = w[j][k0 + k]        (j < 16 rows, k < kc <= 256 columns)
 *
 * so that one k step of the register block is two 8-float loads of weights and one
 * broadcast of x per token: mf_gemm_panel_f32 keeps a block of up to 6 tokens x 16 rows (12
 * AVX2 accumulators) in registers for the whole panel -- 12 FMAs for 2 loads + 6 broadcasts.
 * A panel (16 KiB) stays in L1 while every token of the tile goes through it; the tile's
 * activations (tokens x 256 columns) stay in L2.
 *
 * Order of every sum, fixed whatever the threads, the tile or the other rows: for each panel of
 * columns in turn, a chain over k (fused multiply-adds on AVX2 and NEON, multiply then add in
 * the generic C) from 0, then added to the total of the earlier panels.  (Chains of at most 256
 * terms plus K/256 of those: float32 error ~ (256 + K/256) ulp at worst, less than a single long
 * chain.)
 *
 * The NEON levels run the same block on 4-lane registers (mf_neon_gemm.h): the same chains.
 * The avx512 level runs the 16-column blocks on 512-bit registers (one a token; P.V also 32
 * columns, two a query): the same chain per element, so the same bits as AVX2, at up to twice
 * its FMA width on cores with 512-bit pipes.  The projections run two panels through each
 * block (mf_gemm_panel2_f32: 12 chains).  The 8-wide blocks (decode's panel of up to 8 queries)
 * stay 256-bit.  Not a 12-token block of one panel: GCC spills its accumulators.
 */
#ifndef MEGAFUSE_MF_GEMM_H
#define MEGAFUSE_MF_GEMM_H

#include <stddef.h>
#include "megafuse/mf_simd.h"

#define MF_PANEL_ROWS 16     /* weight rows of a packed panel (NR) */
#define MF_PANEL_K 256       /* columns of a packed panel (KC): a multiple of every block size */
#define MF_GEMM_MR 6         /* tokens of a register block (MR) */

#if defined(__AVX2__) && defined(__FMA__)
#  define MF_GEMM_AVX2 1
#endif

/* The loops over the tokens of a register block must be unrolled whole, or the accumulators
 * live in memory instead of registers (GCC does not always do it by itself: it did not inside
 * the Cython modules). */
#if defined(__GNUC__) && !defined(__clang__)
#  define MF__UNROLL _Pragma("GCC unroll 8")
#  define MF__UNROLL16 _Pragma("GCC unroll 16")
#elif defined(__clang__)
#  define MF__UNROLL _Pragma("unroll")
#  define MF__UNROLL16 _Pragma("unroll")
#else
#  define MF__UNROLL
#  define MF__UNROLL16
#endif

/* Software prefetch of [p, p + bytes) into L2: the next panel's weight rows, while this panel
 * computes (short runs from 16 rows at once, which the hardware prefetchers do not follow far
 * enough).  A prefetch never faults. */
static inline void mf_prefetch_l2(const void *p, ptrdiff_t bytes)
{
#if defined(__GNUC__)
    const char *c = (const char *)p;
    for (ptrdiff_t o = 0; o < bytes; o += 64)
        __builtin_prefetch(c + o, 0, 2);
#else
    (void)p; (void)bytes;
#endif
}

/* panel[k * 16 + j] = rows[j][k] for k < kc, j < 16.  rows may repeat (a short panel). */
static inline void mf_pack_panel_f32(const float *const rows[MF_PANEL_ROWS], ptrdiff_t kc,
                                     float *panel)
{
    ptrdiff_t k = 0;
#if defined(MF_GEMM_AVX2)
    for (; k + 8 <= kc; k += 8) {
        for (int h = 0; h < 2; h++) {          /* rows 0-7, then 8-15: an 8x8 transpose each */
            const float *const *r = rows + 8 * h;
            __m256 a0 = _mm256_loadu_ps(r[0] + k), a1 = _mm256_loadu_ps(r[1] + k);
            __m256 a2 = _mm256_loadu_ps(r[2] + k), a3 = _mm256_loadu_ps(r[3] + k);
            __m256 a4 = _mm256_loadu_ps(r[4] + k), a5 = _mm256_loadu_ps(r[5] + k);
            __m256 a6 = _mm256_loadu_ps(r[6] + k), a7 = _mm256_loadu_ps(r[7] + k);
            __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
            __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
            __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
            __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
            /* u0: column 0 of rows 0-3 | column 4; u1: 1 | 5; u2: 2 | 6; u3: 3 | 7 (u4-u7: rows 4-7) */
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *d = panel + k * MF_PANEL_ROWS + 8 * h;
            _mm256_storeu_ps(d + 0 * MF_PANEL_ROWS, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(d + 1 * MF_PANEL_ROWS, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(d + 2 * MF_PANEL_ROWS, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(d + 3 * MF_PANEL_ROWS, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(d + 4 * MF_PANEL_ROWS, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(d + 5 * MF_PANEL_ROWS, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(d + 6 * MF_PANEL_ROWS, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(d + 7 * MF_PANEL_ROWS, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
#endif
    for (; k < kc; k++)
        for (int j = 0; j < MF_PANEL_ROWS; j++)
            panel[k * MF_PANEL_ROWS + j] = rows[j][k];
}

#if defined(MF_SIMD_AVX512)
/* The block on 512-bit registers: 16 columns of pa into ca (and, NZ = 2, 16 of pb into cb), one
 * register a token and 16 columns, each column the chain of the 256-bit block. */
MF_ALWAYS_INLINE void mf__gemm_block_zmm(
    const int MR, const int NZ, const float *x, ptrdiff_t xi, ptrdiff_t xk, const float *pa,
    const float *pb, ptrdiff_t ldp, ptrdiff_t kc, float *ca, float *cb, ptrdiff_t ldc, int first)
{
    __m512 acc[MF_GEMM_MR][2];
    MF__UNROLL
    for (int i = 0; i < MR; i++)
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (ptrdiff_t k = 0; k < kc; k++) {
        const __m512 w0 = _mm512_loadu_ps(pa + k * ldp);
        const __m512 w1 = NZ > 1 ? _mm512_loadu_ps(pb + k * ldp) : w0;
        MF__UNROLL
        for (int i = 0; i < MR; i++) {
            const __m512 xb = _mm512_set1_ps(x[i * xi + k * xk]);
            acc[i][0] = _mm512_fmadd_ps(xb, w0, acc[i][0]);
            if (NZ > 1)
                acc[i][1] = _mm512_fmadd_ps(xb, w1, acc[i][1]);
        }
    }
    MF__UNROLL
    for (int i = 0; i < MR; i++) {
        MF__UNROLL
        for (int h = 0; h < NZ; h++) {
            float *ci = (h ? cb : ca) + i * ldc;
            if (!first)
                acc[i][h] = _mm512_add_ps(_mm512_loadu_ps(ci), acc[i][h]);
            _mm512_storeu_ps(ci, acc[i][h]);
        }
    }
}
#endif

/*
 * The register block, general form: for i < MR, j < 8 * NV (NV = 2: 16 columns; 1: 8; 4: 32,
 * avx512 only)
 *     c[i * ldc + j] = (first ? 0 : c[i * ldc + j]) + sum_{k < kc} x[i * xi + k * xk] * p[k * ldp + j]
 * where the sum is one chain in k order, added to c at the end.  The callers below fix the
 * strides (constants after inlining): projections read x rows (xi = ldx, xk = 1) against a packed
 * panel (ldp = 16); attention also reads a transposed x (xi = 1, xk = 16 or 8) against rows of V
 * in place (ldp = Da), and its narrow panel of up to 8 queries takes NV = 1.  Column j's chain is
 * the same operations whatever NV: a column's result does not depend on the block's width.
 */
#if defined(MF_GEMM_AVX2)
MF_ALWAYS_INLINE void mf__gemm_block(
    const int MR, const int NV, const float *x, ptrdiff_t xi, ptrdiff_t xk, const float *p,
    ptrdiff_t ldp, ptrdiff_t kc, float *c, ptrdiff_t ldc, int first)
{
#if defined(MF_SIMD_AVX512)
    if (NV > 1) {              /* the same chains, 16 columns a 512-bit register */
        mf__gemm_block_zmm(MR, NV / 2, x, xi, xk, p, p + 16, ldp, kc, c, c + 16, ldc, first);
        return;
    }
#endif
    __m256 acc[MF_GEMM_MR][2];
    MF__UNROLL
    for (int i = 0; i < MR; i++)
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (ptrdiff_t k = 0; k < kc; k++) {
        __m256 w0 = _mm256_loadu_ps(p + k * ldp);
        __m256 w1 = NV > 1 ? _mm256_loadu_ps(p + k * ldp + 8) : w0;
        MF__UNROLL
        for (int i = 0; i < MR; i++) {
            __m256 xb = _mm256_broadcast_ss(x + i * xi + k * xk);
            acc[i][0] = _mm256_fmadd_ps(xb, w0, acc[i][0]);
            if (NV > 1)
                acc[i][1] = _mm256_fmadd_ps(xb, w1, acc[i][1]);
        }
    }
    MF__UNROLL
    for (int i = 0; i < MR; i++) {
        float *ci = c + i * ldc;
        MF__UNROLL
        for (int h = 0; h < NV; h++) {
            if (first)
                _mm256_storeu_ps(ci + 8 * h, acc[i][h]);
            else
                _mm256_storeu_ps(ci + 8 * h, _mm256_add_ps(_mm256_loadu_ps(ci + 8 * h), acc[i][h]));
        }
    }
}
#elif defined(MF_SIMD_NEON)
#include "mf_neon_gemm.h"
#else
static inline void mf__gemm_block(
    const int MR, const int NV, const float *x, ptrdiff_t xi, ptrdiff_t xk, const float *p,
    ptrdiff_t ldp, ptrdiff_t kc, float *c, ptrdiff_t ldc, int first)
{
    float acc[MF_GEMM_MR][MF_PANEL_ROWS];
    const int nj = 8 * NV;
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < MF_PANEL_ROWS; j++)
            acc[i][j] = 0.0f;
    for (ptrdiff_t k = 0; k < kc; k++) {
        const float *pk = p + k * ldp;
        for (int i = 0; i < MR; i++) {
            float xv = x[i * xi + k * xk];
            for (int j = 0; j < nj; j++)
                acc[i][j] += xv * pk[j];
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < nj; j++)
            c[i * ldc + j] = first ? acc[i][j] : c[i * ldc + j] + acc[i][j];
}
#endif

/* A body specialised for each token count mr (1..MF_GEMM_MR). */
#define MF__GEMM_SWITCH(mr, ...)                                                                 \
    switch (mr) {                                                                                \
    case 6: mf__gemm_block(6, __VA_ARGS__); break;                                               \
    case 5: mf__gemm_block(5, __VA_ARGS__); break;                                               \
    case 4: mf__gemm_block(4, __VA_ARGS__); break;                                               \
    case 3: mf__gemm_block(3, __VA_ARGS__); break;                                               \
    case 2: mf__gemm_block(2, __VA_ARGS__); break;                                               \
    default: mf__gemm_block(1, __VA_ARGS__); break;                                              \
    }

/* Projections: c[i * 16 + j] (+)= sum_k x[i * ldx + k] * panel[k * 16 + j], i < mr. */
static inline void mf_gemm_panel_f32(int mr, const float *x, ptrdiff_t ldx, const float *panel,
                                     ptrdiff_t kc, float *c, int first)
{
    MF__GEMM_SWITCH(mr, 2, x, ldx, 1, panel, MF_PANEL_ROWS, kc, c, MF_PANEL_ROWS, first)
}

/* Two panels through one register block: mf_gemm_panel_f32 of panel a into ca and of panel b
 * into cb (each ca / cb element the same chain).  At avx512 a token's two registers give 12
 * chains where one panel gives 6. */
static inline void mf_gemm_panel2_f32(int mr, const float *x, ptrdiff_t ldx, const float *pa,
                                      const float *pb, ptrdiff_t kc, float *ca, float *cb,
                                      int first)
{
#if defined(MF_SIMD_AVX512)
#define MF__PANEL2(MR)                                                                           \
    mf__gemm_block_zmm(MR, 2, x, ldx, 1, pa, pb, MF_PANEL_ROWS, kc, ca, cb, MF_PANEL_ROWS, first)
    switch (mr) {
    case 6: MF__PANEL2(6); break;
    case 5: MF__PANEL2(5); break;
    case 4: MF__PANEL2(4); break;
    case 3: MF__PANEL2(3); break;
    case 2: MF__PANEL2(2); break;
    default: MF__PANEL2(1); break;
    }
#undef MF__PANEL2
#else
    mf_gemm_panel_f32(mr, x, ldx, pa, kc, ca, first);
    mf_gemm_panel_f32(mr, x, ldx, pb, kc, cb, first);
#endif
}

/* The same for a panel 8 columns wide: c[i * 8 + j] = sum_k x[i * ldx + k] * panel[k * 8 + j]
 * (attention's scores of up to 8 queries). */
MF_ALWAYS_INLINE void mf_gemm_panel8_f32(int mr, const float *x, ptrdiff_t ldx, const float *panel,
                                      ptrdiff_t kc, float *c)
{
    MF__GEMM_SWITCH(mr, 1, x, ldx, 1, panel, 8, kc, c, 8, 1)
}

/* 12 keys at once for the 8-wide panel (12 chains, where 6 would wait on the FMA latency):
 * c[i * 8 + j] = sum_k x[i * ldx + k] * panel[k * 8 + j], i < 12; each column the same chain as
 * in mf_gemm_panel8_f32. */
MF_ALWAYS_INLINE void mf_gemm_panel8x12_f32(const float *x, ptrdiff_t ldx, const float *panel,
                                         ptrdiff_t kc, float *c)
{
#if defined(MF_GEMM_AVX2)
    __m256 acc[12];
    MF__UNROLL16
    for (int i = 0; i < 12; i++)
        acc[i] = _mm256_setzero_ps();
    for (ptrdiff_t k = 0; k < kc; k++) {
        __m256 w = _mm256_loadu_ps(panel + k * 8);
        MF__UNROLL16
        for (int i = 0; i < 12; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i * ldx + k), w, acc[i]);
    }
    MF__UNROLL16
    for (int i = 0; i < 12; i++)
        _mm256_storeu_ps(c + i * 8, acc[i]);
#else
    mf_gemm_panel8_f32(6, x, ldx, panel, kc, c);
    mf_gemm_panel8_f32(6, x + 6 * ldx, ldx, panel, kc, c + 6 * 8);
#endif
}

/* Attention's P.V: c[i * ldc + j] += sum_k xt[k * ldxt + i] * p[k * ldp + j], i < mr, j < 8 * NV
 * (xt: rows stored transposed, ldxt = 16 or 8: the probabilities of the block's queries for kc
 * keys). */
MF_ALWAYS_INLINE void mf__gemm_xt(const int NV, int mr, const float *xt, ptrdiff_t ldxt,
                                  const float *p, ptrdiff_t ldp, ptrdiff_t kc, float *c,
                                  ptrdiff_t ldc)
{
    if (ldxt == 8) {
        MF__GEMM_SWITCH(mr, NV, xt, 1, 8, p, ldp, kc, c, ldc, 0)
    } else {
        MF__GEMM_SWITCH(mr, NV, xt, 1, MF_PANEL_ROWS, p, ldp, kc, c, ldc, 0)
    }
}

/* P.V, 16 columns (j < 16). */
MF_ALWAYS_INLINE void mf_gemm_xt_f32(int mr, const float *xt, ptrdiff_t ldxt, const float *p,
                                  ptrdiff_t ldp, ptrdiff_t kc, float *c, ptrdiff_t ldc)
{
    mf__gemm_xt(2, mr, xt, ldxt, p, ldp, kc, c, ldc);
}

#if defined(MF_SIMD_AVX512)
/* P.V 32 columns wide (two 512-bit registers a query: twice the chains of the 16-wide block for
 * decode's 1-4 queries), each column the chain of mf_gemm_xt_f32. */
MF_ALWAYS_INLINE void mf_gemm_xt32_f32(int mr, const float *xt, ptrdiff_t ldxt, const float *p,
                                       ptrdiff_t ldp, ptrdiff_t kc, float *c, ptrdiff_t ldc)
{
    mf__gemm_xt(4, mr, xt, ldxt, p, ldp, kc, c, ldc);
}
#endif

#endif /* MEGAFUSE_MF_GEMM_H */
