"""The demo model's greedy replies to its suggested skill prompts (assets/demo-suggestions.json "skills": each has one
right answer), in AR and in block diffusion with the model's own settings, as JSON on stdout: {mode: {prompt: reply}}.
CI runs it on the x86 host and under qemu-aarch64 (the NEON paths) and requires the same replies (.ci/arm64_stage.sh).
The "open" suggestion (continue a Shakespeare scene) is left out: its 256-token continuation meets near-ties between
two tokens, where the last bit of a float sum decides, and x86's own paths differ there (portable C against AVX2 and
AVX-512 from about the 30th token), so it tests no property of a port; the skill replies are the same on every path.
Only the package, numpy and tokenizers: it runs on the emulated arm64 Python.
    python .ci/demo_replies.py [engine file: converted here when absent] [kernel path: default the automatic one]"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bitnet_app.checkpoint.convert import convert_checkpoint  # noqa: E402
from bitnet_app.demo import demo_model_dir  # noqa: E402
from bitnet_app.model import Model  # noqa: E402

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "demo.bitnet"
    isa = sys.argv[2] if len(sys.argv) > 2 else None
    if not os.path.exists(path):
        convert_checkpoint(demo_model_dir(), path)
    with open(os.path.join(ASSETS, "demo-suggestions.json"), encoding="utf-8") as f:
        data = json.load(f)
    prompts = [item["prompt"] for item in data["skills"]]
    m = Model.open(path, threads=2, isa=isa)
    out = {"kernel_path": m.engine.isa, "ar": {}, "diffusion": {}}
    for prompt in prompts:
        ids = m.chat_ids([{"role": "user", "content": prompt}])
        for mode in ("ar", "diffusion"):
            out[mode][prompt] = m.decode(m.complete(ids, mode=mode, max_new_tokens=256))
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
