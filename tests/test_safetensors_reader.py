"""safetensors_reader.py against files written by safetensors itself, and damaged files."""
import json
import os
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from bitnet_app.checkpoint.safetensors_reader import Checkpoint, SafetensorsError, SafetensorsFile


def test_dtypes_match_safetensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"bf16": torch.randn(5, 3, generator=g).to(torch.bfloat16), "f16": torch.randn(7, generator=g).half(),
               "f32": torch.randn(2, 2, 2, generator=g), "u8": torch.randint(0, 255, (4, 9), dtype=torch.uint8, generator=g),
               "scalar": torch.tensor(1.5, dtype=torch.bfloat16), "empty": torch.zeros(0, 4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    ck = Checkpoint(str(tmp_path))
    assert sorted(ck.names()) == sorted(tensors)
    assert ck.dtype("bf16") == "BF16" and ck.shape("bf16") == (5, 3)
    assert np.array_equal(ck.get("bf16"), tensors["bf16"].view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(ck.get_f32("bf16"), tensors["bf16"].float().numpy())
    assert np.array_equal(ck.get_f32("scalar"), np.float32(1.5))
    for name in ("f16", "f32", "u8", "empty"):
        assert np.array_equal(ck.get(name), tensors[name].numpy()) and ck.get(name).dtype == tensors[name].numpy().dtype


def _write_raw(path, header: dict, data: bytes, header_len=None):
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob) if header_len is None else header_len) + blob + data)


@pytest.mark.parametrize("header,data,hlen,pattern", [
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None, "past the end"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, b"\0" * 16, None, "do not match shape"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16, 1 << 40, "header length"),
    ({"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}}, b"\0" * 2, None, "dtype Q4"),
    ({"a": {"shape": [4]}}, b"", None, "malformed"),
])
def test_damaged_files(tmp_path, header, data, hlen, pattern):
    path = str(tmp_path / "x.safetensors")
    _write_raw(path, header, data, hlen)
    with pytest.raises(SafetensorsError, match=pattern):
        SafetensorsFile(path)


def test_short_file_and_bad_json(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\1\2")
    with pytest.raises(SafetensorsError, match="too short"):
        SafetensorsFile(str(p))
    p.write_bytes(struct.pack("<Q", 3) + b"{x}")
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        SafetensorsFile(str(p))


def test_index_pointing_at_missing_shard_or_wrong_file(tmp_path):
    save_file({"a": torch.zeros(2)}, str(tmp_path / "s1.safetensors"))
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    with pytest.raises(SafetensorsError, match="s2.safetensors .* is missing"):
        Checkpoint(str(tmp_path))
    save_file({"c": torch.zeros(2)}, str(tmp_path / "s2.safetensors"))
    with pytest.raises(SafetensorsError, match="places 'b' in s2.safetensors"):
        Checkpoint(str(tmp_path))


def test_empty_folder(tmp_path):
    with pytest.raises(SafetensorsError, match="no .safetensors files"):
        Checkpoint(str(tmp_path))
    assert not os.listdir(tmp_path)
