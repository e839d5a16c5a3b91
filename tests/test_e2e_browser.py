"""End to end in a real headless Chromium: `streamlit run app.py`, driven as a user would.

1. test_first_run_download_stream_and_stop: the loopback fake Hub serves the bundled demo model
   (assets/demo-model) as a Hub repo: first-run download with byte progress, conversion, a streamed reply
   (Slow motion on: the demo model writes faster than the eye), the health endpoint answering within a
   second while it streams, Stop (named "Stop the reply") that keeps the partial reply and its figures.
2. test_offline_first_start_detour_modes_compare_export: the default model with the Hub out of reach: the
   notice and the demo model, which the picker names (its list shows each model's download size); a detour
   through "Pick another model" and an error page (a mistyped folder) and back, with the user's settings intact
   and a normal-length reply; a diffusion reply on one of the demo model's skill prompts in Slow motion at two
   rates (several slots filled in one step, a step per 1/rate seconds), its picture still there after the reply
   ends without a click, the replay slider following the picture as it plays; the live picture never empty
   mid-reply (Slow motion at its fastest rate); Compare in Slow motion at two rates (both sides a step at a time,
   no stale suggestion among the replies); Compare on a skill prompt (the same text on both sides, the sentence
   that says why diffusion won or lost); the Markdown export (line breaks kept).

3. test_every_select_box_value_and_an_offline_hub_repo: offline mode (HF_HUB_OFFLINE=1): the notice offers no retry;
   every sidebar select box but the model's, in Block diffusion mode, through each value it offers, with no exception
   on the page, then a reply; "Pick another model" opens the model list; a Hub repo id typed there ends in the same
   notice with the server at rest (its CPU time over 3 s).

4. test_llama_family_checkpoint_from_the_hub: a generated Llama-family checkpoint (Llama3-8B-1.58's layout:
   LlamaForCausalLM with BitNet quantization, packed BitLinear weights, untied head, silu, no sub-norms, llama3
   rope scaling; tests/family_checkpoints.py) served by the loopback Hub is downloaded, converted and chatted
   with; the picker's "What each model needs here" table lists the families.

Every request the browser makes is recorded: any host other than the app's own (127.0.0.1 / localhost)
fails the test (the app works offline and sends nothing anywhere).

Screenshots of every state go to test-artifacts/e2e-*.png (look at them). To re-take the README's
screenshots (assets/screenshots/, e.g. after the demo model changes) in one command:
    E2E_SCREENSHOTS=assets/screenshots python -m pytest -q -p no:cacheprovider tests/test_e2e_browser.py

Needs Playwright (PyPI) and /usr/bin/chromium. Without them the test is skipped locally and FAILS when
CI is set. The demo model is part of the repository: without it the test fails. The skill-prompt checks
(several slots per step, identical texts in Compare) apply when the demo model comes with a prompt file
that lists skills (assets/demo-prompts.json).
"""
import contextlib
import json
import os
import re
import urllib.parse

import pytest

from app_driver import (CHROMIUM, CHROMIUM_ARGS, FRESH, WATCH_PACE, assistant_text, at_rest, choose,
                        clear_chat, click_button, click_toggle, compare, free_port, get, messages, no_exception,
                        reply_tokens, select_options, send, set_number, set_slider, sidebar_text, slider_to_min,
                        slider_value, step_period, streamlit, wait_streaming)
from bitnet_app.demo import demo_model_dir
from bitnet_app.ui import model_choices, suggestions
from fake_hub import FakeHub

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(ROOT, "test-artifacts")
SCREENSHOTS_ENV = "E2E_SCREENSHOTS"  # also copy each screenshot there, without the "e2e-" prefix
README_SHOT = {"08-diffusion-live-block": "chat"}  # ... and these under the name the README shows them by
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
REPO = "org/bitnet-demo"
OPEN_PROMPT = "ROMEO.\nBut soft, what light through yonder window breaks?"  # without a prompt file


def _require_browser():
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        msg = "browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def _log(name: str) -> str:
    os.makedirs(ARTIFACTS, exist_ok=True)
    return os.path.join(ARTIFACTS, name)


def _app_env(root, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "BITNET_APP_MODEL")}
    env.update(HF_HUB_CACHE=str(root / "hf"), BITNET_APP_CACHE=str(root / "eng"), BITNET_THREADS="1",
               STREAMLIT_BROWSER_GATHER_USAGE_STATS="false", **extra)
    return env


@pytest.fixture(scope="module")
def demo():
    folder = demo_model_dir()
    assert folder is not None, "the bundled demo model (assets/demo-model) is missing"
    with open(os.path.join(folder, "config.json")) as f:
        context = int(json.load(f)["max_position_embeddings"])
    size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    offered = suggestions.for_folder(folder)
    return {"folder": folder, "context": context, "bytes": size,
            "skills": [p for p, kind in offered if kind == "skill"],
            "open": [p for p, kind in offered if kind == "open"]}


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium; every request any of its pages makes is recorded in browser.requests."""
    _require_browser()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@contextlib.contextmanager
def _page(browser):
    """A fresh page (own context, downloads allowed); yields (page, the list of requested URLs)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    try:
        yield context.new_page(), requests
    finally:
        context.close()


def _assert_only_local(requests: list[str]) -> None:
    assert requests, "no request was recorded"
    foreign = sorted({u for u in requests if urllib.parse.urlsplit(u).hostname not in LOCAL_HOSTS
                      and not u.startswith(("data:", "blob:", "about:"))})
    assert not foreign, f"the page fetched from outside the app: {foreign}"


def _prepare_shot(page) -> None:
    """The sidebar scrolled to its top, where it names the running model; no tooltip of the last click."""
    page.evaluate("() => document.querySelectorAll('[data-testid=\"stSidebarContent\"]')"
                  ".forEach(e => e.scrollTo(0, 0))")
    page.mouse.move(1395, 450)


def _save_shot(png: bytes, name: str) -> None:
    with open(os.path.join(ARTIFACTS, f"e2e-{name}.png"), "wb") as f:
        f.write(png)
    target = os.environ.get(SCREENSHOTS_ENV)
    if target:
        os.makedirs(os.path.join(ROOT, target), exist_ok=True)
        for copy in (name, README_SHOT.get(name)):
            if copy:
                with open(os.path.join(ROOT, target, f"{copy}.png"), "wb") as f:
                    f.write(png)


def _shot(page, name: str) -> None:
    _prepare_shot(page)
    page.wait_for_timeout(300)
    _save_shot(page.screenshot(), name)


LIVE_FRAME = """() => { const msgs = document.querySelectorAll('[data-testid="stChatMessage"]');
  const last = msgs[msgs.length - 1], bp = last ? last.querySelector('.bp') : null;
  return bp && !last.querySelector('.stat-row')
    ? [bp.querySelector('.bp-head').innerText, bp.querySelectorAll('.bp-slots .slot.new').length] : null; }"""


# whether the live block picture lies wholly between the top of the window and the chat input pinned to its bottom
LIVE_IN_VIEW = """() => { const bp = document.querySelector('.bp.live');
  const box = document.querySelector('[data-testid="stBottom"]');
  if (!bp) return false;
  const r = bp.getBoundingClientRect();
  return r.top >= 0 && r.bottom <= (box ? box.getBoundingClientRect().top : window.innerHeight); }"""
# a live frame that filled n+ slots in one step, from the fifth step on (some text already written)
LIVE_MANY = f"""n => {{ const f = ({LIVE_FRAME})(), m = f ? f[0].match(/step (\\d+)$/) : null;
  return f !== null && f[1] >= n && m !== null && Number(m[1]) >= 5; }}"""


# A MutationObserver that records the live block picture of the last chat message at every change of the page:
# [ms, the reply's figures are drawn (it is done), slots, slots not masked, slots filled by this step].
WATCH_PICTURE = """() => {
  window.pictureLog = [];
  if (window.pictureWatch) window.pictureWatch.disconnect();  // one watcher at a time
  const t0 = performance.now();
  window.pictureWatch = new MutationObserver(() => {
    const msgs = document.querySelectorAll('[data-testid="stChatMessage"]');
    const last = msgs[msgs.length - 1];
    const bp = last ? last.querySelector('.bp') : null;
    if (!bp) return;
    const slots = bp.querySelectorAll('.bp-slots .slot');
    window.pictureLog.push([Math.round(performance.now() - t0), !!last.querySelector('.stat-row'), slots.length,
                            bp.querySelectorAll('.bp-slots .slot:not(.mask)').length,
                            bp.querySelectorAll('.bp-slots .slot.new').length]);
  });
  window.pictureWatch.observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def test_first_run_download_stream_and_stop(browser, demo, tmp_path):
    from playwright.sync_api import expect

    # About five seconds of download, so the byte progress is visible for a while.
    with FakeHub({REPO: demo["folder"]}, rate=max(1e5, demo["bytes"] / 5)) as hub, \
            streamlit(_app_env(tmp_path, HF_ENDPOINT=hub.url, BITNET_APP_MODEL=REPO),
                      _log("e2e-streamlit.log")) as url, \
            _page(browser) as (page, requests):
        page.goto(url)

        # 1. First run: byte progress of the download, then conversion, then the chat.
        expect(page.get_by_text(f"Downloading {REPO}")).to_be_visible(timeout=60_000)
        page.wait_for_function(r"() => /B of [\d.]+ [KMG]?B \((?!100%)\d+%\)/.test(document.body.innerText)",
                               timeout=30_000)  # bytes done of total, mid-download
        page.wait_for_timeout(1200)  # let the speed and time-left figures settle
        _shot(page, "01-first-run-download")
        expect(page.locator('[data-testid="stChatInput"] textarea')).to_be_visible(timeout=180_000)
        assert [r for r in hub.requests if r[0] == "GET" and r[1].endswith("model.safetensors")]
        assert f"Running {REPO}" in sidebar_text(page)
        _shot(page, "02-ready")

        # 2. A long reply streams token by token; the server stays responsive; controls are disabled.
        #    The demo model writes thousands of tokens per second: slow motion makes the stream watchable.
        click_toggle(page, "Slow motion")
        set_number(page, "Max new tokens", demo["context"] - 64)
        # A long reply, so that it is still streaming when Stop is pressed: greedy (the same reply every run) on a
        # play's opening, which the demo model writes on at length (219 tokens, ~9 s in slow motion; sampled, or on
        # a count, which it now ends after ~30 numbers, a reply can be over in 2 s)
        slider_to_min(page, "Temperature")
        send(page, "Continue this scene:\nKING HENRY.\nNow, lords, for France; the enterprise" if demo["skills"]
              else "KING HENRY.\nNow, lords, for France; the enterprise")
        first = wait_streaming(page, 1)
        body, took = get(url + "/_stcore/health", 5)
        assert body.strip() == "ok" and took < 1.0, f"health answered in {took:.2f} s while streaming"
        page.wait_for_timeout(600)
        later = assistant_text(page, 1)
        # Markdown may re-render the tail of a growing reply (a line becomes a list item, a `*` pair turns into
        # emphasis), so compare the opening words only, with white space folded
        head = " ".join(first.split())[:20]
        assert len(later) > len(first) and " ".join(later.split()).startswith(head), "the reply did not grow"
        expect(page.locator('[data-testid="stSidebar"] input[type="range"][aria-label="Temperature"]')).to_be_disabled()
        _shot(page, "03-streaming")

        # 3. Stop mid-reply: the partial reply stays, marked as stopped, with its figures, also after the next rerun.
        #    The button is named for what it does (Streamlit's own name is "Stop script").
        expect(page.get_by_role("button", name="Stop script")).to_have_count(0)
        page.get_by_role("button", name="Stop the reply").click()
        page.wait_for_timeout(1500)
        stopped = assistant_text(page, 1)
        assert len(stopped) >= len(later) - 5
        set_number(page, "Seed", 7)  # any widget change reruns the page
        expect(page.get_by_text("stopped by you")).to_be_visible(timeout=20_000)
        kept = assistant_text(page, 1)
        assert kept and stopped.rstrip(" ▌").startswith(kept[:20]), (kept[:60], stopped[:60])
        figures = messages(page).nth(1).locator(".stat-row").first.inner_text()
        assert re.search(r"\d+ tokens", figures) and "tok/s" in figures and "first token" in figures, figures
        _shot(page, "04-stopped-kept")
        _assert_only_local(requests)
    with open(os.path.join(ARTIFACTS, "e2e-summary.json"), "w") as f:
        json.dump({"health_s": took}, f)


def test_offline_first_start_detour_modes_compare_export(browser, demo, tmp_path):
    from playwright.sync_api import expect

    env = _app_env(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")  # the Hub out of reach
    with streamlit(env, _log("e2e-streamlit-offline.log")) as url, _page(browser) as (page, requests):
        chat_box = page.locator('[data-testid="stChatInput"] textarea')
        page.goto(url)

        # 1. First start without the Hub: the demo model opens with the notice; the sidebar names it.
        expect(page.get_by_test_id("stAlertContentWarning").filter(has_text="could not be downloaded")) \
            .to_be_visible(timeout=60_000)
        expect(chat_box).to_be_visible(timeout=60_000)
        assert f"Running {model_choices.DEMO_LABEL}" in sidebar_text(page)
        assert "1.2 GB download" not in sidebar_text(page)
        expect(page.locator('[data-testid="stToast"]')).to_have_count(0)  # nothing covers the notice
        picker = page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Model")
        assert picker.input_value() == "bitnet-b1.58-2B-4T · not downloaded", picker.input_value()  # its own name
        notice = page.get_by_test_id("stAlertContentWarning").filter(has_text="could not be downloaded").inner_text()
        assert "runs offline" not in notice and "runs offline" in sidebar_text(page)  # described once, in the sidebar
        picker.click()
        options = page.get_by_role("option")
        expect(options.first).to_be_visible(timeout=10_000)
        names = options.all_inner_texts()
        assert "bitnet-b1.58-2B-4T-bf16 · 4.8 GB" in names, names
        assert any("Llama3-8B" in n and "GB" in n for n in names), names
        _shot(page, "14-picker-sizes")
        page.keyboard.press("Escape")
        page.get_by_role("button", name="Retry the download").click()
        expect(page.get_by_text("Tried again at")).to_be_visible(timeout=30_000)
        _shot(page, "05-offline-demo-notice")

        # 2. The detour: the user's settings, then "Pick another model", a mistyped folder (an error page),
        #    and back to the demo model. The settings are still the user's; the reply has its normal length.
        max_tokens = 64
        set_number(page, "Max new tokens", max_tokens)
        temperature = slider_value(page, "Temperature")
        page.get_by_role("button", name="Pick another model").click()  # opens the list
        page.get_by_role("option", name=model_choices.CUSTOM_LABEL).click(timeout=20_000)
        expect(page.get_by_text("Type a Hub repo id")).to_be_visible(timeout=20_000)
        box = page.get_by_label("Hub repo id or folder", exact=True)
        box.fill(str(tmp_path / "no-such-checkpoint"))
        box.press("Enter")
        expect(page.get_by_text("That model was not found")).to_be_visible(timeout=20_000)
        _shot(page, "06-error-page")
        other = page.get_by_label("Or open a checkpoint folder on this computer", exact=True)  # the page's own way out
        other.fill(str(tmp_path / "another-missing-folder"))
        other.press("Enter")
        expect(page.get_by_text("another-missing-folder").first).to_be_visible(timeout=20_000)
        no_exception(page)
        expect(page.get_by_text("That model was not found")).to_be_visible(timeout=20_000)
        click_button(page, f"Use the {model_choices.DEMO_LABEL}")
        expect(chat_box).to_be_visible(timeout=60_000)
        assert page.get_by_label("Max new tokens", exact=True).input_value() == str(max_tokens)
        assert slider_value(page, "Temperature") == temperature
        set_number(page, "Seed", 3)  # touching any control used to bring the others back at their minimum
        assert page.get_by_label("Max new tokens", exact=True).input_value() == str(max_tokens)
        first_prompt = demo["skills"][0] if demo["skills"] else "ROMEO.\nBut soft, what light through yonder window"
        send(page, first_prompt)
        tokens = reply_tokens(page, 1)
        assert tokens >= 8, f"a {tokens}-token reply after the detour"
        _shot(page, "07-after-the-detour")

        # 3. The live block picture on free text (about one slot per step): never empty while the reply streams.
        #    Slow motion at its fastest rate keeps it on screen: the demo model writes this reply in ~20 ms, and
        #    Done replaces the live picture with the finished one (reply.py), so without Slow motion Streamlit may
        #    send the browser only that last change (it merges changes to one element queued between two sends).
        #    Each step is drawn in Slow motion, the same frames the unpaced page draws now and then
        #    (test_ui_pieces: which frames it draws without Slow motion).
        clear_chat(page)
        page.locator('[data-testid="stSidebar"] [data-testid="stRadio"]').get_by_text("Block diffusion").click()
        page.wait_for_timeout(800)
        set_number(page, "Max new tokens", min(192, demo["context"] - 96))
        click_toggle(page, "Slow motion")
        set_slider(page, "Steps per second", 30)
        page.evaluate(WATCH_PICTURE)
        send(page, demo["open"][0] if demo["open"] else "KING HENRY.\nNow, lords, for France; the enterprise")
        reply_tokens(page, 1)
        log = page.evaluate("() => window.pictureLog")
        assert log, "the live block picture never showed"
        assert all(r[2] > 0 and r[3] > 0 for r in log), f"an empty block picture: {log}"

        # 4. A skill prompt in diffusion mode (Slow motion, to watch it): several slots filled in one step, at two
        #    rates a presenter sets: a step every 1/rate seconds. The second reply comes under the first: its live
        #    picture is kept in view while it fills. The finished reply keeps its picture, no click.
        clear_chat(page)  # Slow motion is on since 3.
        slider_to_min(page, "Temperature")  # greedy: the same reply at both rates
        periods, skill = {}, None
        for rate in (8, 2):
            set_slider(page, "Steps per second", rate)
            for prompt in ([skill] if skill else demo["skills"][:4] or [OPEN_PROMPT]):  # a reply of 5+ steps
                if rate == 8:
                    clear_chat(page)
                page.evaluate(WATCH_PICTURE)
                page.evaluate(WATCH_PACE)
                send(page, prompt)
                expect(messages(page).last.locator(".bp .slot.new").first).to_be_visible(timeout=60_000)
                if rate == 2:  # a step lasts half a second: one shot of a frame that filled several slots
                    with contextlib.suppress(Exception):  # playwright's TimeoutError: then the frame shown now
                        page.wait_for_function(LIVE_MANY, arg=3 if demo["skills"] else 1, timeout=20_000)
                    page.wait_for_timeout(300)  # the page's own scroll
                    assert page.evaluate(LIVE_IN_VIEW), "the live block picture is out of sight"
                    _shot(page, "08-diffusion-live-block")
                reply_tokens(page, messages(page).count() - 1)
                if len(page.evaluate("() => window.stepLog")) >= 5:
                    skill = prompt
                    break
            periods[rate] = step_period(page.evaluate("() => window.stepLog"))
        assert 0.3 <= periods[2] <= 0.9 and 0.06 <= periods[8] <= 0.3 and periods[2] > 2.2 * periods[8], periods
        if demo["skills"]:
            most = max(r[4] for r in page.evaluate("() => window.pictureLog"))
            assert most >= 3, f"at most {most} slots filled in one step on a skill prompt"
        expect(messages(page).last.locator('[data-testid="stExpander"]')).to_be_visible(timeout=30_000)  # stored
        finished = messages(page).last.locator(".bp-final")
        expect(finished).to_be_visible()  # after the reply, without a click
        assert finished.locator(".tok").count() >= 3 and "Block diffusion writes" in finished.inner_text()
        finished.scroll_into_view_if_needed()
        _shot(page, "12-finished-picture")

        # 5. The replay: as it plays, the slider shows the step the picture shows.
        replay = messages(page).last.locator('[data-testid="stExpander"]').filter(has_text="diffusion steps")
        expect(replay).to_be_visible(timeout=30_000)  # drawn once the reply is stored (its figures come first)
        replay.get_by_text("diffusion steps").click()
        page.wait_for_timeout(500)
        steps = int(re.search(r"Replay the (\d+) diffusion steps", replay.inner_text()).group(1))
        replay.get_by_role("button", name="Play").click()
        seen = []
        for _ in range(12):
            page.wait_for_timeout(120)
            pair = replay.evaluate("""e => {
                const s = e.querySelector('input[type="range"]'), c = e.querySelector('.bp-head');
                const m = c ? c.innerText.match(/step (\\d+) of/) : null;
                return [s ? Number(s.value) : null, m ? Number(m[1]) : null]; }""")
            seen.append(pair)
            if len(seen) == 4:
                _shot(page, "09-diffusion-replay")
        shown = [p for p in seen if None not in p]
        assert shown and all(abs(s - k) <= 1 for s, k in shown), f"slider vs picture step: {seen}"
        assert len({k for _, k in shown}) >= min(3, steps), f"the replay did not play: {seen}"

        # 6. Compare in Slow motion at two rates, from its suggestions: both sides take a step at a time (AR a token,
        #    diffusion a step), so diffusion's steps and AR's tokens come at the same pace; no suggestion stays.
        set_number(page, "Max new tokens", 96)  # room for the whole count (about 72 tokens): the picture shows it end
        page.locator('[data-testid="stButtonGroup"] button', has_text="Compare").click()
        expect(page.get_by_text("Compare: autoregressive vs block diffusion")).to_be_visible(timeout=20_000)
        offered = [suggestions.button_label(p) for p in demo["skills"] + demo["open"]]
        compare_periods = {}
        for rate in (12, 4):
            set_slider(page, "Steps per second", rate)
            if rate == 12 and offered:  # the first run starts from the suggestions
                expect(page.get_by_role("button", name=offered[0])).to_have_count(1)

            def streaming(rate=rate):
                expect(page.locator(".bp.live").first).to_be_visible(timeout=60_000)
                for name in offered:
                    expect(page.get_by_role("button", name=name)).to_have_count(0)  # no stale suggestion
                expect(page.locator('[data-testid="stMetric"]')).to_have_count(0)  # nor the last run's summary
                if rate == 4:
                    page.wait_for_timeout(2000)
                    _shot(page, "13-compare-slow-motion")
            compare(page, skill, streaming)  # the chat's prompt, whose reply has enough steps
            steps = page.evaluate("() => window.stepLog")
            diffusion_period = step_period(steps)
            ar_row = page.locator(f"{FRESH} .stat-row").filter(has_text="Autoregressive").first.inner_text()
            ar_tokens = int(re.search(r"(\d+) tokens", ar_row).group(1))
            ar_done = page.evaluate("""() => { const log = window.rowLog, cleared = log.findIndex(r => r[1] === 0);
                return log.slice(cleared + 1).find(r => r[1] >= 2)[0]; }""")  # both replies' figures drawn
            ar_period = (ar_done - steps[0][0]) / 1000 / max(ar_tokens - 1, 1)
            assert 0.5 / rate <= diffusion_period <= 2.5 / rate, (rate, diffusion_period)
            assert 0.5 <= ar_period / diffusion_period <= 2.0, (rate, ar_period, diffusion_period)  # in step
            compare_periods[rate] = diffusion_period
        # 3x apart as set; 12 a second leaves a step ~83 ms, which a loaded 2-core machine stretches to ~140 ms
        # (compute and drawing), so the check asks for a clearly slower pace at 4, not the exact ratio
        assert compare_periods[4] > 1.4 * compare_periods[12], compare_periods
        click_toggle(page, "Slow motion")

        # 7. Compare on a skill prompt, greedy: the same text on both sides, tokens per step explained. The
        #    demo model's skill prompts are tried in the file's order until the two texts agree (at most 8).
        slider_to_min(page, "Temperature")
        agree = ""
        for prompt in demo["skills"][:8] or ["HAMLET.\nTo be, or not to be, that is the question:"]:
            compare(page, prompt)
            agree = page.locator(f'{FRESH} [data-testid="stMetric"]').filter(has_text="Do the texts agree?").inner_text()
            if "identical" in agree:
                break
        expect(page.get_by_text("Tokens per step", exact=False).last).to_be_visible()
        why = page.locator(FRESH).filter(has_text=re.compile(r"^Block diffusion was")).last.inner_text()
        assert "tokens on average" in why and "AR tokens" in why, why  # why it won or lost, in one sentence
        if demo["skills"]:
            assert "identical" in agree, f"no skill prompt gave the same text both ways: {agree}"
        page.locator(FRESH).filter(has_text=re.compile(r"^Block diffusion was")).last.scroll_into_view_if_needed()
        _shot(page, "10-compare")  # the replies' ends, the summary and its sentence

        # 8. Export the chat (the skill reply of step 4) as Markdown: it names the model that ran, and keeps the
        #    reply's line breaks (a count or a table is not one paragraph).
        page.locator('[data-testid="stButtonGroup"] button', has_text="Chat").click()
        expect(chat_box).to_be_visible(timeout=20_000)
        with page.expect_download() as download:
            page.locator('[data-testid="stSidebar"]').get_by_role("button", name="Markdown").click()
        with open(download.value.path(), encoding="utf-8") as f:
            exported = f.read()
        assert f"# Chat with {model_choices.DEMO_LABEL}" in exported and "### Assistant" in exported
        reply_md = exported.split("### Assistant", 1)[1]
        assert "\n" not in reply_md.strip().split("\n\n")[0].replace("  \n", ""), reply_md[:200]
        _assert_only_local(requests)


def test_every_select_box_value_and_an_offline_hub_repo(browser, demo, tmp_path):
    """Offline mode (HF_HUB_OFFLINE=1): the default model's notice offers no retry (none could download); every select
    box of the sidebar but the model's, in Block diffusion mode, through each value it offers (block attention once
    crashed the page), with no exception on the page, then a reply with what the walk left; "Pick another model"
    opens the model list; a Hub repo id typed there ends in the same notice, with the server at rest."""
    from playwright.sync_api import expect

    env = _app_env(tmp_path, HF_HUB_OFFLINE="1")
    with streamlit(env, _log("e2e-streamlit-selects.log")) as url, _page(browser) as (page, requests):
        chat_box = page.locator('[data-testid="stChatInput"] textarea')
        page.goto(url)
        notice = page.get_by_test_id("stAlertContentWarning").filter(has_text="could not be downloaded")
        expect(notice).to_be_visible(timeout=60_000)
        expect(chat_box).to_be_visible(timeout=60_000)
        expect(page.get_by_text("start the app without it")).to_be_visible()
        assert page.get_by_role("button", name="Retry the download").count() == 0
        _shot(page, "15-first-screen")

        page.locator('[data-testid="stSidebar"] [data-testid="stRadio"]').get_by_text("Block diffusion").click()
        page.wait_for_timeout(800)
        walked = {}
        for label in ("CPU threads", "KV cache", "Block size", "Sub-block size", "Attention pattern", "Fill rule"):
            i = 0
            while i < len(options := select_options(page, label)):  # what it offers may change as it goes
                choose(page, label, options[i])
                no_exception(page)
                expect(chat_box).to_be_visible(timeout=60_000)
                walked.setdefault(label, []).append(options[i])
                i += 1
        assert len(walked["Attention pattern"]) == 2 and len(walked["Block size"]) >= 4, walked
        set_number(page, "Max new tokens", 96)  # a whole reply behind the open list in its picture
        send(page, demo["skills"][0] if demo["skills"] else OPEN_PROMPT)
        assert reply_tokens(page, 1) >= 1
        no_exception(page)

        _prepare_shot(page)  # the sidebar at its top, for the picture of the open list
        page.get_by_role("button", name="Pick another model").click()
        expect(page.get_by_role("option", name=model_choices.CUSTOM_LABEL)).to_be_visible(timeout=20_000)
        page.wait_for_timeout(300)
        _save_shot(page.screenshot(), "16-picker-open")  # as it is: a scroll or a mouse move would close the list
        page.get_by_role("option", name=model_choices.CUSTOM_LABEL).click()
        box = page.get_by_label("Hub repo id or folder", exact=True)
        box.fill("someone/some-bitnet-model")
        box.press("Enter")
        expect(page.get_by_test_id("stAlertContentWarning").filter(
            has_text="someone/some-bitnet-model could not be downloaded")).to_be_visible(timeout=60_000)
        expect(chat_box).to_be_visible(timeout=60_000)
        assert "someone/some-bitnet-model is not downloaded" in sidebar_text(page)
        page.wait_for_timeout(1000)
        busy = at_rest(url)
        assert busy < 0.2, f"the server used {busy:.0%} of a core with nothing to do"
        no_exception(page)
        _assert_only_local(requests)


def test_llama_family_checkpoint_from_the_hub(browser, tmp_path):
    from playwright.sync_api import expect

    from bitnet_app.engine.file import EngineFile
    from family_checkpoints import make_family_checkpoint
    repo = "org/llama3-tiny-1.58bit"
    truth = make_family_checkpoint(str(tmp_path / "llama3"), "llama3")
    with FakeHub({repo: truth["folder"]}) as hub, \
            streamlit(_app_env(tmp_path, HF_ENDPOINT=hub.url, BITNET_APP_MODEL=repo),
                      _log("e2e-streamlit-llama.log")) as url, \
            _page(browser) as (page, requests):
        page.goto(url)
        chat_box = page.locator('[data-testid="stChatInput"] textarea')
        expect(chat_box).to_be_visible(timeout=180_000)
        assert [r for r in hub.requests if r[0] == "GET" and r[1].endswith("model.safetensors")]
        assert f"Running **{repo}**" in sidebar_text(page) or f"Running {repo}" in sidebar_text(page)
        page.get_by_text("What each model needs here").click()
        expect(page.get_by_text("tiiuae/Falcon3-7B-Instruct-1.58bit")).to_be_visible(timeout=10_000)
        expect(page.get_by_text("when this list was opened", exact=False)).to_be_visible()  # measured again
        set_number(page, "Max new tokens", 16)
        set_number(page, "Seed", 5)
        send(page, "Hello! How are you today?")
        tokens = reply_tokens(page, 1)
        assert 1 <= tokens <= 16
        _shot(page, "11-llama-family")
        _assert_only_local(requests)
    converted = [os.path.join(dp, f) for dp, _, fs in os.walk(tmp_path / "eng") for f in fs if f.endswith(".bitnet")]
    assert len(converted) == 1
    ef = EngineFile(converted[0])
    assert ef.meta["source"]["family"] == "llama" and ef.meta["source"]["scale_mode"] == "divide"
    assert (ef.config["hidden_act"], ef.config["sub_norms"], ef.config["tie_word_embeddings"]) == ("silu", False, False)
