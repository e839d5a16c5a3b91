"""Seeded fuzzing of everything a hostile checkpoint, cache file or caller controls (issue 12).

    python tests/fuzz.py                  # the CI size (FAMILIES x CI_CASES), counts printed as JSON
    python tests/fuzz.py --long           # 24,000 cases
    python tests/fuzz.py --cases 50 --family template --seed 3

Families (each case: a seeded mutation of one real input, then the product code that reads it):
    engine_bytes  bit flips, overwritten ranges, truncation, extension of a converted engine file -> Model.open
    engine_meta   structurally invalid edits of its metadata under a valid digest -> Model.open
    safetensors   header edits and byte flips of model.safetensors (and weight-byte flips) -> convert
    config        hostile values in config.json / generation_config.json / dlm_config.json, byte flips,
                  FIFOs, links to /dev/zero, huge and deeply nested files -> convert
    tokenizer     broken tokenizer.json (post-processor naming a missing token, bad model, byte flips) ->
                  convert, then load and chat with what was accepted
    template      generated Jinja templates (loops, big numbers, filters, recursion, garbage) -> chat ids
    knobs         hostile decode parameters and token ids -> Model.generate
and, for hostile values (issue 33; tests/fuzz_values.py):
    resealed_meta, resealed_data   engine files edited, then sealed again (digest and chunk sums recomputed)
    nonfinite     NaN and infinities in a checkpoint's float tensors -> convert
    tokenizer_lies  a tokenizer at odds with itself, the config or the template -> convert
    c_ints        integers past a C int for every knob and engine argument, unknown keywords
and, for values of the wrong type, out of range or zero (issue 47; tests/fuzz_types.py):
    config_types  a wrong type for a typed key of config.json, generation_config.json, dlm_config.json and
                  tokenizer_config.json ("false" for false, 0 for false, "0.7" for 0.7) -> convert
    dlm_decoder   diffusion block and sub-block sizes -> convert; what converts must decode in both modes
    knob_floats   extreme floats for the float knobs -> generate, numpy warnings as errors
    scale_signs   zero, negative and subnormal scales in real and padding rows, re-sealed -> Model.open

Each case runs in a forked child (batches of cases per child, two children at a time) under an address-
space limit (RLIMIT_AS) and a per-case alarm. A case FAILS on: a crash (the child dies of a signal), a
hang (the alarm), a MemoryError, an unclear exception (anything but a ValueError/OSError-family error
with a message), or a silent acceptance (structurally invalid input accepted: the oracle of each family
says what must be refused). The seed inputs are a small generated checkpoint and its engine file.
"""
import argparse
import json
import math
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"   # the Rust thread pool must not be live across fork()

import numpy as np  # noqa: E402

from fuzz_common import (HOSTILE_VALUES, SilentAcceptance, convert, copy_folder, flip_bytes,  # noqa: E402
                         load_converted, open_and_run, positive_finite, rewrite_meta, whole)
from fuzz_types import TYPE_FAMILIES  # noqa: E402
from fuzz_values import VALUE_FAMILIES  # noqa: E402

from bitnet_app.engine.validate import REAL_RANGES  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CI_CASES = 60                 # per family: 16 x 60 = 960 cases in CI
LONG_CASES = 1500             # per family: 16 x 1500 = 24,000 cases
CASE_SECONDS = 20             # alarm per case (templates stop themselves after 2 s)
MEMORY_LIMIT = 4 << 30        # RLIMIT_AS of each child
BATCH = 25                    # cases per child process


# ---- the seed inputs ----------------------------------------------------------------------------------------
def build_seeds(work: str) -> dict:
    """A small checkpoint (made by tests/checkpoints.py in a child: it needs torch) and its engine file."""
    folder = os.path.join(work, "seed-ckpt")
    if not os.path.isdir(folder):
        code = "import checkpoints; checkpoints.make_hf_checkpoint(%r, seed=11, mask_token=True)" % folder
        subprocess.run([sys.executable, "-c", code], check=True, cwd=HERE,  # -c imports from its folder: tests/
                       env=dict(os.environ, TORCHDYNAMO_DISABLE="1", PYTHONPATH=REPO))
    from bitnet_app.checkpoint.convert import convert_checkpoint
    engine = os.path.join(work, "seed.bitnet")
    convert_checkpoint(folder, engine)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    return {"folder": folder, "engine": engine, "fingerprint": _fingerprint(engine), "config": config}


def _fingerprint(engine_path: str):
    """What a conversion produced: the tensor table and the data sums (equal files, equal fingerprints)."""
    from bitnet_app.engine.file import EngineFile
    meta = EngineFile(engine_path).meta
    return json.dumps([meta["tensors"], meta["layout"]["chunk_sums"], meta["config"]], sort_keys=True)


# ---- families -----------------------------------------------------------------------------------------------
def fam_engine_bytes(rng, seeds, case_dir):
    from bitnet_app.engine.file import _HEADER
    with open(seeds["engine"], "rb") as f:
        orig = f.read()
    data = bytearray(orig)
    meta_len = int.from_bytes(orig[12:20], "little")
    meta_end = _HEADER.size + meta_len
    data_start = json.loads(orig[_HEADER.size:meta_end])["layout"]["data_start"]
    kind = int(rng.integers(0, 6))
    if kind == 0:
        flip_bytes(data, rng, 0, meta_end, int(rng.integers(1, 4)))            # header and metadata
    elif kind == 1:
        flip_bytes(data, rng, 0, len(data), int(rng.integers(1, 9)))           # anywhere
    elif kind == 2:
        a = int(rng.integers(0, len(data)))
        n = int(rng.integers(1, 4096))
        fill = [b"\0", b"\xff", None][int(rng.integers(0, 3))]
        data[a:a + n] = (fill * n)[:len(data[a:a + n])] if fill else bytes(rng.integers(0, 256, len(data[a:a + n]),
                                                                                         dtype=np.uint8))
    elif kind == 3:
        del data[int(rng.integers(0, len(data))):]
    elif kind == 4:
        data += bytes(rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8))
    else:
        n = int(rng.integers(1, len(data) // 2))
        data[len(data) - n:] = bytes(n)                                          # zero-filled tail
    path = os.path.join(case_dir, "m.bitnet")
    with open(path, "wb") as f:
        f.write(data)
    open_and_run(path)
    if len(data) != len(orig):
        raise SilentAcceptance(f"an engine file of another length ({len(data)} vs {len(orig)}) was accepted")
    changed = np.flatnonzero(np.frombuffer(bytes(data), np.uint8) != np.frombuffer(orig, np.uint8))
    outside_padding = changed[(changed < meta_end) | (changed >= data_start)]
    if outside_padding.size:
        raise SilentAcceptance(f"bytes changed at {outside_padding[:5].tolist()} and the file was accepted")


def _engine_meta_edit(rng, meta) -> bool:
    """One structurally invalid edit of the metadata (the product must refuse every one); False when an
    earlier edit removed what this one would edit."""
    try:
        return _one_meta_edit(rng, meta)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError):
        return False


def _one_meta_edit(rng, meta) -> bool:
    names = sorted(meta["tensors"])
    t = meta["tensors"][names[int(rng.integers(0, len(names)))]]
    other = meta["tensors"][names[int(rng.integers(0, len(names)))]]
    cfg_keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rope_theta",
                "rms_norm_eps"]
    edits = [
        lambda: t.update(offset=t["offset"] + int(rng.integers(1, 64))),
        lambda: t.update(offset=int(rng.integers(-10 ** 6, 10 ** 12)) // 64 * 64 + (1 if rng.random() < .5 else 0)),
        lambda: t.update(offset=int(rng.integers(0, meta["layout"]["data_start"])) // 64 * 64),
        lambda: t.update(offset=other["offset"]) if other is not t and other["nbytes"] and t["nbytes"] else
        t.update(nbytes=t["nbytes"] + 1),
        lambda: t.update(nbytes=t["nbytes"] + int(rng.choice([-1, 1, 64, 10 ** 9]))),
        lambda: t.update(shape=[d + 1 for d in t["shape"]]),
        lambda: t.update(shape=[HOSTILE_VALUES[int(rng.integers(0, len(HOSTILE_VALUES)))]] + t["shape"][1:]),
        lambda: t.update(dtype=str(rng.choice(["float64", "bfloat16", "int64", "x", ""]))),
        lambda: t.update(offset=str(t["offset"])),
        lambda: meta["tensors"].pop(names[int(rng.integers(0, len(names)))]),
        lambda: meta["config"].update({cfg_keys[int(rng.integers(0, len(cfg_keys)))]:
                                       [0, -1, True, "64", None, float("nan"), float("inf"), [], 0.0, -1e-5][
                                           int(rng.integers(0, 10))]}),
        lambda: meta["config"].update({cfg_keys[int(rng.integers(0, 8))]: 1.5}),
        lambda: meta["config"].pop(cfg_keys[int(rng.integers(0, len(cfg_keys)))]),
        lambda: meta.update(stop_ids=[[meta["config"]["vocab_size"]], ["1"], "x", [-1], [1.5], None][
            int(rng.integers(0, 6))] or 5),
        lambda: meta.update(bos_id=[-1, meta["config"]["vocab_size"], 1.5, "1", True][int(rng.integers(0, 5))]),
        lambda: meta.update(mask_id=[-1, meta["config"]["vocab_size"], 2.5, "3"][int(rng.integers(0, 4))]),
        lambda: meta.update(tokenizer_json=["{", "[]", 5, '{"model": 1}'][int(rng.integers(0, 4))]),
        lambda: meta.update(chat_template=[5, [], {"a": 1}][int(rng.integers(0, 3))]),
        lambda: meta.update(diffusion={"block_size": [0, -4, 2.5, "8", 10 ** 9][int(rng.integers(0, 5))]}),
        lambda: meta.update(diffusion={"attention": ["sideways", 1][int(rng.integers(0, 2))]}),
        lambda: meta["layout"].update(file_bytes=meta["layout"]["file_bytes"] + int(rng.choice([-64, 64, 1]))),
        lambda: meta["layout"].update(data_start=meta["layout"]["data_start"] + int(rng.choice([4096, -4096, 8]))),
        lambda: meta["layout"]["chunk_sums"].__setitem__(0, (meta["layout"]["chunk_sums"][0] + 1) % 2 ** 64),
        lambda: meta["layout"].update(chunk_sums=[]),
        lambda: meta.pop(str(rng.choice(["config", "tensors", "layout"]))),
        lambda: meta.update(tensors=[1, 2]),
        lambda: meta.update(config="x"),
    ]
    edits[int(rng.integers(0, len(edits)))]()
    return True


def fam_engine_meta(rng, seeds, case_dir):
    from bitnet_app.engine.file import EngineFile
    meta = json.loads(json.dumps(EngineFile(seeds["engine"]).meta))
    original = json.dumps(meta, sort_keys=True)
    for _ in range(int(rng.integers(1, 3))):
        if not _engine_meta_edit(rng, meta):
            return "skipped"
    if json.dumps(meta, sort_keys=True) == original:   # a second edit undid the first
        return "skipped"
    path = os.path.join(case_dir, "m.bitnet")
    if not rewrite_meta(seeds["engine"], path, meta):
        return "skipped"
    open_and_run(path)
    raise SilentAcceptance("an engine file with a structurally invalid metadata edit was accepted")


def _read_st_header(path):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = int.from_bytes(data[:8], "little")
    return data, n, json.loads(data[8:8 + n])


def fam_safetensors(rng, seeds, case_dir):
    folder = copy_folder(seeds, case_dir)
    path = os.path.join(folder, "model.safetensors")
    data, n, header = _read_st_header(path)
    kind = int(rng.integers(0, 4))
    weights_only = False
    if kind == 0:                                   # bytes of the header JSON
        flip_bytes(data, rng, 8, 8 + n, int(rng.integers(1, 4)))
    elif kind == 1:                                 # the header length field
        lengths = [0, n - 1, n + 1, 10 ** 12, 2 ** 64 - 1, len(data)]
        data[:8] = lengths[int(rng.integers(0, len(lengths)))].to_bytes(8, "little")
    elif kind == 2:                                 # a semantic header edit, same length or shorter
        names = sorted(k for k in header if k != "__metadata__")
        e = header[names[int(rng.integers(0, len(names)))]]
        b, end = e["data_offsets"]
        choice = int(rng.integers(0, 8))
        if choice == 0:
            e["data_offsets"] = [b + 8, end + 8]
        elif choice == 1:
            e["data_offsets"] = [max(0, b - 8), end - 8]
        elif choice == 2:
            e["shape"] = [d + 1 for d in e["shape"]] or [1]
        elif choice == 3:
            e["dtype"] = str(rng.choice(["F64", "I64", "BOOL", "F8", "U8", "BF16", "x"]))
        elif choice == 4:
            e["data_offsets"] = [str(b), end]
        elif choice == 5:
            del header[names[int(rng.integers(0, len(names)))]]
        elif choice == 6:
            e["shape"] = [HOSTILE_VALUES[int(rng.integers(0, len(HOSTILE_VALUES)))]]
        else:
            e["data_offsets"] = [0, end - b]
        blob = json.dumps(header, separators=(",", ":")).encode()
        if len(blob) > n:
            return "skipped"
        data[8:8 + n] = blob + b" " * (n - len(blob))
    else:                                           # weight bytes: data, no structure (may be accepted)
        flip_bytes(data, rng, 8 + n, len(data), int(rng.integers(1, 9)))
        weights_only = True
    if bytes(data) == open(path, "rb").read():
        return "skipped"
    with open(path, "wb") as f:
        f.write(data)
    out = convert(folder, case_dir)
    load_converted(out)
    if not weights_only and _fingerprint(out) != seeds["fingerprint"]:
        raise SilentAcceptance("a changed safetensors header was accepted and converted to different tensors")


def _config_ok(cfg: dict, orig: dict) -> bool:
    """The oracle: may a conversion accept this config.json? (sizes must match the weights; numbers sane)"""
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if cfg.get(k) != orig.get(k) or not whole(cfg.get(k)):
            return False
    H, D = orig["num_attention_heads"], orig["hidden_size"]
    for k, derived in (("num_key_value_heads", H), ("head_dim", D // H)):
        want = orig.get(k) or derived
        if cfg.get(k) is None:
            if derived != want:
                return False
        elif not whole(cfg[k]) or cfg[k] != want:
            return False
    if cfg.get("max_position_embeddings") is not None and not (whole(cfg["max_position_embeddings"]) and
                                                 0 < cfg["max_position_embeddings"] <= 1 << 20):
        return False
    for k in ("rope_theta", "rms_norm_eps"):       # a number in the range a real model could have
        low, high, _ = REAL_RANGES[k]
        if k in cfg and cfg[k] is not None and not (positive_finite(cfg[k]) and low <= cfg[k] <= high):
            return False
    if cfg.get("tie_word_embeddings") is not None and not isinstance(cfg["tie_word_embeddings"], bool):
        return False                                # "false" is no boolean (issue 47)
    archs, qc = cfg.get("architectures"), cfg.get("quantization_config")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        return False
    if qc is not None and not isinstance(qc, dict):
        return False
    V = cfg.get("vocab_size")
    eos = cfg.get("eos_token_id")
    for v in (eos if isinstance(eos, list) else [eos]):
        if v is not None and not (whole(v) and 0 <= v < V):
            return False
    bos = cfg.get("bos_token_id")
    return bos is None or (whole(bos) and 0 <= bos < V)


def fam_config(rng, seeds, case_dir):
    folder = copy_folder(seeds, case_dir)
    cfg_path = os.path.join(folder, "config.json")
    cfg = dict(seeds["config"])
    kind = int(rng.integers(0, 5))
    must_refuse = False
    if kind == 0:                                   # a hostile value for a key
        key = str(rng.choice(["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                              "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
                              "rope_theta", "rms_norm_eps", "bos_token_id", "eos_token_id", "rope_parameters",
                              "quantization_config", "tie_word_embeddings", "architectures"]))
        cfg[key] = HOSTILE_VALUES[int(rng.integers(0, len(HOSTILE_VALUES)))]
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        must_refuse = not _config_ok(cfg, seeds["config"])
    elif kind == 1:                                 # byte flips in a JSON file
        name = str(rng.choice(["config.json", "generation_config.json", "tokenizer_config.json"]))
        p = os.path.join(folder, name)
        data = bytearray(open(p, "rb").read())
        flip_bytes(data, rng, 0, len(data), int(rng.integers(1, 4)))
        with open(p, "wb") as f:
            f.write(data)
        if name == "config.json":
            try:
                must_refuse = not (isinstance(json.loads(bytes(data)), dict) and _config_ok(json.loads(bytes(data)),
                                                                                             seeds["config"]))
            except ValueError:
                must_refuse = True
    elif kind == 2:                                 # not a regular file, or far too big
        name = str(rng.choice(["config.json", "tokenizer.json", "generation_config.json", "tokenizer_config.json",
                               "model.safetensors", "chat_template.jinja"]))
        p = os.path.join(folder, name)
        if os.path.exists(p):
            os.remove(p)
        how = int(rng.integers(0, 4))
        if how == 0:
            os.mkfifo(p)
        elif how == 1:
            os.symlink("/dev/zero", p)
        elif how == 2:
            os.mkdir(p)
        else:
            with open(p, "wb") as f:
                f.truncate(200 << 20)                # sparse: 200 MB of zeros
        if name == "chat_template.jinja":            # read only without a template in tokenizer_config.json
            tc = json.load(open(os.path.join(folder, "tokenizer_config.json")))
            tc.pop("chat_template", None)
            json.dump(tc, open(os.path.join(folder, "tokenizer_config.json"), "w"))
        must_refuse = True
    elif kind == 3:                                 # deeply nested or huge JSON
        name = str(rng.choice(["config.json", "generation_config.json", "dlm_config.json"]))
        with open(os.path.join(folder, name), "w") as f:
            f.write("[" * int(rng.integers(1000, 200000)))
        must_refuse = True
    else:                                           # generation / DLM settings
        name = str(rng.choice(["generation_config.json", "dlm_config.json"]))
        key = str(rng.choice(["eos_token_id", "bos_token_id", "mask_token_id", "bd_size", "block_size",
                              "attention"]))
        value = HOSTILE_VALUES[int(rng.integers(0, len(HOSTILE_VALUES)))]
        with open(os.path.join(folder, name), "w") as f:
            json.dump({key: value}, f)
        V = seeds["config"]["vocab_size"]
        ok_id = value is None or (whole(value) and 0 <= value < V)
        block_ok = value is None or (whole(value) and 0 < value <= 256)   # 0 too is refused (issue 47)
        must_refuse = {"eos_token_id": name == "generation_config.json" and not (ok_id or value in ([1, 2], [])),
                       "bos_token_id": name == "generation_config.json" and (
                           not (value is None or (whole(value) and value >= 0)) or
                           (not ok_id and "bos_token_id" not in seeds["config"])),
                       "mask_token_id": name == "dlm_config.json" and not ok_id,
                       "bd_size": name == "dlm_config.json" and not block_ok,
                       "block_size": name == "dlm_config.json" and not block_ok,
                       "attention": name == "dlm_config.json" and value is not None}[key]
    out = convert(folder, case_dir)
    load_converted(out)
    if must_refuse:
        raise SilentAcceptance("a checkpoint the oracle calls invalid was converted and loaded")


def _tokenizer_edit(rng, tok: dict):
    choice = int(rng.integers(0, 9))
    if choice == 0 and tok.get("post_processor"):
        tok["post_processor"]["single"][0] = {"SpecialToken": {"id": "<|no such token|>", "type_id": 0}}
    elif choice == 1:
        tok["model"]["type"] = str(rng.choice(["BPE", "WordPiece", "Unigram", "Nope", ""]))
    elif choice == 2:
        vocab = tok["model"]["vocab"]
        for k in list(vocab)[:int(rng.integers(1, 50))]:
            vocab[k] = int(rng.choice([-1, 10 ** 9, 2 ** 40, vocab[k]]))
    elif choice == 3:
        tok["model"]["merges"] = [["zz", "qq"]] * 3 + tok["model"]["merges"][:5]
    elif choice == 4:
        tok["added_tokens"].append({"id": int(rng.choice([10 ** 6, -1, 0])), "content": "<x>", "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    elif choice == 5:
        tok["decoder"] = {"type": str(rng.choice(["Nope", "ByteLevel", "Metaspace"]))}
    elif choice == 6:
        tok["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(((("}, "behavior": "Isolated",
                                "invert": False}
    elif choice == 7:
        tok["normalizer"] = {"type": str(rng.choice(["NFC", "Nope", "Lowercase"]))}
    else:
        del tok["model"]["vocab"][next(iter(tok["model"]["vocab"]))]


def fam_tokenizer(rng, seeds, case_dir):
    folder = copy_folder(seeds, case_dir)
    p = os.path.join(folder, "tokenizer.json")
    if rng.random() < 0.3:
        data = bytearray(open(p, "rb").read())
        flip_bytes(data, rng, 0, len(data), int(rng.integers(1, 6)))
        open(p, "wb").write(data)
    else:
        tok = json.load(open(p))
        _tokenizer_edit(rng, tok)
        json.dump(tok, open(p, "w"))
    try:
        out = convert(folder, case_dir)
    except ValueError:
        return "rejected"
    try:  # accepted at conversion: it must then work at every load (never cached and failing later)
        open_and_run(out)
        from bitnet_app.model import Model
        m = Model.open(out, threads=1)
        m.decode(m.encode("Some text, 123 <|eot_id|> ok"))
        m.close()
    except ValueError as exc:
        raise SilentAcceptance(f"a tokenizer accepted at conversion fails at load: {exc}") from None


TEMPLATE_PARTS = [
    "{% for i in range(N) %}", "{% endfor %}", "{{ 'a' * N }}", "{{ N ** N }}", "{{ 'x' | center(N) }}",
    "{{ range(N) | join('y' * N) }}", "{% set ns = namespace(s='ab') %}", "{% set ns.s = ns.s ~ ns.s %}",
    "{{ ns.s | length }}", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{{ messages[0]['content'] }}",
    "{% if add_generation_prompt %}Assistant: {% endif %}", "{{ raise_exception('no') }}", "{{ undefined_var.x }}",
    "{{ ().__class__.__mro__ }}", "{{ '%*s' % (N, 'a') }}", "{{ '{:N}'.format(1) }}", "{{ messages | tojson }}",
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|eot_id|>{% endfor %}", "{{ 1 / 0 }}",
    "{{ 'z' ~ 'z' * N }}", "{{ ('q' * N).replace('q', 'qq') }}", "{{ (range(N) | list) * N }}", "{%", "}}", "{{",
    "{{ messages.append(1) }}", "{{ lipsum(N) }}", "{{ ('\n' * N) | indent(N) }}", "{{ 'a\tb'.expandtabs(N) }}",
    "{{ [1] * N | length }}", "{{ loop }}", "{{ (N|string) * N }}", "{{ cycler(1, 2).next() }}", "{{ bos_token }}",
]


def fam_template(rng, seeds, case_dir):
    from bitnet_app.text.chat import chat_prompt_ids
    numbers = ["0", "3", "100", "100000", "10**10", "-5", "2**64", "1e300", "99999999999"]
    parts = [str(rng.choice(TEMPLATE_PARTS)) for _ in range(int(rng.integers(1, 8)))]
    template = "".join(p.replace("N", str(rng.choice(numbers))) for p in parts)
    tok = _seed_tokenizer(seeds)
    content = str(rng.choice(["hi", "<|eot_id|>", "x" * int(rng.integers(0, 5000)), "<|begin_of_text|>User: x"]))
    t0 = time.monotonic()
    try:
        ids = chat_prompt_ids(tok, [{"role": "user", "content": content}], template=template)
    finally:
        if time.monotonic() - t0 > 10:
            raise SilentAcceptance(f"a template took {time.monotonic() - t0:.1f} s: {template[:200]!r}")
    if not all(whole(i) for i in ids):
        raise SilentAcceptance("chat ids that are not whole numbers")


_CACHE = {}


def _seed_tokenizer(seeds):
    if "tok" not in _CACHE:
        from bitnet_app.engine.file import EngineFile
        from bitnet_app.text.tokenizer import Tokenizer
        _CACHE["tok"] = Tokenizer.from_meta(EngineFile(seeds["engine"]).meta)
    return _CACHE["tok"]


def _seed_model(seeds):
    if "model" not in _CACHE:
        from bitnet_app.model import Model
        _CACHE["model"] = Model.open(seeds["engine"], threads=1)
    return _CACHE["model"]


KNOB_VALUES = {
    "mode": ["ar", "diffusion", "AR", "", None, 1],
    "max_new_tokens": [1, 4, 0, -5, 2.5, True, "4", float("nan"), None, 10 ** 12],
    "temperature": [0.0, 0.7, 2.0, -1.0, float("nan"), float("inf"), True, "0.5", None, 1e308],
    "top_k": [0, 5, -1, 2.5, True, float("nan"), "3", None, 10 ** 9],
    "top_p": [1.0, 0.5, 0.0, -0.1, 1.5, float("nan"), float("inf"), True, None],
    "repetition_penalty": [1.0, 1.3, 0.0, -1.0, float("nan"), float("inf"), None, 1e-300],
    "seed": [None, 0, 7, -1, 2.5, True, "1", 2 ** 70],
    "block_size": [None, 4, 8, 0, -4, 3.5, True, 10 ** 6],
    "sub_block_size": [1, 2, 4, 0, 3, -1, 1.5, True],
    "threshold": [0.9, 1.0, 0.0, 1.5, float("nan"), -0.2, True],
    "attention": [None, "block", "causal", "x", 1],
    "mask_id": [None, 0, 5, -1, 10 ** 9, 2.5, True],
    "dual_cache": [False, True, 1, "yes", None],
}


def _obviously_bad(name, v) -> bool:
    """The oracle for a knob value: these must always be refused (a range check may refuse more)."""
    from bitnet_app.params import KNOBS
    if v is None:  # "the default"
        return False
    if name in ("mode", "attention"):
        return not isinstance(v, str) or v not in (("ar", "diffusion") if name == "mode" else ("block", "causal"))
    if name == "dual_cache":
        return not isinstance(v, bool)
    if isinstance(v, (bool, str)):
        return True
    if isinstance(v, float) and (not math.isfinite(v) or (name in ("max_new_tokens", "top_k", "seed", "block_size",
                                                                     "sub_block_size", "mask_id") and v != int(v))):
        return True
    limit = KNOBS[name].metadata["limit"]            # past what the C code (or any context) takes
    return v < 0 or (limit is not None and v > limit)


def fam_knobs(rng, seeds, case_dir):
    from bitnet_app.params import KNOBS
    m = _seed_model(seeds)
    kw = {}
    for name in rng.permutation(sorted(KNOB_VALUES))[:int(rng.integers(1, 5))]:
        values = KNOB_VALUES[str(name)]
        kw[str(name)] = values[int(rng.integers(0, len(values)))]
    kw.setdefault("max_new_tokens", 4)
    if whole(kw["max_new_tokens"]) and kw["max_new_tokens"] > 64:
        kw["max_new_tokens"] = 64 if rng.random() < 0.5 else kw["max_new_tokens"]
    ids = [[1, 2, 3], [], [-1], [m.vocab_size], [1.5], [True], ["3"], list(range(300)), [1] * 5][
        int(rng.integers(0, 9))]
    bad = [n for n, v in kw.items() if _obviously_bad(n, v)]
    bad_ids = not ids or any(not whole(i) or not 0 <= i < m.vocab_size for i in ids) or \
        len(ids) >= m.context_length
    done = None
    for ev in m.generate(ids, **kw):
        done = ev
    if bad or bad_ids:
        raise SilentAcceptance(f"decode values {bad or ids[:3]} were accepted")
    limit = kw["max_new_tokens"] if kw["max_new_tokens"] is not None else KNOBS["max_new_tokens"].default
    if not all(0 <= i < m.vocab_size for i in done.ids) or len(done.ids) > limit:
        raise SilentAcceptance(f"a reply of {len(done.ids)} ids for max_new_tokens {limit}")


FAMILIES = {"engine_bytes": fam_engine_bytes, "engine_meta": fam_engine_meta, "safetensors": fam_safetensors,
            "config": fam_config, "tokenizer": fam_tokenizer, "template": fam_template, "knobs": fam_knobs,
            **VALUE_FAMILIES, **TYPE_FAMILIES}


# ---- running cases in children ----------------------------------------------------------------------------
def run_case(family: str, index: int, seed: int, seeds: dict, work: str) -> tuple[str, str]:
    """(outcome, detail): outcome accepted | rejected | skipped | unclear | silent | memory."""
    rng = np.random.default_rng([seed, list(FAMILIES).index(family), index])
    case_dir = tempfile.mkdtemp(dir=work, prefix=f"{family}-{index}-")
    try:
        result = FAMILIES[family](rng, seeds, case_dir)
        return (result or "accepted"), ""
    except SilentAcceptance as exc:
        return "silent", str(exc)[:300]
    except MemoryError as exc:
        return "memory", repr(exc)[:300]
    except (ValueError, OSError) as exc:
        if str(exc).strip():
            return "rejected", f"{type(exc).__name__}: {str(exc)[:200]}"
        return "unclear", f"{type(exc).__name__} without a message"
    except BaseException as exc:  # noqa: BLE001 - the point: anything else is a finding
        return "unclear", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        shutil.rmtree(case_dir, ignore_errors=True)


def _child(cases, seed, seeds, work, wfd):
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    out = os.fdopen(wfd, "w", buffering=1)
    for family, index in cases:
        out.write(json.dumps(["start", family, index]) + "\n")
        signal.alarm(CASE_SECONDS)     # the default action kills the child: the parent calls it a hang
        outcome, detail = run_case(family, index, seed, seeds, work)
        signal.alarm(0)
        out.write(json.dumps(["done", family, index, outcome, detail]) + "\n")
    out.close()
    os._exit(0)


def _death(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return "hang" if sig in (signal.SIGALRM, signal.SIGKILL) else f"crash (signal {signal.Signals(sig).name})"
    return f"crash (exit {os.WEXITSTATUS(status)})"


def run(cases: list[tuple[str, int]], seed: int, seeds: dict, work: str, workers: int = 2, progress=None) -> dict:
    """Run every case in forked children; returns {"counts": {...}, "failures": [...], "by_family": {...}}."""
    pending = [cases[i:i + BATCH] for i in range(0, len(cases), BATCH)]
    running = {}  # fd -> [pid, batch, started case, buffer, last activity]
    results = {}
    while pending or running:
        while pending and len(running) < workers:
            batch = pending.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    _child(batch, seed, seeds, work, w)
                finally:
                    os._exit(3)
            os.close(w)
            running[r] = [pid, batch, None, b"", time.monotonic()]
        ready, _, _ = select.select(list(running), [], [], 1.0)
        now = time.monotonic()
        for fd in list(running):
            pid, batch, started, buf, last = running[fd]
            chunk = b""
            if fd in ready:
                chunk = os.read(fd, 65536)
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if msg[0] == "start":
                        started = (msg[1], msg[2])
                    else:
                        results[(msg[1], msg[2])] = (msg[3], msg[4])
                        started = None
                        if progress:
                            progress(len(results), len(cases))
                running[fd][2:5] = [started, buf, now]
            if fd in ready and not chunk:  # the child closed its pipe: finished or died
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                del running[fd]
                if started is not None:
                    results[started] = (_death(status), "the child died during this case")
                    rest = batch[batch.index(tuple(started)) + 1:]
                    if rest:
                        pending.insert(0, rest)
            elif now - last > CASE_SECONDS + 30:  # stuck without even the alarm firing
                os.kill(pid, signal.SIGKILL)
    counts, by_family, failures = {}, {}, []
    for (family, index), (outcome, detail) in sorted(results.items()):
        counts[outcome] = counts.get(outcome, 0) + 1
        by_family.setdefault(family, {}).setdefault(outcome, 0)
        by_family[family][outcome] += 1
        if outcome not in ("accepted", "rejected", "skipped"):
            failures.append({"family": family, "case": index, "outcome": outcome, "detail": detail})
    missing = [c for c in cases if tuple(c) not in results]
    for family, index in missing:
        failures.append({"family": family, "case": index, "outcome": "lost", "detail": "no result"})
    return {"cases": len(cases), "counts": counts, "by_family": by_family, "failures": failures}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tests/fuzz.py", description=__doc__.split("\n")[0])
    ap.add_argument("--long", action="store_true", help=f"{LONG_CASES} cases per family")
    ap.add_argument("--cases", type=int, help=f"cases per family (default {CI_CASES})")
    ap.add_argument("--family", action="append", choices=list(FAMILIES), help="only these families")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", help="folder for the seed inputs and the cases (default: a temporary one)")
    args = ap.parse_args(argv)
    per = args.cases or (LONG_CASES if args.long else CI_CASES)
    families = args.family or list(FAMILIES)
    work = args.work or tempfile.mkdtemp(prefix="bitnet-fuzz-")
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    seeds = build_seeds(work)
    cases = [(f, i) for i in range(per) for f in families]
    last = [0.0]

    def progress(done, total):
        if time.monotonic() - last[0] > 30:
            last[0] = time.monotonic()
            print(f"fuzz: {done}/{total} cases, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)

    report = run(cases, args.seed, seeds, work, workers=args.workers, progress=progress)
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["seed"] = args.seed
    print(json.dumps(report, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
