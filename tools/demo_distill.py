"""Self-distillation data for the EXPERIMENTAL last phase of demo-model training (tools/train_demo_model.py
``--distill-frac``; off by default, not used for the shipped model: assets/README.md has the results).

Why: a model this small writes high-entropy text, so its diffusion predictions are rarely confident
and it fills masked slots out of order; greedy diffusion then drifts away from greedy AR after a few
tokens. Training the diffusion objective also on the model's *own greedy AR continuations* (the idea
of consistency distillation for parallel decoders, e.g. CLLM) gives it sharp targets along exactly the
trajectories the decoder visits, so it learns to fill AR's choices, with confidence, several at a time. Measured: it does (3.2 tokens per
forward at threshold 0.9), but training the next-token loss on these rows too makes the model collapse into
loops, and without that the agreement with AR does not improve.

greedy_windows(): snapshot the current weights through the real export (HF layout) and the product's
converter, then decode with the product's C engine in exact mode (fp32 head and KV): for each window a
real prompt of P ~ U[16, 128) tokens (BOS + corpus text starting at a line start) continued greedily to
L tokens (MASK banned, stop ids not special: the window is filled). ~12k tokens/s on 2 threads.

suffix_masks(): the masks used on those rows. View a masks a suffix of each block (first masked slot
k ~ U{1..31}, so the mask ratio is uniform), which is the state of a block while the decoder fills it left
to right; view b masks the complementary slots 1..k-1. Slot 0 is never masked (as in the main recipe).
"""
from __future__ import annotations

import os
import random
import sys
import time

import torch

import demo_data as D

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # the product (bitnet_app) from this checkout
    sys.path.insert(0, REPO)


def suffix_masks(n: int, L: int, B: int, gen: torch.Generator):
    """-> (ma, mb) bool (n, L): per block, ma = slots k..B-1, mb = slots 1..k-1, k ~ U{1..B-1}."""
    nb = L // B
    k = 1 + (torch.rand(n, nb, 1, generator=gen) * (B - 1)).long()
    j = torch.arange(B).view(1, 1, B)
    return (j >= k).view(n, L), ((j < k) & (j >= 1)).view(n, L)


def mix_in_suffix_masks(ma: torch.Tensor, mb: torch.Tensor, share: float, B: int, gen: torch.Generator):
    """Replace about `share` of the blocks of (ma, mb) (n, L) by suffix masks (suffix_masks) -> new (ma, mb)."""
    n, L = ma.shape
    sa, sb = suffix_masks(n, L, B, gen)
    pick = (torch.rand(n, L // B, 1, generator=gen) < share).expand(-1, -1, B).reshape(n, L)
    return torch.where(pick, sa, ma), torch.where(pick, sb, mb)


def _engine_snapshot(model, tok, cfg, work: str):
    """Export the current weights (HF layout), convert them, open the engine in exact mode."""
    from bitnet_app.convert import convert_checkpoint
    from bitnet_app.engine import Engine
    from bitnet_app.engine_file import EngineFile
    from export_demo_model import write_model

    folder = os.path.join(work, "snapshot")
    write_model(model, tok, cfg, folder)
    path = convert_checkpoint(folder, os.path.join(work, "snapshot.bitnet"))
    return Engine(EngineFile(path), lm_head="exact", threads=torch.get_num_threads())


def greedy_windows(model, tok, cfg, work: str, stream: torch.Tensor, starts: list[int],
                   rng: random.Random, n: int, L: int, temperature: float = 0.0) -> torch.Tensor:
    """-> (n, L) long: real prompt + the model's own continuation, one window per row: greedy, or sampled at
    `temperature` (> 0). Decoded by the product's AR decoder with no stop ids, so every window is filled."""
    from bitnet_app.decode.ar import generate_ar
    from bitnet_app.decode.events import Done
    from bitnet_app.sampling import Sampler

    t0 = time.time()
    eng = _engine_snapshot(model, tok, cfg, work)
    seed = rng.randrange(2 ** 32) if temperature > 0 else None  # greedy draws nothing: recorded runs stay exact
    sampler = Sampler(temperature=temperature, seed=seed, banned_ids=[D.MASK])
    rows = []
    for _ in range(n):
        P, s = rng.randrange(16, 128), rng.choice(starts)
        ids = [D.BOS] + stream[s:s + P - 1].tolist()
        for ev in generate_ar(eng, ids, sampler=sampler, max_new_tokens=L - len(ids)):
            if isinstance(ev, Done):
                rows.append(ids + list(ev.ids))
    print(f"self-distillation data: {n} {'sampled' if temperature > 0 else 'greedy'} windows in "
          f"{time.time() - t0:.0f} s", flush=True)
    return torch.tensor(rows)
