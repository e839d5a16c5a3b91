"""Choosing the next token from logits: small pure numpy functions, then a Sampler that chains them.

Shapes: logits (V,) for one position or (R, V) for R positions (the diffusion decoder samples a
whole sub-block at once); every function works on the last axis and returns a new array.

Order (the Hugging Face one): banned ids -> repetition penalty -> temperature -> top-k -> top-p ->
softmax -> draw. Temperature 0 means greedy (argmax). The sampler returns the chosen token and its
probability under the final distribution (the diffusion decoder uses it as confidence; for greedy it
is the softmax probability of the argmax).
"""
import numpy as np

NEG_INF = -np.inf


def ban_ids(logits: np.ndarray, banned) -> np.ndarray:
    """Set the logits of `banned` ids to -inf (e.g. the mask token, which is never a prediction)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    banned = np.asarray(list(banned), dtype=np.int64)
    if banned.size:
        out[..., banned] = NEG_INF
    return out


def repetition_penalty(logits: np.ndarray, context_ids, penalty: float) -> np.ndarray:
    """CTRL rule (as in HF): for every id already in the context, divide a positive logit by
    `penalty` and multiply a negative one by it (each id once, however often it occurred)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0 or context_ids is None or len(context_ids) == 0:
        return out
    if penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, not {penalty}")
    ids = np.unique(np.asarray(context_ids, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < out.shape[-1])]
    picked = out[..., ids]
    out[..., ids] = np.where(picked > 0, picked / penalty, picked * penalty)
    return out


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    if temperature <= 0:
        raise ValueError("temperature must be > 0 here (0 means greedy, handled by the caller)")
    return np.asarray(logits, dtype=np.float32) / np.float32(temperature)


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the k largest logits per row (ties at the k-th value are kept too); 0 or >= V keeps all."""
    out = np.array(logits, dtype=np.float32, copy=True)
    v = out.shape[-1]
    if k <= 0 or k >= v:
        return out
    kth = np.partition(out, v - k, axis=-1)[..., v - k:v - k + 1]  # the k-th largest, kept dims
    out[out < kth] = NEG_INF
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    """float64 softmax over the last axis (-inf entries get probability 0)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=-1, keepdims=True)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus: keep the smallest set of most likely ids whose probability sum reaches p (at least one)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if p >= 1.0:
        return out
    if p <= 0:
        raise ValueError(f"top_p must be in (0, 1], not {p}")
    order = np.argsort(-out, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(softmax(out), order, axis=-1)
    before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass of the ids ranked above each id
    drop_sorted = before >= p                                   # the top id has before == 0: always kept
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    out[drop] = NEG_INF
    return out


class Sampler:
    """Greedy or stochastic next-token choice with a seeded np.random.Generator.

        s = Sampler(temperature=0.7, top_p=0.9, seed=1, banned_ids=[mask_id])
        tok, prob = s(logits_v, context_ids)          # (V,) -> int, float
        toks, probs = s(logits_rv, context_ids)       # (R, V) -> (R,) int64, (R,) float64
        tok = s.token(logits_v, context_ids)          # (V,) -> int, the same id without its probability
    """

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int | None = None, banned_ids=(), greedy_kernel=None,
                 sample_kernel=None):
        """greedy_kernel: an implementation of greedy_rows (same contract, e.g. the engine's C one,
        Engine.greedy_rows, which bans ids without copying the rows) for the greedy choice over several rows;
        None = this module's numpy one.
        sample_kernel: the same for the random draw, called (rows (R, V) float32, temperature, top_k, top_p,
        uniforms (R,), banned ids) -> (ids, probs) with the draws of _draw, the banned ids taken as -inf and the
        rows left alone (e.g. Engine.sample_rows); None = _draw."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {top_p}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, not {top_k}")
        if repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, not {repetition_penalty}")
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.repetition_penalty = float(repetition_penalty)
        self.banned_ids = [int(i) for i in banned_ids]
        self._banned = np.array(sorted(set(self.banned_ids)), dtype=np.int32)  # as greedy_rows takes them
        self._banned_set = frozenset(self.banned_ids)
        self.rng = np.random.default_rng(seed)
        self.greedy_rows = greedy_kernel or greedy_rows
        self.sample_rows = sample_kernel

    @classmethod
    def from_params(cls, params, engine=None) -> "Sampler":
        """The sampler a DecodeParams (bitnet_app/params.py) describes, its mask id banned (the mask is never a
        prediction); with the engine's C kernels (Engine.greedy_rows, Engine.sample_rows) when given one."""
        return cls(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                   repetition_penalty=params.repetition_penalty, seed=params.seed,
                   banned_ids=[] if params.mask_id is None else [params.mask_id],
                   greedy_kernel=getattr(engine, "greedy_rows", None), sample_kernel=getattr(engine, "sample_rows", None))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def distribution(self, logits: np.ndarray, context_ids=None) -> np.ndarray:
        """The final distribution the token is drawn from: float64, same shape as logits."""
        x = ban_ids(logits, self.banned_ids)
        x = repetition_penalty(x, context_ids, self.repetition_penalty)
        if not self.greedy:
            x = apply_temperature(x, self.temperature)
            x = top_k_filter(x, self.top_k)
            x = top_p_filter(x, self.top_p)
        return softmax(x)

    def __call__(self, logits: np.ndarray, context_ids=None):
        # Same maths as distribution() + an inverse-CDF draw, but without sorting the whole vocabulary:
        # the draw only looks at the few ids that can win (see _candidates). Greedy runs on all rows at
        # once (a diffusion step samples up to a sub-block of rows over a 128k vocabulary). The kernels
        # ban the ids themselves (no copy of the rows) unless a penalty changes the logits first.
        bans_itself = self.greedy or self.sample_rows is not None  # greedy_rows (numpy's too) and the C draw
        if bans_itself and self.repetition_penalty == 1.0:  # no copy of the rows here
            rows, banned = logits.reshape(-1, logits.shape[-1]), self._banned
        else:
            x = ban_ids(logits, self.banned_ids)  # a float32 copy: the caller's array is left alone
            if self.repetition_penalty != 1.0:
                x = repetition_penalty(x, context_ids, self.repetition_penalty)
            rows, banned = x.reshape(-1, x.shape[-1]), ()
        if self.greedy:
            tokens, probs = self.greedy_rows(rows, banned)
        elif self.sample_rows is not None:  # one uniform per row, in row order, as _draw takes them
            tokens, probs = self.sample_rows(rows, self.temperature, self.top_k, self.top_p,
                                             self.rng.random(len(rows)), banned)
        else:
            tokens = np.empty(len(rows), dtype=np.int64)
            probs = np.empty(len(rows), dtype=np.float64)
            for r, row in enumerate(rows):
                tokens[r], probs[r] = self._draw(row.astype(np.float64) / self.temperature)
        if logits.ndim == 1:
            return int(tokens[0]), float(probs[0])
        return tokens, probs

    def greedy_ids(self, rows: np.ndarray) -> np.ndarray:
        """(R, V) logits -> (R,) int64: each row's greedy choice without a repetition penalty (the ids __call__ gives
        at temperature 0), without the probabilities, which cost an exponential per logit: the exact rule's checks
        need the ids alone. The first largest logit that is not banned: argmax, unless it hit a banned id."""
        ids = np.argmax(rows, axis=-1)
        if not self._banned_set.isdisjoint(ids.tolist()):  # (a set, not np.isin: ~0.5 us against ~14)
            ids = np.argmax(ban_ids(rows, self.banned_ids), axis=-1)
        return ids

    def token(self, logits: np.ndarray, context_ids=None) -> int:
        """The id alone, for one position (V,): what AR needs. Greedy skips the probability (an exp over
        the whole vocabulary per token); otherwise the same draw as __call__."""
        if not self.greedy:
            return self(logits, context_ids)[0]
        if self.repetition_penalty == 1.0:
            return int(self.greedy_ids(logits[None])[0])
        x = repetition_penalty(ban_ids(logits, self.banned_ids), context_ids, self.repetition_penalty)
        return int(np.argmax(x))

    def _draw(self, z: np.ndarray) -> tuple[int, float]:
        """One draw from (V,) float64 tempered logits: top-k, then top-p, then inverse CDF in id order
        (so the same uniform picks the same id as a draw over the full distribution() would)."""
        keep = _candidates(z, self.top_k, self.top_p)
        zk = z if len(keep) == len(z) else z[keep]
        w = np.exp(zk - np.max(zk))
        q = w / w.sum()
        cdf = np.cumsum(q)
        i = min(int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="left")), len(keep) - 1)
        return int(keep[i]), float(q[i])


def greedy_rows(rows: np.ndarray, banned=()) -> tuple[np.ndarray, np.ndarray]:
    """(R, V) float32 logits, the `banned` ids taken as -inf -> argmax ids (R,) int64 and their softmax
    probabilities (R,) float64: 1 / sum(exp(x - max)), the exponentials in float32 (relative error ~1e-8),
    summed in float64; rows are left alone. The reference of the engine's C version (_kernels/greedy.c,
    Engine.greedy_rows)."""
    rows = ban_ids(rows, banned)  # a float32 copy
    tokens = np.argmax(rows, axis=-1)
    rows -= rows[np.arange(len(rows)), tokens][:, None]
    np.exp(rows, out=rows)
    return tokens, 1.0 / np.sum(rows, axis=-1, dtype=np.float64)


NUCLEUS_GUESSES = (256, 4096)  # top-p tries the best 256 ids, then 4096, then the whole pool


def _best(z: np.ndarray, k: int) -> np.ndarray:
    """Ids (ascending) of the k largest entries of z, with every id tied at the k-th value."""
    kth = np.partition(z, len(z) - k)[len(z) - k]
    return np.flatnonzero(z >= kth)


def _candidates(z: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Ids (ascending) that keep a nonzero probability after top-k then top-p, as top_k_filter and
    top_p_filter define them."""
    v = len(z)
    pool = _best(z, top_k) if 0 < top_k < v else np.arange(v)
    finite = pool[np.isfinite(z[pool])]
    pool = finite if len(finite) else pool
    if top_p >= 1.0:
        return pool
    top = np.max(z[pool])
    w_pool = np.exp(z[pool] - top)
    total = w_pool.sum()  # the normaliser over the whole pool, even if the pool shrinks below
    for k in NUCLEUS_GUESSES:
        if len(pool) <= k:
            break
        guess = pool[_best(z[pool], k)]
        w_guess = np.exp(z[guess] - top)
        if w_guess.sum() / total >= top_p:  # the nucleus lies inside the best ids: sort only those
            pool, w_pool = guess, w_guess
            break
    order = np.argsort(-z[pool], kind="stable")          # pool is ascending, so ties rank by id
    p_sorted = w_pool[order] / total
    before = np.cumsum(p_sorted) - p_sorted
    return np.sort(pool[order[before < top_p]])
