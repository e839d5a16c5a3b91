"""The packed engine file: one versioned, mmap-able file per converted checkpoint.

Layout (little endian):
    bytes 0..7    magic b"BITNETAP"
    bytes 8..11   uint32 format version (FORMAT_VERSION)
    bytes 12..19  uint64 length of the JSON metadata that follows
    bytes 20..    JSON metadata (utf-8), then zero padding up to DATA_ALIGN
    data          each tensor at an offset (relative to the start of the file) that is a multiple of 64

Metadata keys: "config" (normalized hyper-parameters, see checkpoint/config.py), "tensors" (name -> dtype, shape,
offset, nbytes), and what the model layer needs: "tokenizer_json", "tokenizer_config",
"generation_config", "chat_template", "stop_ids", "bos_id", "mask_id", "diffusion", "source".

Tensor names (i = layer index), layouts from packing.py:
    embed                       uint16 (V, D)        bfloat16 bits, row-major (embedding and exact head)
    norm                        float32 (D,)
    layers.i.attn_norm          float32 (D,)         input_layernorm
    layers.i.attn_sub_norm      float32 (D,)
    layers.i.ffn_norm           float32 (D,)         post_attention_layernorm
    layers.i.ffn_sub_norm       float32 (I,)
    layers.i.{qkv,o,gate_up,down}.codes  uint8 ternary tiles; .scale float32 (Np,) per-row multiplier
        qkv rows = [q (H*hd) | k (KVH*hd) | v (KVH*hd)], K = D
        o: N = D, K = H*hd;  gate_up rows = [gate (I) | up (I)], K = D;  down: N = D, K = I
    head.i8                     int8 tiles (Vp/16, Dp/4, 64); head.scale float32 (Vp,); head.rowsum int32 (Vp,)

Files are written to a temporary name in the same folder and renamed into place, so a crash never
leaves a half-written file under the final name.
"""
import json
import os
import struct
import tempfile

import numpy as np

MAGIC = b"BITNETAP"
FORMAT_VERSION = 1
DATA_ALIGN = 4096
TENSOR_ALIGN = 64
_HEADER = struct.Struct("<8sIQ")

DTYPES = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int32": np.int32, "float32": np.float32}


class EngineFileError(ValueError):
    """A file that is not a (current) engine file: the message says what to do."""


def write_engine_file(path: str, meta: dict, tensors: dict[str, np.ndarray]) -> None:
    """Write meta + tensors atomically to `path` (temporary file in the same folder, then rename)."""
    table, offset = {}, 0
    for name, arr in tensors.items():
        dtype = np.dtype(arr.dtype).name
        if dtype not in DTYPES:
            raise TypeError(f"tensor {name}: unsupported dtype {dtype}")
        table[name] = {"dtype": dtype, "shape": list(arr.shape), "offset": offset, "nbytes": int(arr.nbytes)}
        offset += -(-int(arr.nbytes) // TENSOR_ALIGN) * TENSOR_ALIGN
    full_meta = dict(meta, tensors=table)
    blob = json.dumps(full_meta, separators=(",", ":")).encode()
    data_start = -(-(_HEADER.size + len(blob)) // DATA_ALIGN) * DATA_ALIGN
    for entry in table.values():
        entry["offset"] += data_start
    blob = json.dumps(full_meta, separators=(",", ":")).encode()  # offsets changed: same length or longer
    data_start2 = -(-(_HEADER.size + len(blob)) // DATA_ALIGN) * DATA_ALIGN
    if data_start2 != data_start:  # the longer numbers crossed a page: shift once more
        for entry in table.values():
            entry["offset"] += data_start2 - data_start
        blob = json.dumps(full_meta, separators=(",", ":")).encode()
        data_start = data_start2
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".partial-", suffix=".bitnet", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, len(blob)))
            f.write(blob)
            for name, arr in tensors.items():
                f.seek(table[name]["offset"])
                f.write(np.ascontiguousarray(arr).tobytes(order="C"))
            end = max((e["offset"] + e["nbytes"] for e in table.values()), default=data_start)
            f.truncate(max(end, data_start))
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a cache file should follow the umask
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


NOT_AN_ENGINE_FILE = ("is not a BitNet engine file (those start with BITNETAP). Give a converted .bitnet file, an "
                      "HF checkpoint folder, a Hub repo id or `demo`; `python -m bitnet_app convert` turns a "
                      "checkpoint into an engine file.")


def _read_meta(path: str, size: int) -> dict:
    """The JSON metadata after the header of a `size`-byte file, or EngineFileError saying what to do."""
    with open(path, "rb") as f:
        head = f.read(_HEADER.size)
        magic, version, meta_len = _HEADER.unpack(head) if len(head) == _HEADER.size else (None, None, 0)
        ours = bool(head) and head[:len(MAGIC)] == MAGIC[:len(head)]  # starts like an engine file (or a cut one)
        problem = (NOT_AN_ENGINE_FILE if not ours
                   else "is too short to be an engine file (truncated?). Convert the checkpoint again."
                   if magic is None
                   else f"has engine format {version}, this version reads {FORMAT_VERSION}. Convert the "
                        "checkpoint again." if version != FORMAT_VERSION
                   else "is truncated (metadata runs past the end). Convert the checkpoint again."
                   if meta_len > size else None)
        if problem:
            raise EngineFileError(f"{path} {problem}")
        return json.loads(f.read(meta_len).decode())


class EngineFile:
    """A converted model opened read-only: `meta` (dict) and `tensors` (name -> numpy view of the mmap)."""

    def __init__(self, path: str):
        self.path = path
        try:
            size = os.path.getsize(path)
            self.meta = _read_meta(path, size)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise EngineFileError(f"cannot read engine file {path}: {exc}") from exc
        table = self.meta.get("tensors", {})
        end = max((e["offset"] + e["nbytes"] for e in table.values()), default=0)
        if end > size:
            raise EngineFileError(f"{path} is truncated ({size} bytes, needs {end}). Convert the checkpoint again.")
        self._mm = np.memmap(path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
        self.tensors = {}
        for name, e in table.items():
            raw = self._mm[e["offset"]:e["offset"] + e["nbytes"]]
            self.tensors[name] = raw.view(DTYPES[e["dtype"]]).reshape(e["shape"])

    @property
    def config(self) -> dict:
        return self.meta["config"]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.tensors[name]

    @property
    def nbytes(self) -> int:
        return os.path.getsize(self.path)
