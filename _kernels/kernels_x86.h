/* What the x86 kernel files share: SIMD helpers, prefetch distances, the token-block macros, and the entries that
 * one file defines for the tables of several paths.
 *
 *   kernels_avx2.c             AVX2 products (2-bit, 1.6-bit, int8, bf16) and the AVX2 table
 *   kernels_avx2_vector.c      AVX2 elementwise ops (norms, quant8, fp16, silu): bn_avx2_*
 *   kernels_x86_attention.c    the multi-row attention of every x86 path: bn_x86_attend_rows
 *   kernels_x86_sampler.c      the greedy confidence's and the sampler's row passes of every x86 path: bn_x86_*
 *   kernels_avx512.c           AVX512-VNNI products and the AVX-512 table
 *   kernels_avx512_vector.c    AVX-512 elementwise ops: bn_avx512_*
 *   kernels_avxvnni.c, kernels_amx.c   two matmuls each on top of the AVX2 / AVX-512 tables (dispatch.c)
 * The 256-bit helpers need -mavx2 -mfma (every x86 file's flags imply them, setup.py).
 */
#ifndef BITNET_KERNELS_X86_H
#define BITNET_KERNELS_X86_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* ---------------------------------------------------------------- constants */

/* Prefetch distances of the weight streams (bytes ahead of the 64-byte group being read), into L1. One token
 * (decode, memory-bound) reads each line once: BN_STREAM_PREFETCH_BYTES, plus BN_FAR_PREFETCH_BYTES into L2
 * (kernels.h). A block of tokens spends longer on each line: BN_BLOCK_PREFETCH_BYTES. */
#define BN_STREAM_PREFETCH_BYTES 2048
#define BN_BLOCK_PREFETCH_BYTES 1024

/* ---------------------------------------------------------------- helpers */

/* A value the compiler must hold in a register as it is at this point (an empty asm that "changes" it): stops
 * GCC from folding one load into two instructions, or from regrouping a sum in a way that needs more registers
 * than AVX2 has (it then spills accumulators to the stack inside the hot loop). */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

/* 4 bytes at p (any alignment) as one int32: 4 int8 activations to broadcast */
static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

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

/* max of row (n floats; -inf when n = 0 or every entry is NaN: a NaN entry keeps the running max, as the scalar
 * `x > mx ? x : mx` does), in four running maxima (one would wait for each max before the next) */
static inline float row_max(const float *row, int n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int s = 0;
    for (; s + 32 <= n; s += 32) { /* max_ps(a, b) is b when either is NaN: the entry goes first */
        m0 = _mm256_max_ps(_mm256_loadu_ps(row + s), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(row + s + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(row + s + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(row + s + 24), m3);
    }
    for (; s + 8 <= n; s += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(row + s), m0);
    float buf[8];
    _mm256_storeu_ps(buf, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    float mx = buf[0];
    for (int j = 1; j < 8; j++) mx = buf[j] > mx ? buf[j] : mx;
    for (; s < n; s++) mx = row[s] > mx ? row[s] : mx;
    return mx;
}

/* ---------------------------------------------------------------- tokens in blocks
 *
 * T tokens are taken in blocks of up to TOKENS_PER_BLOCK, and CALL(BT) runs one block with its size BT a
 * compile-time constant, so that the kernels' per-token loops unroll and their accumulators stay in registers.
 * Expects T (tokens) in scope and gives CALL t0 (the block's first token). */
#define TOKENS_PER_BLOCK 8

/* One block of bt tokens (1..TOKENS_PER_BLOCK) with BT a compile-time constant: CALL(BT) */
#define SWITCH_BLOCK(CALL, bt)                                                       \
    switch (bt) {                                                                    \
        case 8: CALL(8); break;                                                      \
        case 7: CALL(7); break;                                                      \
        case 6: CALL(6); break;                                                      \
        case 5: CALL(5); break;                                                      \
        case 4: CALL(4); break;                                                      \
        case 3: CALL(3); break;                                                      \
        case 2: CALL(2); break;                                                      \
        default: CALL(1); break;                                                     \
    }

/* The blocks of tokens [first, T): t0 the block's first token */
#define DISPATCH_BLOCKS_FROM(CALL, first)                                            \
    for (int t0 = (first); t0 < T;) {                                                \
        const int bt = T - t0 >= TOKENS_PER_BLOCK ? TOKENS_PER_BLOCK : T - t0;       \
        SWITCH_BLOCK(CALL, bt)                                                       \
        t0 += bt;                                                                    \
    }
#define DISPATCH_BLOCKS(CALL) DISPATCH_BLOCKS_FROM(CALL, 0)

/* A batch of 1.6-bit tiles whose first block of tokens unpacks the codes as it multiplies (and keeps them in the
 * thread's buffer) and whose later blocks multiply the kept codes: FIRST(BT) for tokens [0, first), then
 * LATER(BT) for each block from t0 = first. */
#define FIRST_THEN_LATER_BLOCKS(FIRST, LATER, first) \
    SWITCH_BLOCK(FIRST, first)                       \
    DISPATCH_BLOCKS_FROM(LATER, first)

/* y (bt tokens x 8 rows of one half of a row tile, row b at y + b * ldy) = (acc[b] - xsum[b]) * xinv[b] * row_scale
 * for the int32 sums acc of a ternary block of tokens (the 256-bit kernels' common last step) */
static inline __attribute__((always_inline)) void store_half_rows(const __m256i *acc, const int bt,
                                                                  const float *row_scale, const int32_t *xsum,
                                                                  const float *xinv, float *y, int ldy) {
    const __m256 scale = _mm256_loadu_ps(row_scale);
#pragma GCC unroll 8
    for (int b = 0; b < bt; b++) {
        const __m256i sum = _mm256_sub_epi32(acc[b], _mm256_set1_epi32(xsum[b]));
        const __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(xinv[b])), scale);
        _mm256_storeu_ps(y + (size_t)b * ldy, v);
    }
}

/* ---------------------------------------------------------------- entries shared between tables */

/* Hidden: not interposable, so a file's own calls to them (norm_quant's sumsq and quantize) stay inlinable as calls
 * to static functions are, and no call goes through the PLT. */
#define BN_X86_ENTRY __attribute__((visibility("hidden")))

/* The elementwise entries of one instruction set's vector file, named P##entry (kernels.h's entries of the same
 * names): their declarations, and their designated initializers for a table */
#define BN_DECLARE_VECTOR_OPS(P)                                                                               \
    BN_X86_ENTRY float P##dot(const float *a, const float *b, int n);                                         \
    BN_X86_ENTRY void P##axpy(float a, const float *x, float *y, int n);                                      \
    BN_X86_ENTRY float P##sumsq(const float *x, int n);                                                       \
    BN_X86_ENTRY float P##absmax(const float *x, int n);                                                      \
    BN_X86_ENTRY int32_t P##quantize(const float *x, int n, int np, float scale, int8_t *q);                  \
    BN_X86_ENTRY void P##norm_apply(const float *x, float inv, const float *w, float *out, int n);            \
    BN_X86_ENTRY void P##relu2_mul(const float *g, const float *u, float *out, int n);                        \
    BN_X86_ENTRY void P##add(float *y, const float *x, int n);                                                \
    BN_X86_ENTRY void P##to_f16(const float *x, uint16_t *h, int n);                                          \
    BN_X86_ENTRY float P##dot_f16(const float *a, const uint16_t *h, int n);                                  \
    BN_X86_ENTRY void P##axpy_f16(float a, const uint16_t *h, float *y, int n);                               \
    BN_X86_ENTRY int32_t P##norm_quant(const float *x, const float *w, int n, int np, float eps, float *xn,   \
                                       int8_t *q, float *xinv);
#define BN_VECTOR_ENTRIES(P)                                                                                     \
    .dot = P##dot, .axpy = P##axpy, .sumsq = P##sumsq, .absmax = P##absmax, .quantize = P##quantize,            \
    .norm_apply = P##norm_apply, .relu2_mul = P##relu2_mul, .add = P##add, .to_f16 = P##to_f16,                 \
    .dot_f16 = P##dot_f16, .axpy_f16 = P##axpy_f16, .norm_quant = P##norm_quant

BN_DECLARE_VECTOR_OPS(bn_avx2_)   /* kernels_avx2_vector.c */
BN_DECLARE_VECTOR_OPS(bn_avx512_) /* kernels_avx512_vector.c */
/* kernels_avx2_vector.c: kernels.h silu_mul (every x86 table's) */
BN_X86_ENTRY void bn_avx2_silu_mul(const float *g, const float *u, float *out, int n);

/* kernels_x86_attention.c: kernels.h attend_rows (AVX2, head sizes a multiple of 8) */
BN_X86_ENTRY int bn_x86_attend_rows(const float *q, size_t ldq, int nr, int nq, int hd, const void *k, const void *v,
                                    size_t ld, int kv, const float *ks, const float *vs, const int *ends, int c0,
                                    int c1, float scale, float *scratch, float *out, size_t ldo);

/* kernels_x86_sampler.c: kernels.h max_first, expsum, exp_shifted, scale_row, select_at_least (AVX2) */
BN_X86_ENTRY float bn_x86_max_first(const float *x, int n, int *arg);
BN_X86_ENTRY double bn_x86_expsum(const float *x, int n, float mx);
BN_X86_ENTRY double bn_x86_exp_shifted(const double *z, double top, double *w, int n);
BN_X86_ENTRY double bn_x86_scale_row(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad);
BN_X86_ENTRY int bn_x86_select_at_least(const double *w, int n, double t, int *out);

/* The entries every x86 table shares (designated initializers for a bn_kernels table) */
#define BN_X86_SHARED_ENTRIES                                                                                    \
    .attend_rows = bn_x86_attend_rows, .silu_mul = bn_avx2_silu_mul, .max_first = bn_x86_max_first,            \
    .expsum = bn_x86_expsum, .exp_shifted = bn_x86_exp_shifted, .scale_row = bn_x86_scale_row,                 \
    .select_at_least = bn_x86_select_at_least

#endif
