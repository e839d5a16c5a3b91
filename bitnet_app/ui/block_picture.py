"""The live picture of a diffusion block: mask slots as placeholders, filled slots, the newest highlighted.

A frame is plain data kept in the chat history for the replay:
    {"start": absolute position of the block, "slots": [text, or None for a mask], "new": [slot indices],
     "given": [slot indices known before the block's first step: the prompt's tail or the carried token]}
"""
import html

MAX_FRAMES = 600  # frames kept per reply for the replay (a long reply keeps its first ones)


def frame_from_step(step, token_text, previous: dict | None = None) -> dict:
    """A Step event -> frame; token_text(id) gives the text of one token (the model's tokenizer);
    previous: the frame before it, to carry which slots were given rather than generated."""
    slots = [None if int(t) == int(step.mask_id) else token_text(int(t)) for t in step.block]
    new = [int(i) for i in step.filled]
    if previous is not None and previous["start"] == int(step.block_start):
        given = previous.get("given", [])
    else:
        given = [i for i, t in enumerate(slots) if t is not None and i not in new]
    return {"start": int(step.block_start), "slots": slots, "new": new, "given": given}


def _slot_label(text: str) -> str:
    shown = text.replace("\n", "↵").replace("\t", "⇥")
    if shown.strip() == "":
        shown = "␣" * max(1, len(shown))
    return html.escape(shown)


def render(frame: dict, *, caption: str = "") -> str:
    new, given = set(frame["new"]), set(frame.get("given", []))
    parts = []
    for i, text in enumerate(frame["slots"]):
        if text is None:
            parts.append('<span class="slot mask">·</span>')
        else:
            cls = "new" if i in new else "given" if i in given else "fill"
            parts.append(f'<span class="slot {cls}">{_slot_label(text)}</span>')
    open_slots = len(frame["slots"]) - len(given)
    filled = sum(t is not None for t in frame["slots"]) - len(given)
    head = (f"Block at position {frame['start']} · {filled}/{open_slots} slots filled"
            + (f" · {html.escape(caption)}" if caption else ""))
    legend = ('<div class="legend"><span class="slot given">tok</span> given &nbsp; '
              '<span class="slot mask">·</span> still masked &nbsp; '
              '<span class="slot fill">tok</span> filled &nbsp; <span class="slot new">tok</span> filled by '
              'this step</div>')
    return f'<div class="bp"><div class="bp-head">{head}</div><div class="bp-slots">{"".join(parts)}</div>{legend}</div>'
