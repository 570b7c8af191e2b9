/* The roofline probe of the layer benchmarks (benchmarks/_roofline.py compiles it at run time,
 * for megafuse's SIMD level, and calls it through ctypes on the benchmark's thread count).
 *
 *   read_loop   a plain streaming read (DRAM read bandwidth, with a large enough array)
 *   fma_loop    the fp32 peak: 12 independent FMA chains
 *   int8_loop   the int8 peak, the way GGML's dot products multiply-add: maddubs + madd + add
 *               on AVX2, vpdpbusd on AVX-512 VNNI; at megafuse's amx level AMX-INT8 tile
 *               products (tdpbusd), the peak of that level's prefill tiles (the process must
 *               hold the tile data permission: importing megafuse at amx asked for it)
 *
 * Built with -O2 -ffp-contract=fast (so a * x + y is one FMA) and the level's -m flags; no
 * -ffast-math.  Vector types are GCC / Clang vector extensions.
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
typedef float vf __attribute__((vector_size(64)));
#define VW 16                   /* floats per vector */
#elif defined(__AVX__)
typedef float vf __attribute__((vector_size(32)));
#define VW 8
#else
typedef float vf __attribute__((vector_size(16)));
#define VW 4
#endif
#define FMA_CHAINS 12

int probe_width(void) { return VW; }
int fma_chains(void) { return FMA_CHAINS; }

/* Sum n floats (the tail past a multiple of 4 * VW is not read) with 4 accumulators. */
float read_loop(const float *p, long n) {
    const vf *v = (const vf *)p;          /* [n / VW] vectors; p is 64-byte aligned */
    vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (long i = 0; i + 4 <= n / VW; i += 4) {
        s0 += v[i]; s1 += v[i + 1]; s2 += v[i + 2]; s3 += v[i + 3];
    }
    vf s = s0 + s1 + s2 + s3;
    float r = 0;
    for (int k = 0; k < VW; k++) r += s[k];
    return r;
}

/* FMA_CHAINS independent chains with distinct starting values (no two can be merged):
 * n iterations do n * FMA_CHAINS * VW * 2 flops. */
float fma_loop(long n) {
    vf x, y, a[FMA_CHAINS];
    for (int i = 0; i < VW; i++) {
        x[i] = 0.999999f;
        y[i] = 1e-7f;
        for (int j = 0; j < FMA_CHAINS; j++) a[j][i] = 0.01f * (j + 1);
    }
    vf a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7],
       a8 = a[8], a9 = a[9], a10 = a[10], a11 = a[11];
    for (long i = 0; i < n; i++) {
        a0 = a0 * x + y; a1 = a1 * x + y; a2 = a2 * x + y; a3 = a3 * x + y;
        a4 = a4 * x + y; a5 = a5 * x + y; a6 = a6 * x + y; a7 = a7 * x + y;
        a8 = a8 * x + y; a9 = a9 * x + y; a10 = a10 * x + y; a11 = a11 * x + y;
    }
    vf s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    float r = 0;
    for (int i = 0; i < VW; i++) r += s[i];
    return r;
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
/* 4 chains of tdpbusd (16 x 16 int32 += 16 x 64 u8 . 64 x 16 s8: 16384 multiply-adds each), tiles
 * configured on the calling thread and released at the end.  Returns C[0][0] of the four tiles
 * added: 4 * 128 * n. */
int int8_macs_per_iter(void) { return 4 * 16 * 16 * 64; }
int int8_loop(long n) {
    struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; }
        __attribute__((aligned(64))) cfg;
    static const uint8_t ones[16 * 64] __attribute__((aligned(64))) = {[0 ... 1023] = 1};
    static const int8_t twos[16 * 64] __attribute__((aligned(64))) = {[0 ... 1023] = 2};
    int32_t c[4][16][16];
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {       /* C: tiles 0..3, A: 4, B: 6 */
        cfg.rows[t] = (t < 5 || t == 6) ? 16 : 0;
        cfg.colsb[t] = (t < 5 || t == 6) ? 64 : 0;
    }
    _tile_loadconfig(&cfg);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(6, twos, 64);
    for (long i = 0; i < n; i++) {
        _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 6);
        _tile_dpbusd(2, 4, 6); _tile_dpbusd(3, 4, 6);
    }
    _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64);
    _tile_release();
    return c[0][0][0] + c[1][0][0] + c[2][0][0] + c[3][0][0];
}
#elif defined(__AVX512VNNI__)
/* 8 chains of vpdpbusd (64 u8 x s8 multiply-adds each). */
int int8_macs_per_iter(void) { return 8 * 64; }
int int8_loop(long n) {
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
    __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
            c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
            c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7);
    for (long i = 0; i < n; i++) {
        __asm__ volatile("" : "+v"(a));     /* the compiler must not hoist the products */
        c0 = _mm512_dpbusd_epi32(c0, a, b); c1 = _mm512_dpbusd_epi32(c1, a, b);
        c2 = _mm512_dpbusd_epi32(c2, a, b); c3 = _mm512_dpbusd_epi32(c3, a, b);
        c4 = _mm512_dpbusd_epi32(c4, a, b); c5 = _mm512_dpbusd_epi32(c5, a, b);
        c6 = _mm512_dpbusd_epi32(c6, a, b); c7 = _mm512_dpbusd_epi32(c7, a, b);
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1),
        _mm512_add_epi32(c2, c3)), _mm512_add_epi32(_mm512_add_epi32(c4, c5),
        _mm512_add_epi32(c6, c7)));
    return _mm512_reduce_add_epi32(s);
}
#elif defined(__AVX2__)
/* maddubs (u8 x s8 -> pairs summed to s16) + madd with ones (-> s32) + add: 32 multiply-adds a
 * step; four chains, each on an input the compiler must reload every iteration. */
int int8_macs_per_iter(void) { return 4 * 32; }
int int8_loop(long n) {
    __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3),
            a3 = _mm256_set1_epi8(4);
    const __m256i b = _mm256_set1_epi8(2), ones = _mm256_set1_epi16(1);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
    for (long i = 0; i < n; i++) {
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3));
        c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(_mm256_maddubs_epi16(a0, b), ones));
        c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(_mm256_maddubs_epi16(a1, b), ones));
        c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(_mm256_maddubs_epi16(a2, b), ones));
        c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(_mm256_maddubs_epi16(a3, b), ones));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
    return _mm256_extract_epi32(s, 0);
}
#else
/* no int8 SIMD at this level: no int8 peak (the roofline then uses the fp32 one) */
int int8_macs_per_iter(void) { return 0; }
int int8_loop(long n) { return (int)n; }
#endif
