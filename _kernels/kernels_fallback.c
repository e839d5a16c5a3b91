/* The plain C loops of kernels.h's optional entries, in one place: what runs where a table has NULL (the portable
 * table has none of them), and the reference each SIMD entry is tested against (tests/test_kernels.py). They call
 * only the table's required entries. */
#include <math.h>
#include <string.h>

#include "kernels.h"

/* out = silu(g) * u = g / (1 + e^-g) * u */
void bn_fallback_silu_mul(const float *g, const float *u, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---------------------------------------------------------------- attention */

static float dot_i8(const float *a, const int8_t *q, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * (float)q[i];
    return acc;
}

/* The attention of one query row of one GQA group (nq heads at q) over keys [0, n_keys): scores = q . k * scale,
 * softmax (exp, divide), out = sum of score * v over the columns [c0, c1), through the table's vector ops. */
static void attend_row(const bn_kernels *k, const float *q, int nq, int hd, const void *kc, const void *vc, size_t ld,
                       int kv, const float *ks, const float *vs, int n_keys, int c0, int c1, float scale, float *sc,
                       float *out) {
    const float *kf = kc, *vf = vc;
    const uint16_t *kh = kc, *vh = vc;
    const int8_t *k8 = kc, *v8 = vc;
    for (int s = 0; s < n_keys; s++)
        for (int h = 0; h < nq; h++)
            sc[(size_t)h * n_keys + s] =
                kv == BN_KV_F16 ? k->dot_f16(q + h * hd, kh + s * ld, hd) * scale
                : kv == BN_KV_I8 ? dot_i8(q + h * hd, k8 + s * ld, hd) * scale * ks[s]
                                 : k->dot(q + h * hd, kf + s * ld, hd) * scale;
    for (int h = 0; h < nq; h++) { /* softmax per head, in place */
        float *row = sc + (size_t)h * n_keys, mx = -INFINITY, sum = 0.0f;
        for (int s = 0; s < n_keys; s++) mx = row[s] > mx ? row[s] : mx;
        for (int s = 0; s < n_keys; s++) { row[s] = expf(row[s] - mx); sum += row[s]; }
        for (int s = 0; s < n_keys; s++) row[s] /= sum; /* divide, as softmax does */
    }
    for (int h = 0; h < nq; h++) memset(out + h * hd + c0, 0, sizeof(float) * (size_t)(c1 - c0));
    for (int s = 0; s < n_keys; s++) /* the values' columns [c0, c1) */
        for (int h = 0; h < nq; h++) {
            const float p = sc[(size_t)h * n_keys + s];
            if (kv == BN_KV_F16) {
                k->axpy_f16(p, vh + s * ld + c0, out + h * hd + c0, c1 - c0);
            } else if (kv == BN_KV_I8) {
                const float pv = p * vs[s];
                for (int i = c0; i < c1; i++) out[h * hd + i] += pv * (float)v8[s * ld + i];
            } else {
                k->axpy(p, vf + s * ld + c0, out + h * hd + c0, c1 - c0);
            }
        }
}

void bn_fallback_attend_rows(const bn_kernels *k, const float *q, size_t ldq, int nr, int nq, int hd, const void *kc,
                             const void *vc, size_t ld, int kv, const float *ks, const float *vs, const int *ends,
                             int c0, int c1, float scale, float *scratch, float *out, size_t ldo) {
    for (int r = 0; r < nr; r++)
        attend_row(k, q + (size_t)r * ldq, nq, hd, kc, vc, ld, kv, ks, vs, ends[r], c0, c1, scale, scratch,
                   out + (size_t)r * ldo);
}

/* ---------------------------------------------------------------- the greedy confidence (greedy.c) */

float bn_fallback_max_first(const float *x, int n, int *arg) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    *arg = a;
    return x[a];
}

double bn_fallback_expsum(const float *x, int n, float mx) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)expf(x[i] - mx);
    return sum;
}

/* ---------------------------------------------------------------- the sampler (sample.c) */

/* sum of w[0, n) in four chains (one would wait for each add before the next: ~4 cycles a weight) */
static double sum4(const double *w, int n) {
    double a[4] = {0.0, 0.0, 0.0, 0.0};
    int j = 0;
    for (; j + 4 <= n; j += 4)
        for (int c = 0; c < 4; c++) a[c] += w[j + c];
    for (; j < n; j++) a[j & 3] += w[j];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

double bn_fallback_exp_shifted(const double *z, double top, double *w, int n) {
    for (int j = 0; j < n; j++) w[j] = exp(z[j] - top);
    return sum4(w, n);
}

double bn_fallback_scale_row(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad) {
    double top = -INFINITY;
    int neg = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        const double v = (double)x[i] * inv_t;
        z[i] = v;
        top = v > top ? v : top;
        neg += v == -INFINITY;
        bad += !(v - v == 0.0) && v != -INFINITY; /* v - v is NaN for NaN and +-inf */
    }
    *n_neginf = neg;
    *n_bad = bad;
    return top;
}

int bn_fallback_select_at_least(const double *w, int n, double t, int *out) {
    int m = 0;
    for (int j = 0; j < n; j++)
        if (w[j] >= t) out[m++] = j;
    return m;
}
