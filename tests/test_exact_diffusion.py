"""Exact block diffusion (fill_rule="exact", bitnet_app/decode/exact.py): the reply is AR's, in fewer steps.

Greedy: exact diffusion gives greedy AR's reply token for token, on random models and on the bundled demo model.
Sampled: the reply has AR's distribution at the same settings: a chi-square homogeneity test of the first three
tokens over 20,000 seeded draws per mode, which the threshold rule (Fast-dLLM v2's) fails.
"""
import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.decode.exact import accepts, draft_distribution, draw, residual
from bitnet_app.model import Model
from bitnet_app.params import EXACT_NEEDS_CAUSAL, DecodeParams, problem
from checkpoints import make_hf_checkpoint, rewrite_tensor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(REPO, "assets")


def _model(folder, *, seed, attention="causal", block=16, **shape) -> Model:
    make_hf_checkpoint(folder, mask_token=True, seed=seed, **shape,
                       dlm_config={"mask_token_id": None, "bd_size": block, "attention": attention})
    convert_checkpoint(str(folder), str(folder / "m.bitnet"))
    return Model.open(str(folder / "m.bitnet"), threads=2)


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("causal") / "ck", seed=31)


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(i) for i in rng.integers(4, 300, rng.integers(1, 40))] for _ in range(n)]


# ---- greedy: AR's reply -------------------------------------------------------------------------------
@pytest.mark.parametrize("knobs", [dict(), dict(threshold=0.05), dict(threshold=0.3, sub_block_size=16),
                                   dict(threshold=0.1, sub_block_size=4, repetition_penalty=1.3),
                                   dict(threshold=0.5, block_size=8, sub_block_size=2)])
def test_greedy_exact_diffusion_is_greedy_ar(causal, knobs):
    """Many prompts of a random model, low thresholds (drafts common, most of them wrong), the penalty too."""
    truncations, truncate = [], causal.engine.truncate
    causal.engine.truncate = lambda n: (truncations.append(n), truncate(n))  # a rejection at a block's commit
    try:
        drafted = 0
        for prompt in _prompts(24, seed=len(knobs)):
            ar = causal.complete(prompt, max_new_tokens=40, repetition_penalty=knobs.get("repetition_penalty", 1.0))
            done = list(causal.generate(prompt, mode="diffusion", max_new_tokens=40, **knobs))[-1]
            assert done.ids == ar, (prompt, knobs)
            assert done.stats["tokens_per_step"] == len(ar) / done.stats["steps"]  # the tokens that stand
            assert 0 <= done.stats["kept"] <= done.stats["drafted"]
            drafted += done.stats["drafted"]
    finally:
        del causal.engine.truncate
    assert drafted > 0 or knobs == {}
    if knobs.get("threshold", 1) <= 0.1:
        assert truncations, "no draft was rejected at a block's commit: that path went untested"


def test_the_default_fill_rule_follows_the_attention(causal, tmp_path):
    assert causal.decode_params(mode="diffusion").fill_rule == "exact"
    assert causal.decode_params(mode="diffusion", attention="block").fill_rule == "threshold"
    block = _model(tmp_path / "block", seed=32, attention="block")
    assert block.decode_params(mode="diffusion").fill_rule == "threshold"
    with pytest.raises(ValueError, match="exact rule needs causal attention"):
        block.generate(block.encode("hi"), mode="diffusion", fill_rule="exact")
    assert problem("fill_rule", "exact", {"attention": "block"}) == EXACT_NEEDS_CAUSAL  # the page's reason
    assert problem("fill_rule", "exact", {"attention": "causal"}) is None
    # a block-attention checkpoint that also decodes autoregressively runs exact under causal attention
    prompt = block.encode("the quick brown fox")
    assert block.complete(prompt, mode="diffusion", attention="causal", threshold=0.2, max_new_tokens=30) == \
        block.complete(prompt, max_new_tokens=30)


def test_steps_say_which_slots_are_final(causal):
    """Under the exact rule a Step tells the final slots from the drafts still to be checked; a draft that does
    not stand is masked again by a later step."""
    from bitnet_app.decode.events import Step

    steps = [e for e in causal.generate(causal.encode("hello there"), mode="diffusion", threshold=0.05,
                                        max_new_tokens=40) if isinstance(e, Step)]
    assert all(s.settled is not None and s.mask_id not in s.block[:s.settled] for s in steps)
    remasked = any(a.block_start == b.block_start and any(x != a.mask_id and y == a.mask_id
                                                          for x, y in zip(a.block, b.block))
                   for a, b in zip(steps, steps[1:]))
    assert remasked
    threshold = [e for e in causal.generate(causal.encode("hello there"), mode="diffusion", fill_rule="threshold",
                                            max_new_tokens=10) if isinstance(e, Step)]
    assert threshold and all(s.settled is None for s in threshold)


def test_threshold_rule_stats_keep_every_draft(causal):
    done = list(causal.generate(causal.encode("hello there"), mode="diffusion", fill_rule="threshold",
                                threshold=0.05, max_new_tokens=30))[-1]
    assert done.stats["drafted"] == done.stats["kept"] > 0 and done.stats["kept_share"] == 1.0


def test_the_cli_has_the_fill_rule_and_refuses_exact_with_block_attention(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bitnet_app", "generate", "--model", str(tmp_path / "none.bitnet"),
                        "--prompt", "hi", "--attention", "block", "--fill-rule", "exact"], capture_output=True,
                       text=True, cwd=REPO, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 2 and r.stderr.startswith("error: the exact rule needs causal attention")


def test_demo_model_greedy_exact_diffusion_is_greedy_ar_on_every_shipped_prompt(tmp_path):
    """All of assets/demo-prompts.json (the skill prompts and the open ones), app settings, greedy."""
    convert_checkpoint(os.path.join(ASSETS, "demo-model"), str(tmp_path / "demo.bitnet"))
    demo = Model.open(str(tmp_path / "demo.bitnet"), threads=2)
    with open(os.path.join(ASSETS, "demo-prompts.json"), encoding="utf-8") as f:
        shipped = json.load(f)
    prompts = shipped["skills"] + shipped["open"]
    assert len(shipped["skills"]) >= 42 and len(shipped["open"]) >= 8  # 6 held-out prompts of each of 7 families
    drafted = 0
    for text in prompts:
        ids = demo.chat_ids([{"role": "user", "content": text}])
        done = list(demo.generate(ids, mode="diffusion", max_new_tokens=128))[-1]
        assert done.ids == demo.complete(ids, max_new_tokens=128), text
        drafted += done.stats["drafted"]
    assert drafted > 0


# ---- sampled: AR's distribution -----------------------------------------------------------------------
DRAWS = 20_000
SAMPLED = dict(max_new_tokens=3, temperature=0.3, top_k=3, sub_block_size=8, threshold=0.4)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A one-layer random model whose token embeddings share a common part (0.1 of each token's own), so a row
    that sees a mask predicts much like one that sees the token: drafts are often kept (about a quarter), and the
    acceptance test, not only the residual draw, decides. Block 8 = one sub-block: the first three tokens are the
    floor and drafts of one step."""
    folder = tmp_path_factory.mktemp("small") / "ck"
    make_hf_checkpoint(folder, mask_token=True, seed=1, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=1, max_position_embeddings=64,
                       dlm_config={"mask_token_id": None, "bd_size": 8, "attention": "causal"})
    common = torch.from_numpy(np.random.default_rng(1).standard_normal(32).astype(np.float32)) * 0.5
    rewrite_tensor(str(folder), "model.embed_tokens.weight",
                   (common + 0.1 * _read_embedding(folder)).to(torch.bfloat16))
    convert_checkpoint(str(folder), str(folder / "m.bitnet"))
    model = Model.open(str(folder / "m.bitnet"), lm_head="exact", threads=1)
    return model, [model.bos_id, 5, 9]


def _read_embedding(folder) -> torch.Tensor:
    from safetensors.torch import load_file
    return load_file(os.path.join(folder, "model.safetensors"))["model.embed_tokens.weight"].float()


def _first_tokens(model, prompt, first_seed, **knobs) -> tuple[collections.Counter, float]:
    """The first three tokens of DRAWS replies, seeds first_seed.. (disjoint per mode: independent samples)."""
    table, drafted, kept = collections.Counter(), 0, 0
    for seed in range(first_seed, first_seed + DRAWS):
        done = list(model.generate(prompt, seed=seed, **SAMPLED, **knobs))[-1]
        table[tuple(done.ids)] += 1
        drafted, kept = drafted + done.stats.get("drafted", 0), kept + done.stats.get("kept", 0)
    return table, kept / drafted if drafted else 0.0


def chi_square_homogeneity(a: collections.Counter, b: collections.Counter) -> float:
    """The p-value of a chi-square homogeneity test of two samples (cells expected below 5 merged into one):
    Q(df / 2, statistic / 2), the regularized upper incomplete gamma function."""
    na, nb = sum(a.values()), sum(b.values())
    rows, rare = [], np.zeros(2)
    for key in sorted(set(a) | set(b)):
        pair = np.array([a.get(key, 0), b.get(key, 0)], dtype=np.float64)
        if pair.sum() * min(na, nb) / (na + nb) < 5:
            rare += pair
        else:
            rows.append(pair)
    if rare.sum():
        rows.append(rare)
    observed = np.array(rows)
    expected = observed.sum(1, keepdims=True) * observed.sum(0, keepdims=True) / observed.sum()
    statistic = float(((observed - expected) ** 2 / expected).sum())
    df = len(rows) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def test_the_chi_square_p_value_is_right():
    # statistic 3.84 at 1 degree of freedom is the 5% point; 2 x 2 table [[60, 40], [40, 60]]: statistic 8.0
    a, b = collections.Counter({"x": 60, "y": 40}), collections.Counter({"x": 40, "y": 60})
    assert chi_square_homogeneity(a, b) == pytest.approx(0.004678, rel=1e-3)
    assert chi_square_homogeneity(a, a) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def ar_table(small):
    model, prompt = small
    return _first_tokens(model, prompt, 0, mode="ar")[0]


@pytest.mark.parametrize("rule, same", [("exact", True), ("threshold", False)])
def test_sampled_diffusion_has_ar_distribution_only_under_the_exact_rule(small, ar_table, rule, same):
    model, prompt = small
    table, kept_share = _first_tokens(model, prompt, 10**6, mode="diffusion", fill_rule=rule)
    p = chi_square_homogeneity(ar_table, table)
    assert (p > 0.01) == same, (rule, p)
    if rule == "exact":
        assert 0.1 < kept_share < 0.9  # both ways of the acceptance test were taken, many times


def test_the_speculative_pieces():
    p = np.array([0.5, 0.3, 0.2])
    q = draft_distribution(np.array([0.6, 0.35, 0.05]), threshold=0.3)
    assert q == pytest.approx([0.6 / 0.95, 0.35 / 0.95, 0.0])  # only ids above the threshold are ever drafted
    assert accepts(p, q, 2, 0.99) and not accepts(p, q, 0, 0.99)  # p(x) >= q(x) always stands
    r = residual(p, q)
    assert r == pytest.approx(np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()) and r[0] == 0
    assert [draw(np.array([0.2, 0.0, 0.8]), u) for u in (0.0, 0.19, 0.21, 0.99)] == [0, 0, 2, 2]


def test_a_decode_params_must_be_resolved_before_a_decoder_runs(causal):
    from bitnet_app.decode.diffusion import generate_diffusion

    with pytest.raises(ValueError, match="block diffusion needs block_size"):
        list(generate_diffusion(causal.engine, [1, 2, 3], DecodeParams(mode="diffusion", mask_id=3)))
