"""The int8 KV cache (kv="i8": int8 rows with a scale per head and position) against the fp16 one, on the trained demo
model and on the generated families: it must agree with fp16 about as well as another rounding of the same cache
(fp32) does, which is what the next layer's int8 activations make of any small change. benchmarks/kv_agreement.py
measures the same on more prompts (benchmarks/BENCHMARKS.md)."""
import json
import os

import numpy as np
import pytest

from benchmarks.kv_agreement import compare
from bitnet_app.checkpoint.convert import convert_checkpoint
from bitnet_app.model import Model
from family_checkpoints import FAMILIES, make_family_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def models_of(path):
    return {kv: Model.open(path, kv=kv, threads=2) for kv in ("f16", "i8", "f32")}


def check_against_fp16(models, prompts, max_new, min_top1):
    """top-1 agreement of i8 with f16 at least min_top1, its median logit error within twice fp32's (the
    calibration), every position within 15% of the largest logit."""
    i8 = [compare(models["f16"], models["i8"], ids, max_new) for ids in prompts]
    f32 = [compare(models["f16"], models["f32"], ids, max_new) for ids in prompts]
    top1 = np.average([r["top1"] for r in i8], weights=[r["positions"] for r in i8])
    err, calib = np.median([r["err_median"] for r in i8]), np.median([r["err_median"] for r in f32])
    worst = max(r["err_max"] for r in i8)
    print(f"\ntop-1 {top1:.4f}  err median {err:.2e} (f32 vs f16: {calib:.2e})  max {worst:.2e}  greedy same "
          f"{np.mean([r['greedy_same'] for r in i8]):.0%}")
    assert top1 >= min_top1 and err <= 2 * calib and worst <= 0.15


def test_int8_cache_agrees_with_fp16_on_the_demo_model(tmp_path):
    """Measured (8 skill prompts + 8 open ones, 48 tokens): top-1 0.996 / 0.975, error median 0.9% / 1.6%
    (fp32 vs fp16: 0.7% / 1.5%); greedy replies the same for every skill prompt."""
    models = models_of(convert_checkpoint(os.path.join(REPO, "assets", "demo-model"), str(tmp_path / "demo.bitnet")))
    with open(os.path.join(REPO, "assets", "demo-prompts.json")) as f:
        texts = json.load(f)["skills"][:4]
    prompts = [models["f16"].chat_ids([{"role": "user", "content": t}]) for t in texts]
    check_against_fp16(models, prompts, 24, min_top1=0.97)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_int8_cache_agrees_with_fp16_on_each_family(tmp_path, name):
    """Random weights in each family's real layout (GQA, head sizes, rope scaling, sub-norms or none): measured
    top-1 0.95..0.99, error median 1.7..2.0% (fp32 vs fp16: 1.3..1.8%)."""
    truth = make_family_checkpoint(str(tmp_path / "hf"), name)
    models = models_of(convert_checkpoint(truth["folder"], str(tmp_path / "m.bitnet")))
    rng = np.random.default_rng(FAMILIES[name]["seed"])
    banned = {truth["bos"], truth["eos"], truth["eot"], *truth["stops"]}
    pool = np.array([i for i in range(truth["vocab_size"]) if i not in banned])
    check_against_fp16(models, [[int(i) for i in rng.choice(pool, 24)] for _ in range(3)], 24, min_top1=0.9)
