"""First run: download (bytes, speed, ETA) -> convert (its own progress) -> load, then cached.

The work is bitnet_app.source.prepare, run as a background job; this module only draws its progress.
A second start finds the converted engine file and goes straight to chat without touching the network.
Failures raise LoadFailure(kind, message), which load_failures.py turns into a page that says what to do.
"""
import os
import threading
import time

import streamlit as st

from .. import source as model_source
from ..units import format_bytes
from . import jobs
from .model_choices import DEMO_LABEL, Source, demo_available, demo_source

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


def kv_setting() -> str:
    """The KV cache the sidebar asks for ("f16" or "i8"): an argument of the cached loaders, so a change reloads."""
    return st.session_state.get("kv_cache") or "f16"


SMALL_MODEL_BYTES = 64 << 20  # an engine file this small (the demo model's is a few MB) runs on one thread in "auto"


def auto_threads(path: str) -> int | None:
    """The engine's threads when the sidebar says "auto": one for a small model, else None (every core, or
    BITNET_THREADS when set). A step of a model this small lasts tens of microseconds, about what handing work to a
    second thread costs, and a second thread that the OS deschedules stalls every step: on one thread its timings
    are the steadiest, which the page's speed figures need."""
    if os.environ.get("BITNET_THREADS", "").strip():
        return None
    try:
        return 1 if os.path.getsize(path) < SMALL_MODEL_BYTES else None
    except OSError:
        return None


def _open(path: str, threads: int, kv: str) -> Loaded:
    from ..model import Model
    return Loaded(Model.open(path, threads=threads or auto_threads(path), kv=kv), path)


def _release(loaded: Loaded) -> None:
    close = getattr(loaded.model, "close", None)
    if callable(close):
        close()


@st.cache_resource(max_entries=1, show_spinner="Loading the model…", on_release=_release)
def load_engine(path: str, threads: int, kv: str = "f16") -> Loaded:
    return _open(path, threads, kv)


@st.cache_resource(max_entries=1, show_spinner="Loading a second engine for the side-by-side run…",
                   on_release=_release)
def load_compare_engine(path: str, threads: int, kv: str = "f16") -> Loaded:
    """The compare view decodes AR and diffusion in turn, so it needs a second engine (its own KV cache)."""
    return _open(path, threads, kv)


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
        st.toast(f"{source.label} is ready ({' and '.join(work)}); next time it opens at once.",
                 icon=":material/check_circle:")
    return loaded


def ensure_model_or_demo(source: Source, threads: int) -> tuple[Loaded, LoadFailure | None]:
    """ensure_model, except that a Hub repo which cannot be downloaded because the Hub is out of reach
    (offline mode, no network, Hub down) opens the bundled demo model instead, when there is one.
    Returns (loaded, the failure that caused the switch, or None). A failed download is not retried on
    every rerun: it stays failed (and the demo model stays open) until Retry forgets it."""
    if source.kind != "hub" or not demo_available():
        return ensure_model(source, threads), None
    failure = demo_stands_in(source)
    if failure is None:
        try:
            return ensure_model(source, threads, clear_on=model_source.UNREACHABLE), None
        except LoadFailure as exc:
            if exc.kind not in model_source.UNREACHABLE:
                raise
            failure = exc
    return ensure_model(demo_source(), threads, announce=False), failure  # the notice says why


def demo_stands_in(source: Source | None) -> LoadFailure | None:
    """Why the bundled demo model runs in place of `source`: an earlier run found its Hub repo out of reach (the
    failure stays until Retry forgets it); None when it does not (yet)."""
    if source is None or source.kind != "hub" or not demo_available():
        return None
    job = jobs.failed(_prepare_key(source))
    failure = _failure(job) if job is not None else None
    return failure if failure is not None and failure.kind in model_source.UNREACHABLE else None


def _ensure(source: Source, threads: int, work: list) -> Loaded:
    """Prepare the engine file on a background job (drawing each stage's progress as it comes), then load."""
    job = jobs.run(_prepare_key(source), lambda report: model_source.prepare(
        source.target, download_progress=lambda p: report(("download", p)),
        convert_progress=lambda fraction, message="": report(("convert", (fraction, message)))))
    view = _ProgressView(source)
    try:
        prepared = _wait(job, view.draw)
    except LoadFailure as exc:
        view.failed(exc)
        raise
    view.done()
    work.extend(prepared.work)
    return _load(prepared.path, threads)


def _load(path: str, threads: int) -> Loaded:
    try:
        return load_engine(path, int(threads), kv_setting())
    except Exception as exc:  # noqa: BLE001 - a broken file or an engine that cannot start is explained
        raise LoadFailure("bad_checkpoint", f"The model file {path} could not be loaded: {exc}") from exc


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


# The API's advice for an unreachable Hub names the command line's way out; the page has buttons for it.
PAGE_OFFLINE_HINT = (f"Choose \"{DEMO_LABEL}\" in the model picker, point it at a checkpoint "
                     "folder on this computer, or connect to the internet and retry.")


def _failure(job: jobs.Job) -> LoadFailure:
    err = job.error
    message = str(err).replace(model_source.OFFLINE_HINT, PAGE_OFFLINE_HINT)
    return LoadFailure(model_source.kind_of(err), message, job.trace)


def _prepare_key(source: Source) -> str:
    return f"prepare:{source.target}"


def _eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "estimating time left"
    if seconds < 60:
        return f"{seconds:.0f} s left"
    return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s left"


class _ProgressView:
    """The download and conversion progress boxes, each drawn when its stage first reports."""

    def __init__(self, source: Source):
        self.source = source
        self.stage = None            # "download" | "convert" | None before the first report
        self.status = self.bar = self.line = None
        self.started = time.monotonic()

    def draw(self, report) -> None:
        stage, value = report
        if stage != self.stage:
            self._close_stage()
            self.stage, self.started = stage, time.monotonic()
            self._open_stage()
        if stage == "download":
            self._draw_download(value)
        else:
            fraction, message = value
            self.bar.progress(float(fraction), text=f"{message} · {fraction:.0%} · "
                                                    f"{time.monotonic() - self.started:.0f} s")

    def _open_stage(self) -> None:
        if self.stage == "download":
            repo_id = self.source.target
            st.markdown(f"#### First start: getting **{repo_id}**")
            st.caption("The model is downloaded once, converted for this CPU once, and then opens straight into "
                       "chat on every later start. An interrupted download continues where it stopped.")
            self.status = st.status(f"Downloading {repo_id}…", expanded=True)
            with self.status:
                self.bar = st.progress(0.0, text="Listing the files…")
                self.line = st.empty()
        else:
            self.status = st.status("Converting the checkpoint for this CPU (once)…", expanded=True)
            with self.status:
                self.bar = st.progress(0.0, text="Reading the checkpoint…")

    def _draw_download(self, p) -> None:
        self.bar.progress(p.fraction, text=f"{format_bytes(p.done)} of {format_bytes(p.total)} ({p.fraction:.0%})")
        if p.speed:
            speed = f"{format_bytes(p.speed)}/s"
        elif p.done:
            speed = "waiting for data (a stalled connection is retried automatically)"
        else:
            speed = "measuring speed"
        current = f" · {p.file}" if p.file else ""
        self.line.caption(f"{speed} · {_eta_text(p.eta)} · file {min(p.files_done + 1, p.files_total)} of "
                          f"{p.files_total}{current}")

    def _close_stage(self) -> None:
        if self.stage == "download":
            self.status.update(label=f"Downloaded {self.source.target}", state="complete", expanded=False)
        elif self.stage == "convert":
            self.status.update(label=f"Converted in {time.monotonic() - self.started:.0f} s", state="complete",
                               expanded=False)

    def done(self) -> None:
        self._close_stage()

    def failed(self, failure: LoadFailure) -> None:
        if self.stage == "download":
            self.status.update(label=f"Could not download {self.source.target}", state="error", expanded=False)
        elif self.stage == "convert":
            self.status.update(label="The checkpoint could not be converted", state="error", expanded=False)
            if failure.kind == "error":
                failure.kind = "bad_checkpoint"
