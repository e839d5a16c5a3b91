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
phrasing, a closing such as " please."), in sentence case, lower case or capitals. The eval's prompts of
tools/demo_handwritten.json and tools/demo_typed.json are kept out of training: `make_item` redraws any question
that matches one of them (compared without case, spaces or punctuation).

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
# phrases of two to five words to repeat (a few held out by index: Repeat.held); PHRASE_WORDS: any sequence of
# them, asked in any quoting (the model learns to copy the words, whatever they are)
PHRASES = ("good morning|see you soon|thank you very much|happy new year|well done|nice to meet you|have a nice day|"
           "I am here|you are great|we can do it|let it snow|time to go|all is well|hello there|take care|"
           "see you later|good luck|never give up|keep going|rise and shine|sweet dreams|my name is Bit|"
           "I like cake|we love music|the sun is hot|dogs are fun|it is raining|just do it|no problem|"
           "good job everyone|once upon a time|carpe diem|merry christmas|happy birthday to you|"
           "stay home|drink more water|eat your vegetables|go team go|one more time|you can do it").split("|")
PHRASE_WORDS = ("I you we they he she it my your our a an the is are am was be love like want need have see "
                "hello hi goodbye bye good bad great nice happy sad night day morning evening world friend "
                "friends pizza cake tea coffee water milk bread apple banana cheese chocolate ice cream cat dog "
                "bird fish sun moon star rain snow home house school work music song dance play run walk go "
                "come stop wait yes no please thanks thank very much so all big small red blue green new old "
                "hot cold fast slow today tomorrow now here there and or not to of in on up down").split()
STEPS = (2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 25, 50, 100)  # 6-9: adding them is what a table beyond 12 needs
NO_RANGE_END = 10  # a times table asked without its range ("What is the 7 times table?") goes from 1 to 10
HELD_STEP_HUNDREDS = {(2, 4), (3, 6), (5, 2), (10, 8), (4, 1), (25, 5)}  # (step, hundreds digit of the start)

OPENINGS = ["", "", "", "", "Please ", "Can you ", "Could you ", "Would you ", "Now ", "OK, ", "Hi! ", "Hey, ",
            "I'd like you to ", "I want you to ", "Go ahead and ", "Quick: ", "Try to ", "Kindly ", "Task: ",
            "Exercise: ", "Quick one: ", "Hello! ", "Hi there, ", "Okay so ", "Alright, ", "Next, ", "Pls ",
            "Will you ", "Could you please ", "Hey there! Can you "]
CLOSINGS = ["", "", ".", ".", ".", "!", " please.", ", please.", " please", " for me.", ", thanks.", " now.",
            ", thank you!", " thanks", " :)", ", if you can.", " for me please.", ", cheers."]
# a core that starts with "^" (a noun phrase: "Numbers 3 to 7"), "Help me", "Let's" or "I need", or ends with
# "?" (a question), stands alone: it takes only the openings that fit before any sentence, and a question keeps its question mark
STANDALONE_OPENINGS = ["", "", "", "Hi! ", "Hey, ", "OK, ", "Task: ", "Quick one: ", "Hello! ", "So, "]
QUESTION_CLOSINGS = ["?", "?", "?", "", "? Thanks.", ", please?", "? :)"]
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten",
                11: "eleven", 12: "twelve"}


def _compose(*parts: list[str]) -> list[str]:
    """Every combination of one string from each list, joined: a verb list x a range list -> core phrasings."""
    out = [""]
    for options in parts:
        out = [head + option for head in out for option in options]
    return out


def _count_text(rng: random.Random, n: int) -> str:
    """A count as a presenter types it: digits mostly, a number word (two..twelve) a quarter of the time."""
    return NUMBER_WORDS[n] if n in NUMBER_WORDS and rng.random() < 0.25 else str(n)


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
    core = rng.choice(cores)
    question = core.endswith("?")
    standalone = question or core.startswith(("^", "Help me", "Let's", "I need"))
    core = core.strip("^?")
    opening = rng.choice(STANDALONE_OPENINGS if standalone else OPENINGS)
    closing = rng.choice(QUESTION_CLOSINGS if question else CLOSINGS)
    text = opening + (core[0].lower() + core[1:] if opening and not core.startswith("{") else core) + closing
    if opening.endswith(("Can you ", "Could you ", "Would you ", "Will you ", "you please ")) and text[-1] in ".!":
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
    RANGES = ["from {a} to {b}", "{a} to {b}", "{a} through {b}", "{a}-{b}", "from {a} until {b}",
              "between {a} and {b}, both included", "starting at {a} and ending at {b}",
              "beginning with {a}, finishing at {b}", "from {a} up to {b}", "from {a} to {b} inclusive"]
    CORES = CORES + _compose(["List the numbers ", "Write the numbers ", "Give me the numbers ", "Show me the numbers ",
                              "Print the numbers ", "Say the numbers ", "Tell me the numbers ", "Name the numbers ",
                              "Recite the numbers ", "Go through the numbers ", "Run through the numbers ",
                              "Write out every number ", "Count ", "Count up ", "Count forwards ",
                              "Help me count ", "Let's count "], RANGES) + _compose(
        ["What are the numbers ", "What numbers come ", "Which numbers are there "], ["from {a} to {b}?", "{a} to {b}?",
                                                                                     "between {a} and {b}?"]) + [
        "^Numbers {a} to {b}", "^Numbers {a}-{b}", "^A count from {a} to {b}", "^The numbers from {a} to {b}, in order",
        "^Counting from {a} to {b}", "I need the numbers from {a} to {b}", "I need a count from {a} to {b}",
        "^From {a} to {b}, every number", "Starting at {a}, count up to and including {b}",
        "Count up from {a}, stopping at {b}", "Just count {a} to {b}", "Count from {a} to {b}, one number at a time"]

    # a count from 1 may be asked without its start ("Count to 15": 1 to 15, the oracle's reading)
    NO_START = _compose(["Count ", "Count up ", "Count all the way ", "Help me count ", "Let's count ",
                         "Just count ", "Start at 1 and count "], ["to {b}", "up to {b}", "until {b}"]) + _compose(
        ["List the numbers ", "Write the numbers ", "Give me the numbers ", "Show me the numbers ",
         "Print the numbers ", "Say the numbers ", "Write out the numbers ", "Write all the numbers "],
        ["up to {b}", "to {b}", "1 to {b}", "from 1 to {b}", "one to {b}", "until {b}"]) + [
        "Can you count to {b}?", "How high can you count? Go to {b}", "^Numbers up to {b}", "^1 to {b}",
        "^One to {b}, every number", "I need a count to {b}", "Count to {b}, one number at a time",
        "What are the numbers up to {b}?", "Count from one to {b}", "Count 1 to {b}"]

    def draw(self, rng):
        r = rng.random()
        if r < 0.2:  # from 1, up to 100 numbers (a presenter's "Count to 15", "Count from 1 to 50")
            return 1, rng.choice([rng.randint(2, 30), rng.randint(2, 100), 10 * rng.randint(1, 10)])
        if r < 0.3:  # a long count: 30 to 100 numbers, its reply within the context (about 420 tokens)
            a = _number(rng, 0, 990)
            return a, a + rng.randint(29, 99 if a < 100 else 80)
        a = _number(rng, 0, 990)
        return a, a + rng.randint(1, 29)

    # held out: every count that STARTS in 700-799, and counts from 1 that END in 81-89
    def held(self, p): return p[0] // 100 == 7 or (p[0] == 1 and 81 <= p[1] <= 89)
    def answer(self, p): return _join(range(p[0], p[1] + 1))

    def ask(self, rng, p):
        cores = self.NO_START if p[0] == 1 and rng.random() < 0.5 else self.CORES
        return _phrase(rng, cores, a=p[0], b=p[1])


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
    CORES = CORES + _compose(["Count down ", "Count backwards ", "Count backward ", "Count down slowly ",
                              "Go backwards ", "Do a countdown ", "Help me count down ", "Let's count down ",
                              "List the numbers in reverse ", "Write the numbers backwards ",
                              "Say the numbers in descending order ", "Give me a countdown "],
                             ["from {b} to {a}", "{b} to {a}", "from {b} until {a}", "{b}-{a}",
                              "starting at {b} and ending at {a}", "from {b} down to {a}"]) + _compose(
        ["List ", "Write ", "Print ", "Say ", "Show me ", "Give me ", "Recite "],
        ["the numbers from {a} to {b} in reverse order", "the numbers {a} to {b} backwards",
         "the numbers from {a} to {b} in descending order", "the numbers between {a} and {b}, counting down",
         "{b} down to {a}"]) + [
        "^A countdown from {b} to {a}", "^Countdown: {b} to {a}", "^Backwards from {b} to {a}",
        "^Numbers from {b} down to {a}", "What is the countdown from {b} to {a}?", "I need a countdown from {b} to {a}",
        "In reverse, list the numbers from {a} to {b}", "Count from {a} to {b}, but backwards",
        "Count down to {a}, starting at {b}", "Start at {b} and go down to {a}", "Reverse count from {b} to {a}"]

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
    STEP = ["by {s}s", "by {s}", "in steps of {s}", "in {s}s", "going up by {s}", "adding {s} each time",
            "in jumps of {s}", "in increments of {s}"]
    CORES = CORES + _compose(["Count ", "Skip count ", "List the numbers ", "Write the numbers ", "Help me count ",
                              "Let's count "], STEP, [" from {a} to {b}", " from {a} up to {b}",
                                                     ", starting at {a} and ending at {b}"]) + _compose(
        ["Count from {a} to {b} ", "Go from {a} to {b} ", "Count {a} through {b} ", "Count from {a} until {b} "],
        STEP) + _compose(["Write ", "List ", "Give me ", "Say "], ["every {nth} number from {a} to {b}",
                                                                  "every {nth} number between {a} and {b}"]) + [
        "Start at {a} and count by {s}s to {b}", "Starting at {a}, go up by {s} until {b}",
        "^Numbers from {a} to {b} in steps of {s}", "^Skip counting by {s}s: {a} to {b}",
        "What are the numbers from {a} to {b} counting by {s}s?", "Skip count from {a} to {b} by {s}s"]

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
    VERBS = ["Write ", "Show ", "Give me ", "Recite ", "Print ", "Say ", "List ", "Do ", "Tell me ", "Go through ",
             "Write out "]
    CORES = CORES + _compose(VERBS, ["the {n} times table", "the {n}x table"],
                             [" up to {m}", " to {m}", " through {m}", " up to {n} x {m}", " from 1 to {m}"]) + _compose(
        VERBS, ["the multiplication table for {n}", "the multiplication table of {n}", "the table of {n}"],
        [" up to {m}", " up to {n} x {m}", " from 1 to {m}", ", {m} rows", " with {m} lines"]) + _compose(
        ["Write ", "Show me ", "Give me ", "List "], ["the first {m} rows of the {n} times table",
                                                    "{m} lines of the {n} times table",
                                                    "the first {m} multiples of {n}", "{m} rows of the {n}x table"]) + [
        "What's the {n} times table up to {m}?",
        "^The {n}x table, 1 to {m}", "^Multiplication table for {n}, up to {m}", "^{n} times table to {m}",
        "I need the {n} times table up to {m}", "Help me learn the {n} times table up to {m}",
        "Let's do the {n} times table through {m}"]

    # a table asked without its range is the table from 1 to 10 (NO_RANGE_END, the oracle's convention)
    NO_RANGE = _compose(VERBS + ["Teach me ", "Can you do ", "Read out "],
                        ["the {n} times table", "the {n}x table", "the multiplication table for {n}",
                         "the multiplication table of {n}", "the table of {n}", "the times table of {n}",
                         "the {n} times tables"]) + [
        "What is the {n} times table?", "What's the {n} times table?", "What is the {n}x table?",
        "What are the {n} times tables?", "^The {n} times table", "^{n} times table", "^Times table for {n}",
        "^Multiplication table of {n}", "^Multiplication table for {n}", "I need the {n} times table",
        "Help me learn the {n} times table", "Let's do the {n} times table", "How does the {n} times table go?",
        "Do you know the {n} times table?"]

    def draw(self, rng):
        return rng.randint(1, 20), rng.choice([5, 10, 10, 10, 12, 12, rng.randint(2, 20)])

    def held(self, p): return p[0] in (6, 7, 8, 9) and p[1] > 12
    def answer(self, p): return "\n".join(f"{p[0]} x {k} = {p[0] * k}" for k in range(1, p[1] + 1))

    def ask(self, rng, p):
        cores = self.NO_RANGE if p[1] == NO_RANGE_END and rng.random() < 0.5 else self.CORES
        return _phrase(rng, cores, n=p[0], m=p[1])


class Alphabet(Family):
    # held out: ranges that START at K or T, in either case (K and T are seen inside other ranges)
    weight = 8
    CORES = ["Write the letters from {a} to {b}", "List the alphabet from {a} to {b}", "Say the letters {a} to {b}",
             "Letters from {a} to {b}", "Give me the letters {a} through {b}", "Write the alphabet from {a} to {b}",
             "List the letters between {a} and {b}", "Go through the alphabet from {a} to {b}",
             "Recite the alphabet from {a} to {b}", "Show the letters {a} to {b}"]
    CORES = CORES + _compose(["Write ", "List ", "Say ", "Give me ", "Show me ", "Print ", "Recite ", "Tell me ",
                              "Name ", "Go through ", "Run through ", "Type "],
                             ["the letters ", "the alphabet ", "the letters of the alphabet ", "all the letters "],
                             ["from {a} to {b}", "{a} to {b}", "{a} through {b}", "{a}-{b}", "between {a} and {b}",
                              "from {a} until {b}"], ["{case}"]) + [
        "^Letters {a}-{b}{case}", "^The alphabet from {a} to {b}{case}", "^The ABC from {a} to {b}{case}",
        "What are the letters from {a} to {b}{case}?", "Which letters come between {a} and {b}, inclusive?",
        "Help me say the alphabet from {a} to {b}{case}", "Let's go through the letters {a} to {b}{case}",
        "I need the letters {a} through {b}{case}", "Write the alphabet, {a} to {b}{case}"]
    WHOLE = ["Write the alphabet", "Say the alphabet", "List all the letters of the alphabet", "Recite the alphabet",
             "Give me the whole alphabet", "What are the letters of the alphabet"]
    WHOLE = WHOLE + ["Say your ABCs", "Recite the ABC", "List every letter of the alphabet", "Write out the alphabet",
                     "Go through the whole alphabet", "Print the alphabet", "Type the full alphabet",
                     "Give me all 26 letters", "Tell me the alphabet", "Write down the ABC", "Sing the alphabet",
                     "^The whole alphabet", "What is the alphabet?", "Help me learn the alphabet", "Let's do the ABCs"]
    LOWER = [" in lower case", " in lowercase", " in small letters", ", lowercase", " using lowercase letters"]
    UPPER = ["", "", "", "", " in capitals", " in uppercase", " in capital letters", ", uppercase"]

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
        case = rng.choice(self.LOWER if lower else self.UPPER)
        if i == 0 and j == 25:  # the whole alphabet: capitals unless asked for lower case
            return _phrase(rng, [c.rstrip("?") + "{case}" + c[len(c.rstrip("?")):] for c in self.WHOLE], case=case)
        a, b = LETTERS[i], LETTERS[j]  # a range: the letters' own case says the reply's, a "{case}" only repeats it
        return _phrase(rng, self.CORES, a=a.lower() if lower else a, b=b.lower() if lower else b,
                       case=case if rng.random() < 0.3 else "")


class DaysMonths(Family):
    # held out: days starting on Wednesday for more than a week; months starting in September for more than a year
    weight = 9
    CORES = ["List {n} {kind} starting from {x}", "Name the next {n} {kind} starting with {x}",
             "Write {n} {kind} in order, beginning with {x}", "Starting from {x}, list {n} {kind}",
             "Give me {n} {kind} starting on {x}", "Say {n} {kind} in a row, from {x}",
             "Name {n} {kind} in order from {x}", "List {n} {kind} beginning at {x}"]
    CORES = CORES + _compose(["List ", "Name ", "Write ", "Give me ", "Say ", "Tell me ", "Show me ", "Print ",
                              "Write out ", "Go through ", "Help me list ", "Let's name "],
                             ["{n} {kind} starting from {x}", "{n} {kind} starting with {x}",
                              "{n} {kind} starting on {x}", "{n} {kind} in a row, from {x}",
                              "{n} consecutive {kind} from {x}", "{n} {kind} in order, beginning with {x}",
                              "the next {n} {kind}, starting with {x}", "{n} {kind} beginning at {x}"]) + [
        "Starting with {x}, name {n} {kind} in a row", "From {x}, list {n} consecutive {kind}",
        "Beginning on {x}, write {n} {kind}", "^{n} {kind} in a row, starting with {x}",
        "^{n} consecutive {kind} from {x}", "What are {n} {kind} in a row starting from {x}?",
        "I need {n} {kind} starting on {x}", "Count {n} {kind} forward from {x}"]
    WHOLE = {"days": ["List the days of the week", "Name the days of the week", "What are the days of the week",
                      "Say the days of the week in order"],
             "months": ["List the months of the year", "Name the months of the year",
                        "What are the months of the year", "Say the months in order"]}
    WHOLE = {"days": WHOLE["days"] + ["Name all the days of the week", "Go through the days of the week",
                                      "Tell me the days of the week", "^The days of the week, in order",
                                      "Recite the days of the week", "Write out the days of the week",
                                      "Which days are in a week?", "List every day of the week"],
             "months": WHOLE["months"] + ["Name all the months of the year", "Go through the months of the year",
                                          "Tell me the months of the year", "^The months of the year, in order",
                                          "Recite the months of the year", "Write out all the months",
                                          "Which months are in a year?", "List every month of the year"]}

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
        return _phrase(rng, self.CORES, n=_count_text(rng, n), kind=kind, x=names[i])


class Repeat(Family):
    # held out: adjective-noun combinations with (adjective index + noun index) % 7 == 0, PHRASES with index % 7 == 3
    # and PHRASE_WORDS sequences whose word indices sum to 3 modulo 7 (each word is trained)
    weight = 10
    CORES = ["Repeat \"{p}\" {n} times", "Say \"{p}\" {n} times", "Write \"{p}\" {n} times",
             "Repeat the phrase \"{p}\" {n} times", "Type \"{p}\" {n} times", "Say {p} {n} times",
             "Repeat {p} {n} times", "Write the words \"{p}\" {n} times", "Print \"{p}\" {n} times",
             "{n} times, say \"{p}\"", "Echo \"{p}\" {n} times"]
    # {c}: "3 times", "three times", "twice" or "thrice"; an unquoted {p} only after a verb the oracle reads
    CORES = CORES + _compose(["Repeat ", "Say ", "Write ", "Type ", "Print ", "Echo ", "Copy ", "Give me ",
                              "Write out ", "Repeat the phrase ", "Say the words ", "Type out "],
                             ["\"{p}\" {c}", "'{p}' {c}"]) + _compose(
        ["Repeat ", "Say ", "Write ", "Type ", "Print ", "Echo "], ["{p} {c}", "{p} {c} in a row"]) + [
        "{c}, say \"{p}\"", "{c}, write '{p}'", "Repeat after me {c}: \"{p}\"", "Say \"{p}\", {c}",
        "Can you repeat '{p}' {c}?", "^I want \"{p}\" written {c}", "Help me say \"{p}\" {c}",
        "Let's repeat \"{p}\" {c}", "^\"{p}\", {c}", "Repeat \"{p}\" {c}, separated by commas",
        "Echo '{p}' back {c}", "^Please say \"{p}\" {c} in a row"]
    PHRASE_CORES = _compose(["Say ", "Write ", "Repeat ", "Type ", "Print ", "Echo ", "Write out ", "Type out "],
                            ["{q} {c}", "{q} {c} in a row", "{q} {c}, separated by commas"]) + [
        "Can you say {q} {c}?", "Could you write {q} {c}?", "Repeat the phrase {q} {c}", "Say the words {q} {c}",
        "Repeat after me {c}: {q}", "I want you to say {q} {c}", "Say {q} for me {c}"]
    # unquoted, the phrase runs from the verb to the count (what the oracle reads)
    UNQUOTED_CORES = _compose(["Say ", "Write ", "Repeat ", "Type ", "Print ", "Echo "],
                              ["{q} {c}", "{q} {c} in a row", "{q} {c}, separated by commas"]) + [
        "Can you say {q} {c}?", "Could you write {q} {c}?", "Repeat the phrase {q} {c}", "Say the words {q} {c}",
        "I want you to say {q} {c}"]

    QUOTES = [("\"", "\""), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"), ("", "")]  # "", '', curly, none

    def draw(self, rng):
        n, r = rng.randint(2, 12), rng.random()
        if r < 0.08:  # a capital letter: copying any letter from the question to the reply's start
            return rng.choice(LETTERS), n
        if r < 0.28:
            return rng.choice(WORDS), n
        if r < 0.5:
            return f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}", n
        if r < 0.65:
            return rng.choice(PHRASES), n
        k = rng.choice([2, 2, 2, 3, 3, 4, 5])  # any 2-5 words: the skill is copying, not these phrases
        return " ".join(rng.choice(PHRASE_WORDS) for _ in range(k)), n

    def held(self, p):
        words = p[0].split()
        if len(words) == 3 and words[0] == "the" and words[1] in ADJECTIVES and words[2] in NOUNS:
            return (ADJECTIVES.index(words[1]) + NOUNS.index(words[2])) % 7 == 0
        if p[0] in PHRASES:
            return PHRASES.index(p[0]) % 7 == 3
        if len(words) >= 2 and all(w in PHRASE_WORDS for w in words):
            return sum(PHRASE_WORDS.index(w) for w in words) % 7 == 3
        return False

    def answer(self, p): return _join([p[0]] * p[1])

    def ask(self, rng, p):
        n = _count_text(rng, p[1])
        c = {2: "twice", 3: "thrice"}[p[1]] if p[1] in (2, 3) and rng.random() < 0.3 else n + " times"
        if " " in p[0] and rng.random() < 0.5:  # a phrase of words: in double, single, curly or no quotes
            q = rng.choice(self.QUOTES)
            core = rng.choice(self.PHRASE_CORES if q[0] else self.UNQUOTED_CORES)
            return _phrase(rng, [core.replace("{q}", q[0] + "{p}" + q[1])], p=p[0], n=n, c=c)
        return _phrase(rng, self.CORES, p=p[0], n=n, c=c)


FAMILIES: dict[str, Family] = {"count_up": CountUp(), "count_down": CountDown(), "count_by": CountBy(),
                               "times_table": TimesTable(), "alphabet": Alphabet(), "days_months": DaysMonths(),
                               "repeat": Repeat()}

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a helpful assistant. Answer briefly.",
                  "You are a tiny demo model.", "Answer the user's request.", "You are a friendly assistant.",
                  "You are BitNet, a small language model running on a CPU.", "Be concise."]

HANDWRITTEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_handwritten.json")
# 40 phrasings a person types (issue 46's seven among them): counts without a start, long counts, times tables
# without a range, phrases of several words in any quoting, and a few of every other family
TYPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_typed.json")


def normalise(question: str) -> str:
    """Lower case, letters and digits only: two questions that differ only in case, spaces or punctuation match."""
    return re.sub(r"[^a-z0-9]", "", question.lower())


def _kept_out_keys() -> frozenset:
    """The normalised prompts of the eval's own sets (hand-written, typed): never asked in training."""
    keys = set()
    for path in (HANDWRITTEN, TYPED):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                keys |= {normalise(item["prompt"]) for item in json.load(f)}
    return frozenset(keys)


KEPT_OUT = _kept_out_keys()


def pick_family(rng: random.Random, weights: dict[str, float] | None = None) -> str:
    """A family name, drawn by the families' own weights, or by `weights` where it names a family (training
    phases that drill the families the model gets wrong)."""
    names = list(FAMILIES)
    weights = weights or {}
    return rng.choices(names, weights=[weights.get(n, FAMILIES[n].weight) for n in names])[0]


def draw_params(rng: random.Random, family: str, held_out: bool = False):
    """Parameters of `family` on the asked side of its hold-out."""
    fam = FAMILIES[family]
    while True:
        p = fam.draw(rng)
        if fam.held(p) == held_out:
            return p


def answer_items(answer: str) -> int:
    """How many items a reply lists (numbers, lines, letters, words): where a range has to end."""
    return len(re.split(r", |\n", answer))


def make_item(rng: random.Random, family: str, held_out: bool = False,
              max_items: int | None = None) -> tuple[str, str]:
    """(question, answer) of `family`, never a hand-written eval prompt; with max_items, only answers of at most
    that many items (a training drill of where ranges end: a short answer puts a stop decision every few tokens)."""
    fam = FAMILIES[family]
    while True:
        p = draw_params(rng, family, held_out)
        answer = fam.answer(p)
        if max_items is not None and answer_items(answer) > max_items:
            continue
        q = fam.ask(rng, p)
        if normalise(q) not in KEPT_OUT:
            return q, answer


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
