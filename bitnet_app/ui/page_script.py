"""What the page does in the browser that Streamlit has no setting for (one small script, run once per page):

- the chat input's Stop button is named for what it does: Streamlit names it "Stop script" (screen readers read
  that), and this page's Stop ends the reply being written, keeping what it wrote;
- the live block picture of a reply being written (.bp.live) is kept in view: with a few earlier turns it would
  stream below the fold or behind the input box, where the audience never sees it.

open_model_picker draws a second, one-shot script: it opens the sidebar's model list (the notice's "Pick another
model").
"""
import secrets

import streamlit as st

STOP_NAME = "Stop the reply"
SCRIPT = """<span class="page-script"></span><script>
(() => {
  if (window.bitnetPageScript) return;
  window.bitnetPageScript = true;
  const name = %(name)r;
  const visibleBottom = () => {
    const bottom = document.querySelector('[data-testid="stBottom"]');
    return bottom ? bottom.getBoundingClientRect().top : window.innerHeight;
  };
  const tidy = () => {
    document.querySelectorAll('[data-testid="stChatInputStopButton"]').forEach(b => {
      if (b.getAttribute('aria-label') !== name) { b.setAttribute('aria-label', name); b.title = name; }
    });
    const live = document.querySelectorAll('.bp.live');
    if (live.length) {
      const r = live[live.length - 1].getBoundingClientRect();
      if (r.top < 0 || r.bottom > visibleBottom()) live[live.length - 1].scrollIntoView({block: 'center'});
    }
  };
  new MutationObserver(tidy).observe(document.body, {subtree: true, childList: true, characterData: true,
                                                     attributes: true, attributeFilter: ['aria-label']});
  tidy();
})();
</script>"""


def inject() -> None:
    st.html(SCRIPT % {"name": STOP_NAME}, unsafe_allow_javascript=True)


OPEN_PICKER = """<span class="page-script"></span><script>
(() => {  // %(nonce)s: a new element each time, so the script runs each time it is asked for
  // Opened once the page's run is over: the end of a run gives the focus back to the chat box, which would close it.
  let tries = 0;
  const open = () => {
    const box = document.querySelector('[data-testid="stSidebar"] [data-testid="stSelectbox"] input');
    const running = document.querySelector('[data-testid="stStatusWidget"]');
    if (box && !box.disabled && !running) {  // a react-aria combo box: it opens on the keyboard's arrow down
      box.scrollIntoView({block: 'nearest'});  // first: a scroll while it is open would close it
      setTimeout(() => {
        box.focus({preventScroll: true});
        box.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowDown', code: 'ArrowDown', keyCode: 40,
                                                        bubbles: true}));
      }, 300);
    } else if (++tries < 100) setTimeout(open, 100);
  };
  setTimeout(open, 100);
})();
</script>"""


def open_model_picker() -> None:
    """Open the sidebar's model list, as a click on it would (Streamlit cannot open a select box from Python)."""
    st.html(OPEN_PICKER % {"nonce": secrets.token_hex(4)}, unsafe_allow_javascript=True)
