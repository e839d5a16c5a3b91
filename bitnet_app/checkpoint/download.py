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
import hashlib
import json
import os
import re
from typing import Callable

from .config import not_bitnet_reason
from .disk import DiskFull, ensure_free_space
from .files import JSON_LIMIT, read_text
from .progress import ByteCounter, DownloadProgress, tqdm_class

DEFAULT_REPO = "microsoft/bitnet-b1.58-2B-4T"

# Only what conversion and the model layer read; README, images, pytorch bins etc. are skipped.
NEEDED_FILES = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "dlm_config.json",
    "model.safetensors.index.json",
}
PROGRESS_CHUNK = 1 << 20  # huggingface_hub reads 10 MB per chunk: too coarse for a live byte counter
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What the server says becomes a file name in the cache (blobs/<etag>, snapshots/<commit>): the Hub sends
# hex digests (git sha1, LFS sha256); anything with a dot, slash or other character could leave the folder.
_SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
OFFLINE_HINT = ("Use the bundled demo model (`demo`) or a checkpoint folder on this computer instead, "
                 "or connect to the internet and retry.")


# Kinds that mean "the Hub cannot be reached from here" (rather than a problem with the repository): the
# app and the CLI fall back to the bundled demo model on these.
UNREACHABLE = frozenset({"offline", "network"})


class HubError(RuntimeError):
    """A download problem explained for people: `.kind` is a short code, str(self) the full message."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def checked_server_name(value: str, what: str, repo_id: str) -> str:
    """value, a name the server chose (an ETag, a commit), once seen to be a plain file name (letters,
    digits, '-' and '_'); otherwise HubError: a hostile endpoint must not pick a path like `../../x`."""
    if not isinstance(value, str) or not _SAFE_NAME_RE.match(value):
        raise HubError("network", f"The Hub server ({hub_endpoint()}) sent the {what} {str(value)[:80]!r} for "
                                  f"{repo_id}, which is not a plain id (letters, digits, '-', '_'); it is refused (it would name a "
                                  "file outside the download cache). Check HF_ENDPOINT: use the real Hub or a "
                                  "trusted mirror.")
    return value


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


def _translate(exc: Exception, repo_id: str) -> HubError:
    """Map huggingface_hub / httpx errors onto HubError with advice."""
    from huggingface_hub import errors

    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, DiskFull):
        return HubError(exc.kind, str(exc))
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
                        + OFFLINE_HINT)
    if isinstance(exc, errors.LocalEntryNotFoundError) or name in {"ConnectError", "ConnectTimeout", "ReadTimeout",
                                                                  "TimeoutException", "RemoteProtocolError",
                                                                  "NetworkError", "ProxyError", "ReadError"}:
        return HubError("network", f"Cannot reach the Hugging Face Hub ({hub_endpoint()}) to get {repo_id}: "
                                   f"no network connection, or the Hub is down. {OFFLINE_HINT}")
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return HubError("gated", f"Access to {repo_id} was refused (HTTP {status}). Log in with a token that can "
                                     "read it (`hf auth login`, or set HF_TOKEN) and retry.")
        return HubError("network", f"The Hub answered with an error for {repo_id} (HTTP {status}). Retry later. "
                        + OFFLINE_HINT)
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
            shards = set(json.loads(read_text(index, JSON_LIMIT)).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError, TypeError, RecursionError):
            return None
        return folder if shards and all(isinstance(s, str) and os.path.exists(os.path.join(folder, s)) for s in shards) else None
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
            etag = s.lfs.sha256 if s.lfs else s.blob_id
            etags[s.rfilename] = checked_server_name(etag, f"id of {s.rfilename}", repo_id) if etag else ""
    if "config.json" not in sizes:
        raise HubError("not_bitnet", f"{repo_id} has no config.json, so it is not a model checkpoint this app "
                                     "can run. Pick a BitNet b1.58 repository such as microsoft/bitnet-b1.58-2B-4T.")
    if not any(n.endswith(".safetensors") for n in sizes):
        raise HubError("not_bitnet", f"{repo_id} has no .safetensors weights (only safetensors checkpoints are "
                                     "supported; pickled .bin files are never loaded).")
    commit = info.sha or revision or "main"
    return checked_server_name(commit, "commit", repo_id), sizes, etags


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
                                      f"the local cache {cache}. " + OFFLINE_HINT)
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
    counter = ByteCounter(sum(sizes.values()), len(order), progress)
    tqdm_cls = tqdm_class(counter)
    storage = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    folder = None
    try:
        for i, name in enumerate(order):
            if i == 1:  # config.json is in: refuse other architectures before fetching gigabytes
                check_folder_config(folder, repo_id)
                missing = sum(sizes[n] for n in order[1:]
                              if not (etags[n] and os.path.exists(os.path.join(storage, "blobs", etags[n]))))
                ensure_free_space(cache, missing + (64 << 20), f"downloading {repo_id}")
            counter.file = name
            counter.mark()
            counter.report()
            before = counter.done
            _fetch_resumable(repo_id, name, commit, storage, token, tqdm_cls)
            path = hf_hub_download(repo_id, name, revision=commit, cache_dir=cache, token=token,
                                   endpoint=hub_endpoint(), tqdm_class=tqdm_cls)
            folder = os.path.dirname(path)
            counter.add(sizes[name] - (counter.done - before), moved=False)  # cached files count as done
            counter.files_done += 1
    except Exception as exc:  # noqa: BLE001
        raise _translate(exc, repo_id) from exc
    _remember_ref(storage, revision or "main", commit)
    counter.file = ""
    counter.report()
    return folder


def _fetch_resumable(repo_id: str, name: str, commit: str, storage: str, token, tqdm_cls) -> None:
    """Download a plain-HTTP file into blobs/<etag> through a partial file that outlives failures."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers
    from huggingface_hub.utils._runtime import is_xet_available

    url = hf_hub_url(repo_id, name, revision=commit, endpoint=hub_endpoint())
    meta = get_hf_file_metadata(url, token=token, endpoint=hub_endpoint())
    # Checked before either download path (this one or hf_hub_download's) joins them into cache paths.
    if meta.etag is not None:
        checked_server_name(meta.etag, f"ETag of {name}", repo_id)
    if meta.commit_hash is not None:
        checked_server_name(meta.commit_hash, f"commit of {name}", repo_id)
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
                 expected_size=meta.size, tqdm_class=tqdm_cls)
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
    """Raise HubError(not_bitnet) unless folder/config.json describes a BitNet b1.58 model (the converter's rule)."""
    try:
        config = json.loads(read_text(os.path.join(folder, "config.json"), JSON_LIMIT))
    except (OSError, ValueError, RecursionError) as exc:
        raise HubError("not_bitnet", f"{where}: config.json cannot be read ({exc}).") from exc
    if not isinstance(config, dict):
        raise HubError("not_bitnet", f"{where}: config.json is not a JSON object.")
    reason = not_bitnet_reason(config, where)
    if reason:
        raise HubError("not_bitnet", reason)
