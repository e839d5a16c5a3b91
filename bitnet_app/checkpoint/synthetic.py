"""A random engine file of a named shape, written directly (no checkpoint, no packing of big matrices).

    write_synthetic_engine_file(out_path, shape="2b4t", seed=0, layout=None) -> out_path

For benchmarks (`python -m bitnet_app bench --synthetic 2b4t`) and tests. The shapes (checkpoint/presets.py): the
real 2B-4T shape (30 layers, 2560/6912, 20/5 heads, vocab 128256), the Llama-family shapes falcon3-1b, falcon3-3b,
falcon3-7b, falcon3-10b, llama3-8b, 1bitLLM's bitnet-3b, and the tiny test shapes. The rest follows the shape's
family (checkpoint/families.py), as the real models do: its activation, its sub-norms (or none), a tied or an
untied head, and its weight-scale rule. Ternary tiles are random bytes whose four 2-bit fields are each in
{0, 1, 2}; per-row multipliers are about 1.5 (2B-4T's weight_scale, which multiplies) or about mean|W| = 0.02
(1 / weight_scale, for a family whose weight_scale divides); norms are around 1; the embedding (and an untied
lm_head) is random bf16 and the int8 head is its real per-row quantization (so the exact and the int8 heads
agree). The tokenizer is a real but tiny byte-level one (256 byte tokens, no merges) with the special tokens at
the shape's real ids, so the model layer can load the file and encode/decode text. The tiles are in either layout
(packing.PACKINGS; by default the one the converter writes on this CPU).
"""
import json

import numpy as np

from ..engine import packing
from ..engine.file import PLAIN_ATTENTION, TRAINED_BLOCK_SIZE, write_engine_file
from ..text.chat import BITNET_CHAT_TEMPLATE   # microsoft/bitnet-b1.58-2B-4T's (its tokenizer_config.json)
from .convert import CONVERTER_VERSION, build_int8_head
from .families import FAMILIES
from .presets import SHAPES

# 81 = 3^4 byte values whose four 2-bit fields are all in {0, 1, 2}; a random byte b maps to entry b % 81
# (a slight bias towards the first 13 entries is irrelevant for a benchmark and much faster than integers(0, 81))
_TERNARY_BYTES = np.array([a | b << 2 | c << 4 | d << 6 for a in range(3) for b in range(3)
                           for c in range(3) for d in range(3)], dtype=np.uint8)
_BYTE_TO_TERNARY = _TERNARY_BYTES[np.arange(256) % 81]


def random_ternary_tiles(rng, n: int, k: int) -> np.ndarray:
    """Random tile-packed ternary matrix uint8 (n/16, k/16, 64); n, k multiples of 16."""
    raw = rng.integers(0, 256, size=n * k // 4, dtype=np.uint8)
    return _BYTE_TO_TERNARY[raw].reshape(n // 16, k // 16, 64)


# the 243 bytes of the 1.6-bit layout (5 codes each); a random byte b maps to entry b % 243
_TRIT_BYTES = packing.encode_trits(np.array(np.meshgrid(*[range(3)] * 5, indexing="ij")).reshape(5, -1).T)
_BYTE_TO_TRITS = _TRIT_BYTES[np.arange(256) % 243]


def random_ternary5_tiles(rng, n: int, k: int) -> np.ndarray:
    """Random 1.6-bit tiles uint8 (n/16, G5, 64) (packing.py); n, k multiples of 16. The last group's digits past
    k hold code 1 (weight 0), as the converter writes them."""
    g5 = packing.trit5_groups(k)
    tiles = _BYTE_TO_TRITS[rng.integers(0, 256, size=n // 16 * g5 * 64, dtype=np.uint8)].reshape(n // 16, g5, 64)
    rest = (k // 4) % packing.TRITS
    if rest:
        digits = packing.decode_trits(tiles[:, -1])
        digits[..., rest:] = 1
        tiles[:, -1] = packing.encode_trits(digits)
    return tiles


def random_tiles(rng, n: int, k: int, layout: str) -> np.ndarray:
    """Random ternary tiles of an (n, k) matrix in the layout `layout` (packing.PACKINGS)."""
    return random_ternary_tiles(rng, n, k) if layout == packing.PACKING_2BIT else random_ternary5_tiles(rng, n, k)


def random_bf16(rng, rows: int, cols: int, std: float) -> np.ndarray:
    """bf16 bits uint16 (rows, cols) of roughly N(0, std^2) values: random 16-bit indices into a table of
    65536 normal quantiles (rounded to bf16), which is several times faster than drawing normals."""
    u = (np.arange(65536, dtype=np.float64) + 0.5) / 65536
    table = packing.f32_to_bf16((std * _normal_quantile(u)).astype(np.float32))
    idx = rng.integers(0, 65536, size=rows * cols, dtype=np.uint16)
    return table[idx].reshape(rows, cols)


def _normal_quantile(u: np.ndarray) -> np.ndarray:
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
    u = np.asarray(u, dtype=np.float64)
    out = np.empty_like(u)
    lo, hi = u < 0.02425, u > 1 - 0.02425
    mid = ~(lo | hi)
    q = u[mid] - 0.5
    r = q * q
    out[mid] = ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
                (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1))
    for mask, sign in ((lo, 1.0), (hi, -1.0)):
        qq = np.sqrt(-2 * np.log(np.where(sign > 0, u[mask], 1 - u[mask])))
        out[mask] = sign * ((((((c[0] * qq + c[1]) * qq + c[2]) * qq + c[3]) * qq + c[4]) * qq + c[5]) /
                            ((((d[0] * qq + d[1]) * qq + d[2]) * qq + d[3]) * qq + 1))
    return out


def tiny_tokenizer_json(bos: int, eos: int, eot: int) -> str:
    """Byte-level BPE with no merges: the 256 byte symbols, plus the specials at the given ids (the bytes take
    ids 0..255, or 256 ids above the specials when those lie below 256, as Falcon3's eos 11 does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    specials = {}  # one name per id (Falcon3: bos = eos = eot = 11)
    for name, i in (("<|end_of_text|>", eos), ("<|begin_of_text|>", bos), ("<|eot_id|>", eot)):
        if i not in specials.values():
            specials[name] = i
    first = 0 if min(specials.values()) >= 256 else max(specials.values()) + 1
    vocab = {c: first + i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    if "<|begin_of_text|>" in specials:
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos)])
    return tok.to_str()


def write_synthetic_engine_file(out_path: str, shape: str | dict = "2b4t", seed: int = 0,
                                layout: str | None = None) -> str:
    """shape: a name of SHAPES, or a dict of the same keys (presets._shape makes one); layout: the ternary tiles'
    packing (packing.PACKINGS); None: what the converter writes on this CPU."""
    if isinstance(shape, dict):
        s = shape
    elif shape in SHAPES:
        s = SHAPES[shape]
    else:
        raise ValueError(f"unknown synthetic shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if layout is None:
        from ..engine.kernel_paths import preferred_packing
        layout = preferred_packing()
    fam = FAMILIES[s["family"]]
    scale_mode = "divide" if fam.packed_scale == "divide" else "multiply"   # 2B-4T's scales multiply
    tensors = _random_tensors(s, fam, scale_mode, layout, np.random.default_rng(seed))
    meta = _metadata(s, fam, scale_mode, layout, shape, seed)
    write_engine_file(out_path, meta, tensors)
    return out_path


def _random_tensors(s: dict, fam, scale_mode: str, layout: str, rng) -> dict:
    """The engine file's tensors for shape s: bf16 embedding (and untied head), norms near 1, random ternary tiles
    with one multiplier per projection, the int8 head."""
    D, I, L, V = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    assert all(x % 16 == 0 for x in (D, I, q, kv)), "synthetic shapes must be tile aligned"

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    lo, hi = (1.2, 1.8) if scale_mode == "multiply" else (0.015, 0.03)   # weight_scale, or 1 / weight_scale

    def scales(*rows):  # one multiplier per projection, repeated over its rows
        return np.concatenate([np.full(r, rng.uniform(lo, hi), dtype=np.float32) for r in rows])

    tensors = {"embed": random_bf16(rng, V, D, std=0.5), "norm": norm(D)}
    if not fam.tied_head:
        tensors["lm_head"] = random_bf16(rng, V, D, std=0.02)
    for i in range(L):
        o = f"layers.{i}."
        tensors.update({o + "attn_norm": norm(D), o + "ffn_norm": norm(D)})
        if fam.sub_norms is not None:
            tensors.update({o + "attn_sub_norm": norm(D), o + "ffn_sub_norm": norm(I)})
        for name, rows, k in (("qkv", (q, kv, kv), D), ("o", (D,), q), ("gate_up", (I, I), D), ("down", (D,), I)):
            tensors[o + name + ".codes"] = random_tiles(rng, sum(rows), k, layout)
            tensors[o + name + ".scale"] = scales(*rows)
    tensors.update(build_int8_head(tensors.get("lm_head", tensors["embed"])))
    return tensors


def _metadata(s: dict, fam, scale_mode: str, layout: str, shape, seed: int) -> dict:
    """The engine file's metadata for shape s: the config, a tiny tokenizer, the 2B-4T chat template, where it
    came from."""
    config = {k: s[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")}
    config.update(rope_theta=s["rope_theta"], rms_norm_eps=1e-5, bos_token_id=s["bos"],
                  eos_token_id=s["eos"], hidden_act=fam.activation, sub_norms=fam.sub_norms is not None,
                  tie_word_embeddings=fam.tied_head, rope_scaling=None)
    return {
        "config": config,
        "ternary_packing": layout,
        "tokenizer_json": tiny_tokenizer_json(s["bos"], s["eos"], s["eot"]),
        "tokenizer_config": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                             "chat_template": BITNET_CHAT_TEMPLATE},
        "generation_config": {"bos_token_id": s["bos"], "eos_token_id": [s["eos"], s["eot"]]},
        "chat_template": BITNET_CHAT_TEMPLATE,
        "stop_ids": sorted({s["eos"], s["eot"]}),
        "bos_id": s["bos"],
        "mask_id": None,
        "diffusion": {"block_size": TRAINED_BLOCK_SIZE, "attention": PLAIN_ATTENTION, "trained": False},
        "source": {"path": None, "layout": "synthetic", "shape": shape, "seed": seed, "linear_class": None,
                   "family": fam.name, "scale_mode": scale_mode,
                   "scale_mode_inferred": False, "embed_dtype": "BF16",
                   "converter_version": CONVERTER_VERSION},
    }


if __name__ == "__main__":  # python -m bitnet_app.checkpoint.synthetic OUT [shape]
    import sys
    import time
    t0 = time.time()
    write_synthetic_engine_file(sys.argv[1], *(sys.argv[2:3] or ["2b4t"]))
    print(json.dumps({"path": sys.argv[1], "seconds": round(time.time() - t0, 1)}))
