/* The walks over row tiles of the 256-bit kernel files (kernels_avx2.c, kernels_avxvnni.c), from the kernels the
 * file defines before including this header:
 *   ternary_tile_1 / int8_tile_1   one token through a whole 16-row tile (decode: each 64-byte line read once)
 *   int8_half                      a block of up to TOKENS_PER_BLOCK tokens through one 8-row half of a tile
 * ternary_walk_1 takes rows [n0, n1) (whole tiles) for one token; int8_walk for T tokens: one token per tile, or
 * each half of a tile for each block of tokens (kernels.h's int8_matmul). */
#ifndef BITNET_TILE_WALK_H
#define BITNET_TILE_WALK_H

#include "kernels_x86.h"

static void ternary_walk_1(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum,
                           const float *xinv, int n0, int n1, float *y) {
    const int groups = kp / 16;
    for (int tile = n0 / 16; tile < n1 / 16; tile++)
        ternary_tile_1(codes + (size_t)tile * groups * 64, groups, xq, row_scale + tile * 16, xsum[0], xinv[0],
                       y + tile * 16);
}

static void int8_walk(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum, const int8_t *xq,
                      const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    const int groups = kp / 4;
    if (T == 1) {
        for (int tile = n0 / 16; tile < n1 / 16; tile++)
            int8_tile_1(w + (size_t)tile * groups * 64, groups, xq, row_scale + tile * 16, rowsum + tile * 16, xinv[0],
                        y + tile * 16);
        return;
    }
    for (int tile = n0 / 16; tile < n1 / 16; tile++)
        for (int half = 0; half < 2; half++) {
            const int8_t *wt = w + (size_t)tile * groups * 64 + half * 32;
            const int row0 = tile * 16 + half * 8;
#define INT8_CALL(BT) \
    int8_half(wt, groups, xq + (size_t)t0 * kp, kp, BT, row_scale + row0, rowsum + row0, xinv + t0, y + (size_t)t0 * ldy + row0, ldy)
            DISPATCH_BLOCKS(INT8_CALL)
#undef INT8_CALL
        }
}

#endif
