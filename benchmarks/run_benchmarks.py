"""The engine benchmark protocol (results and how to read them: benchmarks/BENCHMARKS.md), in one run:

1. the machine (CPU model, flags) and its two ceilings, measured now with the tools in benchmarks/ceilings/
   (read roof GB/s and AVX2 int8 multiply-add GMAC/s, with 1 and 2 threads), before and after the run;
2. `bitnet_app.bench.run_bench` on the 2B-4T shape (random weights) for every kernel path the CPU has:
   tg128, pp128, single forwards of 1/4/8/16/32 tokens, as fractions of the ceilings;
3. beside the speed, the agreement at that setting: int8 head vs exact head (top-1 agreement and
   relative logit error over 64 positions) and every path against the fastest one the CPU has;
4. memory: peak resident set with one engine (short context and an almost full one), and the time to
   open a converted file and produce the first token.

    python -m benchmarks.run_benchmarks [--repeats 5] [--out benchmarks/results]

Run from the repository root (the checkout's bitnet_app is imported, here and in the child processes).

Writes <out>/<date>-<commit>.json and prints the markdown rows for BENCHMARKS.md.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from bitnet_app.engine import kernel_paths

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MACS_PER_TOKEN_2B4T = 2.084e9  # ternary weights of the 30 layers (performance.md)
# the last layer's o, gate, up and down (2560 x 2560 + 3 x 6912 x 2560), which an n-token forward with one row of
# logits runs for that row only (the engine trims its last layer: _kernels/forward.c, trims_last_layer)
MACS_LAST_TAIL_2B4T = 2560 * 2560 + 3 * 6912 * 2560


def macs_of_block(n: int) -> float:
    """Ternary multiply-adds of an n-token forward of the 2B-4T shape asking for one row of logits."""
    return n * MACS_PER_TOKEN_2B4T - (n - 1) * MACS_LAST_TAIL_2B4T


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


# the CPU flags that decide the kernel paths (bitnet_app/engine/kernel_paths.py), and AVX512-VBMI
PATH_FLAGS = sorted(set().union(*(p.cpu_flags for p in kernel_paths.PATHS)) | {"avx512_vbmi"})


def machine() -> dict:
    info = sh(["lscpu"])
    model = re.search(r"Model name:\s*(.+)", info).group(1).strip()
    flags = re.search(r"Flags:\s*(.+)", info).group(1).split()
    return {"cpu": model, "cpus": os.cpu_count(), "flags": [f for f in PATH_FLAGS if f in flags]}


CEILINGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ceilings")


# compile flags per ceiling tool: the plain AVX2 ones run on every CPU the fast paths run on; int8_vnni needs
# AVX-512 VNNI and int8_amx AMX-INT8 (each is measured only where the CPU has it)
CEILING_FLAGS = {"readbw": ["-mavx2"], "int8_avx2": ["-mavx2"],
                 "int8_vnni": ["-mavx512f", "-mavx512bw", "-mavx512vnni"], "int8_amx": ["-mamx-tile", "-mamx-int8"]}


def build_ceiling(name: str, folder: str) -> str:
    """Compile ceilings/<name>.c (readbw, int8_avx2, int8_vnni, int8_amx) into `folder`; the program's path."""
    exe = os.path.join(folder, name)
    subprocess.run(["gcc", "-O2", *CEILING_FLAGS[name], "-pthread", os.path.join(CEILINGS, f"{name}.c"), "-o", exe],
                   check=True, capture_output=True, text=True)
    return exe


def has_avx512_vnni() -> bool:
    return "avx512_vnni" in machine()["flags"]


def has_amx() -> bool:
    return {"amx_tile", "amx_int8"} <= set(machine()["flags"])


def ceiling_tool(isa: str) -> str:
    """The int8 ceiling tool of a kernel path: tdpbusd on tiles for the AMX path, vpdpbusd on zmm registers for the
    AVX-512 path, the AVX2 int8 steps for the others (the AVX-VNNI path's 256-bit vpdpbusd is measured against
    AVX2's ceiling: a stricter bar on CPUs where vpdpbusd beats vpmaddubsw + vpaddw)."""
    return {kernel_paths.AMX: "int8_amx", kernel_paths.AVX512: "int8_vnni"}.get(isa, "int8_avx2")


def ceilings() -> dict:
    """Build and run this folder's ceiling tools with 1 and 2 threads (ceilings/readbw.c, ceilings/int8_avx2.c,
    ceilings/int8_vnni.c where the CPU has AVX-512 VNNI, ceilings/int8_amx.c where it has AMX-INT8); parse their
    figures. stream_gb_s: the read roof of 2 threads (decode's ceiling); batch_gmac_s: the AVX2 int8 multiply-add
    ceiling of 2 threads (the 256-bit paths' batched forwards); vnni_gmac_s: the vpdpbusd zmm ceiling of 2 threads
    (the AVX-512 path's); amx_gmac_s: the tdpbusd tile ceiling of 2 threads (the AMX path's)."""
    out = {}
    vnni, amx = has_avx512_vnni(), has_amx()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("readbw", "int8_avx2") + (("int8_vnni",) if vnni else ()) + (("int8_amx",) if amx else ()):
            build_ceiling(name, tmp)
        for th in (1, 2):
            out[f"read_gb_s_t{th}"] = float(re.search(r"threads=\d+ read GB/s ([\d.]+)", sh([f"{tmp}/readbw", str(th)])).group(1))
            out[f"int8_gmac_s_t{th}"] = float(re.search(r"int8 ceiling GMAC/s ([\d.]+)", sh([f"{tmp}/int8_avx2", str(th)])).group(1))
            if vnni:
                out[f"vnni_gmac_s_t{th}"] = float(re.search(r"int8 ceiling GMAC/s ([\d.]+)", sh([f"{tmp}/int8_vnni", str(th)])).group(1))
            if amx:
                out[f"amx_gmac_s_t{th}"] = float(re.search(r"int8 ceiling GMAC/s ([\d.]+)", sh([f"{tmp}/int8_amx", str(th)])).group(1))
    out["stream_gb_s"] = out["read_gb_s_t2"]
    out["batch_gmac_s"] = out["int8_gmac_s_t2"]
    if vnni:
        out["vnni_gmac_s"] = out["vnni_gmac_s_t2"]
    if amx:
        out["amx_gmac_s"] = out["amx_gmac_s_t2"]
    return out


def path_ceiling(c: dict, isa: str) -> float:
    """The int8 ceiling (GMAC/s, 2 threads) a path's batched forwards are measured against (ceiling_tool)."""
    return {"int8_amx": c.get("amx_gmac_s"), "int8_vnni": c.get("vnni_gmac_s")}.get(ceiling_tool(isa), c["batch_gmac_s"])


def bench_path(path: str, isa: str, repeats: int, lm_head: str = "int8") -> dict:
    """run_bench in a child process, so every path starts from the same clean state."""
    code = (f"import json\nfrom bitnet_app.bench import run_bench\n"
            f"print(json.dumps(run_bench({path!r}, threads=2, isa={isa!r}, repeats={repeats}, lm_head={lm_head!r})))\n")
    return json.loads(sh([sys.executable, "-c", code]).strip().splitlines()[-1])


def memory_and_load(path: str, ctx_fill: int = 0) -> dict:
    """In a fresh process with ONE engine (RSS counts every mapping of the file separately): seconds to
    open the file and produce the first token, then peak RSS after 128 decode steps and a 32-token
    forward, optionally after filling ctx_fill positions of the KV cache first."""
    code = (
        "import json, time\n"
        "from bitnet_app.engine import Engine, EngineFile\n"
        "from bitnet_app.platform import peak_rss\n"
        f"t = time.perf_counter(); ef = EngineFile({path!r}); e = Engine(ef, threads=2); e.forward([1])\n"
        "load = time.perf_counter() - t\n"
        f"n = {ctx_fill}\n"
        "for i in range(0, n, 256): e.forward(list(range(1, min(256, n - i) + 1)))\n"
        "for i in range(128): e.forward([7])\n"
        "e.forward(list(range(32)), commit=False, rows=range(8))\n"
        "print(json.dumps({'load_and_first_token_s': load, 'context_used': e.n_past, "
        "'peak_rss_mb': peak_rss() / 2**20}))\n")
    return json.loads(sh([sys.executable, "-c", code]).strip().splitlines()[-1])


def agreement(path: str, isas: list[str]) -> dict:
    """Logit agreement at the benchmarked settings, on 64 positions of random ids. Random 30-layer
    ternary models are chaotic (a 1e-7 difference flips an int8 rounding somewhere and the flip
    travels), so each comparison changes ONE thing and reports top-1 agreement and median error."""
    from bitnet_app.engine import Engine, EngineFile

    ef = EngineFile(path)
    ids = np.random.default_rng(1).integers(0, ef.config["vocab_size"], 64)

    def run(**kw):
        return Engine(ef, threads=2, **kw).forward(ids, rows=range(64))

    def compare(a, b):
        err = np.abs(a - b).max(axis=1) / np.abs(b).max()
        return {"top1": float(np.mean(a.argmax(1) == b.argmax(1))), "median_err": float(np.median(err)),
                "max_err": float(err.max())}

    best = isas[0]  # the fastest path this CPU has (amx, else avx512, else avxvnni, else avx2, else portable)
    base = run(lm_head="exact", kv="f32", isa=best)
    res = {"int8 head vs exact head (fp32 KV)": compare(run(lm_head="int8", kv="f32", isa=best), base),
           "fp16 KV vs fp32 KV (exact head)": compare(run(lm_head="exact", kv="f16", isa=best), base)}
    for isa in isas[1:]:
        res[f"{isa} vs {best} (exact head, fp32 KV)"] = compare(run(lm_head="exact", kv="f32", isa=isa), base)
    return res


def rows(result: dict) -> str:
    c = result["ceilings"]
    lines = [f"Machine: {result['machine']['cpu']}, {result['machine']['cpus']} CPUs, flags "
             f"{' '.join(result['machine']['flags'])}; commit {result['commit']}, {result['date']}.",
             f"Ceilings measured in the same run (benchmarks/ceilings/): read roof {c['stream_gb_s']:.1f} GB/s "
             f"(2 threads); AVX2 int8 multiply-add {c['batch_gmac_s']:.0f} GMAC/s (2 threads)"
             + (f"; AVX-512 VNNI vpdpbusd {c['vnni_gmac_s']:.0f} GMAC/s (2 threads, the avx512 row's int8 ceiling)"
                if "vnni_gmac_s" in c else "")
             + (f"; AMX tdpbusd {c['amx_gmac_s']:.0f} GMAC/s (2 threads, the amx row's int8 ceiling)"
                if "amx_gmac_s" in c else "") + ".", "",
             "| path | tg128 tok/s | % of stream ceiling | pp128 tok/s | 1 / 8 / 32-token forward ms | 8x, 32x of 1 "
             "| 8 / 32-token GMAC/s (% of int8 ceiling) | 8 / 32 rows of logits ms |",
             "|---|---|---|---|---|---|---|---|"]
    for isa, r in result["paths"].items():
        bm = {int(k): v for k, v in r["block_ms"].items()}
        ba = {int(k): v for k, v in r["block_ms_all_rows"].items()}
        g8, g32 = (macs_of_block(n) / (bm[n] / 1e3) / 1e9 for n in (8, 32))
        ceil = path_ceiling(c, isa)
        lines.append(
            f"| {r['isa']} | {r['decode_tok_s']:.2f} [{r['decode_tok_s_spread'][0]:.2f}-{r['decode_tok_s_spread'][1]:.2f}]"
            f" | {100 * r['weight_gb_s'] / c['stream_gb_s']:.0f}% ({r['weight_gb_s']:.1f} GB/s)"
            f" | {r['prefill_tok_s']:.1f} | {bm[1]:.1f} / {bm[8]:.1f} / {bm[32]:.1f}"
            f" | {bm[8] / bm[1]:.2f}x, {bm[32] / bm[1]:.2f}x"
            f" | {g8:.0f} ({100 * g8 / ceil:.0f}%) / {g32:.0f} ({100 * g32 / ceil:.0f}%)"
            f" | {ba[8]:.1f} / {ba[32]:.1f} |")
    m = result["memory"]
    lines += ["", f"Memory and load (fastest path, int8 head, fp16 KV): open + first token {m['short']['load_and_first_token_s']:.2f} s "
              f"(file already in the page cache); peak RSS {m['short']['peak_rss_mb']:.0f} MB after 128 decode steps, "
              f"{m['long']['peak_rss_mb']:.0f} MB with {m['long']['context_used']} positions of context."]
    lines += ["", "Agreement (2B-4T shape, random weights, 64 positions; each row changes one setting):", "",
              "| comparison | top-1 agreement | median / max logit error (of the largest logit) |", "|---|---|---|"]
    for name, a in result["agreement"].items():
        lines.append(f"| {name} | {100 * a['top1']:.1f}% | {100 * a['median_err']:.4f}% / {100 * a['max_err']:.2f}% |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--portable-repeats", type=int, default=1, help="the portable path is slow")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()

    from bitnet_app.bench import synthetic_file

    isas = kernel_paths.supported(emulated=False)
    with synthetic_file("2b4t") as path:  # 1.5 GB, deleted at the end (bench --synthetic 2b4t --keep keeps one)
        commit = sh(["git", "rev-parse", "--short", "HEAD"], cwd=REPO).strip()
        result = {"date": datetime.datetime.now().isoformat(timespec="minutes"), "commit": commit,
                  "machine": machine()}
        t = time.time()
        result["ceilings_before"] = ceilings()
        result["paths"] = {}
        for isa in isas:
            reps = args.repeats if kernel_paths.BY_NAME[isa].simd else args.portable_repeats
            result["paths"][isa] = bench_path(path, isa, reps)
            print(f"{isa}: {result['paths'][isa]['decode_tok_s']:.2f} tok/s", file=sys.stderr)
        result["ceilings_after"] = ceilings()  # again after: the machine is shared
        result["ceilings"] = {k: max(result["ceilings_before"][k], result["ceilings_after"][k])
                              for k in ("stream_gb_s", "batch_gmac_s", "vnni_gmac_s", "amx_gmac_s") if k in result["ceilings_before"]}
        result["memory"] = {"short": memory_and_load(path), "long": memory_and_load(path, ctx_fill=3800)}
        result["agreement"] = agreement(path, isas)
        result["seconds"] = time.time() - t
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"{result['date'][:10]}-{commit}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(rows(result))
    b, a = result["ceilings_before"], result["ceilings_after"]
    print(f"\n(ceilings are the better of two measurements: before the run stream {b['stream_gb_s']:.1f} GB/s, batch "
          f"{b['batch_gmac_s']:.0f} GMAC/s; after it {a['stream_gb_s']:.1f} GB/s, {a['batch_gmac_s']:.0f} GMAC/s. "
          f"Raw results: {os.path.relpath(out, REPO)})")


if __name__ == "__main__":
    main()
