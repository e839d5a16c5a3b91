"""The King James Bible as a training corpus for the demo model, from Debian's ``bible-kjv`` packages.

Source: Debian bookworm's ``bible-kjv-text`` 4.38 (the text, in the compressed ``bible.data`` format of
Chip Chapin's Bible Retrieval System) and ``bible-kjv`` 4.38 (the ``bible`` program that reads it),
downloaded from deb.debian.org and checked by sha256. The KJV text (1611) is in the public domain (the
packages' copyright file: "The copyright for the King James Version text of the Bible is expired").

Text layout, one book per work: a chapter is a heading line ("Genesis 1") followed by one verse per line
(the verse numbers are dropped); chapters are separated by a blank line. A few whole books are held out
for validation (never seen by the tokenizer trainer or the model).
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import urllib.request

POOL = "https://deb.debian.org/debian/pool/main/b/bible-kjv/"
DEBS = {  # file -> sha256
    "bible-kjv-text_4.38_all.deb": "d61b6aad4c51ba9e2800b825325fa6a09e99a0d02a9bb6dc4724fcc4995a1b7a",
    "bible-kjv_4.38_amd64.deb": "75a49c032a6efa9faa2beb4a9acb70974380122906329d0e100de36cc88ff02d",
}
VAL_BOOKS = ("Ruth", "Esther", "Jonah", "Mark", "James")
ALL_VERSES = "gen1:1-rev22:21"


def fetch(work: str) -> str:
    """Download both packages into `work` (unless present), check their sha256, unpack them with dpkg-deb
    -> the folder they were unpacked into."""
    os.makedirs(work, exist_ok=True)
    root = os.path.join(work, "bible-kjv")
    for name, sha in DEBS.items():
        path = os.path.join(work, name)
        if not os.path.exists(path):
            urllib.request.urlretrieve(POOL + name, path + ".part")
            os.replace(path + ".part", path)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        if digest != sha:
            raise SystemExit(f"{path}: sha256 {digest} != expected {sha}")
        subprocess.check_call(["dpkg-deb", "-x", path, root])
    return root


def read_bible(root: str) -> str:
    """The whole text as the ``bible`` program prints it (no line wrapping): "Genesis 1", then "  1 In ..."."""
    exe, data = os.path.join(root, "usr/bin/bible"), os.path.join(root, "usr/lib")
    return subprocess.run([exe, "-l1000000", "-p", data, ALL_VERSES], check=True, capture_output=True,
                          text=True).stdout


def split_books(raw: str) -> dict[str, str]:
    """-> {book: text} in canonical order; chapters "Book N\\nverse\\nverse...\\n", joined by a blank line."""
    books: dict[str, list[str]] = {}
    chapter: list[str] | None = None
    for line in raw.splitlines():
        if not line.strip():
            continue
        verse = re.match(r"\s+\d+ (.*)$", line)
        if verse:
            chapter.append(verse.group(1).strip())
            continue
        book = re.match(r"(.+) \d+$", line.strip())
        assert book, f"unexpected line {line!r}"
        chapter = [line.strip()]
        books.setdefault(book.group(1), []).append(chapter)
    return {b: "\n\n".join("\n".join(ch) for ch in chapters) + "\n" for b, chapters in books.items()}


def load_works(root: str) -> tuple[dict[str, str], dict[str, str]]:
    """-> (train, val): {book: text}, canonical order (deterministic)."""
    books = split_books(read_bible(root))
    train = {b: t for b, t in books.items() if b not in VAL_BOOKS}
    val = {b: t for b, t in books.items() if b in VAL_BOOKS}
    assert len(books) == 66 and len(val) == len(VAL_BOOKS), (len(books), len(val))
    return train, val
