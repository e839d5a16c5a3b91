/* AVX2 kernels (compiled with -mavx2 -mfma), for x86 CPUs without AVX512-VNNI.
 *
 * Same tile layouts as the AVX512 path; a 16-row tile is two 256-bit halves (rows 0-7, rows 8-15),
 * each 8 int32 lanes = 8 rows x 4 columns. Products use vpmaddubsw (u8 x s8 -> pairs summed in s16)
 * then vpmaddwd with ones (-> s32):
 *   ternary: codes (<= 2) x activations (|x| <= 128): a pair is at most 512 in magnitude; sums stay in
 *            s16 for 16 groups of 16 columns (see GROUPS_PER_WIDEN), then widen to s32.
 *   int8:    |x| x sign(w, x) so both factors fit: a pair is at most 2 * 127 * 127 = 32258 < 32767.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "token_blocks.h"

/* A value the compiler must hold in a register as it is at this point (an empty asm that "changes" it): stops
 * GCC from folding one load into two instructions, or from regrouping a sum in a way that needs more registers
 * than AVX2 has (it then spills accumulators to the stack inside the hot loop). */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Groups of 16 columns whose products one token sums in int16 before widening to int32. A lane gains at most
 * 4 pairs x 2 products x 2 x 128 = 2048 in magnitude per group (codes <= 2, |x| <= 128), so 16 groups stay within
 * [-32768, 32512]: exact. Widening once per 16 groups instead of once per group saves 15 of 16 vpmaddwd. */
#define GROUPS_PER_WIDEN 16

static inline __attribute__((always_inline)) void ternary_half(
    const uint8_t *wt, int groups, const int8_t *x, int kp, const int bt, const float *row_scale,
    const int32_t *xsum, const float *xinv, float *y, int ldy) {
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i acc[TOKENS_PER_BLOCK]; /* int32 sums, widened from acc16 every GROUPS_PER_WIDEN groups */
#pragma GCC unroll 8
    for (int b = 0; b < TOKENS_PER_BLOCK; b++) acc[b] = _mm256_setzero_si256();
    for (int g0 = 0; g0 < groups; g0 += GROUPS_PER_WIDEN) {
        const int g1 = g0 + GROUPS_PER_WIDEN < groups ? g0 + GROUPS_PER_WIDEN : groups;
        __m256i acc16[TOKENS_PER_BLOCK];
#pragma GCC unroll 8
        for (int b = 0; b < TOKENS_PER_BLOCK; b++) acc16[b] = _mm256_setzero_si256();
        for (int g = g0; g < g1; g++) {
            _mm_prefetch((const char *)(wt + g * 64 + 1024), _MM_HINT_T0);
            const __m256i p = _mm256_loadu_si256((const __m256i *)(wt + g * 64));
            const __m256i w0 = _mm256_and_si256(p, m3), w1 = _mm256_and_si256(_mm256_srli_epi16(p, 2), m3);
            const __m256i w2 = _mm256_and_si256(_mm256_srli_epi16(p, 4), m3), w3 = _mm256_and_si256(_mm256_srli_epi16(p, 6), m3);
#pragma GCC unroll 8
            for (int b = 0; b < bt; b++) {
                const int8_t *xg = x + (size_t)b * kp + g * 16;
                __m256i s = _mm256_maddubs_epi16(w0, _mm256_set1_epi32(load_i32(xg)));
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w1, _mm256_set1_epi32(load_i32(xg + 4))));
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w2, _mm256_set1_epi32(load_i32(xg + 8))));
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w3, _mm256_set1_epi32(load_i32(xg + 12))));
                acc16[b] = _mm256_add_epi16(acc16[b], s);
                KEEP_IN_REGISTER(acc16[b]);
            }
        }
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) acc[b] = _mm256_add_epi32(acc[b], _mm256_madd_epi16(acc16[b], ones));
    }
    store_half_rows(acc, bt, row_scale, xsum, xinv, y, ldy);
}

/* y (16 rows) = (acc - xsum) * xinv * row_scale for the int32 sums of rows 0-7 (acc0) and 8-15 (acc1) of a tile */
static inline void store_tile_rows(__m256i acc0, __m256i acc1, int32_t xsum, float xinv, const float *row_scale,
                                   float *y) {
    const __m256 xi = _mm256_set1_ps(xinv);
    const __m256i xs = _mm256_set1_epi32(xsum);
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc0, xs)), xi),
                                      _mm256_loadu_ps(row_scale)));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc1, xs)), xi),
                                          _mm256_loadu_ps(row_scale + 8)));
}

/* One token (decode) through a whole 16-row tile: per group of 16 columns both 32-byte halves (rows 0-7 and 8-15)
 * at once, so each 64-byte line of the tile is read once and each activation broadcast serves both halves.
 * (The multi-token path walks one half at a time over all groups, then the other; for one token that costs a
 * second pass over the tile and twice the broadcasts.) Same sums as ternary_half, so the same results. */
static void ternary_tile_1(const uint8_t *wt, int groups, const int8_t *x, const float *row_scale, int32_t xsum,
                           float xinv, float *y) {
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0; /* int32 sums of rows 0-7 and 8-15 */
    for (int g0 = 0; g0 < groups; g0 += GROUPS_PER_WIDEN) {
        const int g1 = g0 + GROUPS_PER_WIDEN < groups ? g0 + GROUPS_PER_WIDEN : groups;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0; /* int16 sums of this run of groups */
        for (int g = g0; g < g1; g++) {
            _mm_prefetch((const char *)(wt + g * 64 + 2048), _MM_HINT_T0);
            _mm_prefetch((const char *)(wt + g * 64 + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1); /* and into L2 (kernels.h) */
            const __m256i p = _mm256_loadu_si256((const __m256i *)(wt + g * 64));
            const __m256i q = _mm256_loadu_si256((const __m256i *)(wt + g * 64 + 32));
            const int8_t *xg = x + g * 16;
#pragma GCC unroll 4
            for (int f = 0; f < 4; f++) { /* code field f of every byte: column 4f + j of the group */
                const __m256i xf = _mm256_set1_epi32(load_i32(xg + 4 * f));
                s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(p, 2 * f), m3), xf));
                s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 2 * f), m3), xf));
            }
        }
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(s0, ones));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(s1, ones));
    }
    store_tile_rows(acc0, acc1, xsum, xinv, row_scale, y);
}

static inline __attribute__((always_inline)) void int8_half(
    const int8_t *wt, int groups, const int8_t *x, int kp, const int bt, const float *row_scale,
    const int32_t *rowsum, const float *xinv, float *y, int ldy) {
    (void)rowsum; /* |x| x sign(w, x) needs no correction */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[TOKENS_PER_BLOCK];
#pragma GCC unroll 8
    for (int b = 0; b < TOKENS_PER_BLOCK; b++) acc[b] = _mm256_setzero_si256();
    for (int g = 0; g < groups; g++) {
        _mm_prefetch((const char *)(wt + g * 64 + 1024), _MM_HINT_T0);
        const __m256i w = _mm256_loadu_si256((const __m256i *)(wt + g * 64));
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) {
            const __m256i xv = _mm256_set1_epi32(load_i32(x + (size_t)b * kp + g * 4));
            const __m256i prod = _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(w, xv));
            acc[b] = _mm256_add_epi32(acc[b], _mm256_madd_epi16(prod, ones));
            KEEP_IN_REGISTER(acc[b]);
        }
    }
    const __m256 scale = _mm256_loadu_ps(row_scale);
#pragma GCC unroll 8
    for (int b = 0; b < bt; b++) {
        const __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[b]), _mm256_set1_ps(xinv[b])), scale);
        _mm256_storeu_ps(y + (size_t)b * ldy, v);
    }
}

/* One token through a whole 16-row int8 tile (the head at decode), both halves per 64-byte line as in
 * ternary_tile_1; |x| is computed once for both. Same sums as int8_half. */
static void int8_tile_1(const int8_t *wt, int groups, const int8_t *x, const float *row_scale, const int32_t *rowsum,
                        float xinv, float *y) {
    (void)rowsum;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
    for (int g = 0; g < groups; g++) {
        _mm_prefetch((const char *)(wt + g * 64 + 2048), _MM_HINT_T0);
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wt + g * 64));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wt + g * 64 + 32));
        const __m256i xv = _mm256_set1_epi32(load_i32(x + g * 4)), ax = _mm256_abs_epi8(xv);
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xv)), ones));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xv)), ones));
    }
    const __m256 xi = _mm256_set1_ps(xinv);
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc0), xi), _mm256_loadu_ps(row_scale)));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc1), xi), _mm256_loadu_ps(row_scale + 8)));
}

#include "tile_walk.h" /* ternary_walk (here for one token), int8_walk: from the four kernels above */

/* ---------------------------------------------------------------- several tokens through whole 16-row tiles
 *
 * The multi-token ternary matmul of this path (ternary_tiles; tile_walk.h's half-at-a-time ternary_half walk stays
 * for T = 1 through ternary_walk). Per group of 16 columns and code field, the codes of both halves of the tile
 * (rows 0-7 and 8-15) are unpacked once and each token's activation broadcast serves both: 2 vpmaddubsw per
 * broadcast instead of 1, which is what the AVX2 path ran short of (measured on Zen 4 with BITNET_ISA=avx2: 2B-4T
 * 8- and 32-token forwards 8-10% faster than with ternary_half's 8 tokens x 8 rows). Both halves' int16 sums for
 * TILE_TOKENS tokens fill 8 of the 16 ymm registers; 5 tokens (10) spill and ran slower.
 *
 * The int32 sums are ternary_half's: each int16 run holds the same products of the same GROUPS_PER_WIDEN groups
 * (exact, see there), only added in another order, so y is the same bit for bit. */
#define TILE_TOKENS 4

/* A block of BT (1..TILE_TOKENS) tokens through one tile: wt the tile (groups x 64 bytes), x token 0's activations
 * (token b at x + b kp), y token 0's 16 outputs (token b at y + b ldy). The packed bytes are loaded again for each
 * code field (from L1) rather than kept, which leaves GCC enough registers not to spill the sums. */
/* How a block gets the codes of its tile: from the packed bytes (PACKED), from them while writing the codes to the
 * thread's buffer for the blocks after it (PACKED_STORE), or from that buffer (CODES: no unpacking at all). */
enum { PACKED, PACKED_STORE, CODES };

static inline __attribute__((always_inline)) void ternary_tile_block(const uint8_t *wt, uint8_t *codes, int groups,
                                                                     const int8_t *x, int kp, const int BT,
                                                                     const int FROM, const float *row_scale,
                                                                     const int32_t *xsum, const float *xinv, float *y,
                                                                     int ldy) {
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i acc0[TILE_TOKENS], acc1[TILE_TOKENS]; /* int32 sums of rows 0-7 and 8-15 per token */
    const int8_t *xt[TILE_TOKENS]; /* each token's activations (one pointer each: constant displacements below) */
#pragma GCC unroll 4
    for (int b = 0; b < TILE_TOKENS; b++) xt[b] = x + (size_t)(b < BT ? b : 0) * kp;
#pragma GCC unroll 4
    for (int b = 0; b < TILE_TOKENS; b++) acc0[b] = acc1[b] = _mm256_setzero_si256();
    for (int g0 = 0; g0 < groups; g0 += GROUPS_PER_WIDEN) {
        const int g1 = g0 + GROUPS_PER_WIDEN < groups ? g0 + GROUPS_PER_WIDEN : groups;
        __m256i s0[TILE_TOKENS], s1[TILE_TOKENS]; /* int16 sums of this run of groups */
#pragma GCC unroll 4
        for (int b = 0; b < TILE_TOKENS; b++) s0[b] = s1[b] = _mm256_setzero_si256();
        for (int g = g0; g < g1; g++) { /* prefetch as ternary_tile_1: the first block reads the tile from memory */
            if (FROM != CODES) {
                _mm_prefetch((const char *)(wt + g * 64 + 2048), _MM_HINT_T0);
                _mm_prefetch((const char *)(wt + g * 64 + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1);
            }
#pragma GCC unroll 4
            for (int f = 0; f < 4; f++) { /* code field f of every byte: column 4f + j of the group */
                const size_t at = ((size_t)g * 4 + f) * 64; /* this field's codes, both halves, in the buffer */
                __m256i w0, w1;
                if (FROM == CODES) {
                    w0 = _mm256_load_si256((const __m256i *)(codes + at));
                    w1 = _mm256_load_si256((const __m256i *)(codes + at + 32));
                } else {
                    w0 = _mm256_loadu_si256((const __m256i *)(wt + g * 64));
                    w1 = _mm256_loadu_si256((const __m256i *)(wt + g * 64 + 32));
                    w0 = _mm256_and_si256(_mm256_srli_epi16(w0, 2 * f), m3);
                    w1 = _mm256_and_si256(_mm256_srli_epi16(w1, 2 * f), m3);
                    if (FROM == PACKED_STORE) {
                        _mm256_store_si256((__m256i *)(codes + at), w0);
                        _mm256_store_si256((__m256i *)(codes + at + 32), w1);
                    }
                }
#pragma GCC unroll 4
                for (int b = 0; b < BT; b++) {
                    const __m256i xf = _mm256_set1_epi32(load_i32(xt[b] + g * 16 + 4 * f));
                    s0[b] = _mm256_add_epi16(s0[b], _mm256_maddubs_epi16(w0, xf));
                    s1[b] = _mm256_add_epi16(s1[b], _mm256_maddubs_epi16(w1, xf));
                    KEEP_IN_REGISTER(s0[b]);
                    KEEP_IN_REGISTER(s1[b]);
                }
            }
        }
#pragma GCC unroll 4
        for (int b = 0; b < BT; b++) {
            acc0[b] = _mm256_add_epi32(acc0[b], _mm256_madd_epi16(s0[b], ones));
            acc1[b] = _mm256_add_epi32(acc1[b], _mm256_madd_epi16(s1[b], ones));
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < BT; b++) store_tile_rows(acc0[b], acc1[b], xsum[b], xinv[b], row_scale, y + (size_t)b * ldy);
}

/* kernels.h ternary_matmul: one token by ternary_walk (decode), more tile by tile, TILE_TOKENS tokens at a time, so a
 * tile is read from memory once and from L1/L2 for the later blocks. With more than one block, the first also writes
 * the codes it unpacks (a byte a weight, 16 x kp bytes a tile) to this thread's buffer, and the later blocks multiply
 * those with no unpacking, as ternary5_batch does for 1.6-bit tiles (2B-4T shape, 2-bit tiles, AVX2 on Zen 4,
 * two interleaved rounds: 16 / 32-token forwards 118.8 / 228.0 -> 115.0 / 215.6 ms, pp128 146 -> 158 tok/s; 8 tokens
 * the same). The same int16 runs of the same products: the same y, bit for bit. */
static void ternary_tiles(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum,
                          const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    if (T == 1) {
        ternary_walk(codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy);
        return;
    }
    const int groups = kp / 16;
    uint8_t *buf = T > TILE_TOKENS ? bn_thread_buffer(BN_SCRATCH_CODES, (size_t)groups * 256) : NULL;
    for (int tile = n0 / 16; tile < n1 / 16; tile++) {
        const uint8_t *wt = codes + (size_t)tile * groups * 64;
        for (int t0 = 0; t0 < T; t0 += TILE_TOKENS) {
            const int bt = T - t0 < TILE_TOKENS ? T - t0 : TILE_TOKENS;
#define TILE_CALL(BT, FROM) \
    ternary_tile_block(wt, buf, groups, xq + (size_t)t0 * kp, kp, BT, FROM, row_scale + tile * 16, xsum + t0, \
                       xinv + t0, y + (size_t)t0 * ldy + tile * 16, ldy)
#define TILE_BLOCK(FROM)                        \
    switch (bt) {                               \
        case 4: TILE_CALL(4, FROM); break;      \
        case 3: TILE_CALL(3, FROM); break;      \
        case 2: TILE_CALL(2, FROM); break;      \
        default: TILE_CALL(1, FROM); break;     \
    }
            if (!buf) {
                TILE_BLOCK(PACKED)
            } else if (t0 == 0) {
                TILE_BLOCK(PACKED_STORE)
            } else {
                TILE_BLOCK(CODES)
            }
#undef TILE_BLOCK
#undef TILE_CALL
        }
    }
}

/* ---------------------------------------------------------------- 1.6-bit tiles (5 codes a byte, packing.py)
 *
 * Digit d of a byte q is its code c_d = 3 t_d >> 8 with t_d = q 3^d mod 256, i.e. [t_d >= 86] + [t_d >= 171]. In
 * signed bytes s_d = t_d - 128 (q ^ 0x80) that is [s_d > -43] + [s_d > 42]: two vpcmpgtb whose -1s add up to
 * -c_d; and s_{d+1} = 3 s_d mod 256 like t (two wrapping adds). The codes then go through vpmaddubsw exactly as
 * the 2-bit kernels' do. (The VNNI paths' trick of summing t_d . x instead does not work here: vpmaddubsw would
 * saturate on 255 x 128.) */

/* The codes (0, 1, 2) of one digit of 32 packed bytes, whose signed form s_d is given; s_d becomes s_{d+1}. */
static inline __m256i trit_codes(__m256i *s) {
    const __m256i c = _mm256_abs_epi8(_mm256_add_epi8(_mm256_cmpgt_epi8(*s, _mm256_set1_epi8(-43)),
                                                      _mm256_cmpgt_epi8(*s, _mm256_set1_epi8(42))));
    *s = _mm256_add_epi8(*s, _mm256_add_epi8(*s, *s));
    return c;
}

/* A lane gains at most 5 digits x 2 products x 2 x 128 = 2560 in magnitude per 64-byte group: 12 groups stay within
 * int16 before the sums are widened to int32 (see GROUPS_PER_WIDEN). */
#define GROUPS5_PER_WIDEN 12

/* nd digits of one 64-byte group (both halves: rows 0-7 and 8-15) into the int16 sums s0, s1 */
static inline __attribute__((always_inline)) void ternary5_group(const uint8_t *p, const int8_t *xg, const int nd,
                                                                 __m256i *s0, __m256i *s1) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i a = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), flip);
    __m256i b = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 32)), flip);
#pragma GCC unroll 5
    for (int d = 0; d < nd; d++) {
        const __m256i xf = _mm256_set1_epi32(load_i32(xg + 4 * d));
        *s0 = _mm256_add_epi16(*s0, _mm256_maddubs_epi16(trit_codes(&a), xf));
        *s1 = _mm256_add_epi16(*s1, _mm256_maddubs_epi16(trit_codes(&b), xf));
    }
}

/* One token through a whole 16-row tile of 1.6-bit codes: the same int32 sums as ternary_tile_1 on its 2-bit tile. */
static void ternary5_tile_1(const uint8_t *wt, int kp, const int8_t *x, const float *row_scale, int32_t xsum,
                            float xinv, float *y) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int quads = kp / 4, full = quads / BN_TRIT5_QUADS, rest = quads % BN_TRIT5_QUADS;
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
    for (int g0 = 0; g0 < full; g0 += GROUPS5_PER_WIDEN) {
        const int g1 = g0 + GROUPS5_PER_WIDEN < full ? g0 + GROUPS5_PER_WIDEN : full;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        for (int g = g0; g < g1; g++) {
            _mm_prefetch((const char *)(wt + g * 64 + 2048), _MM_HINT_T0);
            _mm_prefetch((const char *)(wt + g * 64 + BN_FAR_PREFETCH_BYTES), _MM_HINT_T1); /* and into L2 */
            ternary5_group(wt + (size_t)g * 64, x + 20 * g, BN_TRIT5_QUADS, &s0, &s1);
        }
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(s0, ones));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(s1, ones));
    }
    if (rest) { /* the last group's quads, when kp / 4 is not a multiple of 5 */
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        const uint8_t *p = wt + (size_t)full * 64;
        const int8_t *xg = x + 20 * full;
        switch (rest) {
            case 4: ternary5_group(p, xg, 4, &s0, &s1); break;
            case 3: ternary5_group(p, xg, 3, &s0, &s1); break;
            case 2: ternary5_group(p, xg, 2, &s0, &s1); break;
            default: ternary5_group(p, xg, 1, &s0, &s1); break;
        }
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(s0, ones));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(s1, ones));
    }
    store_tile_rows(acc0, acc1, xsum, xinv, row_scale, y);
}

/* 1.6-bit tiles -> 2-bit tiles (kernels.h unpack5): quad m's codes, digit m % 5 of group m / 5, shifted into field
 * m % 4 of group m / 4 (a code is at most 2, so the 16-bit shift never crosses into the next byte). The pattern
 * repeats every 20 quads (4 groups in, 5 out): unpack5_run takes nq quads (a multiple of 4, at most 20) of one
 * 32-byte half, with every index a constant once inlined. */
static inline __attribute__((always_inline)) void unpack5_run(const uint8_t *in, uint8_t *out, const int nq) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i s = _mm256_setzero_si256(), acc = s;
#pragma GCC unroll 20
    for (int m = 0; m < nq; m++) {
        if (m % BN_TRIT5_QUADS == 0) {
            _mm_prefetch((const char *)(in + (m / BN_TRIT5_QUADS) * 64 + 2048), _MM_HINT_T0); /* 2 KB ahead */
            s = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(in + (m / BN_TRIT5_QUADS) * 64)), flip);
        }
        acc = _mm256_or_si256(acc, _mm256_slli_epi16(trit_codes(&s), 2 * (m % 4)));
        if (m % 4 == 3) {
            _mm256_storeu_si256((__m256i *)(out + (m / 4) * 64), acc);
            acc = _mm256_setzero_si256();
        }
    }
}

static void unpack5(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2) {
    BN_UNPACK5_TILES(unpack5_run, tiles5, kp, n_tiles, tiles2, 32);
}

/* A batch of 1.6-bit tiles, unpacked by its first block of tokens as it goes (as kernels_avx512.c does with VBMI):
 * tiles5.c's unpack-then-multiply leaves the core waiting on memory while it unpacks a chunk and memory idle while
 * it multiplies. Here, for each 8-row half of a row tile, the first block of up to TOKENS_PER_BLOCK tokens reads the
 * packed bytes with prefetch, forms each digit's codes (trit_codes) and multiplies them at once; when more blocks
 * follow it also writes the codes, one byte a weight (32 bytes per digit of a group's half), to this thread's
 * buffer, from which the later blocks multiply them with no unpacking at all. The sums are ternary_half's products
 * in another order, in int16 runs of at most GROUPS5_PER_WIDEN groups (exact, see there): the same y, bit for bit. */
#define DIGIT_BYTES 32 /* one digit of one half of a 64-byte group, as codes */

/* nd digits of group g of one half for BT tokens into the int16 sums acc16. packed: from the packed half w5 (and,
 * when store, its codes written to buf); else the codes from buf. x: token 0's activations. */
static inline __attribute__((always_inline)) void ternary5_half_group(const uint8_t *w5, uint8_t *buf, int g,
                                                                      const int packed, int store, const int8_t *x,
                                                                      int kp, const int bt, const int nd,
                                                                      __m256i acc16[TOKENS_PER_BLOCK]) {
    __m256i s = _mm256_setzero_si256();
    if (packed) {
        _mm_prefetch((const char *)(w5 + (size_t)g * 64 + 1024), _MM_HINT_T0);
        s = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w5 + (size_t)g * 64)), _mm256_set1_epi8((char)0x80));
    }
#pragma GCC unroll 5
    for (int d = 0; d < nd; d++) {
        const size_t at = ((size_t)g * BN_TRIT5_QUADS + d) * DIGIT_BYTES; /* this digit's codes in buf */
        __m256i c;
        if (packed) {
            c = trit_codes(&s);
            if (store) _mm256_storeu_si256((__m256i *)(buf + at), c);
        } else {
            c = _mm256_loadu_si256((const __m256i *)(buf + at));
        }
        KEEP_IN_REGISTER(c);
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) {
            const __m256i xd = _mm256_set1_epi32(load_i32(x + (size_t)b * kp + 20 * g + 4 * d));
            acc16[b] = _mm256_add_epi16(acc16[b], _mm256_maddubs_epi16(c, xd));
            KEEP_IN_REGISTER(acc16[b]);
        }
    }
}

/* One 8-row half of a row tile (w5: its packed tile at the half's first byte; row0: its first row) for a block of
 * BT tokens -> y */
static inline __attribute__((always_inline)) void ternary5_half(const uint8_t *w5, uint8_t *buf, const int packed,
                                                                int store, const int8_t *x, int kp, const int bt,
                                                                const float *row_scale, const int32_t *xsum,
                                                                const float *xinv, float *y, int ldy) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int quads = kp / 4, full = quads / BN_TRIT5_QUADS, rest = quads % BN_TRIT5_QUADS;
    __m256i acc[TOKENS_PER_BLOCK], acc16[TOKENS_PER_BLOCK];
#pragma GCC unroll 8
    for (int b = 0; b < TOKENS_PER_BLOCK; b++) acc[b] = _mm256_setzero_si256();
    for (int g0 = 0; g0 < full; g0 += GROUPS5_PER_WIDEN) {
        const int g1 = g0 + GROUPS5_PER_WIDEN < full ? g0 + GROUPS5_PER_WIDEN : full;
#pragma GCC unroll 8
        for (int b = 0; b < TOKENS_PER_BLOCK; b++) acc16[b] = _mm256_setzero_si256();
        for (int g = g0; g < g1; g++) ternary5_half_group(w5, buf, g, packed, store, x, kp, bt, BN_TRIT5_QUADS, acc16);
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) acc[b] = _mm256_add_epi32(acc[b], _mm256_madd_epi16(acc16[b], ones));
    }
    if (rest) { /* the last group's quads, when kp / 4 is not a multiple of 5 */
#pragma GCC unroll 8
        for (int b = 0; b < TOKENS_PER_BLOCK; b++) acc16[b] = _mm256_setzero_si256();
        switch (rest) {
            case 4: ternary5_half_group(w5, buf, full, packed, store, x, kp, bt, 4, acc16); break;
            case 3: ternary5_half_group(w5, buf, full, packed, store, x, kp, bt, 3, acc16); break;
            case 2: ternary5_half_group(w5, buf, full, packed, store, x, kp, bt, 2, acc16); break;
            default: ternary5_half_group(w5, buf, full, packed, store, x, kp, bt, 1, acc16); break;
        }
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) acc[b] = _mm256_add_epi32(acc[b], _mm256_madd_epi16(acc16[b], ones));
    }
    store_half_rows(acc, bt, row_scale, xsum, xinv, y, ldy);
}

/* kernels.h ternary5_matmul for T > 1: each half of each row tile, its first block of tokens from the packed bytes,
 * the others from the codes it wrote. False when there is no memory for the buffer (the caller then takes tiles5.c's
 * path, which has its own fallback). */
static int ternary5_batch(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum,
                          const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    const int groups5 = bn_trit5_groups(kp), store = T > TOKENS_PER_BLOCK;
    const int first = store ? TOKENS_PER_BLOCK : T;
    uint8_t *buf = store ? bn_thread_buffer(BN_SCRATCH_TILES5, (size_t)groups5 * BN_TRIT5_QUADS * DIGIT_BYTES) : NULL;
    if (store && !buf) return 0;
    for (int tile = n0 / 16; tile < n1 / 16; tile++)
        for (int half = 0; half < 2; half++) {
            const uint8_t *w5 = codes + (size_t)tile * groups5 * 64 + half * 32;
            const int row0 = tile * 16 + half * 8;
#define FIRST_CALL(BT) \
    ternary5_half(w5, buf, 1, store, xq, kp, BT, row_scale + row0, xsum, xinv, y + row0, ldy)
#define LATER_CALL(BT) \
    ternary5_half(NULL, buf, 0, 0, xq + (size_t)t0 * kp, kp, BT, row_scale + row0, xsum + t0, xinv + t0, \
                  y + (size_t)t0 * ldy + row0, ldy)
            SWITCH_BLOCK(FIRST_CALL, first)
            DISPATCH_BLOCKS_FROM(LATER_CALL, first)
#undef LATER_CALL
#undef FIRST_CALL
        }
    return 1;
}

static void ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                            const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    if (T > 1) {
        if (!ternary5_batch(codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy))
            bn_ternary5_batch(unpack5, ternary_tiles, ternary5_matmul, codes, kp, row_scale, xq, xsum, xinv, T, n0, n1,
                              y, ldy);
        return;
    }
    const size_t tile_bytes = (size_t)bn_trit5_groups(kp) * 64;
    for (int tile = n0 / 16; tile < n1 / 16; tile++)
        ternary5_tile_1(codes + (size_t)tile * tile_bytes, kp, xq, row_scale + tile * 16, xsum[0], xinv[0],
                        y + tile * 16);
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void bf16_matmul(const uint16_t *w, int k, const float *x, int T, int n0, int n1, float *y, int ldy) {
    for (int n = n0; n < n1; n++) {
        const uint16_t *row = w + (size_t)n * k;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * k;
            __m256 acc = _mm256_setzero_ps();
            int i = 0;
            for (; i + 8 <= k; i += 8) {
                const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + i)));
                acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), _mm256_loadu_ps(xt + i), acc);
            }
            float s = hsum256(acc);
            for (; i < k; i++) {
                union { uint32_t u; float f; } v = {(uint32_t)row[i] << 16};
                s += v.f * xt[i];
            }
            y[(size_t)t * ldy + n] = s;
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum256(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float a, const float *x, float *y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* in double, like the other paths (see kernels_avx512.c) */
static float sumsq(const float *x, int n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    __m256d a = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double s = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++) s += (double)x[i] * x[i];
    return (float)s;
}

static float absmax(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        r = a > r ? a : r;
    }
    return r;
}

static int32_t quantize(const float *x, int n, int np, float scale, int8_t *q) {
    const __m256 sc = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
    __m256i sum = _mm256_setzero_si256();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sc), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i qi = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
        sum = _mm256_add_epi32(sum, qi);
        const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
        const __m128i w8 = _mm_packs_epi16(w16, w16);
        _mm_storel_epi64((__m128i *)(q + i), w8);
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    int32_t s = _mm_cvtsi128_si32(s4);
    for (; i < n; i++) {
        float r = nearbyintf(x[i] * scale);
        r = r > 127.0f ? 127.0f : (r < -128.0f ? -128.0f : r);
        q[i] = (int8_t)r;
        s += q[i];
    }
    for (; i < np; i++) q[i] = 0;
    return s;
}

static void norm_apply(const float *x, float inv, const float *w, float *out, int n) {
    const __m256 vi = _mm256_set1_ps(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), vi)));
    for (; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

static void relu2_mul(const float *g, const float *u, float *out, int n) {
    const __m256 zero = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 r = _mm256_max_ps(_mm256_loadu_ps(g + i), zero);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(r, r), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        const float r = g[i] > 0.0f ? g[i] : 0.0f;
        out[i] = (r * r) * u[i];
    }
}

static void add(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

/* F16C conversions; tails go through an 8-element buffer so every value is converted the same way */
static void to_f16(const float *x, uint16_t *h, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        float buf[8] = {0};
        uint16_t out[8];
        memcpy(buf, x + i, sizeof(float) * (size_t)(n - i));
        _mm_storeu_si128((__m128i *)out, _mm256_cvtps_ph(_mm256_loadu_ps(buf), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        memcpy(h + i, out, sizeof(uint16_t) * (size_t)(n - i));
    }
}

static inline __m256 load_f16_tail(const uint16_t *h, int r) {
    uint16_t buf[8] = {0};
    memcpy(buf, h, sizeof(uint16_t) * (size_t)r);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)buf));
}

static float dot_f16(const float *a, const uint16_t *h, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))), acc);
    float s = hsum256(acc);
    if (i < n) {
        float hv[8];
        _mm256_storeu_ps(hv, load_f16_tail(h + i, n - i));
        for (int j = 0; j < n - i; j++) s += a[i + j] * hv[j];
    }
    return s;
}

static void axpy_f16(float a, const uint16_t *h, float *y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))), _mm256_loadu_ps(y + i)));
    if (i < n) {
        float hv[8];
        _mm256_storeu_ps(hv, load_f16_tail(h + i, n - i));
        for (int j = 0; j < n - i; j++) y[i + j] += a * hv[j];
    }
}

/* ---------------------------------------------------------------- fused steps */

/* quant8(rmsnorm(x) * w): the operations of forward.c's composition, in the same order (so the same
 * numbers), with norm_apply and absmax sharing one pass. */
static int32_t norm_quant(const float *x, const float *w, int n, int np, float eps, float *xn, int8_t *q, float *xinv) {
    const float inv = 1.0f / sqrtf(sumsq(x, n) / (float)n + eps);
    const __m256 vi = _mm256_set1_ps(inv), sign = _mm256_set1_ps(-0.0f);
    __m256 mv = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), vi));
        _mm256_storeu_ps(xn + i, v);
        mv = _mm256_max_ps(mv, _mm256_andnot_ps(sign, v));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float m = _mm_cvtss_f32(h);
    for (; i < n; i++) {
        xn[i] = w[i] * (x[i] * inv);
        const float a = xn[i] < 0.0f ? -xn[i] : xn[i];
        m = a > m ? a : m;
    }
    if (m < 1e-5f) m = 1e-5f;
    const float scale = 127.0f / m;
    *xinv = 1.0f / scale;
    return quantize(xn, n, np, scale, q);
}

/* e^x for x <= 0 (softmax after subtracting the maximum): x = n ln2 + r, e^r by the Cephes polynomial,
 * relative error about 1e-7; below -87.3 the result is 0 (expf gives a denormal there). */
static inline __m256 exp_nonpos(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* 8 cache elements i.. of a K or V source as floats: kv (enum bn_kv) float32, fp16 bits, or int8 (its integers,
 * exactly; the row's scale is applied by the caller) */
static inline __attribute__((always_inline)) __m256 load_kv(const void *base, const int kv, size_t i) {
    if (kv == BN_KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    if (kv == BN_KV_I8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + i))));
    return _mm256_loadu_ps((const float *)base + i);
}
static inline size_t kv_elem(const int kv) { return kv == BN_KV_F16 ? 2 : kv == BN_KV_I8 ? 1 : 4; }

/* Prefetch into L2 one cache row (bytes, whole lines) that a pass reads BN_FAR_PREFETCH_BYTES later: the passes that
 * read the cache from memory (a decode token's, and the first pass over each tile of a batch) stream it. Into L2
 * only: a prefetch into L1 too was slower. This kernel alone over 2B-4T's 150 (layer, KV head) caches at 4,000
 * positions, fp16, 4 query heads an item, 2 threads on Zen 4: 13.9 ms with no prefetch, 13.4 with both, 12.0-12.7
 * with L2 alone. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *row, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)row + o + BN_FAR_PREFETCH_BYTES, _MM_HINT_T1);
}

/* lanes j = horizontal sum of a[j], j < 8 */
static inline __m256 sum8(const __m256 a[8]) {
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* max of row (n floats; -inf when n = 0 or every entry is NaN: a NaN entry keeps the running max, as the scalar
 * `x > mx ? x : mx` does), in four running maxima (one would wait for each max before the next) */
static float row_max(const float *row, int n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int s = 0;
    for (; s + 32 <= n; s += 32) { /* max_ps(a, b) is b when either is NaN: the entry goes first */
        m0 = _mm256_max_ps(_mm256_loadu_ps(row + s), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(row + s + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(row + s + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(row + s + 24), m3);
    }
    for (; s + 8 <= n; s += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(row + s), m0);
    float buf[8];
    _mm256_storeu_ps(buf, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    float mx = buf[0];
    for (int j = 1; j < 8; j++) mx = buf[j] > mx ? buf[j] : mx;
    for (; s < n; s++) mx = row[s] > mx ? row[s] : mx;
    return mx;
}

/* softmax of row (n floats) in place: exp(x - max) / sum (the division per score, as the reference's softmax: a
 * division moved to the output changes the last bits of a row's output, which a random model's near-ties show) */
static void softmax_row(float *row, int n) {
    const float mx = row_max(row, n);
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 sv = _mm256_setzero_ps();
    float buf[8];
    int s;
    for (s = 0; s + 8 <= n; s += 8) {
        const __m256 v = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row + s), vmx));
        _mm256_storeu_ps(row + s, v);
        sv = _mm256_add_ps(sv, v);
    }
    float sum = hsum256(sv);
    if (s < n) { /* the tail through one padded vector, so every score goes through the same exp */
        for (int j = 0; j < 8; j++) buf[j] = s + j < n ? row[s + j] - mx : -INFINITY;
        _mm256_storeu_ps(buf, exp_nonpos(_mm256_loadu_ps(buf)));
        for (int j = 0; s + j < n; j++) { row[s + j] = buf[j]; sum += buf[j]; }
    }
    const __m256 vs = _mm256_set1_ps(sum);
    for (s = 0; s + 8 <= n; s += 8) _mm256_storeu_ps(row + s, _mm256_div_ps(_mm256_loadu_ps(row + s), vs));
    for (; s < n; s++) row[s] /= sum;
}

/* ---- multi-row attention (kernels.h, attend_rows)
 * Key and value rows come from a source: base + s*ld elements, float32, fp16 bits or int8 (`kv`: an enum bn_kv;
 * an int8 row's scale multiplies its score, or its probability before the values pass). With an fp16 or int8 cache
 * and several rows, the first pass over a tile converts it (exactly: every half and every int8 is a float) into a
 * float32 tile (rows of hd) while computing with it, and every later (row, head) of the item reads the tile: each
 * element is converted once per item instead of once per query row and head. `keep` is that tile (KEEP = 1), or
 * unused (KEEP = 0). */


/* Scores of one or two query heads (NH; qa, qb) for keys k + j*ld, j < nk <= 4 (NH = 2) or 8 (NH = 1):
 * ra[j] (rb[j]) = (q . k_j) * scale, times ks[j] for an int8 cache (ks: the keys' scales, else NULL). Eight dot
 * products share one vector sum (sum8); each is an FMA chain over its 8 lanes then the pairwise lane sum, the
 * numbers of the per-token kernel before this one. */
static inline __attribute__((always_inline)) void scores_group(const float *qa, const float *qb, const int NH, int hd,
                                                               const void *k, size_t ld, const int kv, const int nk,
                                                               float scale, const float *ks, float *ra, float *rb,
                                                               float *keep, const int KEEP, const int PF) {
    const int per = NH == 2 ? 4 : 8; /* keys per head in the eight accumulators */
    if (PF)
        for (int j = 0; j < nk; j++) prefetch_ahead((const char *)k + (size_t)j * ld * kv_elem(kv), (size_t)hd * kv_elem(kv));
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        const __m256 a = _mm256_loadu_ps(qa + d), b = NH == 2 ? _mm256_loadu_ps(qb + d) : a;
#pragma GCC unroll 8
        for (int j = 0; j < per; j++)
            if (j < nk) {
                __m256 kr = load_kv(k, kv, (size_t)j * ld + d);
                if (NH == 2) KEEP_IN_REGISTER(kr);
                if (KEEP) _mm256_storeu_ps(keep + (size_t)j * hd + d, kr);
                acc[j] = _mm256_fmadd_ps(a, kr, acc[j]);
                if (NH == 2) acc[4 + j] = _mm256_fmadd_ps(b, kr, acc[4 + j]);
            }
    }
    __m256 v = _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale)); /* NH = 2: [qa . k_0..3 | qb . k_0..3] */
    if (ks) { /* the int8 keys' scales, in the same lanes */
        if (nk == per) {
            v = _mm256_mul_ps(v, NH == 2 ? _mm256_broadcast_ps((const __m128 *)ks) : _mm256_loadu_ps(ks));
        } else {
            float sc[8] = {0};
            for (int j = 0; j < nk; j++) sc[j] = sc[NH == 2 ? 4 + j : j] = ks[j];
            v = _mm256_mul_ps(v, _mm256_loadu_ps(sc));
        }
    }
    if (nk == per) {
        if (NH == 2) {
            _mm_storeu_ps(ra, _mm256_castps256_ps128(v));
            _mm_storeu_ps(rb, _mm256_extractf128_ps(v, 1));
        } else {
            _mm256_storeu_ps(ra, v);
        }
    } else {
        float buf[8];
        _mm256_storeu_ps(buf, v);
        memcpy(ra, buf, sizeof(float) * (size_t)nk);
        if (NH == 2) memcpy(rb, buf + 4, sizeof(float) * (size_t)nk);
    }
}

/* ra[j] (and rb[j]) for the nk keys k + j*ld of one tile, j < nk (ks: their int8 scales, or NULL) */
static inline __attribute__((always_inline)) void scores_run(const float *qa, const float *qb, const int NH, int hd,
                                                             const void *k, size_t ld, const int kv, int nk,
                                                             float scale, const float *ks, float *ra, float *rb,
                                                             float *keep, const int KEEP, const int PF) {
    const int per = NH == 2 ? 4 : 8;
    int j = 0;
    for (; j + per <= nk; j += per)
        scores_group(qa, qb, NH, hd, (const char *)k + j * ld * kv_elem(kv), ld, kv, per, scale,
                     ks ? ks + j : NULL, ra + j, rb + j, keep + (KEEP ? (size_t)j * hd : 0), KEEP, PF);
    if (j < nk)
        scores_group(qa, qb, NH, hd, (const char *)k + j * ld * kv_elem(kv), ld, kv, nk - j, scale,
                     ks ? ks + j : NULL, ra + j, rb + j, keep + (KEEP ? (size_t)j * hd : 0), KEEP, PF);
}

/* oa[c0, c0 + 8*NC) += sum_s pa[s] * v_s over s < n (rows v + s*ld), and the same for ob, pb when NH = 2 (each
 * value row loaded once for both heads). Per column one FMA chain in s order, as one head alone gives it.
 * fresh: the first tile, whose chains start from zero instead of loading oa (which then need not be cleared
 * first: a load right after memset's stores waits for them, ~15% of the attention's time). PF (a pass that reads
 * the cache itself): prefetch pf_cols columns from c0 of each row ahead (prefetch_ahead), 0: none (a later pass
 * over the same rows). */
static inline __attribute__((always_inline)) void values_cols(const float *pa, const float *pb, const int NH, int n,
                                                              const void *v, size_t ld, const int kv, int c0,
                                                              const int NC, float *oa, float *ob, float *keep, int hd,
                                                              const int KEEP, int fresh, const int PF, int pf_cols) {
    __m256 a[8], b[8];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        a[c] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(oa + c0 + 8 * c);
        if (NH == 2) b[c] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(ob + c0 + 8 * c);
    }
    for (int s = 0; s < n; s++) {
        const __m256 xa = _mm256_set1_ps(pa[s]), xb = NH == 2 ? _mm256_set1_ps(pb[s]) : xa;
        if (PF && pf_cols) prefetch_ahead((const char *)v + ((size_t)s * ld + c0) * kv_elem(kv), (size_t)pf_cols * kv_elem(kv));
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m256 vv = load_kv(v, kv, (size_t)s * ld + c0 + 8 * c);
            if (NH == 2) KEEP_IN_REGISTER(vv);
            if (KEEP) _mm256_storeu_ps(keep + (size_t)s * hd + c0 + 8 * c, vv);
            a[c] = _mm256_fmadd_ps(xa, vv, a[c]);
            if (NH == 2) b[c] = _mm256_fmadd_ps(xb, vv, b[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        _mm256_storeu_ps(oa + c0 + 8 * c, a[c]);
        if (NH == 2) _mm256_storeu_ps(ob + c0 + 8 * c, b[c]);
    }
}

/* oa += sum_s pa[s] * v_s (and ob with pb when NH = 2) over the n value rows of one tile, columns [from, to), in passes
 * of at most 6 column vectors for two heads (12 accumulators) or 8 for one head, the last two of even sizes: hd 64 as
 * 32 + 32 for two heads (8 FMA chains each; 48 + 16 left the second pass 4 chains, waiting on the FMA latency) and 64
 * at once for one head, 128 as 48 + 40 + 40. Each column's chain is the same whatever pass it is in. */
static inline __attribute__((always_inline)) void values_run(const float *pa, const float *pb, const int NH, int n,
                                                             int hd, int from, int to, const void *v, size_t ld,
                                                             const int kv, float *oa, float *ob, float *keep,
                                                             const int KEEP, int fresh, const int PF) {
    const int most = NH == 2 ? 6 : 8;
    for (int c0 = from; c0 < to;) {
        const int left = (to - c0) / 8; /* column vectors left: all in one pass, or the next of two halves */
        const int nc = left <= most ? left : left <= 2 * most ? (left + 1) / 2 : most;
        switch (nc) {
#define VALUES_CASE(NC) \
    case NC: values_cols(pa, pb, NH, n, v, ld, kv, c0, NC, oa, ob, keep, hd, KEEP, fresh, PF, c0 == from ? to - from : 0); break;
            VALUES_CASE(8) VALUES_CASE(7) VALUES_CASE(6) VALUES_CASE(5) VALUES_CASE(4) VALUES_CASE(3) VALUES_CASE(2)
            default: values_cols(pa, pb, NH, n, v, ld, kv, c0, 1, oa, ob, keep, hd, KEEP, fresh, PF, c0 == from ? to - from : 0); break;
#undef VALUES_CASE
        }
        c0 += 8 * nc;
    }
}

/* The multi-row attention. Three passes over the visible keys [0, E), E = the largest end (the last row's), in
 * tiles of KEY_TILE keys, so a tile stays in L1 while every row and head of the item uses it:
 *   1. scores (nr, nq, E): each row for its own keys of the tile (none once past its end)
 *   2. softmax per (row, head) over [0, ends[r])
 *   3. out = p . v, tile by tile (the first tile starts the sums; later tiles carry them on through out, which
 *      changes no bit of them)
 * In passes 1 and 3 the row with the largest end goes first (it sees every key of the tile), with its first head (pair) reading
 * the fp16 cache and keeping the converted tile for the others; that first reader prefetches the rows ahead (PF, a
 * constant in each copy of the passes: as a run-time flag the decode attention at 4,000 positions took 14.0-14.5 ms
 * instead of 11.9-12.4, session 23). Pass 3
 * computes the columns [c0, c1) of each head's output only. */
#define KEY_TILE BN_ATTN_KEY_TILE

/* p[s] *= sc[s] for s < n */
static void scale_by(float *p, const float *sc, int n) {
    int s = 0;
    for (; s + 8 <= n; s += 8) _mm256_storeu_ps(p + s, _mm256_mul_ps(_mm256_loadu_ps(p + s), _mm256_loadu_ps(sc + s)));
    for (; s < n; s++) p[s] *= sc[s];
}

static inline __attribute__((always_inline)) void attend_rows_kv(const float *q, size_t ldq, int nr, int nq, int hd,
                                                                 const void *k, const void *v, size_t ld, const int kv,
                                                                 const float *ks, const float *vs, const int *ends,
                                                                 int c0, int c1, float scale, float *scratch,
                                                                 float *out, size_t ldo) {
    int last = nr - 1; /* the row with the largest end (the last one: ends are non-decreasing) */
    for (int r = 0; r < nr; r++) last = ends[r] > ends[last] ? r : last;
    const int E = ends[last], conv = kv != BN_KV_F32 && nr > 1; /* conv: convert each tile once, into `tile` */
    const size_t elem = kv_elem(kv);
    /* each (row, head)'s scores and the float tile start on a 64-byte line (scratch does): a tile at an odd offset
     * split every other 32-byte load across two lines (5 rows x 3 heads x 137 keys: 9.2 -> 7.6 us, hd 64) */
    const size_t ldsc = ((size_t)E + 15) / 16 * 16;
    float *tile = scratch + (size_t)nr * nq * ldsc;
#define SCORES(r, h) (scratch + ((size_t)(r) * nq + (h)) * ldsc)
    for (int s0 = 0; s0 < E; s0 += KEY_TILE) {
        const int n = E - s0 < KEY_TILE ? E - s0 : KEY_TILE;
        const void *src = (const char *)k + (size_t)s0 * ld * elem;
        const float *kst = ks ? ks + s0 : NULL;
        for (int i = 0; i < nr; i++) {
            const int r = i == 0 ? last : i - 1 + (i - 1 >= last);      /* the last row first */
            const int nk = (ends[r] < s0 + n ? ends[r] : s0 + n) - s0; /* keys of this tile row r sees */
            const float *qr = q + (size_t)r * ldq;
            for (int h = 0; h < nq;) {
                const int two = h + 2 <= nq;
                float *ra = SCORES(r, h) + s0, *rb = two ? SCORES(r, h + 1) + s0 : ra;
                const float *qa = qr + (size_t)h * hd, *qb = two ? qa + hd : qa;
#define SCORES_FROM(NH)                                                                                  \
    if (!conv && i == 0 && h == 0) scores_run(qa, qb, NH, hd, src, ld, kv, nk, scale, kst, ra, rb, NULL, 0, 1); \
    else if (!conv) scores_run(qa, qb, NH, hd, src, ld, kv, nk, scale, kst, ra, rb, NULL, 0, 0);           \
    else if (i == 0 && h == 0) scores_run(qa, qb, NH, hd, src, ld, kv, nk, scale, kst, ra, rb, tile, 1, 1);  \
    else scores_run(qa, qb, NH, hd, tile, (size_t)hd, BN_KV_F32, nk, scale, kst, ra, rb, NULL, 0, 0);
                if (two) { SCORES_FROM(2) } else { SCORES_FROM(1) }
#undef SCORES_FROM
                h += two ? 2 : 1;
            }
        }
    }
    for (int r = 0; r < nr; r++) /* (out is not cleared: the first tile, which every row sees, starts the sums) */
        for (int h = 0; h < nq; h++) {
            softmax_row(SCORES(r, h), ends[r]);
            if (vs) scale_by(SCORES(r, h), vs, ends[r]); /* int8 values: p_s * vscale_s */
        }
    for (int s0 = 0; s0 < E; s0 += KEY_TILE) {
        const int n = E - s0 < KEY_TILE ? E - s0 : KEY_TILE;
        const void *src = (const char *)v + (size_t)s0 * ld * elem;
        for (int i = 0; i < nr; i++) {
            const int r = i == 0 ? last : i - 1 + (i - 1 >= last);
            const int nk = (ends[r] < s0 + n ? ends[r] : s0 + n) - s0;
            if (nk <= 0) continue;
            float *orow = out + (size_t)r * ldo;
            for (int h = 0; h < nq;) {
                const int two = h + 2 <= nq;
                const float *pa = SCORES(r, h) + s0, *pb = two ? SCORES(r, h + 1) + s0 : pa;
                float *oa = orow + (size_t)h * hd, *ob = two ? oa + hd : oa;
#define VALUES_FROM(NH)                                                                                  \
    if (!conv && i == 0 && h == 0) values_run(pa, pb, NH, nk, hd, c0, c1, src, ld, kv, oa, ob, NULL, 0, s0 == 0, 1); \
    else if (!conv) values_run(pa, pb, NH, nk, hd, c0, c1, src, ld, kv, oa, ob, NULL, 0, s0 == 0, 0);           \
    else if (i == 0 && h == 0) values_run(pa, pb, NH, nk, hd, c0, c1, src, ld, kv, oa, ob, tile, 1, s0 == 0, 1);  \
    else values_run(pa, pb, NH, nk, hd, c0, c1, tile, (size_t)hd, BN_KV_F32, oa, ob, NULL, 0, s0 == 0, 0);
                if (two) { VALUES_FROM(2) } else { VALUES_FROM(1) }
#undef VALUES_FROM
                h += two ? 2 : 1;
            }
        }
    }
#undef SCORES
}

/* out = silu(g) * u with silu(g) = g * sigmoid(g): with z = e^-|g| (exp_nonpos), sigmoid(g) = 1 / (1 + z) for
 * g >= 0 and z / (1 + z) for g < 0, so the exponential never overflows. Relative error about 1e-7, as expf. */
static void silu_mul(const float *g, const float *u, float *out, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 z = exp_nonpos(_mm256_or_ps(x, sign)); /* e^-|x| */
        const __m256 num = _mm256_blendv_ps(one, z, x);     /* the sign bit of x picks z */
        const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, z));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + i)));
    }
    if (i < n) { /* the tail through one padded vector, so every element takes the same path */
        float gb[8] = {0}, ub[8] = {0}, ob[8];
        memcpy(gb, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(ub, u + i, sizeof(float) * (size_t)(n - i));
        silu_mul(gb, ub, ob, 8);
        memcpy(out + i, ob, sizeof(float) * (size_t)(n - i));
    }
}

/* The greedy confidence (kernels.h): the largest of a row (row_max), then its first index; the float32
 * exponentials (exp_nonpos, as the attention's softmax) summed in double, sixteen at a time in four sums. */
static float max_first(const float *x, int n, int *arg) {
    const float mx = row_max(x, n);
    const __m256 vmx = _mm256_set1_ps(mx);
    int i, a;
    for (i = 0; i + 8 <= n; i += 8) { /* the first index holding the max */
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vmx, _CMP_EQ_OQ));
        if (hit) {
            *arg = i + __builtin_ctz((unsigned)hit);
            return mx;
        }
    }
    for (a = i; a < n && !(x[a] == mx); a++) {}
    *arg = a < n ? a : 0; /* none equal: every entry NaN */
    return a < n ? mx : x[0];
}

static inline __m256d exps_to_double(__m256d s, __m128 e) { return _mm256_add_pd(s, _mm256_cvtps_pd(e)); }

static double expsum(const float *x, int n, float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 e0 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
        const __m256 e1 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vmx));
        s0 = exps_to_double(s0, _mm256_castps256_ps128(e0));
        s1 = exps_to_double(s1, _mm256_extractf128_ps(e0, 1));
        s2 = exps_to_double(s2, _mm256_castps256_ps128(e1));
        s3 = exps_to_double(s3, _mm256_extractf128_ps(e1, 1));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i += 8) { /* the tail through padded vectors, so every entry goes through the same exp */
        float buf[8];
        for (int j = 0; j < 8; j++) buf[j] = i + j < n ? x[i + j] - mx : -INFINITY;
        _mm256_storeu_ps(buf, exp_nonpos(_mm256_loadu_ps(buf)));
        for (int j = 0; j < 8 && i + j < n; j++) sum += (double)buf[j];
    }
    return sum;
}

/* exp(x) in double for x in [-708, 0]: exp(x) = 2^k exp(r) with k = round(x / ln 2) and r = x - k ln 2 (ln 2 in two
 * parts, fdlibm's: k * LN2_HI is exact for |k| < 2^11), |r| <= 0.347; exp(r) = 1 + (r + r^2 P(r)) with P the Taylor
 * series to r^11/13! (its remainder r^14/14! < 5e-18, far below an ulp), evaluated by Estrin's scheme (a chain of
 * 4 FMAs, not 11), so the result is within ~1 ulp of libm's. */
static inline __m256d exp_pd(__m256d x) {
    const __m256d magic = _mm256_set1_pd(6755399441055744.0); /* 1.5 * 2^52: x + magic rounds x to an integer */
    const __m256d kk = _mm256_fmadd_pd(x, _mm256_set1_pd(1.4426950408889634), magic); /* k in the low bits */
    const __m256d k = _mm256_sub_pd(kk, magic);
    const __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.90821492927058770002e-10),
                                       _mm256_fnmadd_pd(k, _mm256_set1_pd(6.93147180369123816490e-01), x));
#define C(n) _mm256_set1_pd(1.0 / (n))
    const __m256d r2 = _mm256_mul_pd(r, r), r4 = _mm256_mul_pd(r2, r2), r8 = _mm256_mul_pd(r4, r4);
    const __m256d p01 = _mm256_fmadd_pd(C(6), r, C(2)), p23 = _mm256_fmadd_pd(C(120), r, C(24));
    const __m256d p45 = _mm256_fmadd_pd(C(5040), r, C(720)), p67 = _mm256_fmadd_pd(C(362880), r, C(40320));
    const __m256d p89 = _mm256_fmadd_pd(C(39916800), r, C(3628800));
    const __m256d pab = _mm256_fmadd_pd(C(6227020800.0), r, C(479001600));
#undef C
    const __m256d p03 = _mm256_fmadd_pd(p23, r2, p01), p47 = _mm256_fmadd_pd(p67, r2, p45);
    const __m256d p8b = _mm256_fmadd_pd(pab, r2, p89);
    const __m256d p = _mm256_fmadd_pd(p8b, r8, _mm256_fmadd_pd(p47, r4, p03));
    const __m256d e = _mm256_add_pd(_mm256_set1_pd(1.0), _mm256_fmadd_pd(r2, p, r));
    const __m256i two_k = _mm256_slli_epi64(
        _mm256_add_epi64(_mm256_sub_epi64(_mm256_castpd_si256(kk), _mm256_castpd_si256(magic)),
                         _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(e, _mm256_castsi256_pd(two_k));
}

/* w[i] = exp(z[i] - top) and their sum, for the sampler's weights (kernels.h), eight at a time in two sums. Groups
 * of eight with an x = z - top below -708 (2^k would leave the normal range; -inf, a banned id, is one) or NaN are
 * noted and redone with libm's exp after the loop, which then has no call in it (a call would make every vector
 * register spill); the sum is then taken again. */
#define EXP_REDO_GROUPS 16
static double exp_shifted(const double *z, double top, double *w, int n) {
    const __m256d vtop = _mm256_set1_pd(top), lo = _mm256_set1_pd(-708.0);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int redo[EXP_REDO_GROUPS], n_redo = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d x0 = _mm256_sub_pd(_mm256_loadu_pd(z + i), vtop);
        const __m256d x1 = _mm256_sub_pd(_mm256_loadu_pd(z + i + 4), vtop);
        const __m256d out = _mm256_or_pd(_mm256_cmp_pd(x0, lo, _CMP_NGE_UQ), _mm256_cmp_pd(x1, lo, _CMP_NGE_UQ));
        if (_mm256_movemask_pd(out)) redo[n_redo < EXP_REDO_GROUPS ? n_redo : EXP_REDO_GROUPS - 1] = i, n_redo++;
        const __m256d w0 = exp_pd(_mm256_max_pd(x0, lo)), w1 = exp_pd(_mm256_max_pd(x1, lo)); /* NaN -> lo */
        _mm256_storeu_pd(w + i, w0);
        _mm256_storeu_pd(w + i + 4, w1);
        s0 = _mm256_add_pd(s0, w0);
        s1 = _mm256_add_pd(s1, w1);
    }
    const int vec_end = i;
    for (; i < n; i++) w[i] = exp(z[i] - top);
    if (n_redo) { /* rare: those groups with libm (every group when there were too many to note), then the sum */
        for (int g = 0; g < (n_redo <= EXP_REDO_GROUPS ? n_redo : vec_end / 8); g++) {
            const int j0 = n_redo <= EXP_REDO_GROUPS ? redo[g] : 8 * g;
            for (int j = j0; j < j0 + 8; j++)
                if (!(z[j] - top >= -708.0)) w[j] = exp(z[j] - top);
        }
        s0 = s1 = _mm256_setzero_pd();
        for (int j = 0; j < vec_end; j += 8) {
            s0 = _mm256_add_pd(s0, _mm256_loadu_pd(w + j));
            s1 = _mm256_add_pd(s1, _mm256_loadu_pd(w + j + 4));
        }
    }
    double c[4];
    _mm256_storeu_pd(c, _mm256_add_pd(s0, s1));
    for (int j = vec_end; j < n; j++) c[j & 3] += w[j];
    return (c[0] + c[1]) + (c[2] + c[3]);
}

/* The sampler's first pass (kernels.h): z = x * inv_t, four at a time; the largest by _mm256_max_pd (which keeps the
 * running max when an entry is NaN, as `v > t ? v : t` does), the counts in 64-bit lanes (a true compare is -1). */
static double scale_row(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad) {
    const __m256d vt = _mm256_set1_pd(inv_t), ninf = _mm256_set1_pd(-INFINITY), zero = _mm256_setzero_pd();
    __m256d t0 = ninf, t1 = ninf;
    __m256i neg = _mm256_setzero_si256(), bad = _mm256_setzero_si256();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d v0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), vt);
        const __m256d v1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)), vt);
        _mm256_storeu_pd(z + i, v0);
        _mm256_storeu_pd(z + i + 4, v1);
        t0 = _mm256_max_pd(v0, t0);
        t1 = _mm256_max_pd(v1, t1);
        neg = _mm256_sub_epi64(neg, _mm256_castpd_si256(_mm256_cmp_pd(v0, ninf, _CMP_EQ_OQ)));
        neg = _mm256_sub_epi64(neg, _mm256_castpd_si256(_mm256_cmp_pd(v1, ninf, _CMP_EQ_OQ)));
        /* v - v is 0 for a finite v, NaN for NaN and +-inf */
        bad = _mm256_sub_epi64(bad, _mm256_castpd_si256(_mm256_cmp_pd(_mm256_sub_pd(v0, v0), zero, _CMP_NEQ_UQ)));
        bad = _mm256_sub_epi64(bad, _mm256_castpd_si256(_mm256_cmp_pd(_mm256_sub_pd(v1, v1), zero, _CMP_NEQ_UQ)));
    }
    double t[8];
    int64_t cn[4], cb[4];
    _mm256_storeu_pd(t, t0);
    _mm256_storeu_pd(t + 4, t1);
    _mm256_storeu_si256((__m256i *)cn, neg);
    _mm256_storeu_si256((__m256i *)cb, bad);
    double top = -INFINITY;
    for (int j = 0; j < 8; j++) top = t[j] > top ? t[j] : top;
    int64_t nn = cn[0] + cn[1] + cn[2] + cn[3], nb = cb[0] + cb[1] + cb[2] + cb[3];
    for (; i < n; i++) {
        const double v = (double)x[i] * inv_t;
        z[i] = v;
        top = v > top ? v : top;
        nn += v == -INFINITY;
        nb += !(v - v == 0.0);
    }
    *n_neginf = (int)nn;
    *n_bad = (int)(nb - nn); /* -inf counted in both */
    return top;
}

/* The j with w[j] >= t, ascending, into out (kernels.h): eight at a time, most eights with none. */
static int select_at_least(const double *w, int n, double t, int *out) {
    const __m256d vt = _mm256_set1_pd(t);
    int m = 0, j = 0;
    for (; j + 8 <= n; j += 8) {
        unsigned hit = (unsigned)(_mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(w + j), vt, _CMP_GE_OQ)) |
                                  _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(w + j + 4), vt, _CMP_GE_OQ)) << 4);
        for (; hit; hit &= hit - 1) out[m++] = j + __builtin_ctz(hit);
    }
    for (; j < n; j++)
        if (w[j] >= t) out[m++] = j;
    return m;
}

/* Head sizes that are a multiple of 8 (every real model); others go to forward.c's generic loop. */
static int attend_rows(const float *q, size_t ldq, int nr, int nq, int hd, const void *k, const void *v, size_t ld,
                       int kv, const float *ks, const float *vs, const int *ends, int c0, int c1, float scale,
                       float *scratch, float *out, size_t ldo) {
    if (hd % 8 || nr <= 0) return 0;
    for (int r = 0; r < nr; r++)
        if (ends[r] <= 0) return 0;
    switch (kv) { /* the cache's element type a constant inside */
        case BN_KV_F16:
            if (hd == 64) /* the usual head sizes constants too: the loops over a row's vectors unroll */
                attend_rows_kv(q, ldq, nr, nq, 64, k, v, ld, BN_KV_F16, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
            else if (hd == 128)
                attend_rows_kv(q, ldq, nr, nq, 128, k, v, ld, BN_KV_F16, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
            else
                attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_F16, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
            break;
        case BN_KV_I8: attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_I8, ks, vs, ends, c0, c1, scale, scratch, out, ldo); break;
        default: attend_rows_kv(q, ldq, nr, nq, hd, k, v, ld, BN_KV_F32, NULL, NULL, ends, c0, c1, scale, scratch, out, ldo);
    }
    return 1;
}

const bn_kernels bn_kernels_avx2 = {
    .name = "avx2", .ternary_matmul = ternary_tiles, .ternary5_matmul = ternary5_matmul, .unpack5 = unpack5,
    .int8_matmul = int8_walk, .bf16_matmul = bf16_matmul,
    .dot = dot, .axpy = axpy, .sumsq = sumsq, .absmax = absmax, .quantize = quantize, .norm_apply = norm_apply,
    .relu2_mul = relu2_mul, .add = add, .to_f16 = to_f16, .dot_f16 = dot_f16, .axpy_f16 = axpy_f16,
    .norm_quant = norm_quant, .attend_rows = attend_rows, .silu_mul = silu_mul, .max_first = max_first,
    .expsum = expsum,
    .exp_shifted = exp_shifted, .scale_row = scale_row, .select_at_least = select_at_least,
};
