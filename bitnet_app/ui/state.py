"""Session state of the page: the chat, the generation in progress, and the decode settings.

Trap (verified with streamlit 1.67 in Chromium): after the user presses Stop, the script's `finally`
blocks still run, but every read or write of st.session_state in them raises StopException again. So
the generation's bookkeeping lives in plain mutable objects stored in session state (`run`, the
message dicts, the messages list): the code grabs them before streaming and only mutates them after.

A stored message is a plain dict:
    {"role": "user"|"assistant", "content": str,
     # assistant only: "id": a short unique string (keys of its widgets),
     "mode": "ar"|"diffusion", "stats": dict|None, "stop_reason": str|None, "stopped": bool,
     "trimmed": int (older messages left out to fit the context), "steps": [picture frames] (diffusion)}
"""
import copy
import secrets

import streamlit as st

from ..params import KNOBS, SECTIONS, sidebar_knobs

# The decode knobs the sidebar shows: those with a sidebar section in bitnet_app/params.py (defaults, ranges, help).
SETTING_KNOBS = [name for section in SECTIONS for name in sidebar_knobs(section)]
# The knobs a newly loaded model leaves as the user set them; every other one starts from the model's own values.
KEPT_ACROSS_MODELS = ("mode", "seed", "max_new_tokens")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer clearly and concisely."
PAGE_MAX_NEW_TOKENS = 512  # the page's longest reply (the CLI's is params' 256): the demo model's count to 100 is
                           # about 390 tokens, and a chat reply cut at 256 reads as a broken model
PROMPT_ROOM = 96           # the context a question keeps free when a model's own limit lowers max new tokens

# key -> initial value of the page's own state (never a widget key)
DEFAULTS = {
    "messages": [],           # the chat history
    # the generation in progress: {"generating": bool (controls drawn disabled),
    #  "job": None | {"kind": "chat"} | {"kind": "compare", "prompt": str}}
    "run": {"generating": False, "job": None},
    "compare": None,          # the last compare run: {"prompt", "ar": message, "diffusion": message}
    "defaults_for": None,     # the engine file whose defaults seeded the decode settings
}

# Widget key -> initial value: every setting a sidebar or page widget edits (the decode settings are re-seeded
# from each model's own defaults when it loads). See init() for why they are kept twice.
SETTINGS = {
    "model_choice": None,     # None: the picker chooses its default before drawing
    "custom_source": "",
    "threads": 0,             # 0: all cores
    "kv_cache": "f16",        # the engine's KV cache: "f16", or "i8" (half the bytes, for long conversations)
    "view": "Chat",
    "system_prompt": DEFAULT_SYSTEM_PROMPT,
    "slow_motion": False,     # replies drawn at a watchable pace (small models are faster than the eye)
    "slow_motion_rate": 4,    # ... in steps per second (a token in AR, a pass filling slots in diffusion): an audience
                              # reads along: the demo model's 8 times table is 15 steps (4 s) in diffusion, 109 in AR
    **{name: KNOBS[name].default for name in SETTING_KNOBS},  # None: the checkpoint's, set by seed_from_model
    "max_new_tokens": PAGE_MAX_NEW_TOKENS,
}
SAVED = "saved_settings"      # the session-state key of the plain dict that keeps SETTINGS' values
REPLAY = "replay_playing"     # {"key": the replay slider's key, "step": the step to show next} while one plays


def init() -> None:
    """Start of every full run: the page's state, and every setting handed to its widget before it is drawn.

    Streamlit forgets a widget's value after any run that does not draw it (an error page, the picker's
    "another model" with nothing typed yet, the other view). The browser then redraws the widget at its own
    default, a slider's or number's minimum, and sends that back with the next interaction: Max new tokens 1,
    Temperature 0, a one-token reply. So each setting also lives in a plain dict that Streamlit never drops,
    and every run first takes the widget's latest value into it (when the widget has one), then gives the
    widget its value from it (Streamlit's pattern for widget values that outlive their widget)."""
    ss = st.session_state
    for key, value in DEFAULTS.items():
        if key not in ss:
            ss[key] = copy.deepcopy(value)
    if SAVED not in ss:
        ss[SAVED] = dict(SETTINGS)
    for key, value in SETTINGS.items():
        keep(key, value)
    ss[REPLAY] = None  # a replay plays on in its own fragment's reruns only: any full run stops it


def keep(key: str, default):
    """Take widget `key`'s latest value into the saved settings (when it has one), then hand it back to the
    widget before it is drawn; `default` when there is none yet. Returns the value (see init)."""
    ss = st.session_state
    saved = ss[SAVED]
    if key in ss:
        saved[key] = ss[key]  # the user's last edit, or a callback's
    elif key not in saved:
        saved[key] = default
    ss[key] = saved[key]  # None too: an empty number input (a random seed), or no model chosen yet
    return saved[key]


def put(key: str, value) -> None:
    """Change a setting (or any widget kept with keep) from code, before its widget is drawn in this run."""
    st.session_state[key] = st.session_state[SAVED][key] = value


def seed_from_model(model, engine_path: str) -> None:
    """Once per loaded model: start the decode settings from the checkpoint's own (Model.suggested_params: its
    sampling and diffusion values, resolved), except those the user keeps across models; max new tokens is
    only lowered, to what the model's context leaves a question (reply_limit)."""
    ss = st.session_state
    if ss.get("defaults_for") == engine_path:
        return
    start = model.suggested_params()
    for name in SETTING_KNOBS:
        if name not in KEPT_ACROSS_MODELS:
            value = getattr(start, name)
            put(name, round(value, 2) if isinstance(value, float) else value)  # as a slider shows it
    put("max_new_tokens", min(int(ss.max_new_tokens), reply_limit(model.context_length)))
    ss.defaults_for = engine_path


def reply_limit(context: int) -> int:
    """The most new tokens the page asks of a model with this context: all but PROMPT_ROOM positions (half of
    a small context): 416 of the demo model's 512, room for its count to 100; 160 of a 256-token test model."""
    return max(16, context // 2, context - PROMPT_ROOM)


def first_max_new_tokens(context: int) -> int:
    """Max new tokens on a fresh page once a model with this context is loaded (seed_from_model from SETTINGS)."""
    return min(PAGE_MAX_NEW_TOKENS, reply_limit(context))


def uses_system_prompt(model) -> bool:
    """Whether the model's chat template puts a system message into the prompt at all (some drop it)."""
    user = [{"role": "user", "content": "Hello"}]
    probe = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}]
    return model.chat_ids(probe + user) != model.chat_ids(user)


def system_prompt(model) -> str:
    """The system prompt the model reads: the sidebar's, or "" when its chat template ignores system messages
    (so it is neither shown as in use nor exported)."""
    text = str(st.session_state.system_prompt or "").strip()
    return text if text and uses_system_prompt(model) else ""


def decode_params(model, mode: str | None = None, *, seeded: bool = False):
    """The page's DecodeParams for `model`: the sidebar's settings (`mode` instead of the sidebar's, when
    given), checked and resolved by Model.decode_params, the one object Model.generate takes. seeded: for a reply,
    with a seed drawn now when the sidebar leaves it empty, so that the reply can be run again off screen, the same
    ids, to time it (each reply still draws afresh)."""
    ss = st.session_state
    values = {name: ss[name] for name in SETTING_KNOBS}
    values["mode"] = mode or ss.mode
    if seeded and values["seed"] is None:
        values["seed"] = fresh_seed()
    return model.decode_params(**values)


def fresh_seed() -> int:
    return secrets.randbelow(2**31)


def slow_motion_rate() -> float | None:
    """Steps per second while Slow motion is on, else None (as fast as the decoder goes)."""
    ss = st.session_state
    return float(ss.slow_motion_rate) if ss.slow_motion else None


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
