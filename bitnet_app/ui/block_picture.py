"""The pictures of block diffusion: the live block as it fills, and the finished reply tinted by step.

A frame is plain data kept in the chat history for the replay:
    {"start": absolute position of the block, "block": its number in the reply (1, 2, ...),
     "slots": [text, or None for a slot still open], "new": [slot indices],
     "given": [slot indices that hold the prompt's tail]}
A slot's text is "" for a special token (end of turn, a role marker): the picture shows the place, not the marker.
The finished picture is the reply's tokens, each with the step that settled it: [[text, step], ...].
"""
import html

MAX_FRAMES = 600  # frames kept per reply for the replay (a long reply keeps its first ones)
PREFILL_COLOUR = "#f3f4f6"  # a token the prompt's own pass predicted (the prompt ended on a block boundary)
# one soft colour per step, in turn: neighbouring steps always differ
STEP_COLOURS = ("#dbeafe", "#fde68a", "#d1fae5", "#fbcfe8", "#e0e7ff", "#fed7aa", "#ccfbf1", "#ede9fe")


def frame_from_step(step, token_text, previous: dict | None = None, prompt_end: int | None = None) -> dict:
    """A Step event -> frame; token_text(id) gives the text of one token (the model's tokenizer, "" for a special
    token); previous: the frame before it, for the block number; prompt_end: the absolute position where the reply
    starts: the slots before it are the prompt's (None: every slot known before the block's first step, for a caller
    that does not know). A slot known before the first step at or after prompt_end is a token the model wrote (the
    first slot of a later block, settled by the step before), drawn as filled, not as the prompt's."""
    slots = [None if int(t) == int(step.mask_id) else token_text(int(t)) for t in step.block]
    new = [int(i) for i in step.filled]
    start = int(step.block_start)
    same_block = previous is not None and previous["start"] == start
    if prompt_end is not None:
        given = [i for i, t in enumerate(slots) if t is not None and start + i < prompt_end]
    elif same_block:
        given = previous.get("given", [])
    else:
        given = [i for i, t in enumerate(slots) if t is not None and i not in new]
    number = previous.get("block", 1) + (0 if same_block else 1) if previous is not None else 1
    return {"start": int(step.block_start), "block": number, "slots": slots, "new": new, "given": given}


def cut_at(frame: dict, end: int) -> None:
    """Drop the frame's slots at absolute positions >= end (the reply's end: its stop token and the drafts after
    it are not part of the reply, so no picture shows them)."""
    keep = max(end - frame["start"], 0)
    if keep < len(frame["slots"]):
        frame["slots"] = frame["slots"][:keep]
        frame["new"] = [i for i in frame["new"] if i < keep]
        frame["given"] = [i for i in frame.get("given", []) if i < keep]


def _slot_label(text: str) -> str:
    if text == "":  # a special token: its place, without its marker
        return ""
    shown = text.replace("\n", "↵").replace("\t", "⇥")
    if shown.strip() == "":
        shown = "␣" * max(1, len(shown))
    return html.escape(shown)


LEGEND = ('<div class="legend"><span class="slot given">tok</span> from the prompt &nbsp; '
          '<span class="slot mask">·</span> still open &nbsp; '
          '<span class="slot fill">tok</span> written by an earlier step &nbsp; <span class="slot new">tok</span> '
          'written by this step</div>')


def render(frame: dict, *, caption: str = "", live: bool = False) -> str:
    """The block as HTML; live: the picture of a reply being written (the page keeps it in view)."""
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
    head = (f"Block {frame.get('block', 1)} of the reply · {filled} of {open_slots} places filled"
            + (f" · {html.escape(caption)}" if caption else ""))
    cls = "bp live" if live else "bp"
    slots = "".join(parts)
    return f'<div class="{cls}"><div class="bp-head">{head}</div><div class="bp-slots">{slots}</div>{LEGEND}</div>'


def _token_html(text: str) -> str:
    """One token of the finished picture: its text, a line break shown as ↵ (the picture flows on, compact)."""
    return html.escape(text).replace("\n", '<span class="nl">↵</span> ')


def what_diffusion_does(block_size: int, attention: str | None) -> str:
    """Block diffusion in one sentence for people who are not engineers, true to the model's attention pattern
    (block: each place sees the whole block; causal, or not known: only the text before it)."""
    sees = ("each place seeing the whole block" if attention == "block"
            else "each place reading only the text before it")
    return (f"Block diffusion writes {block_size} tokens at a time: at each step the model guesses every open place "
            f"of the block at once, {sees}, and keeps the guesses it is sure of, so easy stretches (a count, a times "
            f"table) come out several tokens per step.")


def steps_and_forwards(stats: dict) -> str:
    """Steps, and the model's other runs, told apart once, in plain words."""
    steps, forwards, tokens = int(stats.get("steps", 0)), int(stats.get("forwards", 0)), int(stats.get("tokens", 0))
    per_step = f" ({tokens / steps:.1f} per step)" if steps else ""
    steps_word = "step" if steps == 1 else "steps"
    line = (f"{tokens} tokens took {steps} {steps_word}{per_step}. Tokens written in the same step share a colour; "
            f"the colours take turns, so point at a token to see its step.")
    if forwards > steps:
        line += (f" The model ran {forwards} times in all: once per step, and {forwards - steps} more to read the "
                 f"prompt and to store each finished block.")
    return line


def _colour(step: int) -> str:
    return STEP_COLOURS[(step - 1) % len(STEP_COLOURS)] if step > 0 else PREFILL_COLOUR


def _step_name(step: int) -> str:
    return f"step {step}" if step > 0 else "predicted with the prompt, before the first step"


def render_settled(by_step: list, stats: dict, block_size: int, attention: str | None) -> str:
    """The finished reply, each token tinted by the step that settled it (its number shown on hover), with what it
    shows in words."""
    spans = "".join(f'<span class="tok" style="background:{_colour(int(s))}" title="{_step_name(int(s))}">'
                    f'{_token_html(t)}</span>' for t, s in by_step if t)
    notes = f"{what_diffusion_does(block_size, attention)} {steps_and_forwards(stats)}"
    return (f'<div class="bp-final"><div class="bp-head">How block diffusion wrote this reply</div>'
            f'<div class="bp-text">{spans}</div><div class="legend">{html.escape(notes)}</div></div>')
