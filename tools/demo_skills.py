"""Seeded skill questions with answers that follow from the question, for the demo model's confident regime.

    q, a = make_item(random.Random(1), "count_up", held_out=False)   # ("Count from 12 to 20.", "12, 13, ...")
    family = pick_family(rng)                                       # weighted to long, regular answers

Seven families, each split in three parts so that the answer oracle (tools/demo_oracle.py) and the eval can use
them apart:
- `draw(rng)`: the parameters (numbers, letters, names, a phrase), from anywhere in the family's range;
- `held(params)`: whether they fall in the family's HELD-OUT region (a range or a combination of things each seen
  in training, never unseen words): `make_item(..., held_out=False)` never produces it, `held_out=True` only it,
  so a held-out prompt tests generalisation (counting from 700, the 7 times table beyond 12, ...), not lookup;
- `answer(params)`: the one right reply; `ask(rng, params)`: a question, in one of many phrasings.

A presenter types their own words, so a question is composed from parts (an opening such as "Could you", a core
phrasing, a closing such as " please."), in sentence case, lower case or capitals. The hand-written prompts of
tools/demo_handwritten.json are kept out of training: `make_item` redraws any question that matches one of them
(compared without case, spaces or punctuation).

Small numbers are drawn more often than large ones: a presenter asks "Count from 3 to 7.", rarely from 614.
"""
from __future__ import annotations

import json
import os
import random
import re

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
ADJECTIVES = "red blue green small big old happy quiet bright dark warm cold brave gentle".split()
NOUNS = "cat dog bird fish horse moon star tree boat house king song rose wind".split()
# single words a presenter might ask to repeat (all trained; only adjective-noun pairs are held out)
WORDS = ("hello yes no thank you goodbye please sorry good morning night apple banana water coffee music "
         "happy birthday ok again stop go bitnet").split()
STEPS = (2, 3, 4, 5, 10, 20, 25, 50, 100)
HELD_STEP_HUNDREDS = {(2, 4), (3, 6), (5, 2), (10, 8), (4, 1), (25, 5)}  # (step, hundreds digit of the start)

OPENINGS = ["", "", "", "", "Please ", "Can you ", "Could you ", "Would you ", "Now ", "OK, ", "Hi! ", "Hey, ",
            "I'd like you to ", "I want you to ", "Go ahead and ", "Quick: ", "Try to ", "Kindly "]
CLOSINGS = ["", "", ".", ".", ".", "!", " please.", ", please.", " please", " for me.", ", thanks.", " now."]


def _number(rng: random.Random, low: int, high: int) -> int:
    """A number in [low, high]: small ones more often (a third below 30, a third below 100)."""
    r = rng.random()
    top = high if r > 0.66 else min(high, 99) if r > 0.33 else min(high, 29)
    return rng.randint(low, max(low, top))


def _join(xs) -> str:
    return ", ".join(str(x) for x in xs)


def _phrase(rng: random.Random, cores: list[str], **values) -> str:
    """An opening + a core phrasing + a closing, in sentence case (mostly), lower case or capitals. The case
    changes only the words around the values: a letter, a phrase or a name keeps its case (it says what the
    reply writes)."""
    opening, core, closing = rng.choice(OPENINGS), rng.choice(cores), rng.choice(CLOSINGS)
    text = opening + (core[0].lower() + core[1:] if opening and not core.startswith("{") else core) + closing
    if opening in ("Can you ", "Could you ", "Would you ") and text[-1] in ".!":
        text = text[:-1] + "?"
    r = rng.random()
    case = str.lower if r < 0.2 else str.upper if r < 0.23 else None
    parts = re.split(r"(\{(?:a|b|p|x)\})", text)  # odd items: the values whose case the reply copies
    parts = [x.format(**values) if k % 2 or case is None else case(x.format(**values)) for k, x in enumerate(parts)]
    text = "".join(parts)
    return text[0].upper() + text[1:] if case is None else text


# ---------------------------------------------------------------- the families
class Family:
    """A skill: draw -> params, held(params), answer(params) -> reply, ask(rng, params) -> question."""
    weight = 10

    def draw(self, rng): raise NotImplementedError
    def held(self, p) -> bool: raise NotImplementedError
    def answer(self, p) -> str: raise NotImplementedError
    def ask(self, rng, p) -> str: raise NotImplementedError


class CountUp(Family):
    # held out: every count that STARTS in 700-799 (numbers there are seen inside other counts)
    weight = 14
    CORES = ["Count from {a} to {b}", "Count {a} to {b}", "Count up from {a} to {b}", "Count from {a} up to {b}",
             "Count from {a} through {b}", "Count from {a} until {b}", "Count upwards from {a} to {b}",
             "List the numbers from {a} to {b}", "List the numbers {a} to {b}", "List all the numbers from {a} to {b}",
             "Write the numbers from {a} to {b}", "Write out the numbers {a} through {b}",
             "Give me the numbers from {a} to {b}", "Show the numbers from {a} to {b}",
             "Show me the numbers {a} to {b}", "Print the numbers from {a} to {b}", "Numbers from {a} to {b}",
             "Start at {a} and count to {b}", "Begin at {a} and count up to {b}", "Count up to {b} starting at {a}",
             "Count to {b} from {a}", "Say the numbers from {a} to {b}", "Type the numbers {a} to {b}",
             "Count {a}-{b}", "Write all numbers between {a} and {b}", "Count starting from {a} and stop at {b}"]

    def draw(self, rng):
        a = _number(rng, 0, 990)
        return a, a + rng.randint(1, 29)

    def held(self, p): return p[0] // 100 == 7
    def answer(self, p): return _join(range(p[0], p[1] + 1))
    def ask(self, rng, p): return _phrase(rng, self.CORES, a=p[0], b=p[1])


class CountDown(Family):
    # held out: counts down that START in 300-399
    weight = 11
    CORES = ["Count down from {b} to {a}", "Count backwards from {b} to {a}", "Count backward from {b} to {a}",
             "Count down {b} to {a}", "Count from {b} down to {a}", "Count from {b} to {a}",
             "List the numbers from {b} down to {a}", "Write the numbers from {b} down to {a}",
             "Count down from {b}, stop at {a}", "Countdown from {b} to {a}", "Go down from {b} to {a}",
             "Give me a countdown from {b} to {a}", "Start at {b} and count down to {a}",
             "Count backwards from {b} until {a}", "Say the numbers from {b} down to {a}",
             "Write the numbers {b} to {a} in reverse order", "Count down from {b} all the way to {a}"]

    def draw(self, rng):
        b = _number(rng, 1, 999)
        return max(0, b - rng.randint(1, 29)), b

    def held(self, p): return p[1] // 100 == 3
    def answer(self, p): return _join(range(p[1], p[0] - 1, -1))
    def ask(self, rng, p): return _phrase(rng, self.CORES, a=p[0], b=p[1])


class CountBy(Family):
    # held out: combinations (step, hundreds of the start), e.g. counting by 3s from 600-699
    weight = 11
    CORES = ["Count by {s}s from {a} to {b}", "Count from {a} to {b} in steps of {s}", "Count from {a} to {b} by {s}",
             "Skip count by {s} from {a} to {b}", "Count from {a} to {b} by {s}s", "Count in {s}s from {a} to {b}",
             "Count up by {s} from {a} to {b}", "List the numbers from {a} to {b} going up by {s}",
             "Start at {a} and add {s} each time until {b}", "Count from {a} to {b}, adding {s} each time",
             "Skip-count by {s}s from {a} to {b}", "Write every {nth} number from {a} to {b}"]

    def draw(self, rng):
        s = rng.choice(STEPS)
        a = rng.choice([0, s, _number(rng, 0, 990)])
        return s, a, a + s * rng.randint(2, 20)

    def held(self, p): return (p[0], p[1] // 100) in HELD_STEP_HUNDREDS

    def answer(self, p):
        s, a, b = p
        return _join(range(a, b + 1, s))

    def ask(self, rng, p):
        s, a, b = p
        nth = f"{s}nd" if s == 2 else f"{s}rd" if s == 3 else f"{s}th"
        return _phrase(rng, self.CORES, s=s, a=a, b=b, nth=nth)


class TimesTable(Family):
    # held out: the tables of 6, 7, 8 and 9 beyond 12 (those tables up to 12 are trained, and the others to 20)
    weight = 12
    CORES = ["Write the {n} times table up to {m}", "Show the {n} times table from 1 to {m}",
             "What is the {n} times table up to {m}", "Recite the {n} times table to {m}",
             "Multiplication table of {n} up to {m}", "Give me the {n} times table up to {n} x {m}",
             "The {n} times table, 1 to {m}", "List the multiples of {n} from {n} x 1 to {n} x {m}",
             "Write out the {n} times table to {m}", "Times table for {n} up to {m}",
             "Show me {n} x 1 to {n} x {m}", "Multiply {n} by 1 to {m}", "Do the {n} times table up to {m}"]

    def draw(self, rng):
        return rng.randint(1, 20), rng.choice([5, 10, 10, 12, 12, rng.randint(2, 20)])

    def held(self, p): return p[0] in (6, 7, 8, 9) and p[1] > 12
    def answer(self, p): return "\n".join(f"{p[0]} x {k} = {p[0] * k}" for k in range(1, p[1] + 1))
    def ask(self, rng, p): return _phrase(rng, self.CORES, n=p[0], m=p[1])


class Alphabet(Family):
    # held out: ranges that START at K or T, in either case (K and T are seen inside other ranges)
    weight = 8
    CORES = ["Write the letters from {a} to {b}", "List the alphabet from {a} to {b}", "Say the letters {a} to {b}",
             "Letters from {a} to {b}", "Give me the letters {a} through {b}", "Write the alphabet from {a} to {b}",
             "List the letters between {a} and {b}", "Go through the alphabet from {a} to {b}",
             "Recite the alphabet from {a} to {b}", "Show the letters {a} to {b}"]
    WHOLE = ["Write the alphabet", "Say the alphabet", "List all the letters of the alphabet", "Recite the alphabet",
             "Give me the whole alphabet", "What are the letters of the alphabet"]

    def draw(self, rng):
        i = rng.randrange(0, 25)
        return i, min(25, i + rng.randint(1, 25)), rng.random() < 0.3

    def held(self, p): return LETTERS[p[0]] in "KT"

    def answer(self, p):
        i, j, lower = p
        letters = LETTERS[i:j + 1]
        return _join(letters.lower() if lower else letters)

    def ask(self, rng, p):
        i, j, lower = p
        if i == 0 and j == 25:  # the whole alphabet: capitals unless asked for lower case
            return _phrase(rng, [c + ("{lc}" if lower else "") for c in self.WHOLE], lc=" in lower case")
        a, b = LETTERS[i], LETTERS[j]
        return _phrase(rng, self.CORES, a=a.lower() if lower else a, b=b.lower() if lower else b)


class DaysMonths(Family):
    # held out: days starting on Wednesday for more than a week; months starting in September for more than a year
    weight = 9
    CORES = ["List {n} {kind} starting from {x}", "Name the next {n} {kind} starting with {x}",
             "Write {n} {kind} in order, beginning with {x}", "Starting from {x}, list {n} {kind}",
             "Give me {n} {kind} starting on {x}", "Say {n} {kind} in a row, from {x}",
             "Name {n} {kind} in order from {x}", "List {n} {kind} beginning at {x}"]
    WHOLE = {"days": ["List the days of the week", "Name the days of the week", "What are the days of the week",
                      "Say the days of the week in order"],
             "months": ["List the months of the year", "Name the months of the year",
                        "What are the months of the year", "Say the months in order"]}

    def draw(self, rng):
        kind = rng.choice(["days", "months"])
        names = DAYS if kind == "days" else MONTHS
        if rng.random() < 0.1:
            return kind, 0, len(names), True
        return kind, rng.randrange(len(names)), rng.randint(2, 20), False

    def held(self, p):
        kind, i, n, _whole = p
        return (kind == "days" and i == 2 and n > 7) or (kind == "months" and i == 8 and n > 12)

    def answer(self, p):
        kind, i, n, _whole = p
        names = DAYS if kind == "days" else MONTHS
        return _join(names[(i + k) % len(names)] for k in range(n))

    def ask(self, rng, p):
        kind, i, n, whole = p
        if whole:
            return _phrase(rng, self.WHOLE[kind])
        names = DAYS if kind == "days" else MONTHS
        return _phrase(rng, self.CORES, n=n, kind=kind, x=names[i])


class Repeat(Family):
    # held out: adjective-noun combinations with (adjective index + noun index) % 7 == 0 (each word is trained)
    weight = 10
    CORES = ["Repeat \"{p}\" {n} times", "Say \"{p}\" {n} times", "Write \"{p}\" {n} times",
             "Repeat the phrase \"{p}\" {n} times", "Type \"{p}\" {n} times", "Say {p} {n} times",
             "Repeat {p} {n} times", "Write the words \"{p}\" {n} times", "Print \"{p}\" {n} times",
             "{n} times, say \"{p}\"", "Echo \"{p}\" {n} times"]

    def draw(self, rng):
        n = rng.randint(2, 12)
        if rng.random() < 0.35:
            return rng.choice(WORDS), n
        return f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}", n

    def held(self, p):
        words = p[0].split()
        if len(words) != 3:
            return False
        return (ADJECTIVES.index(words[1]) + NOUNS.index(words[2])) % 7 == 0

    def answer(self, p): return _join([p[0]] * p[1])

    def ask(self, rng, p): return _phrase(rng, self.CORES, p=p[0], n=p[1])


FAMILIES: dict[str, Family] = {"count_up": CountUp(), "count_down": CountDown(), "count_by": CountBy(),
                               "times_table": TimesTable(), "alphabet": Alphabet(), "days_months": DaysMonths(),
                               "repeat": Repeat()}

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a helpful assistant. Answer briefly.",
                  "You are a tiny demo model.", "Answer the user's request.", "You are a friendly assistant.",
                  "You are BitNet, a small language model running on a CPU.", "Be concise."]

HANDWRITTEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_handwritten.json")


def normalise(question: str) -> str:
    """Lower case, letters and digits only: two questions that differ only in case, spaces or punctuation match."""
    return re.sub(r"[^a-z0-9]", "", question.lower())


def _handwritten_keys() -> frozenset:
    if not os.path.exists(HANDWRITTEN):
        return frozenset()
    with open(HANDWRITTEN, encoding="utf-8") as f:
        return frozenset(normalise(item["prompt"]) for item in json.load(f))


KEPT_OUT = _handwritten_keys()


def pick_family(rng: random.Random) -> str:
    names = list(FAMILIES)
    return rng.choices(names, weights=[FAMILIES[n].weight for n in names])[0]


def draw_params(rng: random.Random, family: str, held_out: bool = False):
    """Parameters of `family` on the asked side of its hold-out."""
    fam = FAMILIES[family]
    while True:
        p = fam.draw(rng)
        if fam.held(p) == held_out:
            return p


def make_item(rng: random.Random, family: str, held_out: bool = False) -> tuple[str, str]:
    """(question, answer) of `family`, never a hand-written eval prompt."""
    fam = FAMILIES[family]
    while True:
        p = draw_params(rng, family, held_out)
        q = fam.ask(rng, p)
        if normalise(q) not in KEPT_OUT:
            return q, fam.answer(p)


def held_out_prompts(seed: int, per_family: int, held_out: bool = True) -> list[dict]:
    """[{family, prompt, answer}]: distinct questions, `per_family` of each family, from the held-out regions
    (or, with held_out=False, from the trained ones: fresh seeds give prompts the training may not have drawn)."""
    rng, out = random.Random(seed), []
    for fam in FAMILIES:
        seen = set()
        while len(seen) < per_family:
            q, a = make_item(rng, fam, held_out=held_out)
            if q not in seen:
                seen.add(q)
                out.append({"family": fam, "prompt": q, "answer": a})
    return out
