"""The model picker's choices, and what each one means (a Hub repo or a folder on this computer)."""
import os
from dataclasses import dataclass

from .. import catalog
from ..demo import demo_model_dir
from ..source import DEFAULT_REPO, DEMO, is_repo_id
from ..units import format_bytes
from . import suggestions

BF16_REPO = DEFAULT_REPO + "-bf16"
DEMO_LABEL = "Demo model"  # the bundled demo model's one name: in the picker, the sidebar, the notices, exports
CUSTOM_LABEL = "Another Hub repo or local folder…"
OPEN_PICKER = "open_model_picker"  # session-state flag: the next run opens the picker's list (its notice's button)
MODEL_ENV = "BITNET_APP_MODEL"  # preselects a repo id or folder (also handy for scripted demos and tests)

DESCRIPTIONS = {  # what each picker choice is, shown under the picker while that model runs
    DEFAULT_REPO: "Microsoft's 2B model, packed 1.58-bit weights (about 1.2 GB download).",
    BF16_REPO: "The same model with bf16 master weights (about 4.8 GB download, converted here).",
}


def demo_description() -> str:
    """The bundled demo model in one sentence. Its prompt file says whether it was trained on skills (the
    current demo model) or on Shakespeare alone (the first one), so the sentence holds for the one shipped."""
    skills = any(kind == "skill" for _, kind in suggestions.for_folder(demo_model_dir()))
    if skills:
        return ("A small chat model that ships with the app and runs offline, trained by us for both decode modes "
                "on short skills (counting, times tables, letters, days and months, repeating a phrase) and on "
                "Shakespeare. It gets the suggested prompts exactly right, and most skill questions in your own "
                "words; on counts and tables block diffusion settles several tokens per step.")
    return ("A tiny model trained on Shakespeare that ships with the app and runs offline: it continues the text "
            "you give it (expect style, not sense) and was trained for block diffusion.")


def needs_line(entry: catalog.Entry, roof_gb_s: float | None = None, free_ram: int | None = None) -> str:
    """Download, memory and expected decode speed of a catalog model on this machine, with a warning when the
    memory it needs is more than the computer has free."""
    n = catalog.needs(entry, roof_gb_s)
    free_ram = catalog.available_ram() if free_ram is None else free_ram
    parts = [f"{format_bytes(n.download_bytes)} download",
             f"about {format_bytes(n.memory_bytes)} of memory"]
    if n.expected_tok_s is not None:
        parts.append(f"up to ~{n.expected_tok_s:.0f} tokens/s here ({format_bytes(n.bytes_per_token)} read per "
                     f"token at {roof_gb_s:.0f} GB/s)")
    line = " · ".join(parts) + "."
    if free_ram and n.memory_bytes > free_ram:
        line += f" ⚠ This computer has only {format_bytes(free_ram)} of memory free: it may not run."
    if not entry.chat:
        line += " A base model with no chat template: it continues your text (completion)."
    if not entry.verified:
        line += " (Sizes from the expected shape; the checkpoint's config decides.)"
    return line


def describe(source: "Source", roof_gb_s: float | None = None) -> str:
    """What the model behind `source` is, in a sentence or two (with its needs when the catalog knows it)."""
    if source.label == DEMO_LABEL:
        return demo_description()
    entry = catalog.ENTRIES.get(source.target) if source.kind == "hub" else None
    if source.label in DESCRIPTIONS:
        return DESCRIPTIONS[source.label] + (" " + needs_line(entry, roof_gb_s) if entry else "")
    if entry is not None:
        return f"{entry.name}. " + needs_line(entry, roof_gb_s)
    if source.kind == "hub":
        return "A Hugging Face repository, downloaded and converted for this CPU once."
    if not os.path.exists(source.target):
        return f"There is no folder or file at {source.target} on this computer: check the path."
    if source.target.endswith(".bitnet"):
        return "An engine file on this computer."
    return "A checkpoint folder on this computer, converted for this CPU once."


@dataclass(frozen=True)
class Source:
    label: str   # what the picker shows
    kind: str    # "hub" | "folder" | "demo"
    target: str  # what bitnet_app.source.prepare takes: a repo id, an absolute path, or "demo"

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.target}"


def folder_of(source: Source) -> str | None:
    """The checkpoint folder behind `source` on this computer (its prompt file lives there), or None."""
    if source.kind == "demo":
        return demo_model_dir()
    return source.target if source.kind == "folder" and os.path.isdir(source.target) else None


def demo_available() -> bool:
    return demo_model_dir() is not None


def demo_source() -> Source:
    """The bundled demo model (when it is missing, prepare() explains that)."""
    return Source(DEMO_LABEL, "demo", DEMO)


def choices() -> list[str]:
    labels = [DEFAULT_REPO, BF16_REPO] + [r for r in catalog.ENTRIES if r not in (DEFAULT_REPO, BF16_REPO)]
    if demo_available():
        labels.append(DEMO_LABEL)
    env = os.environ.get(MODEL_ENV, "").strip()
    if env and env not in labels:
        labels.insert(0, env)
    labels.append(CUSTOM_LABEL)
    return labels


def picker_label(label: str, not_downloaded: bool = False) -> str:
    """What the picker shows for choice `label`: a known Hub model by its short name with its download size (the
    sidebar is too narrow for owner/name ids), the demo model as bundled; not_downloaded: the chosen Hub model is out
    of reach and the demo model runs in its place (the caption under the picker says so), so it shows that state
    instead of its size."""
    if label == DEMO_LABEL:
        return f"{DEMO_LABEL} · bundled"
    entry = catalog.ENTRIES.get(label)
    if not_downloaded:
        return f"{short_name(label)} · not downloaded"
    if entry is None:
        return label
    return f"{short_name(label)} · {format_bytes(catalog.needs(entry).download_bytes)}"


def short_name(repo: str) -> str:
    """A repo id without its owner, and without a "-1.58bit" / "-1.58" marker (every model here is 1.58-bit):
    "microsoft/bitnet-b1.58-2B-4T" -> "bitnet-b1.58-2B-4T", "HF1BitLLM/Llama3-8B-1.58-100B-tokens" ->
    "Llama3-8B-100B-tokens"."""
    if not is_repo_id(repo):
        return repo
    name = repo.rsplit("/", 1)[-1]
    return name.replace("-1.58bit", "").replace("-1.58-", "-")


def default_choice() -> str:
    return os.environ.get(MODEL_ENV, "").strip() or DEFAULT_REPO


def resolve(label: str, custom: str = "") -> Source | None:
    """The Source behind a picker label (None while "custom" is chosen but empty)."""
    text = (custom if label == CUSTOM_LABEL else label).strip()
    if label == DEMO_LABEL or text == DEMO:  # "demo" names the bundled demo model everywhere
        return demo_source()
    if not text:
        return None
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.isdir(path) or not is_repo_id(text):
        return Source(text, "folder", path)
    return Source(text, "hub", text)
