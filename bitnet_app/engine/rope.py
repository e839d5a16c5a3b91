"""RoPE frequencies of a model config: plain (1 / theta^(2i/hd)) or with Llama 3.1's "llama3" rope scaling.

    rope_inv_freq(cfg) -> None (plain RoPE: the C engine computes the table from rope_theta, as it always
                          has) or float32 (hd/2,) inverse frequencies for a config with rope_scaling
    rope_inv_freq(cfg, plain=True) -> float32 (hd/2,) either way (the numpy reference)

cfg: the normalized config (checkpoint/config.py): head_dim, rope_theta, and rope_scaling = None or
{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}.
The llama3 rule (transformers modeling_rope_utils._compute_llama3_parameters), in float32 like torch:
    wavelen = 2 pi / inv_freq
    wavelen < orig / high_freq_factor : unchanged (high frequencies)
    wavelen > orig / low_freq_factor  : inv_freq / factor (low frequencies)
    otherwise                         : (1 - s) inv_freq / factor + s inv_freq,
                                        s = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
The cos/sin attention factor of this rule is 1, so only the frequencies change.
"""
import math

import numpy as np

# the llama3 rule's parameters: every one a finite positive number (checked by engine/validate.py and, with
# messages about config.json, by checkpoint/config.py)
ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def plain_inv_freq(theta: float, hd: int) -> np.ndarray:
    """1 / theta^(2i/hd), i < hd/2, float32 (the C engine's own formula: the exponent in fp32, pow in double)."""
    expo = (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)).astype(np.float64)
    return (1.0 / np.power(np.float64(theta), expo).astype(np.float32)).astype(np.float32)


def rope_inv_freq(cfg: dict, plain: bool = False):
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return plain_inv_freq(cfg["rope_theta"], cfg["head_dim"]) if plain else None
    if scaling.get("rope_type") != "llama3":
        raise ValueError(f"rope_scaling {scaling!r} is not supported (only llama3); convert the checkpoint again")
    f32 = np.float32
    hd = cfg["head_dim"]
    inv = (f32(1.0) / np.power(f32(cfg["rope_theta"]), np.arange(0, hd, 2, dtype=f32) / f32(hd))).astype(f32)
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    orig = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = orig / low, orig / high
    wavelen = (f32(2 * math.pi) / inv).astype(f32)
    scaled = np.where(wavelen > low_wavelen, inv / f32(factor), inv).astype(f32)
    smooth = ((f32(orig) / wavelen - f32(low)) / f32(high - low)).astype(f32)
    smoothed = ((f32(1) - smooth) * scaled / f32(factor) + smooth * scaled).astype(f32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.ascontiguousarray(np.where(medium, smoothed, scaled).astype(f32))
