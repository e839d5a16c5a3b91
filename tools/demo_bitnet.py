"""A small BitNet b1.58 model in plain torch, for training the bundled demo model.

Same maths as transformers' ``BitNetForCausalLM`` (5.x) with ``AutoBitLinear``:

* RMSNorm: ``w * (x * rsqrt(mean(x^2) + eps))``, weight ``w`` (not ``1 + w``).
* Attention: GQA (query head h uses KV head h // (H / KV)), half-split ("rotate_half") RoPE with a
  configurable theta, scale 1/sqrt(head_dim), ``attn_sub_norm`` on the concatenated heads before o_proj.
* MLP: ``down(ffn_sub_norm(relu(gate(x))**2 * up(x)))``.
* Tied LM head (logits = final_norm(h) @ embed^T); no biases anywhere.
* Every projection is a BitLinear with quantization-aware training, identical to AutoBitLinear's
  online mode: weights absmean-ternary ``round(W / mean|W|).clamp(-1, 1) * mean|W|`` (one scale per
  matrix), activations per-token int8 absmax ``round(x * 127 / max|x|).clamp(-128, 127) / (127 / max|x|)``,
  straight-through estimator for both (the forward sees the quantized values, gradients pass through).

A BitLinear can be "frozen" from an exported checkpoint (ternary codes + one scale), then it computes
``F.linear(ActQuant(x), W_tern) * weight_scale`` exactly like AutoBitLinear's offline mode.

Attention layouts accepted by ``BitNet.forward`` (T = sequence length of the batch):
* ``"causal"``: ordinary causal attention (AR).
* a bool tensor (T, T): True = the query (row) may attend to the key (column).
* ``"train"``: the training layout of 4 segments of L tokens each, ``[noisy_a | noisy_b | clean_blk | clean_ar]``,
  see ``train_attention``.
* ``"train_causal"``: the training layout for causal-attention diffusion, 3 segments ``[noisy_a | noisy_b | clean]``,
  see ``train_attention_causal``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class BitNetCfg:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 704  # multiple of 4 (2-bit packing packs 4 output rows per byte)
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 1024
    block_size: int = 32  # diffusion block size ("bd_size")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- quantizers (fake-quant + STE)
def weight_quant(w: torch.Tensor) -> torch.Tensor:
    """Absmean ternary fake-quant of a whole matrix, as transformers' WeightQuant (in fp32)."""
    scale = 1.0 / w.abs().mean().clamp(min=1e-5)
    return (w * scale).round().clamp(-1, 1) / scale


def act_quant(x: torch.Tensor) -> torch.Tensor:
    """Per-token (last dim) int8 absmax fake-quant, as transformers' ActQuant (fp32, round half to even)."""
    scale = 127 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    return (x * scale).round().clamp(-128, 127) / scale


def ste(x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
    """Forward value xq, gradient of the identity (straight-through estimator)."""
    return x + (xq - x).detach()


class _ActQuantSTE(torch.autograd.Function):
    """act_quant forward, identity backward: ste(x, act_quant(x)) in one node that saves nothing for the
    backward (on a GPU the quantizer's elementwise passes, not the products, bound a step of this small model)."""

    @staticmethod
    def forward(ctx, x):
        return act_quant(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def act_quant_ste(x: torch.Tensor) -> torch.Tensor:
    return _ActQuantSTE.apply(x)


class BitLinear(nn.Module):
    """y = ActQuant(x) @ WeightQuant(W)^T ; weight (out, in) fp32 latent, no bias."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) * 0.02)
        self.frozen = False  # set by freeze(): use exported ternary codes and scale

    def freeze(self, tern: torch.Tensor, scale: torch.Tensor) -> None:
        """Use exported values: tern (out, in) in {-1,0,1} fp32, scale (1,) fp32 (bf16-rounded)."""
        self.frozen = True
        self.register_buffer("tern", tern.float(), persistent=False)
        self.register_buffer("scale", scale.float().reshape(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.on_quantized(act_quant_ste(x))

    def on_quantized(self, xq: torch.Tensor) -> torch.Tensor:
        """The product for an input already through act_quant_ste (projections that share an input share it)."""
        if self.frozen:  # AutoBitLinear offline: F.linear(ActQuant(x), W_tern) * weight_scale
            return F.linear(xq, self.tern) * self.scale
        return F.linear(xq, ste(self.weight, weight_quant(self.weight)))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float):
    """pos (T,) int -> cos, sin (T, head_dim); half-split layout: dim j pairs with j + head_dim/2."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=pos.device) / head_dim)
    freqs = pos.float()[:, None] * inv_freq[None, :]  # (T, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (T, hd)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, hd); rotate_half(x) = cat(-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def train_attention(q, k, v, block: int):
    """Attention for the training layout [noisy_a | noisy_b | clean_blk | clean_ar], L tokens each.

    q, k, v: (B, H, 4L, hd). Every segment holds positions 0..L-1 of the same sample.
    * noisy_a / noisy_b: a query in block b sees its own noisy block (bidirectionally) and the
      clean_blk keys of blocks < b.  (Fast-dLLM v2's [noisy | clean] mask; two complementary views.)
    * clean_blk: block-causal over itself (key block <= query block): what the decoder commits.
    * clean_ar: plain causal over itself: what AR decoding sees (next-token loss).
    Done as three SDPA calls so no compute is spent on the fully masked 3/4 of a 4L x 4L matrix.
    """
    L = q.shape[2] // 4
    blk = torch.arange(L, device=q.device) // block
    same = blk[:, None] == blk[None, :]  # (L, L) own block
    before = blk[:, None] > blk[None, :]  # (L, L) strictly earlier blocks
    qa, qb, qc, qr = q.split(L, dim=2)
    ka, kb, kc, kr = k.split(L, dim=2)
    va, vb, vc, vr = v.split(L, dim=2)
    m_noisy = torch.cat([same, before], dim=1)  # (L, 2L): [own noisy segment | clean_blk]
    B = q.shape[0]
    o_n = F.scaled_dot_product_attention(
        torch.cat([qa, qb], 0),
        torch.cat([torch.cat([ka, kc], 2), torch.cat([kb, kc], 2)], 0),
        torch.cat([torch.cat([va, vc], 2), torch.cat([vb, vc], 2)], 0),
        attn_mask=m_noisy)
    o_c = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=same | before)
    o_r = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    return torch.cat([o_n[:B], o_n[B:], o_c, o_r], dim=2)


def train_attention_causal(q, k, v, block: int):
    """Attention for the causal training layout [noisy_a | noisy_b | clean], L tokens each.

    q, k, v: (B, H, 3L, hd). Every segment holds positions 0..L-1 of the same sample.
    * noisy_a / noisy_b: a query at position i of block b sees its own noisy block up to i (causally) and the
      clean keys of blocks < b: what a decoder with causal attention sees (the committed blocks, then the
      block being filled, masks included, up to the query).
    * clean: plain causal over itself: the committed K/V and what AR decoding sees (next-token loss).
    """
    L = q.shape[2] // 3
    idx = torch.arange(L, device=q.device)
    blk = idx // block
    own = (blk[:, None] == blk[None, :]) & (idx[:, None] >= idx[None, :])  # (L, L) own block, causally
    before = blk[:, None] > blk[None, :]  # (L, L) strictly earlier blocks
    qa, qb, qc = q.split(L, dim=2)
    ka, kb, kc = k.split(L, dim=2)
    va, vb, vc = v.split(L, dim=2)
    B = q.shape[0]
    o_n = F.scaled_dot_product_attention(
        torch.cat([qa, qb], 0),
        torch.cat([torch.cat([ka, kc], 2), torch.cat([kb, kc], 2)], 0),
        torch.cat([torch.cat([va, vc], 2), torch.cat([vb, vc], 2)], 0),
        attn_mask=torch.cat([own, before], dim=1))
    o_c = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
    return torch.cat([o_n[:B], o_n[B:], o_c], dim=2)


class Attention(nn.Module):
    def __init__(self, c: BitNetCfg):
        super().__init__()
        self.c = c
        hd, H, KV = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        self.q_proj = BitLinear(c.hidden_size, H * hd)
        self.k_proj = BitLinear(c.hidden_size, KV * hd)
        self.v_proj = BitLinear(c.hidden_size, KV * hd)
        self.o_proj = BitLinear(H * hd, c.hidden_size)
        self.attn_sub_norm = RMSNorm(H * hd, c.rms_norm_eps)

    def forward(self, x, cos, sin, layout):
        B, T, _ = x.shape
        c = self.c
        hd, H, KV = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        xq = act_quant_ste(x)  # q, k and v read the same quantized input
        q = self.q_proj.on_quantized(xq).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj.on_quantized(xq).view(B, T, KV, hd).transpose(1, 2)  # (B, KV, T, hd)
        v = self.v_proj.on_quantized(xq).view(B, T, KV, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = k.repeat_interleave(H // KV, dim=1)  # GQA: head h uses KV head h // (H/KV)
        v = v.repeat_interleave(H // KV, dim=1)
        if isinstance(layout, str) and layout == "train":
            o = train_attention(q, k, v, c.block_size)
        elif isinstance(layout, str) and layout == "train_causal":
            o = train_attention_causal(q, k, v, c.block_size)
        elif isinstance(layout, str) and layout == "causal":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=layout)
        o = o.transpose(1, 2).reshape(B, T, H * hd)  # heads concatenated
        return self.o_proj(self.attn_sub_norm(o))


class MLP(nn.Module):
    def __init__(self, c: BitNetCfg):
        super().__init__()
        self.gate_proj = BitLinear(c.hidden_size, c.intermediate_size)
        self.up_proj = BitLinear(c.hidden_size, c.intermediate_size)
        self.down_proj = BitLinear(c.intermediate_size, c.hidden_size)
        self.ffn_sub_norm = RMSNorm(c.intermediate_size, c.rms_norm_eps)

    def forward(self, x):
        xq = act_quant_ste(x)  # gate and up read the same quantized input
        h = F.relu(self.gate_proj.on_quantized(xq)).square() * self.up_proj.on_quantized(xq)
        return self.down_proj(self.ffn_sub_norm(h))


class Layer(nn.Module):
    def __init__(self, c: BitNetCfg):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, layout):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layout)
        return x + self.mlp(self.post_attention_layernorm(x))


class BitNet(nn.Module):
    """Parameter names match transformers' BitNetForCausalLM minus the leading "model."."""

    def __init__(self, c: BitNetCfg):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def hidden(self, ids: torch.Tensor, pos: torch.Tensor, layout) -> torch.Tensor:
        """ids (B, T), pos (T,) -> final-normed hidden states (B, T, d)."""
        cos, sin = rope_cos_sin(pos, self.c.head_dim, self.c.rope_theta)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, layout)
        return self.norm(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Tied head: (..., d) -> (..., vocab)."""
        return h @ self.embed_tokens.weight.t()

    def forward(self, ids, pos=None, layout="causal"):
        if pos is None:
            pos = torch.arange(ids.shape[1], device=ids.device)
        return self.logits(self.hidden(ids, pos, layout))


def block_causal_mask(T: int, block: int) -> torch.Tensor:
    """(T, T) bool: query q may see key k iff k // block <= q // block (Fast-dLLM v2 "block" pattern)."""
    b = torch.arange(T) // block
    return b[:, None] >= b[None, :]


def count_params(m: BitNet) -> int:
    return sum(p.numel() for p in m.parameters())


def param_lr_groups(m: BitNet, weight_decay: float):
    """Weight decay on BitLinear latent weights only (not on norms / embeddings)."""
    decay = [p for n, p in m.named_parameters() if n.endswith("proj.weight")]
    other = [p for n, p in m.named_parameters() if not n.endswith("proj.weight")]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def _self_check():
    """Tiny check that the "train" and "train_causal" layouts equal the same attention done with one big mask."""
    torch.manual_seed(0)
    c = BitNetCfg(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, block_size=4)
    q, k, v = (torch.randn(2, 4, 32, 8) for _ in range(3))
    L = 8
    blk = torch.arange(L) // 4
    same, before = blk[:, None] == blk[None, :], blk[:, None] > blk[None, :]
    full = torch.zeros(4 * L, 4 * L, dtype=torch.bool)
    for s in (0, 1):
        full[s * L:(s + 1) * L, s * L:(s + 1) * L] = same
        full[s * L:(s + 1) * L, 2 * L:3 * L] = before
    full[2 * L:3 * L, 2 * L:3 * L] = same | before
    full[3 * L:, 3 * L:] = torch.ones(L, L, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    got = train_attention(q, k, v, 4)
    assert torch.allclose(ref, got, atol=1e-5), (ref - got).abs().max()
    # the causal layout [noisy_a | noisy_b | clean]: own block up to the query, earlier clean blocks; clean causal
    q3, k3, v3 = (t[:, :, :3 * L] for t in (q, k, v))
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    full3 = torch.zeros(3 * L, 3 * L, dtype=torch.bool)
    for s in (0, 1):
        full3[s * L:(s + 1) * L, s * L:(s + 1) * L] = same & causal
        full3[s * L:(s + 1) * L, 2 * L:] = before
    full3[2 * L:, 2 * L:] = causal
    ref3 = F.scaled_dot_product_attention(q3, k3, v3, attn_mask=full3)
    got3 = train_attention_causal(q3, k3, v3, 4)
    assert torch.allclose(ref3, got3, atol=1e-5), (ref3 - got3).abs().max()
    print("train_attention ok", math.isfinite(float(got.sum())), math.isfinite(float(got3.sum())))


if __name__ == "__main__":
    _self_check()
