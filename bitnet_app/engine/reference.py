"""A plain numpy forward of an engine file: no cache, an explicit attention mask, full recompute.

It shares only the file reader and packing.unpack_* with the engine (both tested on their own), so it
is an independent check of the C forward, and the slow reference the diffusion tests decode with.
Shapes: T tokens at positions 0..T-1, D hidden, hd head dim, mask (T, T) bool, True = may attend.
"""
import numpy as np

from .packing import bf16_to_f32, unpack_int8_tiles, unpack_tiles
from .rope import rope_inv_freq


def causal_mask(T: int) -> np.ndarray:
    return np.tril(np.ones((T, T), dtype=bool))


def block_mask(T: int, block: int) -> np.ndarray:
    """Query q sees key k iff k // block <= q // block (positions counted from 0)."""
    pos = np.arange(T)
    return (pos[None, :] // block) <= (pos[:, None] // block)


class NumpyModel:
    def __init__(self, ef):
        c = ef.config
        self.D, self.I, self.L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        self.H, self.G, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.V, self.theta, self.eps = c["vocab_size"], c["rope_theta"], np.float32(c["rms_norm_eps"])
        self.inv_freq = rope_inv_freq(c, plain=True)
        self.act = c["hidden_act"]
        t = ef.tensors
        self.embed = bf16_to_f32(t["embed"])
        self.head = bf16_to_f32(t["lm_head"]) if "lm_head" in t else self.embed
        self.norm = np.asarray(t["norm"])
        self.layers = []
        kvd = self.G * self.hd
        shapes = {"qkv": (self.D + 2 * kvd, self.D), "o": (self.D, self.D), "gate_up": (2 * self.I, self.D),
                  "down": (self.D, self.I)}
        for l in range(self.L):
            p = f"layers.{l}."
            lay = {k: np.asarray(t[p + k]) if p + k in t else None   # sub-norms: None when the model has none
                   for k in ("attn_norm", "attn_sub_norm", "ffn_norm", "ffn_sub_norm")}
            for name, (n, k) in shapes.items():
                lay[name] = (unpack_tiles(t[p + name + ".codes"], n, k, ef.packing).astype(np.float32),
                             np.asarray(t[p + name + ".scale"])[:n])
            self.layers.append(lay)
        V, D = self.V, self.D
        self.head_i8 = unpack_int8_tiles(t["head.i8"], V, D).astype(np.float32)
        self.head_scale = np.asarray(t["head.scale"])[:V]

    # ---- blocks (fp32 like the reference run in fp32)
    def rmsnorm(self, x, w):
        if w is None:  # a layer without this sub-norm
            return x
        var = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True).astype(np.float32)
        return w * (x * (np.float32(1.0) / np.sqrt(var + self.eps)))

    @staticmethod
    def quant(x):
        """(T, K) -> int values as float (T, K), 1/scale (T, 1): round half to even like torch."""
        m = np.maximum(np.abs(x).max(axis=-1, keepdims=True), np.float32(1e-5))
        scale = np.float32(127.0) / m
        q = np.clip(np.rint(x * scale), -128, 127)
        return q, np.float32(1.0) / scale

    def linear(self, x, wpair):
        w, mult = wpair
        q, inv = self.quant(x)
        return (q.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32) * inv * mult

    def rope_tables(self, T):
        inv = self.inv_freq
        ang = np.arange(T, dtype=np.float32)[:, None] * inv[None, :]
        return np.cos(ang.astype(np.float64)).astype(np.float32), np.sin(ang.astype(np.float64)).astype(np.float32)

    @staticmethod
    def rope(x, cos, sin):
        """x (T, heads, hd), half-split pairs (i, i + hd/2)."""
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    @staticmethod
    def kv_i8(x):
        """K or V (T, G, hd) as the engine's int8 cache holds them: per (position, head) row q = rint(x * 127 / m),
        m = max|x|, and the scale m / 127; returned dequantized, q * scale (float32)."""
        m = np.abs(x).max(axis=-1, keepdims=True)
        safe = np.where(m > 0, m, np.float32(1))
        q = np.clip(np.rint(x * (np.float32(127) / safe)), -128, 127)
        return np.where(m > 0, q * (m / np.float32(127)), np.float32(0)).astype(np.float32)

    def hidden(self, ids, mask, kv16=False, kv=None):
        """Final hidden states (T, D) after the last norm. kv16: K and V rounded to IEEE half, as the
        engine's fp16 KV cache stores them; kv "f32" / "f16" / "i8" (the int8 cache: kv_i8) says it instead."""
        kv = kv or ("f16" if kv16 else "f32")
        T = len(ids)
        x = self.embed[np.asarray(ids)].copy()
        cos, sin = self.rope_tables(T)
        D, hd, H, G = self.D, self.hd, self.H, self.G
        for lay in self.layers:
            a = self.rmsnorm(x, lay["attn_norm"])
            qkv = self.linear(a, lay["qkv"])
            q = self.rope(qkv[:, :D].reshape(T, H, hd), cos, sin)
            k = self.rope(qkv[:, D:D + G * hd].reshape(T, G, hd), cos, sin)
            v = qkv[:, D + G * hd:].reshape(T, G, hd)
            if kv == "f16":
                k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
            elif kv == "i8":
                k, v = self.kv_i8(k), self.kv_i8(v)
            out = np.zeros((T, H, hd), np.float32)
            for h in range(H):
                g = h // (H // G)
                s = (q[:, h, :] @ k[:, g, :].T) * np.float32(1.0 / np.sqrt(hd))
                s = np.where(mask, s, -np.inf)
                p = np.exp(s - s.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                out[:, h, :] = p @ v[:, g, :]
            o = self.rmsnorm(out.reshape(T, D), lay["attn_sub_norm"])
            x = x + self.linear(o, lay["o"])
            b = self.rmsnorm(x, lay["ffn_norm"])
            gu = self.linear(b, lay["gate_up"])
            g, u = gu[:, :self.I], gu[:, self.I:]
            with np.errstate(over="ignore"):  # silu of a large negative g: e^-g = inf, g / inf = -0 as in torch
                hmid = (np.maximum(g, 0) ** 2 if self.act == "relu2" else g / (np.float32(1) + np.exp(-g))) * u
            x = x + self.linear(self.rmsnorm(hmid, lay["ffn_sub_norm"]), lay["down"])
        return self.rmsnorm(x, self.norm)

    def logits(self, ids, mask=None, head="exact", kv16=False, kv=None):
        """(T, V) float32; head "exact" uses the bf16 head (the embedding, or lm_head when untied), "int8" the
        engine's int8 head; kv16 / kv: the KV cache's precision (hidden)."""
        mask = causal_mask(len(ids)) if mask is None else mask
        h = self.hidden(ids, mask, kv16, kv)
        if head == "exact":
            return (h.astype(np.float64) @ self.head.T.astype(np.float64)).astype(np.float32)
        q, inv = self.quant(h)
        return (q.astype(np.float64) @ self.head_i8.T.astype(np.float64)).astype(np.float32) * inv * self.head_scale
