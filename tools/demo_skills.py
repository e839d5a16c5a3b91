"""Seeded skill questions with answers that follow from the question, for the demo model's confident regime.

    q, a = make_item(random.Random(1), "count_up", held_out=False)   # ("Count from 12 to 20.", "12, 13, ...")
    family = pick_family(rng)                                       # weighted to long, regular answers

Every family has a deterministic answer format (the question fixes the answer), varied phrasings, and a
HELD-OUT region of its parameters (a range or a combination of things each seen in training, never unseen
words): `make_item(..., held_out=False)` never produces it, `held_out=True` produces only it. So a held-out
prompt tests generalisation (counting from 700, the 7 times table beyond 12, ...) rather than lookup.
Block diffusion gains most on long, regular answers, so the mix is weighted to them.
"""
from __future__ import annotations

import random

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
# words for spelling, lists and phrases: common English words (all seen in training in every family)
WORDS = ("apple bread candle dragon eagle forest garden harbor island jacket kettle lemon mountain needle orange "
         "pepper queen river silver table umbrella valley window yellow zebra anchor butter castle dinner engine "
         "feather guitar hammer insect jungle kitten ladder marble number ocean pencil rabbit saddle thunder "
         "violin wagon basket cherry doctor finger honey letter mirror planet rocket sister tiger winter summer "
         "autumn spring flower shadow bottle button carpet cotton desert garlic ginger meadow pillow puzzle").split()
ADJECTIVES = "red blue green small big old happy quiet bright dark warm cold brave gentle".split()
NOUNS = "cat dog bird fish horse moon star tree boat house king song rose wind".split()

# Public-domain passages recited verbatim: Shakespeare's Sonnet 18 and 116 (1609), and 19th-century nursery
# rhymes ("Twinkle, Twinkle, Little Star", Jane Taylor 1806; "Mary Had a Little Lamb", Sarah Josepha Hale 1830;
# "Humpty Dumpty" and "Hey Diddle Diddle", traditional, printed in the 1800s).
PASSAGES = {
    "Sonnet 18": ("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
                  "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date:\n"
                  "Sometime too hot the eye of heaven shines,\nAnd often is his gold complexion dimm'd;\n"
                  "And every fair from fair sometime declines,\nBy chance, or nature's changing course, untrimm'd;\n"
                  "But thy eternal summer shall not fade,\nNor lose possession of that fair thou ow'st;\n"
                  "Nor shall Death brag thou wander'st in his shade,\nWhen in eternal lines to time thou grow'st:\n"
                  "So long as men can breathe or eyes can see,\nSo long lives this, and this gives life to thee."),
    "Sonnet 116": ("Let me not to the marriage of true minds\nAdmit impediments. Love is not love\n"
                   "Which alters when it alteration finds,\nOr bends with the remover to remove:\n"
                   "O no! it is an ever-fixed mark\nThat looks on tempests and is never shaken;\n"
                   "It is the star to every wandering bark,\nWhose worth's unknown, although his height be taken.\n"
                   "Love's not Time's fool, though rosy lips and cheeks\nWithin his bending sickle's compass come:\n"
                   "Love alters not with his brief hours and weeks,\nBut bears it out even to the edge of doom.\n"
                   "If this be error and upon me proved,\nI never writ, nor no man ever loved."),
    "Twinkle, Twinkle, Little Star": ("Twinkle, twinkle, little star,\nHow I wonder what you are!\n"
                                      "Up above the world so high,\nLike a diamond in the sky.\n"
                                      "Twinkle, twinkle, little star,\nHow I wonder what you are!"),
    "Mary Had a Little Lamb": ("Mary had a little lamb,\nIts fleece was white as snow;\n"
                               "And everywhere that Mary went,\nThe lamb was sure to go.\n"
                               "It followed her to school one day,\nWhich was against the rule;\n"
                               "It made the children laugh and play\nTo see a lamb at school."),
    "Humpty Dumpty": ("Humpty Dumpty sat on a wall,\nHumpty Dumpty had a great fall;\n"
                      "All the king's horses and all the king's men\nCouldn't put Humpty together again."),
    "Hey Diddle Diddle": ("Hey diddle diddle,\nThe cat and the fiddle,\nThe cow jumped over the moon;\n"
                          "The little dog laughed\nTo see such sport,\nAnd the dish ran away with the spoon."),
}


def number_words(n: int) -> str:
    """0 <= n < 1,000,000 -> English words, e.g. 4382 -> 'four thousand three hundred eighty-two'."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    if n < 1000:
        return ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))
    return number_words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + number_words(n % 1000))


def _pick(rng: random.Random, held_out: bool, draw, is_held_out):
    """Draw parameters until they fall on the asked side of the hold-out (draw: () -> params)."""
    while True:
        p = draw()
        if is_held_out(*p) == held_out:
            return p


def _join(xs) -> str:
    return ", ".join(str(x) for x in xs)


# ---------------------------------------------------------------- families: rng, held_out -> (question, answer)
def count_up(rng, held_out):
    # held out: every count that STARTS in 700-799 (numbers there are seen inside other counts)
    a, n = _pick(rng, held_out, lambda: (rng.randrange(0, 1000), rng.randint(6, 40)), lambda a, n: a // 100 == 7)
    b = a + n - 1
    q = rng.choice(["Count from {a} to {b}.", "Count from {a} to {b}", "Please count from {a} to {b}.",
                    "List the numbers from {a} to {b}.", "Write the numbers {a} to {b}.",
                    "Can you count from {a} up to {b}?", "count {a} to {b}"]).format(a=a, b=b)
    return q, _join(range(a, b + 1))


def count_down(rng, held_out):
    # held out: counts down that START in 300-399
    b, n = _pick(rng, held_out, lambda: (rng.randrange(10, 1000), rng.randint(6, 40)),
                 lambda b, n: b // 100 == 3)
    a = max(0, b - n + 1)
    q = rng.choice(["Count down from {b} to {a}.", "Count backwards from {b} to {a}.",
                    "Please count down from {b} to {a}.", "List the numbers from {b} down to {a}.",
                    "count down {b} to {a}"]).format(a=a, b=b)
    return q, _join(range(b, a - 1, -1))


STEPS = (2, 3, 4, 5, 10, 25)
HELD_STEP_HUNDREDS = {(2, 4), (3, 6), (5, 2), (10, 8), (4, 1), (25, 5)}  # (step, hundreds digit of the start)


def count_by(rng, held_out):
    # held out: combinations (step, hundreds of the start), e.g. counting by 3s from 600-699
    s, a, n = _pick(rng, held_out, lambda: (rng.choice(STEPS), rng.randrange(0, 1000), rng.randint(6, 30)),
                    lambda s, a, n: (s, a // 100) in HELD_STEP_HUNDREDS)
    b = a + s * (n - 1)
    q = rng.choice(["Count by {s}s from {a} to {b}.", "Count from {a} to {b} in steps of {s}.",
                    "Count from {a} to {b} by {s}.", "List every {s}th number from {a} to {b}.",
                    "Skip count by {s} from {a} to {b}."]).format(a=a, b=b, s=s)
    if s == 2 and "th number" in q:
        q = q.replace("every 2th number", "every second number")
    elif s == 3 and "th number" in q:
        q = q.replace("every 3th number", "every third number")
    return q, _join(range(a, b + 1, s))


def times_table(rng, held_out):
    # held out: the tables of 6, 7, 8 and 9 beyond 12 (those tables up to 10 or 12 are trained, and the other
    # tables up to 15 or 20 are trained)
    n, m = _pick(rng, held_out, lambda: (rng.randint(2, 20), rng.choice([10, 10, 12, 12, 15, 20])),
                 lambda n, m: n in (6, 7, 8, 9) and m > 12)
    q = rng.choice(["Write the {n} times table up to {m}.", "Multiplication table of {n}, up to {n} x {m}.",
                    "Show the {n} times table from 1 to {m}.", "What is the {n} times table up to {m}?",
                    "Recite the {n} times table to {m}."]).format(n=n, m=m)
    return q, "\n".join(f"{n} x {k} = {n * k}" for k in range(1, m + 1))


def alphabet(rng, held_out):
    # held out: ranges that START at K or T, in either case (K and T are seen inside other ranges)
    i, n, lower = _pick(rng, held_out, lambda: (rng.randrange(0, 24), rng.randint(3, 26), rng.random() < 0.3),
                        lambda i, n, lower: LETTERS[i] in "KT")
    j = min(25, i + n - 1)
    letters = LETTERS[i:j + 1].lower() if lower else LETTERS[i:j + 1]
    a, b = letters[0], letters[-1]
    if i == 0 and j == 25:
        q = rng.choice(["Write the alphabet.", "Say the alphabet.", "List all the letters of the alphabet."])
        q = q[:-1] + " in lower case." if lower else q
    else:
        q = rng.choice(["Write the letters from {a} to {b}.", "List the alphabet from {a} to {b}.",
                        "Say the letters {a} to {b}.", "Letters from {a} to {b}, please."]).format(a=a, b=b)
    return q, _join(letters)


def days_months(rng, held_out):
    # held out: days starting on Wednesday for more than a week; months starting in September for more than a year
    kind, i, n = _pick(rng, held_out, lambda: (rng.choice(["days", "months"]), rng.randrange(12), rng.randint(3, 20)),
                       lambda kind, i, n: (kind == "days" and i % 7 == 2 and n > 7)
                       or (kind == "months" and i == 8 and n > 12))
    names = DAYS if kind == "days" else MONTHS
    i %= len(names)
    q = rng.choice(["List {n} {kind} starting from {x}.", "Name the next {n} {kind} starting with {x}.",
                    "Write {n} {kind} in order, beginning with {x}.",
                    "Starting from {x}, list {n} {kind}."]).format(n=n, kind=kind, x=names[i])
    return q, _join(names[(i + k) % len(names)] for k in range(n))


def repeat_phrase(rng, held_out):
    # held out: adjective-noun combinations with (adjective index + noun index) % 7 == 0 (each word is trained)
    ai, ni, n = _pick(rng, held_out, lambda: (rng.randrange(len(ADJECTIVES)), rng.randrange(len(NOUNS)),
                                              rng.randint(3, 12)),
                      lambda ai, ni, n: (ai + ni) % 7 == 0)
    phrase = f"the {ADJECTIVES[ai]} {NOUNS[ni]}"
    q = rng.choice(["Repeat \"{p}\" {n} times.", "Say \"{p}\" {n} times.", "Write \"{p}\" {n} times.",
                    "Please repeat the phrase \"{p}\" {n} times."]).format(p=phrase, n=n)
    return q, _join([phrase] * n)


SPELL_FORMATS = [("with dashes", "-"), ("letter by letter, separated by spaces", " "),
                 ("with commas between the letters", ", ")]


def spell(rng, held_out):
    # held out: (word, format) combinations with (word index + format index) % 3 == 0: every word is spelled
    # in training, just not in that format
    wi, fi, upper = _pick(rng, held_out, lambda: (rng.randrange(len(WORDS)), rng.randrange(3), rng.random() < 0.3),
                          lambda wi, fi, upper: (wi + fi) % 3 == 0)
    word = WORDS[wi]
    how, sep = SPELL_FORMATS[fi]
    letters = word.upper() if upper else word
    q = rng.choice(["Spell \"{w}\" {how}.", "Spell the word {w} {how}.", "How do you spell {w}? Write it {how}."])
    q = q.format(w=word, how=how + (", in capitals" if upper else ""))
    return q, sep.join(letters)


def reverse_list(rng, held_out):
    # held out: lists whose first and last words are a combination with (index sum) % 5 == 0
    def draw():
        return (tuple(rng.sample(range(len(WORDS)), rng.randint(3, 8))),)
    (idx,) = _pick(rng, held_out, draw, lambda idx: (idx[0] + idx[-1]) % 5 == 0)
    words = [WORDS[i] for i in idx]
    q = rng.choice(["Reverse this list: {l}.", "Reverse the order: {l}", "Write this list backwards: {l}.",
                    "Put these in reverse order: {l}."]).format(l=_join(words))
    return q, _join(reversed(words))


def to_words(rng, held_out):
    # held out: four-digit numbers whose hundreds digit is 5 ("five hundred" and the thousands are trained)
    (n,) = _pick(rng, held_out, lambda: (rng.choice([rng.randrange(0, 1000), rng.randrange(1000, 10000)]),),
                 lambda n: n >= 1000 and n // 100 % 10 == 5)
    shown = f"{n:,}" if n >= 1000 and rng.random() < 0.5 else str(n)
    q = rng.choice(["Write {x} in words.", "How do you say {x} in words?", "Spell out the number {x}.",
                    "{x} in words, please."]).format(x=shown)
    return q, number_words(n)


def recite(rng, held_out):
    # held out: (passage, number of lines) combinations with (passage index + lines) % 4 == 0 for a partial
    # recitation; the whole passage is always trained
    names = sorted(PASSAGES)

    def draw():
        pi = rng.randrange(len(names))
        total = PASSAGES[names[pi]].count("\n") + 1
        return pi, rng.choice([total, total, rng.randint(2, total)])
    pi, k = _pick(rng, held_out, draw,
                  lambda pi, k: k < PASSAGES[names[pi]].count("\n") + 1 and (pi + k) % 4 == 0)
    name = names[pi]
    lines = PASSAGES[name].split("\n")
    if k == len(lines):
        q = rng.choice(["Recite {x}.", "Please recite {x}.", "Say {x} for me.", "What are the words of {x}?"])
    else:
        q = rng.choice(["Recite the first {k} lines of {x}.", "Give me the first {k} lines of {x}.",
                        "Say the first {k} lines of {x}."])
    return q.format(x=name, k=k), "\n".join(lines[:k])


FAMILIES = {  # name -> (generator, weight): long, regular answers weigh more
    "count_up": (count_up, 14), "count_down": (count_down, 10), "count_by": (count_by, 11),
    "times_table": (times_table, 12), "alphabet": (alphabet, 8), "days_months": (days_months, 8),
    "repeat": (repeat_phrase, 10), "spell": (spell, 7), "reverse": (reverse_list, 6), "to_words": (to_words, 6),
    "recite": (recite, 8),
}

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a helpful assistant. Answer briefly.",
                  "You are a tiny demo model.", "Answer the user's request.", "You are a friendly assistant.",
                  "You are BitNet, a small language model running on a CPU.", "Be concise."]


def pick_family(rng: random.Random) -> str:
    names = list(FAMILIES)
    return rng.choices(names, weights=[FAMILIES[n][1] for n in names])[0]


def make_item(rng: random.Random, family: str, held_out: bool = False) -> tuple[str, str]:
    return FAMILIES[family][0](rng, held_out)


def held_out_prompts(seed: int, per_family: int) -> list[dict]:
    """[{family, prompt, answer}]: distinct held-out questions, `per_family` of each family."""
    rng, out = random.Random(seed), []
    for fam in FAMILIES:
        seen = set()
        while len(seen) < per_family:
            q, a = make_item(rng, fam, held_out=True)
            if q not in seen:
                seen.add(q)
                out.append({"family": fam, "prompt": q, "answer": a})
    return out
