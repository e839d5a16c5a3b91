"""Load failures: when a model cannot be opened, what happened, in words, and what to do next.

show_failure: a page of its own (no model). show_fallback: the notice above the chat when the chosen Hub
model could not be downloaded for want of a network and the demo model was opened instead.
"""
import time

import streamlit as st

from . import jobs
from .model_choices import CUSTOM_LABEL, DEMO_LABEL, OPEN_PICKER, demo_available

RETRIED = "retried"  # session-state key: {"label": the model retried, "at": "HH:MM:SS"} after a Retry button

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


def _retry(label: str):
    """Forget the failure so this run tries again, and note when, so the page can say the retry happened."""
    st.session_state[RETRIED] = {"label": label, "at": time.strftime("%H:%M:%S")}
    jobs.forget_failed()


def _retry_note(label: str, outcome: str) -> None:
    note = st.session_state.get(RETRIED)
    if note and note["label"] == label:
        st.caption(f":material/history: Tried again at {note['at']}: {outcome}")


def _pick_another():
    """Open the model picker's list (the next run does, see model_choices.OPEN_PICKER)."""
    st.session_state[OPEN_PICKER] = True


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
    _retry_note(source_label, "it failed again, as explained above.")
    st.markdown("**What you can do**")
    cols = st.columns(3)
    offer_demo = demo_available() and source_label != DEMO_LABEL
    with cols[0]:
        st.button(f"Use the {DEMO_LABEL}", on_click=_use_demo, disabled=not offer_demo, type="primary",
                  icon=":material/offline_bolt:", width="stretch", key="err_demo",
                  help="A tiny model that ships with the app and needs no network." if offer_demo
                  else "The demo model is not bundled with this copy of the app.")
    with cols[1]:
        if kind == "offline":
            st.caption(OFFLINE_WAY_OUT)
        else:
            st.button("Retry", on_click=_retry, args=(source_label,), icon=":material/refresh:", width="stretch",
                      key="err_retry", help="Try again, for example after reconnecting or freeing disk space.")
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


OFFLINE_WAY_OUT = ("Offline mode is on (HF_HUB_OFFLINE=1), so a retry cannot download: start the app without it "
                   "to download this model.")

FALLBACK_REASONS = {
    "offline": "offline mode is on (HF_HUB_OFFLINE) and it is not on this computer yet",
    "network": "the Hugging Face Hub cannot be reached (no network connection, or the Hub is down)",
}


def show_fallback(failure, wanted_label: str, busy: bool) -> None:
    """The notice at the top of the page while the demo model stands in for `wanted_label` (its buttons are
    drawn disabled while a reply streams)."""
    reason = FALLBACK_REASONS.get(failure.kind, FALLBACK_REASONS["network"])
    with st.container(border=True, key="fallback_notice"):
        st.warning(f"**{wanted_label} could not be downloaded:** {reason}. The {DEMO_LABEL} runs instead (the "
                   f"sidebar says what it is).", icon=":material/cloud_off:")
        _retry_note(wanted_label, "still out of reach, so the demo model stays.")
        row = st.container(horizontal=True, vertical_alignment="center")
        if failure.kind != "offline":  # offline mode is a setting of this process: a retry cannot succeed
            row.button("Retry the download", on_click=_retry, args=(wanted_label,), icon=":material/refresh:",
                       key="fallback_retry",
                       disabled=busy, help=f"Try to download {wanted_label} again, for example after reconnecting.")
        row.button(f"Keep the {DEMO_LABEL}", on_click=_use_demo, icon=":material/offline_bolt:", key="fallback_keep",
                   disabled=busy, help="Choose the demo model in the picker, and hide this notice.")
        row.button("Pick another model", on_click=_pick_another, icon=":material/swap_horiz:", key="fallback_other",
                   disabled=busy, help="Open the model list in the sidebar: a model already on this computer, or "
                                       "another Hub repo id or checkpoint folder.")
        if failure.kind == "offline":
            row.caption(OFFLINE_WAY_OUT)
        with row.popover("Details", icon=":material/info:"):
            st.caption(str(failure))
