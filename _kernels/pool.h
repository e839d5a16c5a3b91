/* A tiny persistent thread pool: the caller is thread 0, workers 1..n-1 wait for work.
 * Workers spin briefly after each job (a forward issues hundreds of jobs back to back), then sleep
 * on a condition variable so an idle engine costs no CPU. Built on pthreads: no OpenMP needed. */
#ifndef BITNET_POOL_H
#define BITNET_POOL_H

typedef void (*bn_job_fn)(void *arg, int thread, int n_threads);
typedef struct bn_pool bn_pool;

bn_pool *bn_pool_create(int n_threads);
void bn_pool_free(bn_pool *p);
int bn_pool_size(const bn_pool *p);
/* Run fn(arg, t, n) on every thread t = 0..n-1 and wait until all return. */
void bn_pool_run(bn_pool *p, bn_job_fn fn, void *arg);

#endif
