/* AVX-VNNI kernels: the 256-bit vpdpbusd of CPUs with AVX-VNNI but no AVX-512 (Intel 12th generation and later
 * desktops and laptops; AMD Zen 4 and 5 have it too). Compiled with -mavx2 -mfma -mf16c -mavxvnni.
 *
 * Only the two matmuls differ from the AVX2 path (dispatch.c copies the AVX2 table and puts these two in): the
 * tile layouts are the AVX2 ones (a 16-row tile is two 256-bit halves, rows 0-7 and 8-15, each 8 int32 lanes =
 * 8 rows x 4 columns), and `vpdpbusd acc, u8, s8` adds the four u8 x s8 products of each lane to its int32 sum
 * in one instruction, where AVX2 needs vpmaddubsw, a 16-bit add and, every 16 groups, vpmaddwd:
 *   ternary: codes (0, 1, 2) x activations, minus xsum at the end (the +1 offset of the codes), as AVX2;
 *   int8:    activations offset to u8 (x ^ 0x80 = x + 128) x s8 weights, minus 128 * rowsum at the end (the
 *            AVX512 path's rule); no saturation anywhere, so every sum is exact.
 *
 * The same file compiled with BN_VNNI_EMULATED (kernels_avxvnni_emulated.c, AVX2 flags only) writes vpdpbusd with
 * AVX2 instructions that give exactly its sums for every operand (dpbusd_avx2), so every line of these kernels is
 * tested on any AVX2 machine, not only on the CPUs that have the instruction; only the instruction itself is not.
 */
#include "kernels_x86.h"

#ifdef BN_VNNI_EMULATED
/* vpdpbusd in AVX2, exact for every operand: vpmaddubsw saturates a pair of u8 x s8 products at 16 bits, so the u8
 * bytes are split into their low 7 bits (pair <= 2 x 127 x 128 = 32512) and their top bit (pair = 128 x (b0 + b1),
 * within [-32768, 32512]), each pair sum is exact, and vpmaddwd adds them in 32 bits. */
static inline __m256i dpbusd_avx2(__m256i acc, __m256i a, __m256i b) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(a, _mm256_set1_epi8(0x7f)), b);
    const __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(a, _mm256_set1_epi8((char)0x80)), b);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones)));
}
#define DPBUSD(acc, a, b) dpbusd_avx2((acc), (a), (b))
#define VNNI_FN(name) bn_avxvnni_emulated_##name
#else
#define DPBUSD(acc, a, b) _mm256_dpbusd_avx_epi32((acc), (a), (b))
#define VNNI_FN(name) bn_avxvnni_##name
#endif

/* One token through a whole 16-row tile (decode): both halves per 64-byte line, and one accumulator per code
 * field and half (8 in all), so consecutive vpdpbusd do not wait for each other (latency 5, two per cycle). */
static void ternary_tile_1(const uint8_t *wt, int groups, const int8_t *x, const float *row_scale, int32_t xsum,
                           float xinv, float *y) {
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256i a[4][2]; /* [field][half] int32 sums */
#pragma GCC unroll 4
    for (int f = 0; f < 4; f++) a[f][0] = a[f][1] = _mm256_setzero_si256();
    for (int g = 0; g < groups; g++) {
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1); /* and into L2 (kernels.h) */
        const __m256i p = _mm256_loadu_si256((const __m256i *)(wt + g * 64));
        const __m256i q = _mm256_loadu_si256((const __m256i *)(wt + g * 64 + 32));
#pragma GCC unroll 4
        for (int f = 0; f < 4; f++) { /* code field f of every byte: column 4f + j of the group */
            const __m256i xf = _mm256_set1_epi32(load_i32(x + g * 16 + 4 * f));
            a[f][0] = DPBUSD(a[f][0], _mm256_and_si256(_mm256_srli_epi16(p, 2 * f), m3), xf);
            a[f][1] = DPBUSD(a[f][1], _mm256_and_si256(_mm256_srli_epi16(q, 2 * f), m3), xf);
        }
    }
    const __m256 xi = _mm256_set1_ps(xinv);
    const __m256i xs = _mm256_set1_epi32(xsum);
    for (int h = 0; h < 2; h++) {
        const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a[0][h], a[1][h]), _mm256_add_epi32(a[2][h], a[3][h]));
        _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s, xs)), xi),
                                                  _mm256_loadu_ps(row_scale + 8 * h)));
    }
}

/* bt tokens (<= TOKENS_PER_BLOCK) through one 8-row half of a tile: each group's codes unpacked once, applied to
 * every token of the block */
static inline __attribute__((always_inline)) void ternary_half(
    const uint8_t *wt, int groups, const int8_t *x, int kp, const int bt, const float *row_scale,
    const int32_t *xsum, const float *xinv, float *y, int ldy) {
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256i acc[TOKENS_PER_BLOCK];
#pragma GCC unroll 8
    for (int b = 0; b < TOKENS_PER_BLOCK; b++) acc[b] = _mm256_setzero_si256();
    for (int g = 0; g < groups; g++) {
        _mm_prefetch((const char *)(wt + g * 64 + BN_BLOCK_PREFETCH_BYTES), _MM_HINT_T0);
        const __m256i p = _mm256_loadu_si256((const __m256i *)(wt + g * 64));
        const __m256i w0 = _mm256_and_si256(p, m3), w1 = _mm256_and_si256(_mm256_srli_epi16(p, 2), m3);
        const __m256i w2 = _mm256_and_si256(_mm256_srli_epi16(p, 4), m3), w3 = _mm256_and_si256(_mm256_srli_epi16(p, 6), m3);
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) {
            const int8_t *xg = x + (size_t)b * kp + g * 16;
            acc[b] = DPBUSD(acc[b], w0, _mm256_set1_epi32(load_i32(xg)));
            acc[b] = DPBUSD(acc[b], w1, _mm256_set1_epi32(load_i32(xg + 4)));
            acc[b] = DPBUSD(acc[b], w2, _mm256_set1_epi32(load_i32(xg + 8)));
            acc[b] = DPBUSD(acc[b], w3, _mm256_set1_epi32(load_i32(xg + 12)));
        }
    }
    store_half_rows(acc, bt, row_scale, xsum, xinv, y, ldy);
}

/* int8: the activations offset to u8 (x ^ 0x80 = x + 128), the sum corrected by 128 * rowsum at the end */
#define INT8_X(xv) _mm256_xor_si256((xv), _mm256_set1_epi8((char)0x80))

static inline __attribute__((always_inline)) void int8_half(
    const int8_t *wt, int groups, const int8_t *x, int kp, const int bt, const float *row_scale,
    const int32_t *rowsum, const float *xinv, float *y, int ldy) {
    __m256i acc[TOKENS_PER_BLOCK];
#pragma GCC unroll 8
    for (int b = 0; b < TOKENS_PER_BLOCK; b++) acc[b] = _mm256_setzero_si256();
    for (int g = 0; g < groups; g++) {
        _mm_prefetch((const char *)(wt + g * 64 + BN_BLOCK_PREFETCH_BYTES), _MM_HINT_T0);
        const __m256i w = _mm256_loadu_si256((const __m256i *)(wt + g * 64));
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) {
            const __m256i xv = INT8_X(_mm256_set1_epi32(load_i32(x + (size_t)b * kp + g * 4)));
            acc[b] = DPBUSD(acc[b], xv, w);
        }
    }
    const __m256 scale = _mm256_loadu_ps(row_scale);
    const __m256i offset = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)rowsum), _mm256_set1_epi32(128));
#pragma GCC unroll 8
    for (int b = 0; b < bt; b++) {
        const __m256i sum = _mm256_sub_epi32(acc[b], offset);
        const __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(xinv[b])), scale);
        _mm256_storeu_ps(y + (size_t)b * ldy, v);
    }
}

/* One token through a whole 16-row int8 tile (the head at decode), both halves per 64-byte line, two accumulators
 * per half so that consecutive vpdpbusd do not wait for each other. */
static void int8_tile_1(const int8_t *wt, int groups, const int8_t *x, const float *row_scale, const int32_t *rowsum,
                        float xinv, float *y) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0; /* a: even groups, b: odd groups */
    int g = 0;
    for (; g + 2 <= groups; g += 2) {
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES + 64), _MM_HINT_T0);
        const __m256i x0 = INT8_X(_mm256_set1_epi32(load_i32(x + g * 4)));
        const __m256i x1 = INT8_X(_mm256_set1_epi32(load_i32(x + g * 4 + 4)));
        a0 = DPBUSD(a0, x0, _mm256_loadu_si256((const __m256i *)(wt + g * 64)));
        a1 = DPBUSD(a1, x0, _mm256_loadu_si256((const __m256i *)(wt + g * 64 + 32)));
        b0 = DPBUSD(b0, x1, _mm256_loadu_si256((const __m256i *)(wt + g * 64 + 64)));
        b1 = DPBUSD(b1, x1, _mm256_loadu_si256((const __m256i *)(wt + g * 64 + 96)));
    }
    if (g < groups) {
        const __m256i x0 = INT8_X(_mm256_set1_epi32(load_i32(x + g * 4)));
        a0 = DPBUSD(a0, x0, _mm256_loadu_si256((const __m256i *)(wt + g * 64)));
        a1 = DPBUSD(a1, x0, _mm256_loadu_si256((const __m256i *)(wt + g * 64 + 32)));
    }
    const __m256 xi = _mm256_set1_ps(xinv);
    const __m256i s[2] = {_mm256_add_epi32(a0, b0), _mm256_add_epi32(a1, b1)};
    for (int h = 0; h < 2; h++) {
        const __m256i offset = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(rowsum + 8 * h)),
                                                  _mm256_set1_epi32(128));
        _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s[h], offset)), xi),
                                                  _mm256_loadu_ps(row_scale + 8 * h)));
    }
}

#include "tile_walk.h" /* ternary_walk_1, int8_walk: from the kernels above */

/* kernels.h ternary_matmul from ternary_tile_1 (one token) and ternary_half (each half of a tile for each block of
 * tokens) above */
static void ternary_walk(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                         const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    if (T == 1) {
        ternary_walk_1(codes, kp, row_scale, xq, xsum, xinv, n0, n1, y);
        return;
    }
    const int groups = kp / 16;
    for (int tile = n0 / 16; tile < n1 / 16; tile++)
        for (int half = 0; half < 2; half++) {
            const uint8_t *wt = codes + (size_t)tile * groups * 64 + half * 32;
            const int row0 = tile * 16 + half * 8;
#define TERNARY_CALL(BT) \
    ternary_half(wt, groups, xq + (size_t)t0 * kp, kp, BT, row_scale + row0, xsum + t0, xinv + t0, y + (size_t)t0 * ldy + row0, ldy)
            DISPATCH_BLOCKS(TERNARY_CALL)
#undef TERNARY_CALL
        }
}

/* One token through a whole 16-row tile of 1.6-bit codes (5 a byte): the AVX-512 kernel's sums (kernels_avx512.c
 * ternary5_tile_1: 256 x codes . x = 3 sum t_d . x_d - sum t_{d+1} . x_d, two vpdpbusd per digit) on both halves,
 * with two accumulators per half and sum (even and odd digits) to hide the vpdpbusd latency in 16 registers. */
static inline __attribute__((always_inline)) void ternary5_group(const uint8_t *p, const int8_t *xg, const int nd,
                                                                 __m256i a[2][2], __m256i b[2][2]) {
    __m256i t0 = _mm256_loadu_si256((const __m256i *)p), t1 = _mm256_loadu_si256((const __m256i *)(p + 32));
#pragma GCC unroll 5
    for (int d = 0; d < nd; d++) {
        const __m256i xb = _mm256_set1_epi32(load_i32(xg + 4 * d));
        a[d & 1][0] = DPBUSD(a[d & 1][0], t0, xb);
        a[d & 1][1] = DPBUSD(a[d & 1][1], t1, xb);
        t0 = _mm256_add_epi8(t0, _mm256_add_epi8(t0, t0)); /* t_{d+1} = 3 t_d mod 256 */
        t1 = _mm256_add_epi8(t1, _mm256_add_epi8(t1, t1));
        b[d & 1][0] = DPBUSD(b[d & 1][0], t0, xb);
        b[d & 1][1] = DPBUSD(b[d & 1][1], t1, xb);
    }
}

static void ternary5_tile_1(const uint8_t *wt, int kp, const int8_t *x, const float *row_scale, int32_t xsum,
                            float xinv, float *y) {
    const int quads = kp / 4, full = quads / BN_TRIT5_QUADS, rest = quads % BN_TRIT5_QUADS;
    __m256i a[2][2], b[2][2]; /* [even / odd digit][half] */
    a[0][0] = a[0][1] = a[1][0] = a[1][1] = b[0][0] = b[0][1] = b[1][0] = b[1][1] = _mm256_setzero_si256();
    for (int g = 0; g < full; g++) {
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1); /* and into L2 (kernels.h) */
        ternary5_group(wt + (size_t)g * 64, x + 20 * g, BN_TRIT5_QUADS, a, b);
    }
    const uint8_t *p = wt + (size_t)full * 64;
    switch (rest) { /* the last group's quads, when kp / 4 is not a multiple of 5 */
        case 4: ternary5_group(p, x + 20 * full, 4, a, b); break;
        case 3: ternary5_group(p, x + 20 * full, 3, a, b); break;
        case 2: ternary5_group(p, x + 20 * full, 2, a, b); break;
        case 1: ternary5_group(p, x + 20 * full, 1, a, b); break;
        default: break;
    }
    const __m256 xi = _mm256_set1_ps(xinv);
    const __m256i xs = _mm256_set1_epi32(xsum);
    for (int h = 0; h < 2; h++) {
        const __m256i A = _mm256_add_epi32(a[0][h], a[1][h]), B = _mm256_add_epi32(b[0][h], b[1][h]);
        const __m256i codes_x = _mm256_srai_epi32(_mm256_sub_epi32(_mm256_add_epi32(A, _mm256_add_epi32(A, A)), B), 8);
        _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(codes_x, xs)), xi),
                                                  _mm256_loadu_ps(row_scale + 8 * h)));
    }
}

void VNNI_FN(ternary5_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                              const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    if (T > 1) { /* the AVX2 path's unpacking, this path's 2-bit kernels */
        bn_ternary5_batch(bn_kernels_avx2.unpack5, ternary_walk, VNNI_FN(ternary5_matmul), codes, kp, row_scale, xq,
                          xsum, xinv, T, n0, n1, y, ldy);
        return;
    }
    const size_t tile_bytes = (size_t)bn_trit5_groups(kp) * 64;
    for (int tile = n0 / 16; tile < n1 / 16; tile++)
        ternary5_tile_1(codes + (size_t)tile * tile_bytes, kp, xq, row_scale + tile * 16, xsum[0], xinv[0],
                        y + tile * 16);
}

void VNNI_FN(ternary_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                             const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    ternary_walk(codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy);
}

void VNNI_FN(int8_matmul)(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum, const int8_t *xq,
                          const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    int8_walk(w, kp, row_scale, rowsum, xq, xinv, T, n0, n1, y, ldy);
}
