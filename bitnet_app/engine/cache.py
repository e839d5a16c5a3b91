"""Where converted engine files live, and the name a checkpoint folder converts to.

cache_dir(): $BITNET_APP_CACHE, else ~/.cache/bitnet_app. A checkpoint folder converts to
cache_dir()/converted/<key>.bitnet, where <key> hashes the folder's config.json bytes and the name,
size and mtime of each weight, tokenizer and config file, plus the engine file format version: a
changed or re-downloaded checkpoint, or a new format, gets a new file; an unchanged one is reused.
"""
import hashlib
import os

from .file import FORMAT_VERSION

CACHE_ENV = "BITNET_APP_CACHE"
_KEYED_SUFFIXES = (".safetensors", ".json", ".jinja")


def cache_dir() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get(CACHE_ENV) or "~/.cache/bitnet_app"))


def checkpoint_key(folder: str) -> str:
    h = hashlib.sha256(f"engine-format-{FORMAT_VERSION}\n".encode())
    with open(os.path.join(folder, "config.json"), "rb") as f:
        h.update(f.read())
    for name in sorted(os.listdir(folder)):
        if name.endswith(_KEYED_SUFFIXES):
            st = os.stat(os.path.join(folder, name))  # follows the Hub cache's symlinks to the blobs
            h.update(f"\n{name}\t{st.st_size}\t{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def converted_path(folder: str) -> str:
    return os.path.join(cache_dir(), "converted", checkpoint_key(folder) + ".bitnet")
