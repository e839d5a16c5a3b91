"""The sidebar: model picker, decode mode and settings (each with one line of help), chat actions, model info.

Every control is drawn disabled while a reply streams: changing a widget would rerun the page and cut
the reply off.
"""
import os
import time

import streamlit as st

from .. import catalog
from ..params import KNOBS, default_threshold, problem, sidebar_knobs
from ..units import format_bytes
from . import export, loading, model_choices, page_script, state


def _clear_chat() -> None:
    st.session_state.messages = []


_ROOF: dict = {}  # threads -> (GB/s or None, "HH:MM:SS" when measured): this process's last measurement
NEEDS_KEY = "needs_open"  # the "What each model needs here" expander's open state (its widget key)


def read_roof(threads: int, *, again: bool = False) -> tuple[float | None, str]:
    """The read roof of this machine (catalog.read_roof_gb_s) and the time it was measured: the last measurement of
    this process, or a new one (the first time, or again: when the table opens, since a figure taken while the
    machine was busy understates it). None when it cannot be measured."""
    if again or threads not in _ROOF:
        try:
            gb_s = catalog.read_roof_gb_s(threads)
        except (MemoryError, ValueError, ImportError):
            gb_s = None
        _ROOF[threads] = (gb_s, time.strftime("%H:%M:%S"))
    return _ROOF[threads]


def _measure_again() -> None:
    if st.session_state.get(NEEDS_KEY):  # opened (not closed)
        read_roof(_threads(), again=True)


def _threads() -> int:
    return int(st.session_state.get("threads") or 0) or (os.cpu_count() or 1)


def catalog_table(roof_gb_s: float | None, free: int | None = None, measured_at: str = "") -> str:
    """Markdown: every model the picker knows by name, with what it needs on this computer (one line each: the
    sidebar is too narrow for a table); free: the memory free now (catalog.available_ram() when not given);
    measured_at: when the read roof was measured ("HH:MM:SS")."""
    free = catalog.available_ram() if free is None else free
    rows, warned = [], False
    for e in catalog.ENTRIES.values():
        n = catalog.needs(e, roof_gb_s)
        over = bool(free) and n.memory_bytes > free
        warned = warned or over
        mem = f"{format_bytes(n.memory_bytes)} memory" + (" ⚠" if over else "")
        speed = f" · ≤ {n.expected_tok_s:.0f} tok/s" if n.expected_tok_s else ""
        base = " (base model)" if not e.chat else ""
        rows.append(f"- **{e.repo}**{base}: {format_bytes(n.download_bytes)} download · {mem}{speed}")
    when = f"measured at {measured_at}, when this list was opened" if measured_at else "measured now"
    note = (f"Speeds are ceilings: the bytes each token reads against this computer's read roof, "
            f"{roof_gb_s:.0f} GB/s ({when}; a busy computer reads slower); the engine reaches about 70-80% of it."
            if roof_gb_s else
            "The read roof could not be measured, so no speeds are shown.")
    warn = f" ⚠: more than the {format_bytes(free)} of memory free now." if warned else ""  # only with a ⚠ row
    return "\n".join(rows) + "\n\n" + note + warn


def model_picker(busy: bool):
    """The model choice (drawn before loading, so a failed load can still be switched): known models with their
    download size, and, when the demo model runs in place of the chosen Hub model (out of reach, found by an earlier
    run), that choice shown as not downloaded. Returns (the chosen Source or None, a placeholder under the picker for
    describe_running, whether the picker shows the demo model standing in)."""
    ss = st.session_state
    with st.sidebar:
        st.markdown("## BitNet chat")
        st.caption("1.58-bit language models, on your CPU.")
        options = model_choices.choices()
        if ss.get("model_choice") not in options:
            state.put("model_choice", model_choices.default_choice() if model_choices.default_choice() in options
                      else options[0])
        chosen = ss.model_choice
        stand_in = loading.demo_stands_in(model_choices.resolve(chosen, ss.get("custom_source") or "")) is not None
        label = st.selectbox("Model", options, key="model_choice", disabled=busy,
                             format_func=lambda o: model_choices.picker_label(
                                 o, not_downloaded=stand_in and o == chosen and o != model_choices.CUSTOM_LABEL),
                             help="A Hugging Face repo (downloaded and converted once; its download size shown), "
                                  f"the {model_choices.DEMO_LABEL} (bundled, runs offline), or a checkpoint folder "
                                  "on this computer.")
        if ss.pop(model_choices.OPEN_PICKER, False):
            page_script.open_model_picker()
        about = st.empty()  # filled once the model runs: the chosen one, or the demo model standing in for it
        custom = ""
        if label == model_choices.CUSTOM_LABEL:
            custom = st.text_input("Hub repo id or folder", key="custom_source", disabled=busy,
                                   placeholder="owner/name or /path/to/checkpoint",
                                   help="Any BitNet b1.58 checkpoint: a Hub repo id, or a local folder with "
                                        "config.json, tokenizer.json and *.safetensors.")
        cores = max(1, os.cpu_count() or 1)
        st.selectbox("CPU threads", list(range(cores + 1)), key="threads", disabled=busy,
                     format_func=lambda t: f"auto (all {cores} cores; 1 for a small model)" if t == 0 else str(t),
                     help="Threads for the engine; auto uses every core, and one for a model of a few MB (the demo "
                          "model), whose steps are too short to share: its speed figures hold better on one. "
                          "Changing it reloads the model.")
        st.selectbox("KV cache", ["f16", "i8"], key="kv_cache", disabled=busy,
                     format_func=lambda kv: {"f16": "fp16", "i8": "int8 (half the memory)"}[kv],
                     help="How the engine keeps the conversation's keys and values: fp16, or int8 with a scale "
                          "per head and position (half the bytes: faster deep into a long conversation, logits "
                          "within ~1% of fp16's). Changing it reloads the model.")
        source = model_choices.resolve(label, custom)
        if source is not None:  # until a model runs (describe_running)
            about.caption(model_choices.describe(source, read_roof(_threads())[0]))
        with st.expander("What each model needs here", icon=":material/speed:", key=NEEDS_KEY,
                         on_change=_measure_again):
            roof, measured_at = read_roof(_threads())
            st.markdown(catalog_table(roof, measured_at=measured_at))
        return source, about, stand_in


def describe_running(about, running, wanted, model) -> None:
    """Under the picker: the model that is actually running (`running`, a Source), and when the demo model
    stands in for the chosen one, which (`wanted`, a Source, else None)."""
    params = _count(int(model.info()["parameters"]))
    lines = [f"Running **{running.label}** · {params} parameters", model_choices.describe(running, read_roof(_threads())[0])]
    if wanted is not None:
        lines.insert(0, f"{wanted.label} is not downloaded: the {model_choices.DEMO_LABEL} runs instead.")
    about.caption("  \n".join(lines))


# sidebar section (bitnet_app/params.py SECTIONS) -> the expander it is drawn in: title, icon
EXPANDERS = {"sampling": ("Sampling", ":material/tune:"), "diffusion": ("Block diffusion", ":material/grid_view:")}


def settings(model, busy: bool) -> None:
    """The decode settings: every knob that params.py places on the sidebar, section by section."""
    ss = st.session_state
    limits = {"max_new_tokens": dict(high=max(1, model.context_length - 1))}  # what only the model knows
    notes = fit_settings(model)
    with st.sidebar:
        st.divider()
        for note in notes.values():
            st.toast(note, icon=":material/tune:")
        for name in sidebar_knobs("top"):
            _knob(name, busy, **limits.get(name, {}))
        st.toggle("Slow motion", key="slow_motion", disabled=busy,
                  help="Draw replies, in Chat and in Compare, at a pace people can follow: small models write faster "
                       "than the eye. The speed figures stay the decoder's own.")
        if ss.slow_motion:
            st.slider("Steps per second", 1, 30, key="slow_motion_rate", disabled=busy,
                      help="How many steps Slow motion draws per second. A step is one token in autoregressive mode "
                           "and one pass of the model, filling several tokens, in block diffusion; in Compare both "
                           "sides take one step at a time.")
        if ss.mode == "diffusion" and not model.trained_for_diffusion:
            st.info("This checkpoint was not trained for block diffusion: it still runs (causal pattern, "
                    "leftmost slot first) but expect about one token per step and AR speed.",
                    icon=":material/info:")
        for section, (title, icon) in EXPANDERS.items():
            with st.expander(title, expanded=section == "sampling" or ss.mode == section, icon=icon):
                for name in sidebar_knobs(section):
                    _knob(name, busy, **limits.get(name, {}), **_follows(name, model))
                    if name in notes:
                        st.info(notes[name], icon=":material/tune:")
        if model.completion:
            st.info("This is a base model with no chat template: it runs as **completion**. It continues the "
                    "text you write rather than answering it, so start the text you want it to go on with.",
                    icon=":material/edit_note:")
        elif state.uses_system_prompt(model):
            st.text_area("System prompt", key="system_prompt", height=90, disabled=busy,
                         help="Instructions the model reads before the conversation.")
        else:
            st.caption("This model's chat template has no place for a system prompt, so it takes none.")


def _follows(name: str, model) -> dict:
    """Widget keywords that make other settings follow this one: a new fill rule starts from its own threshold
    (params.default_threshold: the exact rule drafts lower than the threshold rule keeps)."""
    if name != "fill_rule":
        return {}
    return {"on_change": lambda: state.put("threshold", default_threshold(st.session_state.fill_rule,
                                                                          model.diffusion_defaults["threshold"]))}


def _options(name: str, current=None) -> tuple:
    """The values a select box offers: its list, plus a number the checkpoint itself suggests that the list lacks
    (a model trained with blocks of 12 shows 12, and its sub-block 6), in order."""
    meta = KNOBS[name].metadata
    options = tuple(meta["ui"].get("options") or meta["choices"])
    if isinstance(current, int) and not isinstance(current, bool) and options and current not in options:
        options = tuple(sorted(options + (current,)))
    return options


def _shown(name: str, value) -> str:
    labels = KNOBS[name].metadata["ui"].get("labels") or {}
    return str(labels.get(value, value))


def fit_settings(model) -> dict[str, str]:
    """Before any widget is drawn: each choice that does not go with the others (params.problem, e.g. the exact fill
    rule under block attention, a sub-block larger than the block) is replaced by the nearest one that does, in the
    sidebar's order, and what follows it follows too (the threshold of a new fill rule). Returns knob -> the
    sentence that says what changed and why, drawn under its widget. Adjusting here, not while drawing, keeps every widget's value fixed once it is
    drawn (Streamlit refuses a change to a widget already on the page)."""
    ss = st.session_state
    notes = {}
    for name in state.SETTING_KNOBS:
        value = ss.get(name)
        options = _options(name, value)
        if not options or value not in options:
            continue
        values = {n: ss.get(n) for n in KNOBS}
        why = problem(name, value, values)
        allowed = [o for o in options if not problem(name, o, values)]
        if not why or not allowed:
            continue
        new = min(allowed, key=lambda o: abs(o - value)) if isinstance(value, int) else allowed[0]
        state.put(name, new)
        if name == "fill_rule":
            state.put("threshold", default_threshold(new, model.diffusion_defaults["threshold"]))
        label = KNOBS[name].metadata["label"]
        notes[name] = (f"{label} is now {_shown(name, new)}: {_shown(name, value)} does not go with the other "
                       f"settings ({why})")
    return notes


def _knob(name: str, busy: bool, on_change=None, **ui) -> None:
    """The widget of one decode knob, from its DecodeParams metadata (label, help, range; `ui` overrides
    the widget hints, e.g. a model-dependent maximum). A choice that does not go with the other settings
    (params.problem) is not offered, and a caption says which and why."""
    meta = KNOBS[name].metadata
    ui = {**meta["ui"], **ui}
    common = dict(key=name, disabled=busy, help=meta["help"], on_change=on_change)
    widget = ui.get("widget") or "select"
    if widget == "slider":
        st.slider(meta["label"], ui["low"], ui["high"], step=ui["step"], **common)
    elif widget == "number":
        st.number_input(meta["label"], min_value=meta["low"], max_value=ui.get("high"), step=ui["step"],
                        placeholder=ui.get("placeholder"), **common)
    else:
        options = _options(name, st.session_state.get(name))
        settings = {n: st.session_state.get(n) for n in KNOBS}
        why_not = {o: problem(name, o, settings) for o in options}
        allowed = [o for o in options if not why_not[o]]  # fit_settings made the current value one of these
        labels = ui.get("labels") or {}
        draw = st.radio if widget == "radio" else st.selectbox
        draw(meta["label"], allowed, format_func=lambda o: labels.get(o, str(o)), **common,
             **({"horizontal": True} if widget == "radio" else {}))
        left_out = [o for o in options if why_not[o]]
        if left_out:  # said once, with the reason of the first (they share it)
            st.caption(f"Not offered with these settings: {', '.join(_shown(name, o) for o in left_out)} "
                       f"({why_not[left_out[0]]})")


def chat_actions(model, model_label: str, busy: bool) -> None:
    ss = st.session_state
    system_prompt = state.system_prompt(model)
    with st.sidebar:
        st.divider()
        st.button("Clear chat", on_click=_clear_chat, disabled=busy or not ss.messages, icon=":material/delete:",
                  width="stretch", help="Start a new conversation (the model stays loaded).")
        c1, c2 = st.columns(2)
        msgs = [m for m in ss.messages if m["role"] in ("user", "assistant")]
        c1.download_button("Markdown", export.to_markdown(msgs, system_prompt=system_prompt, model=model_label),
                           file_name="bitnet-chat.md", mime="text/markdown", on_click="ignore",
                           disabled=busy or not msgs, icon=":material/download:", width="stretch",
                           help="Save the chat as a Markdown file.")
        c2.download_button("JSON", export.to_json(msgs, system_prompt=system_prompt, model=model_label,
                                                  settings=state.decode_params(model).kwargs()),
                           file_name="bitnet-chat.json", mime="application/json", on_click="ignore",
                           disabled=busy or not msgs, icon=":material/data_object:", width="stretch",
                           help="Save the chat with its settings and figures as JSON.")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.0f} K"


def model_info(model, label: str) -> None:
    info = model.info()
    with st.sidebar:
        with st.expander("Model info", icon=":material/memory:"):
            rows = [("Model", label), ("Parameters", _count(int(info["parameters"]))),
                    ("Model file", format_bytes(int(info["file_bytes"]))),
                    ("Kernel path", info["isa_label"]), ("Threads", str(info.get("threads"))),
                    ("KV cache", str(info.get("kv"))),
                    ("Context", f"{info.get('context')} tokens"),
                    ("RAM", f"{format_bytes(info['rss_bytes'])} used of {format_bytes(info['ram_bytes'])}"),
                    ("Diffusion-trained", "yes" if info.get("trained_for_diffusion") else "no")]
            st.markdown("\n".join(f"- **{k}:** {v}" for k, v in rows))
            st.caption(os.path.basename(str(info.get("path", ""))))
