"""The command line, the API and the page give the same reply for the same source and settings: all three
go through bitnet_app.source (one converted engine file) and bitnet_app.params (one set of defaults)."""
import os
import subprocess
import sys

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

import bitnet_app
from bitnet_app.decode.events import Done
from checkpoints import make_hf_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "Tell me about the sea"
# Explicit sampling settings, so the three agree because they decode alike, not because all are greedy;
# the diffusion knobs (block size, threshold, attention, mask) are left to each front end's defaults.
SETTINGS = {"max_new_tokens": 10, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7}


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("one-source") / "ck")
    make_hf_checkpoint(folder, mask_token=True, seed=6, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       max_position_embeddings=256)
    return folder


@pytest.fixture
def env(monkeypatch, demo_folder, tmp_path):
    values = {"BITNET_DEMO_MODEL": demo_folder, "BITNET_APP_CACHE": str(tmp_path / "engines"),
              "BITNET_APP_MODEL": "demo", "BITNET_THREADS": "1", "HF_HUB_OFFLINE": "1",
              "HF_HUB_CACHE": str(tmp_path / "hf")}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    st.cache_resource.clear()
    yield values
    st.cache_resource.clear()


def _cli(mode: str, env: dict) -> str:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    r = subprocess.run([sys.executable, "-m", "bitnet_app", "generate", "--model", "demo", "--prompt", PROMPT,
                        "--mode", mode, *flags], capture_output=True, text=True, cwd=REPO, timeout=240,
                       env=dict(os.environ, PYTHONPATH=REPO, **env))
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n")
    return r.stdout[:-1]


def _api(mode: str) -> str:
    model = bitnet_app.load_model("demo", threads=1)
    events = list(model.generate(model.chat_ids([{"role": "user", "content": PROMPT}]), mode=mode, **SETTINGS))
    assert isinstance(events[-1], Done) and events[-1].ids
    return events[-1].text


def _page(mode: str) -> str:
    at = AppTest.from_file(os.path.join(REPO, "app.py"), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    at.sidebar.text_area(key="system_prompt").set_value("")  # the CLI and the API send no system prompt here
    at.sidebar.radio(key="mode").set_value(mode)
    at.sidebar.number_input(key="max_new_tokens").set_value(SETTINGS["max_new_tokens"])
    at.sidebar.number_input(key="seed").set_value(SETTINGS["seed"])
    for name in ("temperature", "top_k", "top_p"):
        at.sidebar.slider(key=name).set_value(SETTINGS[name])
    at.run()
    at.chat_input(key="chat_prompt").set_value(PROMPT).run()
    assert not at.exception, at.exception
    reply = at.session_state["messages"][-1]
    assert reply["role"] == "assistant" and reply["done"] and reply["mode"] == mode
    return reply["content"]


@pytest.mark.parametrize("mode", ["ar", "diffusion"])
def test_cli_api_and_page_agree_on_one_source(env, mode):
    api = _api(mode)
    assert api.strip()
    assert _cli(mode, env) == api
    assert _page(mode) == api
    converted = os.listdir(os.path.join(env["BITNET_APP_CACHE"], "converted"))
    assert len(converted) == 1, converted  # all three prepared the same engine file, converted once


def test_the_page_and_the_api_start_from_the_same_diffusion_defaults(env):
    at = AppTest.from_file(os.path.join(REPO, "app.py"), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    model = bitnet_app.load_model("demo", threads=1)
    api = model.decode_params(mode="diffusion")  # the checkpoint's values, and the threshold of its fill rule
    for name in model.diffusion_defaults:
        if name != "mask_id":  # not a sidebar setting
            assert at.session_state[name] == getattr(api, name), name
    assert at.session_state["fill_rule"] == api.fill_rule


def test_a_new_fill_rule_in_the_sidebar_starts_from_its_own_threshold(env):
    """Switching the fill rule moves the threshold to that rule's default, as the API resolves it (the exact rule
    drafts lower than the threshold rule keeps); a threshold the user then sets stands."""
    at = AppTest.from_file(os.path.join(REPO, "app.py"), default_timeout=120)
    at.run()
    at.sidebar.radio(key="mode").set_value("diffusion").run()
    model = bitnet_app.load_model("demo", threads=1)
    assert at.session_state["fill_rule"] == "exact"  # the generated checkpoint is causal
    for rule in ("threshold", "exact", "threshold"):
        at.sidebar.selectbox(key="fill_rule").set_value(rule).run()
        assert not at.exception, at.exception
        assert at.session_state["threshold"] == model.decode_params(mode="diffusion", fill_rule=rule).threshold
    at.sidebar.slider(key="threshold").set_value(0.55).run()
    assert at.session_state["threshold"] == 0.55 and at.session_state["fill_rule"] == "threshold"


def test_the_sidebar_draws_the_knobs_params_places_there_from_the_checkpoint(env):
    """Each knob with a sidebar section in params.py is a widget keyed by its name, labelled from its metadata,
    and starts from the checkpoint's own values (Model.suggested_params), bar the ones a user keeps."""
    from bitnet_app.params import KNOBS, SECTIONS, sidebar_knobs
    from bitnet_app.ui.state import KEPT_ACROSS_MODELS

    at = AppTest.from_file(os.path.join(REPO, "app.py"), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    widgets = {w.key: w for kind in ("radio", "slider", "number_input", "selectbox") for w in getattr(at.sidebar, kind)}
    start = bitnet_app.load_model("demo", threads=1).suggested_params()
    for name in (n for section in SECTIONS for n in sidebar_knobs(section)):
        assert name in widgets and widgets[name].label == KNOBS[name].metadata["label"], name
        if name not in KEPT_ACROSS_MODELS:
            value = getattr(start, name)
            assert at.session_state[name] == (round(value, 2) if isinstance(value, float) else value), name
