/* AVX2 int8 multiply-add ceiling: the rate of the engine's inner steps on registers only, one 32-MAC step per
 * vpmaddubsw (u8 x s8 -> s16 pairs), two ways:
 *   pair     vpmaddubsw then vpmaddwd with ones (-> s32) then vpaddd: the int8 head's step, and the classic
 *            definition (../shared/tools/int8_avx2.c)
 *   ternary  vpmaddubsw then vpaddw (s16 sums): the ternary kernels' step, which widens to s32 only once per
 *            16 groups (kernels_avx2.c GROUPS_PER_WIDEN). On Zen 3 vpmaddwd and vpmaddubsw share the
 *            multiplier, so this way is ~3x faster than the pair: it is the one the ternary matmuls can reach.
 * The ceiling the benchmarks divide by is the larger (the stricter for us): the last line.
 *
 * Each thread runs 6 independent chains with 6 different u8 operands (6 + 6 accumulators + 2 constants
 * + 2 temporaries fill the 16 ymm registers: more would spill). The empty asm statement after each
 * round tells the compiler that every operand may have changed, so it can neither hoist the products out
 * of the loop nor fold the chains into one (../shared/tools/int8_avx2.c uses one operand for all 8
 * chains: gcc computes its product once per round, so it times 1 multiply per 8 counted).
 *
 *   gcc -O2 -mavx2 -pthread int8_avx2.c -o int8_avx2 && ./int8_avx2 2
 * prints "threads=N int8 GMAC/s X" (the pair), "threads=N ternary-step GMAC/s Y", then
 * "threads=N int8 ceiling GMAC/s max(X, Y)" (each: best of 3 runs).
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "chain_rate.h" /* now_s, chain_rate: the best of 3 timed runs */

#define ITERS 20000000L
#define CHAINS 6

/* one 32-MAC step of chain i: acc_i += madd(maddubs(a_i, b), 1) */
#define STEP(i) c##i = _mm256_add_epi32(c##i, _mm256_madd_epi16(_mm256_maddubs_epi16(a##i, b), one))
/* the ternary kernels' step: acc_i += maddubs(a_i, b) in s16 */
#define STEP16(i) c##i = _mm256_add_epi16(c##i, _mm256_maddubs_epi16(a##i, b))

static void *ternary_chains(void *arg) {
    const char seed = (char)(long)arg;
    const __m256i b = _mm256_set1_epi8(3);
    __m256i a0 = _mm256_set1_epi8(seed + 1), a1 = _mm256_set1_epi8(seed + 2), a2 = _mm256_set1_epi8(seed + 3);
    __m256i a3 = _mm256_set1_epi8(seed + 4), a4 = _mm256_set1_epi8(seed + 5), a5 = _mm256_set1_epi8(seed + 6);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    for (long it = 0; it < ITERS; it++) {
        STEP16(0); STEP16(1); STEP16(2); STEP16(3); STEP16(4); STEP16(5);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    }
    const __m256i c = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(c0, c1), _mm256_add_epi16(c2, c3)),
                                       _mm256_add_epi16(c4, c5));
    return (void *)(long)_mm256_extract_epi16(c, 0);
}

static void *chains(void *arg) {
    const char seed = (char)(long)arg;
    const __m256i b = _mm256_set1_epi8(3), one = _mm256_set1_epi16(1);
    __m256i a0 = _mm256_set1_epi8(seed + 1), a1 = _mm256_set1_epi8(seed + 2), a2 = _mm256_set1_epi8(seed + 3);
    __m256i a3 = _mm256_set1_epi8(seed + 4), a4 = _mm256_set1_epi8(seed + 5), a5 = _mm256_set1_epi8(seed + 6);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    for (long it = 0; it < ITERS; it++) {
        STEP(0); STEP(1); STEP(2); STEP(3); STEP(4); STEP(5);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    }
    const __m256i c = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                       _mm256_add_epi32(c4, c5));
    return (void *)(long)_mm256_extract_epi32(c, 0);
}

int main(int argc, char **argv) {
    const int th = argc > 1 ? atoi(argv[1]) : 2;
    if (th < 1 || th > 256) { fprintf(stderr, "threads must be 1..256\n"); return 2; }
    const double macs = (double)ITERS * CHAINS * 32; /* per thread */
    const double pair = chain_rate(chains, th, macs), ternary = chain_rate(ternary_chains, th, macs);
    printf("threads=%d int8 GMAC/s %.1f\n", th, pair);
    printf("threads=%d ternary-step GMAC/s %.1f\n", th, ternary);
    printf("threads=%d int8 ceiling GMAC/s %.1f\n", th, pair > ternary ? pair : ternary);
    return 0;
}
