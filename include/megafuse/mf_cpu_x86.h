/*
 * mf_cpu_x86.h -- what numpy's CPU features do not tell: whether this process may run Intel AMX.
 *
 * AMX needs three things: the instructions (CPUID leaf 7: AMX-TILE, AMX-INT8), an OS that saves
 * the tile state (XCR0 bits 17 and 18), and, on Linux 5.16+, the process's permission to use the
 * tile data (arch_prctl ARCH_REQ_XCOMP_PERM): without it the first tile instruction kills the
 * process with SIGILL.  mf_x86_amx_state() asks for the permission (once granted it stays for the
 * process and its children) and reports the three as bits.  Compiled with the baseline flags: it
 * executes no AMX instruction itself.
 */
#ifndef MEGAFUSE_MF_CPU_X86_H
#define MEGAFUSE_MF_CPU_X86_H

#define MF_AMX_TILE 1        /* CPUID.(7, 0):EDX[24] */
#define MF_AMX_INT8 2        /* CPUID.(7, 0):EDX[25] */
#define MF_AMX_OS 4          /* XCR0 has XTILECFG and XTILEDATA, and the OS granted the data */

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#  include <cpuid.h>
#  if defined(__linux__)
#    include <sys/syscall.h>
#    include <unistd.h>
#  endif

static inline unsigned long long mf_x86_xcr0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (unsigned long long)hi << 32 | lo;
}

static inline int mf_x86_amx_state(void)
{
    unsigned int a, b, c, d;
    int state = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    state |= (d >> 24 & 1) ? MF_AMX_TILE : 0;
    state |= (d >> 25 & 1) ? MF_AMX_INT8 : 0;
    if (!(state & MF_AMX_TILE) || !__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1))
        return state;                              /* no AMX, or no OSXSAVE: no xgetbv */
#  if defined(__linux__) && defined(SYS_arch_prctl)
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18), <asm/prctl.h> */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0)
        return state;
    if ((mf_x86_xcr0() & 0x60000ULL) == 0x60000ULL)
        state |= MF_AMX_OS;
#  endif
    return state;
}
#else
static inline int mf_x86_amx_state(void) { return 0; }
#endif

#endif /* MEGAFUSE_MF_CPU_X86_H */
