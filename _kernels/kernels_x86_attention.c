/* The multi-row attention of every x86 path (kernels.h attend_rows), in AVX2 (compiled with -mavx2 -mfma -mf16c):
 * the AVX2, AVX-VNNI, AVX-512 and AMX tables all take it (kernels_x86.h BN_X86_SHARED_ENTRIES). Head sizes that are
 * not a multiple of 8 go to the plain loop (kernels_fallback.c). */
#include "kernels_x86.h"

/* 8 cache elements i.. of a K or V source as floats: kv (enum bn_kv) float32, fp16 bits, or int8 (its integers,
 * exactly; the row's scale is applied by the caller) */
static inline __attribute__((always_inline)) __m256 load_kv(const void *base, const int kv, size_t i) {
    if (kv == BN_KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    if (kv == BN_KV_I8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + i))));
    return _mm256_loadu_ps((const float *)base + i);
}

/* Prefetch into L2 one cache row (bytes, whole lines) that a pass reads BN_FAR_PREFETCH_BYTES later: the passes that
 * read the cache from memory (a decode token's, and the first pass over each tile of a batch) stream it. Into L2
 * only: the lines arrive in time from there, and prefetching into L1 as well evicts the tile in use. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *row, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)row + o + BN_FAR_PREFETCH_BYTES, _MM_HINT_T1);
}

/* lanes j = horizontal sum of a[j], j < 8 */
static inline __m256 sum8(const __m256 a[8]) {
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* softmax of row (n floats) in place: exp(x - max) / sum (the division per score, as the reference's softmax: a
 * division moved to the output changes the last bits of a row's output, which a random model's near-ties show) */
static void softmax_row(float *row, int n) {
    const float mx = row_max(row, n);
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 sv = _mm256_setzero_ps();
    float buf[8];
    int s;
    for (s = 0; s + 8 <= n; s += 8) {
        const __m256 v = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row + s), vmx));
        _mm256_storeu_ps(row + s, v);
        sv = _mm256_add_ps(sv, v);
    }
    float sum = hsum256(sv);
    if (s < n) { /* the tail through one padded vector, so every score goes through the same exp */
        for (int j = 0; j < 8; j++) buf[j] = s + j < n ? row[s + j] - mx : -INFINITY;
        _mm256_storeu_ps(buf, exp_nonpos(_mm256_loadu_ps(buf)));
        for (int j = 0; s + j < n; j++) { row[s + j] = buf[j]; sum += buf[j]; }
    }
    const __m256 vs = _mm256_set1_ps(sum);
    for (s = 0; s + 8 <= n; s += 8) _mm256_storeu_ps(row + s, _mm256_div_ps(_mm256_loadu_ps(row + s), vs));
    for (; s < n; s++) row[s] /= sum;
}

/* ---- multi-row attention (kernels.h, attend_rows)
 * Key and value rows come from a source: base + s*ld elements, float32, fp16 bits or int8 (`kv`: an enum bn_kv;
 * an int8 row's scale multiplies its score, or its probability before the values pass). With an fp16 or int8 cache
 * and several rows, the first pass over a tile converts it (exactly: every half and every int8 is a float) into a
 * float32 tile (rows of hd) while computing with it, and every later (row, head) of the item reads the tile: each
 * element is converted once per item instead of once per query row and head. `keep` is that tile (KEEP = 1), or
 * unused (KEEP = 0). */


/* Scores of one or two query heads (NH; qa, qb) for keys k + j*ld, j < nk <= 4 (NH = 2) or 8 (NH = 1):
 * ra[j] (rb[j]) = (q . k_j) * scale, times ks[j] for an int8 cache (ks: the keys' scales, else NULL). Eight dot
 * products share one vector sum (sum8); each is an FMA chain over its 8 lanes then the pairwise lane sum, the
 * numbers of the per-token kernel before this one. */
static inline __attribute__((always_inline)) void scores_group(const float *qa, const float *qb, const int NH, int hd,
                                                               const void *k, size_t ld, const int kv, const int nk,
                                                               float scale, const float *ks, float *ra, float *rb,
                                                               float *keep, const int KEEP, const int PF) {
    const int per = NH == 2 ? 4 : 8; /* keys per head in the eight accumulators */
    if (PF)
        for (int j = 0; j < nk; j++) prefetch_ahead((const char *)k + (size_t)j * ld * bn_kv_elem_bytes(kv), (size_t)hd * bn_kv_elem_bytes(kv));
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        const __m256 a = _mm256_loadu_ps(qa + d), b = NH == 2 ? _mm256_loadu_ps(qb + d) : a;
#pragma GCC unroll 8
        for (int j = 0; j < per; j++)
            if (j < nk) {
                __m256 kr = load_kv(k, kv, (size_t)j * ld + d);
                if (NH == 2) KEEP_IN_REGISTER(kr);
                if (KEEP) _mm256_storeu_ps(keep + (size_t)j * hd + d, kr);
                acc[j] = _mm256_fmadd_ps(a, kr, acc[j]);
                if (NH == 2) acc[4 + j] = _mm256_fmadd_ps(b, kr, acc[4 + j]);
            }
    }
    __m256 v = _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale)); /* NH = 2: [qa . k_0..3 | qb . k_0..3] */
    if (ks) { /* the int8 keys' scales, in the same lanes */
        if (nk == per) {
            v = _mm256_mul_ps(v, NH == 2 ? _mm256_broadcast_ps((const __m128 *)ks) : _mm256_loadu_ps(ks));
        } else {
            float sc[8] = {0};
            for (int j = 0; j < nk; j++) sc[j] = sc[NH == 2 ? 4 + j : j] = ks[j];
            v = _mm256_mul_ps(v, _mm256_loadu_ps(sc));
        }
    }
    if (nk == per) {
        if (NH == 2) {
            _mm_storeu_ps(ra, _mm256_castps256_ps128(v));
            _mm_storeu_ps(rb, _mm256_extractf128_ps(v, 1));
        } else {
            _mm256_storeu_ps(ra, v);
        }
    } else {
        float buf[8];
        _mm256_storeu_ps(buf, v);
        memcpy(ra, buf, sizeof(float) * (size_t)nk);
        if (NH == 2) memcpy(rb, buf + 4, sizeof(float) * (size_t)nk);
    }
}

/* ra[j] (and rb[j]) for the nk keys k + j*ld of one tile, j < nk (ks: their int8 scales, or NULL) */
static inline __attribute__((always_inline)) void scores_run(const float *qa, const float *qb, const int NH, int hd,
                                                             const void *k, size_t ld, const int kv, int nk,
                                                             float scale, const float *ks, float *ra, float *rb,
                                                             float *keep, const int KEEP, const int PF) {
    const int per = NH == 2 ? 4 : 8;
    int j = 0;
    for (; j + per <= nk; j += per)
        scores_group(qa, qb, NH, hd, (const char *)k + j * ld * bn_kv_elem_bytes(kv), ld, kv, per, scale,
                     ks ? ks + j : NULL, ra + j, rb + j, keep + (KEEP ? (size_t)j * hd : 0), KEEP, PF);
    if (j < nk)
        scores_group(qa, qb, NH, hd, (const char *)k + j * ld * bn_kv_elem_bytes(kv), ld, kv, nk - j, scale,
                     ks ? ks + j : NULL, ra + j, rb + j, keep + (KEEP ? (size_t)j * hd : 0), KEEP, PF);
}

/* oa[c0, c0 + 8*NC) += sum_s pa[s] * v_s over s < n (rows v + s*ld), and the same for ob, pb when NH = 2 (each
 * value row loaded once for both heads). Per column one FMA chain in s order, as one head alone gives it.
 * fresh: the first tile, whose chains start from zero instead of loading oa (which then need not be cleared
 * first: a load right after memset's stores waits for them, ~15% of the attention's time). PF (a pass that reads
 * the cache itself): prefetch pf_cols columns from c0 of each row ahead (prefetch_ahead), 0: none (a later pass
 * over the same rows). */
static inline __attribute__((always_inline)) void values_cols(const float *pa, const float *pb, const int NH, int n,
                                                              const void *v, size_t ld, const int kv, int c0,
                                                              const int NC, float *oa, float *ob, float *keep, int hd,
                                                              const int KEEP, int fresh, const int PF, int pf_cols) {
    __m256 a[8], b[8];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        a[c] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(oa + c0 + 8 * c);
        if (NH == 2) b[c] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(ob + c0 + 8 * c);
    }
    for (int s = 0; s < n; s++) {
        const __m256 xa = _mm256_set1_ps(pa[s]), xb = NH == 2 ? _mm256_set1_ps(pb[s]) : xa;
        if (PF && pf_cols) prefetch_ahead((const char *)v + ((size_t)s * ld + c0) * bn_kv_elem_bytes(kv), (size_t)pf_cols * bn_kv_elem_bytes(kv));
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m256 vv = load_kv(v, kv, (size_t)s * ld + c0 + 8 * c);
            if (NH == 2) KEEP_IN_REGISTER(vv);
            if (KEEP) _mm256_storeu_ps(keep + (size_t)s * hd + c0 + 8 * c, vv);
            a[c] = _mm256_fmadd_ps(xa, vv, a[c]);
            if (NH == 2) b[c] = _mm256_fmadd_ps(xb, vv, b[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        _mm256_storeu_ps(oa + c0 + 8 * c, a[c]);
        if (NH == 2) _mm256_storeu_ps(ob + c0 + 8 * c, b[c]);
    }
}

/* oa += sum_s pa[s] * v_s (and ob with pb when NH = 2) over the n value rows of one tile, columns [from, to), in passes
 * of at most 6 column vectors for two heads (12 accumulators) or 8 for one head, the last two of even sizes: hd 64 as
 * 32 + 32 for two heads (8 FMA chains each; 48 + 16 left the second pass 4 chains, waiting on the FMA latency) and 64
 * at once for one head, 128 as 48 + 40 + 40. Each column's chain is the same whatever pass it is in. */
static inline __attribute__((always_inline)) void values_run(const float *pa, const float *pb, const int NH, int n,
                                                             int hd, int from, int to, const void *v, size_t ld,
                                                             const int kv, float *oa, float *ob, float *keep,
                                                             const int KEEP, int fresh, const int PF) {
    const int most = NH == 2 ? 6 : 8;
    for (int c0 = from; c0 < to;) {
        const int left = (to - c0) / 8; /* column vectors left: all in one pass, or the next of two halves */
        const int nc = left <= most ? left : left <= 2 * most ? (left + 1) / 2 : most;
        switch (nc) {
#define VALUES_CASE(NC) \
    case NC: values_cols(pa, pb, NH, n, v, ld, kv, c0, NC, oa, ob, keep, hd, KEEP, fresh, PF, c0 == from ? to - from : 0); break;
            VALUES_CASE(8) VALUES_CASE(7) VALUES_CASE(6) VALUES_CASE(5) VALUES_CASE(4) VALUES_CASE(3) VALUES_CASE(2)
            default: values_cols(pa, pb, NH, n, v, ld, kv, c0, 1, oa, ob, keep, hd, KEEP, fresh, PF, c0 == from ? to - from : 0); break;
#undef VALUES_CASE
        }
        c0 += 8 * nc;
    }
}

/* The multi-row attention. Three passes over the visible keys [0, E), E = the largest end (the last row's), in
 * tiles of KEY_TILE keys, so a tile stays in L1 while every row and head of the item uses it:
 *   1. scores (nr, nq, E): each row for its own keys of the tile (none once past its end)
 *   2. softmax per (row, head) over [0, ends[r])
 *   3. out = p . v, tile by tile (the first tile starts the sums; later tiles carry them on through out, which
 *      changes no bit of them)
 * In passes 1 and 3 the row with the largest end goes first (it sees every key of the tile), with its first head (pair) reading
 * the fp16 cache and keeping the converted tile for the others; that first reader prefetches the rows ahead (PF, a
 * compile-time constant in each copy of the passes: a run-time flag would put a branch in the inner loops). Pass 3
 * computes the columns [c0, c1) of each head's output only. */
#define KEY_TILE BN_ATTN_KEY_TILE

/* p[s] *= sc[s] for s < n */
static void scale_by(float *p, const float *sc, int n) {
    int s = 0;
    for (; s + 8 <= n; s += 8) _mm256_storeu_ps(p + s, _mm256_mul_ps(_mm256_loadu_ps(p + s), _mm256_loadu_ps(sc + s)));
    for (; s < n; s++) p[s] *= sc[s];
}

static inline __attribute__((always_inline)) void attend_rows_kv(const float *q, size_t ldq, int nr, int nq, int hd,
                                                                 const void *k, const void *v, size_t ld, const int kv,
                                                                 const float *ks, const float *vs, const int *ends,
                                                                 int c0, int c1, float scale, float *scratch,
                                                                 float *out, size_t ldo) {
    int last = nr - 1; /* the row with the largest end (the last one: ends are non-decreasing) */
    for (int r = 0; r < nr; r++) last = ends[r] > ends[last] ? r : last;
    const int E = ends[last], conv = kv != BN_KV_F32 && nr > 1; /* conv: convert each tile once, into `tile` */
    const size_t elem = bn_kv_elem_bytes(kv);
    /* each (row, head)'s scores and the float tile start on a 64-byte line (scratch does): at an odd offset every
     * other 32-byte load would straddle two lines */
    const size_t ldsc = ((size_t)E + 15) / 16 * 16;
    float *tile = scratch + (size_t)nr * nq * ldsc;
#define SCORES(r, h) (scratch + ((size_t)(r) * nq + (h)) * ldsc)
    for (int s0 = 0; s0 < E; s0 += KEY_TILE) {
        const int n = E - s0 < KEY_TILE ? E - s0 : KEY_TILE;
        const void *src = (const char *)k + (size_t)s0 * ld * elem;
        const float *kst = ks ? ks + s0 : NULL;
        for (int i = 0; i < nr; i++) {
            const int r = i == 0 ? last : i - 1 + (i - 1 >= last);      /* the last row first */
            const int nk = (ends[r] < s0 + n ? ends[r] : s0 + n) - s0; /* keys of this tile row r sees */
            const float *qr = q + (size_t)r * ldq;
            for (int h = 0; h < nq;) {
                const int two = h + 2 <= nq;
                float *ra = SCORES(r, h) + s0, *rb = two ? SCORES(r, h + 1) + s0 : ra;
                const float *qa = qr + (size_t)h * hd, *qb = two ? qa + hd : qa;
#define SCORES_FROM(NH)                                                                                  \
    if (!conv && i == 0 && h == 0) scores_run(qa, qb, NH, hd, src, ld, kv, nk, scale, kst, ra, rb, NULL, 0, 1); \
    else if (!conv) scores_run(qa, qb, NH, hd, src, ld, kv, nk, scale, kst, ra, rb, NULL, 0, 0);           \
    else if (i == 0 && h == 0) scores_run(qa, qb, NH, hd, src, ld, kv, nk, scale, kst, ra, rb, tile, 1, 1);  \
    else scores_run(qa, qb, NH, hd, tile, (size_t)hd, BN_KV_F32, nk, scale, kst, ra, rb, NULL, 0, 0);
                if (two) { SCORES_FROM(2) } else { SCORES_FROM(1) }
#undef SCORES_FROM
                h += two ? 2 : 1;
            }
        }
    }
    for (int r = 0; r < nr; r++) /* (out is not cleared: the first tile, which every row sees, starts the sums) */
        for (int h = 0; h < nq; h++) {
            softmax_row(SCORES(r, h), ends[r]);
            if (vs) scale_by(SCORES(r, h), vs, ends[r]); /* int8 values: p_s * vscale_s */
        }
    for (int s0 = 0; s0 < E; s0 += KEY_TILE) {
        const int n = E - s0 < KEY_TILE ? E - s0 : KEY_TILE;
        const void *src = (const char *)v + (size_t)s0 * ld * elem;
        for (int i = 0; i < nr; i++) {
            const int r = i == 0 ? last : i - 1 + (i - 1 >= last);
            const int nk = (ends[r] < s0 + n ? ends[r] : s0 + n) - s0;
            if (nk <= 0) continue;
            float *orow = out + (size_t)r * ldo;
            for (int h = 0; h < nq;) {
                const int two = h + 2 <= nq;
                const float *pa = SCORES(r, h) + s0, *pb = two ? SCORES(r, h + 1) + s0 : pa;
                float *oa = orow + (size_t)h * hd, *ob = two ? oa + hd : oa;
#define VALUES_FROM(NH)                                                                                  \
    if (!conv && i == 0 && h == 0) values_run(pa, pb, NH, nk, hd, c0, c1, src, ld, kv, oa, ob, NULL, 0, s0 == 0, 1); \
    else if (!conv) values_run(pa, pb, NH, nk, hd, c0, c1, src, ld, kv, oa, ob, NULL, 0, s0 == 0, 0);           \
    else if (i == 0 && h == 0) values_run(pa, pb, NH, nk, hd, c0, c1, src, ld, kv, oa, ob, tile, 1, s0 == 0, 1);  \
    else values_run(pa, pb, NH, nk, hd, c0, c1, tile, (size_t)hd, BN_KV_F32, oa, ob, NULL, 0, s0 == 0, 0);
                if (two) { VALUES_FROM(2) } else { VALUES_FROM(1) }
#undef VALUES_FROM
                h += two ? 2 : 1;
            }
        }
    }
#undef SCORES
}

/* Head sizes that are a multiple of 8 (every real model); others go to the plain loop (returns 0). */
int bn_x86_attend_rows(const float *q, size_t ldq, int nr, int nq, int hd, const void *k, const void *v, size_t ld,
                       int kv, const float *ks, const float *vs, const int *ends, int c0, int c1, float scale,
                       float *scratch, float *out, size_t ldo) {
    if (hd % 8 || nr <= 0) return 0;
    for (int r = 0; r < nr; r++)
        if (ends[r] <= 0) return 0;
    switch (kv) { /* the cache's element type a constant inside */
        case BN_KV_F16:
            if (hd == 64) /* the usual head sizes constants too: the loops over a row's vectors unroll */
                attend_rows_kv(q, ldq, nr, nq, 64, k, v, ld, BN_KV_F16, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
            else if (hd == 128)
                attend_rows_kv(q, ldq, nr, nq, 128, k, v, ld, BN_KV_F16, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
            else
                attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_F16, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
            break;
        case BN_KV_I8: attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_I8, ks, vs, ends, c0, c1, scale, scratch, out, ldo); break;
        default: attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_F32, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
    }
    return 1;
}
