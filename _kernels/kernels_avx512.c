/* AVX512-VNNI kernels (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma).
 *
 * Ternary: one 64-byte load holds a 16-row x 16-column tile of 2-bit codes. Shifting by 2s and masking
 * gives four registers, each 16 int32 lanes = 16 rows x 4 consecutive columns, so `vpdpbusd`
 * (u8 codes x s8 activations broadcast 4 bytes at a time) accumulates one row per lane with no
 * horizontal sums. A tile is unpacked once per block of up to 16 tokens and reused for all of them.
 * Small blocks split each token's sum over several accumulators to hide the vpdpbusd latency.
 *
 * Int8 head: each 64-byte group is 16 rows x 4 columns of s8 weights; activations are offset to u8
 * (x ^ 0x80 == x + 128), so the sum carries 128 * rowsum[n], removed at the end.
 *
 * 1.6-bit tiles: on a CPU with AVX512-VBMI and GFNI (Zen 4, Ice Lake and later) they arrive in the window code
 * (trit5_windows.c; the engine translates the file's bytes once) and one token is decoded by lookups
 * (window_tile_1); elsewhere (Skylake-X, Cascade Lake, or BITNET_NO_VBMI) in the file's code (ternary5_tile_1).
 * The elementwise ops are kernels_avx512_vector.c's; the attention and the sampler's passes are the x86 files'
 * (256-bit, kernels_x86.h).
 */
#include <pthread.h>
#include <stdlib.h>

#include "kernels_x86.h"

/* Accumulators per token: more when the block is small (to hide the vpdpbusd latency), one when large
 * (registers). RT row tiles x BT tokens x NA accumulators <= 16 of the 32 zmm registers. */
#define ACCS_PER_TOKEN(bt) ((bt) <= 2 ? 4 : (bt) <= 4 ? 2 : 1)

/* y (BT tokens x RT row tiles of 16) = (the int32 sums of acc[r][b * na + a] over a - xsum) * xinv * row_scale */
static inline __attribute__((always_inline)) void store_sums(__m512i acc[2][16], const int rt, const int bt,
                                                             const int na, const float *row_scale, const int32_t *xsum,
                                                             const float *xinv, float *y, int ldy) {
#pragma GCC unroll 2
    for (int r = 0; r < rt; r++) {
        const __m512 scale = _mm512_loadu_ps(row_scale + 16 * r);
#pragma GCC unroll 16
        for (int b = 0; b < bt; b++) {
            __m512i sum = acc[r][b * na];
#pragma GCC unroll 4
            for (int a = 1; a < na; a++) sum = _mm512_add_epi32(sum, acc[r][b * na + a]);
            sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(xsum[b]));
            const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xinv[b])), scale);
            _mm512_storeu_ps(y + (size_t)b * ldy + 16 * r, v);
        }
    }
}

/* Accumulators per token of a block of RT row tiles x BT tokens */
#define ACCS(rt, bt) ((rt) == 1 ? ACCS_PER_TOKEN(bt) : ((bt) <= 4 ? 2 : 1))

/* RT (1 or 2) consecutive row tiles x BT tokens: each 4-byte activation broadcast feeds RT dot products. */
static inline __attribute__((always_inline)) void ternary_block(
    const uint8_t *wt, int groups, const int8_t *x, int kp, const int rt, const int bt, const float *row_scale,
    const int32_t *xsum, const float *xinv, float *y, int ldy) {
    const int na = ACCS(rt, bt);
    const __m512i m3 = _mm512_set1_epi8(3);
    const size_t tile_bytes = (size_t)groups * 64;
    __m512i acc[2][16];
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
        for (int a = 0; a < 16; a++) acc[r][a] = _mm512_setzero_si512();
    for (int g = 0; g < groups; g++) {
        __m512i w[2][4];
#pragma GCC unroll 2
        for (int r = 0; r < rt; r++) {
            const uint8_t *p = wt + r * tile_bytes + g * 64;
            _mm_prefetch((const char *)(p + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
            if (bt == 1) _mm_prefetch((const char *)(p + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1); /* decode: L2 too (kernels.h) */
            const __m512i v = _mm512_loadu_si512((const void *)p);
            w[r][0] = _mm512_and_si512(v, m3);
            w[r][1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), m3);
            w[r][2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m3);
            w[r][3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), m3);
        }
#pragma GCC unroll 16
        for (int b = 0; b < bt; b++) {
            const int8_t *xg = x + (size_t)b * kp + g * 16;
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                const __m512i xb = _mm512_set1_epi32(load_i32(xg + 4 * s));
                const int a = b * na + (s % na);
#pragma GCC unroll 2
                for (int r = 0; r < rt; r++) acc[r][a] = _mm512_dpbusd_epi32(acc[r][a], w[r][s], xb);
            }
        }
    }
    store_sums(acc, rt, bt, na, row_scale, xsum, xinv, y, ldy);
}

static void ternary_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                           const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    const int groups = kp / 16;
#define TERNARY_CALL(RT, BT)                                                                          \
    ternary_block(codes + (size_t)tile * groups * 64, groups, xq + (size_t)t0 * kp, kp, RT, BT,        \
                  row_scale + tile * 16, xsum + t0, xinv + t0, y + (size_t)t0 * ldy + tile * 16, ldy)
#define PAIR_CALL(BT) TERNARY_CALL(2, BT)
#define ONE_CALL(BT) TERNARY_CALL(1, BT)
    int tile = n0 / 16;
    if (T > 1) /* pairs of row tiles share each activation broadcast */
        for (; tile + 2 <= n1 / 16; tile += 2) { DISPATCH_BLOCKS(PAIR_CALL) }
    for (; tile < n1 / 16; tile++) { DISPATCH_BLOCKS(ONE_CALL) }
#undef ONE_CALL
#undef PAIR_CALL
#undef TERNARY_CALL
}

/* ---------------------------------------------------------------- 1.6-bit tiles (5 codes a byte, packing.py)
 *
 * One token from the file's code (CPUs without VBMI and GFNI; window_tile_1 below is the other): a 64-byte group
 * holds 16 rows x 20 columns; digit d of its bytes is the code of columns 4d + j. With
 * t_d = q 3^d mod 256 (t_{d+1} = 3 t_d: two wrapping byte adds) the code is c_d = (3 t_d - t_{d+1}) / 256, so
 *   256 * sum_d c_d . x_d = 3 * sum_d t_d . x_d - sum_d t_{d+1} . x_d
 * and the codes are never formed: two vpdpbusd per digit (u8 t x s8 activations, as the 2-bit kernel's codes), one
 * into A, one into B, and (3A - B) >> 8 at the end. Each product is at most 255 x 128, so A and B may wrap in int32,
 * but 3A - B = 256 x (the code sum), which fits while kp <= BN_TRIT5_MAX_KP: the wrapped difference is exact. One
 * accumulator per digit (10 in all), so consecutive vpdpbusd do not wait for each other. A batch: tiles5.c. */
static inline __attribute__((always_inline)) void ternary5_group(__m512i t, const int8_t *xg, const int nd,
                                                                 __m512i a[BN_TRIT5_QUADS], __m512i b[BN_TRIT5_QUADS]) {
#pragma GCC unroll 5
    for (int d = 0; d < nd; d++) {
        const __m512i xb = _mm512_set1_epi32(load_i32(xg + 4 * d));
        a[d] = _mm512_dpbusd_epi32(a[d], t, xb);
        t = _mm512_add_epi8(t, _mm512_add_epi8(t, t)); /* t_{d+1} = 3 t_d mod 256 */
        b[d] = _mm512_dpbusd_epi32(b[d], t, xb);
    }
}

static void ternary5_tile_1(const uint8_t *wt, int kp, const int8_t *x, const float *row_scale, int32_t xsum,
                            float xinv, float *y) {
    const int quads = kp / 4, full = quads / BN_TRIT5_QUADS, rest = quads % BN_TRIT5_QUADS;
    __m512i a[BN_TRIT5_QUADS], b[BN_TRIT5_QUADS];
#pragma GCC unroll 5
    for (int d = 0; d < BN_TRIT5_QUADS; d++) a[d] = b[d] = _mm512_setzero_si512();
    for (int g = 0; g < full; g++) {
        const uint8_t *p = wt + (size_t)g * 64;
        _mm_prefetch((const char *)(p + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1); /* and into L2 (kernels.h) */
        ternary5_group(_mm512_loadu_si512((const void *)p), x + 20 * g, BN_TRIT5_QUADS, a, b);
    }
    switch (rest) { /* the last group's quads, when kp / 4 is not a multiple of 5 */
        case 4: ternary5_group(_mm512_loadu_si512((const void *)(wt + (size_t)full * 64)), x + 20 * full, 4, a, b); break;
        case 3: ternary5_group(_mm512_loadu_si512((const void *)(wt + (size_t)full * 64)), x + 20 * full, 3, a, b); break;
        case 2: ternary5_group(_mm512_loadu_si512((const void *)(wt + (size_t)full * 64)), x + 20 * full, 2, a, b); break;
        case 1: ternary5_group(_mm512_loadu_si512((const void *)(wt + (size_t)full * 64)), x + 20 * full, 1, a, b); break;
        default: break;
    }
    const __m512i A = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3])), a[4]);
    const __m512i B = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(b[0], b[1]), _mm512_add_epi32(b[2], b[3])), b[4]);
    const __m512i codes_x = _mm512_srai_epi32(_mm512_sub_epi32(_mm512_add_epi32(A, _mm512_add_epi32(A, A)), B), 8);
    const __m512i sum = _mm512_sub_epi32(codes_x, _mm512_set1_epi32(xsum));
    _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xinv)),
                                      _mm512_loadu_ps(row_scale)));
}

/* 1.6-bit tiles -> 2-bit tiles (kernels.h unpack5). Quad m's codes (digit m % 5 of group m / 5) go to field m % 4 of
 * group m / 4, so the pattern repeats every 20 quads (4 groups in, 5 out): unpack5_run takes nq quads (a multiple of
 * 4, at most 20) from `in` with every index a constant once inlined. A digit's code is [t >= 86] + [t >= 171]
 * (= 3t >> 8), added to its field as two masked adds. */
static inline __attribute__((always_inline)) void unpack5_run(const uint8_t *in, uint8_t *out, const int nq) {
    const __m512i lo = _mm512_set1_epi8(86), hi = _mm512_set1_epi8((char)171);
    __m512i t = _mm512_setzero_si512(), acc = _mm512_setzero_si512();
#pragma GCC unroll 20
    for (int m = 0; m < nq; m++) {
        if (m % BN_TRIT5_QUADS == 0) {
            _mm_prefetch((const char *)(in + (m / BN_TRIT5_QUADS) * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
            t = _mm512_loadu_si512((const void *)(in + (m / BN_TRIT5_QUADS) * 64));
        }
        const __m512i field = _mm512_set1_epi8((char)(1 << (2 * (m % 4))));
        acc = _mm512_mask_add_epi8(acc, _mm512_cmpge_epu8_mask(t, lo), acc, field);
        acc = _mm512_mask_add_epi8(acc, _mm512_cmpge_epu8_mask(t, hi), acc, field);
        t = _mm512_add_epi8(t, _mm512_add_epi8(t, t));
        if (m % 4 == 3) {
            _mm512_storeu_si512((void *)(out + (m / 4) * 64), acc);
            acc = _mm512_setzero_si512();
        }
    }
}

static void unpack5(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2) {
    BN_UNPACK5_TILES(unpack5_run, tiles5, kp, n_tiles, tiles2, 64);
}

/* The same unpacking from the window code (trit5_windows.c) with AVX512-VBMI's byte permutes (Zen 4, Ice Lake and
 * later Intel; not Skylake-X or Cascade Lake), about 3x fewer instructions: two 256-entry tables map each byte q to
 * F4 = c0 | c1 << 2 | c2 << 4 | c3 << 6 (its first four codes as one 2-bit byte) and to C4 = c4 (each lookup: two
 * 128-entry vpermi2b and a blend on bit 7 of q). Of 4 groups in, 5 groups out: out0 = F4(g0); out1 = C4(g0) | F4(g1) << 2; out2 = F4(g1) >> 6 | C4(g1) << 2 |
 * F4(g2) << 4; out3 = F4(g2) >> 4 | C4(g2) << 4 | F4(g3) << 6; out4 = F4(g3) >> 2 | C4(g3) << 6, each shift a 16-bit
 * one whose bits from the neighbouring byte a vpternlogd clears. */
static uint8_t vbmi_tables[2][256]; /* [F4, C4][q], q a byte of the window code (trit5_windows.c) */
static pthread_once_t vbmi_once = PTHREAD_ONCE_INIT;
static void fill_vbmi_tables(void) {
    for (unsigned q = 0; q < 256; q++) {
        unsigned c[BN_TRIT5_QUADS];
        for (int d = 0; d < BN_TRIT5_QUADS; d++) c[d] = (unsigned)bn_trit5_window_digit(q, d);
        vbmi_tables[0][q] = (uint8_t)(c[0] | c[1] << 2 | c[2] << 4 | c[3] << 6);
        vbmi_tables[1][q] = (uint8_t)c[4];
    }
}

typedef struct {
    __m512i f4[4], c4[4]; /* each table as four 64-byte registers */
} vbmi_luts;

__attribute__((target("avx512vbmi"))) static inline void vbmi_lookup(const vbmi_luts *t, __m512i q, __m512i *f4,
                                                                     __m512i *c4) {
    const __mmask64 high = _mm512_movepi8_mask(q); /* q >= 128: the tables' second half */
    *f4 = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(t->f4[0], q, t->f4[1]),
                                 _mm512_permutex2var_epi8(t->f4[2], q, t->f4[3]));
    *c4 = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(t->c4[0], q, t->c4[1]),
                                 _mm512_permutex2var_epi8(t->c4[2], q, t->c4[3]));
}

/* (a & m) | b in one vpternlogd: operands A = a, B = b, C = m, truth table (A & C) | B = 0xEC */
#define AND_OR(a, m, b) _mm512_ternarylogic_epi32((a), (b), (m), 0xEC)

/* nq quads (a multiple of 4, at most 20) of one row tile: the output groups nq / 4 */
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void unpack5_vbmi_run(
    const vbmi_luts *t, const uint8_t *in, uint8_t *out, const int nq) {
    __m512i f[4], c[4];
#pragma GCC unroll 4
    for (int g = 0; g < (nq + 4) / 5; g++) {
        _mm_prefetch((const char *)(in + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
        vbmi_lookup(t, _mm512_loadu_si512((const void *)(in + g * 64)), &f[g], &c[g]);
    }
    _mm512_storeu_si512((void *)out, f[0]);
    if (nq > 4) /* C4(g0) | F4(g1) << 2 */
        _mm512_storeu_si512((void *)(out + 64), AND_OR(_mm512_slli_epi16(f[1], 2), _mm512_set1_epi8((char)0xFC), c[0]));
    if (nq > 8) { /* F4(g1) >> 6 | C4(g1) << 2 | F4(g2) << 4 */
        const __m512i lo = AND_OR(_mm512_srli_epi16(f[1], 6), _mm512_set1_epi8(0x03), _mm512_slli_epi16(c[1], 2));
        _mm512_storeu_si512((void *)(out + 128), AND_OR(_mm512_slli_epi16(f[2], 4), _mm512_set1_epi8((char)0xF0), lo));
    }
    if (nq > 12) { /* F4(g2) >> 4 | C4(g2) << 4 | F4(g3) << 6 */
        const __m512i lo = AND_OR(_mm512_srli_epi16(f[2], 4), _mm512_set1_epi8(0x0F), _mm512_slli_epi16(c[2], 4));
        _mm512_storeu_si512((void *)(out + 192), AND_OR(_mm512_slli_epi16(f[3], 6), _mm512_set1_epi8((char)0xC0), lo));
    }
    if (nq > 16) /* F4(g3) >> 2 | C4(g3) << 6 */
        _mm512_storeu_si512((void *)(out + 256), AND_OR(_mm512_srli_epi16(f[3], 2), _mm512_set1_epi8(0x3F),
                                                        _mm512_slli_epi16(c[3], 6)));
}

__attribute__((target("avx512vbmi"))) static void unpack5_vbmi(const uint8_t *tiles5, int kp, int n_tiles,
                                                               uint8_t *tiles2) {
    pthread_once(&vbmi_once, fill_vbmi_tables);
    vbmi_luts t;
    for (int i = 0; i < 4; i++) {
        t.f4[i] = _mm512_loadu_si512((const void *)(vbmi_tables[0] + 64 * i));
        t.c4[i] = _mm512_loadu_si512((const void *)(vbmi_tables[1] + 64 * i));
    }
#define VBMI_RUN(in, out, nq) unpack5_vbmi_run(&t, in, out, nq)
    BN_UNPACK5_TILES(VBMI_RUN, tiles5, kp, n_tiles, tiles2, 64);
#undef VBMI_RUN
}

/* Which 1.6-bit code this CPU's kernels read, and so which unpacking (the path's table entry unpack5, the batches of
 * ternary5_matmul): with AVX512-VBMI and GFNI the window code (the engine translates the file's bytes as it loads
 * them; dispatch.c puts the flag in the table), else the file's bytes as they are. BITNET_NO_VBMI (any value) keeps
 * the file's bytes, so the tests run both on a VBMI machine. */
static bn_unpack5_fn best_unpack5;
static int have_vbmi; /* the window code: this CPU has AVX512-VBMI and GFNI, and BITNET_NO_VBMI is not set */
static pthread_once_t unpack5_once = PTHREAD_ONCE_INIT;
static void choose_unpack5(void) {
    __builtin_cpu_init();
    have_vbmi = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni") && !getenv("BITNET_NO_VBMI");
    best_unpack5 = have_vbmi ? unpack5_vbmi : unpack5;
}
int bn_avx512_trit5_windows(void) {
    pthread_once(&unpack5_once, choose_unpack5);
    return have_vbmi;
}
static void unpack5_best(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2) {
    pthread_once(&unpack5_once, choose_unpack5);
    best_unpack5(tiles5, kp, n_tiles, tiles2);
}

/* A batch of 1.6-bit tiles on a VBMI CPU, unpacked by its first block of tokens as it goes. Unpacking a whole chunk
 * of tiles before multiplying it (tiles5.c) leaves the core waiting on memory while it unpacks and idle on memory
 * while it multiplies; here the first block of up to 8 tokens reads the packed bytes with the 2-bit kernel's
 * prefetch, looks each 64-byte group up (vbmi_lookup: F4 = digits 0-3 as 2-bit fields, C4 = digit 4) and multiplies
 * its five digits at once, so the reads overlap the products as on 2-bit tiles. When more blocks follow, it also
 * writes each run of 20 quads (4 groups in, 80 columns) to this thread's buffer as five 64-byte registers:
 *   F4(g0) F4(g1) F4(g2) F4(g3) C,   C = C4(g0) | C4(g1) << 2 | C4(g2) << 4 | C4(g3) << 6
 * which the later blocks split into fields as the 2-bit kernel does: field f of F4(gi) holds columns 20 gi + 4 f of
 * the run, field gi of C columns 20 gi + 16. The products are the 2-bit kernel's in another order, summed exactly in
 * int32: the same y, bit for bit. A short last run (kp / 4 % 20 quads) keeps the same slots, its absent digits
 * skipped. */
#define RUN_QUADS 20
#define RUN_BYTES (5 * 64)
static inline size_t run_buffer_tile(int kp) { return (size_t)((kp / 4 + RUN_QUADS - 1) / RUN_QUADS) * RUN_BYTES; }

/* Run `run` (nq quads, a multiple of 4, at most 20) of RT row tiles for BT tokens, into acc (NA per token). packed:
 * read the 1.6-bit groups of w5 (row tile r at w5 + r * tile5), and write the run to buf when store; else read it
 * from buf (row tile r at buf + r * tile_buf). Each pointer is offset only where it is read or written (w5 or buf
 * may be NULL where unused). x: the run's first column of token 0. */
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void ternary5_run(
    const vbmi_luts *lut, const uint8_t *w5, size_t tile5, uint8_t *buf, size_t tile_buf, int run, const int packed,
    int store, const int8_t *x, int kp, const int rt, const int bt, const int na, const int nq, __m512i acc[2][16]) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const size_t in = (size_t)run * 4 * 64, out = (size_t)run * RUN_BYTES; /* the run's offsets in w5 and buf */
    __m512i c[2]; /* C: built (packed) or loaded */
#pragma GCC unroll 2
    for (int r = 0; r < rt; r++)
        c[r] = packed ? _mm512_setzero_si512() : _mm512_loadu_si512((const void *)(buf + out + r * tile_buf + 4 * 64));
#pragma GCC unroll 4
    for (int gi = 0; gi < (nq + 4) / 5; gi++) {
        const int nd = nq - 5 * gi < 5 ? nq - 5 * gi : 5; /* this group's digits in the run */
        __m512i f4[2], c4[2];
#pragma GCC unroll 2
        for (int r = 0; r < rt; r++) {
            if (packed) {
                const uint8_t *p = w5 + in + r * tile5 + gi * 64;
                _mm_prefetch((const char *)(p + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
                vbmi_lookup(lut, _mm512_loadu_si512((const void *)p), &f4[r], &c4[r]);
                if (store) {
                    _mm512_storeu_si512((void *)(buf + out + r * tile_buf + gi * 64), f4[r]);
                    c[r] = _mm512_or_si512(c[r], _mm512_slli_epi16(c4[r], 2 * gi)); /* codes <= 2: stays in its byte */
                }
            } else {
                f4[r] = _mm512_loadu_si512((const void *)(buf + out + r * tile_buf + gi * 64));
                c4[r] = _mm512_and_si512(_mm512_srli_epi16(c[r], 2 * gi), m3);
            }
        }
#pragma GCC unroll 5
        for (int d = 0; d < nd; d++) {
            __m512i w[2];
#pragma GCC unroll 2
            for (int r = 0; r < rt; r++) w[r] = d < 4 ? _mm512_and_si512(_mm512_srli_epi16(f4[r], 2 * d), m3) : c4[r];
#pragma GCC unroll 8
            for (int b = 0; b < bt; b++) {
                const __m512i xb = _mm512_set1_epi32(load_i32(x + (size_t)b * kp + 20 * gi + 4 * d));
                const int a = b * na + (5 * gi + d) % na;
#pragma GCC unroll 2
                for (int r = 0; r < rt; r++) acc[r][a] = _mm512_dpbusd_epi32(acc[r][a], w[r], xb);
            }
        }
    }
    if (packed && store && nq >= 5)
#pragma GCC unroll 2
        for (int r = 0; r < rt; r++) _mm512_storeu_si512((void *)(buf + out + r * tile_buf + 4 * 64), c[r]);
}

/* RT row tiles x BT tokens through every run of the tiles (ternary5_run) -> y */
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void ternary5_block(
    const vbmi_luts *lut, const uint8_t *w5, int kp, uint8_t *buf, const int packed, int store, const int8_t *x,
    const int rt, const int bt, const float *row_scale, const int32_t *xsum, const float *xinv, float *y, int ldy) {
    const int na = ACCS(rt, bt), quads = kp / 4, runs = quads / RUN_QUADS;
    const size_t tile5 = (size_t)bn_trit5_groups(kp) * 64, tile_buf = run_buffer_tile(kp);
    __m512i acc[2][16];
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
        for (int a = 0; a < 16; a++) acc[r][a] = _mm512_setzero_si512();
    for (int run = 0; run < runs; run++)
        ternary5_run(lut, w5, tile5, buf, tile_buf, run, packed, store, x + run * 80, kp, rt, bt, na, RUN_QUADS, acc);
#define LAST_RUN(NQ) \
    ternary5_run(lut, w5, tile5, buf, tile_buf, runs, packed, store, x + runs * 80, kp, rt, bt, na, NQ, acc)
    switch (quads % RUN_QUADS) {
        case 16: LAST_RUN(16); break;
        case 12: LAST_RUN(12); break;
        case 8: LAST_RUN(8); break;
        case 4: LAST_RUN(4); break;
        default: break;
    }
#undef LAST_RUN
    store_sums(acc, rt, bt, na, row_scale, xsum, xinv, y, ldy);
}

/* kernels.h ternary5_matmul for T > 1 on a VBMI CPU, by pairs of row tiles (then a last single one): the first
 * block of up to 8 tokens from the packed bytes, one row tile at a time (with the lookup tables in 8 of the 32
 * registers, a pair's 16 accumulators would spill), then the other blocks from the buffer it wrote, two row tiles
 * at a time. False when there is no memory for
 * the buffer (the caller then takes tiles5.c's path, which has its own fallback). */
__attribute__((target("avx512vbmi"))) static int ternary5_batch_vbmi(const uint8_t *codes, int kp,
                                                                     const float *row_scale, const int8_t *xq,
                                                                     const int32_t *xsum, const float *xinv, int T,
                                                                     int n0, int n1, float *y, int ldy) {
    const size_t tile5 = (size_t)bn_trit5_groups(kp) * 64, tile_buf = run_buffer_tile(kp);
    const int store = T > 8, first = T < 8 ? T : 8;
    uint8_t *buf = store ? bn_thread_buffer(BN_SCRATCH_TILES5, 2 * tile_buf) : NULL;
    if (store && !buf) return 0;
    pthread_once(&vbmi_once, fill_vbmi_tables);
    vbmi_luts lut;
    for (int i = 0; i < 4; i++) {
        lut.f4[i] = _mm512_loadu_si512((const void *)(vbmi_tables[0] + 64 * i));
        lut.c4[i] = _mm512_loadu_si512((const void *)(vbmi_tables[1] + 64 * i));
    }
#define FIRST_CALL(BT)                                                                                            \
    ternary5_block(&lut, codes + (size_t)(tile + r) * tile5, kp, store ? buf + r * tile_buf : NULL, 1, store, xq, \
                   1, BT, row_scale + (tile + r) * 16, xsum, xinv, y + (tile + r) * 16, ldy)
#define LATER_CALL(RT, BT)                                                                                        \
    ternary5_block(&lut, NULL, kp, buf, 0, 0, xq + (size_t)t0 * kp, RT, BT, row_scale + tile * 16, xsum + t0,    \
                   xinv + t0, y + (size_t)t0 * ldy + tile * 16, ldy)
#define LATER_PAIR(BT) LATER_CALL(2, BT)
#define LATER_ONE(BT) LATER_CALL(1, BT)
    for (int tile = n0 / 16; tile < n1 / 16;) { /* the first block per row tile, the later ones per pair of tiles */
        const int rt = tile + 2 <= n1 / 16 ? 2 : 1;
        for (int r = 0; r < rt; r++) SWITCH_BLOCK(FIRST_CALL, first)
        if (rt == 2) {
            DISPATCH_BLOCKS_FROM(LATER_PAIR, first)
        } else {
            DISPATCH_BLOCKS_FROM(LATER_ONE, first)
        }
        tile += rt;
    }
#undef LATER_ONE
#undef LATER_PAIR
#undef LATER_CALL
#undef FIRST_CALL
    return 1;
}

/* One token from the window code (trit5_windows.c): each 64-byte group q gives its five digits by five 128-entry
 * lookups (vpermi2b reads bits 0-6 of each index byte, bit 6 choosing the table's half): c0 and c1 by q, c2 and
 * c3 by q >> 1 (a 16-bit shift: bit 7 takes the next byte's bit 0, which the lookup ignores), c4 by q with bit 2
 * taken out (gf2p8affineqb moves bits 3-7 down one); then one vpdpbusd a digit, as the 2-bit kernel does with
 * its fields. Half the vpdpbusd of ternary5_tile_1 and no byte adds: 17 instead of 25 vector instructions a
 * group (Zen 4: ~2 a cycle). The same sums, exactly. */
typedef struct {
    __m512i digit[BN_TRIT5_QUADS][2]; /* digit d's 128-entry table as two registers */
    __m512i drop_bit2;                /* the gf2p8affineqb matrix: bits 0, 1, 3..7 -> bits 0..6 */
} window_luts;
static uint8_t window_tables[BN_TRIT5_QUADS][128];
static pthread_once_t window_once = PTHREAD_ONCE_INIT;
static void fill_window_tables(void) {
    for (int i = 0; i < 128; i++) {
        window_tables[0][i] = bn_trit5_pairs_low[i] / 3;
        window_tables[1][i] = bn_trit5_pairs_low[i] % 3;
        window_tables[2][i] = bn_trit5_pairs_high[i] / 3;
        window_tables[3][i] = bn_trit5_pairs_high[i] % 3;
        window_tables[4][i] = bn_trit5_last[i];
    }
}
static void load_window_luts(window_luts *t) {
    pthread_once(&window_once, fill_window_tables);
    for (int d = 0; d < BN_TRIT5_QUADS; d++)
        for (int h = 0; h < 2; h++) t->digit[d][h] = _mm512_loadu_si512((const void *)(window_tables[d] + 64 * h));
    /* gf2p8affineqb: output bit i is the parity of (byte 7 - i of the matrix) & the input byte */
    uint64_t m = 0;
    for (int i = 0; i < 7; i++) m |= (uint64_t)(1u << (i < 2 ? i : i + 1)) << (8 * (7 - i));
    t->drop_bit2 = _mm512_set1_epi64((long long)m);
}

__attribute__((target("avx512vbmi,gfni"))) static inline __attribute__((always_inline)) void window_group(
    const window_luts *t, __m512i q, const int8_t *xg, const int nd, __m512i acc[BN_TRIT5_QUADS]) {
    const __m512i q1 = _mm512_srli_epi16(q, 1), q4 = _mm512_gf2p8affine_epi64_epi8(q, t->drop_bit2, 0);
    const __m512i index[BN_TRIT5_QUADS] = {q, q, q1, q1, q4};
#pragma GCC unroll 5
    for (int d = 0; d < nd; d++) {
        const __m512i c = _mm512_permutex2var_epi8(t->digit[d][0], index[d], t->digit[d][1]);
        acc[d] = _mm512_dpbusd_epi32(acc[d], c, _mm512_set1_epi32(load_i32(xg + 4 * d)));
    }
}

__attribute__((target("avx512vbmi,gfni"))) static void window_tile_1(const window_luts *t, const uint8_t *wt, int kp,
                                                                     const int8_t *x, const float *row_scale,
                                                                     int32_t xsum, float xinv, float *y) {
    const int quads = kp / 4, full = quads / BN_TRIT5_QUADS, rest = quads % BN_TRIT5_QUADS;
    const window_luts luts = *t; /* in registers for the loop (one row tile at a time: with two, sharing each
                                    * broadcast, the compiler spills) */
    __m512i acc[BN_TRIT5_QUADS];
#pragma GCC unroll 5
    for (int d = 0; d < BN_TRIT5_QUADS; d++) acc[d] = _mm512_setzero_si512();
    for (int g = 0; g < full; g++) {
        const uint8_t *p = wt + (size_t)g * 64;
        _mm_prefetch((const char *)(p + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1); /* and into L2 (kernels.h) */
        window_group(&luts, _mm512_loadu_si512((const void *)p), x + 20 * g, BN_TRIT5_QUADS, acc);
    }
    const uint8_t *last = wt + (size_t)full * 64;
    switch (rest) { /* the last group's quads, when kp / 4 is not a multiple of 5 */
        case 4: window_group(&luts, _mm512_loadu_si512((const void *)last), x + 20 * full, 4, acc); break;
        case 3: window_group(&luts, _mm512_loadu_si512((const void *)last), x + 20 * full, 3, acc); break;
        case 2: window_group(&luts, _mm512_loadu_si512((const void *)last), x + 20 * full, 2, acc); break;
        case 1: window_group(&luts, _mm512_loadu_si512((const void *)last), x + 20 * full, 1, acc); break;
        default: break;
    }
    const __m512i sum = _mm512_sub_epi32(
        _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3])), acc[4]),
        _mm512_set1_epi32(xsum));
    _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xinv)),
                                      _mm512_loadu_ps(row_scale)));
}

static void ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                            const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    pthread_once(&unpack5_once, choose_unpack5);
    if (T > 1) {
        pthread_once(&unpack5_once, choose_unpack5);
        if (have_vbmi && ternary5_batch_vbmi(codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy)) return;
        bn_ternary5_batch(unpack5_best, ternary_matmul, ternary5_matmul, codes, kp, row_scale, xq, xsum, xinv, T, n0,
                          n1, y, ldy);
        return;
    }
    const size_t tile_bytes = (size_t)bn_trit5_groups(kp) * 64;
    if (have_vbmi) {
        window_luts luts;
        load_window_luts(&luts);
        for (int tile = n0 / 16; tile < n1 / 16; tile++)
            window_tile_1(&luts, codes + (size_t)tile * tile_bytes, kp, xq, row_scale + tile * 16, xsum[0], xinv[0],
                          y + tile * 16);
        return;
    }
    for (int tile = n0 / 16; tile < n1 / 16; tile++)
        ternary5_tile_1(codes + (size_t)tile * tile_bytes, kp, xq, row_scale + tile * 16, xsum[0], xinv[0],
                        y + tile * 16);
}

static inline __attribute__((always_inline)) void int8_block(
    const int8_t *wt, int groups, const int8_t *x, int kp, const int bt, const float *row_scale,
    const int32_t *rowsum, const float *xinv, float *y, int ldy) {
    const int na = bt <= 4 ? 4 : 2; /* bt * na <= 16 accumulators; one vpdpbusd per group and token */
    const __m512i flip = _mm512_set1_epi8((char)0x80); /* x ^ 0x80 = x + 128 as u8 */
    __m512i acc[16];
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_si512();
    for (int g = 0; g < groups; g += 4) { /* groups = Kp/4 is a multiple of 4 */
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES + 192), _MM_HINT_T0);
        __m512i w[4];
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) w[s] = _mm512_loadu_si512((const void *)(wt + (g + s) * 64));
#pragma GCC unroll 16
        for (int b = 0; b < bt; b++) {
            const int8_t *xg = x + (size_t)b * kp + g * 4;
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                const int a = b * na + (s % na);
                const __m512i xu8 = _mm512_xor_si512(_mm512_set1_epi32(load_i32(xg + 4 * s)), flip);
                acc[a] = _mm512_dpbusd_epi32(acc[a], xu8, w[s]);
            }
        }
    }
    const __m512 scale = _mm512_loadu_ps(row_scale);
    const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512((const void *)rowsum), 7); /* 128 * rowsum */
#pragma GCC unroll 16
    for (int b = 0; b < bt; b++) {
        __m512i sum = acc[b * na];
#pragma GCC unroll 4
        for (int a = 1; a < na; a++) sum = _mm512_add_epi32(sum, acc[b * na + a]);
        sum = _mm512_sub_epi32(sum, offset);
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xinv[b])), scale);
        _mm512_storeu_ps(y + (size_t)b * ldy, v);
    }
}

static void int8_matmul(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                        const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    const int groups = kp / 4;
    for (int tile = n0 / 16; tile < n1 / 16; tile++) {
        const int8_t *wt = w + (size_t)tile * groups * 64;
#define INT8_CALL(BT)                                                                                 \
    int8_block(wt, groups, xq + (size_t)t0 * kp, kp, BT, row_scale + tile * 16, rowsum + tile * 16, xinv + t0, \
               y + (size_t)t0 * ldy + tile * 16, ldy)
        DISPATCH_BLOCKS(INT8_CALL)
#undef INT8_CALL
    }
}

/* 16 bf16 values -> 16 floats (bf16 is the top half of a float). */
static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void bf16_matmul(const uint16_t *w, int k, const float *x, int T, int n0, int n1, float *y, int ldy) {
    const __mmask16 tail = (__mmask16)((1u << (k % 16)) - 1);
    for (int n = n0; n < n1; n++) {
        const uint16_t *row = w + (size_t)n * k;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * k;
            __m512 acc = _mm512_setzero_ps();
            int i = 0;
            for (; i + 16 <= k; i += 16) acc = _mm512_fmadd_ps(load_bf16(row + i, 0xFFFF), _mm512_loadu_ps(xt + i), acc);
            if (tail) acc = _mm512_fmadd_ps(load_bf16(row + i, tail), _mm512_maskz_loadu_ps(tail, xt + i), acc);
            y[(size_t)t * ldy + n] = _mm512_reduce_add_ps(acc);
        }
    }
}

const bn_kernels bn_kernels_avx512 = {
    .name = "avx512", .ternary_matmul = ternary_matmul, .ternary5_matmul = ternary5_matmul, .unpack5 = unpack5_best,
    .int8_matmul = int8_matmul, .bf16_matmul = bf16_matmul, BN_VECTOR_ENTRIES(bn_avx512_), BN_X86_SHARED_ENTRIES,
};
