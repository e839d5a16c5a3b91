"""The command line in words a user typed: every flag has help, an empty prompt is refused, a reply that cannot be as
long as asked says so, and a bad value is named by its flag (issue 32)."""
import os
import subprocess
import sys

import pytest

from bitnet_app.__main__ import build_parser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, BITNET_THREADS="1", BITNET_APP_CACHE=str(tmp_path / "cache"),
               HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "bitnet_app", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


@pytest.mark.parametrize("command", ["generate", "bench", "convert"])
def test_every_flag_has_help(command):
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    bare = [a.option_strings or [a.dest] for a in sub._actions if not a.help and a.dest != "help"]
    assert not bare, f"{command}: no help for {bare}"


def test_an_empty_prompt_is_refused(tmp_path):
    r = _cli("generate", "--model", "demo", "--prompt", "  ", tmp_path=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: --prompt is empty") and len(r.stderr.strip().splitlines()) == 1


def test_more_new_tokens_than_the_context_holds_is_said(tmp_path):
    r = _cli("generate", "--model", "demo", "--prompt", "Count from 1 to 5.", "--max-new-tokens", "100000",
             "--temperature", "0", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    notice = [line for line in r.stderr.splitlines() if line.startswith("notice: --max-new-tokens 100000")]
    assert notice and "the reply stops after at most" in notice[0]


def test_messages_name_the_flags_not_the_fields():
    from bitnet_app.__main__ import in_flag_words

    assert in_flag_words("max_new_tokens must be an integer >= 1, not 0") == \
        "--max-new-tokens must be an integer >= 1, not 0"
    assert in_flag_words("seed must be an integer >= 0 or None, not -1") == "--seed must be an integer >= 0, not -1"
    assert in_flag_words("sub_block_size (8) must divide block_size (12); try 8 with 32") == \
        "--sub-block-size (8) must divide --block-size (12); try 8 with 32"
    plain = "the exact rule needs causal attention: choose causal attention, or the threshold rule."
    assert in_flag_words(plain) == plain  # one-word knob names inside a sentence are plain words
