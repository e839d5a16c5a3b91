/* The engine (bitnet.h): its creation and freeing, and the forward call, which checks its arguments, embeds the
 * tokens and has the scheduler (schedule.c) run the layer steps (layer.c) on the engine's threads; or, for the
 * tests, runs the serial forward (forward.c), the scheduler's oracle.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "float_mode.h"
#include "layer.h"

static void set_err(char *err, int errlen, const char *msg) {
    if (err && errlen > 0) snprintf(err, (size_t)errlen, "%s", msg);
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

/* The kernel table for isa, or NULL with a message naming the paths this CPU runs (dispatch.c's list). */
static const bn_kernels *kernels_for(const char *isa, char *err, int errlen) {
    const bn_kernels *k = bn_select_kernels(isa);
    if (k) return k;
    char msg[256];
    const char *sep = " ";
    size_t n = (size_t)snprintf(msg, sizeof msg, "kernel path '%s' is not supported by this CPU (or unknown); use", isa);
    for (int i = 0; bn_kernel_path_name(i) && n < sizeof msg; i++)
        if (bn_select_kernels(bn_kernel_path_name(i))) {
            n += (size_t)snprintf(msg + n, sizeof msg - n, "%s%s", sep, bn_kernel_path_name(i));
            sep = ", ";
        }
    set_err(err, errlen, msg);
    return NULL;
}

/* 0 when the thread count, the model's shape and its matrices' layouts are ones the engine runs; else -1 and a
 * message. */
static int check_model(const bn_model *m, int kv, int n_threads, int ctx, char *err, int errlen) {
    if (n_threads < 1 || n_threads > BN_POOL_MAX_THREADS) {
        char msg[160];
        snprintf(msg, sizeof msg, "thread count %d is out of range: use 1 to %d (the number of CPU cores is a good choice)",
                 n_threads, BN_POOL_MAX_THREADS);
        set_err(err, errlen, msg);
        return -1;
    }
    if (m->n_heads <= 0 || m->n_kv_heads <= 0 || m->n_heads % m->n_kv_heads || m->n_heads * m->head_dim != m->dim ||
        m->head_dim % 2 || m->head_dim > BN_MAX_HEAD_DIM || ctx <= 0 || (m->act != BN_ACT_RELU2 && m->act != BN_ACT_SILU) ||
        !m->head_bf16 || kv < BN_KV_F32 || kv > BN_KV_I8) {
        set_err(err, errlen, "inconsistent model shape (heads, kv heads, head_dim, hidden size or context) or KV type");
        return -1;
    }
    for (int l = 0; l < m->n_layers; l++) { /* every matrix in a known layout; 1.6-bit ones not too wide (kernels.h) */
        const bn_ternary *w[4] = {&m->layers[l].qkv, &m->layers[l].o, &m->layers[l].gate_up, &m->layers[l].down};
        for (int i = 0; i < 4; i++)
            if ((w[i]->packing != BN_PACK_2BIT && w[i]->packing != BN_PACK_TRIT5) ||
                (w[i]->packing == BN_PACK_TRIT5 && ROUND16(w[i]->k) > BN_TRIT5_MAX_KP)) {
                set_err(err, errlen, "a ternary matrix has an unknown packing, or is too wide for 1.6-bit tiles; "
                                     "convert the checkpoint again with the 2-bit packing");
                return -1;
            }
    }
    return 0;
}

/* The KV cache (and the int8 cache's row scales), the RoPE tables and the threads' attention scratch; -1 when out
 * of memory. */
static int alloc_cache(bn_engine *e) {
    const bn_model *m = &e->m;
    const size_t rows = (size_t)m->n_layers * e->ctx * m->n_kv_heads;
    /* calloc: untouched pages cost no memory, so the cache's memory grows with the context */
    e->k_cache = calloc(rows * m->head_dim, bn_kv_elem_bytes(e->kv));
    e->v_cache = calloc(rows * m->head_dim, bn_kv_elem_bytes(e->kv));
    if (e->kv == BN_KV_I8) {
        e->k_scale = calloc(rows, sizeof(float));
        e->v_scale = calloc(rows, sizeof(float));
    }
    e->rope_cos = malloc(sizeof(float) * (size_t)e->ctx * (m->head_dim / 2));
    e->rope_sin = malloc(sizeof(float) * (size_t)e->ctx * (m->head_dim / 2));
    /* per thread, rounded to whole cache lines; malloc'ed pages are only touched as far as the keys go */
    e->scores_ld = (BN_ATTN_SCRATCH(ATTN_MAX_ROWS, m->n_heads / m->n_kv_heads, m->head_dim, e->ctx) + 15) / 16 * 16;
    e->scores = aligned_alloc(64, sizeof(float) * e->scores_ld * bn_pool_size(e->pool));
    return e->k_cache && e->v_cache && (e->kv != BN_KV_I8 || (e->k_scale && e->v_scale)) && e->rope_cos &&
                   e->rope_sin && e->scores
               ? 0
               : -1;
}

/* RoPE tables as transformers builds them: inv_freq in fp32 (given, else 1/theta^(2i/hd)),
 * angle = fp32(pos * inv_freq); cos and sin (C, hd/2) */
static void fill_rope(bn_engine *e) {
    const bn_model *m = &e->m;
    const int half = m->head_dim / 2;
    for (int i = 0; i < half; i++) {
        const float expo = (float)(2 * i) / (float)m->head_dim;
        const float inv_freq = m->rope_inv_freq ? m->rope_inv_freq[i]
                                                : 1.0f / (float)pow((double)m->rope_theta, (double)expo);
        for (int p = 0; p < e->ctx; p++) {
            const float angle = (float)p * inv_freq;
            e->rope_cos[(size_t)p * half + i] = (float)cos((double)angle);
            e->rope_sin[(size_t)p * half + i] = (float)sin((double)angle);
        }
    }
}

bn_engine *bn_engine_create(const bn_model *m, int exact_head, int kv, int n_threads, const char *isa, int ctx,
                            char *err, int errlen) {
    const bn_kernels *k = kernels_for(isa, err, errlen);
    if (!k || check_model(m, kv, n_threads, ctx, err, errlen)) return NULL;
    bn_engine *e = calloc(1, sizeof *e);
    if (!e) { set_err(err, errlen, "out of memory"); return NULL; }
    e->m = *m;
    e->layers = malloc(sizeof(bn_layer) * (size_t)m->n_layers);
    if (!e->layers) { free(e); set_err(err, errlen, "out of memory"); return NULL; }
    memcpy(e->layers, m->layers, sizeof(bn_layer) * (size_t)m->n_layers);
    e->m.layers = e->layers;
    e->k = k;
    e->exact_head = exact_head;
    e->kv = kv;
    e->ctx = ctx;
    e->dp = ROUND16(m->dim);
    e->ip = ROUND16(m->hidden);
    e->qkv_np = ROUND16(m->dim + 2 * m->n_kv_heads * m->head_dim);
    e->gu_np = ROUND16(2 * m->hidden);
    e->vp = ROUND16(m->vocab);
    e->xn_ld = e->dp > e->ip ? e->dp : e->ip;
    e->pool = bn_pool_create(n_threads);
    if (!e->pool) {
        bn_engine_free(e);
        set_err(err, errlen, "out of memory starting the engine's threads; use fewer threads");
        return NULL;
    }
    e->sched = bn_schedule_create(m->n_layers, bn_pool_size(e->pool));
    if (!e->sched || alloc_cache(e)) {
        bn_engine_free(e);
        set_err(err, errlen, "out of memory allocating the KV cache; use a shorter context");
        return NULL;
    }
    fill_rope(e);
    return e;
}

void bn_engine_free(bn_engine *e) {
    if (!e) return;
    bn_pool_free(e->pool);
    free(e->layers); free(e->k_cache); free(e->v_cache); free(e->k_scale); free(e->v_scale);
    free(e->rope_cos); free(e->rope_sin);
    free(e->x); free(e->xn); free(e->qkv); free(e->att); free(e->proj); free(e->gu);
    free(e->xq); free(e->xsum); free(e->xinv); free(e->scores); free(e->logit_buf); free(e->q_last);
    bn_schedule_free(e->sched);
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

int bn_all_finite(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) { /* exponent bits all ones: infinity or NaN (a loop the compiler vectorizes) */
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

/* The last layer's K/V are needed for every token, but the rest of it (its attention and everything after) only
 * for the rows whose logits are asked: a denoising step asks for the masked slots of one sub-block (<= 8 of 32),
 * a prefill or a block commit for one row. So, when the logit rows are strictly increasing and fewer than the
 * batch, those steps run on the logit rows alone (compacted: their token t is batch token rows[t]). Each token's
 * sums are the same whatever else is in the batch, so the logits are bit for bit those of the whole batch. */
static int trims_last_layer(const forward_args *fa) {
    if (fa->n_rows >= fa->T) return 0;
    for (int r = 1; r < fa->n_rows; r++)
        if (fa->rows[r] <= fa->rows[r - 1]) return 0;
    return 1;
}

/* bn_forward, or with serial the plain serial forward (forward.c) on the calling thread, every step on all T
 * tokens (no trimmed last layer) */
static int forward(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention, int block_size,
                   const int32_t *rows, int n_rows, float *logits, char *err, int errlen, int serial) {
    const bn_model *m = &e->m;
    if (check_args(e, tokens, T, start, kv_end, attention, block_size, rows, n_rows, err, errlen)) return -1;
    if (grow_scratch(e, T > n_rows ? T : n_rows, n_rows) != 0) {
        set_err(err, errlen, "out of memory for the forward's scratch buffers");
        return -1;
    }
    const unsigned caller_mode = bn_flush_denormals(); /* float_mode.h: restored before returning */
    const double t_begin = e->profiling ? now_s() : 0;
    e->fa = (forward_args){.T = T, .start = start, .kv_end = kv_end, .block = attention == 1 ? block_size : 0,
                           .rows = rows, .n_rows = n_rows};
    if (serial) {
        bn_forward_serial(e, tokens);
    } else {
        e->fa.trim_last = trims_last_layer(&e->fa);
        bn_embed(e, tokens, T);
        bn_plan_forward(e);
        if (e->profiling) e->prof[BN_PART_EMBED] += now_s() - t_begin;
        bn_run_forward(e);
    }
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

int bn_forward(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention, int block_size,
               const int32_t *rows, int n_rows, float *logits, char *err, int errlen) {
    return forward(e, tokens, T, start, kv_end, attention, block_size, rows, n_rows, logits, err, errlen, 0);
}

int bn_forward_serial_oracle(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention,
                             int block_size, const int32_t *rows, int n_rows, float *logits, char *err, int errlen) {
    return forward(e, tokens, T, start, kv_end, attention, block_size, rows, n_rows, logits, err, errlen, 1);
}

