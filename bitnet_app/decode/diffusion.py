"""Block-diffusion decoding, Fast-dLLM v2 style.

    for ev in generate_diffusion(engine, prompt_ids, params, stop_ids={...}, detokenizer=tok.detokenizer()):
        ...  # Step after every forward, Token for each newly resolved slot (in order), then Done

params: a DecodeParams (bitnet_app/params.py) resolved for this model (Model.decode_params): block_size,
sub_block_size, threshold, attention, fill_rule, mask_id, dual_cache, max_new_tokens and the sampling knobs;
`sampler` replaces the one they describe (tests hand in the numpy kernels).

The sequence is cut into blocks of B slots aligned to absolute positions 0, B, 2B, ... A block holds
what is already known (the prompt's tail, or the token predicted by the previous block) followed by
MASK slots up to B: a block is always B whole slots, also when the reply's budget ends inside it (the
model was trained on whole blocks; under block attention every slot sees the whole block, so a shorter
block would change every logit in it). Only the context end may cut a block. The reply is cut to
max_new_tokens as its slots resolve, and decoding stops there: the tokens before the cut are exactly
those of a longer reply. Sub-blocks of S slots are decoded left to right; each step is one uncommitted
forward of the block against the cache (token shift: the logits of slot j-1 predict slot j), then
every masked slot of the sub-block whose confidence (probability of the sampled token) exceeds the
threshold is filled, plus one floor slot, so that each step fills at least one:
  - block attention: the most confident masked slot of the sub-block (Fast-dLLM v2's rule);
  - causal attention: the leftmost masked slot. Its logits see exactly the resolved prefix, so its
    prediction is the AR prediction; threshold 1.0 with causal attention is therefore greedy AR.
That is the threshold fill rule (threshold.py): a filled slot is final at once. The exact rule (fill_rule="exact",
causal attention; exact.py) keeps the threshold's fills as drafts and checks them with the rows the next step re-runs
anyway: a draft stands only if it is what AR writes there, given the final slots before it; the first slot that
is not kept takes AR's choice and the drafts after it are masked again. Steps go to the sub-block of the first
masked slot (left to right; the exact rule may reopen an earlier one).
A finished block is run once more and COMMITTED, so no K/V computed from MASK inputs stays in the
cache; the last row of that pass predicts the next block's first slot (under the exact rule the same pass checks
the drafts still unchecked, and a rejection cuts the cache back and reopens the block).

Shapes: engine.forward(block, rows=R) -> (len(R), V) float32; sampler((R, V)) -> tokens (R,), probs (R,).
Queries (see _Run.query_span): causal attention runs only the slots from the first one whose scratch
K/V is stale (filled since it was last run) to the last masked one, and a finished block's commit keeps
the scratch K/V of its slots that were already final and runs only the rest (exact: no slot sees a
later one, so a slot's K/V depends only on the ids up to it). Block attention
runs the whole block every step (exact), unless DualCache (dual_cache=True) asks to re-run only the
sub-block's slots (and the one before it, whose row predicts the first) after the sub-block's first
step, against the block's scratch K/V (engine kv_end): an approximation, since the other slots' K/V
are from the sub-block's first step.
"""
import numpy as np

from .context import check_prompt_fits
from .events import STOP_CONTEXT, STOP_LENGTH, STOP_TOKEN, Done, Step, Token
from .exact import ExactRule
from .sampling import Sampler
from .stopwatch import Stopwatch
from .threshold import ThresholdRule


class _Reply:
    """The reply as it is resolved: ids in order, streamed text, the stop decision."""

    def __init__(self, prompt, stop_ids, max_new_tokens, context, detokenizer):
        self.prompt = prompt
        self.ids: list[int] = []
        self.stop_ids = stop_ids
        self.max_new_tokens = max_new_tokens
        self.budget = min(max_new_tokens, context - len(prompt))  # the whole reply stays inside the context
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
            self.stop_reason = STOP_LENGTH if len(self.ids) >= self.max_new_tokens else STOP_CONTEXT
        return Token(token, piece)

    def text(self) -> str:
        """The whole reply's text, a held-back incomplete character included ("" without a detokenizer)."""
        if self.detokenizer is None:
            return ""
        self.detokenizer.flush()
        return self.detokenizer.text

    @property
    def context(self):
        return self.prompt + self.ids

    @property
    def done(self) -> bool:
        return self.stop_reason is not None


def _fill_rule(params, sampler):
    """The fill rule's object (threshold.py gives the face both share)."""
    if params.fill_rule == "exact":  # causal attention only (params.py refuses it with block attention)
        return ExactRule(sampler, params.threshold, params.mask_id)
    return ThresholdRule(sampler, params.threshold, params.attention == "causal")


class _Run:
    """One reply: the engine calls, the block bookkeeping and the figures (work time excludes yields)."""

    def __init__(self, engine, prompt, sampler, reply, params, kv_ids):
        self.engine, self.prompt, self.sampler, self.reply = engine, prompt, sampler, reply
        self.B, self.S = params.block_size, params.sub_block_size
        self.attention, self.mask, self.dual_cache = params.attention, params.mask_id, params.dual_cache
        self.causal = self.attention == "causal"
        self.kv_ids = kv_ids
        self.rule = _fill_rule(params, sampler)
        self.fresh = 0  # causal attention: the block's leading slots whose scratch K/V are those of their final ids
        self.forwards = self.steps = 0
        self.ttft = 0.0
        # where the time goes (see _stats): all work, engine calls, denoising steps, the engine calls of the steps
        self.work, self.engine_time, self.step_time = Stopwatch(), Stopwatch(), Stopwatch()
        self.step_engine_s = 0.0

    def engine_call(self, tokens, start, commit, rows, kv_end=None):
        """One engine.forward, counted (stats "forwards") and timed, with the committed ids recorded."""
        self.forwards += 1
        with self.engine_time:
            logits = self.engine.forward(tokens, start=start, commit=commit, attention=self.attention,
                                         block_size=self.B, kv_end=kv_end, rows=rows)
        if commit:
            self.record_committed(start, tokens)
        return logits

    def record_committed(self, start, tokens) -> None:
        """kv_ids (the caller's record of the cache) now holds `tokens` from `start` on."""
        if self.kv_ids is not None:
            del self.kv_ids[start:]
            self.kv_ids.extend(tokens)

    def context(self):
        """The ids so far, for a repetition penalty; None when the sampler has none (nothing to build)."""
        return self.reply.context if self.sampler.repetition_penalty != 1.0 else None

    def sample_one(self, logits_row) -> int:
        return int(self.sampler(logits_row, self.context())[0])

    def first_block(self) -> tuple[int, list[int], int]:
        """Commit the prompt's whole blocks; return (start, known ids, how many of them are prompt) of the
        first block to decode: the prompt's tail, or, when the prompt ends on a block boundary, the token
        its last row predicts."""
        n_full = len(self.prompt) // self.B * self.B
        if n_full:
            logits = self.engine_call(self.prompt[:n_full], 0, True, [n_full - 1])
            if n_full == len(self.prompt):
                return n_full, [self.sample_one(logits[0])], 0
        tail = list(self.prompt[n_full:])
        return n_full, tail, len(tail)

    def query_span(self, lo: int, hi: int, n: int, first_step: bool, wanted: list[int]) -> tuple[int, int, int | None]:
        """(q0, q1, kv_end or None): the block slots [q0, q1) to run as queries for a step on the
        sub-block [lo, hi) of an n-slot block, and how far into the block the keys reach.

        The step needs the logits of rows j-1 for the slots j in `wanted` (token shift; the fill rule says which).
        Causal attention (exact): no row sees a later slot, and a slot's K/V depends only on the ids up to it.
        So the rows from the first stale one (self.fresh: every earlier slot's scratch K/V is from its final
        id) or the first needed one, whichever comes first, to the last needed one run, against the scratch
        K/V earlier steps wrote for the slots before them.
        Block attention: every slot sees the whole block, so all n slots run (exact); under DualCache,
        after the sub-block's first step, only lo-1 .. hi-1 run, against the scratch K/V of the other
        slots (kv_end = n): an approximation, since those K/V are from the sub-block's first step."""
        if self.causal:
            return min(self.fresh, wanted[0] - 1), wanted[-1], None
        if self.dual_cache and not first_step:
            return max(lo - 1, 0), hi, n
        return 0, n, None

    def step(self, block, block_start, lo, hi, first_step) -> list[int]:
        """One denoising forward for the sub-block [lo, hi); the fill rule fills slots in place; returns which."""
        engine_before = self.engine_time.seconds
        with self.step_time:
            masked = [j for j in range(lo, hi) if block[j] == self.mask]  # j >= 1: slot 0 is always known
            wanted = self.rule.rows_wanted(masked)
            q0, q1, kv_end = self.query_span(lo, hi, len(block), first_step, wanted)
            # token shift: the row of slot j-1 predicts slot j
            logits = self.engine_call(block[q0:q1], block_start + q0, False, [j - 1 - q0 for j in wanted],
                                      kv_end=None if kv_end is None else block_start + kv_end)
            self.steps += 1
            filled = self.rule.fill(block, masked, logits, self.context())
            self.fresh = min(q1, filled[0])  # slots [0, q1) were written now or before; a filled slot's K/V is stale
        self.step_engine_s += self.engine_time.seconds - engine_before
        return filled

    def commit(self, block, block_start) -> np.ndarray | None:
        """Commit the finished block's K/V; return the logits row of its last slot (it predicts the next block's
        first slot). Causal attention: the scratch K/V of the slots before self.fresh are already those of the
        final ids, so they are kept as they are and only the later slots run (the last one always does).
        A fill rule with drafts still unchecked (the exact rule) checks them with the same forward's rows; when one
        does not stand, the cache is cut back to it, the block reopens (its later drafts masked again) and None is
        returned."""
        n = len(block)
        check_from = self.rule.unchecked(block)
        keep = min(self.fresh, n - 1) if self.causal else 0
        if check_from is not None:
            keep = min(keep, check_from - 1)
        if keep:
            self.engine.keep_scratch(block_start + keep)
            self.record_committed(block_start, block[:keep])
        self.fresh = 0
        rows = [n - 1 - keep] if check_from is None else list(range(check_from - 1 - keep, n - keep))
        logits = self.engine_call(block[keep:], block_start + keep, True, rows)
        if check_from is not None:
            reopened = self.rule.check_at_commit(block, logits, self.context())
            if reopened is not None:  # the draft there did not stand: its K/V and all after it go
                self.engine.truncate(block_start + reopened)
                if self.kv_ids is not None:
                    del self.kv_ids[block_start + reopened:]
                self.fresh = reopened
                return None
        return logits[-1]

    def resolve_prefix(self, block, emitted: int) -> tuple[int, list]:
        """Token events for the block's slots that became final in order, from slot `emitted` on."""
        events = []
        final = self.rule.final(block)
        while emitted < final and block[emitted] != self.mask and not self.reply.done:
            ev = self.reply.resolve(block[emitted])
            emitted += 1
            if ev is not None:
                events.append(ev)
        return emitted, events

    def emit(self, events):
        for ev in events:
            if isinstance(ev, Token) and not self.ttft:
                self.ttft = self.work.seconds
            yield ev

    def blocks(self):
        """The events of every block, from the first one after the prompt's whole blocks to the reply's end."""
        with self.work:
            block_start, known, prompt_slots = self.first_block()
        while not self.reply.done:
            # the block: known ids, then masks up to B whole slots, also when the budget ends inside it
            # (the model only ever saw whole blocks; the reply is cut to the budget as it resolves).
            # Only the context end may cut a block.
            with self.work:
                block = known + [self.mask] * max(min(self.B, self.engine.ctx - block_start) - len(known), 0)
                self.rule.start_block(len(known))
                emitted, events = self.resolve_prefix(block, prompt_slots)  # a predicted first slot is final already
            yield from self.emit(events)
            last = yield from self.block_steps(block, block_start, emitted)
            if self.reply.done:
                return
            # the last row of the committed block predicts the next block's first slot
            with self.work:
                block_start, known, prompt_slots = block_start + len(block), [self.sample_one(last)], 0
            if block_start >= self.engine.ctx:
                self.reply.stop_reason = STOP_CONTEXT

    def block_steps(self, block, block_start, emitted):
        """Steps on one block until it is complete and committed (or the reply ends); yields the Step and Token
        events, returns the committed block's last logits row (None when the reply ended first)."""
        last, lo = None, None
        while last is None and not self.reply.done:
            with self.work:
                if self.mask in block:  # a step on the sub-block of the first mask (sub-blocks go left to right)
                    first = block.index(self.mask) // self.S * self.S
                    first_step, lo = first != lo, first
                    filled = self.step(block, block_start, lo, min(lo + self.S, len(block)), first_step)
                    settled = None if self.rule.fills_are_final else self.rule.final(block)
                    step = Step(block_start, tuple(block), tuple(filled), self.mask, settled)
                else:  # complete: commit its K/V from its final ids (the exact rule may reopen it, see commit)
                    last, step = self.commit(block, block_start), None
                emitted, events = self.resolve_prefix(block, emitted)
            if step is not None:
                yield step
            yield from self.emit(events)
        return last


def generate_diffusion(engine, prompt_ids, params, *, sampler=None, stop_ids=(), detokenizer=None,
                       kv_ids: list | None = None):
    """Block-diffusion events for prompt_ids with the knobs of `params` (a DecodeParams resolved for this model,
    as Model.generate makes it: the checkpoint's block size, attention and mask id filled in)."""
    prompt = [int(i) for i in prompt_ids]
    params = params.ready_for(engine.vocab_size)
    if params.mode != "diffusion":
        raise ValueError(f"generate_diffusion runs mode 'diffusion', not {params.mode!r}")
    check_prompt_fits(len(prompt), engine.ctx)
    reply = _Reply(prompt, {int(i) for i in stop_ids}, params.max_new_tokens, engine.ctx, detokenizer)
    run = _Run(engine, prompt, sampler or Sampler.from_params(params, engine), reply, params, kv_ids)

    # The cache holds K/V of the attention pattern it was computed with: never mix with an AR turn's.
    engine.reset()
    if kv_ids is not None:
        kv_ids.clear()
    try:
        if reply.budget <= 0:
            reason = STOP_LENGTH if params.max_new_tokens <= 0 else STOP_CONTEXT
            yield Done(_stats(run, 0, len(prompt)), reason, "", [])
            return
        yield from run.blocks()
        with run.work:
            text = reply.text()
        yield Done(_stats(run, len(reply.ids), len(prompt)), reply.stop_reason, text, list(reply.ids))
    finally:
        # an AR turn must not reuse K/V computed with the diffusion pattern
        engine.reset()
        if kv_ids is not None:
            kv_ids.clear()


def _stats(run: _Run, tokens: int, prompt_tokens: int) -> dict:
    forwards, steps, total_s = run.forwards, run.steps, run.work.seconds
    drafted, kept = run.rule.drafts_checked, run.rule.drafts_kept
    return {
        "tokens": tokens,
        "forwards": forwards,            # every engine call: prefill, denoising steps, block commits
        "steps": steps,                  # denoising forwards only
        "tokens_per_forward": tokens / forwards if forwards else 0.0,
        "tokens_per_step": tokens / steps if steps else 0.0,  # tokens that stand: the reply's
        "drafted": drafted,              # slots filled above the threshold and checked (the threshold rule: all stand)
        "kept": kept,                    # ... of which stood
        "kept_share": kept / drafted if drafted else 1.0,
        "tok_s": tokens / total_s if total_s > 0 else 0.0,
        "ttft_s": run.ttft,
        "prompt_tokens": prompt_tokens,
        "total_s": total_s,              # all work inside the generator (never across a yield)
        "engine_s": run.engine_time.seconds,  # inside engine.forward: prefill, steps and commits
        "step_s": run.step_time.seconds,      # denoising steps: their forwards, sampling and the choice of slots
        "step_engine_s": run.step_engine_s,   # the forwards' part of step_s
    }
