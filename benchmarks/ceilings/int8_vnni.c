/* AVX-512 VNNI int8 multiply-add ceiling: the rate of vpdpbusd on 512-bit registers (u8 x s8, four products
 * summed into each of 16 int32 lanes = 64 MACs per instruction), the AVX-512 kernels' only multiply step.
 * The ceiling the benchmarks divide by for the avx512 path (int8_avx2.c is the one for the 256-bit paths).
 *
 * Each thread runs 12 independent accumulator chains (vpdpbusd has a latency of several cycles; 12 chains
 * cover it on the CPUs we have), each with its own u8 operand. The empty asm statement after each round tells
 * the compiler that every operand may have changed, so it can neither hoist the products out of the loop nor
 * merge the chains.
 *
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vnni -pthread int8_vnni.c -o int8_vnni && ./int8_vnni 2
 * prints "threads=N int8 ceiling GMAC/s X" (best of 3 runs). Exits 3 with a message on a CPU without VNNI.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 50000000L
#define CHAINS 12

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define STEP(i) c##i = _mm512_dpbusd_epi32(c##i, a##i, b)

static void *chains(void *arg) {
    const char seed = (char)(long)arg;
    const __m512i b = _mm512_set1_epi8(3);
    __m512i a0 = _mm512_set1_epi8(seed + 1), a1 = _mm512_set1_epi8(seed + 2), a2 = _mm512_set1_epi8(seed + 3);
    __m512i a3 = _mm512_set1_epi8(seed + 4), a4 = _mm512_set1_epi8(seed + 5), a5 = _mm512_set1_epi8(seed + 6);
    __m512i a6 = _mm512_set1_epi8(seed + 7), a7 = _mm512_set1_epi8(seed + 8), a8 = _mm512_set1_epi8(seed + 9);
    __m512i a9 = _mm512_set1_epi8(seed + 10), a10 = _mm512_set1_epi8(seed + 11), a11 = _mm512_set1_epi8(seed + 12);
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    __m512i c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    for (long it = 0; it < ITERS; it++) {
        STEP(0); STEP(1); STEP(2); STEP(3); STEP(4); STEP(5);
        STEP(6); STEP(7); STEP(8); STEP(9); STEP(10); STEP(11);
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
        __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    __m512i c = _mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3));
    c = _mm512_add_epi32(c, _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    c = _mm512_add_epi32(c, _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
    return (void *)(long)_mm512_reduce_add_epi32(c);
}

/* best GMAC/s of 3 runs of th threads */
static double rate(int th) {
    pthread_t ids[256];
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = now_s();
        for (int i = 0; i < th; i++) pthread_create(&ids[i], NULL, chains, (void *)(long)i);
        for (int i = 0; i < th; i++) pthread_join(ids[i], NULL);
        const double g = (double)ITERS * CHAINS * 64 * th / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

int main(int argc, char **argv) {
    const int th = argc > 1 ? atoi(argv[1]) : 2;
    if (th < 1 || th > 256) { fprintf(stderr, "threads must be 1..256\n"); return 2; }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni")) { fprintf(stderr, "this CPU has no AVX-512 VNNI\n"); return 3; }
    printf("threads=%d int8 ceiling GMAC/s %.1f\n", th, rate(th));
    return 0;
}
