"""Tokenizer wrapper, streaming detokenizer and chat template, on the toy Llama-3-style tokenizer of
tests/checkpoints.py (byte-level BPE, <|begin_of_text|> added by the post-processor)."""
import numpy as np
import pytest

from bitnet_app.text.chat import (BITNET_CHAT_TEMPLATE, ChatTemplateError, chat_prompt_ids, render_chat,
                             trim_history)
from bitnet_app.text.tokenizer import Tokenizer
from checkpoints import BOS, EOT, toy_tokenizer_json


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(toy_tokenizer_json(), tokenizer_config={"bos_token": BOS, "eos_token": EOT})


def byte_ids(tok, text: str) -> list[int]:
    """One id per UTF-8 byte (the byte-level alphabet), so every multi-byte character is split."""
    # GPT-2 byte -> printable character map, as the ByteLevel pre-tokenizer defines it
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    ids = [tok.token_id(chars[b]) for b in text.encode("utf-8")]
    assert None not in ids
    return ids


def stream(tok, ids, **kw):
    d = tok.detokenizer(**kw)
    pieces = [d.push(i) for i in ids]
    pieces.append(d.flush())
    return pieces, d.text


def test_encode_adds_bos_once_and_decode_round_trips(tok):
    ids = tok.encode("Hello world")
    assert ids[0] == tok.bos_id == tok.token_id(BOS)
    assert ids.count(tok.bos_id) == 1
    assert tok.encode("Hello world", add_special_tokens=False) == ids[1:]
    assert tok.decode(ids) == BOS + "Hello world"
    assert tok.decode(ids, skip_special_tokens=True) == "Hello world"
    assert tok.eos_id == tok.token_id(EOT)
    assert tok.token_id("no such token") is None


def test_detokenizer_never_emits_half_a_character(tok):
    text = "a€b🙂c日本語 Привет x"
    ids = byte_ids(tok, text)
    pieces, full = stream(tok, ids)
    assert full == text == "".join(pieces)
    assert all("\ufffd" not in p for p in pieces)
    # the pushes inside a multi-byte character emit nothing; the last byte emits the whole character
    euro = byte_ids(tok, "€")
    d = tok.detokenizer()
    assert [d.push(i) for i in euro] == ["", "", "€"]


def test_detokenizer_matches_decode_on_bpe_ids_with_specials(tok):
    rng = np.random.default_rng(0)
    text = "Café, naïve 東京 🙂 The quick brown fox"
    ids = tok.encode(text) + [tok.token_id(EOT)] + tok.encode(" こんにちは", add_special_tokens=False)
    pieces, full = stream(tok, ids)
    assert full == tok.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces)
    # any order of ids drawn from the vocabulary: the stream equals one decode of them all, except
    # that a U+FFFD only appears where the bytes really are invalid
    for _ in range(20):
        ids = [int(i) for i in rng.integers(0, tok.vocab_size, size=30)]
        _, full = stream(tok, ids)
        assert full == tok.decode(ids, skip_special_tokens=True)


def test_detokenizer_handles_ids_that_decode_to_nothing(tok):
    eot = tok.token_id(EOT)
    ids = byte_ids(tok, "é")[:1] + [eot, eot] + byte_ids(tok, "é")[1:] + [eot] + byte_ids(tok, "!")
    pieces, full = stream(tok, ids)
    assert full == "é!"
    assert "" .join(pieces) == "é!"
    _, with_specials = stream(tok, ids, skip_special_tokens=False)
    assert with_specials == tok.decode(ids)


def test_invalid_bytes_are_not_held_back_forever(tok):
    lone = byte_ids(tok, "é")[:1]  # a lead byte whose continuation never comes
    ids = lone + byte_ids(tok, "abcdef")
    pieces, full = stream(tok, ids)
    assert full == "\ufffdabcdef"
    assert sum(1 for p in pieces[:-1] if p) >= 2  # text kept flowing before the end of the stream
    pieces, full = stream(tok, byte_ids(tok, "ab") + lone)
    assert full == "ab\ufffd" and pieces[-1] == "\ufffd"  # flush releases a trailing incomplete character


MESSAGES = [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": " Hello!"},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Capital of France?"}]


def test_default_template_renders_the_bitnet_format():
    text = render_chat(MESSAGES)
    assert text == ("System: Be brief.<|eot_id|>User: Hello!<|eot_id|>Assistant: Hi.<|eot_id|>"
                    "User: Capital of France?<|eot_id|>Assistant: ")
    assert render_chat(MESSAGES, add_generation_prompt=False).endswith("France?<|eot_id|>")
    assert render_chat(MESSAGES, template=BITNET_CHAT_TEMPLATE) == text


def test_chat_ids_have_bos_exactly_once(tok):
    ids = chat_prompt_ids(tok, MESSAGES)
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids == tok.encode(render_chat(MESSAGES))
    assert tok.decode(ids).startswith(BOS + "System: Be brief.")
    # a template that writes the BOS itself still gives one BOS
    own_bos = "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    ids2 = chat_prompt_ids(tok, MESSAGES, template=own_bos)
    assert ids2[0] == tok.bos_id and ids2.count(tok.bos_id) == 1
    assert tok.decode(ids2).startswith(BOS + "system: Be brief. " + EOT)


def test_sandbox_blocks_internals_and_mutation():
    leaked = None
    try:
        leaked = render_chat(MESSAGES, template="{{ ''.__class__ }}")
    except ChatTemplateError:
        pass
    assert leaked is None or "class" not in leaked
    for evil in ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ messages.append(1) }}",
                 "{{ messages[0].update({'role': 'x'}) }}", "{{ cycler.__init__.__globals__ }}"):
        with pytest.raises(ChatTemplateError):
            render_chat(MESSAGES, template=evil)
    with pytest.raises(ChatTemplateError, match="no tools"):
        render_chat(MESSAGES, template="{{ raise_exception('no tools') }}")
    with pytest.raises(ChatTemplateError):
        render_chat(MESSAGES, template="{% for %}")


def test_bad_messages_are_rejected():
    with pytest.raises(ValueError, match="role"):
        render_chat([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError):
        render_chat([{"role": "user"}])


def test_trim_history_drops_oldest_turns_and_keeps_system_and_question(tok):
    history = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(8):
        history += [{"role": "user", "content": f"Question {i}: the quick brown fox?"},
                    {"role": "assistant", "content": f"Answer {i}: the lazy dog sleeps in the sun."}]
    history.append({"role": "user", "content": "Last question?"})
    count = lambda m: len(chat_prompt_ids(tok, m))  # noqa: E731
    full = count(history)
    kept, dropped = trim_history(history, count, context=full, max_new_tokens=0)
    assert (kept, dropped) == (history, 0)
    kept, dropped = trim_history(history, count, context=full // 2, max_new_tokens=20)
    assert count(kept) + 20 <= full // 2
    assert kept[0] == history[0] and kept[-1] == history[-1] and kept[1]["role"] == "user"
    assert dropped == len(history) - len(kept) and dropped % 2 == 0
    assert kept[1:] == history[1 + dropped:]
    # one pair more would have fitted? no: trimming stops at the first history that fits
    assert count(history[:1] + history[1 + dropped - 2:]) + 20 > full // 2
    # nothing fits: the system prompt and the question are kept, the caller reports the overflow
    kept, dropped = trim_history(history, count, context=5, max_new_tokens=20)
    assert kept == [history[0], history[-1]] and dropped == len(history) - 2
