/* Run-time choice of the kernel path: the best one the CPU (and OS) supports, or a forced one.
 * Order of preference: on x86, AMX (with AVX512-VNNI), AVX512-VNNI, AVX-VNNI (256-bit vpdpbusd, CPUs without
 * AVX-512), AVX2; on aarch64, NEON with i8mm, NEON with the dot product, NEON; then portable C. What the OS says
 * about the CPU comes from platform.c. */
#include <pthread.h>
#include <string.h>

#include "kernels.h"
#include "kernels_neon.h"
#include "platform.h"

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

/* AMX-INT8: CPUID leaf 7 EDX bits 24 (tiles) and 25 (int8 multiplies), the OS saving the tile state (XCR0 bits 17
 * and 18), and the OS's permission for this process to use the tile data (platform.c: asked once; it holds for all
 * threads). */
static int amx_usable;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void probe_amx(void) {
#ifndef BN_NO_AMX
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!has_avx512_vnni() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1))
        return;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;
    amx_usable = bn_os_permits_amx();
#endif
}

/* The AVX-VNNI tables: AVX2's entries with the two matmuls replaced, built once. */
static bn_kernels avxvnni_table, avxvnni_emulated_table;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;
static void build_vnni_tables(void) {
    avxvnni_emulated_table = bn_kernels_avx2;
    avxvnni_emulated_table.name = "avxvnni-emulated";
    avxvnni_emulated_table.ternary_matmul = bn_avxvnni_emulated_ternary_matmul;
    avxvnni_emulated_table.ternary5_matmul = bn_avxvnni_emulated_ternary5_matmul;
    avxvnni_emulated_table.int8_matmul = bn_avxvnni_emulated_int8_matmul;
#ifndef BN_NO_AVXVNNI
    avxvnni_table = bn_kernels_avx2;
    avxvnni_table.name = "avxvnni";
    avxvnni_table.ternary_matmul = bn_avxvnni_ternary_matmul;
    avxvnni_table.ternary5_matmul = bn_avxvnni_ternary5_matmul;
    avxvnni_table.int8_matmul = bn_avxvnni_int8_matmul;
#endif
}
/* The AVX-512 table: kernels_avx512.c's, with its 1.6-bit code chosen for this CPU. */
static bn_kernels avx512_table;
static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;
static void build_avx512_table(void) {
    avx512_table = bn_kernels_avx512;
    avx512_table.trit5_windows = bn_avx512_trit5_windows();
}
static const bn_kernels *avx512(void) {
    if (!has_avx512_vnni()) return NULL;
    pthread_once(&avx512_once, build_avx512_table);
    return &avx512_table;
}

/* The AMX tables: AVX512's with the two matmuls on tiles; the emulated one is AVX2's with the tiles in plain C. */
static bn_kernels amx_table, amx_emulated_table;
static pthread_once_t amx_tables_once = PTHREAD_ONCE_INIT;
static void build_amx_tables(void) {
    amx_emulated_table = bn_kernels_avx2;
    amx_emulated_table.name = "amx-emulated";
    amx_emulated_table.ternary_matmul = bn_amx_emulated_ternary_matmul;
    amx_emulated_table.ternary5_matmul = bn_amx_emulated_ternary5_matmul;
    amx_emulated_table.int8_matmul = bn_amx_emulated_int8_matmul;
#ifndef BN_NO_AMX
    if (avx512()) {
        amx_table = *avx512();
        amx_table.name = "amx";
        amx_table.ternary_matmul = bn_amx_ternary_matmul;
        amx_table.ternary5_matmul = bn_amx_ternary5_matmul;
        amx_table.int8_matmul = bn_amx_int8_matmul;
    }
#endif
}
static const bn_kernels *amx(int emulated) {
    pthread_once(&amx_tables_once, build_amx_tables);
    if (emulated) return has_avx2() ? &amx_emulated_table : NULL;
    pthread_once(&amx_once, probe_amx);
    return amx_usable ? &amx_table : NULL;
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

#ifdef BN_HAVE_NEON
/* The NEON tables: the portable table with kernels_neon.c's entries over it, then the dot product's and i8mm's
 * matmuls over that (kernels_neon_dotprod.c, kernels_neon_i8mm.c), built once. */
static bn_kernels neon_table, dotprod_table, i8mm_table;
static pthread_once_t neon_once = PTHREAD_ONCE_INIT;
static void build_neon_tables(void) {
    neon_table = bn_kernels_portable;
    bn_neon_fill(&neon_table);
    neon_table.name = "neon";
#ifndef BN_NO_NEON_DOTPROD
    dotprod_table = neon_table;
    bn_neon_dotprod_fill(&dotprod_table);
    dotprod_table.name = "neon-dotprod";
#endif
#ifndef BN_NO_NEON_I8MM
    i8mm_table = dotprod_table;
    bn_neon_i8mm_fill(&i8mm_table);
    i8mm_table.name = "neon-i8mm";
#endif
}
static const bn_kernels *neon_tables(void) {
    pthread_once(&neon_once, build_neon_tables);
    return &neon_table;
}
#endif

/* One getter per path: its table, or NULL where this CPU (or this build) cannot run it. */
static const bn_kernels *path_portable(void) { return &bn_kernels_portable; }
#ifdef BN_HAVE_NEON
static const bn_kernels *path_neon(void) { return neon_tables(); }
static const bn_kernels *path_neon_dotprod(void) {
#ifndef BN_NO_NEON_DOTPROD
    if (bn_cpu_has_dotprod()) return (void)neon_tables(), &dotprod_table;
#endif
    return NULL;
}
static const bn_kernels *path_neon_i8mm(void) {
#if !defined(BN_NO_NEON_DOTPROD) && !defined(BN_NO_NEON_I8MM)
    if (bn_cpu_has_dotprod() && bn_cpu_has_i8mm()) return (void)neon_tables(), &i8mm_table;
#endif
    return NULL;
}
#endif
#ifdef BN_HAVE_X86
static const bn_kernels *path_amx(void) { return amx(0); }
static const bn_kernels *path_avx512(void) { return avx512(); }
static const bn_kernels *path_avxvnni(void) { return avxvnni(0); }
static const bn_kernels *path_avx2(void) { return has_avx2() ? &bn_kernels_avx2 : NULL; }
static const bn_kernels *path_avxvnni_emulated(void) { return avxvnni(1); }
static const bn_kernels *path_amx_emulated(void) { return amx(1); }
#endif
#if !defined(BN_HAVE_X86) || !defined(BN_HAVE_NEON)
static const bn_kernels *no_path(void) { return NULL; }
#endif
#ifndef BN_HAVE_X86
#define path_amx no_path
#define path_avx512 no_path
#define path_avxvnni no_path
#define path_avx2 no_path
#define path_avxvnni_emulated no_path
#define path_amx_emulated no_path
#endif
#ifndef BN_HAVE_NEON
#define path_neon_i8mm no_path
#define path_neon_dotprod no_path
#define path_neon no_path
#endif

/* Every kernel path by name, in order of preference: the automatic choice is the first one the CPU supports,
 * the emulated ones (another path's code on AVX2, for the tests) excepted. bitnet_app/engine/kernel_paths.py lists
 * the same names, in the same order, with their labels (tests/test_kernels.py checks that). */
static const struct {
    const char *name;
    const bn_kernels *(*table)(void);
    int emulated;
} PATHS[] = {
    {"amx", path_amx, 0},
    {"avx512", path_avx512, 0},
    {"avxvnni", path_avxvnni, 0},
    {"avx2", path_avx2, 0},
    {"neon-i8mm", path_neon_i8mm, 0},
    {"neon-dotprod", path_neon_dotprod, 0},
    {"neon", path_neon, 0},
    {"portable", path_portable, 0},
    {"avxvnni-emulated", path_avxvnni_emulated, 1},
    {"amx-emulated", path_amx_emulated, 1},
};
#define N_PATHS ((int)(sizeof PATHS / sizeof PATHS[0]))

const char *bn_kernel_path_name(int i) { return i >= 0 && i < N_PATHS ? PATHS[i].name : NULL; }

const bn_kernels *bn_select_kernels(const char *force) {
    for (int i = 0; i < N_PATHS; i++) {
        if (force && *force) {
            if (!strcmp(force, PATHS[i].name)) return PATHS[i].table();
        } else if (!PATHS[i].emulated) {
            const bn_kernels *k = PATHS[i].table();
            if (k) return k;
        }
    }
    return NULL; /* a forced name that no path has (the portable path always runs) */
}
