"""Export the trained demo BitNet into the Hugging Face layout of microsoft/bitnet-b1.58-2B-4T.

Files written to OUT (called by tools/train_demo_model.py; ``--export-only`` re-exports a checkpoint):
* model.safetensors: ``model.embed_tokens.weight`` bf16 [V, d] (tied head, no lm_head tensor),
  norms bf16, every projection as packed U8 [out/4, in] (transformers' ``pack_weights``: 4 ternary
  rows per byte, blocked layout, code = w + 1) plus ``<proj>.weight_scale`` bf16 [1] = mean|W|,
  so W_eff = W_tern * weight_scale (linear_class autobitlinear, offline).
* config.json (BitNetForCausalLM keys), generation_config.json, tokenizer.json, tokenizer_config.json
  (with the chat template), dlm_config.json (mask id, block size "bd_size", attention "block").
The bf16 rounding of scales, norms and embeddings changes the model slightly: evaluate the export
(python -m tools.eval_demo_model), not the fp32 training weights.
"""
from __future__ import annotations

import json
import os

import torch

from tools import demo_chat as C
from tools import demo_data as D


def quantized_tensors(model) -> dict[str, torch.Tensor]:
    """fp32 training state -> {HF name: tensor} (packed U8 + bf16 scales, bf16 everything else)."""
    from transformers.integrations.bitnet import pack_weights

    out = {}
    for name, w in model.state_dict().items():
        key = "model." + name
        w = w.detach().float()
        if name.endswith("proj.weight"):
            scale = 1.0 / w.abs().mean().clamp(min=1e-5)  # same as the training quantizer
            tern = (w * scale).round().clamp(-1, 1).to(torch.int8)  # (out, in) in {-1, 0, 1}
            assert w.shape[0] % 4 == 0, name
            out[key] = pack_weights(tern.clone()).contiguous()  # (out/4, in) uint8
            out[key[: -len("weight")] + "weight_scale"] = (1.0 / scale).reshape(1).to(torch.bfloat16)
        else:
            out[key] = w.to(torch.bfloat16).contiguous()
    return out


def hf_config(cfg) -> dict:
    return {
        "architectures": ["BitNetForCausalLM"],
        "model_type": "bitnet",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "relu2",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": D.BOS,
        "eos_token_id": D.EOT_ID,
        "pad_token_id": D.EOT_TEXT,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                                "quantization_mode": "offline"},
    }


def dlm_config(cfg, attention: str = "block") -> dict:
    inside = ("bidirectional inside a block" if attention == "block" else
              "causal inside a block (a slot sees the slots before it, so the leftmost masked slot's prediction is "
              "the AR one)")
    return {
        "mask_token_id": D.MASK,
        "bd_size": cfg.block_size,
        "attention": attention,
        "sub_block_size": 8,
        "threshold": 0.9,
        "notes": f"Fast-dLLM v2 style block diffusion, attention {inside}; blocks aligned to absolute positions "
                 "0, bd_size, ... counted from BOS. Slot 0 of every block was never masked in training: the "
                 "decoder takes it from the prompt tail or from the argmax of the previous block's commit forward.",
    }


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """(out/4, in) uint8 -> (out, in) fp32 ternary; row i*P + r is bits 2i..2i+1 of packed row r (pack_weights)."""
    return torch.cat([((packed >> (2 * i)) & 3).float() - 1 for i in range(4)], dim=0)


def load_export(folder: str):
    """Our torch module (tools/demo_bitnet.py) with exactly the exported values (ternary codes, bf16 scales,
    norms and embeddings): the inverse of write_model."""
    from safetensors.torch import load_file

    from tools.demo_bitnet import BitLinear, BitNet, BitNetCfg

    hc = json.load(open(os.path.join(folder, "config.json")))
    dc = json.load(open(os.path.join(folder, "dlm_config.json")))
    cfg = BitNetCfg(**{k: hc[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "num_key_value_heads", "rope_theta",
                                           "rms_norm_eps", "max_position_embeddings")}, block_size=dc["bd_size"])
    model = BitNet(cfg).eval()
    sd = load_file(os.path.join(folder, "model.safetensors"))
    for name, mod in model.named_modules():
        if isinstance(mod, BitLinear):
            mod.freeze(unpack(sd.pop(f"model.{name}.weight")), sd.pop(f"model.{name}.weight_scale"))
    rest = {k[len("model."):]: v.float() for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(rest, strict=False)
    assert not unexpected and all(k.endswith("proj.weight") for k in missing), (missing, unexpected)
    return model


def write_json(path: str, obj: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def write_model(model, tok, cfg, out: str, attention: str = "block") -> None:
    """The HF folder (weights, configs, tokenizer) of the current weights into `out`."""
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    save_file(quantized_tensors(model), os.path.join(out, "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(os.path.join(out, "model.safetensors.tmp"), os.path.join(out, "model.safetensors"))
    write_json(os.path.join(out, "config.json"), hf_config(cfg))
    write_json(os.path.join(out, "generation_config.json"), {
        "bos_token_id": D.BOS, "eos_token_id": [D.EOT_ID, D.EOT_TEXT], "pad_token_id": D.EOT_TEXT,
        # greedy: the demo's skills have one right answer, and the page and the CLI both start from this
        "do_sample": False, "max_length": cfg.max_position_embeddings})
    write_json(os.path.join(out, "dlm_config.json"), dlm_config(cfg, attention))
    tok.save(os.path.join(out, "tokenizer.json"))
    write_json(os.path.join(out, "tokenizer_config.json"), C.tokenizer_config(cfg.max_position_embeddings))


def export(model, tok, cfg, a, hist, elapsed, step) -> None:
    write_model(model, tok, cfg, a.out, a.attention)
    write_json(os.path.join(a.work, "train_metrics.json"),
               {"hist": hist, "elapsed_s": round(elapsed), "steps_done": step, "args": vars(a),
                "config": cfg.to_dict()})
    print(f"exported to {a.out}", flush=True)
