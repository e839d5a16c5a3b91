"""The threshold fill rule of block diffusion (Fast-dLLM v2's): a filled slot is final at once.

A step fills every masked slot of its sub-block whose sampled token is more than `threshold` sure (the sampler's
probability of it), plus one floor slot, so that each step fills at least one:
  - causal attention: the leftmost masked slot (its row sees exactly the final slots before it: AR's prediction);
  - block attention: the most confident masked slot.

The fill rules share one face, which the diffusion loop (diffusion.py) calls; exact.py's ExactRule is the other:
    rule.start_block(known)                        # a new block, its first `known` slots final
    rule.rows_wanted(masked) -> slots              # the slots whose predicting rows (slot - 1) a step reads
    rule.fill(block, masked, rows, context)        # what a step settles: fills slots in place, returns them
    rule.final(block) -> n                         # slots [0, n) are final (the rest: drafts and masks)
    rule.unchecked(block) -> slot | None           # the first draft a block's commit must still check
    rule.check_at_commit(block, rows, context)     # -> the slot a rejected draft reopens the block at, or None
    rule.drafts_checked, rule.drafts_kept          # the figures ("drafted", "kept" in the stats)
Shapes: rows (R, V) float32 logits, rows[i] predicting slot wanted[i]; context: the repetition penalty's ids
(None without a penalty).
"""


class ThresholdRule:
    fills_are_final = True  # Step.settled stays None: no filled slot is taken back

    def __init__(self, sampler, threshold: float, causal: bool):
        self.sampler, self.threshold, self.causal = sampler, threshold, causal
        self.drafts_checked = 0  # fills beyond the floor (all of them stand, so drafts_kept is the same number)

    @property
    def drafts_kept(self) -> int:
        return self.drafts_checked

    def start_block(self, known: int) -> None:
        pass

    def rows_wanted(self, masked: list[int]) -> list[int]:
        return masked

    def fill(self, block: list, masked: list[int], rows, context) -> list[int]:
        tokens, probs = self.sampler(rows, context)
        chosen = choose(masked, tokens.tolist(), probs.tolist(), self.threshold, self.causal)
        for j, token in chosen:
            block[j] = token
        self.drafts_checked += len(chosen) - 1
        return [j for j, _ in chosen]

    def final(self, block: list) -> int:
        return len(block)

    def unchecked(self, block: list) -> None:
        return None

    def check_at_commit(self, block: list, rows, context) -> None:
        return None  # never asked: unchecked() is None, every fill is final


def choose(masked: list[int], tokens: list[int], probs: list[float], threshold: float,
           causal: bool) -> list[tuple[int, int]]:
    """(slot, id) to fill this step, by slot: every one above the threshold, plus the floor (leftmost for causal
    attention, the most confident otherwise), so each step fills at least one slot. Plain lists: at most a
    sub-block of them, where numpy calls would cost more than the work."""
    floor = 0 if causal else probs.index(max(probs))  # index(max): the first on ties, as argmax
    return [(j, t) for i, (j, t, p) in enumerate(zip(masked, tokens, probs)) if p > threshold or i == floor]
