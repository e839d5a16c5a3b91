"""The chat: history, streaming replies, Stop that keeps the partial reply, regenerate, diffusion replay."""
import time

import streamlit as st

from ..decode.context import ContextOverflow
from . import block_picture, reply, state

EXAMPLES = ["Explain in two sentences what a 1.58-bit model is.",
            "Write a short poem about a fast little CPU.",
            "Give me three tips for a great live demo."]


def _ask(text: str) -> None:
    if text and text.strip() and state.begin({"kind": "chat"}):
        st.session_state.messages.append({"role": "user", "content": text.strip()})


def _submit() -> None:
    _ask(st.session_state.get("chat_prompt") or "")


def _regenerate() -> None:
    msgs = st.session_state.messages
    while msgs and msgs[-1]["role"] == "assistant":
        msgs.pop()
    if msgs:
        state.begin({"kind": "chat"})


@st.fragment
def _replay(index: int, msg: dict, busy: bool) -> None:
    frames = msg["steps"]
    with st.expander(f"Replay the {len(frames)} diffusion steps", icon=":material/slow_motion_video:"):
        pic = st.empty()
        if len(frames) > 1:
            left, right = st.columns([4, 1], vertical_alignment="bottom")
            with left:
                k = st.slider("Step", 1, len(frames), len(frames), key=f"replay_{index}", disabled=busy,
                              help="Move through the forwards of this reply: each one fills some masked slots.")
            with right:
                play = st.button("Play", key=f"play_{index}", icon=":material/play_arrow:", width="stretch",
                                 disabled=busy, help="Replay the steps as they happened.")
        else:
            k, play = 1, False
        if play:
            for j, frame in enumerate(frames, 1):
                pic.markdown(block_picture.render(frame, caption=f"step {j} of {len(frames)}"),
                             unsafe_allow_html=True)
                time.sleep(0.15)
        else:
            pic.markdown(block_picture.render(frames[k - 1], caption=f"step {k} of {len(frames)}"),
                         unsafe_allow_html=True)


def _history(busy: bool) -> None:
    msgs = st.session_state.messages
    slot = st.empty()  # always drawn, so a streaming run replaces the examples instead of leaving them stale
    if not msgs and not busy:
        with slot.container():
            st.markdown("#### What would you like to ask?")
            cols = st.columns(len(EXAMPLES))
            for col, text in zip(cols, EXAMPLES):
                col.button(text, on_click=_ask, args=(text,), width="stretch", key=f"example_{text[:12]}")
    for i, m in enumerate(msgs):
        with st.chat_message(m["role"]):
            if m["role"] == "user":
                st.markdown(m["content"])
                continue
            reply.draw_stored(m)
            if m.get("steps"):
                _replay(i, m, busy)
            if i == len(msgs) - 1 and not busy:
                st.button("Regenerate", on_click=_regenerate, icon=":material/refresh:", type="tertiary",
                          key="regenerate", help="Drop this reply and write a new one for the same question.")


def _conversation() -> list[dict]:
    ss = st.session_state
    convo = [{"role": "system", "content": ss.system_prompt.strip()}] if ss.system_prompt.strip() else []
    for m in ss.messages:
        if m["role"] == "user" or m.get("content"):
            convo.append({"role": m["role"], "content": m["content"]})
    return convo


def _generate(loaded) -> None:
    """Stream one reply for the last user message. Runs while every control is drawn disabled."""
    model = loaded.model
    record, messages = state.run(), st.session_state.messages  # plain objects: usable after a Stop
    convo = _conversation()
    params = state.decode_params()
    msg = reply.new_message(params["mode"])
    with st.chat_message("assistant"):
        if not loaded.lock.acquire(blocking=False):
            st.warning("The model is busy with a reply in another tab. Try again when it is done.")
            state.finish(record)
            return
        try:
            kept, dropped = model.trim_history(convo, params["max_new_tokens"])
            if dropped:
                msg["trimmed"] = dropped
                msg["trim_notice"] = (f"The conversation is longer than the model's context ({model.context_length} "
                                      f"tokens): the {dropped} oldest messages were left out of this reply.")
                st.info(msg["trim_notice"], icon=":material/content_cut:")
            messages.append(msg)
            ids = model.chat_ids(kept)
            view = reply.ReplyView(msg, model, show_picture=params["mode"] == "diffusion",
                                   pause_s=reply.SLOW_MOTION_S if st.session_state.slow_motion else 0.0)
            events = model.generate(ids, **params)
            try:
                for ev in events:
                    view.apply(ev)  # each redraw hands control back to Streamlit (Stop lands here)
            finally:
                events.close()
        except ContextOverflow as exc:
            msg["error"] = (f"This message is too long for the model ({exc.prompt_tokens} tokens, the context "
                            f"holds {exc.context}). Shorten it, lower “max new tokens”, or clear the chat.")
        except Exception as exc:  # noqa: BLE001 - shown in the chat, the app keeps running
            msg["error"] = f"The reply failed: {exc}"
        finally:  # also after Stop: no session-state access here, only the objects fetched above
            if not msg["done"]:
                msg["stopped"] = not msg.get("error")  # an interrupted reply is kept, marked stopped
            if not any(m is msg for m in messages):
                messages.append(msg)
            loaded.lock.release()
            state.finish(record)
    st.rerun()


def draw(loaded) -> None:
    busy = state.busy("chat")
    _history(busy)
    st.chat_input("Message the model…", key="chat_prompt", submit_mode="stop", on_submit=_submit)
    if busy:
        state.resume_watch()
        _generate(loaded)
