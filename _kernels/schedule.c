/* The scheduler of one forward: its stage list (plan) and the run of the stages on the engine's threads. The work of
 * each item is layer.c's (the layer maths); this file decides which items there are and who runs them.
 *
 * A forward is a fixed list of stages (10 per layer, 2 for the head), each split into items: runs of tokens, row
 * tiles of a matrix (or, for a small model's batch, runs of tokens through the whole matrix: token_split), or
 * (tile of tokens, kv head) pairs. The items of a stage are cut into one contiguous range per thread, each with its
 * own atomic counter: a thread takes its own range first, then what is left of the others'; one that finds no item
 * left waits until the stage is done. Owning a range keeps the same weight tiles and tokens on the same core from
 * one stage and one forward to the next, in its caches. Each run of consecutive shared stages is ONE job of the pool
 * (pool.h); a token-split batch folds the token-local stages between two attentions into one (fold_chains). Small
 * stages stay on the calling thread. A worker that joins late skips the finished stages; one the OS has not
 * scheduled holds nobody up (it has taken no item).
 */
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

/* A matrix product runs over the batch in slices of at most MATMUL_SLICE tokens, so a slice's activations
 * (at most 32 x Kp bytes, 221 KB for the 2B model's down_proj) stay in L2 while the weight tiles stream past. */
#define MATMUL_SLICE 32
/* Row tiles are shared out in chunks, about CHUNKS_PER_THREAD per thread and slice: a thread the OS
 * descheduled delays the stage by at most one chunk, and each chunk streams contiguous memory. */
#define CHUNKS_PER_THREAD 8
/* An attention stage takes fewer than ATTN_MAX_ROWS tokens per item when that leaves fewer than
 * ATTN_ITEMS_PER_THREAD items per thread. */
#define ATTN_ITEMS_PER_THREAD 2

/* KIND_CHAIN (token_split batches): the token-local stages from this one up to the next attention, run one after
 * the other on one run of tokens per item; the stages it stands for are `folded` (fold_chains). */
typedef enum { KIND_TOKENS, KIND_MATRIX, KIND_ATTENTION, KIND_CHAIN } stage_kind;

/* One stage of the running forward: its items and the count of those done (its own cache line; the counters of
 * the threads' ranges are in bn_schedule.take). */
typedef struct {
    alignas(64) atomic_int done; /* items finished */
    int n_items;
    int shared;                  /* 1: worth sharing between threads, 0: the caller runs it */
    stage_kind kind;
    bn_matrix mat;               /* KIND_MATRIX: the product (layer.h) */
    int T;                       /* input rows: the batch, or the logit rows for the head stages */
    int chunk, chunks_per_slice; /* KIND_MATRIX: row units per item, items per token slice */
    int slice_tokens;            /* KIND_MATRIX: tokens per slice (MATMUL_SLICE, or a thread's run: token_split) */
    int tokens_per_item;         /* KIND_TOKENS, KIND_ATTENTION, KIND_CHAIN: consecutive tokens (or logit rows) per item */
    int split_units;             /* KIND_ATTENTION: 0, or how many (tile, kv head) units are each split into one
                                    item per thread, each a part of the value columns (plan_layer_tail) */
    int chain_end;               /* KIND_CHAIN: it runs the stages [this one, chain_end) */
    int fused;                   /* KIND_CHAIN: it crosses attentions (fold_causal): an item waits for the K/V of
                                    the runs before it, not for a barrier */
    int folded;                  /* 1: run inside a KIND_CHAIN item, never on its own */
    int xq_run;                  /* layer stages: tokens per run of the xq rows it writes or reads, 0: one run */
} stage;

/* The next item of one thread's range of a stage's items (range_start), in a cache line of its own. */
typedef struct {
    alignas(64) atomic_int next;
} range_counter;

struct bn_schedule {
    int n_threads;
    stage *stages;            /* (L * STAGES_PER_LAYER + HEAD_STAGES) */
    range_counter *take;      /* (stages, threads): the next item of each thread's range */
    range_counter *kv_layers; /* (threads,) a fused chain (fold_causal): the layers whose K/V run r has written */
    int n_stages;
    int segment[2];           /* the stages [from, to) of the running pool job */
};

struct bn_schedule *bn_schedule_create(int n_layers, int n_threads) {
    struct bn_schedule *S = calloc(1, sizeof *S);
    if (!S) return NULL;
    const size_t n_stages = (size_t)n_layers * STAGES_PER_LAYER + HEAD_STAGES;
    S->n_threads = n_threads;
    S->stages = aligned_alloc(64, sizeof(stage) * n_stages);
    S->take = aligned_alloc(64, sizeof(range_counter) * n_stages * (size_t)n_threads);
    S->kv_layers = aligned_alloc(64, sizeof(range_counter) * (size_t)n_threads);
    if (!S->stages || !S->take || !S->kv_layers) {
        bn_schedule_free(S);
        return NULL;
    }
    return S;
}

void bn_schedule_free(struct bn_schedule *S) {
    if (!S) return;
    free(S->stages);
    free(S->take);
    free(S->kv_layers);
    free(S);
}

/* ---------------------------------------------------------------- development timing */

static const char *const PART_NAMES[BN_PART_COUNT] = {
    [BN_PART_EMBED] = "embed", [BN_PART_ATTN_NORM] = "residual+attn_norm+quant", [BN_PART_QKV] = "qkv_proj",
    [BN_PART_ROPE_KV] = "rope+kv_write", [BN_PART_ATTENTION] = "attention",
    [BN_PART_SUB_NORM_ATTN] = "attn_sub_norm+quant", [BN_PART_O] = "o_proj",
    [BN_PART_FFN_NORM] = "residual+ffn_norm+quant", [BN_PART_GATE_UP] = "gate_up_proj",
    [BN_PART_SUB_NORM_FFN] = "relu2*up+ffn_sub_norm+quant", [BN_PART_DOWN] = "down_proj",
    [BN_PART_HEAD_NORM] = "residual+final_norm+quant", [BN_PART_HEAD] = "lm_head", [BN_PART_OUTPUT] = "copy_logits",
    [BN_PART_SYNC] = "thread_dispatch+wait", [BN_PART_TOTAL] = "total",
};

const char *bn_part_name(int part) { return part >= 0 && part < BN_PART_COUNT ? PART_NAMES[part] : NULL; }

void bn_engine_set_profile(bn_engine *e, int on) {
    e->profiling = on;
    memset(e->prof, 0, sizeof e->prof);
}

const double *bn_engine_profile(const bn_engine *e) { return e->prof; }

static const int LAYER_PART[STAGES_PER_LAYER] = {
    [STAGE_ATTN_NORM] = BN_PART_ATTN_NORM, [STAGE_QKV] = BN_PART_QKV, [STAGE_ROPE_KV] = BN_PART_ROPE_KV,
    [STAGE_ATTENTION] = BN_PART_ATTENTION, [STAGE_ATTN_SUB] = BN_PART_SUB_NORM_ATTN, [STAGE_O] = BN_PART_O,
    [STAGE_FFN_NORM] = BN_PART_FFN_NORM, [STAGE_GATE_UP] = BN_PART_GATE_UP,
    [STAGE_FFN_SUB] = BN_PART_SUB_NORM_FFN, [STAGE_DOWN] = BN_PART_DOWN,
};

static int part_of_stage(const bn_engine *e, int s) {
    const int layer_stages = e->m.n_layers * STAGES_PER_LAYER;
    if (s < layer_stages) return LAYER_PART[s % STAGES_PER_LAYER];
    return s - layer_stages == STAGE_HEAD_NORM ? BN_PART_HEAD_NORM : BN_PART_HEAD;
}

/* ---------------------------------------------------------------- the stage list of one forward */

/* Below these amounts of work a stage runs on the calling thread alone: sharing would gain less than the hand-over
 * costs, and a worker descheduled by a busy OS would stall the caller for up to a time slice. */
#define SHARE_MIN_TOKENS 4         /* per-token stages: batch rows */
/* A shared per-token stage hands out runs of tokens, about TOKEN_ITEMS_PER_THREAD per thread: one token's norm on a
 * small model costs less than taking an item from a counter whose cache line two cores take turns at. */
#define TOKEN_ITEMS_PER_THREAD 4
#define SHARE_MIN_MACS (256 * 1024) /* matrix stages: multiply-adds */
#define SHARE_MIN_ATTN (64 * 1024)  /* attention: query rows x visible keys x head size */

static void set_token_stage(const bn_engine *e, stage *st, int n_tokens) {
    int per = n_tokens / (bn_pool_size(e->pool) * TOKEN_ITEMS_PER_THREAD);
    if (per < 1) per = 1;
    *st = (stage){.n_items = (n_tokens + per - 1) / per, .shared = n_tokens >= SHARE_MIN_TOKENS,
                  .kind = KIND_TOKENS, .T = n_tokens, .tokens_per_item = per};
}

/* A small model's batch is split by tokens, not by the rows of each matrix: each thread runs its own tokens
 * through every row of the (cached) weights, so a token's activations stay on one core from stage to stage. Used
 * when one layer's matrices fit in a core's L2 several times over and each thread gets at least
 * TOKEN_SPLIT_MIN_TOKENS. Same sums either way, so the same logits. */
#define TOKEN_SPLIT_MAX_BYTES (256 * 1024)  /* ternary bytes of one layer's matrices */
#define TOKEN_SPLIT_WIDE_BYTES (512 * 1024) /* up to this (the demo model's layers), only batches of at most */
#define TOKEN_SPLIT_WIDE_TOKENS 32          /* this many tokens: a longer batch re-reads the weights from L3 */
#define TOKEN_SPLIT_MIN_TOKENS 2            /* per thread: one token each leaves the kernels' blocks too small */
#define TOKEN_SPLIT_BLOCK 4                 /* the kernels' block of rows: runs are whole blocks when there are enough */
#define TOKEN_SPLIT_ITEMS_PER_THREAD 2      /* runs of tokens per thread (each still a block): a late worker delays by one */

static int token_split(const bn_engine *e, int T) {
    const int n = bn_pool_size(e->pool);
    const size_t layer_bytes = (size_t)e->dp / 4 * (e->qkv_np + e->dp + e->gu_np) + (size_t)e->ip / 4 * e->dp;
    const int fits = layer_bytes <= TOKEN_SPLIT_MAX_BYTES ||
                     (layer_bytes <= TOKEN_SPLIT_WIDE_BYTES && T <= TOKEN_SPLIT_WIDE_TOKENS);
    return n > 1 && fits && T >= n * TOKEN_SPLIT_MIN_TOKENS;
}

/* Tokens per run of a token_split batch of T: the item of its matrix stages and of its chains (fold_chains,
 * fold_causal). Under causal attention one run per thread, as even as T allows, so that the whole batch can run as
 * one chain per thread (fold_causal). Under block attention runs of whole blocks, TOKEN_SPLIT_ITEMS_PER_THREAD per
 * thread, when every run gets one; else one run per thread (even shares: 12 tokens on 2 threads are 6 + 6). */
static int token_run(const bn_engine *e, int T) {
    const int n = bn_pool_size(e->pool), n_items = n * TOKEN_SPLIT_ITEMS_PER_THREAD;
    if (e->fa.block == 0 || T < n_items * TOKEN_SPLIT_BLOCK) return (T + n - 1) / n;
    return (T + n_items - 1) / n_items;
}

static void set_matmul_stage(const bn_engine *e, stage *st, bn_matrix mat, int T) {
    const int units = mat.units, exact = mat.kind == MAT_EXACT_HEAD;
    if (mat.kind == MAT_TERNARY && token_split(e, T)) { /* items: runs of tokens, each through all the rows */
        const int per = token_run(e, T);
        *st = (stage){.n_items = (T + per - 1) / per, .shared = 1, .kind = KIND_MATRIX, .mat = mat, .T = T,
                      .chunk = units, .chunks_per_slice = 1, .slice_tokens = per};
        return;
    }
    int chunk = units / (bn_pool_size(e->pool) * CHUNKS_PER_THREAD);
    if (!exact) chunk += chunk & 1; /* even: the SIMD kernels take row tiles in pairs */
    if (chunk < 2) chunk = 2;
    const int per_slice = (units + chunk - 1) / chunk, slices = (T + MATMUL_SLICE - 1) / MATMUL_SLICE;
    const double macs = (double)T * units * (exact ? 1 : 16) * (exact ? e->m.dim : mat.kp);
    *st = (stage){.n_items = per_slice * slices, .shared = macs >= SHARE_MIN_MACS, .kind = KIND_MATRIX, .mat = mat,
                  .T = T, .chunk = chunk, .chunks_per_slice = per_slice, .slice_tokens = MATMUL_SLICE};
}

/* Item i of a matrix stage: token slice i / chunks_per_slice, row units [u0, u1) of chunk i % chunks_per_slice
 * (units: tiles of 16 rows, or single rows for the exact head). */
static void matrix_item(bn_engine *e, const stage *st, int i) {
    const int slice = i / st->chunks_per_slice, t0 = slice * st->slice_tokens;
    const int rows = st->T - t0 < st->slice_tokens ? st->T - t0 : st->slice_tokens;
    const int u0 = (i % st->chunks_per_slice) * st->chunk;
    const int u1 = u0 + st->chunk < st->mat.units ? u0 + st->chunk : st->mat.units;
    bn_matrix_rows(e, &st->mat, t0, rows, u0, u1, st->xq_run);
}

/* A token_split batch: the stages between two attentions are token-local, so each such run of the layer stages
 * [from, to) becomes ONE stage (KIND_CHAIN) whose item takes a run of tokens through all of them: the threads wait
 * for each other twice per layer (around its attention, which reads every token's K/V), not after each stage. The
 * runs are those of the token-split matrix stages: the same products, the same logits. */
static void fold_chains(bn_engine *e, int from, int to, int T) {
    stage *stages = e->sched->stages;
    const int per = token_run(e, T);
    for (int s = from; s < to;) {
        int end = s;
        while (end < to && end % STAGES_PER_LAYER != STAGE_ATTENTION) end++; /* up to the next attention */
        stage *c = &stages[s];
        for (int f = s; f < end; f++) {
            stages[f].folded = f > s;
            stages[f].xq_run = per; /* a chain's xq rows lie in runs of its tokens (layer.c xq_row) */
        }
        *c = (stage){.n_items = (T + per - 1) / per, .shared = 1, .kind = KIND_CHAIN, .T = T, .tokens_per_item = per,
                     .chain_end = end, .xq_run = per};
        s = end + 1; /* past the attention: the next chain starts at its ATTN_SUB */
    }
}

/* A token_split batch under causal attention (one run of tokens per thread, token_run): the stages [from, to) become
 * ONE chain whose item takes its run through all of them, attentions included. Run r's attention needs the K/V of
 * runs 0..r only (causal), so before each attention an item waits until the runs before it have written that
 * layer's K/V (kv_layers): no barrier, and the first run never waits. The same stages and kernels as fold_chains:
 * the same logits. No deadlock: the calling thread takes run 0 first, and every thread takes runs in order. */
static int fold_causal(bn_engine *e, int from, int to, int T) {
    stage *stages = e->sched->stages;
    const int per = token_run(e, T), n = bn_pool_size(e->pool);
    if (e->fa.block > 0 || (T + per - 1) / per > n) return 0;
    for (int f = from; f < to; f++) {
        stages[f].folded = f > from;
        stages[f].xq_run = per;
    }
    stages[from] = (stage){.n_items = (T + per - 1) / per, .shared = 1, .kind = KIND_CHAIN, .T = T,
                              .tokens_per_item = per, .chain_end = to, .xq_run = per, .fused = 1};
    for (int r = 0; r < n; r++) atomic_init(&e->sched->kv_layers[r].next, 0);
    return 1;
}

/* Range r of n of a stage's items: [range_start(r), range_start(r + 1)). */
static inline int range_start(int n_items, int r, int n) { return (int)((long long)n_items * r / n); }

/* The stages of layer l from its attention on, for a batch of T tokens (the logit rows in a trimmed last layer). */
static void plan_layer_tail(bn_engine *e, int l, int T) {
    const bn_model *m = &e->m;
    stage *s = e->sched->stages + (size_t)l * STAGES_PER_LAYER;
    /* attention: items of attn_rows tokens x one kv head */
    const int attn_shared = (double)T * e->fa.kv_end * m->dim >= SHARE_MIN_ATTN && bn_pool_size(e->pool) > 1;
    int attn_rows = ATTN_MAX_ROWS;
    while (attn_shared && attn_rows > 1 &&
           (T + attn_rows - 1) / attn_rows * m->n_kv_heads < bn_pool_size(e->pool) * ATTN_ITEMS_PER_THREAD)
        attn_rows /= 2;
    /* tiles of even size: 6 rows as 3 + 3, not 4 + 2 (one thread idle for a third of a trimmed last layer's
     * attention); each row's numbers are its own. (No tiles: a forward with no logits.) */
    const int tiles = (T + attn_rows - 1) / attn_rows;
    if (tiles > 0) attn_rows = (T + tiles - 1) / tiles;
    /* Few units (tile, kv head) that do not share out evenly (a decode token of 2B-4T: 5 KV heads on 2 threads): the
     * U % n units left over after an equal number each are split into one item per thread, each with all the scores
     * but only its part of the value columns (each column's numbers are its own), so a split unit's values are read
     * once in all. */
    const int n = bn_pool_size(e->pool), units = tiles * m->n_kv_heads;
    const int split = attn_shared && units % n && units < 8 * n && m->head_dim % 8 == 0 && m->head_dim / 8 >= n
                          ? units % n : 0;
    s[STAGE_ATTENTION] = (stage){.n_items = units + split * (n - 1), .kind = KIND_ATTENTION, .T = T,
                                 .tokens_per_item = attn_rows, .split_units = split, .shared = attn_shared};
    set_token_stage(e, &s[STAGE_ATTN_SUB], T);
    set_matmul_stage(e, &s[STAGE_O], bn_layer_matrix(e, l, STAGE_O), T);
    set_token_stage(e, &s[STAGE_FFN_NORM], T);
    set_matmul_stage(e, &s[STAGE_GATE_UP], bn_layer_matrix(e, l, STAGE_GATE_UP), T);
    set_token_stage(e, &s[STAGE_FFN_SUB], T);
    set_matmul_stage(e, &s[STAGE_DOWN], bn_layer_matrix(e, l, STAGE_DOWN), T);
}

/* The stages of the forward described by e->fa, in the order of layer.h's steps (forward.c runs them so, serially) */
void bn_plan_forward(bn_engine *e) {
    const bn_model *m = &e->m;
    struct bn_schedule *S = e->sched;
    const int T = e->fa.T, L = m->n_layers;
    const int T_last = e->fa.trim_last ? e->fa.n_rows : T; /* tokens of the last layer from its attention on */
    for (int l = 0; l < L; l++) {
        stage *s = S->stages + (size_t)l * STAGES_PER_LAYER;
        set_token_stage(e, &s[STAGE_ATTN_NORM], T);
        set_matmul_stage(e, &s[STAGE_QKV], bn_layer_matrix(e, l, STAGE_QKV), T);
        set_token_stage(e, &s[STAGE_ROPE_KV], T);
        plan_layer_tail(e, l, l == L - 1 ? T_last : T);
    }
    stage *h = S->stages + (size_t)L * STAGES_PER_LAYER;
    const int R = e->fa.n_rows;
    set_token_stage(e, &h[STAGE_HEAD_NORM], R);
    set_matmul_stage(e, &h[STAGE_HEAD], bn_head_matrix(e), R);
    S->n_stages = L * STAGES_PER_LAYER + (R > 0 ? HEAD_STAGES : 0);
    /* token_split batches: fold the token-local stages (the trimmed last layer's tail as a batch of its own) */
    const int tail = (L - 1) * STAGES_PER_LAYER + STAGE_ATTENTION; /* the last layer's attention */
    if (token_split(e, T) && !fold_causal(e, 0, tail, T)) fold_chains(e, 0, tail, T);
    if (token_split(e, T_last)) fold_chains(e, tail + 1, L * STAGES_PER_LAYER, T_last);
    const int n = bn_pool_size(e->pool);
    for (int i = 0; i < S->n_stages; i++) {
        atomic_init(&S->stages[i].done, 0);
        for (int r = 0; r < n; r++) atomic_init(&S->take[(size_t)i * n + r].next, range_start(S->stages[i].n_items, r, n));
    }
}

/* ---------------------------------------------------------------- the run */

/* This thread's attention scratch (bn_engine.scores) */
static inline float *thread_scratch(const bn_engine *e, int thread) { return e->scores + (size_t)thread * e->scores_ld; }

/* Item p of an attention stage: a unit u = (tile u / G of up to tokens_per_item consecutive tokens, kv head u % G),
 * all its value columns or, for the split_units last units, part r of n of them. Thread range r (range_start) holds
 * k whole units, then part r of each split unit, so every thread gets the same work. */
static void attention_item(bn_engine *e, int l, int p, int thread) {
    const stage *st = &e->sched->stages[(size_t)l * STAGES_PER_LAYER + STAGE_ATTENTION];
    const int G = e->m.n_kv_heads, rows = st->tokens_per_item, hd = e->m.head_dim, lo = st->split_units;
    int u = p, c0 = 0, c1 = hd;
    if (lo) {
        const int n = bn_pool_size(e->pool), k = (st->n_items - lo * n) / n; /* whole units per thread */
        const int r = p / (k + lo), j = p % (k + lo), vectors = hd / 8;
        u = j < k ? r * k + j : n * k + (j - k);
        if (j >= k) c0 = 8 * (vectors * r / n), c1 = 8 * (vectors * (r + 1) / n);
    }
    const int g = u % G, t0 = u / G * rows;
    bn_attention_tile(e, l, t0, st->T - t0 < rows ? st->T - t0 : rows, g, c0, c1, thread_scratch(e, thread));
}

/* Item i of a KIND_CHAIN stage: its run of tokens through each stage [s, chain_end) in turn (the calling thread,
 * when profiling, books each stage's time to its part). A fused chain (fold_causal) runs the attentions too: first it
 * waits for the runs before it to have written this layer's K/V; after its own RoPE/K/V stage it says it has. */
static void chain_item(bn_engine *e, int s, int i, int thread) {
    const stage *stages = e->sched->stages, *c = &stages[s];
    const int t0 = i * c->tokens_per_item, t1 = t0 + c->tokens_per_item < c->T ? t0 + c->tokens_per_item : c->T;
    const int timing = e->profiling && thread == 0;
    double t = timing ? now_s() : 0;
    for (int f = s; f < c->chain_end; f++) {
        const int l = f / STAGES_PER_LAYER;
        const layer_stage ls = (layer_stage)(f % STAGES_PER_LAYER);
        if (ls == STAGE_ATTENTION) { /* only in a fused chain */
            for (int r = 0; r < i; r++)
                while (atomic_load_explicit(&e->sched->kv_layers[r].next, memory_order_acquire) <= l) bn_pool_relax();
            if (timing) { /* the wait is synchronisation */
                const double t2 = now_s();
                e->prof[BN_PART_SYNC] += t2 - t;
                t = t2;
            }
            for (int a = t0; a < t1; a += ATTN_MAX_ROWS)
                for (int g = 0; g < e->m.n_kv_heads; g++)
                    bn_attention_tile(e, l, a, t1 - a < ATTN_MAX_ROWS ? t1 - a : ATTN_MAX_ROWS, g, 0,
                                      e->m.head_dim, thread_scratch(e, thread));
        } else if (f == s || stages[f].kind == KIND_TOKENS) { /* stage s itself (a token stage) holds the chain */
            for (int tok = t0; tok < t1; tok++) bn_token_step(e, l, ls, tok, stages[f].xq_run);
            if (c->fused && ls == STAGE_ROPE_KV) /* this run's K/V of layer l are in the cache */
                atomic_store_explicit(&e->sched->kv_layers[i].next, l + 1, memory_order_release);
        } else {
            matrix_item(e, &stages[f], i); /* token_split: item i of the matrix stage is the same run */
        }
        if (timing) {
            const double t2 = now_s();
            e->prof[part_of_stage(e, f)] += t2 - t;
            t = t2;
        }
    }
}

static void run_item(bn_engine *e, int s, int i, int thread) {
    const stage *st = &e->sched->stages[s];
    const int layer_stages = e->m.n_layers * STAGES_PER_LAYER;
    switch (st->kind) {
        case KIND_TOKENS: {
            const int t0 = i * st->tokens_per_item;
            const int t1 = t0 + st->tokens_per_item < st->T ? t0 + st->tokens_per_item : st->T;
            for (int t = t0; t < t1; t++) {
                if (s < layer_stages)
                    bn_token_step(e, s / STAGES_PER_LAYER, (layer_stage)(s % STAGES_PER_LAYER), t, st->xq_run);
                else bn_head_norm_row(e, t);
            }
            break;
        }
        case KIND_ATTENTION:
            attention_item(e, s / STAGES_PER_LAYER, i, thread);
            break;
        case KIND_CHAIN:
            chain_item(e, s, i, thread);
            break;
        case KIND_MATRIX:
            matrix_item(e, st, i);
    }
}

/* Stages [from, to): each one's items, then a wait until all of them are done. Run by every thread of a pool
 * job for a segment of shared stages, or by the calling thread alone for a stage it keeps. */
static void run_stages(bn_engine *e, int from, int to, int thread) {
    const int timing = e->profiling && thread == 0;
    double t = timing ? now_s() : 0;
    for (int s = from; s < to; s++) {
        stage *st = &e->sched->stages[s];
        if (st->folded) continue; /* run by its chain's items */
        const int n = bn_pool_size(e->pool);
        int mine = 0;
        for (int k = 0; k < n; k++) { /* its own range, then what is left of the others' */
            const int r = (thread + k) % n, end = range_start(st->n_items, r + 1, n);
            atomic_int *next = &e->sched->take[(size_t)s * n + r].next;
            int i;
            while (atomic_load_explicit(next, memory_order_relaxed) < end &&
                   (i = atomic_fetch_add_explicit(next, 1, memory_order_relaxed)) < end) {
                run_item(e, s, i, thread);
                mine++;
            }
        }
        if (mine) atomic_fetch_add_explicit(&st->done, mine, memory_order_release);
        if (timing) {
            const double t1 = now_s();
            if (st->kind != KIND_CHAIN) e->prof[part_of_stage(e, s)] += t1 - t; /* a chain books its own parts */
            t = t1;
        }
        while (atomic_load_explicit(&st->done, memory_order_acquire) < st->n_items) bn_pool_relax();
        if (timing) {
            const double t1 = now_s();
            e->prof[BN_PART_SYNC] += t1 - t;
            t = t1;
        }
    }
}

/* The pool job of a segment of shared stages (bn_schedule.segment), run by the caller and every worker that joins. */
static void segment_worker(void *arg, int thread, int n_threads) {
    (void)n_threads;
    bn_engine *e = arg;
    const double t0 = e->profiling && thread == 0 ? now_s() : 0;
    run_stages(e, e->sched->segment[0], e->sched->segment[1], thread);
    if (e->profiling && thread == 0) e->inside += now_s() - t0;
}

/* The whole stage list: runs of consecutive shared stages as one pool job each (for a batch of tokens on a small
 * model that is the whole forward), the other stages on the calling thread. */
void bn_run_forward(bn_engine *e) {
    struct bn_schedule *S = e->sched;
    for (int s = 0; s < S->n_stages;) {
        if (!S->stages[s].shared || bn_pool_size(e->pool) == 1) {
            run_stages(e, s, s + 1, 0);
            s++;
            continue;
        }
        int end = s + 1;
        while (end < S->n_stages && S->stages[end].shared) end++;
        S->segment[0] = s;
        S->segment[1] = end;
        if (e->profiling) {
            const double t0 = now_s(), inside = e->inside;
            bn_pool_run(e->pool, segment_worker, e);
            e->prof[BN_PART_SYNC] += (now_s() - t0) - (e->inside - inside); /* opening and closing the job */
        } else {
            bn_pool_run(e->pool, segment_worker, e);
        }
        s = end;
    }
}
