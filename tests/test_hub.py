"""bitnet_app.checkpoint.download against the loopback fake Hub: real huggingface_hub code over real HTTP."""
import hashlib
import json
import os
import socket

import pytest

from bitnet_app.checkpoint import download as hub
from bitnet_app.checkpoint.config import NotBitNet, not_bitnet_reason, read_model_config
from fake_hub import FakeHub
from support import write_hub_repo


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def repo(tmp_path):
    return write_hub_repo(str(tmp_path / "src"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return str(tmp_path / "hf-cache")


@pytest.fixture
def served(repo, monkeypatch):
    def start(**options):
        fake = FakeHub({"org/bitnet-tiny": repo}, **options).start()
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        started.append(fake)
        return fake
    started = []
    yield start
    for fake in started:
        fake.stop()


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_download_only_needed_files_with_byte_progress(served, repo, cache):
    fake = served()
    seen = []
    folder = hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache, progress=seen.append)
    assert sorted(os.listdir(folder)) == ["config.json", "generation_config.json", "model.safetensors",
                                          "tokenizer.json"]
    for name in os.listdir(folder):
        assert _sha(os.path.join(folder, name)) == _sha(os.path.join(repo, name))
    fetched = {path.rsplit("/", 1)[1] for method, path, _ in fake.requests if method == "GET" and "/resolve/" in path}
    assert fetched == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    total = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    assert seen[-1].done == seen[-1].total == total and seen[-1].files_done == 4 and seen[-1].file == ""
    assert [p.done for p in seen] == sorted(p.done for p in seen)  # bytes only go up
    assert any(0 < p.done < total and p.file == "model.safetensors" for p in seen)  # mid-file byte updates
    assert "config.json" == seen[0].file  # the architecture is checked before the weights are fetched


def test_second_call_is_served_from_cache(served, cache):
    fake = served()
    first = hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    fake.requests.clear()
    seen = []
    assert hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache, progress=seen.append) == first
    assert not [r for r in fake.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert seen[-1].done == seen[-1].total


def test_dropped_connection_resumes_with_range(served, repo, cache):
    fake = served(drop_after={"model.safetensors": 15 << 20})
    folder = hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    gets = [r for r in fake.requests if r[0] == "GET" and r[1].endswith("/model.safetensors")]
    assert len(gets) == 2 and gets[0][2] is None
    resumed_at = int(gets[1][2].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 15 << 20 and resumed_at % hub.PROGRESS_CHUNK == 0  # after the last full chunk
    assert _sha(os.path.join(folder, "model.safetensors")) == _sha(os.path.join(repo, "model.safetensors"))
    assert not [n for n in os.listdir(os.path.join(cache, "models--org--bitnet-tiny", "blobs"))
                if n.endswith(".incomplete")]


def test_download_resumes_on_a_later_call_after_the_network_stayed_down(served, repo, cache):
    fake = served(drop_after={"model.safetensors": 15 << 20}, down_after_drop=True)
    with pytest.raises(hub.HubError) as err:
        hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    assert err.value.kind == "network"
    blobs = os.path.join(cache, "models--org--bitnet-tiny", "blobs")
    partial = [n for n in os.listdir(blobs) if n.endswith(".incomplete")]
    assert len(partial) == 1 and 0 < os.path.getsize(os.path.join(blobs, partial[0])) <= 15 << 20
    kept = os.path.getsize(os.path.join(blobs, partial[0]))
    fake.up()
    fake.requests.clear()
    seen = []
    folder = hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache, progress=seen.append)
    gets = [r for r in fake.requests if r[0] == "GET" and r[1].endswith("/model.safetensors")]
    assert gets == [("GET", gets[0][1], f"bytes={kept}-")]  # only the missing bytes were fetched
    assert _sha(os.path.join(folder, "model.safetensors")) == _sha(os.path.join(repo, "model.safetensors"))
    assert seen[-1].done == seen[-1].total
    assert not [n for n in os.listdir(blobs) if n.endswith(".incomplete")]


def test_offline_mode_uses_the_cache_only(served, cache, monkeypatch):
    fake = served()
    folder = hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    fake.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache) == folder
    with pytest.raises(hub.HubError) as err:
        hub.download_checkpoint("org/never-downloaded", cache_dir=cache)
    assert err.value.kind == "offline" and "bundled demo model" in str(err.value)
    assert "model picker" not in str(err.value)  # the API has none (the page words its own advice)


def test_no_network(cache, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(hub.HubError) as err:
        hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    assert err.value.kind == "network"
    assert "no network" in str(err.value) and "bundled demo model" in str(err.value) and "retry" in str(err.value)


def test_no_network_falls_back_to_a_complete_cached_copy(served, cache, monkeypatch):
    served()
    folder = hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache) == folder


def test_repo_not_found(served, cache):
    served(missing={"org/bitnet-tiny"})
    with pytest.raises(hub.HubError) as err:
        hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    assert err.value.kind == "not_found" and "org/bitnet-tiny" in str(err.value)


@pytest.mark.parametrize("status", [401, 403])
def test_gated_repo_asks_for_a_token(served, cache, status):
    served(gated={"org/bitnet-tiny"}, gated_status=status)
    with pytest.raises(hub.HubError) as err:
        hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    assert err.value.kind == "gated" and "token" in str(err.value)


def test_not_a_bitnet_checkpoint_stops_before_the_weights(tmp_path, cache, monkeypatch):
    llama = write_hub_repo(str(tmp_path / "llama"), model_type="llama", weights=1 << 20)
    with FakeHub({"org/llama": llama}) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        with pytest.raises(hub.HubError) as err:
            hub.download_checkpoint("org/llama", cache_dir=cache)
    assert err.value.kind == "not_bitnet" and "LlamaForCausalLM" in str(err.value)
    assert not [r for r in fake.requests if r[1].endswith(".safetensors")]


def test_disk_space_is_checked_up_front(served, cache):
    fake = served(fake_sizes={"model.safetensors": 1 << 60})  # an exabyte: no disk has that free
    with pytest.raises(hub.HubError) as err:
        hub.download_checkpoint("org/bitnet-tiny", cache_dir=cache)
    assert err.value.kind == "disk_full" and "disk space" in str(err.value)
    assert not [r for r in fake.requests if r[1].endswith(".safetensors")]


def test_bad_repo_id_is_explained(cache):
    with pytest.raises(hub.HubError) as err:
        hub.download_checkpoint("not a repo", cache_dir=cache)
    assert err.value.kind == "not_found" and "owner/name" in str(err.value)


def test_one_bitnet_rule_for_the_download_and_the_converter(tmp_path):
    """The Hub check refuses exactly what the converter refuses, before any weights are fetched: a Llama
    with BitNet quantization (Falcon3, Llama3-8B-1.58) and 1bitLLM's BitnetForCausalLM are accepted by both;
    a full-precision Llama and another architecture are refused by both."""
    cases = {"bitnet": ({"architectures": ["BitNetForCausalLM"], "model_type": "bitnet"}, True),
             "arch-only": ({"architectures": ["BitNetForCausalLM"]}, True),
             "llama-bitnet-quant": ({"model_type": "llama", "quantization_config": {"quant_method": "bitnet"}}, True),
             "1bitllm": ({"architectures": ["BitnetForCausalLM"], "model_type": "llama"}, True),
             "llama-full-precision": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, False),
             "qwen-bitnet-quant": ({"model_type": "qwen2", "quantization_config": {"quant_method": "bitnet"}}, False),
             "mistral": ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, False)}
    for name, (config, ok) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        assert (not_bitnet_reason(config, str(folder)) is None) == ok, name
        if ok:
            hub.check_folder_config(str(folder), str(folder))
            continue
        with pytest.raises(hub.HubError) as err:
            hub.check_folder_config(str(folder), str(folder))
        assert err.value.kind == "not_bitnet"
        with pytest.raises(NotBitNet) as conv_err:
            read_model_config(str(folder))
        assert str(conv_err.value) == str(err.value)  # the same words from both
