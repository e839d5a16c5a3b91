"""Small random checkpoints of the public 1.58-bit families that are not BitNetForCausalLM, each in its real
Hugging Face on-disk layout (as the team's shared reference on model families describes it; that reference is
not in this repository, bitnet_app/checkpoint/families.py holds the rules the app follows), with the shapes
that set it apart:

  falcon3   tiiuae/Falcon3-*-1.58bit: LlamaForCausalLM + quantization_config {"quant_method": "bitnet"} (no
            linear_class: transformers' BitLinear, weight_scale = 1/mean|W| DIVIDES), packed U8; head_dim 256,
            3 query heads per KV head, untied bf16 lm_head, silu, no sub-norms, rope_theta 1000042, eos
            <|endoftext|> and no BOS, a <|system|>/<|user|>/<|assistant|> template
  llama3    HF1BitLLM/Llama3-8B-1.58-100B-tokens: the same layout, 4 query heads per KV head, rope_theta 500000,
            a Llama-3.1 style rope_scaling "llama3" (the engine's llama3 rule), BOS added by the tokenizer,
            the header template, eos <|eot_id|>
  1bitllm   1bitLLM/bitnet_b1_58-*: BitnetForCausalLM (custom code, model_type "llama"), no quantization_config,
            latent fp16 weights, sub-norms named self_attn.inner_attn_ln / mlp.ffn_layernorm, head_dim 100 with
            plain multi-head attention, vocabulary 32002, tied head, silu, a SentencePiece-style tokenizer with
            <unk> <s> </s> at 0 1 2, no chat template (a base model)
  falcon-e  a Falcon-E latent revision: LlamaForCausalLM with latent bf16 weights and quantization_config
            {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"},
            untied head, 2 query heads per KV head

make_family_checkpoint(folder, name) writes one (transformers' own LlamaForCausalLM / BitNetForCausalLM state
dict names and shapes, transformers' own pack_weights, safetensors' save_file) and returns a Truth dict.
For 1bitllm, whose custom code is not available, it also writes `<folder>-reference`: the same weights as
transformers' BitNetForCausalLM (hidden_act silu, online autobitlinear, the sub-norms under BitNet's names),
which computes what 1bitLLM's modeling_bitnet.py does. load_family_reference(truth) loads the reference
in float32 with every BitLinear's compute dtype set to float32 (that shared reference's "fp32 trap": BitLinear
computes in the dtype it was built with, bf16 from the checkpoint, whatever its parameters are cast to).
"""
import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

from checkpoints import _CORPUS, _dump, byte_level_bpe

FALCON3_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' + message['content'] + '<|endoftext|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 64}   # small, so all three regimes of the rule occur

# name -> the family's distinctive facts at a test size
FAMILIES = {
    "falcon3": dict(kind="llama-packed", hidden_size=768, intermediate_size=528, num_hidden_layers=2,
                    num_attention_heads=3, num_key_value_heads=1, head_dim=256, rope_theta=1000042.0,
                    rms_norm_eps=1e-6, tie=False, tokenizer="falcon3", template=FALCON3_TEMPLATE, extra_vocab=37,
                    seed=21),
    "llama3": dict(kind="llama-packed", hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                   num_attention_heads=8, num_key_value_heads=2, head_dim=16, rope_theta=500000.0,
                   rope_scaling=LLAMA3_ROPE_SCALING, rms_norm_eps=1e-5, tie=False, tokenizer="llama3",
                   template=LLAMA3_TEMPLATE, extra_vocab=5, seed=22),
    "1bitllm": dict(kind="1bitllm", hidden_size=200, intermediate_size=344, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=2, head_dim=100, rope_theta=10000.0,
                    rms_norm_eps=1e-5, tie=True, tokenizer="sentencepiece", template=None, vocab_size=32002,
                    seed=23),
    "falcon-e": dict(kind="llama-latent", hidden_size=128, intermediate_size=336, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=1000042.0,
                     rms_norm_eps=1e-6, tie=False, tokenizer="falcon3", template=FALCON3_TEMPLATE, extra_vocab=11,
                     seed=24),
}

PROJ_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
ONEBITLLM_SUB_NORMS = {"self_attn.attn_sub_norm": "self_attn.inner_attn_ln", "mlp.ffn_sub_norm": "mlp.ffn_layernorm"}


def toy_tokenizer(style: str) -> tuple[str, dict]:
    """(tokenizer.json text, {special token: id}) of a small trained tokenizer in the family's style:
    falcon3 (byte-level BPE, specials after the vocabulary, no post-processor), llama3 (byte-level BPE,
    Llama-3 specials, BOS added by a TemplateProcessing post-processor), sentencepiece (LLaMA-1 style:
    <unk> <s> </s> first, "▁" for spaces, byte fallback, BOS added by the post-processor)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    if style == "sentencepiece":
        specials = ["<unk>", "<s>", "</s>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        alphabet = [f"<0x{b:02X}>" for b in range(256)]
        trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=1, show_progress=False,
                                      special_tokens=specials + alphabet)
        tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
        ids = {s: tok.token_to_id(s) for s in specials}
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", ids["<s>"])])
        return tok.to_str(), ids
    tok = byte_level_bpe()
    if style == "falcon3":
        specials = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>"]
        tok.add_special_tokens(specials)
    elif style == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        tok.add_special_tokens(specials)
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos)])
    else:
        raise ValueError(f"unknown tokenizer style {style!r}")
    return tok.to_str(), {s: tok.token_to_id(s) for s in specials}


def _token_ids(style: str, ids: dict) -> dict:
    """bos (None: the family adds none), eos (config.json), stops (generation_config.json), eot."""
    if style == "falcon3":
        e = ids["<|endoftext|>"]
        return {"bos": None, "eos": e, "stops": [e], "eot": e}
    if style == "llama3":
        return {"bos": ids["<|begin_of_text|>"], "eos": ids["<|end_of_text|>"], "eot": ids["<|eot_id|>"],
                "stops": [ids["<|end_of_text|>"], ids["<|eot_id|>"]]}
    return {"bos": ids["<s>"], "eos": ids["</s>"], "stops": [ids["</s>"]], "eot": ids["</s>"]}


def _llama_config(f: dict, V: int):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=f["hidden_size"], intermediate_size=f["intermediate_size"],
                       num_hidden_layers=f["num_hidden_layers"], num_attention_heads=f["num_attention_heads"],
                       num_key_value_heads=f["num_key_value_heads"], head_dim=f["head_dim"], vocab_size=V,
                       max_position_embeddings=256, rms_norm_eps=f["rms_norm_eps"], hidden_act="silu",
                       tie_word_embeddings=f["tie"])


def _state_dict_shapes(f: dict, V: int) -> dict:
    """{tensor name: shape} of transformers' LlamaForCausalLM at this config (built on the meta device: no memory)."""
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        model = LlamaForCausalLM(_llama_config(f, V))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if f["tie"]:
        shapes.pop("lm_head.weight", None)
    return shapes


def make_family_checkpoint(folder: str, name: str) -> dict:
    """Write family `name` (FAMILIES) to folder; return the Truth dict (config, ids, folder of the reference)."""
    f = FAMILIES[name]
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(f["seed"])
    tok_json, specials = toy_tokenizer(f["tokenizer"])
    vocab = json.loads(tok_json)
    n_tok = max(max(vocab["model"]["vocab"].values()), max(specials.values())) + 1
    V = f.get("vocab_size") or n_tok + f.get("extra_vocab", 0)
    ids = _token_ids(f["tokenizer"], specials)
    tensors = _family_tensors(f, V, rng)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config = _family_config(f, V, ids)
    _write_family_text_files(folder, f, config, ids, tok_json)
    truth = dict(name=name, family=f, config=config, vocab_size=V, n_tokenizer=n_tok, bos=ids["bos"],
                 eos=ids["eos"], eot=ids["eot"], stops=ids["stops"], folder=folder, reference=folder,
                 reference_class="LlamaForCausalLM")
    if f["kind"] == "1bitllm":
        truth.update(reference=_write_bitnet_reference(folder, f, tensors, config),
                     reference_class="BitNetForCausalLM")
    return truth


def _family_tensors(f: dict, V: int, rng) -> dict:
    """The checkpoint's tensors by name, in the family's on-disk form (packed, bf16 latent or 1bitLLM's fp16)."""
    from transformers.integrations.bitnet import pack_weights

    tensors = {}
    for key, shape in _state_dict_shapes(f, V).items():
        proj = key.endswith("_proj.weight")
        if key in ("model.embed_tokens.weight", "lm_head.weight"):
            w = rng.standard_normal(shape) * 0.5
        elif not proj:  # RMSNorm gains
            w = 1.0 + 0.2 * rng.standard_normal(shape)
        else:           # latent weights, mean |W| about 1/sqrt(K) (weight_scale 1/mean|W| of 10..50 here)
            w = rng.standard_normal(shape) * rng.uniform(0.8, 1.6) / np.sqrt(shape[1])
        w = torch.from_numpy(w.astype(np.float32))
        if proj and f["kind"] == "llama-packed":
            # onebitllms quantize_to_1bit: T = clamp(round(W / mean|W|)), stored weight_scale = 1 / mean|W|
            mean = w.abs().mean().clamp(min=1e-5)
            t = (w / mean).round().clamp(-1, 1).to(torch.int32)
            tensors[key] = pack_weights(t.clone())
            tensors[key + "_scale"] = (1.0 / mean).reshape(1).to(torch.bfloat16)
        elif proj and f["kind"] == "1bitllm":
            tensors[key] = w.to(torch.float16)          # 1bitLLM's uploads hold fp16 latent weights
        else:
            tensors[key] = w.to(torch.bfloat16)
    if f["kind"] == "1bitllm":  # BitNet's two sub-norms per layer, written under 1bitLLM's names
        D, I = f["hidden_size"], f["intermediate_size"]
        for i in range(f["num_hidden_layers"]):
            for bitnet_name, n in (("self_attn.attn_sub_norm", D), ("mlp.ffn_sub_norm", I)):
                w = torch.from_numpy((1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)).to(torch.float16)
                tensors[f"model.layers.{i}.{ONEBITLLM_SUB_NORMS[bitnet_name]}.weight"] = w
        for k in [k for k in tensors if not k.endswith("_proj.weight")]:
            tensors[k] = tensors[k].to(torch.float16)    # the whole upload is fp16
    return tensors


def _family_config(f: dict, V: int, ids: dict) -> dict:
    """config.json as the family's uploads write it."""
    config = _llama_config(f, V).to_dict()
    for k in ("dtype", "torch_dtype", "transformers_version", "rope_parameters", "rope_scaling", "rope_theta"):
        config.pop(k, None)
    config.update(architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=f["rope_theta"],
                  rope_scaling=f.get("rope_scaling"), bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                  torch_dtype="bfloat16")
    if ids["bos"] is None:
        config.pop("bos_token_id")       # Falcon3-1B-Instruct's config has no bos key
    if f["kind"] == "llama-packed":      # what onebitllms writes: no linear_class, so BitLinear (divide)
        config.update(quantization_config={"modules_to_not_convert": ["lm_head"], "quant_method": "bitnet"},
                      is_bitnet_config=True, pretraining_tp=1)
    elif f["kind"] == "llama-latent":
        config.update(quantization_config={"quant_method": "bitnet", "linear_class": "autobitlinear",
                                           "quantization_mode": "online", "modules_to_not_convert": ["lm_head"]})
    else:                                # 1bitLLM's config: custom class, no quantization_config
        config.update(architectures=["BitnetForCausalLM"], torch_dtype="float16", weight_bits=1, input_bits=8,
                      auto_map={"AutoModelForCausalLM": "modeling_bitnet.BitnetForCausalLM"})
    return config


def _write_family_text_files(folder: str, f: dict, config: dict, ids: dict, tok_json: str) -> None:
    """config.json, generation_config.json, tokenizer.json and tokenizer_config.json."""
    _dump(folder, "config.json", config)
    gen = {"eos_token_id": ids["stops"] if len(ids["stops"]) > 1 else ids["stops"][0], "max_length": 256}
    if ids["bos"] is not None:
        gen["bos_token_id"] = ids["bos"]
    _dump(folder, "generation_config.json", gen)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as fh:
        fh.write(tok_json)
    tc = {"eos_token": {"falcon3": "<|endoftext|>", "llama3": "<|eot_id|>", "sentencepiece": "</s>"}[f["tokenizer"]],
          "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast"}
    if ids["bos"] is not None:
        tc["bos_token"] = {"llama3": "<|begin_of_text|>", "sentencepiece": "<s>"}[f["tokenizer"]]
    if f["template"] is not None:
        tc["chat_template"] = f["template"]
    _dump(folder, "tokenizer_config.json", tc)


def _write_bitnet_reference(folder: str, f: dict, tensors: dict, config: dict) -> str:
    """`<folder>-reference`: the 1bitLLM weights as transformers' BitNetForCausalLM (silu, online
    autobitlinear: absmean weight ternarization and per-token int8 activations, as 1bitLLM's utils_quant.py
    does), sub-norms renamed back to BitNet's names. Tokenizer files are not needed by the reference."""
    ref = folder.rstrip("/") + "-reference"
    os.makedirs(ref, exist_ok=True)
    back = {v: k for k, v in ONEBITLLM_SUB_NORMS.items()}
    out = {}
    for k, v in tensors.items():
        for onebit, bitnet in back.items():
            k = k.replace(f".{onebit}.", f".{bitnet}.")
        out[k] = v
    save_file(out, os.path.join(ref, "model.safetensors"), metadata={"format": "pt"})
    cfg = {k: v for k, v in config.items() if k not in ("auto_map", "weight_bits", "input_bits")}
    cfg.update(architectures=["BitNetForCausalLM"], model_type="bitnet", hidden_act="silu",
               quantization_config={"quant_method": "bitnet", "linear_class": "autobitlinear",
                                    "quantization_mode": "online"})
    _dump(ref, "config.json", cfg)
    return ref


def load_family_reference(truth: dict):
    """transformers' model of truth["reference"] in float32, eval mode (see load_reference_model in
    checkpoints.py for the accelerate / torch.compile workarounds). BitLinear unpacks and multiplies in its
    own `dtype` (bf16 from the checkpoint) whatever its parameters are cast to, so that is set to float32."""
    import torch._dynamo
    import transformers
    from transformers.integrations.bitnet import BitLinear
    from transformers.quantizers import quantizer_bitnet

    torch._dynamo.config.disable = True
    saved = quantizer_bitnet.is_accelerate_available
    quantizer_bitnet.is_accelerate_available = lambda *a, **k: True
    try:
        cls = getattr(transformers, truth["reference_class"])
        model = cls.from_pretrained(truth["reference"], dtype=torch.float32)
    finally:
        quantizer_bitnet.is_accelerate_available = saved
    torch.nn.Module.float(model)
    n_bitlinear = 0
    for module in model.modules():
        if isinstance(module, BitLinear):
            module.dtype = torch.float32
            n_bitlinear += 1
    if truth["family"]["kind"] == "llama-packed":
        assert n_bitlinear == 7 * truth["family"]["num_hidden_layers"], "the reference did not load BitLinear layers"
    return model.eval()
