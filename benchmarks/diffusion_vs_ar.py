"""Block diffusion against AR on one model's held-out prompts: speed, tokens per step, and the step's cost.

    python -m benchmarks.diffusion_vs_ar [--model assets/demo-model] [--prompts-file assets/demo-prompts.json]
        [--limit N] [--max-new-tokens N] [--repeats 3] [--threads 2] [--attention block] [--fill-rule threshold]
        [--threshold T] [--json out.json]

Prompts: a JSON file {"skills": [...], "open": [...]}, each entry the content of ONE user message, rendered
with the model's chat template (Model.chat_ids); the two sets are reported separately.
Decoding: greedy, with everything else as the app runs it by default (Model.generate with the model's
diffusion defaults and DecodeParams': block, sub-block, threshold, fill rule, DualCache, max_new_tokens); beside it,
the same with the other DualCache setting. --sampled: the model's own sampling instead (its
generation_config.json: what the app starts from), seeded so that every run of a reply draws the same ids;
the "reply = AR" columns then compare draws, not decoders. --attention overrides the checkpoint's pattern (a random
engine file of the 2B-4T shape, `python -m bitnet_app bench --synthetic 2b4t`, is not trained for
diffusion and defaults to causal); --fill-rule overrides the app's fill rule (exact under causal attention,
threshold under block attention).

Timing: every reply runs --repeats times; greedy decoding makes each run the same work, so the fastest
run counts (the machine is shared). Times are the decoders' own (work inside the generator, Python
included, never across a yield: Done.stats total_s and its parts).

Reported per prompt set and setting: tokens per denoising step (all tokens / all steps: the tokens that stand),
tokens per forward (block commits and prefill counted), the share of drafted slots (filled above the threshold)
that were kept (the exact rule drops those that are not AR's; the threshold rule keeps all), the share of
prompts whose whole reply equals AR's (and
equals the exact decoder's, for DualCache), committed tokens/s and its ratio to AR's in the same run.
Calibration: how often greedy AR with the other LM head (int8 / exact) gives the same whole reply; two
decoders that differ only by the rounding of the logits part at near-ties, so this is a realistic ceiling.
Then the product figure, per setting: ms of one denoising step as the app runs it (forward, sampling,
bookkeeping, events; not the prefill or the block commits) divided by ms of one AR token (prefill not
counted), beside tokens per step; and the break-even: all of diffusion's time per step (prefill and
commits included) over all of AR's time per token, the tokens per step at which diffusion's tokens/s
equals AR's on this machine. Last, single steps timed alone (fastest of max(repeats, 20)), steadier than
whole replies on a busy machine: an AR token, a full-block step, a sub-block step (--steps-only: just these).
"""
import argparse
import json
import sys

DEFAULT_PROMPTS = "assets/demo-prompts.json"


def load_prompts(path: str, limit: int | None) -> dict[str, list[str]]:
    """{"skills": [...], "open": [...]} -> the same, each list cut to `limit`; refuses another shape."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"no prompts file {path}: give --prompts-file, a JSON {{\"skills\": [...], \"open\": [...]}}")
    if not isinstance(data, dict) or not all(isinstance(v, list) and all(isinstance(t, str) for t in v)
                                             for v in data.values()):
        raise SystemExit(f"{path}: expected {{\"skills\": [...], \"open\": [...]}} with one user message per entry")
    return {name: texts[:limit] for name, texts in data.items() if texts}


def fastest(model, ids, repeats: int, **params):
    """The Done event of the fastest of `repeats` runs (each must give the same ids: greedy or seeded decoding)."""
    from bitnet_app.decode.events import Done

    best = None
    for _ in range(repeats):
        done = next(ev for ev in model.generate(ids, **params) if isinstance(ev, Done))
        if best is not None and done.ids != best.ids:
            raise RuntimeError("two runs of the same prompt gave different replies")
        if best is None or done.stats["total_s"] < best.stats["total_s"]:
            best = done
    return best


def totals(dones) -> dict:
    keys = ("tokens", "forwards", "steps", "total_s", "engine_s", "step_s", "step_engine_s", "prefill_s", "drafted",
            "kept")
    return {k: sum(d.stats.get(k, 0) for d in dones) for k in keys}


def diffusion_row(name: str, dones, ar, exact=None) -> dict:
    """One setting's figures against AR's (and the exact decoder's) replies, prompt by prompt."""
    t, a = totals(dones), totals(ar)
    steps = max(t["steps"], 1)
    outside_steps = t["engine_s"] - t["step_engine_s"]    # the prefill and the block commits
    ar_decode_forwards = max(a["forwards"] - len(ar), 1)   # one per AR token after the prefill's
    row = {
        "setting": name, "prompts": len(dones), "tokens": t["tokens"], "steps": t["steps"],
        "tokens_per_step": t["tokens"] / steps, "tokens_per_forward": t["tokens"] / max(t["forwards"], 1),
        "drafted": t["drafted"], "kept_share": t["kept"] / t["drafted"] if t["drafted"] else 1.0,
        "same_as_ar": sum(d.ids == r.ids for d, r in zip(dones, ar)) / len(dones),
        "tok_s": t["tokens"] / t["total_s"], "ar_tok_s": a["tokens"] / a["total_s"],
        # one denoising step as the app runs it, and its parts (ms)
        "step_ms": 1e3 * (t["total_s"] - outside_steps) / steps,
        "step_forward_ms": 1e3 * t["step_engine_s"] / steps,
        "step_sampling_ms": 1e3 * (t["step_s"] - t["step_engine_s"]) / steps,
        "step_other_ms": 1e3 * (t["total_s"] - t["step_s"] - outside_steps) / steps,
        "commits_per_step_ms": 1e3 * outside_steps / steps,
        "all_in_per_step_ms": 1e3 * t["total_s"] / steps,
        # one AR token (prefill not counted), and all of AR's time per token
        "ar_token_ms": 1e3 * (a["total_s"] - a["prefill_s"]) / ar_decode_forwards,
        "ar_token_forward_ms": 1e3 * (a["engine_s"] - a["prefill_s"]) / ar_decode_forwards,
        "ar_all_in_per_token_ms": 1e3 * a["total_s"] / a["tokens"],
    }
    row["vs_ar"] = row["tok_s"] / row["ar_tok_s"]
    row["step_over_ar_token"] = row["step_ms"] / row["ar_token_ms"]
    row["break_even_tokens_per_step"] = row["all_in_per_step_ms"] / row["ar_all_in_per_token_ms"]
    if exact is not None:
        row["same_as_exact"] = sum(d.ids == e.ids for d, e in zip(dones, exact)) / len(dones)
    return row


def run_set(model, twin, texts, repeats: int, common: dict, dual_default: bool, diffusion: dict) -> dict:
    """twin: the same model with the other LM head; its greedy AR replies calibrate the agreement columns
    (how often two decoders that differ only by the rounding of the logits give the same whole reply);
    diffusion: the diffusion knobs set on the command line (attention, fill_rule; None: the app's)."""
    prompts = [model.chat_ids([{"role": "user", "content": t}]) for t in texts]
    ar = [fastest(model, p, repeats, mode="ar", **common) for p in prompts]
    twin_ar = [fastest(twin, p, 1, mode="ar", **common) for p in prompts]
    diff = {}
    for dual in (dual_default, not dual_default):  # the app's setting first: it is the exact reference if off
        diff[dual] = [fastest(model, p, repeats, mode="diffusion", dual_cache=dual, **diffusion, **common)
                      for p in prompts]
    name = {False: "diffusion", True: "diffusion + DualCache"}
    rows = [diffusion_row(name[dual] + (" (app default)" if dual == dual_default else ""), diff[dual], ar,
                          exact=None if not dual else diff[False]) for dual in (dual_default, not dual_default)]
    sample = {"prompt": texts[0], "ar": model.decode(ar[0].ids), "diffusion": model.decode(diff[dual_default][0].ids)}
    return {"rows": rows, "sample": sample, "ar_tokens": sum(d.stats["tokens"] for d in ar),
            "other_head_same_as_ar": sum(a.ids == b.ids for a, b in zip(twin_ar, ar)) / len(ar)}


def single_step_costs(model, knobs: dict, repeats: int, position: int = 128, sampling: dict | None = None) -> dict:
    """ms (the fastest of `repeats`; robust on a shared machine) of the pieces the decoders run, at a
    given context length: one AR token (a 1-row forward + Sampler.token); one full-block step (all B slots
    as queries, logits of a sub-block's rows, greedy sampling over them: every step of the exact decoder
    under block attention, the first step of each sub-block under DualCache); one sub-block step (S + 1
    slots against the block's scratch K/V: DualCache's other steps; causal attention's other steps run S);
    each with its forward alone. With `sampling` (the model's own sampling defaults, which the app starts from,
    when they are not greedy) the same three again, drawn with those settings ("ar_sampled", ...)."""
    import time

    import numpy as np

    from bitnet_app.decode.sampling import Sampler

    B, S, attention, mask = knobs["block_size"], knobs["sub_block_size"], knobs["attention"], knobs["mask_id"]
    eng = model.engine
    sampler = Sampler(banned_ids=[mask], greedy_kernel=eng.greedy_rows)  # as Model.generate builds it
    ids = [int(i) for i in np.random.default_rng(0).integers(0, min(model.vocab_size, 1000), position + B)]
    eng.reset()
    eng.forward(ids[:position])
    block = ids[position:position + 1] + [mask] * (B - 1)
    rows = list(range(S - 1))  # the masked slots 1 .. S-1 of the first sub-block, by token shift
    fw = dict(attention=attention, block_size=B, commit=False)
    pieces = {  # the decoders' calls: see decode/diffusion.py _Run.query_span
        "ar": lambda: eng.forward(ids[position:position + 1], start=position, commit=False),
        "block": lambda: eng.forward(block, start=position, rows=rows, **fw),
        "sub_block": lambda: eng.forward(block[S - 1:2 * S], start=position + S - 1, kv_end=position + B,
                                    rows=range(S), **fw),  # the second sub-block's slots S-1 .. 2S-1
    }
    if S >= B:  # one sub-block is the whole block: every step is a full-block step
        del pieces["sub_block"]
    samplers = {"ar": sampler.token, "block": sampler, "sub_block": sampler}
    if sampling and sampling.get("temperature", 0.0) > 0:  # as Model.generate builds it for these settings
        drawn = Sampler(**sampling, seed=0, banned_ids=[mask], greedy_kernel=eng.greedy_rows,
                        sample_kernel=eng.sample_rows)
        for name in list(pieces):
            pieces[name + "_sampled"] = pieces[name]
            samplers[name + "_sampled"] = drawn.token if name == "ar" else drawn
    out = {}
    for name, forward in pieces.items():
        forward()  # warm-up (and the scratch K/V the DualCache step reads)
        alone, whole = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            logits = forward()
            t1 = time.perf_counter()
            samplers[name](logits[0] if name.startswith("ar") else logits)
            t2 = time.perf_counter()
            alone.append(t1 - t0)
            whole.append(t2 - t0)
        out[name] = {"forward_ms": 1e3 * min(alone), "with_sampling_ms": 1e3 * min(whole)}
    eng.reset()
    for name in ("block", "sub_block", "block_sampled", "sub_block_sampled"):
        if name in out:
            ar = out["ar_sampled" if name.endswith("_sampled") else "ar"]
            out[name]["over_ar"] = out[name]["with_sampling_ms"] / ar["with_sampling_ms"]
    return out


def print_report(header: str, results: dict) -> None:
    print(header)
    for set_name, res in results.items():
        rows = res["rows"]
        r0 = rows[0]
        print(f"\n{set_name}: {r0['prompts']} prompts, AR {res['ar_tokens']} tokens at {r0['ar_tok_s']:.1f} tok/s "
              f"({r0['ar_token_ms']:.3f} ms per AR token, engine {r0['ar_token_forward_ms']:.3f}); AR with the other "
              f"LM head gives the same whole reply on {100 * res['other_head_same_as_ar']:.0f}% of them\n")
        print("| setting | tokens / step | tokens / forward | drafts kept | reply = AR | reply = exact decoder | tok/s "
              "| vs AR | step ms (forward + sampling + other) | step / AR token | commits ms per step "
              "| break-even tokens / step |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            exact = f"{100 * r['same_as_exact']:.0f}%" if "same_as_exact" in r else "(is the exact decoder)"
            print(f"| {r['setting']} | {r['tokens_per_step']:.2f} | {r['tokens_per_forward']:.2f} "
                  f"| {100 * r['kept_share']:.0f}% of {r['drafted']} | {100 * r['same_as_ar']:.0f}% | {exact} | {r['tok_s']:.1f} | {r['vs_ar']:.2f}x "
                  f"| {r['step_ms']:.3f} ({r['step_forward_ms']:.3f} + {r['step_sampling_ms']:.3f} + "
                  f"{r['step_other_ms']:.3f}) | {r['step_over_ar_token']:.2f} | {r['commits_per_step_ms']:.3f} "
                  f"| {r['break_even_tokens_per_step']:.2f} |")
        s = res["sample"]
        print(f"\nsample: {s['prompt']!r}\n  AR:        {s['ar']!r}\n  diffusion: {s['diffusion']!r}")


def print_single_steps(costs: dict, knobs: dict, sampling: dict | None = None) -> None:
    B, S = knobs["block_size"], knobs["sub_block_size"]
    for suffix, how in (("", "greedy"), ("_sampled", f"the model's own sampling {sampling}")):
        if "ar" + suffix not in costs:
            continue
        print(f"\nsingle steps at position 128 (fastest of the runs, ms; forward alone / with {how}):")
        print(f"  AR token (1 row):                        {costs['ar' + suffix]['forward_ms']:.3f} / "
              f"{costs['ar' + suffix]['with_sampling_ms']:.3f}")
        for name, what in (("block", f"full block, {B} query slots, {S - 1} logit rows"),
                           ("sub_block", f"sub-block, {S + 1} query slots, {S} logit rows")):
            if name + suffix not in costs:
                continue
            c = costs[name + suffix]
            print(f"  diffusion step ({what}): {c['forward_ms']:.3f} / {c['with_sampling_ms']:.3f} = "
                  f"{c['over_ar']:.2f}x an AR token")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="engine file, checkpoint folder, or 'demo' (the bundled model)")
    ap.add_argument("--prompts-file", default=DEFAULT_PROMPTS, help='JSON {"skills": [...], "open": [...]}')
    ap.add_argument("--limit", type=int, help="the first N prompts of each set")
    ap.add_argument("--max-new-tokens", type=int, help="default: the app's (DecodeParams)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per reply; the fastest counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lm-head", default="int8", choices=("int8", "exact"))
    ap.add_argument("--attention", choices=("block", "causal"), help="default: the checkpoint's")
    ap.add_argument("--fill-rule", choices=("exact", "threshold"),
                    help="default: the app's (exact under causal attention, threshold under block attention)")
    ap.add_argument("--threshold", type=float,
                    help="default: the app's for the fill rule (bitnet_app.params.default_threshold)")
    ap.add_argument("--sub-block", type=int, help="sub-block size; default: the app's for this checkpoint")
    ap.add_argument("--sampled", action="store_true",
                    help="the model's own sampling (seeded), as the app starts, instead of greedy decoding")
    ap.add_argument("--steps-only", action="store_true", help="only the single-step costs (no replies)")
    ap.add_argument("--json", help="write the figures here")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    import bitnet_app
    from bitnet_app.params import KNOBS

    model = bitnet_app.load_model(args.model, threads=args.threads, lm_head=args.lm_head)
    sets = {} if args.steps_only else load_prompts(args.prompts_file, args.limit)
    knobs = {**model.diffusion_defaults, **({"attention": args.attention} if args.attention else {})}
    diffusion = {"attention": args.attention, "fill_rule": args.fill_rule, "threshold": args.threshold}
    resolved = model.decode_params(mode="diffusion", **diffusion)  # what the runs use
    knobs["fill_rule"], knobs["threshold"] = resolved.fill_rule, resolved.threshold
    dual_default = KNOBS["dual_cache"].default
    sampling = model.generation_defaults  # what the app's sampler starts from for this model
    common = {**sampling, "seed": 1} if args.sampled else {"temperature": 0.0}
    if args.sub_block:
        knobs["sub_block_size"] = common["sub_block_size"] = args.sub_block
    if args.max_new_tokens:
        common["max_new_tokens"] = args.max_new_tokens
    max_new = common.get("max_new_tokens", KNOBS["max_new_tokens"].default)
    fastest(model, model.chat_ids([{"role": "user", "content": "Hello"}]), 1, mode="diffusion", **common)  # warm-up

    costs = single_step_costs(model, knobs, repeats=max(args.repeats, 20), sampling=sampling)
    results = {}
    if not args.steps_only:
        other = "exact" if args.lm_head == "int8" else "int8"
        twin = bitnet_app.load_model(args.model, threads=args.threads, lm_head=other)
        results = {name: run_set(model, twin, texts, args.repeats, common, dual_default, diffusion)
                   for name, texts in sets.items()}
        twin.close()
    info = model.info()
    header = (f"model {args.model}: {info['parameters'] / 1e6:.1f} M parameters, context {info['context']}, "
              f"{info['isa']}, {info['threads']} threads, {args.lm_head} head; "
              f"{f'sampled {sampling}, seed 1' if args.sampled else 'greedy'}, block {knobs['block_size']}, "
              f"sub-block {knobs['sub_block_size']}, threshold {knobs['threshold']}, attention {knobs['attention']}, "
              f"fill rule {knobs['fill_rule']}, "
              f"DualCache {'on' if dual_default else 'off'} by default, max {max_new} new tokens")
    header += "" if args.steps_only else f"; fastest of {args.repeats} runs per reply"
    print_report(header, results)
    print_single_steps(costs, knobs, sampling)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": header, "knobs": knobs, "results": results, "single_steps": costs}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
