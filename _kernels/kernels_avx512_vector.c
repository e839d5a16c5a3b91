/* AVX-512 elementwise ops (compiled with the AVX512-VNNI flags): kernels.h's per-row entries of the AVX-512 and AMX
 * tables, the tails through masked loads and stores. */
#include "kernels_x86.h"

float bn_avx512_dot(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

void bn_avx512_axpy(float a, const float *x, float *y, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static inline __mmask16 tail_mask(int r) { return (__mmask16)((1u << r) - 1); }

/* in double: the norm's scale then matches a float64 mean to the last bit almost always, so all paths
 * quantize the normed activations the same way (a rounding flip moves a whole row of the next layer) */
float bn_avx512_sumsq(const float *x, int n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int i = 0;
    for (; i < n; i += 16) {
        const __m512 v = i + 16 <= n ? _mm512_loadu_ps(x + i) : _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    return (float)_mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

float bn_avx512_absmax(const float *x, int n) {
    __m512 m = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    if (i < n) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i)));
    return _mm512_reduce_max_ps(m);
}

int32_t bn_avx512_quantize(const float *x, int n, int np, float scale, int8_t *q) {
    const __m512 sc = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int i = 0; i < np; i += 16) { /* np is a multiple of 16; lanes past n are zero */
        const __mmask16 m = i + 16 <= n ? 0xFFFF : (i < n ? tail_mask(n - i) : 0);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sc);
        v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); /* half to even */
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        const __m512i qi = _mm512_cvtps_epi32(v);
        sum = _mm512_add_epi32(sum, qi);
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(qi));
    }
    return _mm512_reduce_add_epi32(sum);
}

void bn_avx512_norm_apply(const float *x, float inv, const float *w, float *out, int n) {
    const __m512 vi = _mm512_set1_ps(inv);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), vi)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i),
                                                         _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vi)));
    }
}

/* quant8(rmsnorm(x) * w) (kernels.h norm_quant): layer.c's composition of sumsq, norm_apply, absmax and quantize,
 * the same operations in the same order (so the same numbers), with norm_apply and absmax in one pass. */
int32_t bn_avx512_norm_quant(const float *x, const float *w, int n, int np, float eps, float *xn, int8_t *q, float *xinv) {
    const float inv = 1.0f / sqrtf(bn_avx512_sumsq(x, n) / (float)n + eps);
    const __m512 vi = _mm512_set1_ps(inv);
    __m512 mv = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), vi));
        _mm512_storeu_ps(xn + i, v);
        mv = _mm512_max_ps(mv, _mm512_abs_ps(v));
    }
    if (i < n) { /* lanes past n are zero: |0| leaves the max alone */
        const __mmask16 m = tail_mask(n - i);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vi));
        _mm512_mask_storeu_ps(xn + i, m, v);
        mv = _mm512_max_ps(mv, _mm512_abs_ps(v));
    }
    float m = _mm512_reduce_max_ps(mv);
    if (m < 1e-5f) m = 1e-5f;
    const float scale = 127.0f / m;
    *xinv = 1.0f / scale;
    return bn_avx512_quantize(xn, n, np, scale, q);
}

void bn_avx512_relu2_mul(const float *g, const float *u, float *out, int n) {
    const __m512 zero = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 r = _mm512_max_ps(_mm512_loadu_ps(g + i), zero);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(r, r), _mm512_loadu_ps(u + i)));
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 r = _mm512_max_ps(_mm512_maskz_loadu_ps(m, g + i), zero);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(r, r), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

void bn_avx512_add(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
    }
}

void bn_avx512_to_f16(const float *x, uint16_t *h, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(h + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(h + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

static inline __m512 load_f16(const uint16_t *h, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h));
}

float bn_avx512_dot_f16(const float *a, const uint16_t *h, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load_f16(h + i, 0xFFFF), acc);
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load_f16(h + i, m), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

void bn_avx512_axpy_f16(float a, const uint16_t *h, float *y, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load_f16(h + i, 0xFFFF), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, load_f16(h + i, m), _mm512_maskz_loadu_ps(m, y + i)));
    }
}
