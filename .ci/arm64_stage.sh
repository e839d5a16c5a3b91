#!/usr/bin/env bash
# CI's ARM stage (issue 45): the engine cross-built for aarch64 and tested on an arm64 Python under qemu-user, on three
# CPU models, each of which must pick its kernel path by itself:
#   cortex-a53  (ARMv8.0: no dot product)        -> neon
#   neoverse-n1 (ARMv8.2: dot product)           -> neon-dotprod
#   max         (dot product, i8mm, SVE ...)     -> neon-i8mm
# On each: tests/test_kernels.py and tests/test_engine.py (every path the emulated CPU runs: the NEON ones and the
# portable one, against numpy and the numpy reference model; on max also tests/test_sampling.py (the sampler's row
# passes) and tests/test_attention_rows.py (the attention's contract) on each NEON path), and the demo model's
# greedy replies to its suggested skill prompts, which must equal the x86 host's. Everything it needs is installed from nothing by .ci/arm64_env.sh and
# cached outside the checkout ($ARM64_CACHE, default /var/cache/bitnet-arm64).
# Usage: .ci/arm64_stage.sh [PYTHON]  (the host's Python 3.11 with the project's test dependencies)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-$(command -v python || command -v python3)}"
export ARM64_CACHE="${ARM64_CACHE:-/var/cache/bitnet-arm64}"
ROOT="$ARM64_CACHE/root"
T0=$(date +%s)
since() { echo "($(( $(date +%s) - T0 )) s into the ARM stage)"; }

.ci/arm64_env.sh "$PY"
echo "== aarch64 cross build (the standard one: the arm64 Python's sysconfig data, aarch64-linux-gnu-gcc) $(since)"
.ci/arm64_build.sh "$PY" >/dev/null

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# The emulated Python has no torch (tests/checkpoints.py): the x86 host makes the engine tests' checkpoints once, in
# their fixtures' setup, into a record that the emulated runs replay.
echo "== the engine tests' checkpoints, made on the host $(since)"
BITNET_CHECKPOINT_RECORD="$WORK/checkpoints" "$PY" -m pytest -q -p no:cacheprovider --setup-only tests/test_engine.py tests/test_attention_rows.py >/dev/null
echo "== the demo model's greedy replies on the host $(since)"
"$PY" .ci/demo_replies.py "$WORK/demo.bitnet" > "$WORK/replies-x86.json"

arm() {  # arm CPU_MODEL ARGS...: the arm64 Python on that emulated CPU (TCG's warnings about features it lacks dropped)
    local model="$1"
    shift
    QEMU_LD_PREFIX="$ROOT" PYTHONPATH="$ARM64_CACHE/site:$PWD" BITNET_CHECKPOINT_RECORD="$WORK/checkpoints" \
        qemu-aarch64 -cpu "$model" "$ROOT/usr/bin/python3.11" "$@" 2> >(grep -v "TCG doesn't support" >&2)
}
# Left out under emulation: the two tests that start a second Python (qemu-user here has no binfmt_misc, so an emulated
# process cannot exec an arm64 program; both are about x86 or the CLI's environment and run in the x86 stages), and the
# check of the automatic path against /proc/cpuinfo, which qemu-user leaves the host's (the asserts below check it).
DESELECT=(--deselect tests/test_kernels.py::test_ternary5_kernels_without_vbmi_are_the_same
          --deselect tests/test_kernels.py::test_this_machine_runs_its_fastest_path
          --deselect tests/test_engine.py::test_bitnet_threads_out_of_range_is_an_error_not_a_crash)
for pair in cortex-a53:neon neoverse-n1:neon-dotprod max:neon-i8mm; do
    model="${pair%%:*}" want="${pair#*:}"
    ONLY_ONE_SIMD_PATH=() SAMPLER=()
    if [ "$want" = neon-i8mm ]; then  # the one CPU that runs all three NEON paths: the sampler's row passes on each
        # (less its comparison with transformers' logits processors, which needs torch: the x86 stages run it), and
        # the multi-row attention's contract on f32, f16 and i8 K/V
        SAMPLER=(tests/test_sampling.py --deselect tests/test_sampling.py::test_chain_matches_transformers_processors
                 tests/test_attention_rows.py)
    fi
    if [ "$want" = neon ]; then  # the comparison of the SIMD paths' logits needs two of them: neoverse-n1 and max run it
        ONLY_ONE_SIMD_PATH=(--deselect tests/test_engine.py::test_the_simd_paths_give_the_same_logits_bit_for_bit)
    fi
    echo "== qemu-aarch64 -cpu $model: the automatic kernel path must be $want $(since)"
    arm "$model" -c "from bitnet_app import _engine; p = _engine.kernel_name(''); assert p == '$want', p; print('$model ->', p)"
    echo "== qemu-aarch64 -cpu $model: tests/test_kernels.py tests/test_engine.py ${SAMPLER[*]-} $(since)"
    arm "$model" -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_engine.py ${SAMPLER[@]+"${SAMPLER[@]}"} \
        "${DESELECT[@]}" \
        ${ONLY_ONE_SIMD_PATH[@]+"${ONLY_ONE_SIMD_PATH[@]}"}
    echo "== qemu-aarch64 -cpu $model: the demo model's greedy replies equal the x86 ones $(since)"
    arm "$model" .ci/demo_replies.py "$WORK/demo.bitnet" > "$WORK/replies-$model.json"
    "$PY" - "$WORK/replies-x86.json" "$WORK/replies-$model.json" "$want" <<'PYEOF'
import json, sys
x86, arm = (json.load(open(p, encoding="utf-8")) for p in sys.argv[1:3])
assert arm["kernel_path"] == sys.argv[3], arm["kernel_path"]
for mode in ("ar", "diffusion"):
    for prompt, reply in x86[mode].items():
        assert arm[mode][prompt] == reply, (mode, prompt, reply, arm[mode][prompt])
print(f"{len(x86['ar'])} prompts x 2 modes: the same replies on {arm['kernel_path']} as on {x86['kernel_path']}")
PYEOF
done
echo "== ARM stage done $(since)"
