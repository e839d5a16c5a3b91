"""The logical sizes of a model, from its normalized config (checkpoint/config.py writes it, validate.py checks it).

    projection_shapes(cfg)        -> {"self_attn.q_proj": (N out, K in), ...}: the seven ternary projections of a layer
    ternary_weight_count(cfg)     -> ternary weights of the whole model
    parameter_count(cfg, vocab)   -> logical parameters (a tied head counted once)
"""


def projection_shapes(cfg: dict) -> dict:
    """Logical [out N, in K] of the seven ternary projections of one layer (cfg: the normalized config)."""
    D, I, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return {"self_attn.q_proj": (q, D), "self_attn.k_proj": (kv, D), "self_attn.v_proj": (kv, D),
            "self_attn.o_proj": (D, q), "mlp.gate_proj": (I, D),
            "mlp.up_proj": (I, D), "mlp.down_proj": (D, I)}


def ternary_weight_count(cfg: dict) -> int:
    """Ternary weights of the whole model (cfg: the normalized config): every layer's seven projections."""
    return cfg["num_hidden_layers"] * sum(n * k for n, k in projection_shapes(cfg).values())


def parameter_count(cfg: dict, vocab_size: int) -> int:
    """Logical parameters of the checkpoint (a tied head counted once): the ternary projections, the norms
    (two or four per layer, and the final one) and the embedding (and an untied lm_head)."""
    d, i, layers = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    norms = layers * (2 * d + (d + i if cfg.get("sub_norms", True) else 0)) + d
    heads = 1 if cfg.get("tie_word_embeddings", True) else 2
    return ternary_weight_count(cfg) + norms + heads * vocab_size * d
