"""The chat as Markdown and as JSON, for the export buttons."""
import json
import time

from .reply import markdown_text, plain_markdown
from .stats import text_line


def to_markdown(messages: list[dict], *, system_prompt: str, model: str) -> str:
    lines = [f"# Chat with {model}", "", f"_Exported {time.strftime('%Y-%m-%d %H:%M')}_", ""]
    if system_prompt.strip():
        lines += ["**System prompt:** " + system_prompt.strip(), ""]
    for m in messages:
        who = "You" if m["role"] == "user" else "Assistant"
        text = m.get("content", "")  # its line breaks kept; what a person typed, as typed
        lines += [f"### {who}", "", plain_markdown(text) if m["role"] == "user" else markdown_text(text), ""]
        if m["role"] == "assistant":
            lines += [f"_{text_line(m)}_", ""]
    return "\n".join(lines)


def to_json(messages: list[dict], *, system_prompt: str, model: str, settings: dict) -> str:
    keep = ("role", "content", "mode", "stats", "timing", "stop_reason", "stopped", "trimmed", "error")
    return json.dumps({"model": model, "exported": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "system_prompt": system_prompt, "settings": settings,
                       "messages": [{k: m[k] for k in keep if k in m} for m in messages]},
                      indent=2, ensure_ascii=False)
