/* Read roof: how fast N threads can stream memory they only read, the ceiling of a decode step (which reads
 * every weight once per token). Each thread sums its own contiguous slice of a 1 GiB buffer with 256-bit loads;
 * the sums are printed so nothing is optimised away. Plain AVX2, so it runs on every x86-64 CPU the engine's
 * fast paths run on.
 *
 * The roof is the best of four ways of reading, because each of them is the fastest on some machine:
 *   pages     4 KB (the default for anonymous memory) or 2 MB (madvise MADV_HUGEPAGE, as the engine's
 *             weights get: bitnet_app/engine/resident.py); 2 MB pages spare the TLB a miss every 4 KB
 *   prefetch  none (the hardware prefetcher alone) or software prefetch 2 KB ahead (as the engine's kernels,
 *             whose loads are spread between arithmetic). On an AMD EPYC Zen 3 guest: 4 KB pages 28 GB/s with
 *             prefetch, 32 without; 2 MB pages 30 and 33.
 *
 *   gcc -O2 -mavx2 -pthread readbw.c -o readbw && ./readbw 2
 * prints one line per way and last "threads=N read GB/s X", the best (each way: best of 5 passes over the
 * buffer, after one warm-up pass).
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define BYTES (1L << 30)
#define PASSES 5

typedef struct {
    const uint8_t *p;
    long n;          /* bytes, a multiple of 128 */
    int prefetch;    /* software prefetch 2 KB ahead */
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
        if (s->prefetch) {
            _mm_prefetch((const char *)(s->p + i + 2048), _MM_HINT_T0);
            _mm_prefetch((const char *)(s->p + i + 2048 + 64), _MM_HINT_T0);
        }
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

/* GB/s of the best of PASSES timed passes of th threads over buf (one warm-up pass first) */
static double roof(const uint8_t *buf, int th, int prefetch, long long *total) {
    long per = (BYTES / th) & ~127L;
    pthread_t tid[256];
    slice sl[256];
    double best = 0;
    for (int pass = 0; pass <= PASSES; pass++) {
        double t0 = now_s();
        for (int i = 0; i < th; i++) {
            sl[i] = (slice){.p = buf + (long)i * per, .n = per, .prefetch = prefetch, .sum = 0};
            pthread_create(&tid[i], NULL, read_slice, &sl[i]);
        }
        for (int i = 0; i < th; i++) {
            pthread_join(tid[i], NULL);
            *total += sl[i].sum;
        }
        double gbs = (double)per * th / (now_s() - t0) / 1e9;
        if (pass > 0 && gbs > best) best = gbs;
    }
    return best;
}

int main(int argc, char **argv) {
    int th = argc > 1 ? atoi(argv[1]) : 2;
    if (th < 1 || th > 256) {
        fprintf(stderr, "threads must be 1..256\n");
        return 2;
    }
    double best = 0;
    long long total = 0;
    for (int huge = 0; huge <= 1; huge++) {
        uint8_t *buf = aligned_alloc(2L << 20, BYTES);
        if (!buf) {
            fprintf(stderr, "cannot allocate 1 GiB\n");
            return 1;
        }
        if (huge) madvise(buf, BYTES, MADV_HUGEPAGE); /* advice: where refused, this way equals the other */
        memset(buf, 1, BYTES);                        /* touch every page before timing */
        for (int prefetch = 0; prefetch <= 1; prefetch++) {
            const double g = roof(buf, th, prefetch, &total);
            printf("threads=%d pages %s prefetch %s read GB/s %.1f\n", th, huge ? "2MB" : "4KB",
                   prefetch ? "2KB" : "none", g);
            if (g > best) best = g;
        }
        free(buf);
    }
    printf("threads=%d read GB/s %.1f\n", th, best);
    if (total == 42) printf(" ");
    return 0;
}
