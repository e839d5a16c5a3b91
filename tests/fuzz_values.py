"""Fuzz families for hostile values (issue 33), run by tests/fuzz.py beside its structural ones:

    resealed_meta   engine-file metadata edits that keep the table well formed but disagree with the config or
                    leave the ranges a real model has (a layer fewer or more, a tensor dropped or renamed, a dtype or
                    shape swapped at the same size, rms_norm_eps 2^31...), under a valid digest -> Model.open
    resealed_data   engine-file data edits with every chunk sum recomputed (NaN and infinities in the float
                    tensors, the unused ternary code 3, a head whose rows no longer match head.rowsum, NaN in the
                    embedding row of BOS, random bit flips) -> Model.open and a forward
    nonfinite       NaN and infinity bit patterns (and flips of a value's exponent to all ones) in the checkpoint's
                    bf16 tensors -> convert
    tokenizer_lies  a tokenizer that disagrees with itself, the config or the template (a post-processor id past
                    the vocabulary or of another token, a renamed or renumbered vocabulary entry, an emptied one, a
                    special token removed, a config or tokenizer_config naming another token) -> convert
    c_ints          integers at and past what a C int (or int64) holds, for every knob, the engine's own arguments
                    and the ids; an unknown keyword -> Model.generate, Engine, its forward and sampler

Each family raises SilentAcceptance when the product accepts what the oracle says it must refuse; the product's
refusals are ValueErrors (and OSErrors) with a message, which tests/fuzz.py counts as "rejected".
"""
import json
import os
import re

import numpy as np

from fuzz_common import SilentAcceptance, convert, copy_folder, open_and_run, reseal_data, rewrite_meta

C_INT_MAX = 2 ** 31 - 1
BIG = [2 ** 31, 2 ** 32, 2 ** 63, 2 ** 64, 10 ** 30, -2 ** 31 - 1, -2 ** 63]
NAN_PAYLOAD = np.frombuffer(b"\x01\x00\xc0\x7f", np.float32)[0]   # a NaN with a payload
_CACHE = {}


def _pick(rng, values):
    return values[int(rng.integers(0, len(values)))]


def _seed_meta(seeds) -> dict:
    from bitnet_app.engine.file import EngineFile
    return json.loads(json.dumps(EngineFile(seeds["engine"]).meta))


def _refused(what: str):
    raise SilentAcceptance(f"accepted: {what}")


# ---- resealed_meta ---------------------------------------------------------------------------------------------
def _meta_edit(rng, meta) -> str:
    """One edit the table check lets through (or need not catch) but the values must not: returns what it did."""
    cfg, table = meta["config"], meta["tensors"]
    names = sorted(table)
    name = _pick(rng, names)
    L = cfg["num_hidden_layers"]
    kind = int(rng.integers(0, 8))
    if kind == 0:
        cfg["num_hidden_layers"] = int(_pick(rng, [L - 1, L + 1, L + 5]))
        return f"num_hidden_layers {cfg['num_hidden_layers']} over a file of {L}"
    if kind == 1:
        key, value = _pick(rng, [("rms_norm_eps", 2.0 ** 31), ("rms_norm_eps", 1.0), ("rms_norm_eps", 1e-20),
                                 ("rope_theta", 1e30), ("rope_theta", 0.5), ("max_position_embeddings", 2 ** 20 + 1),
                                 ("max_position_embeddings", 2 ** 31), ("num_hidden_layers", 5000),
                                 ("vocab_size", 2 ** 23)])
        cfg[key] = value
        return f"{key} = {value}"
    if kind == 2:
        del table[name]
        return f"tensor {name} dropped"
    if kind == 3:
        new = _pick(rng, [f"layers.{L}.{name.split('.', 2)[-1]}", f"layers.{L + 7}.attn_norm", "extra",
                          name + ".old"])
        table[new] = table.pop(name)
        return f"tensor {name} renamed {new}"
    if kind == 4:
        key = _pick(rng, ["tie_word_embeddings", "sub_norms"])
        cfg[key] = not cfg[key]
        return f"{key} flipped"
    if kind == 5:
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}
        key, value = _pick(rng, [("factor", 1e9), ("original_max_position_embeddings", 2 ** 30),
                                 ("high_freq_factor", 1e6)])
        cfg["rope_scaling"][key] = value
        return f"rope_scaling.{key} = {value}"
    e = table[name]
    other = {"float32": "int32", "int32": "float32", "uint8": "int8", "int8": "uint8"}.get(e["dtype"])
    if kind == 6 and other:   # another dtype of the same size
        e["dtype"] = other
        return f"tensor {name} relabelled {other}"
    n = int(np.prod(e["shape"]))   # the same count of elements in another shape
    e["shape"] = [n] if len(e["shape"]) > 1 else ([n // 2, 2] if n % 2 == 0 else [1, n])
    return f"tensor {name} reshaped to {e['shape']}"


def fam_resealed_meta(rng, seeds, case_dir):
    meta = _seed_meta(seeds)
    what = _meta_edit(rng, meta)
    path = os.path.join(case_dir, "m.bitnet")
    if not rewrite_meta(seeds["engine"], path, meta):
        return "skipped"
    open_and_run(path)
    _refused(f"an engine file with {what}")


# ---- resealed_data ---------------------------------------------------------------------------------------------
def _views(meta, raw):
    return {name: raw[e["offset"]:e["offset"] + e["nbytes"]].view(e["dtype"]).reshape(e["shape"])
            for name, e in meta["tensors"].items()}


def _damaged_values(views, packing="2bit") -> str | None:
    """What the product must find after an edit: non-finite floats, code 3 (2-bit tiles: every byte of 1.6-bit
    tiles is a valid code), head rows not matching head.rowsum."""
    for name, v in views.items():
        if v.dtype == np.float32 and not (np.abs(v) <= 65504).all():
            return f"a non-finite or huge value in {name}"
        if name.endswith(".codes") and packing == "2bit" and (v & (v >> 1) & 0x55).any():
            return f"code 3 in {name}"
    tiles = views["head.i8"]
    sums = tiles.sum(axis=1, dtype=np.int32).reshape(tiles.shape[0], 16, 4).sum(axis=2).reshape(-1)
    return None if np.array_equal(sums, views["head.rowsum"]) else "head.rowsum not the sums of head.i8"


def fam_resealed_data(rng, seeds, case_dir):
    with open(seeds["engine"], "rb") as f:
        data = bytearray(f.read())
    meta = _seed_meta(seeds)
    raw = np.frombuffer(data, np.uint8)
    views = _views(meta, raw)
    kind = int(rng.integers(0, 6))
    must_refuse = True
    if kind == 0:
        name = _pick(rng, sorted(n for n, v in views.items() if v.dtype == np.float32))
        flat = views[name].reshape(-1)
        flat[int(rng.integers(0, flat.size))] = _pick(rng, [np.nan, np.inf, -np.inf, NAN_PAYLOAD])
    elif kind == 1:
        flat = views[_pick(rng, sorted(n for n in views if n.endswith(".codes")))].reshape(-1)
        flat[int(rng.integers(0, flat.size))] |= np.uint8(3 << (2 * int(rng.integers(0, 4))))
        must_refuse = meta.get("ternary_packing", "2bit") == "2bit"   # 1.6-bit tiles: any byte is 5 valid codes
    elif kind == 2:
        flat = views["head.rowsum"]
        flat[int(rng.integers(0, meta["config"]["vocab_size"]))] += int(_pick(rng, [1, -1, 127, 1 << 30]))
    elif kind == 3:
        flat = views["head.i8"].reshape(-1)   # one weight of the int8 head: its row's sum changes by one
        i = int(rng.integers(0, flat.size))
        flat[i] = flat[i] + 1 if flat[i] < 127 else flat[i] - 1
    elif kind == 4:   # NaN in the row of BOS: the open cannot see it (the embedding is only summed), the forward must
        views["embed"][meta["bos_id"]] = _pick(rng, [0x7FC0, 0x7F80, 0xFF80])
    else:             # bit flips anywhere in the data: accepted only when they leave the values sound
        start = meta["layout"]["data_start"]
        for _ in range(int(rng.integers(1, 9))):
            pos = int(rng.integers(start, len(data)))
            data[pos] ^= 1 << int(rng.integers(0, 8))
        must_refuse = _damaged_values(views, meta.get("ternary_packing", "2bit")) is not None
    path = reseal_data(case_dir, data, raw, meta)
    if path is None:
        return "skipped"
    logits = open_and_run(path)
    if must_refuse:
        _refused(f"re-sealed data edit {kind} "
                 f"({_damaged_values(views, meta.get('ternary_packing', '2bit')) or 'NaN in the BOS embedding row'})")
    if not np.isfinite(logits).all():
        raise SilentAcceptance("non-finite logits handed back")


# ---- nonfinite -------------------------------------------------------------------------------------------------
def fam_nonfinite(rng, seeds, case_dir):
    folder = copy_folder(seeds, case_dir)
    path = os.path.join(folder, "model.safetensors")
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = _pick(rng, sorted(k for k, e in header.items() if k != "__metadata__" and e["dtype"] == "BF16"))
    b, e = header[name]["data_offsets"]
    at = 8 + n + b + 2 * int(rng.integers(0, (e - b) // 2))
    old = int.from_bytes(data[at:at + 2], "little")
    bits = _pick(rng, [0x7FC0, 0x7F80, 0xFF80, 0xFFC1, 0x7FFF, old | 0x7F80])   # the last: the exponent flipped
    data[at:at + 2] = int(bits).to_bytes(2, "little")
    with open(path, "wb") as f:
        f.write(data)
    convert(folder, case_dir)
    _refused(f"a checkpoint with bf16 0x{bits:04X} in {name}")


# ---- tokenizer_lies --------------------------------------------------------------------------------------------
def _edit_json_file(path, edit):
    with open(path) as f:
        obj = json.load(f)
    edit(obj)
    with open(path, "w") as f:
        json.dump(obj, f)


def _rename_to_existing(rng, tok_path) -> bool:
    """A vocabulary key renamed to another key that exists: the file then holds that key twice (False: not found)."""
    with open(tok_path) as f:
        text = f.read()
    vocab = json.loads(text)["model"]["vocab"]
    keys = sorted(vocab)
    a = _pick(rng, keys)
    b = _pick(rng, [k for k in keys if k != a])
    n = 0
    for ascii_only in (False, True):   # the key as the file spells it: raw UTF-8 or \u escapes
        entry = re.compile(r"(?<=[{,])\s*" + re.escape(json.dumps(a, ensure_ascii=ascii_only)) + r"\s*:\s*" +
                           str(vocab[a]) + r"(?=\s*[,}])")
        text, n = entry.subn(lambda _: json.dumps(b) + ":" + str(vocab[a]), text, count=1)
        if n:
            break
    with open(tok_path, "w") as f:
        f.write(text)
    return n == 1


def fam_tokenizer_lies(rng, seeds, case_dir):
    folder = copy_folder(seeds, case_dir)
    tok_path = os.path.join(folder, "tokenizer.json")
    with open(tok_path) as f:
        tok = json.load(f)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    bos = "<|begin_of_text|>"
    V = seeds["config"]["vocab_size"]
    kind = int(rng.integers(0, 7))
    if kind == 0:    # the post-processor writes an id past the vocabulary, or another token's
        wrong = int(_pick(rng, [V, V + 76, 10 ** 6, ids["<|end_of_text|>"], 57]))
        _edit_json_file(tok_path, lambda t: t["post_processor"]["special_tokens"][bos].update(ids=[wrong]))
    elif kind == 1:
        if not _rename_to_existing(rng, tok_path):
            return "skipped"
    elif kind == 2:
        _edit_json_file(tok_path, lambda t: t["model"].update(vocab={}, merges=[]))
    elif kind == 3:  # an added token moved to another id
        content = _pick(rng, sorted(ids))
        _edit_json_file(tok_path, lambda t: [a.update(id=int(_pick(rng, [a["id"] + 1, 5, a["id"] - 3])))
                                             for a in t["added_tokens"] if a["content"] == content])
    elif kind == 4:  # a special token the config, the template or the post-processor names, removed
        content = _pick(rng, [bos, "<|end_of_text|>", "<|eot_id|>"])
        _edit_json_file(tok_path, lambda t: t.update(added_tokens=[a for a in t["added_tokens"]
                                                                   if a["content"] != content]))
    elif kind == 5:  # tokenizer_config names a token the tokenizer lacks
        key = _pick(rng, ["bos_token", "eos_token"])
        _edit_json_file(os.path.join(folder, "tokenizer_config.json"), lambda c: c.update({key: "<|nope|>"}))
    else:            # config.json's BOS is another token than tokenizer_config's
        _edit_json_file(os.path.join(folder, "config.json"),
                        lambda c: c.update(bos_token_id=int(_pick(rng, [ids["<|end_of_text|>"], 57, 0]))))
    convert(folder, case_dir)
    _refused(f"a tokenizer that lies (edit {kind})")


# ---- c_ints ----------------------------------------------------------------------------------------------------
def _seed_model(seeds):
    if "model" not in _CACHE:
        from bitnet_app.model import Model
        _CACHE["model"] = Model.open(seeds["engine"], threads=1)
    return _CACHE["model"]


def fam_c_ints(rng, seeds, case_dir):
    from bitnet_app.engine.runtime import Engine
    m = _seed_model(seeds)
    eng = m.engine
    v = int(_pick(rng, BIG + [C_INT_MAX]))
    kind = int(rng.integers(0, 8))
    ok = False
    if kind == 0:    # a whole-number knob
        name = _pick(rng, ["top_k", "block_size", "sub_block_size", "mask_id", "max_new_tokens"])
        kw = {name: v, "max_new_tokens": 4} if name != "max_new_tokens" else {name: v}
        if name in ("block_size", "sub_block_size", "mask_id"):
            kw["mode"] = "diffusion"
        ok = name == "top_k" and v == C_INT_MAX     # top_k past the vocabulary keeps every id
        if ok:
            kw["temperature"] = 0.7
        done = list(m.generate([1, 2, 3], **kw))[-1]
        if ok and len(done.ids) > 4:
            raise SilentAcceptance(f"{len(done.ids)} ids for max_new_tokens 4")
    elif kind == 1:  # a seed never reaches C: any size is a seed
        ok = v >= 0
        list(m.generate([1, 2, 3], seed=v, temperature=0.7, max_new_tokens=3))
    elif kind == 2:
        Engine(m.file, threads=_pick(rng, [v, 0, 257, 2.5, True]))
    elif kind == 3:
        Engine(m.file, threads=1, ctx=_pick(rng, [v, 0, 2.5]))
    elif kind == 4:
        arg = _pick(rng, ["tokens", "start", "kv_end", "block_size", "rows"])
        call = {"tokens": dict(tokens=[1, v]), "start": dict(tokens=[1], start=v),
                "kv_end": dict(tokens=[1], start=0, kv_end=v), "rows": dict(tokens=[1, 2], start=0, rows=[v]),
                "block_size": dict(tokens=[1, 2], start=0, attention="block", block_size=v)}[arg]
        ok = arg == "block_size" and v == C_INT_MAX    # one block over every position: a valid pattern
        eng.forward(call.pop("tokens"), **call)
    elif kind == 5:
        ok = v == C_INT_MAX
        eng.sample_rows(np.zeros((1, eng.vocab_size), np.float32), 0.7, v, 1.0, np.zeros(1))
    elif kind == 6:
        m.logits([1, v])
    else:
        list(m.generate([1, 2, 3], **{_pick(rng, ["foo", "topk", "max_tokens", "temp"]): 1}))
    if not ok:
        _refused(f"C-integer case {kind} with {v}")


VALUE_FAMILIES = {"resealed_meta": fam_resealed_meta, "resealed_data": fam_resealed_data, "nonfinite": fam_nonfinite,
                  "tokenizer_lies": fam_tokenizer_lies, "c_ints": fam_c_ints}
