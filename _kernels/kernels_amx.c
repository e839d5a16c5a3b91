/* AMX kernels: the two int8 matmuls on Intel's tile unit (AMX-INT8, Xeon 4th generation and later), for batches of
 * tokens (prefill, a diffusion step). One tile multiply (`tdpbsud`/`tdpbssd`) does 16 tokens x 16 rows x 64 columns
 * = 16,384 multiply-adds; the tile ceiling is 7.4x the zmm vpdpbusd one on the Xeon here (6,242 against 845 GMAC/s
 * on 2 threads). Decode (a token at a time) stays on the AVX512-VNNI kernels, which read each weight once anyway.
 *
 * The operands, with A the tokens and B the weights (C[t, n] += sum_k A[t, k] * B[k, n], k in quads):
 *   A = xq rows: up to 16 tokens x 64 columns of s8 activations, straight from xq (stride kp).
 *   B = 16 rows of quads x 16 weight rows x 4 bytes. The engine's int8 head tile (Np/16, Kp/4, 64) already is this
 *       layout (16 consecutive groups = one B tile). A ternary tile's group of 16 columns (64 bytes, lane n = row n's
 *       16 codes, 4 per byte) unpacks with shifts and masks into exactly 4 B rows: the codes (w + 1 in {0, 1, 2}) as
 *       unsigned bytes, so `tdpbsud` (signed A x unsigned B) sums (w + 1) * x and xsum removes the offset.
 *   C = 16 tokens x 16 weight rows of int32: the layout of y, so the result is scaled and stored row by row.
 * The integer sums are the VNNI kernels' sums and the scaling is the same float arithmetic, so every result is bit
 * for bit the AVX512-VNNI path's (tests/test_kernels.py checks both against numpy).
 *
 * Compiled twice: kernels_amx.c with the AMX flags (the path "amx"), and kernels_amx_emulated.c, which
 * defines BN_AMX_EMULATED and runs the same code with the tile instructions written in plain C (the path
 * "amx-emulated", so the tests run this file's tiling on every machine). Apart from the tile instructions the code is
 * plain C that the compiler vectorizes.
 */
#include <string.h>

#include "kernels.h"

/* Below this many tokens the VNNI kernels are as fast or faster: the tiles' unpacking into B tiles is paid per
 * chunk of weights, and few tokens do not repay it; decode (1 token) is memory-bound either way. */
#define AMX_MIN_TOKENS 8
/* The head's tiles need no unpacking (its B tiles lie in memory as they are), so tiles pay from fewer tokens (a
 * denoising step of the demo model asks for the logits of up to 7 rows). */
#define AMX_MIN_HEAD_TOKENS 4
#define QUADS 16     /* B tile rows: 16 quads = 64 columns */
#define TILE_BYTES 1024

/* ---------------------------------------------------------------- the tile instructions */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile register */
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tile_config;

#ifdef BN_AMX_EMULATED
/* The 8 tile registers of one thread, and the instructions this file uses, as the ISA reference defines them. */
static __thread struct {
    int rows, colsb;
    uint8_t data[16 * 64];
} tmm[8];

static void emu_loadconfig(const tile_config *c) {
    for (int i = 0; i < 8; i++) tmm[i].rows = c->rows[i], tmm[i].colsb = c->colsb[i];
}
static void emu_zero(int t) { memset(tmm[t].data, 0, sizeof tmm[t].data); }
static void emu_load(int t, const void *p, size_t stride) {
    for (int r = 0; r < tmm[t].rows; r++) memcpy(tmm[t].data + r * 64, (const uint8_t *)p + r * stride, tmm[t].colsb);
}
static void emu_store(int t, void *p, size_t stride) {
    for (int r = 0; r < tmm[t].rows; r++) memcpy((uint8_t *)p + r * stride, tmm[t].data + r * 64, tmm[t].colsb);
}
/* C[m, n] += sum over quads q and bytes j of A[m, 4q + j] (s8) * B[q, 4n + j] (u8 or s8) */
static void emu_dp(int c, int a, int b, int b_signed) {
    for (int m = 0; m < tmm[c].rows; m++)
        for (int n = 0; n < tmm[c].colsb / 4; n++) {
            int32_t acc;
            memcpy(&acc, tmm[c].data + m * 64 + 4 * n, 4);
            for (int q = 0; q < tmm[a].colsb / 4; q++)
                for (int j = 0; j < 4; j++) {
                    const int x = (int8_t)tmm[a].data[m * 64 + 4 * q + j];
                    const uint8_t w = tmm[b].data[q * 64 + 4 * n + j];
                    acc += x * (b_signed ? (int)(int8_t)w : (int)w);
                }
            memcpy(tmm[c].data + m * 64 + 4 * n, &acc, 4);
        }
}
#define TILE_LOADCONFIG(c) emu_loadconfig(c)
#define TILE_RELEASE() ((void)0)
#define TILE_ZERO(t) emu_zero(t)
#define TILE_LOAD(t, p, stride) emu_load(t, p, stride)
#define TILE_STORE(t, p, stride) emu_store(t, p, stride)
#define TILE_DP_SU(c, a, b) emu_dp(c, a, b, 0)
#define TILE_DP_SS(c, a, b) emu_dp(c, a, b, 1)
#define FALLBACK bn_kernels_avx2
#define ENTRY(name) bn_amx_emulated_##name
#else
#include <immintrin.h>
/* gcc 12 does not see that ldtilecfg reads the structure and drops the stores that fill it: the empty asm with
 * the address and a memory clobber keeps them. */
#define TILE_LOADCONFIG(c)                             \
    do {                                               \
        __asm__ volatile("" : : "r"(c) : "memory");    \
        _tile_loadconfig(c);                           \
    } while (0)
#define TILE_RELEASE() _tile_release()
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, p, stride) _tile_loadd(t, p, stride)
#define TILE_STORE(t, p, stride) _tile_stored(t, p, stride)
#define TILE_DP_SU(c, a, b) _tile_dpbsud(c, a, b)
#define TILE_DP_SS(c, a, b) _tile_dpbssd(c, a, b)
#define FALLBACK bn_kernels_avx512
#define ENTRY(name) bn_amx_##name
#endif

/* Tile registers: C (weight row tile r, token tile t) = 2r + t; A (token tile t) = 4 + t; B (row tile r) = 6 + r.
 * Token tile 0 holds rows0 tokens, tile 1 rows1 (0: unused, configured as 1 row). loaded: the shape this call loaded
 * last ({-1, -1} at the start of a call), since loading a configuration costs ~0.1 µs. */
static void configure(int rows0, int rows1, int loaded[2]) {
    if (loaded[0] == rows0 && loaded[1] == rows1) return;
    loaded[0] = rows0, loaded[1] = rows1;
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const int r1 = rows1 ? rows1 : 1;
    const uint8_t rows[8] = {rows0, r1, rows0, r1, rows0, r1, QUADS, QUADS};
    for (int i = 0; i < 8; i++) c.rows[i] = rows[i], c.colsb[i] = 64;
    TILE_LOADCONFIG(&c);
}

/* ---------------------------------------------------------------- per-thread scratch */

/* This thread's scratch (thread_buffer.c), followed in the same buffer by room for `unpacked` bytes: two row tiles'
 * codes as B tiles (2, blocks, QUADS, 64) (scratch_unpacked); NULL if out of memory. */
typedef struct {
    int32_t c[4][16 * 16];                  /* the C tiles, stored for scaling */
    int8_t a_tail[32 * 64];                 /* the last block of up to 32 tokens' activations, zero padded */
    uint8_t b_tail[2][TILE_BYTES];          /* the last block of two int8 head tiles, zero padded */
} scratch;
#define SCRATCH_BYTES ((sizeof(scratch) + 63) & ~(size_t)63)

static scratch *thread_scratch(size_t unpacked) { return bn_thread_buffer(BN_SCRATCH_AMX, SCRATCH_BYTES + unpacked); }
static uint8_t *scratch_unpacked(scratch *s) { return (uint8_t *)s + SCRATCH_BYTES; }

/* ---------------------------------------------------------------- the tiled product */

/* One ternary row tile (groups of 64 bytes) -> B tiles (blocks, QUADS, 64): group g gives quads 4g .. 4g+3 (the
 * codes of columns 16g + 4s .. +3 sit in bits 2s of each lane's 4 bytes); quads past the last group are zero.
 * And y (rows x 16, stride ldy) = (c - xsum[t]) * xinv[t] * scale[n]: the VNNI kernels' arithmetic (xsum NULL:
 * none). Plain C in the emulated build (the reference), AVX-512 in the real one (3x faster than what the compiler
 * makes of the plain loops). */
#ifdef BN_AMX_EMULATED
static void unpack_groups(const uint8_t *wt, int groups, uint8_t *out) {
    for (int g = 0; g < groups; g++)
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 64; i++) out[(size_t)g * 256 + 64 * s + i] = (wt[(size_t)g * 64 + i] >> (2 * s)) & 3;
}

static void scale_rows(const int32_t *c, int rows, const int32_t *xsum, const float *xinv, const float *scale,
                       float *y, int ldy) {
    for (int t = 0; t < rows; t++) {
        const int32_t off = xsum ? xsum[t] : 0;
        for (int n = 0; n < 16; n++) y[(size_t)t * ldy + n] = (float)(c[16 * t + n] - off) * xinv[t] * scale[n];
    }
}
#else
static void unpack_groups(const uint8_t *wt, int groups, uint8_t *out) {
    const __m512i m3 = _mm512_set1_epi8(3);
    for (int g = 0; g < groups; g++) {
        const __m512i v = _mm512_loadu_si512((const void *)(wt + (size_t)g * 64));
        uint8_t *o = out + (size_t)g * 256;
        _mm512_storeu_si512((void *)o, _mm512_and_si512(v, m3));
        _mm512_storeu_si512((void *)(o + 64), _mm512_and_si512(_mm512_srli_epi16(v, 2), m3));
        _mm512_storeu_si512((void *)(o + 128), _mm512_and_si512(_mm512_srli_epi16(v, 4), m3));
        _mm512_storeu_si512((void *)(o + 192), _mm512_and_si512(_mm512_srli_epi16(v, 6), m3));
    }
}

static void scale_rows(const int32_t *c, int rows, const int32_t *xsum, const float *xinv, const float *scale,
                       float *y, int ldy) {
    const __m512 s = _mm512_loadu_ps(scale);
    for (int t = 0; t < rows; t++) {
        __m512i v = _mm512_loadu_si512((const void *)(c + 16 * t));
        if (xsum) v = _mm512_sub_epi32(v, _mm512_set1_epi32(xsum[t]));
        const __m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(xinv[t])), s);
        _mm512_storeu_ps(y + (size_t)t * ldy, f);
    }
}
#endif

/* Block kb (groups 4kb .. 4kb+3, those that exist; zero codes past the last) of a ternary row tile wt -> out */
static void unpack_block(const uint8_t *wt, int groups, int kb, uint8_t *out) {
    const int g0 = 4 * kb, n = groups - g0 < 4 ? groups - g0 : 4;
    for (int i = 0; i < 4; i++) __builtin_prefetch(wt + (size_t)(g0 + 32 + i) * 64); /* 8 blocks ahead */
    unpack_groups(wt + (size_t)g0 * 64, n, out);
    if (n < 4) memset(out + n * 256, 0, (size_t)(4 - n) * 256);
}

/* rt (1 or 2) weight row tiles x up to 32 tokens over all blocks of 64 columns. b[r]: row tile r's B tiles
 * (blocks of TILE_BYTES); b_tail[r]: its last block when kp is not a multiple of 64 (zero padded). codes: NULL, or
 * the ternary row tiles to unpack into b block by block on the way (so each block is used while it is in L1). */
static void tiles_block(scratch *s, int loaded[2], const uint8_t *const codes[2], uint8_t *const b[2],
                        const uint8_t *const b_tail[2], int rt, int s8_weights, const int8_t *xq, int kp, int n_tokens,
                        const int32_t *xsum, const float *xinv, const float *scale, float *y, int ldy) {
    const int full = kp / 64, rem = kp % 64, rows0 = n_tokens < 16 ? n_tokens : 16, rows1 = n_tokens - rows0;
    configure(rows0, rows1, loaded);
    if (rem)
        for (int t = 0; t < n_tokens; t++) {
            memcpy(s->a_tail + t * 64, xq + (size_t)t * kp + full * 64, rem);
            memset(s->a_tail + t * 64 + rem, 0, 64 - rem);
        }
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
    for (int kb = 0; kb < full + (rem > 0); kb++) {
        const int tail = kb == full;
        const int8_t *a = tail ? s->a_tail : xq + kb * 64;
        const size_t lda = tail ? 64 : (size_t)kp;
        if (codes)
            for (int r = 0; r < rt; r++) unpack_block(codes[r], kp / 16, kb, b[r] + (size_t)kb * TILE_BYTES);
        TILE_LOAD(4, a, lda);
        if (rows1) TILE_LOAD(5, a + 16 * lda, lda);
        TILE_LOAD(6, tail ? b_tail[0] : b[0] + (size_t)kb * TILE_BYTES, 64);
        if (rt > 1) TILE_LOAD(7, tail ? b_tail[1] : b[1] + (size_t)kb * TILE_BYTES, 64);
        if (s8_weights) {
            TILE_DP_SS(0, 4, 6);
            if (rows1) TILE_DP_SS(1, 5, 6);
            if (rt > 1) TILE_DP_SS(2, 4, 7);
            if (rt > 1 && rows1) TILE_DP_SS(3, 5, 7);
        } else {
            TILE_DP_SU(0, 4, 6);
            if (rows1) TILE_DP_SU(1, 5, 6);
            if (rt > 1) TILE_DP_SU(2, 4, 7);
            if (rt > 1 && rows1) TILE_DP_SU(3, 5, 7);
        }
    }
    TILE_STORE(0, s->c[0], 64);
    if (rows1) TILE_STORE(1, s->c[1], 64);
    if (rt > 1) TILE_STORE(2, s->c[2], 64);
    if (rt > 1 && rows1) TILE_STORE(3, s->c[3], 64);
    for (int r = 0; r < rt; r++) {
        scale_rows(s->c[2 * r], rows0, xsum, xinv, scale + 16 * r, y + 16 * r, ldy);
        if (rows1)
            scale_rows(s->c[2 * r + 1], rows1, xsum ? xsum + 16 : NULL, xinv + 16, scale + 16 * r,
                       y + (size_t)16 * ldy + 16 * r, ldy);
    }
}

/* kernels.h's ternary_matmul: each pair of row tiles is unpacked once, by the first chunk of 32 tokens, and the
 * other chunks read it unpacked */
void ENTRY(ternary_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                           const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    const int blocks = (kp + 63) / 64;
    const size_t tile_bytes = (size_t)blocks * TILE_BYTES;
    scratch *s = T >= AMX_MIN_TOKENS ? thread_scratch(2 * tile_bytes) : NULL;
    if (!s) { /* few tokens, or no memory for the scratch */
        FALLBACK.ternary_matmul(codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy);
        return;
    }
    int loaded[2] = {-1, -1};
    for (int tile = n0 / 16; tile < n1 / 16; tile += 2) {
        const int rt = tile + 1 < n1 / 16 ? 2 : 1;
        uint8_t *const b[2] = {scratch_unpacked(s), scratch_unpacked(s) + tile_bytes};
        const uint8_t *const b_tail[2] = {b[0] + (size_t)(kp / 64) * TILE_BYTES, b[1] + (size_t)(kp / 64) * TILE_BYTES};
        const uint8_t *const rows[2] = {codes + (size_t)tile * (kp / 16) * 64, codes + (size_t)(tile + 1) * (kp / 16) * 64};
        for (int t0 = 0; t0 < T; t0 += 32)
            tiles_block(s, loaded, t0 == 0 ? rows : NULL, b, b_tail, rt, 0, xq + (size_t)t0 * kp, kp, T - t0 < 32 ? T - t0 : 32, xsum + t0, xinv + t0,
                        row_scale + tile * 16, y + (size_t)t0 * ldy + tile * 16, ldy);
    }
    TILE_RELEASE();
}

/* kernels.h's ternary5_matmul: below AMX_MIN_TOKENS the fallback's (its one-token decode), else each pair of row
 * tiles unpacked into 2-bit tiles (the fallback's unpack5) and multiplied by the tiles above (tiles5.c) */
void ENTRY(ternary5_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                            const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    if (T < AMX_MIN_TOKENS) FALLBACK.ternary5_matmul(codes, kp, row_scale, xq, xsum, xinv, T, n0, n1, y, ldy);
    else bn_ternary5_batch(FALLBACK.unpack5, ENTRY(ternary_matmul), FALLBACK.ternary5_matmul, codes, kp, row_scale,
                           xq, xsum, xinv, T, n0, n1, y, ldy);
}

/* kernels.h's int8_matmul (the head): its tiles are B tiles as they lie in memory; the weights are signed, so no
 * offset (rowsum is the VNNI kernels' correction for their unsigned activations) */
void ENTRY(int8_matmul)(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum, const int8_t *xq,
                        const float *xinv, int T, int n0, int n1, float *y, int ldy) {
    scratch *s = T >= AMX_MIN_HEAD_TOKENS ? thread_scratch(0) : NULL;
    if (!s) {
        FALLBACK.int8_matmul(w, kp, row_scale, rowsum, xq, xinv, T, n0, n1, y, ldy);
        return;
    }
    const size_t tile_bytes = (size_t)(kp / 4) * 64;
    const int full = kp / 64, rem_quads = (kp % 64) / 4;
    int loaded[2] = {-1, -1};
    for (int tile = n0 / 16; tile < n1 / 16; tile += 2) {
        const int rt = tile + 1 < n1 / 16 ? 2 : 1;
        /* (only read: tiles_block writes b only when it is given codes to unpack) */
        uint8_t *const b[2] = {(uint8_t *)w + (size_t)tile * tile_bytes, (uint8_t *)w + (size_t)(tile + 1) * tile_bytes};
        const uint8_t *b_tail[2] = {s->b_tail[0], s->b_tail[1]};
        for (int r = 0; r < rt && rem_quads; r++) { /* the last, partial block: the tile's end, then zeros */
            memcpy(s->b_tail[r], b[r] + (size_t)full * TILE_BYTES, (size_t)rem_quads * 64);
            memset(s->b_tail[r] + rem_quads * 64, 0, (size_t)(QUADS - rem_quads) * 64);
        }
        for (int t0 = 0; t0 < T; t0 += 32)
            tiles_block(s, loaded, NULL, b, b_tail, rt, 1, xq + (size_t)t0 * kp, kp, T - t0 < 32 ? T - t0 : 32, NULL, xinv + t0,
                        row_scale + tile * 16, y + (size_t)t0 * ldy + tile * 16, ldy);
    }
    TILE_RELEASE();
}
