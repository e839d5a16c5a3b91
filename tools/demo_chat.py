"""Chat format, tokenizer and training windows of the demo model: skills (tools/demo_skills.py) and Shakespeare
(tools/demo_data.py) as user/assistant turns.

Chat format (the template in tokenizer_config.json renders exactly this; the post-processor adds BOS):

    <|begin_of_text|><|system|>SYSTEM<|eot_id|><|user|>QUESTION<|eot_id|><|assistant|>REPLY<|eot_id|><|user|>...

Role markers are special tokens, so every content is tokenized on its own (no merge across a boundary, no
leading newline in a reply) and `encode(render(messages))` equals the concatenation built here. The reply
ends with <|eot_id|> (id 2, the stop id). The system turn is optional; a quarter of the training windows
start with one, so the model reads it and carries on.

Tokenizer: byte-level BPE with every digit its own token (Digits(individual_digits=True) before ByteLevel):
numbers are spelled digit by digit, so counting and tables can generalise to numbers not seen whole.

Window (L tokens): BOS + a conversation of independent exchanges until L is full (the last one cut), so every
window reaches position L-1 and later turns learn to read past unrelated history (a second message works).
Per token two flags: `target` (next-token loss: assistant content + <|eot_id|>, and the user's Shakespeare
text, which is real text; never a skill question, whose random numbers are noise) and `maskable` (block
diffusion masks only assistant tokens, as Fast-dLLM v2's fine-tuning does: the prompt is always known).
"""
from __future__ import annotations

import random

from tools import demo_data as D
from tools import demo_skills as S

SYSTEM, USER, ASSISTANT = 4, 5, 6
SPECIALS = D.SPECIALS + ["<|system|>", "<|user|>", "<|assistant|>"]
ROLE_ID = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)

# Share of exchanges that are Shakespeare. A passage is ~3x as long as a skill answer, so 0.1 of the exchanges is
# ~25% of the tokens (0.4 was 66%, and the 700-step run of session 4 learnt no skill with the 34% left).
SHAKESPEARE_SHARE = 0.1
SYSTEM_SHARE = 0.25      # share of windows that start with a system turn

CONTINUE_ASKS = ["Continue this scene:\n{x}", "Continue:\n{x}", "{x}", "What comes next?\n{x}",
                 "Continue the play from here:\n{x}"]
SPEECH_ASKS = ["Write a speech for {n}.", "Give {n} a speech.", "What does {n} say?", "Write some lines for {n}."]
SCENE_ASKS = ["Write a scene from a play.", "Write some lines of Shakespeare.", "Write a short dialogue.",
              "Write a passage in the style of Shakespeare."]


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE, digits split one per token; specials at ids 0..6; the post-processor prepends BOS.
    Fails loudly if the trainer stops short of `vocab_size` (min_frequency 2 needs enough repeated pairs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"BPE reached {tok.get_vocab_size()} tokens, not the {vocab_size} asked: "
                         "train it on more text or ask for fewer")
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, s
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[D.BOS]} $A", pair=f"{SPECIALS[D.BOS]} $A {SPECIALS[D.BOS]} $B",
        special_tokens=[(SPECIALS[D.BOS], D.BOS)])
    return tok


def tokenizer_texts(train_works: dict[str, str], seed: int, n_skills: int = 40000) -> list[str]:
    """What the BPE is trained on: the training plays and seeded skill exchanges (never held-out ones)."""
    rng = random.Random(seed)
    items = [" ".join(S.make_item(rng, S.pick_family(rng))) for _ in range(n_skills)]
    return list(train_works.values()) + ["\n".join(items[i:i + 1000]) for i in range(0, len(items), 1000)]


def tokenizer_config(max_len: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[D.BOS],
        "eos_token": SPECIALS[D.EOT_ID],
        "pad_token": SPECIALS[D.EOT_TEXT],
        "mask_token": SPECIALS[D.MASK],
        "additional_special_tokens": SPECIALS[SYSTEM:],
        "add_bos_token": True,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


# ---------------------------------------------------------------- Shakespeare as chat exchanges
def paragraphs(works: dict[str, str]) -> list[list[str]]:
    """Per work, its paragraphs (speeches, stage directions) in order: text split at blank lines."""
    return [[p for p in t.split("\n\n") if p.strip()] for t in works.values()]


def _speaker(par: str) -> str | None:
    """'ROMEO.\\nBut soft...' -> 'ROMEO' (a speech: an upper-case name line ending in '.', then text)."""
    head, _, rest = par.partition("\n")
    name = head[:-1]
    if head.endswith(".") and rest and name.replace(" ", "").replace("'", "").isalpha() and name.isupper():
        return name
    return None


def _passage(pars: list[str], i: int, rng: random.Random) -> str:
    """Paragraphs from i on, until a random length of 200-900 characters is passed (at most 1,200)."""
    want, out, n = rng.randint(200, 900), [], 0
    while i < len(pars) and n < want:
        p = pars[i]
        if n + len(p) > 1200:
            if out:
                break
            p = p[:1200].rsplit("\n", 1)[0]  # one long paragraph: cut at a line end
        out.append(p)
        n, i = n + len(p) + 2, i + 1
    return "\n\n".join(out)


def shakespeare_exchange(works: list[list[str]], rng: random.Random) -> tuple[str, str]:
    """(user, assistant): continue an opening, a speech for a named speaker, or a free scene."""
    pars = rng.choice(works)
    kind = rng.random()
    if kind < 0.6:  # continue: the user gives one paragraph (or the first lines of one)
        i = rng.randrange(len(pars) - 1)
        lines = pars[i].split("\n")
        k = rng.randint(1, min(4, len(lines))) if len(lines) > 2 and rng.random() < 0.5 else len(lines)
        opening = "\n".join(lines[:k])[:600]
        rest = "\n".join(lines[k:])
        passage = _passage(([rest] if rest else []) + pars[i + 1:], 0, rng)
        return rng.choice(CONTINUE_ASKS).format(x=opening), passage
    if kind < 0.85:  # a speech for a speaker
        for _ in range(20):
            i = rng.randrange(len(pars))
            name = _speaker(pars[i])
            if name and pars[i].count("\n") >= 2:
                return rng.choice(SPEECH_ASKS).format(n=name), pars[i][:1200].rsplit("\n", 1)[0] if len(pars[i]) > 1200 else pars[i]
    i = rng.randrange(len(pars))
    return rng.choice(SCENE_ASKS), _passage(pars, i, rng)


# ---------------------------------------------------------------- windows
SHORT_ITEMS = 6  # a short skill answer (--short-share): at most this many numbers, lines or letters


class ChatWindows:
    """Random training (or held-out) windows of L tokens: BOS + exchanges; each with target / maskable flags."""

    def __init__(self, tok, works: dict[str, str], L: int, held_out: bool, shakespeare_share: float = SHAKESPEARE_SHARE,
                 family_weights: dict[str, float] | None = None, short_share: float = 0.0):
        self.tok, self.L, self.held_out, self.shakespeare_share = tok, L, held_out, shakespeare_share
        self.family_weights = family_weights  # None: the families' own weights
        self.short_share = short_share  # share of skill answers drawn with at most SHORT_ITEMS items
        self.works = [p for p in paragraphs(works) if len(p) > 10]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text.strip(), add_special_tokens=False).ids

    def turn(self, role: str, text: str, target: bool, maskable: bool):
        ids = [ROLE_ID[role]] + self.encode(text) + [D.EOT_ID]
        t = [False] + [target] * (len(ids) - 1)  # the role marker is given, never predicted
        return ids, t, [False] + [maskable] * (len(ids) - 1)

    def exchange(self, rng: random.Random):
        """One user/assistant exchange -> (ids, target, maskable)."""
        if rng.random() < self.shakespeare_share:
            q, a = shakespeare_exchange(self.works, rng)
            user = self.turn("user", q, True, False)
        else:
            short = self.short_share and rng.random() < self.short_share
            q, a = S.make_item(rng, S.pick_family(rng, self.family_weights), held_out=self.held_out,
                               max_items=SHORT_ITEMS if short else None)
            user = self.turn("user", q, False, False)
        reply = self.turn("assistant", a, True, True)
        return [u + r for u, r in zip(user, reply)]

    def window(self, rng: random.Random) -> tuple[list[int], list[bool], list[bool]]:
        ids, tgt, msk = [D.BOS], [False], [False]
        if rng.random() < SYSTEM_SHARE:
            i, t, m = self.turn("system", rng.choice(S.SYSTEM_PROMPTS), False, False)
            ids, tgt, msk = ids + i, tgt + t, msk + m
        while len(ids) < self.L:
            i, t, m = self.exchange(rng)
            ids, tgt, msk = ids + i, tgt + t, msk + m
        return ids[:self.L], tgt[:self.L], msk[:self.L]

    def batch(self, rng: random.Random, n: int):
        """-> x (n, L) long, target (n, L) bool, maskable (n, L) bool."""
        import torch  # training only: the prompt and template helpers work without it

        rows = [self.window(rng) for _ in range(n)]
        return tuple(torch.tensor([r[k] for r in rows]) for k in range(3))


def render_ids(tok, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """The ids this module builds for a conversation (BOS + turns [+ <|assistant|>]); the app's rendering of the
    chat template must give the same (checked by the smoke test and tests/test_demo_model.py)."""
    cw = ChatWindows.__new__(ChatWindows)
    cw.tok = tok
    ids = [D.BOS]
    for m in messages:
        ids += cw.turn(m["role"], m["content"], False, False)[0]
    return ids + ([ASSISTANT] if add_generation_prompt else [])
