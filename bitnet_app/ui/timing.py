"""A reply's speed as the decoder measures it, timed again off screen when one run is too short to trust.

The figures under a reply are the decoder's own (Done.stats: the work inside the generator, never across a
yield). Yet while the page streams, the browser paints and Streamlit's server thread sends on the same cores, and
the server thread holds the GIL between the decoder's calls, so one short reply (the demo model writes 89 tokens
in about 10 ms) can read anywhere from a tenth of its speed to all of it. So a reply with less than RETIME_BELOW_S
of decoder time is run again here a few times (runs_for: as many as fit in about a second, odd, 3 to 9), with
nothing drawn, and shown as the median with its spread. In
Compare the two modes run in turn (AR, diffusion, AR, ...), so both meet the same machine, and the speed-up is
that of the median pair. Each run does the shown reply's work: the same settings and seed (so the same ids) and
the same cached prompt prefix (Model.forget_cache keeps what the shown run found cached).

    runs = time_again({"ar": Job(model, ids, params, reused)}, runs_for(stats["total_s"]))  # {name: [stats...]}
    spread([s["tok_s"] for s in runs["ar"]])                      # {"median", "low", "high", "runs"}
    pair(ar_stats, diffusion_stats)                               # speed-up, tokens per step, a step in AR tokens
"""
import statistics
from dataclasses import dataclass

from ..decode.events import Done

RETIME_BELOW_S = 0.5  # a reply with less decoder time than this is timed again off screen
BUDGET_S = 1.0        # ... in about this much decoder time per mode,
MIN_RUNS, MAX_RUNS = 3, 9  # ... in this many runs; odd, so that the median is one of the runs


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


def runs_for(seconds: float) -> int:
    """How many runs time a reply that took `seconds` again: as many as fit in BUDGET_S, odd, MIN_RUNS..MAX_RUNS
    (a 10 ms reply gets 9, a 0.4 s one 3)."""
    n = max(MIN_RUNS, min(MAX_RUNS, int(BUDGET_S / max(float(seconds), 1e-3))))
    return n if n % 2 else n - 1


def time_again(jobs: dict, runs: int) -> dict:
    """{name: Job} -> {name: [Done.stats of each run]}: every job once per round, in the dict's order, `runs`
    rounds. Nothing is drawn meanwhile (the page's drawing is what disturbed the first run)."""
    out = {name: [] for name in jobs}
    for _ in range(runs):
        for name, job in jobs.items():
            job.model.forget_cache(job.reused)
            done = [ev for ev in job.model.generate(job.ids, job.params) if isinstance(ev, Done)][-1]
            out[name].append(dict(done.stats))
    return out


def spread(values: list[float]) -> dict:
    """The median of the values, their lowest and highest, and how many there were."""
    ordered = sorted(float(v) for v in values)
    return {"median": statistics.median(ordered), "low": ordered[0], "high": ordered[-1], "runs": len(ordered)}


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


def median_pair(ar_runs: list[dict], diffusion_runs: list[dict]) -> dict:
    """pair() of the run pair (i-th AR, i-th diffusion) whose speed-up is the median, with the spread of the
    speed-ups over all pairs ("low", "high", "runs")."""
    pairs = [pair(a, d) for a, d in zip(ar_runs, diffusion_runs)]
    timed = [p for p in pairs if p["speedup"] is not None]
    if not timed:
        return dict(pairs[0], low=None, high=None, runs=len(pairs))
    timed.sort(key=lambda p: p["speedup"])
    return dict(timed[(len(timed) - 1) // 2], low=timed[0]["speedup"], high=timed[-1]["speedup"], runs=len(timed))
