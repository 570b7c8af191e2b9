/*
 * ckernel_dtype.h -- the data types of megafuse's weights and activations.
 *
 * The enum values are upstream's (C-Kernel-Engine); the block layouts behind the GGML formats are
 * in megafuse/ggml_blocks.h, and the sizes below come from them (QK*, sizeof(block_*)), whose
 * byte counts ggml_blocks.h checks against GGML's.  Block formats hold `ck_dtype_block_size(dt)`
 * weights in `ck_dtype_block_bytes(dt)` bytes; a row of C weights (C a multiple of the block size)
 * holds `ck_dtype_row_bytes(dt, C)` bytes.
 */
#ifndef CKERNEL_DTYPE_H
#define CKERNEL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "ggml_blocks.h"

typedef enum {
    CK_DT_FP32 = 0,
    CK_DT_BF16 = 1,
    CK_DT_FP16 = 2,
    CK_DT_INT8 = 3,   /* no scales: not a weight format */
    CK_DT_INT4 = 4,   /* no scales: not a weight format */
    CK_DT_Q4_0 = 5,
    CK_DT_Q4_1 = 6,
    CK_DT_Q4_K = 7,
    CK_DT_Q6_K = 8,
    CK_DT_Q8_0 = 9,
    CK_DT_Q8_K = 10,  /* activation format of the K-quant integer dot products */
    CK_DT_Q5_0 = 11,
    CK_DT_Q5_1 = 12,
    CK_DT_Q5_K = 13,
    /* megafuse's own values from here (upstream's enum ends at Q5_K: docs/contract.md §2) */
    CK_DT_Q2_K = 14,
    CK_DT_Q3_K = 15,
    CK_DT_IQ4_NL = 16,
    CK_DT_IQ4_XS = 17,
    CK_DT_COUNT = 18
} CKDataType;

typedef uint32_t CKDataTypeMask;

#define CK_DT_MASK(dt) (1u << (uint32_t)(dt))

/* Every dtype a `const void *w, CKDataType w_dt` argument accepts (docs/contract.md §2). */
#define CK_DT_WEIGHT_FORMATS                                                                   \
    (CK_DT_MASK(CK_DT_FP32) | CK_DT_MASK(CK_DT_BF16) | CK_DT_MASK(CK_DT_FP16) |                \
     CK_DT_MASK(CK_DT_Q4_0) | CK_DT_MASK(CK_DT_Q4_1) | CK_DT_MASK(CK_DT_Q5_0) |                \
     CK_DT_MASK(CK_DT_Q5_1) | CK_DT_MASK(CK_DT_Q8_0) | CK_DT_MASK(CK_DT_Q4_K) |                \
     CK_DT_MASK(CK_DT_Q5_K) | CK_DT_MASK(CK_DT_Q6_K) | CK_DT_MASK(CK_DT_Q2_K) |                \
     CK_DT_MASK(CK_DT_Q3_K) | CK_DT_MASK(CK_DT_IQ4_NL) | CK_DT_MASK(CK_DT_IQ4_XS))

/* 1 for the block formats (scales inside each block), 0 for the plain element types. */
static inline int ck_dtype_is_quantized(CKDataType dt)
{
    switch (dt) {
    case CK_DT_Q4_0: case CK_DT_Q4_1: case CK_DT_Q5_0: case CK_DT_Q5_1: case CK_DT_Q8_0:
    case CK_DT_Q4_K: case CK_DT_Q5_K: case CK_DT_Q6_K: case CK_DT_Q8_K: case CK_DT_Q2_K:
    case CK_DT_Q3_K: case CK_DT_IQ4_NL: case CK_DT_IQ4_XS:
        return 1;
    default:
        return 0;
    }
}

/* Bytes of one storage element: 4 / 2 / 1 for the plain types; 1 (a byte of a uint8 array)
 * for the block formats and INT4 (two weights a byte). 0 for a value outside the enum. */
static inline size_t ck_dtype_bytes(CKDataType dt)
{
    switch (dt) {
    case CK_DT_FP32: return sizeof(float);
    case CK_DT_BF16: return sizeof(mf_bf16_t);
    case CK_DT_FP16: return sizeof(mf_fp16_t);
    case CK_DT_INT8: case CK_DT_INT4: return 1;
    default: return ck_dtype_is_quantized(dt) ? 1 : 0;
    }
}

/* Weights a block: 32 or 256 for the block formats, 2 for INT4 (a byte), else 1. */
static inline size_t ck_dtype_block_size(CKDataType dt)
{
    switch (dt) {
    case CK_DT_Q4_0: return QK4_0;
    case CK_DT_Q4_1: return QK4_1;
    case CK_DT_Q5_0: return QK5_0;
    case CK_DT_Q5_1: return QK5_1;
    case CK_DT_Q8_0: return QK8_0;
    case CK_DT_IQ4_NL: return QK4_NL;
    case CK_DT_Q4_K: case CK_DT_Q5_K: case CK_DT_Q6_K: case CK_DT_Q8_K: case CK_DT_Q2_K:
    case CK_DT_Q3_K: case CK_DT_IQ4_XS:
        return QK_K;
    case CK_DT_INT4:
        return 2;
    default:
        return 1;
    }
}

/* Bytes a block (the block structs of ggml_blocks.h); for the plain types, bytes an element. */
static inline size_t ck_dtype_block_bytes(CKDataType dt)
{
    switch (dt) {
    case CK_DT_Q4_0: return sizeof(block_q4_0);
    case CK_DT_Q4_1: return sizeof(block_q4_1);
    case CK_DT_Q5_0: return sizeof(block_q5_0);
    case CK_DT_Q5_1: return sizeof(block_q5_1);
    case CK_DT_Q8_0: return sizeof(block_q8_0);
    case CK_DT_Q4_K: return sizeof(block_q4_K);
    case CK_DT_Q5_K: return sizeof(block_q5_K);
    case CK_DT_Q6_K: return sizeof(block_q6_K);
    case CK_DT_Q8_K: return sizeof(block_q8_K);
    case CK_DT_Q2_K: return sizeof(block_q2_K);
    case CK_DT_Q3_K: return sizeof(block_q3_K);
    case CK_DT_IQ4_NL: return sizeof(block_iq4_nl);
    case CK_DT_IQ4_XS: return sizeof(block_iq4_xs);
    case CK_DT_INT4: return 1;
    default: return ck_dtype_bytes(dt);
    }
}

/* Bytes of a row of n_elements (rounded up to whole blocks; callers pass multiples). */
static inline size_t ck_dtype_row_bytes(CKDataType dt, size_t n_elements)
{
    size_t block = ck_dtype_block_size(dt);
    return (n_elements + block - 1) / block * ck_dtype_block_bytes(dt);
}

static inline int ck_dtype_supported(CKDataTypeMask mask, CKDataType dt)
{
    return (unsigned)dt < (unsigned)CK_DT_COUNT && (mask & CK_DT_MASK(dt)) != 0;
}

#endif /* CKERNEL_DTYPE_H */
