/* tools/amx-emulated runtime: what a bare-metal test program may call, force-included (-include)
 * before the program.  Besides these, the C functions the megafuse headers use are defined too:
 * memcpy memset memmove memcmp strlen; malloc calloc realloc free aligned_alloc posix_memalign
 * (a bump allocator: free does nothing); exit abort __assert_fail; fabsf copysignf sqrtf fmaf
 * roundf expf tanhf (~1 ulp, not glibc's bits); clock_gettime (emulated time) getpid syscall
 * (arch_prctl: granted) and pthread_create (fails: teams run on the calling thread) & co.
 * Ordinary headers (<string.h>, <stdlib.h>, <immintrin.h>, ...) may be included for their
 * declarations. */
#ifndef MF_AMX_EMULATED_RT_H
#define MF_AMX_EMULATED_RT_H
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

int printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int vprintf(const char *fmt, va_list ap);
int snprintf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int vsnprintf(char *buf, size_t n, const char *fmt, va_list ap);
int puts(const char *s);
int putchar(int c);
/* the program's entry: 0 passes; the runtime prints "RESULT PASS|FAIL (exit code N)" after it */
int test_main(void);
#endif
