/* AVX-512 VNNI int8 multiply-add ceiling: the rate of vpdpbusd on 512-bit registers (u8 x s8, four products
 * summed into each of 16 int32 lanes = 64 MACs per instruction), the AVX-512 kernels' only multiply step.
 * The ceiling the benchmarks divide by for the avx512 path (int8_avx2.c is the one for the 256-bit paths).
 *
 * Each thread runs 12 independent accumulator chains (vpdpbusd has a latency of several cycles; 12 chains
 * cover it on the CPUs we have), each with its own u8 operand, written in assembly (see chains) so that the
 * loop is the 12 instructions and nothing else.
 *
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vnni -pthread int8_vnni.c -o int8_vnni && ./int8_vnni 2
 * prints "threads=N int8 ceiling GMAC/s X" (best of 3 runs). Exits 3 with a message on a CPU without VNNI.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "chain_rate.h" /* now_s, chain_rate: the best of 3 timed runs */

#define ITERS 50000000L
#define CHAINS 12

/* The whole loop in assembly: with intrinsics GCC copies the accumulators between registers and to the stack on
 * every round (measured: 146 instead of ~200 GMAC/s per core on Zen 4). Accumulators zmm0-zmm11, one u8 operand
 * per chain in zmm20-zmm31 (chain i: bytes i + 1), the s8 operand 3 in zmm19. */
#define DP(acc, a) "vpdpbusd %%zmm19, %%zmm" #a ", %%zmm" #acc "\n\t"
static void *chains(void *arg) {
    (void)arg;
    long n = ITERS;
    __asm__ volatile(
        "vpbroadcastd %[b], %%zmm19\n\t"
        "vpternlogd $0xff, %%zmm20, %%zmm20, %%zmm20\n\t" /* all ones: bytes 0xff; the rest from it */
        "vpabsb %%zmm20, %%zmm20\n\t"                      /* bytes 1 */
        "vpaddb %%zmm20, %%zmm20, %%zmm21\n\t" "vpaddb %%zmm20, %%zmm21, %%zmm22\n\t"
        "vpaddb %%zmm20, %%zmm22, %%zmm23\n\t" "vpaddb %%zmm20, %%zmm23, %%zmm24\n\t"
        "vpaddb %%zmm20, %%zmm24, %%zmm25\n\t" "vpaddb %%zmm20, %%zmm25, %%zmm26\n\t"
        "vpaddb %%zmm20, %%zmm26, %%zmm27\n\t" "vpaddb %%zmm20, %%zmm27, %%zmm28\n\t"
        "vpaddb %%zmm20, %%zmm28, %%zmm29\n\t" "vpaddb %%zmm20, %%zmm29, %%zmm30\n\t"
        "vpaddb %%zmm20, %%zmm30, %%zmm31\n\t"
        "vpxord %%zmm0, %%zmm0, %%zmm0\n\t" "vmovdqa64 %%zmm0, %%zmm1\n\t" "vmovdqa64 %%zmm0, %%zmm2\n\t"
        "vmovdqa64 %%zmm0, %%zmm3\n\t" "vmovdqa64 %%zmm0, %%zmm4\n\t" "vmovdqa64 %%zmm0, %%zmm5\n\t"
        "vmovdqa64 %%zmm0, %%zmm6\n\t" "vmovdqa64 %%zmm0, %%zmm7\n\t" "vmovdqa64 %%zmm0, %%zmm8\n\t"
        "vmovdqa64 %%zmm0, %%zmm9\n\t" "vmovdqa64 %%zmm0, %%zmm10\n\t" "vmovdqa64 %%zmm0, %%zmm11\n\t"
        "1:\n\t"
        DP(0, 20) DP(1, 21) DP(2, 22) DP(3, 23) DP(4, 24) DP(5, 25)
        DP(6, 26) DP(7, 27) DP(8, 28) DP(9, 29) DP(10, 30) DP(11, 31)
        "dec %[n]\n\t"
        "jnz 1b\n\t"
        : [n] "+r"(n)
        : [b] "r"(0x03030303)
        : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", "zmm11",
          "zmm19", "zmm20", "zmm21", "zmm22", "zmm23", "zmm24", "zmm25", "zmm26", "zmm27", "zmm28", "zmm29",
          "zmm30", "zmm31", "cc");
    return NULL;
}

int main(int argc, char **argv) {
    const int th = argc > 1 ? atoi(argv[1]) : 2;
    if (th < 1 || th > 256) { fprintf(stderr, "threads must be 1..256\n"); return 2; }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni")) { fprintf(stderr, "this CPU has no AVX-512 VNNI\n"); return 3; }
    printf("threads=%d int8 ceiling GMAC/s %.1f\n", th, chain_rate(chains, th, (double)ITERS * CHAINS * 64));
    return 0;
}
