/* BitNet b1.58 engine: model description, KV-cache state and the one forward call.
 *
 * Shape letters used in every file of _kernels/:
 *   D  hidden size            I  intermediate (FFN) size     L  layers
 *   H  query heads            G  key/value heads              hd head dimension (H*hd == D)
 *   V  vocabulary rows        T  tokens in one forward batch  C  context length (KV-cache positions)
 *   Xp a size rounded up to a multiple of 16 (tile padding, see bitnet_app/packing.py)
 *
 * Weights live in the caller's memory (an mmap of the engine file); the engine never copies them.
 */
#ifndef BITNET_H
#define BITNET_H

#include <stdint.h>
#include <stddef.h>

/* The two layouts of ternary tiles (bitnet_app/engine/packing.py) */
enum bn_packing { BN_PACK_2BIT = 0, BN_PACK_TRIT5 = 1 }; /* 4 codes a byte; 5 codes a byte (1.6 bits a weight) */

/* A ternary linear layer W (N, K): uint8 tiles, (Np/16, Kp/16, 64) in 2 bits or (Np/16, ceil(Kp/20), 64) in
 * 1.6 bits, and one float multiplier per row. */
typedef struct {
    const uint8_t *codes;
    const float *scale;   /* (Np,) weight_scale (multiply) or 1/weight_scale (divide), per row */
    int n, k;             /* logical shape */
    int packing;          /* enum bn_packing */
} bn_ternary;

typedef struct {
    const float *attn_norm;     /* (D,) */
    const float *attn_sub_norm; /* (D,), or NULL: no sub-norm before o_proj (Llama-family checkpoints) */
    const float *ffn_norm;      /* (D,) */
    const float *ffn_sub_norm;  /* (I,), or NULL: no sub-norm before down_proj */
    bn_ternary qkv;             /* (H*hd + 2*G*hd, D) rows [q | k | v] */
    bn_ternary o;               /* (D, D) */
    bn_ternary gate_up;         /* (2I, D) rows [gate | up] */
    bn_ternary down;            /* (D, I) */
} bn_layer;

/* The gated MLP's activation: p = act(gate) * up */
enum bn_act { BN_ACT_RELU2 = 0, BN_ACT_SILU = 1 }; /* relu(g)^2 (BitNet 2B-4T), g * sigmoid(g) (Llama family) */

typedef struct {
    int dim, hidden, n_layers, n_heads, n_kv_heads, head_dim, vocab, ctx;
    int act;                    /* enum bn_act */
    float rope_theta, eps;
    const float *rope_inv_freq; /* (hd/2,) RoPE frequencies (e.g. llama3 rope scaling), or NULL: 1/theta^(2i/hd) */
    const uint16_t *embed;      /* (V, D) bfloat16 bits: the embedding */
    const uint16_t *head_bf16;  /* (V, D) bfloat16 bits: the exact lm_head (== embed when tied) */
    const float *norm;          /* (D,) final norm */
    const int8_t *head_i8;      /* (Vp/16, Dp/4, 64) int8 tiles: the default lm_head */
    const float *head_scale;    /* (Vp,) per-row scale of head_i8 */
    const int32_t *head_rowsum; /* (Vp,) sum of each int8 row (for the u8 activation offset) */
    bn_layer *layers;           /* (L,) */
} bn_model;

typedef struct bn_engine bn_engine;

/* The KV cache's element type. int8: each (layer, KV head, position) row of hd values has its own scale (absmax /
 * 127, round half to even): 1 byte a value + 4 bytes a row, about half fp16's bytes. */
enum bn_kv { BN_KV_F32 = 0, BN_KV_F16 = 1, BN_KV_I8 = 2 };
#define BN_MAX_HEAD_DIM 1024 /* the engine's limit on head_dim (real models: 64 to 256) */

/* exact_head: 1 = bf16 head (head_bf16), 0 = int8 head. kv: the KV cache's element type (enum bn_kv).
 * n_threads: 1 to 256, the calling thread included (more is an error, not a crash).
 * isa: NULL/"" = best the CPU has; a path's name ("avx512", "avx2", "portable": dispatch.c PATHS) forces it.
 * Returns NULL and writes a message into err (errlen bytes) on failure. */
bn_engine *bn_engine_create(const bn_model *m, int exact_head, int kv, int n_threads, const char *isa, int ctx,
                            char *err, int errlen);
void bn_engine_free(bn_engine *e);
const char *bn_engine_isa(const bn_engine *e);
int bn_engine_threads(const bn_engine *e);

/* One forward of T tokens placed at positions start..start+T-1. Their K/V are written to the cache at
 * those positions; attention reads keys [0, kv_end) (causal: k <= q; block: k/B <= q/B).
 * Logits of the batch rows listed in rows[0..n_rows) go to logits (n_rows, V).
 * attention: 0 causal, 1 block (block_size B). Returns 0, or -1 with a message in err. */
int bn_forward(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention,
               int block_size, const int32_t *rows, int n_rows, float *logits, char *err, int errlen);
/* The same forward computed by the plain serial forward (forward.c) on the calling thread, every step on the whole
 * batch: the scheduler's oracle, for the tests (its logits equal bn_forward's bit for bit). */
int bn_forward_serial_oracle(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention,
                             int block_size, const int32_t *rows, int n_rows, float *logits, char *err, int errlen);
/* 1 when every one of x[0, n) is finite (no NaN, no infinity): the check of a forward's logits, one pass of integer
 * tests on the exponent bits (cheaper than numpy's isfinite(...).all() on a diffusion step's rows). */
int bn_all_finite(const float *x, size_t n);

/* The sampler's rows on the engine's threads (rows_job.c): bn_greedy_rows and bn_sample_rows (kernels.h) with this
 * engine's kernel path, the rows shared between the calling thread and the engine's workers. Each row is computed
 * exactly as those single-threaded calls compute it, so the results do not depend on the thread count. Not to be
 * called during a forward on the same engine. Return 0, or -1 when out of memory. */
int bn_engine_greedy_rows(bn_engine *e, const float *x, int R, int V, const int32_t *banned, int n_banned,
                          int64_t *ids, double *probs);
int bn_engine_sample_rows(bn_engine *e, const float *x, int R, int V, double temperature, int top_k, double top_p,
                          const double *u, const int32_t *banned, int n_banned, int64_t *ids, double *probs);

/* Development timing, off by default (one branch per stage when off). While on, every forward adds the
 * calling thread's wall time per part: the items it ran of each stage (the residual add of the previous
 * matrix is part of the next norm); BN_PART_SYNC is its time waiting for the other threads to finish a
 * stage, and opening and closing the forward's job; BN_PART_TOTAL is the whole bn_forward call. */
enum bn_part {
    BN_PART_EMBED, BN_PART_ATTN_NORM, BN_PART_QKV, BN_PART_ROPE_KV, BN_PART_ATTENTION, BN_PART_SUB_NORM_ATTN,
    BN_PART_O, BN_PART_FFN_NORM, BN_PART_GATE_UP, BN_PART_SUB_NORM_FFN, BN_PART_DOWN, BN_PART_HEAD_NORM,
    BN_PART_HEAD, BN_PART_OUTPUT, BN_PART_SYNC, BN_PART_TOTAL, BN_PART_COUNT
};
void bn_engine_set_profile(bn_engine *e, int on); /* on or off; zeroes the totals */
const double *bn_engine_profile(const bn_engine *e); /* BN_PART_COUNT totals in seconds */
const char *bn_part_name(int part);                  /* NULL outside [0, BN_PART_COUNT) */

/* The read roof (roof.c): GB/s that n_threads reach reading a `bytes` buffer, best of `passes`; -1 on failure. */
double bn_read_roof_gb_s(int n_threads, size_t bytes, int passes);

#endif
