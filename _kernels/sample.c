/* One random draw per logit row, after temperature, top-k and top-p: what bitnet_app/decode/sampling.py
 * Sampler._draw and _candidates state in numpy (the reference the tests compare with), without a numpy call per
 * step of it (a diffusion step samples up to a sub-block of rows, and numpy's call overhead per row is more than
 * the demo model's forward).
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
 * Everything after the float32 logits is double, as in numpy; sums run in another order (numpy's are pairwise),
 * two quotients are products by the reciprocal, and the SIMD paths' exponential is within 1 ulp of libm's, so a
 * cut or a draw can move only when it falls within ~1e-15 of a boundary (never seen in the tests' thousands of
 * draws). The passes over the whole row (z and its max, the weights, the heavy weights) go through the kernel
 * table where it has them (kernels.h: scale_row, exp_shifted, select_at_least); the plain loops here are their
 * reference.
 * The nucleus is found without sorting the pool: the weights are binned by their binary exponent, and only the
 * ids of the bins whose mass reaches top_p (one more bin for rounding) are sorted (a stable radix sort: qsort's
 * callbacks would cost more than the sort). A banned (-inf) id stays in the pool with
 * weight 0 when it is the only kind of non-finite entry, and never reaches the kept ids. */
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

#define SMALL_SORT 32 /* up to this many keys, an insertion sort */

/* Sorts ids[0, n) by key (ascending), stably: SMALL_SORT keys or fewer by insertion; more by radix, one pass
 * counting all four 8-bit digits, then one scatter pass per digit (skipped when every key has the same digit), ids
 * travelling with their keys through the spare arrays. Stable, so ids that came in ascending order stay so among
 * equal keys: x descending, ties by the lower id, as numpy's stable argsort of -z. */
static void radix_sort(uint32_t *key, int *ids, uint32_t *key2, int *ids2, int n) {
    if (n <= SMALL_SORT) { /* insertion: stable too, and no count arrays to clear */
        for (int i = 1; i < n; i++) {
            const uint32_t kv = key[i];
            const int id = ids[i];
            int j = i;
            for (; j > 0 && key[j - 1] > kv; j--) {
                key[j] = key[j - 1];
                ids[j] = ids[j - 1];
            }
            key[j] = kv;
            ids[j] = id;
        }
        return;
    }
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
 * comparison with its root), not from a quickselect over a copy of the whole row. */
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
    size_t V;
} scratch;

/* Weights binned by exponent go into MASS_COPIES copies of the bins in turn: a bin's sum in one copy would wait
 * for the add before it (through memory: ~9 cycles) whenever consecutive weights share a bin, as they mostly do. */
#define MASS_COPIES 8

/* The first bin b < bins at which the mass of bins 0..b reaches goal, or bins if none does. */
static int reach(double mass[MASS_COPIES][EXPONENT_BINS], int bins, double goal) {
    double total = 0.0;
    for (int b = 0; b < bins; b++) {
        for (int c = 0; c < MASS_COPIES; c++) total += mass[c][b];
        if (total >= goal) return b;
    }
    return bins;
}

static int nucleus(const bn_kernels *k, scratch *s, const float *x, int n, double top_p, double total, int zeros);

/* s->w[j] = exp(z[pool[j]] - top) for the n ids of the pool, returning their sum: through the table's vector
 * exponential (the pool gathered into s->tmp unless it is every id in order), else kernels_fallback.c's libm loop,
 * the reference.
 * top = -inf (every entry -inf): numpy's nan, here uniform weights. */
static double pool_weights(const bn_kernels *k, scratch *s, int n, double top) {
    if (!isfinite(top)) {
        for (int j = 0; j < n; j++) s->w[j] = 1.0;
        return n;
    }
    const double *z = s->z;
    if (n < (int)s->V) { /* tmp is free again: the top-k selection is done */
        for (int j = 0; j < n; j++) s->tmp[j] = z[s->pool[j]];
        z = s->tmp;
    }
    return (k->exp_shifted ? k->exp_shifted : bn_fallback_exp_shifted)(z, top, s->w, n);
}

/* The kept ids of one row (ascending) into s->kept with their weights in s->w (indexed like kept); returns how
 * many. x is the row, s->z its z; top is z's largest entry (in every pool); n_finite and n_neginf count its
 * finite and its -inf entries. */
static int keep_ids(const bn_kernels *k, scratch *s, const float *x, int V, int top_k, double top_p, double top,
                    int n_finite, int n_neginf) {
    const double *z = s->z;
    int n = 0, zeros = 0; /* zeros: the pool is every id, its -inf ones (banned ids) in it with weight 0 */
    if (top_k > 0 && top_k <= SMALL_TOP_K && top_k < V) { /* the k-th largest x (same order and ties as z) */
        const float kth = kth_largest(x, V, top_k, (float *)s->tmp);
        for (int i = 0; i < V; i++)
            if (x[i] >= kth) s->pool[n++] = i;
    } else if (top_k > 0 && top_k < V) {
        memcpy(s->tmp, z, sizeof(double) * (size_t)V);
        const double kth = select_rank(s->tmp, V, V - top_k);
        for (int i = 0; i < V; i++)
            if (z[i] >= kth) s->pool[n++] = i;
    } else if (n_finite > 0 && n_finite + n_neginf < V) { /* NaN or +inf too: every finite id, in one pass */
        for (int i = 0; i < V; i++)
            if (isfinite(z[i])) s->pool[n++] = i;
    } else { /* every id (numpy keeps the pool when none is finite) */
        for (int i = 0; i < V; i++) s->pool[n++] = i;
        zeros = n_finite > 0 && n_neginf > 0; /* they add 0 to every sum; they leave the kept ids below */
    }
    if (top_k > 0 && top_k < V) { /* the top-k pool without its non-finite ids, unless it has only those */
        int finite = 0;
        for (int j = 0; j < n; j++) finite += isfinite(z[s->pool[j]]) != 0;
        if (finite > 0 && finite < n) {
            int m = 0;
            for (int j = 0; j < n; j++)
                if (isfinite(z[s->pool[j]])) s->pool[m++] = s->pool[j];
            n = m;
        }
    }
    if (top == INFINITY && n < V) { /* the +inf entry left the pool */
        top = -INFINITY;
        for (int j = 0; j < n; j++) top = z[s->pool[j]] > top ? z[s->pool[j]] : top;
    }
    const double total = pool_weights(k, s, n, top);
    if (top_p < 1.0) return nucleus(k, s, x, n, top_p, total, zeros);
    int m = 0;
    for (int j = 0; j < n; j++) /* m <= j: w[j] is read before it is overwritten */
        if (!zeros || z[s->pool[j]] != -INFINITY) {
            s->kept[m] = s->pool[j];
            s->w[m++] = s->w[j];
        }
    return m;
}

/* The nucleus of the pool's n weights s->w (sum total): its ids (ascending) into s->kept, their weights into s->w;
 * returns how many. zeros: the pool's -inf ids have weight 0 and are never kept.
 * The weights are binned by binary exponent, and only the ids of the bins, heaviest first, whose mass reaches
 * top_p (with a margin far above the rounding of sums in another order: numpy's cumsum over these ids ends within
 * ~1e-13 of this mass) are candidates, sorted, and cut as numpy cuts them: every id outside them has at least top_p
 * before it in numpy's order too. Bins below HEAVY_BINS are filled only when the heavy ones fall short (a trained
 * model's rows put ~90% of the mass on a few ids, so most weights are only compared with 2^-HEAVY_BINS). */
#define HEAVY_BINS 16
static int nucleus(const bn_kernels *k, scratch *s, const float *x, int n, double top_p, double total,
                   int zeros) {
    const double heavy = 1.0 / (double)(1 << HEAVY_BINS), goal = top_p * total * (1.0 + 1e-12);
    double mass[MASS_COPIES][EXPONENT_BINS] = {{0}};
    int *places = s->kept; /* the places in the pool of the candidates, ascending (kept is written last) */
    const int n_heavy = (k->select_at_least ? k->select_at_least : bn_fallback_select_at_least)(s->w, n, heavy, places);
    for (int i = 0; i < n_heavy; i++) {
        const int j = places[i];
        s->bin[j] = (uint8_t)exponent_bin(s->w[j]);
        mass[i % MASS_COPIES][s->bin[j]] += s->w[j];
    }
    int last = reach(mass, HEAVY_BINS, goal);
    int c = n_heavy;
    if (last >= HEAVY_BINS) { /* the light weights too: every bin */
        for (int j = 0; j < n; j++)
            if (zeros && s->z[s->pool[j]] == -INFINITY) {
                s->bin[j] = UINT8_MAX; /* never a candidate: numpy's pool has no -inf id */
            } else if (!(s->w[j] >= heavy)) {
                s->bin[j] = (uint8_t)exponent_bin(s->w[j]);
                mass[j % MASS_COPIES][s->bin[j]] += s->w[j];
            }
        last = reach(mass, EXPONENT_BINS, goal);
        c = 0;
        for (int j = 0; j < n; j++)
            if (s->bin[j] <= last) places[c++] = j;
    }
    int n_cand = 0;
    for (int i = 0; i < c; i++)
        if (s->bin[places[i]] <= last) {
            places[n_cand] = places[i];
            s->key[n_cand] = descending_key(x[s->pool[places[i]]]);
            s->cand[n_cand++] = places[i];
        }
    radix_sort(s->key, s->cand, s->key2, s->cand2, n_cand); /* by x descending, ties by the lower id */
    uint8_t *keep = s->bin; /* now by place in the pool: 1 = kept */
    for (int i = 0; i < n_cand; i++) keep[places[i]] = 0;
    double running = 0.0;
    for (int i = 0; i < n_cand; i++) {
        const double p = s->w[s->cand[i]] / total;
        running += p;
        if (running - p < top_p) keep[s->cand[i]] = 1; /* the mass before it, as numpy's cumsum - p */
    }
    int m = 0;
    for (int i = 0; i < n_cand; i++) { /* places ascend and m <= i <= places[i]: each entry is read before it is
                                          overwritten */
        const int j = places[i];
        if (keep[j]) {
            s->kept[m] = s->pool[j];
            s->w[m++] = s->w[j];
        }
    }
    return m;
}

int bn_sample_rows(const bn_kernels *k, const float *x, int R, int V, double temperature, int top_k, double top_p,
                   const double *u, const int32_t *banned, int n_banned, int64_t *ids, double *probs) {
    const size_t n = (size_t)V;
    /* one block for every scratch array: doubles first, then the 4-byte arrays, then the bytes */
    char *block = malloc(n * (3 * sizeof(double) + 6 * sizeof(int) + sizeof(float) + 1));
    if (!block) return -1;
    double *d = (double *)block;
    int *i4 = (int *)(d + 3 * n);
    float *xrow = (float *)(i4 + 6 * n); /* a row with its banned ids set to -inf */
    scratch s = {d, d + n, d + 2 * n, i4, i4 + n, (uint8_t *)(xrow + n), (uint32_t *)(i4 + 2 * n),
                 (uint32_t *)(i4 + 3 * n), i4 + 4 * n, i4 + 5 * n, n};
    for (int r = 0; r < R; r++) {
        const float *row = x + (size_t)r * V;
        if (n_banned) { /* numpy's ban_ids, on a copy: the caller's rows are left alone */
            memcpy(xrow, row, sizeof(float) * n);
            for (int b = 0; b < n_banned; b++) xrow[banned[b]] = -INFINITY;
            row = xrow;
        }
        const double inv_t = 1.0 / temperature; /* a product, not numpy's quotient: at most 1 ulp apart, 3x faster */
        int n_neginf = 0, n_bad = 0;
        const double top = (k->scale_row ? k->scale_row : bn_fallback_scale_row)(row, V, inv_t, s.z, &n_neginf, &n_bad);
        const int m = keep_ids(k, &s, row, V, top_k, top_p, top, V - n_neginf - n_bad, n_neginf);
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
    free(block);
    return 0;
}
