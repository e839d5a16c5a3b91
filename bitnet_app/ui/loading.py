"""First run: download (bytes, speed, ETA) -> convert (its own progress) -> load, then cached.

A second start finds the converted engine file and goes straight to chat without touching the network.
Failures raise LoadFailure(kind, message), which first_run.py turns into a page that says what to do.
"""
import json
import os
import threading
import time

import streamlit as st

from .. import hub
from ..cache import converted_path
from . import jobs
from .sources import Source, demo_available, demo_source

POLL_S = 0.25


class LoadFailure(Exception):
    def __init__(self, kind: str, message: str, trace: str = ""):
        super().__init__(message)
        self.kind, self.trace = kind, trace


class Loaded:
    """A model plus the lock that keeps one generation at a time on its engine (tabs share it)."""

    def __init__(self, model, path: str):
        self.model, self.path = model, path
        self.lock = threading.Lock()


def _open(path: str, threads: int) -> Loaded:
    from ..model import Model
    return Loaded(Model.open(path, threads=threads or None), path)


def _release(loaded: Loaded) -> None:
    close = getattr(loaded.model, "close", None)
    if callable(close):
        close()


@st.cache_resource(max_entries=1, show_spinner="Loading the model…", on_release=_release)
def load_engine(path: str, threads: int) -> Loaded:
    return _open(path, threads)


@st.cache_resource(max_entries=1, show_spinner="Loading a second engine for the side-by-side run…",
                   on_release=_release)
def load_compare_engine(path: str, threads: int) -> Loaded:
    """The compare view decodes AR and diffusion in turn, so it needs a second engine (its own KV cache)."""
    return _open(path, threads)


def _valid_engine_file(path: str) -> bool:
    from ..engine_file import EngineFile, EngineFileError
    if not os.path.isfile(path):
        return False
    try:
        EngineFile(path)
        return True
    except (EngineFileError, OSError, ValueError):
        return False


def engine_bytes_estimate(folder: str) -> int:
    """Size of the engine file conversion will write: bf16 embedding + int8 head + 2-bit ternary weights."""
    try:
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        d, i, n = int(c["hidden_size"]), int(c["intermediate_size"]), int(c["num_hidden_layers"])
        h, kvh, v = int(c["num_attention_heads"]), int(c["num_key_value_heads"]), int(c["vocab_size"])
        hd = int(c.get("head_dim") or d // h)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return 0
    ternary = n * (d * h * hd + 2 * d * kvh * hd + h * hd * d + 3 * d * i)
    return 3 * v * d + ternary // 4 + (16 << 20)


def ensure_model(source: Source, threads: int, *, clear_on: frozenset = frozenset(),
                 announce: bool = True) -> Loaded:
    """The loaded model for `source`, drawing download and conversion progress on the way (the progress
    is cleared once the model is ready; a failure leaves it on the page above the explanation, unless
    its kind is in `clear_on`). announce: a toast says what was done (not when a notice explains it)."""
    holder = st.empty()
    work: list[str] = []
    try:
        with holder.container():
            loaded = _ensure(source, threads, work)
    except LoadFailure as failure:
        if failure.kind in clear_on:
            holder.empty()
        raise
    holder.empty()
    if work and announce:
        st.toast(f"{source.label} is ready ({' and '.join(work)}). It is kept on this computer, so next time it "
                 "opens at once.", icon=":material/check_circle:")
    return loaded


def ensure_model_or_demo(source: Source, threads: int) -> tuple[Loaded, LoadFailure | None]:
    """ensure_model, except that a Hub repo which cannot be downloaded because the Hub is out of reach
    (offline mode, no network, Hub down) opens the bundled demo model instead, when there is one.
    Returns (loaded, the failure that caused the switch, or None). A failed download is not retried on
    every rerun: it stays failed (and the demo model stays open) until Retry forgets it."""
    if source.kind != "hub" or not demo_available():
        return ensure_model(source, threads), None
    job = jobs.failed(_download_key(source.target))
    failure = _failure(job) if job is not None else None
    if failure is None or failure.kind not in hub.UNREACHABLE:
        try:
            return ensure_model(source, threads, clear_on=hub.UNREACHABLE), None
        except LoadFailure as exc:
            if exc.kind not in hub.UNREACHABLE:
                raise
            failure = exc
    return ensure_model(demo_source(), threads, announce=False), failure  # the notice says why


def _ensure(source: Source, threads: int, work: list) -> Loaded:
    if source.kind == "folder" and source.target.endswith(".bitnet") and os.path.isfile(source.target):
        return _load(source.target, threads)
    if source.kind == "hub":
        folder = hub.cached_checkpoint(source.target)  # no network on a second start
        if folder is None or not _valid_engine_file(converted_path(folder)):
            folder = _download(source.target)
            work.append("downloaded")
    else:
        folder = _check_folder(source.target)
    path = converted_path(folder)
    if not _valid_engine_file(path):
        _convert(folder, path)
        work.append("converted for this CPU")
    return _load(path, threads)


def _load(path: str, threads: int) -> Loaded:
    try:
        return load_engine(path, int(threads))
    except Exception as exc:  # noqa: BLE001 - a broken file or an engine that cannot start is explained
        raise LoadFailure("bad_checkpoint", f"The model file {path} could not be loaded: {exc}") from exc


def _check_folder(folder: str) -> str:
    if not os.path.isdir(folder):
        raise LoadFailure("not_found", f"There is no folder {folder} on this computer, and it is not a Hub "
                                       "repository id (owner/name) either. Check the path or the spelling.")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise LoadFailure("bad_checkpoint", f"{folder} has no config.json, so it is not a model checkpoint. "
                                            "Choose the folder that holds config.json, tokenizer.json and the "
                                            "*.safetensors files.")
    try:
        hub.check_folder_config(folder, folder)
    except hub.HubError as exc:
        raise LoadFailure(exc.kind, str(exc)) from exc
    return folder


def _wait(job: jobs.Job, draw) -> object:
    """Redraw from the job's progress until it ends; each draw is also where Stop / rerun can land."""
    while not job.wait(POLL_S):
        if job.progress is not None:
            draw(job.progress)
    if job.progress is not None:
        draw(job.progress)
    if job.error is not None:
        raise _failure(job)
    jobs.forget(job.key)
    return job.result


def _failure(job: jobs.Job) -> LoadFailure:
    err = job.error
    kind = getattr(err, "kind", None) or ("bad_checkpoint" if isinstance(err, ValueError) else "error")
    return LoadFailure(kind, str(err), job.trace)


def _download_key(repo_id: str) -> str:
    return f"download:{repo_id}"


def _eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "estimating time left"
    if seconds < 60:
        return f"{seconds:.0f} s left"
    return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s left"


def _download(repo_id: str) -> str:
    st.markdown(f"#### First start: getting **{repo_id}**")
    st.caption("The model is downloaded once, converted for this CPU once, and then opens straight into chat "
               "on every later start. An interrupted download continues where it stopped.")
    status = st.status(f"Downloading {repo_id}…", expanded=True)
    with status:
        bar = st.progress(0.0, text="Listing the files…")
        line = st.empty()

    def draw(p: hub.DownloadProgress):
        bar.progress(p.fraction, text=f"{hub.format_bytes(p.done)} of {hub.format_bytes(p.total)} "
                                      f"({p.fraction:.0%})")
        if p.speed:
            speed = f"{hub.format_bytes(p.speed)}/s"
        elif p.done:
            speed = "waiting for data (a stalled connection is retried automatically)"
        else:
            speed = "measuring speed"
        current = f" · {p.file}" if p.file else ""
        line.caption(f"{speed} · {_eta_text(p.eta)} · file {min(p.files_done + 1, p.files_total)} of "
                     f"{p.files_total}{current}")

    job = jobs.run(_download_key(repo_id), lambda report: hub.download_checkpoint(repo_id, progress=report))
    try:
        folder = _wait(job, draw)
    except LoadFailure:
        status.update(label=f"Could not download {repo_id}", state="error", expanded=False)
        raise
    status.update(label=f"Downloaded {repo_id}", state="complete", expanded=False)
    return folder


def _convert(folder: str, path: str) -> None:
    try:
        hub.ensure_free_space(os.path.dirname(path), engine_bytes_estimate(folder), "the converted model")
    except hub.HubError as exc:
        raise LoadFailure(exc.kind, str(exc)) from exc
    status = st.status("Converting the checkpoint for this CPU (once)…", expanded=True)
    with status:
        bar = st.progress(0.0, text="Reading the checkpoint…")
    started = time.monotonic()

    def draw(p):
        fraction, message = p
        bar.progress(float(fraction), text=f"{message} · {fraction:.0%} · {time.monotonic() - started:.0f} s")

    def work(report):
        from ..convert import convert_checkpoint
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return convert_checkpoint(folder, path, progress=report)

    job = jobs.run(f"convert:{path}", work)
    try:
        _wait(job, draw)
    except LoadFailure as exc:
        status.update(label="The checkpoint could not be converted", state="error", expanded=False)
        if exc.kind == "error":
            exc.kind = "bad_checkpoint"
        raise
    status.update(label=f"Converted in {time.monotonic() - started:.0f} s", state="complete", expanded=False)
