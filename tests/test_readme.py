"""The README as a newcomer reads it: what to have before the first command comes before the commands, it says how
long the build takes, and its command-line synopsis matches the parser (issue 46)."""
import os
import re

from bitnet_app.__main__ import build_parser

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def test_before_the_first_command_comes_before_the_commands():
    text = _readme()
    start = text.index("## Start")
    assert start < text.index("### Before the first command") < text.index("```bash", start)
    assert "`pip install -e .` compiles" in text and "about 2 minutes" in text


def test_the_command_line_synopsis_matches_the_parser():
    text = _readme()
    synopsis = text[text.index("## Command line"):]
    synopsis = synopsis[:synopsis.index("```", synopsis.index("```") + 3)]
    sub = build_parser()._subparsers._group_actions[0].choices
    kv = next(a for a in sub["generate"]._actions if "--kv" in a.option_strings)
    shown = re.search(r"\[--kv ([\w|]+)\]", synopsis)
    assert shown and set(shown.group(1).split("|")) == set(kv.choices), synopsis
    out = next(a for a in sub["convert"]._actions if "--out" in a.option_strings)
    assert not out.required and re.search(r"convert SRC \[--out [^\]]+\]", synopsis)  # optional, and shown so
