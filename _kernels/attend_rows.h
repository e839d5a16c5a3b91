/* The multi-row attention of the SIMD paths (kernels.h, attend_rows) and the float helpers it shares with
 * kernels_avx2.c (hsum256, exp_nonpos, row_max, softmax_row). Included by kernels_avx2.c (256-bit registers) and by
 * kernels_avx512.c, where __AVX512F__ gives the two hot loops 512-bit registers: the scores take two keys per
 * register (each in its own 256-bit half) and the value sums 16 columns per register. Every lane does the same
 * operations in the same order either way, so both files give the same numbers bit for bit; on CPUs with two
 * 512-bit FMA units (Intel) the wide loops do twice the work per instruction.
 */
#ifndef BITNET_ATTEND_ROWS_H
#define BITNET_ATTEND_ROWS_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* A value the compiler must hold in a register as it is at this point (an empty asm that "changes" it): stops
 * GCC from folding one load into two instructions, or from regrouping a sum in a way that needs more registers
 * than AVX2 has (it then spills accumulators to the stack inside the hot loop). */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x <= 0 (softmax after subtracting the maximum): x = n ln2 + r, e^r by the Cephes polynomial,
 * relative error about 1e-7; below -87.3 the result is 0 (expf gives a denormal there). */
static inline __m256 exp_nonpos(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline __attribute__((always_inline)) __m256 load_kv(const void *base, const int kv16, size_t i) {
    return kv16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)))
                : _mm256_loadu_ps((const float *)base + i);
}

/* lanes j = horizontal sum of a[j], j < 8 */
static inline __m256 sum8(const __m256 a[8]) {
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* max of row (n floats; -inf when n = 0) */
static float row_max(const float *row, int n) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int s = 0;
    for (; s + 8 <= n; s += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(row + s));
    float buf[8];
    _mm256_storeu_ps(buf, mv);
    float mx = buf[0];
    for (int j = 1; j < 8; j++) mx = buf[j] > mx ? buf[j] : mx;
    for (; s < n; s++) mx = row[s] > mx ? row[s] : mx;
    return mx;
}

/* softmax of row (n floats) in place: exp(x - max) / sum */
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
    for (; s < n; s++) row[s] /= sum; /* divide, as softmax does */
}

/* ---- multi-row attention (kernels.h, attend_rows)
 * Key and value rows come from a source: base + s*ld elements, fp16 bits (kv16) or float32. With an fp16 cache and
 * several rows, the first pass over a tile converts it (exactly: every half is a float) into a float32 tile (rows of
 * hd) while computing with it, and every later (row, head) of the item reads the tile: each half is converted once
 * per item instead of once per query row and head. `keep` is that tile (KEEP = 1), or unused (KEEP = 0). */


/* Scores of one or two query heads (NH; qa, qb) for keys k + j*ld, j < nk <= 4 (NH = 2) or 8 (NH = 1):
 * ra[j] (rb[j]) = (q . k_j) * scale. Eight dot products share one vector sum (sum8); each is an FMA chain over
 * its 8 lanes then the pairwise lane sum, the numbers of the per-token kernel before this one. */
static inline __attribute__((always_inline)) void scores_group(const float *qa, const float *qb, const int NH, int hd,
                                                               const void *k, size_t ld, const int kv16, const int nk,
                                                               float scale, float *ra, float *rb, float *keep,
                                                               const int KEEP) {
    const int per = NH == 2 ? 4 : 8; /* keys per head in the eight accumulators */
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        const __m256 a = _mm256_loadu_ps(qa + d), b = NH == 2 ? _mm256_loadu_ps(qb + d) : a;
#pragma GCC unroll 8
        for (int j = 0; j < per; j++)
            if (j < nk) {
                __m256 kv = load_kv(k, kv16, (size_t)j * ld + d);
                if (NH == 2) KEEP_IN_REGISTER(kv);
                if (KEEP) _mm256_storeu_ps(keep + (size_t)j * hd + d, kv);
                acc[j] = _mm256_fmadd_ps(a, kv, acc[j]);
                if (NH == 2) acc[4 + j] = _mm256_fmadd_ps(b, kv, acc[4 + j]);
            }
    }
    const __m256 v = _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale)); /* NH = 2: [qa . k_0..3 | qb . k_0..3] */
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

/* ra[j] (and rb[j]) for the nk keys k + j*ld of one tile, j < nk */
static inline __attribute__((always_inline)) void scores_run(const float *qa, const float *qb, const int NH, int hd,
                                                             const void *k, size_t ld, const int kv16, int nk,
                                                             float scale, float *ra, float *rb, float *keep,
                                                             const int KEEP) {
    const int per = NH == 2 ? 4 : 8;
    int j = 0;
    for (; j + per <= nk; j += per)
        scores_group(qa, qb, NH, hd, (const char *)k + j * ld * (kv16 ? 2 : 4), ld, kv16, per, scale, ra + j,
                     rb + j, keep + (KEEP ? (size_t)j * hd : 0), KEEP);
    if (j < nk)
        scores_group(qa, qb, NH, hd, (const char *)k + j * ld * (kv16 ? 2 : 4), ld, kv16, nk - j, scale, ra + j,
                     rb + j, keep + (KEEP ? (size_t)j * hd : 0), KEEP);
}

/* oa[c0, c0 + 8*NC) += sum_s pa[s] * v_s over s < n (rows v + s*ld), and the same for ob, pb when NH = 2 (each
 * value row loaded once for both heads). Per column one FMA chain in s order, as one head alone gives it.
 * fresh: the first tile, whose chains start from zero instead of loading oa (which then need not be cleared
 * first: a load right after memset's stores waits for them, ~15% of the attention's time). */
static inline __attribute__((always_inline)) void values_cols(const float *pa, const float *pb, const int NH, int n,
                                                              const void *v, size_t ld, const int kv16, int c0,
                                                              const int NC, float *oa, float *ob, float *keep, int hd,
                                                              const int KEEP, int fresh) {
    __m256 a[6], b[6];
#pragma GCC unroll 6
    for (int c = 0; c < NC; c++) {
        a[c] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(oa + c0 + 8 * c);
        if (NH == 2) b[c] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(ob + c0 + 8 * c);
    }
    for (int s = 0; s < n; s++) {
        const __m256 xa = _mm256_set1_ps(pa[s]), xb = NH == 2 ? _mm256_set1_ps(pb[s]) : xa;
#pragma GCC unroll 6
        for (int c = 0; c < NC; c++) {
            __m256 vv = load_kv(v, kv16, (size_t)s * ld + c0 + 8 * c);
            if (NH == 2) KEEP_IN_REGISTER(vv);
            if (KEEP) _mm256_storeu_ps(keep + (size_t)s * hd + c0 + 8 * c, vv);
            a[c] = _mm256_fmadd_ps(xa, vv, a[c]);
            if (NH == 2) b[c] = _mm256_fmadd_ps(xb, vv, b[c]);
        }
    }
#pragma GCC unroll 6
    for (int c = 0; c < NC; c++) {
        _mm256_storeu_ps(oa + c0 + 8 * c, a[c]);
        if (NH == 2) _mm256_storeu_ps(ob + c0 + 8 * c, b[c]);
    }
}

/* oa += sum_s pa[s] * v_s (and ob with pb when NH = 2) over the n value rows of one tile, all hd columns, 48 at
 * a time (12 accumulators for two heads) */
static inline __attribute__((always_inline)) void values_run(const float *pa, const float *pb, const int NH, int n,
                                                             int hd, const void *v, size_t ld, const int kv16,
                                                             float *oa, float *ob, float *keep, const int KEEP, int fresh) {
    for (int c0 = 0; c0 < hd; c0 += 48) {
        switch ((hd - c0) / 8 < 6 ? (hd - c0) / 8 : 6) {
#define VALUES_CASE(NC) \
    case NC: values_cols(pa, pb, NH, n, v, ld, kv16, c0, NC, oa, ob, keep, hd, KEEP, fresh); break;
            VALUES_CASE(6) VALUES_CASE(5) VALUES_CASE(4) VALUES_CASE(3) VALUES_CASE(2)
            default: values_cols(pa, pb, NH, n, v, ld, kv16, c0, 1, oa, ob, keep, hd, KEEP, fresh); break;
#undef VALUES_CASE
        }
    }
}

/* The multi-row attention. Three passes over the visible keys [0, E), E = the largest end (the last row's), in
 * tiles of KEY_TILE keys, so a tile stays in L1 while every row and head of the item uses it:
 *   1. scores (nr, nq, E): each row for its own keys of the tile (none once past its end)
 *   2. softmax per (row, head) over [0, ends[r])
 *   3. out = p . v, tile by tile (the first tile starts the sums; later tiles carry them on through out, which
 *      changes no bit of them)
 * In passes 1 and 3 the row with the largest end goes first (it sees every key of the tile), with its first head (pair) reading
 * the fp16 cache and keeping the converted tile for the others. */
#define KEY_TILE BN_ATTN_KEY_TILE
static inline __attribute__((always_inline)) void attend_rows_kv(const float *q, size_t ldq, int nr, int nq, int hd,
                                                                 const void *k, const void *v, size_t ld, const int kv16,
                                                                 const int *ends, float scale, float *scratch, float *out,
                                                                 size_t ldo) {
    int last = nr - 1; /* the row with the largest end (the last one: ends are non-decreasing) */
    for (int r = 0; r < nr; r++) last = ends[r] > ends[last] ? r : last;
    const int E = ends[last], conv = kv16 && nr > 1; /* conv: convert each tile once, into `tile` */
    const size_t elem = kv16 ? sizeof(uint16_t) : sizeof(float);
    float *tile = scratch + (size_t)nr * nq * E;
#define SCORES(r, h) (scratch + ((size_t)(r) * nq + (h)) * E)
    for (int s0 = 0; s0 < E; s0 += KEY_TILE) {
        const int n = E - s0 < KEY_TILE ? E - s0 : KEY_TILE;
        const void *src = (const char *)k + (size_t)s0 * ld * elem;
        for (int i = 0; i < nr; i++) {
            const int r = i == 0 ? last : i - 1 + (i - 1 >= last);      /* the last row first */
            const int nk = (ends[r] < s0 + n ? ends[r] : s0 + n) - s0; /* keys of this tile row r sees */
            const float *qr = q + (size_t)r * ldq;
            for (int h = 0; h < nq;) {
                const int two = h + 2 <= nq;
                float *ra = SCORES(r, h) + s0, *rb = two ? SCORES(r, h + 1) + s0 : ra;
                const float *qa = qr + (size_t)h * hd, *qb = two ? qa + hd : qa;
#define SCORES_FROM(NH)                                                                                  \
    if (!conv) scores_run(qa, qb, NH, hd, src, ld, kv16, nk, scale, ra, rb, NULL, 0);                    \
    else if (i == 0 && h == 0) scores_run(qa, qb, NH, hd, src, ld, 1, nk, scale, ra, rb, tile, 1);       \
    else scores_run(qa, qb, NH, hd, tile, (size_t)hd, 0, nk, scale, ra, rb, NULL, 0);
                if (two) { SCORES_FROM(2) } else { SCORES_FROM(1) }
#undef SCORES_FROM
                h += two ? 2 : 1;
            }
        }
    }
    for (int r = 0; r < nr; r++) /* (out is not cleared: the first tile, which every row sees, starts the sums) */
        for (int h = 0; h < nq; h++) softmax_row(SCORES(r, h), ends[r]);
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
    if (!conv) values_run(pa, pb, NH, nk, hd, src, ld, kv16, oa, ob, NULL, 0, s0 == 0);                  \
    else if (i == 0 && h == 0) values_run(pa, pb, NH, nk, hd, src, ld, 1, oa, ob, tile, 1, s0 == 0);     \
    else values_run(pa, pb, NH, nk, hd, tile, (size_t)hd, 0, oa, ob, NULL, 0, s0 == 0);
                if (two) { VALUES_FROM(2) } else { VALUES_FROM(1) }
#undef VALUES_FROM
                h += two ? 2 : 1;
            }
        }
    }
#undef SCORES
}

/* Head sizes that are a multiple of 8 (every real model); others go to forward.c's generic loop. */
static int attend_rows(const float *q, size_t ldq, int nr, int nq, int hd, const void *k, const void *v, size_t ld,
                       int kv16, const int *ends, float scale, float *scratch, float *out, size_t ldo) {
    if (hd % 8 || nr <= 0) return 0;
    for (int r = 0; r < nr; r++)
        if (ends[r] <= 0) return 0;
    if (kv16) attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, 1, ends, scale, scratch, out, ldo);
    else attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, 0, ends, scale, scratch, out, ldo);
    return 1;
}

#endif
