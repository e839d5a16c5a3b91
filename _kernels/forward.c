/* The BitNet b1.58 forward pass: all layers in one call, for a batch of T tokens. This file holds the layer maths,
 * in the order of bitnet_app/engine/reference.py (the numpy forward, read it alongside): per-token steps (norms,
 * quant8, RoPE and the K/V write, the activation), attention, the matrix products, the final norm and head; then
 * the engine's creation and bn_forward. Which items of which stage run on which thread is schedule.c's business;
 * the state the two share is engine_state.h.
 *
 * One layer (reference: transformers BitNetDecoderLayer, and LlamaDecoderLayer with BitLinear for the Llama
 * family, fp32), shapes per batch of T tokens:
 *   a = rmsnorm(x) * attn_norm                                          x, a (T, D)
 *   q|k|v = ternary(qkv) @ quant8(a); RoPE (half split) on q and k      qkv (T, H*hd + 2*G*hd)
 *   k, v -> KV cache at positions start .. start+T-1                    cache (L, G, C, hd), fp16 or fp32
 *   o = softmax(q k^T / sqrt(hd)) v over cache keys [0, kv_end) visible to each query (causal or block mask)
 *                                                                       att (T, D)
 *   x += ternary(o_proj) @ quant8(rmsnorm(o) * attn_sub_norm)            proj (T, D)
 *   g|u = ternary(gate_up) @ quant8(rmsnorm(x) * ffn_norm)               gu (T, 2I)
 *   x += ternary(down) @ quant8(rmsnorm(act(g) * u) * ffn_sub_norm)      act: relu(g)^2 or silu(g) = g*sigmoid(g)
 * The sub-norms are optional (NULL in bn_layer: the Llama family has none): then quant8(o), quant8(act(g) * u).
 * Final: logits[rows] = head(rmsnorm(x[rows]) * norm), head = int8 tiles (default) or the bf16 head (exact:
 * the embedding when tied, lm_head when not). Only the logit rows need the last layer beyond its K/V, so when
 * fewer are asked (a prefill, a block commit, a denoising step) its attention and everything after run on those
 * rows alone (schedule.c, trims_last_layer).
 *
 * quant8: per token, scale = 127 / max|x| (max clamped to 1e-5), q = round-half-even(x * scale) in
 * [-128, 127]; the int32 dot products are multiplied back by 1/scale and the per-row weight multiplier.
 * Everything outside the ternary and head dot products is fp32, like the reference run in fp32.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_state.h"
#include "float_mode.h"

static void set_err(char *err, int errlen, const char *msg) {
    if (err && errlen > 0) snprintf(err, (size_t)errlen, "%s", msg);
}

/* ---------------------------------------------------------------- per-token stages */

static float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* Row t of xq for a matrix of padded width kp. Rows are at stride kp, within runs of `run` tokens (0: one run)
 * that each start at a multiple of the widest stride: a chain item (schedule.c fold_chains) writes its run's rows for one
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

/* One K or V row (hd floats) -> int8 q (hd) with the int8 cache's rule: q = round-half-even(x * 127 / max|x|),
 * through the kernel table's absmax and quantize (the same numbers on every path); returns the row's scale
 * max|x| / 127 (0 for a row of zeros). */
static float quant_kv_row(const bn_kernels *k, const float *x, int hd, int8_t *q) {
    const float m = k->absmax(x, hd);
    if (!(m > 0.0f)) {
        memset(q, 0, (size_t)hd);
        return 0.0f;
    }
    int8_t buf[BN_MAX_HEAD_DIM + 16]; /* quantize writes whole groups of 16 */
    k->quantize(x, hd, ROUND16(hd), 127.0f / m, buf);
    memcpy(q, buf, (size_t)hd);
    return m / 127.0f;
}

/* 1 for the stages of a trimmed last layer that run on the logit rows only (its attention and after): their
 * token t is logit row t, i.e. batch token fa.rows[t] (see schedule.c). */
static inline int trimmed_stage(const bn_engine *e, int l, int s) {
    return e->fa.trim_last && l == e->m.n_layers - 1 && s >= STAGE_ATTENTION;
}

void bn_token_stage(bn_engine *e, int l, layer_stage s, int t) {
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
                const size_t row_at = ((size_t)l * m->n_kv_heads + g) * e->ctx + pos, at = row_at * hd;
                const float *kr = row + D + g * hd, *vr = row + D + kvd + g * hd;
                if (e->kv == BN_KV_F16) {
                    e->k->to_f16(kr, (uint16_t *)e->k_cache + at, hd);
                    e->k->to_f16(vr, (uint16_t *)e->v_cache + at, hd);
                } else if (e->kv == BN_KV_I8) {
                    e->k_scale[row_at] = quant_kv_row(e->k, kr, hd, (int8_t *)e->k_cache + at);
                    e->v_scale[row_at] = quant_kv_row(e->k, vr, hd, (int8_t *)e->v_cache + at);
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
            if (m->act == BN_ACT_SILU) (e->k->silu_mul ? e->k->silu_mul : bn_fallback_silu_mul)(g, g + I, g, I);
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

/* The attention of tokens [t0, t0 + nr) (nr <= ATTN_MAX_ROWS) for kv head g: all the query heads of each token's
 * group that share K/V head g, together, so each cached K and V row is read (and converted from fp16) once per tile
 * of tokens and heads; the output columns [c0, c1) of each head (all hd, or a part: schedule.c), whose numbers do
 * not depend on the others (each column's sum runs over the keys alone), so a split changes none of them. Each
 * token sees a prefix [0, end) of the cache: causal: its own position + 1; block: the end of its block (shared by
 * the block's tokens); never beyond kv_end. In a trimmed last layer the tokens are the logit rows: the tile first
 * gathers their query heads into q_last (row t = batch token fa.rows[t]). */
void bn_attention_tile(bn_engine *e, int l, int t0, int nr, int g, int c0, int c1, int thread) {
    const bn_model *m = &e->m;
    const int hd = m->head_dim, G = m->n_kv_heads, group = m->n_heads / G;
    const int trimmed = trimmed_stage(e, l, STAGE_ATTENTION);
    const size_t head0 = (size_t)g * group * hd; /* the first of the group's query heads (contiguous) */
    const float *q = e->qkv + (size_t)t0 * e->qkv_np + head0;
    size_t ldq = (size_t)e->qkv_np;
    if (trimmed) {
        float *gathered = e->q_last + (size_t)t0 * m->dim + head0;
        for (int r = 0; r < nr; r++)
            memcpy(gathered + (size_t)r * m->dim, e->qkv + (size_t)e->fa.rows[t0 + r] * e->qkv_np + head0,
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
    const size_t head_row = ((size_t)l * G + g) * e->ctx; /* layer l, head g, position 0 */
    const size_t off = head_row * hd * bn_kv_elem_bytes(e->kv);
    const void *kc = (const char *)e->k_cache + off, *vc = (const char *)e->v_cache + off;
    const float *ks = e->k_scale ? e->k_scale + head_row : NULL, *vs = e->v_scale ? e->v_scale + head_row : NULL;
    float *out = e->att + (size_t)t0 * m->dim + head0;
    float *sc = e->scores + (size_t)thread * e->scores_ld;
    const float scale = 1.0f / sqrtf((float)hd);
    if (!e->k->attend_rows || !e->k->attend_rows(q, ldq, nr, group, hd, kc, vc, (size_t)hd, e->kv, ks, vs, ends, c0, c1,
                                                 scale, sc, out, (size_t)m->dim))
        bn_fallback_attend_rows(e->k, q, ldq, nr, group, hd, kc, vc, (size_t)hd, e->kv, ks, vs, ends, c0, c1, scale, sc,
                                out, (size_t)m->dim);
}

/* ---------------------------------------------------------------- matrix stages */

/* Item i of a matrix stage: token slice i / chunks_per_slice, row units [u0, u1) of chunk i % chunks_per_slice
 * (units: tiles of 16 rows, or single rows for the exact head). */
void bn_matmul_item(bn_engine *e, const stage *st, int i) {
    const int slice = i / st->chunks_per_slice, t0 = slice * st->slice_tokens;
    const int rows = st->T - t0 < st->slice_tokens ? st->T - t0 : st->slice_tokens;
    const int units = st->kind == KIND_EXACT_HEAD ? e->m.vocab
                      : st->kind == KIND_INT8_HEAD ? e->vp / 16 : ROUND16(st->w->n) / 16;
    const int u0 = (i % st->chunks_per_slice) * st->chunk, u1 = u0 + st->chunk < units ? u0 + st->chunk : units;
    float *y = st->y + (size_t)t0 * st->ldy;
    const int8_t *xq = xq_row(e, t0, st->kp, st->xq_run);
    switch (st->kind) {
        case KIND_TERNARY:
            (st->w->packing == BN_PACK_TRIT5 ? e->k->ternary5_matmul : e->k->ternary_matmul)(
                st->w->codes, st->kp, st->w->scale, xq, e->xsum + t0, e->xinv + t0, rows, u0 * 16, u1 * 16, y, st->ldy);
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

/* Logit row r: x[rows[r]] + proj (the last down_proj) -> final norm: into xq (int8 head) or xn (exact head). */
void bn_head_norm_item(bn_engine *e, int r) {
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

bn_engine *bn_engine_create(const bn_model *m, int exact_head, int kv, int n_threads, const char *isa, int ctx,
                            char *err, int errlen) {
    const bn_kernels *k = bn_select_kernels(isa);
    if (!k) { /* name the paths this CPU runs (dispatch.c's list) */
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
    if (n_threads < 1 || n_threads > BN_POOL_MAX_THREADS) {
        char msg[160];
        snprintf(msg, sizeof msg, "thread count %d is out of range: use 1 to %d (the number of CPU cores is a good choice)",
                 n_threads, BN_POOL_MAX_THREADS);
        set_err(err, errlen, msg);
        return NULL;
    }
    if (m->n_heads <= 0 || m->n_kv_heads <= 0 || m->n_heads % m->n_kv_heads || m->n_heads * m->head_dim != m->dim ||
        m->head_dim % 2 || m->head_dim > BN_MAX_HEAD_DIM || ctx <= 0 || (m->act != BN_ACT_RELU2 && m->act != BN_ACT_SILU) ||
        !m->head_bf16 || kv < BN_KV_F32 || kv > BN_KV_I8) {
        set_err(err, errlen, "inconsistent model shape (heads, kv heads, head_dim, hidden size or context) or KV type");
        return NULL;
    }
    for (int l = 0; l < m->n_layers; l++) { /* every matrix in a known layout; 1.6-bit ones not too wide (kernels.h) */
        const bn_ternary *w[4] = {&m->layers[l].qkv, &m->layers[l].o, &m->layers[l].gate_up, &m->layers[l].down};
        for (int i = 0; i < 4; i++)
            if ((w[i]->packing != BN_PACK_2BIT && w[i]->packing != BN_PACK_TRIT5) ||
                (w[i]->packing == BN_PACK_TRIT5 && ROUND16(w[i]->k) > BN_TRIT5_MAX_KP)) {
                set_err(err, errlen, "a ternary matrix has an unknown packing, or is too wide for 1.6-bit tiles; "
                                     "convert the checkpoint again with the 2-bit packing");
                return NULL;
            }
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
    e->kv = kv;
    e->ctx = ctx;
    e->dp = ROUND16(m->dim);
    e->ip = ROUND16(m->hidden);
    e->qkv_np = ROUND16(m->dim + 2 * m->n_kv_heads * m->head_dim);
    e->gu_np = ROUND16(2 * m->hidden);
    e->vp = ROUND16(m->vocab);
    e->xn_ld = e->dp > e->ip ? e->dp : e->ip;
    const size_t rows = (size_t)m->n_layers * ctx * m->n_kv_heads;
    /* calloc: untouched pages cost no memory, so the cache's memory grows with the context */
    e->k_cache = calloc(rows * m->head_dim, bn_kv_elem_bytes(kv));
    e->v_cache = calloc(rows * m->head_dim, bn_kv_elem_bytes(kv));
    if (kv == BN_KV_I8) {
        e->k_scale = calloc(rows, sizeof(float));
        e->v_scale = calloc(rows, sizeof(float));
    }
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
    if (!e->k_cache || !e->v_cache || (kv == BN_KV_I8 && (!e->k_scale || !e->v_scale)) || !e->rope_cos || !e->rope_sin || !e->scores || !e->stages || !e->take ||
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
    free(e->layers); free(e->k_cache); free(e->v_cache); free(e->k_scale); free(e->v_scale);
    free(e->rope_cos); free(e->rope_sin);
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

int bn_all_finite(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) { /* exponent bits all ones: infinity or NaN (a loop the compiler vectorizes) */
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
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
    bn_plan_forward(e);
    if (e->profiling) e->prof[BN_PART_EMBED] += now_s() - t_begin;
    bn_run_forward(e);
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
