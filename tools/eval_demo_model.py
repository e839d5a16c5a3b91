"""Evaluate the EXPORTED demo model (assets/demo-model) and print the figures for assets/README.md.

    TORCHDYNAMO_DISABLE=1 python tools/eval_demo_model.py --model assets/demo-model --work /tmp/demo-train \
        --write-prompts assets/demo-heldout.json

1. Loads the folder with transformers ``BitNetForCausalLM.from_pretrained(..., dtype=torch.float32)`` then
   ``torch.nn.Module.float(model)`` (embeddings and norms otherwise stay bf16 and F.linear fails)
   (TORCHDYNAMO_DISABLE=1 turns transformers' ``@torch.compile`` on ``unpack_weights``/quantizers into
   plain eager calls: no compiler needed, same numbers) and with our torch module (demo_bitnet, frozen
   from the packed tensors); checks their causal logits agree.
2. Validation losses of both training objectives on the export (same fixed batches as training).
3. AR perplexity on the held-out plays: non-overlapping windows of L tokens (BOS + L-1), transformers.
4. Samples: AR greedy (transformers ``generate``) and block diffusion greedy at threshold 0.9
   (tools/demo_diffusion.py), plus tokens per forward at thresholds 0.7..1.0 on 16 held-out prompts
   (BOS + 63 tokens each, so replies start a fresh aligned block) and the agreement of diffusion greedy
   with AR greedy over the first block (32 generated tokens). ``--write-prompts FILE`` saves those prompts
   as text (assets/demo-heldout.json, used by tests/test_demo_model.py and benchmarks/diffusion_vs_ar.py).
Writes WORK/eval.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_data as D  # noqa: E402
import train_demo_model as TR  # noqa: E402
from demo_bitnet import BitLinear, BitNet, BitNetCfg  # noqa: E402
from demo_diffusion import ar_greedy, diffusion_greedy  # noqa: E402

PROMPTS = {  # sample prompts per training corpus (the keys of train_demo_model.CORPORA)
    "shakespeare": ["To be, or not to be", "ROMEO.\nO, she doth teach the torches to burn bright!",
                    "Shall I compare thee to a summer's day?", "KING.\nWhat news, my lord?"],
    "kjv": ["In the beginning", "And the LORD spake unto Moses, saying,", "The LORD is my shepherd;",
            "Blessed are the"],
}


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """(out/4, in) uint8 -> (out, in) fp32 ternary; row i*P + r is bits 2i..2i+1 of packed row r."""
    return torch.cat([((packed >> (2 * i)) & 3).float() - 1 for i in range(4)], dim=0)


def load_export(folder: str) -> BitNet:
    """Our torch module with exactly the exported values (ternary codes, bf16 scales/norms/embeddings)."""
    from safetensors.torch import load_file

    hc = json.load(open(os.path.join(folder, "config.json")))
    dc = json.load(open(os.path.join(folder, "dlm_config.json")))
    cfg = BitNetCfg(**{k: hc[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "num_key_value_heads", "rope_theta",
                                           "rms_norm_eps", "max_position_embeddings")}, block_size=dc["bd_size"])
    model = BitNet(cfg).eval()
    sd = load_file(os.path.join(folder, "model.safetensors"))
    for name, mod in model.named_modules():
        if isinstance(mod, BitLinear):
            mod.freeze(unpack(sd.pop(f"model.{name}.weight")), sd.pop(f"model.{name}.weight_scale"))
    rest = {k[len("model."):]: v.float() for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(rest, strict=False)
    assert not unexpected and all(k.endswith("proj.weight") for k in missing), (missing, unexpected)
    return model


@torch.no_grad()
def ar_perplexity(hf, stream: list[int], L: int) -> tuple[float, int]:
    """Mean next-token CE over non-overlapping windows [BOS] + L-1 tokens -> (ppl, n targets)."""
    tot, n = 0.0, 0
    for s in range(0, len(stream) - (L - 1) + 1, L - 1):
        x = torch.tensor([[D.BOS] + stream[s:s + L - 1]])
        lg = hf(input_ids=x).logits[0, :-1]
        tot += float(F.cross_entropy(lg, x[0, 1:], reduction="sum"))
        n += L - 1
    return math.exp(tot / n), n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="assets/demo-model")
    p.add_argument("--work", default="/tmp/demo-train")
    p.add_argument("--corpus", choices=sorted(PROMPTS), default=TR.parse_args([]).corpus,
                   help="the corpus the model was trained on (its held-out split is the validation text)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-prompts", type=int, default=16)
    p.add_argument("--max-new", type=int, default=96)
    p.add_argument("--write-prompts", help="also write the held-out prompts as text to this JSON file")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from tokenizers import Tokenizer
    from transformers import BitNetForCausalLM

    res = {}
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    # transformers 5.23 keeps embeddings and norms in the stored bf16 even with dtype=float32 (the unpacked
    # ternary weights become fp32), so the first F.linear would mix dtypes. The model refuses .float()
    # ("not supported for quantized model"), so call nn.Module.float directly: all fp32, values unchanged.
    hf = torch.nn.Module.float(BitNetForCausalLM.from_pretrained(a.model, dtype=torch.float32)).eval()
    mine = load_export(a.model)
    L = mine.c.max_position_embeddings
    targs = TR.parse_args(["--work", a.work, "--seq", str(L), "--corpus", a.corpus])
    _, _, valw = TR.prepare(targs, tok)  # the export's own tokenizer

    x = valw.window(valw.starts[0]).unsqueeze(0)
    with torch.no_grad():
        d = (hf(input_ids=x).logits - mine(x)).abs().max()
    res["max_abs_logit_diff_hf_vs_torch"] = float(d)
    print(f"logits: transformers vs our module, max |diff| = {float(d):.2e}", flush=True)

    vd, va = TR.evaluate(mine, TR.val_batches(valw, targs, mine.c.block_size))
    res.update(val_diffusion_loss=vd, val_ar_loss=va)
    print(f"export val losses: diffusion {vd:.4f}  ar {va:.4f}", flush=True)
    ppl, n = ar_perplexity(hf, valw.stream.tolist(), L)
    res.update(ar_perplexity=ppl, ppl_tokens=n)
    print(f"AR perplexity on the held-out text (transformers, {n} tokens): {ppl:.2f}", flush=True)

    stop = (D.EOT_TEXT, D.EOT_ID)
    res["samples"] = []
    for text in PROMPTS[a.corpus]:
        ids = tok.encode(text).ids  # BOS prepended by the post-processor
        out = hf.generate(torch.tensor([ids]), max_new_tokens=a.max_new, do_sample=False)[0, len(ids):].tolist()
        dg, fw = diffusion_greedy(mine, ids, a.max_new, D.MASK, 0.9, stop_ids=stop)
        res["samples"].append({"prompt": text, "ar": tok.decode(out), "diffusion_0.9": tok.decode(dg),
                               "diffusion_tokens_per_forward": len(dg) / fw})
        print(f"\n=== {text!r}\n--- AR greedy:\n{tok.decode(out)}\n--- diffusion t=0.9 ({len(dg)/fw:.2f} tok/fwd):\n"
              f"{tok.decode(dg)}", flush=True)

    # held-out prompts: BOS + 63 tokens of the validation plays from evenly spaced line starts, so a prompt fills
    # exactly two blocks and the "first block" of a reply is a whole aligned block of B = 32 generated tokens
    vs = valw.stream.tolist()
    starts = valw.starts[:: max(1, len(valw.starts) // a.n_prompts)][: a.n_prompts]
    prompts = [[D.BOS] + vs[s:s + 63] for s in starts]
    if a.write_prompts:  # the same prompts as text, for tests/test_demo_model.py and benchmarks/diffusion_vs_ar.py
        texts = [tok.decode(q[1:]) for q in prompts]
        assert all(tok.encode(t).ids == q for t, q in zip(texts, prompts)), "prompt text does not re-encode"
        with open(a.write_prompts, "w", encoding="utf-8") as f:
            held_out = ", ".join(TR.CORPORA[a.corpus][2])
            json.dump({"source": f"held-out {a.corpus} works {held_out} (never seen in training); "
                       "each prompt encodes to BOS + 63 tokens", "prompts": texts}, f, indent=1)
            f.write("\n")
    res["thresholds"] = {}
    ar_first = [ar_greedy(mine, q, 32, stop) for q in prompts]
    for thr in (0.7, 0.8, 0.9, 0.95, 1.0):
        t0, toks, fws, agree = time.time(), 0, 0, []
        for q, ref in zip(prompts, ar_first):
            g, f = diffusion_greedy(mine, q, a.max_new, D.MASK, thr, stop_ids=stop)
            toks, fws = toks + len(g), fws + f
            n = min(len(ref), len(g))  # the first block: B = 32 generated tokens
            agree.append(sum(int(u == v) for u, v in zip(g[:n], ref[:n])) / max(1, n))
        r = {"tokens": toks, "forwards": fws, "tokens_per_forward": toks / fws,
             "first_block_agreement_with_ar": sum(agree) / len(agree), "per_prompt_agreement": agree,
             "seconds": time.time() - t0}
        res["thresholds"][str(thr)] = r
        print(f"threshold {thr}: {r}", flush=True)
    json.dump(res, open(os.path.join(a.work, "eval.json"), "w"), indent=2)


if __name__ == "__main__":
    main()
