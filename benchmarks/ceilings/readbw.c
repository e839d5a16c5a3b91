/* Read roof: how fast N threads can stream memory they only read, the ceiling of a decode step (which reads
 * every weight once per token). Each thread sums its own contiguous slice of a 1 GiB buffer with 256-bit loads
 * and software prefetch 2 KB ahead (as the engine's kernels do); the sums are printed so nothing is optimised
 * away. Plain AVX2, so it runs on every x86-64 CPU the engine's fast paths run on.
 *
 *   gcc -O2 -mavx2 -pthread readbw.c -o readbw && ./readbw 2
 * prints "threads=N read GB/s X" (best of 5 passes over the buffer, after one warm-up pass).
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES (1L << 30)
#define PASSES 5

typedef struct {
    const uint8_t *p;
    long n;          /* bytes, a multiple of 128 */
    long long sum;   /* keeps the loads alive */
} slice;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *read_slice(void *arg) {
    slice *s = arg;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < s->n; i += 128) {
        _mm_prefetch((const char *)(s->p + i + 2048), _MM_HINT_T0);
        _mm_prefetch((const char *)(s->p + i + 2048 + 64), _MM_HINT_T0);
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(s->p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(s->p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(s->p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(s->p + i + 96)));
    }
    __m256i t = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    long long lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, t);
    s->sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    return NULL;
}

int main(int argc, char **argv) {
    int th = argc > 1 ? atoi(argv[1]) : 2;
    if (th < 1 || th > 256) {
        fprintf(stderr, "threads must be 1..256\n");
        return 2;
    }
    uint8_t *buf = aligned_alloc(64, BYTES);
    if (!buf) {
        fprintf(stderr, "cannot allocate 1 GiB\n");
        return 1;
    }
    memset(buf, 1, BYTES);  /* touch every page before timing */
    long per = (BYTES / th) & ~127L;
    pthread_t tid[256];
    slice sl[256];
    double best = 0;
    long long total = 0;
    for (int pass = 0; pass <= PASSES; pass++) {  /* pass 0 is the warm-up */
        double t0 = now_s();
        for (int i = 0; i < th; i++) {
            sl[i] = (slice){.p = buf + (long)i * per, .n = per, .sum = 0};
            pthread_create(&tid[i], NULL, read_slice, &sl[i]);
        }
        for (int i = 0; i < th; i++) {
            pthread_join(tid[i], NULL);
            total += sl[i].sum;
        }
        double gbs = (double)per * th / (now_s() - t0) / 1e9;
        if (pass > 0 && gbs > best) best = gbs;
    }
    printf("threads=%d read GB/s %.1f\n", th, best);
    if (total == 42) printf(" ");
    free(buf);
    return 0;
}
