/* The dot product's matmuls (FEAT_DotProd, ARMv8.2: compiled with -march=armv8.2-a+dotprod, called only where
 * platform.c says the CPU has it): sdot (vdotq_laneq_s32) multiplies 4 int8 columns of 4 rows by the same 4 activations
 * (one 32-bit lane of the activations' register) into the 4 rows' int32 sums, exactly the layout of a tile's 16 bytes,
 * so a 2-bit group of 64 bytes (16 rows x 16 columns) is 4 loads, 4 ands, 6 shifts and ands and 16 sdot; signed x
 * signed, so the codes (w + 1) need only the xsum correction of the store. The other entries are kernels_neon.c's. */
#define BN_NEON_KERNEL_FILE
#include "kernels_neon.h"

#if defined(__ARM_FEATURE_DOTPROD)
/* The int32 sums of one 2-bit tile (16 rows) for nt tokens; sums[t][r] holds rows 4r..4r+3. */
static void ternary_tile(const uint8_t *wt, int groups, const int8_t *x, int kp, int nt, int32_t acc[][16]) {
    int32x4_t sums[BN_NEON_BLOCK][4];
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) sums[t][r] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g++) {
        int8x16_t f[4][4];
        for (int r = 0; r < 4; r++) bn_neon_fields(vld1q_u8(wt + g * 64 + 16 * r), f[r]);
        for (int t = 0; t < nt; t++) {
            const int8x16_t x16 = vld1q_s8(x + (size_t)t * kp + 16 * g);
            for (int r = 0; r < 4; r++) {
                sums[t][r] = vdotq_laneq_s32(sums[t][r], f[r][0], x16, 0);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], f[r][1], x16, 1);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], f[r][2], x16, 2);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], f[r][3], x16, 3);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) vst1q_s32(acc[t] + 4 * r, sums[t][r]);
}

/* The int8 head: group g (4 columns) is lane g % 4 of the activations' 16 bytes at 16 (g / 4). groups = kp / 4 is a
 * multiple of 4 (kp of 16). */
static void int8_tile(const int8_t *wt, int groups, const int8_t *x, int kp, int nt, int32_t acc[][16]) {
    int32x4_t sums[BN_NEON_BLOCK][4];
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) sums[t][r] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g += 4) {
        int8x16_t w[4][4]; /* [group g + l][register r] */
        for (int l = 0; l < 4; l++)
            for (int r = 0; r < 4; r++) w[l][r] = vld1q_s8(wt + (g + l) * 64 + 16 * r);
        for (int t = 0; t < nt; t++) {
            const int8x16_t x16 = vld1q_s8(x + (size_t)t * kp + 4 * g);
            for (int r = 0; r < 4; r++) {
                sums[t][r] = vdotq_laneq_s32(sums[t][r], w[0][r], x16, 0);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], w[1][r], x16, 1);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], w[2][r], x16, 2);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], w[3][r], x16, 3);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) vst1q_s32(acc[t] + 4 * r, sums[t][r]);
}

BN_NEON_MATMULS(ternary_tile, int8_tile)

/* 1.6-bit tiles: each chunk of row tiles unpacked once into 2-bit tiles and multiplied there (tiles5.c) */
static void ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                            const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    bn_ternary5_batch(bn_neon_unpack5, ternary_matmul, bn_kernels_portable.ternary5_matmul, codes, kp, row_scale, xq,
                      xsum, xinv, T, n0, n1, y, ldy);
}

/* For kernels_neon_i8mm.c: its one-token products. */
void bn_neon_dotprod_ternary(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                             const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    ternary_matmul(codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy);
}
void bn_neon_dotprod_int8(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum, const int8_t *xq,
                          const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    int8_matmul(w, kp, row_scale, rowsum, xq, xinv, T, n0, n1, y, ldy);
}

void bn_neon_dotprod_fill(bn_kernels *k) {
    k->ternary_matmul = ternary_matmul;
    k->ternary5_matmul = ternary5_matmul;
    k->int8_matmul = int8_matmul;
}
#else
#error "kernels_neon_dotprod.c needs the dot product: setup.py compiles it with -march=armv8.2-a+dotprod"
#endif
