/*
 * mf_act_quant.h -- the activation quantizers of the int8 path: a float32 row x[n] -> Q8_0 blocks
 * (mf_quantize_row_q8_0_act, GGML's quantize_row_q8_0_ref) for the 32-weight formats, -> Q8_K
 * blocks (mf_quantize_row_q8_K, GGML's quantize_row_q8_K_ref) for the K-quants.
 *
 * On finite data they are GGML's reference functions exactly.  A block that holds NaN or Inf gets
 * d = NaN and all codes 0 (it dequantizes to NaN, so non-finite activations propagate).  Codes
 * lie in [-127, 127] (never -128): the precondition of the int8 dots of mf_dot_q8.h.
 *
 * Depends on: mf_quant_common.h (mf_mul_nc, mf_round_away, mf_nearest_int, mf_imin),
 * ggml_blocks.h (block_q8_0, block_q8_K, fp16 conversion).
 */
#ifndef MEGAFUSE_MF_ACT_QUANT_H
#define MEGAFUSE_MF_ACT_QUANT_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"
#include "mf_quant_common.h"

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
            y[ib].d = finite ? 0.0f : mf_bits_f32(MF_F32_DEFAULT_NAN_BITS);
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

#endif /* MEGAFUSE_MF_ACT_QUANT_H */
