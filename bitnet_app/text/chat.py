"""Chat messages -> prompt ids: the checkpoint's chat template, rendered in a sandbox, then tokenized.

A message is {"role": "system" | "user" | "assistant", "content": str}.

    ids = chat_prompt_ids(tokenizer, messages, template=meta.get("chat_template"))
    messages, dropped = trim_history(messages, lambda m: len(chat_prompt_ids(tok, m)), context, max_new)

Templates come from downloaded checkpoints, so they are untrusted code: they render in Jinja's
ImmutableSandboxedEnvironment (no attribute access to internals such as `__class__`, no mutation
of the arguments), and any template failure surfaces as ChatTemplateError.
"""
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .tokenizer import Tokenizer

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

ROLES = ("system", "user", "assistant")


class ChatTemplateError(ValueError):
    """The chat template is broken, unsafe, or rejected the messages."""


def _raise_exception(message):
    # Hugging Face templates call raise_exception("...") to reject a conversation.
    raise ChatTemplateError(f"the chat template rejected the conversation: {message}")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    return env


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
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render_chat(messages, *, template: str | None = None, add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "") -> str:
    """Render the messages with `template` (default: the BitNet template) in a sandbox."""
    messages = check_messages(messages)
    try:
        compiled = _environment().from_string(template or BITNET_CHAT_TEMPLATE)
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token or "", eos_token=eos_token or "")
    except ChatTemplateError:
        raise
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"the chat template tried something the sandbox forbids: {exc}") from exc
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"the chat template cannot be rendered: {exc}") from exc


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
    text = render_chat(messages, template=template, add_generation_prompt=add_generation_prompt,
                       bos_token=tokenizer.bos_token or "", eos_token=tokenizer.eos_token or "")
    return encode_rendered(tokenizer, text)


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
