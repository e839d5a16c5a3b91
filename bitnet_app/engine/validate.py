"""What an engine file's metadata must hold before anything in it is used (file.py calls these).

check_table(meta, size, ...) -> layout   the tensor table: known dtypes, shapes of whole numbers, nbytes equal
                                         to the shape's size, offsets aligned, after the metadata, in
                                         bounds and not overlapping; the layout block (data start, file size,
                                         chunk sums) consistent with the file
check_meta(meta, where)                  the config (config_problem), the ternary packing and the keys the model
                                         layer reads
config_problem(cfg) -> str | None        the hyper-parameters the engine runs on, each by its rule in
                                         key_rules.py (positive whole numbers, not booleans, not 1.5; a finite
                                         positive rope_theta and rms_norm_eps; each in the range a real model
                                         could have, REAL_RANGES),
                                         heads that divide evenly, a known activation, sub-norm and head
                                         flags, no rope scaling or a complete llama3 one

Every failure is an EngineFileError naming the file and saying "convert the checkpoint again"; the
converter uses config_problem too, so a checkpoint with such values is refused before conversion.
"""
import math

import numpy as np

from .key_rules import ACTIVATIONS, MAX_CONTEXT, RULES, problem
from .packing import PACKINGS
from .rope import ROPE_SCALING_KEYS

DTYPES = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int32": np.int32, "float32": np.float32}
# The range a real model's value lies in (generous: the largest models are far inside), and BitNet b1.58 2B-4T's
# own value for the message: key_rules.RULES. A value outside is a damaged or hostile config (rms_norm_eps 2^31 makes
# every output the same token), refused rather than run.
CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps")
REAL_RANGES = {k: (RULES[k].low, RULES[k].high, RULES[k].example) for k in CONFIG_KEYS}
ROPE_SCALING_RANGES = {"factor": 1024.0, "low_freq_factor": 1024.0, "high_freq_factor": 1024.0,
                       "original_max_position_embeddings": float(MAX_CONTEXT)}  # llama3: 8, 1, 4, 8192


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class EngineFileError(ValueError):
    """A file that is not a (current, intact) engine file: the message says what to do."""


class NonFiniteLogits(EngineFileError):
    """The engine computed NaN or infinite logits: the file's weights hold values no real model has (engine/runtime.py
    stops the reply rather than sample from them)."""


def _fail(where: str, what: str):
    raise EngineFileError(f"{where} {what}. Convert the checkpoint again.")


def config_problem(cfg) -> str | None:
    """None when cfg holds usable hyper-parameters, else what is wrong with them."""
    if not isinstance(cfg, dict):
        return "has no config object"
    for key in CONFIG_KEYS + ("hidden_act", "sub_norms", "tie_word_embeddings"):
        why = problem(key, cfg.get(key))
        if why:
            return "has " + why
    h, g, hd, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["hidden_size"]
    if h * hd != d or h % g or hd % 2:
        return (f"has {h} heads x head_dim {hd} for hidden_size {d} with {g} KV heads (heads x head_dim must equal "
                "hidden_size, the KV heads divide the heads, head_dim is even)")
    return rope_scaling_problem(cfg.get("rope_scaling"))


def rope_scaling_problem(rs) -> str | None:
    """None for no rope scaling or a complete llama3 one (engine/rope.py), else what is wrong."""
    if rs is None:
        return None
    if not isinstance(rs, dict) or rs.get("rope_type") != "llama3":
        return f"has rope_scaling = {str(rs)[:120]}, which is not the llama3 rule (the only rope scaling supported)"
    for key in ROPE_SCALING_KEYS:
        v = rs.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            return f"has rope_scaling.{key} = {v!r}, which is not a finite positive number"
        if v > ROPE_SCALING_RANGES[key]:
            return (f"has rope_scaling.{key} = {v!r}, outside the range a real model could have (at most "
                    f"{ROPE_SCALING_RANGES[key]:g}; Llama 3.1 has factor 8, low and high freq factors 1 and 4, "
                    "original_max_position_embeddings 8192)")
    if rs["high_freq_factor"] <= rs["low_freq_factor"]:
        return (f"has rope_scaling high_freq_factor {rs['high_freq_factor']} <= low_freq_factor "
                f"{rs['low_freq_factor']} (the llama3 rule divides by their difference)")
    return None


def check_table(meta: dict, size: int, header_bytes: int, where: str, tensor_align: int, data_align: int) -> dict:
    """The layout block, once the tensor table and the layout are seen to fit the `size`-byte file."""
    layout, table = meta.get("layout"), meta.get("tensors")
    if not isinstance(layout, dict) or not isinstance(table, dict):
        _fail(where, "lacks its tensor table or layout")
    start, end, chunk = layout.get("data_start"), layout.get("file_bytes"), layout.get("chunk_bytes")
    sums = layout.get("chunk_sums")
    if not all(_whole(v) for v in (start, end, chunk)) or not isinstance(sums, list) or \
            not all(_whole(s) and 0 <= s < 1 << 64 for s in sums):
        _fail(where, "has a malformed layout block")
    if end != size:
        _fail(where, f"is {size} bytes but was written as {end} (truncated, extended or damaged)")
    if start < header_bytes or start % data_align or start > end or chunk <= 0 or chunk % 8 or \
            len(sums) != -(-(end - start) // chunk):
        _fail(where, "has an inconsistent layout block")
    spans = []
    for name, e in table.items():
        if not isinstance(e, dict):
            _fail(where, f"has a malformed entry for tensor {name!r}")
        dtype, shape, offset, nbytes = e.get("dtype"), e.get("shape"), e.get("offset"), e.get("nbytes")
        if dtype not in DTYPES or not isinstance(shape, list) or not all(_whole(d) and 0 <= d <= 1 << 40 for d in shape) \
                or not _whole(offset) or not _whole(nbytes):
            _fail(where, f"has a malformed entry for tensor {name!r}")
        if nbytes != math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize:
            _fail(where, f"gives tensor {name!r} {nbytes} bytes for shape {shape} of {dtype}")
        if offset % tensor_align or offset < start or offset + nbytes > end:
            _fail(where, f"places tensor {name!r} at [{offset}, {offset + nbytes}), outside the aligned data "
                         f"region [{start}, {end})")
        spans.append((offset, offset + nbytes, name))
    spans.sort()
    for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            _fail(where, f"has overlapping tensors {n0!r} and {n1!r}")
    return layout


def check_meta(meta: dict, where: str) -> None:
    """The config and the metadata the model layer reads (ids in range, text where text is expected)."""
    problem = config_problem(meta.get("config"))
    if problem:
        _fail(where, problem)
    cfg = meta["config"]
    V = cfg["vocab_size"]
    names = meta["tensors"]
    for i in range(cfg["num_hidden_layers"]):
        for n in ("attn_sub_norm", "ffn_sub_norm"):
            if (f"layers.{i}.{n}" in names) != cfg["sub_norms"]:
                _fail(where, f"says sub_norms = {str(cfg['sub_norms']).lower()} but layers.{i}.{n} is "
                             f"{'present' if not cfg['sub_norms'] else 'missing'}")
    if ("lm_head" in names) == cfg["tie_word_embeddings"]:
        _fail(where, f"says tie_word_embeddings = {str(cfg['tie_word_embeddings']).lower()} but lm_head is "
                     f"{'present' if cfg['tie_word_embeddings'] else 'missing'}")
    stops = meta.get("stop_ids", [])
    if not isinstance(stops, list) or not all(_whole(i) and 0 <= i < V for i in stops):
        _fail(where, f"has stop_ids {str(stops)[:80]} outside the vocabulary of {V}")
    for key in ("bos_id", "mask_id"):
        v = meta.get(key)
        if v is not None and not (_whole(v) and 0 <= v < V):
            _fail(where, f"has {key} {v!r} outside the vocabulary of {V}")
    for key in ("tokenizer_json", "chat_template"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            _fail(where, f"has a {key} that is not text")
    for key in ("tokenizer_config", "generation_config", "diffusion", "source"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            _fail(where, f"has a {key} that is not an object")
    if meta.get("ternary_packing") not in PACKINGS:
        _fail(where, f"has a ternary_packing {str(meta.get('ternary_packing'))[:40]!r} (one of {', '.join(PACKINGS)})")
    if meta.get("prompt_format") not in (None, "chat", "completion"):
        _fail(where, f"has a prompt_format {meta['prompt_format']!r} (chat or completion)")
    _check_settings(meta, where)


def _check_settings(meta: dict, where: str) -> None:
    """The values the model layer reads from the checkpoint's settings, by the rules the converter held them to
    (key_rules): the diffusion block, generation_config.json's and tokenizer_config.json's."""
    d = meta.get("diffusion") or {}
    if d.get("attention") not in (None, "block", "causal"):
        _fail(where, f"has a diffusion attention {d['attention']!r} (block or causal)")
    for part, keys in (("diffusion", ("block_size", "sub_block_size", "threshold", "trained")),
                       ("generation_config", ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty",
                                              "bos_token_id", "eos_token_id")),
                       ("tokenizer_config", ("bos_token", "eos_token", "add_bos_token"))):
        values = meta.get(part) or {}
        for key in keys:
            why = None if values.get(key) is None else problem(key, values[key])
            if why:
                _fail(where, f"has {part} {why}")
    block, sub = d.get("block_size"), d.get("sub_block_size")
    if block is not None and sub is not None and block % sub:
        _fail(where, f"has a diffusion sub_block_size {sub} that does not divide its block_size {block}")
