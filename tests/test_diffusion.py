"""Block diffusion: the engine decoder against an independent slow reference, and its invariants."""
import numpy as np
import pytest

from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.decode.ar import generate_ar
from bitnet_app.decode.diffusion import generate_diffusion
from bitnet_app.decode.events import Done, Step, Token
from bitnet_app.engine.runtime import Engine
from bitnet_app.engine.file import EngineFile
from bitnet_app.decode.sampling import Sampler
from bitnet_app.params import DecodeParams
from checkpoints import make_hf_checkpoint
from diffusion_reference import reference_diffusion
from bitnet_app.engine.reference import NumpyModel

B, S = 16, 4


@pytest.fixture(scope="module")
def dlm(tmp_path_factory):
    d = tmp_path_factory.mktemp("dlm")
    truth = make_hf_checkpoint(d / "ck", mask_token=True, dlm_config={"mask_token_id": None, "bd_size": B}, seed=5)
    convert_checkpoint(str(d / "ck"), str(d / "m.bitnet"))
    ef = EngineFile(str(d / "m.bitnet"))
    return ef, NumpyModel(ef), Engine(ef, lm_head="exact", threads=2), truth["mask"]


def diffusion_params(mask, **kw) -> DecodeParams:
    """The knobs of a direct decoder call, as Model.generate hands them over (resolved)."""
    return DecodeParams(mode="diffusion", mask_id=mask, **{"fill_rule": "threshold", **kw})


def run_engine(eng, prompt, mask, sampler=None, stop_ids=(), **kw):
    sampler = sampler or Sampler(banned_ids=[mask])
    events = list(generate_diffusion(eng, prompt, diffusion_params(mask, **kw), sampler=sampler, stop_ids=stop_ids))
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1
    return events


def fills_of(events):
    return [list(e.filled) for e in events if isinstance(e, Step)]


def prompt_of(n, seed=0):
    return [int(i) for i in np.random.default_rng(seed).integers(0, 200, n)]


@pytest.mark.parametrize("attention", ["block", "causal"])
@pytest.mark.parametrize("threshold", [0.05, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("prompt_len", [5, B, B + 5])  # shorter than, equal to, longer than a block
def test_engine_decoder_equals_slow_reference(dlm, attention, threshold, prompt_len):
    ef, ref, eng, mask = dlm
    prompt = prompt_of(prompt_len, seed=prompt_len)
    kw = dict(max_new_tokens=40, block_size=B, sub_block_size=S, threshold=threshold, attention=attention)
    events = run_engine(eng, prompt, mask, **kw)
    ids, fills, reason = reference_diffusion(ref, prompt, sampler=Sampler(banned_ids=[mask]), stop_ids=[],
                                             mask_id=mask, **kw)
    assert events[-1].ids == ids
    assert fills_of(events) == fills
    assert [e.id for e in events if isinstance(e, Token)] == ids  # text streams in order, once per id
    assert events[-1].stop_reason == "length" == reason


@pytest.mark.parametrize("attention", ["block", "causal"])
def test_sampled_decoding_equals_reference(dlm, attention):
    ef, ref, eng, mask = dlm
    prompt = prompt_of(9, seed=3)
    kw = dict(max_new_tokens=30, block_size=B, sub_block_size=S, threshold=0.2, attention=attention)
    mk = lambda: Sampler(temperature=0.8, top_p=0.9, seed=11, banned_ids=[mask])  # noqa: E731
    events = run_engine(eng, prompt, mask, sampler=mk(), **kw)
    ids, fills, _ = reference_diffusion(ref, prompt, sampler=mk(), stop_ids=[], mask_id=mask, **kw)
    assert events[-1].ids == ids and fills_of(events) == fills


@pytest.mark.parametrize("attention", ["block", "causal"])
def test_a_budget_ending_inside_a_block_cuts_a_longer_reply(dlm, attention):
    """Every block has B whole slots: under block attention every slot sees the whole block, so a block cut
    to the budget would change its logits. A reply whose budget ends mid-block is the start of a longer one,
    with the same steps so far."""
    ef, ref, eng, mask = dlm
    prompt = prompt_of(5, seed=14)  # the first block holds 11 reply slots, the next ones 16
    kw = dict(block_size=B, sub_block_size=S, threshold=0.3, attention=attention)
    long = run_engine(eng, prompt, mask, max_new_tokens=43, **kw)
    assert all(len(e.block) == B for e in long if isinstance(e, Step))
    for budget in (1, 3, 9, 14, 20, 30):  # each ends inside a block, or in its first sub-block
        short = run_engine(eng, prompt, mask, max_new_tokens=budget, **kw)
        assert short[-1].ids == long[-1].ids[:budget] and short[-1].stop_reason == "length"
        steps = [e for e in short if isinstance(e, Step)]
        assert all(len(e.block) == B for e in steps)
        assert fills_of(short) == fills_of(long)[:len(steps)]


@pytest.mark.parametrize("attention", ["block", "causal"])
def test_only_the_context_end_cuts_a_block(dlm, attention):
    ef, ref, eng, mask = dlm
    ctx = 2 * B + 6
    short_ctx = Engine(ef, lm_head="exact", threads=2, ctx=ctx)
    prompt = prompt_of(5, seed=15)
    kw = dict(max_new_tokens=100, block_size=B, sub_block_size=S, threshold=0.3, attention=attention)
    events = run_engine(short_ctx, prompt, mask, **kw)
    ids, fills, reason = reference_diffusion(ref, prompt, sampler=Sampler(banned_ids=[mask]), stop_ids=[],
                                             mask_id=mask, ctx=ctx, **kw)
    assert (events[-1].ids, fills_of(events), events[-1].stop_reason) == (ids, fills, reason)
    assert len(ids) == ctx - len(prompt) and reason == "context"
    assert {len(e.block) for e in events if isinstance(e, Step)} == {B, 6}


def test_stop_token_inside_a_block_ends_the_reply(dlm):
    ef, ref, eng, mask = dlm
    prompt = prompt_of(7, seed=4)
    kw = dict(max_new_tokens=40, block_size=B, sub_block_size=S, threshold=0.05, attention="block")
    free = run_engine(eng, prompt, mask, **kw)[-1].ids
    stop = free[11]                                   # a token in the middle of the first generated block
    first = free.index(stop)
    events = run_engine(eng, prompt, mask, stop_ids=[stop], **kw)
    assert events[-1].ids == free[:first] and events[-1].stop_reason == "stop"
    ids, fills, reason = reference_diffusion(ref, prompt, sampler=Sampler(banned_ids=[mask]), stop_ids=[stop],
                                             mask_id=mask, **kw)
    assert (events[-1].ids, fills_of(events), reason) == (ids, fills, "stop")


def test_threshold_one_fills_exactly_one_slot_per_forward(dlm):
    ef, ref, eng, mask = dlm
    for attention in ("block", "causal"):
        events = run_engine(eng, prompt_of(6), mask, max_new_tokens=33, block_size=B, sub_block_size=S,
                            threshold=1.0, attention=attention)
        assert all(len(e.filled) == 1 for e in events if isinstance(e, Step))


def test_causal_leftmost_floor_equals_greedy_ar(dlm):
    """With causal attention and nothing above the threshold, diffusion is exactly greedy AR."""
    ef, ref, eng, mask = dlm
    prompt = prompt_of(10, seed=8)
    events = run_engine(eng, prompt, mask, max_new_tokens=37, block_size=B, sub_block_size=S, threshold=1.0,
                        attention="causal")
    ar = list(generate_ar(eng, prompt, DecodeParams(max_new_tokens=37), sampler=Sampler(banned_ids=[mask])))
    assert events[-1].ids == ar[-1].ids
    assert all(e.filled[0] == min(j for j, t in enumerate(e.block) if t == mask or j in e.filled)
               for e in events if isinstance(e, Step))


def test_causal_steps_run_only_the_rows_they_need(dlm):
    """Causal attention: a step re-runs only the slots from the first stale one (at most the previous sub-block's)
    to the last masked one, and a commit keeps the scratch K/V of the slots already final (the equality with the
    slow reference and with a fresh prefill is checked above)."""
    ef, ref, eng, mask = dlm
    calls, forward = [], eng.forward

    def recording(tokens, **kw):
        calls.append((len(tokens), kw["commit"]))
        return forward(tokens, **kw)

    eng.forward = recording
    try:
        events = run_engine(eng, prompt_of(3, seed=4), mask, max_new_tokens=3 * B, block_size=B, sub_block_size=S,
                            threshold=0.3, attention="causal")
    finally:
        del eng.forward
    steps = [n for n, commit in calls if not commit]
    commits = [n for n, commit in calls if commit]  # block commits only: the prompt (3 < B) has no whole block
    assert len(events[-1].ids) == 3 * B and len(steps) == sum(isinstance(e, Step) for e in events)
    assert max(steps) <= 2 * S - 1 and max(commits) <= S, (steps, commits)
    assert len(commits) >= 2


def test_dual_cache_changes_nothing_for_causal_attention(dlm):
    """Causal steps always re-run only the sub-block (exact), so the knob cannot change them."""
    ef, ref, eng, mask = dlm
    prompt = prompt_of(12, seed=9)
    kw = dict(max_new_tokens=40, block_size=B, sub_block_size=S, threshold=0.2, attention="causal")
    ids, fills, _ = reference_diffusion(ref, prompt, sampler=Sampler(banned_ids=[mask]), stop_ids=[], mask_id=mask, **kw)
    for dual in (False, True):
        events = run_engine(eng, prompt, mask, dual_cache=dual, **kw)
        assert events[-1].ids == ids and fills_of(events) == fills


def test_dual_cache_block_attention_runs_and_fills_every_slot(dlm):
    """For block attention DualCache is an approximation (later slots keep K/V from the sub-block's
    first step): it must still produce a full, mask-free reply."""
    ef, ref, eng, mask = dlm
    events = run_engine(eng, prompt_of(12, seed=9), mask, max_new_tokens=40, block_size=B, sub_block_size=S,
                        threshold=0.2, attention="block", dual_cache=True)
    assert len(events[-1].ids) == 40 and mask not in events[-1].ids


@pytest.mark.parametrize("attention", ["block", "causal"])
def test_cache_after_a_finished_block_equals_fresh_prefill(dlm, attention):
    """No K/V computed from MASK inputs stays in the cache once a block is committed."""
    ef, ref, eng, mask = dlm
    prompt = prompt_of(B, seed=12)
    kv_ids = []
    gen = generate_diffusion(eng, prompt, diffusion_params(mask, max_new_tokens=3 * B, block_size=B, sub_block_size=S,
                                                           threshold=0.3, attention=attention),
                             sampler=Sampler(banned_ids=[mask]), kv_ids=kv_ids)
    for ev in gen:
        if isinstance(ev, Step) and ev.block_start == 2 * B:  # prompt block and first reply block committed
            break
    assert eng.n_past == 2 * B and len(kv_ids) == 2 * B
    probe = prompt_of(B, seed=13)
    kw = dict(start=2 * B, commit=False, attention=attention, block_size=B, rows=range(B))
    cached = eng.forward(probe, **kw)
    committed = list(kv_ids)
    gen.close()
    assert kv_ids == [] and eng.n_past == 0  # closing resets: the next turn never reuses diffusion K/V
    fresh = Engine(ef, lm_head="exact", threads=2)
    fresh.forward(committed, attention=attention, block_size=B)
    np.testing.assert_allclose(fresh.forward(probe, **kw), cached, rtol=0, atol=1e-5 * np.abs(cached).max())


def test_bad_knobs_give_clear_errors(dlm):
    ef, ref, eng, mask = dlm
    base = dict(max_new_tokens=4, block_size=B, sub_block_size=S, threshold=0.9, attention="block")
    cases = [(dict(sub_block_size=5), "must divide"), (dict(threshold=0.0), r"\(0, 1\]"),
             (dict(threshold=1.5), r"\(0, 1\]"), (dict(attention="full"), "'block', 'causal'"),
             (dict(block_size=0), ">= 1")]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            run_engine(eng, prompt_of(4), mask, **{**base, **change})
    for bad_mask in (-1, ef.config["vocab_size"], None):
        with pytest.raises(ValueError, match="mask_id"):
            list(generate_diffusion(eng, prompt_of(4), diffusion_params(bad_mask, **base), sampler=Sampler()))


def test_mask_is_never_predicted_and_stats_are_complete(dlm):
    ef, ref, eng, mask = dlm
    events = run_engine(eng, prompt_of(3), mask, max_new_tokens=20, block_size=B, sub_block_size=S, threshold=0.5,
                        attention="block")
    done = events[-1]
    assert mask not in done.ids
    for key in ("tokens", "forwards", "tokens_per_forward", "tok_s", "ttft_s", "steps"):
        assert key in done.stats
    st = done.stats  # where the time went: steps (their forwards inside), other forwards, the rest
    assert 0 < st["step_engine_s"] < st["step_s"] < st["total_s"] and st["step_engine_s"] < st["engine_s"]
    assert st["engine_s"] - st["step_engine_s"] + st["step_s"] <= st["total_s"]
    assert done.stats["tokens"] == 20 and done.stats["forwards"] == sum(isinstance(e, Step) for e in events) + \
        (done.stats["forwards"] - done.stats["steps"])


def test_model_without_a_mask_token_still_runs_diffusion(tmp_path):
    """No mask token: the model says it was not trained for diffusion, picks a spare id as the mask,
    defaults to causal attention, and the leftmost floor makes threshold 1.0 equal greedy AR."""
    from bitnet_app.model import Model

    make_hf_checkpoint(tmp_path / "ck", seed=21)
    convert_checkpoint(str(tmp_path / "ck"), str(tmp_path / "m.bitnet"))
    model = Model.open(str(tmp_path / "m.bitnet"), lm_head="exact", threads=2)
    assert model.trained_for_diffusion is False and model.mask_id is None
    knobs = model.diffusion_defaults
    assert knobs["attention"] == "causal" and knobs["mask_id"] is not None
    ids = model.encode("the quick brown fox")
    ar = model.complete(ids, max_new_tokens=20)
    diff = model.complete(ids, mode="diffusion", max_new_tokens=20, threshold=1.0, dual_cache=True)
    assert diff == ar


def test_step_replay_times_each_part_and_replays_the_same_decisions(dlm, tmp_path, capsys):
    """benchmarks/step_replay.py end to end on a small model: both decoders recorded, every forward timed alone, the
    decoders replayed on the recorded logits (it raises if a replay asks other forwards), the ratio printed."""
    from benchmarks import step_replay

    prompts = tmp_path / "prompts.json"
    prompts.write_text('{"skills": ["Count from 1 to 9", "Spell cat"], "open": ["ROMEO."]}')
    step_replay.main(["--model", dlm[0].path, "--prompts-file", str(prompts), "--max-new-tokens", "20",
                      "--repeats", "2", "--threshold", "0.2"])
    printed = capsys.readouterr().out
    assert "2 skills prompts" in printed and "threshold 0.2" in printed
    ar, diffusion = (line.split() for line in printed.splitlines() if " forwards: engine " in line)
    assert ar[0] == "ar" and diffusion[0] == "diffusion"
    ar, diffusion = " ".join(ar), " ".join(diffusion)
    assert " us per token" in ar and "tokens per step" in diffusion and "diffusion / AR speed: " in printed


def test_benchmark_reports_both_prompt_sets(dlm, tmp_path, capsys):
    """benchmarks/diffusion_vs_ar.py end to end on a small model: prompts rendered with the chat template,
    skills and open reported separately, the step cost beside tokens per step."""
    from benchmarks import diffusion_vs_ar

    ef, ref, eng, mask = dlm
    prompts = tmp_path / "prompts.json"
    prompts.write_text('{"skills": ["Count from 1 to 9", "Spell cat"], "open": ["ROMEO."]}')
    out = tmp_path / "out.json"
    diffusion_vs_ar.main(["--model", ef.path, "--prompts-file", str(prompts), "--max-new-tokens", "20",
                          "--repeats", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "skills: 2 prompts" in printed and "open: 1 prompts" in printed and "step / AR token" in printed
    import json
    res = json.loads(out.read_text())["results"]
    for name in ("skills", "open"):
        default, dual = res[name]["rows"]
        assert "app default" in default["setting"] and "DualCache" in dual["setting"]
        assert default["tokens_per_step"] >= 1.0 and 0 <= dual["same_as_exact"] <= 1
        assert default["step_ms"] > default["step_forward_ms"] > 0 and default["ar_token_ms"] > 0
    steps = json.loads(out.read_text())["single_steps"]
    assert {"ar", "block", "sub_block"} <= set(steps) and steps["block"]["with_sampling_ms"] > steps["block"]["forward_ms"] > 0


def test_row_cost_reports_costs_rows_per_token_and_the_bound(dlm, tmp_path, capsys, monkeypatch):
    """benchmarks/row_cost.py end to end: R-row forwards timed for the model and a random demo-like shape (written
    with that shape), the rows a reply's tokens take counted from the real decoder's calls, and the bound worked
    out from both."""
    import json

    from benchmarks import row_cost
    from bitnet_app.engine import EngineFile

    monkeypatch.setattr(row_cost.tempfile, "gettempdir", lambda: str(tmp_path))
    prompts = tmp_path / "prompts.json"
    prompts.write_text('{"skills": ["Count from 1 to 9", "Spell cat"], "open": ["ROMEO."]}')
    out = tmp_path / "out.json"
    row_cost.main(["--model", dlm[0].path, "--shapes", "d128", "--rows", "4,9", "--rounds", "1", "--iters", "2",
                   "--prompts-file", str(prompts), "--json", str(out)])
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert set(res["costs"]) == {dlm[0].path, "d128"}
    for table in res["costs"].values():
        assert set(table) == {"1", "4", "9"} and table["1"]["marginal"] is None
        for R in (4, 9):
            t = table[str(R)]
            assert t["ms"] > 0 and abs(t["marginal"] - (t["over_one_row"] - 1) / (R - 1)) < 1e-9
    written = list((tmp_path / "bitnet-row-cost").glob("row-cost-d128-*.bitnet"))
    assert len(written) == 1
    cfg = EngineFile(str(written[0])).config
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == \
        (128, 384, 6, 4096)
    rows = res["rows"]
    assert rows["steps"] > 0 and rows["tokens"] > 0
    assert rows["rows_per_token"] >= 1  # every token of a reply is filled from a row of some step
    k, r = rows["tokens_per_step"], rows["rows_per_step"]
    c, rc = rows["commits"] / rows["steps"], rows["rows_per_commit"]
    for name, b in res["bound"].items():
        m = b["cheapest_marginal_row"]
        assert abs(b["at_most_x_ar"] - k / (1 + (r - 1) * m + c * (1 + (rc - 1) * m))) < 1e-9
        assert f"{name}: cheapest marginal row" in printed
    assert "rows per token" in printed
