"""Session state of the page: the chat, the generation in progress, and the decode settings.

Trap (verified with streamlit 1.67 in Chromium): after the user presses Stop, the script's `finally`
blocks still run, but every read or write of st.session_state in them raises StopException again. So
the generation's bookkeeping lives in plain mutable objects stored in session state (`run`, the
message dicts, the messages list): the code grabs them before streaming and only mutates them after.

A stored message is a plain dict:
    {"role": "user"|"assistant", "content": str,
     # assistant only:
     "mode": "ar"|"diffusion", "stats": dict|None, "stop_reason": str|None, "stopped": bool,
     "trimmed": int (older messages left out to fit the context), "steps": [picture frames] (diffusion)}
"""
import copy

import streamlit as st

from ..params import KNOBS, DecodeParams

# The decode knobs the sidebar shows (their defaults, ranges and help: bitnet_app/params.py).
SIDEBAR_KNOBS = ("mode", "temperature", "top_p", "top_k", "repetition_penalty", "max_new_tokens", "seed",
                 "block_size", "sub_block_size", "threshold", "attention")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer clearly and concisely."

# key -> initial value (decode settings are re-seeded from each model's own defaults when it loads)
DEFAULTS = {
    "messages": [],           # the chat history
    # the generation in progress: {"generating": bool (controls drawn disabled),
    #  "job": None | {"kind": "chat"} | {"kind": "compare", "prompt": str}}
    "run": {"generating": False, "job": None},
    "compare": None,          # the last compare run: {"prompt", "ar": message, "diffusion": message}
    "view": "Chat",
    "system_prompt": DEFAULT_SYSTEM_PROMPT,
    "slow_motion": False,     # chat replies drawn at a watchable pace (small models are faster than the eye)
    "threads": 0,             # 0: all cores
    "defaults_for": None,     # the engine file whose defaults seeded the decode settings
    **{name: KNOBS[name].default for name in SIDEBAR_KNOBS},  # None: the checkpoint's, set by seed_from_model
}


def init() -> None:
    for key, value in DEFAULTS.items():
        if key not in st.session_state:
            st.session_state[key] = copy.deepcopy(value)


def seed_from_model(model, engine_path: str) -> None:
    """Once per loaded model: start the sampler and diffusion knobs from the checkpoint's own values."""
    ss = st.session_state
    if ss.get("defaults_for") == engine_path:
        return
    gen = model.generation_defaults
    ss.temperature = round(float(gen["temperature"]), 2)
    ss.top_p = round(float(gen["top_p"]), 2)
    ss.top_k = int(gen["top_k"])
    ss.repetition_penalty = round(float(gen["repetition_penalty"]), 2)
    diff = model.diffusion_defaults
    ss.block_size = int(diff["block_size"])
    ss.sub_block_size = min(int(diff["sub_block_size"]), ss.block_size)
    ss.threshold = float(diff["threshold"])
    ss.attention = diff["attention"]
    ss.max_new_tokens = min(int(ss.max_new_tokens), max(16, model.context_length // 2))
    ss.defaults_for = engine_path


def decode_params(mode: str | None = None) -> dict:
    """The settings as Model.generate keyword arguments (the knobs that matter for the mode)."""
    ss = st.session_state
    values = {name: ss[name] for name in SIDEBAR_KNOBS}
    values["mode"] = mode or ss.mode
    return DecodeParams.from_kwargs(**values).kwargs()


def run() -> dict:
    """The mutable generation record (safe to mutate in a `finally` after Stop)."""
    return st.session_state.run


def busy(kind: str | None = None) -> bool:
    r = st.session_state.run
    return bool(r["generating"]) and (kind is None or (r["job"] or {}).get("kind") == kind)


def begin(job: dict) -> bool:
    """Flag a generation (from a widget callback, so the run that follows draws every control disabled)."""
    r = st.session_state.run
    if r["generating"]:
        return False
    r["job"], r["generating"] = job, True
    return True


@st.fragment(run_every=1.0)
def resume_watch() -> None:
    """Drawn in a generating run. A Stop ends the run with every control still drawn disabled and no rerun
    follows; this timer notices that the reply has ended and reruns the page, which enables them again."""
    if not st.session_state.run["generating"]:
        st.rerun(scope="app")


def finish(record: dict) -> None:
    """End a generation; `record` is run(), fetched before streaming (no session-state access here)."""
    record["job"], record["generating"] = None, False
