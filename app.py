"""BitNet chat: `streamlit run app.py`. The page only draws; bitnet_app does the work."""
import os

import streamlit as st

from bitnet_app.ui import (chat_view, compare_view, load_failures, loading, model_choices, page_script, sidebar,
                           state, style, suggestions)

# The favicon is a file the app serves itself: a ":material/...:" or emoji icon is fetched from a CDN.
ICON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "icon.png")
FELL_BACK = "fell_back_for"  # session-state key: the source the last rerun for a fallback was made for
SIDEBAR_PX = 360  # wide enough for the picker's names and sizes (a number: open on a desktop, at this width)
st.set_page_config(page_title="BitNet chat", page_icon=ICON if os.path.isfile(ICON) else None, layout="wide",
                   initial_sidebar_state=SIDEBAR_PX)
style.inject()
page_script.inject()
state.init()
busy = state.busy()

source, about, picker_shows_demo = sidebar.model_picker(busy)
if source is None:
    st.info("Type a Hub repo id (owner/name) or a checkpoint folder in the sidebar to begin.")
    st.stop()
try:  # a Hub model that cannot be downloaded for want of a network opens the bundled demo model instead
    loaded, fell_back = loading.ensure_model_or_demo(source, int(st.session_state.threads))
except loading.LoadFailure as failure:
    load_failures.show_failure(failure, source.label)
if fell_back is not None and not picker_shows_demo and st.session_state.get(FELL_BACK) != source.key:
    st.session_state[FELL_BACK] = source.key  # once per source: a second rerun could only loop
    st.rerun()  # found out just now: once more, so that the picker shows the choice as not downloaded
if picker_shows_demo:
    st.session_state.pop(FELL_BACK, None)
if fell_back is not None:
    load_failures.show_fallback(fell_back, source.label, busy)
running = model_choices.demo_source() if fell_back is not None else source  # the model that actually runs
model_label = running.label

model = loaded.model
if st.session_state.get("engine_path") != loaded.path:  # another model: free the compare view's second engine
    loading.load_compare_engine.clear()
    st.session_state.engine_path = loaded.path
state.seed_from_model(model, loaded.path)
sidebar.settings(model, busy)
sidebar.chat_actions(model, model_label, busy)
sidebar.describe_running(about, running, source if fell_back is not None else None, model)
sidebar.model_info(model, model_label)
if not model.info()["isa_simd"]:  # the portable path
    st.warning("This CPU has no AVX2, so the engine runs its portable C kernels: replies will be slow.",
               icon=":material/speed:")

view = st.segmented_control("View", ["Chat", "Compare"], key="view", disabled=busy, required=True,
                            label_visibility="collapsed")
prompts = suggestions.for_folder(model_choices.folder_of(running))
if view == "Compare":
    compare_view.draw(loaded, lambda: loading.load_compare_engine(loaded.path, int(st.session_state.threads),
                                                                  loading.kv_setting()), prompts)
else:
    chat_view.draw(loaded, prompts)
