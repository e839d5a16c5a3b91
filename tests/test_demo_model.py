"""The bundled demo model (assets/demo-model): it is the model assets/README.md describes, transformers
loads it, and the engine reproduces transformers on it.

A trained model is not chaotic the way random ternary test models are: here the engine in exact mode must
match the fp32 reference at every position to fp32 precision, and the fast default (int8 head, fp16 KV
cache) must keep every top-1 and the held-out loss."""
import hashlib
import json
import os
import re

import numpy as np
import pytest

from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.model import Model
from checkpoints import load_reference_model
from test_parity import require_reference

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
DEMO = os.path.join(ASSETS, "demo-model")
HELD_OUT = ("HAMLET.\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
            "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles,\n"
            "And by opposing end them.")


def test_bundled_files_are_the_ones_the_readme_records():
    text = open(os.path.join(ASSETS, "README.md"), encoding="utf-8").read()
    block = text[text.index("### Checksums"):]
    recorded = re.findall(r"^([0-9a-f]{64})\s+demo-model/(\S+)\s+\((\d+) bytes\)", block, re.M)
    assert {name for _, name, _ in recorded} >= {"model.safetensors", "tokenizer.json", "config.json",
                                                 "tokenizer_config.json", "dlm_config.json"}
    for digest, name, size in recorded:
        data = open(os.path.join(DEMO, name), "rb").read()
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (digest, int(size)), name


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    require_reference()
    path = str(tmp_path_factory.mktemp("demo") / "demo.bitnet")
    convert_checkpoint(DEMO, path)
    return path


def test_demo_model_is_a_block_diffusion_bitnet(demo):
    m = Model.open(demo, threads=2)
    assert m.trained_for_diffusion and m.mask_id == 3
    assert m.diffusion_defaults["attention"] == "block" and m.diffusion_defaults["block_size"] == 32
    assert m.meta["source"]["scale_mode"] == "multiply"  # autobitlinear: W_eff = ternary x weight_scale


def _log_softmax(z):
    z = z.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def test_engine_reproduces_transformers_on_the_demo_model(demo):
    import torch

    ids = Model.open(demo, threads=2).encode(HELD_OUT)
    with torch.no_grad():
        ref = load_reference_model(DEMO)(torch.tensor([ids])).logits[0].float().numpy()
    scale = np.abs(ref).max()
    ref_nll = -np.mean(_log_softmax(ref)[np.arange(len(ids) - 1), ids[1:]])

    exact = Model.open(demo, lm_head="exact", threads=2).logits(ids)           # bf16 head, fp32 KV
    assert np.abs(exact - ref).max() / scale < 1e-5                              # measured 9e-7
    assert np.array_equal(exact.argmax(1), ref.argmax(1))

    fast = Model.open(demo, threads=2).logits(ids)                               # int8 head, fp16 KV
    assert fast.argmax(1).tolist() == ref.argmax(1).tolist()                     # measured: every position
    nll = -np.mean(_log_softmax(fast)[np.arange(len(ids) - 1), ids[1:]])
    assert abs(nll - ref_nll) < 0.01                                             # measured 0.0002 nats


def test_held_out_prompts_fill_two_whole_blocks():
    """assets/demo-heldout.json (benchmarks/diffusion_vs_ar.py --prompts-file) holds text from the two plays kept out
    of training; with the bundled tokenizer every prompt is BOS + 63 tokens, so every reply starts a fresh block."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(DEMO, "tokenizer.json"))
    data = json.load(open(os.path.join(ASSETS, "demo-heldout.json"), encoding="utf-8"))
    assert "julius_caesar" in data["source"] and len(data["prompts"]) == 16
    for text in data["prompts"]:
        ids = tok.encode(text).ids
        assert len(ids) == 64 and ids[0] == 0 and 3 not in ids
