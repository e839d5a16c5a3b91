/* Thread pool with optional joining.
 *
 * A job is a function that takes work items from a shared atomic counter until none are left, so any
 * number of threads may run it. The caller always runs it; idle workers join while the job is open.
 * When the caller runs out of items it closes the job and waits only for the workers that joined:
 * a worker the OS has not scheduled (a busy machine, the Streamlit server on the other core) can
 * never stall a forward.
 *
 * state (64 bits) = job generation << 32 | CLOSED bit | number of workers that joined.
 * Workers spin briefly between jobs (a forward issues hundreds of jobs back to back), then sleep on
 * a condition variable so an idle engine costs no CPU.
 */
#include "pool.h"

#include "float_mode.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__) /* the spin-wait hint: lets an SMT sibling or the core's power state make use of the wait */
#define cpu_relax() __asm__ volatile("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ROUNDS 100000 /* about 1-3 ms of polling before a worker goes to sleep */
#define CLOSED ((uint64_t)1 << 31)
#define JOINED_MASK (CLOSED - 1)

typedef struct {
    struct bn_pool *pool;
    int index; /* 1..n-1: the thread number this worker always runs jobs as */
} worker_arg;

struct bn_pool {
    int n;
    pthread_t *threads;
    worker_arg *args;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    _Atomic uint64_t state;
    atomic_int done;     /* workers of the current job that finished it */
    atomic_int sleepers;
    atomic_int stop;
    bn_job_fn fn;
    void *arg;
};

static inline uint32_t gen_of(uint64_t s) { return (uint32_t)(s >> 32); }

static void *worker_main(void *p) {
    bn_pool *pool = ((worker_arg *)p)->pool;
    const int index = ((worker_arg *)p)->index;
    uint32_t seen = 0;
    int spins = 0;
    bn_flush_denormals(); /* the engine's float mode (float_mode.h): a worker runs nothing else */
    while (!atomic_load_explicit(&pool->stop, memory_order_acquire)) {
        uint64_t s = atomic_load_explicit(&pool->state, memory_order_acquire);
        if (gen_of(s) == seen || (s & CLOSED)) {
            seen = gen_of(s);
            if (++spins < SPIN_ROUNDS) {
                cpu_relax(); /* no sched_yield: it would hand the core to any background job for a slice */
                continue;
            }
            pthread_mutex_lock(&pool->lock);
            atomic_fetch_add(&pool->sleepers, 1);
            while (gen_of(atomic_load(&pool->state)) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->wake, &pool->lock);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->lock);
            spins = 0;
            continue;
        }
        /* an open job we have not joined: join it (fails if it closed or changed meanwhile) */
        if (!atomic_compare_exchange_weak_explicit(&pool->state, &s, s + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        seen = gen_of(s);
        spins = 0;
        pool->fn(pool->arg, index, pool->n); /* always the same number: a job can give each thread the same share */
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
    }
    return NULL;
}

bn_pool *bn_pool_create(int n_threads) {
    if (n_threads < 1 || n_threads > BN_POOL_MAX_THREADS) return NULL;
    bn_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    p->threads = calloc((size_t)p->n, sizeof(pthread_t));
    p->args = calloc((size_t)p->n, sizeof(worker_arg));
    if (!p->threads || !p->args || pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p->threads);
        free(p->args);
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->wake, NULL) != 0) {
        pthread_mutex_destroy(&p->lock);
        free(p->threads);
        free(p->args);
        free(p);
        return NULL;
    }
    atomic_init(&p->state, CLOSED); /* generation 0, closed: nothing to join */
    for (int i = 1; i < p->n; i++) {
        p->args[i] = (worker_arg){p, i};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) { /* run with the threads we got */
            p->n = i;
            break;
        }
    }
    return p;
}

int bn_pool_size(const bn_pool *p) { return p->n; }

void bn_pool_relax(void) { cpu_relax(); }

void bn_pool_run(bn_pool *p, bn_job_fn fn, void *arg) {
    if (p->n == 1) { fn(arg, 0, 1); return; }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint64_t gen = gen_of(atomic_load(&p->state)) + 1;
    atomic_store(&p->state, (uint64_t)gen << 32); /* open, nobody joined; seq_cst pairs with the sleepers check */
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    fn(arg, 0, p->n);
    const uint64_t s = atomic_fetch_or_explicit(&p->state, CLOSED, memory_order_acq_rel);
    const int joined = (int)(s & JOINED_MASK);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < joined) cpu_relax();
}

void bn_pool_free(bn_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->state, (uint64_t)1 << 32); /* wake sleepers: the generation changed */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p->args);
    free(p);
}
