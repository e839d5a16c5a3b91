/* The multi-row attention of the NEON paths (kernels.h attend_rows), in ARMv8.0 ASIMD: the neon, neon-dotprod and
 * neon-i8mm tables all take it (kernels_neon.c's bn_neon_fill). Head sizes that are not a multiple of 8 go to the
 * plain loop (kernels_fallback.c).
 *
 * Three passes over the visible keys [0, E), E = the largest end, in tiles of BN_ATTN_KEY_TILE keys, so that a tile
 * of K (then of V) stays in L1 while every row and head of the item reads it:
 *   1. scores (nr, nq, E) = (q . k_s) * scale (* ks[s] for int8 keys), each row for the keys of the tile it sees
 *   2. softmax per (row, head) over [0, ends[r]): the NEON exponential of score - max (kernels_neon.h, the x86
 *      paths' floats), summed, then a division per score; int8 values: p_s * vs[s]
 *   3. out[c0, c1) = sum_s p_s * v_s, tile by tile (the first tile, which every row sees, starts the sums; later
 *      tiles carry them on through out)
 * Why a row's numbers never depend on its tile or column range: each score is one function of (q row, key row) (two
 * 4-lane FMA chains over hd, then their lane sum), each softmax runs over that row's own scores, and each output
 * column is one FMA chain over s in order, in its own lane. */
#define BN_NEON_KERNEL_FILE
#include "kernels_neon.h"

#include <math.h>
#include <string.h>

/* 8 cache elements from i of a K or V source as floats (exact: every half and every int8 is a float; an int8 row's
 * scale is applied by the caller) */
static inline __attribute__((always_inline)) void load_kv8(const void *base, const int kv, size_t i, float32x4_t *lo,
                                                           float32x4_t *hi) {
    if (kv == BN_KV_F16) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)base + i));
        *lo = vcvt_f32_f16(vget_low_f16(h));
        *hi = vcvt_high_f32_f16(h);
    } else if (kv == BN_KV_I8) {
        const int16x8_t w = vmovl_s8(vld1_s8((const int8_t *)base + i));
        *lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
        *hi = vcvtq_f32_s32(vmovl_high_s16(w));
    } else {
        *lo = vld1q_f32((const float *)base + i);
        *hi = vld1q_f32((const float *)base + i + 4);
    }
}

/* sc[j] = (qh . k_j) * scale (* ks[j]) for the nk <= 4 keys k + j*ld: NK keys at once (independent chains), each
 * key's number the same whatever group it is in */
static inline __attribute__((always_inline)) void scores_group(const float *qh, int hd, const void *k, size_t ld,
                                                               const int kv, const int nk, float scale,
                                                               const float *ks, float *sc) {
    float32x4_t a[4], b[4];
    for (int j = 0; j < 4; j++) a[j] = b[j] = vdupq_n_f32(0.0f);
    for (int d = 0; d < hd; d += 8) {
        const float32x4_t q0 = vld1q_f32(qh + d), q1 = vld1q_f32(qh + d + 4);
        for (int j = 0; j < 4; j++)
            if (j < nk) {
                float32x4_t k0, k1;
                load_kv8(k, kv, (size_t)j * ld + d, &k0, &k1);
                a[j] = vfmaq_f32(a[j], q0, k0);
                b[j] = vfmaq_f32(b[j], q1, k1);
            }
    }
    for (int j = 0; j < nk; j++) {
        const float s = vaddvq_f32(vaddq_f32(a[j], b[j])) * scale;
        sc[j] = ks ? s * ks[j] : s;
    }
}

static inline __attribute__((always_inline)) void scores_run(const float *qh, int hd, const void *k, size_t ld,
                                                             const int kv, int nk, float scale, const float *ks,
                                                             float *sc) {
    const size_t elem = bn_kv_elem_bytes(kv);
    int j = 0;
    for (; j + 4 <= nk; j += 4)
        scores_group(qh, hd, (const char *)k + (size_t)j * ld * elem, ld, kv, 4, scale, ks ? ks + j : NULL, sc + j);
    for (; j < nk; j++)
        scores_group(qh, hd, (const char *)k + (size_t)j * ld * elem, ld, kv, 1, scale, ks ? ks + j : NULL, sc + j);
}

/* softmax of row (n floats) in place: e^(x - max) by bn_neon_exp_nonpos (the tail through one padded vector, so
 * every score takes the same exponential), summed in 4 lanes then the tail in order, and a division per score (as
 * the reference softmax); then p_s *= vs[s] for int8 values */
static void softmax_row(float *row, int n, const float *vs) {
    float mx = -INFINITY;
    for (int s = 0; s < n; s++) mx = row[s] > mx ? row[s] : mx;
    const float32x4_t vmx = vdupq_n_f32(mx);
    float32x4_t acc = vdupq_n_f32(0.0f);
    int s = 0;
    for (; s + 4 <= n; s += 4) {
        const float32x4_t e = bn_neon_exp_nonpos(vsubq_f32(vld1q_f32(row + s), vmx));
        vst1q_f32(row + s, e);
        acc = vaddq_f32(acc, e);
    }
    float sum = vaddvq_f32(acc);
    if (s < n) {
        float b[4] = {mx, mx, mx, mx}; /* padding: e^0, left out */
        memcpy(b, row + s, sizeof(float) * (size_t)(n - s));
        vst1q_f32(b, bn_neon_exp_nonpos(vsubq_f32(vld1q_f32(b), vmx)));
        for (int j = 0; s + j < n; j++) {
            row[s + j] = b[j];
            sum += b[j];
        }
    }
    const float32x4_t vsum = vdupq_n_f32(sum);
    for (s = 0; s + 4 <= n; s += 4) vst1q_f32(row + s, vdivq_f32(vld1q_f32(row + s), vsum));
    for (; s < n; s++) row[s] /= sum;
    if (vs)
        for (s = 0; s < n; s++) row[s] *= vs[s];
}

/* o[c, c + 8*NU) (+)= sum_s p[s] * v_s over the n value rows v + s*ld: NU units of 8 columns in registers, one FMA
 * chain per column in s order; fresh: the chains start from zero (the first tile) */
static inline __attribute__((always_inline)) void values_cols(const float *p, int n, const void *v, size_t ld,
                                                              const int kv, int c, const int NU, float *o,
                                                              int fresh) {
    float32x4_t lo[4], hi[4];
    for (int u = 0; u < NU; u++) {
        lo[u] = fresh ? vdupq_n_f32(0.0f) : vld1q_f32(o + c + 8 * u);
        hi[u] = fresh ? vdupq_n_f32(0.0f) : vld1q_f32(o + c + 8 * u + 4);
    }
    for (int s = 0; s < n; s++) {
        const float ps = p[s];
        for (int u = 0; u < NU; u++) {
            float32x4_t v0, v1;
            load_kv8(v, kv, (size_t)s * ld + c + 8 * u, &v0, &v1);
            lo[u] = vfmaq_n_f32(lo[u], v0, ps);
            hi[u] = vfmaq_n_f32(hi[u], v1, ps);
        }
    }
    for (int u = 0; u < NU; u++) {
        vst1q_f32(o + c + 8 * u, lo[u]);
        vst1q_f32(o + c + 8 * u + 4, hi[u]);
    }
}

static inline __attribute__((always_inline)) void values_run(const float *p, int n, const void *v, size_t ld,
                                                             const int kv, int c0, int c1, float *o, int fresh) {
    int c = c0;
    for (; c + 32 <= c1; c += 32) values_cols(p, n, v, ld, kv, c, 4, o, fresh);
    switch ((c1 - c) / 8) {
        case 3: values_cols(p, n, v, ld, kv, c, 3, o, fresh); break;
        case 2: values_cols(p, n, v, ld, kv, c, 2, o, fresh); break;
        case 1: values_cols(p, n, v, ld, kv, c, 1, o, fresh); break;
        default: break;
    }
}

static inline __attribute__((always_inline)) void attend_rows_kv(const float *q, size_t ldq, int nr, int nq, int hd,
                                                                 const void *k, const void *v, size_t ld, const int kv,
                                                                 const float *ks, const float *vs, const int *ends,
                                                                 int c0, int c1, float scale, float *scratch,
                                                                 float *out, size_t ldo) {
    int E = 0;
    for (int r = 0; r < nr; r++) E = ends[r] > E ? ends[r] : E;
    const size_t elem = bn_kv_elem_bytes(kv), ldsc = ((size_t)E + 15) / 16 * 16;
#define SCORES(r, h) (scratch + ((size_t)(r) * nq + (h)) * ldsc)
    for (int s0 = 0; s0 < E; s0 += BN_ATTN_KEY_TILE) {
        const int n = E - s0 < BN_ATTN_KEY_TILE ? E - s0 : BN_ATTN_KEY_TILE;
        const void *src = (const char *)k + (size_t)s0 * ld * elem;
        for (int r = 0; r < nr; r++) {
            const int nk = (ends[r] < s0 + n ? ends[r] : s0 + n) - s0; /* keys of this tile row r sees */
            for (int h = 0; h < nq; h++)
                scores_run(q + (size_t)r * ldq + (size_t)h * hd, hd, src, ld, kv, nk, scale, ks ? ks + s0 : NULL,
                           SCORES(r, h) + s0);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < nq; h++) softmax_row(SCORES(r, h), ends[r], vs);
    for (int s0 = 0; s0 < E; s0 += BN_ATTN_KEY_TILE) {
        const int n = E - s0 < BN_ATTN_KEY_TILE ? E - s0 : BN_ATTN_KEY_TILE;
        const void *src = (const char *)v + (size_t)s0 * ld * elem;
        for (int r = 0; r < nr; r++) {
            const int nk = (ends[r] < s0 + n ? ends[r] : s0 + n) - s0;
            if (nk <= 0) continue;
            for (int h = 0; h < nq; h++)
                values_run(SCORES(r, h) + s0, nk, src, ld, kv, c0, c1, out + (size_t)r * ldo + (size_t)h * hd,
                           s0 == 0);
        }
    }
#undef SCORES
}

/* The shapes handled here: head sizes that are a multiple of 8 (every real model), at least one row, and every row
 * seeing a key; the plain loop takes the others. */
static int handles(int hd, int nr, const int *ends) {
    int ok = hd % 8 == 0 && nr > 0;
    for (int r = 0; ok && r < nr; r++) ok = ends[r] > 0;
    return ok;
}

int bn_neon_attend_rows(const float *q, size_t ldq, int nr, int nq, int hd, const void *k, const void *v, size_t ld,
                        int kv, const float *ks, const float *vs, const int *ends, int c0, int c1, float scale,
                        float *scratch, float *out, size_t ldo) {
    if (!handles(hd, nr, ends)) return 0;
    if (kv == BN_KV_F16) /* the cache's element type a constant inside each copy */
        attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_F16, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
    else if (kv == BN_KV_I8)
        attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_I8, ks, vs, ends, c0, c1, scale, scratch, out, ldo);
    else
        attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_F32, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
    return 1;
}
