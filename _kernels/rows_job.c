/* The sampler's rows (greedy.c, sample.c) on the engine's threads (bitnet.h: bn_engine_greedy_rows,
 * bn_engine_sample_rows). A diffusion step samples up to a sub-block of rows, each one a pass or more over the whole
 * vocabulary (~2 us for the greedy confidence of a 4k row, ~7-14 us for a draw): the calling thread and every
 * worker that joins the pool job take rows one at a time from a shared counter. A row is computed by the same
 * single-row call whichever thread takes it, so the ids and probabilities are those of the single-threaded
 * functions, whatever the thread count. The caller computes in the engine's float mode for the job (float_mode.h),
 * as the workers always do. */
#include <stdatomic.h>

#include "bitnet.h"
#include "float_mode.h"
#include "kernels.h"
#include "pool.h"

const bn_kernels *bn_engine_kernels(const bn_engine *e); /* engine_api.c */
bn_pool *bn_engine_pool(bn_engine *e);

typedef struct {
    const bn_kernels *k;
    const float *x; /* (R, V) logit rows */
    int R, V;
    const int32_t *banned; /* the ids taken as -inf */
    int n_banned;
    double temperature, top_p; /* sampling when temperature > 0, else greedy */
    int top_k;
    const double *u; /* (R,) the draws' uniforms */
    int64_t *ids;
    double *probs;
    atomic_int next;   /* the next row to take */
    atomic_int failed; /* a draw ran out of memory */
} rows_job;

static void rows_worker(void *arg, int thread, int n_threads) {
    (void)thread;
    (void)n_threads;
    rows_job *j = arg;
    for (int r; (r = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->R;) {
        const float *row = j->x + (size_t)r * j->V;
        if (j->temperature > 0.0) {
            if (bn_sample_rows(j->k, row, 1, j->V, j->temperature, j->top_k, j->top_p, j->u + r, j->banned,
                               j->n_banned, j->ids + r, j->probs + r))
                atomic_store_explicit(&j->failed, 1, memory_order_relaxed);
        } else {
            bn_greedy_rows(j->k, row, 1, j->V, j->banned, j->n_banned, j->ids + r, j->probs + r);
        }
    }
}

static int run_rows(bn_engine *e, rows_job *j) {
    j->k = bn_engine_kernels(e);
    atomic_init(&j->next, 0);
    atomic_init(&j->failed, 0);
    const unsigned caller_mode = bn_flush_denormals();
    if (j->R > 1) bn_pool_run(bn_engine_pool(e), rows_worker, j); /* the pool's release/acquire publish the rows */
    else rows_worker(j, 0, 1);
    bn_restore_float_mode(caller_mode);
    return atomic_load(&j->failed) ? -1 : 0;
}

int bn_engine_greedy_rows(bn_engine *e, const float *x, int R, int V, const int32_t *banned, int n_banned,
                          int64_t *ids, double *probs) {
    rows_job j = {.x = x, .R = R, .V = V, .banned = banned, .n_banned = n_banned, .ids = ids, .probs = probs};
    return run_rows(e, &j);
}

int bn_engine_sample_rows(bn_engine *e, const float *x, int R, int V, double temperature, int top_k, double top_p,
                          const double *u, const int32_t *banned, int n_banned, int64_t *ids, double *probs) {
    rows_job j = {.x = x, .R = R, .V = V, .banned = banned, .n_banned = n_banned, .temperature = temperature,
                  .top_k = top_k, .top_p = top_p, .u = u, .ids = ids, .probs = probs};
    return run_rows(e, &j);
}
