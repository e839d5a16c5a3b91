/* Run-time choice of the kernel path: the best one the CPU (and OS) supports, or a forced one. */
#include <string.h>

#include "kernels.h"

#ifdef BN_HAVE_X86
static int has_avx512_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
static int has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#endif

const bn_kernels *bn_select_kernels(const char *force) {
    if (force && *force) {
        if (!strcmp(force, "portable")) return &bn_kernels_portable;
#ifdef BN_HAVE_X86
        if (!strcmp(force, "avx512") || !strcmp(force, "avx512-vnni")) return has_avx512_vnni() ? &bn_kernels_avx512 : NULL;
        if (!strcmp(force, "avx2")) return has_avx2() ? &bn_kernels_avx2 : NULL;
#endif
        return NULL;
    }
#ifdef BN_HAVE_X86
    if (has_avx512_vnni()) return &bn_kernels_avx512;
    if (has_avx2()) return &bn_kernels_avx2;
#endif
    return &bn_kernels_portable;
}
