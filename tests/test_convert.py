"""convert.py on generated checkpoints in the real HF layout (tests/checkpoints.py): packed codes round
trip per projection and fused order, scale rules, head quantization, metadata, and bad inputs."""
import os

import numpy as np
import pytest
import torch

import checkpoints
from bitnet_app.engine import packing
from bitnet_app.checkpoint.convert import ConvertError, convert_checkpoint
from bitnet_app.engine.file import EngineFile

GROUPS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
          "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def convert(folder, out):
    convert_checkpoint(folder, out)
    return EngineFile(out)


def engine_weights(ef, i, group, n, k):
    """(ternary int8 (n, k), per-row multiplier (Np,)) of one fused engine matrix."""
    codes, scale = ef[f"layers.{i}.{group}.codes"], ef[f"layers.{i}.{group}.scale"]
    assert codes.shape == packing.ternary_tile_shape(n, k, ef.packing)
    assert scale.shape == (packing.ceil_to(n, 16),) and scale.dtype == np.float32
    assert not scale[n:].any()                              # padding rows multiply by 0
    return packing.unpack_tiles(codes, n, k, ef.packing), scale


# Awkward sizes: hidden 48 (4 heads x 12, 2 KV heads: qkv 96 rows), intermediate 100 (gate_up 200 rows padded to
# 208, down K = 100 padded to 112).
AWKWARD = dict(hidden_size=48, intermediate_size=100, num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("linear_class,mode", [("autobitlinear", "multiply"), ("bitlinear", "divide")])
def test_offline_codes_and_scales_round_trip(make_ckpt, engine_path, linear_class, mode):
    folder, truth = make_ckpt(linear_class=linear_class, **AWKWARD)
    ef = convert(folder, engine_path)
    assert ef.meta["source"]["layout"] == "offline"
    assert ef.meta["source"]["scale_mode"] == mode and ef.meta["source"]["scale_mode_inferred"] is False
    for i in range(truth["config"]["num_hidden_layers"]):
        for group, projs in GROUPS.items():
            names = [f"model.layers.{i}.{p}.weight" for p in projs]
            want = np.concatenate([truth["ternary"][n] for n in names])     # fused in q|k|v, gate|up order
            got, scale = engine_weights(ef, i, group, *want.shape)
            assert np.array_equal(got, want), (i, group)
            row = 0
            for n in names:
                s = np.float32(truth["scale"][n + "_scale"])
                m = s if mode == "multiply" else np.float32(1) / s
                rows = truth["ternary"][n].shape[0]
                assert np.all(scale[row:row + rows] == m), (n, scale[row], m)
                row += rows


def test_the_packing_is_chosen_at_conversion(make_ckpt, tmp_path):
    """By default what packing_for chooses for this model on this CPU (format 4's ternary_packing; a model this
    small decodes from cache: 2-bit tiles), either one when asked: the same weights either way, in fewer bytes at
    1.6 bits; an unknown packing is refused before any work."""
    folder, _ = make_ckpt(**AWKWARD)
    assert convert(folder, str(tmp_path / "default.bitnet")).meta["ternary_packing"] == "2bit"
    five = EngineFile(convert_checkpoint(folder, str(tmp_path / "five.bitnet"), packing="1.6bit"))
    two = EngineFile(convert_checkpoint(folder, str(tmp_path / "two.bitnet"), packing="2bit"))
    assert (five.packing, two.packing) == ("1.6bit", "2bit") and five.meta["ternary_packing"] == "1.6bit"
    for i in range(2):
        for group, (n, k) in {"qkv": (96, 48), "o": (48, 48), "gate_up": (200, 48), "down": (48, 100)}.items():
            a, sa = engine_weights(five, i, group, n, k)
            b, sb = engine_weights(two, i, group, n, k)
            assert np.array_equal(a, b) and np.array_equal(sa, sb), (i, group)
    tiles = {f: sum(t.nbytes for name, t in f.tensors.items() if name.endswith(".codes")) for f in (five, two)}
    assert tiles[five] < tiles[two]  # (4/5 of the bytes for wide matrices; these are 48 to 112 columns wide)
    with pytest.raises(ConvertError, match="unknown ternary packing"):
        convert_checkpoint(folder, str(tmp_path / "x.bitnet"), packing="1bit")


def test_offline_matches_transformers_reference_weights(make_ckpt, engine_path):
    """The reference model (transformers, fp32) sees W_tern * weight_scale; the engine file must hold the same."""
    folder, truth = make_ckpt()
    ef = convert(folder, engine_path)
    model = checkpoints.load_reference_model(folder)
    attn = model.model.layers[1].self_attn
    ref = [(m.weight.detach().numpy(), float(m.weight_scale)) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
    n = sum(w.shape[0] for w, _ in ref)
    got, scale = engine_weights(ef, 1, "qkv", n, 64)
    want = np.concatenate([w * s for w, s in ref])
    assert np.allclose(got * scale[:n, None], want, rtol=0, atol=0)
    norm = model.model.layers[1].input_layernorm.weight.detach().numpy()
    assert np.array_equal(ef["layers.1.attn_norm"], norm)


def test_online_ternarizes_like_transformers_weightquant(make_ckpt, engine_path):
    from transformers.integrations.bitnet import WeightQuant
    folder, truth = make_ckpt(layout="online", **AWKWARD)
    ef = convert(folder, engine_path)
    assert ef.meta["source"]["layout"] == "online" and ef.meta["source"]["scale_mode"] == "multiply"
    for i in range(truth["config"]["num_hidden_layers"]):
        for group, projs in GROUPS.items():
            lat = [truth["latent"][f"model.layers.{i}.{p}.weight"] for p in projs]
            n, k = sum(w.shape[0] for w in lat), lat[0].shape[1]
            got, scale = engine_weights(ef, i, group, n, k)
            # transformers' own fake-quantized weight, fp32: T / s
            want = np.concatenate([WeightQuant.forward(None, torch.from_numpy(w)).numpy() for w in lat])
            assert np.allclose(got * scale[:n, None], want, rtol=1e-6, atol=0), (i, group)
            assert set(np.unique(got)) <= {-1, 0, 1} and (got == 0).any() and (got != 0).any()


@pytest.mark.parametrize("scale_range,mode", [((1.0, 2.0), "multiply"), ((20.0, 60.0), "divide")])
def test_missing_linear_class_is_inferred_and_recorded(make_ckpt, engine_path, scale_range, mode):
    folder, truth = make_ckpt(linear_class=None, scale_range=scale_range)
    ef = convert(folder, engine_path)
    src = ef.meta["source"]
    assert src["linear_class"] is None and src["scale_mode"] == mode and src["scale_mode_inferred"] is True
    s = np.float32(truth["scale"]["model.layers.0.self_attn.q_proj.weight_scale"])
    assert ef["layers.0.qkv.scale"][0] == (s if mode == "multiply" else np.float32(1) / s)


def test_sharded_equals_single_file(make_ckpt, tmp_path):
    one, _ = make_ckpt("one", seed=3)
    three, _ = make_ckpt("three", seed=3, shards=3)
    assert os.path.exists(os.path.join(three, "model.safetensors.index.json"))
    a = convert(one, str(tmp_path / "a.bitnet"))
    b = convert(three, str(tmp_path / "b.bitnet"))
    assert a.tensors.keys() == b.tensors.keys()
    for name in a.tensors:
        assert np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize("rope_style", ["flat", "parameters"])
def test_rope_config_styles(make_ckpt, engine_path, rope_style):
    folder, _ = make_ckpt(rope_style=rope_style, max_position_embeddings=128)
    cfg = convert(folder, engine_path).config
    assert cfg["rope_theta"] == 500000.0 and cfg["max_position_embeddings"] == 128


def test_config_keys_and_values(make_ckpt, engine_path):
    folder, truth = make_ckpt(num_hidden_layers=3)
    cfg = convert(folder, engine_path).config
    assert set(cfg) == {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rope_theta",
                        "rms_norm_eps", "bos_token_id", "eos_token_id", "hidden_act", "sub_norms",
                        "tie_word_embeddings", "rope_scaling"}
    # the 2B-4T architecture: relu2, sub-norms, tied head, plain RoPE
    assert (cfg["hidden_act"], cfg["sub_norms"], cfg["tie_word_embeddings"], cfg["rope_scaling"]) == \
        ("relu2", True, True, None)
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (64, 96, 3)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 16)
    assert cfg["vocab_size"] == truth["vocab_size"] and cfg["rms_norm_eps"] == 1e-5
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (truth["bos"], truth["eos"])


def test_head_int8_agrees_with_embedding(make_ckpt, engine_path):
    folder, truth = make_ckpt(extra_vocab=5, mask_token=True)
    ef = convert(folder, engine_path)
    V, D = truth["vocab_size"], 64
    assert V == truth["n_tokenizer"] + 5 and ef.config["vocab_size"] == V
    from safetensors.torch import load_file
    src = load_file(os.path.join(folder, "model.safetensors"))["model.embed_tokens.weight"]
    assert np.array_equal(ef["embed"], src.view(torch.int16).numpy().view(np.uint16))   # bf16 bits unchanged
    emb = packing.bf16_to_f32(ef["embed"])
    Vp = packing.ceil_to(V, 16)
    assert ef["head.i8"].shape == (Vp // 16, D // 4, 64) and ef["head.scale"].shape == (Vp,)
    w8 = packing.unpack_int8_tiles(ef["head.i8"], V, D)
    scale = ef["head.scale"]
    assert np.all(np.abs(w8 * scale[:V, None] - emb) <= scale[:V, None] * 0.5 + 1e-6)
    assert np.allclose(scale[:V], np.abs(emb).max(axis=1) / 127, rtol=1e-6)
    assert not scale[V:].any() and not ef["head.rowsum"][V:].any()
    assert np.array_equal(ef["head.rowsum"][:V], w8.astype(np.int32).sum(axis=1))


def test_f32_embedding_is_rounded_to_bf16_and_noted(make_ckpt, engine_path):
    folder, _ = make_ckpt(embed_dtype=torch.float32)
    ef = convert(folder, engine_path)
    from safetensors.torch import load_file
    src = load_file(os.path.join(folder, "model.safetensors"))["model.embed_tokens.weight"]
    assert np.array_equal(ef["embed"], src.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    assert ef.meta["source"]["embed_dtype"] == "F32" and ef.meta["source"]["embed_rounded_to_bf16"] is True


def test_text_metadata(make_ckpt, engine_path):
    from tokenizers import Tokenizer
    folder, truth = make_ckpt()
    meta = convert(folder, engine_path).meta
    assert meta["stop_ids"] == [truth["eos"], truth["eot"]]
    assert meta["bos_id"] == truth["bos"] and meta["mask_id"] is None
    assert meta["chat_template"] == checkpoints.BITNET_CHAT_TEMPLATE
    assert meta["tokenizer_config"]["bos_token"] == "<|begin_of_text|>"
    assert meta["generation_config"]["eos_token_id"] == [truth["eos"], truth["eot"]]
    assert meta["diffusion"] == {"block_size": 32, "attention": "causal", "trained": False}
    tok = Tokenizer.from_str(meta["tokenizer_json"])
    ids = tok.encode("Hello world").ids
    assert ids[0] == truth["bos"] and tok.decode(ids) == "Hello world"


def test_mask_token_and_dlm_config(make_ckpt, engine_path, tmp_path):
    folder, truth = make_ckpt(mask_token=True)
    meta = convert(folder, engine_path).meta
    assert meta["mask_id"] == truth["mask"] and meta["mask_id"] < truth["vocab_size"]
    assert meta["diffusion"] == {"block_size": 32, "attention": "causal", "trained": True}
    folder2, truth2 = make_ckpt("dlm", extra_vocab=1, dlm_config={"mask_token_id": 7, "bd_size": 16})
    meta2 = convert(folder2, str(tmp_path / "dlm.bitnet")).meta
    assert meta2["mask_id"] == 7
    assert meta2["diffusion"] == {"block_size": 16, "attention": "block", "trained": True}


def test_dlm_config_suggests_the_decoding_knobs(make_ckpt, tmp_path):
    """sub_block_size and threshold of dlm_config.json become the model's diffusion defaults (what the app and
    Model.generate start from; the threshold is the threshold rule's); without them the DecodeParams defaults
    hold."""
    from bitnet_app.engine.runtime import Engine
    from bitnet_app.model import Model
    from bitnet_app.params import PLAIN_THRESHOLD, SUB_BLOCK

    folder, _ = make_ckpt("dlm", extra_vocab=1, dlm_config={"mask_token_id": 7, "bd_size": 16,
                                                             "sub_block_size": 16, "threshold": 0.75})
    ef = convert(folder, str(tmp_path / "dlm.bitnet"))
    assert ef.meta["diffusion"] == {"block_size": 16, "attention": "block", "trained": True,
                                    "sub_block_size": 16, "threshold": 0.75}
    d = Model(ef, Engine(ef, threads=1)).diffusion_defaults
    assert (d["block_size"], d["sub_block_size"], d["threshold"]) == (16, 16, 0.75)
    model = Model(ef, Engine(ef, threads=1))  # block attention: the threshold rule, at the suggested threshold
    assert model.decode_params(mode="diffusion").threshold == 0.75
    assert model.decode_params(mode="diffusion", threshold=0.8).threshold == 0.8
    folder2, _ = make_ckpt("dlm2", extra_vocab=1, dlm_config={"mask_token_id": 7})
    ef2 = convert(folder2, str(tmp_path / "dlm2.bitnet"))
    d2 = Model(ef2, Engine(ef2, threads=1)).diffusion_defaults
    assert (d2["sub_block_size"], d2["threshold"]) == (SUB_BLOCK, None)   # block 32: the largest divisor up to 8
    assert Model(ef2, Engine(ef2, threads=1)).decode_params(mode="diffusion").threshold == PLAIN_THRESHOLD


def test_block_size_from_config_bd_size(make_ckpt, engine_path):
    folder, _ = make_ckpt(mask_token=True)
    checkpoints.edit_json(folder, "config.json", bd_size=8)
    assert convert(folder, engine_path).meta["diffusion"]["block_size"] == 8


def test_chat_template_fallback_files(make_ckpt, engine_path, tmp_path):
    folder, _ = make_ckpt(chat_template=None)
    assert convert(folder, engine_path).meta["chat_template"] is None
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write("{{ messages[0]['content'] }}")
    assert convert(folder, str(tmp_path / "b.bitnet")).meta["chat_template"] == "{{ messages[0]['content'] }}"


def test_progress_reports_monotone_to_one(make_ckpt, engine_path):
    folder, _ = make_ckpt()
    seen = []
    convert_checkpoint(folder, engine_path, progress=lambda f, m: seen.append((f, m)))
    fracs = [f for f, _ in seen]
    assert len(seen) >= 4 and fracs == sorted(fracs) and fracs[-1] == 1.0 and all(isinstance(m, str) for _, m in seen)


# ---- bad inputs: ConvertError with a message naming the problem, and nothing under the output path ----

def _truncate(folder):
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)


def _huge_header(folder):
    with open(os.path.join(folder, "model.safetensors"), "r+b") as f:
        f.write((10 ** 12).to_bytes(8, "little"))


def _code3(folder):
    name = "model.layers.1.mlp.up_proj.weight"
    from safetensors.torch import load_file
    t = load_file(os.path.join(folder, "model.safetensors"))[name].clone()
    t[2, 5] = 0b11000000
    checkpoints.rewrite_tensor(folder, name, t)


BAD = {
    "truncated": (_truncate, r"past the end.*model\.safetensors|model\.safetensors.*truncated"),
    "corrupt header": (_huge_header, r"header length .* runs past the end"),
    "wrong architecture": (lambda d: checkpoints.edit_json(d, "config.json", model_type="mistral",
                                                architectures=["MistralForCausalLM"]),
                           r"'mistral' model \(MistralForCausalLM\): it has BitNet quantization, but model_type"),
    "full-precision llama": (lambda d: checkpoints.edit_json(d, "config.json", model_type="llama", architectures=["LlamaForCausalLM"],
                                                  quantization_config=None), r"has no BitNet quantization"),
    "missing tensor": (lambda d: checkpoints.rewrite_tensor(d, "model.layers.1.mlp.down_proj.weight", None),
                       r"'model\.layers\.1\.mlp\.down_proj\.weight' is missing"),
    "missing scale": (lambda d: checkpoints.rewrite_tensor(d, "model.layers.0.self_attn.o_proj.weight_scale", None),
                      r"weight_scale' is missing"),
    "wrong shape": (lambda d: checkpoints.rewrite_tensor(d, "model.layers.0.self_attn.k_proj.weight",
                                                         torch.zeros(4, 64, dtype=torch.uint8)),
                    r"k_proj\.weight' has shape \[4, 64\], expected \[8, 64\]"),
    "wrong dtype": (lambda d: checkpoints.rewrite_tensor(d, "model.layers.0.self_attn.q_proj.weight",
                                                         torch.zeros(16, 64, dtype=torch.int8)),
                    r"q_proj\.weight' has dtype I8"),
    "missing tokenizer": (lambda d: os.remove(os.path.join(d, "tokenizer.json")), r"tokenizer\.json is missing"),
    "missing config": (lambda d: os.remove(os.path.join(d, "config.json")), r"config\.json is missing"),
    "code 3": (_code3, r"up_proj\.weight' holds the invalid 2-bit code 3"),
    "unsupported quant method": (lambda d: checkpoints.edit_json(d, "config.json", quantization_config={"quant_method": "gptq"}),
                                 r"quantization method 'gptq' is not supported"),
    "mode mismatch": (lambda d: checkpoints.edit_json(d, "config.json", quantization_config={
        "quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"}),
        r"quantization_mode is 'online' but .* is U8"),
    "untied head without lm_head": (lambda d: checkpoints.edit_json(d, "config.json", tie_word_embeddings=False),
                                    r"tie_word_embeddings = false, but .* holds no lm_head\.weight"),
    "unknown activation": (lambda d: checkpoints.edit_json(d, "config.json", hidden_act="gelu"), r"hidden_act = 'gelu'"),
    "unknown rope scaling": (lambda d: checkpoints.edit_json(d, "config.json", rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                             r"rope_scaling\.rope_type = 'yarn'"),
    "mask out of range": (lambda d: open(os.path.join(d, "dlm_config.json"), "w").write('{"mask_token_id": 100000}'),
                          r"mask token id 100000 is outside"),
    "sub-block does not divide the block": (
        lambda d: open(os.path.join(d, "dlm_config.json"), "w").write('{"bd_size": 32, "sub_block_size": 12}'),
        r"sub_block_size 12 in dlm_config\.json must be a whole number that divides the block size 32"),
    "threshold out of range": (lambda d: open(os.path.join(d, "dlm_config.json"), "w").write('{"threshold": 1.5}'),
                               r"dlm_config\.json has threshold = 1\.5, outside the range the decoder takes \(\(0, 1\]"),
    "vocab mismatch": (lambda d: checkpoints.edit_json(d, "config.json", vocab_size=500), r"embed_tokens\.weight' has shape"),
    "heads do not fit": (lambda d: checkpoints.edit_json(d, "config.json", head_dim=8), r"not hidden_size"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_convert_error_and_writes_nothing(make_ckpt, engine_path, case):
    breaker, pattern = BAD[case]
    folder, _ = make_ckpt()
    breaker(folder)
    with pytest.raises(ConvertError, match=pattern) as info:
        convert_checkpoint(folder, engine_path)
    assert isinstance(info.value, ValueError)
    assert os.listdir(os.path.dirname(engine_path)) == []     # no output, no temporary leftovers
    # every message also says what to do
    assert any(w in str(info.value).lower() for w in ("download", "use ", "fix ", "pass ", "point "))
