"""The events a decoder yields; the UI draws them and never touches arrays.

A reply is a stream of Token (and, for diffusion, Step) events ending with exactly one Done.
Token.text pieces concatenate to the reply as it grows; Done.text is the whole reply and is
authoritative (it also holds a trailing incomplete UTF-8 character, shown as U+FFFD, that no
Token carried).
"""
from dataclasses import dataclass, field

# Done.stop_reason values
STOP_TOKEN = "stop"        # a stop id was produced (it is not part of the output)
STOP_LENGTH = "length"     # max_new_tokens reached
STOP_CONTEXT = "context"   # the context window is full


@dataclass(frozen=True)
class Token:
    """One generated token that is final, with the text it completes ("" if a character is still pending)."""
    id: int
    text: str


@dataclass(frozen=True)
class Step:
    """One diffusion forward: the current block as it stands (mask_id where still unknown).

    block_start: absolute position of the block's first slot; block: ids of the block's slots;
    filled: slot indices (into block) resolved by this step; mask_id: the id that marks unknown slots;
    settled: under the exact fill rule, how many leading slots are final (the filled slots after them are drafts
    that a later step checks, and may mask again); None when every filled slot is final (the threshold rule).
    """
    block_start: int
    block: tuple
    filled: tuple
    mask_id: int
    settled: int | None = None


@dataclass(frozen=True)
class Done:
    """The end of a reply. stats: at least tokens, forwards, tokens_per_forward, tok_s, ttft_s."""
    stats: dict
    stop_reason: str
    text: str
    ids: list = field(default_factory=list)  # the generated ids, stop id excluded
