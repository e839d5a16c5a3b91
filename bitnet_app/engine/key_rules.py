"""One rule per key for every value that enters from a file: a checkpoint's config.json, dlm_config.json,
generation_config.json and tokenizer_config.json (read by checkpoint/config.py at conversion), and the same keys
again in an engine file's metadata (engine/validate.py, at every open). Types are checked strictly, before ranges:
"false" is not a boolean (bool("false") is True), 1.5 and true are not whole numbers, "0.7" is not a number.

    problem(key, value) -> str | None    None when value suits key's rule, else "key = value; it must be ..." or
                                         "key = value, outside the range a real model could have (...)"
    RULES                                key -> Rule (kind, range, an example value for the message)

The callers put the file's name in front ("config.json has ...") and say what to do. The decode settings a
generation_config.json suggests are held to the decode knobs' ranges (params.py, which this layer does not import:
tests/test_hostile.py checks that the two agree), so that what a checkpoint suggests always runs.
"""
import math
from dataclasses import dataclass

MAX_CONTEXT = 1 << 20
C_INT_MAX = 2**31 - 1
ACTIVATIONS = ("relu2", "silu")


@dataclass(frozen=True)
class Rule:
    kind: str                  # whole (>= 1) | count (>= 0) | number | flag | text | id | ids | token
    low: float | None = None   # [low, high]: the range a real model's value lies in (generous)
    high: float | None = None
    example: object = None     # BitNet b1.58 2B-4T's value (or a real model's), for the message
    choices: tuple = ()        # text: the allowed strings (empty: any string)
    low_open: bool = False     # (low, high]
    zero: bool = False         # 0 is allowed below the range (temperature 0: greedy)
    range_is: str = "the range a real model could have"
    example_is: str = "BitNet b1.58 2B-4T has"


def _knob(low, high, example, **kw):
    """A decode setting's rule: params.py's range for the knob of the same name."""
    return Rule("count" if isinstance(low, int) and isinstance(high, int) else "number", low, high, example,
                range_is="the range the decoder takes", example_is="e.g.", **kw)


def _size(high, example):
    return Rule("whole", 1, high, example)


FLAG, ID, IDS, TEXT, TOKEN = Rule("flag"), Rule("id"), Rule("ids"), Rule("text"), Rule("token")
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
    "threshold": _knob(0.0, 1.0, 0.9, low_open=True), "mask_token_id": ID, "trained": FLAG,
    "attention": TEXT, "attention_pattern": TEXT, "attn_pattern": TEXT, "attention_type": TEXT,
    "attention_mask": TEXT,
    # generation_config.json: the decode knobs' own rules (params.py), so that what a checkpoint suggests runs
    "do_sample": FLAG, "temperature": _knob(0.01, 100.0, 0.6, zero=True), "top_p": _knob(0.0, 1.0, 0.9, low_open=True),
    "top_k": _knob(0, C_INT_MAX, 50), "repetition_penalty": _knob(0.01, 100.0, 1.0),
    # tokenizer_config.json
    "bos_token": TOKEN, "eos_token": TOKEN, "add_bos_token": FLAG,
}
WHAT = {"whole": "a whole number", "count": "a whole number >= 0", "flag": "true or false (a JSON boolean, not text or a number)",
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
    if kind == "count":
        return _whole(v) and v >= 0
    if kind == "number":
        return _number(v) and (v > 0 or (rule.zero and v == 0))
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
    if not _fits(rule, value):
        what = ("a finite number >= 0" if rule.zero else "a finite positive number") if rule.kind == "number" else \
            "a whole number of at least 1" if rule.kind == "whole" else \
            f"one of {', '.join(repr(c) for c in rule.choices)}" if rule.choices else WHAT[rule.kind]
        return f"{key} = {value!r}; it must be {what}"
    if rule.kind not in ("whole", "count", "number") or (rule.zero and value == 0):
        return None
    if value > rule.high or value < rule.low or (rule.low_open and value == rule.low):
        span = f"{'(' if rule.low_open else '['}{rule.low:g}, {rule.high:g}]" + (" or 0" if rule.zero else "")
        return f"{key} = {value!r}, outside {rule.range_is} ({span}; {rule.example_is} {rule.example:g})"
    return None
