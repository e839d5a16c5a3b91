/* The BitNet b1.58 forward pass: all layers in one call, for a batch of T tokens.
 *
 * Per layer (reference: transformers BitNetDecoderLayer, fp32):
 *   a = rmsnorm(x) * attn_norm                      (T, D)
 *   q|k|v = ternary(qkv) @ quant8(a)                 (T, H*hd + 2*G*hd); RoPE half-split on q, k
 *   K/V of the batch -> cache[start .. start+T)      (L, C, G*hd) float32
 *   o = attention(q, cache keys [0, kv_end) under the causal or block mask)   (T, D)
 *   x += ternary(o_proj) @ quant8(rmsnorm(o) * attn_sub_norm)
 *   b = rmsnorm(x) * ffn_norm; g|u = ternary(gate_up) @ quant8(b)            (T, 2I)
 *   x += ternary(down) @ quant8(rmsnorm(relu(g)^2 * u) * ffn_sub_norm)
 * Final: logits[rows] = head(rmsnorm(x[rows]) * norm), head = int8 tiles (default) or bf16 embed (exact).
 *
 * quant8: per token, scale = 127 / max|x| (max clamped to 1e-5), q = round-half-even(x * scale) in
 * [-128, 127]; the int32 dot products are multiplied back by 1/scale and the per-row weight multiplier.
 * Everything outside the ternary and head dot products is fp32, like the reference run in fp32.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitnet.h"
#include "kernels.h"
#include "pool.h"


#define ROUND16(n) (((n) + 15) / 16 * 16)

struct bn_engine {
    bn_model m;
    bn_layer *layers; /* own copy of the layer table */
    const bn_kernels *k;
    bn_pool *pool;
    int exact_head, ctx;
    int dp, ip, qkv_np, gu_np, vp; /* padded sizes */
    int xn_ld;                     /* row stride of xn: max(Dp, Ip) */
    int kv16;                      /* 1: the KV cache holds IEEE half (fp16), 0: float32 */
    void *k_cache, *v_cache;       /* (L, C, G*hd) of fp16 or float32 */
    float *rope_cos, *rope_sin;    /* (C, hd/2) */
    /* scratch, sized for cap_t tokens and cap_rows logit rows */
    int cap_t, cap_rows;
    float *x, *xn, *qkv, *att, *proj, *gu, *scores, *logit_buf;
    int8_t *xq;
    int32_t *xsum;
    float *xinv;
    /* development timing (bn_engine_set_profile): seconds per part, added by the calling thread */
    int profiling;
    double prof[BN_PART_COUNT];
    double sync_s; /* time the caller spent opening parallel jobs and waiting for their workers */
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

/* A running clock of the calling thread: prof_mark(e, part, &c) adds the time since the last mark to
 * `part`, less the time spent in the pool (opening jobs, waiting for workers), which goes to BN_PART_SYNC. */
typedef struct { double t, sync; } prof_clock;

static prof_clock prof_start(const bn_engine *e) {
    prof_clock c = {0, 0};
    if (e->profiling) { c.t = now_s(); c.sync = e->sync_s; }
    return c;
}

static void prof_mark(bn_engine *e, int part, prof_clock *c) {
    if (!e->profiling) return;
    const double t = now_s(), sync = e->sync_s;
    e->prof[part] += (t - c->t) - (sync - c->sync);
    e->prof[BN_PART_SYNC] += sync - c->sync;
    c->t = t;
    c->sync = sync;
}

/* bn_pool_run, timing the caller's time outside the job itself when profiling */
typedef struct { bn_job_fn fn; void *arg; double *inside; } timed_job;
static void timed_job_fn(void *arg, int t, int n) {
    timed_job *j = arg;
    const double t0 = now_s();
    j->fn(j->arg, t, n);
    if (t == 0) *j->inside += now_s() - t0;
}

static void pool_run(bn_engine *e, bn_job_fn fn, void *arg) {
    if (!e->profiling) { bn_pool_run(e->pool, fn, arg); return; }
    double inside = 0;
    timed_job j = {fn, arg, &inside};
    const double t0 = now_s();
    bn_pool_run(e->pool, timed_job_fn, &j);
    e->sync_s += now_s() - t0 - inside;
}

static const char *const PART_NAMES[BN_PART_COUNT] = {
    [BN_PART_EMBED] = "embed", [BN_PART_ATTN_NORM] = "attn_norm+quant", [BN_PART_QKV] = "qkv_proj",
    [BN_PART_ROPE_KV] = "rope+kv_write", [BN_PART_ATTENTION] = "attention",
    [BN_PART_SUB_NORM_ATTN] = "attn_sub_norm+quant", [BN_PART_O] = "o_proj",
    [BN_PART_FFN_NORM] = "residual+ffn_norm+quant", [BN_PART_GATE_UP] = "gate_up_proj",
    [BN_PART_SUB_NORM_FFN] = "relu2*up+ffn_sub_norm+quant", [BN_PART_DOWN] = "down_proj",
    [BN_PART_RESIDUAL] = "residual", [BN_PART_HEAD_NORM] = "final_norm+quant", [BN_PART_HEAD] = "lm_head",
    [BN_PART_OUTPUT] = "copy_logits", [BN_PART_SYNC] = "thread_dispatch+wait", [BN_PART_TOTAL] = "total",
};

const char *bn_part_name(int part) { return part >= 0 && part < BN_PART_COUNT ? PART_NAMES[part] : NULL; }

void bn_engine_set_profile(bn_engine *e, int on) {
    e->profiling = on;
    memset(e->prof, 0, sizeof e->prof);
    e->sync_s = 0;
}

const double *bn_engine_profile(const bn_engine *e) { return e->prof; }

/* ---------------------------------------------------------------- small fp32 blocks */

static float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* One token row: xn = rmsnorm(x) * w (LlamaRMSNorm, fp32), then quant8(xn) into xq row t. */
static void norm_quant_row(bn_engine *e, const float *x, const float *w, int n, int kp, int t) {
    const bn_kernels *k = e->k;
    float *xn = e->xn + (size_t)t * e->xn_ld;
    const float inv = 1.0f / sqrtf(k->sumsq(x, n) / (float)n + e->m.eps);
    k->norm_apply(x, inv, w, xn, n);
    float m = k->absmax(xn, n);
    if (m < 1e-5f) m = 1e-5f;
    const float scale = 127.0f / m;
    e->xsum[t] = k->quantize(xn, n, kp, scale, e->xq + (size_t)t * kp);
    e->xinv[t] = 1.0f / scale;
}

/* ---------------------------------------------------------------- parallel jobs */

/* Work is shared out in chunks taken from an atomic counter rather than fixed halves, so that a
 * thread the OS descheduled (a busy desktop, the Streamlit server) delays the forward by at most
 * one chunk. Chunks are contiguous runs of rows, so each thread still streams memory in order. */
#define CHUNKS_PER_THREAD 8

typedef struct {
    bn_engine *e;
    int kind; /* 0 ternary, 1 int8 head, 2 bf16 head */
    const bn_ternary *w;
    int T, n_units; /* tiles of 16 rows (kinds 0, 1) or rows (kind 2) */
    const float *xf;
    float *y;
    int ldy;
    int chunk;
    atomic_int next;
    const int8_t *xq; /* quantized activations (T, Kp) and their sums and 1/scales: kinds 0 and 1 */
    const int32_t *xsum;
    const float *xinv;
} matmul_job;

static void matmul_chunk(const matmul_job *j, int u0, int u1);

static void matmul_worker(void *arg, int t, int n) { /* any number of threads may run it */
    (void)t; (void)n;
    matmul_job *j = arg;
    for (;;) {
        const int u0 = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
        if (u0 >= j->n_units) return;
        matmul_chunk(j, u0, u0 + j->chunk < j->n_units ? u0 + j->chunk : j->n_units);
    }
}

static void run_matmul(bn_engine *e, matmul_job *j) {
    const int n = bn_pool_size(e->pool);
    j->chunk = j->n_units / (n * CHUNKS_PER_THREAD);
    j->chunk += j->chunk & 1; /* even: the kernels take row tiles in pairs */
    if (j->chunk < 2) j->chunk = 2;
    atomic_init(&j->next, 0);
    pool_run(e, matmul_worker, j);
}

static void matmul_chunk(const matmul_job *j, int u0, int u1) {
    const bn_engine *e = j->e;
    if (j->kind == 0) {
        e->k->ternary_matmul(j->w->codes, ROUND16(j->w->k), j->w->scale, j->xq, j->xsum, j->xinv, j->T, u0 * 16,
                             u1 * 16, j->y, j->ldy);
    } else if (j->kind == 1) {
        e->k->int8_matmul(e->m.head_i8, e->dp, e->m.head_scale, e->m.head_rowsum, j->xq, j->xinv, j->T, u0 * 16,
                          u1 * 16, j->y, j->ldy);
    } else {
        e->k->bf16_matmul(e->m.embed, e->m.dim, j->xf, j->T, u0, u1, j->y, j->ldy);
    }
}

/* y (T, Np) = W @ quant8 rows already in e->xq. Batches run in slices of MATMUL_SLICE tokens, so the
 * slice's activations (at most 32 x Kp bytes, 221 KB for the FFN down projection) stay in L2 while
 * every weight tile streams past them; weights are re-read once per slice. */
#define MATMUL_SLICE 32

static void ternary(bn_engine *e, const bn_ternary *w, int T, float *y, int ldy) {
    const int kp = ROUND16(w->k);
    for (int t0 = 0; t0 < T; t0 += MATMUL_SLICE) {
        matmul_job j = {e, 0, w, T - t0 < MATMUL_SLICE ? T - t0 : MATMUL_SLICE, ROUND16(w->n) / 16, NULL,
                        y + (size_t)t0 * ldy, ldy};
        j.xq = e->xq + (size_t)t0 * kp;
        j.xsum = e->xsum + t0;
        j.xinv = e->xinv + t0;
        run_matmul(e, &j);
    }
}

/* The per-token work between the matrix products, fused into one pass each and shared out by token
 * (a single token stays on the calling thread). */
enum {
    ST_ATTN_IN,  /* [x += proj of the previous layer's down] ; quant8(rmsnorm(x) * attn_norm) */
    ST_ROPE_KV,  /* RoPE on q and k; k, v -> cache at the token's position */
    ST_SUB_ATTN, /* quant8(rmsnorm(att) * attn_sub_norm) */
    ST_FFN_IN,   /* x += proj (o_proj); quant8(rmsnorm(x) * ffn_norm) */
    ST_SUB_FFN,  /* h = relu(g)^2 * u; quant8(rmsnorm(h) * ffn_sub_norm) */
    ST_RESIDUAL, /* x += proj (down_proj) */
};

typedef struct {
    bn_engine *e;
    int layer, stage, start;
    int T;
    atomic_int next; /* next token to take */
} token_job;

static void rope(const bn_engine *e, float *x, int pos);

static void token_stage(bn_engine *e, int l, int stage, int start, int t) {
    const bn_model *m = &e->m;
    const bn_layer *ly = &e->layers[l];
    const int D = m->dim, I = m->hidden, hd = m->head_dim, kvd = m->n_kv_heads * hd;
    float *x = e->x + (size_t)t * D, *proj = e->proj + (size_t)t * e->dp;
    switch (stage) {
        case ST_ATTN_IN:
            norm_quant_row(e, x, ly->attn_norm, D, e->dp, t);
            break;
        case ST_ROPE_KV: {
            float *row = e->qkv + (size_t)t * e->qkv_np;
            const int pos = start + t;
            for (int h = 0; h < m->n_heads + m->n_kv_heads; h++) rope(e, row + h * hd, pos); /* q heads, then k */
            const size_t at = ((size_t)l * e->ctx + pos) * kvd;
            if (e->kv16) {
                e->k->to_f16(row + D, (uint16_t *)e->k_cache + at, kvd);
                e->k->to_f16(row + D + kvd, (uint16_t *)e->v_cache + at, kvd);
            } else {
                memcpy((float *)e->k_cache + at, row + D, sizeof(float) * (size_t)kvd);
                memcpy((float *)e->v_cache + at, row + D + kvd, sizeof(float) * (size_t)kvd);
            }
            break;
        }
        case ST_SUB_ATTN:
            norm_quant_row(e, e->att + (size_t)t * D, ly->attn_sub_norm, D, e->dp, t);
            break;
        case ST_FFN_IN:
            e->k->add(x, proj, D);
            norm_quant_row(e, x, ly->ffn_norm, D, e->dp, t);
            break;
        case ST_SUB_FFN: {
            float *g = e->gu + (size_t)t * e->gu_np; /* [gate (I) | up (I)]; h overwrites the gate half */
            e->k->relu2_mul(g, g + I, g, I);
            norm_quant_row(e, g, ly->ffn_sub_norm, I, e->ip, t);
            break;
        }
        default:
            e->k->add(x, proj, D);
    }
}

static void token_worker(void *arg, int th, int nth) {
    (void)th; (void)nth;
    token_job *j = arg;
    for (int t; (t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->T;)
        token_stage(j->e, j->layer, j->stage, j->start, t);
}

static void run_tokens(bn_engine *e, int l, int stage, int start, int T) {
    if (T < 2) {
        for (int t = 0; t < T; t++) token_stage(e, l, stage, start, t);
        return;
    }
    token_job j = {e, l, stage, start, T, 0};
    pool_run(e, token_worker, &j);
}

typedef struct {
    bn_engine *e;
    int layer, T, start, kv_end, block;
    atomic_int next; /* next (token, kv head) pair to take */
} attn_job;

/* One (token, kv head) pair at a time: the `group` query heads that share a K/V head are done together,
 * so each cached K and V row is read once per group (GQA), not once per query head. */
static void attention_worker(void *arg, int th, int nth) {
    (void)nth;
    attn_job *j = arg;
    bn_engine *e = j->e;
    const bn_model *m = &e->m;
    const int hd = m->head_dim, kvd = m->n_kv_heads * hd, group = m->n_heads / m->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t layer_off = (size_t)j->layer * e->ctx * kvd;
    const float *kc = (const float *)e->k_cache + layer_off, *vc = (const float *)e->v_cache + layer_off;
    const uint16_t *kh = (const uint16_t *)e->k_cache + layer_off, *vh = (const uint16_t *)e->v_cache + layer_off;
    float *sc = e->scores + (size_t)th * group * e->ctx; /* (group, ctx) scores of this thread */
    const int pairs = j->T * m->n_kv_heads;
    for (;;) {
        const int p = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (p >= pairs) break;
        const int t = p / m->n_kv_heads, g = p % m->n_kv_heads;
        const int pos = j->start + t;
        /* visible keys are a prefix [0, end): causal up to pos, block up to the end of pos's block */
        int end = j->block > 0 ? (pos / j->block + 1) * j->block : pos + 1;
        if (end > j->kv_end) end = j->kv_end;
        const float *q = e->qkv + (size_t)t * e->qkv_np + (size_t)g * group * hd; /* group heads, contiguous */
        float *out = e->att + (size_t)t * m->dim + (size_t)g * group * hd;
        for (int s = 0; s < end; s++) {
            const size_t kr = (size_t)s * kvd + (size_t)g * hd;
            for (int h = 0; h < group; h++)
                sc[(size_t)h * end + s] = (e->kv16 ? e->k->dot_f16(q + h * hd, kh + kr, hd) : e->k->dot(q + h * hd, kc + kr, hd)) * scale;
        }
        for (int h = 0; h < group; h++) { /* softmax per head, in place */
            float *row = sc + (size_t)h * end, mx = -INFINITY, sum = 0.0f;
            for (int s = 0; s < end; s++) mx = row[s] > mx ? row[s] : mx;
            for (int s = 0; s < end; s++) { row[s] = expf(row[s] - mx); sum += row[s]; }
            for (int s = 0; s < end; s++) row[s] /= sum; /* divide, as softmax does */
        }
        memset(out, 0, sizeof(float) * (size_t)group * hd);
        for (int s = 0; s < end; s++) {
            const size_t vr = (size_t)s * kvd + (size_t)g * hd;
            for (int h = 0; h < group; h++) {
                if (e->kv16) e->k->axpy_f16(sc[(size_t)h * end + s], vh + vr, out + h * hd, hd);
                else e->k->axpy(sc[(size_t)h * end + s], vc + vr, out + h * hd, hd);
            }
        }
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
        e->logit_buf = malloc(sizeof(float) * (size_t)rows * e->vp);
        e->cap_rows = e->logit_buf ? rows : 0;
        if (!e->logit_buf) return -1;
    }
    return 0;
}

bn_engine *bn_engine_create(const bn_model *m, int exact_head, int kv16, int n_threads, const char *isa, int ctx,
                            char *err, int errlen) {
    const bn_kernels *k = bn_select_kernels(isa);
    if (!k) {
        char msg[160];
        snprintf(msg, sizeof msg, "kernel path '%s' is not supported by this CPU (or unknown); use avx512, avx2 or portable", isa);
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
        m->head_dim % 2 || ctx <= 0) {
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
    e->pool = bn_pool_create(n_threads);
    if (!e->pool) {
        bn_engine_free(e);
        set_err(err, errlen, "out of memory starting the engine's threads; use fewer threads");
        return NULL;
    }
    e->scores = malloc(sizeof(float) * (size_t)ctx * (m->n_heads / m->n_kv_heads) * bn_pool_size(e->pool));
    if (!e->k_cache || !e->v_cache || !e->rope_cos || !e->rope_sin || !e->scores) {
        bn_engine_free(e);
        set_err(err, errlen, "out of memory allocating the KV cache; use a shorter context");
        return NULL;
    }
    /* RoPE tables as transformers builds them: inv_freq in fp32, angle = fp32(pos * inv_freq) */
    for (int i = 0; i < half; i++) {
        const float expo = (float)(2 * i) / (float)m->head_dim;
        const float inv_freq = 1.0f / (float)pow((double)m->rope_theta, (double)expo);
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
    free(e->xq); free(e->xsum); free(e->xinv); free(e->scores); free(e->logit_buf);
    free(e);
}

const char *bn_engine_isa(const bn_engine *e) { return e->k->name; }
int bn_engine_threads(const bn_engine *e) { return bn_pool_size(e->pool); }

/* ---------------------------------------------------------------- the forward */

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

static void head_forward(bn_engine *e, const int32_t *rows, int n_rows, float *logits, prof_clock *c);

static void layer_forward(bn_engine *e, int l, int T, int start, int kv_end, int block) {
    const bn_layer *ly = &e->layers[l];
    prof_clock c = prof_start(e);
    run_tokens(e, l, ST_ATTN_IN, start, T);
    prof_mark(e, BN_PART_ATTN_NORM, &c);
    ternary(e, &ly->qkv, T, e->qkv, e->qkv_np);
    prof_mark(e, BN_PART_QKV, &c);
    run_tokens(e, l, ST_ROPE_KV, start, T);
    prof_mark(e, BN_PART_ROPE_KV, &c);
    attn_job aj = {e, l, T, start, kv_end, block, 0};
    pool_run(e, attention_worker, &aj);
    prof_mark(e, BN_PART_ATTENTION, &c);
    run_tokens(e, l, ST_SUB_ATTN, start, T);
    prof_mark(e, BN_PART_SUB_NORM_ATTN, &c);
    ternary(e, &ly->o, T, e->proj, e->dp);
    prof_mark(e, BN_PART_O, &c);
    run_tokens(e, l, ST_FFN_IN, start, T);
    prof_mark(e, BN_PART_FFN_NORM, &c);
    ternary(e, &ly->gate_up, T, e->gu, e->gu_np);
    prof_mark(e, BN_PART_GATE_UP, &c);
    run_tokens(e, l, ST_SUB_FFN, start, T);
    prof_mark(e, BN_PART_SUB_NORM_FFN, &c);
    ternary(e, &ly->down, T, e->proj, e->dp);
    prof_mark(e, BN_PART_DOWN, &c);
    run_tokens(e, l, ST_RESIDUAL, start, T);
    prof_mark(e, BN_PART_RESIDUAL, &c);
}

int bn_forward(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention, int block_size,
               const int32_t *rows, int n_rows, float *logits, char *err, int errlen) {
    const bn_model *m = &e->m;
    char msg[200];
    if (T <= 0) { set_err(err, errlen, "forward needs at least one token"); return -1; }
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= m->vocab) {
            snprintf(msg, sizeof msg, "token id %d is out of range (vocabulary %d)", tokens[t], m->vocab);
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
    if (grow_scratch(e, T > n_rows ? T : n_rows, n_rows) != 0) { set_err(err, errlen, "out of memory for the forward's scratch buffers"); return -1; }

    const double t_begin = e->profiling ? now_s() : 0;
    prof_clock c = prof_start(e);
    const int D = m->dim;
    for (int t = 0; t < T; t++) {
        const uint16_t *row = m->embed + (size_t)tokens[t] * D;
        for (int i = 0; i < D; i++) e->x[(size_t)t * D + i] = bf16_to_f32(row[i]);
    }
    prof_mark(e, BN_PART_EMBED, &c);
    const int block = attention == 1 ? block_size : 0;
    for (int l = 0; l < m->n_layers; l++) layer_forward(e, l, T, start, kv_end, block);
    c = prof_start(e);
    if (n_rows > 0) head_forward(e, rows, n_rows, logits, &c);
    if (e->profiling) e->prof[BN_PART_TOTAL] += now_s() - t_begin;
    return 0;
}

/* logits (n_rows, V) of the batch rows `rows`: final norm, then the int8 or the exact head */
static void head_forward(bn_engine *e, const int32_t *rows, int n_rows, float *logits, prof_clock *c) {
    const bn_model *m = &e->m;
    const int D = m->dim;

    /* final norm of the requested rows, then the head */
    for (int r = 0; r < n_rows; r++) memcpy(e->att + (size_t)r * D, e->x + (size_t)rows[r] * D, sizeof(float) * D);
    if (e->exact_head) {
        for (int r = 0; r < n_rows; r++) {
            const float *x = e->att + (size_t)r * D;
            const float inv = 1.0f / sqrtf(e->k->sumsq(x, D) / (float)D + m->eps);
            e->k->norm_apply(x, inv, m->norm, e->xn + (size_t)r * D, D);
        }
        prof_mark(e, BN_PART_HEAD_NORM, c);
        matmul_job j = {e, 2, NULL, n_rows, m->vocab, e->xn, e->logit_buf, e->vp};
        run_matmul(e, &j);
    } else {
        for (int r = 0; r < n_rows; r++) norm_quant_row(e, e->att + (size_t)r * D, m->norm, D, e->dp, r);
        prof_mark(e, BN_PART_HEAD_NORM, c);
        matmul_job j = {e, 1, NULL, n_rows, e->vp / 16, NULL, e->logit_buf, e->vp};
        j.xq = e->xq;
        j.xinv = e->xinv;
        run_matmul(e, &j);
    }
    prof_mark(e, BN_PART_HEAD, c);
    for (int r = 0; r < n_rows; r++)
        memcpy(logits + (size_t)r * m->vocab, e->logit_buf + (size_t)r * e->vp, sizeof(float) * (size_t)m->vocab);
    prof_mark(e, BN_PART_OUTPUT, c);
}
