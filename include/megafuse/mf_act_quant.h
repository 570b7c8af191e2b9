/*
 * mf_act_quant.h -- the activation quantizers of the int8 path: a float32 row x[n] -> a Q8_0
 * activation row (mf_quantize_row_q8_0_act: GGML's quantize_row_q8_0_ref, stored in the layout of
 * mf_act_layout.h) for the 32-weight formats, -> Q8_K blocks (mf_quantize_row_q8_K, GGML's
 * quantize_row_q8_K_ref) for the K-quants.
 *
 * On finite data the codes and scales are GGML's reference functions exactly.  A block that holds
 * NaN or Inf gets d = NaN and all codes 0 (it dequantizes to NaN, so non-finite activations
 * propagate).  Codes lie in [-127, 127] (never -128): the precondition of the int8 dots of
 * mf_dot_q8.h.
 *
 * Depends on: mf_act_layout.h (the Q8_0 activation row), mf_quant_common.h (mf_mul_nc,
 * mf_round_away, mf_nearest_int, mf_imin), ggml_blocks.h (block_q8_K, fp16 conversion).
 */
#ifndef MEGAFUSE_MF_ACT_QUANT_H
#define MEGAFUSE_MF_ACT_QUANT_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"
#include "mf_act_layout.h"
#include "mf_quant_common.h"

/* ============================================================================================ */
/* Activation quantizers (the int8 path)                                                        */
/* ============================================================================================ */

/* x[n] -> a Q8_0 activation row (mf_act_layout.h; mf_act_q8_0_row_bytes(n) bytes, all written).
 * Per block of 32, GGML's quantize_row_q8_0_ref: amax = max |x|, d = amax / 127, id = 1/d (0 when
 * d = 0), q = roundf(x * id); d rounded to fp16, then stored as float with s = d * sum(q).
 * A block holding NaN or Inf: d = s = NaN, q = 0. */
static inline void mf_quantize_row_q8_0_act(const float *MF_RESTRICT x, void *MF_RESTRICT va,
                                            ptrdiff_t n)
{
    const ptrdiff_t nb = n / QK8_0;
    const size_t ng = mf_act_q8_0_groups((size_t)n);
    int8_t *codes = (int8_t *)va;                                         /* [ng][2][64] */
    float *f = (float *)(void *)((char *)va + ng * MF_ACT_GROUP_CODE_BYTES);  /* [ng][4][2] */
    const size_t used = ng * (MF_ACT_GROUP_CODE_BYTES + MF_ACT_GROUP_F_FLOATS * sizeof(float));
    /* zero blocks from block nb on (a last odd block shares its pair with one: written below) */
    memset(codes + (size_t)(nb / 2) * 64, 0, ng * MF_ACT_GROUP_CODE_BYTES - (size_t)(nb / 2) * 64);
    for (size_t k = (size_t)nb; k < ng * MF_ACT_GROUP_BLOCKS; k++)       /* zero blocks */
        f[k / 4 * 8 + mf_act_q8_0_f_slot(k % 4)] = f[k / 4 * 8 + mf_act_q8_0_f_slot(k % 4) + 1] = 0.0f;
    memset((char *)va + used, 0, mf_act_q8_0_row_bytes((size_t)n) - used);
    for (ptrdiff_t ib = 0; ib < nb; ib++) {
        const float *xb = x + ib * QK8_0;
        /* block ib = 4g + 2p + h: lo half at pair offset 16h, hi half at 32 + 16h */
        int8_t *lo = codes + (ib >> 1) * 64 + (ib & 1) * 16, *hi = lo + 32;
        float *fb = f + ib / 4 * 8 + mf_act_q8_0_f_slot((size_t)(ib % 4));      /* [d, s] */
        float amax = 0.0f;
        int finite = 1;
        for (int j = 0; j < QK8_0; j++) {
            const float a = fabsf(xb[j]);
            finite &= a <= FLT_MAX;
            amax = a > amax ? a : amax;
        }
        if (!finite) {
            memset(lo, 0, 16);
            memset(hi, 0, 16);
            fb[0] = fb[1] = mf_bits_f32(MF_F32_DEFAULT_NAN_BITS);
            continue;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_0; j++) {
            const int q = (int)mf_round_away(mf_mul_nc(xb[j], id));
            if (j < 16)
                lo[j] = (int8_t)q;
            else
                hi[j - 16] = (int8_t)q;
            sum += q;
        }
        const float d16 = mf_fp16_to_fp32(mf_fp32_to_fp16(d));
        fb[0] = d16;
        fb[1] = d16 * (float)sum;                          /* exact */
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
