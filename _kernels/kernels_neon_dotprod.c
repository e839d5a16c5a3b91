/* The dot product's matmuls (FEAT_DotProd, ARMv8.2: compiled with -march=armv8.2-a+dotprod, called only where
 * platform.c says the CPU has it): sdot (vdotq_laneq_s32) multiplies 4 int8 columns of 4 rows by the same 4 activations
 * (one 32-bit lane of the activations' register) into the 4 rows' int32 sums, exactly the layout of a tile's 16 bytes,
 * so a 2-bit group of 64 bytes (16 rows x 16 columns) is 4 loads, 4 ands, 6 shifts and ands and 16 sdot; signed x
 * signed, so the codes (w + 1) need only the xsum correction of the store. The other entries are kernels_neon.c's. */
#define BN_NEON_KERNEL_FILE
#include "kernels_neon.h"

#if defined(__ARM_FEATURE_DOTPROD)
/* One token (decode): the sums in four registers (rows 4r..4r+3), 16 sdot per 64-byte group. */
static void ternary_tile_1(const uint8_t *wt, int groups, const int8_t *x, int32_t acc[16]) {
    int32x4_t s0 = vdupq_n_s32(0), s1 = s0, s2 = s0, s3 = s0;
    for (int g = 0; g < groups; g++) {
        const int8x16_t x16 = vld1q_s8(x + 16 * g);
        int8x16_t f[4][4];
        for (int r = 0; r < 4; r++) bn_neon_fields(vld1q_u8(wt + g * 64 + 16 * r), f[r]);
#define ROWS4(S, R)                                  \
    S = vdotq_laneq_s32(S, f[R][0], x16, 0);         \
    S = vdotq_laneq_s32(S, f[R][1], x16, 1);         \
    S = vdotq_laneq_s32(S, f[R][2], x16, 2);         \
    S = vdotq_laneq_s32(S, f[R][3], x16, 3);
        ROWS4(s0, 0) ROWS4(s1, 1) ROWS4(s2, 2) ROWS4(s3, 3)
#undef ROWS4
    }
    bn_neon_keep_sums(acc, s0, s1, s2, s3);
}

/* The int32 sums of one 2-bit tile (16 rows) for NT tokens (a constant where it is inlined: the sums stay in
 * registers); sums[t][r] holds rows 4r..4r+3. Each register of codes is split into its fields once for all NT tokens. */
static inline __attribute__((always_inline)) void ternary_block(const uint8_t *wt, int groups, const int8_t *x, int kp,
                                                                const int NT, int32_t acc[][16]) {
    int32x4_t sums[BN_NEON_BLOCK][4];
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 4; r++) sums[t][r] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g++) {
        int8x16_t x16[BN_NEON_BLOCK];
        for (int t = 0; t < NT; t++) x16[t] = vld1q_s8(x + (size_t)t * kp + 16 * g);
        for (int r = 0; r < 4; r++) {
            int8x16_t f[4];
            bn_neon_fields(vld1q_u8(wt + g * 64 + 16 * r), f);
            for (int t = 0; t < NT; t++) {
                sums[t][r] = vdotq_laneq_s32(sums[t][r], f[0], x16[t], 0);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], f[1], x16[t], 1);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], f[2], x16[t], 2);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], f[3], x16[t], 3);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 4; r++) vst1q_s32(acc[t] + 4 * r, sums[t][r]);
}

static void ternary_tile(const uint8_t *wt, int groups, const int8_t *x, int kp, int nt, int32_t acc[][16]) {
    switch (nt) {
        case 1: ternary_tile_1(wt, groups, x, acc[0]); break;
        case 2: ternary_block(wt, groups, x, kp, 2, acc); break;
        case 3: ternary_block(wt, groups, x, kp, 3, acc); break;
        default: ternary_block(wt, groups, x, kp, BN_NEON_BLOCK, acc); break;
    }
}

/* The int8 head for one token, the sums in four registers. */
static void int8_tile_1(const int8_t *wt, int groups, const int8_t *x, int32_t acc[16]) {
    int32x4_t s0 = vdupq_n_s32(0), s1 = s0, s2 = s0, s3 = s0;
    for (int g = 0; g < groups; g += 4) {
        const int8x16_t x16 = vld1q_s8(x + 4 * g);
        const int8_t *p = wt + g * 64;
#define ROWS4(S, R)                                                \
    S = vdotq_laneq_s32(S, vld1q_s8(p + 16 * (R)), x16, 0);        \
    S = vdotq_laneq_s32(S, vld1q_s8(p + 64 + 16 * (R)), x16, 1);   \
    S = vdotq_laneq_s32(S, vld1q_s8(p + 128 + 16 * (R)), x16, 2);  \
    S = vdotq_laneq_s32(S, vld1q_s8(p + 192 + 16 * (R)), x16, 3);
        ROWS4(s0, 0) ROWS4(s1, 1) ROWS4(s2, 2) ROWS4(s3, 3)
#undef ROWS4
    }
    bn_neon_keep_sums(acc, s0, s1, s2, s3);
}

/* The int8 head for NT tokens (a constant where inlined): group g (4 columns) is lane g % 4 of the activations'
 * 16 bytes at 4 (g - g % 4); groups = kp / 4 is a multiple of 4 (kp of 16). */
static inline __attribute__((always_inline)) void int8_block(const int8_t *wt, int groups, const int8_t *x, int kp,
                                                             const int NT, int32_t acc[][16]) {
    int32x4_t sums[BN_NEON_BLOCK][4];
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 4; r++) sums[t][r] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g += 4) {
        int8x16_t x16[BN_NEON_BLOCK];
        for (int t = 0; t < NT; t++) x16[t] = vld1q_s8(x + (size_t)t * kp + 4 * g);
        for (int r = 0; r < 4; r++) {
            const int8x16_t w0 = vld1q_s8(wt + g * 64 + 16 * r), w1 = vld1q_s8(wt + (g + 1) * 64 + 16 * r);
            const int8x16_t w2 = vld1q_s8(wt + (g + 2) * 64 + 16 * r), w3 = vld1q_s8(wt + (g + 3) * 64 + 16 * r);
            for (int t = 0; t < NT; t++) {
                sums[t][r] = vdotq_laneq_s32(sums[t][r], w0, x16[t], 0);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], w1, x16[t], 1);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], w2, x16[t], 2);
                sums[t][r] = vdotq_laneq_s32(sums[t][r], w3, x16[t], 3);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 4; r++) vst1q_s32(acc[t] + 4 * r, sums[t][r]);
}

static void int8_tile(const int8_t *wt, int groups, const int8_t *x, int kp, int nt, int32_t acc[][16]) {
    switch (nt) {
        case 1: int8_tile_1(wt, groups, x, acc[0]); break;
        case 2: int8_block(wt, groups, x, kp, 2, acc); break;
        case 3: int8_block(wt, groups, x, kp, 3, acc); break;
        default: int8_block(wt, groups, x, kp, BN_NEON_BLOCK, acc); break;
    }
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
