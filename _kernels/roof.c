/* The read roof: how fast the engine's threads can stream memory they only read, which is the ceiling of a
 * decode step (it reads every weight once per token). The model picker divides it by a model's bytes per
 * token to say what decode speed to expect (bitnet_app/catalog.py). Plain C (the compiler vectorizes the
 * sums); benchmarks/ceilings/readbw.c is the AVX2 tool with prefetch that the benchmarks quote.
 *
 * The buffer (bytes, touched once first so its pages exist, advised for 2 MB pages like the weights) is cut into CHUNKS pieces that the pool's
 * threads take from an atomic counter (pool.h: whoever joins the job shares the work); the figure is the
 * best of `passes` timed passes. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitnet.h"
#include "platform.h"
#include "pool.h"

#define CHUNKS 64

typedef struct {
    const uint64_t *p;
    size_t words_per_chunk;
    atomic_int next;
    atomic_ullong sink; /* the sums, so the loads are not optimised away */
} roof_job;

static void read_chunks(void *arg, int thread, int n_threads) {
    (void)thread;
    (void)n_threads;
    roof_job *j = arg;
    int c;
    while ((c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < CHUNKS) {
        const uint64_t *w = j->p + (size_t)c * j->words_per_chunk;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= j->words_per_chunk; i += 4) {
            s0 += w[i];
            s1 += w[i + 1];
            s2 += w[i + 2];
            s3 += w[i + 3];
        }
        atomic_fetch_add_explicit(&j->sink, s0 + s1 + s2 + s3, memory_order_relaxed);
    }
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double bn_read_roof_gb_s(int n_threads, size_t bytes, int passes) {
    const size_t words = bytes / sizeof(uint64_t) / (CHUNKS * 4) * (CHUNKS * 4);
    if (words == 0 || passes < 1) return -1.0;
    /* 2 MB pages where the OS gives them, as the engine's weights get (bitnet_app/engine/resident.py) */
    const size_t huge = (size_t)2 << 20, size = (words * sizeof(uint64_t) + huge - 1) / huge * huge;
    uint64_t *buf = aligned_alloc(huge, size);
    bn_advise_huge_pages(buf, size);
    bn_pool *pool = bn_pool_create(n_threads);
    if (!buf || !pool) {
        free(buf);
        bn_pool_free(pool);
        return -1.0;
    }
    memset(buf, 1, words * sizeof(uint64_t));
    roof_job j = {.p = buf, .words_per_chunk = words / CHUNKS};
    atomic_init(&j.sink, 0);
    double best = 0.0;
    for (int pass = 0; pass <= passes; pass++) { /* pass 0: warm-up */
        atomic_store(&j.next, 0);
        const double t = seconds();
        bn_pool_run(pool, read_chunks, &j);
        const double dt = seconds() - t;
        const double gb_s = (double)(words * sizeof(uint64_t)) / dt / 1e9;
        if (pass > 0 && gb_s > best) best = gb_s;
    }
    bn_pool_free(pool);
    free(buf);
    return atomic_load(&j.sink) == 1 ? -1.0 : best; /* the sum of 0x0101.. words is never 1 */
}
