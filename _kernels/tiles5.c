/* 1.6-bit ternary tiles (5 codes a byte, bitnet_app/engine/packing.py) for a batch of tokens, on the paths that have
 * no batch kernel of their own (AVX-VNNI, AMX, AVX-512 without VBMI; kernels_avx2.c and kernels_avx512.c
 * unpack in the first block of tokens, so that the reads overlap the products, where here the core waits on memory
 * while it unpacks a chunk and leaves memory idle while it multiplies), and as their fallback: each
 * chunk of CHUNK_TILES row tiles is unpacked once into 2-bit tiles in a buffer of the calling thread, and the path's
 * own 2-bit kernel multiplies the whole batch there. The unpacking costs about what one token's decode costs, so a
 * forward of T tokens pays it once for T; and the 2-bit kernels (blocks of tokens, pairs of tiles, AMX tiles) run
 * unchanged, with exactly the sums they have on 2-bit files: the same y, bit for bit.
 *
 * The buffer: CHUNK_TILES x kp/16 x 64 bytes (56 KB for the 2B-4T down_proj), one per thread that runs a forward
 * (the calling thread and the pool's workers: thread_buffer.c), grown when a wider matrix comes.
 */
#include "kernels.h"

#define CHUNK_TILES 2 /* row tiles unpacked at a time: the pair the AVX-512 and AMX kernels take together */

void bn_ternary5_batch(bn_unpack5_fn unpack5, bn_ternary_fn matmul2, bn_ternary_fn one_token, const uint8_t *codes,
                       int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum, const float *xinv,
                       int T, int n0, int n1, float *y, int ldy) {
    const size_t tile2 = (size_t)kp / 16 * 64, tile5 = (size_t)bn_trit5_groups(kp) * 64;
    uint8_t *buf = bn_thread_buffer(BN_SCRATCH_TILES5, CHUNK_TILES * tile2);
    if (!buf) { /* no memory for the buffer: one token at a time, decoded in place */
        for (int t = 0; t < T; t++)
            one_token(codes, kp, row_scale, xq + (size_t)t * kp, xsum + t, xinv + t, 1, n0, n1, y + (size_t)t * ldy, ldy);
        return;
    }
    for (int tile = n0 / 16; tile < n1 / 16; tile += CHUNK_TILES) {
        const int nt = n1 / 16 - tile < CHUNK_TILES ? n1 / 16 - tile : CHUNK_TILES;
        unpack5(codes + (size_t)tile * tile5, kp, nt, buf);
        matmul2(buf, kp, row_scale + tile * 16, xq, xsum, xinv, T, 0, nt * 16, y + tile * 16, ldy);
    }
}
