/* AVX512-VNNI kernels (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma).
 *
 * Ternary: one 64-byte load holds a 16-row x 16-column tile of 2-bit codes. Shifting by 2s and masking
 * gives four registers, each 16 int32 lanes = 16 rows x 4 consecutive columns, so `vpdpbusd`
 * (u8 codes x s8 activations broadcast 4 bytes at a time) accumulates one row per lane with no
 * horizontal sums. A tile is unpacked once per block of up to 16 tokens and reused for all of them.
 * Small blocks split each token's sum over several accumulators to hide the vpdpbusd latency.
 *
 * Int8 head: each 64-byte group is 16 rows x 4 columns of s8 weights; activations are offset to u8
 * (x ^ 0x80 == x + 128), so the sum carries 128 * rowsum[n], removed at the end.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

#define PREFETCH_BYTES 2048 /* stream distance: 32 cache lines ahead of the tile being read */

static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Accumulators per token: more when the block is small (to hide the vpdpbusd latency), one when large
 * (registers). RT row tiles x BT tokens x NA accumulators <= 16 of the 32 zmm registers. */
#define ACCS_PER_TOKEN(bt) ((bt) <= 2 ? 4 : (bt) <= 4 ? 2 : 1)

/* RT (1 or 2) consecutive row tiles x BT tokens: each 4-byte activation broadcast feeds RT dot products. */
static inline __attribute__((always_inline)) void ternary_block(
    const uint8_t *wt, int groups, const int8_t *x, int kp, const int rt, const int bt, const float *row_scale,
    const int32_t *xsum, const float *xinv, float *y, int ldy) {
    const int na = rt == 1 ? ACCS_PER_TOKEN(bt) : (bt <= 4 ? 2 : 1);
    const __m512i m3 = _mm512_set1_epi8(3);
    const size_t tile_bytes = (size_t)groups * 64;
    __m512i acc[2][16];
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
        for (int a = 0; a < 16; a++) acc[r][a] = _mm512_setzero_si512();
    for (int g = 0; g < groups; g++) {
        __m512i w[2][4];
#pragma GCC unroll 2
        for (int r = 0; r < rt; r++) {
            const uint8_t *p = wt + r * tile_bytes + g * 64;
            _mm_prefetch((const char *)(p + PREFETCH_BYTES), _MM_HINT_T0);
            if (bt == 1) _mm_prefetch((const char *)(p + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1); /* decode: L2 too (kernels.h) */
            const __m512i v = _mm512_loadu_si512((const void *)p);
            w[r][0] = _mm512_and_si512(v, m3);
            w[r][1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), m3);
            w[r][2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m3);
            w[r][3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), m3);
        }
#pragma GCC unroll 16
        for (int b = 0; b < bt; b++) {
            const int8_t *xg = x + (size_t)b * kp + g * 16;
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                const __m512i xb = _mm512_set1_epi32(load_i32(xg + 4 * s));
                const int a = b * na + (s % na);
#pragma GCC unroll 2
                for (int r = 0; r < rt; r++) acc[r][a] = _mm512_dpbusd_epi32(acc[r][a], w[r][s], xb);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < rt; r++) {
        const __m512 scale = _mm512_loadu_ps(row_scale + 16 * r);
#pragma GCC unroll 16
        for (int b = 0; b < bt; b++) {
            __m512i sum = acc[r][b * na];
#pragma GCC unroll 4
            for (int a = 1; a < na; a++) sum = _mm512_add_epi32(sum, acc[r][b * na + a]);
            sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(xsum[b]));
            const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xinv[b])), scale);
            _mm512_storeu_ps(y + (size_t)b * ldy + 16 * r, v);
        }
    }
}

/* Token blocks: one token alone (decode, memory-bound); otherwise blocks of 8 then the remainder. */
#define DISPATCH_BLOCKS(CALL, RT)                                     \
    for (int t0 = 0; t0 < T;) {                                       \
        int bt = T - t0 >= 8 ? 8 : T - t0;                            \
        switch (bt) {                                                 \
            case 8: CALL(RT, 8); break;                               \
            case 7: CALL(RT, 7); break;                               \
            case 6: CALL(RT, 6); break;                               \
            case 5: CALL(RT, 5); break;                               \
            case 4: CALL(RT, 4); break;                               \
            case 3: CALL(RT, 3); break;                               \
            case 2: CALL(RT, 2); break;                               \
            default: CALL(RT, 1); break;                              \
        }                                                             \
        t0 += bt;                                                     \
    }

static void ternary_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                           const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    const int groups = kp / 16;
#define TERNARY_CALL(RT, BT)                                                                          \
    ternary_block(codes + (size_t)tile * groups * 64, groups, xq + (size_t)t0 * kp, kp, RT, BT,        \
                  row_scale + tile * 16, xsum + t0, xinv + t0, y + (size_t)t0 * ldy + tile * 16, ldy)
    int tile = n0 / 16;
    if (T > 1) /* pairs of row tiles share each activation broadcast */
        for (; tile + 2 <= n1 / 16; tile += 2) { DISPATCH_BLOCKS(TERNARY_CALL, 2) }
    for (; tile < n1 / 16; tile++) { DISPATCH_BLOCKS(TERNARY_CALL, 1) }
#undef TERNARY_CALL
}

static inline __attribute__((always_inline)) void int8_block(
    const int8_t *wt, int groups, const int8_t *x, int kp, const int bt, const float *row_scale,
    const int32_t *rowsum, const float *xinv, float *y, int ldy) {
    const int na = bt <= 4 ? 4 : 2; /* bt * na <= 16 accumulators; one vpdpbusd per group and token */
    __m512i acc[16];
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_si512();
    for (int g = 0; g < groups; g += 4) { /* groups = Kp/4 is a multiple of 4 */
        _mm_prefetch((const char *)(wt + g * 64 + PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + PREFETCH_BYTES + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + PREFETCH_BYTES + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + PREFETCH_BYTES + 192), _MM_HINT_T0);
        __m512i w[4];
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) w[s] = _mm512_loadu_si512((const void *)(wt + (g + s) * 64));
#pragma GCC unroll 16
        for (int b = 0; b < bt; b++) {
            const int8_t *xg = x + (size_t)b * kp + g * 4;
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                const int a = b * na + (s % na);
                const __m512i xu8 = _mm512_set1_epi32(load_i32(xg + 4 * s) ^ (int32_t)0x80808080);
                acc[a] = _mm512_dpbusd_epi32(acc[a], xu8, w[s]);
            }
        }
    }
    const __m512 scale = _mm512_loadu_ps(row_scale);
    const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512((const void *)rowsum), 7); /* 128 * rowsum */
#pragma GCC unroll 16
    for (int b = 0; b < bt; b++) {
        __m512i sum = acc[b * na];
#pragma GCC unroll 4
        for (int a = 1; a < na; a++) sum = _mm512_add_epi32(sum, acc[b * na + a]);
        sum = _mm512_sub_epi32(sum, offset);
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xinv[b])), scale);
        _mm512_storeu_ps(y + (size_t)b * ldy, v);
    }
}

static void int8_matmul(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                        const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    const int groups = kp / 4;
    for (int tile = n0 / 16; tile < n1 / 16; tile++) {
        const int8_t *wt = w + (size_t)tile * groups * 64;
#define INT8_CALL(RT, BT)                                                                             \
    int8_block(wt, groups, xq + (size_t)t0 * kp, kp, BT, row_scale + tile * 16, rowsum + tile * 16, xinv + t0, \
               y + (size_t)t0 * ldy + tile * 16, ldy)
        DISPATCH_BLOCKS(INT8_CALL, 1)
#undef INT8_CALL
    }
}

/* 16 bf16 values -> 16 floats (bf16 is the top half of a float). */
static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void bf16_matmul(const uint16_t *w, int k, const float *x, int T, int n0, int n1, float *y, int ldy) {
    const __mmask16 tail = (__mmask16)((1u << (k % 16)) - 1);
    for (int n = n0; n < n1; n++) {
        const uint16_t *row = w + (size_t)n * k;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * k;
            __m512 acc = _mm512_setzero_ps();
            int i = 0;
            for (; i + 16 <= k; i += 16) acc = _mm512_fmadd_ps(load_bf16(row + i, 0xFFFF), _mm512_loadu_ps(xt + i), acc);
            if (tail) acc = _mm512_fmadd_ps(load_bf16(row + i, tail), _mm512_maskz_loadu_ps(tail, xt + i), acc);
            y[(size_t)t * ldy + n] = _mm512_reduce_add_ps(acc);
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static void axpy(float a, const float *x, float *y, int n) {
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
static float sumsq(const float *x, int n) {
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

static float absmax(const float *x, int n) {
    __m512 m = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    if (i < n) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i)));
    return _mm512_reduce_max_ps(m);
}

static int32_t quantize(const float *x, int n, int np, float scale, int8_t *q) {
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

static void norm_apply(const float *x, float inv, const float *w, float *out, int n) {
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

static void relu2_mul(const float *g, const float *u, float *out, int n) {
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

static void add(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
    }
}

static void to_f16(const float *x, uint16_t *h, int n) {
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

static float dot_f16(const float *a, const uint16_t *h, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load_f16(h + i, 0xFFFF), acc);
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load_f16(h + i, m), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static void axpy_f16(float a, const uint16_t *h, float *y, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load_f16(h + i, 0xFFFF), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, load_f16(h + i, m), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

const bn_kernels bn_kernels_avx512 = {"avx512", ternary_matmul, int8_matmul, bf16_matmul, dot, axpy,
                                      sumsq, absmax, quantize, norm_apply, relu2_mul, add,
                                      to_f16, dot_f16, axpy_f16};
