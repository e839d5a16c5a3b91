"""Download a BitNet checkpoint from the Hugging Face Hub, with byte-level progress and clear errors.

    folder = download_checkpoint("microsoft/bitnet-b1.58-2B-4T", progress=print)

Steps: list the repo's files (HfApi.model_info with file sizes) -> fetch config.json and check that
it is a BitNet checkpoint -> check free disk space against the bytes still to fetch -> one
`hf_hub_download` per needed file, pinned to the listed commit, with a tqdm class that only counts
bytes. The callback receives a `DownloadProgress` of plain numbers (no Streamlit here: the callback may
run on a worker thread). Files land in the standard Hugging Face cache, so a finished file is never
fetched twice; a connection that drops mid-file is resumed with an HTTP Range request by
huggingface_hub. With HF_HUB_OFFLINE=1 only the local cache is used.

Every failure is a `HubError` with `.kind` (offline, network, not_found, gated, not_bitnet, disk_full,
incomplete) and a message that says what happened and what to do.
"""
import collections
import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Callable

import tqdm as _tqdm

DEFAULT_REPO = "microsoft/bitnet-b1.58-2B-4T"

# Only what conversion and the model layer read; README, images, pytorch bins etc. are skipped.
NEEDED_FILES = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "dlm_config.json",
    "model.safetensors.index.json",
}
PROGRESS_CHUNK = 1 << 20  # huggingface_hub reads 10 MB per chunk: too coarse for a live byte counter
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_OFFLINE_HINT = ("Choose \"Demo model (bundled, offline)\" in the model picker, point it at a checkpoint folder "
                 "on this computer, or connect to the internet and retry.")


# Kinds that mean "the Hub cannot be reached from here" (rather than a problem with the repository): the
# app and the CLI fall back to the bundled demo model on these.
UNREACHABLE = frozenset({"offline", "network"})


class HubError(RuntimeError):
    """A download problem explained for people: `.kind` is a short code, str(self) the full message."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class DownloadProgress:
    done: int            # bytes of needed files present so far (including files already cached)
    total: int           # bytes of all needed files
    speed: float         # bytes per second over the last few seconds (0 while unknown)
    eta: float | None    # seconds left at that speed, None while unknown
    file: str            # file being fetched ("" once finished)
    files_done: int
    files_total: int

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0


def is_repo_id(text: str) -> bool:
    """'org/name' (not an existing local path)."""
    return bool(_REPO_ID_RE.match(text or "")) and not os.path.exists(text)


def is_needed(filename: str) -> bool:
    return "/" not in filename and (filename in NEEDED_FILES or filename.endswith(".safetensors"))


def offline_mode() -> bool:
    """HF_HUB_OFFLINE read now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"} or constants.is_offline_mode()


def hub_endpoint() -> str:
    """HF_ENDPOINT read now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hf_cache_dir(cache_dir: str | None = None) -> str:
    if cache_dir:
        return os.path.expanduser(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants
    return constants.HF_HUB_CACHE


def check_bitnet_config(config: dict, where: str) -> None:
    """Raise HubError(not_bitnet) unless config.json describes a BitNet b1.58 model."""
    archs = [str(a) for a in config.get("architectures") or []]
    model_type = str(config.get("model_type", ""))
    quant = config.get("quantization_config") or {}
    if model_type.lower() == "bitnet" or any("bitnet" in a.lower() for a in archs) \
            or str(quant.get("quant_method", "")).lower() == "bitnet":
        return
    what = ", ".join(archs) or model_type or "an unknown architecture"
    raise HubError("not_bitnet", f"{where} is not a BitNet b1.58 checkpoint (its config.json says {what}). "
                                 "This app only runs 1.58-bit BitNet models, such as microsoft/bitnet-b1.58-2B-4T.")


def free_bytes(path: str) -> int:
    """Free space of the file system that holds `path` (or its nearest existing parent)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return shutil.disk_usage(path).free


def ensure_free_space(path: str, needed: int, what: str) -> None:
    free = free_bytes(path)
    if free < needed:
        raise HubError("disk_full", f"Not enough disk space for {what}: it needs {format_bytes(needed)} but only "
                                    f"{format_bytes(free)} is free at {path}. Free some space (or set HF_HUB_CACHE "
                                    "to a bigger disk) and try again.")


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class _ByteCounter:
    """Thread-safe running totals; turns byte counts into DownloadProgress callbacks."""

    def __init__(self, total: int, files_total: int, callback: Callable | None):
        self.total, self.files_total, self.callback = total, files_total, callback
        self.done, self.files_done, self.file = 0, 0, ""
        self._window = collections.deque()  # (time, bytes moved by this process)
        self._moved = 0
        self._lock = threading.Lock()

    def mark(self) -> None:
        """A reference point for the speed (start of a file), so the first chunk counts too."""
        with self._lock:
            self._window.append((time.monotonic(), self._moved))

    def add(self, n: int, *, moved: bool = True) -> None:
        with self._lock:
            self.done += n
            if moved:
                self._moved += n
                now = time.monotonic()
                self._window.append((now, self._moved))
                while len(self._window) > 2 and now - self._window[0][0] > 5.0:
                    self._window.popleft()
        self.report()

    def snapshot(self) -> DownloadProgress:
        with self._lock:
            now = time.monotonic()
            while len(self._window) > 1 and now - self._window[0][0] > 5.0:
                self._window.popleft()  # a stalled download shows its speed falling to 0
            speed = 0.0
            if len(self._window) >= 2:
                t0, b0 = self._window[0]
                speed = (self._window[-1][1] - b0) / (now - t0) if now - t0 >= 0.2 else 0.0
            left = max(0, self.total - self.done)
            eta = left / speed if speed > 0 else (0.0 if left == 0 else None)
            return DownloadProgress(self.done, self.total, speed, eta, self.file, self.files_done, self.files_total)

    def report(self) -> None:
        if self.callback is not None:
            self.callback(self.snapshot())


def _tqdm_class(counter: _ByteCounter):
    """A silent tqdm that forwards every byte update to `counter` (huggingface_hub calls update(n))."""

    class ByteTqdm(_tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            kwargs.pop("name", None)
            initial = int(kwargs.get("initial") or 0)
            super().__init__(*args, **kwargs)
            if initial:  # bytes already on disk from an earlier attempt
                counter.add(initial, moved=False)

        def update(self, n=1):
            counter.add(int(n or 0))
            return super().update(n)

    return ByteTqdm


def _translate(exc: Exception, repo_id: str) -> HubError:
    """Map huggingface_hub / httpx errors onto HubError with advice."""
    from huggingface_hub import errors

    if isinstance(exc, HubError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, errors.GatedRepoError):
        return HubError("gated", f"{repo_id} is a gated repository: you must accept its terms on huggingface.co and "
                                 "log in with a token (`hf auth login`, or set HF_TOKEN), then retry.")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError("not_found", f"The repository {repo_id} was not found on the Hub. Check the spelling "
                                     "(owner/name). If it is private, log in with a token (`hf auth login`, or set "
                                     "HF_TOKEN) that can read it.")
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError("not_found", f"{repo_id} has no such revision (branch, tag or commit). Check the revision.")
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return HubError("offline", f"Offline mode is on (HF_HUB_OFFLINE) and {repo_id} is not in the local cache. "
                        + _OFFLINE_HINT)
    if isinstance(exc, errors.LocalEntryNotFoundError) or name in {"ConnectError", "ConnectTimeout", "ReadTimeout",
                                                                  "TimeoutException", "RemoteProtocolError",
                                                                  "NetworkError", "ProxyError", "ReadError"}:
        return HubError("network", f"Cannot reach the Hugging Face Hub ({hub_endpoint()}) to get {repo_id}: "
                                   f"no network connection, or the Hub is down. {_OFFLINE_HINT}")
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return HubError("gated", f"Access to {repo_id} was refused (HTTP {status}). Log in with a token that can "
                                     "read it (`hf auth login`, or set HF_TOKEN) and retry.")
        return HubError("network", f"The Hub answered with an error for {repo_id} (HTTP {status}). Retry later. "
                        + _OFFLINE_HINT)
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return HubError("disk_full", f"The disk filled up while downloading {repo_id}. Free some space and retry; "
                                     "the files already downloaded are kept.")
    return HubError("network", f"Downloading {repo_id} failed: {exc}. Retry; finished files are kept.")


def cached_checkpoint(repo_id: str, *, revision: str | None = None, cache_dir: str | None = None) -> str | None:
    """The folder of a complete cached snapshot of `repo_id`, or None. Makes no network request."""
    from huggingface_hub import try_to_load_from_cache

    cfg = try_to_load_from_cache(repo_id, "config.json", cache_dir=hf_cache_dir(cache_dir), revision=revision)
    if not isinstance(cfg, str):
        return None
    folder = os.path.dirname(cfg)
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                shards = set(json.load(f).get("weight_map", {}).values())
        except (OSError, ValueError):
            return None
        return folder if shards and all(os.path.exists(os.path.join(folder, s)) for s in shards) else None
    has_weights = any(n.endswith(".safetensors") for n in os.listdir(folder))
    return folder if has_weights and os.path.exists(os.path.join(folder, "tokenizer.json")) else None


def _list_files(repo_id: str, revision: str | None, token) -> tuple[str, dict[str, int], dict[str, str]]:
    """(commit sha, {needed file: size}, {needed file: etag}) from the Hub's model_info."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=hub_endpoint(), token=token).model_info(repo_id, revision=revision, files_metadata=True)
    sizes, etags = {}, {}
    for s in info.siblings or []:
        if is_needed(s.rfilename):
            sizes[s.rfilename] = int(s.size or (s.lfs.size if s.lfs else 0) or 0)
            etags[s.rfilename] = s.lfs.sha256 if s.lfs else (s.blob_id or "")
    if "config.json" not in sizes:
        raise HubError("not_bitnet", f"{repo_id} has no config.json, so it is not a model checkpoint this app "
                                     "can run. Pick a BitNet b1.58 repository such as microsoft/bitnet-b1.58-2B-4T.")
    if not any(n.endswith(".safetensors") for n in sizes):
        raise HubError("not_bitnet", f"{repo_id} has no .safetensors weights (only safetensors checkpoints are "
                                     "supported; pickled .bin files are never loaded).")
    return info.sha or revision or "main", sizes, etags


def download_checkpoint(repo_id: str, *, revision: str | None = None, cache_dir: str | None = None,
                        progress: Callable[[DownloadProgress], None] | None = None, token=None) -> str:
    """Fetch the files a BitNet checkpoint needs; returns the local snapshot folder."""
    from huggingface_hub import constants, hf_hub_download

    # http_get reads constants.DOWNLOAD_CHUNK_SIZE on every call: smaller chunks give a smooth byte
    # counter and a finer resume point after a dropped connection.
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, PROGRESS_CHUNK)
    if not is_repo_id(repo_id):
        raise HubError("not_found", f"{repo_id!r} is neither a Hub repository id (owner/name) nor an existing "
                                    "folder on this computer.")
    cache = hf_cache_dir(cache_dir)
    if offline_mode():
        folder = cached_checkpoint(repo_id, revision=revision, cache_dir=cache)
        if folder is None:
            raise HubError("offline", f"Offline mode is on (HF_HUB_OFFLINE) and {repo_id} is not (completely) in "
                                      f"the local cache {cache}. " + _OFFLINE_HINT)
        check_folder_config(folder, repo_id)
        return folder
    try:
        commit, sizes, etags = _list_files(repo_id, revision, token)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a HubError
        err = _translate(exc, repo_id)
        if err.kind == "network":  # no network: a complete cached copy still works
            folder = cached_checkpoint(repo_id, revision=revision, cache_dir=cache)
            if folder is not None:
                return folder
        raise err from exc

    order = ["config.json"] + sorted((n for n in sizes if n != "config.json"), key=lambda n: (sizes[n], n))
    counter = _ByteCounter(sum(sizes.values()), len(order), progress)
    tqdm_class = _tqdm_class(counter)
    storage = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    folder = None
    try:
        for i, name in enumerate(order):
            if i == 1:  # config.json is in: refuse other architectures before fetching gigabytes
                check_folder_config(folder, repo_id)
                missing = sum(sizes[n] for n in order[1:]
                              if not os.path.exists(os.path.join(storage, "blobs", etags[n])))
                ensure_free_space(cache, missing + (64 << 20), f"downloading {repo_id}")
            counter.file = name
            counter.mark()
            counter.report()
            before = counter.done
            _fetch_resumable(repo_id, name, commit, storage, token, tqdm_class)
            path = hf_hub_download(repo_id, name, revision=commit, cache_dir=cache, token=token,
                                   endpoint=hub_endpoint(), tqdm_class=tqdm_class)
            folder = os.path.dirname(path)
            counter.add(sizes[name] - (counter.done - before), moved=False)  # cached files count as done
            counter.files_done += 1
    except Exception as exc:  # noqa: BLE001
        raise _translate(exc, repo_id) from exc
    _remember_ref(storage, revision or "main", commit)
    counter.file = ""
    counter.report()
    return folder


def _fetch_resumable(repo_id: str, name: str, commit: str, storage: str, token, tqdm_class) -> None:
    """Download a plain-HTTP file into blobs/<etag> through a partial file that outlives failures."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers
    from huggingface_hub.utils._runtime import is_xet_available

    url = hf_hub_url(repo_id, name, revision=commit, endpoint=hub_endpoint())
    meta = get_hf_file_metadata(url, token=token, endpoint=hub_endpoint())
    if meta.etag is None or (meta.xet_file_data is not None and is_xet_available()):
        return  # Xet storage has its own transfer protocol: hf_hub_download handles it
    blob = os.path.join(storage, "blobs", meta.etag)
    if os.path.exists(blob):
        return
    part = blob + ".incomplete"
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    have = os.path.getsize(part) if os.path.exists(part) else 0
    if meta.size is not None and have > meta.size:
        have = 0
    with open(part, "r+b" if have else "wb") as f:
        f.seek(have)
        f.truncate()
        http_get(meta.location, f, resume_size=have, headers=build_hf_headers(token=token),
                 expected_size=meta.size, tqdm_class=tqdm_class)
    if have and re.fullmatch(r"[0-9a-f]{64}", meta.etag) and _sha256(part) != meta.etag:
        os.remove(part)  # the stitched file is not the published one: start over next time
        raise HubError("network", f"{name} of {repo_id} was damaged while resuming the download. "
                                  "It was deleted; retry to download it again.")
    os.replace(part, blob)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _remember_ref(storage: str, revision: str, commit: str) -> None:
    """refs/<revision> -> commit, as huggingface_hub does, so the cache is found offline by branch name."""
    if revision == commit:
        return
    ref = os.path.join(storage, "refs", revision)
    try:
        os.makedirs(os.path.dirname(ref), exist_ok=True)
        with open(ref + ".tmp", "w") as f:
            f.write(commit)
        os.replace(ref + ".tmp", ref)
    except OSError:
        pass  # only an optimisation for offline starts


def check_folder_config(folder: str, where: str) -> None:
    try:
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise HubError("not_bitnet", f"{where}: config.json cannot be read ({exc}).") from exc
    check_bitnet_config(config, where)
