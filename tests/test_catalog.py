"""catalog.py: what each named model needs (download, memory, bytes per token, expected speed) and the picker."""
import numpy as np
import pytest

from bitnet_app import catalog
from bitnet_app.bench import bytes_per_token
from bitnet_app.checkpoint.synthetic import SHAPES, write_synthetic_engine_file
from bitnet_app.engine.file import EngineFile
from bitnet_app.ui import model_choices


def _entry_of_shape(name, family):
    s = SHAPES[name]
    return catalog.Entry(name, name, family, hidden=s["hidden_size"], intermediate=s["intermediate_size"],
                         layers=s["num_hidden_layers"], heads=s["num_attention_heads"],
                         kv_heads=s["num_key_value_heads"], head_dim=s["head_dim"], vocab=s["vocab_size"],
                         context=s["max_position_embeddings"], weights="packed", chat=True)


@pytest.mark.parametrize("layout", ["2bit", "1.6bit"])
def test_the_arithmetic_is_the_engine_files(tmp_path, layout):
    """bytes per token and the engine file size from the formulas equal what the engine really reads and writes
    for the same shape (tiny Llama and BitNet shapes, written by the synthetic writer), up to tile padding, for
    either packing of the ternary tiles."""
    for shape, family, tied in (("tiny-llama", "llama", False), ("tiny", "bitnet", True)):
        ef = EngineFile(write_synthetic_engine_file(str(tmp_path / f"{shape}.bitnet"), shape=shape, layout=layout))
        entry = _entry_of_shape(shape, family)
        assert entry.tied == tied                                          # the family's rule (families.py)
        n = catalog.needs(entry, roof_gb_s=10.0, packing=layout)
        real = bytes_per_token(ef, "int8")
        # the head's rows padded to 16; at 1.6 bits also each row's last group of 20 columns (64 to 160 wide here)
        assert abs(n.bytes_per_token - real) <= (0.01 if layout == "2bit" else 0.03) * real
        tensors = sum(int(t.nbytes) for t in ef.tensors.values())
        assert abs(n.engine_bytes - tensors) <= 0.15 * tensors  # norms, per-row scales: 11% at this tiny size
        assert np.isclose(n.expected_tok_s, 10e9 / n.bytes_per_token)


def test_the_real_shapes_agree_with_the_fact_sheet():
    """The team's shared reference on model families (not in this repository), section 5: body parameters and
    bytes read per token (int8 head)."""
    body = {"tiiuae/Falcon3-1B-Instruct-1.58bit": 1.13e9, "tiiuae/Falcon3-7B-Instruct-1.58bit": 6.65e9,
            "HF1BitLLM/Llama3-8B-1.58-100B-tokens": 6.98e9, "microsoft/bitnet-b1.58-2B-4T": 2.08e9,
            "1bitLLM/bitnet_b1_58-large": 0.68e9}
    for repo, want in body.items():
        assert abs(catalog.ENTRIES[repo].body / want - 1) < 0.01, repo
    two_b = catalog.needs(catalog.ENTRIES["microsoft/bitnet-b1.58-2B-4T"])
    assert abs(two_b.bytes_per_token / 849e6 - 1) < 0.01           # BENCHMARKS.md: 849 MB per token
    assert abs(catalog.needs(catalog.ENTRIES["microsoft/bitnet-b1.58-2B-4T"], packing="1.6bit").bytes_per_token
               / 746e6 - 1) < 0.01                                  # 1.6-bit tiles (reference/performance.md)
    assert abs(two_b.download_bytes / 1.18e9 - 1) < 0.03
    # the synthetic bench shapes are the catalog's (synthetic.py derives them; this guards against a return to copies)
    for shape, repo in (("falcon3-1b", "tiiuae/Falcon3-1B-Instruct-1.58bit"),
                        ("falcon3-7b", "tiiuae/Falcon3-7B-Instruct-1.58bit"),
                        ("llama3-8b", "HF1BitLLM/Llama3-8B-1.58-100B-tokens")):
        e, s = catalog.ENTRIES[repo], SHAPES[shape]
        assert (e.hidden, e.intermediate, e.layers, e.heads, e.kv_heads, e.head_dim, e.vocab) == tuple(
            s[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                           "num_key_value_heads", "head_dim", "vocab_size"))


def test_picker_lists_every_family_with_its_needs_and_warns_when_memory_is_short():
    labels = model_choices.choices()
    assert labels[0] == model_choices.DEFAULT_REPO and all(r in labels for r in catalog.ENTRIES)
    e = catalog.ENTRIES["tiiuae/Falcon3-7B-Instruct-1.58bit"]
    line = model_choices.needs_line(e, roof_gb_s=20.0, free_ram=64 << 30)
    n = catalog.needs(e, 20.0)
    assert "3.3 GB download" in line and f"~{n.expected_tok_s:.0f} tokens/s" in line and "⚠" not in line
    short = model_choices.needs_line(e, roof_gb_s=20.0, free_ram=1 << 30)
    assert "⚠" in short and "1.1 GB of memory free" in short
    base = model_choices.needs_line(catalog.ENTRIES["1bitLLM/bitnet_b1_58-large"], roof_gb_s=None, free_ram=64 << 30)
    assert "completion" in base and "tokens/s" not in base
    src = model_choices.resolve("tiiuae/Falcon3-1B-Instruct-1.58bit")
    assert src.kind == "hub" and "Falcon3 1B" in model_choices.describe(src, 20.0)


def test_read_roof_is_measured():
    r = catalog.read_roof_gb_s(2)
    assert 0.1 < r < 10000
