/* The engine's state (struct bn_engine) and the stage list of one forward, shared by the forward's two halves:
 *   forward.c   the layer maths: what a stage computes for one token, one tile of weight rows or one attention tile
 *               (read it beside bitnet_app/engine/reference.py), and the engine's creation and the forward call
 *   schedule.c  the stage list of a forward (plan), how its items are shared between the threads, and the run
 * Shape letters: bitnet.h.
 */
#ifndef BITNET_ENGINE_STATE_H
#define BITNET_ENGINE_STATE_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "bitnet.h"
#include "kernels.h"
#include "pool.h"

#define ROUND16(n) (((n) + 15) / 16 * 16)
/* An attention item takes up to ATTN_MAX_ROWS consecutive tokens (schedule.c takes fewer when that leaves too few
 * items per thread), so each key and value tile serves all of them. */
#define ATTN_MAX_ROWS 8

/* The stages of one layer, in order; the item of each is given in brackets. */
typedef enum {
    STAGE_ATTN_NORM, /* [token] x += proj (the previous layer's down_proj); xq = quant8(rmsnorm(x) * attn_norm) */
    STAGE_QKV,       /* [row tiles] qkv = ternary(qkv) @ xq */
    STAGE_ROPE_KV,   /* [token] RoPE on its q and k heads; its k, v -> the cache at its position */
    STAGE_ATTENTION, /* [token, kv head] att = attention of the group's query heads over the visible keys */
    STAGE_ATTN_SUB,  /* [token] xq = quant8(rmsnorm(att) * attn_sub_norm) */
    STAGE_O,         /* [row tiles] proj = ternary(o) @ xq */
    STAGE_FFN_NORM,  /* [token] x += proj; xq = quant8(rmsnorm(x) * ffn_norm) */
    STAGE_GATE_UP,   /* [row tiles] gu = ternary(gate_up) @ xq */
    STAGE_FFN_SUB,   /* [token] gate := act(gate) * up; xq = quant8(rmsnorm(gate) * ffn_sub_norm) or quant8(gate) */
    STAGE_DOWN,      /* [row tiles] proj = ternary(down) @ xq */
    STAGES_PER_LAYER
} layer_stage;

/* After the last layer. */
typedef enum {
    STAGE_HEAD_NORM, /* [logit row] x[row] + proj[row] -> final norm (and quant8 for the int8 head) */
    STAGE_HEAD,      /* [row tiles, or vocabulary rows for the exact head] logits = head @ normed rows */
    HEAD_STAGES
} head_stage;

/* KIND_CHAIN (token_split batches): the token-local stages from this one up to the next attention, run one after
 * the other on one run of tokens per item; the stages it stands for are `folded` (see schedule.c). */
typedef enum { KIND_TOKENS, KIND_TERNARY, KIND_ATTENTION, KIND_INT8_HEAD, KIND_EXACT_HEAD, KIND_CHAIN } stage_kind;

/* One stage of the running forward: its items and the count of those done (its own cache line; the counters of
 * the threads' ranges are in bn_engine.take). */
typedef struct {
    alignas(64) atomic_int done; /* items finished */
    int n_items;
    int shared;                  /* 1: worth sharing between threads (see schedule.c), 0: the caller runs it */
    stage_kind kind;
    const bn_ternary *w;         /* KIND_TERNARY: the matrix */
    float *y;                    /* matrix stages: output (T, ldy) */
    int T;                       /* input rows: the batch, or the logit rows for the head stages */
    int ldy, kp;                 /* output row stride; padded K of the quantized input rows */
    int chunk, chunks_per_slice; /* matrix stages: row units per item, items per token slice */
    int slice_tokens;            /* matrix stages: tokens per slice (MATMUL_SLICE, or a thread's run: token_split) */
    int tokens_per_item;         /* KIND_TOKENS, KIND_ATTENTION, KIND_CHAIN: consecutive tokens (or logit rows) per item */
    int split_units;             /* KIND_ATTENTION: 0, or how many (tile, kv head) units are each split into one
                                    item per thread, each a part of the value columns (schedule.c plan_layer_tail) */
    int chain_end;               /* KIND_CHAIN: it runs the stages [this one, chain_end) */
    int fused;                   /* KIND_CHAIN: it crosses attentions (fold_causal): an item waits for the K/V of
                                    the runs before it, not for a barrier */
    int folded;                  /* 1: run inside a KIND_CHAIN item, never on its own */
    int xq_run;                  /* layer stages: tokens per run of the xq rows it writes or reads (xq_row), 0: one run */
} stage;

/* The next item of one thread's range of a stage's items (range_start), in a cache line of its own. */
typedef struct {
    alignas(64) atomic_int next;
} range_counter;

/* The arguments of the running forward (read by every thread of the job). */
typedef struct {
    int T, start, kv_end, block; /* block: 0 causal, else the block size of block attention */
    const int32_t *rows;         /* logit rows (n_rows) */
    int n_rows;
    int trim_last;               /* 1: the last layer runs only the logit rows after writing every token's K/V */
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
    stage *stages; /* (L * STAGES_PER_LAYER + HEAD_STAGES) */
    range_counter *take; /* (L * STAGES_PER_LAYER + HEAD_STAGES, threads): the next item of each thread's range */
    range_counter *kv_layers; /* (threads,) a fused chain (fold_causal): the layers whose K/V run r has written */
    int n_stages;
    int segment[2]; /* the stages [from, to) of the running pool job */
    float *q_last;  /* (cap_rows, D) the trimmed last layer's query rows, gathered by its attention items */
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

/* forward.c: the work of one item of a stage (schedule.c hands the items out) */
void bn_token_stage(bn_engine *e, int l, layer_stage s, int t); /* stage s of layer l for token t (KIND_TOKENS) */
/* tokens [t0, t0 + nr), kv head g, its query heads [h0, h0 + nh) of the group */
void bn_attention_tile(bn_engine *e, int l, int t0, int nr, int g, int c0, int c1, int thread);
void bn_matmul_item(bn_engine *e, const stage *st, int i);      /* item i of a matrix stage */
void bn_head_norm_item(bn_engine *e, int r);                     /* logit row r's final norm */

/* schedule.c: the stage list of the forward described by e->fa, then its run on the engine's threads */
void bn_plan_forward(bn_engine *e);
void bn_run_forward(bn_engine *e);

#endif
