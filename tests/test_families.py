"""The public 1.58-bit families besides BitNet 2B-4T (Falcon3, Llama3-8B-1.58, 1bitLLM, Falcon-E), each built
offline in its real on-disk layout (tests/family_checkpoints.py), converted, and run against transformers.

Checked per family: what the converter read from the checkpoint (scale rule, activation, sub-norms, head,
RoPE, ids, template); per-position logits (exact head, every kernel path) and greedy continuations against
the fp32 transformers reference, with the tolerances test_parity.py calibrates from the reference's own
sensitivity to 1e-6 nudges; and that an engine file computing a plausible wrong rule (the 2B-4T scale rule,
relu2 for silu, the sub-norms dropped, the llama3 rope scaling ignored, the embedding as the head) fails the
same checks. Unknown combinations of keys are refused with a message naming the key and the value.

Measured during development (avx2 and portable, 3 prompts of 40 positions; "nudges" = the reference's own
worst move under 1e-6 nudges, "engine" = the engine against the un-nudged reference):
  family     nudges median / max    engine median / max    argmax   greedy (24 tokens)
  falcon3    0.0095 / 0.014         3e-7..7e-7 / 0.0072    1.000    identical
  llama3     0.0038 / 0.011         3e-7 / 6e-7            1.000    identical
  1bitllm    0.0088 / 0.015         0.0082 / 0.013         1.000    identical
  falcon-e   0.0096 / 0.017         3e-7 / 0.0062          1.000    identical
(identical on avx2 and portable; worst prompt shown, every family has a prompt at the fp32 floor). The wrong
rules: multiply instead of divide median 1.1..1.2, relu2 for silu 0.36, sub-norms dropped 0.81, embedding as
the head 1.9, llama3 rope scaling ignored 0.10 (3.3x its tolerance of 0.03); all part from the reference's
greedy text at step 0.
"""
import os
import shutil

import numpy as np
import pytest

from bitnet_app.checkpoint.config import ConvertError
from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.engine import packing
from bitnet_app.engine.file import EngineFile, write_engine_file
from bitnet_app.engine.rope import rope_inv_freq
from bitnet_app.model import Model
from checkpoints import edit_json
from family_checkpoints import FAMILIES, load_family_reference, make_family_checkpoint
from parity_reference import (FP32_FLOOR, GREEDY_NEW, PROMPT_LEN, PROMPTS, CalibratedCase, Reference, built_once,
                              fmt, greedy_check, position_errors, require_reference)
from support import PATHS, logits_of_a_chat

GREEDY_PROMPT = 10


class FamilyReference(Reference):
    """parity_reference.Reference (logits, nudges, greedy) around the family's transformers model."""

    def __init__(self, truth):
        self.torch = require_reference()
        self.model = load_family_reference(truth)


def family_prompt(truth, n, seed):
    """BOS when the family adds one, then random ids over the whole vocabulary, never BOS or a stop id."""
    rng = np.random.default_rng(seed)
    banned = {truth["bos"], truth["eos"], truth["eot"], *truth["stops"]}
    pool = np.array([i for i in range(truth["vocab_size"]) if i not in banned])
    head = [int(truth["bos"])] if truth["bos"] is not None else []
    return head + [int(i) for i in rng.choice(pool, n - len(head))]


class FamilyCase(CalibratedCase):
    """One family: checkpoint, engine file, reference, calibration, greedy reference (built once per module)."""

    def __init__(self, name, root):
        self.name, self.root = name, root
        self.truth = make_family_checkpoint(os.path.join(root, "hf"), name)
        self.path = convert_checkpoint(self.truth["folder"], os.path.join(root, "model.bitnet"))
        self.ef = EngineFile(self.path)
        self.ref = FamilyReference(self.truth)
        self.model = Model.open(self.path, lm_head="exact", threads=2)
        self.stop_ids = self.model.stop_ids
        seed = FAMILIES[name]["seed"]
        self.calibrate([family_prompt(self.truth, PROMPT_LEN, 100 * seed + p) for p in range(PROMPTS)],
                       family_prompt(self.truth, GREEDY_PROMPT, 100 * seed + 99))
        self._broken = {}

    def converted(self, layout):
        """The same checkpoint converted with the ternary tiles in `layout` (packing.PACKINGS), once."""
        path = os.path.join(self.root, f"model-{layout}.bitnet")
        if not os.path.exists(path):
            convert_checkpoint(self.truth["folder"], path, packing=layout)
        return path

    def broken_model(self, bug):
        if bug not in self._broken:
            meta = {k: v for k, v in self.ef.meta.items() if k != "tensors"}
            meta["config"] = dict(meta["config"])
            tensors = BROKEN[bug](self.ef, meta)
            path = os.path.join(self.root, f"broken-{len(self._broken)}.bitnet")
            write_engine_file(path, meta, tensors)
            self._broken[bug] = Model.open(path, lm_head="exact", threads=2)
        return self._broken[bug]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    require_reference()
    return built_once(FamilyCase, tmp_path_factory)


# ---------------------------------------------------------------------------------------------
# what the converter read

def test_the_converter_reads_each_family_from_its_checkpoint(cases):
    """Scale rule, activation, sub-norms, head, RoPE, ids and template: from config.json and the tensors."""
    import torch
    from safetensors.torch import load_file

    def bf16_bits(t):  # a bf16 torch tensor -> its uint16 bit patterns
        return t.view(torch.int16).numpy().view(np.uint16)
    for name, f in FAMILIES.items():
        case = cases(name)
        cfg, src, meta = case.ef.config, case.ef.meta["source"], case.ef.meta
        assert cfg["hidden_act"] == "silu"
        assert cfg["head_dim"] == f["head_dim"] and cfg["num_key_value_heads"] == f["num_key_value_heads"]
        assert cfg["rope_theta"] == f["rope_theta"] and cfg["rope_scaling"] == f.get("rope_scaling")
        assert cfg["tie_word_embeddings"] == f["tie"] and ("lm_head" in case.ef.tensors) == (not f["tie"])
        assert cfg["sub_norms"] == (f["kind"] == "1bitllm")
        assert src["family"] == ("1bitllm" if f["kind"] == "1bitllm" else "llama")
        assert src["scale_mode"] == ("divide" if f["kind"] == "llama-packed" else "multiply")
        assert src["layout"] == ("offline" if f["kind"] == "llama-packed" else "online")
        assert meta["stop_ids"] == case.truth["stops"] and meta["bos_id"] == case.truth["bos"]
        assert meta["prompt_format"] == ("completion" if f["template"] is None else "chat")
        if f["kind"] == "llama-packed":
            # the per-row multiplier of q rows is 1 / the stored weight_scale (BitLinear divides)
            hf = load_file(os.path.join(case.truth["folder"], "model.safetensors"))
            ws = bf16_bits(hf["model.layers.0.self_attn.q_proj.weight_scale"])
            q_rows = f["num_attention_heads"] * f["head_dim"]
            got = np.asarray(case.ef.tensors["layers.0.qkv.scale"])[:q_rows]
            assert np.all(got == np.float32(1.0) / packing.bf16_to_f32(ws)[0])
        if not f["tie"]:
            hf = load_file(os.path.join(case.truth["folder"], "model.safetensors"))
            assert np.array_equal(case.ef.tensors["lm_head"], bf16_bits(hf["lm_head.weight"]))
        if cfg["rope_scaling"]:  # the reference really uses the llama3 rule, and so does the engine
            ref_inv = case.ref.model.model.rotary_emb.inv_freq.numpy()
            # the same float32 operations; torch's vectorised pow may round one of them differently from numpy's
            # on some CPUs (measured: 1 ulp of one frequency on Zen 4 AVX-512, none on Zen 3), while the plain
            # rule (checked next) differs by up to the factor 8
            np.testing.assert_array_max_ulp(ref_inv, rope_inv_freq(cfg), maxulp=2)
            assert not np.allclose(ref_inv, rope_inv_freq(dict(cfg, rope_scaling=None), plain=True))


def test_templates_and_completion(cases):
    falcon = cases("falcon3").model
    ids = falcon.chat_ids([{"role": "user", "content": "Hello"}])
    assert falcon.decode(ids) == "<|user|>\nHello\n<|assistant|>\n"   # no BOS: Falcon3 adds none
    llama = cases("llama3").model
    ids = llama.chat_ids([{"role": "user", "content": "Hello"}])
    assert llama.decode(ids) == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                                 "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert ids.count(llama.bos_id) == 1
    base = cases("1bitllm").model   # no chat template: completion, the conversation is one text
    assert base.completion and not falcon.completion and base.info()["completion"]
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Once upon a time"}]
    assert base.chat_ids(convo) == base.encode("Once upon a time")
    assert base.chat_ids(convo)[0] == base.bos_id


# ---------------------------------------------------------------------------------------------
# parity with transformers

@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_logits_match_transformers(cases, name, isa):
    case = cases(name)
    model = Model.open(case.path, lm_head="exact", threads=2, isa=isa)
    assert model.engine.isa.startswith(isa)
    ok, d = case.check_logits(model)
    print(f"\n{name} [{model.engine.isa}]: tolerances {fmt(case.tol)}\n  engine {fmt(d)}")
    assert ok, f"{name}: engine logits differ from transformers' beyond the calibrated tolerance: {fmt(d)}"
    best = min(float(np.median(position_errors(model.logits(ids), r))) for ids, r in zip(case.prompts, case.refs))
    assert best <= FP32_FLOOR, f"{name}: no prompt agrees to the fp32 floor (best median {best:.3g})"


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_16bit_tiles_give_the_2bit_logits_bit_for_bit(cases, name, isa):
    """Each family's 1.6-bit file gives bit for bit the logits of its 2-bit file, on every kernel path, for every
    kind of forward (support.logits_of_a_chat) and both heads."""
    case = cases(name)
    five, two = case.converted("1.6bit"), case.converted("2bit")
    assert EngineFile(five).packing == "1.6bit" and EngineFile(two).packing == "2bit"
    ids = family_prompt(case.truth, 36, 7)
    for head in ("exact", "int8"):
        got, want = (logits_of_a_chat(p, isa, head, ids) for p in (five, two))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_greedy_text_matches_transformers(cases, name):
    case = cases(name)
    assert len(case.ref_seq) >= GREEDY_NEW // 2, f"{name}: the reference stopped early; pick another seed"
    ok, d = greedy_check(case.model, case)
    out = case.model.complete(case.greedy_prompt, max_new_tokens=GREEDY_NEW)
    print(f"\n{name}: greedy {fmt(d)}\n  reference text {case.model.decode(case.ref_seq)!r}\n"
          f"  engine text    {case.model.decode(out)!r}")
    assert ok, f"{name}: greedy continuation differs from the reference's: {fmt(d)}"


# ---------------------------------------------------------------------------------------------
# teeth: engine files that compute a plausible wrong rule fail the same checks

def _layers(ef):
    return range(ef.config["num_hidden_layers"])


def broken_multiply(ef, meta):
    """The 2B-4T rule on a BitLinear checkpoint: W = T * weight_scale instead of T / weight_scale."""
    t = dict(ef.tensors)
    for i in _layers(ef):
        for p in ("qkv", "o", "gate_up", "down"):
            s = np.array(t[f"layers.{i}.{p}.scale"], dtype=np.float32)
            s[s > 0] = 1.0 / s[s > 0]
            t[f"layers.{i}.{p}.scale"] = s
    return t


def broken_relu2(ef, meta):
    meta["config"]["hidden_act"] = "relu2"
    return dict(ef.tensors)


def broken_no_rope_scaling(ef, meta):
    meta["config"]["rope_scaling"] = None
    return dict(ef.tensors)


def broken_no_sub_norms(ef, meta):
    meta["config"]["sub_norms"] = False
    return {k: v for k, v in ef.tensors.items() if not k.endswith("_sub_norm")}


def broken_tied_head(ef, meta):
    """The embedding read as the head of an untied checkpoint (the int8 head rebuilt from it too)."""
    from bitnet_app.checkpoint.convert import build_int8_head
    meta["config"]["tie_word_embeddings"] = True
    t = {k: v for k, v in ef.tensors.items() if k != "lm_head"}
    t.update(build_int8_head(np.asarray(ef.tensors["embed"])))
    return t


BROKEN = {"multiply by weight_scale": broken_multiply, "relu2 for silu": broken_relu2,
          "llama3 rope scaling ignored": broken_no_rope_scaling, "sub-norms dropped": broken_no_sub_norms,
          "embedding as the head": broken_tied_head}
BROKEN_CASES = [("falcon3", "multiply by weight_scale"), ("falcon3", "relu2 for silu"),
                ("llama3", "llama3 rope scaling ignored"), ("llama3", "multiply by weight_scale"),
                ("1bitllm", "sub-norms dropped"), ("falcon-e", "embedding as the head")]


@pytest.mark.parametrize("name,bug", BROKEN_CASES)
def test_wrong_rules_fail_the_same_checks(cases, name, bug):
    case = cases(name)
    broken = case.broken_model(bug)
    ok_logits, d = case.check_logits(broken)
    ok_greedy, g = greedy_check(broken, case)
    print(f"\n{name} / {bug}: logits {fmt(d)}\n  greedy {fmt(g)}")
    assert not ok_logits, f"{name}: the logits check does not notice '{bug}': {fmt(d)}"
    assert not ok_greedy, f"{name}: the greedy check does not notice '{bug}': {fmt(g)}"


# ---------------------------------------------------------------------------------------------
# unknown combinations: a clear refusal naming the key and the value, never a wrong answer

def _edit_config(folder, **changes):
    edit_json(folder, "config.json", **changes)


def _drop_tensor(folder, name):
    from safetensors.torch import load_file, save_file
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    del tensors[name]
    save_file(tensors, path, metadata={"format": "pt"})


QC = {"modules_to_not_convert": ["lm_head"], "quant_method": "bitnet"}
UNKNOWN = {
    "gelu activation": (lambda d: _edit_config(d, hidden_act="gelu_pytorch_tanh"), r"hidden_act = 'gelu_pytorch_tanh'"),
    "yarn rope scaling": (lambda d: _edit_config(d, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                          r"rope_scaling\.rope_type = 'yarn'"),
    "llama3 scaling without factor": (lambda d: _edit_config(d, rope_scaling={
        "rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}), r"rope_scaling\.factor = None"),
    "unknown linear class": (lambda d: _edit_config(d, quantization_config=dict(QC, linear_class="ternlinear")),
                             r"linear_class 'ternlinear'"),
    "per-linear rms norm": (lambda d: _edit_config(d, quantization_config=dict(QC, use_rms_norm=True)),
                            r"use_rms_norm"),
    "attention bias": (lambda d: _edit_config(d, attention_bias=True), r"attention_bias = True"),
    "mlp bias": (lambda d: _edit_config(d, mlp_bias=True), r"mlp_bias = True"),
    "partial rotary": (lambda d: _edit_config(d, partial_rotary_factor=0.5), r"partial_rotary_factor = 0\.5"),
    "qwen with bitnet quantization": (lambda d: _edit_config(d, model_type="qwen2", architectures=["Qwen2ForCausalLM"]),
                                      r"model_type 'qwen2' is not one this app runs"),
    "full-precision llama": (lambda d: _edit_config(d, quantization_config=None, is_bitnet_config=None),
                             r"no BitNet quantization"),
    "untied without lm_head": (lambda d: _drop_tensor(d, "lm_head.weight"), r"holds no lm_head\.weight"),
    "head_dim not fitting": (lambda d: _edit_config(d, head_dim=128), r"head_dim = 3 x 128 = 384, not hidden_size 768"),
}


@pytest.mark.parametrize("what", list(UNKNOWN))
def test_unknown_combinations_are_refused_by_name(tmp_path, what):
    folder = str(tmp_path / "falcon3")
    make_family_checkpoint(folder, "falcon3")
    breaker, pattern = UNKNOWN[what]
    breaker(folder)
    with pytest.raises(ConvertError, match=pattern):
        convert_checkpoint(folder, str(tmp_path / "out.bitnet"))
    assert not os.path.exists(tmp_path / "out.bitnet")


def test_sub_norms_in_only_some_layers_are_refused(tmp_path):
    folder = str(tmp_path / "1bitllm")
    make_family_checkpoint(folder, "1bitllm")
    _drop_tensor(folder, "model.layers.1.self_attn.inner_attn_ln.weight")
    with pytest.raises(ConvertError, match=r"'model\.layers\.1\.self_attn\.inner_attn_ln\.weight' is missing"):
        convert_checkpoint(folder, str(tmp_path / "out.bitnet"))
    shutil.rmtree(folder + "-reference", ignore_errors=True)


def test_folded_bf16_revision_converts_like_the_packed_one(tmp_path):
    """Falcon-E's `bfloat16` revision holds T / weight_scale folded into bf16 (onebitllms convert_to_bf16): the
    converter takes such latent weights as they are (T = sign, scale = |w|), so it gives the packed revision's
    ternary codes and its scales up to their bf16 rounding. Absmean would keep T but shrink every scale to
    |w| x (the fraction of nonzero weights)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.bitnet import unpack_weights
    packed = str(tmp_path / "packed")
    truth = make_family_checkpoint(packed, "falcon3")
    folded = str(tmp_path / "bfloat16")
    shutil.copytree(packed, folded)
    tensors = load_file(os.path.join(packed, "model.safetensors"))
    out = {}
    for k, v in tensors.items():
        if k.endswith("_proj.weight"):
            out[k] = (unpack_weights(v, dtype=torch.bfloat16) / tensors[k + "_scale"]).to(torch.bfloat16)
        elif not k.endswith("weight_scale"):
            out[k] = v
    save_file(out, os.path.join(folded, "model.safetensors"), metadata={"format": "pt"})
    a = EngineFile(convert_checkpoint(packed, str(tmp_path / "a.bitnet")))
    b = EngineFile(convert_checkpoint(folded, str(tmp_path / "b.bitnet")))
    assert b.meta["source"]["layout"] == "online"
    for name in a.tensors:
        if name.endswith(".codes"):
            assert np.array_equal(a[name], b[name]), name
        elif name.endswith(".scale") and name.startswith("layers."):
            sa, sb = np.asarray(a[name]), np.asarray(b[name])
            assert np.all(np.abs(sb - sa) <= sa * 2.0 ** -8), name    # bf16 rounding of 1 / weight_scale
    ids = family_prompt(truth, 24, 5)
    la = Model.open(a.path, lm_head="exact", threads=1).logits(ids)
    lb = Model.open(b.path, lm_head="exact", threads=1).logits(ids)
    assert (la.argmax(1) == lb.argmax(1)).mean() >= 0.9


def test_a_bitnet_or_1bitllm_checkpoint_without_its_sub_norms_is_refused(tmp_path, make_ckpt):
    """Their modeling code always has sub-norms: missing ones mean a damaged download, never a model without."""
    folder = str(tmp_path / "1bitllm")
    make_family_checkpoint(folder, "1bitllm")
    for i in range(FAMILIES["1bitllm"]["num_hidden_layers"]):
        for n in ("self_attn.inner_attn_ln", "mlp.ffn_layernorm"):
            _drop_tensor(folder, f"model.layers.{i}.{n}.weight")
    with pytest.raises(ConvertError, match=r"'model\.layers\.0\.self_attn\.inner_attn_ln\.weight' is missing"):
        convert_checkpoint(folder, str(tmp_path / "out.bitnet"))
    bitnet, _ = make_ckpt("bitnet")
    _drop_tensor(bitnet, "model.layers.0.self_attn.attn_sub_norm.weight")
    _drop_tensor(bitnet, "model.layers.0.mlp.ffn_sub_norm.weight")
    with pytest.raises(ConvertError, match=r"'model\.layers\.0\.self_attn\.attn_sub_norm\.weight' is missing"):
        convert_checkpoint(bitnet, str(tmp_path / "out.bitnet"))
