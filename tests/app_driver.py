"""Driving the app in a real headless Chromium: `streamlit run app.py` on a loopback port, and the moves a user
makes on the page (sidebar numbers, sliders and toggles, the chat box, Compare), with what they read back.

Shared by the browser test (tests/test_e2e_browser.py) and benchmarks/page_vs_api.py; it needs only the standard
library and Playwright (PyPI), and /usr/bin/chromium.
"""
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url: str, timeout: float) -> tuple[str, float]:
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read().decode()
    return body, time.monotonic() - t0


SERVER_PIDS: dict = {}  # the URL streamlit() yields -> the server's process id (server_cpu_seconds)


@contextlib.contextmanager
def streamlit(env: dict, log_path: str):
    """`streamlit run app.py` on a free loopback port with `env`, its output in `log_path`; yields its URL once
    healthy (SERVER_PIDS[url]: its process id)."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", os.path.join(ROOT, "app.py"),
                                 "--server.port", str(port), "--server.address", "127.0.0.1",
                                 "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if get(url + "/_stcore/health", 2)[0].strip() == "ok":
                        break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"streamlit did not start; see {log_path}")
                time.sleep(0.3)
            SERVER_PIDS[url] = proc.pid
            yield url
        finally:
            SERVER_PIDS.pop(url, None)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def server_cpu_seconds(url: str) -> float:
    """The CPU time the app's server process (of streamlit(): url) has used so far, all its threads (Linux /proc)."""
    with open(f"/proc/{SERVER_PIDS[url]}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def at_rest(url: str, seconds: float = 3.0) -> float:
    """The share of one core the server used over `seconds` (an idle server: about 0)."""
    before = server_cpu_seconds(url)
    time.sleep(seconds)
    return (server_cpu_seconds(url) - before) / seconds


def no_exception(page) -> None:
    """Nothing on the page is a Streamlit exception box (a traceback where the page should be)."""
    boxes = page.locator('[data-testid="stException"]')
    assert boxes.count() == 0, boxes.first.inner_text()[:600]


def sidebar_select(page, label: str):
    return page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(
        has=page.get_by_text(label, exact=True))


def open_select(page, label: str):
    """Open sidebar select box `label`'s list (clicked again when a click lands while the page redraws it); returns
    the options locator."""
    options = page.get_by_role("option")
    for attempt in range(4):
        sidebar_select(page, label).get_by_role("combobox").click()
        try:
            options.first.wait_for(timeout=5_000)
            return options
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: once more
            if attempt == 3:
                raise
            page.keyboard.press("Escape")
            page.wait_for_timeout(500)


def select_options(page, label: str) -> list[str]:
    """The options sidebar select box `label` offers now (its list opened, read, and closed)."""
    names = open_select(page, label).all_inner_texts()
    page.keyboard.press("Escape")
    page.wait_for_timeout(300)
    return names


def choose(page, label: str, option: str) -> None:
    """Choose `option` in sidebar select box `label`, and wait for the page's run it starts to end."""
    open_select(page, label)
    page.get_by_role("option", name=option, exact=True).click()
    page.wait_for_timeout(500)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)


def messages(page):
    return page.locator('[data-testid="stChatMessage"]')


def assistant_text(page, index: int) -> str:
    return messages(page).nth(index).locator('[data-testid="stMarkdownContainer"]').first.inner_text()


def sidebar_text(page) -> str:
    return page.locator('[data-testid="stSidebar"]').inner_text()


def set_number(page, label: str, value: int) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_timeout(800)


FRESH = '[data-testid="stElementContainer"]:not([data-stale="true"])'  # drawn by the current script run
FRESH_COMPARE = """p => {
    const fresh = [...document.querySelectorAll('[data-testid="stElementContainer"]:not([data-stale="true"])')];
    return fresh.some(e => e.innerText.includes('Prompt: ' + p.split('\\n')[0])) &&
           fresh.some(e => e.querySelector('[data-testid="stMetric"]') && e.innerText.includes('Do the texts agree?'));
}"""


def slider_to_min(page, label: str) -> None:
    page.locator('[data-testid="stSidebar"] [data-testid="stSlider"]').filter(has_text=label) \
        .get_by_role("slider").press("Home")
    page.wait_for_timeout(800)


def slider_value(page, label: str) -> str:
    return page.locator(f'[data-testid="stSidebar"] input[type="range"][aria-label="{label}"]').input_value()


def click_toggle(page, label: str) -> None:
    page.locator('[data-testid="stSidebar"] [data-testid="stCheckbox"]').filter(has_text=label).locator("label").click()
    page.wait_for_timeout(800)


def choose_model(page, label: str) -> None:
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name=label).click()
    page.wait_for_timeout(800)


def click_button(page, text: str) -> None:
    page.get_by_role("button", name=text).first.click()


def clear_chat(page) -> None:
    """Clear chat, clicked again if the click landed while the last reply's rerun redrew the button (nothing to do
    when the chat is empty)."""
    if not messages(page).count():
        return
    for attempt in range(3):
        click_button(page, "Clear chat")
        try:
            page.wait_for_function("() => !document.querySelector('[data-testid=\"stChatMessage\"]')", timeout=10_000)
            return
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: try once more
            if attempt == 2:
                raise


def send(page, text: str) -> None:
    box = page.locator('[data-testid="stChatInput"] textarea')
    box.fill(text)
    box.press("Enter")


def wait_streaming(page, index: int, min_chars: int = 40, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        if messages(page).count() > index:
            text = assistant_text(page, index)
            if len(text) >= min_chars:
                return text
        page.wait_for_timeout(100)
    raise AssertionError(f"no streamed text in message {index} after {timeout} s (got {text!r})")


def reply_tokens(page, index: int, timeout_ms: int = 120_000) -> int:
    """The token count in the figures under assistant message `index`, once the reply is done."""
    row = messages(page).nth(index).locator(".stat-row")
    row.filter(has_text="tokens").first.wait_for(timeout=timeout_ms)
    return int(re.search(r"(\d+) tokens", row.first.inner_text()).group(1))


# The pace of a reply while it streams: window.stepLog = [[ms, the step the live block picture shows]] (each new
# one), window.rowLog = [[ms, how many reply figures the current run has drawn]] (each change).
WATCH_PACE = """() => {
  window.stepLog = []; window.rowLog = [];
  if (window.paceWatch) window.paceWatch.disconnect();  // one watcher: an older one would log with its own clock
  const t0 = performance.now();
  let step = null, rows = 0;
  window.paceWatch = new MutationObserver(() => {
    const t = Math.round(performance.now() - t0);
    const head = document.querySelector('.bp.live .bp-head');
    const m = head ? head.innerText.match(/step (\\d+)$/) : null;
    if (m && m[1] !== step) { step = m[1]; window.stepLog.push([t, Number(m[1])]); }
    const n = document.querySelectorAll(
      '[data-testid="stElementContainer"]:not([data-stale="true"]) .stat-row').length;
    if (n !== rows) { rows = n; window.rowLog.push([t, n]); }
  });
  window.paceWatch.observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


# Every speed figure the page shows from now on: window.speedsSeen = [each distinct "N tok/s" chip text or
# "N.NN×" metric value, in the order they appeared] (a figure that is replaced shows up twice).
WATCH_SPEEDS = """() => {
  window.speedsSeen = [];
  if (window.speedWatch) window.speedWatch.disconnect();
  const seen = new Set();
  const look = () => {
    document.querySelectorAll('[data-testid="stElementContainer"]:not([data-stale="true"]) .chip, '
                              + '[data-testid="stElementContainer"]:not([data-stale="true"]) [data-testid="stMetricValue"]')
      .forEach(e => { const t = e.innerText.trim();
                      if (/tok\\/s$|×$/.test(t) && !seen.has(t)) { seen.add(t); window.speedsSeen.push(t); } });
  };
  window.speedWatch = new MutationObserver(look);
  window.speedWatch.observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def compare(page, prompt: str, while_streaming=None) -> None:
    """Run Compare on `prompt` and wait for its result; while_streaming(): called once the run has started.
    Streamlit keeps the previous run's elements on the page, marked data-stale, until it redraws them, and the last
    result may be for the same prompt: the run clears the figures when it starts (WATCH_PACE sees that), then the
    fresh summary under this prompt says it is over."""
    box = page.get_by_placeholder("A prompt to run both ways…")
    expect_enabled = time.monotonic() + 60
    while not box.is_enabled() and time.monotonic() < expect_enabled:  # the view switch (or the last run) is over
        page.wait_for_timeout(200)
    page.evaluate(WATCH_PACE)
    box.fill(prompt)
    box.press("Enter")
    started = ("() => window.rowLog.some(r => r[1] === 0) || !window.rowLog.length && "
               "!document.querySelector('.stat-row')")
    for attempt in range(4):  # up to 60 s for the run to start
        try:
            page.wait_for_function(started, timeout=15_000)
            break
        except Exception:  # noqa: BLE001 - playwright's TimeoutError
            if attempt == 3:
                raise
            # The box clears when it takes a prompt: still holding it, the press landed while the page redrew the box
            # (session 21 saw a Compare that never started), so press again, as a user would.
            if box.input_value() == prompt:
                box.press("Enter")
    if while_streaming is not None:
        while_streaming()
    page.wait_for_function(FRESH_COMPARE, arg=prompt, timeout=180_000)


def step_period(log: list) -> float:
    """Seconds per step from WATCH_PACE's stepLog: the median over successive steps shown."""
    gaps = sorted((b[0] - a[0]) / 1000 / (b[1] - a[1]) for a, b in zip(log, log[1:]) if b[1] > a[1])
    assert len(gaps) >= 3, f"too few steps seen: {log}"
    return gaps[len(gaps) // 2]


def set_slider(page, label: str, value: int) -> None:
    """A sidebar slider of whole numbers set by keyboard, arrow by arrow until it shows `value` (a key pressed while
    the page reruns may be lost: look again after each round)."""
    slider = page.locator('[data-testid="stSidebar"] [data-testid="stSlider"]').filter(has_text=label) \
        .get_by_role("slider")
    for _ in range(10):
        now = int(float(slider_value(page, label)))
        if now == value:
            return
        for _ in range(abs(value - now)):
            slider.press("ArrowRight" if value > now else "ArrowLeft")
        page.wait_for_timeout(800)
    raise AssertionError(f"the {label} slider shows {slider_value(page, label)}, not {value}")
