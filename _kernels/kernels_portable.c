/* Portable C kernels: the plain reference path, and the fallback for CPUs without AVX2.
 * Same tile layouts as the SIMD files (bitnet_app/packing.py):
 *   ternary byte [t, g, 4i+j] bits 2s = code(row 16t+i, col 16g+4s+j), code = w + 1
 *   int8    byte [t, g, 4i+j]          = w8(row 16t+i, col 4g+j)
 *   1.6-bit byte [t, g, 4i+j] digit d  = code(row 16t+i, col 20g+4d+j), digit d of q = 3 (q 3^d mod 256) >> 8
 */
#include "kernels.h"

/* y[n] = (acc[i] - xsum) * xinv * row_scale[n] for the 16 rows n = 16 tile + i of a ternary tile */
static void store_rows(const int32_t acc[16], int tile, int32_t xsum, float xinv, const float *row_scale, float *y) {
    for (int i = 0; i < 16; i++) {
        const int n = tile * 16 + i;
        y[n] = (float)(acc[i] - xsum) * xinv * row_scale[n];
    }
}

/* acc[i] += sum_k code(row i, k) * x[k] for one 16-row tile: 2-bit codes (groups of 16 columns) */
static void tile_dot2(const uint8_t *wt, int kp, const int8_t *x, int32_t acc[16]) {
    for (int g = 0; g < kp / 16; g++) {
        const uint8_t *p = wt + g * 64;
        const int8_t *xg = x + g * 16;
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 4; j++) {
                const unsigned b = p[4 * i + j];
                acc[i] += (int)(b & 3) * xg[j] + (int)((b >> 2) & 3) * xg[4 + j] +
                          (int)((b >> 4) & 3) * xg[8 + j] + (int)(b >> 6) * xg[12 + j];
            }
    }
}

/* the same from 1.6-bit codes (groups of 20 columns, the last one possibly partial) */
static void tile_dot5(const uint8_t *wt, int kp, const int8_t *x, int32_t acc[16]) {
    const int quads = kp / 4;
    for (int g = 0; g < bn_trit5_groups(kp); g++) {
        const int nd = quads - 5 * g < BN_TRIT5_QUADS ? quads - 5 * g : BN_TRIT5_QUADS;
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 4; j++)
                for (int d = 0; d < nd; d++) acc[i] += bn_trit5_file_digit(wt[g * 64 + 4 * i + j], d) * x[4 * (5 * g + d) + j];
    }
}

/* kernels.h's ternary_matmul for tiles of tile_bytes each, through one tile's dot products */
static void walk_tiles(void (*tile_dot)(const uint8_t *, int, const int8_t *, int32_t *), size_t tile_bytes,
                       const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum,
                       const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    for (int tile = n0 / 16; tile < n1 / 16; tile++)
        for (int t = 0; t < T; t++) {
            int32_t acc[16] = {0};
            tile_dot(codes + (size_t)tile * tile_bytes, kp, xq + (size_t)t * kp, acc);
            store_rows(acc, tile, xsum[t], xinv[t], row_scale, y + (size_t)t * ldy);
        }
}

static void ternary_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                           const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    walk_tiles(tile_dot2, (size_t)kp / 16 * 64, codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy);
}

static void ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                            const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    walk_tiles(tile_dot5, (size_t)bn_trit5_groups(kp) * 64, codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy);
}

/* 1.6-bit tiles -> 2-bit tiles: quad m's codes (digit m % 5 of group m / 5) into field m % 4 of group m / 4 */
static void unpack5(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2) {
    const int quads = kp / 4, g5 = bn_trit5_groups(kp), g2 = kp / 16;
    for (int tile = 0; tile < n_tiles; tile++) {
        const uint8_t *in = tiles5 + (size_t)tile * g5 * 64;
        uint8_t *out = tiles2 + (size_t)tile * g2 * 64;
        for (int m = 0; m < quads; m++)
            for (int b = 0; b < 64; b++) {
                uint8_t *o = out + (m / 4) * 64 + b;
                const unsigned field = (unsigned)bn_trit5_file_digit(in[(m / 5) * 64 + b], m % 5) << (2 * (m % 4));
                *o = (uint8_t)(m % 4 ? *o | field : field);
            }
    }
}

static void int8_matmul(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                        const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    (void)rowsum; /* only the u8-offset SIMD paths need it */
    const int groups = kp / 4;
    for (int tile = n0 / 16; tile < n1 / 16; tile++) {
        const int8_t *wt = w + (size_t)tile * groups * 64;
        for (int t = 0; t < T; t++) {
            const int8_t *x = xq + (size_t)t * kp;
            int32_t acc[16] = {0};
            for (int g = 0; g < groups; g++)
                for (int i = 0; i < 16; i++)
                    for (int j = 0; j < 4; j++) acc[i] += wt[g * 64 + 4 * i + j] * x[4 * g + j];
            for (int i = 0; i < 16; i++) {
                const int n = tile * 16 + i;
                y[(size_t)t * ldy + n] = (float)acc[i] * xinv[t] * row_scale[n];
            }
        }
    }
}

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

static void bf16_matmul(const uint16_t *w, int k, const float *x, int T, int n0, int n1, float *y, int ldy) {
    for (int n = n0; n < n1; n++) {
        const uint16_t *row = w + (size_t)n * k;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * k;
            float acc = 0.0f;
            for (int i = 0; i < k; i++) acc += bf16_to_float(row[i]) * xt[i];
            y[(size_t)t * ldy + n] = acc;
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void axpy(float a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* in double, like the SIMD paths; four chains so the adds overlap */
static float sumsq(const float *x, int n) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++) acc[l] += (double)x[i + l] * x[i + l];
    for (; i < n; i++) acc[0] += (double)x[i] * x[i];
    return (float)((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

static float absmax(const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        m = a > m ? a : m;
    }
    return m;
}

/* round half to even for |v| < 2^22 (here |v| <= 127 after the scale) without a libm call */
static inline float round_even(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (v + magic) - magic;
}

static int32_t quantize(const float *x, int n, int np, float scale, int8_t *q) {
    int32_t s = 0;
    for (int i = 0; i < n; i++) {
        float r = round_even(x[i] * scale);
        r = r > 127.0f ? 127.0f : (r < -128.0f ? -128.0f : r);
        q[i] = (int8_t)r;
        s += q[i];
    }
    for (int i = n; i < np; i++) q[i] = 0;
    return s;
}

static void norm_apply(const float *x, float inv, const float *w, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

static void relu2_mul(const float *g, const float *u, float *out, int n) {
    for (int i = 0; i < n; i++) {
        const float r = g[i] > 0.0f ? g[i] : 0.0f;
        out[i] = (r * r) * u[i];
    }
}

static void add(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

/* float <-> IEEE half in plain C, rounding to nearest even like F16C's vcvtps2ph. */
static uint16_t float_to_half(float f) {
    union { float f; uint32_t u; } v = {f};
    const uint32_t sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u : 0)); /* inf, nan */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);                                /* overflow */
    if (a < 0x38800000u) {                                                                  /* subnormal */
        if (a < 0x33000000u) return (uint16_t)sign;                                        /* to zero */
        const uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;       /* 14..24 */
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((a >> 13) - (112u << 10));                /* rebias 127 -> 15 */
    const uint32_t rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;  /* may carry into the exponent: still right */
    return (uint16_t)(sign | h);
}

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FFu;
    union { uint32_t u; float f; } v;
    if (e == 0) {
        v.f = (float)m * 5.9604644775390625e-08f; /* m * 2^-24 */
        v.u |= sign;
    } else if (e == 31) {
        v.u = sign | 0x7F800000u | (m << 13);
    } else {
        v.u = sign | ((e + 112) << 23) | (m << 13);
    }
    return v.f;
}

static void to_f16(const float *x, uint16_t *h, int n) {
    for (int i = 0; i < n; i++) h[i] = float_to_half(x[i]);
}

static float dot_f16(const float *a, const uint16_t *h, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * half_to_float(h[i]);
    return acc;
}

static void axpy_f16(float a, const uint16_t *h, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a * half_to_float(h[i]);
}

const bn_kernels bn_kernels_portable = {
    .name = "portable", .ternary_matmul = ternary_matmul, .ternary5_matmul = ternary5_matmul, .unpack5 = unpack5,
    .int8_matmul = int8_matmul, .bf16_matmul = bf16_matmul, .dot = dot, .axpy = axpy, .sumsq = sumsq,
    .absmax = absmax, .quantize = quantize, .norm_apply = norm_apply, .relu2_mul = relu2_mul, .add = add,
    .to_f16 = to_f16, .dot_f16 = dot_f16, .axpy_f16 = axpy_f16,
};
