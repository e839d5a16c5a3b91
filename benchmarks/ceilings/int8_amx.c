/* AMX-INT8 multiply-add ceiling: the rate of tdpbusd on tile registers (16 x 64 u8 times 64 x 16 s8 into 16 x 16
 * int32 = 16,384 MACs per instruction), the amx path's multiply step for batches of 8 tokens or more.
 * The ceiling the benchmarks divide by for the amx path.
 *
 * Each thread keeps 4 independent accumulator tiles (tmm0-3) fed from 2 A and 2 B tiles (tmm4-7) that stay in
 * the registers, so the loop is the 4 multiplies and nothing else.
 *
 *   gcc -O2 -mamx-tile -mamx-int8 -pthread int8_amx.c -o int8_amx && ./int8_amx 2
 * prints "threads=N int8 ceiling GMAC/s X" (best of 3 runs). Exits 3 with a message where the CPU has no AMX-INT8
 * or Linux does not grant this process the tiles.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "chain_rate.h" /* now_s, chain_rate: the best of 3 timed runs */

#define ITERS 5000000L
#define CHAINS 4

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tile_config;

static void *chains(void *arg) {
    (void)arg;
    static const uint8_t ones[16 * 64] = {1};
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.rows[i] = 16, c.colsb[i] = 64;
    __asm__ volatile("" : : "r"(&c) : "memory"); /* gcc 12 otherwise drops the stores that fill c */
    _tile_loadconfig(&c);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long i = 0; i < ITERS; i++) {
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    _tile_release();
    return NULL;
}

int main(int argc, char **argv) {
    const int th = argc > 1 ? atoi(argv[1]) : 2;
    if (th < 1 || th > 256) { fprintf(stderr, "threads must be 1..256\n"); return 2; }
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!((d >> 24) & 1) || !((d >> 25) & 1) || syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18)) {
        fprintf(stderr, "this CPU (or OS) gives no AMX-INT8 tiles\n");
        return 3;
    }
    printf("threads=%d int8 ceiling GMAC/s %.1f\n", th, chain_rate(chains, th, (double)ITERS * CHAINS * 16384));
    return 0;
}
