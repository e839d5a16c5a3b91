/* The layer maths of the BitNet b1.58 forward (layer.h), in the order of bitnet_app/engine/reference.py (the numpy
 * forward, read it alongside): per-token steps (norms, quant8, RoPE and the K/V write, the activation), attention,
 * the matrix products, the final norm and head. forward.c strings them together for one forward.
 *
 * quant8: per token, scale = 127 / max|x| (max clamped to 1e-5), q = round-half-even(x * scale) in
 * [-128, 127]; the int32 dot products are multiplied back by 1/scale and the per-row weight multiplier.
 * Everything outside the ternary and head dot products is fp32, like the reference run in fp32.
 */
#include <math.h>
#include <string.h>

#include "layer.h"

/* ---------------------------------------------------------------- per-token steps */

static float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

void bn_embed(bn_engine *e, const int32_t *tokens, int T) {
    const int D = e->m.dim;
    for (int t = 0; t < T; t++) {
        const uint16_t *row = e->m.embed + (size_t)tokens[t] * D;
        for (int i = 0; i < D; i++) e->x[(size_t)t * D + i] = bf16_to_f32(row[i]);
    }
}

/* Row t of xq for a matrix of padded width kp. Rows are at stride kp, within runs of `run` tokens (0: one run)
 * that each start at a multiple of the widest stride: one run of tokens (a thread's, schedule.c fold_chains) may
 * write its rows for one matrix while another run is at a matrix of another width, and neither overwrites the
 * other's rows. */
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

/* 1 for the steps of a trimmed last layer that run on the logit rows only (its attention and after): their
 * token t is logit row t, i.e. batch token fa.rows[t] (forward_args.trim_last). */
static inline int trimmed_stage(const bn_engine *e, int l, int s) {
    return e->fa.trim_last && l == e->m.n_layers - 1 && s >= STAGE_ATTENTION;
}

void bn_token_step(bn_engine *e, int l, layer_stage s, int t, int run) {
    const bn_model *m = &e->m;
    const bn_layer *ly = &e->layers[l];
    const int D = m->dim, I = m->hidden, hd = m->head_dim, kvd = m->n_kv_heads * hd;
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

/* The attention of tokens [t0, t0 + nr) for kv head g (layer.h): all the query heads of each token's group that
 * share K/V head g, together, so each cached K and V row is read (and converted from fp16) once per tile of tokens
 * and heads; the value columns [c0, c1) of each head's output, whose numbers do not depend on the others (each
 * column's sum runs over the keys alone), so a split changes none of them. Each token sees a prefix [0, end) of the
 * cache: causal: its own position + 1; block: the end of its block (shared by the block's tokens); never beyond
 * kv_end. In a trimmed last layer the tokens are the logit rows: the tile first gathers their query heads into
 * q_last (row t = batch token fa.rows[t]). */
void bn_attention_tile(bn_engine *e, int l, int t0, int nr, int g, int c0, int c1, float *sc) {
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
    const float scale = 1.0f / sqrtf((float)hd);
    if (!e->k->attend_rows || !e->k->attend_rows(q, ldq, nr, group, hd, kc, vc, (size_t)hd, e->kv, ks, vs, ends, c0, c1,
                                                 scale, sc, out, (size_t)m->dim))
        bn_fallback_attend_rows(e->k, q, ldq, nr, group, hd, kc, vc, (size_t)hd, e->kv, ks, vs, ends, c0, c1, scale, sc,
                                out, (size_t)m->dim);
}

/* ---------------------------------------------------------------- matrix steps */

static bn_matrix ternary_step(const bn_ternary *w, float *y, int ldy, int kp) {
    return (bn_matrix){.kind = MAT_TERNARY, .w = w, .y = y, .ldy = ldy, .kp = kp, .units = ROUND16(w->n) / 16};
}

bn_matrix bn_layer_matrix(const bn_engine *e, int l, layer_stage s) {
    const bn_layer *ly = &e->layers[l];
    switch (s) {
        case STAGE_QKV: return ternary_step(&ly->qkv, e->qkv, e->qkv_np, e->dp);      /* qkv (T, qkv_np) */
        case STAGE_O: return ternary_step(&ly->o, e->proj, e->dp, e->dp);             /* proj (T, Dp) */
        case STAGE_GATE_UP: return ternary_step(&ly->gate_up, e->gu, e->gu_np, e->dp); /* gu (T, gu_np) */
        default: return ternary_step(&ly->down, e->proj, e->dp, e->ip);               /* proj (T, Dp) */
    }
}

bn_matrix bn_head_matrix(const bn_engine *e) { /* logits (rows, Vp) */
    if (e->exact_head)
        return (bn_matrix){.kind = MAT_EXACT_HEAD, .y = e->logit_buf, .ldy = e->vp, .kp = 0, .units = e->m.vocab};
    return (bn_matrix){.kind = MAT_INT8_HEAD, .y = e->logit_buf, .ldy = e->vp, .kp = e->dp, .units = e->vp / 16};
}

void bn_matrix_rows(bn_engine *e, const bn_matrix *mx, int t0, int rows, int u0, int u1, int run) {
    float *y = mx->y + (size_t)t0 * mx->ldy;
    const int8_t *xq = xq_row(e, t0, mx->kp, run);
    switch (mx->kind) {
        case MAT_TERNARY:
            (mx->w->packing == BN_PACK_TRIT5 ? e->k->ternary5_matmul : e->k->ternary_matmul)(
                mx->w->codes, mx->kp, mx->w->scale, xq, e->xsum + t0, e->xinv + t0, rows, u0 * 16, u1 * 16, y, mx->ldy);
            break;
        case MAT_INT8_HEAD:
            e->k->int8_matmul(e->m.head_i8, e->dp, e->m.head_scale, e->m.head_rowsum, xq, e->xinv + t0, rows,
                              u0 * 16, u1 * 16, y, mx->ldy);
            break;
        case MAT_EXACT_HEAD:
            e->k->bf16_matmul(e->m.head_bf16, e->m.dim, e->xn + (size_t)t0 * e->m.dim, rows, u0, u1, y, mx->ldy);
            break;
    }
}

/* Logit row r: x[rows[r]] + proj (the last down_proj) -> final norm: into xq (int8 head) or xn (exact head). */
void bn_head_norm_row(bn_engine *e, int r) {
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
