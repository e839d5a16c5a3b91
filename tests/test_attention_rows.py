"""Multi-row attention (an item = a tile of up to 8 consecutive query rows x one KV head): every row must get the
numbers it gets alone, whatever tile it lands in, on every kernel path.

The shapes cover what the tiles must get right: GQA groups of 2 (heads in pairs) and 3 (a pair and a single head),
head sizes 16 and 64 (one and two column chunks of the values), forwards that start mid-block so tiles straddle
block boundaries, causal rows (each its own end) and block rows (ends shared per block), and keys beyond the
queries (kv_end, the dual cache's scratch keys)."""
import numpy as np
import pytest

from bitnet_app.engine.kernel_paths import PORTABLE
from bitnet_app.engine.reference import causal_mask
from bitnet_app.engine.runtime import Engine
from support import PATHS, agrees_kv, engine_model, ids_for

BLOCK = 8
PREFIX = 13            # committed tokens: not a multiple of the block or of the 8-row tile
START, ROWS = 15, 21   # the tested forward: rows 15..35 straddle blocks 16, 24 and 32 and tiles of 8 rows
KV_END = 40            # they see scratch keys 36..39 too (block attention), written by an earlier forward


@pytest.fixture(scope="module", params=["group3_hd16", "group2_hd64"])
def model(request, tmp_path_factory):
    if request.param == "group3_hd16":
        return engine_model(tmp_path_factory, "rows16", hidden_size=96, intermediate_size=72,
                             num_attention_heads=6, num_key_value_heads=2, seed=5)
    return engine_model(tmp_path_factory, "rows64", hidden_size=128, intermediate_size=80,
                         num_attention_heads=2, num_key_value_heads=1, seed=6)


def _attention(kind):
    return dict(attention="block", block_size=BLOCK) if kind == "block" else {}


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("kv", ["f16", "f32", "i8"])
@pytest.mark.parametrize("kind", ["causal", "block"])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_together_equal_rows_alone(model, isa, kv, kind, threads):
    """A forward of 21 rows against a cache with scratch keys beyond them gives, bit for bit, what each row gives
    in a forward of its own against the same cache (the dual cache's sub-block re-run relies on this)."""
    ef, _ = model
    ids = ids_for(ef, 48, seed=7)
    eng = Engine(ef, lm_head="exact", isa=isa, threads=threads, kv=kv)
    eng.forward(ids[:PREFIX])
    eng.forward(ids[PREFIX:48], commit=False, **_attention("block"))  # scratch K/V at 13..47
    together = eng.forward(ids[START:START + ROWS], start=START, commit=False, kv_end=KV_END, rows=range(ROWS),
                           **_attention(kind))
    alone = np.concatenate([eng.forward(ids[p:p + 1], start=p, commit=False, kv_end=KV_END, **_attention(kind))
                            for p in range(START, START + ROWS)])
    np.testing.assert_array_equal(together, alone)
    assert eng.n_past == PREFIX


@pytest.mark.parametrize("kv", ["f16", "f32", "i8"])
@pytest.mark.parametrize("kind", ["causal", "block"])
def test_every_path_agrees_on_a_dual_cache_forward(model, kv, kind):
    """The same forward (rows mid-block, keys beyond them) on each kernel path against the portable one."""
    ef, _ = model
    ids = ids_for(ef, 48, seed=8)
    outs = {}
    for isa in PATHS:
        eng = Engine(ef, lm_head="exact", isa=isa, threads=2, kv=kv)
        eng.forward(ids[:PREFIX])
        eng.forward(ids[PREFIX:48], commit=False, **_attention("block"))
        outs[isa] = eng.forward(ids[START:START + ROWS], start=START, commit=False, kv_end=KV_END,
                                rows=range(ROWS), **_attention(kind))
    for isa, out in outs.items():
        assert agrees_kv(out, outs[PORTABLE], kv), isa


def _prefix_then_block_mask(T):
    """Rows < PREFIX causal (the committed prompt); later rows block attention from position 0."""
    m = causal_mask(T)
    pos = np.arange(T)
    m[PREFIX:] = (pos[None, :] // BLOCK <= pos[PREFIX:, None] // BLOCK)
    return m


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("kv", ["f16", "f32", "i8"])
@pytest.mark.parametrize("kind", ["causal", "block"])
def test_a_forward_after_a_prefix_matches_numpy_reference(model, isa, kv, kind):
    """Committed prompt of 13, then 27 rows in one forward (causal, or block attention in blocks of 8 that the
    8-row tiles straddle): the rows' logits against the numpy reference's with the same mask."""
    ef, ref = model
    T = 40
    ids = ids_for(ef, T, seed=9)
    eng = Engine(ef, lm_head="exact", isa=isa, threads=2, kv=kv)
    eng.forward(ids[:PREFIX])
    out = eng.forward(ids[PREFIX:], commit=False, rows=range(T - PREFIX), **_attention(kind))
    mask = _prefix_then_block_mask(T) if kind == "block" else None
    want = ref.logits(ids, mask=mask, kv=kv)[PREFIX:]
    assert agrees_kv(out, want, kv)


@pytest.fixture(scope="module", params=["3kv_hd16", "2kv_hd48"])
def odd_heads(request, tmp_path_factory):
    """KV heads that do not share out evenly over the threads, and a long context (so a decode token's attention is
    shared between threads): 3 KV heads of 4 query heads (head size 16) on 2 threads, 2 KV heads of 2 query heads
    (head size 48) on 3 threads. schedule.c splits the units left over into one item per thread, each with its part
    of the value columns: halves of 8 columns, thirds of 16."""
    if request.param == "3kv_hd16":
        return engine_model(tmp_path_factory, "odd", hidden_size=192, intermediate_size=64, num_attention_heads=12,
                             num_key_value_heads=3, max_position_embeddings=512, seed=8)
    return engine_model(tmp_path_factory, "odd48", hidden_size=192, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, seed=9)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("kv", ["f16", "i8"])
def test_splitting_a_units_value_columns_between_items_changes_no_logit(odd_heads, isa, kv):
    """With 1 thread nothing is split; with 2 and 3 threads the decode token's leftover (kv head) units are split
    into parts of their value columns on one model or the other, or not: the logits are the same bit for bit, and
    they agree with the numpy reference (the fp16 cache's: over 420 positions the int8 cache's rounding ties, see
    agrees_kv, pile up in a random model; its agreement is checked on shorter forwards above)."""
    ef, ref = odd_heads
    ids = ids_for(ef, 420, seed=3)

    def run(threads):
        eng = Engine(ef, lm_head="exact", isa=isa, threads=threads, kv=kv)
        eng.forward(ids[:400], rows=[])
        return np.concatenate([eng.forward(ids[p:p + 1]) for p in range(400, 420)])
    one = run(1)
    for threads in (2, 3):
        np.testing.assert_array_equal(run(threads), one)
    if kv == "f16":
        assert agrees_kv(one, ref.logits(ids, kv=kv)[400:], kv)
