"""A model source -> a converted engine file: the one path the CLI, load_model and the page all take.

    prepared = prepare("microsoft/bitnet-b1.58-2B-4T", download_progress=print, convert_progress=print)
    prepared.path       # the engine file to open with Model.open
    prepared.work       # what was done on the way: [], ["downloaded"], ["converted for this CPU"], or both
    prepared.fell_back  # with demo_fallback=True: the HubError that made it open the demo model, else None

A source is one of
    "demo"           the bundled demo model (bitnet_app.demo), an ordinary checkpoint folder
    an engine file   a converted .bitnet file, used as it is
    a folder         a Hugging Face checkpoint folder: checked (config.json, a BitNet architecture), then
                     converted once into cache_dir()/converted/ and reused while the folder is unchanged
    a Hub repo id    "owner/name": a complete cached snapshot whose converted file exists is used without
                     touching the network; otherwise it is downloaded (checkpoint/download.py), then
                     converted as a folder
download_progress(DownloadProgress) and convert_progress(fraction, message) may run on a worker thread.
demo_fallback=True: a Hub repo that cannot be downloaded because the Hub is out of reach (offline mode,
no network) opens the bundled demo model instead, when there is one.

Every failure is an exception with a message that says what to do; kind_of(exc) names it for the page
(not_found, bad_checkpoint, not_bitnet, disk_full, offline, network, gated, error).
"""
import os
import stat
from dataclasses import dataclass, field

from . import demo
from .checkpoint.config import NotBitNet, not_bitnet_reason, read_json
from .checkpoint.disk import ensure_free_space
from .checkpoint.download import (DEFAULT_REPO, OFFLINE_HINT, UNREACHABLE, HubError, cached_checkpoint,
                                  download_checkpoint, is_repo_id)
from .engine.cache import converted_path
from .engine.file import MAGIC, EngineFile, EngineFileError, remove_stale_partials

__all__ = ["prepare", "engine_file_for", "checkpoint_folder", "Prepared", "ModelNotFound", "HubError",
           "kind_of", "DEFAULT_REPO", "OFFLINE_HINT", "UNREACHABLE", "DEMO", "is_repo_id"]

DEMO = demo.NAME  # "demo"
DOWNLOADED, CONVERTED = "downloaded", "converted for this CPU"


class ModelNotFound(FileNotFoundError):
    """The source names no engine file, checkpoint folder or Hub repository (`.kind` "not_found"), or a
    folder that is not a checkpoint ("bad_checkpoint")."""

    def __init__(self, message: str, kind: str = "not_found"):
        super().__init__(message)
        self.kind = kind


@dataclass
class Prepared:
    path: str                                   # the converted engine file
    work: list[str] = field(default_factory=list)
    fell_back: HubError | None = None           # why the demo model stands in for the source asked for


def kind_of(exc: BaseException) -> str:
    """A short name for what went wrong (the page picks its title and buttons by it)."""
    return getattr(exc, "kind", None) or ("bad_checkpoint" if isinstance(exc, ValueError) else "error")


def engine_file_for(src, *, download_progress=None, convert_progress=None) -> str:
    """The path of a converted engine file for src (prepare(src).path)."""
    return prepare(src, download_progress=download_progress, convert_progress=convert_progress).path


def prepare(src, *, download_progress=None, convert_progress=None, demo_fallback: bool = False) -> Prepared:
    """Download and convert as needed; see the module docstring."""
    src = os.fspath(src)
    done = Prepared(path="")
    path = os.path.expanduser(src)
    if src != DEMO and os.path.isfile(path):
        EngineFile(path)  # cheap (header, metadata, sizes): a foreign or truncated file is explained here
        done.path = path
        return done
    if src != DEMO and os.path.lexists(path) and not os.path.isdir(path):
        raise _not_a_folder(src, path)  # a device, a FIFO, a dangling link: said so, not "does not exist"
    try:
        folder = _folder(src, download_progress, done)
    except HubError as exc:
        if not (demo_fallback and exc.kind in UNREACHABLE and demo.demo_model_dir() is not None):
            raise
        done.fell_back = exc
        folder = _demo_folder()
    done.path = _converted(folder, convert_progress, done)
    return done


def checkpoint_folder(src, *, download_progress=None) -> str:
    """The checkpoint folder behind src ("demo", a folder, or a Hub repo id, downloaded as needed)."""
    src = os.fspath(src)
    if src == DEMO:
        return _demo_folder()
    path = os.path.expanduser(src)
    if os.path.isdir(path):
        return _checked_folder(path)
    if os.path.lexists(path):
        raise _not_a_folder(src, path)
    if is_repo_id(src):
        return download_checkpoint(src, progress=download_progress)
    raise _not_found(src)


def _folder(src: str, download_progress, done: Prepared) -> str:
    """The checkpoint folder to convert; a Hub repo is downloaded unless its snapshot is cached and converted."""
    if is_repo_id(src):
        folder = cached_checkpoint(src)  # no network on a second start
        if folder is not None and _valid_engine_file(converted_path(folder)):
            return folder
        folder = download_checkpoint(src, progress=download_progress)
        done.work.append(DOWNLOADED)
        return folder
    return checkpoint_folder(src)


def _converted(folder: str, progress, done: Prepared) -> str:
    from .checkpoint.convert import convert_checkpoint, estimated_output_bytes

    out = converted_path(folder)
    remove_stale_partials(os.path.dirname(out))  # what killed conversions left behind
    if _valid_engine_file(out):
        return out
    ensure_free_space(os.path.dirname(out), estimated_output_bytes(folder), "the converted model")
    convert_checkpoint(folder, out, progress=progress)  # writes a temporary file, then renames
    done.work.append(CONVERTED)
    return out


def _valid_engine_file(path: str) -> bool:
    """True for an intact engine file of the current format; an old, damaged (checksums, table, metadata)
    or unreadable one is converted again, replacing it."""
    if not os.path.isfile(path):
        return False
    try:
        EngineFile(path)
        return True
    except (EngineFileError, OSError, ValueError):
        return False


def _demo_folder() -> str:
    folder = demo.demo_model_dir()
    if folder is None:
        raise ModelNotFound(demo.missing_message())
    return folder


def _checked_folder(folder: str) -> str:
    """folder, once it is seen to hold a BitNet config.json (before any conversion work)."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ModelNotFound(f"{folder} has no config.json, so it is not a model checkpoint. Choose the folder "
                            "that holds config.json, tokenizer.json and the *.safetensors files (or give a "
                            "converted .bitnet file or a Hub repo id).", kind="bad_checkpoint")
    raw = read_json(folder, "config.json", required=True)
    reason = not_bitnet_reason(raw if isinstance(raw, dict) else {}, folder)
    if reason:
        raise NotBitNet(reason)
    return folder


def _not_a_folder(src: str, path: str) -> ModelNotFound:
    """What is wrong with a path that exists but is no checkpoint folder: a converted engine file (already converted),
    another file, or no file at all (a device such as /dev/zero, a FIFO, a socket, a dangling link)."""
    if not os.path.exists(path):
        what = "is a symbolic link to something that does not exist"
    elif os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                engine = f.read(len(MAGIC)) == MAGIC
        except OSError:  # unreadable: said below as "a file"
            engine = False
        if engine:
            return ModelNotFound(f"{src} is an engine file, converted already: there is nothing to convert. Use it as "
                                 f"it is (`python -m bitnet_app generate --model {src} ...`, or open it in the app).",
                                 kind="bad_checkpoint")
        what = "is a file, not a checkpoint folder"
    else:
        what = f"is {_file_kind(path)}, not a model"
    return ModelNotFound(f"{src} {what}. Give a checkpoint folder (config.json, tokenizer.json, *.safetensors), a "
                         f"converted .bitnet file, a Hub repo id such as {DEFAULT_REPO}, or `{DEMO}`.",
                         kind="bad_checkpoint")


def _file_kind(path: str) -> str:
    """'a device', 'a named pipe (FIFO)', 'a socket', or 'not a regular file', for a path that is no file or folder."""
    mode = os.stat(path).st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def _not_found(src: str) -> ModelNotFound:
    return ModelNotFound(f"{src} does not exist: it is neither a file nor a folder on this computer, nor a Hub "
                         f"repository id (owner/name). Check the path or the spelling: give a converted .bitnet "
                         f"file, a checkpoint folder, a Hub repo id such as {DEFAULT_REPO}, or `{DEMO}`.")
