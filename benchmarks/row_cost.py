"""What bounds exact block diffusion against AR on this machine: the cost of a forward's extra rows, and how many
rows a token of the reply takes.

    python -m benchmarks.row_cost [--model demo] [--shapes d384,d256,d192,d128] [--rows 1,8,15,16,30]
        [--rounds 8] [--iters 50] [--threads 2] [--prompts-file assets/demo-prompts.json] [--json out.json]

1. Forward cost per row count. For the model and for random engine files of demo-like shapes (vocab 4096,
   512 positions, head size 64; SHAPES below), R-row forwards as a denoising step runs them: causal, uncommitted,
   at position --pos after a committed prefix, the logits of every row. Each round times every R in turn (a drift
   of the machine hits all alike); the fastest round counts. Reported: ms, the multiple of a 1-row forward (an AR
   token), and the marginal cost of a row, (c(R) - c(1)) / (R - 1) / c(1).
2. Rows per token. The model's skill prompts decoded greedily with the app's diffusion settings, every engine
   call counted: rows per denoising step, per block commit, per token.
3. The bound. A forward of R rows costs at least 1 + (R - 1) m one-row forwards (AR tokens), m the cheapest
   marginal row measured. A step runs r rows and keeps k tokens, and c commits of rc rows follow each step, so
   diffusion is at most k / (1 + (r - 1) m + c (1 + (rc - 1) m)) times as fast as AR, before sampling and Python;
   and it reaches x times AR only if m <= (k / x - 1 - c) / (r - 1 + c (rc - 1)).
"""
import argparse
import json
import os
import tempfile

import numpy as np

from benchmarks.diffusion_vs_ar import DEFAULT_PROMPTS, load_prompts
from benchmarks.timing import per_call

# Demo-like shapes: (hidden, intermediate, layers, query heads, KV heads), head size 64, vocab 4096.
SHAPES = {
    "d384": (384, 1024, 8, 6, 2),  # the phase-6 demo model's shape (14.2 M parameters)
    "d256": (256, 768, 8, 4, 2),
    "d192": (192, 512, 6, 3, 1),   # the phase-1..5 demo models' hidden size and depth
    "d128": (128, 384, 6, 2, 1),
}


def shape_file(name: str, folder: str) -> str:
    """A random engine file of one of SHAPES in the tiles this CPU's converter writes (written once into folder)."""
    from bitnet_app.checkpoint.presets import _shape
    from bitnet_app.checkpoint.synthetic import write_synthetic_engine_file
    from bitnet_app.engine.kernel_paths import preferred_packing

    path = os.path.join(folder, f"row-cost-{name}-{preferred_packing()}.bitnet")
    if not os.path.exists(path):
        D, I, L, H, KV = SHAPES[name]
        shape = _shape("bitnet", hidden_size=D, intermediate_size=I, num_hidden_layers=L, num_attention_heads=H,
                       num_key_value_heads=KV, head_dim=64, vocab_size=4096, max_position_embeddings=512,
                       bos=1, eos=2, eot=3)
        write_synthetic_engine_file(path, shape)
    return path


def forward_costs(engine, rows: list[int], pos: int, rounds: int, iters: int) -> dict[int, float]:
    """{R: ms} of an R-row causal uncommitted forward at `pos` asking every row's logits; fastest round."""
    rng = np.random.default_rng(0)
    top = min(engine.vocab_size, 4000)
    engine.reset()
    engine.forward(rng.integers(0, top, pos).tolist(), rows=[pos - 1])
    batches = {R: rng.integers(0, top, R).tolist() for R in rows}
    best = {R: float("inf") for R in rows}
    for _ in range(rounds):
        for R in rows:
            step = per_call(lambda: engine.forward(batches[R], start=pos, commit=False, attention="causal",
                                                   rows=range(R)), iters)
            best[R] = min(best[R], step)
    engine.reset()
    return {R: 1e3 * s for R, s in best.items()}


def cost_table(costs: dict[int, float]) -> dict:
    """ms, multiple of one row, and marginal cost of a row (in one-row forwards) per R."""
    one = costs[1]
    return {R: {"ms": ms, "over_one_row": ms / one, "marginal": (ms - one) / (R - 1) / one if R > 1 else None}
            for R, ms in costs.items()}


class _RowCounter:
    """Stands in for a model's engine: forwards go to the real one; counts the rows of denoising steps (uncommitted)
    and of block commits (committed, after a reply's first step: a committed call before it is the prompt's prefill).
    (benchmarks.step_replay.Recorder keeps every call's logits too: too much memory for a whole prompt set.)"""

    def __init__(self, engine):
        self.engine = engine
        self.steps = self.step_rows = self.commits = self.commit_rows = 0
        self.stepped = False  # the reply under way has run a step

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def reset(self):  # a reply starts (and ends) with a reset of the cache
        self.stepped = False
        self.engine.reset()

    def forward(self, tokens, **kw):
        if not kw.get("commit", True):
            self.steps += 1
            self.step_rows += len(tokens)
            self.stepped = True
        elif self.stepped:
            self.commits += 1
            self.commit_rows += len(tokens)
        return self.engine.forward(tokens, **kw)


def rows_per_token(model, texts: list[str]) -> dict:
    """Engine rows of greedy exact diffusion (the app's settings) on the prompts: per step, per commit, per token."""
    real, counter, tokens = model.engine, _RowCounter(model.engine), 0
    model.engine = counter
    try:
        for text in texts:
            done = list(model.generate(model.chat_ids([{"role": "user", "content": text}]), mode="diffusion",
                                       temperature=0))[-1]
            tokens += done.stats["tokens"]
    finally:
        model.engine = real
    c = counter
    return {"tokens": tokens, "steps": c.steps, "commits": c.commits, "rows_per_step": c.step_rows / c.steps,
            "rows_per_commit": c.commit_rows / max(c.commits, 1), "tokens_per_step": tokens / c.steps,
            "rows_per_token": (c.step_rows + c.commit_rows) / tokens}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="engine file, checkpoint folder, or 'demo' (the bundled model)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="random demo-like shapes to time beside it ('' none)")
    ap.add_argument("--rows", default="1,8,15,16,30")
    ap.add_argument("--pos", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts-file", default=DEFAULT_PROMPTS)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import bitnet_app

    rows = sorted({1, *(int(r) for r in args.rows.split(","))})
    model = bitnet_app.load_model(args.model, threads=args.threads)
    out = {"model": args.model, "isa": model.info()["isa"], "threads": args.threads, "pos": args.pos, "costs": {}}
    out["costs"][args.model] = cost_table(forward_costs(model.engine, rows, args.pos, args.rounds, args.iters))
    folder = os.path.join(tempfile.gettempdir(), "bitnet-row-cost")
    os.makedirs(folder, exist_ok=True)
    for name in filter(None, args.shapes.split(",")):
        shaped = bitnet_app.load_model(shape_file(name, folder), threads=args.threads)
        out["costs"][name] = cost_table(forward_costs(shaped.engine, rows, args.pos, args.rounds, args.iters))
    print(f"{out['isa']}, {args.threads} threads, causal R-row forwards at position {args.pos}, every row's logits:")
    print("| model | " + " | ".join(f"R={R}" for R in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for name, table in out["costs"].items():
        cells = [f"{t['ms']:.3f} ms" + (f" = {t['over_one_row']:.2f}x, row {t['marginal']:.2f}" if R > 1 else "")
                 for R, t in table.items()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    texts = load_prompts(args.prompts_file, None)["skills"]
    out["rows"] = use = rows_per_token(model, texts)
    print(f"exact diffusion, app settings, {len(texts)} skill prompts: {use['tokens_per_step']:.2f} tokens and "
          f"{use['rows_per_step']:.1f} rows per step, {use['rows_per_commit']:.1f} rows per commit "
          f"({use['commits'] / use['steps']:.2f} commits per step): {use['rows_per_token']:.2f} rows per token")
    k, r, c, rc = use["tokens_per_step"], use["rows_per_step"], use["commits"] / use["steps"], use["rows_per_commit"]
    need = (k / 1.4 - 1 - c) / (r - 1 + c * (rc - 1))
    out["bound"] = {}
    for name, table in out["costs"].items():
        m = min(t["marginal"] for t in table.values() if t["marginal"] is not None)
        most = k / (1 + (r - 1) * m + c * (1 + (rc - 1) * m))
        out["bound"][name] = {"cheapest_marginal_row": m, "at_most_x_ar": most, "row_for_1_4x": need}
        print(f"{name}: cheapest marginal row {m:.2f} of a 1-row forward: diffusion at most {most:.2f}x AR; "
              f"1.4x needs a row at most {need:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
