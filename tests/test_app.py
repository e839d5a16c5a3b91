"""The Streamlit page under streamlit.testing.v1.AppTest, running the real engine on small checkpoints.

The first run downloads from a loopback fake Hub (HF_ENDPOINT, the real huggingface_hub code),
converts, loads and chats; caches live in tmp folders per test module.
"""
import json
import os
import shutil
import socket
import time

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Block

from bitnet_app.engine.kernel_paths import PORTABLE
from bitnet_app.source import DEFAULT_REPO
from bitnet_app.ui import export, jobs, model_choices, reply, stats, suggestions
from checkpoints import make_hf_checkpoint
from fake_hub import FakeHub

APP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app.py")
REPO = "org/bitnet-tiny"
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=256)
NO_SYSTEM_TEMPLATE = ("{%- for m in messages -%}{%- if m['role'] != 'system' -%}{{ m['content'] }}\n{%- endif -%}"
                      "{%- endfor -%}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    dlm = str(root / "dlm")
    make_hf_checkpoint(dlm, mask_token=True, seed=1, **SMALL)
    plain = str(root / "plain")
    make_hf_checkpoint(plain, mask_token=False, seed=2, **SMALL)
    llama = str(root / "llama")
    shutil.copytree(plain, llama)
    with open(os.path.join(llama, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama")
    cfg.pop("quantization_config", None)
    with open(os.path.join(llama, "config.json"), "w") as f:
        json.dump(cfg, f)
    nosys = str(root / "nosys")  # a completion-style template that drops system messages (the first demo model's)
    make_hf_checkpoint(nosys, mask_token=True, seed=3, chat_template=NO_SYSTEM_TEMPLATE, **SMALL)
    broken = str(root / "broken")
    shutil.copytree(plain, broken)
    weights = os.path.join(broken, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)  # a download cut in half
    return {"dlm": dlm, "plain": plain, "llama": llama, "broken": broken, "nosys": nosys}


@pytest.fixture(scope="module")
def fake_hub(checkpoints):
    with FakeHub({REPO: checkpoints["dlm"], "org/bitnet-gated": checkpoints["dlm"]},
                 missing={"org/missing"}, gated={"org/bitnet-gated"}) as hub:
        yield hub


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    return {"hf": str(root / "hf"), "engines": str(root / "engines")}


@pytest.fixture
def env(monkeypatch, fake_hub, caches):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", caches["hf"])
    monkeypatch.setenv("BITNET_APP_CACHE", caches["engines"])
    monkeypatch.setenv("BITNET_APP_MODEL", REPO)
    monkeypatch.setenv("BITNET_THREADS", "1")  # 2 shared cores: a spinning second worker only slows tests
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # No demo model unless a test provides one (assets/demo-model must not change what these tests see).
    monkeypatch.setenv("BITNET_DEMO_MODEL", os.path.join(caches["engines"], "no-demo-model-here"))
    st.cache_resource.clear()  # cached engines outlive AppTest instances
    jobs.forget_failed()
    yield monkeypatch
    st.cache_resource.clear()


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    return at


def _chat(at: AppTest, text: str) -> dict:
    at.chat_input(key="chat_prompt").set_value(text).run()
    assert not at.exception, at.exception
    msgs = at.session_state["messages"]
    assert msgs[-1]["role"] == "assistant"
    return msgs[-1]


def _all_markdown(at) -> str:
    return "\n".join(m.value for m in at.markdown)


def test_first_run_downloads_converts_then_chats(env, fake_hub, caches):
    fake_hub.requests.clear()
    at = _app()
    assert [r for r in fake_hub.requests if r[0] == "GET" and r[1].endswith("model.safetensors")]
    assert any("downloaded and converted for this CPU" in t.value for t in at.toast)
    assert os.listdir(os.path.join(caches["engines"], "converted"))  # the engine file is cached
    assert at.sidebar.selectbox(key="model_choice").value == REPO
    # greedy: with a fresh random seed the random-weight model may draw its stop token first (an empty reply)
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    msg = _chat(at, "Hello there")
    assert msg["done"] and not msg["stopped"] and msg["content"] and msg["mode"] == "ar"
    assert msg["stats"]["tokens"] > 0 and msg["stats"]["tok_s"] > 0 and msg["stats"]["ttft_s"] > 0
    bubble = at.chat_message[1]
    assert bubble.markdown[0].value == reply.markdown_text(msg["content"])  # the text, line breaks kept
    assert "tok/s" in bubble.markdown[1].value and "first token" in bubble.markdown[1].value
    assert at.session_state["messages"][0] == {"role": "user", "content": "Hello there"}


def test_second_start_goes_straight_to_chat_without_the_network(env, fake_hub, caches):
    _app()  # make sure the model is downloaded and converted
    st.cache_resource.clear()
    fake_hub.requests.clear()
    at = _app()
    assert not at.toast  # no download, no conversion
    assert fake_hub.requests == []
    assert at.chat_input(key="chat_prompt")


def test_chat_in_diffusion_mode_shows_steps_and_forwards(env):
    at = _app()
    at.sidebar.radio(key="mode").set_value("diffusion").run()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    msg = _chat(at, "Tell me a story")
    assert msg["mode"] == "diffusion" and msg["done"]
    assert msg["stats"]["forwards"] > 0 and msg["stats"]["tokens_per_forward"] > 0
    assert msg["steps"] and all(0 < len(f["slots"]) <= at.session_state["block_size"] for f in msg["steps"])
    assert all(f["new"] for f in msg["steps"])  # every forward fills at least one slot
    row = [m.value for m in at.chat_message[1].markdown if "stat-row" in m.value][0]
    assert "forwards" in row and "tokens/step" in row and "steps" in row
    assert any("diffusion steps" in e.label for e in at.expander)  # the replay
    assert len(msg["steps"]) > 1
    at.slider(key=f"replay_{msg['id']}").set_value(1).run()  # the replay slider redraws an earlier step
    assert any(f"step 1 of {len(msg['steps'])}" in m.value for m in at.markdown)


DIFFUSION_SELECTS = ("block_size", "sub_block_size", "attention", "fill_rule")


def test_every_diffusion_choice_runs_or_is_adjusted_with_a_note(env):
    """Each select box of the diffusion settings through each value it offers, from every state the walk reaches:
    the page never breaks (block attention under the exact rule once raised StreamlitWidgetAlreadyInstantiatedError
    from the threshold), what no longer fits is changed with a note, and a reply runs with what is shown."""
    at = _app()
    at.sidebar.radio(key="mode").set_value("diffusion").run()
    at.sidebar.number_input(key="max_new_tokens").set_value(3).run()
    assert at.session_state["attention"] == "causal" and at.session_state["fill_rule"] == "exact"
    at.sidebar.selectbox(key="attention").set_value("block").run()
    assert not at.exception, at.exception
    assert at.session_state["fill_rule"] == "threshold"  # the exact rule needs causal attention
    assert at.sidebar.slider(key="threshold").value == 0.9  # ... and the threshold follows the rule
    assert any("Fill rule is now Threshold" in i.value for i in at.sidebar.info)
    assert "Not offered with these settings: Exact" in _sidebar_captions(at)
    for name in DIFFUSION_SELECTS:
        for value in _select_values(name):
            if value not in _offered(at, name):
                continue
            at.sidebar.selectbox(key=name).set_value(value).run()
            assert not at.exception, (name, value, at.exception)
            shown = {n: at.sidebar.selectbox(key=n).value for n in DIFFUSION_SELECTS}
            assert shown[name] == value
            assert shown["block_size"] % shown["sub_block_size"] == 0, shown
            msg = _chat(at, "Hi")
            assert msg["done"] and msg["mode"] == "diffusion", (shown, msg)
    at.sidebar.selectbox(key="block_size").set_value(4).run()  # below the sub-block size: it follows, with a note
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="sub_block_size").value <= 4
    assert any("Sub-block size is now" in i.value for i in at.sidebar.info)


def _select_values(name: str) -> tuple:
    from bitnet_app.params import KNOBS
    meta = KNOBS[name].metadata
    return tuple(meta["ui"].get("options") or meta["choices"])


def _offered(at, name: str) -> list:
    """The values select box `name` offers now (its options as drawn are labels: map them back)."""
    from bitnet_app.params import KNOBS
    labels = KNOBS[name].metadata["ui"].get("labels") or {}
    drawn = at.sidebar.selectbox(key=name).options
    return [v for v in _select_values(name) if str(labels.get(v, v)) in drawn]


def test_settings_reach_the_decoder_and_regenerate_repeats_a_greedy_reply(env):
    at = _app()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    at.sidebar.number_input(key="max_new_tokens").set_value(5).run()
    first = _chat(at, "Count to ten")
    assert first["stats"]["tokens"] <= 5 and first["stop_reason"] in ("length", "stop")
    at.button(key="regenerate").click().run()
    assert not at.exception
    msgs = at.session_state["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert msgs[-1]["content"] == first["content"]  # temperature 0: the same reply again


def test_system_prompt_clear_and_export(env):
    at = _app()
    at.sidebar.text_area(key="system_prompt").set_value("Answer like a pirate.").run()
    at.sidebar.number_input(key="max_new_tokens").set_value(4).run()
    _chat(at, "Hi")
    msgs = at.session_state["messages"]
    md = export.to_markdown(msgs, system_prompt="Answer like a pirate.", model=REPO)
    assert "Answer like a pirate." in md and "### You" in md and "Hi" in md and "tok/s" in md
    data = json.loads(export.to_json(msgs, system_prompt="Answer like a pirate.", model=REPO,
                                     settings={"mode": "ar"}))
    assert data["messages"][1]["stats"]["tokens"] == msgs[1]["stats"]["tokens"]
    assert len(at.sidebar.download_button) == 2
    clear = [b for b in at.sidebar.button if b.label == "Clear chat"][0]
    clear.click().run()
    assert at.session_state["messages"] == []


def test_long_history_is_trimmed_with_a_notice(env):
    at = _app()
    long = "the quick brown fox jumps over the lazy dog " * 12
    at.session_state["messages"] = [m for _ in range(6) for m in
                                    ({"role": "user", "content": long},
                                     {"role": "assistant", "content": long, "mode": "ar", "stats": None})]
    at.sidebar.number_input(key="max_new_tokens").set_value(8).run()
    msg = _chat(at, "And now?")
    assert msg["trimmed"] > 0
    assert any("oldest messages were left out" in i.value for i in at.info)


def test_a_chat_of_short_replies_keeps_its_history(env, checkpoints):
    """Max new tokens at half the context, replies of 10 tokens: the history is not trimmed for room no reply uses
    (a times-table chat with the demo model got the trimmed notice on every reply from its third)."""
    import bitnet_app
    from bitnet_app.ui import chat_view
    line = "one two three four five"
    history = [m for _ in range(4) for m in ({"role": "user", "content": line},
                                             {"role": "assistant", "content": line, "mode": "ar",
                                              "stats": {"tokens": 10}})]
    model = bitnet_app.load_model(checkpoints["dlm"], threads=1)
    try:
        prompt = len(model.chat_ids([{"role": "system", "content": "x"}] + history + [{"role": "user", "content": "Hi"}]))
        context = model.context_length
    finally:
        model.close()
    assert prompt + 128 > context > prompt + chat_view.MIN_ROOM + 16  # trimmed if 128 were kept free; fits with 32
    assert chat_view.reply_room(128, history) == chat_view.MIN_ROOM and chat_view.reply_room(128, []) == 128
    at = _app()
    at.session_state["messages"] = list(history)
    at.sidebar.number_input(key="max_new_tokens").set_value(128).run()
    msg = _chat(at, "Hi")
    assert msg["trimmed"] == 0 and not any("oldest messages were left out" in i.value for i in at.info)
    assert chat_view.reply_room(128, [{"role": "assistant", "stats": {"tokens": 109}}]) == 128  # capped
    assert chat_view.reply_room(256, [{"role": "assistant", "stats": {"tokens": 109}}]) == 163


def test_a_message_longer_than_the_context_is_explained(env):
    at = _app()
    at.sidebar.number_input(key="max_new_tokens").set_value(8).run()
    msg = _chat(at, "tell me about the sea " * 200)  # far beyond the 256-token context
    assert "too long for the model" in msg["error"] and not msg["stopped"]
    assert any("too long for the model" in e.value for e in at.error)
    assert at.chat_input(key="chat_prompt")  # the chat goes on


def test_a_damaged_model_stops_the_reply_keeps_its_text_and_says_so(env):
    """Non-finite logits stop a reply with an error naming the model file (engine/runtime.py); the page keeps the
    text written before it and says so (issue 33)."""
    from bitnet_app.engine.runtime import Engine
    from bitnet_app.engine.validate import NonFiniteLogits

    at = _app()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    at.sidebar.number_input(key="max_new_tokens").set_value(16).run()
    real, calls = Engine.forward, []

    def damaged_after_three_tokens(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 4:   # the prefill and three tokens went well
            raise NonFiniteLogits(f"{self.file.path} is damaged: the engine computed logits that are not finite numbers")
        return real(self, *args, **kwargs)

    env.setattr(Engine, "forward", damaged_after_three_tokens)
    msg = _chat(at, "Hello")
    assert msg["content"] and not msg["done"] and not msg["stopped"]
    assert "is damaged" in msg["error"] and "The text it wrote before that is kept below" in msg["error"]
    assert any("is damaged" in e.value for e in at.error)
    assert msg["content"].strip() in _all_markdown(at)
    assert at.chat_input(key="chat_prompt")  # the chat goes on


def test_compare_view_runs_both_modes(env):
    at = _app()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    at.sidebar.number_input(key="max_new_tokens").set_value(24).run()
    at.segmented_control(key="view").set_value("Compare").run()
    assert not at.exception
    at.chat_input(key="compare_prompt").set_value("Hello").run()
    assert not at.exception, at.exception
    result = at.session_state["compare"]
    assert not result.get("error"), result.get("error")
    assert result["ar"]["done"] and result["diffusion"]["done"]
    assert result["ar"]["stats"]["tokens_per_forward"] == 1.0
    assert result["diffusion"]["stats"]["forwards"] > 0
    labels = [m.label for m in at.metric]
    assert "Diffusion speed vs AR" in labels and "Do the texts agree?" in labels
    assert not _fixed_heights(at._tree)  # the columns grow with the replies: nothing scrolls out of sight


def _fixed_heights(node) -> list[str]:
    """The fixed heights of every container on the page (a fixed-height box scrolls its content)."""
    proto = getattr(node, "proto", None)
    out = []
    if type(proto).__name__ == "Block" and proto.HasField("height_config") \
            and proto.height_config.WhichOneof("height_spec") == "pixel_height":
        out.append(f"{proto.height_config.pixel_height}px")
    children = getattr(node, "children", None)
    for child in (children.values() if isinstance(children, dict) else children or []):
        out += _fixed_heights(child)
    return out


def test_not_trained_for_diffusion_is_said_plainly(env, checkpoints):
    env.setenv("BITNET_APP_MODEL", checkpoints["plain"])
    at = _app()
    at.sidebar.radio(key="mode").set_value("diffusion").run()
    assert any("not trained for block diffusion" in i.value for i in at.sidebar.info)


def test_model_info_and_slow_cpu_warning(env):
    env.setenv("BITNET_ISA", PORTABLE)  # what a CPU without AVX2 gets
    at = _app()
    info = [m.value for m in at.sidebar.markdown if "Kernel path" in m.value][0]
    assert "portable C" in info and "Parameters" in info and "RAM" in info and "Model file" in info
    assert any("no AVX2" in w.value for w in at.warning)


def test_the_kv_cache_setting_reloads_the_engine_and_chats(env):
    """The sidebar's KV cache choice: fp16 by default; int8 reloads the engine with the int8 cache (Model info
    says so) and the chat goes on."""
    at = _app()
    info = [m.value for m in at.sidebar.markdown if "Kernel path" in m.value][0]
    assert "**KV cache:** f16" in info
    at.sidebar.selectbox(key="kv_cache").set_value("i8").run()
    assert not at.exception, at.exception
    info = [m.value for m in at.sidebar.markdown if "Kernel path" in m.value][0]
    assert "**KV cache:** i8" in info
    assert _chat(at, "Hello")["content"]


def test_disk_full_is_checked_before_downloading(env, checkpoints, tmp_path):
    with FakeHub({"org/huge": checkpoints["dlm"]}, fake_sizes={"model.safetensors": 1 << 60}) as huge:
        env.setenv("HF_ENDPOINT", huge.url)
        env.setenv("BITNET_APP_MODEL", "org/huge")
        at = _app()
    assert "Not enough disk space" in _all_markdown(at)
    assert "needs" in at.error[0].value and "free" in at.error[0].value
    assert not [r for r in huge.requests if r[1].endswith(".safetensors")]


def test_error_page_leads_to_the_bundled_demo_model(env, checkpoints, tmp_path):
    env.setenv("BITNET_APP_MODEL", "org/missing")  # not found: no automatic fallback, the page offers the demo
    env.setenv("BITNET_DEMO_MODEL", checkpoints["plain"])  # stands in for assets/demo-model
    env.setenv("BITNET_APP_CACHE", str(tmp_path / "engines"))
    at = _app()
    assert "That model was not found" in _all_markdown(at)
    at.button(key="err_retry").click().run()
    assert "That model was not found" in _all_markdown(at) and "Tried again at" in _captions(at)
    assert model_choices.picker_label(model_choices.DEMO_LABEL) in at.sidebar.selectbox(key="model_choice").options
    demo = [b for b in at.button if b.label == f"Use the {model_choices.DEMO_LABEL}"][0]
    assert not demo.disabled
    demo.click().run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="model_choice").value == model_choices.DEMO_LABEL
    at.sidebar.number_input(key="max_new_tokens").set_value(6).run()
    assert _chat(at, "Hello")["done"]


@pytest.mark.parametrize("case, title", [
    ("offline", "You are offline"),
    ("not_found", "That model was not found"),
    ("gated", "needs a Hugging Face login"),
    ("not_bitnet", "That is not a BitNet model"),
    ("bad_checkpoint", "That checkpoint cannot be used"),
    ("no_network", "cannot be reached"),
])
def test_error_pages_explain_what_to_do(env, checkpoints, case, title, tmp_path):
    if case == "offline":
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        env.setenv("BITNET_APP_CACHE", str(tmp_path / "empty-engines"))
    elif case == "not_found":
        env.setenv("BITNET_APP_MODEL", "org/missing")
    elif case == "gated":
        env.setenv("BITNET_APP_MODEL", "org/bitnet-gated")
    elif case == "not_bitnet":
        env.setenv("BITNET_APP_MODEL", checkpoints["llama"])
    elif case == "bad_checkpoint":
        env.setenv("BITNET_APP_MODEL", checkpoints["broken"])
    elif case == "no_network":
        env.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
        env.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        env.setenv("BITNET_APP_CACHE", str(tmp_path / "empty-engines"))
    at = _app()
    page = _all_markdown(at)
    assert title in page, page
    assert at.error and at.error[0].value  # the explanation in words
    labels = [b.label for b in at.button]
    assert f"Use the {model_choices.DEMO_LABEL}" in labels
    assert ("Retry" in labels) == (case != "offline")  # offline mode is on: a retry could not download
    if case == "offline":
        assert "start the app without it" in _captions(at)
    assert not at.chat_input  # no chat without a model
    if case in ("offline", "no_network"):
        assert "Demo model" in at.error[0].value


def _closed_port() -> int:
    """A loopback port with nothing listening on it: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _captions(at) -> str:
    return "\n".join(c.value for c in at.caption)


def _sidebar_captions(at) -> str:
    return "\n".join(c.value for c in at.sidebar.caption)


def _notice(at) -> str:
    return "\n".join(w.value for w in at.warning if "could not be downloaded" in w.value)


@pytest.mark.parametrize("how", ["hub_unreachable", "offline_mode"])
def test_default_model_out_of_reach_opens_the_demo_model_with_a_notice(env, checkpoints, tmp_path, how):
    env.delenv("BITNET_APP_MODEL")  # the default model, microsoft/bitnet-b1.58-2B-4T
    env.setenv("BITNET_DEMO_MODEL", checkpoints["dlm"])  # stands in for assets/demo-model
    env.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    env.setenv("BITNET_APP_CACHE", str(tmp_path / "engines"))
    if how == "offline_mode":
        env.setenv("HF_HUB_OFFLINE", "1")
    else:
        env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    at = _app()
    picker = at.sidebar.selectbox(key="model_choice")
    assert picker.value == DEFAULT_REPO  # the choice is kept
    assert picker.options[picker.index] == "bitnet-b1.58-2B-4T · not downloaded"  # ... in its state, under its name
    notice = _notice(at)
    assert DEFAULT_REPO in notice and f"The {model_choices.DEMO_LABEL} runs instead" in notice
    assert ("offline mode is on" if how == "offline_mode" else "cannot be reached") in notice
    assert not at.error  # no error page: the demo model is open and chats
    assert not at.toast  # the demo model was converted just now, but the notice says what happened
    assert "Diffusion-trained:** yes" in [m.value for m in at.sidebar.markdown if "Kernel path" in m.value][0]
    about = _sidebar_captions(at)
    assert f"Running **{model_choices.DEMO_LABEL}**" in about
    assert f"{DEFAULT_REPO} is not downloaded: the {model_choices.DEMO_LABEL} runs instead" in about
    assert "1.2 GB download" not in about  # the model that failed is not described as the one running
    at.sidebar.number_input(key="max_new_tokens").set_value(6).run()
    msg = _chat(at, "Hello")
    assert msg["done"] and msg["stats"]["tokens"] > 0
    assert _notice(at)  # the notice stays while the demo model stands in

    if how == "offline_mode":  # a setting of this process: a retry cannot download, so none is offered
        assert not [b for b in at.button if b.key == "fallback_retry"]
        assert "start the app without it" in _captions(at)
    else:
        assert "Tried again" not in _captions(at)
        at.button(key="fallback_retry").click().run()  # tries the download again: still out of reach
        assert not at.exception, at.exception
        assert _notice(at) and at.chat_input(key="chat_prompt")
        assert "Tried again at" in _captions(at) and "still out of reach" in _captions(at)  # the click did something
        assert picker.options[picker.index] == "bitnet-b1.58-2B-4T · not downloaded"
        assert len(at.session_state["messages"]) == 2  # the chat is kept

    at.button(key="fallback_keep").click().run()
    assert at.sidebar.selectbox(key="model_choice").value == model_choices.DEMO_LABEL
    assert not _notice(at) and at.chat_input(key="chat_prompt")


def test_pick_another_model_from_the_notice(env, checkpoints, tmp_path):
    env.setenv("BITNET_APP_MODEL", "org/not-on-this-hub")
    env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    env.setenv("BITNET_DEMO_MODEL", checkpoints["dlm"])
    env.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    env.setenv("BITNET_APP_CACHE", str(tmp_path / "engines"))
    at = _app()
    assert "org/not-on-this-hub could not be downloaded" in _notice(at)
    at.button(key="fallback_other").click().run()  # opens the picker's list (a script in the browser does)
    assert any("stSelectbox" in h.proto.body for h in at.get("html")), "no script opens the model list"
    at.sidebar.selectbox(key="model_choice").set_value(model_choices.CUSTOM_LABEL).run()
    at.sidebar.text_input(key="custom_source").set_value(checkpoints["plain"]).run()
    assert not at.exception, at.exception
    assert not _notice(at) and at.chat_input(key="chat_prompt")
    assert "Diffusion-trained:** no" in [m.value for m in at.sidebar.markdown if "Kernel path" in m.value][0]


def test_a_hub_repo_typed_while_offline_ends_in_the_notice_at_rest(env, checkpoints, tmp_path):
    """The custom entry with a Hub repo id that cannot be downloaded: the same notice as the default model's, and
    the run ends (a rerun loop would never settle: AppTest's run would time out)."""
    env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    env.setenv("BITNET_DEMO_MODEL", checkpoints["dlm"])
    env.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    env.setenv("BITNET_APP_CACHE", str(tmp_path / "engines"))
    at = _app()
    at.sidebar.selectbox(key="model_choice").set_value(model_choices.CUSTOM_LABEL).run()
    at.sidebar.text_input(key="custom_source").set_value("someone/some-bitnet-model").run(timeout=60)
    assert not at.exception, at.exception
    assert "someone/some-bitnet-model could not be downloaded" in _notice(at)
    assert "someone/some-bitnet-model is not downloaded" in _sidebar_captions(at)
    assert at.chat_input(key="chat_prompt")
    at.sidebar.number_input(key="max_new_tokens").set_value(4).run(timeout=60)
    assert _chat(at, "Hello")["done"] and _notice(at)


def test_slow_motion_paces_the_reply_but_not_the_figures(env):
    at = _app()
    at.sidebar.number_input(key="max_new_tokens").set_value(12).run()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    fast = _chat(at, "Hello")
    at.sidebar.toggle(key="slow_motion").set_value(True).run()
    at.sidebar.slider(key="slow_motion_rate").set_value(20).run()  # steps (here tokens) per second
    t0 = time.monotonic()
    at.button(key="regenerate").click().run()
    took = time.monotonic() - t0
    slow = at.session_state["messages"][-1]
    assert slow["content"] == fast["content"] and slow["done"]
    assert took >= (slow["stats"]["tokens"] - 1) / 20  # one beat per token, at the rate set
    assert slow["stats"]["tok_s"] > 3 * 20  # the engine's own speed, not the paced one


def _remount_as_a_browser_does(at) -> None:
    """AppTest hands every widget its server-side value. A browser that mounts a widget afresh (after a run that
    did not draw it) shows the value the page sent with it (`set_value`), or else the widget's own default (a
    number's or slider's minimum), and sends that back with the next interaction. Apply that rule to the
    sidebar's numbers and sliders, as the browser does after a detour."""
    for widget in at.sidebar.number_input:
        if not widget.proto.set_value:
            widget.set_value(type(widget.value)(widget.proto.default))
    for widget in at.sidebar.slider:
        if not widget.proto.set_value:
            widget.set_value(type(widget.value)(widget.proto.default[0]))


def _settings_shown(at) -> dict:
    return {w.key: w.value for w in list(at.sidebar.number_input) + list(at.sidebar.slider)}


def test_settings_survive_a_detour_and_the_next_reply_is_normal(env, checkpoints, tmp_path):
    """The detour that gave one-token replies: the demo model stands in for an unreachable Hub model; the user
    sets Max new tokens and Temperature; "Pick another model", the custom entry (nothing typed yet, so no settings),
    back to the demo model; then a mistyped folder (an error page) and back again. The settings are the user's
    after each detour, and the reply is the same full-length reply as before."""
    env.delenv("BITNET_APP_MODEL")
    env.setenv("BITNET_DEMO_MODEL", checkpoints["dlm"])
    env.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    env.setenv("BITNET_APP_CACHE", str(tmp_path / "engines"))
    env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    at = _app()
    assert _notice(at)
    at.sidebar.number_input(key="max_new_tokens").set_value(24).run()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    at.sidebar.slider(key="top_p").set_value(0.8).run()
    before = _settings_shown(at)
    first = _chat(at, "Hello")
    assert first["stats"]["tokens"] > 8, first  # the test model writes on (it has no reason to stop)

    at.button(key="fallback_other").click().run()  # opens the model list, where the user picks the custom entry:
    at.sidebar.selectbox(key="model_choice").set_value(model_choices.CUSTOM_LABEL).run()  # nothing typed: no model
    assert not at.exception and not at.sidebar.slider
    at.sidebar.selectbox(key="model_choice").set_value(model_choices.DEMO_LABEL).run()
    _remount_as_a_browser_does(at)
    assert _settings_shown(at) == before
    at.sidebar.number_input(key="seed").set_value(3).run()  # touch any control
    assert _settings_shown(at) == dict(before, seed=3)
    at.button(key="regenerate").click().run()
    again = at.session_state["messages"][-1]
    assert again["content"] == first["content"] and again["stats"]["tokens"] == first["stats"]["tokens"]

    at.sidebar.selectbox(key="model_choice").set_value(model_choices.CUSTOM_LABEL).run()
    at.sidebar.text_input(key="custom_source").set_value(str(tmp_path / "no-such-folder")).run()
    assert "That model was not found" in _all_markdown(at) and not at.sidebar.slider  # an error page
    [b for b in at.button if b.label == f"Use the {model_choices.DEMO_LABEL}"][0].click().run()
    _remount_as_a_browser_does(at)
    assert _settings_shown(at) == dict(before, seed=3)
    [b for b in at.sidebar.button if b.label == "Clear chat"][0].click().run()
    third = _chat(at, "Hello")
    assert third["content"] == first["content"] and third["stats"]["tokens"] == first["stats"]["tokens"]


SKILLS = ["Count from 12 to 31.", "Say the alphabet from D to P.", "What is 7 times 1 up to 7 times 12?",
          "Spell the word garden letter by letter.", "Count down from 50 to 41.", "Name the months from May."]
OPEN = ["Continue this scene:\nROMEO.\nBut soft, what light", "Write a speech for HAMLET."]


@pytest.fixture
def demo_with_prompts(checkpoints, tmp_path):
    """A demo-model folder laid out as assets/ is: demo-model/ with demo-prompts.json beside it."""
    root = tmp_path / "assets"
    shutil.copytree(checkpoints["dlm"], root / "demo-model")
    (root / "demo-prompts.json").write_text(json.dumps({"skills": SKILLS, "open": OPEN}))
    return str(root / "demo-model")


def test_the_demo_model_suggests_its_skill_prompts(env, demo_with_prompts, tmp_path):
    env.delenv("BITNET_APP_MODEL")
    env.setenv("BITNET_DEMO_MODEL", demo_with_prompts)
    env.setenv("HF_HUB_OFFLINE", "1")
    env.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    env.setenv("BITNET_APP_CACHE", str(tmp_path / "engines"))
    at = _app()
    assert "short skills" in _sidebar_captions(at)  # describes this demo model, once: in the sidebar
    assert "short skills" not in _notice(at) and "the sidebar says what it is" in _notice(at)
    offered = [at.button(key=f"example_{i}") for i in range(4)]
    wanted = [SKILLS[0], SKILLS[2], SKILLS[4], OPEN[0]]  # three skills spread over the list, then free text
    assert [b.label for b in offered] == [suggestions.button_label(p) for p in wanted]
    assert "Block diffusion" in _captions(at) and "Decoding" in _captions(at)  # names the sidebar's switch
    at.button(key="example_mode").click().run()  # ... or switches it from here
    assert at.sidebar.radio(key="mode").value == "diffusion" and not [b for b in at.button if b.key == "example_mode"]
    at.sidebar.radio(key="mode").set_value("ar").run()
    at.sidebar.number_input(key="max_new_tokens").set_value(8).run()
    at.button(key="example_1").click().run()
    assert not at.exception, at.exception
    msgs = at.session_state["messages"]
    assert msgs[0] == {"role": "user", "content": SKILLS[2]} and msgs[1]["done"]

    at.segmented_control(key="view").set_value("Compare").run()
    assert at.button(key="compare_example_0").label == suggestions.button_label(SKILLS[0])
    at.button(key="compare_example_3").click().run()
    assert not at.exception, at.exception
    assert at.session_state["compare"]["prompt"] == OPEN[0]
    assert any("Tokens per step" in c and "always 1" in c for c in _captions(at).split("\n"))


def test_general_suggestions_for_a_model_without_a_prompt_file(env):
    at = _app()
    assert [at.button(key=f"example_{i}").label for i in range(3)] == [p for p, _ in suggestions.GENERAL]


def test_the_system_prompt_is_offered_only_where_the_template_reads_it(env, checkpoints):
    at = _app()  # 2B-4T's template: the system prompt is read
    assert at.sidebar.text_area(key="system_prompt")
    env.setenv("BITNET_APP_MODEL", checkpoints["nosys"])
    at = _app()
    assert not at.sidebar.text_area  # nothing to set that the model would never see
    assert "no place for a system prompt" in _sidebar_captions(at)
    at.sidebar.number_input(key="max_new_tokens").set_value(4).run()
    assert _chat(at, "Hi")["done"]


def test_which_chat_templates_read_a_system_prompt(env, checkpoints, caches):
    """state.uses_system_prompt decides whether the page shows, sends and exports the system prompt."""
    import bitnet_app
    from bitnet_app.ui import state
    for name, reads in (("dlm", True), ("nosys", False)):
        model = bitnet_app.load_model(checkpoints[name], threads=1)
        try:
            assert state.uses_system_prompt(model) is reads
        finally:
            model.close()


def test_a_base_model_runs_as_completion_and_the_page_says_so(env, tmp_path):
    """A checkpoint without a chat template (1bitLLM's layout, tests/family_checkpoints.py): the sidebar says it
    continues the user's text, offers no system prompt, and a reply streams."""
    from family_checkpoints import make_family_checkpoint
    folder = str(tmp_path / "1bitllm")
    make_family_checkpoint(folder, "1bitllm")
    env.setenv("BITNET_APP_MODEL", folder)
    at = _app()
    assert any("runs as **completion**" in i.value for i in at.sidebar.info)
    assert not at.sidebar.text_area  # a completion has no place for a system prompt
    at.sidebar.number_input(key="max_new_tokens").set_value(4).run()
    assert _chat(at, "Once upon a time")["done"]


# ---- issue 32: the presenter's page ------------------------------------------------------------------------
def _paths(node, prefix=()):
    """(path of child indices from the page's root, node) of every node under `node`."""
    for index, child in sorted(getattr(node, "children", {}).items()):
        yield prefix + (index,), child
        yield from _paths(child, prefix + (index,))


def _chat_paths(at) -> list[tuple]:
    """The paths of the chat message bubbles in the main area, in order."""
    return [p for p, n in _paths(at._tree) if getattr(n, "type", "") == "chat_message"]


def test_a_finished_reply_is_drawn_where_it_streamed(env, monkeypatch):
    """The finished reply must replace the streamed one in place: drawn elsewhere, both show until the rerun ends
    (the reply appeared twice). The run that streams is kept as it ended (no rerun) and compared with the next."""
    at = _app()
    at.sidebar.number_input(key="max_new_tokens").set_value(6).run()
    with monkeypatch.context() as patch:
        patch.setattr(st, "rerun", lambda *a, **k: None)
        at.chat_input(key="chat_prompt").set_value("Hello").run()
    assert not at.exception, at.exception
    streamed = _chat_paths(at)
    at.run()
    assert at.session_state["messages"][-1]["done"]
    assert _chat_paths(at) == streamed


def test_compare_draws_its_result_where_it_streamed_and_no_suggestion_stays(env, monkeypatch, demo_with_prompts):
    env.setenv("BITNET_APP_MODEL", demo_with_prompts)  # a model with a prompt file: skill suggestions, with a note
    at = _app()
    at.sidebar.number_input(key="max_new_tokens").set_value(6).run()
    at.segmented_control(key="view").set_value("Compare").run()
    suggested = [p for p, n in _paths(at._tree) if getattr(n, "type", "") == "button"
                 and str(getattr(n, "key", "") or "").startswith("compare_example")]
    assert suggested
    with monkeypatch.context() as patch:
        patch.setattr(st, "rerun", lambda *a, **k: None)
        at.chat_input(key="compare_prompt").set_value("Hello").run()
    assert not at.exception, at.exception
    streamed = _chat_paths(at)
    _nothing_stays(suggested, dict(_paths(at._tree)), "a suggestion")
    at.run()
    assert at.session_state["compare"]["ar"]["done"]
    assert _chat_paths(at) == streamed
    # ... and the next run that streams leaves no part of this result's summary on screen either
    summary = [p for p, n in _paths(at._tree) if getattr(n, "type", "") == "metric"]
    assert summary
    with monkeypatch.context() as patch:
        patch.setattr(st, "rerun", lambda *a, **k: None)
        at.chat_input(key="compare_prompt").set_value("Hello again").run()
    assert not at.exception, at.exception
    _nothing_stays(summary, dict(_paths(at._tree)), "a part of the last summary")


def _nothing_stays(paths, nodes, what) -> None:
    """In the browser an element stays on screen until a run replaces it, and a block (columns, a container) sent
    again keeps its old children until they are replaced: each of `paths` must lie under an element (not a block)
    of the run `nodes` come from, which replaces it whole."""
    for path in paths:
        under = [path[:i] for i in range(2, len(path) + 1)]
        assert any(q in nodes and not isinstance(nodes[q], Block) for q in under), f"{what} stays at {path}"


def test_a_short_reply_is_timed_again_off_screen(env):
    """The demo-sized model writes a reply in milliseconds: one run is too short to time, so the page times it again
    with nothing drawn, until it has about half a second of decoder time, and shows the fastest run."""
    from bitnet_app.ui import timing
    at = _app()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    at.sidebar.number_input(key="max_new_tokens").set_value(12).run()
    msg = _chat(at, "Hello")
    assert msg["stats"]["total_s"] < timing.RETIME_BELOW_S
    t = msg["timing"]
    assert t["runs"] >= timing.MIN_RUNS and t["low"] <= t["tok_s"] == t["high"]
    assert t["runs"] * msg["stats"]["total_s"] >= timing.STEADY_S / 4 or t["runs"] == timing.MAX_RUNS  # ~ steady
    assert t["tokens"] == msg["stats"]["tokens"]  # the same reply
    row = [m.value for m in at.chat_message[1].markdown if "stat-row" in m.value][0]
    assert f"fastest of {t['runs']} runs" in row and f"{stats.rate(t['tok_s'])} tok/s" in row


def test_compare_times_both_again_and_says_why_in_one_sentence(env):
    from bitnet_app.ui import timing
    at = _app()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    at.sidebar.number_input(key="max_new_tokens").set_value(24).run()
    at.segmented_control(key="view").set_value("Compare").run()
    at.chat_input(key="compare_prompt").set_value("Hello").run()
    assert not at.exception, at.exception
    result = at.session_state["compare"]
    runs = result["timing"]["runs"]
    assert runs >= timing.MIN_RUNS
    assert result["ar"]["timing"]["runs"] == result["diffusion"]["timing"]["runs"] == runs
    shown = result["diffusion"]["timing"]["tok_s"] / result["ar"]["timing"]["tok_s"]
    assert abs(result["timing"]["speedup"] - shown) < 1e-9  # the large figure is the ratio of the two shown
    assert any(m.value == f"{result['timing']['speedup']:.2f}×" for m in at.metric)
    sentence = [m.value for m in at.markdown if "Block diffusion was" in m.value]
    assert sentence and "tokens on average" in sentence[0] and "AR tokens" in sentence[0]
    assert any(m.label == "Tokens per step (diffusion)" for m in at.metric)


def test_a_finished_diffusion_reply_keeps_its_picture_without_a_click(env):
    at = _app()
    at.sidebar.radio(key="mode").set_value("diffusion").run()
    at.sidebar.slider(key="temperature").set_value(0.0).run()
    at.sidebar.number_input(key="max_new_tokens").set_value(5).run()
    msg = _chat(at, "Tell me a story")
    bubble = [m.value for m in at.chat_message[1].markdown]
    assert any("bp-final" in v and "Block diffusion writes" in v for v in bubble)  # not inside the Replay expander
    assert sum(len(t) for t, _ in msg["by_step"]) == len(msg["content"])
    end = msg["stats"]["prompt_tokens"] + msg["stats"]["tokens"]
    assert all(f["start"] + len(f["slots"]) <= end for f in msg["steps"])  # nothing past the reply's end


def test_retimed_runs_write_the_same_reply(env, checkpoints):
    """A sampled reply is timed again with the seed the page drew for it: every run writes the same ids."""
    import bitnet_app
    from bitnet_app.decode.events import Done
    from bitnet_app.ui import timing
    model = bitnet_app.load_model(checkpoints["dlm"], threads=1)
    try:
        ids = model.chat_ids([{"role": "user", "content": "Hello"}])
        for mode in ("ar", "diffusion"):
            params = model.decode_params(mode=mode, temperature=0.9, max_new_tokens=10, seed=11)
            first = [ev for ev in model.generate(ids, params) if isinstance(ev, Done)][-1]
            runs = timing.time_again({mode: timing.Job(model, ids, params, first.stats.get("reused_tokens", 0))},
                                     runs=3)[mode]
            assert len(runs) == 3
            assert [r["tokens"] for r in runs] == [first.stats["tokens"]] * 3
            assert [r.get("reused_tokens", 0) for r in runs] == [first.stats.get("reused_tokens", 0)] * 3
    finally:
        model.close()
