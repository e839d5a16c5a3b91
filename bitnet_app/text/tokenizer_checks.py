"""What the converter checks in a checkpoint's tokenizer before it is stored in an engine file: that it loads, and
that it agrees with the model's config and chat template. A tokenizer that lies (a post-processor id past the
embedding, a renamed vocabulary entry that makes the library renumber the special tokens, an emptied vocabulary)
is refused once, at conversion, rather than cached to fail, or to write garbage, at every start.

    check_tokenizer(text, where, vocab_size, named_ids={}, template=None, named_texts={})
        the tokenizers library loads it; a probe text comes back from encode/decode; every id it can produce
        (vocabulary, added tokens, post-processor) fits the embedding and has a token, and the post-processor
        writes each special token as its own id; its vocabulary is not empty and not renumbered (each added token
        keeps the id the file declares, which no vocabulary entry has too; the vocabulary's ids have no gap);
        every special id the config, the stop ids and the mask setting name (named_ids: what -> id), every token
        text tokenizer_config.json names (named_texts: what -> text) and every special token the template writes
        exists, encodes to itself and decodes back
    token_id_in_json(parsed, content) -> id | None   a token's id, read from the parsed tokenizer.json

Every failure is a TokenizerError (a ValueError) saying what is wrong and what to do.
"""
import json
import re

import tokenizers

from .tokenizer import TokenizerError, guarded, post_processor_problem

PROBE = "Hello, world! 123 The quick brown fox."   # letters, digits, punctuation: any real tokenizer gives it back
SPECIAL_IN_TEMPLATE = re.compile(r"<\|[^<>|\s]{1,64}\|>")  # what a template writes as special: <|eot_id|>, <|user|>
USE_ORIGINAL = "Use the tokenizer that came with the checkpoint (download it again)."


def _library(where: str, fn, *args, **kwargs):
    """guarded() for a checkpoint's tokenizer.json at conversion: a failure says the file cannot be used."""
    return guarded(lambda exc: TokenizerError(f"{where} cannot be used: the tokenizers library fails on it "
                                              f"({type(exc).__name__}: {str(exc)[:200]}). Download the checkpoint's "
                                              "tokenizer.json again."), fn, *args, **kwargs)


def check_tokenizer(tok_text: str, where: str, vocab_size: int, named_ids: dict | None = None,
                    template: str | None = None, named_texts: dict | None = None) -> None:
    """See the module docstring. named_ids: {"bos_token_id": 128000, "stop id": 128009, ...};
    named_texts: {"tokenizer_config.json bos_token": "<|begin_of_text|>", ...}; template: the chat template the
    model will render (None: none)."""
    tok = _library(where, tokenizers.Tokenizer.from_str, tok_text)
    problem = post_processor_problem(tok)
    if problem:
        raise TokenizerError(f"{where} cannot be used: {problem}. {USE_ORIGINAL}")
    full = _library(where, tok.encode, PROBE, add_special_tokens=True).ids
    plain = _library(where, tok.encode, PROBE, add_special_tokens=False).ids
    back = _library(where, tok.decode, plain)
    vocab = _library(where, tok.get_vocab, with_added_tokens=True)
    n = max(vocab.values(), default=-1) + 1   # the highest id, not the count
    if n > vocab_size:
        raise TokenizerError(f"{where} has token ids up to {n - 1} but the model's embedding has only {vocab_size} "
                             f"rows, so some ids would have no embedding. {USE_ORIGINAL}")
    if _library(where, tok.get_vocab_size, with_added_tokens=False) == 0:
        raise TokenizerError(f"{where} has an empty vocabulary: it cannot encode text. {USE_ORIGINAL}")
    for i in full:
        if not 0 <= i < vocab_size or tok.id_to_token(i) is None:
            raise TokenizerError(f"{where} adds token id {i} around every text (its post-processor), which "
                                 f"{'no token of it has' if 0 <= i < vocab_size else 'lies past the embedding of'} "
                                 f"{vocab_size} rows). {USE_ORIGINAL}")
    if back != PROBE and back.lstrip() != PROBE:
        raise TokenizerError(f"{where} does not give back the text it encodes: {PROBE!r} comes back as {back[:80]!r} "
                             f"(an empty or damaged vocabulary). {USE_ORIGINAL}")
    parsed = json.loads(tok_text)
    _check_numbering(tok, parsed, where, vocab_size)
    _check_post_processor(tok, parsed.get("post_processor"), where)
    for what, i in (named_ids or {}).items():
        _check_id(tok, where, what, i, vocab_size)
    for what, text in (named_texts or {}).items():
        i = tok.token_to_id(text)
        if i is None:
            raise TokenizerError(f"{where} has no token {text!r}, which {what} names. {USE_ORIGINAL}")
        _check_id(tok, where, f"{what} {text!r}", i, vocab_size)
    for text in sorted(set(SPECIAL_IN_TEMPLATE.findall(template or ""))):
        i = tok.token_to_id(text)
        if i is not None:   # a token the template writes (text of no token is written as plain text)
            _check_id(tok, where, f"the chat template's {text!r}", i, vocab_size)


def _check_numbering(tok, parsed: dict, where: str, vocab_size: int) -> None:
    """Each added token keeps the id tokenizer.json declares, and the vocabulary's ids (with the added ones) run from
    0 without a gap or a duplicate: else the library renumbers the special tokens without a word."""
    added = [e for e in parsed.get("added_tokens") or [] if isinstance(e, dict)] \
        if isinstance(parsed.get("added_tokens"), list) else []
    model = parsed.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    owner = {i: k for k, i in vocab.items()} if isinstance(vocab, dict) else {}   # id -> its vocabulary entry
    for entry in added:
        if isinstance(entry.get("content"), str) and isinstance(entry.get("id"), int):
            got = tok.token_to_id(entry["content"])
            if got != entry["id"]:
                raise TokenizerError(f"{where} declares token {entry['content']!r} as id {entry['id']}, but the "
                                     f"tokenizers library numbers it {got}: its vocabulary was renumbered or edited "
                                     f"(a renamed or duplicated entry). {USE_ORIGINAL}")
            if owner.get(entry["id"], entry["content"]) != entry["content"]:
                raise TokenizerError(f"{where} declares token {entry['content']!r} as id {entry['id']}, which its "
                                     f"vocabulary gives to {owner[entry['id']]!r}: one of them was renumbered. "
                                     f"{USE_ORIGINAL}")
    if isinstance(vocab, dict) and vocab and all(isinstance(i, int) for i in vocab.values()):
        ids = list(vocab.values())
        if not 0 <= min(ids) <= max(ids) < vocab_size:
            return   # ids the embedding cannot hold: check_tokenizer refused them already, or the library drops them
        gaps = set(range(max(ids) + 1)) - set(ids) - {e.get("id") for e in added}
        if len(set(ids)) != len(ids) or gaps:
            what = f"no token has id {min(gaps)}" if gaps else "two tokens share an id"
            raise TokenizerError(f"{where} has a vocabulary that was renumbered or edited ({what}). {USE_ORIGINAL}")


def _check_post_processor(tok, processor, where: str) -> None:
    """The ids a post-processor writes for its special tokens (TemplateProcessing's special_tokens, also inside a
    Sequence) are those tokens' own ids: else every prompt starts with another token than it says."""
    if isinstance(processor, list):
        for p in processor:
            _check_post_processor(tok, p, where)
    if not isinstance(processor, dict):
        return
    _check_post_processor(tok, processor.get("processors"), where)
    specials = processor.get("special_tokens")
    for entry in specials.values() if isinstance(specials, dict) else []:
        ids, texts = (entry.get("ids"), entry.get("tokens")) if isinstance(entry, dict) else (None, None)
        if isinstance(ids, list) and isinstance(texts, list):
            for i, text in zip(ids, texts):
                if isinstance(text, str) and tok.token_to_id(text) not in (None, i):
                    raise TokenizerError(f"{where} has a post-processor that writes {text!r} as id {i}, but that token "
                                         f"is id {tok.token_to_id(text)}: every prompt would start with another "
                                         f"token than it says. {USE_ORIGINAL}")


def _check_id(tok, where: str, what: str, i: int, vocab_size: int) -> None:
    """Token id i (named by `what`) exists, encodes to itself and decodes back: a special token from its text, an
    ordinary one from its decoded text."""
    content = tok.id_to_token(i) if 0 <= i < vocab_size else None
    if content is None:
        raise TokenizerError(f"{where} has no token with id {i}, which {what} names. Fix the config or "
                             f"{USE_ORIGINAL[0].lower()}{USE_ORIGINAL[1:]}")
    special = i in tok.get_added_tokens_decoder()
    text = content if special else tok.decode([i], skip_special_tokens=False)
    ids = _library(where, tok.encode, text, add_special_tokens=False).ids
    decoded = _library(where, tok.decode, [i], skip_special_tokens=False)
    if ids != [i] or decoded != text:
        raise TokenizerError(f"{where} does not keep token {i} ({what}): {text!r} encodes to {ids[:8]} and id {i} "
                             f"decodes to {decoded[:40]!r}. The tokenizer and the config do not agree. {USE_ORIGINAL}")


def token_id_in_json(tok: dict, content: str) -> int | None:
    """The id of token `content` in a parsed tokenizer.json: an added token's, else the model vocabulary's."""
    added = tok.get("added_tokens") or []
    for t in added if isinstance(added, list) else []:
        if isinstance(t, dict) and t.get("content") == content and isinstance(t.get("id"), int):
            return t["id"]
    model = tok.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict) and isinstance(vocab.get(content), int):
        return vocab[content]
    return None
