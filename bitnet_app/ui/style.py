"""The few styles the theme in .streamlit/config.toml cannot express: stat chips and the block pictures."""
import streamlit as st

CSS = """
<style>
.stat-row {display:flex; flex-wrap:wrap; gap:.35rem; margin:.35rem 0 .1rem 0;}
.chip {font-size:.74rem; line-height:1.1; padding:.22rem .55rem; border-radius:999px;
       background:#eef0fb; color:#312e81; border:1px solid #d9dcf2; white-space:nowrap;}
.chip.mode {background:#4f46e5; color:#fff; border-color:#4f46e5;}
.chip.stopped {background:#fff4e5; color:#9a3412; border-color:#fed7aa;}
.chip.warn {background:#fef2f2; color:#991b1b; border-color:#fecaca;}
.bp {border:1px solid #d9dcf2; border-radius:.6rem; padding:.5rem .6rem .6rem .6rem; background:#ffffff;
     margin:.25rem 0 .5rem 0;}
.bp-head {font-size:.72rem; color:#6b6a8f; margin-bottom:.35rem; letter-spacing:.02em;}
.bp-slots {display:flex; flex-wrap:wrap; gap:3px;}
.slot {font-family:ui-monospace, SFMono-Regular, Menlo, monospace; font-size:.78rem; min-width:1.6rem;
       text-align:center; padding:.15rem .3rem; border-radius:.35rem; white-space:pre;}
.slot.mask {background:repeating-linear-gradient(45deg,#eceefb,#eceefb 4px,#e2e5f7 4px,#e2e5f7 8px);
            color:#a3a7cf;}
.slot.given {background:#f3f4f6; color:#9ca3af;}
.slot.fill {background:#e0e7ff; color:#1e1b4b;}
.slot.new {background:#fbbf24; color:#1f1300; box-shadow:0 0 0 2px #f59e0b; font-weight:600;}
.slot.gone {opacity:.35;}
.legend {font-size:.7rem; color:#6b6a8f; margin-top:.35rem;}
.legend span.slot {min-width:0; font-size:.66rem; padding:.05rem .3rem;}
.bp.live {scroll-margin:1rem;}
.bp-final {border:1px solid #d9dcf2; border-radius:.6rem; padding:.5rem .6rem .55rem .6rem; background:#ffffff;
           margin:.1rem 0 .35rem 0;}
.bp-text {font-family:ui-monospace, SFMono-Regular, Menlo, monospace; font-size:.78rem; line-height:1.75;
          white-space:pre-wrap; color:#1e1b4b;}
.bp-text .tok {border-radius:.25rem; padding:.05rem 0;}
.bp-text .nl {color:#8b8fb8;}
.chip.note {font-style:italic; background:#fff; color:#6b6a8f;}
div[data-testid="stElementContainer"]:has(.page-script) {display:none;}
</style>
"""


def inject() -> None:
    st.html(CSS)
