/*
 * mf_attention.h -- causal flash attention for a block of up to 16 query rows of one head, built
 * on the GEMM register blocks of mf_gemm.h (prefill's attention).
 *
 * The block's queries are packed once into a panel Qp [D][16] (or [D][8] for up to 8 queries:
 * decode's heads of a kv group); then, KV tile by KV tile:
 *   S^T [n][16] = K_tile . Qp            (mf_gemm_panel_f32: keys as the rows of x, 6 at a time;
 *                                         up to 4 queries: keys in lanes, mf__scores_keys_in_lanes)
 *   scale, causal mask, online softmax   (16 queries side by side: vector max / exp / sums)
 *   out[i] = out[i] * alpha_i + P^T[:, i] . V_tile    (mf_gemm_xt_f32: V rows used in place)
 * No hsum anywhere, no score array longer than one KV tile, one normalisation at the end.
 *
 * Each query's result is one fixed sequence of operations over the KV tiles (its column of every
 * product is computed independently of the other 15): results do not depend on threads, nor on
 * which other queries share its block.
 */
#ifndef MEGAFUSE_MF_ATTENTION_H
#define MEGAFUSE_MF_ATTENTION_H

#include <math.h>
#include <string.h>
#include <stdint.h>
#include <stddef.h>
#include "megafuse/mf_gemm.h"

#define MF_ATT_QUERIES 16        /* query rows of a block (one panel of queries) */
#define MF_ATT_MAX_HEAD_DIM 256  /* head_dim this kernel takes (the panel lives on the stack) */
#define MF_ATT_MAX_KV_TILE 256   /* KV tile this kernel takes (MF_MAX_KV_TILE) */
#define MF_ATT_F16_TILE_FLOATS 16384   /* a float16 cache's tile, converted: keys x Da at most */

/*
 * What a layer adds to causal attention (a NULL pointer, or zeros: none of it).
 *   softcap > 0: a scaled score s becomes softcap * tanh(s / softcap) (Gemma 2's logit capping);
 *   window > 0:  a row at position p sees keys p - window < k <= p only (sliding-window layers);
 *   ring > 0:    key k's K and V rows are row k % ring of the cache (a cache that keeps only the
 *                last `ring` positions: a sliding-window layer's, ring >= window + the rows one
 *                call writes).
 */
typedef struct {
    float softcap;
    ptrdiff_t window;
    ptrdiff_t ring;
} mf_att_opts;

/* s[i] = exp(s[i] - m[i]); sum[i] += s[i] for i < W (8 or 16). */
MF_ALWAYS_INLINE void mf__exp_sub_acc(const int W, float *s, const float *m, float *sum)
{
#if defined(__AVX2__) && defined(__FMA__)
    for (int h = 0; h < W; h += 8) {
        __m256 p = mf_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + h), _mm256_loadu_ps(m + h)));
        _mm256_storeu_ps(s + h, p);
        _mm256_storeu_ps(sum + h, _mm256_add_ps(_mm256_loadu_ps(sum + h), p));
    }
#elif defined(MF_SIMD_NEON)
    for (int h = 0; h < W; h += 4) {
        const float32x4_t p = mf_neon_exp(vsubq_f32(vld1q_f32(s + h), vld1q_f32(m + h)));
        vst1q_f32(s + h, p);
        vst1q_f32(sum + h, vaddq_f32(vld1q_f32(sum + h), p));
    }
#else
    for (int i = 0; i < W; i++) {
        s[i] = expf(s[i] - m[i]);
        sum[i] += s[i];
    }
#endif
}

#if defined(MF_GEMM_AVX2)
/* r[d] = {r0[d], r1[d], ..., r7[d]}: an 8 x 8 transpose in registers (24 shuffles). */
MF_ALWAYS_INLINE void mf__transpose8x8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/*
 * Decode's scores with the keys in lanes, for NQ (1..4) queries: the 8-wide panel puts the
 * queries in lanes, so for 3-4 query heads a kv group (SmolLM2, Llama-3) half its FMAs or more
 * compute copies.  Here 8 * NK keys (16 or 32) are transposed 8 dims at a time into kt, and each
 * dim is one FMA per (query, 8 keys):
 *     st[j * 8 + i] = sum_d k[j * ldk + d] * qp[d * 8 + i]    j < 8 * NK, i < 8
 * one chain in d order from 0 per (key, query) -- the chain of mf_gemm_panel8_f32, so the same
 * bits; lanes i >= NQ repeat query NQ - 1, as the panel's copies do.  NQ x NK accumulators
 * (6-8) keep both FMA pipes busy.
 */
MF_ALWAYS_INLINE void mf__scores_keys_in_lanes(const int NQ, const int NK, const float *k,
                                               ptrdiff_t ldk, const float *qp, ptrdiff_t D,
                                               float *st)
{
    MF_ALIGNED(32) float kt[8][32];          /* [dim of the chunk][key]: 8 dims of 8 * NK keys */
    __m256 acc[4][4];                        /* [query][8 keys] */
    MF__UNROLL
    for (int i = 0; i < NQ; i++)
        MF__UNROLL
        for (int h = 0; h < NK; h++)
            acc[i][h] = _mm256_setzero_ps();
    for (ptrdiff_t d0 = 0; d0 < D; d0 += 8) {
        const int nd = D - d0 < 8 ? (int)(D - d0) : 8;
        MF__UNROLL
        for (int h = 0; h < NK; h++) {
            if (nd == 8) {
                __m256 r[8];
                MF__UNROLL
                for (int j = 0; j < 8; j++)
                    r[j] = _mm256_loadu_ps(k + (8 * h + j) * ldk + d0);
                mf__transpose8x8(r);
                MF__UNROLL
                for (int d = 0; d < 8; d++)
                    _mm256_store_ps(kt[d] + 8 * h, r[d]);
            } else {                          /* the last dims of a head_dim not a multiple of 8 */
                for (int d = 0; d < nd; d++)
                    for (int j = 0; j < 8; j++)
                        kt[d][8 * h + j] = k[(8 * h + j) * ldk + d0 + d];
            }
        }
        for (int d = 0; d < nd; d++) {
            __m256 kv[4];
            MF__UNROLL
            for (int h = 0; h < NK; h++)
                kv[h] = _mm256_load_ps(kt[d] + 8 * h);
            MF__UNROLL
            for (int i = 0; i < NQ; i++) {
                const __m256 qb = _mm256_broadcast_ss(qp + (d0 + d) * 8 + i);
                MF__UNROLL
                for (int h = 0; h < NK; h++)
                    acc[i][h] = _mm256_fmadd_ps(kv[h], qb, acc[i][h]);
            }
        }
    }
    MF__UNROLL
    for (int h = 0; h < NK; h++) {            /* [query][key] -> st [key][query] */
        __m256 r[8];
        MF__UNROLL
        for (int i = 0; i < 8; i++)
            r[i] = acc[i < NQ ? i : NQ - 1][h];
        mf__transpose8x8(r);
        MF__UNROLL
        for (int j = 0; j < 8; j++)
            _mm256_storeu_ps(st + (8 * h + j) * 8, r[j]);
    }
}

/* The scores of a tile's first keys through mf__scores_keys_in_lanes, as many whole blocks as fit
 * in its n keys (32 keys a block for 1-2 queries, 16 for 3-4); returns the first key left to the
 * panel. */
MF_ALWAYS_INLINE ptrdiff_t mf__scores_few_queries(int nq, const float *k, ptrdiff_t ldk,
                                                  const float *qp, ptrdiff_t D, ptrdiff_t n,
                                                  float *st)
{
    ptrdiff_t j0 = 0;
#define MF__KEYS(NQ, NK)                                                                         \
    for (; j0 + 8 * (NK) <= n; j0 += 8 * (NK))                                                  \
        mf__scores_keys_in_lanes(NQ, NK, k + j0 * ldk, ldk, qp, D, st + j0 * 8)
    switch (nq) {
    case 1: MF__KEYS(1, 4); break;
    case 2: MF__KEYS(2, 4); break;
    case 3: MF__KEYS(3, 2); break;
    default: MF__KEYS(4, 2); break;
    }
#undef MF__KEYS
    return j0;
}
#endif

/*
 * Decode reads each K and V row of a tile once, and a model's weights stream through the caches
 * between one token's visit to a layer's cache and the next, so a decode tile usually comes from
 * DRAM.  The tile's own order of reads (a column of 8 dims of 16 keys at a time for the scores, a
 * 16-dim column of every key for P.V) is not one the hardware prefetchers follow, and software
 * prefetch instructions did not help.  So a decode tile is first read in address order, one
 * 4-byte load a cache line of K and of V: it comes in at the rate of a sequential read, and the
 * scores and P.V find it in L1/L2; a tile already in L2/L3 pays the touch as a small share of its
 * attention time.  The loads are scalar, so the vector pipes keep the arithmetic; 4 bytes, so no
 * load passes the tile's last byte.  A float16 tile is touched the same way before it is
 * converted: the conversion alone reads it no faster than the scores would.  (The measurements:
 * benchmarks/README.md, "Measurements moved from code comments".)
 */
static inline void mf__touch_tile(const void *k, const void *v, ptrdiff_t bytes)
{
    const char *kb = (const char *)k, *vb = (const char *)v;
    uint32_t any = 0;
    for (ptrdiff_t o = 0; o < bytes; o += 64) {
        uint32_t a, b;
        memcpy(&a, kb + o, sizeof a);
        memcpy(&b, vb + o, sizeof b);
        any |= a | b;
    }
#if defined(__GNUC__)
    __asm__ volatile("" : : "r"(any));        /* the loads are the point: keep them */
#else
    {
        volatile uint32_t sink = any;
        (void)sink;
    }
#endif
}

/* y[i] = float16 bits h[i] as float32, i < n (IEEE binary16: every value exact in float32). */
static inline void mf__f16_to_f32(const uint16_t *h, float *y, ptrdiff_t n)
{
    ptrdiff_t i = 0;
#if defined(MF_SIMD_AVX512)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#endif
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(h + i))));
#elif defined(MF_SIMD_NEON)       /* fcvtl: a signalling NaN comes out quiet, as with F16C */
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
#endif
    for (; i < n; i++) {
        const uint32_t sign = (uint32_t)(h[i] & 0x8000u) << 16, e = (h[i] >> 10) & 0x1fu;
        uint32_t m = h[i] & 0x3ffu, bits;
        if (e == 0x1f) {                          /* inf / NaN (payload kept, quiet bit as is) */
            bits = sign | 0x7f800000u | m << 13;
        } else if (e != 0) {                      /* normal */
            bits = sign | (e + 112) << 23 | m << 13;
        } else if (m == 0) {                      /* +-0 */
            bits = sign;
        } else {                                  /* subnormal: normalise */
            int k = 0;
            while (!(m & 0x400u)) {
                m <<= 1;
                k++;
            }
            bits = sign | (uint32_t)(113 - k) << 23 | (m & 0x3ffu) << 13;
        }
        memcpy(&y[i], &bits, sizeof bits);
    }
}

/*
 * The body of mf_attend_range_f32 for a panel of W queries (W = 16, or 8 when the block has at
 * most 8 rows: decode's query heads of one kv group).  Every query's column goes through the same
 * operations at either width, so the width changes the time, never the result.
 */
MF_ALWAYS_INLINE void mf__attend_range(
    const int W, const float *q, ptrdiff_t ldq, const float *k, const float *v, ptrdiff_t Da,
    ptrdiff_t first_pos, ptrdiff_t pos_step, int nq, ptrdiff_t D, float scale, ptrdiff_t kv_tile,
    ptrdiff_t key_begin, ptrdiff_t key_end, float *out, ptrdiff_t ldo, float *m_out, float *l_out,
    const uint16_t *k16, const uint16_t *v16, float *kt, float *vt, const mf_att_opts *opts)
{
    MF_ALIGNED(64) float qp[MF_ATT_MAX_HEAD_DIM * MF_ATT_QUERIES];   /* [D][W] queries, packed */
    MF_ALIGNED(64) float st[MF_ATT_MAX_KV_TILE * MF_ATT_QUERIES];    /* [n][W] scores, then p */
    float m[MF_ATT_QUERIES], l[MF_ATT_QUERIES], alpha[MF_ATT_QUERIES], tsum[MF_ATT_QUERIES];
    float tmax[MF_ATT_QUERIES], msub[MF_ATT_QUERIES];
    ptrdiff_t pos[MF_ATT_QUERIES];
    const float softcap = opts ? opts->softcap : 0.0f;
    const ptrdiff_t window = opts ? opts->window : 0, ring = opts ? opts->ring : 0;
    const float *rows[MF_ATT_QUERIES];
    ptrdiff_t n_keys = first_pos + (nq - 1) * pos_step + 1;   /* keys the last row sees */
    ptrdiff_t d16 = D / 16 * 16;
    if (n_keys > key_end)
        n_keys = key_end;

    for (int i = 0; i < W; i++) {   /* rows past nq repeat the last (unused) */
        int r = i < nq ? i : nq - 1;
        rows[i] = q + r * ldq;
        pos[i] = first_pos + r * pos_step;
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    if (W == MF_PANEL_ROWS) {
        mf_pack_panel_f32(rows, D, qp);
    } else {
        for (ptrdiff_t d = 0; d < D; d++)
            for (int i = 0; i < W; i++)
                qp[d * W + i] = rows[i][d];
    }
    for (int i = 0; i < nq; i++)
        memset(out + i * ldo, 0, (size_t)Da * sizeof(float));
    /* a window: the tiles before the first row's first visible key are skipped whole (the
     * range's tile grid kept), the keys of the others that a row may not see are masked */
    ptrdiff_t t_first = key_begin, pos_last = first_pos + (nq - 1) * pos_step;
    if (window > 0 && first_pos - window + 1 > key_begin)
        t_first = key_begin + (first_pos - window + 1 - key_begin) / kv_tile * kv_tile;

    for (ptrdiff_t t0 = t_first, n; t0 < n_keys; t0 += n) {
        n = kv_tile < n_keys - t0 ? kv_tile : n_keys - t0;
        ptrdiff_t row = t0;               /* the tile's first K/V row: a ring wraps between tiles */
        if (ring > 0) {
            row = t0 % ring;
            if (n > ring - row)
                n = ring - row;
        }
        const float *kb = k16 ? kt : k + row * Da, *vb = k16 ? vt : v + row * Da;   /* the tile */
        if (k16) {                        /* a float16 cache: the tile converted, in order */
            if (pos_step == 0)            /* decode: read in address order first, as below */
                mf__touch_tile(k16 + row * Da, v16 + row * Da,
                               n * Da * (ptrdiff_t)sizeof(uint16_t));
            mf__f16_to_f32(k16 + row * Da, kt, n * Da);
            mf__f16_to_f32(v16 + row * Da, vt, n * Da);
        } else if (pos_step == 0) {       /* decode: the tile read in address order first */
            mf__touch_tile(kb, vb, n * Da * (ptrdiff_t)sizeof(float));
        }
        /* S^T = K_tile . Qp, 6 keys a register block (12 for the 8-wide panel; up to 4 queries:
         * 16 or 32 keys in lanes first) */
        ptrdiff_t j0 = 0;
#if defined(MF_GEMM_AVX2)
        if (W == 8 && nq <= 4)
            j0 = mf__scores_few_queries(nq, kb, Da, qp, D, n, st);
#endif
        if (W == 8)
            for (; j0 + 12 <= n; j0 += 12)
                mf_gemm_panel8x12_f32(kb + j0 * Da, Da, qp, D, st + j0 * W);
        for (; j0 < n; j0 += MF_GEMM_MR) {
            int mr = (int)(n - j0 < MF_GEMM_MR ? n - j0 : MF_GEMM_MR);
            if (W == MF_PANEL_ROWS)
                mf_gemm_panel_f32(mr, kb + j0 * Da, Da, qp, D, st + j0 * W, 1);
            else
                mf_gemm_panel8_f32(mr, kb + j0 * Da, Da, qp, D, st + j0 * W);
        }
        /* scale (and cap), mask (keys past a row's position, or before its window, weigh
         * nothing), tile max (NaN skipped) */
        int diagonal = t0 + n - 1 > pos[0];
        int early = window > 0 && t0 <= pos_last - window;   /* keys before some row's window */
        float sc = scale;
        if (softcap > 0.0f) {             /* capped scores: s = softcap * tanh(s * scale / cap) */
            for (ptrdiff_t j = 0; j < n * W; j++)
                st[j] = softcap * tanhf(st[j] * scale / softcap);
            sc = 1.0f;
        }
#if defined(__AVX2__) && defined(__FMA__)
        {   /* the same per lane: x = s * sc, -inf where masked, max(x, tmax) */
            __m256 vs = _mm256_set1_ps(sc), ninf = _mm256_set1_ps(-INFINITY);
            for (int h = 0; h < W; h += 8) {
                __m256i vpos = _mm256_set_epi32((int)pos[h + 7], (int)pos[h + 6], (int)pos[h + 5],
                                                (int)pos[h + 4], (int)pos[h + 3], (int)pos[h + 2],
                                                (int)pos[h + 1], (int)pos[h]);
                __m256i vlow = _mm256_sub_epi32(vpos, _mm256_set1_epi32((int)window - 1));
                __m256 vmax = ninf;
                for (ptrdiff_t j = 0; j < n; j++) {
                    float *s = st + j * W + h;
                    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s), vs);
                    __m256i key = _mm256_set1_epi32((int)(t0 + j));
                    if (diagonal) {
                        __m256i past = _mm256_cmpgt_epi32(key, vpos);
                        x = _mm256_blendv_ps(x, ninf, _mm256_castsi256_ps(past));
                    }
                    if (early) {          /* key < pos - window + 1 */
                        __m256i before = _mm256_cmpgt_epi32(vlow, key);
                        x = _mm256_blendv_ps(x, ninf, _mm256_castsi256_ps(before));
                    }
                    _mm256_storeu_ps(s, x);
                    vmax = _mm256_max_ps(x, vmax);    /* x > max ? x : max (a NaN x skipped) */
                }
                _mm256_storeu_ps(tmax + h, vmax);
            }
        }
#else
        for (int i = 0; i < W; i++)
            tmax[i] = -INFINITY;
        for (ptrdiff_t j = 0; j < n; j++) {
            float *s = st + j * W;
            for (int i = 0; i < W; i++) {
                float x = s[i] * sc;
                if ((diagonal && t0 + j > pos[i]) || (early && t0 + j <= pos[i] - window))
                    x = -INFINITY;
                s[i] = x;
                tmax[i] = x > tmax[i] ? x : tmax[i];
            }
        }
#endif
        /* online softmax: new max, the factor the earlier tiles are rescaled by; a row that has
         * seen no key yet (max -inf) takes exp(-inf - 0) = 0 for its masked keys */
        for (int i = 0; i < W; i++) {
            float m_new = m[i] >= tmax[i] ? m[i] : tmax[i];
            alpha[i] = (m_new > m[i] && l[i] != 0.0f) ? expf(m[i] - m_new) : 1.0f;
            m[i] = m_new;
            msub[i] = m_new == -INFINITY ? 0.0f : m_new;
            tsum[i] = 0.0f;
        }
        for (ptrdiff_t j = 0; j < n; j++)
            mf__exp_sub_acc(W, st + j * W, msub, tsum);
        for (int i = 0; i < nq; i++) {
            l[i] = l[i] * alpha[i] + tsum[i];
            if (alpha[i] != 1.0f)
                mf_scale_f32(out + i * ldo, alpha[i], D);
        }
        /* out += P^T . V_tile: 6 queries x 16 dims a register block (32 at avx512), V rows in
         * place */
        ptrdiff_t d0 = 0;
#if defined(MF_SIMD_AVX512)
        for (; d0 + 32 <= d16; d0 += 32)
            for (int i0 = 0; i0 < nq; i0 += MF_GEMM_MR) {
                int mr = nq - i0 < MF_GEMM_MR ? nq - i0 : MF_GEMM_MR;
                mf_gemm_xt32_f32(mr, st + i0, W, vb + d0, Da, n, out + i0 * ldo + d0, ldo);
            }
#endif
        for (; d0 < d16; d0 += 16)
            for (int i0 = 0; i0 < nq; i0 += MF_GEMM_MR) {
                int mr = nq - i0 < MF_GEMM_MR ? nq - i0 : MF_GEMM_MR;
                mf_gemm_xt_f32(mr, st + i0, W, vb + d0, Da, n, out + i0 * ldo + d0, ldo);
            }
        for (int i = 0; i < nq; i++)          /* dims past the last whole 16 */
            for (ptrdiff_t d = d16; d < D; d++) {
                float acc = 0.0f;
                for (ptrdiff_t j = 0; j < n; j++)
                    acc += st[j * W + i] * vb[j * Da + d];
                out[i * ldo + d] += acc;
            }
    }
    if (m_out != NULL) {
        for (int i = 0; i < nq; i++) {
            m_out[i] = m[i];
            l_out[i] = l[i];
        }
        return;
    }
    for (int i = 0; i < nq; i++)
        mf_scale_f32(out + i * ldo, 1.0f / l[i], D);
}

/* One instance of mf__attend_range by panel width (8 queries for up to 8 rows) and by K/V row
 * stride: a constant for the usual head dims (64: Llama-3.2, Qwen2, SmolLM2; 128), so that every
 * K and V address of the register blocks is an immediate offset of one pointer, which removes
 * about a quarter of the instructions a key costs.  CALL(W, DA) is the caller's call. */
#define MF__ATTEND_BY_SHAPE(CALL)                                                                \
    do {                                                                                         \
        if (nq <= 8) {                                                                           \
            if (Da == 64)                                                                        \
                CALL(8, 64);                                                                     \
            else if (Da == 128)                                                                  \
                CALL(8, 128);                                                                    \
            else                                                                                 \
                CALL(8, Da);                                                                     \
        } else {                                                                                 \
            if (Da == 64)                                                                        \
                CALL(MF_PANEL_ROWS, 64);                                                         \
            else if (Da == 128)                                                                  \
                CALL(MF_PANEL_ROWS, 128);                                                        \
            else                                                                                 \
                CALL(MF_PANEL_ROWS, Da);                                                         \
        }                                                                                        \
    } while (0)
#define MF__ATTEND32(W, DA)                                                                      \
    mf__attend_range(W, q, ldq, k, v, DA, first_pos, pos_step, nq, D, scale, kv_tile,          \
                     key_begin, key_end, out, ldo, m_out, l_out, NULL, NULL, NULL, NULL, opts)
#define MF__ATTEND16(W, DA)                                                                      \
    mf__attend_range(W, q, ldq, NULL, NULL, DA, first_pos, pos_step, nq, D, scale, kv_tile,    \
                     key_begin, key_end, out, ldo, m_out, l_out, k, v, kt, vt, opts)

/*
 * Keys key_begin .. key_end-1 (and none past a row's position) of the attention of nq (1..16)
 * query rows at positions pos_i = first_pos + i * pos_step: q rows at stride ldq, K/V rows of one
 * kv head at stride Da, out rows at stride ldo.
 *   m_out == NULL: out[i][:D] = softmax-weighted sum of v over those keys, out[i][D:Da] = 0.
 *   otherwise the unnormalised parts for mf_attend_combine_f32: out[i][:D] = sum_j e^(s_ij - m_i)
 *   v_j, m_out[i] = m_i (the largest score, -inf if no key was visible), l_out[i] = sum_j
 *   e^(s_ij - m_i).
 * D <= MF_ATT_MAX_HEAD_DIM, kv_tile <= MF_ATT_MAX_KV_TILE.  Up to 8 rows (decode's query heads of
 * a kv group: 4 in Llama-3, 7 in Qwen2, 3 in SmolLM2) take a panel 8 queries wide, half the
 * score products and exps of the 16-wide one.  opts: a layer's capping, window and ring cache
 * (mf_att_opts; NULL: none).  With a window, each row's keys are also cut to its window.
 */
static void mf_attend_range_f32(const float *q, ptrdiff_t ldq, const float *k, const float *v,
                                ptrdiff_t Da, ptrdiff_t first_pos, ptrdiff_t pos_step, int nq,
                                ptrdiff_t D, float scale, ptrdiff_t kv_tile, ptrdiff_t key_begin,
                                ptrdiff_t key_end, float *out, ptrdiff_t ldo, float *m_out,
                                float *l_out, const mf_att_opts *opts)
{
    MF__ATTEND_BY_SHAPE(MF__ATTEND32);
}

/*
 * mf_attend_range_f32 over a float16 K/V cache (a model's kv_dtype "float16"): k, v are float16
 * rows at stride Da.  Each KV tile is converted to float32 on the stack as it is reached (in
 * address order; at decode it is first touched, mf__touch_tile), then runs through the
 * same code as a float32 tile: the result is mf_attend_range_f32's on the cache's values widened
 * to float32.  The tile is at most MF_ATT_F16_TILE_FLOATS / Da keys (kv_tile is cut to that:
 * 256 keys at D = 64, 128 at 128, 64 at 256).  D <= MF_ATT_MAX_HEAD_DIM.
 */
static void mf_attend_range_f16(const float *q, ptrdiff_t ldq, const uint16_t *k,
                                const uint16_t *v, ptrdiff_t Da, ptrdiff_t first_pos,
                                ptrdiff_t pos_step, int nq, ptrdiff_t D, float scale,
                                ptrdiff_t kv_tile, ptrdiff_t key_begin, ptrdiff_t key_end,
                                float *out, ptrdiff_t ldo, float *m_out, float *l_out,
                                const mf_att_opts *opts)
{
    MF_ALIGNED(64) float kt[MF_ATT_F16_TILE_FLOATS];     /* [tile keys][Da]: the tile's K */
    MF_ALIGNED(64) float vt[MF_ATT_F16_TILE_FLOATS];     /* [tile keys][Da]: its V */
    if (kv_tile > MF_ATT_F16_TILE_FLOATS / Da)
        kv_tile = MF_ATT_F16_TILE_FLOATS / Da;
    MF__ATTEND_BY_SHAPE(MF__ATTEND16);
}
#undef MF__ATTEND_BY_SHAPE
#undef MF__ATTEND32
#undef MF__ATTEND16

/* The whole attention of the block's rows: keys 0 .. the last row's position (see above). */
static inline void mf_attend_block_f32(const float *q, ptrdiff_t ldq, const float *k,
                                       const float *v, ptrdiff_t Da, ptrdiff_t first_pos,
                                       ptrdiff_t pos_step, int nq, ptrdiff_t D, float scale,
                                       ptrdiff_t kv_tile, float *out, ptrdiff_t ldo,
                                       const mf_att_opts *opts)
{
    mf_attend_range_f32(q, ldq, k, v, Da, first_pos, pos_step, nq, D, scale, kv_tile, 0,
                        first_pos + (nq - 1) * pos_step + 1, out, ldo, NULL, NULL, opts);
}

/*
 * Decode over a long context, split into n_seg fixed ranges of keys (split-KV): part s of a head
 * is acc[s * ld_part .. + D], m[s * ld_ml], l[s * ld_ml] from mf_attend_range_f32.  out[:D] =
 * (sum_s e^(m_s - M) acc_s) / (sum_s e^(m_s - M) l_s), M = max_s m_s, in the order of s; out[D:Da]
 * = 0.  The ranges depend on the number of keys only, so the result does not depend on threads.
 */
static void mf_attend_combine_f32(const float *acc, ptrdiff_t ld_part, const float *m,
                                  const float *l, ptrdiff_t ld_ml, int n_seg, ptrdiff_t D,
                                  ptrdiff_t Da, float *out)
{
    float mx = -INFINITY, total = 0.0f;
    for (int s = 0; s < n_seg; s++)
        mx = m[s * ld_ml] > mx ? m[s * ld_ml] : mx;
    memset(out, 0, (size_t)Da * sizeof(float));
    for (int s = 0; s < n_seg; s++) {
        if (m[s * ld_ml] == -INFINITY)       /* no key of this range visible: weighs nothing */
            continue;
        float w = expf(m[s * ld_ml] - mx);
        total += l[s * ld_ml] * w;
        mf_axpy_f32(out, w, acc + s * ld_part, D);
    }
    mf_scale_f32(out, 1.0f / total, D);
}

#endif /* MEGAFUSE_MF_ATTENTION_H */
