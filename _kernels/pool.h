/* A tiny persistent thread pool (pthreads, no OpenMP). The caller always runs a job; idle workers
 * join it while it is open. A job must therefore share its work through atomic counters, so that
 * it is correct whatever number of threads end up running it (see pool.c). */
#ifndef BITNET_POOL_H
#define BITNET_POOL_H

typedef void (*bn_job_fn)(void *arg, int thread, int n_threads);
typedef struct bn_pool bn_pool;

#define BN_POOL_MAX_THREADS 256

/* n_threads in [1, BN_POOL_MAX_THREADS], the caller included. Returns NULL when out of range or out of
 * memory; if the OS refuses to start some threads the pool runs with those it got (bn_pool_size). */
bn_pool *bn_pool_create(int n_threads);
void bn_pool_free(bn_pool *p);
int bn_pool_size(const bn_pool *p);
/* Run fn(arg, t, n) on the caller (t = 0) and on every worker that joins in time (worker i always as t = i,
 * distinct within a job, < n); returns once the caller's call and every joined call returned. */
void bn_pool_run(bn_pool *p, bn_job_fn fn, void *arg);

/* A pause for spin-wait loops (the x86 `pause` instruction; nothing elsewhere). */
void bn_pool_relax(void);

#endif
