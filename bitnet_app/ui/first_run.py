"""The page shown when a model cannot be opened: what happened, in words, and what to do next."""
import streamlit as st

from . import jobs
from .sources import CUSTOM_LABEL, DEMO_LABEL, demo_available

TITLES = {
    "offline": "You are offline, and this model is not on this computer yet",
    "network": "The Hugging Face Hub cannot be reached",
    "not_found": "That model was not found",
    "gated": "That model needs a Hugging Face login",
    "not_bitnet": "That is not a BitNet model",
    "disk_full": "Not enough disk space",
    "bad_checkpoint": "That checkpoint cannot be used",
    "error": "Something went wrong while opening the model",
}


def _use_demo():
    st.session_state.model_choice = DEMO_LABEL
    jobs.forget_failed()


def _retry():
    jobs.forget_failed()


def _use_folder():
    folder = st.session_state.get("error_folder", "").strip()
    if folder:
        st.session_state.model_choice = CUSTOM_LABEL
        st.session_state.custom_source = folder
        jobs.forget_failed()


def show_failure(failure, source_label: str) -> None:
    """Draw the explanation with buttons for each way out, then end this run."""
    kind = failure.kind if failure.kind in TITLES else "error"
    st.markdown(f"### {TITLES[kind]}")
    st.error(str(failure), icon=":material/error:")
    st.markdown("**What you can do**")
    cols = st.columns(3)
    offer_demo = demo_available() and source_label != DEMO_LABEL
    with cols[0]:
        st.button("Use the bundled demo model", on_click=_use_demo, disabled=not offer_demo, type="primary",
                  icon=":material/offline_bolt:", width="stretch", key="err_demo",
                  help="A tiny model that ships with the app and needs no network." if offer_demo
                  else "The demo model is not bundled with this copy of the app.")
    with cols[1]:
        st.button("Retry", on_click=_retry, icon=":material/refresh:", width="stretch", key="err_retry",
                  help="Try again, for example after reconnecting or freeing disk space.")
    with cols[2]:
        st.text_input("Or open a checkpoint folder on this computer", key="error_folder",
                      placeholder="/path/to/checkpoint", on_change=_use_folder,
                      help="A Hugging Face BitNet folder with config.json, tokenizer.json and *.safetensors.")
    if kind == "gated":
        st.caption("Log in once with `hf auth login` (or set the HF_TOKEN environment variable), then retry.")
    if failure.trace:
        with st.expander("Technical details"):
            st.code(failure.trace, language="text")
    st.stop()
