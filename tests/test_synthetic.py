"""synthetic.py: a tiny random engine file that is internally consistent and loadable."""
import numpy as np
import pytest
from tokenizers import Tokenizer

from bitnet_app.engine import packing
from bitnet_app.engine.file import EngineFile
from bitnet_app.checkpoint.synthetic import SHAPES, random_bf16, random_ternary_tiles, write_synthetic_engine_file
from support import PATHS


@pytest.mark.parametrize("layout", packing.PACKINGS)
def test_tiny_file_is_consistent(tmp_path, layout):
    path = write_synthetic_engine_file(str(tmp_path / "tiny.bitnet"), shape="tiny", seed=1, layout=layout)
    ef = EngineFile(path)
    assert ef.packing == layout
    cfg, s = ef.config, SHAPES["tiny"]
    D, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    assert ef["embed"].shape == (V, D) and ef["embed"].dtype == np.uint16
    for i in range(cfg["num_hidden_layers"]):
        for name, n, k in (("qkv", q + 2 * kv, D), ("o", D, q), ("gate_up", 2 * I, D), ("down", D, I)):
            codes = ef[f"layers.{i}.{name}.codes"]
            assert codes.shape == packing.ternary_tile_shape(n, k, layout)
            if layout == "2bit":
                fields = np.stack([(codes >> (2 * j)) & 3 for j in range(4)])
                assert fields.max() <= 2 and len(np.unique(fields)) == 3      # ternary, all three values used
            else:  # every byte a valid 5-digit code, and the digits past k weight 0
                assert np.array_equal(packing.encode_trits(packing.decode_trits(codes)), codes)
                full = packing.unpack_ternary5_tiles(codes, n, codes.shape[1] * 20)
                assert len(np.unique(full[:, :k])) == 3 and not full[:, k:].any()
            sc = ef[f"layers.{i}.{name}.scale"]
            assert sc.shape == (n,) and np.all((sc > 1.1) & (sc < 1.9))
        assert ef[f"layers.{i}.ffn_sub_norm"].shape == (I,)
    w8 = packing.unpack_int8_tiles(ef["head.i8"], V, D)                    # the int8 head quantizes the embedding
    emb = packing.bf16_to_f32(ef["embed"])
    assert np.all(np.abs(w8 * ef["head.scale"][:V, None] - emb) <= ef["head.scale"][:V, None] / 2 + 1e-6)
    assert np.array_equal(ef["head.rowsum"][:V], w8.astype(np.int32).sum(1))
    assert ef.meta["stop_ids"] == [s["eos"], s["eot"]] and ef.meta["bos_id"] == s["bos"]
    tok = Tokenizer.from_str(ef.meta["tokenizer_json"])
    ids = tok.encode("Hi é!<|eot_id|>").ids
    assert ids[0] == s["bos"] and ids[-1] == s["eot"] and max(ids) < V
    assert tok.decode(ids) == "Hi é!"


def test_same_seed_same_file(tmp_path):
    a = write_synthetic_engine_file(str(tmp_path / "a.bitnet"), shape="tiny", seed=5)
    b = write_synthetic_engine_file(str(tmp_path / "b.bitnet"), shape="tiny", seed=5)
    assert open(a, "rb").read() == open(b, "rb").read()


def test_random_helpers():
    rng = np.random.default_rng(0)
    t = random_ternary_tiles(rng, 32, 64)
    w = packing.unpack_ternary_tiles(t, 32, 64)
    assert set(np.unique(w)) == {-1, 0, 1}
    x = packing.bf16_to_f32(random_bf16(rng, 200, 300, std=0.5))
    assert abs(x.std() - 0.5) < 0.02 and abs(x.mean()) < 0.02


def test_unknown_shape():
    with pytest.raises(ValueError, match="unknown synthetic shape"):
        write_synthetic_engine_file("/nonexistent/x.bitnet", shape="7b")


def test_the_cli_knows_every_shape():
    from bitnet_app.__main__ import PACKINGS, SYNTHETIC_SHAPES
    assert SYNTHETIC_SHAPES == tuple(SHAPES)
    assert PACKINGS == packing.PACKINGS


def test_llama_family_shape_runs_like_the_numpy_reference(tmp_path):
    """tiny-llama: silu, no sub-norms, an untied head whose int8 copy is the head's (not the embedding's),
    Falcon3's single eos 11; the engine agrees with the numpy reference on it."""
    from bitnet_app.engine.reference import NumpyModel
    from bitnet_app.model import Model
    path = write_synthetic_engine_file(str(tmp_path / "tl.bitnet"), shape="tiny-llama", seed=2)
    ef = EngineFile(path)
    cfg = ef.config
    assert (cfg["hidden_act"], cfg["sub_norms"], cfg["tie_word_embeddings"]) == ("silu", False, False)
    assert not any(n.endswith("_sub_norm") for n in ef.tensors) and ef["lm_head"].shape == ef["embed"].shape
    V, D = cfg["vocab_size"], cfg["hidden_size"]
    w8 = packing.unpack_int8_tiles(ef["head.i8"], V, D)
    head = packing.bf16_to_f32(ef["lm_head"])
    assert np.all(np.abs(w8 * ef["head.scale"][:V, None] - head) <= ef["head.scale"][:V, None] / 2 + 1e-6)
    assert ef.meta["stop_ids"] == [11] and ef.meta["bos_id"] == 11
    model = Model.open(path, lm_head="exact", threads=1)
    ids = model.encode("Hello there")
    assert max(ids) < V and model.decode(ids).endswith("Hello there")
    ref = NumpyModel(ef).logits(ids)
    got = model.logits(ids)
    assert np.median(np.abs(got - ref).max(1) / np.abs(ref).max()) < 1e-5


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-1bitllm"])
def test_family_shapes_agree_with_the_numpy_reference_on_every_path(tmp_path, shape, isa):
    """head_dim 32 with 3:1 GQA (silu, no sub-norms, untied) and head_dim 96 with multi-head attention (silu,
    sub-norms, tied): the engine's exact head and fp32 KV against the plain numpy forward, 40 positions."""
    from bitnet_app.engine.reference import NumpyModel
    from bitnet_app.model import Model
    ef = EngineFile(write_synthetic_engine_file(str(tmp_path / f"{shape}.bitnet"), shape=shape, seed=4))
    fam = SHAPES[shape]["family"]
    assert ef.config["sub_norms"] == (fam != "llama") and ef.config["tie_word_embeddings"] == (fam != "llama")
    ids = [int(i) for i in np.random.default_rng(1).integers(0, ef.config["vocab_size"], 40)]
    got = Model.open(ef.path, lm_head="exact", threads=2, isa=isa).logits(ids)
    ref = NumpyModel(ef).logits(ids)
    err = np.abs(got - ref).max(1) / np.abs(ref).max()
    assert np.median(err) < 1e-5, np.median(err)   # between int8 rounding flips, the fp32 floor
