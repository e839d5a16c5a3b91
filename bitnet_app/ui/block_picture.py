"""The live picture of a diffusion block: mask slots as placeholders, filled slots, the newest highlighted.

A frame is plain data kept in the chat history for the replay:
    {"start": absolute position of the block, "slots": [text, or None for a mask], "new": [slot indices]}
"""
import html

MAX_FRAMES = 600  # frames kept per reply for the replay (a long reply keeps its first ones)


def frame_from_step(step, token_text) -> dict:
    """A Step event -> frame; token_text(id) gives the text of one token (the model's tokenizer)."""
    slots = [None if int(t) == int(step.mask_id) else token_text(int(t)) for t in step.block]
    return {"start": int(step.block_start), "slots": slots, "new": [int(i) for i in step.filled]}


def _slot_label(text: str) -> str:
    shown = text.replace("\n", "↵").replace("\t", "⇥")
    if shown.strip() == "":
        shown = "␣" * max(1, len(shown))
    return html.escape(shown)


def render(frame: dict, *, caption: str = "") -> str:
    new = set(frame["new"])
    parts = []
    for i, text in enumerate(frame["slots"]):
        if text is None:
            parts.append('<span class="slot mask">·</span>')
        else:
            cls = "new" if i in new else "fill"
            parts.append(f'<span class="slot {cls}">{_slot_label(text)}</span>')
    filled = sum(t is not None for t in frame["slots"])
    head = (f"Block at position {frame['start']} · {filled}/{len(frame['slots'])} slots filled"
            + (f" · {html.escape(caption)}" if caption else ""))
    legend = ('<div class="legend"><span class="slot mask">·</span> still masked &nbsp; '
              '<span class="slot fill">tok</span> filled &nbsp; <span class="slot new">tok</span> filled by '
              'this step</div>')
    return f'<div class="bp"><div class="bp-head">{head}</div><div class="bp-slots">{"".join(parts)}</div>{legend}</div>'
