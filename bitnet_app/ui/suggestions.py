"""The prompts the empty chat (and the empty compare view) suggest: ones the running model is good at.

A model folder may come with a suggestion file, `demo-suggestions.json`, inside it or beside it (the bundled
demo model's is assets/demo-suggestions.json):
    {"skills": [{"prompt": user message, "answer": the model's greedy reply}, ...], "open": [user message, ...]}
Each skill prompt there is one the model answers exactly right, greedy, in both decode modes (the recorded answer
is checked against the model and the answer oracle by tests/test_demo_model.py in every CI run), so a presenter
can trust it. Without one, a prompt file `demo-prompts.json` in the same places (the eval's held-out prompts,
{"skills": [...], "open": [...]}) is used. "skills" are tasks whose answer follows from the question (counting,
times tables, the alphabet…), where the model is sure of many slots at once and block diffusion fills several per
forward; "open" is free text (Shakespeare), where it is not. Without either file the suggestions are general
questions for a chat model.
"""
import json
import os

import streamlit as st

SUGGESTION_FILE = "demo-suggestions.json"
PROMPT_FILE = "demo-prompts.json"
SKILLS_SHOWN = 3
GENERAL = [("Explain in two sentences what a 1.58-bit model is.", ""),
           ("Write a short poem about a fast little CPU.", ""),
           ("Give me three tips for a great live demo.", "")]


def prompt_file(folder: str | None) -> str | None:
    """The suggestion file (else the prompt file) that belongs to the checkpoint folder `folder` (inside it, else
    beside it), or None."""
    if not folder or not os.path.isdir(folder):
        return None
    for name in (SUGGESTION_FILE, PROMPT_FILE):
        for path in (os.path.join(folder, name), os.path.join(os.path.dirname(os.path.abspath(folder)), name)):
            if os.path.isfile(path):
                return path
    return None


def _texts(entries) -> list[str]:
    """User-message texts from a list of strings (or of {"prompt": ...} / {"content": ...} records)."""
    out = []
    for e in entries if isinstance(entries, list) else []:
        text = e if isinstance(e, str) else (e.get("prompt") or e.get("content")) if isinstance(e, dict) else None
        if isinstance(text, str) and text.strip():
            out.append(text.strip())
    return out


def load(path: str) -> tuple[list[str], list[str]]:
    """(skills, open) from a prompt file; ([], []) when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return [], []
    if not isinstance(data, dict):
        return [], []
    return _texts(data.get("skills")), _texts(data.get("open"))


def _spread(items: list[str], n: int) -> list[str]:
    """n items spread evenly over the list (the file lists its prompts family by family, so this shows several
    families), in order."""
    if len(items) <= n:
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def for_folder(folder: str | None) -> list[tuple[str, str]]:
    """[(prompt, kind)] to offer: kind "skill" or "open" for a model with a prompt file, "" for general ones. A
    suggestion file's prompts are all offered (each one is checked); a prompt file's (held-out prompts, many) are
    spread, SKILLS_SHOWN of them."""
    path = prompt_file(folder)
    skills, open_ = load(path) if path else ([], [])
    if not skills and not open_:
        return list(GENERAL)
    checked = os.path.basename(path) == SUGGESTION_FILE
    if not skills:  # free text only
        return [(p, "open") for p in (open_ if checked else _spread(open_, SKILLS_SHOWN))]
    shown = skills if checked else _spread(skills, SKILLS_SHOWN)
    return [(p, "skill") for p in shown] + [(p, "open") for p in (open_ if checked else open_[:1])]


def button_label(prompt: str, limit: int = 70) -> str:
    """One line for a button, nothing cut mid-way: line breaks shown as " / "; a longer prompt as its first lines
    that fit and how many lines follow (the whole prompt is the button's tooltip); one long line cut at a word."""
    lines = [part.strip() for part in prompt.splitlines() if part.strip()]
    whole = " / ".join(lines)
    if len(whole) <= limit:
        return whole
    if len(lines) > 1 and len(lines[0]) <= limit - 14:
        head = lines[0]
        for n, line in enumerate(lines[1:], start=1):
            more = f" (+{len(lines) - n - 1} lines)" if n < len(lines) - 1 else ""
            if len(head) + 3 + len(line) + len(more) > limit:
                return f"{head} (+{len(lines) - n} lines)"
            head += " / " + line
        return head
    cut = whole[:limit - 1].rsplit(" ", 1)[0] if " " in whole[:limit - 1] else whole[:limit - 1]
    return cut.rstrip() + "…"


NOTES = {  # what the skill prompts show, per view (chat: in each decoding mode)
    "chat": "This model is surest on skills like these: ask one in **Block diffusion** mode (the sidebar's "
            "**Decoding** switch) and watch a step fill more than one place of a block.",
    "chat-diffusion": "This model is surest on skills like these: ask one and watch a step of block diffusion fill "
                      "more than one place of a block.",
    "compare": "On skills like these, block diffusion settles more than one token per forward; the summary says "
               "whether the two texts agree.",
}
OPEN_NOTE = " The book marks free text, where it is unsure and settles about one token per step."


def _use_diffusion() -> None:
    from . import state
    state.put("mode", "diffusion")


def draw(prompts: list[tuple[str, str]], on_pick, key: str, view: str = "chat") -> None:
    """Buttons for suggested prompts ([(prompt, kind)], for_folder), every one whole, in rows that wrap, with a line
    on what the skill prompts show in `view` ("chat" or "compare"); in the chat in autoregressive mode, a button that
    switches to block diffusion; on_pick(prompt) on a click."""
    kinds = {kind for _, kind in prompts}
    diffusion = st.session_state.get("mode") == "diffusion"
    if "skill" in kinds:
        note = NOTES["chat-diffusion" if view == "chat" and diffusion else view]
        st.caption(note + (OPEN_NOTE if "open" in kinds else ""))
        if view == "chat" and not diffusion:
            st.button("Switch to Block diffusion", on_click=_use_diffusion, key=f"{key}_mode",
                      icon=":material/grid_view:", type="primary",
                      help="The sidebar's Decoding switch: block diffusion, so a step can write several tokens.")
    row = st.container(horizontal=True, gap="small")
    for i, (text, kind) in enumerate(prompts):
        row.button(button_label(text), on_click=on_pick, args=(text,), width="content",
                   key=f"{key}_{i}", icon=":material/menu_book:" if kind == "open" else None,
                   help=f"Send: {text}")
