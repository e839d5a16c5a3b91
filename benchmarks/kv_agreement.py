"""The int8 KV cache against fp16: top-1 agreement, logit error and greedy text, on the demo model's held-out
prompts (the generated model families: tests/test_kv_int8.py measures them, `pytest -s` prints the figures).

    python -m benchmarks.kv_agreement [--model assets/demo-model] [--prompts-file assets/demo-prompts.json]
        [--limit N] [--max-new-tokens 48] [--threads 2] [--json out.json]

Per prompt (the chat template applied, as the app does): the fp16 engine's greedy reply, then
  teacher-forced logits: one causal forward of prompt + that reply under each cache, every position compared:
    top1     the share of positions whose argmax is the same
    err      max |logit difference| / max |fp16 logit| per position: its median and its maximum
  greedy     the int8 engine's own greedy reply: identical to fp16's, or the index of the first other token.
Beside it, as a calibration, the fp32 cache against fp16 (another rounding of the same cache: how often such a
change alone flips a near-tie of the greedy reply).
The int8 head is used throughout (the app's default), and the fp16 cache is the reference because it is the default
one (the fp32 cache is within fp16's rounding of it).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from bitnet_app.model import Model

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def compare(ref: Model, alt: Model, ids: list[int], max_new: int) -> dict:
    """{top1, err_median, err_max, greedy_same, first_diff} of `alt` against `ref` on one prompt."""
    ref_reply = ref.complete(ids, max_new_tokens=max_new)
    seq = list(ids) + list(ref_reply)
    a, b = ref.logits(seq), alt.logits(seq)
    err = np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)
    reply = alt.complete(ids, max_new_tokens=max_new)
    first = next((i for i, (x, y) in enumerate(zip(reply, ref_reply)) if x != y),
                 None if len(reply) == len(ref_reply) else min(len(reply), len(ref_reply)))
    return {"positions": len(seq), "top1": float(np.mean(a.argmax(1) == b.argmax(1))),
            "err_median": float(np.median(err)), "err_max": float(err.max()),
            "greedy_same": first is None, "first_diff": first}


def summarize(rows: list[dict]) -> dict:
    return {"prompts": len(rows), "positions": sum(r["positions"] for r in rows),
            "top1": float(np.average([r["top1"] for r in rows], weights=[r["positions"] for r in rows])),
            "err_median": float(np.median([r["err_median"] for r in rows])),
            "err_max": float(max(r["err_max"] for r in rows)),
            "greedy_same": sum(r["greedy_same"] for r in rows) / len(rows)}


def open_all(path: str, threads: int) -> dict:
    return {kv: Model.open(path, kv=kv, threads=threads) for kv in ("f16", "i8", "f32")}


def both(models: dict, ids: list[int], max_new: int) -> dict:
    """i8 against f16, and (calibration: what another rounding of the same cache does) f32 against f16."""
    return {"i8": compare(models["f16"], models["i8"], ids, max_new),
            "f32": compare(models["f16"], models["f32"], ids, max_new)}


def summarize_both(rows: list[dict]) -> dict:
    return {kv: {"summary": summarize([r[kv] for r in rows]), "rows": [r[kv] for r in rows]} for kv in ("i8", "f32")}


def demo_rows(model_src: str, prompts_file: str, limit: int, max_new: int, threads: int) -> dict:
    from bitnet_app.source import engine_file_for
    models = open_all(engine_file_for(model_src), threads)
    with open(prompts_file) as f:
        prompts = json.load(f)
    return {name: summarize_both([both(models, models["f16"].chat_ids([{"role": "user", "content": t}]), max_new)
                                  for t in texts[:limit]])
            for name, texts in prompts.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(REPO, "assets", "demo-model"))
    ap.add_argument("--prompts-file", default=os.path.join(REPO, "assets", "demo-prompts.json"))
    ap.add_argument("--limit", type=int, default=12, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    result = {"demo": demo_rows(args.model, args.prompts_file, args.limit, args.max_new_tokens, args.threads)}
    for group, sets in result.items():
        for name, r in sets.items():
            for kv in ("i8", "f32"):
                s = r[kv]["summary"]
                print(f"{group:9s} {name:10s} {kv} vs f16: prompts {s['prompts']:3d} positions {s['positions']:5d}  "
                      f"top-1 {s['top1']:.4f}  err median {s['err_median']:.2e} max {s['err_max']:.2e}  greedy "
                      f"same {s['greedy_same']:.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
