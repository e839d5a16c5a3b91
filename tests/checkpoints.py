"""Small random BitNet checkpoints in the real Hugging Face on-disk layout, for tests.

make_hf_checkpoint(folder, ...) writes what microsoft/bitnet-b1.58-2B-4T ("offline": packed U8 weight
(N/4, K) + one-element BF16 weight_scale) or its -bf16 sibling ("online": BF16 latent weight (N, K))
would hold, at a tiny shape, using transformers' own `pack_weights` and safetensors' own `save_file`,
plus config.json / generation_config.json / tokenizer.json / tokenizer_config.json as those repos
write them. It returns a Truth dict holding the generated ternary weights and scales, so a test
can compare what the converter wrote against what went in.

load_reference_model(folder) loads such a folder with transformers.BitNetForCausalLM in float32.

CI's ARM stage runs test_kernels.py and test_engine.py on an emulated arm64 Python that has no torch (PyPI's aarch64
torch is a CUDA build of 900 MB). There make_hf_checkpoint replays a record: with $BITNET_CHECKPOINT_RECORD set to a
folder, the x86 run of the same tests writes each checkpoint it makes there (by this code, keyed by its arguments),
and a run without torch copies it from there instead of making it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import shutil

import numpy as np

try:
    import torch
    from safetensors.torch import save_file
except ImportError:  # the ARM stage's emulated Python: checkpoints come from the record (above)
    torch = None

from bitnet_app.text.chat import BITNET_CHAT_TEMPLATE  # 2B-4T's chat template

BOS, EOS, EOT, MASK = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "|<MASK>|"

# Training text for the toy tokenizer: plain sentences written for these tests, fixed so that the
# trained vocabulary (and with it every token id) is the same on every run.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs into the woods.
User: Hello! How are you today?
Assistant: I am fine, thank you. How can I help you?
System: You are a helpful assistant. Answer briefly and clearly.
User: What is the capital of France?
Assistant: The capital of France is Paris. It is a large city on the river Seine.
Once upon a time there was a small town by the sea. The people of the town were fishermen, and every
morning they sailed out on their boats to catch fish. In the evening they came home, sold the fish in
the market, and told stories about the sea. The children listened to the stories and dreamed of boats.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024. Symbols: ( ) [ ] { } < > + - * / = ! ? , . ; : ' "
Café, naïve, résumé, 東京, こんにちは, Привет, emoji 🙂.
def add(a, b):
    return a + b
"""


def byte_level_bpe(vocab_size: int = 400):
    """A byte-level BPE Tokenizer trained on _CORPUS (no special tokens yet; the callers add their own)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tok


@functools.lru_cache(maxsize=None)
def toy_tokenizer_json(mask_token: bool = False) -> str:
    """A byte-level BPE tokenizer.json (about 400 ids), Llama-3 style: the special tokens come after
    the ordinary ones, and a TemplateProcessing post-processor prepends <|begin_of_text|>."""
    from tokenizers import processors

    tok = byte_level_bpe()
    tok.add_special_tokens([BOS, EOS, EOT] + ([MASK] if mask_token else []))
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)])
    return tok.to_str()


def _bf16(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(torch.bfloat16)


PROJ_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


RECORD_ENV = "BITNET_CHECKPOINT_RECORD"


def make_hf_checkpoint(folder, **kw) -> dict:
    """_make_hf_checkpoint's checkpoint in `folder` and its Truth dict, made here or, where torch is missing, copied
    from the record of a run that made it ($BITNET_CHECKPOINT_RECORD: see the module's docstring)."""
    record = os.environ.get(RECORD_ENV)
    if not record:
        if torch is None:
            raise RuntimeError(f"torch is not installed: making a test checkpoint needs it, or ${RECORD_ENV} set to "
                               "the record of a run that made them")
        return _make_hf_checkpoint(folder, **kw)
    entry = os.path.join(record, hashlib.sha256(repr(sorted(kw.items())).encode()).hexdigest()[:20])
    if torch is None:
        if not os.path.isdir(entry):
            raise RuntimeError(f"no recorded checkpoint for {kw} in {record}: run the same tests with torch and "
                               f"${RECORD_ENV}={record} first")
        shutil.copytree(os.path.join(entry, "folder"), folder, dirs_exist_ok=True)
        with open(os.path.join(entry, "truth.pkl"), "rb") as f:
            return pickle.load(f)
    truth = _make_hf_checkpoint(folder, **kw)
    if not os.path.isdir(entry):
        tmp = entry + f".tmp{os.getpid()}"
        shutil.copytree(folder, os.path.join(tmp, "folder"))
        with open(os.path.join(tmp, "truth.pkl"), "wb") as f:
            pickle.dump(truth, f)
        os.replace(tmp, entry)
    return truth


def _make_hf_checkpoint(folder, *, layout="offline", linear_class="autobitlinear", hidden_size=64,
                       intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=None, vocab_size=None, extra_vocab=0, shards=1, rope_style="flat",
                       max_position_embeddings=256, seed=0, mask_token=False, dlm_config=None,
                       chat_template=BITNET_CHAT_TEMPLATE, scale_range=None, embed_dtype=None):
    """Write a random BitNetForCausalLM checkpoint to `folder`; return the Truth dict:
        config, tokenizer ids (bos, eos, eot, mask), vocab_size,
        ternary: {tensor name: int8 (N, K)} (offline), scale: {tensor name: float} (offline, the stored bf16 value),
        latent: {tensor name: float32 (N, K)} (online, the bf16 values as stored).
    linear_class None omits the key from quantization_config. scale_range: uniform range of weight_scale
    (default (1, 2) as in 2B-4T, or (20, 60) for "bitlinear", which stores 1/mean|W|)."""
    embed_dtype = torch.bfloat16 if embed_dtype is None else embed_dtype
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    tok_json = toy_tokenizer_json(mask_token)
    vocab = json.loads(tok_json)
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    n_tok = max(max(vocab["model"]["vocab"].values()), max(ids.values())) + 1
    V = (vocab_size or n_tok) + extra_vocab
    D, I, H, KVH = hidden_size, intermediate_size, num_attention_heads, num_key_value_heads
    hd = head_dim or D // H
    if scale_range is None:
        scale_range = (20.0, 60.0) if linear_class == "bitlinear" else (1.0, 2.0)

    tensors, truth = _random_weights(rng, layout, V, D, I, H, KVH, hd, num_hidden_layers, scale_range, embed_dtype)
    _save_tensors(folder, tensors, shards)
    config = _config(layout, linear_class, V, D, I, H, KVH, head_dim, num_hidden_layers, max_position_embeddings,
                     rope_style, ids)
    _write_text_files(folder, config, tok_json, ids, max_position_embeddings, chat_template, dlm_config)
    truth.update(config=config, vocab_size=V, bos=ids[BOS], eos=ids[EOS], eot=ids[EOT],
                 mask=ids.get(MASK), n_tokenizer=n_tok)
    return truth


def _random_weights(rng, layout, V, D, I, H, KVH, hd, num_hidden_layers, scale_range, embed_dtype):
    """(tensors by checkpoint name, truth: the ternary codes and scales or the latent weights they hold)."""
    tensors, truth = {}, {"ternary": {}, "scale": {}, "latent": {}}
    tensors["model.embed_tokens.weight"] = torch.from_numpy(
        (rng.standard_normal((V, D)) * 0.5).astype(np.float32)).to(embed_dtype)
    tensors["model.norm.weight"] = _bf16(1.0 + 0.2 * rng.standard_normal(D))
    shapes = {"self_attn.q_proj": (H * hd, D), "self_attn.k_proj": (KVH * hd, D), "self_attn.v_proj": (KVH * hd, D),
              "self_attn.o_proj": (D, H * hd), "mlp.gate_proj": (I, D), "mlp.up_proj": (I, D), "mlp.down_proj": (D, I)}
    from transformers.integrations.bitnet import pack_weights
    for i in range(num_hidden_layers):
        p = f"model.layers.{i}."
        for norm, n in (("input_layernorm", D), ("post_attention_layernorm", D),
                        ("self_attn.attn_sub_norm", D), ("mlp.ffn_sub_norm", I)):
            tensors[p + norm + ".weight"] = _bf16(1.0 + 0.2 * rng.standard_normal(n))
        for proj in PROJ_NAMES:
            name = p + proj + ".weight"
            N, K = shapes[proj]
            if layout == "offline":
                t = rng.choice(np.array([-1, 0, 1], dtype=np.int8), size=(N, K), p=[0.3, 0.4, 0.3])
                truth["ternary"][name] = t
                tensors[name] = pack_weights(torch.from_numpy(t.astype(np.int32)).clone())
                s = _bf16([rng.uniform(*scale_range)])
                truth["scale"][name + "_scale"] = float(s.float()[0])
                tensors[name + "_scale"] = s
            elif layout == "online":
                # latent "master" weights of O(1) magnitude, like the -bf16 sibling of 2B-4T
                w = _bf16(rng.standard_normal((N, K)) * rng.uniform(0.5, 2.5))
                truth["latent"][name] = w.float().numpy()
                tensors[name] = w
            else:
                raise ValueError(f"layout must be 'offline' or 'online', not {layout!r}")
    return tensors, truth


def _config(layout, linear_class, V, D, I, H, KVH, head_dim, num_hidden_layers, max_position_embeddings, rope_style,
            ids) -> dict:
    """config.json of the checkpoint, as the BitNet repos on the Hub write it."""
    qc = {"quant_method": "bitnet", "quantization_mode": layout}
    if linear_class is not None:
        qc["linear_class"] = linear_class
    config = {
        "architectures": ["BitNetForCausalLM"], "model_type": "bitnet", "hidden_act": "relu2",
        "hidden_size": D, "intermediate_size": I, "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": H, "num_key_value_heads": KVH, "vocab_size": V,
        "max_position_embeddings": max_position_embeddings, "rms_norm_eps": 1e-5,
        "initializer_range": 0.02, "attention_bias": False, "attention_dropout": 0.0, "use_cache": True,
        "tie_word_embeddings": True, "bos_token_id": ids[BOS], "eos_token_id": ids[EOS],
        "torch_dtype": "bfloat16", "quantization_config": qc,
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    if rope_style == "flat":
        config["rope_theta"] = 500000.0
    elif rope_style == "parameters":
        config["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    else:
        raise ValueError(f"rope_style must be 'flat' or 'parameters', not {rope_style!r}")
    return config


def _write_text_files(folder, config, tok_json, ids, max_position_embeddings, chat_template, dlm_config):
    """config.json, generation_config.json, tokenizer.json, tokenizer_config.json (and dlm_config.json)."""
    _dump(folder, "config.json", config)
    _dump(folder, "generation_config.json", {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOS], ids[EOT]],
                                             "do_sample": True, "temperature": 0.6, "top_p": 0.9,
                                             "max_length": max_position_embeddings})
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok_json)
    tc = {"bos_token": BOS, "eos_token": EOT, "model_max_length": max_position_embeddings,
          "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": True}
    if chat_template is not None:
        tc["chat_template"] = chat_template
    _dump(folder, "tokenizer_config.json", tc)
    if dlm_config is not None:
        _dump(folder, "dlm_config.json", dlm_config)


def edit_json(folder, name, **changes):
    """Set keys of the JSON object in folder/name; a value of None removes the key."""
    path = os.path.join(folder, name)
    with open(path) as f:
        obj = json.load(f)
    for k, v in changes.items():
        if v is None:
            obj.pop(k, None)
        else:
            obj[k] = v
    with open(path, "w") as f:
        json.dump(obj, f)


def _dump(folder, name, obj):
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)


def _save_tensors(folder, tensors, shards):
    """One model.safetensors, or `shards` files plus model.safetensors.index.json (names split in order)."""
    meta = {"format": "pt"}
    if shards <= 1:
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata=meta)
        return
    names = list(tensors)
    weight_map, total = {}, 0
    for k, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        fn = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {names[j]: tensors[names[j]] for j in part}
        save_file(chunk, os.path.join(folder, fn), metadata=meta)
        for n, t in chunk.items():
            weight_map[n] = fn
            total += t.numel() * t.element_size()
    _dump(folder, "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


def rewrite_tensor(folder, name, value):
    """Replace (value: torch.Tensor) or drop (value None) one tensor in whichever file of `folder` holds it."""
    from safetensors.torch import load_file
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            fn = json.load(f)["weight_map"][name]
    else:
        fn = "model.safetensors"
    path = os.path.join(folder, fn)
    tensors = load_file(path)
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value.contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def load_reference_model(folder):
    """transformers.BitNetForCausalLM of `folder` in float32 (eval mode), the parity reference.

    Two workarounds, both needed with transformers 5.23 / torch 2.13 on this CPU-only setup:
    - the bitnet quantizer's validate_environment insists on `accelerate` (it is not used on this
      path and is not installed here); we make its availability check return True for the load;
    - unpack_weights / WeightQuant / ActQuant are decorated with @torch.compile, which needs a C
      compiler toolchain and takes seconds per shape; TORCHDYNAMO_DISABLE=1 must be in the
      environment before torch is imported (conftest.py sets it), or we fall back to
      torch._dynamo.config.disable = True here, so they run eagerly with identical maths.
    For the offline layout the packed U8 weights are unpacked to float32 ternary values at load time
    (dtype=torch.float32), and weight_scale (bf16 in the file) is upcast to float32, so the reference
    runs all of AutoBitLinear in fp32: F.linear(ActQuant(x), W_tern) * weight_scale.
    """
    import torch._dynamo
    import transformers
    from transformers.quantizers import quantizer_bitnet

    torch._dynamo.config.disable = True
    saved = quantizer_bitnet.is_accelerate_available
    quantizer_bitnet.is_accelerate_available = lambda *a, **k: True
    try:
        model = transformers.BitNetForCausalLM.from_pretrained(folder, dtype=torch.float32)
    finally:
        quantizer_bitnet.is_accelerate_available = saved
    # transformers 5.23 leaves the non-quantized tensors (embedding, norms) in the checkpoint's bf16
    # even with dtype=torch.float32, and F.linear then fails on bf16 x fp32: upcast everything.
    # (PreTrainedModel.float() refuses quantized models, so call torch's own Module.float.)
    torch.nn.Module.float(model)
    return model.eval()
