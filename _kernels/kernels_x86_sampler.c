/* The row passes of every x86 path over a logit row (kernels.h max_first, expsum: the greedy confidence, greedy.c;
 * exp_shifted, scale_row, select_at_least: the sampler, sample.c), in AVX2 (compiled with -mavx2 -mfma -mf16c). */
#include "kernels_x86.h"

/* The greedy confidence (kernels.h): the largest of a row (row_max), then its first index; the float32
 * exponentials (exp_nonpos, as the attention's softmax) summed in double, sixteen at a time in four sums. */
float bn_x86_max_first(const float *x, int n, int *arg) {
    const float mx = row_max(x, n);
    const __m256 vmx = _mm256_set1_ps(mx);
    int i, a;
    for (i = 0; i + 8 <= n; i += 8) { /* the first index holding the max */
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vmx, _CMP_EQ_OQ));
        if (hit) {
            *arg = i + __builtin_ctz((unsigned)hit);
            return mx;
        }
    }
    for (a = i; a < n && !(x[a] == mx); a++) {}
    *arg = a < n ? a : 0; /* none equal: every entry NaN */
    return a < n ? mx : x[0];
}

static inline __m256d exps_to_double(__m256d s, __m128 e) { return _mm256_add_pd(s, _mm256_cvtps_pd(e)); }

double bn_x86_expsum(const float *x, int n, float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 e0 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
        const __m256 e1 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vmx));
        s0 = exps_to_double(s0, _mm256_castps256_ps128(e0));
        s1 = exps_to_double(s1, _mm256_extractf128_ps(e0, 1));
        s2 = exps_to_double(s2, _mm256_castps256_ps128(e1));
        s3 = exps_to_double(s3, _mm256_extractf128_ps(e1, 1));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i += 8) { /* the tail through padded vectors, so every entry goes through the same exp */
        float buf[8];
        for (int j = 0; j < 8; j++) buf[j] = i + j < n ? x[i + j] - mx : -INFINITY;
        _mm256_storeu_ps(buf, exp_nonpos(_mm256_loadu_ps(buf)));
        for (int j = 0; j < 8 && i + j < n; j++) sum += (double)buf[j];
    }
    return sum;
}

/* exp(x) in double for x in [-708, 0]: exp(x) = 2^k exp(r) with k = round(x / ln 2) and r = x - k ln 2 (ln 2 in two
 * parts, fdlibm's: k * LN2_HI is exact for |k| < 2^11), |r| <= 0.347; exp(r) = 1 + (r + r^2 P(r)) with P the Taylor
 * series to r^11/13! (its remainder r^14/14! < 5e-18, far below an ulp), evaluated by Estrin's scheme (a chain of
 * 4 FMAs, not 11), so the result is within ~1 ulp of libm's. */
static inline __m256d exp_pd(__m256d x) {
    const __m256d magic = _mm256_set1_pd(6755399441055744.0); /* 1.5 * 2^52: x + magic rounds x to an integer */
    const __m256d kk = _mm256_fmadd_pd(x, _mm256_set1_pd(1.4426950408889634), magic); /* k in the low bits */
    const __m256d k = _mm256_sub_pd(kk, magic);
    const __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.90821492927058770002e-10),
                                       _mm256_fnmadd_pd(k, _mm256_set1_pd(6.93147180369123816490e-01), x));
#define C(n) _mm256_set1_pd(1.0 / (n))
    const __m256d r2 = _mm256_mul_pd(r, r), r4 = _mm256_mul_pd(r2, r2), r8 = _mm256_mul_pd(r4, r4);
    const __m256d p01 = _mm256_fmadd_pd(C(6), r, C(2)), p23 = _mm256_fmadd_pd(C(120), r, C(24));
    const __m256d p45 = _mm256_fmadd_pd(C(5040), r, C(720)), p67 = _mm256_fmadd_pd(C(362880), r, C(40320));
    const __m256d p89 = _mm256_fmadd_pd(C(39916800), r, C(3628800));
    const __m256d pab = _mm256_fmadd_pd(C(6227020800.0), r, C(479001600));
#undef C
    const __m256d p03 = _mm256_fmadd_pd(p23, r2, p01), p47 = _mm256_fmadd_pd(p67, r2, p45);
    const __m256d p8b = _mm256_fmadd_pd(pab, r2, p89);
    const __m256d p = _mm256_fmadd_pd(p8b, r8, _mm256_fmadd_pd(p47, r4, p03));
    const __m256d e = _mm256_add_pd(_mm256_set1_pd(1.0), _mm256_fmadd_pd(r2, p, r));
    const __m256i two_k = _mm256_slli_epi64(
        _mm256_add_epi64(_mm256_sub_epi64(_mm256_castpd_si256(kk), _mm256_castpd_si256(magic)),
                         _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(e, _mm256_castsi256_pd(two_k));
}

/* w[i] = exp(z[i] - top) and their sum, for the sampler's weights (kernels.h), eight at a time in two sums. Groups
 * of eight with an x = z - top below -708 (2^k would leave the normal range; -inf, a banned id, is one) or NaN are
 * noted and redone with libm's exp after the loop, which then has no call in it (a call would make every vector
 * register spill); the sum is then taken again. */
#define EXP_REDO_GROUPS 16
double bn_x86_exp_shifted(const double *z, double top, double *w, int n) {
    const __m256d vtop = _mm256_set1_pd(top), lo = _mm256_set1_pd(-708.0);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int redo[EXP_REDO_GROUPS], n_redo = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d x0 = _mm256_sub_pd(_mm256_loadu_pd(z + i), vtop);
        const __m256d x1 = _mm256_sub_pd(_mm256_loadu_pd(z + i + 4), vtop);
        const __m256d out = _mm256_or_pd(_mm256_cmp_pd(x0, lo, _CMP_NGE_UQ), _mm256_cmp_pd(x1, lo, _CMP_NGE_UQ));
        if (_mm256_movemask_pd(out)) redo[n_redo < EXP_REDO_GROUPS ? n_redo : EXP_REDO_GROUPS - 1] = i, n_redo++;
        const __m256d w0 = exp_pd(_mm256_max_pd(x0, lo)), w1 = exp_pd(_mm256_max_pd(x1, lo)); /* NaN -> lo */
        _mm256_storeu_pd(w + i, w0);
        _mm256_storeu_pd(w + i + 4, w1);
        s0 = _mm256_add_pd(s0, w0);
        s1 = _mm256_add_pd(s1, w1);
    }
    const int vec_end = i;
    for (; i < n; i++) w[i] = exp(z[i] - top);
    if (n_redo) { /* rare: those groups with libm (every group when there were too many to note), then the sum */
        for (int g = 0; g < (n_redo <= EXP_REDO_GROUPS ? n_redo : vec_end / 8); g++) {
            const int j0 = n_redo <= EXP_REDO_GROUPS ? redo[g] : 8 * g;
            for (int j = j0; j < j0 + 8; j++)
                if (!(z[j] - top >= -708.0)) w[j] = exp(z[j] - top);
        }
        s0 = s1 = _mm256_setzero_pd();
        for (int j = 0; j < vec_end; j += 8) {
            s0 = _mm256_add_pd(s0, _mm256_loadu_pd(w + j));
            s1 = _mm256_add_pd(s1, _mm256_loadu_pd(w + j + 4));
        }
    }
    double c[4];
    _mm256_storeu_pd(c, _mm256_add_pd(s0, s1));
    for (int j = vec_end; j < n; j++) c[j & 3] += w[j];
    return (c[0] + c[1]) + (c[2] + c[3]);
}

/* The sampler's first pass (kernels.h): z = x * inv_t, four at a time; the largest by _mm256_max_pd (which keeps the
 * running max when an entry is NaN, as `v > t ? v : t` does), the counts in 64-bit lanes (a true compare is -1). */
double bn_x86_scale_row(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad) {
    const __m256d vt = _mm256_set1_pd(inv_t), ninf = _mm256_set1_pd(-INFINITY), zero = _mm256_setzero_pd();
    __m256d t0 = ninf, t1 = ninf;
    __m256i neg = _mm256_setzero_si256(), bad = _mm256_setzero_si256();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d v0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), vt);
        const __m256d v1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)), vt);
        _mm256_storeu_pd(z + i, v0);
        _mm256_storeu_pd(z + i + 4, v1);
        t0 = _mm256_max_pd(v0, t0);
        t1 = _mm256_max_pd(v1, t1);
        neg = _mm256_sub_epi64(neg, _mm256_castpd_si256(_mm256_cmp_pd(v0, ninf, _CMP_EQ_OQ)));
        neg = _mm256_sub_epi64(neg, _mm256_castpd_si256(_mm256_cmp_pd(v1, ninf, _CMP_EQ_OQ)));
        /* v - v is 0 for a finite v, NaN for NaN and +-inf */
        bad = _mm256_sub_epi64(bad, _mm256_castpd_si256(_mm256_cmp_pd(_mm256_sub_pd(v0, v0), zero, _CMP_NEQ_UQ)));
        bad = _mm256_sub_epi64(bad, _mm256_castpd_si256(_mm256_cmp_pd(_mm256_sub_pd(v1, v1), zero, _CMP_NEQ_UQ)));
    }
    double t[8];
    int64_t cn[4], cb[4];
    _mm256_storeu_pd(t, t0);
    _mm256_storeu_pd(t + 4, t1);
    _mm256_storeu_si256((__m256i *)cn, neg);
    _mm256_storeu_si256((__m256i *)cb, bad);
    double top = -INFINITY;
    for (int j = 0; j < 8; j++) top = t[j] > top ? t[j] : top;
    int64_t nn = cn[0] + cn[1] + cn[2] + cn[3], nb = cb[0] + cb[1] + cb[2] + cb[3];
    for (; i < n; i++) {
        const double v = (double)x[i] * inv_t;
        z[i] = v;
        top = v > top ? v : top;
        nn += v == -INFINITY;
        nb += !(v - v == 0.0);
    }
    *n_neginf = (int)nn;
    *n_bad = (int)(nb - nn); /* -inf counted in both */
    return top;
}

/* The j with w[j] >= t, ascending, into out (kernels.h): eight at a time, most eights with none. */
int bn_x86_select_at_least(const double *w, int n, double t, int *out) {
    const __m256d vt = _mm256_set1_pd(t);
    int m = 0, j = 0;
    for (; j + 8 <= n; j += 8) {
        unsigned hit = (unsigned)(_mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(w + j), vt, _CMP_GE_OQ)) |
                                  _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(w + j + 4), vt, _CMP_GE_OQ)) << 4);
        for (; hit; hit &= hit - 1) out[m++] = j + __builtin_ctz(hit);
    }
    for (; j < n; j++)
        if (w[j] >= t) out[m++] = j;
    return m;
}
