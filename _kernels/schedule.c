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
#include <stdatomic.h>
#include <string.h>

#include "engine_state.h"

/* A matrix product runs over the batch in slices of at most MATMUL_SLICE tokens, so a slice's activations
 * (at most 32 x Kp bytes, 221 KB for the 2B model's down_proj) stay in L2 while the weight tiles stream past. */
#define MATMUL_SLICE 32
/* Row tiles are shared out in chunks, about CHUNKS_PER_THREAD per thread and slice: a thread the OS
 * descheduled delays the stage by at most one chunk, and each chunk streams contiguous memory. */
#define CHUNKS_PER_THREAD 8
/* An attention stage takes fewer than ATTN_MAX_ROWS tokens per item when that leaves fewer than
 * ATTN_ITEMS_PER_THREAD items per thread. */
#define ATTN_ITEMS_PER_THREAD 2

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

static void set_matmul_stage(const bn_engine *e, stage *st, stage_kind kind, const bn_ternary *w, int units, int T,
                             float *y, int ldy, int kp) {
    if (kind == KIND_TERNARY && token_split(e, T)) { /* items: runs of tokens, each through all the rows */
        const int per = token_run(e, T);
        *st = (stage){.n_items = (T + per - 1) / per, .shared = 1, .kind = kind, .w = w, .y = y, .T = T, .ldy = ldy,
                      .kp = kp, .chunk = units, .chunks_per_slice = 1, .slice_tokens = per};
        return;
    }
    int chunk = units / (bn_pool_size(e->pool) * CHUNKS_PER_THREAD);
    if (kind != KIND_EXACT_HEAD) chunk += chunk & 1; /* even: the SIMD kernels take row tiles in pairs */
    if (chunk < 2) chunk = 2;
    const int per_slice = (units + chunk - 1) / chunk, slices = (T + MATMUL_SLICE - 1) / MATMUL_SLICE;
    const double macs = (double)T * units * (kind == KIND_EXACT_HEAD ? 1 : 16) * (kind == KIND_EXACT_HEAD ? e->m.dim : kp);
    *st = (stage){.n_items = per_slice * slices, .shared = macs >= SHARE_MIN_MACS, .kind = kind, .w = w, .y = y,
                  .T = T, .ldy = ldy, .kp = kp, .chunk = chunk, .chunks_per_slice = per_slice,
                  .slice_tokens = MATMUL_SLICE};
}

/* A token_split batch: every stage between two attentions is token-local (a token's row of one stage needs only
 * its own rows of the stage before), so each such run of stages becomes ONE stage (KIND_CHAIN) whose item takes a
 * run of tokens through all of them: the threads wait for each other twice per layer (before and after its
 * attention, which reads every token's K/V) instead of after each of ten stages. The runs of tokens are those of
 * the token-split matrix stages, so every product sees the same rows as before: the same logits. Folds the layer
 * stages [from, to) of a batch of T tokens. */
static void fold_chains(bn_engine *e, int from, int to, int T) {
    const int per = token_run(e, T);
    for (int s = from; s < to;) {
        int end = s;
        while (end < to && end % STAGES_PER_LAYER != STAGE_ATTENTION) end++; /* up to the next attention */
        stage *c = &e->stages[s];
        for (int f = s; f < end; f++) {
            e->stages[f].folded = f > s;
            e->stages[f].xq_run = per; /* a chain's xq rows lie in runs of its tokens (xq_row) */
        }
        *c = (stage){.n_items = (T + per - 1) / per, .shared = 1, .kind = KIND_CHAIN, .T = T, .tokens_per_item = per,
                     .chain_end = end, .xq_run = per};
        s = end + 1; /* past the attention: the next chain starts at its ATTN_SUB */
    }
}

/* A token_split batch under causal attention (one run of tokens per thread, token_run): the stages [from, to) (whole
 * layers, then the last layer up to its attention) become ONE chain whose item takes its run through all of them,
 * attentions included. A token sees only the keys up to its own position, so run r's attention needs the K/V of
 * runs 0..r only: the item waits, before each attention, until the runs before it have written that layer's K/V
 * (kv_layers), and nothing waits for a later run. So no thread waits at a barrier twice per layer; the first run
 * never waits. A run's tokens go through the same stages with the same kernels as in fold_chains: the same logits.
 * No deadlock: the calling thread takes run 0 first, and every thread takes runs in increasing order. */
static int fold_causal(bn_engine *e, int from, int to, int T) {
    const int per = token_run(e, T), n = bn_pool_size(e->pool);
    if (e->fa.block > 0 || (T + per - 1) / per > n) return 0;
    for (int f = from; f < to; f++) {
        e->stages[f].folded = f > from;
        e->stages[f].xq_run = per;
    }
    e->stages[from] = (stage){.n_items = (T + per - 1) / per, .shared = 1, .kind = KIND_CHAIN, .T = T,
                              .tokens_per_item = per, .chain_end = to, .xq_run = per, .fused = 1};
    for (int r = 0; r < n; r++) atomic_init(&e->kv_layers[r].next, 0);
    return 1;
}

/* Range r of n of a stage's items: [range_start(r), range_start(r + 1)). */
static inline int range_start(int n_items, int r, int n) { return (int)((long long)n_items * r / n); }

/* The last layer's K/V are needed for every token, but the rest of it (its attention and everything after) only
 * for the rows whose logits are asked: a denoising step asks for the masked slots of one sub-block (<= 8 of 32),
 * a prefill or a block commit for one row. So, when the logit rows are strictly increasing and fewer than the
 * batch, those stages run on the logit rows alone (compacted: their token t is batch token rows[t]). Each token's
 * sums are the same whatever else is in the batch, so the logits are bit for bit those of the whole batch. */
static int trims_last_layer(const bn_engine *e) {
    if (e->fa.n_rows >= e->fa.T) return 0;
    for (int r = 1; r < e->fa.n_rows; r++)
        if (e->fa.rows[r] <= e->fa.rows[r - 1]) return 0;
    return 1;
}

/* The stages of layer l from its attention on, for a batch of T tokens (the logit rows in a trimmed last layer). */
static void plan_layer_tail(bn_engine *e, int l, int T) {
    const bn_model *m = &e->m;
    const bn_layer *ly = &e->layers[l];
    stage *s = e->stages + (size_t)l * STAGES_PER_LAYER;
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
    set_matmul_stage(e, &s[STAGE_O], KIND_TERNARY, &ly->o, e->dp / 16, T, e->proj, e->dp, e->dp);
    set_token_stage(e, &s[STAGE_FFN_NORM], T);
    set_matmul_stage(e, &s[STAGE_GATE_UP], KIND_TERNARY, &ly->gate_up, e->gu_np / 16, T, e->gu, e->gu_np, e->dp);
    set_token_stage(e, &s[STAGE_FFN_SUB], T);
    set_matmul_stage(e, &s[STAGE_DOWN], KIND_TERNARY, &ly->down, e->dp / 16, T, e->proj, e->dp, e->ip);
}

void bn_plan_forward(bn_engine *e) {
    const bn_model *m = &e->m;
    const int T = e->fa.T, L = m->n_layers;
    e->fa.trim_last = trims_last_layer(e);
    const int T_last = e->fa.trim_last ? e->fa.n_rows : T; /* tokens of the last layer from its attention on */
    for (int l = 0; l < L; l++) {
        const bn_layer *ly = &e->layers[l];
        stage *s = e->stages + (size_t)l * STAGES_PER_LAYER;
        set_token_stage(e, &s[STAGE_ATTN_NORM], T);
        set_matmul_stage(e, &s[STAGE_QKV], KIND_TERNARY, &ly->qkv, e->qkv_np / 16, T, e->qkv, e->qkv_np, e->dp);
        set_token_stage(e, &s[STAGE_ROPE_KV], T);
        plan_layer_tail(e, l, l == L - 1 ? T_last : T);
    }
    stage *h = e->stages + (size_t)L * STAGES_PER_LAYER;
    const int R = e->fa.n_rows;
    set_token_stage(e, &h[STAGE_HEAD_NORM], R);
    if (e->exact_head) set_matmul_stage(e, &h[STAGE_HEAD], KIND_EXACT_HEAD, NULL, m->vocab, R, e->logit_buf, e->vp, 0);
    else set_matmul_stage(e, &h[STAGE_HEAD], KIND_INT8_HEAD, NULL, e->vp / 16, R, e->logit_buf, e->vp, e->dp);
    e->n_stages = L * STAGES_PER_LAYER + (R > 0 ? HEAD_STAGES : 0);
    /* token_split batches: fold the token-local stages (the trimmed last layer's tail as a batch of its own) */
    const int tail = (L - 1) * STAGES_PER_LAYER + STAGE_ATTENTION; /* the last layer's attention */
    if (token_split(e, T) && !fold_causal(e, 0, tail, T)) fold_chains(e, 0, tail, T);
    if (token_split(e, T_last)) fold_chains(e, tail + 1, L * STAGES_PER_LAYER, T_last);
    const int n = bn_pool_size(e->pool);
    for (int i = 0; i < e->n_stages; i++) {
        atomic_init(&e->stages[i].done, 0);
        for (int r = 0; r < n; r++) atomic_init(&e->take[(size_t)i * n + r].next, range_start(e->stages[i].n_items, r, n));
    }
}

/* ---------------------------------------------------------------- the run */

/* Item p of an attention stage: a unit u = (tile u / G of up to tokens_per_item consecutive tokens, kv head u % G),
 * all its value columns or, for the split_units last units, part r of n of them. Thread range r (range_start) holds
 * k whole units, then part r of each split unit, so every thread gets the same work. */
static void attention_item(bn_engine *e, int l, int p, int thread) {
    const stage *st = &e->stages[(size_t)l * STAGES_PER_LAYER + STAGE_ATTENTION];
    const int G = e->m.n_kv_heads, rows = st->tokens_per_item, hd = e->m.head_dim, lo = st->split_units;
    int u = p, c0 = 0, c1 = hd;
    if (lo) {
        const int n = bn_pool_size(e->pool), k = (st->n_items - lo * n) / n; /* whole units per thread */
        const int r = p / (k + lo), j = p % (k + lo), vectors = hd / 8;
        u = j < k ? r * k + j : n * k + (j - k);
        if (j >= k) c0 = 8 * (vectors * r / n), c1 = 8 * (vectors * (r + 1) / n);
    }
    const int g = u % G, t0 = u / G * rows;
    bn_attention_tile(e, l, t0, st->T - t0 < rows ? st->T - t0 : rows, g, c0, c1, thread);
}

/* Item i of a KIND_CHAIN stage: its run of tokens through each stage [s, chain_end) in turn (the calling thread,
 * when profiling, books each stage's time to its part). A fused chain (fold_causal) runs the attentions too: first it
 * waits for the runs before it to have written this layer's K/V; after its own RoPE/K/V stage it says it has. */
static void chain_item(bn_engine *e, int s, int i, int thread) {
    const stage *c = &e->stages[s];
    const int t0 = i * c->tokens_per_item, t1 = t0 + c->tokens_per_item < c->T ? t0 + c->tokens_per_item : c->T;
    const int timing = e->profiling && thread == 0;
    double t = timing ? now_s() : 0;
    for (int f = s; f < c->chain_end; f++) {
        const int l = f / STAGES_PER_LAYER;
        const layer_stage ls = (layer_stage)(f % STAGES_PER_LAYER);
        if (ls == STAGE_ATTENTION) { /* only in a fused chain */
            for (int r = 0; r < i; r++)
                while (atomic_load_explicit(&e->kv_layers[r].next, memory_order_acquire) <= l) bn_pool_relax();
            if (timing) { /* the wait is synchronisation */
                const double t2 = now_s();
                e->prof[BN_PART_SYNC] += t2 - t;
                t = t2;
            }
            for (int a = t0; a < t1; a += ATTN_MAX_ROWS)
                for (int g = 0; g < e->m.n_kv_heads; g++)
                    bn_attention_tile(e, l, a, t1 - a < ATTN_MAX_ROWS ? t1 - a : ATTN_MAX_ROWS, g, 0,
                                      e->m.head_dim, thread);
        } else if (f == s || e->stages[f].kind == KIND_TOKENS) { /* stage s itself (a token stage) holds the chain */
            for (int tok = t0; tok < t1; tok++) bn_token_stage(e, l, ls, tok);
            if (c->fused && ls == STAGE_ROPE_KV) /* this run's K/V of layer l are in the cache */
                atomic_store_explicit(&e->kv_layers[i].next, l + 1, memory_order_release);
        } else {
            bn_matmul_item(e, &e->stages[f], i); /* token_split: item i of the matrix stage is the same run */
        }
        if (timing) {
            const double t2 = now_s();
            e->prof[part_of_stage(e, f)] += t2 - t;
            t = t2;
        }
    }
}

static void run_item(bn_engine *e, int s, int i, int thread) {
    const stage *st = &e->stages[s];
    const int layer_stages = e->m.n_layers * STAGES_PER_LAYER;
    switch (st->kind) {
        case KIND_TOKENS: {
            const int t0 = i * st->tokens_per_item;
            const int t1 = t0 + st->tokens_per_item < st->T ? t0 + st->tokens_per_item : st->T;
            for (int t = t0; t < t1; t++) {
                if (s < layer_stages) bn_token_stage(e, s / STAGES_PER_LAYER, (layer_stage)(s % STAGES_PER_LAYER), t);
                else bn_head_norm_item(e, t);
            }
            break;
        }
        case KIND_ATTENTION:
            attention_item(e, s / STAGES_PER_LAYER, i, thread);
            break;
        case KIND_CHAIN:
            chain_item(e, s, i, thread);
            break;
        default:
            bn_matmul_item(e, st, i);
    }
}

/* Stages [from, to): each one's items, then a wait until all of them are done. Run by every thread of a pool
 * job for a segment of shared stages, or by the calling thread alone for a stage it keeps. */
static void run_stages(bn_engine *e, int from, int to, int thread) {
    const int timing = e->profiling && thread == 0;
    double t = timing ? now_s() : 0;
    for (int s = from; s < to; s++) {
        stage *st = &e->stages[s];
        if (st->folded) continue; /* run by its chain's items */
        const int n = bn_pool_size(e->pool);
        int mine = 0;
        for (int k = 0; k < n; k++) { /* its own range, then what is left of the others' */
            const int r = (thread + k) % n, end = range_start(st->n_items, r + 1, n);
            atomic_int *next = &e->take[(size_t)s * n + r].next;
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

/* The pool job of a segment of shared stages (e->segment), run by the caller and every worker that joins. */
static void segment_worker(void *arg, int thread, int n_threads) {
    (void)n_threads;
    bn_engine *e = arg;
    const double t0 = e->profiling && thread == 0 ? now_s() : 0;
    run_stages(e, e->segment[0], e->segment[1], thread);
    if (e->profiling && thread == 0) e->inside += now_s() - t0;
}

/* The whole stage list: runs of consecutive shared stages as one pool job each (for a batch of tokens on a small
 * model that is the whole forward), the other stages on the calling thread. */
void bn_run_forward(bn_engine *e) {
    for (int s = 0; s < e->n_stages;) {
        if (!e->stages[s].shared || bn_pool_size(e->pool) == 1) {
            run_stages(e, s, s + 1, 0);
            s++;
            continue;
        }
        int end = s + 1;
        while (end < e->n_stages && e->stages[end].shared) end++;
        e->segment[0] = s;
        e->segment[1] = end;
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
