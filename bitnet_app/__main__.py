"""Command line: python -m bitnet_app {convert, generate, bench}.

    python -m bitnet_app convert SRC --out DST
    python -m bitnet_app generate --model M --prompt TEXT [--mode ar|diffusion] [--max-new-tokens N]
                                  [--temperature T] [--seed S] [--top-k K] [--top-p P]
                                  [--repetition-penalty R] [--chat | --raw] [--system TEXT]
                                  [--lm-head int8|exact] [--threads N]
    python -m bitnet_app bench (--model M | --synthetic 2b4t) [--json] [--threads N] [--isa ISA]

M is an engine file, a checkpoint folder, a Hub repo id, or `demo`: the bundled demo model
(bitnet_app.demo). A Hub repo that cannot be downloaded because the Hub is out of reach (offline mode,
no network) falls back to the demo model with a one-line notice on stderr, when the demo model exists.

generate streams the reply to stdout and writes the stats to stderr. A user error (missing file,
bad checkpoint, prompt too long, no network...) prints one line to stderr and exits with status 2.
"""
import argparse
import json
import sys
import time


def _progress_printer(label: str):
    """A convert progress callback(fraction, message) that prints at most every half second."""
    last = [0.0]

    def report(frac, msg=""):
        now = time.monotonic()
        if now - last[0] >= 0.5 or frac >= 1.0:
            last[0] = now
            print(f"{label}: {100 * frac:5.1f}% {msg}", file=sys.stderr, flush=True)
    return report


def _download_printer(p):
    print(f"download: {100 * p.fraction:5.1f}% {p.file}", file=sys.stderr, flush=True)


def _demo_dir() -> str:
    """The bundled demo model's folder (`--model demo`), or a clear error."""
    from . import ModelNotFound
    from .demo import demo_model_dir, missing_message

    folder = demo_model_dir()
    if folder is None:
        raise ModelNotFound(missing_message())
    return folder


def _model_file(name: str) -> str:
    """The engine file for --model: "demo" is the bundled demo model; a Hub repo that cannot be downloaded
    because the Hub is out of reach (offline mode, no network) falls back to it, with a notice."""
    from . import resolve_model_file
    from .demo import NAME, demo_model_dir
    from .hub import UNREACHABLE, HubError

    progress = dict(download_progress=_download_printer, convert_progress=_progress_printer("convert"))
    if name == NAME:
        return resolve_model_file(_demo_dir(), **progress)
    try:
        return resolve_model_file(name, **progress)
    except HubError as exc:
        demo = demo_model_dir()
        if exc.kind not in UNREACHABLE or demo is None:
            raise
        why = "offline mode is on" if exc.kind == "offline" else "the Hugging Face Hub cannot be reached"
        print(f"notice: {name} cannot be downloaded ({why}); using the bundled demo model ({demo}) instead",
              file=sys.stderr, flush=True)
        return resolve_model_file(demo, **progress)


def cmd_convert(args) -> int:
    import os

    from . import hub
    from .cache import converted_path
    from .convert import convert_checkpoint
    from .demo import NAME

    src = _demo_dir() if args.src == NAME else args.src
    if not os.path.exists(src) and hub.is_repo_id(src):
        src = hub.download_checkpoint(src, progress=_download_printer)
    out = args.out or converted_path(src)
    convert_checkpoint(src, out, progress=_progress_printer("convert"))
    print(out)
    return 0


def _decode_params(args) -> dict:
    p = {"mode": args.mode, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
         "seed": args.seed, "top_k": args.top_k, "top_p": args.top_p,
         "repetition_penalty": args.repetition_penalty}
    if args.mode == "diffusion":
        p.update(block_size=args.block_size, sub_block_size=args.sub_block_size, threshold=args.threshold,
                 attention=args.attention, dual_cache=args.dual_cache)
    return {k: v for k, v in p.items() if v is not None}


def cmd_generate(args) -> int:
    from .decode.events import Done, Token
    from .model import Model

    model = Model.open(_model_file(args.model), lm_head=args.lm_head, threads=args.threads)
    if args.raw:
        ids = model.encode(args.prompt)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        ids = model.chat_ids(messages + [{"role": "user", "content": args.prompt}])
    streamed = ""
    for ev in model.generate(ids, **_decode_params(args)):
        if isinstance(ev, Token) and ev.text:
            streamed += ev.text
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Done):
            sys.stdout.write(ev.text[len(streamed):] + "\n")  # a held-back trailing character, if any
            sys.stdout.flush()
            print("stats " + json.dumps(dict(ev.stats, stop_reason=ev.stop_reason, mode=args.mode),
                                        sort_keys=True), file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from .bench import format_report, run_bench, synthetic_file

    if args.synthetic:
        print(f"bench: preparing the synthetic {args.synthetic} model (written once, then cached)",
              file=sys.stderr, flush=True)
        path = synthetic_file(args.synthetic)
    else:
        path = _model_file(args.model)
    report = run_bench(path, threads=args.threads, isa=args.isa, lm_head=args.lm_head, repeats=args.repeats,
                       progress=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


MODEL_HELP = ("engine file, checkpoint folder, Hub repo id, or 'demo' (the bundled demo model; also used, with a "
              "notice, when a Hub repo cannot be downloaded for want of a network)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bitnet_app",
                                 description="BitNet b1.58 on the CPU: convert checkpoints, generate text, benchmark.")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="convert a Hugging Face BitNet checkpoint folder into an engine file")
    c.add_argument("src", help="checkpoint folder (config.json, tokenizer.json, *.safetensors), Hub repo id, or "
                                       "'demo' (the bundled demo model)")
    c.add_argument("--out", help="engine file to write (default: the cache folder; the path is printed)")
    c.set_defaults(func=cmd_convert)

    g = sub.add_parser("generate", help="generate a reply, streamed to stdout")
    g.add_argument("--model", required=True, help=MODEL_HELP)
    g.add_argument("--prompt", required=True)
    g.add_argument("--mode", choices=("ar", "diffusion"), default="ar")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--seed", type=int)
    g.add_argument("--top-k", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--repetition-penalty", type=float)
    g.add_argument("--block-size", type=int, help="diffusion: slots per block (default: the checkpoint's)")
    g.add_argument("--sub-block-size", type=int, help="diffusion: slots decoded together (default 8)")
    g.add_argument("--threshold", type=float, help="diffusion: confidence to fill a slot, in (0, 1] (default 0.9)")
    g.add_argument("--attention", choices=("block", "causal"), help="diffusion: attention pattern")
    g.add_argument("--dual-cache", action="store_true", default=None,
                   help="diffusion: re-run only the sub-block inside a block (faster, approximate for block attention)")
    form = g.add_mutually_exclusive_group()
    form.add_argument("--chat", dest="raw", action="store_false", help="wrap the prompt in the chat template (default)")
    form.add_argument("--raw", dest="raw", action="store_true", help="use the prompt text as is (BOS added)")
    g.add_argument("--system", help="system prompt (chat form only)")
    g.add_argument("--lm-head", choices=("int8", "exact"), default="int8")
    g.add_argument("--threads", type=int)
    g.set_defaults(func=cmd_generate, raw=False)

    b = sub.add_parser("bench", help="engine speed: tg128, pp128, block forwards, bytes per token")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help=MODEL_HELP)
    src.add_argument("--synthetic", choices=("2b4t", "tiny"), help="random weights of a named shape")
    b.add_argument("--json", action="store_true", help="print the figures as JSON")
    b.add_argument("--threads", type=int)
    b.add_argument("--isa", choices=("avx512", "avx2", "portable"), help="force a kernel path")
    b.add_argument("--lm-head", choices=("int8", "exact"), default="int8")
    b.add_argument("--repeats", type=int, default=5, help="timed runs per figure (after one warm-up)")
    b.set_defaults(func=cmd_bench)
    return ap


def _user_errors() -> tuple:
    """Exceptions that mean bad input or environment, not a bug: one line, exit 2."""
    errors = [ValueError, OSError, NotImplementedError]
    try:
        from .hub import HubError
        errors.append(HubError)
    except ImportError:  # huggingface_hub missing: then no HubError can be raised either
        pass
    return tuple(errors)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except _user_errors() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
