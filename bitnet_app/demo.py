"""Where the bundled demo model is: one answer for the app, the CLI and the tests.

The demo model is a small BitNet checkpoint trained for block diffusion, shipped in the repository as
`assets/demo-model/` (an ordinary Hugging Face folder). It is looked for in this order:

1. $BITNET_DEMO_MODEL, when set: that folder and nothing else (a wrong path means "no demo model",
   never silently another one; tests use it to point at their own checkpoint or at nothing);
2. `assets/demo-model` beside the package (running from the checkout, or an editable install);
3. `assets/demo-model` under the current folder (after `pip install .` the package lives in
   site-packages, but `streamlit run app.py` runs from the checkout).

A folder counts only if it holds config.json.
"""
import os

ENV = "BITNET_DEMO_MODEL"
NAME = "demo"  # `--model demo` on the command line
PACKAGE_DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "demo-model")


def candidates() -> list[str]:
    """The folders looked at, in order."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return [os.path.abspath(os.path.expanduser(env))]
    return [PACKAGE_DEMO, os.path.abspath(os.path.join("assets", "demo-model"))]


def demo_model_dir() -> str | None:
    """The bundled demo model's checkpoint folder, or None when this copy of the app has none."""
    for folder in candidates():
        if os.path.isfile(os.path.join(folder, "config.json")):
            return folder
    return None


def missing_message() -> str:
    """What to say when the demo model was asked for but is not there."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return f"{ENV} is set to {env}, which is not a model checkpoint folder (it has no config.json)."
    return ("This copy of the app has no bundled demo model (assets/demo-model/config.json was not found next "
            f"to the package or in the current folder). Run from the repository checkout, or set {ENV}.")
