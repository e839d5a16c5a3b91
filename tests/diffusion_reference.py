"""A slow, independent block-diffusion decoder for the tests: the numpy forward over the WHOLE sequence
with an explicit attention mask at every step, no KV cache, no scratch tricks.

Why full recompute equals the engine's cache: with the block pattern (key k visible to query q iff
k // B <= q // B) or the causal one, no earlier position ever sees a later block, so the K/V of finished
blocks do not depend on what the current block holds.

Every block has B whole slots (masks up to B), also when the budget ends inside it: only the context
end (ctx, when given) cuts a block. The reply is cut to max_new_tokens as it resolves.

Returns (generated ids, per-step fills, stop reason), the fills as lists of slot indices per forward.
"""
import numpy as np

from bitnet_app.engine.reference import block_mask, causal_mask


def reference_diffusion(ref, prompt, *, sampler, stop_ids, max_new_tokens, block_size, sub_block_size,
                        threshold, attention, mask_id, head="exact", ctx=None):
    B, S = block_size, sub_block_size
    budget = max_new_tokens if ctx is None else min(max_new_tokens, ctx - len(prompt))
    stop_ids = set(stop_ids)
    seq = list(prompt)            # resolved ids (prompt + reply so far)
    out, fills = [], []

    def logits_at(tokens, rows):
        n = len(tokens)
        mask = block_mask(n, B) if attention == "block" else causal_mask(n)
        return ref.logits(np.asarray(tokens), mask=mask, head=head)[rows]

    def finished():
        return len(out) >= budget

    # the first slot of a block that starts right after the prompt or a finished block
    def predict_next(seq_now):
        return int(sampler(logits_at(seq_now, [len(seq_now) - 1])[0], list(seq_now))[0])

    def resolve(tok):
        """Append one id in order; the stop reason if the reply ends here, else None."""
        if tok in stop_ids:
            return "stop"
        out.append(tok)
        seq.append(tok)
        if finished():
            return "length" if len(out) >= max_new_tokens else "context"
        return None

    block_start = len(prompt) // B * B
    known = list(prompt[block_start:])
    if not known:
        known = [predict_next(seq)]
    while True:
        for tok in known[len(seq) - block_start:]:  # a predicted first slot (not prompt) is final at once
            if reason := resolve(tok):
                return out, fills, reason
        room = B if ctx is None else min(B, ctx - block_start)  # whole blocks; only the context end cuts one
        block = known + [mask_id] * (room - len(known))
        for lo in range(0, len(block), S):
            hi = min(lo + S, len(block))
            while any(block[j] == mask_id for j in range(lo, hi)):
                masked = [j for j in range(lo, hi) if block[j] == mask_id]
                full = seq[:block_start] + block
                lg = logits_at(full, [block_start + j - 1 for j in masked])
                toks, probs = sampler(lg, list(seq))
                chosen = {masked[i] for i, p in enumerate(probs) if p > threshold}
                chosen.add(masked[0] if attention == "causal" else masked[int(np.argmax(probs))])
                for j in sorted(chosen):
                    block[j] = int(toks[masked.index(j)])
                fills.append(sorted(chosen))
                # resolve the in-order prefix
                while len(seq) - block_start < len(block) and block[len(seq) - block_start] != mask_id:
                    if reason := resolve(block[len(seq) - block_start]):
                        return out, fills, reason
        block_start += len(block)
        if ctx is not None and block_start >= ctx:
            return out, fills, "context"
        known = [predict_next(seq)]
