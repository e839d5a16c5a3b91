"""Diffusion against AR as a sum of parts, each timed at its fastest: a figure that a machine shared with other jobs
cannot spoil as it spoils whole replies.

    python -m benchmarks.step_replay [--model demo] [--prompts-file assets/demo-prompts.json] [--set skills]
        [--limit 20] [--repeats 15] [--threads 2] [--max-new-tokens N] [--threshold T] [--sub-block N]

Each reply (greedy, the app's settings; --threshold and --sub-block override the app's) is decoded once, AR and
block diffusion, while every engine forward is recorded: how many tokens, where, which logit rows, how far the keys
reach, and the logits it returned. Then, per mode:
  engine   every recorded forward again on its own, --repeats times, the fastest counted (Engine.forward with its
           argument checks; uncommitted, on a cache of random ids: the time of a forward does not depend on the ids)
  python   the decoder replayed against the recorded logits (every forward answers at once, so the decoder takes the
           same decisions), the fastest of --repeats: sampling (on the engine's threads), the fill rule, events and
           the detokenizer
The sum of the two, per token, is the mode's cost; their ratio is the speed of diffusion against AR. Both are
optimistic: in a real decode the Python between forwards evicts part of the engine's caches. So compare ratios, and
take benchmarks.diffusion_vs_ar on a quiet machine as the authority.
"""
import argparse

import numpy as np

from benchmarks.diffusion_vs_ar import DEFAULT_PROMPTS, load_prompts
from benchmarks.timing import best_per_call


class Recorder:
    """Stands in for a model's engine: forwards go to the real one and are recorded with their logits."""

    def __init__(self, engine):
        self.engine, self.calls, self.logits = engine, [], []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward(self, tokens, **kw):
        start = self.engine.n_past if kw.get("start") is None else kw["start"]
        out = self.engine.forward(tokens, **kw)
        self.calls.append((len(tokens), start, kw.get("rows"), kw.get("kv_end")))
        self.logits.append(out)
        return out


class Replay:
    """Stands in for a model's engine: forwards answer with recorded logits, in order; the cache is left alone."""

    def __init__(self, engine, logits):
        self.engine, self.logits, self.next = engine, logits, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward(self, tokens, **kw):
        self.next += 1
        return self.logits[self.next - 1]

    def reset(self):
        pass

    def truncate(self, n):
        pass

    def keep_scratch(self, end):
        pass


def engine_seconds(engine, calls, repeats: int, cache: dict) -> float:
    """The fastest time of each recorded forward, run alone (uncommitted, after position 0), summed."""
    ids = [int(i) for i in np.random.default_rng(0).integers(5, engine.vocab_size - 1, engine.ctx)]
    total = 0.0
    for n, start, rows, kv_end in calls:
        start = max(start, 1)  # position 0 stays committed, so every forward may be an uncommitted one
        key = (n, start, None if rows is None else tuple(rows), kv_end)
        if key not in cache:
            tokens = ids[start:start + n]
            cache[key] = best_per_call(lambda: engine.forward(tokens, start=start, commit=False, rows=rows,
                                                              kv_end=kv_end), 1, repeats)
        total += cache[key]
    return total


def measure(model, prompts, repeats: int, knobs: dict, common: dict) -> dict:
    """{mode: {tokens, steps, forwards, engine_s, python_s}} for greedy AR and diffusion on the prompts (knobs: the
    diffusion settings to override; common: those of both modes)."""
    real, figures = model.engine, {}
    for mode in ("ar", "diffusion"):
        params = dict(mode=mode, temperature=0, **common, **(knobs if mode == "diffusion" else {}))
        model.engine = recorder = Recorder(real)
        try:
            dones = [list(model.generate(p, **params))[-1] for p in prompts]
        finally:
            model.engine = real
        figures[mode] = {"tokens": sum(d.stats["tokens"] for d in dones), "forwards": len(recorder.calls),
                         "steps": sum(d.stats.get("steps", 0) for d in dones), "calls": recorder.calls,
                         "logits": recorder.logits}
    real.reset()
    real.forward([0])  # position 0 committed; the timed forwards write scratch K/V after it
    cache = {}
    for mode, f in figures.items():
        f["engine_s"] = engine_seconds(real, f.pop("calls"), repeats, cache)
        replay = Replay(real, f.pop("logits"))
        params = dict(mode=mode, temperature=0, **common, **(knobs if mode == "diffusion" else {}))

        def decode_all():
            replay.next = 0
            for p in prompts:
                list(model.generate(p, **params))
            if replay.next != len(replay.logits):  # greedy decoding on the same logits takes the same decisions
                raise RuntimeError(f"the replay asked {replay.next} forwards, the recorded run {len(replay.logits)}")

        model.engine = replay
        try:
            f["python_s"] = best_per_call(decode_all, 1, repeats)
        finally:
            model.engine = real
    return figures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="engine file, checkpoint folder, or 'demo' (the bundled model)")
    ap.add_argument("--prompts-file", default=DEFAULT_PROMPTS, help='JSON {"skills": [...], "open": [...]}')
    ap.add_argument("--set", default="skills", help="which prompt set of the file")
    ap.add_argument("--limit", type=int, default=20, help="the first N prompts of the set")
    ap.add_argument("--repeats", type=int, default=15, help="runs of each part; the fastest counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, help="default: the app's (DecodeParams)")
    ap.add_argument("--threshold", type=float, help="default: the app's for the fill rule")
    ap.add_argument("--sub-block", type=int, help="default: the checkpoint's")
    args = ap.parse_args(argv)

    import bitnet_app

    model = bitnet_app.load_model(args.model, threads=args.threads)
    texts = load_prompts(args.prompts_file, args.limit)[args.set]
    prompts = [model.chat_ids([{"role": "user", "content": t}]) for t in texts]
    knobs = {k: v for k, v in (("threshold", args.threshold), ("sub_block_size", args.sub_block)) if v is not None}
    common = {} if args.max_new_tokens is None else {"max_new_tokens": args.max_new_tokens}
    figures = measure(model, prompts, args.repeats, knobs, common)
    d = model.decode_params(mode="diffusion", **knobs)
    print(f"model {args.model}: {model.engine.isa}, {model.engine.threads} threads; {len(prompts)} {args.set} prompts; "
          f"diffusion: threshold {d.threshold}, sub-block {d.sub_block_size}, fill rule {d.fill_rule}; "
          f"fastest of {args.repeats}")
    per_token = {}
    for mode, f in figures.items():
        total = f["engine_s"] + f["python_s"]
        per_token[mode] = total / f["tokens"]
        line = (f"  {mode:9s} {f['tokens']} tokens, {f['forwards']} forwards: engine {1e3 * f['engine_s']:.1f} ms + "
                f"python {1e3 * f['python_s']:.1f} ms = {1e6 * per_token[mode]:.1f} us per token")
        if f["steps"]:
            line += (f"; {f['tokens'] / f['steps']:.2f} tokens per step, {1e6 * total / f['steps']:.1f} us per step "
                     f"(python {1e6 * f['python_s'] / f['steps']:.1f})")
        print(line)
    print(f"  diffusion / AR speed: {per_token['ar'] / per_token['diffusion']:.2f}x")


if __name__ == "__main__":
    main()
