"""One rule per key for every value that enters from a file: a checkpoint's config.json, dlm_config.json,
generation_config.json and tokenizer_config.json (read by checkpoint/config.py at conversion), and the same keys
again in an engine file's metadata (engine/validate.py, at every open). Types are checked strictly, before ranges:
"false" is not a boolean (bool("false") is True), 1.5 and true are not whole numbers, "0.7" is not a number.

    problem(key, value) -> str | None    None when value suits key's rule, else "key = value; it must be ..." or
                                         "key = value, outside the range a real model could have (...)"
    RULES                                key -> Rule (kind, range, an example value for the message)

The callers put the file's name in front ("config.json has ...") and say what to do.
"""
import math
from dataclasses import dataclass

from ..params import knob_problem

MAX_CONTEXT = 1 << 20
ACTIVATIONS = ("relu2", "silu")


@dataclass(frozen=True)
class Rule:
    kind: str                  # whole | number | flag | text | id | ids | token | knob (a decode knob's own rule)
    low: float | None = None   # [low, high]: the range a real model's value lies in (generous)
    high: float | None = None
    example: object = None     # BitNet b1.58 2B-4T's value (or a real model's), for the message
    choices: tuple = ()        # text: the allowed strings (empty: any string)


def _size(high, example):
    return Rule("whole", 1, high, example)


FLAG, ID, IDS, TEXT, TOKEN, KNOB = (Rule("flag"), Rule("id", 0, None), Rule("ids", 0, None), Rule("text"),
                                    Rule("token"), Rule("knob"))
RULES = {
    # config.json, and an engine file's config (the keys the engine runs on)
    "hidden_size": _size(1 << 16, 2560),            # Llama 3.1 405B: 16384
    "intermediate_size": _size(1 << 18, 6912),      # 405B: 53248
    "num_hidden_layers": _size(1024, 30),           # 405B: 126
    "num_attention_heads": _size(1024, 20),         # 405B: 128
    "num_key_value_heads": _size(1024, 5),
    "head_dim": _size(1024, 128),                   # 64 to 256 in practice
    "vocab_size": _size(1 << 22, 128256),           # Gemma: 262144
    "max_position_embeddings": _size(MAX_CONTEXT, 4096),
    "rope_theta": Rule("number", 1.0, 1e12, 500000.0),     # 1e4 to a few 1e9 (long-context fine-tunes)
    "rms_norm_eps": Rule("number", 1e-12, 1e-2, 1e-05),    # 1e-5 or 1e-6 in practice
    "hidden_act": Rule("text", choices=ACTIVATIONS),
    "tie_word_embeddings": FLAG, "sub_norms": FLAG, "attention_bias": FLAG, "mlp_bias": FLAG,
    "use_rms_norm": FLAG,                           # quantization_config's
    "bos_token_id": ID, "eos_token_id": IDS,
    # dlm_config.json (and config.json's bd_size), and an engine file's diffusion block
    "bd_size": _size(MAX_CONTEXT, 32), "block_size": _size(MAX_CONTEXT, 32), "sub_block_size": _size(MAX_CONTEXT, 8),
    "threshold": KNOB, "mask_token_id": ID, "trained": FLAG,
    "attention": TEXT, "attention_pattern": TEXT, "attn_pattern": TEXT, "attention_type": TEXT,
    "attention_mask": TEXT,
    # generation_config.json: the decode knobs' own rules (params.py), so that what a checkpoint suggests runs
    "do_sample": FLAG, "temperature": KNOB, "top_p": KNOB, "top_k": KNOB, "repetition_penalty": KNOB,
    # tokenizer_config.json
    "bos_token": TOKEN, "eos_token": TOKEN,
}
WHAT = {"whole": "a whole number", "flag": "true or false (a JSON boolean, not text or a number)",
        "text": "text", "id": "a token id (a whole number >= 0)",
        "ids": "a token id or a list of them (whole numbers >= 0)",
        "token": 'a token\'s text, or {"content": its text}'}


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fits(rule: Rule, v) -> bool:
    """v is of rule's type (the range aside)."""
    kind = rule.kind
    if kind == "whole":
        return _whole(v) and v > 0
    if kind == "number":
        return _number(v) and v > 0
    if kind == "flag":
        return isinstance(v, bool)
    if kind == "text":
        return isinstance(v, str) and (not rule.choices or v in rule.choices)
    if kind == "id":
        return _whole(v) and v >= 0
    if kind == "ids":
        return all(_whole(i) and i >= 0 for i in (v if isinstance(v, list) else [v]))
    content = v.get("content") if isinstance(v, dict) else v   # token
    return isinstance(content, str)


def problem(key: str, value) -> str | None:
    """See the module docstring. A key without a rule is not checked here (None)."""
    rule = RULES.get(key)
    if rule is None:
        return None
    if rule.kind == "knob":
        why = knob_problem(key, value)
        why = None if why is None else why.split(", not ")[0].replace(" or None", "")   # the value is named here
        return None if why is None else f"{key} = {value!r}; {why.replace(key + ' must', 'it must', 1)}"
    if not _fits(rule, value):
        what = "a finite positive number" if rule.kind == "number" else \
            "a whole number of at least 1" if rule.kind == "whole" else \
            f"one of {', '.join(repr(c) for c in rule.choices)}" if rule.choices else WHAT[rule.kind]
        return f"{key} = {value!r}; it must be {what}"
    if rule.kind in ("whole", "number") and not rule.low <= value <= rule.high:
        return (f"{key} = {value!r}, outside the range a real model could have ({rule.low:g} to {rule.high:g}; "
                f"BitNet b1.58 2B-4T has {rule.example:g})")
    return None
