/* The per-ISA kernel table. One implementation per file: kernels_portable.c (plain C, the reference
 * path), kernels_avx2.c, kernels_avx512.c (AVX512-VNNI); kernels_avxvnni.c and kernels_amx.c give two matmuls on top
 * of AVX2's and AVX512's tables. Each is compiled with its own target flags (setup.py) and chosen at run time
 * (dispatch.c).
 *
 * Activations arrive quantized: xq (T, Kp) int8 per token (zero padded to Kp), with
 *   xsum[t] = sum_k xq[t, k]   (corrects the +1 offset of the ternary codes: (w+1)*x = w*x + x)
 *   xinv[t] = 1 / act_scale[t] (dequantizes the int32 dot product)
 */
#ifndef BITNET_KERNELS_H
#define BITNET_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "bitnet.h" /* enum bn_kv: the KV cache's element type */

/* A ternary matmul (the signature of ternary_matmul and ternary5_matmul below) and a 1.6-bit -> 2-bit tile unpacker. */
typedef void (*bn_ternary_fn)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                              const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
typedef void (*bn_unpack5_fn)(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2);

typedef struct {
    const char *name;
    /* Ternary W (N, K) tiles @ xq (T, Kp) -> y (T, ldy) for rows [n0, n1) (multiples of 16):
     * y[t, n] = (sum_k W[n, k] * xq[t, k]) * xinv[t] * row_scale[n] */
    void (*ternary_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                           const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
    /* The same product from the 1.6-bit tiles of W (Np/16, G5, 64), 5 codes a byte (bitnet_app/engine/packing.py;
     * G5 = bn_trit5_groups(kp)): the same y, bit for bit, as ternary_matmul on the 2-bit tiles of the same weights.
     * The bytes are the file's, or the window code where trit5_windows says so (below).
     * One token is decoded straight from the packed bytes; a batch unpacks each chunk of row tiles once into 2-bit
     * tiles and runs ternary_matmul on them (bn_ternary5_batch), or, on AVX2 and on AVX-512 with VBMI, has its first
     * block of tokens unpack as it multiplies (kernels_avx2.c, kernels_avx512.c). Needs kp <= BN_TRIT5_MAX_KP. */
    void (*ternary5_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                            const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
    /* n_tiles consecutive row tiles of 1.6-bit codes (G5 groups each) -> the 2-bit tiles of the same weights
     * (kp/16 groups each): the reference of the batch path, and its first step. */
    void (*unpack5)(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2);
    /* 1 when ternary5_matmul and unpack5 read 1.6-bit tiles in the window code (trit5_windows.c: AVX-512 with VBMI
     * and GFNI, and AMX on such a CPU), which the engine translates the file's bytes into as it loads them; 0 when
     * they read the file's bytes as they are. Set by dispatch.c. */
    int trit5_windows;
    /* Int8 head tiles (Np/16, Kp/4, 64) @ xq (T, Kp) -> y (T, ldy) for rows [n0, n1) (multiples of 16):
     * y[t, n] = (sum_k w8[n, k] * xq[t, k]) * xinv[t] * row_scale[n]; rowsum[n] = sum_k w8[n, k] */
    void (*int8_matmul)(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                        const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy);
    /* bf16 W (N, K) row-major @ x (T, K) float -> y (T, ldy) for rows [n0, n1) (any): the exact head */
    void (*bf16_matmul)(const uint16_t *w, int k, const float *x, int T, int n0, int n1, float *y, int ldy);
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float a, const float *x, float *y, int n); /* y += a * x */
    /* elementwise, per token row (n floats) */
    float (*sumsq)(const float *x, int n);                  /* sum x^2 */
    float (*absmax)(const float *x, int n);                 /* max |x| (0 for n = 0) */
    /* q = clamp(round_half_even(x * scale), -128, 127), zero padded to np; returns sum(q) */
    int32_t (*quantize)(const float *x, int n, int np, float scale, int8_t *q);
    void (*norm_apply)(const float *x, float inv, const float *w, float *out, int n); /* out = w * (x * inv) */
    void (*relu2_mul)(const float *g, const float *u, float *out, int n);            /* out = max(g,0)^2 * u */
    void (*add)(float *y, const float *x, int n);                                   /* y += x */
    /* the fp16 KV cache: IEEE half, round to nearest even */
    void (*to_f16)(const float *x, uint16_t *h, int n);
    float (*dot_f16)(const float *a, const uint16_t *h, int n);
    void (*axpy_f16)(float a, const uint16_t *h, float *y, int n); /* y += a * float(h) */

    /* Optional fused steps: NULL in a table means layer.c or kernels_fallback.c composes them from the entries above,
     * which is the reference. */
    /* One row: q (np bytes) = quant8(rmsnorm(x) * w) exactly as layer.c composes sumsq, norm_apply (into
     * xn, n floats of scratch), absmax and quantize; *xinv = 1 / scale; returns sum(q). */
    int32_t (*norm_quant)(const float *x, const float *w, int n, int np, float eps, float *xn, int8_t *q, float *xinv);
    /* Attention of a tile of nr consecutive query rows that share one K/V head. Row r (r < nr) has nq query
     * heads at q + r*ldq (nq*hd floats, contiguous) and sees keys s in [0, ends[r]) (ends non-decreasing,
     * ends[0] >= 1: causal rows differ, block rows share one end) at k + s*ld, values at v + s*ld (elements of
     * type kv, enum bn_kv: float32, fp16 bits, or int8 whose rows' scales are ks[s] and vs[s], else NULL).
     * Per (row, head): out (hd) = softmax(q . k_s * scale) @ v (int8: k_s = ks[s] * k8_s, v_s = vs[s] * v8_s),
     * only its columns [c0, c1) (0 <= c0 < c1 <= hd; c0 and c1 multiples of 8 unless they are 0 and hd), written to
     * out + r*ldo + h*hd + c, with exactly the numbers the same row would get alone (nr = 1) and with all hd
     * columns: a row's result never depends on the tile or the column range it is in. scratch:
     * BN_ATTN_SCRATCH(nr, nq, hd, largest end) floats, 64-byte aligned.
     * Returns 0 when it does not handle this shape (kernels_fallback.c's loop then runs), 1 when done. */
    int (*attend_rows)(const float *q, size_t ldq, int nr, int nq, int hd, const void *k, const void *v, size_t ld,
                       int kv, const float *ks, const float *vs, const int *ends, int c0, int c1, float scale,
                       float *scratch, float *out, size_t ldo);
    /* out = silu(g) * u = g / (1 + e^-g) * u (the Llama family's gated MLP); NULL: kernels_fallback.c's loop */
    void (*silu_mul)(const float *g, const float *u, float *out, int n);
    /* The greedy confidence of a logit row, in two passes over each run of it between banned ids (greedy.c):
     * max_first: the largest of x[0, n) (n >= 1) and *arg its first index (NaN logits: an entry in range);
     * expsum: sum_i exp(x_i - mx) with float32 exponentials summed in double (-inf entries add 0, or the SIMD
     * exponential's floor of ~1e-38). NULL: greedy.c's plain loops. */
    float (*max_first)(const float *x, int n, int *arg);
    double (*expsum)(const float *x, int n, float mx);
    /* w[i] = exp(z[i] - top) (n doubles, z[i] <= top) within ~1 ulp of libm's exp, for the sampler's weights;
     * returns their sum (in any order). NULL: sample.c's libm loop. */
    double (*exp_shifted)(const double *z, double top, double *w, int n);
    /* The sampler's first pass over a row: z[i] = x[i] * inv_t (double); returns the largest z (NaN entries
     * ignored; -inf if none) and counts the z that are -inf and those that are NaN or +inf. NULL: sample.c's loop. */
    double (*scale_row)(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad);
    /* The indices j (ascending) with w[j] >= t into out; returns how many. NULL: sample.c's loop. */
    int (*select_at_least)(const double *w, int n, double t, int *out);
} bn_kernels;

/* attend_rows works through the keys in tiles of BN_ATTN_KEY_TILE, each converted once to float32 for all the
 * tile's rows and heads; its scratch (64-byte aligned): the scores (nr * nq, n_keys rounded up to 16: rows on whole
 * cache lines), then one key tile (BN_ATTN_KEY_TILE, hd). */
#define BN_ATTN_KEY_TILE 64
#define BN_ATTN_SCRATCH(nr, nq, hd, n_keys) \
    ((size_t)(nr) * (nq) * (((size_t)(n_keys) + 15) / 16 * 16) + (size_t)BN_ATTN_KEY_TILE * (hd))

/* The decode kernels (one token: weight-bandwidth-bound) prefetch each 64-byte line twice: into L1 ~2 KB ahead and
 * into L2 this far ahead. A core that is latency-bound on memory (Intel's) then keeps more lines in flight. */
#define BN_FAR_PREFETCH_BYTES 8192

/* Bytes per element of a KV cache of type kv (enum bn_kv) */
static inline size_t bn_kv_elem_bytes(int kv) { return kv == BN_KV_F16 ? 2 : kv == BN_KV_I8 ? 1 : 4; }

/* 1.6-bit tiles (packing.py): G5 groups of 5 quads (20 columns, 64 bytes) per row tile, the last one possibly
 * partial. The decode kernels sum 256 times each dot product in int32 (kernels_avx512.c), exact while
 * 256 * 2 * 128 * kp < 2^31: kp at most BN_TRIT5_MAX_KP. */
#define BN_TRIT5_QUADS 5
#define BN_TRIT5_MAX_KP 32752
static inline int bn_trit5_groups(int kp) { return (kp / 4 + BN_TRIT5_QUADS - 1) / BN_TRIT5_QUADS; }
/* Digit d (0..4) of a 1.6-bit byte q as the file holds it: the code (0, 1, 2) of quad 5g + d (packing.py
 * decode_trits: c_d = 3 t_d >> 8, t_d = q 3^d mod 256) */
static inline int bn_trit5_file_digit(unsigned q, int d) {
    static const unsigned POW3[BN_TRIT5_QUADS] = {1, 3, 9, 27, 81};
    return (int)((3 * ((q * POW3[d]) & 255)) >> 8);
}
/* The unpacking of one 1.6-bit row tile (in, G5 groups) into 2-bit groups (out), as the SIMD files write it: quad m
 * goes from digit m % 5 of group m / 5 to field m % 4 of group m / 4, a pattern that repeats every 20 quads (4 groups
 * in, 5 out). RUN(in, out, nq) unpacks nq quads (a multiple of 4, at most 20) from the start of its arguments, with
 * nq a constant here so that it unrolls: runs of 20, then the rest (kp is a multiple of 16: whole output groups). */
#define BN_UNPACK5_RUNS(RUN, in, out, quads)                                                                     \
    do {                                                                                                         \
        const int runs_ = (quads) / 20;                                                                          \
        for (int r_ = 0; r_ < runs_; r_++) RUN((in) + (size_t)r_ * 4 * 64, (out) + (size_t)r_ * 5 * 64, 20);     \
        const uint8_t *in_ = (in) + (size_t)runs_ * 4 * 64;                                                      \
        uint8_t *out_ = (out) + (size_t)runs_ * 5 * 64;                                                          \
        switch ((quads) % 20) {                                                                                  \
            case 16: RUN(in_, out_, 16); break;                                                                  \
            case 12: RUN(in_, out_, 12); break;                                                                  \
            case 8: RUN(in_, out_, 8); break;                                                                    \
            case 4: RUN(in_, out_, 4); break;                                                                    \
            default: break;                                                                                      \
        }                                                                                                        \
    } while (0)
/* n_tiles consecutive 1.6-bit row tiles (tiles5, G5 groups each) -> their 2-bit tiles (tiles2, kp / 16 groups each),
 * each tile's 64-byte groups taken `width` bytes at a time (a register: 32 for AVX2, 64 for AVX-512), RUN as above
 * with in and out at that slice of the groups. */
#define BN_UNPACK5_TILES(RUN, tiles5, kp, n_tiles, tiles2, width)                                                \
    do {                                                                                                         \
        const size_t in_tile_ = (size_t)bn_trit5_groups(kp) * 64, out_tile_ = (size_t)(kp) / 16 * 64;           \
        for (int tile_ = 0; tile_ < (n_tiles); tile_++)                                                          \
            for (int lane_ = 0; lane_ < 64; lane_ += (width))                                                    \
                BN_UNPACK5_RUNS(RUN, (tiles5) + tile_ * in_tile_ + lane_, (tiles2) + tile_ * out_tile_ + lane_,  \
                                (kp) / 4);                                                                       \
    } while (0)
/* thread_buffer.c: this thread's buffer for `use` (one of BN_SCRATCH_*), at least `bytes` long, 64-byte aligned; its
 * contents are undefined at each call (it may have grown); NULL when out of memory. Freed when the thread ends. */
enum { BN_SCRATCH_TILES5, BN_SCRATCH_AMX, BN_SCRATCH_CODES, BN_SCRATCH_USES };
void *bn_thread_buffer(int use, size_t bytes);
/* tiles5.c: ternary5_matmul for a batch (T > 1) from a path's parts: each chunk of row tiles unpacked once (unpack5)
 * into this thread's buffer of 2-bit tiles and multiplied there (matmul2, the path's ternary_matmul); without memory
 * for the buffer, token by token through one_token (the path's ternary5_matmul, which decodes one token in place). */
void bn_ternary5_batch(bn_unpack5_fn unpack5, bn_ternary_fn matmul2, bn_ternary_fn one_token, const uint8_t *codes,
                       int kp, const float *row_scale, const int8_t *xq, const int32_t *xsum, const float *xinv,
                       int T, int n0, int n1, float *y, int ldy);

/* trit5_windows.c: the window code of 1.6-bit tiles. Its three tables (128 entries each): c0 * 3 + c1 by q & 127,
 * c2 * 3 + c3 by q >> 1, c4 by q without bit 2; digit d (0..4) of a window byte; and the file's bytes translated in
 * place into window bytes. */
extern const uint8_t bn_trit5_pairs_low[128], bn_trit5_pairs_high[128], bn_trit5_last[128];
int bn_trit5_window_digit(unsigned q, int d);
void bn_trit5_translate(uint8_t *bytes, size_t n);

extern const bn_kernels bn_kernels_portable;
#ifdef BN_HAVE_X86
extern const bn_kernels bn_kernels_avx2;
extern const bn_kernels bn_kernels_avx512;
/* kernels_avxvnni.c: the two matmuls of the AVX-VNNI path (its other entries are AVX2's; dispatch.c builds the
 * table), and the same code with vpdpbusd written in AVX2 (kernels_avxvnni_emulated.c, for tests) */
void bn_avxvnni_emulated_ternary_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                                        const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_avxvnni_emulated_ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                                         const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_avxvnni_emulated_int8_matmul(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                                     const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy);
/* kernels_avx512.c: whether its 1.6-bit kernels read the window code (this CPU has AVX512-VBMI and GFNI, and
 * BITNET_NO_VBMI is not set); decided once */
int bn_avx512_trit5_windows(void);
#ifndef BN_NO_AVXVNNI /* setup.py defines it when the compiler has no -mavxvnni */
void bn_avxvnni_ternary_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                               const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_avxvnni_ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                                const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_avxvnni_int8_matmul(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                            const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy);
#endif
/* kernels_amx.c: the two matmuls of the AMX path (tile multiplies for 8 tokens or more, the AVX512-VNNI kernels
 * below that; its other entries are AVX512's), and the same code with the tile instructions in plain C over the
 * AVX2 kernels (kernels_amx_emulated.c, for tests) */
void bn_amx_emulated_ternary_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                                    const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_amx_emulated_ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                                     const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_amx_emulated_int8_matmul(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                                 const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy);
#ifndef BN_NO_AMX /* setup.py defines it when the compiler has no -mamx-int8 */
void bn_amx_ternary_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                           const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_amx_ternary5_matmul(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                            const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy);
void bn_amx_int8_matmul(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                        const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy);
#endif
#endif

/* The best table for this CPU, or the one named by `force` (a name of dispatch.c's PATHS: "amx", "avx512",
 * "avxvnni", "avx2", "portable", or "avxvnni-emulated" / "amx-emulated": those kernels' code on AVX2, for tests).
 * Returns NULL if the forced path is unknown or not supported by the CPU. */
const bn_kernels *bn_select_kernels(const char *force);
/* The name of kernel path i (0, 1, ... in dispatch.c's order of preference), NULL past the last one. */
const char *bn_kernel_path_name(int i);

/* kernels_fallback.c: the plain C loops of the optional entries above (the reference; they run where a table has
 * NULL). attend_rows takes the table for its dot products and handles every shape. */
void bn_fallback_silu_mul(const float *g, const float *u, float *out, int n);
void bn_fallback_attend_rows(const bn_kernels *k, const float *q, size_t ldq, int nr, int nq, int hd, const void *kc,
                             const void *vc, size_t ld, int kv, const float *ks, const float *vs, const int *ends,
                             int c0, int c1, float scale, float *scratch, float *out, size_t ldo);
float bn_fallback_max_first(const float *x, int n, int *arg);
double bn_fallback_expsum(const float *x, int n, float mx);
double bn_fallback_exp_shifted(const double *z, double top, double *w, int n);
double bn_fallback_scale_row(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad);
int bn_fallback_select_at_least(const double *w, int n, double t, int *out);

/* greedy.c: per row of x (R, V), the argmax id and its softmax probability (the diffusion step's confidence) with
 * the n_banned ids `banned` (ascending, distinct, in [0, V)) left out, as if they were -inf; through the table's
 * max_first and expsum when it has them. */
void bn_greedy_rows(const bn_kernels *k, const float *x, int R, int V, const int32_t *banned, int n_banned,
                    int64_t *ids, double *probs);

/* sample.c: per row of x (R, V), one draw after temperature (> 0), top-k (0: off) and top-p (1: off) with the
 * uniform u[r] in [0, 1), the n_banned ids `banned` (in [0, V)) taken as -inf: the id and its probability under the
 * final distribution (decode/sampling.py Sampler._draw is the reference), the row's passes through the table's
 * entries where it has them. x is left alone. Returns -1 when out of memory (nothing written), else 0. */
int bn_sample_rows(const bn_kernels *k, const float *x, int R, int V, double temperature, int top_k, double top_p,
                   const double *u, const int32_t *banned, int n_banned, int64_t *ids, double *probs);

#endif
