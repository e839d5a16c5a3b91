/* One random draw per logit row, after temperature, top-k and top-p: what bitnet_app/decode/sampling.py
 * Sampler._draw and _candidates state in numpy (the reference the tests compare with), without a numpy call per
 * step of it (a diffusion step samples up to a sub-block of rows; numpy spent ~80 µs per row of a 4k vocabulary
 * on call overhead alone, more than the demo model's forward).
 *
 * Per row x (V,) float32, with banned ids already -inf, and a uniform u in [0, 1):
 *   z = x / temperature (double)
 *   pool = the ids of the top_k largest z, every id tied at the k-th kept (all ids if top_k <= 0 or >= V); then
 *          only its finite entries, unless it has none
 *   w_i = exp(z_i - max z) over the pool, total = their sum
 *   nucleus (top_p < 1): the pool by z descending (ties: the lower id first); an id is kept while the mass of
 *          the ids before it, sum of w / total, is < top_p (so the top id always is)
 *   draw: q = w / (sum of w) over the kept ids in id order; the first id whose running sum of q reaches
 *          u * (the whole running sum), clamped to the last; its q is the probability returned.
 * Everything after the float32 logits is double, as in numpy; sums run in another order (numpy's are pairwise) and
 * two quotients are products by the reciprocal, so a cut or a draw can move only when it falls within ~1e-15 of a
 * boundary (never seen in the tests' thousands of draws).
 * The nucleus is found without sorting the pool: the weights are binned by their binary exponent, and only the
 * ids of the bins whose mass reaches top_p (one more bin for rounding) are sorted (a stable radix sort: qsort's
 * callbacks took ~0.3 ms for the ~3,000 candidates of a flat row). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define EXPONENT_BINS 64 /* w in (0, 1]: bin b holds w in [2^-(b+1), 2^-b); the last bin also everything smaller */

/* A key whose unsigned order is the descending order of the logit x (IEEE bits, flipped so that larger x sort
 * first; -0.0 ties with 0.0, as in numpy's comparisons). z = x / temperature keeps the order and the ties of x:
 * two different floats stay different and in order after the product, at double precision. */
static inline uint32_t descending_key(float x) {
    uint32_t b;
    x = x == 0.0f ? 0.0f : x;
    memcpy(&b, &x, sizeof b);
    b = (b >> 31) ? ~b : b | 0x80000000u; /* ascending order of x as unsigned */
    return ~b;
}

/* Sorts ids[0, n) by key (ascending), stably: one pass counts all four 8-bit digits, then one scatter pass per
 * digit (skipped when every key has the same digit); ids travel with their keys through the spare arrays. Stable,
 * so ids that came in ascending order stay so among equal keys: x descending, ties by the lower id, as numpy's
 * stable argsort of -z. */
static void radix_sort(uint32_t *key, int *ids, uint32_t *key2, int *ids2, int n) {
    int count[4][257] = {{0}};
    for (int i = 0; i < n; i++)
        for (int d = 0; d < 4; d++) count[d][((key[i] >> (8 * d)) & 255) + 1]++;
    for (int d = 0; d < 4; d++) {
        int same = 0;
        for (int v = 1; v <= 256; v++) same |= count[d][v] == n;
        if (same) continue;
        for (int v = 0; v < 256; v++) count[d][v + 1] += count[d][v];
        for (int i = 0; i < n; i++) {
            const int at = count[d][(key[i] >> (8 * d)) & 255]++;
            key2[at] = key[i];
            ids2[at] = ids[i];
        }
        memcpy(key, key2, sizeof(uint32_t) * (size_t)n);
        memcpy(ids, ids2, sizeof(int) * (size_t)n);
    }
}

/* The value of rank t (0 = smallest) of v[0, n), by quickselect; v is reordered. */
static double select_rank(double *v, int n, int t) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const double pivot = v[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot) i++;
            while (v[j] > pivot) j--;
            if (i <= j) {
                const double s = v[i];
                v[i++] = v[j];
                v[j--] = s;
            }
        }
        if (t <= j) hi = j;
        else if (t >= i) lo = i;
        else break;
    }
    return v[t];
}

/* The bin of w in (0, 1] from its exponent bits: [0.5, 1] -> 0, [0.25, 0.5) -> 1, ...; 0 -> the last bin. */
/* Up to this top_k, the k-th largest comes from one pass with a min-heap of the k largest (most entries lose one
 * comparison with its root), not from a quickselect over a copy of the whole row (1.1 ms at 128k ids). */
#define SMALL_TOP_K 1024

/* The k-th largest of x[0, n) (0 < k < n), counting equal values apart, as numpy's partition; heap: k floats. */
static float kth_largest(const float *x, int n, int k, float *heap) {
    int size = 0;
    for (int i = 0; i < n; i++) {
        float v = x[i];
        if (size < k) { /* push, sifting up */
            int c = size++;
            while (c > 0 && heap[(c - 1) / 2] > v) {
                heap[c] = heap[(c - 1) / 2];
                c = (c - 1) / 2;
            }
            heap[c] = v;
        } else if (v > heap[0]) { /* replace the root, sifting down */
            int c = 0;
            for (;;) {
                int child = 2 * c + 1;
                if (child >= k) break;
                if (child + 1 < k && heap[child + 1] < heap[child]) child++;
                if (!(heap[child] < v)) break;
                heap[c] = heap[child];
                c = child;
            }
            heap[c] = v;
        }
    }
    return heap[0];
}

static inline int exponent_bin(double w) {
    uint64_t bits;
    memcpy(&bits, &w, sizeof bits);
    const int b = 1022 - (int)((bits >> 52) & 0x7ff);
    return b < 0 ? 0 : b >= EXPONENT_BINS ? EXPONENT_BINS - 1 : b;
}

typedef struct {
    double *z;     /* (V,) the row's z = x / temperature */
    double *w;     /* (V,) weights, indexed like pool (then like kept) */
    double *tmp;   /* (V,) top-k selection; the draw's running sums */
    int *pool;     /* (V,) */
    int *kept;     /* (V,) */
    uint8_t *bin;  /* (V,) exponent bin of each pool weight; then 1 for each kept id (by id) */
    uint32_t *key, *key2; /* (V,) the candidates' sort keys */
    int *cand, *cand2;    /* (V,) the candidates' ids */
} scratch;

/* The kept ids of one row (ascending) into s->kept with their weights in s->w (indexed like kept); returns how
 * many. x is the row, s->z its z; top is z's largest entry (in every pool), n_finite how many of them are finite. */
static int keep_ids(scratch *s, const float *x, int V, int top_k, double top_p, double top, int n_finite) {
    const double *z = s->z;
    int n = 0;
    if (top_k > 0 && top_k <= SMALL_TOP_K && top_k < V) { /* the k-th largest x (same order and ties as z) */
        const float kth = kth_largest(x, V, top_k, (float *)s->tmp);
        for (int i = 0; i < V; i++)
            if (x[i] >= kth) s->pool[n++] = i;
    } else if (top_k > 0 && top_k < V) {
        memcpy(s->tmp, z, sizeof(double) * (size_t)V);
        const double kth = select_rank(s->tmp, V, V - top_k);
        for (int i = 0; i < V; i++)
            if (z[i] >= kth) s->pool[n++] = i;
    } else {
        for (int i = 0; i < V; i++) s->pool[n++] = i;
    }
    int finite = n_finite;
    if (n < V) {
        finite = 0;
        for (int j = 0; j < n; j++) finite += isfinite(z[s->pool[j]]) != 0;
    }
    if (finite > 0 && finite < n) {
        int m = 0;
        for (int j = 0; j < n; j++)
            if (isfinite(z[s->pool[j]])) s->pool[m++] = s->pool[j];
        n = m;
        if (top == INFINITY) { /* the +inf entry left the pool (the usual leavers, banned ids, are -inf) */
            top = -INFINITY;
            for (int j = 0; j < n; j++) top = z[s->pool[j]] > top ? z[s->pool[j]] : top;
        }
    }
    double total = 0.0;
    for (int j = 0; j < n; j++) {
        s->w[j] = isfinite(top) ? exp(z[s->pool[j]] - top) : 1.0; /* all -inf: numpy's nan, here uniform */
        total += s->w[j];
    }
    if (top_p >= 1.0) {
        memcpy(s->kept, s->pool, sizeof(int) * (size_t)n);
        return n;
    }
    /* the bins, heaviest weights first, until their mass reaches top_p, with a margin far above the rounding of
     * sums in another order (numpy's cumsum over these ids ends within ~1e-13 of this mass), so every id outside
     * them has at least top_p before it in numpy's order too */
    double mass4[4][EXPONENT_BINS] = {{0}}, bin_mass[EXPONENT_BINS]; /* four copies: consecutive weights mostly
                                                                          share a bin, and one copy would make each
                                                                          sum wait for the one before */
    for (int j = 0; j < n; j++) {
        s->bin[j] = (uint8_t)exponent_bin(s->w[j]);
        mass4[j & 3][s->bin[j]] += s->w[j];
    }
    for (int b = 0; b < EXPONENT_BINS; b++) bin_mass[b] = (mass4[0][b] + mass4[1][b]) + (mass4[2][b] + mass4[3][b]);
    int last = 0;
    for (double mass = 0.0; last < EXPONENT_BINS; last++) {
        mass += bin_mass[last];
        if (mass >= top_p * total * (1.0 + 1e-12)) break;
    }
    last = last < EXPONENT_BINS ? last : EXPONENT_BINS - 1;
    int c = 0;
    for (int j = 0; j < n; j++)
        if (s->bin[j] <= last) {
            s->key[c] = descending_key(x[s->pool[j]]);
            s->cand[c++] = j; /* its place in the pool (and in w) */
        }
    radix_sort(s->key, s->cand, s->key2, s->cand2, c);
    uint8_t *keep = s->bin; /* now by place in the pool: 1 = kept */
    memset(keep, 0, (size_t)n);
    double running = 0.0;
    for (int j = 0; j < c; j++) {
        const double p = s->w[s->cand[j]] / total;
        running += p;
        if (running - p < top_p) keep[s->cand[j]] = 1; /* the mass before it, as numpy's cumsum - p */
    }
    int m = 0;
    for (int j = 0; j < n; j++) /* the pool is in id order; m <= j, so w is read before it is overwritten */
        if (keep[j]) {
            s->kept[m] = s->pool[j];
            s->w[m++] = s->w[j];
        }
    return m;
}

int bn_sample_rows(const float *x, int R, int V, double temperature, int top_k, double top_p, const double *u,
                   int64_t *ids, double *probs) {
    const size_t n = (size_t)V;
    scratch s = {malloc(sizeof(double) * n), malloc(sizeof(double) * n), malloc(sizeof(double) * n),
                 malloc(sizeof(int) * n), malloc(sizeof(int) * n), malloc(n), malloc(sizeof(uint32_t) * n),
                 malloc(sizeof(uint32_t) * n), malloc(sizeof(int) * n), malloc(sizeof(int) * n)};
    const int ok = s.z && s.w && s.tmp && s.pool && s.kept && s.bin && s.key && s.key2 && s.cand && s.cand2;
    for (int r = 0; ok && r < R; r++) {
        const float *row = x + (size_t)r * V;
        const double inv_t = 1.0 / temperature; /* a product, not numpy's quotient: at most 1 ulp apart, 3x faster */
        double top4[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}; /* four chains: a max waits for the last */
        int n_finite = 0;
        for (int i = 0; i < V; i++) {
            const double z = (double)row[i] * inv_t;
            s.z[i] = z;
            top4[i & 3] = z > top4[i & 3] ? z : top4[i & 3];
            n_finite += isfinite(z) != 0;
        }
        const double top = fmax(fmax(top4[0], top4[1]), fmax(top4[2], top4[3]));
        const int m = keep_ids(&s, row, V, top_k, top_p, top, n_finite);
        if (m == 0) { /* only NaN logits make every comparison false: take the largest z (or id 0), never crash */
            int best = 0;
            for (int i = 1; i < V; i++) best = s.z[i] > s.z[best] ? i : best;
            ids[r] = best;
            probs[r] = 0.0;
            continue;
        }
        double sum = 0.0; /* q = w / sum; the running sum of q in id order (numpy's cumsum), then the first id whose
                             running sum reaches u times the last one (numpy's searchsorted, side "left") */
        for (int j = 0; j < m; j++) sum += s.w[j];
        const double inv_sum = 1.0 / sum;
        double cdf = 0.0;
        for (int j = 0; j < m; j++) s.tmp[j] = cdf += s.w[j] * inv_sum;
        const double target = u[r] * s.tmp[m - 1];
        int lo = 0, hi = m - 1; /* the first j with tmp[j] >= target, or the last */
        while (lo < hi) {
            const int mid = lo + (hi - lo) / 2;
            if (s.tmp[mid] >= target) hi = mid;
            else lo = mid + 1;
        }
        ids[r] = s.kept[lo];
        probs[r] = s.w[lo] / sum;
    }
    free(s.z); free(s.w); free(s.tmp); free(s.pool); free(s.kept); free(s.bin); free(s.key); free(s.key2);
    free(s.cand); free(s.cand2);
    return ok ? 0 : -1;
}
