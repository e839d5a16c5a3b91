/* The int8 matrix multiply's matmuls (FEAT_I8MM, ARMv8.6: compiled with -march=armv8.6-a+dotprod+i8mm, called only
 * where platform.c says the CPU has it): for batches, smmla (vmmlaq_s32) multiplies a 2x8 int8 block of weights (two
 * rows, 8 columns) by an 8x2 block of activations (two tokens) into a 2x2 int32 block: 32 products an instruction,
 * twice sdot's. A tile's bytes hold 4 columns of 4 rows per 32-bit lane (field s of a 2-bit group, or one int8
 * group), so two of them zipped by 32-bit lanes (vzip1q_s32 / vzip2q_s32) give the 2x8 blocks of rows (4r, 4r+1) and
 * (4r+2, 4r+3). One token (decode) has no second column to fill: it takes the dot product's kernels
 * (kernels_neon_dotprod.c; every i8mm CPU has the dot product). */
#define BN_NEON_KERNEL_FILE
#include "kernels_neon.h"

#if defined(__ARM_FEATURE_MATMUL_INT8)
void bn_neon_dotprod_ternary(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                             const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_neon_dotprod_int8(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum, const int8_t *xq,
                          const float *xinv, int T, int n0, int n1, float *y, int ldy);

#define PAIRS (BN_NEON_BLOCK / 2)

/* Columns c..c+7 of tokens t and t + 1 (zeros for a token past the block's nt) as smmla's 8x2 block. */
static inline int8x16_t token_pair(const int8_t *x, int kp, int t, int nt, int c) {
    const int8x8_t a = vld1_s8(x + (size_t)t * kp + c);
    return vcombine_s8(a, t + 1 < nt ? vld1_s8(x + (size_t)(t + 1) * kp + c) : vdup_n_s8(0));
}

/* sums[p][2r + a] (rows 4r + 2a, 4r + 2a + 1 by tokens 2p, 2p + 1) -> acc[t][row] */
static void store_pairs(int32x4_t sums[PAIRS][8], int nt, int32_t acc[][16]) {
    for (int p = 0; p < (nt + 1) / 2; p++)
        for (int rp = 0; rp < 8; rp++) {
            int32_t v[4];
            vst1q_s32(v, sums[p][rp]);
            const int row = (rp / 2) * 4 + (rp % 2) * 2, t = 2 * p;
            acc[t][row] = v[0];
            acc[t][row + 1] = v[2];
            if (t + 1 < nt) {
                acc[t + 1][row] = v[1];
                acc[t + 1][row + 1] = v[3];
            }
        }
}

/* One 2-bit tile (16 rows) by nt (1..BN_NEON_BLOCK) tokens in NP token pairs (a constant where inlined: the sums stay
 * in registers): per group and half h (columns 8h..8h+7), fields 2h and 2h + 1 zipped into 8 blocks of 2 rows, each
 * multiplied by every token pair. */
static inline __attribute__((always_inline)) void ternary_pairs(const uint8_t *wt, int groups, const int8_t *x,
                                                                int kp, int nt, const int NP, int32_t acc[][16]) {
    int32x4_t sums[PAIRS][8];
    for (int p = 0; p < NP; p++)
        for (int rp = 0; rp < 8; rp++) sums[p][rp] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g++) {
        int8x16_t f[4][4];
        for (int r = 0; r < 4; r++) bn_neon_fields(vld1q_u8(wt + g * 64 + 16 * r), f[r]);
        for (int h = 0; h < 2; h++) {
            int8x16_t a[8];
            for (int r = 0; r < 4; r++) {
                const int32x4_t lo = vreinterpretq_s32_s8(f[r][2 * h]), hi = vreinterpretq_s32_s8(f[r][2 * h + 1]);
                a[2 * r] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));
                a[2 * r + 1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));
            }
            for (int p = 0; p < NP; p++) {
                const int8x16_t b = token_pair(x, kp, 2 * p, nt, 16 * g + 8 * h);
                for (int rp = 0; rp < 8; rp++) sums[p][rp] = vmmlaq_s32(sums[p][rp], a[rp], b);
            }
        }
    }
    store_pairs(sums, nt, acc);
}

static void ternary_tile(const uint8_t *wt, int groups, const int8_t *x, int kp, int nt, int32_t acc[][16]) {
    if (nt <= 2)
        ternary_pairs(wt, groups, x, kp, nt, 1, acc);
    else
        ternary_pairs(wt, groups, x, kp, nt, PAIRS, acc);
}

/* The int8 head: int8 groups g and g + 1 (columns 4g..4g+7) zipped into the 2x8 blocks; groups = kp / 4 is even. */
static inline __attribute__((always_inline)) void int8_pairs(const int8_t *wt, int groups, const int8_t *x, int kp,
                                                             int nt, const int NP, int32_t acc[][16]) {
    int32x4_t sums[PAIRS][8];
    for (int p = 0; p < NP; p++)
        for (int rp = 0; rp < 8; rp++) sums[p][rp] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g += 2) {
        int8x16_t a[8];
        for (int r = 0; r < 4; r++) {
            const int32x4_t lo = vreinterpretq_s32_s8(vld1q_s8(wt + g * 64 + 16 * r));
            const int32x4_t hi = vreinterpretq_s32_s8(vld1q_s8(wt + (g + 1) * 64 + 16 * r));
            a[2 * r] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));
            a[2 * r + 1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));
        }
        for (int p = 0; p < NP; p++) {
            const int8x16_t b = token_pair(x, kp, 2 * p, nt, 4 * g);
            for (int rp = 0; rp < 8; rp++) sums[p][rp] = vmmlaq_s32(sums[p][rp], a[rp], b);
        }
    }
    store_pairs(sums, nt, acc);
}

static void int8_tile(const int8_t *wt, int groups, const int8_t *x, int kp, int nt, int32_t acc[][16]) {
    if (nt <= 2)
        int8_pairs(wt, groups, x, kp, nt, 1, acc);
    else
        int8_pairs(wt, groups, x, kp, nt, PAIRS, acc);
}

BN_NEON_MATMULS(ternary_tile, int8_tile)

/* One token: the dot product's kernels; a batch: the tiles above. */
static void ternary_any(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum,
                        const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    (T == 1 ? bn_neon_dotprod_ternary : ternary_matmul)(codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy);
}
static void int8_any(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum, const int8_t *xq,
                     const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    (T == 1 ? bn_neon_dotprod_int8 : int8_matmul)(w, kp, row_scale, rowsum, xq, xinv, T, n0, n1, y, ldy);
}
static void ternary5_any(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum,
                         const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    bn_ternary5_batch(bn_neon_unpack5, ternary_any, bn_kernels_portable.ternary5_matmul, codes, kp, row_scale, xq,
                      xsum, xinv, T, n0, n1, y, ldy);
}

void bn_neon_i8mm_fill(bn_kernels *k) {
    k->ternary_matmul = ternary_any;
    k->ternary5_matmul = ternary5_any;
    k->int8_matmul = int8_any;
}
#else
#error "kernels_neon_i8mm.c needs i8mm: setup.py compiles it with -march=armv8.6-a+dotprod+i8mm"
#endif
