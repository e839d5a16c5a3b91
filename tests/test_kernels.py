"""Every kernel path the CPU supports against plain numpy, on random and awkward shapes."""
import os
import platform

import numpy as np
import pytest

from bitnet_app import _engine, _engine_testing
from bitnet_app import platform as os_platform
from bitnet_app.engine import kernel_paths
from bitnet_app.engine.packing import (TRIT5_MAX_KP, bf16_to_f32, f32_to_bf16, pack_int8_tiles, pack_ternary5_tiles,
                                       pack_ternary_tiles, quantize_rows_int8)
from support import PATHS

# (N, K, T): N=1, K not a multiple of 16 or of the vector width, batches 1..33
SHAPES = [(1, 16, 1), (16, 16, 1), (17, 5, 3), (33, 100, 7), (64, 2560 // 8, 8), (48, 72, 16), (40, 136, 33),
          (96, 64, 2), (31, 47, 4), (128, 256, 5), (80, 96, 9), (16, 1000, 32),
          # the inner sizes of the Llama-family checkpoints (bitnet_app/catalog.py): down_proj's K = the
          # intermediate size of Falcon3-7B/10B (23040), Llama3-8B (14336) and 1bitLLM-3B (8640); hidden 3200
          (32, 23040, 2), (16, 14336, 3), (48, 8640, 1), (32, 3200, 9), (32, 8640, 6),
          # one token (decode: kernels_avx2.c's whole-tile path), several tiles, runs of 16 groups and a tail
          (64, 2560, 1), (48, 264, 1)]


def cpu_flags():
    """The CPU's feature flags as the OS reports them (bitnet_app/platform.py: Linux's /proc/cpuinfo "flags" on x86,
    "Features" on aarch64, macOS's sysctl on Apple Silicon; empty where there are none)."""
    return os_platform.cpu_features()


def expected_best_path(flags):
    """The kernel path the dispatcher must pick for these CPU flags (the same rule as _kernels/dispatch.c: the first
    path in the order of preference whose flags the CPU has)."""
    return next(p.name for p in kernel_paths.PATHS if not p.emulated and p.cpu_flags <= flags)


def test_the_engine_and_the_registry_name_the_same_paths():
    """One name per path, the same on both sides: the C dispatcher's list (dispatch.c) is kernel_paths.py's, in the
    same order, and the automatic choice is one of them."""
    assert _engine.kernel_paths() == kernel_paths.names()
    assert len(set(kernel_paths.names())) == len(kernel_paths.PATHS)
    assert len({p.label for p in kernel_paths.PATHS}) == len(kernel_paths.PATHS)
    assert _engine.kernel_name("") in kernel_paths.names(emulated=False)
    for name in PATHS:
        assert _engine.kernel_name(name) == name  # a forced path reports its own name


def test_this_machine_runs_its_fastest_path():
    # Whatever the CPU (AVX-512 VNNI, AVX2 only, or neither), the dispatcher picks the best path it has,
    # and every path the CPU supports is among the ones these tests run.
    flags = cpu_flags()
    if not flags and platform.machine().lower() in ("x86_64", "amd64"):
        pytest.fail("no CPU flags read on an x86-64 CPU: cannot tell which kernel path it should run")
    best = expected_best_path(flags)
    assert _engine.kernel_name("") == best
    assert kernel_paths.PORTABLE in PATHS
    for path in kernel_paths.PATHS:
        if path.name == kernel_paths.AMX:  # the tiles also need Linux's permission, asked at run time
            assert (path.name in PATHS) == (best == kernel_paths.AMX)
        else:
            assert (path.name in PATHS) == (path.cpu_flags <= flags), path.name


def padded_activations(rng, T, K, kp):
    x = np.zeros((T, kp), dtype=np.int8)
    x[:, :K] = rng.integers(-127, 128, size=(T, K))
    return x


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("N,K,T", SHAPES)
def test_ternary_matmul_matches_numpy(isa, N, K, T):
    rng = np.random.default_rng(N * 1000 + K * 10 + T)
    w = rng.integers(-1, 2, size=(N, K)).astype(np.int8)
    tiles = pack_ternary_tiles(w)
    np_, kp = tiles.shape[0] * 16, tiles.shape[1] * 16
    scale = np.zeros(np_, np.float32)
    scale[:N] = rng.uniform(0.5, 2.0, N)
    x = padded_activations(rng, T, K, kp)
    y = _engine_testing.kernel_ternary(isa, tiles, scale, x)
    exact = x[:, :K].astype(np.int64) @ w.T.astype(np.int64)          # (T, N) integers
    np.testing.assert_array_equal(y[:, :N], (exact.astype(np.float32) * np.float32(1.0)) * scale[:N])


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("x_value, w_value", [(-128, 1), (-128, -1), (127, 1), (127, -1)])
def test_ternary_and_int8_matmuls_are_exact_at_the_extremes(isa, T, x_value, w_value):
    """Every activation at -128 or 127 and every weight at the same extreme: the largest sums the int16 stages
    of the AVX2 kernels hold (kernels_avx2.c GROUPS_PER_WIDEN) must still come out exact."""
    N, K = 32, 2560
    w = np.full((N, K), w_value, np.int8)
    x = np.full((T, K), x_value, np.int8)
    exact = (x.astype(np.int64) @ w.T.astype(np.int64)).astype(np.float32)
    tiles = pack_ternary_tiles(w)
    y = _engine_testing.kernel_ternary(isa, tiles, np.ones(tiles.shape[0] * 16, np.float32), x)
    np.testing.assert_array_equal(y[:, :N], exact)
    w8 = np.full((N, K), 127 * w_value, np.int8)
    tiles8 = pack_int8_tiles(w8)
    rowsum = w8.sum(axis=1, dtype=np.int32)
    y8 = _engine_testing.kernel_int8(isa, tiles8, np.ones(N, np.float32), rowsum, x)
    np.testing.assert_array_equal(y8[:, :N], 127 * exact)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("N,K,T", SHAPES)
def test_ternary5_matmul_is_the_2bit_matmul_bit_for_bit(isa, N, K, T):
    """The 1.6-bit tiles (5 codes a byte) give every path exactly the numbers of its 2-bit kernel on the same weights
    (and so numpy's): one token decoded in place, a batch unpacked into 2-bit tiles (tiles5.c); SHAPES has every
    remainder of kp / 4 by 5 (the last group's 1 to 5 quads). And the path's unpacking gives numpy's 2-bit tiles."""
    rng = np.random.default_rng(N * 1000 + K * 10 + T)
    w = rng.integers(-1, 2, size=(N, K)).astype(np.int8)
    tiles2, tiles5 = pack_ternary_tiles(w), pack_ternary5_tiles(w)
    np_, kp = tiles2.shape[0] * 16, tiles2.shape[1] * 16
    scale = np.zeros(np_, np.float32)
    scale[:N] = rng.uniform(0.5, 2.0, N)
    x = padded_activations(rng, T, K, kp)
    y5 = _engine_testing.kernel_ternary5(isa, tiles5, scale, x)
    np.testing.assert_array_equal(y5.view(np.uint32), _engine_testing.kernel_ternary(isa, tiles2, scale, x).view(np.uint32))
    exact = x[:, :K].astype(np.int64) @ w.T.astype(np.int64)
    np.testing.assert_array_equal(y5[:, :N], exact.astype(np.float32) * scale[:N])
    np.testing.assert_array_equal(_engine_testing.kernel_unpack5(isa, tiles5, kp), tiles2)


def test_ternary5_kernels_without_vbmi_are_the_same():
    """kernels_avx512.c reads 1.6-bit tiles in the window code where the CPU has AVX512-VBMI and GFNI (one token by
    lookups, batches unpacked with byte permutes), else in the file's code (one token by the 3A - B sums, unpacked
    with compares); BITNET_NO_VBMI keeps the file's code, so a VBMI machine tests both: every path, one token and
    batches, in a process of its own (the choice is made once per process), against numpy."""
    import subprocess
    import sys
    code = """
import numpy as np
from bitnet_app import _engine, _engine_testing
from bitnet_app.engine import kernel_paths
from bitnet_app.engine.packing import pack_ternary5_tiles, pack_ternary_tiles
assert not any(_engine.reads_trit5_windows(isa) for isa in kernel_paths.supported())
rng = np.random.default_rng(5)
for n, k, T in ((32, 2560, 3), (48, 264, 9), (16, 6912, 2), (32, 2560, 1), (16, 88, 1)):
    w = rng.integers(-1, 2, size=(n, k)).astype(np.int8)
    t2, t5 = pack_ternary_tiles(w), pack_ternary5_tiles(w)
    x = rng.integers(-128, 128, size=(T, t2.shape[1] * 16)).astype(np.int8)
    x[:, k:] = 0
    for isa in kernel_paths.supported():
        assert np.array_equal(_engine_testing.kernel_unpack5(isa, t5, x.shape[1]), t2), isa
        y = _engine_testing.kernel_ternary5(isa, t5, np.ones(n, np.float32), x)
        assert np.array_equal(y, (x[:, :k].astype(np.int64) @ w.T).astype(np.float32)), isa
print("ok")
"""
    env = dict(os.environ, BITNET_NO_VBMI="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("x_value, w_value", [(-128, 1), (-128, -1), (127, 1), (127, -1), (-128, 0)])
def test_ternary5_matmul_is_exact_at_the_widest_extremes(isa, T, x_value, w_value):
    """The widest matrix 1.6-bit tiles take (kp = BN_TRIT5_MAX_KP, 32752) with every activation and weight at an
    extreme: the VNNI kernels' 256 x (code sum) and the AVX2 kernel's int16 runs still come out exact."""
    N, K = 16, TRIT5_MAX_KP
    w = np.full((N, K), w_value, np.int8)
    x = np.full((T, K), x_value, np.int8)
    exact = (x.astype(np.int64) @ w.T.astype(np.int64)).astype(np.float32)
    y = _engine_testing.kernel_ternary5(isa, pack_ternary5_tiles(w), np.ones(N, np.float32), x)
    np.testing.assert_array_equal(y, exact)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("N,K,T", SHAPES)
def test_int8_matmul_matches_numpy(isa, N, K, T):
    rng = np.random.default_rng(7 + N * 1000 + K * 10 + T)
    w8, scale = quantize_rows_int8(rng.standard_normal((N, K)).astype(np.float32))
    tiles = pack_int8_tiles(w8)
    np_, kp = tiles.shape[0] * 16, tiles.shape[1] * 4
    scale_p = np.zeros(np_, np.float32)
    scale_p[:N] = scale
    rowsum = np.zeros(np_, np.int32)
    rowsum[:N] = w8.astype(np.int32).sum(axis=1)
    x = padded_activations(rng, T, K, kp)
    y = _engine_testing.kernel_int8(isa, tiles, scale_p, rowsum, x)
    exact = x[:, :K].astype(np.int64) @ w8.T.astype(np.int64)
    np.testing.assert_array_equal(y[:, :N], exact.astype(np.float32) * scale)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("N,K,T", [(1, 1, 1), (5, 17, 3), (40, 2560 // 16, 2), (33, 100, 33)])
def test_bf16_matmul_matches_numpy(isa, N, K, T):
    rng = np.random.default_rng(N + K + T)
    w = f32_to_bf16(rng.standard_normal((N, K)).astype(np.float32))
    x = rng.standard_normal((T, K)).astype(np.float32)
    y = _engine_testing.kernel_bf16(isa, w, x)
    ref = x.astype(np.float64) @ bf16_to_f32(w).T.astype(np.float64)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.sqrt(K))


def test_unknown_path_is_a_clear_error():
    with pytest.raises(ValueError, match="not supported"):
        _engine.kernel_name("sse9")


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the out-of-range values are the point
@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n", [1, 7, 16, 37, 128])
def test_fp16_conversion_matches_numpy(isa, n):
    """The KV cache's float -> half rounding (nearest even, subnormals, overflow) is numpy's on every path."""
    rng = np.random.default_rng(n)
    special = np.array([0.0, -0.0, 65504.0, 65520.0, 1e6, -1e6, 6e-8, 2.98e-8, 1e-9, 6.1e-5, 1 + 2 ** -11,
                        1 + 3 * 2 ** -11, np.inf, -np.inf], np.float32)
    x = np.concatenate([rng.standard_normal(n).astype(np.float32) * 10 ** rng.uniform(-8, 5, n).astype(np.float32),
                        special])
    h = _engine_testing.kernel_to_f16(isa, x)
    np.testing.assert_array_equal(h, x.astype(np.float16).view(np.uint16))
    # and back, inside a dot product and an axpy
    y = rng.standard_normal(len(x)).astype(np.float32)
    finite = np.isfinite(x.astype(np.float16))
    back = x.astype(np.float16).astype(np.float64)
    d = _engine_testing.kernel_dot_f16(isa, y[finite], h[finite])
    np.testing.assert_allclose(d, float(y[finite].astype(np.float64) @ back[finite]), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n", [1, 7, 16, 100, 384, 1000, 1024])
@pytest.mark.parametrize("case", ["normal", "tiny", "spiky"])
def test_fused_norm_quant_is_the_composition_bit_for_bit(isa, n, case):
    """A path's fused norm_quant gives the q, sum(q) and 1/scale of its own sumsq, norm_apply, absmax and quantize
    as layer.c composes them (paths without one run that composition): the logits do not depend on whether a
    path fuses the passes. AVX2 and AVX-512 fuse them."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32) * (1e-7 if case == "tiny" else 3.0)
    if case == "spiky":
        x[rng.integers(n)] = 500.0
    w = (rng.standard_normal(n) * 0.5 + 1.0).astype(np.float32)
    np_ = (n + 15) // 16 * 16 + 16  # a padded width past the row, as the engine's matrices have
    fused = _engine_testing.kernel_norm_quant(isa, x, w, np_, 1e-6, True)
    if fused is None:
        assert isa not in (kernel_paths.AVX2, kernel_paths.AVX512), "AVX2 and AVX-512 fuse norm_quant"
        return
    q, total, xinv = fused
    q0, total0, xinv0 = _engine_testing.kernel_norm_quant(isa, x, w, np_, 1e-6, False)
    np.testing.assert_array_equal(q, q0)
    assert (total, xinv) == (total0, xinv0)
    assert not q[n:].any() and total == int(q.astype(np.int64).sum())


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n", [1, 7, 8, 13, 64, 1000])
def test_silu_mul_matches_numpy(isa, n):
    """The fast silu(g) * u (paths that have one) against float64 numpy: relative error at the fp32 level,
    including large |g| where e^-g overflows in a naive formula."""
    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n) * 6).astype(np.float32)
    g[: min(n, 3)] = np.array([-120.0, 95.0, 0.0], dtype=np.float32)[: min(n, 3)]
    u = rng.standard_normal(n).astype(np.float32)
    got = _engine_testing.kernel_silu_mul(isa, g, u)
    if got is None:
        assert isa != kernel_paths.AVX2, "the AVX2 path has a silu_mul"
        return
    gd = g.astype(np.float64)
    with np.errstate(over="ignore"):
        want = gd / (1 + np.exp(-gd)) * u
    assert np.all(np.abs(got - want) <= 4e-7 * np.abs(want) + 1e-30), np.abs(got - want).max()


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows, vocab", [(1, 1), (1, 7), (8, 4096), (3, 13), (2, 128256), (33, 100)])
def test_greedy_rows_match_the_numpy_reference(isa, rows, vocab):
    """The engine's greedy choice + confidence (greedy.c, the diffusion step's sampler) against
    decode/sampling.py greedy_rows: the same ids (the first on ties, banned ids never chosen, whether they are
    banned by the caller's list, which the C version reads without copying the rows, or are -inf already) and
    the same probabilities to float32 exponential accuracy, on peaked, flat and tied rows."""
    from bitnet_app.decode.sampling import greedy_rows

    rng = np.random.default_rng(rows * 1000 + vocab)
    x = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    x[0, rng.integers(vocab)] += 30.0  # a confident row (probability ~1)
    if rows > 1:
        x[1] = 0.5  # a flat row: every id ties, the first wins, probability 1 / vocab
    if rows > 2:
        x[2, [vocab - 1, vocab // 2]] = x[2].max() + 1  # a tie between two ids: the lower one
        x[2, 0] = -np.inf  # a banned id
    banned_lists = [[]]
    if vocab > 3:  # the first, an adjacent pair, the last; and the confident row's winner
        banned_lists += [[0, 1, vocab // 3, vocab - 1], sorted({int(np.argmax(x[0])), 2})]
    for banned in banned_lists:
        x_before = x.copy()
        got_ids, got_p = _engine_testing.greedy_rows(isa, x, np.array(banned, dtype=np.int32))
        np.testing.assert_array_equal(x, x_before)  # the C version leaves its input alone
        want_ids, want_p = greedy_rows(x, banned)
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_allclose(got_p, want_p, rtol=1e-6)
        assert not set(got_ids.tolist()) & set(banned)
    if rows > 1:
        got_ids, got_p = _engine_testing.greedy_rows(isa, x, np.array([], dtype=np.int32))
        assert got_ids[1] == 0 and abs(got_p[1] - 1 / vocab) < 1e-6 / vocab
    with pytest.raises(ValueError, match="banned ids"):
        _engine_testing.greedy_rows(isa, x, np.array([vocab], dtype=np.int32))

@pytest.mark.parametrize("isa", PATHS)
def test_greedy_rows_of_nan_logits_give_an_id_not_a_crash(isa):
    """A broken model's NaN logits (all of a row, or some) still give an id in range and no crash, with a banned id
    among them."""
    x = np.full((3, 50), np.nan, dtype=np.float32)
    x[1, 7] = 2.0                      # one finite entry among NaNs
    x[2] = np.arange(50, dtype=np.float32)
    x[2, ::3] = np.nan                 # NaNs among finite entries
    ids, _ = _engine_testing.greedy_rows(isa, x, np.array([4], dtype=np.int32))
    assert ((ids >= 0) & (ids < 50)).all() and 4 not in ids.tolist(), ids
