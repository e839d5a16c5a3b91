/* The timing of the int8 ceiling tools (int8_avx2.c, int8_vnni.c): th threads each run `body` (independent
 * multiply-add chains on registers) at once; the best of 3 runs, in GMAC/s, given the multiply-adds one thread's
 * body does. */
#ifndef CEILINGS_CHAIN_RATE_H
#define CEILINGS_CHAIN_RATE_H

#include <pthread.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* best GMAC/s of 3 runs of th (<= 256) threads running body(thread number) */
static double chain_rate(void *(*body)(void *), int th, double macs_per_thread) {
    pthread_t ids[256];
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = now_s();
        for (int i = 0; i < th; i++) pthread_create(&ids[i], NULL, body, (void *)(long)i);
        for (int i = 0; i < th; i++) pthread_join(ids[i], NULL);
        const double g = macs_per_thread * th / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

#endif
