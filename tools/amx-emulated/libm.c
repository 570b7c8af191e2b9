/* tools/amx-emulated runtime: the float functions of libm that the megafuse headers call, computed
 * in double (about 1 ulp; not glibc's bits, so compare transcendental results with a tolerance). */
#include <stdint.h>

typedef union { float f; uint32_t u; } fbits;
typedef union { double d; uint64_t u; } dbits;

float fabsf(float x) { fbits v = { x }; v.u &= 0x7fffffffu; return v.f; }
float copysignf(float x, float y)
{
    fbits a = { x }, b = { y };
    a.u = (a.u & 0x7fffffffu) | (b.u & 0x80000000u);
    return a.f;
}
float sqrtf(float x) { float r; __asm__("sqrtss %1, %0" : "=x"(r) : "x"(x)); return r; }
float fmaf(float a, float b, float c)
{
    __asm__("vfmadd213ss %2, %1, %0" : "+x"(a) : "x"(b), "x"(c));
    return a;
}
/* halfway cases away from zero, like C's round */
float roundf(float x)
{
    double t, d = x;
    __asm__("roundsd $3, %1, %0" : "=x"(t) : "x"(d));          /* truncate */
    if (d - t >= 0.5) t += 1.0;
    else if (t - d >= 0.5) t -= 1.0;
    return (float)t;
}

static double nearest(double x) { double r; __asm__("roundsd $0, %1, %0" : "=x"(r) : "x"(x)); return r; }

static double exp_d(double x)
{
    if (x != x) return x;
    if (x > 709.0) return 1.0 / 0.0;
    if (x < -745.0) return 0.0;
    /* x = n ln2 + r, |r| <= ln2/2, ln2 split in two parts so that n ln2 is exact */
    const double n = nearest(x * 1.44269504088896340736);
    const double r = (x - n * 0.693147180369123816490) - n * 1.90821492927058770002e-10;
    double term = 1.0, sum = 1.0;
    for (int i = 1; i <= 14; i++) {
        term *= r / i;
        sum += term;
    }
    int e = (int)n;
    double scale = 1.0;
    if (e < -1000) { scale = 0x1p-1000; e += 1000; }
    dbits p = { .u = (uint64_t)(e + 1023) << 52 };
    return sum * p.d * scale;
}

float expf(float x) { return (float)exp_d(x); }

float tanhf(float x)
{
    const double d = x;
    if (d > 20.0) return 1.0f;
    if (d < -20.0) return -1.0f;
    if (d > -1e-4 && d < 1e-4) return (float)(d - d * d * d / 3.0);
    const double e = exp_d(2.0 * d);
    return (float)((e - 1.0) / (e + 1.0));
}
