"""Draw one reply from decoder events into placeholders, keeping the message dict (in session state) current.

Every event updates the stored message first and then the screen, so whatever moment a Stop lands
on, the history already holds the partial reply (the caller's `finally` marks it stopped).
"""
import time
import uuid

import streamlit as st

from ..decode.events import Done, Step, Token
from . import block_picture, stats

CURSOR = " ▌"
SLOW_MOTION_S = 0.04  # "Slow motion": a pause after each drawn token (AR) or step (diffusion), ~25 per second
REDRAW_S = 1 / 30     # otherwise the text and the block picture are redrawn at most this often: a small model
                      # makes thousands of events per second, more than the browser can paint


def new_message(mode: str) -> dict:
    return {"id": uuid.uuid4().hex[:12], "role": "assistant", "content": "", "mode": mode, "stats": None,
            "stop_reason": None, "stopped": False, "trimmed": 0, "steps": [], "tokens_seen": 0, "done": False}


class ReplyView:
    def __init__(self, msg: dict, model, *, show_picture: bool = True, pause_s: float = 0.0):
        """pause_s: wait this long after drawing each token (or each step, with the picture), so that a
        small model's reply can be watched; the decoders time only their own work, so the figures stay."""
        self.msg, self.model, self.pause_s = msg, model, pause_s
        self.text = st.empty()
        self.picture = st.empty() if show_picture else None
        self.footer = st.empty()
        self._texts: dict[int, str] = {}
        self._last_frame = None
        self._frame_drawn = True  # whether the picture shows the last step's frame
        self._drawn_at = {"text": 0.0, "picture": 0.0}
        self.text.markdown(CURSOR)

    def _token_text(self, tid: int) -> str:
        if tid not in self._texts:
            self._texts[tid] = self.model.decode([tid])
        return self._texts[tid]

    def apply(self, ev) -> None:
        m = self.msg
        if isinstance(ev, Token):
            m["content"] += ev.text
            m["tokens_seen"] += 1
            if self._due("text"):
                self.text.markdown(markdown_text(m["content"]) + CURSOR)
                if self.picture is None:
                    self._pause()
        elif isinstance(ev, Step):
            frame = block_picture.frame_from_step(ev, self._token_text, self._last_frame)
            self._last_frame = frame
            if len(m["steps"]) < block_picture.MAX_FRAMES:
                m["steps"].append(frame)
            self._frame_drawn = False
            if self.picture is not None and self._due("picture"):
                self._draw_frame()
                self._pause()
        elif isinstance(ev, Done):
            m["content"], m["stats"], m["stop_reason"], m["done"] = ev.text, dict(ev.stats), ev.stop_reason, True
            if self.picture is not None and not self._frame_drawn:  # end on the last step, not the last one drawn
                self._draw_frame()
            self.text.markdown(markdown_text(m["content"]) or "_(empty reply)_")
            self.footer.markdown(stats.html_row(m), unsafe_allow_html=True)

    def _draw_frame(self) -> None:
        caption = f"step {len(self.msg['steps'])}"
        self.picture.markdown(block_picture.render(self._last_frame, caption=caption), unsafe_allow_html=True)
        self._frame_drawn = True

    def _due(self, what: str) -> bool:
        """Whether to redraw `what` now: always in Slow motion (it paces every event), else at most every
        REDRAW_S seconds (the stored message is always current; Done draws the final text)."""
        if self.pause_s > 0:
            return True
        now = time.perf_counter()
        if now - self._drawn_at[what] < REDRAW_S:
            return False
        self._drawn_at[what] = now
        return True

    def _pause(self) -> None:
        if self.pause_s > 0:
            time.sleep(self.pause_s)


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


def draw_stored(msg: dict) -> None:
    """A finished (or stopped) reply from history."""
    if msg.get("error"):
        st.error(msg["error"], icon=":material/error:")
    if msg.get("trim_notice"):
        st.info(msg["trim_notice"], icon=":material/content_cut:")
    st.markdown(markdown_text(msg.get("content") or "") or
                ("_(stopped before the first token)_" if msg.get("stopped") else ""))
    st.markdown(stats.html_row(msg), unsafe_allow_html=True)
