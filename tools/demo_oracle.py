"""The answer oracle: the one right reply to a skill prompt, read from the prompt's own words.

    expected("Could you count down from 25 to 14?")   # -> ("count_down", "25, 24, 23, ..., 14")
    expected("What is the capital of France?")        # -> None: not a skill the demo model has

It parses the text (it never sees the generator's parameters), so it also answers prompts written by hand in
phrasings the generator never uses (tools/demo_handwritten.json). Every prompt of tools/demo_skills.py gets the
generator's own answer (checked by tests/test_demo_model.py over thousands of seeded prompts of every family).
The answers are built by the families' own `answer` functions, so the two cannot drift apart.
"""
from __future__ import annotations

import re

from tools.demo_skills import DAYS, FAMILIES, LETTERS, MONTHS, NO_RANGE_END

_WORD_NUMBERS = {"twice": 2, "thrice": 3, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                 "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}


def _numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _counts(text: str) -> list[int]:
    """The numbers of a lower-case text, in digits or words: 'seven days from monday' -> [7]."""
    words = "|".join(w for w in _WORD_NUMBERS if not w.endswith("ice"))
    return [int(x) if x.isdigit() else _WORD_NUMBERS[x] for x in re.findall(rf"\d+|\b(?:{words})\b", text)]


def _times_table(t: str):
    """'the 7 times table up to 12', 'the first 10 lines of the 2 times table' -> (7, 12), (2, 10); no end: 1 to
    NO_RANGE_END (10)."""
    m = re.search(r"(\d+) times table|table (?:of|for) (\d+)|multiples of (\d+)|multiply (\d+)|(\d+) x 1\b"
                  r"|(\d+) ?x table", t)
    if m is None:
        return None
    n = int(next(g for g in m.groups() if g))
    ends = [x for x in _numbers(t[:m.start()] + " " + t[m.end():]) if x != 1]
    return "times_table", (n, ends[-1] if ends else NO_RANGE_END)


def _count_step(t: str) -> tuple[int, str] | None:
    """A count by steps: 'by 3s', 'in steps of 3', 'in 3s', 'adding 3', 'up by 3', 'every 3rd' -> (the step, the
    text without it), or None."""
    for pat in (r"\bby (\d+)s?\b(?! x)", r"steps? of (\d+)", r"\bin (\d+)s\b", r"\badd(?:ing)? (\d+)",
                r"every (\d+)(?:st|nd|rd|th)\b", r"\bjumps? of (\d+)", r"\bincrements? of (\d+)"):
        m = re.search(pat, t)
        if m:
            return int(m.group(1)), t[:m.start()] + " " + t[m.end():]
    return None


def _letters(prompt: str):
    """'letters from C to H' / 'alphabet from c to h' -> (i, j, lower); the whole alphabet -> (0, 25, lower)."""
    m = re.search(r"\b([A-Za-z])\b\s*(?i:to|through|and|until|-)\s*\b([A-Za-z])\b", prompt)
    if m:
        a, b = m.group(1), m.group(2)
        return LETTERS.index(a.upper()), LETTERS.index(b.upper()), a.islower()
    lower = bool(re.search(r"lower ?case|small letters", prompt, re.I))
    return 0, 25, lower


def _days_months(prompt: str, t: str):
    for kind, names in (("days", DAYS), ("months", MONTHS)):
        found = [(t.find(n.lower()), i) for i, n in enumerate(names) if n.lower() in t]
        if found:
            i = min(found)[1]
            nums = _counts(t)
            return "days_months", (kind, i, nums[0] if nums else len(names), not nums)
    for kind, names in (("days", DAYS), ("months", MONTHS)):
        if re.search(rf"\b{kind}\b|\b{kind[:-1]}s? of the", t):
            nums = _counts(t)
            return "days_months", (kind, 0, nums[0] if nums else len(names), not nums)
    return None


def _repeat(prompt: str, t: str):
    n = None
    m = re.search(r"(\d+) times", t)
    if m:
        n = int(m.group(1))
    else:
        for w, v in _WORD_NUMBERS.items():
            if re.search(rf"\b{w}\b(?: times)?", t):
                n = v
                break
    if n is None:
        return None
    q = (re.search(r'"([^"]+)"', prompt) or re.search("\u201c([^\u201d]+)\u201d", prompt)
         or re.search("\u2018([^\u2019]+)\u2019", prompt) or re.search(r"(?<!\w)'([^']+)'(?!\w)", prompt))  # not "I'd"
    if q:
        return "repeat", (q.group(1), n)
    m = re.search(r"\b(?:repeat|say|write|type|print|echo)\s+(?:the (?:phrase|word|words)\s+)?(.+?)\s+"
                  r"(?:\d+|twice|thrice|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\b", prompt, re.I)
    if m:
        return "repeat", (m.group(1).strip(" '"), n)
    return None


def parse(prompt: str):
    """prompt -> (family, params) in tools/demo_skills.py's terms, or None when it asks no skill of the demo."""
    t = prompt.lower()
    if re.search(r"times table|multiplication|multiples? of|\bmultiply\b|\bx \d+ to\b|\d ?x table|\btable (?:of|for) \d", t):
        return _times_table(t)
    if re.search(r"\bletters?\b|alphabet|\babcs?\b", t):
        return "alphabet", _letters(prompt)
    if re.search(r"\brepeat\b|\becho\b|\d+ times\b|\btwice\b|\bthrice\b|\b(?:" + "|".join(_WORD_NUMBERS) + r") times\b", t):
        return _repeat(prompt, t)
    dm = _days_months(prompt, t)
    if dm:
        return dm
    nums = _numbers(t)
    down = re.search(r"\bdown\b|backward|countdown|reverse|descending", t)
    if len(nums) == 1 and not down and re.search(r"\b(?:count|numbers|to|until)\b", t):
        return "count_up", (1, nums[0])  # a count without its start ("Count to 15") starts at 1
    if len(nums) < 2:
        return None
    stepped = _count_step(t)
    if stepped is not None:
        step, rest = stepped
        ends = _numbers(rest)
        if len(ends) >= 2:
            return "count_by", (step, ends[0], ends[1])
    a, b = nums[0], nums[1]
    if re.search(r"\bto \d+,? (?:starting|from|beginning)", t):  # "count up to 30 starting at 5": the end first
        a, b = b, a
    if down or a > b:
        return "count_down", (min(a, b), max(a, b))
    return "count_up", (a, b)


def expected(prompt: str) -> tuple[str, str] | None:
    """prompt -> (family, the exact right reply), or None."""
    got = parse(prompt)
    if got is None:
        return None
    family, params = got
    return family, FAMILIES[family].answer(params)
