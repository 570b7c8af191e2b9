/*
 * ggml_blocks.h -- GGML's block formats, byte for byte, and exact fp16 / bf16 conversions.
 *
 * A quantized row of n weights is n / QK consecutive blocks (QK = 32 for Q4_0 ... Q8_0 and
 * IQ4_NL, QK_K = 256 for the K-quants, IQ4_XS and Q8_K).  The struct layouts are GGML's
 * (ggml-common.h); every multi-byte field is little-endian, as GGUF stores it.  The structs are
 * declared with 1-byte packing: GGML's layouts have no padding anyway (the sizes are checked
 * below), and packing makes a block at any address legal to read -- a uint8 NumPy array or a
 * GGUF memmap carries no alignment promise.
 *
 * Conversions (scalar, exact, the same bits as NumPy's float16 casts that gguf relies on):
 *   mf_fp16_to_fp32  every half is exactly representable; NaN payloads are kept (no quieting)
 *   mf_fp32_to_fp16  IEEE round to nearest, ties to even, subnormals included; >= 65520 -> Inf;
 *                    NaN keeps the top 10 payload bits (a payload that would vanish becomes 1)
 *   mf_bf16_to_fp32  bits << 16
 *   mf_fp32_to_bf16  round to nearest even; NaN -> quiet NaN (GGML's ggml_compute_fp32_to_bf16)
 * mf_fp16_to_fp32_lanes is mf_fp16_to_fp32 without branches (for loops that vectorise); the
 * vector versions (F16C etc.) live in mf_dequant.h, mf_weight_quant.h and mf_quant_common.h;
 * all are tested to give these bits.
 */
#ifndef MEGAFUSE_GGML_BLOCKS_H
#define MEGAFUSE_GGML_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- compile-time checks that work in C89/C99/C11 and C++ ---------------------------------- */
#if defined(__cplusplus) && __cplusplus >= 201103L
#  define MF_STATIC_ASSERT(cond, name) static_assert(cond, #name)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#  define MF_STATIC_ASSERT(cond, name) _Static_assert(cond, #name)
#else
#  define MF_STATIC_ASSERT(cond, name) typedef char mf_static_assert_##name[(cond) ? 1 : -1]
#endif

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK4_NL 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t mf_fp16_t;   /* IEEE binary16 bits */
typedef uint16_t mf_bf16_t;   /* bfloat16 bits: the top half of a float32 */

#pragma pack(push, 1)

/* x = d * (q - 8), q the 4-bit value; qs[j] holds weight j (low nibble) and j + 16 (high). */
typedef struct {
    mf_fp16_t d;               /* scale */
    uint8_t qs[QK4_0 / 2];     /* nibbles */
} block_q4_0;

/* x = d * q + m */
typedef struct {
    mf_fp16_t d;               /* scale */
    mf_fp16_t m;               /* min */
    uint8_t qs[QK4_1 / 2];     /* nibbles, as Q4_0 */
} block_q4_1;

/* x = d * (q - 16), q = nibble | (bit j of qh) << 4 */
typedef struct {
    mf_fp16_t d;               /* scale */
    uint8_t qh[4];             /* 5th bits, a little-endian uint32: bit j -> weight j */
    uint8_t qs[QK5_0 / 2];     /* nibbles, as Q4_0 */
} block_q5_0;

/* x = d * q + m, q = nibble | (bit j of qh) << 4 */
typedef struct {
    mf_fp16_t d;               /* scale */
    mf_fp16_t m;               /* min */
    uint8_t qh[4];             /* 5th bits */
    uint8_t qs[QK5_1 / 2];     /* nibbles */
} block_q5_1;

/* x = d * q (also the activation format of the 32-weight integer dot products) */
typedef struct {
    mf_fp16_t d;               /* scale */
    int8_t qs[QK8_0];          /* quants */
} block_q8_0;

/* 8 sub-blocks of 32: x = (d * sc[j]) * q - (dmin * m[j]), sc and m 6-bit (see get_scale_min_k4).
 * qs: 4 chunks of 32 bytes; chunk c holds sub-block 2c in its low nibbles, 2c+1 in its high. */
typedef struct {
    mf_fp16_t d;               /* super-block scale of the scales */
    mf_fp16_t dmin;            /* super-block scale of the mins */
    uint8_t scales[K_SCALE_SIZE]; /* 8 scales and 8 mins, 6 bits each */
    uint8_t qs[QK_K / 2];      /* nibbles */
} block_q4_K;

/* As Q4_K plus a 5th bit: in chunk c, low nibble l gets bit 2c of qh[l], high nibble bit 2c+1. */
typedef struct {
    mf_fp16_t d;
    mf_fp16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];      /* 5th bits */
    uint8_t qs[QK_K / 2];      /* nibbles */
} block_q5_K;

/* 16 sub-blocks of 16: x = (d * scales[j]) * (q - 32), q 6-bit (4 low bits in ql, 2 in qh). */
typedef struct {
    uint8_t ql[QK_K / 2];      /* low 4 bits */
    uint8_t qh[QK_K / 4];      /* high 2 bits */
    int8_t scales[QK_K / 16];  /* 8-bit scales */
    mf_fp16_t d;               /* super-block scale */
} block_q6_K;

/* 16 sub-blocks of 16: x = (d * sc) * q - (dmin * m), q 2-bit, sc and m 4-bit (scales[j]: sc in
 * the low nibble, m in the high).  qs: 2 halves of 32 bytes; in half h, bits 2k..2k+1 of byte l
 * are weight 128h + 32k + l (sub-block 8h + 2k for l < 16, 8h + 2k + 1 after). */
typedef struct {
    uint8_t scales[QK_K / 16]; /* scales and mins, 4 bits each */
    uint8_t qs[QK_K / 4];      /* 2-bit codes */
    mf_fp16_t d;               /* super-block scale of the scales */
    mf_fp16_t dmin;            /* super-block scale of the mins */
} block_q2_K;

/* 16 sub-blocks of 16: x = (d * (sc - 32)) * (q - 4 + 4 h), q 2-bit as in Q2_K's qs, h bit k of
 * hmask[l] for weight 32k + l (k = 0..7), sc 6-bit (mf_q3k_scales). */
typedef struct {
    uint8_t hmask[QK_K / 8];   /* the third bits */
    uint8_t qs[QK_K / 4];      /* the low 2 bits */
    uint8_t scales[12];        /* 16 scales, 6 bits each */
    mf_fp16_t d;               /* super-block scale */
} block_q3_K;

/* x = d * kvalues_iq4nl[q], q 4-bit: qs[j] holds weight j (low nibble) and j + 16 (high). */
typedef struct {
    mf_fp16_t d;               /* scale */
    uint8_t qs[QK4_NL / 2];    /* indices into the value table */
} block_iq4_nl;

/* 8 sub-blocks of 32: x = (d * (ls - 32)) * kvalues_iq4nl[q], ls 6-bit (mf_iq4xs_scale); qs[16j
 * + l] holds weight 32j + l (low nibble) and 32j + 16 + l (high). */
typedef struct {
    mf_fp16_t d;               /* super-block scale */
    uint16_t scales_h;         /* the top 2 bits of each ls, 2 a sub-block */
    uint8_t scales_l[QK_K / 64];  /* the low 4 bits of each ls, 2 a byte */
    uint8_t qs[QK_K / 2];      /* indices into the value table */
} block_iq4_xs;

/* Activations of the K-quant integer dot products: x = d * q (d float32, not fp16). */
typedef struct {
    float d;                   /* scale */
    int8_t qs[QK_K];           /* quants */
    int16_t bsums[QK_K / 16];  /* sum of qs over each group of 16 */
} block_q8_K;

#pragma pack(pop)

MF_STATIC_ASSERT(sizeof(block_q4_0) == 18, block_q4_0_is_18_bytes);
MF_STATIC_ASSERT(sizeof(block_q4_1) == 20, block_q4_1_is_20_bytes);
MF_STATIC_ASSERT(sizeof(block_q5_0) == 22, block_q5_0_is_22_bytes);
MF_STATIC_ASSERT(sizeof(block_q5_1) == 24, block_q5_1_is_24_bytes);
MF_STATIC_ASSERT(sizeof(block_q8_0) == 34, block_q8_0_is_34_bytes);
MF_STATIC_ASSERT(sizeof(block_q4_K) == 144, block_q4_K_is_144_bytes);
MF_STATIC_ASSERT(sizeof(block_q5_K) == 176, block_q5_K_is_176_bytes);
MF_STATIC_ASSERT(sizeof(block_q6_K) == 210, block_q6_K_is_210_bytes);
MF_STATIC_ASSERT(sizeof(block_q8_K) == 292, block_q8_K_is_292_bytes);
MF_STATIC_ASSERT(sizeof(block_q2_K) == 84, block_q2_K_is_84_bytes);
MF_STATIC_ASSERT(sizeof(block_q3_K) == 110, block_q3_K_is_110_bytes);
MF_STATIC_ASSERT(sizeof(block_iq4_nl) == 18, block_iq4_nl_is_18_bytes);
MF_STATIC_ASSERT(sizeof(block_iq4_xs) == 136, block_iq4_xs_is_136_bytes);
MF_STATIC_ASSERT(sizeof(float) == 4, float_is_binary32);

/* ---- bit casts ------------------------------------------------------------------------------ */
#define MF_F32_DEFAULT_NAN_BITS 0x7fc00000u   /* x86's and NumPy's default NaN (quiet) */

static inline uint32_t mf_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float mf_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- fp16 <-> fp32 -------------------------------------------------------------------------- */
static inline float mf_fp16_to_fp32(mf_fp16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = (uint32_t)h & 0x7fffu;          /* exponent and mantissa */
    uint32_t bits;
    if (em >= 0x7c00u)                            /* Inf, NaN: payload kept */
        bits = (em << 13) | 0x7f800000u;
    else if (em >= 0x0400u)                       /* normal: rebias the exponent by 127 - 15 */
        bits = (em << 13) + 0x38000000u;
    else                                          /* subnormal or zero: em * 2^-24, exact */
        bits = mf_f32_bits((float)em * 5.9604644775390625e-08f);
    return mf_bits_f32(sign | bits);
}

/* The same bits without branches (masks only), for loops the compiler should vectorise. */
static inline float mf_fp16_to_fp32_lanes(mf_fp16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = (uint32_t)h & 0x7fffu;
    uint32_t special = (em << 13) | 0x7f800000u;
    uint32_t normal = (em << 13) + 0x38000000u;
    uint32_t small = mf_f32_bits((float)(int32_t)em * 5.9604644775390625e-08f);
    uint32_t is_special = 0u - (uint32_t)(em >= 0x7c00u);      /* all ones or zero */
    uint32_t is_normal = 0u - (uint32_t)(em >= 0x0400u);
    uint32_t bits = (special & is_special) | (normal & is_normal & ~is_special) | (small & ~is_normal);
    return mf_bits_f32(sign | bits);
}

static inline mf_fp16_t mf_fp32_to_fp16(float f)
{
    uint32_t x = mf_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {                       /* NaN: keep the top payload bits, stay NaN */
        uint32_t m = (ax & 0x007fffffu) >> 13;
        return (mf_fp16_t)(sign | 0x7c00u | (m ? m : 1u));
    }
    if (ax >= 0x477ff000u)                        /* >= 65520 (incl. Inf): rounds to Inf */
        return (mf_fp16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) {                      /* normal half: round at bit 13, ties to even */
        uint32_t r = ax + 0x00000fffu + ((ax >> 13) & 1u);
        return (mf_fp16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    if (ax <= 0x33000000u)                        /* <= 2^-25 (a tie with 0 at 2^-25): zero */
        return (mf_fp16_t)sign;
    {                                             /* subnormal half, in units of 2^-24 */
        uint32_t e = ax >> 23;                    /* 102..112 */
        uint32_t m = (ax & 0x007fffffu) | 0x00800000u;
        uint32_t shift = 126u - e;                /* value = m * 2^(e-150) = (m >> shift) units */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
        return (mf_fp16_t)(sign | q);
    }
}

/* ---- bf16 <-> fp32 -------------------------------------------------------------------------- */
static inline float mf_bf16_to_fp32(mf_bf16_t h)
{
    return mf_bits_f32((uint32_t)h << 16);
}

static inline mf_bf16_t mf_fp32_to_bf16(float f)
{
    uint32_t x = mf_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)          /* NaN: force quiet */
        return (mf_bf16_t)((x >> 16) | 0x40u);
    return (mf_bf16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---- K-quant scale packing (GGML's get_scale_min_k4) ---------------------------------------- */
/* Sub-block j (0..7) of a Q4_K/Q5_K super-block: its 6-bit scale *sc and min *m. */
static inline void mf_get_scale_min_k4(int j, const uint8_t *q /* [12] */, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = (uint8_t)(q[j] & 63);
        *m = (uint8_t)(q[j + 4] & 63);
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---- Q3_K scales, IQ4_NL / IQ4_XS values ---------------------------------------------------- */
/* The 16 6-bit scales of a Q3_K super-block (0..63; the weight's factor is sc - 32): sub-block j
 * keeps its low 4 bits in the low (j < 8) or high (j >= 8) nibble of scales[j % 8], its top 2
 * bits in bits 2(j / 4) .. 2(j / 4) + 1 of scales[8 + j % 4]. */
static inline void mf_q3k_scales(const uint8_t *scales /* [12] */, uint8_t sc[16])
{
    /* four scales a 32-bit word: bytes j .. j+3 of scales[0..3] and scales[4..7] hold the low
     * nibbles of scales 0..7 (and the high nibbles of 8..15), scales[8..11] the top bits */
    const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    uint32_t a, b, t, out[4];
    memcpy(&a, scales, 4);
    memcpy(&b, scales + 4, 4);
    memcpy(&t, scales + 8, 4);
    out[0] = (a & m4) | ((t & m2) << 4);
    out[1] = (b & m4) | (((t >> 2) & m2) << 4);
    out[2] = ((a >> 4) & m4) | (((t >> 4) & m2) << 4);
    out[3] = ((b >> 4) & m4) | (((t >> 6) & m2) << 4);
    memcpy(sc, out, 16);
}

/* The 6-bit scale ls (0..63; the factor is ls - 32) of sub-block j (0..7) of an IQ4_XS block. */
static inline int mf_iq4xs_scale(const uint8_t *scales_l /* [4] */, uint16_t scales_h, int j)
{
    return ((scales_l[j / 2] >> (4 * (j % 2))) & 0x0F) | (((scales_h >> (2 * j)) & 3) << 4);
}

/* The 16 values of a 4-bit index of IQ4_NL and IQ4_XS (GGML's kvalues_iq4nl). */
static const int8_t mf_kvalues_iq4nl[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

#ifdef __cplusplus
}
#endif

#endif /* MEGAFUSE_GGML_BLOCKS_H */
