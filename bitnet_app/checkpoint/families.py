"""The model families this app runs: one record each, the only place a family's rules are written down.

    family_of(raw) -> Family or None     which family config.json (raw) describes, from what it says
                                         (architectures, model_type, quantization_config), never from a repo name
    FAMILIES       name -> Family        in the order family_of tries them
    SUB_NORM_NAMINGS name -> (before o_proj, before down_proj)   the sub-norm tensor names each naming uses

The three families (facts from the team's shared reference on model families, which is not part of this repository):
  bitnet   model_type "bitnet" / BitNetForCausalLM (microsoft/bitnet-b1.58-2B-4T): relu2, sub-norms, tied head
  1bitllm  BitnetForCausalLM (lowercase n, model_type "llama", 1bitLLM/bitnet_b1_58-*): custom code, latent
           weights with no quantization_config; silu, sub-norms named inner_attn_ln / ffn_layernorm, tied head
  llama    model_type "llama" with quantization_config.quant_method "bitnet" (tiiuae Falcon3 / Falcon-E,
           HF1BitLLM Llama3-8B-1.58): transformers' LlamaForCausalLM with BitLinear; silu, no sub-norms,
           untied head; weight_scale divides unless linear_class says "autobitlinear"
A record holds the family's rules; a checkpoint's own config.json and tensors still decide its sizes, whether
its head is tied and which sub-norms it has (checkpoint/config.py, checkpoint/convert.py). The operations a
rule names (an activation, a rope scaling) are the engine's: engine/validate.py ACTIVATIONS, engine/rope.py.
Plain data: no numpy, no other module of the package.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str                        # meta["source"]["family"], catalog.py Entry.family
    described_as: str                # for the message that refuses other models
    # how config.json names it: one of `architectures` listed, or `model_type` one of `model_types`;
    # and, when quant_method is set, quantization_config.quant_method equal to it
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    quant_method: str | None
    activation: str                  # hidden_act when config.json names none (the modeling code's default)
    sub_norms: tuple[str, str] | None   # its RMSNorms before o_proj and before down_proj; None: it has none
    sub_norms_required: tuple[str, ...]  # namings one of which every layer must use; (): whatever the tensors hold
    # packed U8 weights whose config names no linear_class: "divide" (transformers' BitLinear, weight_scale =
    # 1/mean|W|) or "infer" (AutoBitLinear-era checkpoints such as 2B-4T multiply by weight_scale = mean|W|;
    # the converter tells the two apart by the scales' size, convert._infer_scale_mode)
    packed_scale: str
    tied_head: bool                  # its checkpoints' head is the embedding (the synthetic shapes, the catalog)
    rope_theta: float                # when config.json names none (the config class's default)
    rms_norm_eps: float              # the same
    rope_scalings: tuple[str, ...]   # the rope_scaling kinds it may carry besides plain RoPE (engine/rope.py)
    prompt_without_template: str     # a checkpoint with no chat template: "chat" with text/chat.py's
                                     # BITNET_CHAT_TEMPLATE, or "completion" (a base model)

    def recognises(self, raw: dict) -> bool:
        """Whether config.json (raw) names this family."""
        archs = architectures_of(raw)
        named = any(a in archs for a in self.architectures) or \
            str(raw.get("model_type", "")).lower() in self.model_types
        if not named or self.quant_method is None:
            return named
        qc = raw.get("quantization_config")
        return isinstance(qc, dict) and qc.get("quant_method") == self.quant_method


BITNET = Family(
    name="bitnet", described_as="a BitNetForCausalLM (microsoft/bitnet-b1.58-2B-4T)",
    architectures=("BitNetForCausalLM",), model_types=("bitnet",), quant_method=None,
    activation="relu2", sub_norms=("self_attn.attn_sub_norm", "mlp.ffn_sub_norm"), sub_norms_required=("bitnet",),
    packed_scale="infer", tied_head=True,
    rope_theta=500000.0, rms_norm_eps=1e-5,   # transformers BitNetConfig
    rope_scalings=("llama3",), prompt_without_template="chat")

ONEBITLLM = Family(
    name="1bitllm", described_as="1bitLLM's BitnetForCausalLM",
    architectures=("BitnetForCausalLM",), model_types=(), quant_method=None,
    # its sub-norms under BitNet's names too (the names llama.cpp's tensor map gives them)
    activation="silu", sub_norms=("self_attn.inner_attn_ln", "mlp.ffn_layernorm"),
    sub_norms_required=("1bitllm", "bitnet"),
    packed_scale="divide", tied_head=True,
    rope_theta=10000.0, rms_norm_eps=1e-6,    # transformers LlamaConfig
    rope_scalings=("llama3",), prompt_without_template="completion")

LLAMA = Family(
    name="llama", described_as="Llama models with BitNet quantization (tiiuae/Falcon3-*-1.58bit, tiiuae/Falcon-E-*, "
                              "HF1BitLLM/Llama3-8B-1.58-100B-tokens)",
    architectures=(), model_types=("llama",), quant_method="bitnet",
    activation="silu", sub_norms=None, sub_norms_required=(),
    packed_scale="divide", tied_head=False,
    rope_theta=10000.0, rms_norm_eps=1e-6,    # transformers LlamaConfig
    rope_scalings=("llama3",), prompt_without_template="completion")

# 1bitllm before llama: its model_type is "llama" too
FAMILIES = {f.name: f for f in (BITNET, ONEBITLLM, LLAMA)}
SUB_NORM_NAMINGS = {f.name: f.sub_norms for f in FAMILIES.values() if f.sub_norms is not None}


def architectures_of(raw: dict) -> list[str]:
    """config.json's `architectures` list (its names only; a value of another kind names none: config.py refuses it)."""
    archs = raw.get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def family_of(raw: dict) -> Family | None:
    """The first family (in FAMILIES' order) that config.json (raw) names, or None."""
    return next((f for f in FAMILIES.values() if f.recognises(raw)), None)
