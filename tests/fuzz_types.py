"""Fuzz families for values of the wrong type, out of range or zero (issue 47), run by tests/fuzz.py:

    config_types    a value of the wrong type for a key a checkpoint's files hold ("false" for a boolean, 0 for
                    false, "0.7" for a number, 2.5 for a whole number, a list, an object), or the right one ->
                    convert; every wrong type must be refused
    dlm_decoder     dlm_config.json block and sub-block sizes (0, negative, past the context, not dividing) ->
                    convert; what converts must decode in both modes with its defaults
    knob_floats     extreme floats for the temperature, the repetition penalty, top_p and the threshold -> generate,
                    with every numpy warning turned into an error; what is out of range must be refused
    scale_signs     zero, negative and subnormal per-row scales and head.scale values, in real and padding rows, of
                    a re-sealed engine file -> open and a forward; a real row's scale must be positive, a padding
                    row's 0
"""
import json
import math
import os
import warnings

import numpy as np

from fuzz_common import SilentAcceptance, convert, copy_folder, open_and_run, reseal_data

_CACHE = {}


def _pick(rng, values):
    return values[int(rng.integers(0, len(values)))]


def _write_json(folder, name, changes):
    path = os.path.join(folder, name)
    obj = json.load(open(path)) if os.path.exists(path) else {}
    obj.update(changes)
    with open(path, "w") as f:
        json.dump(obj, f)


# ---- config_types ----------------------------------------------------------------------------------------------
# file -> key -> (a good value, its kind); the seed checkpoint's own ids where an id is meant
TYPED = {
    "config.json": {"tie_word_embeddings": (True, "flag"), "attention_bias": (False, "flag"),
                    "mlp_bias": (False, "flag"), "rope_theta": (10000.0, "number"), "rms_norm_eps": (1e-5, "number"),
                    "max_position_embeddings": (256, "whole"), "hidden_act": ("relu2", "text")},
    "generation_config.json": {"do_sample": (True, "flag"), "temperature": (0.7, "number"), "top_p": (0.9, "number"),
                               "top_k": (50, "whole"), "repetition_penalty": (1.1, "number")},
    "dlm_config.json": {"bd_size": (8, "whole"), "block_size": (16, "whole"), "threshold": (0.9, "number"),
                        "sub_block_size": (4, "whole")},
    "tokenizer_config.json": {"bos_token": ("<|begin_of_text|>", "token"), "add_bos_token": (False, "flag")},
}


def _wrong_types(good, kind) -> list:
    """Values of another type than `kind` that a lax reader would coerce into something."""
    common = [[good], {"value": good}, json.dumps(good) if not isinstance(good, str) else 5]
    if kind == "flag":
        return common + [str(good).lower(), str(not good).lower(), int(good), int(not good), "", 1.0]
    if kind == "whole":
        return common + [str(good), good + 0.5, True, float("nan")]
    if kind == "number":
        return common + [str(good), True, False]
    if kind == "text":
        return common + [1, True]
    return [5, True, ["<|begin_of_text|>"], {"content": 5}]   # token


def fam_config_types(rng, seeds, case_dir):
    folder = copy_folder(seeds, case_dir)
    name = _pick(rng, sorted(TYPED))
    key = _pick(rng, sorted(TYPED[name]))
    good, kind = TYPED[name][key]
    wrong = _wrong_types(good, kind)
    right = rng.random() < 0.2
    value = good if right else wrong[int(rng.integers(0, len(wrong)))]
    _write_json(folder, name, {key: value})
    out = convert(folder, case_dir)
    if not right:
        raise SilentAcceptance(f"{name} with {key} = {value!r} (not {kind}) was converted")
    open_and_run(out)


# ---- dlm_decoder -----------------------------------------------------------------------------------------------
def fam_dlm_decoder(rng, seeds, case_dir):
    from bitnet_app.model import Model
    folder = copy_folder(seeds, case_dir)
    ctx = seeds["config"]["max_position_embeddings"]
    key = _pick(rng, ["bd_size", "block_size", "config bd_size"])
    block = int(_pick(rng, [0, -1, -32, ctx + 1, 10 ** 6, 1, 2, 3, 4, 5, 7, 12, 32, ctx]))
    sub = _pick(rng, [None, None, 0, -2, 1, 2, 3, 4, 5, 8, 16, 64])
    if key == "config bd_size":
        _write_json(folder, "config.json", {"bd_size": block})
        dlm = {} if sub is None else {"sub_block_size": sub}
    else:
        dlm = {key: block, **({} if sub is None else {"sub_block_size": sub})}
    if dlm or key != "config bd_size":
        _write_json(folder, "dlm_config.json", dlm)
    out = convert(folder, case_dir)
    if not 0 < block <= ctx or (sub is not None and not (0 < sub and block % sub == 0)):
        raise SilentAcceptance(f"block size {block} ({key}) with sub-block {sub} was converted (context {ctx})")
    m = Model.open(out, threads=1)
    try:
        for mode in ("ar", "diffusion"):   # the defaults of what converted must run
            done = list(m.generate([1, 2, 3], mode=mode, max_new_tokens=4))[-1]
            if not 0 < len(done.ids) <= 4:
                raise SilentAcceptance(f"{mode}: {len(done.ids)} ids for max_new_tokens 4")
    except ValueError as exc:
        raise SilentAcceptance(f"converted with block {block}, sub {sub}, then {mode} failed: {exc}") from None
    finally:
        m.close()


# ---- knob_floats -----------------------------------------------------------------------------------------------
EXTREME = [0.0, -0.0, 5e-324, 1e-300, 1e-44, 1e-38, 1e-8, 0.005, 0.5, 1.0, 2.0, 100.0, 100.5, 1e6, 1e38, 1e300,
           3.4e38, -1e-300, float("nan"), float("inf")]


def _in_range(name, v) -> bool:
    """The oracle: the ranges params.py documents (0 is greedy for the temperature)."""
    from bitnet_app import params
    if not math.isfinite(v):
        return False
    if name == "temperature":
        return v == 0 or params.TEMPERATURE_MIN <= v <= params.TEMPERATURE_MAX
    if name == "repetition_penalty":
        return params.REPETITION_PENALTY_MIN <= v <= params.REPETITION_PENALTY_MAX
    return 0 < v <= 1   # top_p, threshold


def fam_knob_floats(rng, seeds, case_dir):
    if "model" not in _CACHE:
        from bitnet_app.model import Model
        _CACHE["model"] = Model.open(seeds["engine"], threads=1)
    m = _CACHE["model"]
    kw = {"max_new_tokens": 4, "mode": _pick(rng, ["ar", "ar", "diffusion"])}
    names = ["temperature", "repetition_penalty", "top_p"] + (["threshold"] if kw["mode"] == "diffusion" else [])
    for name in rng.permutation(names)[:int(rng.integers(1, 3))]:
        kw[str(name)] = float(_pick(rng, EXTREME))
    if "temperature" not in kw and rng.random() < 0.5:
        kw["temperature"] = 0.7
    out_of_range = [n for n, v in kw.items() if isinstance(v, float) and not _in_range(n, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a numpy RuntimeWarning is a finding: it would reach the user's stderr
        with np.errstate(over="raise", divide="raise", invalid="raise"):   # what numpy warns of by default
            done = list(m.generate([1, 2, 3, 4, 5, 1, 2], **kw))[-1]
    if out_of_range:
        raise SilentAcceptance(f"decode values {out_of_range} = {[kw[n] for n in out_of_range]} were accepted")
    if not all(0 <= i < m.vocab_size for i in done.ids) or len(done.ids) > 4:
        raise SilentAcceptance(f"a reply {done.ids[:6]} for {kw}")


# ---- scale_signs -----------------------------------------------------------------------------------------------
def fam_scale_signs(rng, seeds, case_dir):
    from bitnet_app.engine import file as ef
    from bitnet_app.engine.values import scale_rows
    with open(seeds["engine"], "rb") as f:
        data = bytearray(f.read())
    meta = json.loads(json.dumps(ef.EngineFile(seeds["engine"]).meta))
    raw = np.frombuffer(data, np.uint8)
    names = sorted(n for n in meta["tensors"] if scale_rows(n, meta["config"]) is not None)
    name = _pick(rng, names)
    e = meta["tensors"][name]
    view = raw[e["offset"]:e["offset"] + e["nbytes"]].view(np.float32)
    rows = scale_rows(name, meta["config"])
    padding = view.size > rows and rng.random() < 0.25
    i = int(rng.integers(rows, view.size)) if padding else int(rng.integers(0, rows))
    if not padding and rng.random() < 0.3:
        i = slice(None, rows)   # every real row
    value = np.float32(_pick(rng, [0.0, -0.0, -1.0, -1e-30, -65504.0, 1e-45, 0.5, 2.0]))
    view[i] = -view[i] if value == -1.0 else value
    ok = bool(np.all(view[:rows] > 0) and np.all(view[rows:] == 0))
    path = reseal_data(case_dir, data, raw, meta)
    if path is None:
        return "skipped"
    logits = open_and_run(path)
    if not ok:
        raise SilentAcceptance(f"{name}[{i}] = {value} ({'padding' if padding else 'real'} row) was accepted")
    if not np.isfinite(logits).all():
        raise SilentAcceptance("non-finite logits handed back")


TYPE_FAMILIES = {"config_types": fam_config_types, "dlm_decoder": fam_dlm_decoder, "knob_floats": fam_knob_floats,
                 "scale_signs": fam_scale_signs}
