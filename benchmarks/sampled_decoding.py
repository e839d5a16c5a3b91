"""Whole replies, greedy and sampled, AR and block diffusion: tokens per second as the app decodes them.

    python -m benchmarks.sampled_decoding [--model demo] [--prompts-file assets/demo-prompts.json] [--limit 16]
        [--threads 2] [--isa ISA] [--max-new-tokens 256] [--json out.json]

For each mode (ar, diffusion) and setting (greedy: temperature 0; sampled: temperature 0.7, top-p 0.9, seed 1,
the demo model's own generation_config), the first --limit "skills" prompts of the prompts file, each one user
message through the chat template, decoded once; prints one line per mode and setting: tokens, tokens/s
(all tokens over the decoders' own total_s) and, for diffusion, ms per denoising step. To compare two builds
run it once per build with PYTHONPATH set to each checkout, alternating (the machine's speed drifts). Raw
outputs of such runs: benchmarks/results/text/2026-11-25-sampled-decoding-demo-ab*.txt (HISTORY.md, "Random
draws in C").
"""
import argparse
import json

from benchmarks.diffusion_vs_ar import DEFAULT_PROMPTS, load_prompts

SETTINGS = (dict(temperature=0.0), dict(temperature=0.7, top_p=0.9, seed=1))


def measure(model, prompts: list[str], mode: str, max_new_tokens: int, **sampling) -> dict:
    """tokens, total_s, steps and step_s summed over one reply per prompt."""
    from bitnet_app.decode.events import Done

    out = {"tokens": 0, "total_s": 0.0, "steps": 0, "step_s": 0.0}
    for prompt in prompts:
        ids = model.chat_ids([{"role": "user", "content": prompt}])
        for ev in model.generate(ids, mode=mode, max_new_tokens=max_new_tokens, **sampling):
            if isinstance(ev, Done):
                for key in out:
                    out[key] += ev.stats.get(key, 0)
    return out


def main(argv=None) -> int:
    import bitnet_app

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo", help="engine file, checkpoint folder, or 'demo' (the bundled model)")
    ap.add_argument("--prompts-file", default=DEFAULT_PROMPTS, help='JSON {"skills": [...], "open": [...]}')
    ap.add_argument("--limit", type=int, default=16, help="the first N skills prompts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", help="force a kernel path")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--json", help="also write every figure here")
    a = ap.parse_args(argv)

    model = bitnet_app.load_model(a.model, threads=a.threads, isa=a.isa)
    prompts = load_prompts(a.prompts_file, a.limit)["skills"]
    figures = []
    for mode in ("ar", "diffusion"):
        for sampling in SETTINGS:
            r = measure(model, prompts, mode, a.max_new_tokens, **sampling)
            step = f", step {1e3 * r['step_s'] / r['steps']:.3f} ms" if r["steps"] else ""
            print(f"{mode:9s} {sampling}: {r['tokens']} tokens, {r['tokens'] / r['total_s']:.0f} tok/s{step}", flush=True)
            figures.append(dict(r, mode=mode, sampling=sampling))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"model": a.model, "prompts": len(prompts), "results": figures}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
