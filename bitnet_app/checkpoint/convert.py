"""Hugging Face 1.58-bit checkpoint folder (BitNetForCausalLM, a Llama with BitNet quantization, or 1bitLLM's
BitnetForCausalLM; see checkpoint/families.py) -> one packed engine file (engine/file.py).

    convert_checkpoint(src_dir, out_path, *, progress=None, packing=None) -> out_path
        = plan_conversion (every check that reads no weight; the layouts and the scale rule: a Plan)
        -> read_tensors (the weights, ternarized, fused and tiled; the int8 head)
        -> write_conversion (the engine file's value rules on what is written, the metadata, the atomic write)

Two source layouts:
  offline  microsoft/bitnet-b1.58-2B-4T: `<proj>.weight` U8 (N/4, K) in the HF blocked layout
           (packing.unpack_hf_u8) + a one-element `<proj>.weight_scale`.
           linear_class "autobitlinear": W_eff = T * weight_scale  (scale_mode "multiply")
           linear_class "bitlinear":     W_eff = T / weight_scale  (scale_mode "divide")
           linear_class absent: the family's packed_scale (families.py): a Llama (transformers' BitLinear, the
           default class) divides; a BitNet model's rule is inferred from the scales (see _infer_scale_mode),
           recorded in meta.
  online   the -bf16 sibling, 1bitLLM's checkpoints, Falcon-E's latent revisions: `<proj>.weight`
           BF16/F16/F32 (N, K) latent weights, ternarized exactly as transformers WeightQuant (and 1bitLLM's
           weight_quant) does in fp32: s = 1/max(mean|w|, 1e-5), T = clamp(rint(w*s), -1, 1), W_eff = T * float32(1/s).
The scale rule is folded here into the per-row multiplier, so the engine only ever multiplies.
Sub-norms: under one of the namings of families.py (BitNet's self_attn.attn_sub_norm / mlp.ffn_sub_norm, 1bitLLM's
self_attn.inner_attn_ln / mlp.ffn_layernorm), or none (the Llama family): whichever layer 0 has, every layer must
have, and a family that requires them must have them.
Output tensors (names and layouts in engine/file.py): per layer, q|k|v and gate|up fused row-wise into
one tile-packed ternary matrix each (2-bit or 1.6-bit tiles, as packing.packing_for chooses) with a float32
per-row multiplier (Np,), padding rows 0.
The embedding stays bf16 (V, D). The head is the embedding (tied) or lm_head.weight (untied: stored bf16 as
`lm_head` for the exact head); the int8 head is the head's per-row absmax quantization, built in row chunks.
"""
import os
import re
import time
from dataclasses import dataclass

import numpy as np

from ..engine import packing
from ..engine.file import write_engine_file
from ..engine.packing import packing_for
from ..engine.values import value_problem
from .config import (ConvertError, projection_shapes, read_model_config, read_quant_config, read_text_meta,
                     ternary_weight_count)
from .families import SUB_NORM_NAMINGS, Family, family_of
from .weight_range import check_weights
from .safetensors_reader import Checkpoint, SafetensorsError

FLOAT_TAGS = ("BF16", "F16", "F32")
HEAD_CHUNK = 8192           # embedding rows per head-quantization chunk (multiple of 16): ~84 MB fp32 at D=2560
DIVIDE_THRESHOLD = 3.0      # see _infer_scale_mode
CONVERTER_VERSION = 1
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")



def _sub_norm_naming(ck: Checkpoint) -> str | None:
    """Which sub-norm naming layer 0 uses ("bitnet", "1bitllm"), or None when it has no sub-norms."""
    found = [k for k, names in SUB_NORM_NAMINGS.items() if any(f"model.layers.0.{n}.weight" in ck for n in names)]
    if len(found) > 1:
        raise ConvertError(f"layer 0 of {ck.folder} holds sub-norms under both namings ({', '.join(found)}). The "
                           "checkpoint is not one this app knows: use an unmodified checkpoint.")
    return found[0] if found else None


def _norm_shapes(cfg: dict, naming: str | None) -> dict:
    """HF norm name -> (engine name suffix, length), sub-norms under `naming` (None: no sub-norms)."""
    D, I = cfg["hidden_size"], cfg["intermediate_size"]
    out = {"input_layernorm": ("attn_norm", D), "post_attention_layernorm": ("ffn_norm", D)}
    if naming is not None:
        attn, ffn = SUB_NORM_NAMINGS[naming]
        out.update({attn: ("attn_sub_norm", D), ffn: ("ffn_sub_norm", I)})
    return out


def _expect(ck: Checkpoint, name: str, shape: tuple, tags: tuple) -> None:
    """Raise ConvertError unless tensor `name` exists with this shape and one of these dtypes."""
    if name not in ck:
        raise ConvertError(f"tensor {name!r} is missing from {ck.folder}. The checkpoint is incomplete or not a "
                           f"BitNet b1.58 model: download it again.")
    got = tuple(ck.shape(name))
    if got != tuple(shape):
        raise ConvertError(f"tensor {name!r} has shape {list(got)}, expected {list(shape)} from config.json. "
                           f"The weights and config.json do not belong together: download the checkpoint again.")
    if ck.dtype(name) not in tags:
        raise ConvertError(f"tensor {name!r} has dtype {ck.dtype(name)}, expected {' or '.join(tags)}. "
                           f"Use an unmodified BitNet b1.58 checkpoint (packed U8 or bf16).")


def _check_tensors(ck: Checkpoint, cfg: dict, layout: str, naming: str | None) -> None:
    """Check every tensor the conversion reads (header only, no data) before any work starts."""
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    _expect(ck, "model.embed_tokens.weight", (V, D), FLOAT_TAGS)
    if not cfg["tie_word_embeddings"]:
        _expect(ck, "lm_head.weight", (V, D), FLOAT_TAGS)
    _expect(ck, "model.norm.weight", (D,), FLOAT_TAGS)
    others = [n for k, names in SUB_NORM_NAMINGS.items() if k != naming for n in names]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for hf, (_, n) in _norm_shapes(cfg, naming).items():
            _expect(ck, p + hf + ".weight", (n,), FLOAT_TAGS)
        stray = [p + n + ".weight" for n in others if p + n + ".weight" in ck]
        if stray:
            raise ConvertError(f"tensor {stray[0]!r} is a sub-norm, but layer 0 has "
                               f"{'no sub-norms' if naming is None else 'them under the other naming'}. The layers do "
                               "not agree: use an unmodified checkpoint.")
        for proj, (N, K) in projection_shapes(cfg).items():
            name = p + proj + ".weight"
            if layout == "offline":
                if N % 4:
                    raise ConvertError(f"{name}: {N} output rows cannot be stored 4 per byte (packed layout). Use an unmodified BitNet b1.58 checkpoint.")
                _expect(ck, name, (N // 4, K), ("U8",))
                s = name + "_scale"
                if s not in ck:
                    raise ConvertError(f"tensor {s!r} is missing from {ck.folder}; packed U8 weights need their "
                                       f"weight_scale. Download the checkpoint again.")
                if ck.dtype(s) not in FLOAT_TAGS or int(np.prod(ck.shape(s))) != 1:
                    raise ConvertError(f"tensor {s!r} is {ck.dtype(s)} {list(ck.shape(s))}, expected one "
                                       f"BF16/F16/F32 value (a per-tensor scale). Use an unmodified BitNet b1.58 checkpoint.")
            else:
                _expect(ck, name, (N, K), FLOAT_TAGS)


def _check_layer_count(ck: Checkpoint, cfg: dict) -> None:
    """Weights of layers beyond num_hidden_layers would be dropped silently: refuse instead."""
    L = cfg["num_hidden_layers"]
    extra = sorted({int(m.group(1)) for m in map(_LAYER_RE.match, ck.names()) if m and int(m.group(1)) >= L})
    if extra:
        raise ConvertError(f"config.json says num_hidden_layers = {L}, but the weights hold layers up to {extra[-1]} "
                           f"({extra[-1] + 1} layers). config.json and the weights do not belong together: fix "
                           "num_hidden_layers or download the checkpoint again.")


def _layout(ck: Checkpoint, cfg: dict, linear_class, mode) -> str:
    """"offline" (packed U8) or "online" (latent floats), from the data, checked against the config."""
    if cfg["num_hidden_layers"] == 0:
        return mode or "offline"
    first = "model.layers.0.self_attn.q_proj.weight"
    if first not in ck:
        raise ConvertError(f"tensor {first!r} is missing from {ck.folder}. Download the checkpoint again.")
    if ck.dtype(first) not in ("U8",) + FLOAT_TAGS:
        raise ConvertError(f"tensor {first!r} has dtype {ck.dtype(first)}, expected U8 (packed ternary) or "
                           f"BF16/F16/F32 (latent weights). Use an unmodified BitNet b1.58 checkpoint.")
    layout = "offline" if ck.dtype(first) == "U8" else "online"
    if mode is not None and mode != layout:
        raise ConvertError(f"quantization_mode is {mode!r} but {first} is {ck.dtype(first)} "
                           f"({'packed' if layout == 'offline' else 'latent float'} weights). config.json and the "
                           f"weights do not match: download the checkpoint again.")
    if layout == "online" and linear_class == "bitlinear":
        raise ConvertError("linear_class 'bitlinear' with latent (online) weights is not a supported quantization "
                           "mode. Use the packed checkpoint, or an autobitlinear online one.")
    return layout


def _infer_scale_mode(scales: list[float]) -> str:
    """Offline checkpoint without linear_class: does W_eff = T * s or T / s?

    Both conventions store a per-tensor scale derived from the latent weights' mean |W|:
    autobitlinear (2B-4T) stores mean|W| itself (~1.5 there; trained BitNet latents are O(0.01..2)),
    bitlinear stores 1/mean|W| (HF1BitLLM-era models: ~20-100). A median scale above 3 would mean a
    latent mean |W| above 3 under "multiply", which no known checkpoint has, so it is read as "divide".
    """
    return "divide" if float(np.median(scales)) > DIVIDE_THRESHOLD else "multiply"


def _ternary(ck: Checkpoint, name: str, layout: str, scale_mode: str,
             folded: bool = False) -> tuple[np.ndarray, np.float32]:
    """One projection -> (ternary int8 (N, K), float32 multiplier m) with W_eff = T * m.
    folded: latent weights that are already ternary x one scale (every nonzero |w| equal, as in Falcon-E's
    `bfloat16` revision, onebitllms convert_to_bf16: T * mean|W|) are taken as they are, T = sign(w),
    m = |w|; absmean would recover T but shrink m to mean|w| = m * (the fraction of nonzero weights)."""
    if layout == "offline":
        packed = ck.get(name)
        if np.any(packed & (packed >> 1) & 0x55):   # a 2-bit field equal to 3 (would unpack to +2)
            raise ConvertError(f"tensor {name!r} holds the invalid 2-bit code 3 (ternary codes are 0, 1, 2). "
                               f"The file is corrupt: download the checkpoint again.")
        t = packing.unpack_hf_u8(packed)
        s = np.float32(ck.get_f32(name + "_scale").reshape(-1)[0])
        if not np.isfinite(s) or s <= 0:
            raise ConvertError(f"{name}_scale is {s}; a weight scale must be a positive number. Download the "
                               f"checkpoint again.")
        with np.errstate(over="ignore"):   # 1/s of a subnormal s is inf: write_conversion refuses it, no warning
            return t, (s if scale_mode == "multiply" else np.float32(1.0) / s)
    w = ck.get_f32(name)
    check_weights(name, w, ck.folder)
    if folded:
        nz = np.abs(w[w != 0])
        if nz.size and nz.min() == nz.max():
            return np.sign(w).astype(np.int8), np.float32(nz[0])
    # transformers WeightQuant, in fp32: s = 1 / mean|w|.clamp(1e-5); T = round(w*s).clamp(-1, 1); W = T / s
    mean = np.float32(np.mean(np.abs(w), dtype=np.float64))
    s = np.float32(1.0) / max(mean, np.float32(1e-5))
    t = np.clip(np.rint(w * s), -1, 1).astype(np.int8)
    return t, np.float32(1.0) / s


def _finite_f32(ck: Checkpoint, name: str) -> np.ndarray:
    """A (small) float tensor as float32, once every value is seen to be finite."""
    arr = ck.get_f32(name)
    check_weights(name, arr, ck.folder)
    return arr


def _fuse(parts: list[tuple[np.ndarray, np.float32]], layout: str) -> tuple[np.ndarray, np.ndarray]:
    """[(T_j (N_j, K), m_j)] -> (tiles of concat(T_j) rows in `layout`, per-row multiplier float32 (Np,), 0 in
    padding)."""
    t = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts], axis=0)
    codes = packing.pack_tiles(t, layout)
    scale = np.zeros(codes.shape[0] * packing.TILE_ROWS, dtype=np.float32)
    row = 0
    for tj, mj in parts:
        scale[row:row + tj.shape[0]] = mj
        row += tj.shape[0]
    return codes, scale


def build_int8_head(embed: np.ndarray, report=None) -> dict:
    """bf16 bits (V, D) -> head.i8 int8 tiles (Vp/16, Dp/4, 64), head.scale float32 (Vp,), head.rowsum int32 (Vp,):
    the per-row absmax int8 quantization of the embedding (packing.quantize_rows_int8), padding rows 0.
    Works HEAD_CHUNK rows at a time, so the fp32 copy never exceeds one chunk."""
    V, D = embed.shape
    Vp, Dp = packing.ceil_to(V, 16), packing.ceil_to(D, 16)
    head = np.zeros((Vp // 16, Dp // 4, 64), dtype=np.int8)
    scale = np.zeros(Vp, dtype=np.float32)
    rowsum = np.zeros(Vp, dtype=np.int32)
    for r in range(0, V, HEAD_CHUNK):
        e = min(V, r + HEAD_CHUNK)
        w8, sc = packing.quantize_rows_int8(packing.bf16_to_f32(embed[r:e]))
        tiles = packing.pack_int8_tiles(w8)
        head[r // 16:r // 16 + tiles.shape[0]] = tiles
        scale[r:e] = sc
        rowsum[r:e] = w8.sum(axis=1, dtype=np.int32)
        if report is not None:
            report(e / V, f"lm head rows {e}/{V}")
    return {"head.i8": head, "head.scale": scale, "head.rowsum": rowsum}


def _read_embed(ck: Checkpoint, V: int, D: int, name: str = "model.embed_tokens.weight") -> np.ndarray:
    """A (V, D) float tensor (the embedding, or lm_head.weight) as bf16 bits: a view of the mmap when stored
    as BF16, else rounded."""
    src = ck.get(name)
    for r in range(0, V, HEAD_CHUNK):   # in row chunks: 2B-4T's embedding is 656 MB
        check_weights(name, src[r:r + HEAD_CHUNK], ck.folder, first_row=r)
    if ck.dtype(name) == "BF16":
        return src
    embed = np.empty((V, D), dtype=np.uint16)
    for r in range(0, V, HEAD_CHUNK):
        embed[r:r + HEAD_CHUNK] = packing.f32_to_bf16(src[r:r + HEAD_CHUNK].astype(np.float32))
    return embed


@dataclass
class Plan:
    """Everything a conversion decides before it reads a weight (plan_conversion): the checked config and text
    metadata, the open checkpoint, and how its tensors become the engine file's."""
    src_dir: str
    cfg: dict                # the normalized config, tie_word_embeddings and sub_norms set from the tensors
    raw: dict                # config.json as read
    family: Family
    text: dict               # read_text_meta's keys (tokenizer, template, stop ids, diffusion...)
    ck: Checkpoint
    naming: str | None       # the sub-norms' naming (families.py SUB_NORM_NAMINGS), None: none
    layout: str              # the source weights: "offline" (packed U8) or "online" (latent floats)
    linear_class: str | None
    quantization_mode: str | None
    tiles: str               # the engine file's ternary tile layout: "2bit" or "1.6bit"
    scale_mode: str          # "multiply" or "divide" (W_eff = T * s or T / s)
    scale_mode_inferred: bool
    folded: bool             # latent weights taken as already ternary x one scale (see _ternary)


def convert_checkpoint(src_dir: str, out_path: str, *, progress=None, packing: str | None = None) -> str:
    """Convert the HF checkpoint folder `src_dir` to the engine file `out_path` (written atomically).
    progress: optional callable(fraction in [0, 1], message). packing: the ternary tiles' layout ("2bit" or
    "1.6bit"; None: engine/packing.py packing_for chooses). Returns out_path.
    Raises ConvertError (a ValueError) for any bad input; nothing is written under out_path (or beside it) then."""
    t0 = time.time()

    def report(frac, msg):
        if progress is not None:
            progress(min(1.0, max(0.0, frac)), msg)

    plan = plan_conversion(src_dir, out_path, packing)
    try:
        tensors = read_tensors(plan, report)
    except SafetensorsError as exc:
        raise ConvertError(str(exc)) from exc
    report(0.96, "writing the engine file")
    write_conversion(plan, tensors, out_path)
    report(1.0, f"done in {time.time() - t0:.1f} s")
    return out_path


def plan_conversion(src_dir: str, out_path: str, packing: str | None = None) -> Plan:
    """Check everything that can be checked without reading a weight (the paths, the config and the text files, the
    tensor table) and decide the conversion: the source layout, the tile layout and the scale rule."""
    _check_paths(src_dir, out_path)
    cfg, raw = read_model_config(src_dir)
    fam = family_of(raw)   # not None: read_model_config refuses other models
    _, linear_class, mode = read_quant_config(raw)
    text = read_text_meta(src_dir, cfg, raw)
    try:
        ck = Checkpoint(src_dir)
    except SafetensorsError as exc:
        raise ConvertError(str(exc)) from exc
    cfg["tie_word_embeddings"] = _tied(ck, raw)
    naming = _sub_norms(ck, cfg, fam)
    cfg["sub_norms"] = naming is not None
    layout = _layout(ck, cfg, linear_class, mode)
    _check_tensors(ck, cfg, layout, naming)
    _check_layer_count(ck, cfg)
    try:
        tiles = packing_for(max(k for _, k in projection_shapes(cfg).values()), packing,
                            n_weights=ternary_weight_count(cfg))
    except ValueError as exc:
        raise ConvertError(str(exc)) from None
    scale_mode, inferred = _scale_mode(ck, cfg, fam, layout, linear_class)
    # Folded ternary latent weights are taken exactly unless the config asks for transformers' online
    # AutoBitLinear, which re-quantizes whatever it gets by absmean (and the engine must compute the same).
    return Plan(src_dir, cfg, raw, fam, text, ck, naming, layout, linear_class, mode, tiles, scale_mode, inferred,
                folded=layout == "online" and linear_class != "autobitlinear")


def _check_paths(src_dir: str, out_path: str) -> None:
    """A source that is a folder, and an output that is neither a folder nor one of the source's own files."""
    if not os.path.isdir(src_dir):
        raise ConvertError(f"{src_dir} is not a folder. Pass a Hugging Face checkpoint folder "
                           f"(config.json, tokenizer.json, *.safetensors).")
    _refuse_own_input(src_dir, out_path)
    if os.path.isdir(out_path):
        raise ConvertError(f"{out_path} is a folder: the output is one engine file. Give a file path, e.g. "
                           f"{os.path.join(out_path, 'model.bitnet')}, or leave --out out to use the cache folder.")


def _tied(ck: Checkpoint, raw: dict) -> bool:
    """Tied unless config.json says false (a boolean: read_model_config checked it), or says nothing and the weights
    hold their own lm_head."""
    tie = raw.get("tie_word_embeddings")
    tied = tie if tie is not None else "lm_head.weight" not in ck
    if not tied and "lm_head.weight" not in ck:
        raise ConvertError(f"config.json has tie_word_embeddings = false, but {ck.folder} holds no lm_head.weight. "
                           "The checkpoint is incomplete: download it again.")
    return tied


def _sub_norms(ck: Checkpoint, cfg: dict, fam: Family) -> str | None:
    """The sub-norms' naming layer 0 uses (None: none), once a family that requires them is seen to have them."""
    naming = _sub_norm_naming(ck) if cfg["num_hidden_layers"] else None
    # a family whose modeling code always has sub-norms: their absence means a damaged checkpoint
    if cfg["num_hidden_layers"] and fam.sub_norms_required and naming not in fam.sub_norms_required:
        want = SUB_NORM_NAMINGS[fam.sub_norms_required[0]]
        raise ConvertError(f"tensor 'model.layers.0.{want[0]}.weight' is missing from {ck.folder}: a {fam.name} model "
                           f"has sub-norms ({' and '.join(want)}) in every layer. The checkpoint is incomplete: download "
                           "it again.")
    return naming


def _scale_mode(ck: Checkpoint, cfg: dict, fam: Family, layout: str, linear_class) -> tuple[str, bool]:
    """(the scale rule, whether it was inferred from the scales): "multiply" (W_eff = T * s) or "divide" (T / s)."""
    if layout == "online" or linear_class == "autobitlinear":
        return "multiply", False         # online: W_eff = T * (1/s), s computed here
    if linear_class == "bitlinear" or fam.packed_scale == "divide":
        return "divide", False   # transformers' BitLinear, the class a config without linear_class gets
    scales = [float(ck.get_f32(f"model.layers.{i}.{p}.weight_scale").reshape(-1)[0])
              for i in range(cfg["num_hidden_layers"]) for p in projection_shapes(cfg)]
    return (_infer_scale_mode(scales) if scales else "multiply"), True


def read_tensors(plan: Plan, report) -> dict:
    """The engine file's tensors (names and layouts in engine/file.py), read from the checkpoint as `plan` says.
    report(fraction, message): the layers are 85% of the work, the head about 10%."""
    cfg, ck = plan.cfg, plan.ck
    tensors = {"embed": _read_embed(ck, cfg["vocab_size"], cfg["hidden_size"])}
    if not cfg["tie_word_embeddings"]:
        tensors["lm_head"] = _read_embed(ck, cfg["vocab_size"], cfg["hidden_size"], "lm_head.weight")
    head = build_int8_head(tensors.get("lm_head", tensors["embed"]), lambda f, m: report(0.1 * f, m))
    tensors["norm"] = _finite_f32(ck, "model.norm.weight")
    L = cfg["num_hidden_layers"]
    for i in range(L):
        tensors.update(_read_layer(plan, i))
        report(0.1 + 0.85 * (i + 1) / max(L, 1), f"layer {i + 1}/{L}")
    tensors.update(head)
    return tensors


FUSED = (("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")), ("o", ("self_attn.o_proj",)),
         ("gate_up", ("mlp.gate_proj", "mlp.up_proj")), ("down", ("mlp.down_proj",)))


def _read_layer(plan: Plan, i: int) -> dict:
    """Layer i's engine tensors: its norms (float32) and its four fused ternary matrices (tiles + per-row scale)."""
    p, o = f"model.layers.{i}.", f"layers.{i}."
    norms = _norm_shapes(plan.cfg, plan.naming)
    out = {o + eng: _finite_f32(plan.ck, p + hf + ".weight") for hf, (eng, _) in norms.items()}
    tern = {proj: _ternary(plan.ck, p + proj + ".weight", plan.layout, plan.scale_mode, plan.folded)
            for proj in projection_shapes(plan.cfg)}
    for eng, group in FUSED:
        out[o + eng + ".codes"], out[o + eng + ".scale"] = _fuse([tern[g] for g in group], plan.tiles)
    return out


def write_conversion(plan: Plan, tensors: dict, out_path: str) -> None:
    """Check what is written by the engine file's own value rules (engine/values.py: a scale 1/s of a tiny
    weight_scale can still be inf), then write the tensors and the metadata to out_path, atomically."""
    for name, arr in tensors.items():
        why = value_problem(name, arr, plan.cfg) if arr.dtype == np.float32 else None
        if why:
            raise ConvertError(f"converting {plan.src_dir} gives values no engine file may hold: {why}. The "
                               "checkpoint is damaged: download it again.")
    embed_dtype = plan.ck.dtype("model.embed_tokens.weight")
    meta = dict(plan.text)
    meta["config"] = plan.cfg
    meta["ternary_packing"] = plan.tiles
    meta["source"] = {
        "path": os.path.abspath(plan.src_dir), "family": plan.family.name, "sub_norm_naming": plan.naming,
        "layout": plan.layout, "linear_class": plan.linear_class,
        "quantization_mode": plan.quantization_mode, "scale_mode": plan.scale_mode,
        "scale_mode_inferred": plan.scale_mode_inferred,
        "embed_dtype": embed_dtype, "embed_rounded_to_bf16": embed_dtype != "BF16",
        "converter_version": CONVERTER_VERSION,
    }
    try:
        write_engine_file(out_path, meta, tensors)
    except OSError as exc:
        raise ConvertError(f"cannot write {out_path}: {exc}. Free some disk space or choose another output "
                           f"path.") from exc


def _refuse_own_input(src_dir: str, out_path: str) -> None:
    """An output that is one of the checkpoint's files (or the folder) would overwrite its own source."""
    out = os.path.realpath(out_path)
    inputs = {os.path.realpath(src_dir)} | {os.path.realpath(os.path.join(src_dir, n)) for n in os.listdir(src_dir)}
    same = out in inputs or (os.path.exists(out_path) and any(
        os.path.exists(p) and os.path.samefile(out_path, p) for p in inputs))
    if same:
        raise ConvertError(f"{out_path} is one of the checkpoint's own files (or its folder): converting into it would "
                           f"destroy the source. Choose another --out path, e.g. {os.path.join(src_dir, 'model.bitnet')}, "
                           "or leave --out out to use the cache folder.")


def estimated_output_bytes(folder: str) -> int:
    """About the size of the engine file convert_checkpoint(folder) writes (0 when config.json cannot be
    read): the bf16 embedding and the int8 head (3 bytes per vocab x hidden; 5 with an untied head's own
    bf16 copy), 2-bit ternary weights, and 16 MB for norms, scales, padding and metadata."""
    try:
        cfg, raw = read_model_config(folder)
    except ConvertError:
        return 0
    per_row = 3 if raw.get("tie_word_embeddings") is not False else 5
    return per_row * cfg["vocab_size"] * cfg["hidden_size"] + ternary_weight_count(cfg) // 4 + (16 << 20)
