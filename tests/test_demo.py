"""The bundled demo model: where it is looked for, `--model demo` on the command line, and the CLI's fallback
to it when a Hub repo cannot be downloaded for want of a network (a small test checkpoint stands in for
assets/demo-model through $BITNET_DEMO_MODEL)."""
import os
import socket
import subprocess
import sys

import pytest

from bitnet_app import demo
from checkpoints import make_hf_checkpoint
from fake_hub import FakeHub

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "Hello! How are you today?"


def _checkpoint_folder(path) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write("{}")
    return str(path)


def test_demo_model_dir_looks_in_order_env_package_then_current_folder(monkeypatch, tmp_path):
    package = tmp_path / "pkg" / "assets" / "demo-model"
    cwd = tmp_path / "checkout"
    monkeypatch.setattr(demo, "PACKAGE_DEMO", str(package))
    monkeypatch.chdir(_checkpoint_folder(tmp_path / "plain-dir"))  # a folder without assets/
    monkeypatch.delenv(demo.ENV, raising=False)
    assert demo.demo_model_dir() is None

    os.makedirs(cwd / "assets" / "demo-model")  # a folder without config.json does not count
    monkeypatch.chdir(cwd)
    assert demo.demo_model_dir() is None
    in_cwd = _checkpoint_folder(cwd / "assets" / "demo-model")
    assert demo.demo_model_dir() == in_cwd  # after `pip install .`, run from the checkout

    beside = _checkpoint_folder(package)
    assert demo.demo_model_dir() == beside  # the package's own checkout comes first

    chosen = _checkpoint_folder(tmp_path / "chosen")
    monkeypatch.setenv(demo.ENV, chosen)
    assert demo.demo_model_dir() == chosen  # the environment variable comes first
    monkeypatch.setenv(demo.ENV, str(tmp_path / "missing"))
    assert demo.demo_model_dir() is None  # ... and a wrong one means no demo, never silently another
    assert "BITNET_DEMO_MODEL" in demo.missing_message()


@pytest.fixture(scope="module")
def demo_ckpt(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("demo") / "demo-model")
    make_hf_checkpoint(folder, mask_token=True, seed=4, max_position_embeddings=128,
                       dlm_config={"mask_token_id": None, "bd_size": 32})
    return folder


def _cli(*args, tmp_path, **env_extra):
    env = dict(os.environ, PYTHONPATH=ROOT, BITNET_THREADS="1", BITNET_APP_CACHE=str(tmp_path / "engines"),
               HF_HUB_CACHE=str(tmp_path / "hf"), **env_extra)
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-m", "bitnet_app", *args], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=240)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_model_demo_and_the_fallback_when_the_hub_is_out_of_reach(demo_ckpt, tmp_path):
    gen = ("generate", "--prompt", PROMPT, "--max-new-tokens", "8", "--threads", "1")
    direct = _cli(*gen, "--model", demo_ckpt, tmp_path=tmp_path)
    assert direct.returncode == 0, direct.stderr
    by_name = _cli(*gen, "--model", "demo", tmp_path=tmp_path, BITNET_DEMO_MODEL=demo_ckpt)
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == direct.stdout and by_name.stdout.strip()
    assert "notice" not in by_name.stderr

    unreachable = f"http://127.0.0.1:{_closed_port()}"
    fell_back = _cli(*gen, "--model", "microsoft/bitnet-b1.58-2B-4T", tmp_path=tmp_path,
                     BITNET_DEMO_MODEL=demo_ckpt, HF_ENDPOINT=unreachable)
    assert fell_back.returncode == 0, fell_back.stderr
    notices = [line for line in fell_back.stderr.splitlines() if line.startswith("notice: ")]
    assert len(notices) == 1, fell_back.stderr
    assert "microsoft/bitnet-b1.58-2B-4T" in notices[0] and "bundled demo model" in notices[0]
    assert fell_back.stdout == direct.stdout

    no_demo = _cli(*gen, "--model", "microsoft/bitnet-b1.58-2B-4T", tmp_path=tmp_path,
                   BITNET_DEMO_MODEL=str(tmp_path / "none"), HF_ENDPOINT=unreachable)
    assert no_demo.returncode == 2 and no_demo.stderr.startswith("error: Cannot reach the Hugging Face Hub")
    assert len(no_demo.stderr.strip().splitlines()) == 1 and not no_demo.stdout


def test_cli_other_hub_errors_do_not_fall_back_and_convert_demo(demo_ckpt, tmp_path):
    with FakeHub({}, missing={"org/missing"}) as hub:
        r = _cli("generate", "--model", "org/missing", "--prompt", PROMPT, tmp_path=tmp_path,
                 BITNET_DEMO_MODEL=demo_ckpt, HF_ENDPOINT=hub.url)
    assert r.returncode == 2 and "was not found" in r.stderr and "notice" not in r.stderr
    out = str(tmp_path / "demo.bitnet")
    r = _cli("convert", "demo", "--out", out, tmp_path=tmp_path, BITNET_DEMO_MODEL=demo_ckpt)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == out and os.path.getsize(out) > 0
    r = _cli("convert", "demo", "--out", out, tmp_path=tmp_path, BITNET_DEMO_MODEL=str(tmp_path / "none"))
    assert r.returncode == 2 and "BITNET_DEMO_MODEL" in r.stderr
