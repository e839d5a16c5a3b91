"""The packed engine file: one versioned, mmap-able file per converted checkpoint.

Layout (little endian), format 4 (format 2 and 3 files are still read, see "Versions" below):
    bytes 0..7    magic b"BITNETAP"
    bytes 8..11   uint32 format version (FORMAT_VERSION)
    bytes 12..19  uint64 length of the JSON metadata that follows
    bytes 20..35  the first 16 bytes of sha256(bytes 0..19 + the JSON metadata): damage to the header or
                  the metadata is found before anything in it is believed
    bytes 36..    JSON metadata (utf-8), then zero padding up to DATA_ALIGN
    data          each tensor at an offset (relative to the start of the file) that is a multiple of 64,
                  in offset order, not overlapping, zero padding between; the file ends on a multiple of 64

Metadata keys: "config" (normalized hyper-parameters, see checkpoint/config.py), "tensors" (name -> dtype, shape,
offset, nbytes), "layout" (data_start, file_bytes, chunk_bytes, chunk_sums: the wrapping uint64 sum of
each CHUNK_BYTES piece of the data region, read as little-endian uint64 words), and what the model
layer needs: "tokenizer_json", "tokenizer_config",
"generation_config", "chat_template", "stop_ids", "bos_id", "mask_id", "diffusion" (block_size and attention:
what the model was trained with, TRAINED_BLOCK_SIZE and PLAIN_ATTENTION where the checkpoint names none; trained;
a dlm_config.json's suggested sub_block_size and threshold), "source"; and "ternary_packing" (format 4): the
layout of every ternary matrix's tiles, "2bit" (4 codes a byte) or "1.6bit" (5 codes a byte), packing.py PACKINGS;
the converter chooses it.

Config keys of format 3 beyond the sizes (checkpoint/config.py writes them, validate.py checks them):
    hidden_act "relu2" | "silu"      the gated MLP's activation
    sub_norms true | false           layers.i.{attn,ffn}_sub_norm present (BitNet) or absent (Llama family)
    tie_word_embeddings true | false the head is the embedding, or its own tensor lm_head
    rope_scaling null | {"rope_type": "llama3", ...}   see engine/rope.py
The weight-scale rule (multiply or divide by the checkpoint's weight_scale) is folded into each matrix's
per-row multiplier at conversion, so the engine has one rule: W_eff = T * scale.

Versions: format 3 (before the 1.6-bit tiles) has no "ternary_packing" and always holds 2-bit tiles; it is read
as "2bit". Format 2 (before the Llama family) had none of the config keys above either and always held relu2,
sub-norms and a tied head; it is read with those values filled in. Format 1 and unknown versions are refused with
"convert again". A checkpoint folder's cached conversion is keyed by the format (engine/cache.py), so an older
cached file is converted again, into the current format, when the app next opens that checkpoint.

Tensor names (i = layer index), layouts from packing.py:
    embed                       uint16 (V, D)        bfloat16 bits, row-major (embedding; the exact head when tied)
    lm_head                     uint16 (V, D)        bfloat16 bits: the exact head when untied (absent when tied)
    norm                        float32 (D,)
    layers.i.attn_norm          float32 (D,)         input_layernorm
    layers.i.attn_sub_norm      float32 (D,)         only when sub_norms
    layers.i.ffn_norm           float32 (D,)         post_attention_layernorm
    layers.i.ffn_sub_norm       float32 (I,)         only when sub_norms
    layers.i.{qkv,o,gate_up,down}.codes  uint8 ternary tiles in the file's packing (packing.ternary_tile_shape);
                                .scale float32 (Np,) per-row multiplier
        qkv rows = [q (H*hd) | k (KVH*hd) | v (KVH*hd)], K = D
        o: N = D, K = H*hd;  gate_up rows = [gate (I) | up (I)], K = D;  down: N = D, K = I
    head.i8                     int8 tiles (Vp/16, Dp/4, 64); head.scale float32 (Vp,); head.rowsum int32 (Vp,)
                                (the int8 head: of lm_head when untied, else of the embedding)

Files are written to a temporary name in the same folder (.partial-<pid>-*.bitnet) and renamed into
place, so a crash never leaves a half-written file under the final name; remove_stale_partials()
deletes the temporary files of writers that are no longer running.

Opening checks everything the engine and the model layer rely on (engine/validate.py): the metadata's
checksum, the tensor table (dtypes, shapes, sizes, aligned offsets after the metadata, in bounds, not
overlapping), the config values and the text metadata. The data's chunk sums are all verified when the
data is small (<= FULL_VERIFY_BYTES, e.g. the demo model: a few ms); a large file verifies its first and
last chunks and two random ones at each open (a zero-filled or torn tail is always found; a flipped bit
elsewhere with a chance per open), because summing all 1.5 GB of the 2B-4T file costs about a second.
EngineFile(path, verify="full") checks every chunk. A file whose checksums were recomputed after an edit passes
them, so the values are checked too (engine/values.py): the tensor set matches the config exactly, the small
tensors (norms, scales, the head's row sums) are checked whole at every open, and the ternary codes of every chunk
verified hold no unused code 3.
"""
import hashlib
import json
import mmap
import os
import re
import stat
import struct
import tempfile
import time

import numpy as np

from .. import platform
from .packing import PACKING_2BIT
from .validate import DTYPES, EngineFileError, check_meta, check_table
from .values import check_small_tensors, check_tensor_set, ternary_code_problem

MAGIC = b"BITNETAP"
FORMAT_VERSION = 4
READABLE_VERSIONS = (2, 3, 4)
# what a format-2 file implicitly was: BitNet b1.58 2B-4T's architecture
FORMAT_2_DEFAULTS = {"hidden_act": "relu2", "sub_norms": True, "tie_word_embeddings": True, "rope_scaling": None}
# meta["diffusion"] of a checkpoint that names none (converted files always hold both; a file without them means these):
TRAINED_BLOCK_SIZE = 32      # no bd_size: Fast-dLLM v2's training block size
PLAIN_ATTENTION = "causal"   # no dlm_config.json: an ordinary causal LM
DATA_ALIGN = 4096
TENSOR_ALIGN = 64
CHUNK_BYTES = 16 << 20           # one data checksum per 16 MB
FULL_VERIFY_BYTES = 64 << 20     # data up to this size is verified completely at every open
SAMPLED_CHUNKS = 2               # random chunks verified (besides the first and last) in a larger file
MAX_META_BYTES = 256 << 20       # the 2B-4T metadata (with its 9 MB tokenizer) is ~10 MB
STALE_PARTIAL_SECONDS = 3600     # a temporary file untouched this long belongs to no live writer
_HEADER = struct.Struct("<8sIQ16s")
_PREFIX = struct.Struct("<8sIQ")  # the part of the header the digest covers
_PARTIAL_RE = re.compile(r"^\.partial-(?:(\d+)-)?.*\.bitnet$")


def _digest(prefix: bytes, blob: bytes) -> bytes:
    return hashlib.sha256(prefix + blob).digest()[:16]


def _words(raw: np.ndarray) -> np.ndarray:
    """uint8 bytes -> little-endian uint64 words (zero-padded to a multiple of 8)."""
    if raw.size % 8:
        raw = np.concatenate([raw, np.zeros(8 - raw.size % 8, np.uint8)])
    return raw.view("<u8")


def _chunk_sums(spans, n_chunks: int) -> list[int]:
    """spans: (offset relative to the data start (a multiple of 8), uint8 bytes) -> wrapping uint64 sum of
    each CHUNK_BYTES chunk of the data region (gaps are zeros and add nothing)."""
    sums = [0] * n_chunks
    for rel, raw in spans:
        pos = 0
        while pos < raw.size:
            c = (rel + pos) // CHUNK_BYTES
            take = min(raw.size - pos, (c + 1) * CHUNK_BYTES - (rel + pos))
            sums[c] = (sums[c] + int(_words(raw[pos:pos + take]).sum(dtype=np.uint64))) % (1 << 64)
            pos += take
    return sums


def write_engine_file(path: str, meta: dict, tensors: dict[str, np.ndarray]) -> None:
    """Write meta + tensors atomically to `path` (temporary file in the same folder, then rename)."""
    table, rel = {}, 0
    for name, arr in tensors.items():
        dtype = np.dtype(arr.dtype).name
        if dtype not in DTYPES:
            raise TypeError(f"tensor {name}: unsupported dtype {dtype}")
        table[name] = {"dtype": dtype, "shape": list(arr.shape), "offset": rel, "nbytes": int(arr.nbytes)}
        rel += -(-int(arr.nbytes) // TENSOR_ALIGN) * TENSOR_ALIGN
    data_bytes = rel  # the data region, padded to TENSOR_ALIGN
    n_chunks = -(-data_bytes // CHUNK_BYTES)
    sums = _chunk_sums(((table[n]["offset"], np.ascontiguousarray(a).reshape(-1).view(np.uint8))
                        for n, a in tensors.items()), n_chunks)
    layout = {"data_start": 0, "file_bytes": 0, "chunk_bytes": CHUNK_BYTES, "chunk_sums": sums}
    full_meta = dict(meta, tensors=table, layout=layout)
    data_start = 0
    while True:  # offsets depend on where the data starts, which depends on the metadata's length
        blob = json.dumps(full_meta, separators=(",", ":")).encode()
        start = -(-(_HEADER.size + len(blob)) // DATA_ALIGN) * DATA_ALIGN
        if start == data_start:
            break
        for entry in table.values():
            entry["offset"] += start - data_start
        layout["data_start"], layout["file_bytes"], data_start = start, start + data_bytes, start
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    remove_stale_partials(folder)
    fd, tmp = tempfile.mkstemp(prefix=f".partial-{os.getpid()}-", suffix=".bitnet", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(blob))
            f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, len(blob), _digest(prefix, blob)))
            f.write(blob)
            for name, arr in tensors.items():
                f.seek(table[name]["offset"])
                f.write(np.ascontiguousarray(arr).tobytes(order="C"))
            f.truncate(data_start + data_bytes)
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def remove_stale_partials(folder: str) -> list[str]:
    """Delete the .partial-*.bitnet files of writers that were killed: the writer's pid (in the name) is no
    longer running, or the file has not changed for STALE_PARTIAL_SECONDS (a reused pid, or a name from
    another machine). Returns the paths removed; a folder that cannot be listed is left alone."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        m = _PARTIAL_RE.match(name)
        if not m:
            continue
        path = os.path.join(folder, name)
        try:
            age = now - os.lstat(path).st_mtime
            pid = int(m.group(1)) if m.group(1) else None
            if age > STALE_PARTIAL_SECONDS or (pid is not None and pid != os.getpid() and not _pid_alive(pid)):
                os.unlink(path)
                removed.append(path)
        except (OSError, ValueError):
            continue  # gone already, or not ours to delete
    return removed


NOT_AN_ENGINE_FILE = ("is not a BitNet engine file (those start with BITNETAP). Give a converted .bitnet file, an "
                      "HF checkpoint folder, a Hub repo id or `demo`; `python -m bitnet_app convert` turns a "
                      "checkpoint into an engine file.")


def _problem(version, meta_len: int, size: int) -> str | None:
    if version is None:
        return "is too short to be an engine file (truncated?). Convert the checkpoint again."
    if version not in READABLE_VERSIONS:
        readable = ", ".join(map(str, READABLE_VERSIONS[:-1])) + f" and {READABLE_VERSIONS[-1]}"
        return (f"has engine format {version}, this version reads {readable}. "
                "Convert the checkpoint again "
                "(the cached copy of a checkpoint folder or Hub repo is rebuilt by itself).")
    if meta_len > min(size - _HEADER.size, MAX_META_BYTES):
        return "is truncated or damaged (its metadata runs past the end). Convert the checkpoint again."
    return None


def _read_meta(path: str) -> tuple[dict, int]:
    """(the JSON metadata, file size) of an engine file, checked against its digest; EngineFileError saying
    what to do otherwise. Refuses anything that is not a regular file (a FIFO or a device would block or
    never end)."""
    with open(path, "rb", buffering=0) as f:  # opening a FIFO would block: checked by the caller first
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise EngineFileError(f"{path} is not a regular file. Give a converted .bitnet file.")
        size = st.st_size
        head = f.read(_HEADER.size)
        if not head or head[:len(MAGIC)] != MAGIC[:len(head)]:  # does not start like an engine file
            raise EngineFileError(f"{path} {NOT_AN_ENGINE_FILE}")
        version, meta_len, digest = None, 0, b""
        if len(head) >= 12:
            version = struct.unpack_from("<I", head, 8)[0]
        if len(head) == _HEADER.size:
            _, version, meta_len, digest = _HEADER.unpack(head)
        elif version in READABLE_VERSIONS:
            version = None
        problem = _problem(version, meta_len, size)
        if problem:
            raise EngineFileError(f"{path} {problem}")
        blob = f.read(meta_len)
    if len(blob) != meta_len or _digest(_PREFIX.pack(MAGIC, version, meta_len), blob) != digest:
        raise EngineFileError(f"{path} is damaged: the checksum of its header and metadata does not match. "
                              "Convert the checkpoint again.")
    try:
        meta = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise EngineFileError(f"{path} has unreadable metadata ({exc}). Convert the checkpoint again.") from None
    if not isinstance(meta, dict):
        raise EngineFileError(f"{path} has metadata that is not a JSON object. Convert the checkpoint again.")
    if version == 2 and isinstance(meta.get("config"), dict):
        for key, value in FORMAT_2_DEFAULTS.items():
            meta["config"].setdefault(key, value)
    if version < 4:
        meta.setdefault("ternary_packing", PACKING_2BIT)
    return meta, size


class EngineFile:
    """A converted model opened read-only: `meta` (dict) and `tensors` (name -> numpy view of the mmap).
    verify: "auto" (all data chunks when the data is small, a sample otherwise) or "full"."""

    def __init__(self, path: str, verify: str = "auto"):
        self.path = path
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist")
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise EngineFileError(f"{path} is not a regular file. Give a converted .bitnet file.")
        try:
            self.meta, size = _read_meta(path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise EngineFileError(f"cannot read engine file {path}: {exc}") from exc
        where = f"{path}"
        layout = check_table(self.meta, size, _HEADER.size, where, TENSOR_ALIGN, DATA_ALIGN)
        check_meta(self.meta, where)
        check_tensor_set(self.meta["tensors"], self.config, where)
        if size:
            with open(path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._mm = np.frombuffer(self._map, dtype=np.uint8)
        else:  # a zero-length file: mmap refuses one
            self._map, self._mm = None, np.zeros(0, np.uint8)
        self._verify_data(layout, verify)
        self.tensors = {}
        for name, e in self.meta["tensors"].items():
            raw = self._mm[e["offset"]:e["offset"] + e["nbytes"]]
            self.tensors[name] = raw.view(DTYPES[e["dtype"]]).reshape(e["shape"])
        check_small_tensors(self.tensors, self.config, where)
        self._unmap_checked_pages()

    def _unmap_checked_pages(self) -> None:
        """Take the pages the checks above read out of this process's memory map: the whole int8 head (328 MB for
        2B-4T) and the verified chunks. The OS keeps them in its page cache (a later read of them is a minor fault),
        but mapped they counted in the process's resident memory for as long as it ran: 2B-4T's peak RSS was 1240 MB
        instead of ~900 (the engine reads the weights it streams into its own copy, engine/resident.py)."""
        if self._map is not None:
            platform.release_pages(self._map)

    def _verify_data(self, layout: dict, verify: str) -> None:
        start, end, sums = layout["data_start"], layout["file_bytes"], layout["chunk_sums"]
        n = len(sums)
        if verify == "full" or end - start <= FULL_VERIFY_BYTES:
            chunks = range(n)
        else:
            rng = np.random.default_rng()
            chunks = sorted({0, n - 1, *(int(c) for c in rng.integers(0, n, SAMPLED_CHUNKS))})
        # (2-bit tiles only: every byte of 1.6-bit tiles decodes to codes 0, 1, 2 on every path, packing.py)
        codes = [(e["offset"], e["offset"] + e["nbytes"], name) for name, e in self.meta["tensors"].items()
                 if name.endswith(".codes") and self.packing == PACKING_2BIT]
        for c in chunks:
            b = start + c * CHUNK_BYTES
            got = int(_words(self._mm[b:min(end, b + CHUNK_BYTES)]).sum(dtype=np.uint64))
            if got != sums[c]:
                raise EngineFileError(f"{self.path} is damaged: the data between bytes {b} and "
                                      f"{min(end, b + CHUNK_BYTES)} does not match its checksum. Convert the "
                                      "checkpoint again.")
            self._verify_codes(codes, b, min(end, b + CHUNK_BYTES))

    def _verify_codes(self, codes, b: int, e: int) -> None:
        """The ternary codes inside bytes [b, e) hold no unused code 3 (one the checksum vouches for when the
        checksums were recomputed after an edit): checked on every chunk _verify_data sums."""
        for lo, hi, name in codes:
            lo, hi = max(lo, b), min(hi, e)
            bad = ternary_code_problem(self._mm[lo:hi]) if lo < hi else None
            if bad is not None:
                raise EngineFileError(f"{self.path} is damaged: tensor {name!r} holds the unused ternary code 3 (its "
                                      f"byte {lo + bad - self.meta['tensors'][name]['offset']}). Convert the "
                                      "checkpoint again.")

    @property
    def config(self) -> dict:
        return self.meta["config"]

    @property
    def packing(self) -> str:
        """The layout of the ternary tiles: "2bit" or "1.6bit" (packing.PACKINGS)."""
        return self.meta["ternary_packing"]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.tensors[name]

    @property
    def nbytes(self) -> int:
        return os.path.getsize(self.path)
