"""Why greedy block diffusion does (not) agree with greedy AR on a demo model: the figures behind
assets/README.md, "What decides the two diffusion checks".

    TORCHDYNAMO_DISABLE=1 python -m tools.diagnose_demo_diffusion --model assets/demo-model \
        --prompts-file assets/demo-heldout.json

For each held-out prompt (BOS + 63 tokens, so the reply starts a whole block), AR greedy writes the first
block (32 tokens). Then:
1. AR's own confidence along that text (torch, causal): mean top-1 probability, share of positions with
   top-1 > 0.9 (only such tokens can be filled in parallel at threshold 0.9), share of near-ties
   (top-1 minus top-2 < 0.05: any other decoder may pick the other token).
2. Diffusion teacher-forced along AR's text (torch, block attention): for every state "first k tokens of
   the block known, the rest MASK", does the leftmost masked slot's argmax equal AR's token? Is the
   leftmost slot the most confident one of its sub-block (else Fast-dLLM v2 commits another slot first)?
   Are two slots above 0.9 (a parallel fill at threshold 0.9)?
3. The product's decoders (C engine, exact head), free-running: first-block agreement of diffusion at
   threshold 0.9 with sub-blocks of 8, 4, 2, 1 (1 = strictly left to right), and of AR with the int8 head
   (the same AR decoder up to the rounding of the head: how far two near-identical greedy decoders part).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import torch

from tools.demo_diffusion import _block_logits, ar_greedy
from tools.export_demo_model import load_export


@torch.no_grad()
def ar_confidence(model, prompt: list[int], block: list[int], mask_id: int) -> tuple[list[float], list[float]]:
    """-> (top-1 probability, top-1 minus top-2) of AR's causal prediction at every slot of `block`."""
    lg = model(torch.tensor([prompt + block]))[0, len(prompt) - 1: len(prompt) + len(block) - 1]
    lg[:, mask_id] = float("-inf")
    top = torch.softmax(lg, -1).topk(2, -1).values  # (len(block), 2)
    return top[:, 0].tolist(), (top[:, 0] - top[:, 1]).tolist()


def diffusion_along(model, prompt: list[int], block: list[int], mask_id: int, sub: int = 8):
    """Teacher-forced states of `block` (slot 0 known) -> per state (leftmost == AR, leftmost most confident in
    its sub-block, two slots above 0.9)."""
    out, P, B = [], len(prompt), len(block)
    for k in range(1, B):
        lg = _block_logits(model, prompt + block[:k] + [mask_id] * (B - k), mask_id)
        conf, arg = torch.softmax(lg[P + k - 1: P + B - 1], -1).max(-1)  # rows predicting slots k..B-1
        end = (k // sub + 1) * sub - k  # masked slots left in this sub-block
        out.append((int(arg[0]) == block[k], int(conf[:end].argmax()) == 0, int((conf[:end] > 0.9).sum()) >= 2))
    return out


def product_agreement(folder: str, prompts: list[str], threads: int) -> dict:
    from bitnet_app.convert import convert_checkpoint
    from bitnet_app.model import Model

    with tempfile.TemporaryDirectory() as tmp:  # the engines map the file; it may go once both are open
        path = os.path.join(tmp, "diag.bitnet")
        convert_checkpoint(folder, path)
        exact = Model.open(path, lm_head="exact", threads=threads)
        int8 = Model.open(path, threads=threads)
    ids = [exact.encode(t) for t in prompts]
    ar = [exact.complete(p, mode="ar", max_new_tokens=32, temperature=0.0) for p in ids]

    def agreement(texts):
        share = [float(np.mean([a == b for a, b in zip(x, y)])) for x, y in zip(texts, ar)]
        return {"first_block": float(np.mean(share)), "identical": sum(s == 1.0 for s in share)}

    res = {"ar_int8_head": agreement([int8.complete(p, mode="ar", max_new_tokens=32, temperature=0.0) for p in ids])}
    for sub in (8, 4, 2, 1):
        res[f"diffusion_0.9_sub{sub}"] = agreement([exact.complete(p, mode="diffusion", max_new_tokens=32,
                                                                   temperature=0.0, threshold=0.9,
                                                                   sub_block_size=sub) for p in ids])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="assets/demo-model")
    ap.add_argument("--prompts-file", default="assets/demo-heldout.json")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from tokenizers import Tokenizer

    model = load_export(a.model)
    mask_id = json.load(open(os.path.join(a.model, "dlm_config.json")))["mask_token_id"]
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    texts = json.load(open(a.prompts_file, encoding="utf-8"))["prompts"]
    tops, gaps, states = [], [], []
    for text in texts:
        prompt = tok.encode(text).ids
        block = ar_greedy(model, prompt, 32, mask_id=mask_id)
        t, g = ar_confidence(model, prompt, block, mask_id)
        tops += t
        gaps += g
        states += diffusion_along(model, prompt, block, mask_id)
    tops, gaps, states = np.array(tops), np.array(gaps), np.array(states, dtype=float)
    res = {"model": a.model, "prompts_file": a.prompts_file, "prompts": len(texts),
           "ar_mean_top1": float(tops.mean()), "ar_top1_above_0.9": float((tops > 0.9).mean()),
           "ar_near_ties_gap_below_0.05": float((gaps < 0.05).mean()),
           "leftmost_equals_ar": float(states[:, 0].mean()), "leftmost_most_confident": float(states[:, 1].mean()),
           "two_slots_above_0.9": float(states[:, 2].mean()),
           **product_agreement(a.model, texts, a.threads)}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
