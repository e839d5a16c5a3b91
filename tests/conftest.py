"""Shared test setup.

TORCHDYNAMO_DISABLE must be set before torch is first imported: transformers' BitNet helpers
(unpack_weights, WeightQuant, ActQuant) are decorated with @torch.compile, which would otherwise
compile (slowly, needing a C toolchain) on first call. With it they run eagerly, same maths.
"""
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import pytest  # noqa: E402

import checkpoints  # noqa: E402  (tests/ is on sys.path: pytest rootdir-relative conftest import)


@pytest.fixture
def make_ckpt(tmp_path):
    """Factory: make_ckpt(name="ck", **make_hf_checkpoint kwargs) -> (folder, truth)."""
    def make(name="ck", **kw):
        folder = str(tmp_path / name)
        return folder, checkpoints.make_hf_checkpoint(folder, **kw)
    return make


@pytest.fixture
def engine_path(tmp_path):
    """Where a test writes its converted engine file (inside its own folder, to check for leftovers)."""
    out = tmp_path / "out"
    out.mkdir()
    return str(out / "model.bitnet")


# the small engine models of test_engine.py and test_resident.py: (EngineFile, its numpy reference)
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # awkward sizes: hidden 80 and intermediate 72 are not multiples of the 64-byte vector width
    from support import engine_model  # lazily: importing it loads the engine
    return engine_model(tmp_path_factory, "engine", hidden_size=80, intermediate_size=72,
                        num_attention_heads=4, num_key_value_heads=2, seed=3)


@pytest.fixture(scope="module")
def tiny_hd16(tmp_path_factory):
    """head_dim 16, a multiple of 8: the shape the SIMD attention kernels take (real models' 48, 64, 128 too);
    GQA groups of 3 and 45 positions, so keys come in blocks of 8 and a tail. 1.6-bit tiles whatever the CPU (the
    converter's default depends on it; `tiny` has that default)."""
    from support import engine_model  # lazily: importing it loads the engine
    return engine_model(tmp_path_factory, "engine16", packing="1.6bit", hidden_size=96, intermediate_size=72,
                        num_attention_heads=6, num_key_value_heads=2, seed=4)
