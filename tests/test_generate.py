"""Generation on a real converted checkpoint (random weights, toy tokenizer): the AR decoder against
the model's own full forward, stop ids, seeds, context limits, cancellation, cache reuse, loading, CLI."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import bitnet_app
from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.decode.ar import generate_ar
from bitnet_app.decode.context import ContextOverflow
from bitnet_app.decode.events import Done, Token
from bitnet_app.model import Model
from bitnet_app.decode.sampling import Sampler
from bitnet_app.params import DecodeParams
from checkpoints import make_hf_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTX = 96


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    folder = str(root / "hf")
    make_hf_checkpoint(folder, seed=3, max_position_embeddings=CTX)
    path = convert_checkpoint(folder, str(root / "model.bitnet"))
    return {"root": root, "folder": folder, "file": path}


@pytest.fixture(scope="module")
def model(ckpt):
    return Model.open(ckpt["file"], threads=1)


def prompt(model, text="Hello! How are you today?"):
    return model.chat_ids([{"role": "user", "content": text}])


def argmax_chain(model, ids, n):
    """Greedy continuation from fresh full forwards (Model.logits), stopping like the decoder."""
    seq, out = list(ids), []
    for _ in range(n):
        t = int(np.argmax(model.logits(seq)[-1]))
        if t in model.stop_ids:
            break
        out.append(t)
        seq.append(t)
    return out


def test_greedy_equals_the_argmax_chain_of_logits(model):
    ids = prompt(model)
    out = model.complete(ids, max_new_tokens=24)
    assert len(out) > 0
    assert out == argmax_chain(model, ids, 24)


def test_events_stream_the_text_and_carry_stats(model):
    events = list(model.generate(prompt(model), max_new_tokens=10))
    tokens, done = events[:-1], events[-1]
    assert all(isinstance(e, Token) for e in tokens) and isinstance(done, Done)
    assert [e.id for e in tokens] == done.ids
    assert done.text.startswith("".join(e.text for e in tokens))
    assert done.text == model.tokenizer.decode(done.ids, skip_special_tokens=True)
    s = done.stats
    for key in ("tokens", "forwards", "tokens_per_forward", "tok_s", "ttft_s", "prefill_s", "prompt_tokens",
                "decode_tok_s"):
        assert key in s
    assert s["tokens"] == len(done.ids)
    if done.stop_reason == "length":
        assert s["tokens"] == 10 and s["forwards"] == 10 and s["tokens_per_forward"] == 1.0
    assert s["tok_s"] > 0 and 0 < s["ttft_s"] <= s["total_s"] and s["prompt_tokens"] == len(prompt(model))


def test_stop_ids_end_generation_and_are_not_output(model):
    ids = prompt(model)
    free = model.complete(ids, max_new_tokens=12)
    assert len(free) == 12
    stop = free[5]
    first = free.index(stop)
    events = list(generate_ar(model.engine, ids, DecodeParams(max_new_tokens=12), sampler=Sampler(), stop_ids=[stop],
                              detokenizer=model.tokenizer.detokenizer()))
    done = events[-1]
    assert done.stop_reason == "stop"
    assert done.ids == free[:first] and stop not in done.ids
    assert done.stats["forwards"] == first + 1  # the forward that produced the stop id counts


def test_the_checkpoint_stop_ids_are_eos_and_eot(model, ckpt):
    cfg = json.load(open(os.path.join(ckpt["folder"], "generation_config.json")))
    assert sorted(model.stop_ids) == sorted(cfg["eos_token_id"])


def test_same_seed_same_output_different_seed_different_output(model):
    ids = prompt(model)
    kw = dict(max_new_tokens=16, temperature=1.0, top_p=0.95)
    a = model.complete(ids, seed=11, **kw)
    assert a == model.complete(ids, seed=11, **kw)
    others = [model.complete(ids, seed=s, **kw) for s in (12, 13, 14)]
    assert any(o != a for o in others)
    assert a != model.complete(ids, max_new_tokens=16)  # sampled at T=1 is not the greedy chain here


def test_context_overflow_is_a_clear_error(model):
    ctx = model.context_length
    assert ctx == CTX
    too_long = [model.bos_id] * ctx
    with pytest.raises(ContextOverflow, match=rf"{ctx} tokens but the model's context holds {ctx}"):
        model.generate(too_long, max_new_tokens=4)  # raised at the call, before any event
    with pytest.raises(ValueError):
        model.complete([], max_new_tokens=4)
    # one free position: exactly one new token, then the context is full
    done = list(model.generate([model.bos_id] * (ctx - 1), max_new_tokens=4))[-1]
    assert len(done.ids) <= 1 and done.stop_reason in ("context", "stop")
    with pytest.raises(ValueError, match="out of range"):
        model.complete([model.vocab_size], max_new_tokens=1)


def test_closing_a_generator_early_keeps_the_cache_consistent(model):
    ids = prompt(model)
    want = model.complete(ids, max_new_tokens=12)
    gen = model.generate(ids, max_new_tokens=12)
    got = [next(gen).id for _ in range(3)]
    gen.close()
    assert got == want[:3]
    assert model.engine.n_past == len(model._kv_ids)
    assert model.complete(ids, max_new_tokens=12) == want  # reuses what the closed run committed


def test_an_interrupted_generator_stops_instead_of_corrupting_the_cache(model):
    ids = prompt(model)
    want = model.complete(ids, max_new_tokens=10)
    gen = model.generate(ids, max_new_tokens=10)
    next(gen)
    other = model.complete(prompt(model, "The quick brown fox"), max_new_tokens=5)  # takes the engine over
    with pytest.raises(RuntimeError, match="another generation"):
        next(gen)
    gen = model.generate(ids, max_new_tokens=10)
    next(gen)
    model.logits([model.bos_id, 5])
    with pytest.raises(RuntimeError):
        next(gen)
    assert model.complete(ids, max_new_tokens=10) == want
    assert model.complete(prompt(model, "The quick brown fox"), max_new_tokens=5) == other


def test_a_second_chat_turn_reuses_the_cache_and_matches_a_fresh_run(model):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    first = model.complete(model.chat_ids(msgs), max_new_tokens=8)
    msgs += [{"role": "assistant", "content": model.decode(first, skip_special_tokens=True)},
             {"role": "user", "content": "And the river?"}]
    ids2 = model.chat_ids(msgs)
    events = list(model.generate(ids2, max_new_tokens=8))
    assert events[-1].stats["reused_tokens"] > 0
    assert events[-1].ids == argmax_chain(model, ids2, 8)


def test_model_facts(model):
    assert model.vocab_size == model.logits(prompt(model)).shape[1]
    assert model.logits([model.bos_id, 5, 6]).shape == (3, model.vocab_size)
    assert model.logits([model.bos_id]).dtype == np.float32
    assert model.trained_for_diffusion is False and model.mask_id is None
    d = model.diffusion_defaults
    assert d["sub_block_size"] == 8 and d["threshold"] is None and d["block_size"] > 0  # no suggestion: the rule's
    info = model.info()
    assert info["parameters"] > 0 and info["file_bytes"] == os.path.getsize(model.file.path)
    assert info["threads"] == 1 and info["context"] == CTX and info["lm_head"] == "int8"
    with pytest.raises(TypeError, match="unknown decode parameter"):
        model.complete(prompt(model), temprature=0.5)
    assert model.encode("Hello")[0] == model.bos_id and model.decode(model.encode("Hello")).endswith("Hello")


def test_load_model_converts_a_folder_once_into_the_cache(ckpt, monkeypatch, tmp_path):
    monkeypatch.setenv("BITNET_APP_CACHE", str(tmp_path / "cache"))
    m1 = bitnet_app.load_model(ckpt["folder"], threads=1)
    path = m1.file.path
    assert path.startswith(str(tmp_path / "cache")) and os.path.isfile(path)
    stamp = os.stat(path).st_mtime_ns
    m2 = bitnet_app.load_model(ckpt["folder"], threads=1)
    assert m2.file.path == path and os.stat(path).st_mtime_ns == stamp  # reused, not converted again
    ids = prompt(m1)
    assert m2.complete(ids, max_new_tokens=6) == bitnet_app.load_model(ckpt["file"], threads=1).complete(
        ids, max_new_tokens=6)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bitnet_app.load_model(str(tmp_path / "missing.bitnet"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        bitnet_app.load_model(str(tmp_path))


def run_cli(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=REPO, BITNET_THREADS="1", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "bitnet_app", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=240)


def test_cli_convert_then_generate(ckpt, model, tmp_path):
    out = str(tmp_path / "cli.bitnet")
    r = run_cli("convert", ckpt["folder"], "--out", out)
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(out) and r.stdout.strip() == out
    r = run_cli("generate", "--model", out, "--prompt", "Hello! How are you today?", "--max-new-tokens", "7",
                "--threads", "1")
    assert r.returncode == 0, r.stderr
    want = model.complete(prompt(model), max_new_tokens=7)
    assert r.stdout == model.tokenizer.decode(want, skip_special_tokens=True) + "\n"
    stats = json.loads(r.stderr.strip().splitlines()[-1].removeprefix("stats "))
    assert stats["tokens"] == len(want) and stats["mode"] == "ar"
    r = run_cli("generate", "--model", out, "--prompt", "The quick", "--raw", "--max-new-tokens", "5",
                "--temperature", "0.8", "--seed", "3", "--top-k", "20", "--top-p", "0.9",
                "--repetition-penalty", "1.1", "--threads", "1")
    assert r.returncode == 0, r.stderr
    want = model.complete(model.encode("The quick"), max_new_tokens=5, temperature=0.8, seed=3, top_k=20,
                          top_p=0.9, repetition_penalty=1.1)
    assert r.stdout == model.tokenizer.decode(want, skip_special_tokens=True) + "\n"


def test_cli_generate_and_bench_take_the_kv_cache(ckpt, tmp_path):
    """--kv i8 runs the int8 KV cache (the same greedy text as the API with kv="i8"); --packing converts either
    way; the CLI's choices are the engine's."""
    from bitnet_app.__main__ import KV_CHOICES
    from bitnet_app.engine.runtime import KV_TYPES
    from bitnet_app.model import Model
    assert KV_CHOICES == KV_TYPES
    out = str(tmp_path / "two.bitnet")
    r = run_cli("convert", ckpt["folder"], "--out", out, "--packing", "2bit")
    assert r.returncode == 0, r.stderr
    r = run_cli("generate", "--model", out, "--prompt", "Hello!", "--max-new-tokens", "6", "--kv", "i8",
                "--threads", "1")
    assert r.returncode == 0, r.stderr
    m = Model.open(out, kv="i8", threads=1)
    assert m.info()["kv"] == "i8" and m.file.packing == "2bit"
    want = m.complete(m.chat_ids([{"role": "user", "content": "Hello!"}]), max_new_tokens=6)
    assert r.stdout == m.tokenizer.decode(want, skip_special_tokens=True) + "\n"
    r = run_cli("bench", "--synthetic", "tiny", "--json", "--threads", "1", "--repeats", "1", "--kv", "i8",
                "--packing", "1.6bit", env_extra={"BITNET_APP_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kv"] == "i8"


def test_cli_user_errors_are_one_line_and_exit_2(ckpt, tmp_path):
    for args in (("generate", "--model", str(tmp_path / "nope"), "--prompt", "x"),
                 ("generate", "--model", os.path.join(ckpt["folder"], "config.json"), "--prompt", "x"),
                 ("generate", "--model", ckpt["file"], "--prompt", "fox " * 200),
                 ("convert", str(tmp_path / "nope"), "--out", str(tmp_path / "x.bitnet"))):
        r = run_cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not os.path.exists(tmp_path / "x.bitnet")


def _files_under(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


def test_cli_bench_synthetic_tiny_json(tmp_path):
    """The report's figures; the random model is deleted at the end unless --keep asks to keep it."""
    bench = ("bench", "--synthetic", "tiny", "--json", "--threads", "1", "--repeats", "2")
    r = run_cli(*bench, env_extra={"BITNET_APP_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert set(rep["block_ms"]) == {"1", "4", "8", "16", "32"} and all(v > 0 for v in rep["block_ms"].values())
    assert rep["decode_tok_s"] > 0 and rep["prefill_tok_s"] > 0 and rep["threads"] == 1 and rep["isa"]
    assert _files_under(tmp_path) == []  # nothing left behind

    r = run_cli(*bench, "--keep", env_extra={"BITNET_APP_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert _files_under(tmp_path) == [os.path.join("synthetic", "tiny-seed0.bitnet")]
    from bitnet_app.engine.file import EngineFile
    ef = EngineFile(rep["model"])
    tiles = sum(t.nbytes for n, t in ef.tensors.items() if n.endswith(".codes"))
    assert rep["bytes_per_token"] == tiles + ef.tensors["head.i8"].nbytes


def test_diffusion_mode_dispatches_with_a_stand_in_mask_on_an_untrained_checkpoint(model):
    d = model.diffusion_defaults
    assert model.mask_id is None and d["attention"] == "causal"
    spare = d["mask_id"]
    assert spare is not None and 0 <= spare < model.vocab_size
    assert spare != model.bos_id and spare not in model.stop_ids
    ids = prompt(model)
    ar = model.complete(ids, max_new_tokens=12)
    assert spare not in ar  # otherwise banning it would (rightly) change the greedy text below
    # causal attention + threshold 1.0: one slot per forward, the leftmost, i.e. exactly greedy AR
    events = list(model.generate(ids, mode="diffusion", max_new_tokens=12, threshold=1.0))
    assert events[-1].ids == ar
    assert {"tokens", "forwards", "tokens_per_forward", "tok_s", "ttft_s"} <= set(events[-1].stats)
    with pytest.raises(ValueError, match="mode"):
        model.generate(ids, mode="beam")


def test_cli_a_text_file_as_model_is_not_called_a_truncated_engine_file(ckpt, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")  # shorter than an engine file's header
    cut = tmp_path / "cut.bitnet"
    with open(ckpt["file"], "rb") as f:
        cut.write_bytes(f.read(12))  # the start of a real engine file
    for path, said in ((notes, "is not a BitNet engine file"), (cut, "truncated")):
        r = run_cli("generate", "--model", str(path), "--prompt", "x")
        assert r.returncode == 2 and r.stderr.startswith("error: ") and said in r.stderr, r.stderr
        assert ("truncated" in r.stderr) == (path == cut)


@pytest.mark.parametrize("settings", [dict(), dict(repetition_penalty=1.3), dict(temperature=0.8, top_p=0.9, seed=4)])
def test_sampler_token_is_the_id_of_a_full_call(settings):
    """AR asks only for the id (greedy then skips the probability): the same id, and the same random draws."""
    logits = np.random.default_rng(7).standard_normal((12, 300)).astype(np.float32) * 4
    context = [5, 9, int(np.argmax(logits[0]))]
    full, alone = Sampler(banned_ids=[2], **settings), Sampler(banned_ids=[2], **settings)
    for row in logits:
        assert alone.token(row, context) == full(row, context)[0]
