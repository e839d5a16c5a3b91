"""Chat messages -> prompt ids: the checkpoint's chat template, rendered in a sandbox, then tokenized.

A message is {"role": "system" | "user" | "assistant", "content": str}.

    ids = chat_prompt_ids(tokenizer, messages, template=meta.get("chat_template"))
    messages, dropped = trim_history(messages, lambda m: len(chat_prompt_ids(tok, m)), context, max_new)
    check_template_syntax(template)   # at conversion: ChatTemplateError unless Jinja can parse it

Templates come from downloaded checkpoints, so they are untrusted code: they render in Jinja's
ImmutableSandboxedEnvironment (no attribute access to internals such as `__class__`, no mutation
of the arguments) with limits on time and size (sandbox.py), and any template failure surfaces as
ChatTemplateError.

Message text is data, never markup: a user who types "<|eot_id|>" or "<|begin_of_text|>" gets those
characters tokenized as plain text; only the special tokens the template itself writes become special
ids (see chat_prompt_ids).
"""
import re

import jinja2

from .sandbox import LimitedEnvironment, render_limited
from .tokenizer import Tokenizer, check_text

RENDER_SECONDS = 2.0           # a real template renders in milliseconds
MAX_RENDER_CHARS = 1 << 16     # template text beyond 4x what the messages bring (real ones add ~100 B a turn)
_SENTINEL = "\ue000{}\ue001"   # private-use characters standing in for message i's content

# The BitNet b1.58 2B-4T template (bitnet-checkpoint.md §7): "System: ...<|eot_id|>User: ...<|eot_id|>Assistant: ".
# It holds no BOS: the tokenizer's post-processor adds <|begin_of_text|>.
BITNET_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = message['role'] | capitalize + ': '+ message['content'] | trim + '<|eot_id|>' %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"
)

# A base model (a checkpoint without a chat template, e.g. 1bitLLM's) runs as completion: the conversation is
# one document, each message's text continuing the one before (the model's replies continue the user's
# text); a system prompt has no place in it.
COMPLETION_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['content'] }}{% endif %}"
    "{% endfor %}"
)

ROLES = ("system", "user", "assistant")


class ChatTemplateError(ValueError):
    """The chat template is broken, unsafe, or rejected the messages."""


def _raise_exception(message):
    # Hugging Face templates call raise_exception("...") to reject a conversation.
    raise ChatTemplateError(f"the chat template rejected the conversation: {message}")


def _environment(max_chars: int) -> LimitedEnvironment:
    env = LimitedEnvironment(max_chars, RENDER_SECONDS, trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    return env


def check_template_syntax(template: str | None) -> None:
    """Refuse a chat template Jinja cannot parse (parsed, never run: it runs only in render_chat), so a broken
    one is refused when the checkpoint is converted rather than failing every chat later. None: no template."""
    if template is None:
        return
    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the checkpoint's chat template is not valid Jinja (line {exc.lineno}: "
                                f"{exc.message}). Fix chat_template in tokenizer_config.json (or chat_template.jinja), "
                                "or download the checkpoint again.") from None
    except RecursionError:
        raise ChatTemplateError("the checkpoint's chat template nests too deeply to be parsed. Download the "
                                "checkpoint again.") from None


def check_messages(messages) -> list[dict]:
    """Validate and copy a message list (plain dicts of str, so the template sees no foreign objects)."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content'")
        if m["role"] not in ROLES:
            raise ValueError(f"message {i} has role {m['role']!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise ValueError(f"message {i} content must be a string")
        check_text(m["content"], f"message {i} ({m['role']})")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render_chat(messages, *, template: str | None = None, add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "") -> str:
    """Render the messages with `template` (default: the BitNet template) in a sandbox."""
    messages = check_messages(messages)
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"the chat template must be text, not {type(template).__name__}; convert the "
                                "checkpoint again")
    limit = MAX_RENDER_CHARS + 4 * sum(len(m["content"]) for m in messages)
    variables = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                     bos_token=bos_token or "", eos_token=eos_token or "")
    try:
        return render_limited(_environment(limit), template or BITNET_CHAT_TEMPLATE, variables)
    except ChatTemplateError:
        raise
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"the chat template tried something the sandbox forbids: {exc}") from exc
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"the chat template cannot be rendered: {exc}") from exc
    except (ValueError, ArithmeticError, TypeError, LookupError, AttributeError, RecursionError,
            MemoryError) as exc:  # the template's own code failed (1/0, 'a' + 1, a limit of sandbox.py...)
        raise ChatTemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc


def encode_rendered(tokenizer: Tokenizer, text: str) -> list[int]:
    """Tokenize rendered chat text WITH special-token post-processing, BOS exactly once.

    The post-processor adds <|begin_of_text|>; a template that writes {{ bos_token }} itself would then
    give two, so a doubled leading BOS is collapsed to one.
    """
    ids = tokenizer.encode(text, add_special_tokens=True)
    bos = tokenizer.bos_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


def chat_prompt_ids(tokenizer: Tokenizer, messages, *, template: str | None = None,
                    add_generation_prompt: bool = True) -> list[int]:
    """The prompt ids of a conversation: special ids only where the template writes special tokens.

    When no message contains a special token's text (the usual case), the rendered text is tokenized as
    a whole. Otherwise the template is rendered once more with a placeholder for each message's content,
    which tells which special tokens the template wrote; the text between them (template text and
    message contents together, as the tokenizer would split it) is tokenized with special tokens read
    as plain text."""
    messages = check_messages(messages)
    kw = dict(template=template, add_generation_prompt=add_generation_prompt,
              bos_token=tokenizer.bos_token or "", eos_token=tokenizer.eos_token or "")
    text = render_chat(messages, **kw)
    specials = tokenizer.special_strings()
    if not any(s in m["content"] for m in messages for s in specials):
        return encode_rendered(tokenizer, text)
    pieces = _template_pieces(messages, text, kw)
    marker = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    ids, run = [], []        # run: plain text since the last template marker
    for piece, from_template in pieces:
        if not from_template:
            run.append(piece)
            continue
        at = 0
        for m in marker.finditer(piece):
            run.append(piece[at:m.start()])
            ids += tokenizer.encode_plain("".join(run)) + [tokenizer.token_id(m.group())]
            run, at = [], m.end()
        run.append(piece[at:])
    ids += tokenizer.encode_plain("".join(run))
    ids = tokenizer.add_post_processing(ids)
    bos = tokenizer.bos_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


def _template_pieces(messages: list[dict], text: str, kw: dict) -> list[tuple[str, bool]]:
    """The rendered text as [(piece, written by the template?)]: render with placeholders, then find what
    each message's content became (a template may trim or capitalize it) by rendering it alone."""
    marks = [_SENTINEL.format(i) for i in range(len(messages))]
    placeholders = [dict(m, content=marks[i]) for i, m in enumerate(messages)]
    skeleton = render_chat(placeholders, **kw)
    parts = re.split("(\ue000\\d+\ue001)", skeleton)
    pieces = []
    for part in parts:
        if part in marks:
            i = marks.index(part)
            pieces.append((_rendered_content(messages, placeholders, skeleton, i, kw), False))
        elif part:
            pieces.append((part, True))
    return pieces


def _rendered_content(messages, placeholders, skeleton: str, i: int, kw: dict) -> str:
    """Message i's content as the template writes it; its raw content when that cannot be told apart."""
    mark = _SENTINEL.format(i)
    if skeleton.count(mark) != 1:
        return messages[i]["content"]
    before, after = skeleton.split(mark)
    alone = render_chat(placeholders[:i] + [messages[i]] + placeholders[i + 1:], **kw)
    if alone.startswith(before) and alone.endswith(after) and len(alone) >= len(before) + len(after):
        return alone[len(before):len(alone) - len(after)]
    return messages[i]["content"]


def trim_history(messages, count_tokens, context: int, max_new_tokens: int) -> tuple[list[dict], int]:
    """Drop the oldest turns until count_tokens(messages) + max_new_tokens <= context.

    count_tokens: messages -> prompt length in tokens (e.g. len of chat_prompt_ids).
    A leading system message is always kept, and so is the last message (the user's question).
    Turns go in whole exchanges: a user message together with the replies that follow it, so the
    kept history still starts with a user message. Returns (kept messages, number of messages
    dropped). If even the shortest history does not fit, it is returned as is: the caller's
    generate() then raises ContextOverflow with the exact lengths.
    """
    messages = check_messages(messages)
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    body = messages[len(head):]
    dropped = 0
    while len(body) > 1 and count_tokens(head + body) + max_new_tokens > context:
        cut = 1
        while cut < len(body) - 1 and body[cut]["role"] != "user":
            cut += 1  # also drop the replies of the oldest user message
        body = body[cut:]
        dropped += cut
    return head + body, dropped
