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
    """[(prompt, kind)] to offer: kind "skill" or "open" for a model with a prompt file, "" for general ones."""
    path = prompt_file(folder)
    skills, open_ = load(path) if path else ([], [])
    if not skills and not open_:
        return list(GENERAL)
    if not skills:  # free text only
        return [(p, "open") for p in _spread(open_, SKILLS_SHOWN)]
    return [(p, "skill") for p in _spread(skills, SKILLS_SHOWN)] + [(p, "open") for p in open_[:1]]


def button_label(prompt: str, limit: int = 70) -> str:
    """One line for a button: line breaks shown as " / ", long prompts cut with an ellipsis."""
    line = " / ".join(part.strip() for part in prompt.splitlines() if part.strip())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


NOTES = {  # what the skill prompts show, per view
    "chat": "This model is surest on skills like these: ask one in **Block diffusion** mode and watch a step fill "
            "more than one slot of a block.",
    "compare": "On skills like these, block diffusion settles more than one token per forward; the summary says "
               "whether the two texts agree.",
}
OPEN_NOTE = " The book marks free text, where it is unsure and settles about one token per step."


def draw(prompts: list[tuple[str, str]], on_pick, key: str, view: str = "chat") -> None:
    """Buttons for suggested prompts ([(prompt, kind)], for_folder) with a line on what the skill prompts show
    in `view` ("chat" or "compare"); on_pick(prompt) on a click."""
    kinds = {kind for _, kind in prompts}
    if "skill" in kinds:
        st.caption(NOTES[view] + (OPEN_NOTE if "open" in kinds else ""))
    cols = st.columns(len(prompts))
    for i, (col, (text, kind)) in enumerate(zip(cols, prompts)):
        col.button(button_label(text), on_click=on_pick, args=(text,), width="stretch",
                   key=f"{key}_{i}", icon=":material/menu_book:" if kind == "open" else None,
                   help=f"Send: {text}")
