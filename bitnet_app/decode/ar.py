"""Autoregressive decoding: prefill the prompt in one forward, then one token per forward.

    for ev in generate_ar(engine, prompt_ids, params, stop_ids={128001, 128009}, detokenizer=tok.detokenizer()):
        ...  # Token(id, text) per token, then Done(stats, stop_reason, text, ids)

params: a DecodeParams (bitnet_app/params.py) resolved for this model (Model.decode_params): max_new_tokens and
the sampling knobs; `sampler` replaces the one they describe (tests hand in the numpy kernels).

Shapes: engine.forward(ids) -> (1, V) float32 logits of the last id; sampler.token takes (V,).

Timing: a Stopwatch (stopwatch.py) around the work done inside the generator (forwards, sampling,
detokenizing), never across a `yield`, so a slow consumer does not change the figures.

Cache: `kv_ids` (optional, a list the caller owns) names the ids whose K/V fill the engine's committed
positions [0, len(kv_ids)); the generator reuses the common prefix with the prompt and keeps the
list exact after every forward, so closing the generator at any yield leaves both consistent.
"""
from .context import check_prompt_fits, reusable_prefix
from .events import STOP_CONTEXT, STOP_LENGTH, STOP_TOKEN, Done, Token
from .sampling import Sampler
from .stopwatch import Stopwatch


def _forward_commit(engine, ids, start, kv_ids):
    """Run and commit ids at positions start.. ; keep kv_ids in step (cut first: a failed call may
    have overwritten positions from start on)."""
    if kv_ids is not None:
        del kv_ids[start:]
    logits = engine.forward(ids, start=start, commit=True)
    if kv_ids is not None:
        kv_ids.extend(int(i) for i in ids)
    return logits[0]


def _prefill(engine, prompt, kv_ids):
    """The uncached part of the prompt in one forward: (the logits of its last row, which predict the first token;
    how many leading prompt positions the cache already held)."""
    reuse = reusable_prefix(kv_ids, prompt, engine.n_past)
    if kv_ids is None:
        engine.reset()
    else:
        engine.truncate(reuse)
        del kv_ids[reuse:]
    return _forward_commit(engine, prompt[reuse:], reuse, kv_ids), reuse


def generate_ar(engine, prompt_ids, params, *, sampler=None, stop_ids=(), detokenizer=None,
                kv_ids: list | None = None):
    params = params.ready_for(engine.vocab_size)
    sampler = sampler or Sampler.from_params(params, engine)
    max_new_tokens = params.max_new_tokens
    prompt = [int(i) for i in prompt_ids]
    check_prompt_fits(len(prompt), engine.ctx)
    stop_set = {int(i) for i in stop_ids}
    budget = min(int(max_new_tokens), engine.ctx - len(prompt))  # the whole reply stays inside the context

    if budget <= 0:
        reason = STOP_LENGTH if max_new_tokens <= 0 else STOP_CONTEXT
        yield Done(_stats(0, 0, 0.0, 0.0, 0.0, len(prompt), 0), reason, "", [])
        return

    work, engine_time = Stopwatch(), Stopwatch()  # all work inside the generator; engine.forward calls alone
    ttft = 0.0
    out: list[int] = []     # generated ids, stop excluded
    context = list(prompt)  # what the repetition penalty looks at
    stop_reason = STOP_LENGTH

    with work, engine_time:
        logits, reuse = _prefill(engine, prompt, kv_ids)
    forwards, prefill_s = 1, engine_time.seconds

    while True:
        with work:
            token = sampler.token(logits, context)
            stopped = token in stop_set
            if not stopped:
                out.append(token)
                context.append(token)
                piece = detokenizer.push(token) if detokenizer is not None else ""
        if stopped:
            stop_reason = STOP_TOKEN
            break
        if len(out) == 1:
            ttft = work.seconds
        yield Token(token, piece)
        if len(out) >= budget:
            stop_reason = STOP_LENGTH if len(out) >= max_new_tokens else STOP_CONTEXT
            break
        with work, engine_time:
            logits = _forward_commit(engine, [token], len(prompt) + len(out) - 1, kv_ids)
        forwards += 1

    with work:
        text = ""
        if detokenizer is not None:
            detokenizer.flush()  # a held-back incomplete character ends up in detokenizer.text
            text = detokenizer.text
    stats = _stats(len(out), forwards, work.seconds, ttft, prefill_s, len(prompt), reuse)
    stats["engine_s"] = engine_time.seconds  # prefill and decode forwards (the rest of total_s: sampling, text)
    yield Done(stats, stop_reason, text, out)


def _stats(tokens, forwards, total_s, ttft_s, prefill_s, prompt_tokens, reused_tokens) -> dict:
    # decode: everything after the first token was ready; each forward after the prefill yields one id
    decode_s = max(total_s - ttft_s, 0.0)
    decode_forwards = max(forwards - 1, 0)
    return {
        "tokens": tokens,
        "forwards": forwards,
        "tokens_per_forward": tokens / forwards if forwards else 0.0,
        "tok_s": tokens / total_s if total_s > 0 else 0.0,
        "ttft_s": ttft_s,
        "prefill_s": prefill_s,
        "prompt_tokens": prompt_tokens,
        "prefill_tok_s": (prompt_tokens - reused_tokens) / prefill_s if prefill_s > 0 else 0.0,
        "reused_tokens": reused_tokens,
        "decode_tok_s": decode_forwards / decode_s if decode_forwards and decode_s > 0 else 0.0,
        "total_s": total_s,
    }
