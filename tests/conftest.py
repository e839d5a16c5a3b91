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
