"""AR and block diffusion on one prompt, side by side, decoded alternately in one loop (fair timings)."""
import difflib

import streamlit as st

from . import reply, state, suggestions
from .stats import MODE_LABELS

MODES = ("ar", "diffusion")
TPF_NOTE = ("**Tokens per forward**: how many tokens one pass of the model settles on average. Autoregressive: "
            "always 1; block diffusion: every slot it is sure enough of, so more per pass means fewer passes.")


def _ask(text: str) -> None:
    if text and text.strip():
        state.begin({"kind": "compare", "prompt": text.strip()})


def _submit() -> None:
    _ask(st.session_state.get("compare_prompt") or "")


def summary(ar: dict, diff: dict) -> dict:
    """Speedup of diffusion over AR, tokens per forward of each, and whether the texts agree."""
    sa, sd = ar.get("stats") or {}, diff.get("stats") or {}
    out = {"speedup": None, "ar_tpf": sa.get("tokens_per_forward"), "diffusion_tpf": sd.get("tokens_per_forward"),
           "identical": ar.get("content", "") == diff.get("content", ""),
           "similarity": difflib.SequenceMatcher(None, ar.get("content", ""), diff.get("content", "")).ratio()}
    if sa.get("tok_s") and sd.get("tok_s"):
        out["speedup"] = float(sd["tok_s"]) / float(sa["tok_s"])
    return out


def _draw_summary(result: dict) -> None:
    s = summary(result["ar"], result["diffusion"])
    c1, c2, c3 = st.columns(3)
    c1.metric("Diffusion speed vs AR", f"{s['speedup']:.2f}×" if s["speedup"] else "–", border=True,
              help="Diffusion tokens per second divided by AR tokens per second, measured inside each decoder.")
    tpf = f"{s['diffusion_tpf']:.2f}" if s["diffusion_tpf"] is not None else "–"
    c2.metric("Tokens per forward (diffusion)", tpf, border=True,
              help="How many tokens each diffusion forward produced on average; AR always makes 1.")
    agree = "identical" if s["identical"] else f"{s['similarity']:.0%} similar"
    c3.metric("Do the texts agree?", agree, border=True,
              help="Greedy decoding (temperature 0) makes the two modes most comparable.")
    st.caption(TPF_NOTE)


def _columns():
    """One bordered column per mode. They grow with the replies: a fixed height would scroll inside the box
    and hide the start of each reply."""
    cols = st.columns(2, gap="medium")
    boxes = {}
    for col, mode in zip(cols, MODES):
        with col:
            st.markdown(f"##### {MODE_LABELS[mode]}")
            boxes[mode] = st.container(border=True)
    return boxes


def _run(loaded, second, prompt: str) -> None:
    ss = st.session_state
    model = loaded.model
    record = state.run()  # a plain dict: usable in the finally after a Stop
    result = {"prompt": prompt, "ar": reply.new_message("ar"), "diffusion": reply.new_message("diffusion")}
    ss.compare = result
    system_prompt = state.system_prompt(model)
    boxes = _columns()
    views, events = {}, {}
    engines = {"ar": loaded, "diffusion": second}
    params = {mode: state.decode_params(engines[mode].model, mode) for mode in MODES}
    if not loaded.lock.acquire(blocking=False):
        st.warning("The model is busy with a reply in another tab. Try again when it is done.")
        state.finish(record)
        return
    second.lock.acquire()
    try:
        convo = [{"role": "system", "content": system_prompt}] if system_prompt else []
        ids = model.chat_ids(convo + [{"role": "user", "content": prompt}])
        for mode in MODES:
            with boxes[mode]:
                with st.chat_message("assistant"):
                    views[mode] = reply.ReplyView(result[mode], engines[mode].model, show_picture=mode == "diffusion")
            events[mode] = engines[mode].model.generate(ids, params[mode])
        active = list(MODES)
        while active:  # one loop, one event from each decoder in turn
            for mode in list(active):
                try:
                    ev = next(events[mode])
                except StopIteration:
                    active.remove(mode)
                    continue
                views[mode].apply(ev)
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"The compare run failed: {exc}"
    finally:
        for mode in MODES:
            if mode in events:
                events[mode].close()
            if not result[mode]["done"]:
                result[mode]["stopped"] = not result.get("error")
        second.lock.release()
        loaded.lock.release()
        state.finish(record)
    st.rerun()


def draw(loaded, load_second, prompts: list[tuple[str, str]]) -> None:
    """load_second() gives the second engine; prompts: suggestions while nothing has been compared yet."""
    ss = st.session_state
    model = loaded.model
    st.markdown("#### Compare: autoregressive vs block diffusion")
    st.caption("One prompt, both decoders, one event from each in turn on the same CPU, so the speed figures are "
               "fair. The sidebar settings apply to both; temperature 0 makes the texts most comparable.")
    if not model.trained_for_diffusion:
        st.info("This checkpoint was not trained for block diffusion, so diffusion mode falls back to filling "
                "the leftmost slot each step: expect about one token per forward, AR speed and AR text.",
                icon=":material/info:")
    busy = state.busy("compare")
    st.chat_input("A prompt to run both ways…", key="compare_prompt", submit_mode="stop", on_submit=_submit)
    if busy:
        state.resume_watch()
        prompt = state.run()["job"]["prompt"]
        st.markdown(f"**Prompt:** {prompt}")
        _run(loaded, load_second(), prompt)
        return
    result = ss.compare
    if not result:
        st.markdown("Type a prompt below to start, or pick one:")
        suggestions.draw(prompts, _ask, "compare_example", view="compare")
        return
    st.markdown(f"**Prompt:** {result['prompt']}")
    if result.get("error"):
        st.error(result["error"], icon=":material/error:")
    boxes = _columns()
    for mode in MODES:
        with boxes[mode]:
            with st.chat_message("assistant"):
                reply.draw_stored(result[mode])
    if result["ar"].get("stats") and result["diffusion"].get("stats"):
        _draw_summary(result)
