"""The chat: history, streaming replies, Stop that keeps the partial reply, regenerate, diffusion replay."""
import time

import streamlit as st

from ..decode.context import ContextOverflow
from . import block_picture, reply, state, suggestions, timing


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


REPLAY_STEP_S = 0.15  # pause between steps when a replay plays


def _play(key: str) -> None:
    ss = st.session_state
    playing = ss.get(state.REPLAY)
    ss[state.REPLAY] = None if playing and playing["key"] == key else {"key": key, "step": 1}  # Play / Stop


@st.fragment
def _replay(index: int, msg: dict, busy: bool) -> None:
    """The steps of a diffusion reply: a slider picks one; Play walks the slider through them, one fragment
    rerun per step, so the slider always shows the step the picture shows."""
    ss = st.session_state
    frames = msg["steps"]
    n = len(frames)
    key = f"replay_{msg.get('id', index)}"
    playing = ss.get(state.REPLAY)
    playing = playing if playing and playing["key"] == key and not busy else None
    if playing:
        state.put(key, min(playing["step"], n))
    k = min(max(int(state.keep(key, n)), 1), n)
    with st.expander(f"Replay the {n} diffusion steps", icon=":material/slow_motion_video:"):
        pic = st.empty()
        if n > 1:
            left, right = st.columns([4, 1], vertical_alignment="bottom")
            with left:
                k = st.slider("Step", 1, n, key=key, disabled=busy or bool(playing),
                              help="Move through the steps of this reply: each one fills some open places of a block.")
            with right:
                st.button("Stop" if playing else "Play", key=f"play_{key}", on_click=_play, args=(key,),
                          icon=":material/stop:" if playing else ":material/play_arrow:", width="stretch",
                          disabled=busy, help="Replay the steps as they happened, one after another.")
        pic.markdown(block_picture.render(frames[k - 1], caption=f"step {k} of {n}"), unsafe_allow_html=True)
    if playing:
        time.sleep(REPLAY_STEP_S)
        if k < n:
            playing["step"] = k + 1
        else:
            ss[state.REPLAY] = None
        st.rerun(scope="fragment")


def _history(busy: bool, prompts: list[tuple[str, str]]) -> None:
    msgs = st.session_state.messages
    slot = st.empty()  # always drawn, so a streaming run replaces the examples instead of leaving them stale
    if not msgs and not busy:
        with slot.container():
            st.markdown("#### What would you like to ask?")
            suggestions.draw(prompts, _ask, "example")
    for i, m in enumerate(msgs):
        with st.chat_message(m["role"]):
            if m["role"] == "user":
                st.markdown(reply.plain_markdown(m["content"]))  # as typed: *stars* stay stars
                continue
            reply.draw_stored(m)
            if m.get("steps"):
                _replay(i, m, busy)
            actions = st.empty()  # always drawn: while a reply streams, no stale Regenerate stays on an older one
            if i == len(msgs) - 1 and not busy:
                actions.button("Regenerate", on_click=_regenerate, icon=":material/refresh:", type="tertiary",
                               key="regenerate", help="Drop this reply and write a new one for the same question.")


def reply_room(max_new_tokens: int, messages: list[dict]) -> int:
    """The room the history leaves for the next reply: max new tokens, or, once the chat has replies, half as much
    again as the longest one so far (at least MIN_ROOM), whichever is less. Keeping max new tokens free (416 of the
    demo model's 512 positions) would drop the oldest turns of a chat of 110-token times tables from its third reply on,
    for room no reply uses; a reply that does outgrow it stops at the context's end and says so."""
    longest = max((int((m.get("stats") or {}).get("tokens", 0)) for m in messages if m["role"] == "assistant"),
                  default=0)
    return max_new_tokens if not longest else min(max_new_tokens, max(MIN_ROOM, longest * 3 // 2))


MIN_ROOM = 32


def _conversation(model) -> list[dict]:
    system_prompt = state.system_prompt(model)
    convo = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for m in st.session_state.messages:
        if m["role"] == "user" or m.get("content"):
            convo.append({"role": m["role"], "content": m["content"]})
    return convo


def _generate(loaded) -> None:
    """Stream one reply for the last user message (drawn where the history will show it), then time it again off
    screen when it was too short to time once (timing.py). Runs while every control is drawn disabled."""
    model = loaded.model
    record, messages = state.run(), st.session_state.messages  # plain objects: usable after a Stop
    convo = _conversation(model)
    params = state.decode_params(model, seeded=True)  # seeded: a re-timed run writes the same reply
    pacer = reply.Pacer(state.slow_motion_rate())
    msg, view, work = reply.new_message(params.mode, params.attention), None, reply.Work()
    with st.chat_message("assistant"):
        if not loaded.lock.acquire(blocking=False):
            st.warning("The model is busy with a reply in another tab. Try again when it is done.")
            state.finish(record)
            return
        try:
            kept, dropped = model.trim_history(convo, reply_room(params.max_new_tokens, messages))
            if dropped:
                msg["trimmed"] = dropped
                msg["trim_notice"] = (f"The conversation is longer than the model's context ({model.context_length} "
                                      f"tokens): the {dropped} oldest messages were left out of this reply.")
                st.info(msg["trim_notice"], icon=":material/content_cut:")
            messages.append(msg)
            ids = model.chat_ids(kept)
            view = reply.ReplyView(msg, model, prompt_tokens=len(ids), show_picture=params.mode == "diffusion",
                                   paced=pacer.on)
            events = model.generate(ids, params)
            try:
                for beat in reply.beats(work.timed(events), params.mode):
                    for ev in beat:
                        view.apply(ev)
                    view.draw()  # each redraw hands control back to Streamlit (Stop lands here)
                    pacer.wait()
            finally:
                events.close()
            if timing.too_short(msg["stats"]):
                view.note(reply.TIMING_NOTE)
                job = timing.Job(model, ids, params, msg["stats"].get("reused_tokens", 0))
                msg["timing"] = timing.fastest(timing.time_again({"reply": job})["reply"])
        except ContextOverflow as exc:
            msg["error"] = (f"This message is too long for the model ({exc.prompt_tokens} tokens, the context "
                            f"holds {exc.context}). Shorten it, lower “max new tokens”, or clear the chat.")
        except Exception as exc:  # noqa: BLE001 - shown in the chat, the app keeps running
            msg["error"] = reply.failure_text("The reply", exc, partial=bool(msg["content"]))
        finally:  # also after Stop: no session-state access here, only the objects fetched above
            if not msg["done"]:
                msg["stopped"] = not msg.get("error")  # an interrupted reply is kept, marked stopped
                if msg["stopped"] and view is not None:
                    view.stopped(work)  # with the figures of what it wrote
            if not any(m is msg for m in messages):
                messages.append(msg)
            loaded.lock.release()
            state.finish(record)
    st.rerun()


def draw(loaded, prompts: list[tuple[str, str]]) -> None:
    """prompts: the suggestions for an empty chat, [(prompt, kind)] (suggestions.for_folder)."""
    busy = state.busy("chat")
    _history(busy, prompts)
    st.chat_input("Message the model…", key="chat_prompt", submit_mode="stop", on_submit=_submit)
    if busy:
        with st.sidebar:  # not in the page's flow: the reply streams where the history will show it
            state.resume_watch()
        _generate(loaded)
