"""Sampling maths: each filter against a hand-worked case, the chain against transformers' own
logits processors, and the sampler's draws against the distribution it reports."""
import numpy as np
import pytest

from bitnet_app import _engine_testing
from bitnet_app.engine import kernel_paths
from support import PATHS
from bitnet_app.decode.sampling import (Sampler, apply_temperature, ban_ids, repetition_penalty, softmax,
                                 top_k_filter, top_p_filter)


def c_draws(rows, temperature, top_k, top_p, uniforms, banned=(), isa=""):
    """The engine's draw (_kernels/sample.c), as Engine.sample_rows calls it (isa "": this CPU's kernel path)."""
    return _engine_testing.sample_rows(isa, np.ascontiguousarray(rows, dtype=np.float32), float(temperature), int(top_k),
                               float(top_p), np.ascontiguousarray(uniforms, dtype=np.float64),
                               np.array(sorted(set(banned)), dtype=np.int32))


def test_repetition_penalty_divides_positive_and_multiplies_negative_once_per_id():
    logits = np.array([2.0, -2.0, 1.0, -1.0, 0.5], dtype=np.float32)
    out = repetition_penalty(logits, [0, 1, 1, 1, 4], 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, -1.0, 0.25])
    np.testing.assert_array_equal(logits, [2.0, -2.0, 1.0, -1.0, 0.5])  # input untouched
    np.testing.assert_array_equal(repetition_penalty(logits, [0, 1], 1.0), logits)


def test_top_k_keeps_the_k_largest():
    logits = np.array([0.1, 3.0, -1.0, 2.0, 2.5], dtype=np.float32)
    out = top_k_filter(logits, 2)
    assert np.isfinite(out).tolist() == [False, True, False, False, True]
    assert np.isfinite(top_k_filter(logits, 0)).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    logits = np.log(probs).astype(np.float32)
    assert np.isfinite(top_p_filter(logits, 0.79)).tolist() == [False, True, False, True]
    assert np.isfinite(top_p_filter(logits, 0.81)).tolist() == [False, True, True, True]
    assert np.isfinite(top_p_filter(logits, 0.01)).tolist() == [False, True, False, False]  # at least one
    assert np.isfinite(top_p_filter(logits, 1.0)).all()


def test_temperature_and_softmax():
    logits = np.array([1.0, 2.0, 4.0], dtype=np.float32)
    p = softmax(apply_temperature(logits, 0.5))
    want = np.exp([2.0, 4.0, 8.0]) / np.exp([2.0, 4.0, 8.0]).sum()
    np.testing.assert_allclose(p, want, rtol=1e-6)
    assert softmax(np.array([0.0, -np.inf]))[1] == 0.0


def test_chain_matches_transformers_processors():
    import torch
    from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=300).astype(np.float32)
    context = rng.integers(0, 300, size=40)
    sampler = Sampler(temperature=0.7, top_k=50, top_p=0.8, repetition_penalty=1.3)
    ours = sampler.distribution(logits, context)

    ids = torch.tensor(context)[None]
    x = torch.tensor(logits)[None]
    for proc in (RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7), TopKLogitsWarper(50),
                 TopPLogitsWarper(0.8)):
        x = proc(ids, x)
    theirs = torch.softmax(x.double(), dim=-1)[0].numpy()
    assert ((ours > 0) == (theirs > 0)).all()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-9)


def test_greedy_returns_argmax_and_its_softmax_probability():
    logits = np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32)
    tok, prob = Sampler()(logits)
    assert tok == 1
    assert prob == pytest.approx(softmax(logits)[1])


def test_banned_ids_are_never_chosen():
    logits = np.array([0.0, 10.0, 1.0], dtype=np.float32)
    assert Sampler(banned_ids=[1])(logits)[0] == 2
    s = Sampler(temperature=5.0, seed=0, banned_ids=[1])
    assert all(s(logits)[0] != 1 for _ in range(200))
    assert ban_ids(logits, [1])[1] == -np.inf


def test_greedy_ids_are_the_ids_of_the_greedy_draw():
    """Sampler.greedy_ids (the exact rule's checks) gives the ids of a greedy call, ties and banned ids included."""
    rng = np.random.default_rng(3)
    rows = rng.integers(-3, 4, (64, 40)).astype(np.float32)  # many ties at the top
    rows[::3, 7] = 9.0                                        # a banned id holding the largest logit
    for banned in ([], [7], [0, 7, 39]):
        s = Sampler(banned_ids=banned)
        assert s.greedy_ids(rows).tolist() == s(rows)[0].tolist()
        assert not set(s.greedy_ids(rows).tolist()) & set(banned)

def test_draws_follow_the_reported_distribution_and_probability():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4])).astype(np.float32)
    s = Sampler(temperature=1.0, seed=123)
    draws = [s(logits) for _ in range(20000)]
    counts = np.bincount([t for t, _ in draws], minlength=4) / len(draws)
    np.testing.assert_allclose(counts, [0.1, 0.2, 0.3, 0.4], atol=0.015)
    for t, p in draws[:50]:
        assert p == pytest.approx([0.1, 0.2, 0.3, 0.4][t], rel=1e-5)


def test_same_seed_same_draws_different_seed_different_draws():
    logits = np.zeros(1000, dtype=np.float32)
    a = [Sampler(temperature=1.0, seed=7)(logits)[0] for _ in range(1)]
    s1, s2, s3 = (Sampler(temperature=1.0, seed=k) for k in (7, 7, 8))
    seq1 = [s1(logits)[0] for _ in range(20)]
    seq2 = [s2(logits)[0] for _ in range(20)]
    seq3 = [s3(logits)[0] for _ in range(20)]
    assert seq1 == seq2 and seq1[:1] == a
    assert seq1 != seq3


def test_rows_are_sampled_independently():
    logits = np.full((3, 5), -5.0, dtype=np.float32)
    logits[0, 4] = logits[1, 0] = logits[2, 2] = 5.0
    toks, probs = Sampler()(logits)
    assert toks.tolist() == [4, 0, 2]
    assert probs.shape == (3,) and (probs > 0.9).all()


def test_bad_settings_are_rejected():
    for kwargs in ({"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}, {"repetition_penalty": 0}):
        with pytest.raises(ValueError):
            Sampler(**kwargs)


@pytest.mark.parametrize("kernel", [None, c_draws], ids=["numpy", "c"])
@pytest.mark.parametrize("spread", [0.3, 3.0, 8.0])  # flat (nucleus beyond the first guess) to peaked
@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (40, 0.95), (0, 1.0), (2000, 0.5)])
def test_fast_draw_equals_a_draw_from_the_full_distribution(spread, top_k, top_p, kernel):
    rng = np.random.default_rng(1)
    logits = rng.normal(0, spread, size=(6, 5000)).astype(np.float32)
    context = rng.integers(0, 5000, size=30)
    s = Sampler(temperature=0.8, top_k=top_k, top_p=top_p, repetition_penalty=1.2, seed=5, banned_ids=[3],
                sample_kernel=kernel)
    toks, probs = s(logits, context)
    dist = s.distribution(logits, context)
    uniforms = np.random.default_rng(5).random(len(logits))  # the sampler's rng draws one per row
    for r in range(len(logits)):
        cdf = np.cumsum(dist[r])
        want = int(np.searchsorted(cdf, uniforms[r] * cdf[-1], side="left"))
        assert toks[r] == want
        assert probs[r] == pytest.approx(dist[r, want], rel=1e-5)  # float64 vs float32 tempering
        assert toks[r] != 3


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("vocab", [1, 2, 7, 300, 4096, 20000])
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.9), (1.0, 0, 1.0), (0.5, 40, 1.0), (1.3, 5, 0.5),
                                                     (0.7, 0, 0.999), (2.0, 3000, 0.95), (0.7, 1, 0.9),
                                                     (0.05, 0, 0.9)])
def test_the_c_draw_is_the_numpy_draw(vocab, temperature, top_k, top_p, isa):
    """_kernels/sample.c against Sampler._draw, the numpy reference, with the same uniforms: the same id every time
    and its probability to ~1e-13 (the sums run in another order; the SIMD paths' exponential is within an ulp of
    libm's), on flat, tied (rounded), peaked and very peaked rows with a banned (-inf) id, on every kernel path."""
    rng = np.random.default_rng(vocab)
    for spread in (0.3, 3.0, 12.0, 60.0):
        x = (rng.standard_normal((20, vocab)) * spread).astype(np.float32)
        if spread == 3.0:
            x = np.round(x, 1)  # many ties, which rank by id
        if vocab > 3:
            x[:, 3] = -np.inf
        u = np.random.default_rng(9).random(len(x))
        ref = Sampler(temperature=temperature, top_k=top_k, top_p=top_p, seed=9)  # draws the same uniforms
        want = [ref._draw(row.astype(np.float64) / temperature) for row in x]
        ids, probs = c_draws(x, temperature, top_k, top_p, u, isa=isa)
        assert ids.tolist() == [i for i, _ in want], spread
        np.testing.assert_allclose(probs, [p for _, p in want], rtol=1e-12, atol=0)


def test_a_sampler_with_the_c_draw_gives_the_same_replies():
    """The seeded sampler draws the same ids through the engine's kernel as through numpy, one row (AR) or several
    (a diffusion step), with a repetition penalty and a banned id."""
    rng = np.random.default_rng(2)
    context = rng.integers(0, 4096, size=40)
    make = lambda kernel: Sampler(temperature=0.7, top_p=0.9, repetition_penalty=1.1, seed=3, banned_ids=[3],
                                  sample_kernel=kernel)
    py, c = make(None), make(c_draws)
    for step in range(30):
        logits = (rng.standard_normal((1 if step % 2 else 7, 4096)) * 4).astype(np.float32)
        (a_ids, a_p), (b_ids, b_p) = py(logits, context), c(logits, context)
        assert a_ids.tolist() == b_ids.tolist()
        np.testing.assert_allclose(b_p, a_p, rtol=1e-12)
    assert py.token(logits[0], context) == c.token(logits[0], context)


def test_the_c_draw_rejects_impossible_settings():
    x = np.zeros((2, 5), dtype=np.float32)
    for args in ((0.0, 0, 0.9, [0.5, 0.5]), (1.0, 0, 0.0, [0.5, 0.5]), (1.0, 0, 1.5, [0.5, 0.5]),
                 (1.0, 0, 0.9, [0.5])):
        with pytest.raises(ValueError):
            c_draws(x, *args)


@pytest.mark.parametrize("isa", PATHS)
def test_nan_logits_give_an_id_not_a_crash(isa):
    """Logits that are all NaN (a broken model) leave nothing to keep; the C draw still returns an id in range."""
    x = np.full((3, 50), np.nan, dtype=np.float32)
    x[1, 7] = 2.0  # one finite entry among NaNs
    for top_k, top_p in ((0, 0.9), (5, 1.0), (0, 1.0)):
        ids, probs = c_draws(x, 0.7, top_k, top_p, np.full(3, 0.5), isa=isa)
        assert ((ids >= 0) & (ids < 50)).all(), ids


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("top_p", [0.9, 1.0])
def test_an_infinite_logit_is_dropped_as_numpy_drops_it(isa, top_p):
    """+inf is not finite: both draws leave it out of the pool and draw from the rest (with a banned -inf id too)."""
    x = (np.random.default_rng(4).standard_normal((8, 300)) * 2).astype(np.float32)
    x[:, 17] = np.inf
    x[:, 3] = -np.inf
    u = np.random.default_rng(6).random(len(x))
    ref = Sampler(temperature=0.8, top_p=top_p, seed=6)
    want = [ref._draw(row.astype(np.float64) / 0.8) for row in x]
    ids, _ = c_draws(x, 0.8, 0, top_p, u, isa=isa)
    assert ids.tolist() == [i for i, _ in want] and 17 not in ids.tolist()


@pytest.mark.parametrize("isa", PATHS)
def test_a_banned_id_is_never_drawn_even_by_a_zero_uniform(isa):
    """The banned (-inf) ids are left out of the pool, as numpy leaves them out, even where the fast path keeps
    them in place with weight 0: a uniform of 0 draws the first kept id, never a banned one, with and without
    top-p, on a flat row (the nucleus then needs every bin) and a peaked one."""
    for spread in (0.0, 0.01, 5.0):
        x = (np.random.default_rng(3).standard_normal((2, 64)) * spread).astype(np.float32)
        x[:, [0, 1, 40]] = -np.inf
        for top_p in (0.5, 0.999999, 1.0):
            ref = Sampler(temperature=1.0, top_p=top_p, seed=0)
            ref.rng = type("Zero", (), {"random": staticmethod(lambda: 0.0)})()  # _draw's uniform: 0
            want = [ref._draw(row.astype(np.float64)) for row in x]
            ids, probs = c_draws(x, 1.0, 0, top_p, np.zeros(2), isa=isa)
            assert ids.tolist() == [i for i, _ in want], (spread, top_p)
            assert not set(ids.tolist()) & {0, 1, 40}
            np.testing.assert_allclose(probs, [p for _, p in want], rtol=1e-12)


@pytest.mark.parametrize("isa", PATHS)
def test_banned_ids_given_to_the_c_draw_are_the_same_as_minus_infinity(isa):
    """The draw takes the banned ids as a list (no numpy copy of the rows to set them): the same ids and
    probabilities as rows with those ids at -inf, the caller's rows left alone, with and without top-k and top-p,
    also when a banned id holds the largest logit."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 700)) * 3).astype(np.float32)
    x[0, 5] = 40.0  # the row's winner, banned
    banned = [0, 5, 6, 699]
    u = rng.random(len(x))
    masked = x.copy()
    masked[:, banned] = -np.inf
    before = x.copy()
    for temperature, top_k, top_p in ((0.7, 0, 0.9), (1.0, 0, 1.0), (0.8, 30, 0.95)):
        got = c_draws(x, temperature, top_k, top_p, u, banned=banned, isa=isa)
        want = c_draws(masked, temperature, top_k, top_p, u, isa=isa)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert not set(got[0].tolist()) & set(banned)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("isa", PATHS)
def test_the_vector_exponential_is_within_an_ulp_of_libm(isa):
    """exp(z - top) for the sampler's weights: within 1 ulp of libm's over the whole range a draw sees (down to
    -745, where exp leaves the normal range and then underflows to 0), with -inf (banned ids) exactly 0 and NaN
    NaN, wherever they fall among the vector groups (also more of those groups than the kernel notes one by one);
    and their sum."""
    import math
    got = _engine_testing.exp_shifted(isa, np.zeros(1), 0.0)
    if got is None:  # sample.c calls libm: the portable path only (the x86 and NEON paths have a vector exponential)
        assert isa == kernel_paths.PORTABLE
        return
    rng = np.random.default_rng(0)
    z = np.concatenate([rng.uniform(-40, 0, 5000), rng.uniform(-760, 0, 3000),
                        [-708.0, -707.99, -708.01, -745.1, -746.0, -np.inf, 0.0, -1e-300, np.nan, -0.3466, -0.3467]])
    rng.shuffle(z)
    z = z + 3.5  # top = 3.5: the kernel subtracts it
    want = np.array([math.exp(v - 3.5) if not math.isnan(v) else np.nan for v in z])
    w, total = _engine_testing.exp_shifted(isa, z, 3.5)
    normal = want > 0
    assert np.all(np.abs(w[normal] - want[normal]) <= np.spacing(want[normal])), isa
    np.testing.assert_array_equal(w[~normal], want[~normal])  # 0 for -inf and below -745, NaN for NaN
    finite = ~np.isnan(z)
    w2, total2 = _engine_testing.exp_shifted(isa, z[finite], 3.5)
    assert total2 == pytest.approx(math.fsum(want[finite]), rel=1e-14)
