/* tools/amx-emulated runtime: single-thread stand-ins for the POSIX calls of the megafuse headers.
 * pthread_create fails (EAGAIN), so a thread team runs on its calling thread only;
 * syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, ...) succeeds (the boot stub enabled the AMX state);
 * clock_gettime counts emulated time from the TSC. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* Bochs's TSC advances with emulated instructions (clock: sync=none, ips=1e8 in the bochsrc) */
#define TSC_HZ 100000000ull

struct rt_timespec { long tv_sec; long tv_nsec; };

int clock_gettime(int clock_id, struct rt_timespec *ts)
{
    uint32_t lo, hi;
    (void)clock_id;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    const uint64_t t = ((uint64_t)hi << 32) | lo;
    ts->tv_sec = (long)(t / TSC_HZ);
    ts->tv_nsec = (long)(t % TSC_HZ * (1000000000ull / TSC_HZ));
    return 0;
}

int getpid(void) { return 1; }

long syscall(long nr, ...)
{
    switch (nr) {
    case 158: return 0;   /* arch_prctl (ARCH_REQ_XCOMP_PERM, ARCH_GET_XCOMP_PERM): granted */
    case 202: return 0;   /* futex: with one thread nobody waits */
    default: return -1;
    }
}

int pthread_create(void *thread, const void *attr, void *(*fn)(void *), void *arg)
{
    (void)thread; (void)attr; (void)fn; (void)arg;
    return 11;            /* EAGAIN */
}
int pthread_join(unsigned long thread, void **ret)
{
    (void)thread;
    if (ret) *ret = NULL;
    return 0;
}
int pthread_attr_init(void *attr) { (void)attr; return 0; }
int pthread_attr_destroy(void *attr) { (void)attr; return 0; }
int pthread_attr_setstacksize(void *attr, size_t size) { (void)attr; (void)size; return 0; }
