"""The exact fill rule of block diffusion: a drafted slot stands only if it is what AR would have written there.

Causal attention only. There the row of slot j-1 sees only the slots before it, so once they are final its
logits are AR's own prediction for slot j. The slots of a block are final up to `settled`; after them come
drafts (slots filled above the threshold, not yet checked) and masks. A denoising step runs the rows of every
slot from `settled` to the sub-block's last mask, and the rule walks them left to right:
  - a draft x is checked against its row: greedy keeps it when it is the row's argmax; sampled keeps it with
    probability min(1, p(x) / q(x)) (speculative sampling), p the row's distribution after the sampler's
    processing (repetition penalty over the final ids before the slot, temperature, top-k, top-p), q the
    distribution x was drawn from;
  - the first masked slot takes the row's own choice (AR's: the floor that makes every step fill one slot);
  - a rejected draft is replaced by the row's choice (greedy: its argmax; sampled: a draw from max(0, p - q),
    normalized) and every draft after it is dropped (masked again): their rows saw the rejected token.
The walk stops at the first slot it fills. The masked slots after a floor then get drafts from their rows (every
one more than `threshold` sure), which a later step's rows check. With these rules each token of the reply has
AR's distribution at the same settings (greedy: the reply is greedy AR's), whatever the drafts were.

q, exactly: a slot is drafted only when the token drawn for it is more than `threshold` sure, so a draft is a draw
from the sampler's distribution restricted to the ids above the threshold and renormalized (draft_distribution;
for a threshold >= 0.5 that is the one such id). Accepting against that q is what keeps the rule exact.

Shapes: rows (R, V) float32 logits, row i predicting slot settled + i; distributions (V,) float64.
"""
import numpy as np


def draft_distribution(q: np.ndarray, threshold: float) -> np.ndarray:
    """(V,) the distribution a draft is drawn from, given that one was made: q on the ids above the threshold,
    renormalized (all zeros when none is)."""
    kept = np.where(q > threshold, q, 0.0)
    total = kept.sum()
    return kept / total if total > 0 else kept


def accepts(p: np.ndarray, q: np.ndarray, x: int, u: float) -> bool:
    """Speculative sampling's test for a draft x ~ q against the target p, with u ~ U[0, 1): u < p(x) / q(x)."""
    return u * q[x] < p[x]


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(V,) what a rejected draft's slot is drawn from: max(0, p - q), normalized (p itself if that is all zero,
    which a rejection never meets: then p >= q everywhere, and p(x) >= q(x) accepts every draft)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def draw(dist: np.ndarray, u: float) -> int:
    """One id from a (V,) distribution with u ~ U[0, 1): inverse CDF in id order."""
    cdf = np.cumsum(dist)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(dist) - 1)


# how a walk over the rows ended (ExactRule._walk)
FLOOR = "floor"         # it filled a masked slot with AR's choice: only then may the masked slots after it be drafted
REPLACED = "replaced"   # a draft did not stand: AR's choice took its slot, and the drafts after it are masked again
ALL_KEPT = "kept"       # the rows reached the block's last slot and every draft stood


class ExactRule:
    """The exact fill rule of one reply, with the fill rules' face (threshold.py): the block's final slots
    [0, settled), the distribution of every draft not yet checked, and the figures."""
    fills_are_final = False  # Step.settled tells the final slots; the filled slots after them are drafts

    def __init__(self, sampler, threshold: float, mask: int):
        self.sampler, self.threshold, self.mask = sampler, threshold, mask
        self.settled = 0                    # the block's slots [0, settled) are final
        self.q: dict[int, np.ndarray] = {}  # drafted slot -> its q (sampled only: greedy's q is its argmax)
        self.drafts_checked = 0             # drafts checked: kept, replaced or dropped (masked again)
        self.drafts_kept = 0                # ... of which stood

    def start_block(self, known: int) -> None:
        self.settled = known
        self.q.clear()

    def rows_wanted(self, masked: list[int]) -> list[int]:
        """The rows of the slots from `settled` to the first masked one (the drafts to check, then the floor) and
        of the masked slots after it (new drafts). A draft after the floor is checked by a later step's rows, so
        its row is not asked for now."""
        return [*range(self.settled, masked[0] + 1), *masked[1:]]

    def fill(self, block: list, masked: list[int], rows: np.ndarray, context) -> list[int]:
        """rows as rows_wanted(masked) asks: check the drafts, fill the first slot that is not kept, then draft the
        masked slots after a floor. Returns the filled slots."""
        n_check = masked[0] + 1 - self.settled
        ended = self._walk(block, rows[:n_check], context)
        filled = [self.settled - 1]
        if ended == FLOOR:  # the floor is masked[0]; rows after it saw it masked: they only draft, for a later step
            filled += self._draft(block, masked[1:], rows[n_check:], context)
        return filled

    def final(self, block: list) -> int:
        return self.settled

    def unchecked(self, block: list) -> int | None:
        """The first slot a finished block's commit still checks (its drafts after the last step's floor)."""
        return self.settled if self.settled < len(block) else None

    def check_at_commit(self, block: list, rows: np.ndarray, context) -> int | None:
        """rows[i]: the committed row that predicts slot unchecked(block) + i. Returns the slot of a draft that did
        not stand (AR's choice is there now, the block reopens: its K/V and all after it go), or None."""
        return self.settled - 1 if self._walk(block, rows, context) == REPLACED else None

    def _contexts(self, block, n: int, context):
        """The repetition-penalty context of each of the n slots from `settled` on: the final ids before it
        (context, then the block's slots from `settled` up to it); None when the sampler has no penalty."""
        if context is None:
            return [None] * n
        return [list(context) + list(block[self.settled:s]) for s in range(self.settled, self.settled + n)]

    def _walk(self, block: list, rows: np.ndarray, context) -> str:
        """Walk the slots from `settled` on (block changed in place, `settled` moved past the walk) with rows[i]
        the re-run row that predicts slot settled + i; context: the final ids before slot `settled` (prompt and
        reply), or None without a repetition penalty. Returns how the walk ended: FLOOR, REPLACED or ALL_KEPT."""
        n = min(len(rows), len(block) - self.settled)  # rows past the block's last slot predict the next block
        floor, verdict = self._judges(block, rows[:n], context)
        for i in range(n):
            s = self.settled + i
            x = block[s]
            if x == self.mask:
                block[s] = floor(i)  # the floor: what AR writes here
                self.settled = s + 1
                return FLOOR
            kept, token = verdict(i, s, x)
            self.drafts_checked += 1
            self.drafts_kept += kept
            if not kept:
                block[s] = token
                self._drop_after(block, s)
                self.settled = s + 1
                return REPLACED
        self.settled += n
        return ALL_KEPT

    def _judges(self, block: list, rows: np.ndarray, context):
        """(floor, verdict) for the walk over rows: floor(i) is AR's id for slot settled + i; verdict(i, s, x) is
        (whether draft x at slot s stands, the id there)."""
        if self.sampler.greedy and context is None:  # AR's choice of every row at once (ids only: no confidence)
            ar = self.sampler.greedy_ids(rows).tolist()
            return ar.__getitem__, lambda i, s, x: (ar[i] == x, ar[i])
        contexts = self._contexts(block, len(rows), context)  # row by row, each with the penalty context of its slot

        def floor(i):
            return int(self.sampler(rows[i], contexts[i])[0])

        return floor, lambda i, s, x: self._check(s, x, rows[i], contexts[i], lambda: floor(i))

    def _check(self, s: int, x: int, row, ctx, choice) -> tuple[bool, int]:
        """(whether draft x at slot s stands, the id that stands there); choice() is AR's id there (greedy)."""
        if self.sampler.greedy:
            ar = choice()
            return ar == x, ar
        p, q = self.sampler.distribution(row, ctx), self.q.pop(s)
        if accepts(p, q, x, self.sampler.rng.random()):
            return True, x
        return False, draw(residual(p, q), self.sampler.rng.random())

    def _drop_after(self, block: list, s: int) -> None:
        """Mask every draft after slot s again: its row saw a token that did not stand."""
        for j in range(s + 1, len(block)):
            if block[j] != self.mask:
                block[j] = self.mask
                self.q.pop(j, None)
                self.drafts_checked += 1

    def _draft(self, block: list, slots: list[int], rows: np.ndarray, context) -> list[int]:
        """Fill the masked `slots` whose token is more than `threshold` sure (rows[i] predicts slots[i]); returns
        them. Sampled drafts keep their q for the check."""
        if not slots:
            return []
        if self.sampler.greedy:
            tokens, probs = self.sampler(rows, context)
            chosen = [(j, t) for j, t, p in zip(slots, tokens.tolist(), probs.tolist()) if p > self.threshold]
        else:
            chosen = []
            for j, row in zip(slots, rows):
                q = self.sampler.distribution(row, context)
                x = draw(q, self.sampler.rng.random())
                if q[x] > self.threshold:
                    chosen.append((j, x))
                    self.q[j] = draft_distribution(q, self.threshold)
        for j, x in chosen:
            block[j] = x
        return [j for j, _ in chosen]
