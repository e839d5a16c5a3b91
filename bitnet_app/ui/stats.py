"""The figures under every reply: tokens, tok/s (timed again when short: the fastest of the runs), time to first
token; for block diffusion its steps, tokens per step and forwards."""
import html

from ..params import KNOBS

MODE_LABELS = KNOBS["mode"].metadata["ui"]["labels"]  # {"ar": "Autoregressive", "diffusion": "Block diffusion"}
STOP_LABELS = {"stop": "end of reply", "length": "max new tokens reached", "context": "context full"}


def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def rate(tok_s: float) -> str:
    """A speed as people read it: 40.0, 10,540."""
    return f"{tok_s:,.0f}" if tok_s >= 100 else f"{tok_s:.1f}"


def speed_chips(msg: dict) -> list[tuple[str, str]]:
    """tok/s: the fastest of the runs timed off screen when the reply was too short to time once (timing.py);
    else the decoder's figure of the one run."""
    timed = msg.get("timing")
    if timed:
        return [("", f"{rate(float(timed['tok_s']))} tok/s"), ("", f"fastest of {timed['runs']} runs")]
    return [("", f"{rate(float((msg.get('stats') or {}).get('tok_s', 0.0)))} tok/s")]


def chips(msg: dict, speed: bool = True) -> list[tuple[str, str]]:
    """(css class, text) pairs for one assistant message (a stopped one keeps the figures of what it wrote);
    speed: with its tok/s (not while the reply is being timed again: a figure appears once, when it is final)."""
    out = [("mode", MODE_LABELS.get(msg.get("mode"), msg.get("mode") or ""))]
    s = msg.get("stats") or {}
    if s:
        out.append(("", f"{int(s.get('tokens', 0))} tokens"))
        out += speed_chips(msg) if speed else []
        if s.get("ttft_s") is not None:
            out.append(("", f"first token {_seconds(float(s['ttft_s']))}"))
        if msg.get("mode") == "diffusion" and s.get("steps"):
            out.append(("", _count(int(s["steps"]), "step")))
            out.append(("", f"{float(s.get('tokens_per_step', 0.0)):.2f} tokens/step"))
        if msg.get("mode") == "diffusion" and s.get("forwards"):
            out.append(("", _count(int(s["forwards"]), "forward")))
        if msg.get("mode") == "diffusion" and s.get("drafted"):  # slots filled above the threshold
            out.append(("", f"{100 * float(s.get('kept_share', 0.0)):.0f}% of {int(s['drafted'])} drafts kept"))
    if msg.get("stopped"):
        out.append(("stopped", "stopped by you"))
    elif msg.get("stop_reason"):
        out.append(("", STOP_LABELS.get(msg["stop_reason"], msg["stop_reason"])))
    return out


def html_row(msg: dict, note: str = "", speed: bool = True) -> str:
    """The chips as HTML; note: one more, in italics (what the page is doing with the reply now); speed: see chips."""
    spans = "".join(f'<span class="chip {cls}">{html.escape(text)}</span>' for cls, text in chips(msg, speed))
    if note:
        spans += f'<span class="chip note">{html.escape(note)}</span>'
    return f'<div class="stat-row">{spans}</div>'


def text_line(msg: dict) -> str:
    return " · ".join(text for _, text in chips(msg))
