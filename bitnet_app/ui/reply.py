"""Draw one reply from decoder events into placeholders, keeping the message dict (in session state) current.

Every event updates the stored message first and then the screen, so whatever moment a Stop lands on, the history
already holds the partial reply; the caller's `finally` marks it stopped and keeps the figures so far
(ReplyView.stopped, from Work: the decoder's time measured around each of its events).

Events come in beats (beats()): one token in autoregressive mode, one step and the tokens it settled in block
diffusion. Slow motion paces beats (Pacer: a rate in beats per second), and Compare advances each side by one beat
in turn, so both sides move in step.
"""
import re
import time
import uuid

import streamlit as st

from ..decode.events import Done, Step, Token
from . import block_picture, stats, timing

CURSOR = " ▌"
TIMING_NOTE = "timing it again off screen…"
WAIT_NOTE = "its speed: timed off screen when the run ends"  # a short reply's Done, before it is timed again
REDRAW_S = 1 / 30     # without Slow motion the text and the block picture are redrawn at most this often: a small
                      # model makes thousands of events per second, more than the browser can paint


def new_message(mode: str, attention: str | None = None) -> dict:
    """A stored assistant message; attention: the attention pattern block diffusion ran with (its picture's words)."""
    return {"id": uuid.uuid4().hex[:12], "role": "assistant", "content": "", "mode": mode, "attention": attention,
            "stats": None,
            "stop_reason": None, "stopped": False, "trimmed": 0, "steps": [], "by_step": [], "tokens_seen": 0,
            "done": False}


def beats(events, mode: str):
    """The events in beats (lists): [Token] in autoregressive mode; in block diffusion a Step and the Tokens that
    came after it (the tokens it settled). Done ends the last beat."""
    beat = []
    for ev in events:
        if mode == "diffusion" and isinstance(ev, Step) and any(isinstance(e, Step) for e in beat):
            yield beat
            beat = []
        beat.append(ev)
        if mode != "diffusion" and isinstance(ev, Token):
            yield beat
            beat = []
    if beat:
        yield beat


class Work:
    """The decoder's own time, measured around each next() of its events, so none of the page's drawing is in it:
    the figures of a reply stopped before its Done (which carries the decoder's figures)."""

    def __init__(self):
        self.seconds = 0.0
        self.first_token_s = None

    def timed(self, events):
        it = iter(events)
        while True:
            t = time.perf_counter()
            try:
                ev = next(it)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - t
            if self.first_token_s is None and isinstance(ev, Token):
                self.first_token_s = self.seconds
            yield ev


class Pacer:
    """Slow motion: beats drawn at `rate` per second (None or 0: as fast as they come). Deadlines, not fixed
    pauses, so the drawing time is part of each beat's share and the rate holds."""

    def __init__(self, rate: float | None):
        self.interval = 1.0 / float(rate) if rate else 0.0
        self._next = None

    @property
    def on(self) -> bool:
        return self.interval > 0

    def wait(self) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        self._next = (now if self._next is None else self._next) + self.interval
        if self._next > now:
            time.sleep(self._next - now)
        else:
            self._next = now  # behind (a slow draw): go on from here rather than catch up in a burst


class ReplyView:
    def __init__(self, msg: dict, model, *, prompt_tokens: int = 0, show_picture: bool = True, paced: bool = False):
        """The placeholders of one reply: the live block picture (diffusion) above the text, so it stays where it
        is while the text grows, then the text, the finished picture (diffusion) and the figures, where the history
        draws them. prompt_tokens: where the reply starts; paced: Slow motion (every beat is drawn)."""
        self.msg, self.model, self.paced, self.prompt_tokens = msg, model, paced, prompt_tokens
        self.picture = st.empty() if show_picture else None
        self.text = st.empty()
        self.finished = st.empty() if show_picture else None
        self.footer = st.empty()
        self._texts: dict[int, str] = {}
        self._last_frame = None
        self._frame_drawn = True  # whether the picture shows the last step's frame
        self._drawn_at = {"text": 0.0, "picture": 0.0}
        self.steps_seen = 0
        self.text.markdown(CURSOR)

    def _token_text(self, tid: int) -> str:
        if tid not in self._texts:
            self._texts[tid] = self.model.decode([tid], skip_special_tokens=True)  # a special token: ""
        return self._texts[tid]

    def apply(self, ev) -> None:
        """Take one event into the stored message (Done also draws the finished reply)."""
        m = self.msg
        if isinstance(ev, Token):
            m["content"] += ev.text
            m["tokens_seen"] += 1
            if self.picture is not None:  # diffusion: the step that settled this token (the latest; 0: the prefill)
                m["by_step"].append([ev.text, self.steps_seen])
        elif isinstance(ev, Step):
            self.steps_seen += 1
            m.setdefault("block_size", len(ev.block))
            frame = block_picture.frame_from_step(ev, self._token_text, self._last_frame, self.prompt_tokens)
            self._last_frame = frame
            if len(m["steps"]) < block_picture.MAX_FRAMES:
                m["steps"].append(frame)
            self._frame_drawn = False
        elif isinstance(ev, Done):
            m["content"], m["stats"], m["stop_reason"], m["done"] = ev.text, dict(ev.stats), ev.stop_reason, True
            self._cut_frames(int(ev.stats.get("prompt_tokens", self.prompt_tokens)) + int(ev.stats.get("tokens", 0)))
            self.text.markdown(markdown_text(m["content"]) or "_(empty reply)_")
            if self.picture is not None:  # the live block gives way to the whole reply, tinted by step
                self.picture.empty()
                draw_finished_picture(m, self.finished)
            if timing.too_short(m["stats"]):  # timed again: its speed appears once, when final
                self.note(WAIT_NOTE)
            else:
                self.footer.markdown(stats.html_row(m), unsafe_allow_html=True)

    def draw(self) -> None:
        """Redraw the text and the picture as they stand (in Slow motion always, else when due)."""
        if self.msg["done"]:
            return
        if self._due("text"):
            self.text.markdown(markdown_text(self.msg["content"]) + CURSOR)
        if self.picture is not None and not self._frame_drawn and self._due("picture"):
            self._draw_frame()

    def note(self, text: str) -> None:
        """A line under the finished reply's figures, without its speed: that it is being timed again."""
        self.footer.markdown(stats.html_row(self.msg, note=text, speed=False), unsafe_allow_html=True)

    def stopped(self, work: Work) -> None:
        """After a Stop (no Done came): the figures of what was written, from the decoder's time so far. Plain
        mutations only: this runs in a `finally` after the Stop (see state.py)."""
        m = self.msg
        tokens, seconds = int(m["tokens_seen"]), work.seconds
        figures = {"tokens": tokens, "tok_s": tokens / seconds if seconds > 0 else 0.0, "total_s": seconds,
                   "partial": True}
        if work.first_token_s is not None:
            figures["ttft_s"] = work.first_token_s
        if self.steps_seen:
            figures.update(steps=self.steps_seen, tokens_per_step=tokens / self.steps_seen)
        m["stats"] = figures
        self._cut_frames(self.prompt_tokens + tokens)

    def _cut_frames(self, end: int) -> None:
        """Nothing past the reply's end in any picture (its stop token, drafts after it, or after a Stop)."""
        for frame in self.msg["steps"]:
            block_picture.cut_at(frame, end)

    def _draw_frame(self) -> None:
        caption = f"step {self.steps_seen}"
        self.picture.markdown(block_picture.render(self._last_frame, caption=caption, live=True), unsafe_allow_html=True)
        self._frame_drawn = True

    def _due(self, what: str) -> bool:
        """Whether to redraw `what` now: always in Slow motion (it paces every beat), else at most every
        REDRAW_S seconds (the stored message is always current; Done draws the final text)."""
        if self.paced:
            return True
        now = time.perf_counter()
        if now - self._drawn_at[what] < REDRAW_S:
            return False
        self._drawn_at[what] = now
        return True


def failure_text(what: str, exc: Exception, partial: bool) -> str:
    """The line a failed reply shows above its text (draw_stored): what failed and why (a damaged model file says so
    in its own words, engine/runtime.py), and, when tokens came before the failure, that they are kept."""
    kept = " The text it wrote before that is kept below." if partial else ""
    return f"{what} failed: {exc}{kept}"


def markdown_text(text: str) -> str:
    """Chat text as Markdown that keeps its line breaks: outside fenced code blocks a single newline becomes a hard
    break ("  \n"), so verse, lists of numbers and tables show line by line (Markdown would join such lines)."""
    parts = text.split("```")
    for i in range(0, len(parts), 2):  # the even parts lie outside the fences
        parts[i] = parts[i].replace("\n", "  \n")
    return "```".join(parts)


MARKDOWN_SIGNS = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:=])")


def plain_markdown(text: str) -> str:
    """Text a person typed, as Markdown that shows it as typed: every sign Markdown (or Streamlit's own additions:
    $math$, :emoji: and :color[...]) would read is escaped, and its line breaks are kept."""
    return markdown_text(MARKDOWN_SIGNS.sub(r"\\\1", text))  # no ``` is left to fence


def draw_stored(msg: dict) -> None:
    """A finished (or stopped) reply from history: its text, the picture of how block diffusion wrote it (visible
    without a click), its figures."""
    if msg.get("error"):
        st.error(msg["error"], icon=":material/error:")
    if msg.get("trim_notice"):
        st.info(msg["trim_notice"], icon=":material/content_cut:")
    st.markdown(markdown_text(msg.get("content") or "") or
                ("_(stopped before the first token)_" if msg.get("stopped") else ""))
    draw_finished_picture(msg, st)
    st.markdown(stats.html_row(msg), unsafe_allow_html=True)


def draw_finished_picture(msg: dict, where) -> None:
    """The reply tinted by step (block diffusion), into `where` (a placeholder, or st)."""
    if msg.get("by_step") and msg.get("stats"):
        where.markdown(block_picture.render_settled(msg["by_step"], msg["stats"], int(msg.get("block_size") or 0),
                                                    msg.get("attention")),
                       unsafe_allow_html=True)
