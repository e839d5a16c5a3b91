"""The command line refuses bad flags at once, in the words typed (issue 46's smaller items): `bench --repeats 0`,
`--threads 0` before a synthetic model file is written, `--keep` without `--synthetic`, and a diffusion setting that
does not fit the checkpoint's named by its flag."""
import os
import time

import pytest

from bitnet_app.__main__ import main


def _refused(argv, capsys) -> str:
    """Run the CLI; it must stop with exit status 2 within a few seconds. Returns what it printed on stderr."""
    t = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        raise SystemExit(main(argv))
    assert stop.value.code == 2
    assert time.monotonic() - t < 10, "refused only after doing work"
    return capsys.readouterr().err


def test_bench_repeats_zero_is_refused_at_once(capsys):
    err = _refused(["bench", "--model", "demo", "--repeats", "0"], capsys)
    assert "--repeats" in err and "0 is out of range: use 1 or more" in err


def test_bench_threads_zero_is_refused_before_the_synthetic_file_is_written(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("BITNET_APP_CACHE", str(tmp_path))
    err = _refused(["bench", "--synthetic", "2b4t", "--threads", "0"], capsys)
    assert "--threads" in err and "error: threads:" not in err and "use 1 to" in err
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs], "a file was written before the refusal"


def test_keep_and_packing_go_with_synthetic(capsys):
    from bitnet_app.engine.packing import PACKINGS
    for flag in (["--keep"], ["--packing", PACKINGS[0]]):
        err = _refused(["bench", "--model", "demo", *flag], capsys)
        assert f"{flag[0]} goes with --synthetic" in err


def test_generate_names_the_flags_typed(capsys):
    err = _refused(["generate", "--model", "demo", "--prompt", "hi", "--threads", "0"], capsys)
    assert "argument --threads" in err and "error: threads:" not in err
    err = _refused(["generate", "--model", "demo", "--prompt", "hi", "--mode", "diffusion", "--sub-block-size", "3",
                    "--max-new-tokens", "2"], capsys)
    assert "--sub-block-size (3) must divide --block-size" in err and "sub_block_size" not in err
