"""The bundled demo model (assets/demo-model): it is the model assets/README.md describes, transformers
loads it, and the engine reproduces transformers on it.

A trained model is far less chaotic than the random ternary models of test_parity.py, but the reference
itself still moves between CPUs: where x * 127 / max|x| lies on a .5 rounding boundary, torch's own
summation order (AVX-512 vs AVX2 kernels) flips one int8 activation and moves that position's logits by up
to ~4e-3 of the logit scale. So the exact-mode tolerance is calibrated as in test_parity.py, against what
1e-6 nudges of the reference's input embedding and weight scales do to the reference on this CPU (3x the
worst move, no looser floors), and the fast default (int8 head, fp16 KV cache) may change a top-1 only at a
near-tie, and must keep the held-out loss."""
import hashlib
import json
import os
import re

import numpy as np
import pytest

from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.model import Model
from parity_reference import FP32_FLOOR, Reference, require_reference, summary
from support import PATHS, assert_threads_change_nothing

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
DEMO = os.path.join(ASSETS, "demo-model")
HELD_OUT = ("HAMLET.\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
            "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles,\n"
            "And by opposing end them.")
# A conversation in the trained format: a held-out skill with its right answer, then a Shakespeare turn.
CONVERSATION = [{"role": "user", "content": "Count down from 316 to 303."},
                {"role": "assistant", "content": "316, 315, 314, 313, 312, 311, 310, 309, 308, 307, 306, 305, 304, 303"},
                {"role": "user", "content": "Continue this scene:\nHAMLET."},
                {"role": "assistant", "content": HELD_OUT.split("\n", 1)[1]}]


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


def test_demo_model_is_a_block_diffusion_chat_bitnet(demo):
    m = Model.open(demo, threads=2)
    assert m.trained_for_diffusion and m.mask_id == 3
    assert m.diffusion_defaults["attention"] == "causal" and m.diffusion_defaults["block_size"] == 32
    assert m.meta["source"]["scale_mode"] == "multiply"  # autobitlinear: W_eff = ternary x weight_scale
    assert m.context_length == 512 and m.stop_ids[0] == m.encode("<|eot_id|>", add_special_tokens=False)[0]


def test_the_app_renders_the_chat_as_the_model_was_trained(demo):
    """The chat template (rendered by bitnet_app.chat's sandbox) gives the very ids the training windows were
    built from (tools/demo_chat.py): system, user and assistant turns, each closed by the stop token."""
    from tokenizers import Tokenizer

    from tools import demo_chat

    tok = Tokenizer.from_file(os.path.join(DEMO, "tokenizer.json"))
    m = Model.open(demo, threads=2)
    talk = [{"role": "system", "content": "Be concise."}, {"role": "user", "content": "Count from 3 to 12."},
            {"role": "assistant", "content": "3, 4, 5, 6, 7, 8, 9, 10, 11, 12"},
            {"role": "user", "content": "Repeat \"the red cat\" 3 times."}]
    for n in (2, 4):
        assert m.chat_ids(talk[:n]) == demo_chat.render_ids(tok, talk[:n])
    ids = m.chat_ids(talk[:3], add_generation_prompt=False)
    assert ids[-1] == m.stop_ids[0] and ids.count(m.stop_ids[0]) == 3


def _log_softmax(z):
    z = z.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def test_engine_reproduces_transformers_on_the_demo_model(demo):
    ids = Model.open(demo, threads=2).chat_ids(CONVERSATION, add_generation_prompt=False)
    reference = Reference(DEMO)
    ref = reference.logits(ids)
    ref_nll = -np.mean(_log_softmax(ref)[np.arange(len(ids) - 1), ids[1:]])
    # What fp32-level noise does to the reference itself on this CPU (measured on a Zen 3 AVX2 machine:
    # worst position 4.3e-3, worst median 9e-4 of the logit scale, every argmax kept).
    nudged = [summary(n, ref) for _, n in reference.nudged_logits(ids)]
    max_tol = 3 * max(max(s["max"] for s in nudged), FP32_FLOOR)
    median_tol = 3 * max(max(s["median"] for s in nudged), FP32_FLOOR)
    argmax_min = min(s["argmax"] for s in nudged) - 1.0 / len(ids)

    exact = summary(Model.open(demo, lm_head="exact", threads=2).logits(ids), ref)  # bf16 head, fp32 KV
    assert exact["max"] <= max_tol and exact["median"] <= median_tol, (exact, max_tol, median_tol)
    assert exact["argmax"] >= argmax_min, (exact, argmax_min)   # measured: 1.0 (Zen 3 AVX2, Zen 4 AVX-512)

    # The fast default (int8 head, fp16 KV) approximates the head and the cache, so it may change the top-1 where
    # the reference's two best logits are nearly tied, never elsewhere: only where the reference's margin is within
    # the int8 head's resolution (1/127 of the logit scale), and at most half of those near-ties. Measured: phase
    # 3's model 0-3 flips of 164 positions (Zen 3 AVX2, Zen 4 AVX-512 and AVX2, portable); phase 4's, more sure of
    # the skill turn and as unsure of the Shakespeare one, 6 of its near-ties (Zen 4 AVX-512), margins <= 0.26%.
    fast = Model.open(demo, threads=2).logits(ids)                               # int8 head, fp16 KV
    flips = np.nonzero(fast.argmax(1) != ref.argmax(1))[0]
    scale = np.abs(ref).max()
    margins = (ref.max(1) - ref[np.arange(len(ids)), fast.argmax(1)])[flips] / scale
    top2 = np.sort(ref, axis=1)[:, -2:]
    near_ties = int(np.sum((top2[:, 1] - top2[:, 0]) / scale <= 1 / 127))
    assert np.all(margins <= 1 / 127), (flips, margins)
    assert len(flips) <= near_ties / 2, (flips, near_ties)
    nll = -np.mean(_log_softmax(fast)[np.arange(len(ids) - 1), ids[1:]])
    assert abs(nll - ref_nll) < 0.01                                             # measured 0.0002 nats


def test_every_suggestion_is_exactly_right_in_both_modes(demo):
    """assets/demo-suggestions.json: the prompts the page offers with the demo model. Each one's recorded answer is
    the answer oracle's (tools/demo_oracle.py), and the model, greedy as it starts, gives exactly that reply in
    AR and in block diffusion with its own settings (the checkpoint's rule, block size, threshold)."""
    from bitnet_app.ui import suggestions
    from tools.demo_oracle import expected

    data = json.load(open(os.path.join(ASSETS, "demo-suggestions.json"), encoding="utf-8"))
    assert suggestions.prompt_file(DEMO) == os.path.join(ASSETS, "demo-suggestions.json")
    assert len(data["skills"]) >= 4 and len(data["open"]) >= 1
    m = Model.open(demo, threads=2)
    assert m.generation_defaults["temperature"] == 0.0  # the demo starts greedy, on the page and in the CLI
    for item in data["skills"]:
        assert expected(item["prompt"])[1] == item["answer"], item
        ids = m.chat_ids([{"role": "user", "content": item["prompt"]}])
        for mode in ("ar", "diffusion"):
            got = m.decode(m.complete(ids, mode=mode, max_new_tokens=256)).strip()
            assert got == item["answer"], (mode, item["prompt"], got)


def test_held_out_prompts_were_never_trained_on():
    """assets/demo-prompts.json: {"skills": [...], "open": [...]}, each one user message. Every skill prompt comes
    from a held-out parameter region of tools/demo_skills.py, so the training generator never asks it (checked
    on a large sample); the open prompts are from the held-out plays."""
    import random

    from tools import demo_skills
    from tools.eval_demo_model import skill_prompts

    data = json.load(open(os.path.join(ASSETS, "demo-prompts.json"), encoding="utf-8"))
    assert sorted(data) == ["open", "skills"] and all(isinstance(p, str) and p for v in data.values() for p in v)
    held_out = {p["prompt"]: p["family"] for p in skill_prompts()}
    assert len(data["skills"]) >= 32 and set(data["skills"]) <= set(held_out)
    assert len({held_out[p] for p in data["skills"]}) == len(demo_skills.FAMILIES)  # every family
    rng = random.Random(0)
    trained = {demo_skills.make_item(rng, f)[0] for f in demo_skills.FAMILIES for _ in range(3000)}
    assert not trained & set(data["skills"])
    speakers = ("BRUTUS", "CASSIUS", "CAESAR", "ANTONY", "LUCIUS", "PORTIA", "VIOLA", "OLIVIA", "MALVOLIO",
                "SIR TOBY", "SIR ANDREW", "MARIA", "FESTE", "CLOWN", "ORSINO", "DUKE", "SEBASTIAN", "FABIAN")
    assert len(data["open"]) >= 4 and all(any(s in p for s in speakers) for p in data["open"])


@pytest.mark.parametrize("isa", PATHS)
def test_the_thread_count_changes_no_logit_of_the_demo_models_batches(demo, isa):
    """The demo model's layers (384 KiB of ternary tiles) are split between threads by tokens for batches of at
    most 32 (a denoising step: _kernels/schedule.c TOKEN_SPLIT_WIDE_BYTES) and by the rows of each matrix above
    that (a long prompt): 1, 2 and 3 threads give bit-identical logits either way."""
    from bitnet_app.engine.file import EngineFile
    from bitnet_app.engine.runtime import Engine

    ef = EngineFile(demo)
    ids = np.random.default_rng(7).integers(7, 4096, 61)

    def run(threads):
        eng = Engine(ef, isa=isa, threads=threads)
        out = [eng.forward(ids[:40], rows=range(40))]                                  # 40 rows: split by matrix rows
        out.append(eng.forward(ids[40:49], start=40, commit=False, rows=range(1, 9)))  # a 9-row step: by tokens
        out.append(eng.forward(ids[40:60], start=40, rows=range(20)))                  # 20 rows: by tokens
        out.append(eng.forward(ids[60:61], start=60))                                  # one token
        return out
    assert_threads_change_nothing(run)


def test_the_page_leaves_room_for_a_count_to_100(demo):
    """The page's longest reply for the demo model (ui/state.py reply_limit of its 512 positions) holds the
    oracle's answer to "Count to 100." and its stop token, and the question with the page's system prompt fits
    in the positions left: a count to 100 is not cut at a token limit the page set."""
    from bitnet_app.ui import state
    from tools.demo_oracle import expected

    m = Model.open(demo, threads=1)
    limit = state.first_max_new_tokens(m.context_length)
    answer = m.encode(expected("Count to 100.")[1], add_special_tokens=False)
    ids = m.chat_ids([{"role": "system", "content": state.DEFAULT_SYSTEM_PROMPT},
                      {"role": "user", "content": "Count to 100."}])
    assert len(answer) + 1 <= limit and len(ids) + limit <= m.context_length, (len(answer), len(ids), limit)
