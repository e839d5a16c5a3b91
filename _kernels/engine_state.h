/* The engine's state (struct bn_engine) and the calls between its parts, each of which calls only the ones below it:
 *   engine_api.c  creation, freeing and the forward call (bitnet.h)
 *   schedule.c    the stage list of a forward (plan), how its items are shared between the threads, and the run
 *   forward.c     the same forward on one thread, in the order of the maths: the scheduler's oracle
 *   layer.c       the layer maths: what a step computes for one token, one tile of tokens or a range of weight
 *                 rows (layer.h), which knows nothing of threads
 *   kernels.h     the kernel table of the CPU's path (dispatch.c), which every step computes with
 * Shape letters: bitnet.h.
 */
#ifndef BITNET_ENGINE_STATE_H
#define BITNET_ENGINE_STATE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "bitnet.h"
#include "kernels.h"
#include "pool.h"

#define ROUND16(n) (((n) + 15) / 16 * 16)
/* An attention tile takes up to ATTN_MAX_ROWS consecutive tokens (schedule.c takes fewer when that leaves too few
 * items per thread), so each key and value tile serves all of them. */
#define ATTN_MAX_ROWS 8

/* The arguments of the running forward (read by every thread of the job). */
typedef struct {
    int T, start, kv_end, block; /* block: 0 causal, else the block size of block attention */
    const int32_t *rows;         /* logit rows (n_rows) */
    int n_rows;
    int trim_last;               /* 1: the last layer runs only the logit rows after writing every token's K/V
                                    (engine_api.c trims_last_layer) */
} forward_args;

struct bn_engine {
    bn_model m;
    bn_layer *layers; /* own copy of the layer table */
    const bn_kernels *k;
    bn_pool *pool;
    int exact_head, ctx;
    int dp, ip, qkv_np, gu_np, vp; /* padded sizes: D, I, H*hd + 2*G*hd, 2I, V rounded up to 16 */
    int xn_ld;                     /* row stride of xn: max(Dp, Ip) */
    int kv;                        /* the KV cache's elements: enum bn_kv (float32, IEEE half, int8) */
    float *k_scale, *v_scale;      /* int8 cache: (L, G, C) each row's scale (absmax / 127), else NULL */
    void *k_cache, *v_cache;       /* (L, G, C, hd) of kv's type: each head's rows contiguous, so an attention
                                      item streams them (not 1 row in G) */
    float *rope_cos, *rope_sin;    /* (C, hd/2) */
    /* scratch, sized for cap_t tokens and cap_rows logit rows (grown, never shrunk) */
    int cap_t, cap_rows;
    float *x;         /* (T, D) the residual stream */
    float *xn;        /* (T, max(Dp, Ip)) a normed row before quant8; the exact head's normed rows (n_rows, D) */
    float *qkv;       /* (T, qkv_np) */
    float *att;       /* (T, D) attention output; the final rows (n_rows, D) before the head */
    float *proj;      /* (T, Dp) o_proj and down_proj outputs, added to x by the next stage */
    float *gu;        /* (T, gu_np) [gate | up]; relu(gate)^2 * up overwrites the gate half */
    float *scores;    /* (threads, scores_ld) each thread's attention scratch: BN_ATTN_SCRATCH(ATTN_MAX_ROWS, H/G, hd, C) */
    size_t scores_ld;
    float *logit_buf; /* (rows, Vp) the head's output before the copy to the caller's (rows, V) */
    int8_t *xq;       /* (T, max(Dp, Ip)) quant8 rows, at stride Kp of the matrix that reads them */
    int32_t *xsum;    /* (T,) sum of each quant8 row */
    float *xinv;      /* (T,) 1 / quant8 scale of each row */
    /* the running forward */
    forward_args fa;
    struct bn_schedule *sched; /* schedule.c's stage list and counters */
    float *q_last;             /* (cap_rows, D) the trimmed last layer's query rows, gathered by its attention tiles */
    /* development timing (bn_engine_set_profile): seconds per part, added by the calling thread */
    int profiling;
    double prof[BN_PART_COUNT];
    double inside; /* the calling thread's time inside pool jobs */
};

/* Development timing (bn_engine_set_profile): a monotonic clock in seconds. */
static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* schedule.c: its state for an engine of n_layers layers and n_threads threads (NULL when out of memory), the stage
 * list of the forward described by e->fa, then its run on the engine's threads */
struct bn_schedule *bn_schedule_create(int n_layers, int n_threads);
void bn_schedule_free(struct bn_schedule *s);
void bn_plan_forward(bn_engine *e);
void bn_run_forward(bn_engine *e);

/* forward.c: the forward described by e->fa (trim_last 0) on the calling thread, from the tokens to logit_buf */
void bn_forward_serial(bn_engine *e, const int32_t *tokens);

#endif
