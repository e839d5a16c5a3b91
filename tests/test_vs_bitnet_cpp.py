"""benchmarks/vs_bitnet_cpp.py's own logic, with no bitnet.cpp build: reading llama-bench's JSON, the clear
error (exit 2, what to run) when the anchor is missing, the load figures and the read roof."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks import vs_bitnet_cpp as vs
from benchmarks.run_benchmarks import build_ceiling

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `llama-bench -m models/bitnet2b4t-dummy-i2_s.gguf -t 2 -r 2 -p 0 -n 8 -o json` of bitnet.cpp (ygqdan/BitNet-linux
# snapshot, shared/tools/bitnet_cpp recipe) on the random 2B-4T GGUF, exactly as it printed it on a 2-vCPU EPYC
# (a busy one: hence 3.9 tok/s).
LLAMA_BENCH_TG8 = """[
  {
    "build_commit": "unknown",
    "build_number": 0,
    "cuda": false,
    "vulkan": false,
    "kompute": false,
    "metal": false,
    "sycl": false,
    "rpc": "0",
    "gpu_blas": false,
    "blas": false,
    "cpu_info": "AMD EPYC",
    "gpu_info": "",
    "model_filename": "models/bitnet2b4t-dummy-i2_s.gguf",
    "model_type": "bitnet-b1.58 2B I2_S - 2 bpw ternary",
    "model_size": 1836120640,
    "model_n_params": 2741155840,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": 99,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": false,
    "tensor_split": "0.00",
    "use_mmap": true,
    "embeddings": false,
    "n_prompt": 0,
    "n_gen": 8,
    "test_time": "2026-11-23T21:27:15Z",
    "avg_ns": 2047579763,
    "stddev_ns": 32041829,
    "avg_ts": 3.907530,
    "stddev_ts": 0.061148,
    "samples_ns": [ 2070236758, 2024922768 ],
    "samples_ts": [ 3.86429, 3.95077 ]
  }
]
"""


def test_llama_bench_json_is_read_per_test():
    (tg,) = vs.parse_llama_bench_json(LLAMA_BENCH_TG8)
    assert tg["test"] == "tg8"
    assert tg["samples_ts"] == [3.86429, 3.95077]
    assert tg["threads"] == 2 and tg["type_k"] == "f16" and "I2_S" in tg["model_type"]
    pp = json.loads(LLAMA_BENCH_TG8)
    pp[0].update(n_prompt=128, n_gen=0, samples_ts=[60.5, 58.25])
    (p,) = vs.parse_llama_bench_json(json.dumps(pp))
    assert p["test"] == "pp128" and p["samples_ts"] == [60.5, 58.25]


@pytest.mark.parametrize("text", ["", "llama-bench: error: failed to load model", "[]", "{}"])
def test_llama_bench_output_that_is_not_a_result_is_an_error(text):
    with pytest.raises(ValueError, match="llama-bench"):
        vs.parse_llama_bench_json(text)


def test_a_llama_bench_test_without_samples_is_an_error():
    bad = json.loads(LLAMA_BENCH_TG8)
    bad[0]["samples_ts"] = []
    with pytest.raises(ValueError, match="samples_ts"):
        vs.parse_llama_bench_json(json.dumps(bad))


def test_tests_are_named_as_llama_bench_names_them():
    assert vs.parse_test("tg64") == (0, 64) and vs.parse_test("pp8") == (8, 0)
    cmd = vs.llama_bench_command("/a/llama-bench", "/a/m.gguf", "pp32", 2, 3)
    assert cmd[cmd.index("-p") + 1] == "32" and cmd[cmd.index("-n") + 1] == "0"
    assert cmd[cmd.index("-t") + 1] == "2" and cmd[cmd.index("-r") + 1] == "3" and cmd[-2:] == ["-o", "json"]
    for bad in ("tg", "pp0", "x64", "tg-1"):
        with pytest.raises(ValueError, match="tgN"):
            vs.parse_test(bad)


def test_a_missing_anchor_says_what_to_build_and_exits_2(tmp_path):
    anchor = tmp_path / "no-anchor"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.vs_bitnet_cpp", "--anchor", str(anchor)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""  # no table, no figure
    assert str(anchor / "build-new-i2s/bin/llama-bench") in proc.stderr
    assert str(anchor / "models/bitnet2b4t-dummy-i2_s.gguf") in proc.stderr
    assert "build.sh deps src-new build-new-i2s models-i2s" in proc.stderr


def test_an_incomplete_anchor_names_only_what_is_missing(tmp_path):
    bench = tmp_path / "build-new-i2s/bin/llama-bench"
    bench.parent.mkdir(parents=True)
    bench.write_text("#!/bin/sh\n")
    bench.chmod(0o755)
    with pytest.raises(vs.AnchorMissing) as e:
        vs.check_anchor(str(tmp_path))
    assert "bitnet2b4t-dummy-i2_s.gguf" in str(e.value) and "llama-bench\n" not in str(e.value)
    (tmp_path / "models").mkdir()
    (tmp_path / "models/bitnet2b4t-dummy-i2_s.gguf").write_bytes(b"GGUF")
    found = vs.check_anchor(str(tmp_path))  # the Q6_K-head variant is optional
    assert found == {"bitnet.cpp I2_S, F16 head": (str(bench), str(tmp_path / "models/bitnet2b4t-dummy-i2_s.gguf"))}
    (tmp_path / "models/bitnet2b4t-dummy-i2_s-embq6k.gguf").write_bytes(b"GGUF")
    assert "bitnet.cpp I2_S, Q6_K head" in vs.check_anchor(str(tmp_path))


def test_the_tl2_variant_needs_its_own_build_and_runs_decode_only(tmp_path):
    """TL2 (bitnet.cpp's AVX2 lookup-table kernels) has a llama-bench of its own; without it the variant is left
    out, not run with the I2_S build."""
    for rel in ("build-new-i2s/bin/llama-bench", "build-new-tl2/bin/llama-bench"):
        (tmp_path / rel).parent.mkdir(parents=True)
    i2s = tmp_path / "build-new-i2s/bin/llama-bench"
    i2s.write_text("#!/bin/sh\n")
    i2s.chmod(0o755)
    (tmp_path / "models").mkdir()
    for m in ("bitnet2b4t-dummy-i2_s.gguf", "bitnet2b4t-dummy-tl2.gguf"):
        (tmp_path / "models" / m).write_bytes(b"GGUF")
    assert "bitnet.cpp TL2, F16 head" not in vs.check_anchor(str(tmp_path))
    tl2 = tmp_path / "build-new-tl2/bin/llama-bench"
    tl2.write_text("#!/bin/sh\n")
    tl2.chmod(0o755)
    assert vs.check_anchor(str(tmp_path))["bitnet.cpp TL2, F16 head"] == \
        (str(tl2), str(tmp_path / "models/bitnet2b4t-dummy-tl2.gguf"))
    assert vs.THEIRS["bitnet.cpp TL2, F16 head"].decode_only and not vs.THEIRS["bitnet.cpp I2_S, F16 head"].decode_only


def test_the_ratio_to_their_best_variant_takes_the_fastest_of_the_sitting():
    def by(**medians):
        return {name: {"median": m} for name, m in medians.items()}

    s = {"tg64": by(**{"ours, int8 head": 30.0, "bitnet.cpp I2_S, F16 head": 20.0, "bitnet.cpp TL2, F16 head": 25.0}),
         "pp32": by(**{"ours, int8 head": 100.0, "bitnet.cpp I2_S, F16 head": 50.0})}  # TL2: no pp figure
    r = vs.ratios(s)
    assert r["tg64"]["ours int8 / theirs' best variant"] == 30.0 / 25.0
    assert r["tg64"]["ours int8 / theirs TL2"] == 30.0 / 25.0 and r["tg64"]["ours int8 / theirs F16"] == 1.5
    assert r["pp32"] == {"ours int8 / theirs F16": 2.0, "ours int8 / theirs' best variant": 2.0}


def test_a_llama_bench_that_cannot_run_is_missing(tmp_path):
    bench = tmp_path / "build-new-i2s/bin/llama-bench"
    bench.parent.mkdir(parents=True)
    bench.write_text("not a program")  # not executable
    (tmp_path / "models").mkdir()
    (tmp_path / "models/bitnet2b4t-dummy-i2_s.gguf").write_bytes(b"GGUF")
    with pytest.raises(vs.AnchorMissing, match="llama-bench"):
        vs.check_anchor(str(tmp_path))


def test_summary_and_ratios_come_from_the_undisturbed_samples():
    def rec(config, samples, other):
        return {"test": "tg64", "config": config, "samples_ts": samples, "other_cores": other, "load1_before": 1.0}

    recs = [rec("ours, int8 head", [20.0, 22.0], 0.0), rec("ours, int8 head", [18.0], 0.1),
            rec("ours, int8 head", [5.0, 6.0], 1.0),  # disturbed: dropped, undisturbed ones exist
            rec("bitnet.cpp I2_S, F16 head", [10.0, 12.0, 8.0], 0.9)]  # disturbed, but all there is: kept
    s = vs.summarize(recs, ["tg64", "pp8"], max_other=0.15)
    assert set(s) == {"tg64"}
    ours = s["tg64"]["ours, int8 head"]
    assert (ours["median"], ours["min"], ours["max"], ours["n"], ours["dropped"], ours["other_max"]) == \
        (20.0, 18.0, 22.0, 3, 1, 0.1)
    theirs = s["tg64"]["bitnet.cpp I2_S, F16 head"]
    assert (theirs["median"], theirs["n"], theirs["dropped"], theirs["other_max"]) == (10.0, 3, 0, 0.9)
    r = vs.ratios(s)["tg64"]
    # no Q6_K, TL2 or bf16 run: no ratio made up for them
    assert r == {"ours int8 / theirs F16": 2.0, "ours int8 / theirs' best variant": 2.0}


def test_other_load_is_the_machine_minus_the_child():
    assert vs.other_cores(busy_s=4.0, child_cpu_s=3.0, wall_s=2.0) == 0.5
    assert vs.other_cores(busy_s=3.9, child_cpu_s=4.0, wall_s=2.0) == 0.0  # tick rounding, never negative


def test_the_read_roof_comes_from_the_ceiling_tool(tmp_path):
    """benchmarks/ceilings/readbw.c, compiled and run as the sitting does (1 thread: a second at most)."""
    exe = build_ceiling("readbw", str(tmp_path))
    out = subprocess.run([exe, "1"], capture_output=True, text=True, check=True).stdout
    assert vs.parse_readbw(out) > 0.5  # GB/s: any machine that runs the engine reads faster than this
    with pytest.raises(ValueError, match="read GB/s"):
        vs.parse_readbw("cannot allocate 1 GiB\n")


def test_configurations_alternate_ours_and_theirs():
    assert vs.interleaved(["o1", "o2"], ["t1", "t2"]) == ["o1", "t1", "o2", "t2"]
    assert vs.interleaved(["o1", "o2"], ["t1"]) == ["o1", "t1", "o2"]  # no Q6_K build: the rest at the end


def test_a_saved_sitting_prints_its_tables_again():
    """--report on the sitting recorded in BENCHMARKS.md: every figure comes from its records."""
    saved = os.path.join(REPO, "benchmarks", "results", "2026-11-23-vs-bitnet-cpp-ebbc61b.json")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.vs_bitnet_cpp", "--report", saved, "--anchor", "/nowhere"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(saved) as f:
        result = json.load(f)
    s = vs.summarize(result["records"], result["tests"], result["max_other"])
    ours, theirs = s["tg64"]["ours, int8 head"], s["tg64"]["bitnet.cpp I2_S, F16 head"]
    gb_s = result["bytes_per_token"]["ours, int8 head"] * ours["median"] / 1e9
    assert f"| tg64 | ours, int8 head: int8 + fp32 row scale (default) | 849 MB | {ours['median']:.2f} " in proc.stdout
    assert f"| {gb_s:.1f} (" in proc.stdout
    assert f"| ours int8 / theirs F16 | {ours['median'] / theirs['median']:.2f}x |" in proc.stdout
