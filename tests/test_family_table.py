"""checkpoint/families.py: the one record per model family that the config reader, the converter, the synthetic
shapes and the catalog all follow."""
import dataclasses

import pytest
from checkpoints import edit_json

from bitnet_app import catalog
from bitnet_app.checkpoint import families
from bitnet_app.checkpoint.config import NotBitNet, read_model_config
from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.checkpoint.families import FAMILIES, SUB_NORM_NAMINGS, family_of
from bitnet_app.checkpoint.presets import SHAPES
from bitnet_app.engine.file import EngineFile
from bitnet_app.engine.validate import ACTIVATIONS, rope_scaling_problem

LLAMA3_RULE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_family_names_only_what_the_engine_runs(name):
    """Its activation and rope scalings are engine operations; its sub-norm namings exist."""
    f = FAMILIES[name]
    assert f.name == name and f.activation in ACTIVATIONS
    assert all(rope_scaling_problem(dict(LLAMA3_RULE, rope_type=kind)) is None for kind in f.rope_scalings)
    assert all(n in SUB_NORM_NAMINGS for n in f.sub_norms_required)
    assert (f.sub_norms is None) == (name not in SUB_NORM_NAMINGS)
    assert f.packed_scale in ("divide", "infer") and f.prompt_without_template in ("chat", "completion")


def test_config_json_names_the_family():
    cases = [({"architectures": ["BitNetForCausalLM"], "model_type": "bitnet"}, "bitnet"),
             ({"model_type": "BitNet"}, "bitnet"),
             ({"architectures": ["BitnetForCausalLM"], "model_type": "llama"}, "1bitllm"),
             ({"architectures": ["BitnetForCausalLM"], "model_type": "llama",
               "quantization_config": {"quant_method": "bitnet"}}, "1bitllm"),   # 1bitllm is tried before llama
             ({"model_type": "llama", "quantization_config": {"quant_method": "bitnet"}}, "llama"),
             ({"model_type": "llama"}, None),
             ({"model_type": "llama", "quantization_config": {"quant_method": "gptq"}}, None),
             ({"model_type": "qwen2", "quantization_config": {"quant_method": "bitnet"}}, None)]
    for raw, want in cases:
        got = family_of(raw)
        assert (got and got.name) == want, raw


def test_the_catalog_and_the_synthetic_shapes_follow_the_families():
    for e in catalog.ENTRIES.values():
        assert e.tied == FAMILIES[e.family].tied_head
    for name, s in SHAPES.items():
        assert s["family"] in FAMILIES, name
    with pytest.raises(ValueError, match="unknown family"):
        catalog.Entry("x/y", "x", "mistral", hidden=64, intermediate=96, layers=1, heads=4, kv_heads=4, head_dim=16,
                      vocab=300, context=256, weights="packed", chat=True)


def test_a_new_family_is_one_record(make_ckpt, engine_path, monkeypatch):
    """A family the app does not know is refused; one record in the table and the same checkpoint converts,
    following the record's rules. The record copies BitNet's rules under another name, so code that still
    asked for the name "bitnet" would treat it as a Llama (divide, completion) and fail here."""
    folder, _ = make_ckpt("newfam", linear_class=None, chat_template=None)
    edit_json(folder, "config.json", architectures=["TernaryForCausalLM"], model_type="ternary",
              quantization_config=None)
    with pytest.raises(NotBitNet):
        read_model_config(folder)

    new = dataclasses.replace(families.BITNET, name="ternary", described_as="a TernaryForCausalLM",
                              architectures=("TernaryForCausalLM",), model_types=("ternary",))
    monkeypatch.setitem(FAMILIES, "ternary", new)
    ef = EngineFile(convert_checkpoint(folder, engine_path))
    src = ef.meta["source"]
    assert (src["family"], src["scale_mode"], src["scale_mode_inferred"]) == ("ternary", "multiply", True)
    assert ef.meta["prompt_format"] == "chat" and ef.config["sub_norms"]
