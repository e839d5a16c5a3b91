/* AVX2 products (compiled with -mavx2 -mfma -mf16c), for x86 CPUs without AVX512-VNNI, and the AVX2 table.
 *
 * Same tile layouts as the AVX512 path; a 16-row tile is two 256-bit halves (rows 0-7, rows 8-15),
 * each 8 int32 lanes = 8 rows x 4 columns. Products use vpmaddubsw (u8 x s8 -> pairs summed in s16)
 * then vpmaddwd with ones (-> s32):
 *   ternary: codes (<= 2) x activations (|x| <= 128): a pair is at most 512 in magnitude; sums stay in
 *            s16 for 16 groups of 16 columns (see GROUPS_PER_WIDEN), then widen to s32.
 *   int8:    |x| x sign(w, x) so both factors fit: a pair is at most 2 * 127 * 127 = 32258 < 32767.
 * The elementwise ops are kernels_avx2_vector.c's, the attention and the sampler's passes the x86 files'
 * (kernels_x86.h).
 */
#include "kernels_x86.h"

/* Groups of 16 columns whose products one token sums in int16 before widening to int32. A lane gains at most
 * 4 pairs x 2 products x 2 x 128 = 2048 in magnitude per group (codes <= 2, |x| <= 128), so 16 groups stay within
 * [-32768, 32512]: exact. Widening once per 16 groups instead of once per group saves 15 of 16 vpmaddwd. */
#define GROUPS_PER_WIDEN 16

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
 * The int16 runs of GROUPS_PER_WIDEN groups are those of ternary_tile_block below: the same sums. */
static void ternary_tile_1(const uint8_t *wt, int groups, const int8_t *x, const float *row_scale, int32_t xsum,
                           float xinv, float *y) {
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0; /* int32 sums of rows 0-7 and 8-15 */
    for (int g0 = 0; g0 < groups; g0 += GROUPS_PER_WIDEN) {
        const int g1 = g0 + GROUPS_PER_WIDEN < groups ? g0 + GROUPS_PER_WIDEN : groups;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0; /* int16 sums of this run of groups */
        for (int g = g0; g < g1; g++) {
            _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
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
        _mm_prefetch((const char *)(wt + g * 64 + BN_BLOCK_PREFETCH_BYTES), _MM_HINT_T0);
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
        _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
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

#include "tile_walk.h" /* ternary_walk_1, int8_walk: from the kernels above */

/* ---------------------------------------------------------------- several tokens through whole 16-row tiles
 *
 * Per group of 16 columns and code field, the codes of both halves of the tile (rows 0-7 and 8-15) are unpacked
 * once and each token's activation broadcast serves both: 2 vpmaddubsw per broadcast, which keeps the multiply
 * ports busy where one half at a time left them waiting on broadcasts. Both halves' int16 sums for TILE_TOKENS
 * tokens fill 8 of the 16 ymm registers; 5 tokens (10) would spill.
 *
 * Each int16 run holds the products of the same GROUPS_PER_WIDEN groups as one token's (ternary_tile_1; exact,
 * see GROUPS_PER_WIDEN), so y is the same bit for bit whatever the block. */
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
                _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
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

/* kernels.h ternary_matmul: one token by ternary_tile_1 (decode), more tile by tile, TILE_TOKENS tokens at a time, so
 * a tile is read from memory once and from L1/L2 for the later blocks. With more than one block, the first also
 * writes the codes it unpacks (a byte a weight, 16 x kp bytes a tile) to this thread's buffer, and the later blocks
 * multiply those with no unpacking (unpacking costs more than reading the codes from L2), as ternary5_batch does
 * for 1.6-bit tiles. The same int16 runs of the same products: the same y, bit for bit. */
static void ternary_tiles(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum,
                          const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    if (T == 1) {
        ternary_walk_1(codes, kp, row_scale, xq, xsum, xinv, n0, n1, y);
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
            _mm_prefetch((const char *)(wt + g * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
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
            _mm_prefetch((const char *)(in + (m / BN_TRIT5_QUADS) * 64 + BN_STREAM_PREFETCH_BYTES), _MM_HINT_T0);
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
 * buffer, from which the later blocks multiply them with no unpacking at all. The sums are ternary5_tile_1's products
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
        _mm_prefetch((const char *)(w5 + (size_t)g * 64 + BN_BLOCK_PREFETCH_BYTES), _MM_HINT_T0);
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
            FIRST_THEN_LATER_BLOCKS(FIRST_CALL, LATER_CALL, first)
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

const bn_kernels bn_kernels_avx2 = {
    .name = "avx2", .ternary_matmul = ternary_tiles, .ternary5_matmul = ternary5_matmul, .unpack5 = unpack5,
    .int8_matmul = int8_walk, .bf16_matmul = bf16_matmul,
    BN_VECTOR_ENTRIES(bn_avx2_), BN_X86_SHARED_ENTRIES,
};
