/* ARMv8.0 ASIMD (NEON) kernels: every aarch64 CPU (Cortex-A53/A72: Raspberry Pi 3/4). The same tile layouts as
 * kernels_portable.c; integer sums bit for bit its, the elementwise float entries (quantize, norms, fp16, axpy, add)
 * the same numbers, the reductions (dot, sums) in 4 lanes.
 *
 * Without the dot product, a 4-column int8 dot product per row is a widening multiply (vmull_s8: int16 products) and
 * pairwise adds into int32 (vpadalq_s16); ternary codes (0..2) times int8 stay within int16 for the four fields of a
 * group, so they are summed in int16 first: per 64 code bytes 4 ands, 6 shifts and ands, 32 multiplies, 24 adds and 8
 * pairwise adds. */
#define BN_NEON_KERNEL_FILE
#include "kernels_neon.h"

#include <math.h>
#include <string.h>

/* One token (decode): rows 4r, 4r+1 (lo[r]) and 4r+2, 4r+3 (hi[r]) in registers. */
static void ternary_tile_1(const uint8_t *wt, int groups, const int8_t *x, int32_t acc[16]) {
    int32x4_t lo[4], hi[4];
    for (int r = 0; r < 4; r++) lo[r] = hi[r] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g++) {
        const int32x4_t x16 = vreinterpretq_s32_s8(vld1q_s8(x + 16 * g));
        const int8x16_t x0 = vreinterpretq_s8_s32(vdupq_laneq_s32(x16, 0)), x1 = vreinterpretq_s8_s32(vdupq_laneq_s32(x16, 1));
        const int8x16_t x2 = vreinterpretq_s8_s32(vdupq_laneq_s32(x16, 2)), x3 = vreinterpretq_s8_s32(vdupq_laneq_s32(x16, 3));
        for (int r = 0; r < 4; r++) {
            int8x16_t f[4];
            bn_neon_fields(vld1q_u8(wt + g * 64 + 16 * r), f);
            int16x8_t pl = vmull_s8(vget_low_s8(f[0]), vget_low_s8(x0)), ph = vmull_high_s8(f[0], x0);
            pl = vmlal_s8(pl, vget_low_s8(f[1]), vget_low_s8(x1));
            ph = vmlal_high_s8(ph, f[1], x1);
            pl = vmlal_s8(pl, vget_low_s8(f[2]), vget_low_s8(x2));
            ph = vmlal_high_s8(ph, f[2], x2);
            pl = vmlal_s8(pl, vget_low_s8(f[3]), vget_low_s8(x3));
            ph = vmlal_high_s8(ph, f[3], x3);
            lo[r] = vpadalq_s16(lo[r], pl);
            hi[r] = vpadalq_s16(hi[r], ph);
        }
    }
    for (int r = 0; r < 4; r++) vst1q_s32(acc + 4 * r, vpaddq_s32(lo[r], hi[r]));
}

/* The int32 sums of one 2-bit ternary tile (16 rows) for nt tokens. acc2[t][r] holds rows 4r, 4r+1 as
 * [row 4r cols j0+j1, j2+j3, row 4r+1 ...] (lo) and rows 4r+2, 4r+3 (hi); vpaddq_s32 puts them in row order. */
static void ternary_tile(const uint8_t *wt, int groups, const int8_t *x, int kp, int nt, int32_t acc[][16]) {
    if (nt == 1) {
        ternary_tile_1(wt, groups, x, acc[0]);
        return;
    }
    int32x4_t lo[BN_NEON_BLOCK][4], hi[BN_NEON_BLOCK][4];
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) lo[t][r] = hi[t][r] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g++) {
        int8x16_t f[4][4]; /* [register r: rows 4r..4r+3][field s] */
        for (int r = 0; r < 4; r++) bn_neon_fields(vld1q_u8(wt + g * 64 + 16 * r), f[r]);
        for (int t = 0; t < nt; t++) {
            const int32x4_t x16 = vreinterpretq_s32_s8(vld1q_s8(x + (size_t)t * kp + 16 * g));
            int8x16_t xs[4]; /* columns 4s..4s+3 for each of the 4 rows */
            xs[0] = vreinterpretq_s8_s32(vdupq_laneq_s32(x16, 0));
            xs[1] = vreinterpretq_s8_s32(vdupq_laneq_s32(x16, 1));
            xs[2] = vreinterpretq_s8_s32(vdupq_laneq_s32(x16, 2));
            xs[3] = vreinterpretq_s8_s32(vdupq_laneq_s32(x16, 3));
            for (int r = 0; r < 4; r++) {
                int16x8_t pl = vmull_s8(vget_low_s8(f[r][0]), vget_low_s8(xs[0]));
                int16x8_t ph = vmull_high_s8(f[r][0], xs[0]);
                for (int s = 1; s < 4; s++) { /* |sum| <= 4 * 2 * 128: int16 */
                    pl = vmlal_s8(pl, vget_low_s8(f[r][s]), vget_low_s8(xs[s]));
                    ph = vmlal_high_s8(ph, f[r][s], xs[s]);
                }
                lo[t][r] = vpadalq_s16(lo[t][r], pl);
                hi[t][r] = vpadalq_s16(hi[t][r], ph);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) vst1q_s32(acc[t] + 4 * r, vpaddq_s32(lo[t][r], hi[t][r]));
}

/* The same for the int8 head (groups of 4 columns): int8 x int8 products reach 2^14, so each is added in pairs into
 * int32 at once. */
static void int8_tile(const int8_t *wt, int groups, const int8_t *x, int kp, int nt, int32_t acc[][16]) {
    int32x4_t lo[BN_NEON_BLOCK][4], hi[BN_NEON_BLOCK][4];
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) lo[t][r] = hi[t][r] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g++) {
        int8x16_t w[4];
        for (int r = 0; r < 4; r++) w[r] = vld1q_s8(wt + g * 64 + 16 * r);
        for (int t = 0; t < nt; t++) {
            int32_t x4;
            memcpy(&x4, x + (size_t)t * kp + 4 * g, 4);
            const int8x16_t xs = vreinterpretq_s8_s32(vdupq_n_s32(x4));
            for (int r = 0; r < 4; r++) {
                lo[t][r] = vpadalq_s16(lo[t][r], vmull_s8(vget_low_s8(w[r]), vget_low_s8(xs)));
                hi[t][r] = vpadalq_s16(hi[t][r], vmull_high_s8(w[r], xs));
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) vst1q_s32(acc[t] + 4 * r, vpaddq_s32(lo[t][r], hi[t][r]));
}

/* 1.6-bit tiles -> 2-bit tiles, 16 bytes at a time: digit d of q is 3 (q 3^d mod 256) >> 8, which is
 * (t >= 86) + (t >= 171) for t = q 3^d mod 256 (a wrapping multiply and two compares). */
static inline uint8x16_t digit5(uint8x16_t q, int d) {
    static const uint8_t POW3[BN_TRIT5_QUADS] = {1, 3, 9, 27, 81};
    const uint8x16_t t = vmulq_u8(q, vdupq_n_u8(POW3[d]));
    /* each compare is 0xFF (-1) where true: 0 - m1 - m2 counts them */
    return vsubq_u8(vsubq_u8(vdupq_n_u8(0), vcgeq_u8(t, vdupq_n_u8(86))), vcgeq_u8(t, vdupq_n_u8(171)));
}
static inline void unpack5_run(const uint8_t *in, uint8_t *out, int nq) {
    uint8x16_t o = vdupq_n_u8(0);
    for (int m = 0; m < nq; m++) {
        const uint8x16_t field = vshlq_u8(digit5(vld1q_u8(in + (m / 5) * 64), m % 5), vdupq_n_s8((int8_t)(2 * (m % 4))));
        o = m % 4 ? vorrq_u8(o, field) : field;
        if (m % 4 == 3) vst1q_u8(out + (m / 4) * 64, o);
    }
}
#define UNPACK5_RUN(in, out, nq) unpack5_run(in, out, nq)
void bn_neon_unpack5(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2) {
    BN_UNPACK5_TILES(UNPACK5_RUN, tiles5, kp, n_tiles, tiles2, 16);
}

BN_NEON_MATMULS(ternary_tile, int8_tile)

/* 1.6-bit tiles: each chunk of row tiles unpacked once into 2-bit tiles and multiplied there (tiles5.c) */
static void ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                            const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    bn_ternary5_batch(bn_neon_unpack5, ternary_matmul, bn_kernels_portable.ternary5_matmul, codes, kp, row_scale, xq,
                      xsum, xinv, T, n0, n1, y, ldy);
}

static void bf16_matmul(const uint16_t *w, int k, const float *x, int T, int n0, int n1, float *y, int ldy) {
    for (int n = n0; n < n1; n++) {
        const uint16_t *row = w + (size_t)n * k;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * k;
            float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
            int i = 0;
            for (; i + 8 <= k; i += 8) {
                const uint16x8_t h = vld1q_u16(row + i);
                a0 = vaddq_f32(a0, vmulq_f32(vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)), vld1q_f32(xt + i)));
                a1 = vaddq_f32(a1, vmulq_f32(vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)), vld1q_f32(xt + i + 4)));
            }
            float acc = vaddvq_f32(vaddq_f32(a0, a1));
            for (; i < k; i++) {
                union { uint32_t u; float f; } v = {(uint32_t)row[i] << 16};
                acc += v.f * xt[i];
            }
            y[(size_t)t * ldy + n] = acc;
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = vaddq_f32(a0, vmulq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
        a1 = vaddq_f32(a1, vmulq_f32(vld1q_f32(a + i + 4), vld1q_f32(b + i + 4)));
    }
    float acc = vaddvq_f32(vaddq_f32(a0, a1));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void axpy(float a, const float *x, float *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_n_f32(vld1q_f32(x + i), a)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* in double, four chains as kernels_portable.c sums them (chain l: elements 4i + l), so the same float */
static float sumsq(const float *x, int n) {
    float64x2_t c01 = vdupq_n_f64(0.0), c23 = vdupq_n_f64(0.0);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        const float64x2_t d01 = vcvt_f64_f32(vget_low_f32(v)), d23 = vcvt_high_f64_f32(v);
        c01 = vaddq_f64(c01, vmulq_f64(d01, d01));
        c23 = vaddq_f64(c23, vmulq_f64(d23, d23));
    }
    double acc0 = vgetq_lane_f64(c01, 0);
    for (; i < n; i++) acc0 += (double)x[i] * x[i];
    return (float)((acc0 + vgetq_lane_f64(c01, 1)) + (vgetq_lane_f64(c23, 0) + vgetq_lane_f64(c23, 1)));
}

static float absmax(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + i))); /* maxnm: NaN ignored, as portable */
    float r = vmaxnmvq_f32(m);
    for (; i < n; i++) {
        const float a = fabsf(x[i]);
        r = a > r ? a : r;
    }
    return r;
}

/* q = clamp(round_half_even(x * scale)): vcvtnq rounds to nearest even, the saturating narrows clamp */
static int32_t quantize(const float *x, int n, int np, float scale, int8_t *q) {
    int32x4_t s4 = vdupq_n_s32(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i), scale));
        const int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i + 4), scale));
        const int8x8_t v = vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b)));
        vst1_s8(q + i, v);
        s4 = vpadalq_s16(s4, vmovl_s8(v));
    }
    int32_t s = vaddvq_s32(s4);
    for (; i < n; i++) {
        float r = (x[i] * scale + 12582912.0f) - 12582912.0f; /* 1.5 * 2^23: round half to even, |v| < 2^22 */
        r = r > 127.0f ? 127.0f : (r < -128.0f ? -128.0f : r);
        q[i] = (int8_t)r;
        s += q[i];
    }
    for (; i < np; i++) q[i] = 0;
    return s;
}

static void norm_apply(const float *x, float inv, const float *w, float *out, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vmulq_f32(vld1q_f32(w + i), vmulq_n_f32(vld1q_f32(x + i), inv)));
    for (; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

/* quant8(rmsnorm(x) * w) (kernels.h norm_quant): layer.c's composition of sumsq, norm_apply, absmax and quantize, the
 * same operations in the same order (so the same numbers), with norm_apply and absmax sharing one pass */
static int32_t norm_quant(const float *x, const float *w, int n, int np, float eps, float *xn, int8_t *q, float *xinv) {
    const float inv = 1.0f / sqrtf(sumsq(x, n) / (float)n + eps);
    float32x4_t m4 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vmulq_f32(vld1q_f32(w + i), vmulq_n_f32(vld1q_f32(x + i), inv));
        vst1q_f32(xn + i, v);
        m4 = vmaxnmq_f32(m4, vabsq_f32(v)); /* absmax's lanes */
    }
    float m = vmaxnmvq_f32(m4);
    for (; i < n; i++) {
        xn[i] = w[i] * (x[i] * inv);
        const float a = fabsf(xn[i]);
        m = a > m ? a : m;
    }
    if (m < 1e-5f) m = 1e-5f;
    const float scale = 127.0f / m;
    *xinv = 1.0f / scale;
    return quantize(xn, n, np, scale, q);
}

static void relu2_mul(const float *g, const float *u, float *out, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t r = vmaxq_f32(vld1q_f32(g + i), vdupq_n_f32(0.0f));
        vst1q_f32(out + i, vmulq_f32(vmulq_f32(r, r), vld1q_f32(u + i)));
    }
    for (; i < n; i++) {
        const float r = g[i] > 0.0f ? g[i] : 0.0f;
        out[i] = (r * r) * u[i];
    }
}

/* out = silu(g) * u = g * sigmoid(g), with z = e^-|g| (bn_neon_exp_nonpos): sigmoid(g) = 1 / (1 + z) for g >= 0 and
 * z / (1 + z) for g < 0, so the exponential never overflows; relative error about 1e-7, as expf */
static inline float32x4_t silu_mul4(float32x4_t x, float32x4_t u) {
    const float32x4_t one = vdupq_n_f32(1.0f), z = bn_neon_exp_nonpos(vnegq_f32(vabsq_f32(x)));
    const float32x4_t num = vbslq_f32(vcltq_f32(x, vdupq_n_f32(0.0f)), z, one);
    return vmulq_f32(vmulq_f32(x, vdivq_f32(num, vaddq_f32(one, z))), u);
}

static void silu_mul(const float *g, const float *u, float *out, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, silu_mul4(vld1q_f32(g + i), vld1q_f32(u + i)));
    if (i < n) { /* the tail through one padded vector: every element takes the same path */
        float gb[4] = {0}, ub[4] = {0}, ob[4];
        memcpy(gb, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(ub, u + i, sizeof(float) * (size_t)(n - i));
        vst1q_f32(ob, silu_mul4(vld1q_f32(gb), vld1q_f32(ub)));
        memcpy(out + i, ob, sizeof(float) * (size_t)(n - i));
    }
}

static void add(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vld1q_f32(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

/* IEEE half, round to nearest even: the conversions are ARMv8.0 instructions (fcvtn / fcvtl) */
static void to_f16(const float *x, uint16_t *h, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) {
        const float16x4_t v = vcvt_f16_f32(vdupq_n_f32(x[i]));
        h[i] = vget_lane_u16(vreinterpret_u16_f16(v), 0);
    }
}

static inline float32x4_t load_f16(const uint16_t *h) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))); }
static inline float half1(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

static float dot_f16(const float *a, const uint16_t *h, int n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = vaddq_f32(a0, vmulq_f32(vld1q_f32(a + i), load_f16(h + i)));
        a1 = vaddq_f32(a1, vmulq_f32(vld1q_f32(a + i + 4), load_f16(h + i + 4)));
    }
    float acc = vaddvq_f32(vaddq_f32(a0, a1));
    for (; i < n; i++) acc += a[i] * half1(h[i]);
    return acc;
}

static void axpy_f16(float a, const uint16_t *h, float *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_n_f32(load_f16(h + i), a)));
    for (; i < n; i++) y[i] += a * half1(h[i]);
}

/* The sampler's and the greedy choice's row passes (greedy.c, sample.c: their plain loops are the reference, and these
 * give the same results: the same comparisons, each lane in order, then the lanes in order). */

/* The largest of x[0, n) and its first index: per lane, the first of its largest (an entry replaces the lane's only
 * when greater, so NaN never does, and a NaN x[0] stays: as the plain loop, which returns x[0] then), then the first
 * index that holds the largest value. */
static float max_first(const float *x, int n, int *arg) {
    float m = x[0];
    int i = 0;
    if (n >= 8) {
        float32x4_t m0 = vdupq_n_f32(x[0]), m1 = m0;
        for (; i + 8 <= n; i += 8) {
            const float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
            m0 = vbslq_f32(vcgtq_f32(a, m0), a, m0);
            m1 = vbslq_f32(vcgtq_f32(b, m1), b, m1);
        }
        float lanes[8];
        vst1q_f32(lanes, m0);
        vst1q_f32(lanes + 4, m1);
        for (int l = 0; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    if (m != m) { /* NaN: only where x[0] is NaN, which the plain loop keeps */
        *arg = 0;
        return x[0];
    }
    int a = 0;
    while (!(x[a] == m)) a++; /* the first entry equal to the largest (0.0 == -0.0, as the plain loop's ties) */
    *arg = a;
    return x[a];
}

/* sum_i exp(x_i - mx): the float32 exponentials (bn_neon_exp_nonpos) summed in double, in two double pairs, then
 * the tail's (through one padded vector, so every entry goes through the same exponential) in order */
static double expsum(const float *x, int n, float mx) {
    const float32x4_t vmx = vdupq_n_f32(mx);
    float64x2_t s01 = vdupq_n_f64(0.0), s23 = s01;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = bn_neon_exp_nonpos(vsubq_f32(vld1q_f32(x + i), vmx));
        s01 = vaddq_f64(s01, vcvt_f64_f32(vget_low_f32(e)));
        s23 = vaddq_f64(s23, vcvt_high_f64_f32(e));
    }
    double sum = (vgetq_lane_f64(s01, 0) + vgetq_lane_f64(s01, 1)) + (vgetq_lane_f64(s23, 0) + vgetq_lane_f64(s23, 1));
    if (i < n) {
        float b[4] = {mx, mx, mx, mx}; /* padding: e^0, left out of the sum */
        memcpy(b, x + i, sizeof(float) * (size_t)(n - i));
        float e[4];
        vst1q_f32(e, bn_neon_exp_nonpos(vsubq_f32(vld1q_f32(b), vmx)));
        for (int j = 0; j < n - i; j++) sum += (double)e[j];
    }
    return sum;
}

/* exp(x) in double for x in [-708, 0]: 2^k e^r with k = round(x / ln2), r = x - k ln2 (ln2 in fdlibm's two parts: k
 * times the first is exact), |r| <= 0.347; e^r = 1 + (r + r^2 P(r)), P the Taylor series to r^11 / 13! (the rest
 * < 5e-18 of an ulp's worth), in Estrin's scheme; 2^k built in the exponent field (k >= -1021: a normal number).
 * Within ~1 ulp of libm's exp, as kernels_x86_sampler.c's exp_pd. */
static inline float64x2_t exp_pd2(float64x2_t x) {
    const float64x2_t k = vrndnq_f64(vmulq_n_f64(x, 1.4426950408889634));
    const float64x2_t r = vfmsq_f64(vfmsq_f64(x, k, vdupq_n_f64(6.93147180369123816490e-01)), k,
                                    vdupq_n_f64(1.90821492927058770002e-10));
#define TERMS(a, b) vfmaq_f64(vdupq_n_f64(1.0 / (a)), vdupq_n_f64(1.0 / (b)), r) /* 1/a + r/b */
    const float64x2_t r2 = vmulq_f64(r, r), r4 = vmulq_f64(r2, r2), r8 = vmulq_f64(r4, r4);
    const float64x2_t p03 = vfmaq_f64(TERMS(2, 6), TERMS(24, 120), r2);
    const float64x2_t p47 = vfmaq_f64(TERMS(720, 5040), TERMS(40320, 362880), r2);
    const float64x2_t p8b = vfmaq_f64(TERMS(3628800, 39916800), TERMS(479001600, 6227020800.0), r2);
#undef TERMS
    const float64x2_t p = vfmaq_f64(vfmaq_f64(p03, p47, r4), p8b, r8);
    const float64x2_t e = vaddq_f64(vdupq_n_f64(1.0), vfmaq_f64(r, r2, p));
    const int64x2_t two_k = vshlq_n_s64(vaddq_s64(vcvtq_s64_f64(k), vdupq_n_s64(1023)), 52);
    return vmulq_f64(e, vreinterpretq_f64_s64(two_k));
}

/* w[i] = exp(z[i] - top) and their sum (kernels.h exp_shifted), two at a time; a pair with an x below -708 (2^k would
 * leave the normal range; -inf, a banned id, is one) or NaN takes libm's exp instead */
static double exp_shifted(const double *z, double top, double *w, int n) {
    const float64x2_t vtop = vdupq_n_f64(top), lo = vdupq_n_f64(-708.0);
    float64x2_t s0 = vdupq_n_f64(0.0), s1 = s0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float64x2_t x0 = vsubq_f64(vld1q_f64(z + i), vtop), x1 = vsubq_f64(vld1q_f64(z + i + 2), vtop);
        const uint64x2_t in = vandq_u64(vcgeq_f64(x0, lo), vcgeq_f64(x1, lo)); /* false for NaN */
        if (vgetq_lane_u64(in, 0) & vgetq_lane_u64(in, 1)) {
            vst1q_f64(w + i, exp_pd2(x0));
            vst1q_f64(w + i + 2, exp_pd2(x1));
        } else {
            for (int j = i; j < i + 4; j++) w[j] = exp(z[j] - top);
        }
        s0 = vaddq_f64(s0, vld1q_f64(w + i));
        s1 = vaddq_f64(s1, vld1q_f64(w + i + 2));
    }
    double sum = (vgetq_lane_f64(s0, 0) + vgetq_lane_f64(s0, 1)) + (vgetq_lane_f64(s1, 0) + vgetq_lane_f64(s1, 1));
    for (; i < n; i++) {
        w[i] = exp(z[i] - top);
        sum += w[i];
    }
    return sum;
}

/* z[i] = x[i] * inv_t in double; the largest z (NaN ignored, -inf if none; where the largest is a zero, its sign may
 * differ from the plain loop's, which the sampler's z - top cannot see), the count of -inf and of NaN or +inf */
static double scale_row(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad) {
    const float64x2_t neg_inf = vdupq_n_f64(-INFINITY), zero = vdupq_n_f64(0.0);
    float64x2_t top = neg_inf;
    int64x2_t neg = vdupq_n_s64(0), finite = vdupq_n_s64(0); /* masks are -1 where true: subtract them */
    int i = 0;
    for (; i + 2 <= n; i += 2) {
        const float64x2_t v = vmulq_n_f64(vcvt_f64_f32(vld1_f32(x + i)), inv_t);
        vst1q_f64(z + i, v);
        top = vbslq_f64(vcgtq_f64(v, top), v, top);
        neg = vsubq_s64(neg, vreinterpretq_s64_u64(vceqq_f64(v, neg_inf)));
        /* v - v == 0 fails for NaN and +-inf */
        finite = vsubq_s64(finite, vreinterpretq_s64_u64(vceqq_f64(vsubq_f64(v, v), zero)));
    }
    double t = vgetq_lane_f64(top, 0);
    t = vgetq_lane_f64(top, 1) > t ? vgetq_lane_f64(top, 1) : t;
    int n_neg = (int)(vgetq_lane_s64(neg, 0) + vgetq_lane_s64(neg, 1));
    int n_nonfinite = i - (int)(vgetq_lane_s64(finite, 0) + vgetq_lane_s64(finite, 1));
    for (; i < n; i++) {
        const double v = (double)x[i] * inv_t;
        z[i] = v;
        t = v > t ? v : t;
        n_neg += v == -INFINITY;
        n_nonfinite += !(v - v == 0.0);
    }
    *n_neginf = n_neg;
    *n_bad = n_nonfinite - n_neg;
    return t;
}

/* The j (ascending) with w[j] >= t: four at a time compared, most of a row's weights falling short */
static int select_at_least(const double *w, int n, double t, int *out) {
    const float64x2_t tt = vdupq_n_f64(t);
    int m = 0, j = 0;
    for (; j + 4 <= n; j += 4) {
        const uint64x2_t a = vcgeq_f64(vld1q_f64(w + j), tt), b = vcgeq_f64(vld1q_f64(w + j + 2), tt);
        if (!(vgetq_lane_u64(vorrq_u64(a, b), 0) | vgetq_lane_u64(vorrq_u64(a, b), 1))) continue;
        for (int l = 0; l < 4; l++)
            if (w[j + l] >= t) out[m++] = j + l;
    }
    for (; j < n; j++)
        if (w[j] >= t) out[m++] = j;
    return m;
}

void bn_neon_fill(bn_kernels *k) {
    k->ternary_matmul = ternary_matmul;
    k->ternary5_matmul = ternary5_matmul;
    k->unpack5 = bn_neon_unpack5;
    k->trit5_windows = 0;
    k->int8_matmul = int8_matmul;
    k->bf16_matmul = bf16_matmul;
    k->dot = dot;
    k->axpy = axpy;
    k->sumsq = sumsq;
    k->absmax = absmax;
    k->quantize = quantize;
    k->norm_apply = norm_apply;
    k->norm_quant = norm_quant;
    k->relu2_mul = relu2_mul;
    k->silu_mul = silu_mul;
    k->add = add;
    k->to_f16 = to_f16;
    k->dot_f16 = dot_f16;
    k->axpy_f16 = axpy_f16;
    k->attend_rows = bn_neon_attend_rows;
    k->max_first = max_first;
    k->expsum = expsum;
    k->exp_shifted = exp_shifted;
    k->scale_row = scale_row;
    k->select_at_least = select_at_least;
}
