"""Read safetensors checkpoints (one file or shards with an index) as numpy views of an mmap.

File layout (the safetensors spec): 8-byte little-endian header length n, n bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data;
offsets are relative to byte 8 + n. Nothing is copied: `get` returns a read-only view of the mapping.

dtypes: BF16 comes back as uint16 bit patterns (numpy has no bfloat16; see packing.bf16_to_f32),
the others as their numpy type. Every header is validated against the file size first, so a
truncated or corrupt download gives a SafetensorsError that names the file, never a crash later.
"""
import json
import math
import os
import struct

import numpy as np

from .files import JSON_LIMIT, CheckpointFileError, check_regular, read_text

# safetensors dtype tag -> numpy dtype of the view we hand out
DTYPES = {
    "BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
    "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "I32": np.int32, "U32": np.uint32, "I64": np.int64, "U64": np.uint64, "BOOL": np.bool_,
}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_MAX_HEADER = 100 * 1024 * 1024  # the spec's own limit; a larger value means a corrupt file


class SafetensorsError(ValueError):
    """A checkpoint file that cannot be read; the message says which file and what to do."""


def _redownload(path: str) -> str:
    return f"{path}: delete it and download the checkpoint again"


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_contiguous(entries: dict, base: int, size: int, path: str) -> None:
    """The spec's rule: the tensors tile the data buffer exactly, in some order, with no overlap and no hole
    (an overlap would make two tensors share bytes; a hole or trailing bytes mean a damaged file)."""
    at = base
    for name, (_, _, b, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if b != at:
            what = "overlaps the tensor before it" if b < at else f"leaves a hole of {b - at} bytes before it"
            raise SafetensorsError(f"tensor {name!r} {what} (data offsets must tile the file). {_redownload(path)}")
        at = end
    if at != size:
        raise SafetensorsError(f"the tensors end at byte {at} but the file has {size} bytes (damaged or extended). "
                               f"{_redownload(path)}")


def check_shard_name(fn, index: str) -> None:
    """A shard named in the index must be a plain *.safetensors file name in the checkpoint folder: an
    absolute path, a `../` or a sub-folder could make a downloaded index read any file on this computer."""
    if (not isinstance(fn, str) or not fn.endswith(".safetensors") or os.path.basename(fn) != fn
            or fn.startswith(".") or "\\" in fn or "\0" in fn):
        raise SafetensorsError(f"{index} names the shard {str(fn)[:200]!r}, which is not a *.safetensors file in "
                               f"the checkpoint folder (absolute paths, '..' and sub-folders are refused). The index "
                               f"is corrupt or hostile: {_redownload(index)}")


class SafetensorsFile:
    """One .safetensors file: `entries` name -> (dtype tag, shape tuple, absolute begin, end)."""

    def __init__(self, path: str):
        self.path = path
        try:
            size = check_regular(path).st_size
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise SafetensorsError(f"file is {size} bytes, too short for a safetensors header. {_redownload(path)}")
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or 8 + n > size:
                    raise SafetensorsError(
                        f"header length {n} runs past the end of the {size}-byte file (truncated or not a "
                        f"safetensors file). {_redownload(path)}")
                raw = f.read(n)
        except CheckpointFileError as exc:
            raise SafetensorsError(str(exc)) from None
        except OSError as exc:
            raise SafetensorsError(f"cannot read {path}: {exc}") from exc
        try:
            header = json.loads(raw.decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise SafetensorsError(f"header is not valid JSON ({exc}). {_redownload(path)}") from None
        self.metadata = header.pop("__metadata__", None) or {}
        if not isinstance(self.metadata, dict):
            raise SafetensorsError(f"__metadata__ is not an object. {_redownload(path)}")
        base = 8 + n
        self.entries = {}
        for name, e in header.items():
            try:
                tag, shape, (b, end) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
            except (KeyError, TypeError, ValueError) as exc:
                raise SafetensorsError(f"tensor {name!r} has a malformed header entry. {_redownload(path)}") from None
            if not all(_whole(v) and v >= 0 for v in (b, end, *shape)):
                raise SafetensorsError(f"tensor {name!r} has a shape {list(shape)} or data offsets {[b, end]} that are "
                                       f"not whole non-negative numbers. {_redownload(path)}")
            if not isinstance(tag, str) or tag not in DTYPES:
                raise SafetensorsError(f"tensor {name!r} has dtype {tag}, which this reader does not know. "
                                       f"Use a checkpoint saved in BF16/F16/F32/U8.")
            want = math.prod(shape) * np.dtype(DTYPES[tag]).itemsize
            if not (0 <= b <= end) or end - b != want:
                raise SafetensorsError(f"tensor {name!r}: data offsets [{b}, {end}] do not match shape {list(shape)} "
                                       f"of {tag}. {_redownload(path)}")
            if base + end > size:
                raise SafetensorsError(f"tensor {name!r} ends at byte {base + end}, past the end of the {size}-byte "
                                       f"file (truncated download). {_redownload(path)}")
            self.entries[name] = (tag, shape, base + b, base + end)
        _check_contiguous(self.entries, base, size, path)
        self._mm = np.memmap(path, dtype=np.uint8, mode="r") if size else None

    def get(self, name: str) -> np.ndarray:
        tag, shape, b, end = self.entries[name]
        if b == end:
            return np.zeros(shape, dtype=DTYPES[tag])
        return self._mm[b:end].view(DTYPES[tag]).reshape(shape)


class Checkpoint:
    """All tensors of a checkpoint folder: `model.safetensors.index.json` + shards, `model.safetensors`,
    or (fallback) every *.safetensors file in the folder. Tensor names must be unique across files."""

    def __init__(self, folder: str):
        self.folder = folder
        index = os.path.join(folder, INDEX_NAME)
        if os.path.exists(index):
            try:
                weight_map = json.loads(read_text(index, JSON_LIMIT))["weight_map"]
            except CheckpointFileError as exc:
                raise SafetensorsError(str(exc)) from None
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
                raise SafetensorsError(f"{index} is not a valid safetensors index ({exc}). {_redownload(index)}") from None
            if not isinstance(weight_map, dict) or not weight_map:
                raise SafetensorsError(f"{index} has no weight_map object. {_redownload(index)}")
            for fn in weight_map.values():   # each a name in the folder (5, null or a list is none), before sorting
                check_shard_name(fn, index)
            files = sorted(set(weight_map.values()))
        elif os.path.exists(os.path.join(folder, SINGLE_NAME)):
            files, weight_map = [SINGLE_NAME], None
        else:
            files, weight_map = sorted(p for p in os.listdir(folder) if p.endswith(".safetensors")), None
        if not files:
            raise SafetensorsError(f"no .safetensors files in {folder}. Point at a Hugging Face checkpoint folder "
                                   f"(with model.safetensors or a sharded index).")
        self.files = {}
        for fn in files:
            path = os.path.join(folder, fn)
            if not os.path.exists(path):
                raise SafetensorsError(f"shard {fn} listed in {INDEX_NAME} is missing from {folder}. "
                                       f"Download the checkpoint again.")
            self.files[fn] = SafetensorsFile(path)
        self._where = {}
        for fn, sf in self.files.items():
            for name in sf.entries:
                if name in self._where:
                    raise SafetensorsError(f"tensor {name!r} appears in both {self._where[name]} and {fn}.")
                self._where[name] = fn
        if weight_map is not None:
            for name, fn in weight_map.items():
                if self._where.get(name) != fn:
                    raise SafetensorsError(f"{INDEX_NAME} places {name!r} in {fn}, but that shard does not hold it. "
                                           f"Download the checkpoint again.")

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def dtype(self, name: str) -> str:
        """The safetensors dtype tag ("BF16", "U8", ...)."""
        return self.files[self._where[name]].entries[name][0]

    def shape(self, name: str) -> tuple:
        return self.files[self._where[name]].entries[name][1]

    def get(self, name: str) -> np.ndarray:
        """Read-only numpy view (BF16 as uint16 bits)."""
        return self.files[self._where[name]].get(name)

    def get_f32(self, name: str) -> np.ndarray:
        """The tensor as float32 (a new array); BF16 is widened exactly."""
        arr, tag = self.get(name), self.dtype(name)
        if tag == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.astype(np.float32)
