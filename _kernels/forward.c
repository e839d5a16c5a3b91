/* The BitNet b1.58 forward pass: all layers in one call, for a batch of T tokens.
 *
 * One layer (reference: transformers BitNetDecoderLayer, and LlamaDecoderLayer with BitLinear for the Llama
 * family, fp32), shapes per batch of T tokens:
 *   a = rmsnorm(x) * attn_norm                                          x, a (T, D)
 *   q|k|v = ternary(qkv) @ quant8(a); RoPE (half split) on q and k      qkv (T, H*hd + 2*G*hd)
 *   k, v -> KV cache at positions start .. start+T-1                    cache (L, C, G*hd), fp16 or fp32
 *   o = softmax(q k^T / sqrt(hd)) v over cache keys [0, kv_end) visible to each query (causal or block mask)
 *                                                                       att (T, D)
 *   x += ternary(o_proj) @ quant8(rmsnorm(o) * attn_sub_norm)            proj (T, D)
 *   g|u = ternary(gate_up) @ quant8(rmsnorm(x) * ffn_norm)               gu (T, 2I)
 *   x += ternary(down) @ quant8(rmsnorm(act(g) * u) * ffn_sub_norm)      act: relu(g)^2 or silu(g) = g*sigmoid(g)
 * The sub-norms are optional (NULL in bn_layer: the Llama family has none): then quant8(o), quant8(act(g) * u).
 * Final: logits[rows] = head(rmsnorm(x[rows]) * norm), head = int8 tiles (default) or the bf16 head (exact:
 * the embedding when tied, lm_head when not). Only the logit rows need the last layer beyond its K/V, so when
 * fewer are asked (a prefill, a block commit, a denoising step) its attention and everything after run on those
 * rows alone (trims_last_layer).
 *
 * quant8: per token, scale = 127 / max|x| (max clamped to 1e-5), q = round-half-even(x * scale) in
 * [-128, 127]; the int32 dot products are multiplied back by 1/scale and the per-row weight multiplier.
 * Everything outside the ternary and head dot products is fp32, like the reference run in fp32.
 *
 * Threads: a forward is a fixed list of stages (10 per layer, 2 for the head), each split into items (runs of tokens,
 * row tiles of a matrix or, for a small model's batch, runs of tokens through the whole matrix (token_split),
 * (tile of tokens, kv head) pairs). The items of a stage are cut into one contiguous range
 * per thread, each with its own atomic counter: a thread takes the items of its own range first, then those left
 * in the others' ranges; one that finds no item left waits until the stage's items are all done, then goes on to
 * the next stage. Owning a range keeps the same weight tiles and the same tokens on the same core from one stage
 * and one forward to the next, in its caches (taking items from one shared counter moved them between the cores
 * at random: on a Zen 4 VM a small model's 8-row forward ran 1.8x slower on 2 threads than on 1). Stages with
 * enough work are shared: each run of consecutive shared stages is ONE job of the pool (pool.h), so a batch of
 * tokens on a small model costs one job per forward, not one per operation; when such a batch is split by tokens,
 * the token-local stages between two attentions are folded into one (fold_chains), so its threads wait for each
 * other twice per layer. Small stages (a single token's
 * norms, a small model's matrices at decode) stay on the calling thread. Workers that join a job late skip the
 * finished stages; a worker the OS has not scheduled never holds anyone up (it has taken no item).
 */
#include <math.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitnet.h"
#include "float_mode.h"
#include "kernels.h"
#include "pool.h"

#define ROUND16(n) (((n) + 15) / 16 * 16)
/* A matrix product runs over the batch in slices of at most MATMUL_SLICE tokens, so a slice's activations
 * (at most 32 x Kp bytes, 221 KB for the 2B model's down_proj) stay in L2 while the weight tiles stream past. */
#define MATMUL_SLICE 32
/* Row tiles are shared out in chunks, about CHUNKS_PER_THREAD per thread and slice: a thread the OS
 * descheduled delays the stage by at most one chunk, and each chunk streams contiguous memory. */
#define CHUNKS_PER_THREAD 8
/* An attention item takes up to ATTN_MAX_ROWS consecutive tokens (fewer when that leaves fewer than
 * ATTN_ITEMS_PER_THREAD items per thread), so each key and value tile serves all of them. */
#define ATTN_MAX_ROWS 8
#define ATTN_ITEMS_PER_THREAD 2

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
 * the other on one run of tokens per item; the stages it stands for are `folded` (see plan_forward). */
typedef enum { KIND_TOKENS, KIND_TERNARY, KIND_ATTENTION, KIND_INT8_HEAD, KIND_EXACT_HEAD, KIND_CHAIN } stage_kind;

/* One stage of the running forward: its items and the count of those done (its own cache line; the counters of
 * the threads' ranges are in bn_engine.take). */
typedef struct {
    alignas(64) atomic_int done; /* items finished */
    int n_items;
    int shared;                  /* 1: worth sharing between threads (see plan_forward), 0: the caller runs it */
    stage_kind kind;
    const bn_ternary *w;         /* KIND_TERNARY: the matrix */
    float *y;                    /* matrix stages: output (T, ldy) */
    int T;                       /* input rows: the batch, or the logit rows for the head stages */
    int ldy, kp;                 /* output row stride; padded K of the quantized input rows */
    int chunk, chunks_per_slice; /* matrix stages: row units per item, items per token slice */
    int slice_tokens;            /* matrix stages: tokens per slice (MATMUL_SLICE, or a thread's run: token_split) */
    int tokens_per_item;         /* KIND_TOKENS, KIND_ATTENTION, KIND_CHAIN: consecutive tokens (or logit rows) per item */
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
    int kv16;                      /* 1: the KV cache holds IEEE half (fp16), 0: float32 */
    void *k_cache, *v_cache;       /* (L, G, C, hd) of fp16 or float32: each head's rows contiguous, so an attention
                                      item streams them (with (L, C, G*hd) it read 1 row in G: ~2x slower at 4k) */
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

static void set_err(char *err, int errlen, const char *msg) {
    if (err && errlen > 0) snprintf(err, (size_t)errlen, "%s", msg);
}

/* ---------------------------------------------------------------- development timing */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

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

/* ---------------------------------------------------------------- per-token stages */

static float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* Row t of xq for a matrix of padded width kp. Rows are at stride kp, within runs of `run` tokens (0: one run)
 * that each start at a multiple of the widest stride: a chain item (fold_chains) writes its run's rows for one
 * matrix while another thread's run is at a matrix of another width, and neither overwrites the other's rows. */
static inline int8_t *xq_row(const bn_engine *e, int t, int kp, int run) {
    const int base = run ? t - t % run : 0;
    return e->xq + (size_t)base * e->xn_ld + (size_t)(t - base) * kp;
}

/* Token row t of xq (xq_row) = quant8(rmsnorm(x) * w) (LlamaRMSNorm in fp32), with its sum and 1/scale. */
static void norm_quant_row(bn_engine *e, const float *x, const float *w, int n, int kp, int t, int run) {
    const bn_kernels *k = e->k;
    int8_t *q = xq_row(e, t, kp, run);
    float *xn = e->xn + (size_t)t * e->xn_ld;
    if (k->norm_quant) { /* the same operations, fused into fewer passes */
        e->xsum[t] = k->norm_quant(x, w, n, kp, e->m.eps, xn, q, &e->xinv[t]);
        return;
    }
    const float inv = 1.0f / sqrtf(k->sumsq(x, n) / (float)n + e->m.eps);
    k->norm_apply(x, inv, w, xn, n);
    float m = k->absmax(xn, n);
    if (m < 1e-5f) m = 1e-5f;
    const float scale = 127.0f / m;
    e->xsum[t] = k->quantize(xn, n, kp, scale, q);
    e->xinv[t] = 1.0f / scale;
}

/* Token row t of xq (xq_row) = quant8(x) with no norm before it (a layer without sub-norms). */
static void quant_row(bn_engine *e, const float *x, int n, int kp, int t, int run) {
    float m = e->k->absmax(x, n);
    if (m < 1e-5f) m = 1e-5f;
    const float scale = 127.0f / m;
    e->xsum[t] = e->k->quantize(x, n, kp, scale, xq_row(e, t, kp, run));
    e->xinv[t] = 1.0f / scale;
}

/* out = silu(g) * u = g / (1 + e^-g) * u, the reference of the kernel table's optional silu_mul */
static void silu_mul_ref(const float *g, const float *u, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* x (hd) rotated in place at position pos: pairs (i, i + hd/2) */
static void rope(const bn_engine *e, float *x, int pos) {
    const int half = e->m.head_dim / 2;
    const float *c = e->rope_cos + (size_t)pos * half, *s = e->rope_sin + (size_t)pos * half;
    for (int i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * c[i] - b * s[i];
        x[i + half] = b * c[i] + a * s[i];
    }
}

/* 1 for the stages of a trimmed last layer that run on the logit rows only (its attention and after): their
 * token t is logit row t, i.e. batch token fa.rows[t] (see plan_forward). */
static inline int trimmed_stage(const bn_engine *e, int l, int s) {
    return e->fa.trim_last && l == e->m.n_layers - 1 && s >= STAGE_ATTENTION;
}

static void token_stage(bn_engine *e, int l, layer_stage s, int t) {
    const bn_model *m = &e->m;
    const bn_layer *ly = &e->layers[l];
    const int D = m->dim, I = m->hidden, hd = m->head_dim, kvd = m->n_kv_heads * hd;
    const int run = e->stages[(size_t)l * STAGES_PER_LAYER + s].xq_run;
    /* the residual row: in a trimmed last layer (trimmed_stage), row t of the batch is the logit row t */
    const int xt = trimmed_stage(e, l, s) ? e->fa.rows[t] : t;
    float *x = e->x + (size_t)xt * D, *proj = e->proj + (size_t)t * e->dp;
    switch (s) {
        case STAGE_ATTN_NORM:
            if (l > 0) e->k->add(x, proj, D);
            norm_quant_row(e, x, ly->attn_norm, D, e->dp, t, run);
            break;
        case STAGE_ROPE_KV: {
            float *row = e->qkv + (size_t)t * e->qkv_np; /* [q (H*hd) | k (G*hd) | v (G*hd)] */
            const int pos = e->fa.start + t;
            for (int h = 0; h < m->n_heads + m->n_kv_heads; h++) rope(e, row + h * hd, pos); /* q heads, then k */
            for (int g = 0; g < m->n_kv_heads; g++) { /* head g's row at position pos: see k_cache */
                const size_t at = (((size_t)l * m->n_kv_heads + g) * e->ctx + pos) * hd;
                const float *kr = row + D + g * hd, *vr = row + D + kvd + g * hd;
                if (e->kv16) {
                    e->k->to_f16(kr, (uint16_t *)e->k_cache + at, hd);
                    e->k->to_f16(vr, (uint16_t *)e->v_cache + at, hd);
                } else {
                    memcpy((float *)e->k_cache + at, kr, sizeof(float) * (size_t)hd);
                    memcpy((float *)e->v_cache + at, vr, sizeof(float) * (size_t)hd);
                }
            }
            break;
        }
        case STAGE_ATTN_SUB:
            if (ly->attn_sub_norm) norm_quant_row(e, e->att + (size_t)t * D, ly->attn_sub_norm, D, e->dp, t, run);
            else quant_row(e, e->att + (size_t)t * D, D, e->dp, t, run);
            break;
        case STAGE_FFN_NORM:
            e->k->add(x, proj, D);
            norm_quant_row(e, x, ly->ffn_norm, D, e->dp, t, run);
            break;
        case STAGE_FFN_SUB: {
            float *g = e->gu + (size_t)t * e->gu_np; /* [gate (I) | up (I)] */
            if (m->act == BN_ACT_SILU) (e->k->silu_mul ? e->k->silu_mul : silu_mul_ref)(g, g + I, g, I);
            else e->k->relu2_mul(g, g + I, g, I);
            if (ly->ffn_sub_norm) norm_quant_row(e, g, ly->ffn_sub_norm, I, e->ip, t, run);
            else quant_row(e, g, I, e->ip, t, run);
            break;
        }
        default:
            break;
    }
}

/* ---------------------------------------------------------------- attention */

/* The generic attention of one GQA group (the reference, and the path of kernel tables without `attend`):
 * scores = q . k * scale, softmax (exp, divide), out = sum of score * v, through the table's vector ops. */
static void attend_generic(const bn_kernels *k, const float *q, int nq, int hd, const void *kc, const void *vc,
                           size_t ld, int kv16, int n_keys, float scale, float *sc, float *out) {
    const float *kf = kc, *vf = vc;
    const uint16_t *kh = kc, *vh = vc;
    for (int s = 0; s < n_keys; s++)
        for (int h = 0; h < nq; h++)
            sc[(size_t)h * n_keys + s] =
                (kv16 ? k->dot_f16(q + h * hd, kh + s * ld, hd) : k->dot(q + h * hd, kf + s * ld, hd)) * scale;
    for (int h = 0; h < nq; h++) { /* softmax per head, in place */
        float *row = sc + (size_t)h * n_keys, mx = -INFINITY, sum = 0.0f;
        for (int s = 0; s < n_keys; s++) mx = row[s] > mx ? row[s] : mx;
        for (int s = 0; s < n_keys; s++) { row[s] = expf(row[s] - mx); sum += row[s]; }
        for (int s = 0; s < n_keys; s++) row[s] /= sum; /* divide, as softmax does */
    }
    memset(out, 0, sizeof(float) * (size_t)nq * hd);
    for (int s = 0; s < n_keys; s++)
        for (int h = 0; h < nq; h++) {
            if (kv16) k->axpy_f16(sc[(size_t)h * n_keys + s], vh + s * ld, out + h * hd, hd);
            else k->axpy(sc[(size_t)h * n_keys + s], vf + s * ld, out + h * hd, hd);
        }
}

/* The generic multi-row attention (the reference, and the path of kernel tables without attend_rows): the same
 * item as attend_rows (kernels.h), one row at a time through attend_generic. */
static void attend_rows_generic(const bn_kernels *k, const float *q, size_t ldq, int nr, int nq, int hd, const void *kc,
                                const void *vc, size_t ld, int kv16, const int *ends, float scale, float *sc, float *out,
                                size_t ldo) {
    for (int r = 0; r < nr; r++)
        attend_generic(k, q + (size_t)r * ldq, nq, hd, kc, vc, ld, kv16, ends[r], scale, sc, out + (size_t)r * ldo);
}

/* The attention of tokens [t0, t0 + nr) (nr <= ATTN_MAX_ROWS) for kv head g: the `group` query heads of each token
 * that share K/V head g, all together, so each cached K and V row is read (and converted from fp16) once per tile of
 * tokens and head group. Each token sees a prefix [0, end) of the cache: causal: its own position + 1; block: the end
 * of its block (shared by the block's tokens); never beyond kv_end. In a trimmed last layer the tokens are the logit
 * rows: the tile first gathers their query heads into q_last (row t = batch token fa.rows[t]). */
static void attention_tile(bn_engine *e, int l, int t0, int nr, int g, int thread) {
    const bn_model *m = &e->m;
    const int hd = m->head_dim, G = m->n_kv_heads, group = m->n_heads / G;
    const int trimmed = trimmed_stage(e, l, STAGE_ATTENTION);
    const float *q = e->qkv + (size_t)t0 * e->qkv_np + (size_t)g * group * hd; /* the group's heads, contiguous */
    size_t ldq = (size_t)e->qkv_np;
    if (trimmed) {
        float *gathered = e->q_last + (size_t)t0 * m->dim + (size_t)g * group * hd;
        for (int r = 0; r < nr; r++)
            memcpy(gathered + (size_t)r * m->dim, e->qkv + (size_t)e->fa.rows[t0 + r] * e->qkv_np + (size_t)g * group * hd,
                   sizeof(float) * (size_t)group * hd);
        q = gathered;
        ldq = (size_t)m->dim;
    }
    int ends[ATTN_MAX_ROWS];
    for (int r = 0; r < nr; r++) {
        const int pos = e->fa.start + (trimmed ? e->fa.rows[t0 + r] : t0 + r);
        int end = e->fa.block > 0 ? (pos / e->fa.block + 1) * e->fa.block : pos + 1; /* block or causal mask */
        ends[r] = end < e->fa.kv_end ? end : e->fa.kv_end;
    }
    const size_t elem = e->kv16 ? sizeof(uint16_t) : sizeof(float);
    const size_t off = ((size_t)l * G + g) * e->ctx * hd * elem; /* layer l, head g, position 0 */
    const void *kc = (const char *)e->k_cache + off, *vc = (const char *)e->v_cache + off;
    float *out = e->att + (size_t)t0 * m->dim + (size_t)g * group * hd;
    float *sc = e->scores + (size_t)thread * e->scores_ld;
    const float scale = 1.0f / sqrtf((float)hd);
    if (!e->k->attend_rows || !e->k->attend_rows(q, ldq, nr, group, hd, kc, vc, (size_t)hd, e->kv16, ends, scale, sc,
                                                 out, (size_t)m->dim))
        attend_rows_generic(e->k, q, ldq, nr, group, hd, kc, vc, (size_t)hd, e->kv16, ends, scale, sc, out,
                            (size_t)m->dim);
}

/* Item p of an attention stage = (tile of up to tokens_per_item consecutive tokens, kv head g). */
static void attention_item(bn_engine *e, int l, int p, int thread) {
    const stage *st = &e->stages[(size_t)l * STAGES_PER_LAYER + STAGE_ATTENTION];
    const int G = e->m.n_kv_heads, rows = st->tokens_per_item, t0 = p / G * rows;
    attention_tile(e, l, t0, st->T - t0 < rows ? st->T - t0 : rows, p % G, thread);
}

/* ---------------------------------------------------------------- matrix stages */

/* Item i of a matrix stage: token slice i / chunks_per_slice, row units [u0, u1) of chunk i % chunks_per_slice
 * (units: tiles of 16 rows, or single rows for the exact head). */
static void matmul_item(bn_engine *e, const stage *st, int i) {
    const int slice = i / st->chunks_per_slice, t0 = slice * st->slice_tokens;
    const int rows = st->T - t0 < st->slice_tokens ? st->T - t0 : st->slice_tokens;
    const int units = st->kind == KIND_EXACT_HEAD ? e->m.vocab
                      : st->kind == KIND_INT8_HEAD ? e->vp / 16 : ROUND16(st->w->n) / 16;
    const int u0 = (i % st->chunks_per_slice) * st->chunk, u1 = u0 + st->chunk < units ? u0 + st->chunk : units;
    float *y = st->y + (size_t)t0 * st->ldy;
    const int8_t *xq = xq_row(e, t0, st->kp, st->xq_run);
    switch (st->kind) {
        case KIND_TERNARY:
            e->k->ternary_matmul(st->w->codes, st->kp, st->w->scale, xq, e->xsum + t0, e->xinv + t0, rows, u0 * 16,
                                 u1 * 16, y, st->ldy);
            break;
        case KIND_INT8_HEAD:
            e->k->int8_matmul(e->m.head_i8, e->dp, e->m.head_scale, e->m.head_rowsum, xq, e->xinv + t0, rows,
                              u0 * 16, u1 * 16, y, st->ldy);
            break;
        case KIND_EXACT_HEAD:
            e->k->bf16_matmul(e->m.head_bf16, e->m.dim, e->xn + (size_t)t0 * e->m.dim, rows, u0, u1, y, st->ldy);
            break;
        default:
            break;
    }
}

/* ---------------------------------------------------------------- the stage list of one forward */

/* Below these amounts of work a stage runs on the calling thread alone: sharing it would gain less than the
 * hand-over costs, and a worker that joined and was then descheduled by a busy OS stalls the caller for up to a
 * time slice (so the fewer stages a small forward shares, the steadier it runs). */
#define SHARE_MIN_TOKENS 4         /* per-token stages: batch rows */
/* A shared per-token stage hands out runs of tokens, about TOKEN_ITEMS_PER_THREAD runs per thread: one token's
 * norm or RoPE on a small model is ~0.1 µs, less than taking an item from the shared counter costs when two
 * cores take turns at its cache line. */
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
 * through every row of the (cached) weights, so a token's activations stay on one core from stage to stage; split
 * by rows, every stage reads half of each token's inputs from the other core. Used when one layer's matrices fit
 * in a core's L2 several times over (each core then reads all of them) and each thread gets at least a whole
 * block of tokens for the kernels (TOKEN_SPLIT_MIN_TOKENS). Same sums either way, so the same logits. */
#define TOKEN_SPLIT_MAX_BYTES (256 * 1024) /* ternary bytes of one layer's matrices */
#define TOKEN_SPLIT_MIN_TOKENS 2           /* per thread (8 rows on 2 threads: 0.31 -> 0.19 ms avx512, 0.178 -> 0.166
                                              avx2, with fold_chains; 4-7 rows, split by rows until this was 4: amx
                                              0.12-0.17 -> 0.095-0.136 ms; 1 token per thread made 2 rows slower) */
#define TOKEN_SPLIT_BLOCK 4                /* the kernels' block of rows: runs are whole blocks when there are enough */
#define TOKEN_SPLIT_ITEMS_PER_THREAD 2     /* runs of tokens per thread (when each still has a block): a late worker
                                              delays by one */

static int token_split(const bn_engine *e, int T) {
    const int n = bn_pool_size(e->pool);
    const size_t layer_bytes = (size_t)e->dp / 4 * (e->qkv_np + e->dp + e->gu_np) + (size_t)e->ip / 4 * e->dp;
    return n > 1 && layer_bytes <= TOKEN_SPLIT_MAX_BYTES && T >= n * TOKEN_SPLIT_MIN_TOKENS;
}

/* Tokens per run of a token_split batch of T: the item of its matrix stages and of its chains (fold_chains,
 * fold_causal). Under causal attention one run per thread, as even as T allows, so that the whole batch can run as
 * one chain per thread (fold_causal: 16 / 24 / 32 rows of the demo model 0.28-0.31 / 0.38-0.40 / 0.44-0.52 ->
 * 0.24-0.26 / 0.34-0.37 / 0.41-0.46 ms on amx, ab_builds). Under block attention runs of whole blocks,
 * TOKEN_SPLIT_ITEMS_PER_THREAD per thread, when every run gets one; else one run per thread (12 tokens on 2
 * threads: 6 + 6, where runs of 4 gave one thread 8 and the other 4). */
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
    s[STAGE_ATTENTION] = (stage){.n_items = (T + attn_rows - 1) / attn_rows * m->n_kv_heads, .kind = KIND_ATTENTION,
                                 .T = T, .tokens_per_item = attn_rows, .shared = attn_shared};
    set_token_stage(e, &s[STAGE_ATTN_SUB], T);
    set_matmul_stage(e, &s[STAGE_O], KIND_TERNARY, &ly->o, e->dp / 16, T, e->proj, e->dp, e->dp);
    set_token_stage(e, &s[STAGE_FFN_NORM], T);
    set_matmul_stage(e, &s[STAGE_GATE_UP], KIND_TERNARY, &ly->gate_up, e->gu_np / 16, T, e->gu, e->gu_np, e->dp);
    set_token_stage(e, &s[STAGE_FFN_SUB], T);
    set_matmul_stage(e, &s[STAGE_DOWN], KIND_TERNARY, &ly->down, e->dp / 16, T, e->proj, e->dp, e->ip);
}

static void plan_forward(bn_engine *e) {
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

/* Logit row r: x[rows[r]] + proj (the last down_proj) -> final norm: into xq (int8 head) or xn (exact head). */
static void head_norm_item(bn_engine *e, int r) {
    const bn_model *m = &e->m;
    const int D = m->dim, t = e->fa.rows[r];
    float *xr = e->att + (size_t)r * D;
    memcpy(xr, e->x + (size_t)t * D, sizeof(float) * D);
    e->k->add(xr, e->proj + (size_t)(e->fa.trim_last ? r : t) * e->dp, D); /* a trimmed last layer: compacted */
    if (e->exact_head) {
        const float inv = 1.0f / sqrtf(e->k->sumsq(xr, D) / (float)D + m->eps);
        e->k->norm_apply(xr, inv, m->norm, e->xn + (size_t)r * D, D);
    } else {
        norm_quant_row(e, xr, m->norm, D, e->dp, r, 0);
    }
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
                    attention_tile(e, l, a, t1 - a < ATTN_MAX_ROWS ? t1 - a : ATTN_MAX_ROWS, g, thread);
        } else if (f == s || e->stages[f].kind == KIND_TOKENS) { /* stage s itself (a token stage) holds the chain */
            for (int tok = t0; tok < t1; tok++) token_stage(e, l, ls, tok);
            if (c->fused && ls == STAGE_ROPE_KV) /* this run's K/V of layer l are in the cache */
                atomic_store_explicit(&e->kv_layers[i].next, l + 1, memory_order_release);
        } else {
            matmul_item(e, &e->stages[f], i); /* token_split: item i of the matrix stage is the same run */
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
                if (s < layer_stages) token_stage(e, s / STAGES_PER_LAYER, (layer_stage)(s % STAGES_PER_LAYER), t);
                else head_norm_item(e, t);
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
            matmul_item(e, st, i);
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
static void run_forward(bn_engine *e) {
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

/* ---------------------------------------------------------------- create / free */

static int grow_scratch(bn_engine *e, int T, int rows) {
    if (T > e->cap_t) {
        const bn_model *m = &e->m;
        const int widest = e->ip > e->dp ? e->ip : e->dp;
        free(e->x); free(e->xn); free(e->qkv); free(e->att); free(e->proj); free(e->gu);
        free(e->xq); free(e->xsum); free(e->xinv);
        e->x = malloc(sizeof(float) * (size_t)T * m->dim);
        e->xn = malloc(sizeof(float) * (size_t)T * widest);
        e->qkv = malloc(sizeof(float) * (size_t)T * e->qkv_np);
        e->att = malloc(sizeof(float) * (size_t)T * m->dim);
        e->proj = malloc(sizeof(float) * (size_t)T * e->dp);
        e->gu = malloc(sizeof(float) * (size_t)T * e->gu_np);
        e->xq = malloc((size_t)T * widest + 64);
        e->xsum = malloc(sizeof(int32_t) * (size_t)T);
        e->xinv = malloc(sizeof(float) * (size_t)T);
        e->cap_t = T;
        if (!e->x || !e->xn || !e->qkv || !e->att || !e->proj || !e->gu || !e->xq || !e->xsum || !e->xinv) {
            e->cap_t = 0;
            return -1;
        }
    }
    if (rows > e->cap_rows) {
        free(e->logit_buf);
        free(e->q_last);
        e->logit_buf = malloc(sizeof(float) * (size_t)rows * e->vp);
        e->q_last = malloc(sizeof(float) * (size_t)rows * e->m.dim);
        e->cap_rows = e->logit_buf && e->q_last ? rows : 0;
        if (!e->cap_rows) return -1;
    }
    return 0;
}

bn_engine *bn_engine_create(const bn_model *m, int exact_head, int kv16, int n_threads, const char *isa, int ctx,
                            char *err, int errlen) {
    const bn_kernels *k = bn_select_kernels(isa);
    if (!k) {
        char msg[160];
        snprintf(msg, sizeof msg, "kernel path '%s' is not supported by this CPU (or unknown); use avx512, avxvnni, avx2 or portable", isa);
        set_err(err, errlen, msg);
        return NULL;
    }
    if (n_threads < 1 || n_threads > BN_POOL_MAX_THREADS) {
        char msg[160];
        snprintf(msg, sizeof msg, "thread count %d is out of range: use 1 to %d (the number of CPU cores is a good choice)",
                 n_threads, BN_POOL_MAX_THREADS);
        set_err(err, errlen, msg);
        return NULL;
    }
    if (m->n_heads <= 0 || m->n_kv_heads <= 0 || m->n_heads % m->n_kv_heads || m->n_heads * m->head_dim != m->dim ||
        m->head_dim % 2 || ctx <= 0 || (m->act != BN_ACT_RELU2 && m->act != BN_ACT_SILU) || !m->head_bf16) {
        set_err(err, errlen, "inconsistent model shape (heads, kv heads, head_dim, hidden size or context)");
        return NULL;
    }
    bn_engine *e = calloc(1, sizeof *e);
    if (!e) { set_err(err, errlen, "out of memory"); return NULL; }
    e->m = *m;
    e->layers = malloc(sizeof(bn_layer) * (size_t)m->n_layers);
    if (!e->layers) { free(e); set_err(err, errlen, "out of memory"); return NULL; }
    memcpy(e->layers, m->layers, sizeof(bn_layer) * (size_t)m->n_layers);
    e->m.layers = e->layers;
    e->k = k;
    e->exact_head = exact_head;
    e->kv16 = kv16;
    e->ctx = ctx;
    e->dp = ROUND16(m->dim);
    e->ip = ROUND16(m->hidden);
    e->qkv_np = ROUND16(m->dim + 2 * m->n_kv_heads * m->head_dim);
    e->gu_np = ROUND16(2 * m->hidden);
    e->vp = ROUND16(m->vocab);
    e->xn_ld = e->dp > e->ip ? e->dp : e->ip;
    const size_t kv = (size_t)m->n_layers * ctx * m->n_kv_heads * m->head_dim;
    const size_t elem = kv16 ? sizeof(uint16_t) : sizeof(float);
    e->k_cache = calloc(kv, elem); /* calloc: untouched pages cost no memory */
    e->v_cache = calloc(kv, elem);
    const int half = m->head_dim / 2;
    e->rope_cos = malloc(sizeof(float) * (size_t)ctx * half);
    e->rope_sin = malloc(sizeof(float) * (size_t)ctx * half);
    e->stages = aligned_alloc(64, sizeof(stage) * ((size_t)m->n_layers * STAGES_PER_LAYER + HEAD_STAGES));
    e->pool = bn_pool_create(n_threads);
    if (!e->pool) {
        bn_engine_free(e);
        set_err(err, errlen, "out of memory starting the engine's threads; use fewer threads");
        return NULL;
    }
    e->take = aligned_alloc(64, sizeof(range_counter) * ((size_t)m->n_layers * STAGES_PER_LAYER + HEAD_STAGES) *
                                    bn_pool_size(e->pool));
    e->kv_layers = aligned_alloc(64, sizeof(range_counter) * (size_t)bn_pool_size(e->pool));
    /* per thread, rounded to whole cache lines; malloc'ed pages are only touched as far as the keys go */
    e->scores_ld = (BN_ATTN_SCRATCH(ATTN_MAX_ROWS, m->n_heads / m->n_kv_heads, m->head_dim, ctx) + 15) / 16 * 16;
    e->scores = aligned_alloc(64, sizeof(float) * e->scores_ld * bn_pool_size(e->pool));
    if (!e->k_cache || !e->v_cache || !e->rope_cos || !e->rope_sin || !e->scores || !e->stages || !e->take ||
        !e->kv_layers) {
        bn_engine_free(e);
        set_err(err, errlen, "out of memory allocating the KV cache; use a shorter context");
        return NULL;
    }
    /* RoPE tables as transformers builds them: inv_freq in fp32 (given, else 1/theta^(2i/hd)),
     * angle = fp32(pos * inv_freq) */
    for (int i = 0; i < half; i++) {
        const float expo = (float)(2 * i) / (float)m->head_dim;
        const float inv_freq = m->rope_inv_freq ? m->rope_inv_freq[i]
                                                : 1.0f / (float)pow((double)m->rope_theta, (double)expo);
        for (int p = 0; p < ctx; p++) {
            const float angle = (float)p * inv_freq;
            e->rope_cos[(size_t)p * half + i] = (float)cos((double)angle);
            e->rope_sin[(size_t)p * half + i] = (float)sin((double)angle);
        }
    }
    return e;
}

void bn_engine_free(bn_engine *e) {
    if (!e) return;
    bn_pool_free(e->pool);
    free(e->layers); free(e->k_cache); free(e->v_cache); free(e->rope_cos); free(e->rope_sin);
    free(e->x); free(e->xn); free(e->qkv); free(e->att); free(e->proj); free(e->gu);
    free(e->xq); free(e->xsum); free(e->xinv); free(e->scores); free(e->logit_buf); free(e->q_last); free(e->stages);
    free(e->take); free(e->kv_layers);
    free(e);
}

const char *bn_engine_isa(const bn_engine *e) { return e->k->name; }
int bn_engine_threads(const bn_engine *e) { return bn_pool_size(e->pool); }

/* For rows_job.c, which runs the sampler's rows on this engine's threads. */
const bn_kernels *bn_engine_kernels(const bn_engine *e) { return e->k; }
bn_pool *bn_engine_pool(bn_engine *e) { return e->pool; }

/* ---------------------------------------------------------------- the forward */

static int check_args(const bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention,
                      int block_size, const int32_t *rows, int n_rows, char *err, int errlen) {
    char msg[200];
    if (T <= 0) { set_err(err, errlen, "forward needs at least one token"); return -1; }
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= e->m.vocab) {
            snprintf(msg, sizeof msg, "token id %d is out of range (vocabulary %d)", tokens[t], e->m.vocab);
            set_err(err, errlen, msg);
            return -1;
        }
    if (start < 0 || start + T > e->ctx || kv_end < start + T || kv_end > e->ctx) {
        snprintf(msg, sizeof msg, "positions %d..%d (keys up to %d) do not fit the context of %d", start, start + T - 1,
                 kv_end, e->ctx);
        set_err(err, errlen, msg);
        return -1;
    }
    if (attention == 1 && block_size <= 0) { set_err(err, errlen, "block attention needs block_size > 0"); return -1; }
    for (int r = 0; r < n_rows; r++)
        if (rows[r] < 0 || rows[r] >= T) { set_err(err, errlen, "logit row out of range"); return -1; }
    return 0;
}

int bn_forward(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention, int block_size,
               const int32_t *rows, int n_rows, float *logits, char *err, int errlen) {
    const bn_model *m = &e->m;
    if (check_args(e, tokens, T, start, kv_end, attention, block_size, rows, n_rows, err, errlen)) return -1;
    if (grow_scratch(e, T > n_rows ? T : n_rows, n_rows) != 0) {
        set_err(err, errlen, "out of memory for the forward's scratch buffers");
        return -1;
    }
    const unsigned caller_mode = bn_flush_denormals(); /* float_mode.h: restored before returning */
    const double t_begin = e->profiling ? now_s() : 0;
    const int D = m->dim;
    for (int t = 0; t < T; t++) {
        const uint16_t *row = m->embed + (size_t)tokens[t] * D;
        for (int i = 0; i < D; i++) e->x[(size_t)t * D + i] = bf16_to_f32(row[i]);
    }
    e->fa = (forward_args){.T = T, .start = start, .kv_end = kv_end, .block = attention == 1 ? block_size : 0,
                           .rows = rows, .n_rows = n_rows};
    plan_forward(e);
    if (e->profiling) e->prof[BN_PART_EMBED] += now_s() - t_begin;
    run_forward(e);
    const double t = e->profiling ? now_s() : 0;
    for (int r = 0; r < n_rows; r++)
        memcpy(logits + (size_t)r * m->vocab, e->logit_buf + (size_t)r * e->vp, sizeof(float) * (size_t)m->vocab);
    if (e->profiling) {
        const double t_end = now_s();
        e->prof[BN_PART_OUTPUT] += t_end - t;
        e->prof[BN_PART_TOTAL] += t_end - t_begin;
    }
    bn_restore_float_mode(caller_mode);
    return 0;
}
