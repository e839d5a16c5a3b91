"""The non-tensor half of a Hugging Face BitNet checkpoint folder: config, tokenizer, chat template,
generation settings and block-diffusion (DLM) settings, checked and normalized for the engine file.

The family's rules (defaults, sub-norms, prompt format...) come from its record in checkpoint/families.py;
whether sub-norms exist and whether the head is tied is finally decided by the tensors (convert.py). The
tokenizer and the chat template are checked by text/ (the code that later uses them).

not_bitnet_reason(raw, where) -> None, or why config.json is not a model this app runs (the one rule,
                                 used by the Hub download before fetching weights and by the converter)
read_model_config(folder) -> (normalized config dict, raw config.json dict)
read_quant_config(raw)    -> (quant_method, linear_class or None, quantization_mode or None)
read_text_meta(folder, config, raw) -> the metadata keys the model layer needs (tokenizer_json, stop_ids, ...)
Every problem raises ConvertError with what is wrong and what to do.
"""
import json
import math
import os

from ..engine.file import PLAIN_ATTENTION, TRAINED_BLOCK_SIZE
from ..engine.key_rules import RULES, WHAT, problem
from ..engine.rope import ROPE_SCALING_KEYS
from ..engine.sizes import projection_shapes, ternary_weight_count  # noqa: F401 (convert.py's)
from ..engine.validate import ACTIVATIONS, config_problem
from .families import FAMILIES, Family, architectures_of, family_of
from .files import JSON_LIMIT, TEMPLATE_LIMIT, TOKENIZER_LIMIT, CheckpointFileError, check_inside, read_text

MASK_TOKEN = "|<MASK>|"          # the mask token of BitNet DLM checkpoints (tokenizer resized to 128257 rows)


class ConvertError(ValueError):
    """A checkpoint that cannot be converted; the message says what is wrong and what to do."""
    kind = "bad_checkpoint"


class NotBitNet(ConvertError):
    """config.json describes another architecture (see not_bitnet_reason)."""
    kind = "not_bitnet"


def read_json(folder: str, name: str, required: bool = False, kind=dict):
    """Parsed JSON of folder/name (a regular file of at most JSON_LIMIT bytes holding a `kind`, a JSON
    object by default), or None when absent and not required."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        if required:
            raise ConvertError(f"{name} is missing from {folder}. Download the complete checkpoint "
                               f"(config.json, tokenizer.json and the .safetensors files).")
        return None
    try:
        value = json.loads(read_text(path, JSON_LIMIT))
    except CheckpointFileError as exc:
        raise ConvertError(str(exc)) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConvertError(f"{path} is not valid JSON ({exc}). Download the checkpoint again.") from None
    if kind is not None and not isinstance(value, kind):
        raise ConvertError(f"{path} holds a JSON {type(value).__name__}, not an object. Download the checkpoint again.")
    return value


def _value(raw: dict, key: str, where: str = "config.json", default=None, required: bool = False):
    """raw[key] checked by its rule (engine/key_rules.py: the type strictly, then the range): "false" is not a
    boolean, 1.5 and true are not whole numbers, "64" is no number. Absent or null: `default`, or an error when
    required. The message names the file, the key and the value."""
    v = raw.get(key)
    if v is None:
        if required:
            raise ConvertError(f"{where} has no value for {key}; it must be {WHAT.get(RULES[key].kind, 'a number')}. "
                               f"Fix {where} or download the checkpoint again.")
        return default
    why = problem(key, v)
    if why:
        raise ConvertError(f"{where} has {why}. Fix {where} or download the checkpoint again.")
    return v


def _ids(value, key: str, where: str) -> list[int]:
    """A token id or a list of them (eos_token_id may be either), by the rule of `key`; None: none."""
    if value is None:
        return []
    why = problem(key, value)
    if why:
        raise ConvertError(f"{where} has {why}. Fix {where} or download the checkpoint again.")
    return list(value) if isinstance(value, list) else [value]


def not_bitnet_reason(raw: dict, where: str) -> str | None:
    """None when config.json (raw) describes a model the engine implements (a family of families.py), else a
    message saying what it is and what to do. Used before any weights are downloaded."""
    if family_of(raw) is not None:
        return None
    archs = architectures_of(raw)
    qc = raw.get("quantization_config")
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    what = f"a {raw.get('model_type')!r} model ({', '.join(archs) or 'no architectures listed'})"
    if method == "bitnet":
        runs = ", or ".join(t + (f" with quant_method {f.quant_method!r}" if f.quant_method else "")
                            for f in FAMILIES.values() for t in f.model_types)
        why = f"it has BitNet quantization, but model_type {raw.get('model_type')!r} is not one this app runs ({runs})"
    elif method is not None:
        why = f"its quantization_config.quant_method is {method!r}, not 'bitnet' (1.58-bit ternary weights)"
    else:
        why = "it has no BitNet quantization (no quantization_config with quant_method 'bitnet')"
    kinds = [f.described_as for f in FAMILIES.values()]
    return (f"{where} holds {what}: {why}. This app runs 1.58-bit BitNet models only: use "
            f"{', '.join(kinds[:-1])} or {kinds[-1]}.")


def read_model_config(folder: str) -> tuple[dict, dict]:
    """config.json -> (engine config, raw). Accepts the flat `rope_theta` of the real checkpoints and the
    `rope_parameters` dict newer transformers writes."""
    raw = read_json(folder, "config.json", required=True)
    archs = raw.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ConvertError(f"config.json in {folder} has architectures = {str(archs)[:80]}; it must be a list of class "
                           'names such as ["BitNetForCausalLM"]. Fix config.json or download the checkpoint again.')
    reason = not_bitnet_reason(raw, folder)
    if reason:
        raise NotBitNet(reason)
    fam = family_of(raw)
    act = fam.activation if raw.get("hidden_act") is None else raw["hidden_act"]
    if act not in ACTIVATIONS:
        raise ConvertError(f"config.json has hidden_act = {act!r}; the engine runs relu2 (BitNet b1.58) and silu "
                           "(the Llama family). Use a checkpoint with one of those.")
    for key in ("attention_bias", "mlp_bias"):
        if _value(raw, key):
            raise ConvertError(f"config.json has {key} = {raw[key]!r}; the engine has no biases (no 1.58-bit model "
                               "it runs uses them). Use a checkpoint without biases.")
    prf = raw.get("partial_rotary_factor", 1.0)
    if prf is not None and (isinstance(prf, bool) or prf != 1):   # true == 1 in Python, but is no factor
        raise ConvertError(f"config.json has partial_rotary_factor = {prf!r}; the engine rotates whole heads (1.0). "
                           "Use a checkpoint without partial rotary embeddings.")
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                           "vocab_size") if k not in raw]
    if missing:
        raise ConvertError(f"config.json in {folder} lacks {missing[0]!r}. Download the checkpoint again.")
    D, H = _value(raw, "hidden_size", required=True), _value(raw, "num_attention_heads", required=True)
    kvh, hd = _value(raw, "num_key_value_heads"), _value(raw, "head_dim")
    if hd is None:
        hd = D // H if H > 0 else 0   # 0: refused below with the other sizes
    cfg = {
        "hidden_size": D,
        "intermediate_size": _value(raw, "intermediate_size", required=True),
        "num_hidden_layers": _value(raw, "num_hidden_layers", required=True),
        "num_attention_heads": H,
        "num_key_value_heads": kvh or H,
        "head_dim": hd,
        "vocab_size": _value(raw, "vocab_size", required=True),
        "max_position_embeddings": _value(raw, "max_position_embeddings", default=2048),
        "rope_theta": _rope_theta(raw, fam.rope_theta),
        "rope_scaling": _rope_scaling(raw, fam),
        "rms_norm_eps": float(_value(raw, "rms_norm_eps", default=fam.rms_norm_eps)),
        "hidden_act": act,
        # provisional, from the family; convert.py sets both from the tensors it finds
        "sub_norms": fam.sub_norms is not None,
        "tie_word_embeddings": _value(raw, "tie_word_embeddings") is not False,
        "bos_token_id": _value(raw, "bos_token_id"),   # one id (eos may be a list)
        "eos_token_id": raw.get("eos_token_id"),
    }
    for key in ("bos_token_id", "eos_token_id"):
        for i in _ids(cfg[key], key, "config.json"):
            if not 0 <= i < cfg["vocab_size"]:
                raise ConvertError(f"config.json has {key} {i}, outside the {cfg['vocab_size']} embedding rows. Fix "
                                   "config.json or download the checkpoint again.")
    if kvh is not None and kvh <= 0:
        raise ConvertError(f"config.json has num_key_value_heads = {kvh}; it must be positive (or absent: as many "
                           "as the attention heads). Fix config.json.")
    if min(cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                             "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")) <= 0:
        raise ConvertError(f"config.json in {folder} has a size that is not positive: {cfg}. Fix config.json or download the checkpoint again.")
    if H * cfg["head_dim"] != D:
        raise ConvertError(f"config.json has num_attention_heads x head_dim = {H} x {cfg['head_dim']} = "
                           f"{H * cfg['head_dim']}, not hidden_size {D}; the engine needs them equal (every model it "
                           "runs has them equal). Fix head_dim in config.json or use an unmodified checkpoint.")
    if H % cfg["num_key_value_heads"] or cfg["head_dim"] % 2:
        raise ConvertError(f"{H} attention heads cannot share {cfg['num_key_value_heads']} KV heads, or head_dim "
                           f"{cfg['head_dim']} is odd. Fix config.json or use an unmodified checkpoint.")
    problem = config_problem(cfg)  # the engine file's own rule (ranges), so a converted file always opens
    if problem:
        raise ConvertError(f"config.json in {folder} {problem}. Fix config.json or use an unmodified checkpoint.")
    return cfg, raw


def _rope_params(raw: dict) -> tuple[str, dict]:
    """(the key it came from, the dict): rope_parameters (newer transformers) or rope_scaling (older)."""
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if params is not None:
            if not isinstance(params, dict):
                raise ConvertError(f"config.json has {key} = {params!r}, not an object. Fix config.json.")
            return key, params
    return "rope_scaling", {}


def _rope_theta(raw: dict, default: float) -> float:
    _, params = _rope_params(raw)
    if raw.get("rope_theta") is not None:
        return float(_value(raw, "rope_theta"))
    return float(_value(params, "rope_theta", default=default))


def _rope_scaling(raw: dict, fam: Family) -> dict | None:
    """None (plain RoPE) or the llama3 rule's parameters (engine/rope.py); a kind the family does not list
    (families.py rope_scalings) is refused."""
    key, params = _rope_params(raw)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("default", None):
        return None
    if kind not in fam.rope_scalings:
        raise ConvertError(f"config.json has {key}.rope_type = {kind!r}; the engine runs plain RoPE and the "
                           f"{' and '.join(fam.rope_scalings)} rope scaling only. Use a checkpoint without that rope "
                           "scaling.")
    out = {"rope_type": "llama3"}
    for k in ROPE_SCALING_KEYS:
        v = params.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ConvertError(f"config.json has {key}.{k} = {v!r}; the llama3 rope scaling needs it as a finite "
                               "positive number. Fix config.json or download the checkpoint again.")
        out[k] = v
    if out["high_freq_factor"] <= out["low_freq_factor"]:
        raise ConvertError(f"config.json has {key}.high_freq_factor = {out['high_freq_factor']!r} <= low_freq_factor "
                           f"{out['low_freq_factor']!r}; the llama3 rule needs high > low. Fix config.json.")
    return out


def read_quant_config(raw: dict) -> tuple[str | None, str | None, str | None]:
    """quantization_config -> (quant_method, linear_class, quantization_mode); None where a key is absent."""
    qc = raw.get("quantization_config")
    qc = {} if qc is None else qc   # absent; [], "" or 0 are as wrong as "x"
    if not isinstance(qc, dict):
        raise ConvertError(f"config.json has quantization_config = {qc!r}, not an object. Fix config.json.")
    method, lc, mode = qc.get("quant_method"), qc.get("linear_class"), qc.get("quantization_mode")
    if qc and method != "bitnet":
        raise ConvertError(f"quantization method {method!r} is not supported (only 'bitnet' 1.58-bit weights). "
                           f"Use a BitNet b1.58 checkpoint.")
    if lc not in (None, "autobitlinear", "bitlinear"):
        raise ConvertError(f"quantization_config.linear_class {lc!r} is not supported (autobitlinear or bitlinear). Use a BitNet b1.58 checkpoint.")
    if mode not in (None, "offline", "online"):
        raise ConvertError(f"quantization_config.quantization_mode {mode!r} is not supported (offline or online). Use a BitNet b1.58 checkpoint.")
    if _value(qc, "use_rms_norm", "config.json's quantization_config"):
        raise ConvertError("quantization_config.use_rms_norm=true (an extra RMSNorm inside every linear) is not "
                           "supported by the engine. Use a checkpoint without it.")
    return method, lc, mode


def read_text_meta(folder: str, config: dict, raw: dict | None = None) -> dict:
    """config: the normalized config; raw: config.json as read (for bd_size).
    Returns tokenizer_json, tokenizer_config, generation_config, chat_template, prompt_format, stop_ids, bos_id,
    mask_id, diffusion. prompt_format: "chat", or for a checkpoint without a chat template its family's
    prompt_without_template (families.py: "chat" with the BitNet template, or "completion": a base model)."""
    # imported here: `tokenizers` and jinja2 load only when a checkpoint is converted
    from ..text.chat import BITNET_CHAT_TEMPLATE, ChatTemplateError, check_template_syntax
    from ..text.tokenizer import TokenizerError
    from ..text.tokenizer_checks import check_tokenizer, token_id_in_json

    tok_path = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(tok_path):
        raise ConvertError(f"tokenizer.json is missing from {folder}. Download it with the checkpoint "
                           f"(the app needs the Hugging Face fast tokenizer file).")
    try:
        tok_text = read_text(tok_path, TOKENIZER_LIMIT)
        tok = json.loads(tok_text)
    except CheckpointFileError as exc:
        raise ConvertError(str(exc)) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConvertError(f"{tok_path} is not a valid tokenizer file ({exc}). Download it again.") from None
    if not isinstance(tok, dict):
        raise ConvertError(f"{tok_path} is not a tokenizer (not a JSON object). Download it again.")
    tc = read_json(folder, "tokenizer_config.json") or {}
    gc = read_json(folder, "generation_config.json") or {}
    dlm = read_json(folder, "dlm_config.json")
    V = config["vocab_size"]

    stops = gc.get("eos_token_id", config.get("eos_token_id"))
    stop_ids = _ids(stops, "eos_token_id", "generation_config.json / config.json")
    bos = config.get("bos_token_id")
    if bos is None:
        bos = _value(gc, "bos_token_id", "generation_config.json")
    if bos is not None and not 0 <= bos < V:
        raise ConvertError(f"bos_token_id {bos} is outside the {V} embedding rows; fix config.json.")

    mask_id = _value(dlm or {}, "mask_token_id", "dlm_config.json")
    if mask_id is None:
        mask_id = token_id_in_json(tok, MASK_TOKEN)
    if mask_id is not None and not 0 <= int(mask_id) < V:
        raise ConvertError(f"mask token id {mask_id} is outside the {V} embedding rows. The DLM checkpoint is "
                           f"inconsistent: fix mask_token_id in dlm_config.json, or use a checkpoint whose embedding has a mask row.")
    for sid in stop_ids:
        if not 0 <= sid < V:
            raise ConvertError(f"stop token id {sid} is outside the {V} embedding rows; fix eos_token_id in "
                               f"generation_config.json / config.json.")

    block = _block_size(dlm, raw, config["max_position_embeddings"])
    for key in ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty", "bos_token_id"):   # stored
        _value(gc, key, "generation_config.json")
    for key in ("bos_token", "eos_token", "add_bos_token"):
        _value(tc, key, "tokenizer_config.json")
    template = _chat_template(folder, tc)
    try:
        check_template_syntax(template)
    except ChatTemplateError as exc:
        raise ConvertError(str(exc)) from None
    fam = family_of(raw or {})
    prompt_format = fam.prompt_without_template if template is None and fam is not None else "chat"
    named = {"bos_token_id": bos, "the mask token id": mask_id,
             **{f"stop id {i} (eos_token_id)": i for i in stop_ids + _ids(config.get("eos_token_id"), "", "")}}
    texts = {f"tokenizer_config.json's {k}": _token_text(tc.get(k)) for k in ("bos_token", "eos_token")}
    bos_text = texts["tokenizer_config.json's bos_token"]
    if bos is not None and bos_text is not None and token_id_in_json(tok, bos_text) not in (None, bos):
        raise ConvertError(f"config.json's bos_token_id is {bos}, but tokenizer_config.json's bos_token {bos_text!r} is "
                           f"token {token_id_in_json(tok, bos_text)} of {tok_path}: they do not agree. Use the "
                           "checkpoint's original files (download it again).")
    try:   # the tokenizer agrees with the ids above and with the template the model will render
        check_tokenizer(tok_text, tok_path, V, {k: v for k, v in named.items() if v is not None},
                        template if template is not None or prompt_format != "chat" else BITNET_CHAT_TEMPLATE,
                        {k: v for k, v in texts.items() if v is not None})
    except TokenizerError as exc:
        raise ConvertError(str(exc)) from None
    return {
        "tokenizer_json": tok_text,
        "tokenizer_config": tc,
        "generation_config": gc,
        "chat_template": template,
        "prompt_format": prompt_format,
        "stop_ids": stop_ids,
        "bos_id": None if bos is None else int(bos),
        "mask_id": None if mask_id is None else int(mask_id),
        "diffusion": {"block_size": int(block), "attention": _dlm_attention(dlm),
                      "trained": dlm is not None or mask_id is not None, **_dlm_decoding(dlm, int(block))},
    }


def _block_size(dlm: dict | None, raw: dict | None, context: int) -> int:
    """The diffusion block size: dlm_config.json's bd_size (or block_size), else config.json's bd_size, else
    TRAINED_BLOCK_SIZE; the first that is set is taken (0 is a value, refused like -1, never skipped). Any size from 1
    to the context decodes with the defaults: the default sub-block divides it (params.default_sub_block)."""
    for where, source, key in (("dlm_config.json", dlm or {}, "bd_size"), ("dlm_config.json", dlm or {}, "block_size"),
                               ("config.json", raw or {}, "bd_size")):
        block = _value(source, key, where)
        if block is not None:
            if block > context:
                raise ConvertError(f"{where} has {key} = {block}, longer than the model's context of {context} "
                                   f"tokens (max_position_embeddings). Fix {where}: the block size the model was "
                                   "trained with (32 for Fast-dLLM v2).")
            return block
    return TRAINED_BLOCK_SIZE


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}; None for anything else."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _dlm_decoding(dlm, block: int) -> dict:
    """The decoding knobs a DLM checkpoint suggests (dlm_config.json sub_block_size, threshold), checked, for the
    app to start from; the keys it names, none when there is no dlm_config.json."""
    out = {}
    sub = _value(dlm or {}, "sub_block_size", "dlm_config.json")
    if sub is not None:
        if sub > block or block % sub:
            raise ConvertError(f"sub_block_size {sub!r} in dlm_config.json must be a whole number that divides the "
                               f"block size {block} (e.g. 8 for 32). Fix dlm_config.json or remove the key.")
        out["sub_block_size"] = sub
    thr = _value(dlm or {}, "threshold", "dlm_config.json")
    if thr is not None:
        out["threshold"] = float(thr)
    return out


def _chat_template(folder: str, tc: dict):
    """tokenizer_config.json's chat_template (a string, or a list of named ones: take "default"),
    else chat_template.jinja, else chat_template.json; None when the checkpoint has none."""
    t = tc.get("chat_template")
    if t is not None and not isinstance(t, (str, list)):
        raise ConvertError(f"tokenizer_config.json has a chat_template that is a {type(t).__name__}, not text. Fix it "
                           "or download the checkpoint again.")
    if isinstance(t, list):
        named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    if isinstance(t, str):
        if len(t) > TEMPLATE_LIMIT:
            raise ConvertError(f"the chat template in tokenizer_config.json is over {TEMPLATE_LIMIT >> 20} MB. Use the "
                               "checkpoint's original tokenizer_config.json.")
        return t
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.lexists(jinja):
        try:
            check_inside(jinja, folder)
            return read_text(jinja, TEMPLATE_LIMIT)
        except CheckpointFileError as exc:
            raise ConvertError(str(exc)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConvertError(f"{jinja} cannot be read ({exc}). Download the checkpoint again.") from None
    if os.path.lexists(os.path.join(folder, "chat_template.json")):
        try:
            check_inside(os.path.join(folder, "chat_template.json"), folder)
        except CheckpointFileError as exc:
            raise ConvertError(str(exc)) from None
    js = read_json(folder, "chat_template.json")
    if isinstance(js, dict) and isinstance(js.get("chat_template"), str):
        return js["chat_template"]
    return None


def _dlm_attention(dlm) -> str:
    """"block" (bidirectional inside a block) or "causal"; DLM configs name the key variously, and one
    that names none means Fast-dLLM v2's block pattern. No dlm_config.json: PLAIN_ATTENTION."""
    if dlm is None:
        return PLAIN_ATTENTION
    for key in ("attention", "attention_pattern", "attn_pattern", "attention_type", "attention_mask"):
        v = _value(dlm, key, "dlm_config.json")
        if v is not None:
            v = v.lower()
            if "block" in v or "bidirectional" in v:
                return "block"
            if "causal" in v:
                return "causal"
            raise ConvertError(f"dlm_config.json {key}={v!r} is not an attention pattern this app knows "
                               f"(block or causal). Fix dlm_config.json.")
    return "block"
