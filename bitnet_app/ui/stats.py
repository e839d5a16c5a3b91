"""The figures under every reply: tokens, tok/s, time to first token; forwards and tokens per forward."""
import html

from ..params import KNOBS

MODE_LABELS = KNOBS["mode"].metadata["ui"]["labels"]  # {"ar": "Autoregressive", "diffusion": "Block diffusion"}
STOP_LABELS = {"stop": "end of reply", "length": "max new tokens reached", "context": "context full"}


def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def chips(msg: dict) -> list[tuple[str, str]]:
    """(css class, text) pairs for one assistant message."""
    out = [("mode", MODE_LABELS.get(msg.get("mode"), msg.get("mode") or ""))]
    s = msg.get("stats") or {}
    if s:
        out.append(("", f"{int(s.get('tokens', 0))} tokens"))
        out.append(("", f"{float(s.get('tok_s', 0.0)):.1f} tok/s"))
        if s.get("ttft_s") is not None:
            out.append(("", f"first token {_seconds(float(s['ttft_s']))}"))
        if msg.get("mode") == "diffusion":
            out.append(("", f"{int(s.get('forwards', 0))} forwards"))
            out.append(("", f"{float(s.get('tokens_per_forward', 0.0)):.2f} tokens/forward"))
            if s.get("drafted"):  # slots filled above the threshold: the exact rule keeps only AR's
                out.append(("", f"{100 * float(s.get('kept_share', 0.0)):.0f}% of {int(s['drafted'])} drafts kept"))
    if msg.get("stopped"):
        out.append(("stopped", "stopped by you"))
    elif msg.get("stop_reason"):
        out.append(("", STOP_LABELS.get(msg["stop_reason"], msg["stop_reason"])))
    return out


def html_row(msg: dict) -> str:
    spans = "".join(f'<span class="chip {cls}">{html.escape(text)}</span>' for cls, text in chips(msg))
    return f'<div class="stat-row">{spans}</div>'


def text_line(msg: dict) -> str:
    return " · ".join(text for _, text in chips(msg))
