"""DecodeParams: one set of decode knobs, checked strictly, the same for the API, the CLI and the page."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bitnet_app.params import KNOBS, DecodeParams

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BAD = [  # (knob, value, words the message must hold)
    ("max_new_tokens", -5, "integer >= 1"), ("max_new_tokens", 0, "integer >= 1"),
    ("max_new_tokens", 2.5, "whole number"), ("max_new_tokens", True, "integer >= 1"),
    ("max_new_tokens", "12", "integer >= 1"), ("max_new_tokens", math.inf, "integer >= 1"),
    ("temperature", -0.1, "0 or a number in [0.01, 100]"), ("temperature", math.nan, "0 or a number in [0.01, 100]"),
    ("temperature", math.inf, "0 or a number in [0.01, 100]"), ("temperature", False, "0 or a number in [0.01, 100]"),
    ("temperature", 1e-300, "0 or a number in [0.01, 100]"), ("temperature", 1e300, "0 or a number in [0.01, 100]"),
    ("top_k", -1, "integer >= 0"), ("top_k", 2.5, "whole number"),
    ("top_p", 0.0, "(0, 1]"), ("top_p", 1.5, "(0, 1]"), ("top_p", math.nan, "(0, 1]"),
    ("repetition_penalty", 0.0, "number in [0.01, 100]"), ("repetition_penalty", -1.0, "number in [0.01, 100]"),
    ("repetition_penalty", math.inf, "number in [0.01, 100]"), ("repetition_penalty", 1e-44, "number in [0.01, 100]"),
    ("seed", -1, "integer >= 0"), ("seed", 1.5, "whole number"), ("seed", True, "integer >= 0"),
    ("block_size", 0, "integer >= 1"), ("block_size", 8.5, "whole number"),
    ("sub_block_size", 0, "integer >= 1"), ("threshold", 0.0, "(0, 1]"), ("threshold", 1.01, "(0, 1]"),
    ("threshold", math.nan, "(0, 1]"), ("attention", "full", "'block', 'causal'"),
    ("mode", "beam", "'ar', 'diffusion'"), ("mask_id", -1, "integer >= 0"), ("mask_id", 3.5, "whole number"),
    ("dual_cache", 1, "True or False"), ("dual_cache", "yes", "True or False"),
]


@pytest.mark.parametrize("name, value, words", BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_bad_values_are_refused_with_what_is_allowed(name, value, words):
    with pytest.raises(ValueError) as err:
        DecodeParams(**{name: value})
    assert str(err.value).startswith(name) and words in str(err.value), str(err.value)


def test_good_values_are_kept_and_normalized():
    p = DecodeParams(max_new_tokens=np.int64(12), temperature=1, top_k=5.0, top_p=np.float32(0.5), seed=3,
                     block_size=16, sub_block_size=4, threshold=1.0, attention="block", dual_cache=np.bool_(True))
    assert (p.max_new_tokens, p.top_k, p.seed) == (12, 5, 3) and type(p.max_new_tokens) is int
    assert type(p.temperature) is float and p.top_p == 0.5 and p.dual_cache is True
    with pytest.raises(ValueError, match="must divide block_size"):
        DecodeParams(block_size=32, sub_block_size=12)


def test_one_default_per_knob_and_unknown_names():
    p = DecodeParams()
    assert {f: getattr(p, f) for f in KNOBS} == {f: KNOBS[f].default for f in KNOBS}
    assert p.threshold is None and p.attention is None and p.block_size is None  # None: the checkpoint's / rule's
    assert DecodeParams.from_kwargs(threshold=None, seed=None) == p  # None means "the default"
    with pytest.raises(TypeError, match="unknown decode parameter.*temprature"):
        DecodeParams.from_kwargs(temprature=0.5)
    assert set(DecodeParams(mode="ar").kwargs()) == {"mode", "max_new_tokens", "temperature", "top_k", "top_p",
                                                     "repetition_penalty"}  # no diffusion knobs, no None
    assert "threshold" in DecodeParams(mode="diffusion", threshold=0.8).kwargs()


def test_each_fill_rule_starts_from_its_own_threshold():
    """The exact rule drafts below the threshold rule's keep (its threshold changes the speed, never the reply);
    the threshold rule keeps the checkpoint's suggestion, else Fast-dLLM v2's 0.9; a given value always stands."""
    from bitnet_app.params import EXACT_DRAFT_THRESHOLD, PLAIN_THRESHOLD

    def resolved(suggested=None, **kw):
        ckpt = {"block_size": 32, "attention": "causal", "mask_id": 3, "threshold": suggested}
        return DecodeParams(mode="diffusion", **kw).resolve(ckpt, vocab_size=10).threshold

    assert EXACT_DRAFT_THRESHOLD < PLAIN_THRESHOLD
    assert resolved() == resolved(0.95) == EXACT_DRAFT_THRESHOLD  # causal -> exact
    assert resolved(fill_rule="threshold") == PLAIN_THRESHOLD
    assert resolved(0.95, fill_rule="threshold") == 0.95
    assert resolved(0.95, fill_rule="exact", threshold=0.6) == resolved(threshold=0.6) == 0.6
    assert DecodeParams(mode="ar").resolve({"mask_id": 3}, vocab_size=10).threshold is None


def test_model_generate_checks_before_it_runs(tmp_path, monkeypatch):
    import bitnet_app
    from checkpoints import make_hf_checkpoint

    make_hf_checkpoint(str(tmp_path / "ck"), seed=8)
    monkeypatch.setenv("BITNET_APP_CACHE", str(tmp_path / "cache"))
    model = bitnet_app.load_model(str(tmp_path / "ck"), threads=1)
    ids = model.encode("hello")
    for bad in (dict(max_new_tokens=-5), dict(temperature=math.nan), dict(top_k=2.5), dict(top_p=0),
                dict(mode="diffusion", threshold=2.0), dict(repetition_penalty=math.inf)):
        with pytest.raises(ValueError):
            model.generate(ids, **bad)  # at the call, before any event
    with pytest.raises(ValueError, match="mask_id 999999 is out of range"):
        model.generate(ids, mode="diffusion", mask_id=999999)
    assert len(model.complete(ids, max_new_tokens=3.0)) <= 3  # an integral float is a whole number


@pytest.mark.parametrize("flags, words", [
    (["--max-new-tokens", "-5"], "--max-new-tokens must be an integer >= 1, not -5"),  # flags, not field names
    (["--top-k", "2.5"], "--top-k must be a whole number"),
    (["--temperature", "nan"], "--temperature must be 0 or a number in [0.01, 100] (the range that keeps the "
                               "arithmetic finite), not nan"),
    (["--top-p", "0"], "--top-p must be a number in (0, 1]"),
    (["--seed", "-1"], "--seed must be an integer >= 0, not -1"),  # no "or None": leaving the flag out does that
])
def test_the_cli_refuses_bad_values_in_one_line(flags, words, tmp_path):
    r = subprocess.run([sys.executable, "-m", "bitnet_app", "generate", "--model", str(tmp_path / "none.bitnet"),
                        "--prompt", "hi", *flags], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: ") and words in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_model_takes_one_decode_params_or_keywords(tmp_path, monkeypatch):
    """Model.generate/complete take a DecodeParams whole (the page's and the CLI's) or its fields as keywords (the
    API's); both give the same reply, the checkpoint's values are filled in once (decode_params), and a wrong name
    is a TypeError that names it and lists the known ones."""
    import bitnet_app
    from checkpoints import make_hf_checkpoint

    make_hf_checkpoint(str(tmp_path / "ck"), seed=8, mask_token=True)
    monkeypatch.setenv("BITNET_APP_CACHE", str(tmp_path / "cache"))
    model = bitnet_app.load_model(str(tmp_path / "ck"), threads=1)
    ids = model.encode("hello")
    for mode in ("ar", "diffusion"):
        keywords = dict(mode=mode, max_new_tokens=6, temperature=0.8, seed=5)
        given = DecodeParams(**keywords)
        resolved = model.decode_params(given)
        assert resolved == model.decode_params(**keywords)
        assert model.complete(ids, given) == model.complete(ids, resolved) == model.complete(ids, **keywords)
        assert resolved.resolve({}, vocab_size=model.vocab_size) == resolved  # resolving twice changes nothing
    d = model.decode_params(mode="diffusion")
    assert (d.block_size, d.attention, d.mask_id) == (model.diffusion_defaults["block_size"],
                                                      model.diffusion_defaults["attention"], model.mask_id)
    assert model.decode_params().mask_id == model.mask_id and model.decode_params().block_size is None
    with pytest.raises(TypeError) as err:
        model.generate(ids, temprature=0.5)
    assert "temprature" in str(err.value) and all(name in str(err.value) for name in KNOBS)
    with pytest.raises(TypeError, match="not both"):
        model.complete(ids, DecodeParams(), seed=1)
    with pytest.raises(TypeError, match="DecodeParams"):
        model.complete(ids, {"seed": 1})
    start = model.suggested_params()  # where the page starts: the checkpoint's sampling and diffusion values
    assert start.block_size == d.block_size and start.temperature == model.generation_defaults["temperature"]
