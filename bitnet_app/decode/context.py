"""What every decoder checks before it runs: does the prompt fit, and how much of it is already cached."""


class ContextOverflow(ValueError):
    """The prompt does not fit the model's context window (the app trims history and retries)."""

    def __init__(self, prompt_tokens: int, context: int):
        self.prompt_tokens, self.context = prompt_tokens, context
        super().__init__(f"the prompt is {prompt_tokens} tokens but the model's context holds {context} "
                         f"(and at least one new token must fit): shorten the prompt or drop earlier turns")


def check_prompt_fits(prompt_tokens: int, context: int) -> None:
    if prompt_tokens == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS id)")
    if prompt_tokens >= context:
        raise ContextOverflow(prompt_tokens, context)


def reusable_prefix(cached_ids, prompt_ids, n_past: int) -> int:
    """How many leading prompt positions have valid committed K/V: the common prefix of the ids the
    cache holds and the prompt, within the committed length, leaving at least one prompt token to
    run (its logits start the reply)."""
    if cached_ids is None:
        return 0
    limit = min(len(cached_ids), len(prompt_ids) - 1, n_past)
    n = 0
    while n < limit and cached_ids[n] == prompt_ids[n]:
        n += 1
    return n
