/* Tokens in blocks for the 256-bit kernels (kernels_avx2.c, kernels_avxvnni.c): T tokens are taken in blocks of
 * up to TOKENS_PER_BLOCK, and CALL(BT) runs one block with its size BT a compile-time constant, so that the kernels'
 * per-token loops unroll and their accumulators stay in registers. Expects T (tokens) in scope and gives CALL t0
 * (the block's first token). store_half_rows: the blocks' common last step. */
#ifndef BITNET_TOKEN_BLOCKS_H
#define BITNET_TOKEN_BLOCKS_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define TOKENS_PER_BLOCK 8

/* y (bt tokens x 8 rows of one half of a row tile, row b at y + b * ldy) = (acc[b] - xsum[b]) * xinv[b] * row_scale
 * for the int32 sums acc of a ternary block of tokens */
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

#endif
