/*
 * mf_format_dispatch.h -- one entry per role, chosen by CKDataType at run time: the function
 * pointers of every weight format (mf_dequantize_row_for, mf_quantize_row_for, mf_dot_f32_for,
 * mf_dot_q8_for), the activation format the int8 path pairs with a weight format
 * (mf_activation_dtype, mf_activation_row_bytes, mf_quantize_activation_row), and the calls by
 * dtype (mf_dequantize_row, mf_quantize_row, mf_weight_row_dot_f32, mf_weight_row_dot_q8).
 *
 * Depends on: mf_dequant.h, mf_dot_f32.h, mf_act_quant.h, mf_dot_q8.h, mf_weight_quant.h (the
 * functions it dispatches to), mf_act_layout.h (activation row sizes), ckernel_dtype.h (CKDataType).
 */
#ifndef MEGAFUSE_MF_FORMAT_DISPATCH_H
#define MEGAFUSE_MF_FORMAT_DISPATCH_H

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "ckernel_dtype.h"
#include "mf_quant_common.h"
#include "mf_act_layout.h"
#include "mf_dequant.h"
#include "mf_dot_f32.h"
#include "mf_act_quant.h"
#include "mf_dot_q8.h"
#include "mf_weight_quant.h"

/* ============================================================================================ */
/* Dispatch by CKDataType (the caller has checked that dt is a weight format and n a multiple   */
/* of its block size).                                                                          */
/* ============================================================================================ */

typedef void (*mf_dequantize_row_fn)(const void *w, float *y, ptrdiff_t n);
typedef void (*mf_quantize_row_fn)(const float *x, void *w, ptrdiff_t n);
typedef float (*mf_dot_f32_fn)(const void *w, const float *x, ptrdiff_t n);
typedef float (*mf_dot_q8_fn)(const void *w, const void *a, ptrdiff_t n);

static inline mf_dequantize_row_fn mf_dequantize_row_for(int dt)
{
    switch (dt) {
    case CK_DT_FP32: return mf_dequantize_row_fp32;
    case CK_DT_FP16: return mf_dequantize_row_fp16;
    case CK_DT_BF16: return mf_dequantize_row_bf16;
    case CK_DT_Q4_0: return mf_dequantize_row_q4_0;
    case CK_DT_Q4_1: return mf_dequantize_row_q4_1;
    case CK_DT_Q5_0: return mf_dequantize_row_q5_0;
    case CK_DT_Q5_1: return mf_dequantize_row_q5_1;
    case CK_DT_Q8_0: return mf_dequantize_row_q8_0;
    case CK_DT_Q4_K: return mf_dequantize_row_q4_K;
    case CK_DT_Q5_K: return mf_dequantize_row_q5_K;
    case CK_DT_Q6_K: return mf_dequantize_row_q6_K;
    case CK_DT_Q2_K: return mf_dequantize_row_q2_K;
    case CK_DT_Q3_K: return mf_dequantize_row_q3_K;
    case CK_DT_IQ4_NL: return mf_dequantize_row_iq4_nl;
    case CK_DT_IQ4_XS: return mf_dequantize_row_iq4_xs;
    default: return NULL;
    }
}

static inline mf_quantize_row_fn mf_quantize_row_for(int dt)
{
    switch (dt) {
    case CK_DT_FP32: return mf_quantize_row_fp32;
    case CK_DT_FP16: return mf_quantize_row_fp16;
    case CK_DT_BF16: return mf_quantize_row_bf16;
    case CK_DT_Q4_0: return mf_quantize_row_q4_0;
    case CK_DT_Q4_1: return mf_quantize_row_q4_1;
    case CK_DT_Q5_0: return mf_quantize_row_q5_0;
    case CK_DT_Q5_1: return mf_quantize_row_q5_1;
    case CK_DT_Q8_0: return mf_quantize_row_q8_0;
    case CK_DT_Q4_K: return mf_quantize_row_q4_K;
    case CK_DT_Q5_K: return mf_quantize_row_q5_K;
    case CK_DT_Q6_K: return mf_quantize_row_q6_K;
    case CK_DT_Q2_K: return mf_quantize_row_q2_K;
    case CK_DT_Q3_K: return mf_quantize_row_q3_K;
    case CK_DT_IQ4_NL: return mf_quantize_row_iq4_nl;
    case CK_DT_IQ4_XS: return mf_quantize_row_iq4_xs;
    default: return NULL;
    }
}

static inline mf_dot_f32_fn mf_dot_f32_for(int dt)
{
    switch (dt) {
    case CK_DT_FP32: return mf_dot_fp32_f32;
    case CK_DT_FP16: return mf_dot_fp16_f32;
    case CK_DT_BF16: return mf_dot_bf16_f32;
    case CK_DT_Q4_0: return mf_dot_q4_0_f32;
    case CK_DT_Q4_1: return mf_dot_q4_1_f32;
    case CK_DT_Q5_0: return mf_dot_q5_0_f32;
    case CK_DT_Q5_1: return mf_dot_q5_1_f32;
    case CK_DT_Q8_0: return mf_dot_q8_0_f32;
    case CK_DT_Q4_K: return mf_dot_q4_K_f32;
    case CK_DT_Q5_K: return mf_dot_q5_K_f32;
    case CK_DT_Q6_K: return mf_dot_q6_K_f32;
    case CK_DT_Q2_K: return mf_dot_q2_K_f32;
    case CK_DT_Q3_K: return mf_dot_q3_K_f32;
    case CK_DT_IQ4_NL: return mf_dot_iq4_nl_f32;
    case CK_DT_IQ4_XS: return mf_dot_iq4_xs_f32;
    default: return NULL;
    }
}

/* The dot of the int8 path.  For the float formats the "quantized activations" are the float32
 * activations themselves (mf_quantize_activation_row copies them), so one call sequence serves
 * every weight format. */
static inline mf_dot_q8_fn mf_dot_q8_for(int dt)
{
    switch (dt) {
    case CK_DT_FP32: return (mf_dot_q8_fn)(void (*)(void))mf_dot_fp32_f32;
    case CK_DT_FP16: return (mf_dot_q8_fn)(void (*)(void))mf_dot_fp16_f32;
    case CK_DT_BF16: return (mf_dot_q8_fn)(void (*)(void))mf_dot_bf16_f32;
    case CK_DT_Q4_0: return mf_dot_q4_0_q8_0;
    case CK_DT_Q4_1: return mf_dot_q4_1_q8_0;
    case CK_DT_Q5_0: return mf_dot_q5_0_q8_0;
    case CK_DT_Q5_1: return mf_dot_q5_1_q8_0;
    case CK_DT_Q8_0: return mf_dot_q8_0_q8_0;
    case CK_DT_Q4_K: return mf_dot_q4_K_q8_K;
    case CK_DT_Q5_K: return mf_dot_q5_K_q8_K;
    case CK_DT_Q6_K: return mf_dot_q6_K_q8_K;
    case CK_DT_Q2_K: return mf_dot_q2_K_q8_K;
    case CK_DT_Q3_K: return mf_dot_q3_K_q8_K;
    case CK_DT_IQ4_NL: return mf_dot_iq4_nl_q8_0;
    case CK_DT_IQ4_XS: return mf_dot_iq4_xs_q8_K;
    default: return NULL;
    }
}

/* The activation format the int8 path pairs with weights of dt, as llama.cpp pairs them: Q8_0 for
 * the 32-weight block formats (IQ4_NL included), Q8_K for the 256-weight ones (the K-quants and
 * IQ4_XS), FP32 (no quantization) for the float formats; -1 otherwise.
 * dt may also be an activation format itself (Q8_0, Q8_K), which maps to itself. */
static inline int mf_activation_dtype(int dt)
{
    switch (dt) {
    case CK_DT_Q4_0: case CK_DT_Q4_1: case CK_DT_Q5_0: case CK_DT_Q5_1: case CK_DT_Q8_0:
    case CK_DT_IQ4_NL:
        return CK_DT_Q8_0;
    case CK_DT_Q4_K: case CK_DT_Q5_K: case CK_DT_Q6_K: case CK_DT_Q8_K: case CK_DT_Q2_K:
    case CK_DT_Q3_K: case CK_DT_IQ4_XS:
        return CK_DT_Q8_K;
    case CK_DT_FP32: case CK_DT_FP16: case CK_DT_BF16:
        return CK_DT_FP32;
    default:
        return -1;
    }
}

/* Bytes of one activation row of n values for weights of dt (0 for a non-weight dt): the Q8_0 /
 * Q8_K activation rows of mf_act_layout.h, n float32 for the float formats. */
static inline size_t mf_activation_row_bytes(int dt, size_t n)
{
    switch (mf_activation_dtype(dt)) {
    case CK_DT_Q8_0: return mf_act_q8_0_row_bytes(n);
    case CK_DT_Q8_K: return mf_act_q8_K_row_bytes(n);
    case CK_DT_FP32: return n * sizeof(float);
    default: return 0;
    }
}

/* x[n] -> the activation row for weights of dt, mf_activation_row_bytes(dt, n) bytes at a. */
static inline void mf_quantize_activation_row(const float *MF_RESTRICT x, void *MF_RESTRICT a,
                                              ptrdiff_t n, int dt)
{
    switch (mf_activation_dtype(dt)) {
    case CK_DT_Q8_0: mf_quantize_row_q8_0_act(x, a, n); break;
    case CK_DT_Q8_K: mf_quantize_row_q8_K(x, a, n); break;
    case CK_DT_FP32: memcpy(a, x, (size_t)n * sizeof(float)); break;
    default: break;
    }
}

static inline void mf_dequantize_row(const void *w, float *y, ptrdiff_t n, int dt)
{
    mf_dequantize_row_fn f = mf_dequantize_row_for(dt);
    if (f != NULL)
        f(w, y, n);
}

static inline void mf_quantize_row(const float *x, void *w, ptrdiff_t n, int dt)
{
    mf_quantize_row_fn f = mf_quantize_row_for(dt);
    if (f != NULL)
        f(x, w, n);
}

/* sum_i w_i x_i of one weight row (NaN for a dt that is not a weight format). */
static inline float mf_weight_row_dot_f32(const void *w, int dt, const float *x, ptrdiff_t n)
{
    mf_dot_f32_fn f = mf_dot_f32_for(dt);
    return f != NULL ? f(w, x, n) : NAN;
}

/* The int8 path's dot of one weight row with an activation row from mf_quantize_activation_row. */
static inline float mf_weight_row_dot_q8(const void *w, int dt, const void *a, ptrdiff_t n)
{
    mf_dot_q8_fn f = mf_dot_q8_for(dt);
    return f != NULL ? f(w, a, n) : NAN;
}

#endif /* MEGAFUSE_MF_FORMAT_DISPATCH_H */
