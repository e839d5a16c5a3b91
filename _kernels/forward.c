/* One forward of the BitNet b1.58 model, top to bottom, on one thread: the order the maths runs, read beside
 * bitnet_app/engine/reference.py. It is the scheduler's oracle: schedule.c runs the same steps (layer.c) on the
 * engine's threads, and tests/test_forward_serial.py checks that both give the same logits, bit for bit.
 *
 * One layer (reference: transformers BitNetDecoderLayer, and LlamaDecoderLayer with BitLinear for the Llama
 * family, fp32), shapes per batch of T tokens:
 *   a = rmsnorm(x) * attn_norm                                          x, a (T, D)
 *   q|k|v = ternary(qkv) @ quant8(a); RoPE (half split) on q and k      qkv (T, H*hd + 2*G*hd)
 *   k, v -> KV cache at positions start .. start+T-1                    cache (L, G, C, hd): fp32, fp16 or int8
 *   o = softmax(q k^T / sqrt(hd)) v over cache keys [0, kv_end) visible to each query (causal or block mask)
 *                                                                       att (T, D)
 *   x += ternary(o_proj) @ quant8(rmsnorm(o) * attn_sub_norm)            proj (T, D)
 *   g|u = ternary(gate_up) @ quant8(rmsnorm(x) * ffn_norm)               gu (T, 2I)
 *   x += ternary(down) @ quant8(rmsnorm(act(g) * u) * ffn_sub_norm)      act: relu(g)^2 or silu(g) = g*sigmoid(g)
 * The sub-norms are optional (NULL in bn_layer: the Llama family has none): then quant8(o), quant8(act(g) * u).
 * Each residual add runs in the step after its matrix (the next norm adds proj to x).
 * Final: logits[rows] = head(rmsnorm(x[rows]) * norm), head = int8 tiles (default) or the bf16 head (exact:
 * the embedding when tied, lm_head when not).
 */
#include "layer.h"

/* y (T rows) = the matrix step mx over all its rows */
static void matrix(bn_engine *e, bn_matrix mx, int T) { bn_matrix_rows(e, &mx, 0, T, 0, mx.units, 0); }

void bn_forward_serial(bn_engine *e, const int32_t *tokens) {
    const int T = e->fa.T, R = e->fa.n_rows, G = e->m.n_kv_heads, hd = e->m.head_dim;
    bn_embed(e, tokens, T);                                                         /* x (T, D) */
    for (int l = 0; l < e->m.n_layers; l++) {
        for (int t = 0; t < T; t++) bn_token_step(e, l, STAGE_ATTN_NORM, t, 0);    /* x += proj; xq (T, Dp) */
        matrix(e, bn_layer_matrix(e, l, STAGE_QKV), T);                             /* qkv (T, qkv_np) */
        for (int t = 0; t < T; t++) bn_token_step(e, l, STAGE_ROPE_KV, t, 0);      /* q, k rotated; k, v cached */
        for (int t0 = 0; t0 < T; t0 += ATTN_MAX_ROWS)                               /* att (T, D) */
            for (int g = 0; g < G; g++)
                bn_attention_tile(e, l, t0, T - t0 < ATTN_MAX_ROWS ? T - t0 : ATTN_MAX_ROWS, g, 0, hd, e->scores);
        for (int t = 0; t < T; t++) bn_token_step(e, l, STAGE_ATTN_SUB, t, 0);     /* xq (T, Dp) */
        matrix(e, bn_layer_matrix(e, l, STAGE_O), T);                               /* proj (T, Dp) */
        for (int t = 0; t < T; t++) bn_token_step(e, l, STAGE_FFN_NORM, t, 0);     /* x += proj; xq (T, Dp) */
        matrix(e, bn_layer_matrix(e, l, STAGE_GATE_UP), T);                         /* gu (T, 2Ip) */
        for (int t = 0; t < T; t++) bn_token_step(e, l, STAGE_FFN_SUB, t, 0);      /* act(g) * u; xq (T, Ip) */
        matrix(e, bn_layer_matrix(e, l, STAGE_DOWN), T);                            /* proj (T, Dp) */
    }
    for (int r = 0; r < R; r++) bn_head_norm_row(e, r);                             /* x[rows] + proj, normed */
    if (R > 0) matrix(e, bn_head_matrix(e), R);                                     /* logits (R, Vp) */
}
