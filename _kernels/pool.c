#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ROUNDS 200000 /* about 1-5 ms of polling before a worker goes to sleep */

struct bn_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_int generation; /* bumped once per job */
    atomic_int pending;    /* workers still running the current job */
    atomic_int sleepers;
    int stop;
    bn_job_fn fn;
    void *arg;
};

typedef struct { bn_pool *pool; int index; } worker_arg;

static void *worker_main(void *p) {
    worker_arg *wa = p;
    bn_pool *pool = wa->pool;
    const int index = wa->index;
    free(wa);
    int seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool->generation, memory_order_acquire) == seen) {
            if (++spins < SPIN_ROUNDS) { cpu_relax(); continue; }
            pthread_mutex_lock(&pool->lock);
            atomic_fetch_add(&pool->sleepers, 1);
            while (atomic_load(&pool->generation) == seen && !pool->stop) pthread_cond_wait(&pool->wake, &pool->lock);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->lock);
            spins = 0;
        }
        if (pool->stop) return NULL;
        seen = atomic_load(&pool->generation);
        pool->fn(pool->arg, index, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

bn_pool *bn_pool_create(int n_threads) {
    bn_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = calloc((size_t)p->n, sizeof(pthread_t));
    for (int i = 1; i < p->n; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) { /* run with fewer threads */
            free(wa);
            p->n = i;
            break;
        }
    }
    return p;
}

int bn_pool_size(const bn_pool *p) { return p->n; }

void bn_pool_run(bn_pool *p, bn_job_fn fn, void *arg) {
    if (p->n == 1) { fn(arg, 0, 1); return; }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleepers)) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    fn(arg, 0, p->n);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) cpu_relax();
}

void bn_pool_free(bn_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p);
}
