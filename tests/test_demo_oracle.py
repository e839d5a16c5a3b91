"""The demo model's answer oracle (tools/demo_oracle.py) and its prompt sets: the oracle reads a prompt's own words
and gives the generator's answer for every prompt the generator makes, in either region; the hand-written prompts
have recorded answers the oracle agrees with, and the generator never asks one of them (they test phrasings the
model was never trained on)."""
import json
import random

import pytest

from tools import demo_skills as S
from tools.demo_oracle import expected


@pytest.mark.parametrize("family", list(S.FAMILIES))
@pytest.mark.parametrize("held_out", [False, True])
def test_the_oracle_gives_the_generators_answer(family, held_out):
    rng = random.Random(hash((family, held_out)) & 0xFFFF)
    for _ in range(1500):
        q, a = S.make_item(rng, family, held_out=held_out)
        assert expected(q) == (family, a), q


def test_the_regions_split_each_family():
    """Every family has both a trained and a held-out region, and make_item stays on the asked side."""
    rng = random.Random(3)
    for name, fam in S.FAMILIES.items():
        for held_out in (False, True):
            for _ in range(200):
                assert fam.held(S.draw_params(rng, name, held_out)) == held_out, name


def test_hand_written_prompts_have_checked_answers_and_are_kept_out_of_training():
    with open(S.HANDWRITTEN, encoding="utf-8") as f:
        items = json.load(f)
    assert len(items) >= 50 and {it["family"] for it in items} == set(S.FAMILIES)
    for it in items:
        assert expected(it["prompt"]) == (it["family"], it["answer"]), it["prompt"]
    kept_out = {S.normalise(it["prompt"]) for it in items}
    assert kept_out <= S.KEPT_OUT
    rng = random.Random(0)
    for family in S.FAMILIES:
        for _ in range(3000):
            assert S.normalise(S.make_item(rng, family)[0]) not in kept_out


def test_questions_outside_the_skills_have_no_answer():
    for q in ("What is the capital of France?", "Write a poem about the sea.", "Continue this scene:\nROMEO."):
        assert expected(q) is None, q


def test_the_oracle_reads_counts_in_words_and_single_quoted_phrases():
    """The generator writes some counts as words (two..twelve, twice, thrice) and some phrases in single quotes."""
    assert expected("Name seven days starting on Friday.") == ("days_months", S.FAMILIES["days_months"].answer(
        ("days", 4, 7, False)))
    assert expected("List twelve months from March") == ("days_months", S.FAMILIES["days_months"].answer(
        ("months", 2, 12, False)))
    assert expected("Thrice, write 'the red cat'") == ("repeat", "the red cat, the red cat, the red cat")
    assert expected("I'd like you to say 'hello' five times") == ("repeat", ", ".join(["hello"] * 5))
    assert expected("Show the 7x table up to 3") == ("times_table", "7 x 1 = 7\n7 x 2 = 14\n7 x 3 = 21")


def test_the_generator_writes_counts_in_words_sometimes():
    rng = random.Random(5)
    qs = [S.make_item(rng, f)[0].lower() for f in ("repeat", "days_months") for _ in range(400)]
    assert any(w in q for q in qs for w in (" twice", " thrice", " five ", " seven ", " twelve "))


def test_typed_prompts_have_checked_answers_and_are_kept_out_of_training():
    """tools/demo_typed.json: 40 phrasings a person types (issue 46's seven among them), with the oracle's answers
    (each read and checked by hand when written); the generator never asks one of them."""
    with open(S.TYPED, encoding="utf-8") as f:
        items = json.load(f)
    assert len(items) == 40 and len({it["prompt"] for it in items}) == 40
    for it in items:
        assert expected(it["prompt"]) == (it["family"], it["answer"]), it["prompt"]
    prompts = {it["prompt"] for it in items}
    assert {"Count to 15.", "Count from 1 to 50.", "What is the 7 times table?", "Write out the 5 times table.",
            "Say 'hello world' 3 times.", "Write 'I love pizza' twice.", "Repeat 'good night' five times."} <= prompts
    kept_out = {S.normalise(p) for p in prompts}
    assert kept_out <= S.KEPT_OUT
    rng = random.Random(1)
    for family in S.FAMILIES:
        for _ in range(3000):
            assert S.normalise(S.make_item(rng, family)[0]) not in kept_out


def test_the_oracle_reads_counts_without_a_start_tables_without_a_range_and_quoted_phrases():
    """A count without its start starts at 1; a times table without its range goes from 1 to 10 (the convention
    the generator trains); a phrase of several words is read in double, single or curly quotes, or none."""
    assert expected("Count to 4.") == ("count_up", "1, 2, 3, 4")
    assert expected("count up to 3 please") == ("count_up", "1, 2, 3")
    assert expected("What is the 3 times table?")[1].split("\n")[-1] == "3 x 10 = 30"
    for q in ("Say 'hello world' twice.", 'Say "hello world" twice.', "Say \u201chello world\u201d twice.",
              "Say \u2018hello world\u2019 twice.", "Say hello world twice."):
        assert expected(q) == ("repeat", "hello world, hello world"), q
