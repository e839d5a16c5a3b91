"""What an engine file's tensors must hold, beyond the table validate.py checks: the checks file.py runs at each open.

A file whose checksums were recomputed after an edit (a deliberate attacker, or a buggy writer) passes the checksum
test, so these look at the values themselves:

    check_tensor_set(names, cfg, where)   exactly the tensors the config implies: no missing layer, no extra one (a
                                          config saying 1 layer over a file of 2 would run a one-layer model)
    check_small_tensors(tensors, cfg, where)   the small tensors, whole, at every open: every float32 tensor by
                                          value_problem, and head.rowsum equal to the sums of head.i8's rows (~40 ms
                                          for 2B-4T, most of it reading the 328 MB head)
    value_problem(name, arr, cfg) -> str | None   the one list of value rules of a float32 tensor, which the
                                          converter holds what it writes to as well: finite and within MAX_WEIGHT
                                          (norms, per-row scales, head.scale); a scale (per-row multiplier) positive
                                          in every real row and 0 in the padding rows
    ternary_code_problem(raw) -> int | None   the first byte of 2-bit ternary codes (packing.pack_ternary_tiles)
                                          holding the unused code 3; file.py runs it on the chunks it verifies

Each failure is an EngineFileError naming the file and the tensor, saying "convert the checkpoint again".
"""
import numpy as np

from .sizes import projection_shapes
from .validate import EngineFileError

EVEN_BITS = np.uint64(0x5555555555555555)   # bit 0 of every 2-bit field of a little-endian word
MAX_WEIGHT = 65504.0   # fp16's largest: no real model's weight (or scale) comes near it; a flipped exponent bit does


def _fail(where: str, what: str):
    raise EngineFileError(f"{where} is damaged: {what}. Convert the checkpoint again.")


def scale_rows(name: str, cfg: dict) -> int | None:
    """The real rows of scale tensor `name` (the rest of its length is padding to whole tiles), or None when `name`
    is no scale: layers.i.{qkv,o,gate_up,down}.scale (the fused projections' rows) and head.scale (the vocabulary)."""
    if name == "head.scale":
        return cfg["vocab_size"]
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "layers" or parts[3] != "scale":
        return None
    shapes = projection_shapes(cfg)
    fused = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
             "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}.get(parts[2])
    return None if fused is None else sum(shapes[p][0] for p in fused)


def value_problem(name: str, arr: np.ndarray, cfg: dict) -> str | None:
    """What is wrong with the values of float32 tensor `name`, or None. Every value is a finite number within
    MAX_WEIGHT; a scale multiplies a row's ternary (or int8) weights, so in a real row it is positive (the converter
    refuses a weight_scale <= 0, and the multipliers it derives are positive: a zero scale silences the row, a negative
    one flips it; head.scale all 0 made every reply token 0) and in a padding row it is 0, as the converter writes."""
    flat = arr.reshape(-1)
    bad = ~(np.abs(flat) <= MAX_WEIGHT)   # NaN compares false
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"tensor {name!r} holds {flat[i]:.3g} at index {i} (weights are finite numbers no larger than {MAX_WEIGHT:g})"
    rows = scale_rows(name, cfg)
    if rows is None:
        return None
    low = np.flatnonzero(~(flat[:rows] > 0))
    if low.size:
        i = int(low[0])
        return (f"tensor {name!r} holds {flat[i]:.3g} at index {i} (a scale of a real row is a positive number: 0 "
                "silences the row, a negative one flips its sign)")
    pad = np.flatnonzero(flat[rows:] != 0)
    if pad.size:
        i = rows + int(pad[0])
        return f"tensor {name!r} holds {flat[i]:.3g} at index {i} (a padding row past its {rows} real rows, which is 0)"
    return None


def expected_tensor_names(cfg: dict) -> set[str]:
    """The tensor names of an engine file with this (checked) config (the layout of engine/file.py)."""
    names = {"embed", "norm", "head.i8", "head.scale", "head.rowsum"} | (set() if cfg["tie_word_embeddings"]
                                                                        else {"lm_head"})
    per_layer = ["attn_norm", "ffn_norm"] + (["attn_sub_norm", "ffn_sub_norm"] if cfg["sub_norms"] else [])
    per_layer += [f"{m}.{part}" for m in ("qkv", "o", "gate_up", "down") for part in ("codes", "scale")]
    return names | {f"layers.{i}.{n}" for i in range(cfg["num_hidden_layers"]) for n in per_layer}


def check_tensor_set(names, cfg: dict, where: str) -> None:
    want, have = expected_tensor_names(cfg), set(names)
    missing, extra = sorted(want - have), sorted(have - want)
    if missing:
        _fail(where, f"tensor {missing[0]!r} is missing ({len(missing)} in all), though its config "
                     f"(num_hidden_layers = {cfg['num_hidden_layers']}) needs it")
    if extra:
        _fail(where, f"it holds tensor {extra[0]!r} ({len(extra)} such), which its config "
                     f"(num_hidden_layers = {cfg['num_hidden_layers']}) has no place for")


def check_small_tensors(tensors: dict, cfg: dict, where: str) -> None:
    """Every float32 tensor finite and within MAX_WEIGHT; head.rowsum the row sums of head.i8 (int8 tiles
    (Vp/16, Dp/4, 64), byte [t, g, 4*i + j] = w8[16*t + i, 4*g + j], see packing.pack_int8_tiles)."""
    vp, dp = -(-cfg["vocab_size"] // 16) * 16, -(-cfg["hidden_size"] // 16) * 16
    for name, dtype, shape in (("head.i8", np.int8, (vp // 16, dp // 4, 64)), ("head.scale", np.float32, (vp,)),
                               ("head.rowsum", np.int32, (vp,))):
        if tensors[name].dtype != dtype or tensors[name].shape != shape:
            _fail(where, f"tensor {name!r} is {tensors[name].dtype.name}{tensors[name].shape}, its config needs "
                         f"{np.dtype(dtype).name}{shape}")
    for name, arr in tensors.items():
        why = value_problem(name, arr, cfg) if arr.dtype == np.float32 else None
        if why:
            _fail(where, why)
    tiles, rowsum = tensors["head.i8"], tensors["head.rowsum"]
    from .. import _engine  # the compiled extension: 30 ms for 2B-4T's 328 MB head, numpy's strided sum ~300 ms
    sums = _engine.int8_tile_rowsums(tiles)
    if not np.array_equal(sums, rowsum):
        row = int(np.flatnonzero(sums != rowsum)[0])
        _fail(where, f"head.rowsum[{row}] is {int(rowsum[row])}, but row {row} of head.i8 sums to {int(sums[row])}")


def ternary_code_problem(raw: np.ndarray) -> int | None:
    """The index of the first byte holding code 3 (0b11) in one of its four 2-bit fields, or None; raw: uint8 bytes of
    2-bit ternary codes (codes 0, 1, 2 = weights -1, 0, +1). Checked eight bytes at a time."""
    n = raw.size // 8 * 8
    words = raw[:n].view("<u8")
    bad = words & (words >> np.uint64(1)) & EVEN_BITS
    if bad.any():
        w = int(np.flatnonzero(bad)[0])
        return 8 * w + int(np.flatnonzero(raw[8 * w:8 * w + 8] & (raw[8 * w:8 * w + 8] >> 1) & 0x55)[0])
    tail = raw[n:]
    hits = np.flatnonzero(tail & (tail >> 1) & 0x55)
    return n + int(hits[0]) if hits.size else None
