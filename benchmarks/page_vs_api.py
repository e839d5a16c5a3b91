"""The page's speed figures against the API's, in one sitting: the bars of issue 32 ("Done when").

    python -m benchmarks.page_vs_api [--prompt TEXT] [--compares 4] [--chats 3] [--api-runs 9] [--threads N]
        [--sampled] [--seed 1] [--json out.json]

Run it from the repository root on a quiet machine (it needs Playwright and /usr/bin/chromium, as the browser test).
It starts the real app on the bundled demo model (`streamlit run app.py`, BITNET_APP_MODEL=demo, offline) and
drives it in headless Chromium (tests/app_driver.py, shared with tests/test_e2e_browser.py): Compare on one prompt
--compares times, reading the speed-up each run shows, then --chats chat replies in autoregressive mode (each in a
cleared chat), reading their tok/s. Before and after the page, the API runs the same prompt with the same settings
(bitnet_app.load_model, Model.generate) --api-runs times each, and its figures are the medians of both batches.

Settings: the app's starting values for the demo model, greedy (temperature 0; --sampled keeps the model's own
sampling) with the seed --seed typed into the sidebar and given to the API, so that both write the same replies.
The API's figures do the work the page times: Compare runs AR and diffusion in turn on two models (as the page has
two engines), both from a cold cache (Model.forget_cache, as the page's Compare); the chat's AR reply is the same
call repeated on one model after a first one (the cache then holds the prompt, as the page's does after Compare).

Bars, each printed with PASS or FAIL (exit status 1 when one fails):
  - the page's Compare speed-ups lie within 1.3x of each other (highest / lowest);
  - their median lies within 25% of the API's speed-up;
  - the chat's AR tok/s (median of the replies) is at least 60% of the API's;
  - each figure appears once: no tok/s or speed-up the page shows is replaced by another for the same reply.
Printed beside them, without a verdict: the issue's aim for a reply's tok/s, within 15% of the API's.
"""
import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile

DEFAULT_PROMPT = "Show the 8 times table from 1 to 15."
BARS = {"compare_spread": 1.3, "compare_vs_api": 0.25, "chat_vs_api": 0.60}


def api_settings(model, args) -> dict:
    """The decode settings the page starts from for this model (ui/state.py seed_from_model), greedy unless
    --sampled, with the seed the page is given."""
    from bitnet_app.ui import state

    start = dataclasses.asdict(model.suggested_params())
    settings = {k: round(v, 2) if isinstance(v, float) else v for k, v in start.items()}
    settings["max_new_tokens"] = state.first_max_new_tokens(model.context_length)
    settings["seed"] = args.seed
    if not args.sampled:
        settings["temperature"] = 0.0
    return settings


def prompt_ids(model, prompt: str) -> list[int]:
    """The ids the page sends: its default system prompt (when the template reads one) and the prompt."""
    from bitnet_app.ui import state

    system = [{"role": "system", "content": state.DEFAULT_SYSTEM_PROMPT}] if state.uses_system_prompt(model) else []
    return model.chat_ids(system + [{"role": "user", "content": prompt}])


def _done(model, ids, params):
    from bitnet_app.decode.events import Done

    return [ev for ev in model.generate(ids, params) if isinstance(ev, Done)][-1]


def api_threads(args) -> int | None:
    """The threads the page runs the demo model on: --threads, else the page's "auto" (ui/loading.auto_threads)."""
    import bitnet_app
    from bitnet_app.ui.loading import auto_threads

    if args.threads:
        return args.threads
    probe = bitnet_app.load_model("demo", threads=1)
    try:
        return auto_threads(probe.info()["path"])
    finally:
        probe.close()


def api_figures(args) -> dict:
    """{"speedups": [...], "ar_tok_s": [...]}: Compare's pairs (AR then diffusion, both cold) and the chat's AR."""
    import bitnet_app

    threads = api_threads(args)
    ar_model = bitnet_app.load_model("demo", threads=threads)
    diffusion_model = bitnet_app.load_model("demo", threads=threads)
    try:
        ids = prompt_ids(ar_model, args.prompt)
        settings = api_settings(ar_model, args)
        params = {mode: ar_model.decode_params(**dict(settings, mode=mode)) for mode in ("ar", "diffusion")}
        speedups, ar_tok_s = [], []
        for _ in range(args.api_runs):
            ar_model.forget_cache()
            ar = _done(ar_model, ids, params["ar"])
            diffusion = _done(diffusion_model, ids, params["diffusion"])
            speedups.append(diffusion.stats["tok_s"] / ar.stats["tok_s"])
        _done(ar_model, ids, params["ar"])  # the cache now holds the prompt, as the page's does
        for _ in range(args.api_runs):
            ar_tok_s.append(_done(ar_model, ids, params["ar"]).stats["tok_s"])
        return {"speedups": speedups, "ar_tok_s": ar_tok_s}
    finally:
        ar_model.close()
        diffusion_model.close()


def _number(text: str) -> float:
    return float(re.search(r"[\d,.]+", text).group(0).replace(",", ""))


def page_figures(args) -> dict:
    """{"speedups": [...], "ar_tok_s": [...]}: what the page shows, driven as a user would."""
    from playwright.sync_api import sync_playwright

    from tests.app_driver import (CHROMIUM, CHROMIUM_ARGS, FRESH, WATCH_SPEEDS, clear_chat, compare, messages,
                                  reply_tokens, send, set_number, slider_to_min, streamlit)

    env = dict(os.environ, BITNET_APP_MODEL="demo", HF_HUB_OFFLINE="1", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    if args.threads:
        env["BITNET_THREADS"] = str(args.threads)
    log = os.path.join(tempfile.gettempdir(), "page_vs_api-streamlit.log")
    out = {"speedups": [], "ar_tok_s": [], "figures_replaced": []}
    with streamlit(env, log) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url)
        page.locator('[data-testid="stChatInput"] textarea').wait_for(timeout=180_000)
        set_number(page, "Seed", args.seed)
        if not args.sampled:
            slider_to_min(page, "Temperature")
        page.locator('[data-testid="stButtonGroup"] button', has_text="Compare").click()
        for _ in range(args.compares):
            compare(page, args.prompt, lambda: page.evaluate(WATCH_SPEEDS))
            shown = page.locator(f'{FRESH} [data-testid="stMetric"]').filter(has_text="Diffusion speed vs AR") \
                .locator('[data-testid="stMetricValue"]').inner_text()
            out["speedups"].append(_number(shown))
            seen = page.evaluate("() => window.speedsSeen")  # this run's: its two tok/s and the speed-up, once each
            if len(seen) > 3:
                out["figures_replaced"].append(seen)
        page.locator('[data-testid="stButtonGroup"] button', has_text="Chat").click()
        page.get_by_text("What would you like to ask?").wait_for(timeout=60_000)  # the empty chat, drawn
        for _ in range(args.chats):
            clear_chat(page)
            page.evaluate(WATCH_SPEEDS)
            send(page, args.prompt)
            reply_tokens(page, 1)
            page.locator(f"{FRESH} .stat-row").filter(has_text="tok/s").first.wait_for(timeout=60_000)  # final
            row = messages(page).nth(1).locator(".stat-row").first.inner_text()
            out["ar_tok_s"].append(_number(re.search(r"[\d,.]+ tok/s", row).group(0)))
            seen = page.evaluate("() => window.speedsSeen")
            if len(seen) > 1:
                out["figures_replaced"].append(seen)
        browser.close()
    return out


def verdict(page: dict, api: dict) -> list[dict]:
    """The three bars: (name, value, bar, passed)."""
    spread = max(page["speedups"]) / min(page["speedups"])
    page_median, api_median = statistics.median(page["speedups"]), statistics.median(api["speedups"])
    off = abs(page_median / api_median - 1)
    chat = statistics.median(page["ar_tok_s"]) / statistics.median(api["ar_tok_s"])
    return [
        {"bar": "Compare speed-ups within 1.3x of each other (highest / lowest)", "value": spread,
         "passed": spread <= BARS["compare_spread"]},
        {"bar": "their median within 25% of the API's speed-up (relative difference)", "value": off,
         "passed": off <= BARS["compare_vs_api"]},
        {"bar": "chat AR tok/s at least 60% of the API's (page / API)", "value": chat,
         "passed": chat >= BARS["chat_vs_api"]},
        {"bar": "each figure appears once (runs where one was replaced)", "value": len(page["figures_replaced"]),
         "passed": not page["figures_replaced"]},
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="the one prompt of every run")
    ap.add_argument("--compares", type=int, default=4, help="Compare runs on the page")
    ap.add_argument("--chats", type=int, default=3, help="chat replies on the page (autoregressive)")
    ap.add_argument("--api-runs", type=int, default=9, help="runs of each API figure, before and after the page")
    ap.add_argument("--threads", type=int, help="engine threads, page and API alike (default: the page's auto: one "
                                                "for the demo model)")
    ap.add_argument("--sampled", action="store_true", help="the model's own sampling instead of greedy")
    ap.add_argument("--seed", type=int, default=1, help="the seed typed into the sidebar and given to the API")
    ap.add_argument("--json", help="also write the figures and verdicts to this file")
    args = ap.parse_args(argv)

    before = api_figures(args)
    page = page_figures(args)
    after = api_figures(args)
    api = {k: before[k] + after[k] for k in before}
    bars = verdict(page, api)
    print(f"prompt: {args.prompt!r} ({'sampled' if args.sampled else 'greedy'}, seed {args.seed})")
    print(f"page Compare speed-ups: {', '.join(f'{x:.2f}' for x in page['speedups'])}; API median "
          f"{statistics.median(api['speedups']):.2f} (runs {min(api['speedups']):.2f}-{max(api['speedups']):.2f})")
    print(f"page chat AR tok/s: {', '.join(f'{x:,.0f}' for x in page['ar_tok_s'])}; API median "
          f"{statistics.median(api['ar_tok_s']):,.0f}")
    for b in bars:
        print(f"{'PASS' if b['passed'] else 'FAIL'}  {b['bar']}: {b['value']:.2f}")
    aim = abs(bars[2]["value"] - 1)
    print(f"({'met' if aim <= 0.15 else 'not met'})  aim: chat AR tok/s within 15% of the API's: {aim:.0%} off")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"prompt": args.prompt, "sampled": args.sampled, "seed": args.seed, "page": page, "api": api,
                       "bars": bars}, f, indent=2)
    return 0 if all(b["passed"] for b in bars) else 1


if __name__ == "__main__":
    sys.exit(main())
