"""The transformers reference and the calibrated checks that test_parity.py and test_families.py apply to the engine
(and to engine files with a known bug): logits per position within the reference's own 1e-6 sensitivity, greedy
continuations. test_parity.py's docstring gives the measurements behind the tolerances.

Shapes: logits (positions, vocab) float32; ids a list of token ids starting with BOS.
"""
import contextlib
import os

import numpy as np


def require_reference():
    """torch + transformers, or a clear error (never a skip: CI must not pass without the reference)."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        where = "CI is set, so this is an error" if os.environ.get("CI") else "the parity tests need it"
        raise RuntimeError(f"the parity reference needs torch and transformers ({exc}); {where}. "
                           f"Install them: pip install torch==2.13.0 -e '.[test]'") from exc
    return torch


PROMPTS = 3           # prompts per model for the logits check ...
PROMPT_LEN = 40       # ... of this many positions each
GREEDY_PROMPT = 10    # greedy continuation: prompt length ...
GREEDY_NEW = 24       # ... and new tokens
NUDGE = 1e-6          # relative size of the sensitivity nudges
N_NUDGES = 8          # embedding nudges (random directions), plus 2 weight-scale nudges x(1 +- 1e-6)


class Reference:
    """transformers BitNetForCausalLM in fp32: logits, nudged logits, greedy continuation."""

    def __init__(self, folder):
        torch = require_reference()
        from checkpoints import load_reference_model
        self.torch = torch
        self.model = load_reference_model(folder)

    def logits(self, ids, embeds=None):
        torch = self.torch
        with torch.no_grad():
            out = self.model(torch.tensor([ids])) if embeds is None else self.model(inputs_embeds=embeds)
        return out.logits[0].float().numpy()

    def nudged_logits(self, ids, embedding_nudges=N_NUDGES, scale_nudges=True):
        """[(what, logits)]: the reference after 1e-6 relative nudges of its input embedding (random
        directions) and of all its weight scales: what the reference itself does under fp32-level noise."""
        torch = self.torch
        out = []
        with torch.no_grad():
            emb = self.model.model.embed_tokens(torch.tensor([ids]))
        for k in range(embedding_nudges):
            g = torch.Generator().manual_seed(1000 + k)
            noise = torch.randn(emb.shape, generator=g, dtype=emb.dtype)
            out.append((f"embedding x(1 + 1e-6 N(0,1)) #{k}", self.logits(ids, embeds=emb * (1 + NUDGE * noise))))
        for sign in ((1, -1) if scale_nudges else ()):
            with self._scaled_weights(1 + sign * NUDGE):
                out.append((f"weight scales x(1 {'+' if sign > 0 else '-'} 1e-6)", self.logits(ids)))
        return out

    @contextlib.contextmanager
    def _scaled_weights(self, factor):
        """Every projection's weight_scale buffer (offline), or latent weight (online: absmean
        ternarization is scale-invariant, so this scales W_eff only), multiplied by factor."""
        torch = self.torch
        tensors = [t for name, t in self.model.named_buffers() if name.endswith("_proj.weight_scale")]
        if not tensors:
            tensors = [t for name, t in self.model.named_parameters() if name.endswith("_proj.weight")]
        assert tensors, "found no projection weights or scales to nudge"
        saved = [t.detach().clone() for t in tensors]
        with torch.no_grad():
            for t in tensors:
                t.mul_(factor)
        try:
            yield
        finally:
            with torch.no_grad():
                for t, s in zip(tensors, saved):
                    t.copy_(s)

    def greedy(self, ids, n_new, stop_ids):
        """Greedy continuation by full recompute, with Model.complete's contract: argmax of the last
        row appended until n_new tokens or a stop id (not output). Returns (tokens, the rows used)."""
        seq, out, rows = list(ids), [], []
        for _ in range(n_new):
            row = self.logits(seq)[-1]
            rows.append(row)
            nxt = int(np.argmax(row))
            if nxt in stop_ids:
                break
            out.append(nxt)
            seq.append(nxt)
        return out, rows


def position_errors(a, ref):
    """Per position: max over the vocabulary of |a - ref|, relative to the logit scale max |ref|."""
    return np.abs(a - ref).max(axis=1) / np.abs(ref).max()


def argmax_agreement(a, ref):
    return float((a.argmax(axis=1) == ref.argmax(axis=1)).mean())


def summary(a, ref):
    e = position_errors(a, ref)
    return {"max": float(e.max()), "median": float(np.median(e)), "cascade": cascade_level(e),
            "argmax": argmax_agreement(a, ref)}


def cascade_level(e):
    """How far one early rounding flip drags the later positions: the median error from the first
    moved position (error > FP32_FLOOR) on, if that position lies in the first half; else 0."""
    moved = np.nonzero(e > FP32_FLOOR)[0]
    if len(moved) == 0 or moved[0] >= len(e) // 2:
        return 0.0
    return float(np.median(e[moved[0]:]))


# Tolerances = TOL_FACTOR x what the 1e-6 nudges do to the reference (worst over all nudges and prompts
# of this run), with floors from the development measurements (module docstring):
TOL_FACTOR = 3.0
FP32_FLOOR = 1e-5      # a position "moved" above this (fp32 floor between flips: 2e-7..7e-7)
CASCADE_FLOOR = 0.01   # cascade levels measured 0.005..0.023 (18 prompts x 10 nudges x 3 models); a run
                       # whose nudges happen to flip nothing early must not make one engine flip fatal
MIN_FLIP = 0.05        # single flips measured 0.3%..46% of the logit scale
ARGMAX_SLACK = 0.1     # argmax agreement >= (worst agreement of a nudged reference, capped at 0.9) - this


def calibrate(sens):
    """Tolerances from the nudged references' summaries (one per prompt and nudge)."""
    worst = {k: max(s[k] for s in sens) for k in ("median", "cascade", "max")}
    worst_argmax = min(s["argmax"] for s in sens)
    return {"median_tol": TOL_FACTOR * max(worst["median"], worst["cascade"], CASCADE_FLOOR),
            "max_tol": TOL_FACTOR * max(worst["max"], MIN_FLIP),
            "argmax_min": min(0.9, worst_argmax) - ARGMAX_SLACK,
            "sens_median": worst["median"], "sens_cascade": worst["cascade"], "sens_max": worst["max"],
            "sens_argmax": worst_argmax}


def logits_check(logits, refs, tol):
    """(ok, details) for a model's logits on the prompts against the reference's, with calibrated tol:
    every prompt's median position error <= median_tol, worst position <= max_tol, and argmax
    agreement over all positions >= argmax_min."""
    per = [summary(a, r) for a, r in zip(logits, refs)]
    agree = float(np.mean(np.concatenate([a.argmax(1) == r.argmax(1) for a, r in zip(logits, refs)])))
    d = {"median": max(p["median"] for p in per), "max": max(p["max"] for p in per), "argmax": agree}
    ok = d["median"] <= tol["median_tol"] and d["max"] <= tol["max_tol"] and agree >= tol["argmax_min"]
    return ok, d


def greedy_check(model, case):
    """(ok, details): Model.complete (greedy) against the reference's greedy continuation.
    (a) the sequences are equal, or they part at a step where the reference's choice beat the
        model's by at most median_tol x the logit scale (a near tie that a 1e-6 nudge can swap);
    (b) along the model's own continuation, the model's token is the reference's argmax at
        >= argmax_min of the steps (teacher forcing: one reference forward of prompt + output)."""
    tol = case.tol
    prompt, ref_seq, ref_rows = case.greedy_prompt, case.ref_seq, case.ref_rows
    out = model.complete(prompt, max_new_tokens=GREEDY_NEW)
    k = 0
    while k < min(len(out), len(ref_seq)) and out[k] == ref_seq[k]:
        k += 1
    split_margin = 0.0
    if out != ref_seq:
        row = ref_rows[k]
        if k < len(out):
            chosen = row[out[k]]
        else:  # the model stopped here: its best stop id
            chosen = max(row[s] for s in case.stop_ids)
        split_margin = float((row.max() - chosen) / np.abs(row).max())
    agree = 1.0
    if out:
        rows = case.ref.logits(prompt + out)[len(prompt) - 1:len(prompt) - 1 + len(out)]
        agree = float(np.mean(rows.argmax(axis=1) == np.array(out)))
    ok = split_margin <= tol["median_tol"] and agree >= tol["argmax_min"]
    return ok, {"common_prefix": k, "ref_len": len(ref_seq), "out_len": len(out),
                "split_margin": split_margin, "teacher_forced_agreement": agree}


class CalibratedCase:
    """What both parity suites hold per model (a subclass sets ref, a Reference, and stop_ids, then calls calibrate):
    the reference's logits on the prompts, what 1e-6 nudges do to them and the tolerances calibrated from that,
    the reference's greedy continuation; and the logits check against them."""

    def calibrate(self, prompts, greedy_prompt):
        self.prompts = prompts
        self.refs = [self.ref.logits(ids) for ids in prompts]
        self.sens = []  # (prompt index, nudge, summary against the un-nudged reference)
        for p, (ids, r) in enumerate(zip(prompts, self.refs)):
            self.sens += [(p, what, summary(n, r)) for what, n in self.ref.nudged_logits(ids)]
        self.tol = calibrate([s for _, _, s in self.sens])
        self.greedy_prompt = greedy_prompt
        self.ref_seq, self.ref_rows = self.ref.greedy(greedy_prompt, GREEDY_NEW, self.stop_ids)

    def check_logits(self, model):
        return logits_check([model.logits(ids) for ids in self.prompts], self.refs, self.tol)


def built_once(case_class, tmp_path_factory):
    """get(name) -> case_class(name, a new folder), built on the first call for that name (a module fixture's
    cases: each model is built and calibrated once, and only when a test asks for it)."""
    built = {}

    def get(name):
        if name not in built:
            built[name] = case_class(name, str(tmp_path_factory.mktemp(name)))
        return built[name]
    return get


def fmt(d):
    """A dict of figures on one line."""
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items())
