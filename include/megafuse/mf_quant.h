/*
 * mf_quant.h -- the weight formats of megafuse: dequantize, dot products and quantizers.
 *
 * An umbrella: it only includes the headers of one role each, in dependency order, so that
 * `cdef extern from "megafuse/mf_quant.h"` sees all of them.  Each role header compiles alone.
 *
 *   mf_quant_common.h     SIMD level switches, scalar helpers, AVX2 building blocks, block pieces
 *                         several roles decode alike (fp16 scales, K-quant scales, Q6_K codes)
 *   mf_dequant.h          mf_dequantize_row_<dt>(w, y, n)    y[n] = the weights, bit-exact with
 *                                                            GGML / gguf.quants.dequantize
 *   mf_dot_f32.h          mf_dot_<dt>_f32(w, x, n)           sum_i w_i x_i, float activations
 *                                                            (weights decoded in registers);
 *                         mf_dot4_<dt>_f32: four rows at once, the bits of the one-row dots
 *   mf_act_layout.h       the byte layout of the int8 path's activation rows (sizes, offsets)
 *   mf_act_quant.h        mf_quantize_row_q8_0_act, mf_quantize_row_q8_K: activations of the
 *                         int8 path (GGML's quantize_row_q8_0_ref / quantize_row_q8_K_ref)
 *   mf_dot_q8.h           mf_dot_{q4_0,q4_1,q5_0,q5_1,q8_0,iq4_nl}_q8_0,
 *                         mf_dot_{q2_K,q3_K,q4_K,q5_K,q6_K,iq4_xs}_q8_K:
 *                         one weight row x one quantized activation row, exact integer sums,
 *                         one fixed sequence of float operations per pair (per SIMD level)
 *   mf_weight_quant.h     mf_quantize_row_<dt>(x, w, n): the weight quantizers, K-quants included
 *   mf_format_dispatch.h  the functions of a CKDataType (mf_*_for), the activation format of a
 *                         weight format, the calls by dtype
 *   mf_q8_tiles.h         mf_q8_rows_tokens: up to 4 weight rows x any number of activation rows
 *                         (the projections of the int8 path), the bits of the one-row dots
 *
 * dt is any weight format (FP32, FP16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, IQ4_XS); a "row" is n weights, n a multiple of the block size (the caller
 * checks it).  Shapes: w = one weight row, [n / block] blocks (ck_dtype_row_bytes(dt, n) bytes);
 * x, y [n] float32; a = one activation row (mf_act_layout.h: a Q8_0 activation row or [n / 256]
 * block_q8_K).
 *
 * No function here allocates, fails or reads outside [w, w + row bytes) and [x, x + n).
 */
#ifndef MEGAFUSE_MF_QUANT_H
#define MEGAFUSE_MF_QUANT_H

#include "mf_quant_common.h"
#include "mf_dequant.h"
#include "mf_dot_f32.h"
#include "mf_act_layout.h"
#include "mf_act_quant.h"
#include "mf_dot_q8.h"
#include "mf_weight_quant.h"
#include "mf_format_dispatch.h"
#include "mf_q8_tiles.h"

#endif /* MEGAFUSE_MF_QUANT_H */
