/* The aarch64 kernel files (kernels_neon.c: ARMv8.0 ASIMD; kernels_neon_dotprod.c: sdot; kernels_neon_i8mm.c:
 * smmla; kernels_neon_attention.c: the multi-row attention, ARMv8.0) and what they share. Each file writes its entries
 * over a table that dispatch.c starts from the portable one: the ARMv8.0 files every entry they have (the attention
 * included), the other two their matmuls: every entry of kernels.h, the optional ones too (silu_mul and expsum
 * through bn_neon_exp_nonpos below, exp_shifted through its double exponential in kernels_neon.c).
 *
 * Why 2-bit ternary tiles on ARM (kernel_paths.py: trit_tiles False): a 64-byte group of 2-bit codes (256 weights)
 * costs 4 and, 6 shift-and (or shift) and 16 sdot, ~7 instructions per 64 weights; a 1.6-bit byte's digit d is
 * (q * 3^d mod 256 >= 86) + (... >= 171), a multiply, two compares and two subtractions per digit of 16 bytes before
 * its sdot, plus a 4-byte broadcast of the activations (20-column groups do not fall on 16-byte lanes): ~20
 * instructions per 64 weights. A core would then be bound by its instructions, not by memory, well below the read roof
 * of an M2 or a Graviton 3 (BENCHMARKS.md counts both from the objects), so the fewer bytes of 1.6-bit tiles do not pay.
 * The 1.6-bit entries here unpack each chunk of row tiles into 2-bit tiles once and multiply those (tiles5.c). */
#ifndef BITNET_KERNELS_NEON_H
#define BITNET_KERNELS_NEON_H

#include "kernels.h"

void bn_neon_fill(bn_kernels *k);
/* kernels_neon_attention.c: kernels.h's attend_rows (head sizes a multiple of 8; returns 0 for the others) */
int bn_neon_attend_rows(const float *q, size_t ldq, int nr, int nq, int hd, const void *k, const void *v, size_t ld,
                        int kv, const float *ks, const float *vs, const int *ends, int c0, int c1, float scale,
                        float *scratch, float *out, size_t ldo);
#ifndef BN_NO_NEON_DOTPROD
void bn_neon_dotprod_fill(bn_kernels *k);
#endif
#ifndef BN_NO_NEON_I8MM
void bn_neon_i8mm_fill(bn_kernels *k);
#endif

#if defined(__aarch64__) && defined(BN_NEON_KERNEL_FILE) /* the kernel files' shared parts */
#include <arm_neon.h>

/* Tokens a batch kernel takes through a tile at once (each decoded group of weights is reused for all of them). */
#define BN_NEON_BLOCK 4

/* The four 2-bit fields of 16 code bytes: field s holds columns 4s..4s+3 of the 4 rows the bytes belong to. */
static inline void bn_neon_fields(uint8x16_t v, int8x16_t f[4]) {
    const uint8x16_t three = vdupq_n_u8(3);
    f[0] = vreinterpretq_s8_u8(vandq_u8(v, three));
    f[1] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v, 2), three));
    f[2] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v, 4), three));
    f[3] = vreinterpretq_s8_u8(vshrq_n_u8(v, 6));
}

/* The int32 sums of one row tile (16 rows, four to a register) into acc */
static inline void bn_neon_keep_sums(int32_t acc[16], int32x4_t s0, int32x4_t s1, int32x4_t s2, int32x4_t s3) {
    vst1q_s32(acc, s0);
    vst1q_s32(acc + 4, s1);
    vst1q_s32(acc + 8, s2);
    vst1q_s32(acc + 12, s3);
}

/* y[i] = (float)(acc[i] - xsum) * xinv * row_scale[i] for 16 rows: portable.c's store, each operation rounded alike */
static inline void bn_neon_store_ternary(const int32_t acc[16], int32_t xsum, float xinv, const float *row_scale,
                                         float *y) {
    const int32x4_t s = vdupq_n_s32(xsum);
    for (int q = 0; q < 4; q++) {
        const float32x4_t v = vcvtq_f32_s32(vsubq_s32(vld1q_s32(acc + 4 * q), s));
        vst1q_f32(y + 4 * q, vmulq_f32(vmulq_n_f32(v, xinv), vld1q_f32(row_scale + 4 * q)));
    }
}
/* y[i] = (float)acc[i] * xinv * row_scale[i] for 16 rows (the int8 head) */
static inline void bn_neon_store_int8(const int32_t acc[16], float xinv, const float *row_scale, float *y) {
    for (int q = 0; q < 4; q++) {
        const float32x4_t v = vcvtq_f32_s32(vld1q_s32(acc + 4 * q));
        vst1q_f32(y + 4 * q, vmulq_f32(vmulq_n_f32(v, xinv), vld1q_f32(row_scale + 4 * q)));
    }
}

/* kernels.h's ternary_matmul and int8_matmul from a file's tile kernels, which give the int32 sums of one 16-row tile
 * for nt <= BN_NEON_BLOCK tokens (x: token t at x + t * kp) into acc[t][16]:
 *   TERNARY_TILE(wt, groups, x, kp, nt, acc)  2-bit codes (w + 1), groups = kp / 16
 *   INT8_TILE(wt, groups, x, kp, nt, acc)     int8 weights, groups = kp / 4 */
#define BN_NEON_MATMULS(TERNARY_TILE, INT8_TILE)                                                                  \
    static void ternary_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,            \
                               const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) { \
        const int groups = kp / 16;                                                                                \
        for (int tile = n0 / 16; tile < n1 / 16; tile++)                                                           \
            for (int t0 = 0; t0 < T; t0 += BN_NEON_BLOCK) {                                                        \
                const int nt = T - t0 < BN_NEON_BLOCK ? T - t0 : BN_NEON_BLOCK;                                    \
                int32_t acc[BN_NEON_BLOCK][16];                                                                    \
                TERNARY_TILE(codes + (size_t)tile * groups * 64, groups, xq + (size_t)t0 * kp, kp, nt, acc);       \
                for (int t = 0; t < nt; t++)                                                                       \
                    bn_neon_store_ternary(acc[t], xsum[t0 + t], xinv[t0 + t], row_scale + tile * 16,               \
                                          y + (size_t)(t0 + t) * ldy + tile * 16);                                 \
            }                                                                                                      \
    }                                                                                                              \
    static void int8_matmul(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,               \
                            const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy) {       \
        (void)rowsum; /* signed x signed products: no offset to correct */                                        \
        const int groups = kp / 4;                                                                                 \
        for (int tile = n0 / 16; tile < n1 / 16; tile++)                                                           \
            for (int t0 = 0; t0 < T; t0 += BN_NEON_BLOCK) {                                                        \
                const int nt = T - t0 < BN_NEON_BLOCK ? T - t0 : BN_NEON_BLOCK;                                    \
                int32_t acc[BN_NEON_BLOCK][16];                                                                    \
                INT8_TILE(w + (size_t)tile * groups * 64, groups, xq + (size_t)t0 * kp, kp, nt, acc);              \
                for (int t = 0; t < nt; t++)                                                                       \
                    bn_neon_store_int8(acc[t], xinv[t0 + t], row_scale + tile * 16,                                \
                                       y + (size_t)(t0 + t) * ldy + tile * 16);                                    \
            }                                                                                                      \
    }

/* e^x for x <= 0 (a softmax's or an expsum's x - max, a silu's -|g|), relative error about 1e-7: x = n ln2 + r with
 * n = floor(x log2(e) + 1/2), ln2 in two parts (the first exact in few bits, so n * it is exact), e^r by a degree-7
 * polynomial (Cephes' expf), times 2^n built in the exponent field. The operations of kernels_x86.h's exp_nonpos, FMA
 * for FMA, so both give the same floats. Below -87.3 the result is ~1e-38 (the clamp; -inf gives it too); NaN
 * gives that as well (fmaxnm ignores NaN, as x86's max does). */
static inline float32x4_t bn_neon_exp_nonpos(float32x4_t x) {
    x = vmaxnmq_f32(x, vdupq_n_f32(-87.3f));
    const float32x4_t n = vrndmq_f32(vfmaq_f32(vdupq_n_f32(0.5f), x, vdupq_n_f32(1.44269504088896341f)));
    x = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    x = vfmsq_f32(x, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), vdupq_n_f32(1.9875691500e-4f), x);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, x);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, x);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, x);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, x);
    p = vfmaq_f32(vaddq_f32(x, vdupq_n_f32(1.0f)), p, vmulq_f32(x, x));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23); /* n >= -126: a normal 2^n */
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

void bn_neon_unpack5(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2); /* kernels_neon.c */
#endif

#endif
