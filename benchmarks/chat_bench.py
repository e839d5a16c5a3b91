"""What a chat feels like: decode deep into a conversation, time to first token, and the bytes behind each.

    python -m benchmarks.chat_bench [--synthetic 2b4t | --model M] [--threads 2] [--isa avx512]
        [--packing 2bit,1.6bit] [--kv f16,i8] [--positions 64,1000,2000,4000] [--tokens 16] [--prompt 1000]
        [--rounds 3] [--json out.json]

For every ternary packing (with --synthetic: a random file of that shape and packing, kept in the cache; with
--model: the file as it is) and every KV cache type, per round and in turn (so a drift of the machine hits every
configuration alike; the figure is the median over the rounds):
  decode at position p   the cache filled (prefill in pieces of 512, no logits, once to the largest position, then
                         cut back to each p, largest first), then --tokens committed single-token forwards from p
                         on: tok/s. Beside it the bytes that token reads,
                         weights + p x (K/V bytes per position), and the share of the roof it reaches:
                         tok/s x bytes / roof. The roof is the read roof of the same threads (bitnet_app/machine.py),
                         measured before and after every configuration: its median over the run counts.
  ttft                   one forward of a --prompt-token prompt from an empty cache asking for the last row's logits
                         (what the first token of a reply waits for), ms.
  bytes                  per format: the weights one decode token streams (every ternary tile and the int8 head,
                         bitnet_app/bench.py bytes_per_token) and the K/V bytes one position adds to each token
                         (2 x layers x KV heads x head_dim x element size, + two float scales a row for int8).
Decode tokens attend to every earlier position, so a token at position p costs (weights + p x K/V) / roof at best;
"share" says how far from that a configuration is. Run on a quiet machine for figures; on a busy one, compare
configurations within a round.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics

import numpy as np

from bitnet_app.bench import bytes_per_token, synthetic_file
from bitnet_app.engine import Engine, EngineFile
from bitnet_app.machine import read_roof_gb_s
from benchmarks.timing import seconds

FILL_PIECE = 512
KV_ELEM_BYTES = {"f32": 4, "f16": 2, "i8": 1}


def kv_bytes_per_position(cfg: dict, kv: str) -> int:
    """K/V bytes one position adds to a decode token's reads: K and V rows of every layer and KV head."""
    rows = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"]
    return rows * (cfg["head_dim"] * KV_ELEM_BYTES[kv] + (4 if kv == "i8" else 0))


def fill(eng: Engine, ids, p: int) -> None:
    eng.reset()
    for s in range(0, p, FILL_PIECE):
        eng.forward(ids[s:min(p, s + FILL_PIECE)], rows=[])


def decode_tok_s(eng: Engine, ids, p: int, tokens: int) -> float:
    """tok/s of `tokens` committed decode steps from position p; the cache holds ids[:p] (or more: cut to p)."""
    eng.truncate(p)
    eng.forward(ids[p:p + 1])  # warm: the first token after a fill pays for page faults of new cache rows
    eng.truncate(p)

    def decode():
        for i in range(tokens):
            eng.forward(ids[p + i:p + i + 1])
    return tokens / seconds(decode)


def ttft_ms(eng: Engine, ids, n: int) -> float:
    eng.reset()
    return 1e3 * seconds(lambda: eng.forward(ids[:n]))


def measure(path: str, kv: str, args, roofs: list) -> dict:
    """One round of one configuration: {position: tok/s}, ttft."""
    roofs.append(read_roof_gb_s(args.threads))
    eng = Engine(EngineFile(path), threads=args.threads, isa=args.isa, kv=kv)
    need = max(args.positions) + args.tokens + 1
    if eng.ctx < max(need, args.prompt):
        raise ValueError(f"the model's context ({eng.ctx}) is shorter than the benchmark needs ({need})")
    ids = np.random.default_rng(0).integers(0, eng.vocab_size, size=max(need, args.prompt))
    fill(eng, ids, max(args.positions))  # once: each position below is the cache cut back (largest first)
    decode = {p: decode_tok_s(eng, ids, p, args.tokens) for p in sorted(args.positions, reverse=True)}
    out = {"decode": {p: decode[p] for p in args.positions}, "ttft_ms": ttft_ms(eng, ids, args.prompt),
           "isa": eng.isa, "threads": eng.threads}
    del eng
    roofs.append(read_roof_gb_s(args.threads))
    return out


@contextlib.contextmanager
def model_files(args):
    """{packing: engine file path}: synthetic files of each packing, or the one model file given."""
    if args.model:
        from bitnet_app.source import engine_file_for
        path = engine_file_for(args.model)
        yield {EngineFile(path).packing: path}
        return
    with contextlib.ExitStack() as stack:
        yield {p: stack.enter_context(synthetic_file(args.synthetic, keep=True, layout=p)) for p in args.packing}


def run(args) -> dict:
    roofs: list[float] = []
    rounds: dict = {}
    with model_files(args) as files:
        for _ in range(args.rounds):
            for packing, path in files.items():
                for kv in args.kv:
                    rounds.setdefault((packing, kv), []).append(measure(path, kv, args, roofs))
        formats = {}
        for packing, path in files.items():
            ef = EngineFile(path)
            formats[packing] = {"weights_bytes": bytes_per_token(ef, "int8"),
                                "kv_bytes_per_position": {kv: kv_bytes_per_position(ef.config, kv) for kv in args.kv}}
    roof = statistics.median(roofs)
    result = {"roof_gb_s": roof, "roofs_gb_s": roofs, "formats": formats, "configs": []}
    for (packing, kv), runs in rounds.items():
        w, per_pos = formats[packing]["weights_bytes"], formats[packing]["kv_bytes_per_position"][kv]
        decode = {}
        for p in args.positions:
            tok_s = statistics.median(r["decode"][p] for r in runs)
            bytes_p = w + p * per_pos
            decode[p] = {"tok_s": tok_s, "tok_s_rounds": [r["decode"][p] for r in runs], "bytes": bytes_p,
                         "roof_tok_s": roof * 1e9 / bytes_p, "share_of_roof": tok_s * bytes_p / (roof * 1e9)}
        result["configs"].append({"packing": packing, "kv": kv, "isa": runs[0]["isa"], "threads": runs[0]["threads"],
                                  "decode": decode, "ttft_ms": statistics.median(r["ttft_ms"] for r in runs),
                                  "ttft_ms_rounds": [r["ttft_ms"] for r in runs]})
    return result


def report(r: dict, prompt: int) -> str:
    lines = [f"read roof {r['roof_gb_s']:.1f} GB/s (median of {len(r['roofs_gb_s'])} readings "
             f"{min(r['roofs_gb_s']):.1f}..{max(r['roofs_gb_s']):.1f})"]
    for packing, f in r["formats"].items():
        kvs = ", ".join(f"{kv} {b / 1e3:.1f} KB" for kv, b in f["kv_bytes_per_position"].items())
        lines.append(f"{packing}: weights {f['weights_bytes'] / 1e6:.1f} MB per token; K/V per position: {kvs}")
    for c in r["configs"]:
        cells = "  ".join(f"p{p} {d['tok_s']:6.2f} tok/s ({d['bytes'] / 1e6:.0f} MB, {d['share_of_roof']:.0%})"
                          for p, d in c["decode"].items())
        lines.append(f"{c['packing']:6s} kv {c['kv']} [{c['isa']}, {c['threads']} threads]: {cells}  "
                     f"ttft({prompt}) {c['ttft_ms']:.0f} ms")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--synthetic", default="2b4t", help="a shape of bitnet_app/checkpoint/synthetic.py")
    src.add_argument("--model", help="an engine file, checkpoint folder, Hub repo id or 'demo' (its own packing)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", help="force a kernel path (bitnet_app/engine/kernel_paths.py)")
    ap.add_argument("--packing", default="2bit,1.6bit", type=lambda s: s.split(","))
    ap.add_argument("--kv", default="f16,i8", type=lambda s: s.split(","))
    ap.add_argument("--positions", default="64,1000,2000,4000", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens timed at each position")
    ap.add_argument("--prompt", type=int, default=1000, help="prompt tokens of the time-to-first-token figure")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    r = run(args)
    print(report(r, args.prompt))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(r, args=vars(args)), f, indent=1)


if __name__ == "__main__":
    main()
