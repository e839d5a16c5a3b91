/* The OS- and CPU-identity-dependent readings of platform.h: one branch per system (Linux, macOS, other POSIX). */
#define _GNU_SOURCE /* Linux: syscall */
#include "platform.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/mman.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <sys/syscall.h>
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

/* Linux's bits of AT_HWCAP / AT_HWCAP2 (asm/hwcap.h, spelled out: older C libraries' headers lack HWCAP2_I8MM). */
#define BN_HWCAP_ASIMDDP (1UL << 20)
#define BN_HWCAP2_I8MM (1UL << 13)
#if defined(__aarch64__) && defined(__linux__) && !defined(AT_HWCAP2)
#define AT_HWCAP2 26
#endif

#if defined(__APPLE__)
/* An integer sysctl (hw.optional.arm.FEAT_DotProd ...): its value, or 0 if the name is unknown. */
static long long sysctl_int(const char *name) {
    long long v = 0;
    size_t size = sizeof v;
    int32_t v32 = 0;
    if (sysctlbyname(name, &v, &size, NULL, 0) != 0) return 0;
    if (size == sizeof v32) { /* most hw.* flags are 32-bit */
        memcpy(&v32, &v, sizeof v32);
        return v32;
    }
    return v;
}
#endif

int bn_cpu_has_dotprod(void) {
#if defined(__aarch64__) && defined(__linux__)
    return (getauxval(AT_HWCAP) & BN_HWCAP_ASIMDDP) != 0;
#elif defined(__aarch64__) && defined(__APPLE__)
    return sysctl_int("hw.optional.arm.FEAT_DotProd") != 0;
#else
    return 0;
#endif
}

int bn_cpu_has_i8mm(void) {
#if defined(__aarch64__) && defined(__linux__)
    return (getauxval(AT_HWCAP2) & BN_HWCAP2_I8MM) != 0;
#elif defined(__aarch64__) && defined(__APPLE__)
    return sysctl_int("hw.optional.arm.FEAT_I8MM") != 0;
#else
    return 0;
#endif
}

/* Linux x86: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) asks for the tile data once per process. */
#define BN_ARCH_REQ_XCOMP_PERM 0x1023
#define BN_XFEATURE_XTILEDATA 18
int bn_os_permits_amx(void) {
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__)) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, BN_ARCH_REQ_XCOMP_PERM, BN_XFEATURE_XTILEDATA) == 0;
#else
    return 0; /* no system here grants AMX another way */
#endif
}

void bn_advise_huge_pages(void *p, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p && n) madvise(p, n, MADV_HUGEPAGE); /* advice: where refused, the pages stay small */
#else
    (void)p;
    (void)n;
#endif
}
