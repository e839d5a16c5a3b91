"""The non-tensor half of a Hugging Face BitNet checkpoint folder: config, tokenizer, chat template,
generation settings and block-diffusion (DLM) settings, checked and normalized for the engine file.

not_bitnet_reason(raw, where) -> None, or why config.json is not a model this app runs (the one rule,
                                 used by the Hub download before fetching weights and by the converter)
read_model_config(folder) -> (normalized config dict, raw config.json dict)
read_quant_config(raw)    -> (quant_method, linear_class or None, quantization_mode or None)
read_text_meta(folder, config, raw) -> the metadata keys the model layer needs (tokenizer_json, stop_ids, ...)
Every problem raises ConvertError with what is wrong and what to do.
"""
import json
import os

from ..params import DEFAULT_ATTENTION, DEFAULT_BLOCK_SIZE

MASK_TOKEN = "|<MASK>|"          # the mask token of BitNet DLM checkpoints (tokenizer resized to 128257 rows)
DEFAULT_ROPE_THETA = 500000.0    # transformers BitNetConfig.default_theta
ARCH = "BitNetForCausalLM"


class ConvertError(ValueError):
    """A checkpoint that cannot be converted; the message says what is wrong and what to do."""
    kind = "bad_checkpoint"


class NotBitNet(ConvertError):
    """config.json describes another architecture (see not_bitnet_reason)."""
    kind = "not_bitnet"


def read_json(folder: str, name: str, required: bool = False):
    """Parsed JSON of folder/name, or None when absent and not required."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        if required:
            raise ConvertError(f"{name} is missing from {folder}. Download the complete checkpoint "
                               f"(config.json, tokenizer.json and the .safetensors files).")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConvertError(f"{path} is not valid JSON ({exc}). Download the checkpoint again.") from exc


def not_bitnet_reason(raw: dict, where: str) -> str | None:
    """None when config.json (raw) describes the architecture the engine implements (model_type "bitnet"
    or BitNetForCausalLM), else a message saying what it is and what to do. A Llama with BitNet
    quantization is refused too: it lacks the BitNet sub-norms, so the converter could not run it."""
    archs = [str(a) for a in raw.get("architectures") or []]
    if str(raw.get("model_type", "")).lower() == "bitnet" or ARCH in archs:
        return None
    return (f"{where} holds a {raw.get('model_type')!r} model ({', '.join(archs) or 'no architectures listed'}), "
            f"not {ARCH}. This app runs BitNet b1.58 models only: use one such as microsoft/bitnet-b1.58-2B-4T.")


def read_model_config(folder: str) -> tuple[dict, dict]:
    """config.json -> (engine config, raw). Accepts the flat `rope_theta` of the real checkpoints and the
    `rope_parameters` dict newer transformers writes."""
    raw = read_json(folder, "config.json", required=True)
    reason = not_bitnet_reason(raw, folder)
    if reason:
        raise NotBitNet(reason)
    if raw.get("hidden_act", "relu2") != "relu2":
        raise ConvertError(f"hidden_act {raw['hidden_act']!r} is not supported (BitNet b1.58 uses relu2). "
                           f"Use a BitNet b1.58 checkpoint.")
    if raw.get("attention_bias"):
        raise ConvertError("attention_bias=true is not supported (BitNet b1.58 has no biases). "
                           "Use a BitNet b1.58 checkpoint.")
    try:
        D, H = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        cfg = {
            "hidden_size": D,
            "intermediate_size": int(raw["intermediate_size"]),
            "num_hidden_layers": int(raw["num_hidden_layers"]),
            "num_attention_heads": H,
            "num_key_value_heads": int(raw.get("num_key_value_heads") or H),
            "head_dim": int(raw.get("head_dim") or D // H),
            "vocab_size": int(raw["vocab_size"]),
            "max_position_embeddings": int(raw.get("max_position_embeddings", 2048)),
            "rope_theta": _rope_theta(raw),
            "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-5)),
            "bos_token_id": raw.get("bos_token_id"),
            "eos_token_id": raw.get("eos_token_id"),
        }
    except KeyError as exc:
        raise ConvertError(f"config.json in {folder} lacks {exc.args[0]!r}. Download the checkpoint again.") from exc
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ConvertError(f"config.json in {folder} has an invalid value ({exc}). Download the checkpoint again.") from exc
    if min(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], H, cfg["num_key_value_heads"],
           cfg["head_dim"], cfg["vocab_size"], cfg["max_position_embeddings"]) <= 0:
        raise ConvertError(f"config.json in {folder} has a size that is not positive: {cfg}. Fix config.json or download the checkpoint again.")
    if H * cfg["head_dim"] != D:
        raise ConvertError(f"num_attention_heads x head_dim = {H} x {cfg['head_dim']} != hidden_size {D}; the BitNet "
                           f"attention sub-norm needs them equal. Fix head_dim in config.json or use an unmodified checkpoint.")
    if H % cfg["num_key_value_heads"] or cfg["head_dim"] % 2:
        raise ConvertError(f"{H} attention heads cannot share {cfg['num_key_value_heads']} KV heads, or head_dim "
                           f"{cfg['head_dim']} is odd. Fix config.json or use an unmodified checkpoint.")
    return cfg, raw


def projection_shapes(cfg: dict) -> dict:
    """Logical [out N, in K] of the seven ternary projections of one layer (cfg: the normalized config)."""
    D, I, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return {"self_attn.q_proj": (q, D), "self_attn.k_proj": (kv, D), "self_attn.v_proj": (kv, D),
            "self_attn.o_proj": (D, q), "mlp.gate_proj": (I, D),
            "mlp.up_proj": (I, D), "mlp.down_proj": (D, I)}


def ternary_weight_count(cfg: dict) -> int:
    """Ternary weights of the whole model (cfg: the normalized config): every layer's seven projections."""
    return cfg["num_hidden_layers"] * sum(n * k for n, k in projection_shapes(cfg).values())


def _rope_theta(raw: dict) -> float:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None):
        raise ConvertError(f"RoPE scaling {kind!r} is not supported (only plain RoPE). Use a checkpoint without rope scaling.")
    return float(raw.get("rope_theta") or params.get("rope_theta") or DEFAULT_ROPE_THETA)


def read_quant_config(raw: dict) -> tuple[str | None, str | None, str | None]:
    """quantization_config -> (quant_method, linear_class, quantization_mode); None where a key is absent."""
    qc = raw.get("quantization_config") or {}
    method, lc, mode = qc.get("quant_method"), qc.get("linear_class"), qc.get("quantization_mode")
    if qc and method != "bitnet":
        raise ConvertError(f"quantization method {method!r} is not supported (only 'bitnet' 1.58-bit weights). "
                           f"Use a BitNet b1.58 checkpoint.")
    if lc not in (None, "autobitlinear", "bitlinear"):
        raise ConvertError(f"quantization_config.linear_class {lc!r} is not supported (autobitlinear or bitlinear). Use a BitNet b1.58 checkpoint.")
    if mode not in (None, "offline", "online"):
        raise ConvertError(f"quantization_config.quantization_mode {mode!r} is not supported (offline or online). Use a BitNet b1.58 checkpoint.")
    if qc.get("use_rms_norm"):
        raise ConvertError("quantization_config.use_rms_norm=true (an extra RMSNorm inside every linear) is not "
                           "supported by the engine. Use a checkpoint without it.")
    return method, lc, mode


def read_text_meta(folder: str, config: dict, raw: dict | None = None) -> dict:
    """config: the normalized config; raw: config.json as read (for bd_size).
    Returns tokenizer_json, tokenizer_config, generation_config, chat_template, stop_ids, bos_id, mask_id, diffusion."""
    tok_path = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(tok_path):
        raise ConvertError(f"tokenizer.json is missing from {folder}. Download it with the checkpoint "
                           f"(the app needs the Hugging Face fast tokenizer file).")
    try:
        with open(tok_path, encoding="utf-8") as f:
            tok_text = f.read()
        tok = json.loads(tok_text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConvertError(f"{tok_path} is not a valid tokenizer file ({exc}). Download it again.") from exc
    tc = read_json(folder, "tokenizer_config.json") or {}
    gc = read_json(folder, "generation_config.json") or {}
    dlm = read_json(folder, "dlm_config.json")
    V = config["vocab_size"]

    stops = gc.get("eos_token_id", config.get("eos_token_id"))
    stop_ids = [int(s) for s in (stops if isinstance(stops, list) else [stops]) if s is not None]
    bos = config.get("bos_token_id")
    if bos is None:
        bos = gc.get("bos_token_id")

    mask_id = (dlm or {}).get("mask_token_id")
    if mask_id is None:
        mask_id = _token_id(tok, MASK_TOKEN)
    if mask_id is not None and not 0 <= int(mask_id) < V:
        raise ConvertError(f"mask token id {mask_id} is outside the {V} embedding rows. The DLM checkpoint is "
                           f"inconsistent: fix mask_token_id in dlm_config.json, or use a checkpoint whose embedding has a mask row.")
    for sid in stop_ids:
        if not 0 <= sid < V:
            raise ConvertError(f"stop token id {sid} is outside the {V} embedding rows; fix eos_token_id in "
                               f"generation_config.json / config.json.")

    block = (dlm or {}).get("bd_size") or (dlm or {}).get("block_size") or (raw or {}).get("bd_size") or DEFAULT_BLOCK_SIZE
    return {
        "tokenizer_json": tok_text,
        "tokenizer_config": tc,
        "generation_config": gc,
        "chat_template": _chat_template(folder, tc),
        "stop_ids": stop_ids,
        "bos_id": None if bos is None else int(bos),
        "mask_id": None if mask_id is None else int(mask_id),
        "diffusion": {"block_size": int(block), "attention": _dlm_attention(dlm),
                      "trained": dlm is not None or mask_id is not None},
    }


def _token_id(tok: dict, content: str):
    for t in tok.get("added_tokens") or []:
        if t.get("content") == content:
            return int(t["id"])
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and content in vocab:
        return int(vocab[content])
    return None


def _chat_template(folder: str, tc: dict):
    """tokenizer_config.json's chat_template (a string, or a list of named ones: take "default"),
    else chat_template.jinja, else chat_template.json; None when the checkpoint has none."""
    t = tc.get("chat_template")
    if isinstance(t, list):
        named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    if isinstance(t, str):
        return t
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    js = read_json(folder, "chat_template.json")
    if isinstance(js, dict) and isinstance(js.get("chat_template"), str):
        return js["chat_template"]
    return None


def _dlm_attention(dlm) -> str:
    """"block" (bidirectional inside a block) or "causal"; DLM configs name the key variously, and one
    that names none means Fast-dLLM v2's block pattern. No dlm_config.json: DEFAULT_ATTENTION."""
    if dlm is None:
        return DEFAULT_ATTENTION
    for key in ("attention", "attention_pattern", "attn_pattern", "attention_type", "attention_mask"):
        v = dlm.get(key)
        if isinstance(v, str):
            v = v.lower()
            if "block" in v or "bidirectional" in v:
                return "block"
            if "causal" in v:
                return "causal"
            raise ConvertError(f"dlm_config.json {key}={v!r} is not an attention pattern this app knows "
                               f"(block or causal). Fix dlm_config.json.")
    return "block"
