"""Decode parameters, written once: each knob's name, default, allowed range, help text, sidebar widget and check.

    p = DecodeParams(mode="diffusion", threshold=0.8)   # ValueError with a clear message on a bad value
    p = DecodeParams.from_kwargs(**decode_params)        # the same; TypeError naming an unknown keyword
    p = p.resolve(checkpoint_values, vocab_size=V)       # the knobs left None filled from the checkpoint
    p.kwargs()                                           # the knobs that matter for p.mode, as a dict

One DecodeParams is built at each edge (the page, the CLI, the API: Model.decode_params) and travels whole
through Model.generate into the decoders. block_size, attention and mask_id default to None: the checkpoint's
own values (its dlm_config.json, or what its conversion recorded), which `resolve` fills in, once, where the
object is built. Values are checked strictly: NaN and infinity, True/False where a number is meant, a fraction
for a whole-number knob, a value out of range and a value that does not go with another knob (CONSTRAINTS) are
refused, never silently replaced. Every whole-number knob has an upper bound too (C_INT_MAX: what a C int holds,
where the value reaches the engine's C code; MAX_REPLY: no context is longer), so no value reaches C to overflow
there: the message names the keyword, as the caller wrote it.

A knob's `ui` metadata places it on the page's sidebar (section, widget and its hints) and the CLI's `generate`
has one flag per knob, so a new knob is declared here and read by its decoder, nowhere else.
"""
import math
import numbers
from dataclasses import dataclass, field, fields, replace

import numpy as np

MODES = ("ar", "diffusion")
ATTENTIONS = ("block", "causal")
FILL_RULES = ("exact", "threshold")
RULE_OF_ATTENTION = {"causal": "exact", "block": "threshold"}  # fill_rule when none is given (see resolve)
# threshold when none is given (see resolve). The threshold rule keeps every slot above it, so its default is
# Fast-dLLM v2's (or the checkpoint's dlm_config.json suggestion): lower loses quality. The exact rule keeps only
# what AR would write, so the threshold only decides how much is drafted: lower drafts more (more tokens per
# step, more rejected drafts, bigger steps). 0.5 is the lowest at which at most one id can be drafted for a slot;
# on the demo model it settles 6.4 tokens a step against 3.8 at 0.9, for about the same cost per token (a step of
# that tiny model costs about its rows; a big model's step costs its weights, so there fewer steps win more).
# benchmarks/BENCHMARKS.md has the sweep.
PLAIN_THRESHOLD = 0.9
EXACT_DRAFT_THRESHOLD = 0.5
SECTIONS = ("top", "sampling", "diffusion")  # where the sidebar draws a knob (ui["section"]), in this order
C_INT_MAX = 2**31 - 1      # top_k and mask_id reach the engine's C code as a C int (and int32 arrays)
MAX_REPLY = 1 << 20        # max_new_tokens, block sizes: engine/validate.py MAX_CONTEXT, the longest context a file has
LIMITS = {C_INT_MAX: "the largest the engine's C code takes", MAX_REPLY: "the longest context an engine file can have"}
# The ranges that keep the sampler's float32 arithmetic finite: a real model's logits (|x| far below 1e4) divided or
# multiplied by the repetition penalty, then divided by the temperature, stay far from float32's 3.4e38, and no numpy
# warning is raised.
# Outside them, a penalty of 1e-44 turned the logits into infinities (greedy and sampled then disagreed). The page's
# sliders lie inside them (see each knob's ui hints); the API and the CLI refuse what lies outside.
REPETITION_PENALTY_MIN, REPETITION_PENALTY_MAX = 0.01, 100.0
TEMPERATURE_MIN, TEMPERATURE_MAX = 0.01, 100.0   # and 0: greedy
SUB_BLOCK = 8   # the sub-block size a block of 8 or more starts from (see default_sub_block)


class ParameterTypeError(TypeError, ValueError):
    """A keyword that is no decode parameter, or settings of the wrong type: a TypeError as Python has it, and a
    ValueError, so that every edge (the CLI's one-line errors, the page) treats it as the bad input it is."""


def knob(default, help: str, *, kind: type, low=None, high=None, low_open: bool = False, limit=None, choices=(),
         optional: bool = False, zero: bool = False, diffusion: bool = False, label: str = "", ui: dict | None = None):
    """A DecodeParams field and its metadata.

    kind: int, float, bool or str; [low, high] the allowed range (low excluded when low_open); limit: for a whole
    number, the largest value the code below can take (LIMITS says why), refused in words of its own;
    choices: the allowed strings (exactly as written: no other case, no other type); optional: None is allowed (it
    means the checkpoint's or a fresh value); zero: 0 is allowed below the range (temperature 0: greedy);
    diffusion: only block diffusion reads it; label and ui are for the page's sidebar: ui["section"] (one of
    SECTIONS; no section: not on the sidebar), ui["widget"] ("radio", "slider", "number" or "select") and its
    hints (slider/number ranges and steps, select options, choice labels, a placeholder)."""
    meta = dict(help=help, kind=kind, low=low, high=high, low_open=low_open, limit=limit, choices=tuple(choices),
                optional=optional, zero=zero, diffusion=diffusion, label=label, ui=ui or {})
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class DecodeParams:
    mode: str = knob("ar", "Autoregressive (ar) writes one token per forward; block diffusion fills several "
                     "slots of a block per forward.", kind=str, choices=MODES, label="Decoding",
                     ui=dict(section="top", widget="radio",
                             labels={"ar": "Autoregressive", "diffusion": "Block diffusion"}))
    temperature: float = knob(0.0, "0 always picks the likeliest token; higher values give more varied text.",
                              kind=float, low=TEMPERATURE_MIN, high=TEMPERATURE_MAX, zero=True, label="Temperature",
                              ui=dict(section="sampling", widget="slider", low=0.0, high=2.0, step=0.05))
    top_p: float = knob(1.0, "Sample only from the smallest set of tokens whose probabilities add up to p, "
                        "in (0, 1]; 1 turns it off.", kind=float, low=0.0, low_open=True, high=1.0,
                        label="Top-p", ui=dict(section="sampling", widget="slider", low=0.05, high=1.0, step=0.05))
    top_k: int = knob(0, "Sample only from the k likeliest tokens; 0 turns the limit off.", kind=int, low=0,
                      limit=C_INT_MAX, label="Top-k",
                      ui=dict(section="sampling", widget="slider", low=0, high=200, step=1))
    repetition_penalty: float = knob(1.0, "Above 1 makes tokens that already appeared less likely, against "
                                     "loops; 1 turns it off.", kind=float, low=REPETITION_PENALTY_MIN,
                                     high=REPETITION_PENALTY_MAX,
                                     label="Repetition penalty",
                                     ui=dict(section="sampling", widget="slider", low=1.0, high=2.0, step=0.05))
    max_new_tokens: int = knob(256, "The longest reply, in tokens.", kind=int, low=1, limit=MAX_REPLY,
                               label="Max new tokens",
                               ui=dict(section="sampling", widget="number", step=16))
    seed: int | None = knob(None, "The same seed and settings give the same reply; without one, each reply "
                            "draws afresh.", kind=int, low=0, optional=True, label="Seed",
                            ui=dict(section="sampling", widget="number", high=2**31 - 1, step=1,
                                    placeholder="random"))
    block_size: int | None = knob(None, "Tokens per block; must match the block size the model was trained "
                                  "with.", kind=int, low=1, limit=MAX_REPLY, optional=True,
                                  diffusion=True, label="Block size",
                                  ui=dict(section="diffusion", widget="select", options=(4, 8, 16, 32, 64)))
    sub_block_size: int | None = knob(None, "Slots decided together, left to right inside a block; must divide "
                                      "the block size. Default: the checkpoint's suggestion, else the largest "
                                      f"divisor of the block size up to {SUB_BLOCK}.", kind=int, low=1,
                                      limit=MAX_REPLY, optional=True, diffusion=True, label="Sub-block size",
                               ui=dict(section="diffusion", widget="select", options=(1, 2, 4, 8, 16, 32, 64)))
    threshold: float | None = knob(None, "Fill every slot whose prediction is more than this sure, in (0, 1]; "
                                   "1.0 fills one per forward. Under the exact rule it only picks the drafts that "
                                   "a later step checks, so it changes the speed, never the reply. Default: "
                                   f"{EXACT_DRAFT_THRESHOLD} for the exact rule; the checkpoint's suggestion, else "
                                   f"{PLAIN_THRESHOLD}, for the threshold rule.", kind=float, low=0.0, low_open=True,
                                   high=1.0, optional=True, diffusion=True, label="Confidence threshold",
                            ui=dict(section="diffusion", widget="slider", low=0.5, high=1.0, step=0.01))
    attention: str | None = knob(None, "block: slots in a block see each other (Fast-dLLM v2); causal: each "
                                 "sees only earlier ones.", kind=str,
                                 choices=ATTENTIONS, optional=True, diffusion=True, label="Attention pattern",
                                 ui=dict(section="diffusion", widget="select"))
    fill_rule: str | None = knob(None, "exact: a slot filled above the threshold stands only if it is what "
                                 "autoregressive decoding would write there, so the reply is AR's, in fewer steps "
                                 "(needs causal attention); threshold: every such slot stands (Fast-dLLM v2, "
                                 "faster, may differ from AR). Default: exact under causal attention.", kind=str,
                                 choices=FILL_RULES, optional=True, diffusion=True, label="Fill rule",
                                 ui=dict(section="diffusion", widget="select",
                                         labels={"exact": "Exact (AR's reply)", "threshold": "Threshold (Fast-dLLM v2)"}))
    mask_id: int | None = knob(None, "The id of the mask token that marks undecided slots (a spare id when "
                               "the checkpoint has none).", kind=int, low=0, limit=C_INT_MAX, optional=True,
                               diffusion=True, label="Mask id")
    dual_cache: bool = knob(False, "Block attention: re-run only the sub-block after its first step (faster, "
                            "approximate). Causal attention always does (exact).", kind=bool, diffusion=True,
                            label="Dual cache")

    def __post_init__(self):
        for f in fields(self):
            object.__setattr__(self, f.name, _checked(f.name, getattr(self, f.name), f.metadata))
        for name in CONSTRAINTS:
            why = problem(name, getattr(self, name), self)
            if why:
                raise ValueError(why)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "DecodeParams":
        """Keyword arguments as Model.generate takes them; None means the default. An unknown name is a
        TypeError that names it and lists the known ones."""
        unknown = set(kwargs) - set(KNOBS)
        if unknown:
            raise ParameterTypeError(f"unknown decode parameter(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(KNOBS)}")
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def resolve(self, checkpoint: dict, *, vocab_size: int) -> "DecodeParams":
        """The object a decoder runs with: the knobs still None set from `checkpoint` (the model's values:
        Model.diffusion_defaults for diffusion, its real mask id for AR), the fill rule from the attention
        (exact for causal, threshold for block), checked again, and ready for this model (ready_for). Knobs that
        already have a value are kept."""
        suggested = {k: v for k, v in checkpoint.items() if k not in ("threshold", "sub_block_size")}
        filled = replace(self, **{k: v for k, v in suggested.items() if getattr(self, k) is None})
        if filled.sub_block_size is None and filled.block_size is not None:
            filled = replace(filled, sub_block_size=default_sub_block(filled.block_size,
                                                                      checkpoint.get("sub_block_size")))
        if filled.fill_rule is None and filled.attention is not None:
            filled = replace(filled, fill_rule=RULE_OF_ATTENTION[filled.attention])
        if filled.threshold is None and filled.fill_rule is not None:
            filled = replace(filled, threshold=default_threshold(filled.fill_rule, checkpoint.get("threshold")))
        return filled.ready_for(vocab_size)

    def ready_for(self, vocab_size: int) -> "DecodeParams":
        """self, once every knob its mode reads has a value and the mask id lies inside the vocabulary;
        else ValueError (the decoders call it too, for a caller that skipped `resolve`)."""
        if self.mask_id is not None and self.mask_id >= vocab_size:
            raise ValueError(f"mask_id {self.mask_id} is out of range for this model (vocabulary {vocab_size})")
        if self.mode == "diffusion":
            unset = [f.name for f in fields(self) if f.metadata["diffusion"] and getattr(self, f.name) is None]
            if unset:
                raise ValueError(f"block diffusion needs {', '.join(unset)} (None is the checkpoint's value: "
                                 "resolve the parameters against the model first, as Model.generate does)")
        return self

    def kwargs(self) -> dict:
        """The knobs that matter for this mode, as keywords (None left out): for an export, or a log."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None and (self.mode == "diffusion" or not f.metadata["diffusion"])}


KNOBS = {f.name: f for f in fields(DecodeParams)}  # name -> dataclasses.Field (.default, .metadata)


def default_threshold(fill_rule: str, suggested: float | None = None) -> float:
    """The threshold a fill rule starts from: EXACT_DRAFT_THRESHOLD for the exact rule; for the threshold rule,
    the checkpoint's suggestion (dlm_config.json) when it has one, else PLAIN_THRESHOLD."""
    if fill_rule == "exact":
        return EXACT_DRAFT_THRESHOLD
    return float(suggested) if suggested is not None else PLAIN_THRESHOLD


def default_sub_block(block_size: int, suggested: int | None = None) -> int:
    """The sub-block size a block starts from: the checkpoint's suggestion when it divides the block, else the largest
    divisor of the block up to SUB_BLOCK (8 for 32, 6 for 12, 4 for 4): every block size has one."""
    if suggested and block_size % suggested == 0:
        return int(suggested)
    return max(d for d in range(1, min(SUB_BLOCK, block_size) + 1) if block_size % d == 0)


def sidebar_knobs(section: str) -> list[str]:
    """The knobs the page's sidebar draws in `section` (one of SECTIONS), in field order."""
    return [name for name, f in KNOBS.items() if f.metadata["ui"].get("section") == section]


# ---- values that do not go together -------------------------------------------------------------------
def _divides_block(value, other) -> str | None:
    block = other("block_size")
    if block is not None and value is not None and block % value:
        return (f"sub_block_size ({value}) must divide block_size ({block}); try {default_sub_block(block)} (or leave "
                f"it unset: the largest divisor of the block size up to {SUB_BLOCK})")
    return None


EXACT_NEEDS_CAUSAL = ("the exact rule needs causal attention: it checks each filled slot against the row before "
                      "it, which is the autoregressive prediction only when that row sees no later slot (under block "
                      "attention that would take a second, causal pass, which this app does not run). Choose "
                      "causal attention, or the threshold rule.")


def _exact_needs_causal(value, other) -> str | None:
    return EXACT_NEEDS_CAUSAL if value == "exact" and other("attention") == "block" else None


# knob -> (its value, other(name) -> another knob's value) -> why the value cannot be used, or None
CONSTRAINTS = {"sub_block_size": _divides_block, "fill_rule": _exact_needs_causal}


def problem(name: str, value, settings) -> str | None:
    """Why knob `name` cannot take `value` beside the other settings (a DecodeParams or a dict of knob
    values), or None. The page asks before it offers a choice; DecodeParams refuses with the same words."""
    rule = CONSTRAINTS.get(name)
    if rule is None:
        return None
    other = settings.get if isinstance(settings, dict) else lambda n: getattr(settings, n)
    return rule(value, other)


# ---- one value ----------------------------------------------------------------------------------------
def _checked(name: str, value, meta):
    """value converted to the knob's kind (an integral float to int), or ValueError saying what is allowed."""
    kind, optional = meta["kind"], meta["optional"]
    if value is None and optional:
        return None
    want, given = describe(meta), value
    if kind is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, not {value!r}")
        return bool(value)
    if kind is str:
        return one_of(name, value, meta["choices"])
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be {want}, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {want}, not {value!r}")
    if meta["zero"] and value == 0:
        return 0 if kind is int else 0.0
    if kind is int:
        if value != int(value):
            raise ValueError(f"{name} must be a whole number ({want}), not {value!r}")
        value = int(value)
    else:
        value = float(value)
    low, high, limit = meta["low"], meta["high"], meta["limit"]
    if limit is not None and value > limit:
        raise ValueError(f"{name} must be at most {limit} ({LIMITS[limit]}), not {given!r}")
    if (low is not None and (value < low or (meta["low_open"] and value == low))) or \
            (high is not None and value > high):
        raise ValueError(f"{name} must be {want}, not {value!r}")
    return value


def one_of(name: str, value, choices: tuple) -> str:
    """value when it is one of `choices` exactly as written (a str: no other case, no other type, "" is no
    choice), else ValueError "name must be one of ...": the one rule of every named choice (the decode knobs', and
    the engine's lm_head, kv and attention)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, not {value!r}")
    return value


def knob_problem(name: str, value) -> str | None:
    """Why `value` cannot be knob `name` (in the words of the ValueError DecodeParams raises), or None. The rules a
    checkpoint's suggested settings are held to (engine/key_rules.py, a layer that cannot import this one) are
    checked against it (tests/test_hostile.py)."""
    try:
        _checked(name, value, KNOBS[name].metadata)
    except ValueError as exc:
        return str(exc)
    return None


def describe(meta) -> str:
    """The allowed values in words: "an integer >= 1", "a number in (0, 1]", "one of 'ar', 'diffusion'"."""
    if meta["kind"] is str:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    if meta["kind"] is bool:
        return "True or False"
    noun = ("0 or " if meta["zero"] else "") + ("an integer" if meta["kind"] is int else "a number")
    low, high = meta["low"], meta["high"]
    if low is not None and high is not None:
        text = f"{noun} in {'(' if meta['low_open'] else '['}{low:g}, {high:g}]"
        text += " (the range that keeps the arithmetic finite)" if meta["kind"] is float and high > 1 else ""
    elif low is not None:
        text = f"{noun} {'>' if meta['low_open'] else '>='} {low:g}"
    else:
        text = noun
    return text + (" or None" if meta["optional"] else "")
