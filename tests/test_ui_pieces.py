"""The page's pure pieces: block picture frames, stat chips, compare summary, export."""
import json

from bitnet_app.decode.events import Step
from bitnet_app.ui import block_picture, compare_view, export, stats

MASK = 99
TEXT = {1: "Hi", 2: " <b>", 3: "\n", 4: "!"}


def test_block_picture_frames_track_given_filled_and_new_slots():
    first = block_picture.frame_from_step(Step(32, (1, 2, MASK, MASK), (1,), MASK), TEXT.get)
    assert first == {"start": 32, "block": 1, "slots": ["Hi", " <b>", None, None], "new": [1], "given": [0]}
    second = block_picture.frame_from_step(Step(32, (1, 2, 3, MASK), (2,), MASK), TEXT.get, first)
    assert second["given"] == [0] and second["new"] == [2]
    html = block_picture.render(second, caption="step 2")
    assert html.count('class="slot mask"') == 2  # one slot + the legend
    assert 'class="slot new">↵<' in html and 'class="slot given">Hi<' in html
    slots = html.split('bp-slots">')[1].split('<div class="legend">')[0]
    assert "&lt;b&gt;" in slots and "<b>" not in slots  # token text is escaped, never markup
    assert "2 of 3 places filled" in html  # the given slot is not counted as generated
    assert "Block 1 of the reply" in html and "position" not in html  # words for people, not positions
    other_block = block_picture.frame_from_step(Step(64, (4, MASK), (0,), MASK), TEXT.get, second)
    assert other_block["given"] == [] and other_block["block"] == 2


def test_a_later_blocks_first_slot_is_the_models_token_and_special_tokens_are_hidden():
    """The reply starts at position 34 (prompt_end): the prompt's tail is given; the first slot of the next block
    holds a token the model wrote (settled by the step before), so it is drawn as written, not as the prompt's; a
    special token (its text "") shows its place without its marker."""
    text = {**TEXT, 5: ""}  # 5: a special token, as ReplyView's decode(skip_special_tokens=True) gives it
    first = block_picture.frame_from_step(Step(32, (1, 2, MASK, MASK), (2,), MASK), text.get, None, 34)
    assert first["given"] == [0, 1]
    later = block_picture.frame_from_step(Step(36, (4, MASK, 5, MASK), (2,), MASK), text.get, first, 34)
    assert later["given"] == [] and later["block"] == 2
    html = block_picture.render(later)
    assert 'class="slot fill">!<' in html and 'class="slot new"></span>' in html and 'given">!' not in html
    assert "&lt;|" not in html


def test_the_words_under_a_picture_fit_the_attention_pattern():
    causal = block_picture.what_diffusion_does(32, "causal")
    block = block_picture.what_diffusion_does(32, "block")
    assert "only the text before it" in causal and "whole block" not in causal
    assert "whole block" in block
    assert "forward" not in block_picture.steps_and_forwards({"tokens": 82, "steps": 82, "forwards": 90})


def test_stat_chips_show_the_figures_of_each_mode():
    ar = {"mode": "ar", "stats": {"tokens": 12, "tok_s": 40.0, "ttft_s": 0.05, "forwards": 12,
                                  "tokens_per_forward": 1.0}, "stop_reason": "stop"}
    line = stats.text_line(ar)
    assert "12 tokens" in line and "40.0 tok/s" in line and "first token 50 ms" in line and "forwards" not in line
    diff = dict(ar, mode="diffusion", stats=dict(ar["stats"], forwards=4, tokens_per_forward=3.0, steps=3,
                                                 tokens_per_step=4.0))
    assert "4 forwards" in stats.text_line(diff) and "3 steps" in stats.text_line(diff)
    assert "4.00 tokens/step" in stats.text_line(diff)
    assert "drafts" not in stats.text_line(diff)  # none drafted: nothing to say
    exact = dict(diff, stats=dict(diff["stats"], drafted=8, kept=6, kept_share=0.75))
    assert "75% of 8 drafts kept" in stats.text_line(exact)
    assert "75% of 8 drafts kept" in export.to_markdown([dict(exact, role="assistant")], system_prompt="", model="m")
    stopped = {"mode": "ar", "stats": None, "stopped": True}
    assert "stopped by you" in stats.html_row(stopped)


def test_compare_summary():
    ar = {"content": "the cat sat", "stats": {"tok_s": 10.0, "tokens_per_forward": 1.0}}
    df = {"content": "the cat sat", "stats": {"tok_s": 25.0, "tokens_per_forward": 2.5}}
    s = compare_view.summary(ar, df)
    assert s["speedup"] == 2.5 and s["identical"] and s["diffusion_tpf"] == 2.5
    assert compare_view.why(s) == ""  # no steps, no step cost: no sentence rather than a wrong one
    s = compare_view.summary(ar, dict(df, content="the dog ran"))
    assert not s["identical"] and 0 < s["similarity"] < 1


def test_exports_hold_the_conversation_and_figures():
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello **there**", "mode": "ar", "stopped": True,
             "stats": None, "steps": [{"start": 0}]}]
    md = export.to_markdown(msgs, system_prompt="Be brief.", model="org/m")
    assert "# Chat with org/m" in md and "Be brief." in md and "Hello **there**" in md and "stopped by you" in md
    data = json.loads(export.to_json(msgs, system_prompt="Be brief.", model="org/m", settings={"mode": "ar"}))
    assert data["messages"][1]["stopped"] is True and "steps" not in data["messages"][1]
    assert data["settings"] == {"mode": "ar"}


def test_suggestions_come_from_the_model_folders_prompt_file(tmp_path):
    from bitnet_app.ui import suggestions
    model = tmp_path / "assets" / "demo-model"
    model.mkdir(parents=True)
    assert suggestions.for_folder(str(model)) == suggestions.GENERAL  # no prompt file: general questions
    skills = [f"Count from {i} to {i + 9}." for i in range(9)]
    (tmp_path / "assets" / "demo-prompts.json").write_text(json.dumps({"skills": skills, "open": ["ROMEO.\nBut"]}))
    assert suggestions.for_folder(str(model)) == [(skills[0], "skill"), (skills[3], "skill"), (skills[6], "skill"),
                                                  ("ROMEO.\nBut", "open")]  # beside the folder
    (model / "demo-prompts.json").write_text(json.dumps({"skills": [{"prompt": "Spell cat."}], "open": []}))
    assert suggestions.for_folder(str(model)) == [("Spell cat.", "skill")]  # inside the folder wins
    (model / "demo-prompts.json").write_text("{not json")
    assert suggestions.for_folder(str(model)) == suggestions.GENERAL
    checked = {"skills": [{"prompt": "Count from 3 to 7.", "answer": "3, 4, 5, 6, 7"}], "open": ["ROMEO."]}
    (tmp_path / "assets" / "demo-suggestions.json").write_text(json.dumps(checked))
    assert suggestions.for_folder(str(model)) == [("Count from 3 to 7.", "skill"), ("ROMEO.", "open")]  # it wins
    assert suggestions.button_label("ROMEO.\nBut soft") == "ROMEO. / But soft"
    assert suggestions.button_label("x" * 100, limit=10) == "x" * 9 + "…"
    scene = "Continue this scene:\nBRUTUS.\nLucius!--My gown.--Farewell now, good Messala:--\nGood night, Titinius"
    assert suggestions.button_label(scene) == "Continue this scene: / BRUTUS. (+2 lines)"  # whole lines, never cut
    many = {"skills": [{"prompt": f"Count from 1 to {n}."} for n in range(5, 12)], "open": ["A.", "B."]}
    (tmp_path / "assets" / "demo-suggestions.json").write_text(json.dumps(many))
    assert len(suggestions.for_folder(str(model))) == 9  # every checked suggestion is offered


def test_chat_text_keeps_its_line_breaks_outside_code():
    """Single newlines become Markdown hard breaks (verse and tables show line by line); code fences are untouched."""
    from bitnet_app.ui.reply import markdown_text

    assert markdown_text("8 x 1 = 8\n8 x 2 = 16") == "8 x 1 = 8  \n8 x 2 = 16"
    assert markdown_text("a\n\nb") == "a  \n  \nb"  # still a paragraph break
    code = "see:\n```\nx = 1\ny = 2\n```\nend\nnow"
    assert markdown_text(code) == "see:  \n```\nx = 1\ny = 2\n```  \nend  \nnow"
    assert markdown_text("") == "" and markdown_text("one line") == "one line"


# ---- issue 32: the presenter's page ------------------------------------------------------------------------
def test_the_compare_sentence_says_why_diffusion_won_or_lost():
    """Tokens per step against what a step costs in AR tokens, both measured: their ratio is the speed-up."""
    ar = {"content": "1 2 3", "stats": {"tokens": 100, "total_s": 0.010, "tok_s": 10_000.0}}
    won = {"content": "1 2 3", "stats": {"tokens": 100, "steps": 20, "total_s": 0.005, "tok_s": 20_000.0}}
    s = compare_view.summary(ar, won)
    assert s["tokens_per_step"] == 5.0 and abs(s["step_in_ar_tokens"] - 2.5) < 1e-9
    assert abs(s["speedup"] - s["tokens_per_step"] / s["step_in_ar_tokens"]) < 1e-9
    assert compare_view.why(s).startswith("Block diffusion was 2.00× as fast as AR: each of its steps settled 5.0 "
                                          "tokens on average, and a step took as long as 2.5 AR tokens")
    lost = {"content": "1 2 3", "stats": {"tokens": 100, "steps": 50, "total_s": 0.020, "tok_s": 5_000.0}}
    assert compare_view.why(compare_view.summary(ar, lost)).startswith("Block diffusion was slower than AR (0.50×)")


def test_timing_counts_the_fastest_run_and_the_speedup_is_the_ratio_of_the_shown_tok_s():
    from bitnet_app.ui import compare_view, timing

    ar = [{"tokens": 10, "total_s": t, "tok_s": 10 / t} for t in (0.020, 0.010, 0.040)]
    diff = [{"tokens": 10, "steps": 2, "total_s": t, "tok_s": 10 / t} for t in (0.005, 0.020, 0.008)]
    fa, fd = timing.fastest(ar), timing.fastest(diff)
    assert (fa["total_s"], fa["runs"], fa["low"], fa["high"]) == (0.010, 3, 250.0, 1000.0)
    m = timing.pair(fa, fd)
    assert m["speedup"] == fd["tok_s"] / fa["tok_s"] == 2.0  # the large figure: the ratio of the two shown
    assert m["tokens_per_step"] == 5.0 and abs(m["step_in_ar_tokens"] - 2.5) < 1e-9
    s = compare_view.summary({"stats": ar[0], "timing": fa}, {"stats": diff[0], "timing": fd}, dict(m, runs=3))
    assert s["speedup"] == 2.0 and s["runs"] == 3
    ar_chip = stats.speed_chips({"stats": ar[0], "timing": fa})[0][1]
    diff_chip = stats.speed_chips({"stats": diff[0], "timing": fd})[0][1]
    assert (ar_chip, diff_chip) == ("1,000 tok/s", "2,000 tok/s")  # 2,000 / 1,000 = the 2.00x above them
    assert timing.too_short({"total_s": 0.01}) and not timing.too_short({"total_s": 2.0}) and not timing.too_short(None)


def test_a_retimed_reply_shows_its_fastest_run_and_a_timed_one_no_speed_before():
    msg = {"mode": "ar", "stats": {"tokens": 89, "tok_s": 1020.0, "total_s": 0.087},
           "timing": {"tokens": 89, "tok_s": 10540.4, "total_s": 0.0084, "runs": 41, "low": 900.0, "high": 10540.4}}
    line = stats.text_line(msg)
    assert "10,540 tok/s" in line and "fastest of 41 runs" in line and "1,020" not in line
    waiting = stats.html_row({"mode": "ar", "stats": msg["stats"]}, note="timing it again off screen…", speed=False)
    assert "tok/s" not in waiting and "89 tokens" in waiting  # no figure until the final one


def test_a_stopped_reply_keeps_its_figures():
    """A Stop ends a reply before its Done: the figures of what it wrote come from the decoder's time measured
    around each of its events (reply.Work), not from the page's clock."""
    import time

    from bitnet_app.decode.events import Token
    from bitnet_app.ui import reply

    def slow_decoder():
        for i in range(3):
            time.sleep(0.01)
            yield Token(i, "ab")

    msg = reply.new_message("ar")
    view = reply.ReplyView(msg, model=None, show_picture=False)
    work = reply.Work()
    for ev in work.timed(slow_decoder()):
        view.apply(ev)
        time.sleep(0.05)  # the page's drawing: not the decoder's time
    view.stopped(work)
    msg["stopped"] = True
    assert msg["stats"]["tokens"] == 3 and 0.03 <= msg["stats"]["total_s"] < 0.1
    line = stats.text_line(msg)
    assert "3 tokens" in line and "tok/s" in line and "first token" in line and "stopped by you" in line


def test_beats_are_a_token_in_ar_and_a_step_with_its_tokens_in_diffusion():
    from bitnet_app.decode.events import Done, Token
    from bitnet_app.ui import reply

    tok = [Token(i, str(i)) for i in range(4)]
    done = Done({}, "stop", "0123")
    assert list(reply.beats(tok + [done], "ar")) == [[t] for t in tok] + [[done]]
    s1, s2 = Step(0, (1, MASK), (0,), MASK), Step(0, (1, 2), (1,), MASK)
    assert list(reply.beats([s1, tok[0], tok[1], s2, tok[2], done], "diffusion")) == \
        [[s1, tok[0], tok[1]], [s2, tok[2], done]]


class _Placeholder:
    """A stand-in for st.empty(): every body drawn into it, and what it shows now (None once emptied)."""

    def __init__(self):
        self.drawn, self.shown = [], None

    def markdown(self, body, **_):
        self.drawn.append(body)
        self.shown = body

    def empty(self):
        self.shown = None


def test_without_slow_motion_the_live_picture_shows_the_first_step_then_one_at_most_every_redraw_s(monkeypatch):
    """The unpaced page (the browser test watches the live picture in Slow motion, where every step is drawn): the
    first step at once, then the latest step at most every REDRAW_S, never an empty block; Done swaps the live
    picture for the finished one."""
    import re
    from types import SimpleNamespace

    from bitnet_app.decode.events import Done, Token
    from bitnet_app.ui import reply

    placeholders = []
    monkeypatch.setattr(reply, "st", SimpleNamespace(empty=lambda: placeholders.append(_Placeholder()) or
                                                     placeholders[-1]))
    clock = [100.0]
    monkeypatch.setattr(reply.time, "perf_counter", lambda: clock[0])
    msg = reply.new_message("diffusion")
    view = reply.ReplyView(msg, SimpleNamespace(decode=lambda ids, skip_special_tokens=False: TEXT[ids[0]]), prompt_tokens=32)
    picture, finished = placeholders[0], placeholders[2]
    block = [MASK] * 4
    for slot, wait in enumerate((0.0, reply.REDRAW_S / 2, reply.REDRAW_S, 0.0)):  # step 2 and 4 come too soon
        clock[0] += wait
        block[slot] = slot + 1
        view.apply(Step(32, tuple(block), (slot,), MASK))
        view.apply(Token(slot + 1, TEXT[slot + 1]))
        view.draw()
    assert [re.search(r"step (\d+)", body).group(1) for body in picture.drawn] == ["1", "3"]
    assert all(not re.search(r" 0 of \d+ places filled", body) for body in picture.drawn)  # never empty
    assert 'class="bp live"' in picture.shown and finished.shown is None
    view.apply(Done({"tokens": 4, "steps": 4, "prompt_tokens": 32}, "length", "Hi <b>\n!"))
    assert picture.shown is None and 'class="bp-final"' in finished.shown


def test_slow_motion_holds_its_rate():
    import time

    from bitnet_app.ui import reply

    pacer = reply.Pacer(20)
    t0 = time.perf_counter()
    for _ in range(10):
        pacer.wait()
    assert 0.45 <= time.perf_counter() - t0 < 0.9  # 10 beats at 20 per second
    assert not reply.Pacer(None).on


def test_the_finished_picture_tints_each_token_by_its_step_and_says_what_it_shows():
    by_step = [["8 x 1 = 8", 1], ["\n", 1], ["8 x 2", 2], [" = 16", 2], ["", 3]]
    page = block_picture.render_settled(by_step, {"tokens": 4, "steps": 2, "forwards": 4}, 32, "causal")
    assert page.count('class="tok"') == 4 and 'title="step 2"' in page and "↵" in page
    assert "Block diffusion writes 32 tokens at a time" in page  # one sentence for people who are not engineers
    assert "4 tokens took 2 steps" in page and "ran 4 times in all: once per step, and 2 more" in page
    assert "Each colour is one step" not in page and "point at a token to see its step" in page  # true for 82 steps


def test_the_picture_never_shows_ids_past_the_replys_end():
    frame = block_picture.frame_from_step(Step(32, (1, 2, 3, 4), (2, 3), MASK), TEXT.get)
    block_picture.cut_at(frame, 34)  # the reply ends at position 34: its stop token sits there
    assert frame["slots"] == ["Hi", " <b>"] and frame["new"] == []


def test_the_markdown_export_keeps_single_line_breaks():
    msgs = [{"role": "user", "content": "The 8 times table"},
            {"role": "assistant", "content": "8 x 1 = 8\n8 x 2 = 16", "mode": "ar", "stats": None}]
    assert "8 x 1 = 8  \n8 x 2 = 16" in export.to_markdown(msgs, system_prompt="", model="m")


def test_the_memory_footnote_only_comes_with_a_warned_row():
    from bitnet_app.ui import sidebar

    assert "⚠" not in sidebar.catalog_table(None, free=10**15)  # every model fits: no ⚠ row, no footnote
    tight = sidebar.catalog_table(None, free=10**9)
    assert "GB memory ⚠" in tight and "⚠: more than the 1.0 GB of memory free now" in tight


def test_the_read_roof_is_measured_again_when_the_table_opens_and_says_when():
    """The roof the table's speeds stand on: measured once for the page, then again each time the table is opened
    (sidebar._measure_again, the expander's on_change), and the table says when."""
    import time

    import streamlit as st

    from bitnet_app.ui import sidebar

    first = sidebar.read_roof(1)
    assert sidebar.read_roof(1) == first  # the page's other lines reuse it
    time.sleep(1.1)
    st.session_state[sidebar.NEEDS_KEY] = True  # opened
    st.session_state["threads"] = 1
    sidebar._measure_again()
    again = sidebar.read_roof(1)
    assert again[1] != first[1] and again[0] is not None and again[0] > 0
    table = sidebar.catalog_table(again[0], free=10**15, measured_at=again[1])
    assert f"measured at {again[1]}, when this list was opened" in table


def test_a_path_that_does_not_exist_is_not_called_a_checkpoint_folder(tmp_path):
    from bitnet_app.ui import model_choices

    missing = model_choices.resolve(model_choices.CUSTOM_LABEL, str(tmp_path / "no-such-folder"))
    assert "checkpoint folder on this computer" not in model_choices.describe(missing)
    assert "no folder or file" in model_choices.describe(missing)
    real = model_choices.resolve(model_choices.CUSTOM_LABEL, str(tmp_path))
    assert "checkpoint folder on this computer" in model_choices.describe(real)


def test_the_picker_shows_short_names_with_sizes_and_a_model_not_downloaded():
    from bitnet_app.source import DEFAULT_REPO
    from bitnet_app.ui import model_choices

    assert model_choices.picker_label(DEFAULT_REPO) == "bitnet-b1.58-2B-4T · 1.2 GB"
    assert all(len(model_choices.picker_label(r)) <= 33 for r in model_choices.choices())  # none cut off
    assert model_choices.picker_label(DEFAULT_REPO, not_downloaded=True) == "bitnet-b1.58-2B-4T · not downloaded"
    assert model_choices.picker_label(model_choices.DEMO_LABEL) == "Demo model · bundled"  # its one name
    assert model_choices.picker_label(model_choices.DEMO_LABEL, not_downloaded=True) == "Demo model · bundled"


def test_dot_venv_is_ignored():
    """The README's first step makes .venv in the checkout: git must not offer it for a commit."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, ".gitignore"), encoding="utf-8") as f:
        assert {".venv", ".venv/", "/.venv", "/.venv/"} & {line.strip() for line in f}


def test_what_a_person_typed_shows_as_typed_in_the_chat_and_the_export():
    from bitnet_app.ui import reply

    typed = "*stars* and _under_ $5 :smile: 1. not a list\n# not a heading"
    shown = reply.plain_markdown(typed)
    assert "\\*stars\\*" in shown and "\\_under\\_" in shown and "\\$5" in shown and "\\:smile\\:" in shown
    assert "1\\. not a list  \n\\# not a heading" in shown  # its line break kept, no list, no heading
    msgs = [{"role": "user", "content": typed},
            {"role": "assistant", "content": "**bold** from the model", "mode": "ar", "stats": None}]
    md = export.to_markdown(msgs, system_prompt="", model="m")
    assert "\\*stars\\*" in md and "**bold** from the model" in md  # the model's Markdown stays Markdown


def test_auto_threads_is_one_for_a_small_model_unless_bitnet_threads_says(tmp_path, monkeypatch):
    from bitnet_app.ui import loading

    small = tmp_path / "small.bitnet"
    small.write_bytes(b"\0" * 1024)
    big = tmp_path / "big.bitnet"
    with open(big, "wb") as f:
        f.truncate(loading.SMALL_MODEL_BYTES)  # sparse: no disk used
    monkeypatch.delenv("BITNET_THREADS", raising=False)
    assert loading.auto_threads(str(small)) == 1 and loading.auto_threads(str(big)) is None
    assert loading.auto_threads(str(tmp_path / "missing.bitnet")) is None
    monkeypatch.setenv("BITNET_THREADS", "2")
    assert loading.auto_threads(str(small)) is None  # the engine reads it: the user's number wins


def test_a_select_box_offers_the_checkpoints_own_number():
    """A checkpoint trained with blocks of 12 (sub-block 6 by params.default_sub_block) keeps them in the sidebar:
    its numbers join the fixed lists instead of being replaced by the first option."""
    from bitnet_app.ui import sidebar

    assert sidebar._options("block_size", 12) == (4, 8, 12, 16, 32, 64)
    assert sidebar._options("sub_block_size", 6) == (1, 2, 4, 6, 8, 16, 32, 64)
    assert sidebar._options("block_size", 32) == (4, 8, 16, 32, 64)
    assert sidebar._options("block_size", None) == (4, 8, 16, 32, 64)
    assert sidebar._options("attention", "block") == sidebar._options("attention")
