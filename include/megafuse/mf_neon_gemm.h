/*
 * mf_neon_gemm.h -- the register block of mf_gemm.h on AArch64 Advanced SIMD (the neon,
 * neon_dotprod and i8mm levels): up to MF_GEMM_MR tokens x 8 * NV columns (NV = 1 or 2), one
 * 4-lane register per token and 4 columns, 24 accumulators at most of the 32 registers.
 *
 * Column j's chain is the AVX2 block's: acc = x * w + acc fused (vfmaq_n_f32), in k order from 0,
 * then added to c -- so the same bits as the avx2 and avx512 levels.  Included by mf_gemm.h only.
 */
#ifndef MEGAFUSE_MF_NEON_GEMM_H
#define MEGAFUSE_MF_NEON_GEMM_H

#include <stddef.h>
#include <arm_neon.h>

MF_ALWAYS_INLINE void mf__gemm_block(
    const int MR, const int NV, const float *x, ptrdiff_t xi, ptrdiff_t xk, const float *p,
    ptrdiff_t ldp, ptrdiff_t kc, float *c, ptrdiff_t ldc, int first)
{
    const int NQ = 2 * NV;                     /* 4-column registers a token */
    float32x4_t acc[MF_GEMM_MR][4];
    MF__UNROLL
    for (int i = 0; i < MR; i++)
        MF__UNROLL
        for (int h = 0; h < NQ; h++)
            acc[i][h] = vdupq_n_f32(0.0f);
    for (ptrdiff_t k = 0; k < kc; k++) {
        float32x4_t w[4];
        MF__UNROLL
        for (int h = 0; h < NQ; h++)
            w[h] = vld1q_f32(p + k * ldp + 4 * h);
        MF__UNROLL
        for (int i = 0; i < MR; i++) {
            const float xv = x[i * xi + k * xk];
            MF__UNROLL
            for (int h = 0; h < NQ; h++)
                acc[i][h] = vfmaq_n_f32(acc[i][h], w[h], xv);
        }
    }
    MF__UNROLL
    for (int i = 0; i < MR; i++) {
        float *ci = c + i * ldc;
        MF__UNROLL
        for (int h = 0; h < NQ; h++) {
            if (first)
                vst1q_f32(ci + 4 * h, acc[i][h]);
            else
                vst1q_f32(ci + 4 * h, vaddq_f32(vld1q_f32(ci + 4 * h), acc[i][h]));
        }
    }
}

#endif /* MEGAFUSE_MF_NEON_GEMM_H */
