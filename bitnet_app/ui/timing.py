"""A reply's speed as the decoder measures it, timed again off screen when one run is too short to trust.

The figures under a reply are the decoder's own (Done.stats: the work inside the generator, never across a
yield). Yet while the page streams, the browser paints and Streamlit's server thread sends on the same cores, and
the server thread holds the GIL between the decoder's calls, so one short reply (the demo model writes 89 tokens
in about 10 ms) can read anywhere from a tenth of its speed to all of it, and so can any one re-run on a busy
machine. So a reply with less than RETIME_BELOW_S of decoder time is run again here with nothing drawn, until each
job has gathered STEADY_S of decoder time (MIN_RUNS to MAX_RUNS runs), and its figure is its fastest run's: the
disturbances only ever add time, so the fastest run is the one that holds from one sitting to the next. In Compare
the two modes run in turn (AR, diffusion, AR, ...), so both meet the same machine, and the speed-up is the ratio of
the two fastest runs, whose tok/s are the ones the page shows beside it. Each run does the shown reply's work: the
same settings and seed (so the same ids) and the same cached prompt prefix (Model.forget_cache keeps what the shown
run found cached).

    runs = time_again({"ar": Job(model, ids, params, reused)})   # {name: [stats of each run]}
    fastest(runs["ar"])                                            # that run's stats, with "runs", "low", "high"
    pair(fastest(runs["ar"]), fastest(runs["diffusion"]))          # speed-up, tokens per step, a step in AR tokens
"""
import time
from dataclasses import dataclass

from ..decode.events import Done

RETIME_BELOW_S = 0.5  # a reply with less decoder time than this is timed again off screen
STEADY_S = 0.5        # ... until each job has this much decoder time,
MIN_RUNS, MAX_RUNS = 5, 200  # ... in at least this many runs, and at most this many
WALL_S = 5.0          # ... and never longer than this on the clock (a slow machine: the runs so far stand)


@dataclass
class Job:
    """One reply to time again: the model, the prompt ids, the DecodeParams it ran with (seeded), and how many
    prompt positions the shown run found cached (its stats["reused_tokens"]; 0 for a cold start)."""
    model: object
    ids: list
    params: object
    reused: int = 0


def too_short(stats: dict | None) -> bool:
    """Whether one run of this reply is too short to time well (no figures: nothing to time)."""
    return bool(stats) and float(stats.get("total_s", 0.0)) < RETIME_BELOW_S


def time_again(jobs: dict, seconds: float = STEADY_S, *, runs: int | None = None) -> dict:
    """{name: Job} -> {name: [Done.stats of each run]}: every job once per round, in the dict's order, until each
    has `seconds` of decoder time and MIN_RUNS runs (or MAX_RUNS rounds, or WALL_S on the clock); runs: exactly that
    many rounds instead. Nothing is drawn meanwhile (the page's drawing is what disturbed the first run)."""
    out = {name: [] for name in jobs}
    started = time.monotonic()
    while True:
        for name, job in jobs.items():
            job.model.forget_cache(job.reused)
            done = [ev for ev in job.model.generate(job.ids, job.params) if isinstance(ev, Done)][-1]
            out[name].append(dict(done.stats))
        n = len(next(iter(out.values())))
        if runs is not None:
            if n >= runs:
                return out
            continue
        gathered = min(sum(float(s.get("total_s", 0.0)) for s in stats) for stats in out.values())
        if n >= MAX_RUNS or (n >= MIN_RUNS and (gathered >= seconds or time.monotonic() - started >= WALL_S)):
            return out


def fastest(runs: list[dict]) -> dict:
    """The stats of the fastest run (the least decoder time), with how many runs there were and the lowest and
    highest tok/s among them ("runs", "low", "high")."""
    speeds = [float(s.get("tok_s", 0.0)) for s in runs]
    best = min(runs, key=lambda s: float(s.get("total_s", 0.0)))
    return dict(best, runs=len(runs), low=min(speeds), high=max(speeds))


def pair(ar: dict, diffusion: dict) -> dict:
    """The figures of one AR run and one diffusion run of a prompt (their Done.stats): the speed-up of diffusion
    (its tok/s over AR's), its tokens per step, and what a step costs, in AR tokens (diffusion's time per step over
    AR's time per token, both all in). speed-up = tokens per step / step cost, exactly. None where a figure is
    missing (no tokens, no steps)."""
    out = {"speedup": None, "tokens_per_step": None, "step_in_ar_tokens": None}
    if ar.get("tok_s") and diffusion.get("tok_s"):
        out["speedup"] = float(diffusion["tok_s"]) / float(ar["tok_s"])
    steps, ar_tokens = int(diffusion.get("steps") or 0), int(ar.get("tokens") or 0)
    if steps and ar_tokens and ar.get("total_s"):
        out["tokens_per_step"] = int(diffusion.get("tokens", 0)) / steps
        out["step_in_ar_tokens"] = (float(diffusion["total_s"]) / steps) / (float(ar["total_s"]) / ar_tokens)
    return out
