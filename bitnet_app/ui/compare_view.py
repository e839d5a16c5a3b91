"""AR and block diffusion on one prompt, side by side: one beat of each in turn in one loop (fair timings, and in
Slow motion both sides move in step), then, for short replies, both timed again off screen in turn."""
import difflib

import streamlit as st

from . import block_picture, reply, state, suggestions, timing
from .stats import MODE_LABELS

MODES = ("ar", "diffusion")
TPS_NOTE = ("**Tokens per step**: how many tokens one step (one pass of the model that fills slots) settles on "
            "average. Autoregressive: always 1; block diffusion: every slot it is sure enough of, so more per step "
            "means fewer steps, and each step costs more than an AR token: the sentence above weighs the two.")


def _ask(text: str) -> None:
    if text and text.strip():
        state.begin({"kind": "compare", "prompt": text.strip()})


def _submit() -> None:
    _ask(st.session_state.get("compare_prompt") or "")


def summary(ar: dict, diff: dict, timed: dict | None = None) -> dict:
    """Speed-up of diffusion over AR, its tokens per step and what a step costs in AR tokens (timing.pair; from
    `timed`, the pair of the fastest runs timed again, when there is one), and whether the texts agree."""
    figures = timed or timing.pair(ar.get("stats") or {}, diff.get("stats") or {})
    sd = diff.get("stats") or {}
    return {"speedup": figures["speedup"], "tokens_per_step": figures["tokens_per_step"],
            "step_in_ar_tokens": figures["step_in_ar_tokens"], "runs": figures.get("runs", 1),
            "diffusion_tpf": sd.get("tokens_per_forward"),
            "identical": ar.get("content", "") == diff.get("content", ""),
            "similarity": difflib.SequenceMatcher(None, ar.get("content", ""), diff.get("content", "")).ratio()}


def why(s: dict) -> str:
    """One plain sentence: why diffusion won or lost (tokens per step against a step's cost in AR tokens)."""
    x, tps, cost = s["speedup"], s["tokens_per_step"], s["step_in_ar_tokens"]
    if x is None or tps is None or cost is None:
        return ""
    if x >= 1.05:
        verdict = f"Block diffusion was {x:.2f}× as fast as AR"
    elif x > 0.95:
        verdict = f"Block diffusion was about as fast as AR ({x:.2f}×)"
    else:
        verdict = f"Block diffusion was slower than AR ({x:.2f}×)"
    link = "and" if x >= 1.05 else "but"
    return (f"{verdict}: each of its steps settled {tps:.1f} tokens on average, {link} a step took as long as "
            f"{cost:.1f} AR tokens here ({tps:.1f} / {cost:.1f} = {x:.2f}).")


def _draw_summary(result: dict) -> None:
    s = summary(result["ar"], result["diffusion"], result.get("timing"))
    c1, c2, c3 = st.columns(3)
    retimed = (f"; the fastest of {s['runs']} runs of each, timed off screen in turn (the tok/s under each reply)"
               if result.get("timing") else "")
    c1.metric("Diffusion speed vs AR", f"{s['speedup']:.2f}×" if s["speedup"] else "–", border=True,
              help="Diffusion tokens per second divided by AR tokens per second, measured inside each decoder"
                   + retimed + ".")
    tps = f"{s['tokens_per_step']:.2f}" if s["tokens_per_step"] is not None else "–"
    c2.metric("Tokens per step (diffusion)", tps, border=True,
              help="How many tokens each diffusion step settled on average; AR always makes 1.")
    agree = "identical" if s["identical"] else f"{s['similarity']:.0%} similar"
    c3.metric("Do the texts agree?", agree, border=True,
              help="Greedy decoding (temperature 0) makes the two modes most comparable.")
    sentence = why(s)
    if sentence:
        st.markdown(f"**{sentence}**")
    if result.get("timing"):
        st.caption(f"Short replies are timed again off screen: {s['runs']} runs of each mode, in turn, and each "
                   "mode's fastest run counts (a busy computer only ever adds time), so the figures hold from one "
                   "run to the next.")
    st.caption(TPS_NOTE)


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


def _stream(views: dict, events: dict, works: dict, pacer) -> None:
    """One beat of each side in turn until both are done (in Slow motion a pause after each round)."""
    streams = {mode: reply.beats(works[mode].timed(events[mode]), mode) for mode in MODES}
    while streams:
        for mode in list(streams):
            beat = next(streams[mode], None)
            if beat is None:
                del streams[mode]
                continue
            for ev in beat:
                views[mode].apply(ev)
            views[mode].draw()
        pacer.wait()


def _time_again(result: dict, engines: dict, ids: list, params: dict, views: dict) -> None:
    """Both replies run again off screen, in turn, when either was too short to time once: each one's fastest run
    (timing.fastest), whose tok/s the columns show, and the pair of them (timing.pair) for the summary, so the
    speed-up is the ratio of the two tok/s beside it."""
    if not all(result[m]["done"] for m in MODES) or not any(timing.too_short(result[m]["stats"]) for m in MODES):
        return
    for mode in MODES:
        views[mode].note(reply.TIMING_NOTE)  # the one that was long enough shows no figure before the other's
    jobs = {mode: timing.Job(engines[mode].model, ids, params[mode]) for mode in MODES}  # both cold, as they ran
    runs = timing.time_again(jobs)
    for mode in MODES:
        result[mode]["timing"] = timing.fastest(runs[mode])
    result["timing"] = dict(timing.pair(result["ar"]["timing"], result["diffusion"]["timing"]),
                            runs=result["ar"]["timing"]["runs"])


def _run(loaded, second, prompt: str) -> None:
    """Both decoders on `prompt`, drawn where the finished result will be (the same columns)."""
    ss = st.session_state
    model = loaded.model
    record = state.run()  # a plain dict: usable in the finally after a Stop
    result = {"prompt": prompt, "ar": reply.new_message("ar"), "diffusion": reply.new_message("diffusion")}
    ss.compare = result
    system_prompt = state.system_prompt(model)
    st.markdown(f"**Prompt:** {reply.plain_markdown(prompt)}")
    boxes = _columns()
    st.empty()  # where the finished run draws its summary: the last run's summary is replaced now, not left stale
    views, events = {}, {}
    works = {mode: reply.Work() for mode in MODES}
    engines = {"ar": loaded, "diffusion": second}
    params = {mode: state.decode_params(engines[mode].model, mode, seeded=True) for mode in MODES}
    result["diffusion"]["attention"] = params["diffusion"].attention
    pacer = reply.Pacer(state.slow_motion_rate())
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
                    views[mode] = reply.ReplyView(result[mode], engines[mode].model, prompt_tokens=len(ids),
                                                  show_picture=mode == "diffusion", paced=pacer.on)
            engines[mode].model.forget_cache()  # both start cold (diffusion always does): the same prefill work
            events[mode] = engines[mode].model.generate(ids, params[mode])
        _stream(views, events, works, pacer)
        _time_again(result, engines, ids, params, views)
    except Exception as exc:  # noqa: BLE001
        result["error"] = reply.failure_text("The compare run", exc,
                                             partial=any(result[mode]["content"] for mode in MODES))
    finally:
        for mode in MODES:
            if mode in events:
                events[mode].close()
            if not result[mode]["done"]:
                result[mode]["stopped"] = not result.get("error")
                if result[mode]["stopped"] and mode in views:
                    views[mode].stopped(works[mode])  # with the figures of what it wrote
        second.lock.release()
        loaded.lock.release()
        state.finish(record)
    st.rerun()


def _draw_result(result: dict) -> None:
    """The finished run, in the places the run that streamed it drew (_run): the prompt, the columns, then one
    place for what only a finished run has (an error, the summary)."""
    st.markdown(f"**Prompt:** {reply.plain_markdown(result['prompt'])}")
    boxes = _columns()
    for mode in MODES:
        with boxes[mode]:
            with st.chat_message("assistant"):
                reply.draw_stored(result[mode])
    with st.container():
        if result.get("error"):
            st.error(result["error"], icon=":material/error:")
        if result["ar"].get("stats") and result["diffusion"].get("stats"):
            _draw_summary(result)


def draw(loaded, load_second, prompts: list[tuple[str, str]]) -> None:
    """load_second() gives the second engine; prompts: suggestions while nothing has been compared yet."""
    ss = st.session_state
    model = loaded.model
    st.markdown("#### Compare: autoregressive vs block diffusion")
    block = int(ss.get("block_size") or model.diffusion_defaults["block_size"])
    attention = ss.get("attention") or model.diffusion_defaults["attention"]
    st.caption("One prompt, both decoders, one step of each in turn on the same CPU, so the speed figures are fair "
               f"(Slow motion moves both sides in step). {block_picture.what_diffusion_does(block, attention)} The sidebar "
               "settings apply to both; temperature 0 makes the texts most comparable.")
    if not model.trained_for_diffusion:
        st.info("This checkpoint was not trained for block diffusion, so diffusion mode falls back to filling "
                "the leftmost slot each step: expect about one token per step, AR speed and AR text.",
                icon=":material/info:")
    busy = state.busy("compare")
    st.chat_input("A prompt to run both ways…", key="compare_prompt", submit_mode="stop", on_submit=_submit)
    # Two places, each drawn in every run: in the browser an element stays on screen until a run replaces it (a
    # block sent again keeps its old children until they are replaced), so the run that streams leaves `examples`
    # empty (no stale suggestion among the replies) and streams in `body`, where the finished result is then drawn
    # in place (not a second time beside it); _run and _draw_result draw the same places in it.
    examples, body = st.empty(), st.empty()
    if busy:
        with st.sidebar:  # not in the page's flow: the replies stream where the result will show them
            state.resume_watch()
        with body.container():
            _run(loaded, load_second(), state.run()["job"]["prompt"])
        return
    result = ss.compare
    if not result:
        with examples.container():
            st.markdown("Type a prompt below to start, or pick one:")
            suggestions.draw(prompts, _ask, "compare_example", view="compare")
        return
    with body.container():
        _draw_result(result)
