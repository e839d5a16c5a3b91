"""The scheduled forward (_kernels/schedule.c: the layer steps on the engine's threads, token-split batches, chains,
a trimmed last layer) against the plain serial C forward (_kernels/forward.c: every step on the whole batch, in the
order of the maths): the same logits, bit for bit, on every kernel path this machine runs and with 1, 2 and 3
threads."""
import numpy as np
import pytest

from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.engine import kernel_paths
from bitnet_app.engine.file import EngineFile
from bitnet_app.engine.runtime import Engine
from checkpoints import make_hf_checkpoint

PATHS = kernel_paths.supported()  # every path this CPU runs, the emulated ones included

# (tokens [a, b), start, kv_end, attention (0 causal, 1 block), block size, logit rows): the forwards a chat makes,
# in an order whose K/V each later one reads
FORWARDS = [
    ((0, 5), 0, 5, 0, 0, range(5)),             # a prefill: rows split between the threads
    ((5, 37), 5, 37, 0, 0, range(32)),          # a batch split by tokens (causal)
    ((37, 45), 37, 45, 0, 0, range(8)),         # one run per thread through every layer (fold_causal)
    ((37, 43), 37, 45, 0, 0, [1, 4, 5]),        # a trimmed last layer, keys beyond the batch
    ((37, 45), 37, 45, 0, 0, range(1, 8)),      # a diffusion step's rows: trimmed
    ((37, 45), 37, 45, 1, 8, range(8)),         # block attention
    ((5, 37), 5, 37, 1, 16, range(32)),         # block attention, split by tokens
    ((0, 3), 0, 45, 0, 0, []),                  # no logit rows
    ((5, 6), 5, 6, 0, 0, [0]),                  # one token (decode)
]


def model(tmp_path_factory, name, packing, **shape):
    d = tmp_path_factory.mktemp(name)
    make_hf_checkpoint(d / "ck", num_hidden_layers=2, **shape)
    convert_checkpoint(str(d / "ck"), str(d / "m.bitnet"), packing=packing)
    return EngineFile(str(d / "m.bitnet"))


@pytest.fixture(scope="module", params=["hd16-1.6bit", "hd20-2bit"])
def engine_file(tmp_path_factory, request):
    """head_dim 16 (the SIMD attention) in 1.6-bit tiles, and head_dim 20 (the plain attention loop) with widths
    that are not multiples of the vector width in 2-bit tiles"""
    if request.param == "hd16-1.6bit":
        return model(tmp_path_factory, "serial16", "1.6bit", hidden_size=96, intermediate_size=72,
                     num_attention_heads=6, num_key_value_heads=2, seed=4)
    return model(tmp_path_factory, "serial20", "2bit", hidden_size=80, intermediate_size=72,
                 num_attention_heads=4, num_key_value_heads=2, seed=3)


def logits(eng, ids, serial):
    """Every forward of FORWARDS through the engine's C forward: scheduled, or the serial oracle"""
    out = []
    for (a, b), start, kv_end, attention, block_size, rows in FORWARDS:
        rows = np.asarray(list(rows), np.int32)
        got = np.zeros((len(rows), eng.vocab_size), np.float32)
        assert eng._c.forward(np.ascontiguousarray(ids[a:b], np.int32), start, kv_end, attention, block_size, rows,
                              got, serial=serial)
        out.append(got)
    return out


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("head,kv", [("int8", "f16"), ("exact", "i8")])
def test_the_scheduled_forward_equals_the_serial_one(engine_file, isa, head, kv):
    ids = np.random.default_rng(5).integers(0, engine_file.config["vocab_size"], 45)
    for threads in (1, 2, 3):
        scheduled = logits(Engine(engine_file, lm_head=head, isa=isa, threads=threads, kv=kv), ids, serial=False)
        serial = logits(Engine(engine_file, lm_head=head, isa=isa, threads=threads, kv=kv), ids, serial=True)
        for i, (a, b) in enumerate(zip(scheduled, serial, strict=True)):
            assert np.array_equal(a, b), (threads, FORWARDS[i])
