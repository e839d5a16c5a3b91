import json, sys, time
import bitnet_app
from bitnet_app.decode.events import Done
m = bitnet_app.load_model("demo", threads=2)
prompts = json.load(open("/work/main/assets/demo-prompts.json"))["skills"][:16]
for mode in ("ar", "diffusion"):
    for kw in (dict(temperature=0.0), dict(temperature=0.7, top_p=0.9, seed=1)):
        toks = 0; t = 0.0; step_s = 0.0; steps = 0
        for p in prompts:
            ids = m.chat_ids([{"role": "user", "content": p}])
            for ev in m.generate(ids, mode=mode, max_new_tokens=256, **kw):
                if isinstance(ev, Done):
                    toks += ev.stats["tokens"]; t += ev.stats["total_s"]; step_s += ev.stats.get("step_s", 0); steps += ev.stats.get("steps", 0)
        extra = f", step {1e3*step_s/steps:.3f} ms" if steps else ""
        print(f"{mode:9s} {kw}: {toks} tokens, {toks/t:.0f} tok/s{extra}")
