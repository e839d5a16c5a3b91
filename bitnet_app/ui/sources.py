"""The model picker's choices, and what each one means (a Hub repo or a folder on this computer)."""
import os
from dataclasses import dataclass

from ..demo import demo_model_dir
from ..source import DEFAULT_REPO, DEMO, is_repo_id

BF16_REPO = DEFAULT_REPO + "-bf16"
DEMO_LABEL = "Demo model (bundled, offline)"
CUSTOM_LABEL = "Another Hub repo or local folder…"
MODEL_ENV = "BITNET_APP_MODEL"  # preselects a repo id or folder (also handy for scripted demos and tests)

DESCRIPTIONS = {
    DEFAULT_REPO: "Microsoft's 2B model, packed 1.58-bit weights (about 1.2 GB download).",
    BF16_REPO: "The same model with bf16 master weights (about 4.8 GB download, converted here).",
    DEMO_LABEL: "A tiny model trained on Shakespeare that ships with the app: works offline, continues the "
                "text you give it, and was trained for block diffusion.",
}


@dataclass(frozen=True)
class Source:
    label: str   # what the picker shows
    kind: str    # "hub" | "folder" | "demo"
    target: str  # what bitnet_app.source.prepare takes: a repo id, an absolute path, or "demo"

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.target}"


def demo_available() -> bool:
    return demo_model_dir() is not None


def demo_source() -> Source:
    """The bundled demo model (when it is missing, prepare() explains that)."""
    return Source(DEMO_LABEL, "demo", DEMO)


def choices() -> list[str]:
    labels = [DEFAULT_REPO, BF16_REPO]
    if demo_available():
        labels.append(DEMO_LABEL)
    env = os.environ.get(MODEL_ENV, "").strip()
    if env and env not in labels:
        labels.insert(0, env)
    labels.append(CUSTOM_LABEL)
    return labels


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
