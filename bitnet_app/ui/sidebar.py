"""The sidebar: model picker, decode mode and settings (each with one line of help), chat actions, model info.

Every control is drawn disabled while a reply streams: changing a widget would rerun the page and cut
the reply off.
"""
import os

import streamlit as st

from .. import hub
from . import export, sources, state
from .stats import MODE_LABELS

ISA_LABELS = {"avx512-vnni": "AVX512-VNNI", "avx512": "AVX512-VNNI", "avx2": "AVX2", "portable": "portable C"}


def _clear_chat() -> None:
    st.session_state.messages = []


def model_picker(busy: bool):
    """The model choice (drawn before loading, so a failed load can still be switched).
    Returns (the chosen Source or None, a placeholder under the picker for describe_running)."""
    with st.sidebar:
        st.markdown("## BitNet chat")
        st.caption("1.58-bit language models, on your CPU.")
        options = sources.choices()
        if st.session_state.get("model_choice") not in options:
            state.put("model_choice", sources.default_choice() if sources.default_choice() in options
                      else options[0])
        label = st.selectbox("Model", options, key="model_choice", disabled=busy,
                             help="A Hugging Face repo (downloaded and converted once), the bundled demo model, "
                                  "or a checkpoint folder on this computer.")
        about = st.empty()  # filled once the model runs: the chosen one, or the demo model standing in for it
        custom = ""
        if label == sources.CUSTOM_LABEL:
            custom = st.text_input("Hub repo id or folder", key="custom_source", disabled=busy,
                                   placeholder="owner/name or /path/to/checkpoint",
                                   help="Any BitNet b1.58 checkpoint: a Hub repo id, or a local folder with "
                                        "config.json, tokenizer.json and *.safetensors.")
        st.number_input("CPU threads", min_value=0, max_value=max(1, os.cpu_count() or 1), step=1, key="threads",
                        disabled=busy, help="Threads for the engine; 0 uses every core. Changing it reloads the model.")
        source = sources.resolve(label, custom)
        if source is not None:
            about.caption(sources.describe(source))  # until a model runs (describe_running)
        return source, about


def describe_running(about, running, wanted, model) -> None:
    """Under the picker: the model that is actually running (`running`, a Source), and when the demo model
    stands in for the chosen one, which (`wanted`, a Source, else None)."""
    params = _count(int(model.info()["parameters"]))
    name = "the bundled demo model" if running.label == sources.DEMO_LABEL else f"**{running.label}**"
    lines = [f"Running {name} · {params} parameters", sources.describe(running)]
    if wanted is not None:
        lines.insert(1, f"(instead of {wanted.label}, which could not be downloaded)")
    about.caption("  \n".join(lines))


def settings(model, busy: bool) -> None:
    ss = st.session_state
    with st.sidebar:
        st.divider()
        st.radio("Decoding", ["ar", "diffusion"], key="mode", horizontal=True, disabled=busy,
                 format_func=MODE_LABELS.get,
                 help="Autoregressive writes one token per forward; block diffusion fills several slots of a "
                      "block per forward.")
        st.toggle("Slow motion", key="slow_motion", disabled=busy,
                  help="Draw chat replies at a pace people can follow (about 25 tokens, or diffusion steps, per "
                       "second): small models write faster than the eye. The speed figures stay the engine's own.")
        if ss.mode == "diffusion" and not model.trained_for_diffusion:
            st.info("This checkpoint was not trained for block diffusion: it still runs (causal pattern, "
                    "leftmost slot first) but expect about one token per forward and AR speed.",
                    icon=":material/info:")
        with st.expander("Sampling", expanded=True, icon=":material/tune:"):
            st.slider("Temperature", 0.0, 2.0, step=0.05, key="temperature", disabled=busy,
                      help="0 always picks the likeliest token; higher values give more varied text.")
            st.slider("Top-p", 0.05, 1.0, step=0.05, key="top_p", disabled=busy,
                      help="Sample only from the smallest set of tokens whose probabilities add up to p.")
            st.slider("Top-k", 0, 200, step=1, key="top_k", disabled=busy,
                      help="Sample only from the k likeliest tokens; 0 turns the limit off.")
            st.slider("Repetition penalty", 1.0, 2.0, step=0.05, key="repetition_penalty", disabled=busy,
                      help="Above 1 makes tokens that already appeared less likely, against loops.")
            st.number_input("Max new tokens", min_value=1, max_value=max(1, model.context_length - 1), step=16,
                            key="max_new_tokens", disabled=busy, help="The longest reply, in tokens.")
            st.number_input("Seed", min_value=0, max_value=2**31 - 1, step=1, key="seed", disabled=busy,
                            help="The same seed and settings give the same reply.")
        with st.expander("Block diffusion", expanded=ss.mode == "diffusion", icon=":material/grid_view:"):
            st.selectbox("Block size", [4, 8, 16, 32, 64], key="block_size", disabled=busy,
                         help="Tokens per block; must match the block size the model was trained with.")
            subs = [s for s in (1, 2, 4, 8, 16, 32, 64) if s <= ss.block_size]
            if ss.sub_block_size not in subs:
                state.put("sub_block_size", subs[-1])
            st.selectbox("Sub-block size", subs, key="sub_block_size", disabled=busy,
                         help="Slots decided together, left to right inside a block.")
            st.slider("Confidence threshold", 0.5, 1.0, step=0.01, key="threshold", disabled=busy,
                      help="Fill every slot whose prediction is at least this sure; 1.0 fills one per forward.")
            st.selectbox("Attention pattern", ["block", "causal"], key="attention", disabled=busy,
                         help="block: slots in a block see each other (Fast-dLLM v2); causal: each sees only "
                              "earlier ones.")
        if state.uses_system_prompt(model):
            st.text_area("System prompt", key="system_prompt", height=90, disabled=busy,
                         help="Instructions the model reads before the conversation.")
        else:
            st.caption("This model's chat template has no place for a system prompt, so it takes none.")


def chat_actions(model, model_label: str, busy: bool) -> None:
    ss = st.session_state
    system_prompt = state.system_prompt(model)
    with st.sidebar:
        st.divider()
        st.button("Clear chat", on_click=_clear_chat, disabled=busy or not ss.messages, icon=":material/delete:",
                  width="stretch", help="Start a new conversation (the model stays loaded).")
        c1, c2 = st.columns(2)
        msgs = [m for m in ss.messages if m["role"] in ("user", "assistant")]
        c1.download_button("Markdown", export.to_markdown(msgs, system_prompt=system_prompt, model=model_label),
                           file_name="bitnet-chat.md", mime="text/markdown", on_click="ignore",
                           disabled=busy or not msgs, icon=":material/download:", width="stretch",
                           help="Save the chat as a Markdown file.")
        c2.download_button("JSON", export.to_json(msgs, system_prompt=system_prompt, model=model_label,
                                                  settings=state.decode_params()),
                           file_name="bitnet-chat.json", mime="application/json", on_click="ignore",
                           disabled=busy or not msgs, icon=":material/data_object:", width="stretch",
                           help="Save the chat with its settings and figures as JSON.")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _total_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.0f} K"


def model_info(model, label: str) -> None:
    info = model.info()
    isa = ISA_LABELS.get(str(info.get("isa")).lower(), str(info.get("isa")))
    with st.sidebar:
        with st.expander("Model info", icon=":material/memory:"):
            rows = [("Model", label), ("Parameters", _count(int(info["parameters"]))),
                    ("Model file", hub.format_bytes(int(info["file_bytes"]))),
                    ("Kernel path", isa), ("Threads", str(info.get("threads"))),
                    ("Context", f"{info.get('context')} tokens"),
                    ("RAM", f"{hub.format_bytes(_rss_bytes())} used of {hub.format_bytes(_total_ram())}"),
                    ("Diffusion-trained", "yes" if info.get("trained_for_diffusion") else "no")]
            st.markdown("\n".join(f"- **{k}:** {v}" for k, v in rows))
            st.caption(os.path.basename(str(info.get("path", ""))))
