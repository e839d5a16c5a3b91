/* AVX2 elementwise ops (compiled with -mavx2 -mfma -mf16c): kernels.h's per-row entries of the AVX2 table and of
 * the tables built on it (AVX-VNNI, the emulated paths); silu_mul serves the AVX-512 tables too. Each tail goes
 * through the same arithmetic as the vectors (or the plain loop that gives the same numbers), so a row's result
 * does not depend on its length. */
#include "kernels_x86.h"

float bn_avx2_dot(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum256(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void bn_avx2_axpy(float a, const float *x, float *y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* in double, like the other paths (see kernels_avx512_vector.c) */
float bn_avx2_sumsq(const float *x, int n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    __m256d a = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double s = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++) s += (double)x[i] * x[i];
    return (float)s;
}

float bn_avx2_absmax(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        r = a > r ? a : r;
    }
    return r;
}

int32_t bn_avx2_quantize(const float *x, int n, int np, float scale, int8_t *q) {
    const __m256 sc = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
    __m256i sum = _mm256_setzero_si256();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sc), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i qi = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
        sum = _mm256_add_epi32(sum, qi);
        const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
        const __m128i w8 = _mm_packs_epi16(w16, w16);
        _mm_storel_epi64((__m128i *)(q + i), w8);
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    int32_t s = _mm_cvtsi128_si32(s4);
    for (; i < n; i++) {
        float r = nearbyintf(x[i] * scale);
        r = r > 127.0f ? 127.0f : (r < -128.0f ? -128.0f : r);
        q[i] = (int8_t)r;
        s += q[i];
    }
    for (; i < np; i++) q[i] = 0;
    return s;
}

void bn_avx2_norm_apply(const float *x, float inv, const float *w, float *out, int n) {
    const __m256 vi = _mm256_set1_ps(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), vi)));
    for (; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

void bn_avx2_relu2_mul(const float *g, const float *u, float *out, int n) {
    const __m256 zero = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 r = _mm256_max_ps(_mm256_loadu_ps(g + i), zero);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(r, r), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        const float r = g[i] > 0.0f ? g[i] : 0.0f;
        out[i] = (r * r) * u[i];
    }
}

void bn_avx2_add(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

/* F16C conversions; tails go through an 8-element buffer so every value is converted the same way */
void bn_avx2_to_f16(const float *x, uint16_t *h, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        float buf[8] = {0};
        uint16_t out[8];
        memcpy(buf, x + i, sizeof(float) * (size_t)(n - i));
        _mm_storeu_si128((__m128i *)out, _mm256_cvtps_ph(_mm256_loadu_ps(buf), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        memcpy(h + i, out, sizeof(uint16_t) * (size_t)(n - i));
    }
}

static inline __m256 load_f16_tail(const uint16_t *h, int r) {
    uint16_t buf[8] = {0};
    memcpy(buf, h, sizeof(uint16_t) * (size_t)r);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)buf));
}

float bn_avx2_dot_f16(const float *a, const uint16_t *h, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))), acc);
    float s = hsum256(acc);
    if (i < n) {
        float hv[8];
        _mm256_storeu_ps(hv, load_f16_tail(h + i, n - i));
        for (int j = 0; j < n - i; j++) s += a[i + j] * hv[j];
    }
    return s;
}

void bn_avx2_axpy_f16(float a, const uint16_t *h, float *y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))), _mm256_loadu_ps(y + i)));
    if (i < n) {
        float hv[8];
        _mm256_storeu_ps(hv, load_f16_tail(h + i, n - i));
        for (int j = 0; j < n - i; j++) y[i + j] += a * hv[j];
    }
}

/* ---------------------------------------------------------------- fused steps (kernels.h's optional entries) */

/* quant8(rmsnorm(x) * w): the operations of layer.c's composition, in the same order (so the same
 * numbers), with norm_apply and absmax sharing one pass. */
int32_t bn_avx2_norm_quant(const float *x, const float *w, int n, int np, float eps, float *xn, int8_t *q, float *xinv) {
    const float inv = 1.0f / sqrtf(bn_avx2_sumsq(x, n) / (float)n + eps);
    const __m256 vi = _mm256_set1_ps(inv), sign = _mm256_set1_ps(-0.0f);
    __m256 mv = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), vi));
        _mm256_storeu_ps(xn + i, v);
        mv = _mm256_max_ps(mv, _mm256_andnot_ps(sign, v));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float m = _mm_cvtss_f32(h);
    for (; i < n; i++) {
        xn[i] = w[i] * (x[i] * inv);
        const float a = xn[i] < 0.0f ? -xn[i] : xn[i];
        m = a > m ? a : m;
    }
    if (m < 1e-5f) m = 1e-5f;
    const float scale = 127.0f / m;
    *xinv = 1.0f / scale;
    return bn_avx2_quantize(xn, n, np, scale, q);
}

/* out = silu(g) * u with silu(g) = g * sigmoid(g): with z = e^-|g| (exp_nonpos), sigmoid(g) = 1 / (1 + z) for
 * g >= 0 and z / (1 + z) for g < 0, so the exponential never overflows. Relative error about 1e-7, as expf. */
void bn_avx2_silu_mul(const float *g, const float *u, float *out, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 z = exp_nonpos(_mm256_or_ps(x, sign)); /* e^-|x| */
        const __m256 num = _mm256_blendv_ps(one, z, x);     /* the sign bit of x picks z */
        const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, z));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + i)));
    }
    if (i < n) { /* the tail through one padded vector, so every element takes the same path */
        float gb[8] = {0}, ub[8] = {0}, ob[8];
        memcpy(gb, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(ub, u + i, sizeof(float) * (size_t)(n - i));
        bn_avx2_silu_mul(gb, ub, ob, 8);
        memcpy(out + i, ob, sizeof(float) * (size_t)(n - i));
    }
}
