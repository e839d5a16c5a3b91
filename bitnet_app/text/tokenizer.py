"""Text <-> token ids, from the tokenizer.json stored in the engine file (Hugging Face `tokenizers`).

    tok = Tokenizer.from_meta(ef.meta)
    ids = tok.encode("Hello")            # [128000, ...]: the post-processor adds <|begin_of_text|>, once
    tok.decode(ids)                      # "<|begin_of_text|>Hello"
    detok = tok.detokenizer()            # streaming: push ids one at a time, get only finished text
    text = "".join(detok.push(i) for i in ids) + detok.flush()

The checks the converter runs before a tokenizer is stored are in tokenizer_checks.py.
"""
import json

import tokenizers

REPLACEMENT_CHAR = "\ufffd"  # what a byte-level decoder shows for an incomplete UTF-8 sequence
MAX_UTF8_BYTES = 4           # a character spans at most 4 bytes, so at most 4 byte-level tokens
WINDOW_MEMORY = 1 << 16      # decoded windows a Tokenizer remembers (a few MB at most), then it starts afresh


class TokenizerError(ValueError):
    """The checkpoint has no usable tokenizer."""


def guarded(failure, fn, *args, **kwargs):
    """fn(*args, **kwargs) of the Rust tokenizer, with its panics (pyo3's PanicException is a BaseException, so it
    would pass every `except Exception`) and errors turned into the TokenizerError failure(exc) returns."""
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - PanicException and the plain Exceptions of tokenizers
        raise failure(exc) from None


def _rust_call(what: str, fn, *args, **kwargs):
    """guarded(), for a tokenizer read from an engine file: a failure blames its tokenizer.json."""
    return guarded(lambda exc: TokenizerError(f"the model's tokenizer.json is broken: {what} failed "
                                              f"({type(exc).__name__}: {str(exc)[:200]}). Download the checkpoint's "
                                              "tokenizer.json again and convert it again."), fn, *args, **kwargs)


def _template_tokens(processor: dict):
    """(the special tokens a TemplateProcessing's single and pair templates write, its special_tokens map) for it
    and every processor inside a Sequence."""
    inner = processor.get("processors")
    for p in inner if isinstance(inner, list) else []:
        if isinstance(p, dict):
            yield from _template_tokens(p)
    if processor.get("type") == "TemplateProcessing":
        pieces = [p for key in ("single", "pair") for p in processor.get(key) or [] if isinstance(p, dict)]
        named = [p["SpecialToken"].get("id") for p in pieces if isinstance(p.get("SpecialToken"), dict)]
        yield named, processor.get("special_tokens") or {}


def post_processor_problem(tok) -> str | None:
    """What is wrong with a loaded tokenizer's post-processor, or None: a template that writes a special token its
    special_tokens map lacks makes the tokenizers library panic in Rust at the first encode, printing the panic to
    stderr (fd 2) before Python sees an exception; found here first, the user sees only the clear error."""
    processor = tok.post_processor
    if processor is None:
        return None
    try:
        state = json.loads(processor.__getstate__())
    except (AttributeError, TypeError, ValueError):   # a processor without a JSON state: nothing to look at
        return None
    for named, specials in _template_tokens(state if isinstance(state, dict) else {}):
        for token in named:
            if token not in specials:
                return (f"its post-processor writes the special token {token!r}, which its special_tokens list "
                        f"lacks (it lists {', '.join(repr(k) for k in list(specials)[:5]) or 'none'})")
    return None


def check_text(text, what: str = "the text") -> None:
    """ValueError unless `text` is a str that UTF-8 can encode: a prompt read from bytes that were not UTF-8 (a
    terminal in another encoding; Python keeps such bytes as lone surrogates) is the input's fault, and is said so
    here rather than blamed on the model's tokenizer."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a str, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid UTF-8: character {exc.start} ({text[exc.start]!r}) stands for a byte "
                         "that is no character (a prompt in another encoding?). Give the text as UTF-8.") from None


def _token_content(value) -> str | None:
    """tokenizer_config stores special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    def __init__(self, tokenizer_json: str, *, tokenizer_config: dict | None = None,
                 bos_id: int | None = None, eos_id: int | None = None):
        if not tokenizer_json:
            raise TokenizerError("the model file has no tokenizer (tokenizer.json was missing at conversion); "
                                 "convert a checkpoint folder that contains tokenizer.json")
        if not isinstance(tokenizer_json, str):
            raise TokenizerError("the model file's tokenizer is not text; convert the checkpoint again")
        self._json = tokenizer_json
        self._tok = _rust_call("reading it", tokenizers.Tokenizer.from_str, tokenizer_json)
        problem = post_processor_problem(self._tok)
        if problem:
            raise TokenizerError(f"the model's tokenizer.json is broken: {problem}. Download the checkpoint's "
                                 "tokenizer.json again and convert it again.")
        self._plain = None      # a copy that reads special tokens as text (encode_plain), made when needed
        self._specials = None
        self._windows: dict[tuple, str] = {}  # decode_window's memory
        cfg = tokenizer_config or {}
        self.bos_token = _token_content(cfg.get("bos_token"))
        self.eos_token = _token_content(cfg.get("eos_token"))
        if bos_id is None and self.bos_token is not None:
            bos_id = self._tok.token_to_id(self.bos_token)
        if self.bos_token is None and bos_id is not None:
            self.bos_token = self._tok.id_to_token(bos_id)
        if eos_id is None and self.eos_token is not None:
            eos_id = self._tok.token_to_id(self.eos_token)
        if self.eos_token is None and eos_id is not None:
            self.eos_token = self._tok.id_to_token(eos_id)
        self.bos_id, self.eos_id = bos_id, eos_id
        # Llama-3 tokenizers add BOS in their TemplateProcessing post-processor; if this one does not
        # but its config asks for it (add_bos_token), add it here so both routes give the same ids.
        probe = _rust_call("encoding a test text", self._tok.encode, "", add_special_tokens=True).ids
        self._add_bos_by_hand = bool(cfg.get("add_bos_token")) and bos_id is not None and bos_id not in probe
        # what the post-processor puts around a text (Llama-3: [<|begin_of_text|>] before, nothing after)
        plain = _rust_call("encoding a test text", self._tok.encode, "a", add_special_tokens=False).ids
        full = _rust_call("encoding a test text", self._tok.encode, "a", add_special_tokens=True).ids
        k = next((k for k in range(len(full) - len(plain) + 1) if full[k:k + len(plain)] == plain), 0)
        self._around = (full[:k], full[k + len(plain):])
        _rust_call("decoding a test text", self._tok.decode, full)

    @classmethod
    def from_meta(cls, meta: dict) -> "Tokenizer":
        stop_ids = meta.get("stop_ids") or []
        return cls(meta.get("tokenizer_json") or "", tokenizer_config=meta.get("tokenizer_config") or {},
                   bos_id=meta.get("bos_id"), eos_id=stop_ids[0] if stop_ids else None)

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows (added tokens included); the model's vocabulary may be larger."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        check_text(text)
        ids = _rust_call("encoding", self._tok.encode, text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens:
            ids = self._with_bos(ids)
        return ids

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self._add_bos_by_hand and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """text -> ids with special tokens' text read as plain text ("<|eot_id|>" becomes ordinary
        pieces, never the special id) and no post-processing (no BOS)."""
        check_text(text)
        if not text:
            return []
        if self._plain is None:
            plain = _rust_call("reading it", tokenizers.Tokenizer.from_str, self._json)
            plain.encode_special_tokens = True
            self._plain = plain
        return _rust_call("encoding", self._plain.encode, text, add_special_tokens=False).ids

    def add_post_processing(self, ids: list[int]) -> list[int]:
        """ids of encode_plain pieces -> what encode(..., add_special_tokens=True) adds around a text."""
        before, after = self._around
        return self._with_bos(list(before) + list(ids) + list(after))

    def special_strings(self) -> list[str]:
        """The text of every special token (what a message must not be able to forge)."""
        if self._specials is None:
            self._specials = [c for c in self.special_tokens().values() if c]
        return self._specials

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return _rust_call("decoding", self._tok.decode, [int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_window(self, ids: tuple, skip_special_tokens: bool) -> str:
        """decode() of a short window of ids, remembered: a detokenizer decodes the same windows of one to a few
        ids again and again (counts, tables, verse), and a call through the Rust binding with its checks costs
        several µs, as much per token as a demo-model diffusion step spends on its own bookkeeping."""
        key = (skip_special_tokens, ids)
        text = self._windows.get(key)
        if text is None:
            if len(self._windows) >= WINDOW_MEMORY:
                self._windows.clear()
            text = self._windows[key] = self.decode(ids, skip_special_tokens=skip_special_tokens)
        return text

    def token_id(self, token: str) -> int | None:
        """Id of one token string (e.g. "<|eot_id|>"), or None if the vocabulary lacks it."""
        return _rust_call("looking up a token", self._tok.token_to_id, token)

    def special_tokens(self) -> dict[int, str]:
        """{id: content} of the added special tokens (<|begin_of_text|>, reserved ones, ...)."""
        added = _rust_call("listing its special tokens", self._tok.get_added_tokens_decoder)
        return {int(i): t.content for i, t in added.items() if t.special}

    def id_to_token(self, token_id: int) -> str | None:
        return _rust_call("looking up a token", self._tok.id_to_token, int(token_id))

    def detokenizer(self, skip_special_tokens: bool = True) -> "IncrementalDetokenizer":
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Turns a stream of ids into a stream of finished text pieces.

    Keeps two offsets into the ids seen so far: `_prefix` (start of a small context window, so the
    decoder sees the token before the new ones, which matters for decoders that treat a leading
    space specially) and `_read` (everything before it has been emitted). Each push decodes the
    window twice: with and without the pending ids; the new text is the difference. If the new text
    ends in U+FFFD, a character is still incomplete, so nothing is emitted yet, unless more than
    MAX_UTF8_BYTES ids are pending (then the U+FFFD is real, e.g. the model produced invalid bytes).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.text = ""  # everything emitted so far

    def _decode(self, ids) -> str:
        if len(ids) <= 2 * MAX_UTF8_BYTES:  # the usual window: the id before the new ones, and those
            return self._tok.decode_window(tuple(ids), self._skip)
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def _new_text(self) -> str:
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        # Byte-level decoders keep `before` as a prefix of `after`; if a decoder rewrites it anyway,
        # emit from the same character count (the best that can be done without re-emitting).
        return after[len(before):]

    def _advance(self, piece: str) -> str:
        self._prefix, self._read = self._read, len(self._ids)
        self.text += piece
        return piece

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes ("" if none yet)."""
        self._ids.append(int(token_id))
        piece = self._new_text()
        pending = len(self._ids) - self._read
        if piece.endswith(REPLACEMENT_CHAR) and pending <= MAX_UTF8_BYTES:
            return ""  # hold back: the next id may finish the character
        if not piece and pending <= MAX_UTF8_BYTES:
            return ""  # ids that decode to nothing (skipped specials): keep them as pending context
        return self._advance(piece)

    def flush(self) -> str:
        """At the end of a stream: emit whatever is still held back (an incomplete character shows as U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        return self._advance(self._new_text())
