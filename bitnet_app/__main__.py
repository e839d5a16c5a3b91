"""Command line: python -m bitnet_app {convert, generate, bench}.

    python -m bitnet_app convert SRC --out DST
    python -m bitnet_app generate --model M --prompt TEXT [--mode ar|diffusion] [--max-new-tokens N]
                                  [--temperature T] [--seed S] [--top-k K] [--top-p P] ...
                                  [--chat | --raw] [--system TEXT] [--lm-head int8|exact] [--kv f16|f32|i8] [--threads N]
    python -m bitnet_app bench (--model M | --synthetic 2b4t|falcon3-1b|falcon3-7b|llama3-8b|...) [--json] [--threads N] [--isa ISA]

generate has one flag per decode knob of bitnet_app/params.py (DecodeParams: names, defaults, ranges,
help). M is an engine file, a checkpoint folder, a Hub repo id, or `demo`: the bundled demo model
(bitnet_app.demo); bitnet_app.source turns it into an engine file. A Hub repo that cannot be downloaded because the Hub is out of reach (offline mode,
no network) falls back to the demo model with a one-line notice on stderr, when the demo model exists.

generate streams the reply to stdout and writes the stats to stderr. A user error (missing file,
bad checkpoint, a decode value out of range, prompt too long, no network...) prints one line to stderr
and exits with status 2.
"""
import argparse
import json
import re
import sys
import time

from .checkpoint.presets import SHAPES
from .engine import kernel_paths

PACKINGS = ("2bit", "1.6bit")  # engine/packing.py PACKINGS: the layouts of the ternary tiles
KV_CHOICES = ("f32", "f16", "i8")  # engine/runtime.py KV_TYPES: the KV cache's element types
SYNTHETIC_SHAPES = tuple(SHAPES)   # the shapes of `bench --synthetic` (plain data, not the writer: synthetic.py)


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


def _model_file(name: str) -> str:
    """The engine file for --model (bitnet_app.source.prepare): a Hub repo that cannot be downloaded
    because the Hub is out of reach falls back to the bundled demo model, with a notice."""
    from .source import prepare

    prepared = prepare(name, download_progress=_download_printer, convert_progress=_progress_printer("convert"),
                       demo_fallback=True)
    if prepared.fell_back is not None:
        why = "offline mode is on" if prepared.fell_back.kind == "offline" else "the Hugging Face Hub cannot be reached"
        print(f"notice: {name} cannot be downloaded ({why}); using the bundled demo model instead",
              file=sys.stderr, flush=True)
    return prepared.path


def cmd_convert(args) -> int:
    from .checkpoint.convert import convert_checkpoint
    from .engine.cache import converted_path
    from .source import checkpoint_folder

    src = checkpoint_folder(args.src, download_progress=_download_printer)
    out = args.out or converted_path(src)
    convert_checkpoint(src, out, progress=_progress_printer("convert"), packing=args.packing)
    print(out)
    return 0


def _decode_params(args):
    """The CLI's one DecodeParams, from the generate flags (a flag not given is None: the default, or the
    checkpoint's value, which Model.generate fills in); a bad value is a ValueError naming its flag: one line,
    exit 2."""
    from .params import KNOBS, DecodeParams

    try:
        return DecodeParams.from_kwargs(**{name: getattr(args, name) for name in KNOBS})
    except ValueError as exc:
        raise ValueError(in_flag_words(str(exc))) from None


def in_flag_words(message: str) -> str:
    """A DecodeParams message as the command line says it: a knob's name becomes its flag (max_new_tokens ->
    --max-new-tokens; a one-word name only where it opens the message, where it cannot be a plain word), and
    "or None", the API's way to leave a knob unset, goes (leaving the flag out does that here)."""
    from .params import KNOBS

    names = sorted(KNOBS, key=len, reverse=True)
    pattern = r"\b(" + "|".join(n for n in names if "_" in n) + r")\b|^(" + "|".join(names) + r")\b"
    flagged = re.sub(pattern, lambda m: "--" + (m.group(1) or m.group(2)).replace("_", "-"), message)
    return flagged.replace(" or None", "")


def _check_room(args, prompt_tokens: int, context: int) -> None:
    """--max-new-tokens beyond what the context holds after the prompt: say so (the reply stops at the context's
    end) rather than stop there silently."""
    room = context - prompt_tokens
    if args.max_new_tokens is not None and args.max_new_tokens > room:
        print(f"notice: --max-new-tokens {args.max_new_tokens} is more than fits: the model's context holds "
              f"{context} tokens and the prompt takes {prompt_tokens}, so the reply stops after at most {room}",
              file=sys.stderr, flush=True)


def cmd_generate(args) -> int:
    from .decode.events import Done, Token
    from .model import Model

    if not args.prompt.strip():
        raise ValueError("--prompt is empty: give the text to answer (or, with --raw, to continue)")
    params = _decode_params(args)  # checked before any model work
    model = Model.open(_model_file(args.model), lm_head=args.lm_head, threads=args.threads, kv=args.kv)
    try:
        params = model.decode_params(params)  # the checkpoint's values filled in: checked again, beside them
    except ValueError as exc:
        raise ValueError(in_flag_words(str(exc))) from None
    if args.raw:
        ids = model.encode(args.prompt)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        ids = model.chat_ids(messages + [{"role": "user", "content": args.prompt}])
    _check_room(args, len(ids), model.context_length)
    streamed = ""
    for ev in model.generate(ids, params):
        if isinstance(ev, Token) and ev.text:
            streamed += ev.text
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Done):
            sys.stdout.write(ev.text[len(streamed):] + "\n")  # a held-back trailing character, if any
            sys.stdout.flush()
            print("stats " + json.dumps(dict(ev.stats, stop_reason=ev.stop_reason, mode=params.mode),
                                        sort_keys=True), file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from .bench import format_report, run_bench, synthetic_file

    say = lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    if not args.synthetic and (args.keep or args.packing):  # they shape the synthetic file: without one, a mistake
        raise ValueError(f"{'--keep' if args.keep else '--packing'} goes with --synthetic (it shapes the generated "
                         "model file); --model runs the file as it is")
    if args.synthetic:
        say(f"preparing the synthetic {args.synthetic} model ("
            + ("kept in the cache for the next run)" if args.keep else "deleted at the end; --keep keeps it)"))
        with synthetic_file(args.synthetic, keep=args.keep, layout=args.packing) as path:
            report = run_bench(path, threads=args.threads, isa=args.isa, lm_head=args.lm_head, kv=args.kv,
                               repeats=args.repeats, progress=say)
    else:
        report = run_bench(_model_file(args.model), threads=args.threads, isa=args.isa, lm_head=args.lm_head, kv=args.kv,
                           repeats=args.repeats, progress=say)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


MODEL_HELP = ("engine file, checkpoint folder, Hub repo id, or 'demo' (the bundled demo model; also used, with a "
              "notice, when a Hub repo cannot be downloaded for want of a network)")


LM_HEAD_HELP = ("the output layer: int8 (default, fast) or exact (bf16 weights and an fp32 KV cache: the reference, "
                "slower)")
THREADS_HELP = "CPU threads for the engine (default: every core, or BITNET_THREADS)"


def _at_least_one(high: int | None = None, advice: str = ""):
    """An argparse type: a whole number from 1 (to `high`), refused before any work starts (argparse names the
    flag)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < 1 or (high is not None and value > high):
            span = f"1 to {high}" if high is not None else "1 or more"
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {span}{advice}")
        return value
    return parse


def _threads_flag():
    from .engine.runtime import MAX_THREADS
    return _at_least_one(MAX_THREADS, " (the number of CPU cores is a good choice)")


def _number(text: str):
    """An int or float as typed; DecodeParams says whether it suits the knob (a fraction for a whole-number
    knob, NaN, a value out of range get its one-line error)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _add_decode_flags(parser) -> None:
    """One flag per DecodeParams knob (bitnet_app/params.py): its name, help, default and choices."""
    from .params import KNOBS

    for name, f in KNOBS.items():
        meta, flag = f.metadata, "--" + name.replace("_", "-")
        default = "the checkpoint's" if f.default is None and meta["diffusion"] else \
            "none" if f.default is None else f.default
        help_text = f"{meta['help']} ({'diffusion only; ' if meta['diffusion'] else ''}default: {default})"
        if meta["kind"] is bool:
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        elif meta["kind"] is str:
            parser.add_argument(flag, choices=meta["choices"], help=help_text)
        else:
            parser.add_argument(flag, type=_number, metavar=name.split("_")[-1].upper(), help=help_text)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bitnet_app",
                                 description="BitNet b1.58 on the CPU: convert checkpoints, generate text, benchmark.")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="convert a Hugging Face BitNet checkpoint folder into an engine file")
    c.add_argument("src", help="checkpoint folder (config.json, tokenizer.json, *.safetensors), Hub repo id, or "
                                       "'demo' (the bundled demo model)")
    c.add_argument("--out", help="engine file to write (default: the cache folder; the path is printed)")
    c.add_argument("--packing", choices=PACKINGS,
                   help="ternary tiles: 1.6 bits a weight (5 a byte) or 2 bits (4 a byte); default: 1.6 where the "
                        "CPU has VNNI (AVX512-VNNI, AVX-VNNI), else 2")
    c.set_defaults(func=cmd_convert)

    g = sub.add_parser("generate", help="generate a reply, streamed to stdout")
    g.add_argument("--model", required=True, help=MODEL_HELP)
    g.add_argument("--prompt", required=True, help="the text to answer (the user's message; with --raw, the text "
                                                   "to continue)")
    _add_decode_flags(g)
    form = g.add_mutually_exclusive_group()
    form.add_argument("--chat", dest="raw", action="store_false", help="wrap the prompt in the chat template (default)")
    form.add_argument("--raw", dest="raw", action="store_true", help="use the prompt text as is (BOS added)")
    g.add_argument("--system", help="system prompt (chat form only)")
    g.add_argument("--lm-head", choices=("int8", "exact"), default="int8", help=LM_HEAD_HELP)
    g.add_argument("--kv", choices=KV_CHOICES, help="KV cache: f16 (default with the int8 head), f32, or i8 "
                                                     "(int8, a scale per head and position: half fp16's bytes)")
    g.add_argument("--threads", type=_threads_flag(), help=THREADS_HELP)
    g.set_defaults(func=cmd_generate, raw=False)

    b = sub.add_parser("bench", help="engine speed: tg128, pp128, block forwards, bytes per token")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help=MODEL_HELP)
    src.add_argument("--synthetic", choices=SYNTHETIC_SHAPES, help="random weights of a named shape")
    b.add_argument("--json", action="store_true", help="print the figures as JSON")
    b.add_argument("--threads", type=_threads_flag(), help=THREADS_HELP)
    b.add_argument("--isa", choices=kernel_paths.names(),
                   help="force a kernel path (the *-emulated ones: those kernels written in AVX2 or C, for tests)")
    b.add_argument("--lm-head", choices=("int8", "exact"), default="int8", help=LM_HEAD_HELP)
    b.add_argument("--kv", choices=KV_CHOICES, help="KV cache (default f16 with the int8 head)")
    b.add_argument("--repeats", type=_at_least_one(), default=5,
                   help="timed runs per figure (after one warm-up; 1 or more)")
    b.add_argument("--keep", action="store_true",
                   help="with --synthetic: keep the generated file in the cache for the next run")
    b.add_argument("--packing", choices=PACKINGS,
                   help="with --synthetic: the ternary tiles' layout (default: what the converter writes on this CPU)")
    b.set_defaults(func=cmd_bench)
    return ap


def _user_errors() -> tuple:
    """Exceptions that mean bad input or environment, not a bug: one line, exit 2."""
    errors = [ValueError, OSError, NotImplementedError]
    try:
        from .checkpoint.download import HubError
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
