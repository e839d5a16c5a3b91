"""What several test modules share: the kernel paths to run, small engine models and how to compare their logits,
and a Hub repository folder. Test modules import from here (and from the other non-test modules of tests/), never
from one another (test_layout.py checks it).

    from support import PATHS, engine_model, ids_for
"""
import json
import os

import numpy as np

from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.engine import kernel_paths
from bitnet_app.engine.file import EngineFile
from bitnet_app.engine.reference import NumpyModel
from bitnet_app.engine.runtime import Engine
from checkpoints import make_hf_checkpoint

# Every kernel path this CPU runs. The emulated ones (avxvnni-emulated, amx-emulated) are the AVX-VNNI and AMX kernels
# with vpdpbusd / the tile instructions written in AVX2 / plain C (exactly), so that their code runs on every AVX2
# machine; avxvnni and amx themselves only where the CPU has the instructions.
PATHS = kernel_paths.supported()

TOL = 2e-5  # relative to the largest logit: only fp32 summation order differs


def agrees(out, want, min_rows=0.75):
    """Most rows equal to fp32 precision. Random ternary models are chaotic: a 1e-7 difference (FMA in
    the attention dot products, summation order) occasionally flips one int8 activation across a
    rounding boundary, and every later row of that sequence then moves by up to a few percent. A real
    bug (a wrong mask, scale, rotation or layout) moves nearly every row, so requiring 3/4 of the rows
    at fp32 precision keeps the check sharp without depending on luck."""
    row_err = np.abs(out - want).max(axis=1) / np.abs(want).max()
    return np.mean(row_err <= TOL) >= min_rows and np.median(row_err) <= TOL


def agrees_kv(out, want, kv):
    """agrees() for the f16 and f32 caches. The int8 cache's attention outputs lie on a lattice (int8 values x a
    row scale) wherever one key takes all the weight, as in these random models, and bf16 norm gains keep them on
    it, so the next int8 activation often lies exactly halfway between two integers; a last-bit difference from
    the reference (summation order) then rounds it the other way, which moves that row alone by up to a few
    percent (measured: up to 3.5%, in up to half the rows of a sequence). So for i8: the median row at fp32
    precision, every row within 5%, the same argmax in 95% of rows. A wrong scale or index moves every row."""
    if kv != "i8":
        return agrees(out, want)
    row_err = np.abs(out - want).max(axis=1) / np.abs(want).max()
    return (np.median(row_err) <= TOL and row_err.max() <= 0.05
            and np.mean(out.argmax(axis=1) == want.argmax(axis=1)) >= 0.95)


def engine_model(tmp_path_factory, name, packing=None, **shape):
    """A random checkpoint of this shape (2 layers), converted (in the packing given, else the default): (EngineFile,
    its numpy reference)."""
    d = tmp_path_factory.mktemp(name)
    make_hf_checkpoint(d / "ck", num_hidden_layers=2, **shape)
    convert_checkpoint(str(d / "ck"), str(d / "m.bitnet"), packing=packing)
    ef = EngineFile(str(d / "m.bitnet"))
    return ef, NumpyModel(ef)


def ids_for(ef, n, seed=0):
    """n random token ids of the engine file's vocabulary."""
    return np.random.default_rng(seed).integers(0, ef.config["vocab_size"], n)


def logits_of_a_chat(path, isa, lm_head, ids, threads=2):
    """The logits an engine of the file `path` gives on the kernel path `isa` for every kind of forward: a prefill,
    a uncommitted block (a diffusion step) and its few rows, one token at a time (decode), and a prefill of 8 rows
    (the AMX tiles' smallest batch) after them. For comparing files that hold the same weights bit for bit."""
    eng = Engine(EngineFile(path), lm_head=lm_head, isa=isa, threads=threads)
    n = len(ids) - 12
    out = [eng.forward(ids[:n], rows=range(n))]
    out.append(eng.forward(ids[n:n + 8], start=n, commit=False, attention="block", block_size=8, rows=range(8)))
    out.append(eng.forward(ids[n:n + 8], start=n, commit=False, attention="block", block_size=8, rows=[1, 4, 6]))
    out += [eng.forward(ids[i:i + 1]) for i in range(n, n + 4)]
    out.append(eng.forward(ids[n + 4:n + 12], rows=range(8)))
    return out


def assert_threads_change_nothing(run):
    """run(threads) -> a list of logit arrays: 2 and 3 threads give the 1-thread arrays bit for bit."""
    one = run(1)
    for threads in (2, 3):
        for a, b in zip(run(threads), one, strict=True):
            assert np.array_equal(a, b), threads


HUB_WEIGHTS = 24 << 20  # many read chunks, so a dropped connection resumes mid-file


def write_hub_repo(folder, *, model_type="bitnet", weights=HUB_WEIGHTS):
    """A Hub repository's files for the fake Hub (fake_hub.py): a config of `model_type`, a tokenizer, a
    generation config, files the app never needs, and `weights` random bytes of model.safetensors."""
    os.makedirs(folder, exist_ok=True)
    arch = "BitNetForCausalLM" if model_type == "bitnet" else "LlamaForCausalLM"
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"architectures": [arch], "model_type": model_type, "vocab_size": 64}, f)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "BPE"}}, f)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [1, 2]}, f)
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write("not needed by the app\n")
    with open(os.path.join(folder, "pytorch_model.bin"), "wb") as f:
        f.write(b"never downloaded")
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(os.urandom(weights))
    return folder
