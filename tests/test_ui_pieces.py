"""The page's pure pieces: block picture frames, stat chips, compare summary, export."""
import json

from bitnet_app.decode.events import Step
from bitnet_app.ui import block_picture, compare_view, export, stats

MASK = 99
TEXT = {1: "Hi", 2: " <b>", 3: "\n", 4: "!"}


def test_block_picture_frames_track_given_filled_and_new_slots():
    first = block_picture.frame_from_step(Step(32, (1, 2, MASK, MASK), (1,), MASK), TEXT.get)
    assert first == {"start": 32, "slots": ["Hi", " <b>", None, None], "new": [1], "given": [0]}
    second = block_picture.frame_from_step(Step(32, (1, 2, 3, MASK), (2,), MASK), TEXT.get, first)
    assert second["given"] == [0] and second["new"] == [2]
    html = block_picture.render(second, caption="step 2")
    assert html.count('class="slot mask"') == 2  # one slot + the legend
    assert 'class="slot new">↵<' in html and 'class="slot given">Hi<' in html
    slots = html.split('bp-slots">')[1].split('<div class="legend">')[0]
    assert "&lt;b&gt;" in slots and "<b>" not in slots  # token text is escaped, never markup
    assert "2/3 slots filled" in html  # the given slot is not counted as generated
    other_block = block_picture.frame_from_step(Step(64, (4, MASK), (0,), MASK), TEXT.get, second)
    assert other_block["given"] == []


def test_stat_chips_show_the_figures_of_each_mode():
    ar = {"mode": "ar", "stats": {"tokens": 12, "tok_s": 40.0, "ttft_s": 0.05, "forwards": 12,
                                  "tokens_per_forward": 1.0}, "stop_reason": "stop"}
    line = stats.text_line(ar)
    assert "12 tokens" in line and "40.0 tok/s" in line and "first token 50 ms" in line and "forwards" not in line
    diff = dict(ar, mode="diffusion", stats=dict(ar["stats"], forwards=4, tokens_per_forward=3.0))
    assert "4 forwards" in stats.text_line(diff) and "3.00 tokens/forward" in stats.text_line(diff)
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


def test_chat_text_keeps_its_line_breaks_outside_code():
    """Single newlines become Markdown hard breaks (verse and tables show line by line); code fences are untouched."""
    from bitnet_app.ui.reply import markdown_text

    assert markdown_text("8 x 1 = 8\n8 x 2 = 16") == "8 x 1 = 8  \n8 x 2 = 16"
    assert markdown_text("a\n\nb") == "a  \n  \nb"  # still a paragraph break
    code = "see:\n```\nx = 1\ny = 2\n```\nend\nnow"
    assert markdown_text(code) == "see:  \n```\nx = 1\ny = 2\n```  \nend  \nnow"
    assert markdown_text("") == "" and markdown_text("one line") == "one line"
