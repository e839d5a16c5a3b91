"""Block diffusion against AR on one model: committed tokens/s, tokens per forward, and text agreement.

    python -m benchmarks.diffusion_vs_ar --model assets/demo-model --prompts-file assets/demo-heldout.json \
        [--prompts 16] [--max-new-tokens 96] [--lm-head exact]

For every prompt (from --prompts-file, e.g. the demo model's held-out prompts, else built-in prompts),
greedy AR is the baseline; then diffusion at thresholds 0.7/0.8/0.9/0.95/1.0, with and without DualCache.
Reported per setting: committed tokens/s (tokens / wall time of the whole reply, measured inside the decoder),
forwards and tokens per forward, and agreement with the AR text: the share of the first block (32 tokens)
identical to AR, and the whole reply's identical-prefix length. A second AR row (the same decoder with
the other LM head, int8 vs exact) calibrates those columns: how far two near-identical greedy decoders part.
Then the engine costs that decide the trade on this machine: one AR step, one full-block step and one
sub-block (DualCache) step, from single forwards, and the break-even tokens per step.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

THRESHOLDS = (0.7, 0.8, 0.9, 0.95, 1.0)
FALLBACK_PROMPTS = ["ROMEO. ", "First Citizen. Before we proceed any further, hear me speak.\n",
                    "HAMLET. To be, or not to be", "Enter the KING and QUEEN", "KING. ", "Now is the winter",
                    "LADY MACBETH. ", "Friends, Romans, countrymen"]


def prompts_for(n: int, prompts_file: str | None) -> list[str]:
    """The first n prompts of a JSON file {"prompts": [...]} (for the demo model: its held-out prompts,
    assets/demo-heldout.json, written by tools/eval_demo_model.py), else built-in prompts."""
    if prompts_file:
        return json.load(open(prompts_file, encoding="utf-8"))["prompts"][:n]
    return FALLBACK_PROMPTS[:n]


def run(model, ids, **params):
    from bitnet_app.decode.events import Done

    t = time.perf_counter()
    for ev in model.generate(ids, **params):
        if isinstance(ev, Done):
            ev.stats["wall_s"] = time.perf_counter() - t
            return ev


def prefix_len(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def summary_row(name: str, res, ar, B: int) -> dict:
    """Done events of one setting (one per prompt) against greedy AR's -> speed, tokens per forward, agreement."""
    toks = sum(d.stats["tokens"] for d in res)
    agree = [np.mean([a == b for a, b in zip(d.ids[:B], r.ids[:B])]) if r.ids[:B] else 1.0 for d, r in zip(res, ar)]
    pref = [prefix_len(d.ids, r.ids) / max(1, len(r.ids)) for d, r in zip(res, ar)]
    return {"setting": name, "tok_s": toks / sum(d.stats["wall_s"] for d in res),
            "tokens_per_forward": toks / sum(d.stats["forwards"] for d in res),
            "tokens_per_step": toks / max(1, sum(d.stats.get("steps", d.stats["forwards"]) for d in res)),
            "first_block_agree": float(np.mean(agree)), "prefix": float(np.mean(pref)),
            "identical_first_blocks": int(sum(a == 1.0 for a in agree))}


def step_costs(model, block: int, sub: int, reps: int = 5) -> dict:
    """ms of one AR step, one full-block uncommitted step, one DualCache sub-block step (median)."""
    eng = model.engine
    ids = np.arange(64 + block) % model.vocab_size
    eng.reset()
    eng.forward(ids[:64])

    def med(f):
        f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return 1e3 * statistics.median(ts)

    out = {"ar_step_ms": med(lambda: eng.forward(ids[64:65], commit=False)),
           "block_step_ms": med(lambda: eng.forward(ids[64:64 + block], commit=False, attention="block",
                                                    block_size=block, rows=range(sub))),
           "dual_cache_step_ms": med(lambda: eng.forward(ids[64 + 8:64 + 8 + sub], start=64 + 8, commit=False,
                                                         attention="block", block_size=block,
                                                         kv_end=64 + block, rows=range(sub)))}
    eng.reset()
    out["break_even_tokens_per_step"] = out["block_step_ms"] / out["ar_step_ms"]
    out["break_even_tokens_per_step_dual"] = out["dual_cache_step_ms"] / out["ar_step_ms"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts-file", help='JSON {"prompts": [...]}, e.g. assets/demo-heldout.json')
    ap.add_argument("--lm-head", default="int8", choices=("int8", "exact"))
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args()

    import bitnet_app

    model = bitnet_app.load_model(args.model, threads=args.threads, lm_head=args.lm_head)
    knobs = model.diffusion_defaults
    B, S = knobs["block_size"], knobs["sub_block_size"]
    texts = prompts_for(args.prompts, args.prompts_file)
    prompts = [model.encode(t) for t in texts]
    common = dict(max_new_tokens=args.max_new_tokens, temperature=0.0)
    run(model, prompts[0], mode="ar", **common)  # warm-up
    ar = [run(model, p, mode="ar", **common) for p in prompts]
    rows = [summary_row("AR (greedy)", ar, ar, B)]
    # Calibration of the agreement columns: the same AR decoder with the other head (int8 rounding of the
    # logits only). Position-by-position agreement of two free-running greedy texts is decided by near-ties.
    other = "exact" if args.lm_head == "int8" else "int8"
    twin = bitnet_app.load_model(args.model, threads=args.threads, lm_head=other)  # a second engine, closed below
    rows.append(summary_row(f"AR (greedy), {other} head", [run(twin, p, mode="ar", **common) for p in prompts], ar, B))
    twin.close()
    samples = {"AR": model.decode(ar[0].ids)}
    for dual in (False, True):
        for thr in THRESHOLDS:
            res = [run(model, p, mode="diffusion", threshold=thr, dual_cache=dual, **common) for p in prompts]
            name = f"diffusion thr {thr}" + (" + DualCache" if dual else "")
            rows.append(summary_row(name, res, ar, B))
            if thr == 0.9:
                samples[name] = model.decode(res[0].ids)
    costs = step_costs(model, B, S)
    info = model.info()
    print(f"model {args.model}: {info['parameters'] / 1e6:.1f} M parameters, {info['isa']}, {info['threads']} threads, {args.lm_head} head; "
          f"block {B}, sub-block {S}, attention {knobs['attention']}, {len(prompts)} prompts x {args.max_new_tokens} tokens, greedy\n")
    print("| setting | committed tok/s | vs AR | tokens / forward | first block = AR | whole first block = AR | identical prefix |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['tok_s']:.1f} | {r['tok_s'] / rows[0]['tok_s']:.2f}x | {r['tokens_per_forward']:.2f} "
              f"| {100 * r['first_block_agree']:.0f}% | {r['identical_first_blocks']}/{len(prompts)} | {100 * r['prefix']:.0f}% |")
    print(f"\nstep costs: AR {costs['ar_step_ms']:.2f} ms, full block ({B}) {costs['block_step_ms']:.2f} ms, "
          f"DualCache sub-block ({S}) {costs['dual_cache_step_ms']:.2f} ms: diffusion beats AR only above "
          f"{costs['break_even_tokens_per_step']:.1f} tokens per full-block step "
          f"({costs['break_even_tokens_per_step_dual']:.1f} with DualCache)")
    print("\nsamples (prompt 1):")
    print(f"prompt: {texts[0]!r}")
    for k, v in samples.items():
        print(f"{k}: {v!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "costs": costs, "samples": samples, "prompts": texts}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
