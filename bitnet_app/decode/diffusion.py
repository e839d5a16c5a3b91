"""Block-diffusion decoding, Fast-dLLM v2 style (shared/reference/block-diffusion.md).

    for ev in generate_diffusion(engine, prompt_ids, sampler=Sampler(banned_ids=[mask]), stop_ids={...},
                                 max_new_tokens=64, detokenizer=tok.detokenizer(), block_size=32,
                                 sub_block_size=8, threshold=0.9, attention="block", mask_id=mask):
        ...  # Step after every forward, Token for each newly resolved slot (in order), then Done

The sequence is cut into blocks of B slots aligned to absolute positions 0, B, 2B, ... A block holds
what is already known (the prompt's tail, or the token predicted by the previous block) followed by
MASK slots. Sub-blocks of S slots are decoded left to right; each step is one uncommitted forward of
the whole block against the cache (token shift: the logits of slot j-1 predict slot j), then every
masked slot of the sub-block whose confidence (probability of the sampled token) exceeds the threshold
is filled, and always at least one: the most confident (block attention) or the leftmost (causal
attention, which makes the result equal greedy AR when nothing else passes the threshold). A finished
block is run once more and COMMITTED, so no K/V computed from MASK inputs stays in the cache; the last
row of that pass predicts the next block's first slot.

Shapes: engine.forward(block, rows=R) -> (len(R), V) float32; sampler((R, V)) -> tokens (R,), probs (R,).
DualCache (optional, off by default): inside a sub-block, after its first full-block step, re-run only
the sub-block's query rows against the block's scratch K/V (engine kv_end); exact for causal attention,
an approximation for block attention (later slots' K/V are from the first step's inputs).
"""
import time

import numpy as np

from .context import check_prompt_fits
from .events import STOP_CONTEXT, STOP_LENGTH, STOP_TOKEN, Done, Step, Token

ATTENTIONS = ("block", "causal")


def check_knobs(vocab_size: int, block_size: int, sub_block_size: int, threshold: float, attention: str,
                mask_id) -> None:
    """Clear errors for knob values the decoder cannot run with."""
    if int(block_size) < 1:
        raise ValueError(f"block_size must be a positive number of slots, not {block_size}")
    if int(sub_block_size) < 1 or int(block_size) % int(sub_block_size):
        raise ValueError(f"sub_block_size ({sub_block_size}) must divide block_size ({block_size}); try 8 with 32")
    if not 0.0 < float(threshold) <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1], not {threshold} (0.9 is a good start; 1.0 = one slot per forward)")
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be 'block' or 'causal', not {attention!r}")
    if mask_id is None or not 0 <= int(mask_id) < vocab_size:
        raise ValueError(f"mask_id {mask_id} is out of range for this model (vocabulary {vocab_size})")


class _Reply:
    """The reply as it is resolved: ids in order, streamed text, the stop decision."""

    def __init__(self, prompt, stop_ids, budget, detokenizer):
        self.prompt = prompt
        self.ids: list[int] = []
        self.stop_ids = stop_ids
        self.budget = budget
        self.detokenizer = detokenizer
        self.stop_reason = None

    def resolve(self, token: int):
        """Append one resolved id in order; returns its Token event, or None when the reply ended."""
        if self.stop_reason is not None:
            return None
        if token in self.stop_ids:
            self.stop_reason = STOP_TOKEN
            return None
        self.ids.append(token)
        piece = self.detokenizer.push(token) if self.detokenizer is not None else ""
        if len(self.ids) >= self.budget:
            self.stop_reason = "budget"
        return Token(token, piece)

    @property
    def context(self):
        return self.prompt + self.ids


def generate_diffusion(engine, prompt_ids, *, sampler, stop_ids=(), max_new_tokens: int = 256, detokenizer=None,
                       kv_ids: list | None = None, block_size: int = 32, sub_block_size: int = 8,
                       threshold: float = 0.9, attention: str = "block", mask_id=None, dual_cache: bool = False):
    prompt = [int(i) for i in prompt_ids]
    B, S, thr, mask = int(block_size), int(sub_block_size), float(threshold), mask_id
    check_knobs(engine.vocab_size, B, S, thr, attention, mask)
    mask = int(mask)
    check_prompt_fits(len(prompt), engine.ctx)
    causal = attention == "causal"
    budget = min(int(max_new_tokens), engine.ctx - len(prompt))
    reply = _Reply(prompt, {int(i) for i in stop_ids}, budget, detokenizer)

    clock = time.perf_counter
    busy = ttft = 0.0
    forwards = steps = 0

    def run(tokens, start, commit, rows, kv_end=None):
        nonlocal forwards
        forwards += 1
        return engine.forward(tokens, start=start, commit=commit, attention=attention, block_size=B,
                              kv_end=kv_end, rows=rows)

    # The cache holds K/V of the attention pattern it was computed with: never mix with an AR turn's.
    engine.reset()
    if kv_ids is not None:
        kv_ids.clear()
    try:
        if budget <= 0:
            reason = STOP_LENGTH if max_new_tokens <= 0 else STOP_CONTEXT
            yield Done(_stats(0, 0, 0, 0.0, 0.0, len(prompt)), reason, "", [])
            return

        # Prefill: the prompt's whole blocks, committed.
        t = clock()
        n_full = len(prompt) // B * B
        first = None
        if n_full:
            logits = run(prompt[:n_full], 0, True, [n_full - 1])
            if kv_ids is not None:
                kv_ids.extend(prompt[:n_full])
            if n_full == len(prompt):  # the prompt ends on a block boundary: its last row predicts slot 0
                first = _sample_one(sampler, logits[0], reply.context)
        busy += clock() - t

        block_start = n_full
        known = prompt[n_full:] if first is None else [first]
        n_prompt_slots = len(prompt) - n_full  # slots of this block that belong to the prompt
        while True:
            t = clock()
            # block slots: known ids, then masks up to B (fewer at the end of the budget or context)
            room = min(B, engine.ctx - block_start, len(prompt) + budget - block_start)
            block = known + [mask] * max(room - len(known), 0)
            events = []
            for i in range(n_prompt_slots, len(known)):  # the predicted first slot is resolved already
                ev = reply.resolve(block[i])
                if ev is not None:
                    events.append(ev)
            emitted = len(known)
            busy += clock() - t
            for ev in events:
                if not ttft:
                    ttft = busy
                yield ev
            if reply.stop_reason is not None:
                break

            # Sub-blocks left to right, each until it has no masks.
            for lo in range(0, len(block), S):
                hi = min(lo + S, len(block))
                first_step = True
                while any(block[j] == mask for j in range(lo, hi)):
                    t = clock()
                    masked = [j for j in range(lo, hi) if block[j] == mask]  # j >= 1: slot 0 is always known
                    rows = [j - 1 for j in masked]
                    if dual_cache and not first_step:
                        q0 = max(lo - 1, 0)                              # queries: rows lo-1 .. hi-2
                        logits = run(block[q0:hi - 1], block_start + q0, False, [r - q0 for r in rows],
                                     kv_end=block_start + len(block))
                    else:
                        logits = run(block, block_start, False, rows)
                    first_step = False
                    steps += 1
                    tokens, probs = sampler(logits, reply.context)
                    fill = _choose(masked, np.asarray(probs), thr, causal)
                    for j in fill:
                        block[j] = int(tokens[masked.index(j)])
                    # stream the resolved prefix
                    events = []
                    while emitted < len(block) and block[emitted] != mask and reply.stop_reason is None:
                        ev = reply.resolve(block[emitted])
                        emitted += 1
                        if ev is not None:
                            events.append(ev)
                    busy += clock() - t
                    yield Step(block_start, tuple(block), tuple(fill), mask)
                    for ev in events:
                        if not ttft:
                            ttft = busy
                        yield ev
                    if reply.stop_reason is not None:
                        break
                if reply.stop_reason is not None:
                    break
            if reply.stop_reason is not None:
                break

            # The block is complete: commit its K/V from its final ids; the last row predicts the next slot.
            t = clock()
            logits = run(block, block_start, True, [len(block) - 1])
            if kv_ids is not None:
                kv_ids.extend(block)  # (cleared at the end: these K/V used the diffusion attention pattern)
            block_start += len(block)
            n_prompt_slots = 0
            known = [_sample_one(sampler, logits[0], reply.context)]
            busy += clock() - t
            if block_start >= engine.ctx:
                reply.stop_reason = STOP_CONTEXT
                break

        t = clock()
        if detokenizer is not None:
            detokenizer.flush()
            text = detokenizer.text
        else:
            text = ""
        busy += clock() - t
        reason = reply.stop_reason
        if reason == "budget":
            reason = STOP_LENGTH if len(reply.ids) >= max_new_tokens else STOP_CONTEXT
        yield Done(_stats(len(reply.ids), forwards, steps, busy, ttft, len(prompt)), reason, text, list(reply.ids))
    finally:
        # an AR turn must not reuse K/V computed with the diffusion pattern
        engine.reset()
        if kv_ids is not None:
            kv_ids.clear()


def _sample_one(sampler, logits_row, context) -> int:
    return int(sampler(logits_row, context)[0])


def _choose(masked: list[int], probs: np.ndarray, threshold: float, causal: bool) -> list[int]:
    """Slots to fill this step: every one above the threshold, plus the floor (leftmost for causal
    attention, the most confident otherwise), so each step fills at least one slot."""
    fill = {masked[i] for i in np.flatnonzero(probs > threshold)}
    fill.add(masked[0] if causal else masked[int(np.argmax(probs))])
    return sorted(fill)


def _stats(tokens, forwards, steps, total_s, ttft_s, prompt_tokens) -> dict:
    return {
        "tokens": tokens,
        "forwards": forwards,            # every engine call: prefill, denoising steps, block commits
        "steps": steps,                  # denoising forwards only
        "tokens_per_forward": tokens / forwards if forwards else 0.0,
        "tokens_per_step": tokens / steps if steps else 0.0,
        "tok_s": tokens / total_s if total_s > 0 else 0.0,
        "ttft_s": ttft_s,
        "prompt_tokens": prompt_tokens,
        "total_s": total_s,
    }
