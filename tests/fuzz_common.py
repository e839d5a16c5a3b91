"""What the fuzz families share (tests/fuzz.py, fuzz_values.py, fuzz_types.py): the oracle's exception, copies of
the seed inputs, the product calls a case ends with (a re-sealed engine file among them), and the hostile values."""
import json
import math
import os
import shutil


class SilentAcceptance(AssertionError):
    """The product accepted input the family's oracle calls structurally invalid."""


# ---- helpers -------------------------------------------------------------------------------------------------
def copy_folder(seeds, case_dir):
    dst = os.path.join(case_dir, "ck")
    shutil.copytree(seeds["folder"], dst)
    return dst


def flip_bytes(data: bytearray, rng, lo: int, hi: int, k: int) -> None:
    for _ in range(k):
        pos = int(rng.integers(lo, max(lo + 1, hi)))
        data[pos] ^= 1 << int(rng.integers(0, 8))


def convert(folder, case_dir):
    from bitnet_app.checkpoint.convert import convert_checkpoint
    return convert_checkpoint(folder, os.path.join(case_dir, "out.bitnet"))


def load_converted(out):
    """A file the converter wrote must load: a failure here means it was cached to fail at every start."""
    try:
        open_and_run(out)
    except ValueError as exc:
        raise SilentAcceptance(f"converted, then refused at load: {exc}") from None


def open_and_run(path):
    """Open, chat-encode and run a forward. A chat template that parses but fails when run (an undefined
    name...) is refused at chat time with a ChatTemplateError: a clear error, and the file still works for
    raw prompts, so it counts as a rejection of the template, not of the file."""
    from bitnet_app.model import Model
    from bitnet_app.text.chat import ChatTemplateError
    m = Model.open(path, threads=1)
    try:
        ids = m.chat_ids([{"role": "user", "content": "Hello <|eot_id|> there"}])
    except ChatTemplateError:
        ids = m.encode("Hello there")
    out = m.logits(ids[:8])
    m.close()
    return out


HOSTILE_VALUES = [0, -1, 1.5, True, False, "64", None, float("nan"), float("inf"), -float("inf"), 10 ** 30, [],
                  {}, [1, 2], 2 ** 31, -2 ** 63, 1e308, "", "nan"]


def whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def positive_finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def rewrite_meta(src, dst, meta) -> bool:
    """Write src with its metadata replaced by `meta` under a valid digest (False: it does not fit)."""
    from bitnet_app.engine import file as ef
    with open(src, "rb") as f:
        data = bytearray(f.read())
    meta_len = int.from_bytes(data[12:20], "little")
    start = json.loads(data[ef._HEADER.size:ef._HEADER.size + meta_len])["layout"]["data_start"]
    blob = json.dumps(meta).encode()
    room = start - ef._HEADER.size
    if len(blob) > room:
        return False
    blob += b" " * (room - len(blob))
    prefix = ef._PREFIX.pack(ef.MAGIC, ef.FORMAT_VERSION, len(blob))
    data[:start] = ef._HEADER.pack(ef.MAGIC, ef.FORMAT_VERSION, len(blob), ef._digest(prefix, blob)) + blob
    with open(dst, "wb") as f:
        f.write(data)
    return True


def reseal_data(case_dir, data, raw, meta):
    """The engine file `data` (its tensor bytes `raw` edited in place) with its chunk sums and digest made valid
    again, written into case_dir: its path, or None when the metadata no longer fits."""
    from bitnet_app.engine import file as ef
    step, end = meta["layout"]["chunk_bytes"], meta["layout"]["file_bytes"]
    meta["layout"]["chunk_sums"] = [int(ef._words(raw[b:min(end, b + step)]).sum(dtype="uint64"))
                                    for b in range(meta["layout"]["data_start"], end, step)]
    src = os.path.join(case_dir, "edited.bitnet")
    with open(src, "wb") as f:
        f.write(data)
    path = os.path.join(case_dir, "m.bitnet")
    return path if rewrite_meta(src, path, meta) else None
