"""A small, slow, simple torch block-diffusion sampler (Fast-dLLM v2 style) and AR greedy, for the demo model.

Reference for numbers in assets/README.md only; the product's decoder is the C engine's. No KV cache:
every forward recomputes the whole sequence with the block-causal mask, which gives the same logits
as a cached decoder that commits each finished block (committed K/V never saw MASK inputs).

Algorithm (reference/block-diffusion.md), greedy (temperature 0):
* blocks of B tokens aligned to absolute positions 0, B, 2B, ... (BOS is position 0);
* the current block = known tokens of its aligned span (prompt tail, or the token produced by the
  previous block's commit forward) + MASKs up to B;
* sub-blocks of S slots left to right; while a sub-block has a MASK: one forward, slot j is predicted
  by the logits of slot j-1 (token shift), MASK logit = -inf; fill every masked slot of the sub-block
  whose softmax probability > threshold, and always the single most confident one;
* block complete: one "commit" forward over it; argmax of its last logit = first token of the next block.
Counted forwards: every denoising forward + every commit forward + the prompt prefill only when it
produces a token (prompt length a multiple of B). AR counts one forward per token the same way.
"""
from __future__ import annotations

import torch

from tools.demo_bitnet import BitNet, block_causal_mask


@torch.no_grad()
def _block_logits(model: BitNet, ids: list[int], mask_id: int) -> torch.Tensor:
    """Full forward with the block-causal pattern -> logits (T, V), MASK logit -inf."""
    T, B = len(ids), model.c.block_size
    lg = model(torch.tensor([ids]), torch.arange(T), block_causal_mask(T, B))[0]
    lg[:, mask_id] = float("-inf")
    return lg


@torch.no_grad()
def diffusion_greedy(model: BitNet, prompt: list[int], max_new: int, mask_id: int, threshold: float = 0.9,
                     sub_block: int = 8, stop_ids=(), trace=None) -> tuple[list[int], int]:
    """prompt ids (BOS first) -> (generated ids, forwards). trace: optional list receiving block snapshots."""
    B = model.c.block_size
    limit = min(len(prompt) + max_new, model.c.max_position_embeddings)
    ids, forwards = list(prompt), 0
    if len(ids) % B == 0:  # prompt fills whole blocks: its prefill forward yields the next token
        ids.append(int(_block_logits(model, ids, mask_id)[-1].argmax()))
        forwards += 1
    while len(ids) < limit and not any(t in stop_ids for t in ids[len(prompt):]):
        start = (len(ids) // B) * B
        block = ids[start:] + [mask_id] * (min(start + B, limit) - len(ids))  # known head + MASKs
        for lo in range(0, len(block), sub_block):
            while mask_id in block[lo:lo + sub_block]:
                lg = _block_logits(model, ids[:start] + block, mask_id)
                forwards += 1
                slots = [j for j in range(lo, min(lo + sub_block, len(block))) if block[j] == mask_id]
                probs = torch.softmax(lg[[start + j - 1 for j in slots]], dim=-1)  # token shift
                conf, tok = probs.max(dim=-1)
                fill = [i for i in range(len(slots)) if conf[i] > threshold] or [int(conf.argmax())]
                for i in fill:
                    block[slots[i]] = int(tok[i])
                if trace is not None:
                    trace.append((start, list(block), [slots[i] for i in fill]))
        ids = ids[:start] + block
        if len(ids) < limit and not any(t in stop_ids for t in ids[len(prompt):]):
            ids.append(int(_block_logits(model, ids, mask_id)[-1].argmax()))  # commit forward
            forwards += 1
    gen = ids[len(prompt):][:max_new]
    for k, t in enumerate(gen):
        if t in stop_ids:
            return gen[:k], forwards
    return gen, forwards


@torch.no_grad()
def ar_greedy(model: BitNet, prompt: list[int], max_new: int, stop_ids=(), mask_id=None) -> list[int]:
    """Plain causal greedy decoding (full recompute per token)."""
    ids = list(prompt)
    limit = min(len(prompt) + max_new, model.c.max_position_embeddings)
    while len(ids) < limit:
        lg = model(torch.tensor([ids]))[0, -1]
        if mask_id is not None:
            lg[mask_id] = float("-inf")
        t = int(lg.argmax())
        if t in stop_ids:
            break
        ids.append(t)
    return ids[len(prompt):]
