/* The layer maths (layer.c): what each step of a forward computes for one token, one tile of tokens and a KV head,
 * or a range of a matrix's rows, on the engine's buffers (engine_state.h). Nothing here knows about threads: the
 * serial forward (forward.c) calls these steps in the order of the maths, the scheduler (schedule.c) hands them out
 * to the engine's threads. Shape letters: bitnet.h.
 */
#ifndef BITNET_LAYER_H
#define BITNET_LAYER_H

#include "engine_state.h"

/* The steps of one layer, in the order the maths runs; the unit each works on is given in brackets. */
typedef enum {
    STAGE_ATTN_NORM, /* [token] x += proj (the previous layer's down_proj); xq = quant8(rmsnorm(x) * attn_norm) */
    STAGE_QKV,       /* [row tiles] qkv = ternary(qkv) @ xq */
    STAGE_ROPE_KV,   /* [token] RoPE on its q and k heads; its k, v -> the cache at its position */
    STAGE_ATTENTION, /* [tokens, kv head] att = attention of the group's query heads over the visible keys */
    STAGE_ATTN_SUB,  /* [token] xq = quant8(rmsnorm(att) * attn_sub_norm) */
    STAGE_O,         /* [row tiles] proj = ternary(o) @ xq */
    STAGE_FFN_NORM,  /* [token] x += proj; xq = quant8(rmsnorm(x) * ffn_norm) */
    STAGE_GATE_UP,   /* [row tiles] gu = ternary(gate_up) @ xq */
    STAGE_FFN_SUB,   /* [token] gate := act(gate) * up; xq = quant8(rmsnorm(gate) * ffn_sub_norm) or quant8(gate) */
    STAGE_DOWN,      /* [row tiles] proj = ternary(down) @ xq */
    STAGES_PER_LAYER
} layer_stage;

/* After the last layer. */
typedef enum {
    STAGE_HEAD_NORM, /* [logit row] x[row] + proj[row] -> final norm (and quant8 for the int8 head) */
    STAGE_HEAD,      /* [row tiles, or vocabulary rows for the exact head] logits = head @ normed rows */
    HEAD_STAGES
} head_stage;

/* A matrix step: y (T, ldy) = W @ the quantized rows (xq, at stride kp) or, for the exact head, @ the normed rows
 * (xn, at stride D). Its units are row tiles of 16 (ternary, int8 head) or single rows (exact head). */
typedef enum { MAT_TERNARY, MAT_INT8_HEAD, MAT_EXACT_HEAD } matrix_kind;
typedef struct {
    matrix_kind kind;
    const bn_ternary *w; /* MAT_TERNARY: the matrix */
    float *y;
    int ldy, kp;         /* output row stride; padded K of the quantized input rows */
    int units;           /* row tiles (or rows) of W */
} bn_matrix;

/* Step s's matrix in layer l (s one of STAGE_QKV, STAGE_O, STAGE_GATE_UP, STAGE_DOWN), and the head's. */
bn_matrix bn_layer_matrix(const bn_engine *e, int l, layer_stage s);
bn_matrix bn_head_matrix(const bn_engine *e);

/* x (T, D) = the embedding rows of tokens */
void bn_embed(bn_engine *e, const int32_t *tokens, int T);

/* Token step s (STAGE_ATTN_NORM, ROPE_KV, ATTN_SUB, FFN_NORM, FFN_SUB) of layer l for token t. xq_run: the tokens per
 * run of the xq rows it writes (0: one run; see xq_row in layer.c). */
void bn_token_step(bn_engine *e, int l, layer_stage s, int t, int xq_run);

/* The attention of tokens [t0, t0 + nr) (nr <= ATTN_MAX_ROWS) for KV head g: every query head of the group that
 * shares it, the value columns [c0, c1) of each head's output (0 and hd: all of them). scratch: BN_ATTN_SCRATCH for
 * ATTN_MAX_ROWS rows (bn_engine.scores_ld floats, 64-byte aligned). */
void bn_attention_tile(bn_engine *e, int l, int t0, int nr, int g, int c0, int c1, float *scratch);

/* y rows [t0, t0 + rows) of the matrix step mx, its units [u0, u1); xq_run as bn_token_step. */
void bn_matrix_rows(bn_engine *e, const bn_matrix *mx, int t0, int rows, int u0, int u1, int xq_run);

/* Logit row r: x[rows[r]] + proj (the last down_proj) -> final norm: into xq (int8 head) or xn (exact head). */
void bn_head_norm_row(bn_engine *e, int r);

#endif
