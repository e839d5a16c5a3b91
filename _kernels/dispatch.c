/* Run-time choice of the kernel path: the best one the CPU (and OS) supports, or a forced one.
 * Order of preference: AVX512-VNNI, AVX-VNNI (256-bit vpdpbusd, CPUs without AVX-512), AVX2, portable C. */
#include <pthread.h>
#include <string.h>

#include "kernels.h"

#ifdef BN_HAVE_X86
#include <cpuid.h>

static int has_avx512_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
static int has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
/* AVX-VNNI is CPUID leaf 7, sub-leaf 1, EAX bit 4 (read directly: older compilers' __builtin_cpu_supports do not
 * know the name); it uses the YMM state that has_avx2 already requires the OS to save. */
static int has_avx_vnni(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!has_avx2() || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 4) & 1;
}

/* The AVX-VNNI tables: AVX2's entries with the two matmuls replaced, built once. */
static bn_kernels avxvnni_table, avxvnni_emulated_table;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;
static void build_vnni_tables(void) {
    avxvnni_emulated_table = bn_kernels_avx2;
    avxvnni_emulated_table.name = "avxvnni-emulated";
    avxvnni_emulated_table.ternary_matmul = bn_avxvnni_emulated_ternary_matmul;
    avxvnni_emulated_table.int8_matmul = bn_avxvnni_emulated_int8_matmul;
#ifndef BN_NO_AVXVNNI
    avxvnni_table = bn_kernels_avx2;
    avxvnni_table.name = "avxvnni";
    avxvnni_table.ternary_matmul = bn_avxvnni_ternary_matmul;
    avxvnni_table.int8_matmul = bn_avxvnni_int8_matmul;
#endif
}
/* The AVX-512 table: kernels_avx512.c's entries, and AVX2's fused steps where it has none of its own (multi-row
 * attention, the greedy confidence, silu): a 256-bit kernel beats forward.c's generic loop on these CPUs too. */
static bn_kernels avx512_table;
static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;
static void build_avx512_table(void) {
    avx512_table = bn_kernels_avx512;
    if (!avx512_table.attend_rows) avx512_table.attend_rows = bn_kernels_avx2.attend_rows;
    if (!avx512_table.max_expsum) avx512_table.max_expsum = bn_kernels_avx2.max_expsum;
    if (!avx512_table.silu_mul) avx512_table.silu_mul = bn_kernels_avx2.silu_mul;
}
static const bn_kernels *avx512(void) {
    if (!has_avx512_vnni()) return NULL;
    pthread_once(&avx512_once, build_avx512_table);
    return &avx512_table;
}

static const bn_kernels *avxvnni(int emulated) {
    pthread_once(&vnni_once, build_vnni_tables);
    if (emulated) return has_avx2() ? &avxvnni_emulated_table : NULL;
#ifndef BN_NO_AVXVNNI
    if (has_avx_vnni()) return &avxvnni_table;
#endif
    return NULL;
}
#endif

const bn_kernels *bn_select_kernels(const char *force) {
    if (force && *force) {
        if (!strcmp(force, "portable")) return &bn_kernels_portable;
#ifdef BN_HAVE_X86
        if (!strcmp(force, "avx512") || !strcmp(force, "avx512-vnni")) return avx512();
        if (!strcmp(force, "avxvnni")) return avxvnni(0);
        if (!strcmp(force, "avxvnni-emulated")) return avxvnni(1);
        if (!strcmp(force, "avx2")) return has_avx2() ? &bn_kernels_avx2 : NULL;
#endif
        return NULL;
    }
#ifdef BN_HAVE_X86
    if (has_avx512_vnni()) return avx512();
    if (avxvnni(0)) return avxvnni(0);
    if (has_avx2()) return &bn_kernels_avx2;
#endif
    return &bn_kernels_portable;
}
