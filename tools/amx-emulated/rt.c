/* tools/amx-emulated runtime: the C library of a bare-metal test program.  COM1 serial console
 * and printf, the string functions compilers and the megafuse headers call, a bump allocator over
 * the RAM above the kernel, exit/abort/assert, the CPU exception report, and the power-off that
 * ends Bochs.  rt_main() is called by boot.S and calls test_main(). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include "rt.h"

extern char _bss_end[];                    /* linker.ld: end of the kernel image */
extern uint64_t mb_magic_val;              /* boot.S: what GRUB passed in eax */
void rt_exit(int code) __attribute__((noreturn));

/* ---------------------------------------------------------------- serial port, power-off */
static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" :: "a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) { uint8_t v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }

#define COM1 0x3F8
static void serial_init(void)
{
    outb(COM1 + 1, 0x00);                  /* no interrupts: the port is polled */
    outb(COM1 + 3, 0x80);                  /* divisor latch */
    outb(COM1 + 0, 0x01);                  /* 115200 baud */
    outb(COM1 + 1, 0x00);
    outb(COM1 + 3, 0x03);                  /* 8N1 */
    outb(COM1 + 2, 0xC7);                  /* FIFOs on and cleared */
    outb(COM1 + 4, 0x03);                  /* DTR, RTS */
}
static void serial_putc(char c)
{
    if (c == '\n') serial_putc('\r');
    while (!(inb(COM1 + 5) & 0x20)) { }   /* transmit holding register empty */
    outb(COM1, (uint8_t)c);
}

/* Bochs powers off when "Shutdown" is written to port 0x8900 (its exit status is 1 even then) */
static void __attribute__((noreturn)) power_off(void)
{
    while (!(inb(COM1 + 5) & 0x40)) { }   /* the last byte has left */
    for (const char *s = "Shutdown"; *s; s++) outb(0x8900, (uint8_t)*s);
    for (;;) __asm__ volatile("cli; hlt");
}

/* ---------------------------------------------------------------- string.h
 * (built with -fno-tree-loop-distribute-patterns: gcc must not turn these loops into calls to
 * themselves) */
void *memset(void *dst, int c, size_t n)
{
    void *d = dst;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
    return dst;
}
void *memcpy(void *restrict dst, const void *restrict src, size_t n)
{
    void *d = dst;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(src), "+c"(n) :: "memory");
    return dst;
}
void *memmove(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d <= s || d >= s + n) return memcpy(dst, src, n);
    while (n--) d[n] = s[n];               /* overlapping, destination above: backwards */
    return dst;
}
int memcmp(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return x[i] - y[i];
    return 0;
}
size_t strlen(const char *s)
{
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

/* ---------------------------------------------------------------- heap: bump allocator */
static uintptr_t heap_next, heap_end;

static void heap_init(uint32_t multiboot_info)
{
    uint64_t top = 64ull << 20;            /* if GRUB said nothing */
    const uint32_t *mbi = (const uint32_t *)(uintptr_t)multiboot_info;
    if (mbi && (mbi[0] & 1)) top = (1ull << 20) + (uint64_t)mbi[2] * 1024;   /* mem_upper, KiB */
    if (top > (4ull << 30)) top = 4ull << 30;   /* boot.S maps the first 4 GiB */
    heap_next = ((uintptr_t)_bss_end + 0xFFFFF) & ~(uintptr_t)0xFFFFF;
    heap_end = top & ~(uintptr_t)0xFFF;
}

/* every block is at least 64-byte aligned and has its size in the 8 bytes before it (realloc) */
void *aligned_alloc(size_t align, size_t size)
{
    if (align < 64) align = 64;
    const uintptr_t p = (heap_next + sizeof(size_t) + align - 1) & ~(uintptr_t)(align - 1);
    if (p + size > heap_end || p + size < p) {
        printf("\nruntime: out of memory (%lu bytes asked, %lu free; more with MF_AMX_MEM)\n",
               (unsigned long)size, (unsigned long)(heap_end - heap_next));
        rt_exit(3);
    }
    ((size_t *)p)[-1] = size;
    heap_next = p + size;
    return (void *)p;
}
void *malloc(size_t n) { return aligned_alloc(64, n); }
void *calloc(size_t count, size_t size)
{
    const size_t n = count * size;
    if (size && n / size != count) return NULL;
    return memset(malloc(n), 0, n);
}
void free(void *p) { (void)p; }
void *realloc(void *p, size_t n)
{
    if (!p) return malloc(n);
    const size_t old = ((size_t *)p)[-1];
    return memcpy(malloc(n), p, old < n ? old : n);
}
int posix_memalign(void **out, size_t align, size_t size)
{
    *out = aligned_alloc(align, size);
    return 0;
}

/* ---------------------------------------------------------------- printf
 * %d %i %u %x %X %o %p %s %c %f %e %g %%; flags - 0 + space; width, precision, *; l ll z j t h */
struct sink { char *buf; size_t cap, len; int serial; };

static void put(struct sink *o, char c)
{
    if (o->serial) serial_putc(c);
    else if (o->len + 1 < o->cap) o->buf[o->len] = c;
    o->len++;
}
static void pad(struct sink *o, int n, char c) { while (n-- > 0) put(o, c); }
static void put_field(struct sink *o, const char *s, int len, int width, int left)
{
    if (!left) pad(o, width - len, ' ');
    for (int i = 0; i < len; i++) put(o, s[i]);
    if (left) pad(o, width - len, ' ');
}

static void put_int(struct sink *o, unsigned long long v, char sign, unsigned base, int upper,
                    int width, int zero, int left, int prec)
{
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    char tmp[72];
    int n = 0;
    do { tmp[n++] = digits[v % base]; v /= base; } while (v);
    while (n < prec && n < 64) tmp[n++] = '0';
    const int len = n + (sign != 0);
    if (!left && !zero) pad(o, width - len, ' ');
    if (sign) put(o, sign);
    if (!left && zero) pad(o, width - len, '0');
    while (n) put(o, tmp[--n]);
    if (left) pad(o, width - len, ' ');
}

/* %f / %e (%g picks one): good to ~15 significant digits, enough for test output */
static void put_double(struct sink *o, double d, int prec, int width, int left, char sign, char conv)
{
    union { double d; uint64_t u; } bits = { d };
    const int neg = (int)(bits.u >> 63);
    if (((bits.u >> 52) & 0x7FF) == 0x7FF) {
        const char *s = (bits.u << 12) ? "nan" : neg ? "-inf" : "inf";
        put_field(o, s, (int)strlen(s), width, left);
        return;
    }
    if (neg) d = -d;
    if (prec < 0) prec = 6;
    if (prec > 17) prec = 17;
    if (conv == 'g') conv = d != 0 && (d < 1e-4 || d >= 1e15) ? 'e' : 'f';
    int exp10 = 0;
    if (conv == 'e' && d != 0) {
        while (d >= 10) { d /= 10; exp10++; }
        while (d < 1) { d *= 10; exp10--; }
    }
    double half = 0.5;
    for (int i = 0; i < prec; i++) half /= 10;
    d += half;
    if (conv == 'e' && d >= 10) { d /= 10; exp10++; }
    char tmp[64];
    int n = 0;
    if (neg) tmp[n++] = '-';
    else if (sign) tmp[n++] = sign;
    if (d >= 1e19) {
        put_field(o, neg ? "-huge" : "huge", neg ? 5 : 4, width, left);
        return;
    }
    unsigned long long ip = (unsigned long long)d;
    double frac = d - (double)ip;
    char digits[24];
    int nd = 0;
    do { digits[nd++] = (char)('0' + ip % 10); ip /= 10; } while (ip);
    while (nd) tmp[n++] = digits[--nd];
    if (prec) {
        tmp[n++] = '.';
        for (int i = 0; i < prec; i++) {
            frac *= 10;
            const int dg = (int)frac;
            tmp[n++] = (char)('0' + dg);
            frac -= dg;
        }
    }
    if (conv == 'e') {
        const int e = exp10 < 0 ? -exp10 : exp10;
        tmp[n++] = 'e';
        tmp[n++] = exp10 < 0 ? '-' : '+';
        if (e >= 100) tmp[n++] = (char)('0' + e / 100);
        tmp[n++] = (char)('0' + e / 10 % 10);
        tmp[n++] = (char)('0' + e % 10);
    }
    put_field(o, tmp, n, width, left);
}

static int format(struct sink *o, const char *f, va_list ap)
{
    for (; *f; f++) {
        if (*f != '%') { put(o, *f); continue; }
        int left = 0, zero = 0, width = 0, prec = -1, size = 0;
        char sign = 0;
        for (f++;; f++) {
            if (*f == '-') left = 1;
            else if (*f == '0') zero = 1;
            else if (*f == '+') sign = '+';
            else if (*f == ' ') { if (!sign) sign = ' '; }
            else if (*f != '#') break;
        }
        if (*f == '*') {
            width = va_arg(ap, int);
            if (width < 0) { left = 1; width = -width; }
            f++;
        } else {
            while (*f >= '0' && *f <= '9') width = width * 10 + (*f++ - '0');
        }
        if (*f == '.') {
            prec = 0;
            if (*++f == '*') { prec = va_arg(ap, int); f++; }
            else while (*f >= '0' && *f <= '9') prec = prec * 10 + (*f++ - '0');
        }
        for (;; f++) {
            if (*f == 'l') size++;
            else if (*f == 'z' || *f == 'j' || *f == 't') size = 2;
            else if (*f != 'h') break;
        }
        switch (*f) {
        case 'd': case 'i': {
            const long long v = size ? va_arg(ap, long long) : va_arg(ap, int);
            put_int(o, v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v,
                    v < 0 ? '-' : sign, 10, 0, width, zero, left, prec);
            break;
        }
        case 'u': case 'x': case 'X': case 'o': {
            const unsigned long long v = size ? va_arg(ap, unsigned long long) : va_arg(ap, unsigned);
            put_int(o, v, 0, *f == 'u' ? 10 : *f == 'o' ? 8 : 16, *f == 'X', width, zero, left, prec);
            break;
        }
        case 'p':
            put(o, '0');
            put(o, 'x');
            put_int(o, (uintptr_t)va_arg(ap, void *), 0, 16, 0, width, zero, left, prec);
            break;
        case 'c': {
            const char c = (char)va_arg(ap, int);
            put_field(o, &c, 1, width, left);
            break;
        }
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (!s) s = "(null)";
            size_t len = strlen(s);
            if (prec >= 0 && (size_t)prec < len) len = (size_t)prec;
            put_field(o, s, (int)len, width, left);
            break;
        }
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
            put_double(o, va_arg(ap, double), prec, width, left, sign, (char)(*f | 0x20));
            break;
        case '%': put(o, '%'); break;
        case 0: return (int)o->len;
        default: put(o, '%'); put(o, *f); break;
        }
    }
    return (int)o->len;
}

int vprintf(const char *fmt, va_list ap)
{
    struct sink o = { NULL, 0, 0, 1 };
    return format(&o, fmt, ap);
}
int printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int r = vprintf(fmt, ap);
    va_end(ap);
    return r;
}
int vsnprintf(char *buf, size_t n, const char *fmt, va_list ap)
{
    struct sink o = { buf, n, 0, 0 };
    const int r = format(&o, fmt, ap);
    if (n) buf[o.len < n ? o.len : n - 1] = 0;
    return r;
}
int snprintf(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int r = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return r;
}
int putchar(int c) { serial_putc((char)c); return c; }
int puts(const char *s)
{
    while (*s) serial_putc(*s++);
    serial_putc('\n');
    return 0;
}

/* ---------------------------------------------------------------- ends */
void rt_exit(int code)
{
    printf("\nRESULT %s (exit code %d)\n", code == 0 ? "PASS" : "FAIL", code);
    power_off();
}
void __attribute__((noreturn)) exit(int code) { rt_exit(code); }
void __attribute__((noreturn)) abort(void)
{
    printf("\nabort() called\n");
    rt_exit(134);
}
void __assert_fail(const char *expr, const char *file, unsigned line, const char *fn)
{
    printf("\nassertion failed: %s at %s:%u (%s)\n", expr, file, line, fn);
    rt_exit(134);
}

/* boot.S's handler of vectors 0-31 passes its stack: vector, error code, rip, cs, rflags, rsp */
void rt_exception(const uint64_t *frame)
{
    static const char *const names[22] = {
        "#DE divide error", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD invalid opcode",
        "#NM device not available", "#DF double fault", "9", "#TS", "#NP", "#SS",
        "#GP general protection", "#PF page fault", "15", "#MF x87", "#AC alignment", "#MC",
        "#XM SIMD floating point", "#VE", "#CP control protection" };
    uint64_t cr2;
    __asm__ volatile("mov %%cr2, %0" : "=r"(cr2));
    printf("\n*** CPU exception %lu (%s) err=0x%lx rip=0x%lx rsp=0x%lx rflags=0x%lx cr2=0x%lx\n",
           (unsigned long)frame[0], frame[0] < 22 ? names[frame[0]] : "reserved",
           (unsigned long)frame[1], (unsigned long)frame[2], (unsigned long)frame[5],
           (unsigned long)frame[4], (unsigned long)cr2);
    rt_exit(128 + (int)frame[0]);
}

void rt_main(uint32_t multiboot_info)
{
    uint32_t lo, hi;
    serial_init();
    heap_init(multiboot_info);
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    printf("amx-emulated: booted (multiboot magic 0x%lx), xcr0=0x%lx, heap %lu MiB\n",
           (unsigned long)mb_magic_val, ((unsigned long)hi << 32) | lo,
           (unsigned long)((heap_end - heap_next) >> 20));
    rt_exit(test_main());
}
