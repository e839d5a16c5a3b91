"""packing.py: round trips on awkward shapes, the documented byte positions, and agreement with
transformers' own pack_weights / unpack_weights and torch's bfloat16 rounding."""
import numpy as np
import pytest
import torch

from bitnet_app.engine import packing

SHAPES = [(1, 1), (1, 17), (4, 3), (15, 16), (16, 16), (17, 33), (33, 100), (40, 7)]


def ternary(rng, shape):
    return rng.integers(-1, 2, size=shape).astype(np.int8)


@pytest.mark.parametrize("n,k", SHAPES)
def test_ternary_tiles_round_trip_and_padding(n, k):
    w = ternary(np.random.default_rng(n * 100 + k), (n, k))
    packed = packing.pack_ternary_tiles(w)
    np_, kp = packing.ceil_to(n, 16), packing.ceil_to(k, 16)
    assert packed.shape == (np_ // 16, kp // 16, 64) and packed.dtype == np.uint8
    assert np.array_equal(packing.unpack_ternary_tiles(packed, n, k), w)
    full = packing.unpack_ternary_tiles(packed, np_, kp)      # padding must be weight 0 (code 1)
    assert not full[n:].any() and not full[:, k:].any()


def test_ternary_tile_byte_position_matches_docstring():
    # one +1 at (r, c) in a field of zeros: byte [r//16, c//16, 4*(r%16) + c%4], shift 2*((c%16)//4), code 2
    n, k, r, c = 35, 50, 21, 39
    w = np.zeros((n, k), np.int8)
    w[r, c] = 1
    packed = packing.pack_ternary_tiles(w)
    expect = np.full(packed.shape, 0b01010101, np.uint8)       # every field code 1
    s = (c % 16) // 4
    expect[r // 16, c // 16, 4 * (r % 16) + c % 4] = (0b01010101 & ~(3 << 2 * s)) | (2 << 2 * s)
    assert np.array_equal(packed, expect)


def test_pack_ternary_tiles_rejects_non_ternary():
    with pytest.raises(ValueError):
        packing.pack_ternary_tiles(np.array([[0, 2]], np.int8))


def test_trit_bytes_decode_every_value_exactly():
    """All 3^5 = 243 digit tuples: encode -> decode is the identity, the bytes are distinct, and the two facts the
    kernels build on hold: t_{d+1} = 3 t_d mod 256, and 256 c_d = 3 t_d - t_{d+1} (packing.py docstring)."""
    digits = np.array(np.meshgrid(*[range(3)] * 5, indexing="ij")).reshape(5, -1).T   # (243, 5), c_0 first
    q = packing.encode_trits(digits)
    assert len(set(q.tolist())) == 243 and q.dtype == np.uint8
    assert np.array_equal(packing.decode_trits(q), digits)
    t = (q.astype(np.int64)[:, None] * 3 ** np.arange(6)) % 256                         # t_0 .. t_5
    assert np.array_equal(t[:, 1:], (3 * t[:, :-1]) % 256)
    assert np.array_equal(256 * digits, 3 * t[:, :5] - t[:, 1:])


def test_the_window_code_holds_every_digit_tuple_each_code_in_its_window():
    """The window code (_kernels/trit5_windows.c), which the AVX-512 kernels with VBMI and GFNI read: the file's 243
    bytes translate to 243 distinct bytes with the same five codes, and each code is a function of its 7-bit window
    (flipping the bit its window leaves out never changes it), which is what lets one vpermi2b look it up."""
    from bitnet_app import _engine, _engine_testing
    digits = np.array(np.meshgrid(*[range(3)] * 5, indexing="ij")).reshape(5, -1).T   # (243, 5), c_0 first
    window = packing.encode_trits(digits)
    _engine.translate_trit5(window)
    assert len(set(window.tolist())) == 243
    codes = _engine_testing.trit5_window_digits()                                      # (256, 5)
    assert np.array_equal(codes[window], digits)
    q = np.arange(256)
    for d, left_out in enumerate([7, 7, 0, 0, 2]):
        assert np.array_equal(codes[q, d], codes[q ^ (1 << left_out), d])
    every = q.astype(np.uint8)    # the 13 bytes encode_trits never writes too (a damaged file): the same digits
    _engine.translate_trit5(every)
    assert np.array_equal(codes[every], packing.decode_trits(q.astype(np.uint8)))


@pytest.mark.parametrize("n,k", SHAPES + [(16, 80), (16, 64), (32, 6912)])
def test_ternary5_tiles_round_trip_and_padding(n, k):
    w = ternary(np.random.default_rng(n * 100 + k + 1), (n, k))
    packed = packing.pack_ternary5_tiles(w)
    np_, kp = packing.ceil_to(n, 16), packing.ceil_to(k, 16)
    assert packed.shape == (np_ // 16, -(-kp // 20), 64) == packing.ternary_tile_shape(n, k, "1.6bit")
    assert np.array_equal(packing.unpack_ternary5_tiles(packed, n, k), w)
    assert np.array_equal(packing.unpack_tiles(packing.pack_tiles(w, "1.6bit"), n, k, "1.6bit"), w)
    full = packing.unpack_ternary5_tiles(packed, np_, packed.shape[1] * 20)  # padding, and digits past kp: code 1
    assert not full[n:].any() and not full[:, k:].any()
    assert packed.nbytes * 5 <= packing.pack_ternary_tiles(w).nbytes * 4 + np_ * 16  # 1.6 bits a weight, + a group


def test_ternary5_byte_position_matches_docstring():
    # one +1 at (r, c): byte [r//16, c//20, 4*(r%16) + c%4] holds code 2 at digit (c%20)//4, code 1 at the others
    n, k, r, c = 35, 50, 21, 39
    w = np.zeros((n, k), np.int8)
    w[r, c] = 1
    packed = packing.pack_ternary5_tiles(w)
    expect = np.full(packed.shape, packing.encode_trits([1, 1, 1, 1, 1]), np.uint8)
    digits = [1] * 5
    digits[(c % 20) // 4] = 2
    expect[r // 16, c // 20, 4 * (r % 16) + c % 4] = packing.encode_trits(digits)
    assert np.array_equal(packed, expect)
    with pytest.raises(ValueError):
        packing.pack_ternary5_tiles(np.array([[0, 2]], np.int8))


@pytest.mark.parametrize("n,k", SHAPES)
def test_int8_tiles_round_trip(n, k):
    w8 = np.random.default_rng(k).integers(-127, 128, size=(n, k)).astype(np.int8)
    packed = packing.pack_int8_tiles(w8)
    assert packed.shape == (packing.ceil_to(n, 16) // 16, packing.ceil_to(k, 16) // 4, 64)
    assert np.array_equal(packing.unpack_int8_tiles(packed, n, k), w8)
    full = packing.unpack_int8_tiles(packed, packing.ceil_to(n, 16), packing.ceil_to(k, 16))
    assert not full[n:].any() and not full[:, k:].any()
    r, c = n - 1, k - 1   # documented position: byte [r//16, c//4, 4*(r%16) + c%4]
    assert packed[r // 16, c // 4, 4 * (r % 16) + c % 4] == w8[r, c]


@pytest.mark.parametrize("n,k", [(4, 1), (8, 3), (12, 17), (64, 33)])
def test_hf_u8_matches_transformers(n, k):
    from transformers.integrations.bitnet import pack_weights, unpack_weights
    w = ternary(np.random.default_rng(n + k), (n, k))
    ours = packing.pack_hf_u8(w)
    theirs = pack_weights(torch.from_numpy(w.astype(np.int32))).numpy()
    assert ours.shape == (n // 4, k) and np.array_equal(ours, theirs)
    assert np.array_equal(packing.unpack_hf_u8(ours), w)
    assert np.array_equal(unpack_weights(torch.from_numpy(ours), dtype=torch.float32).numpy(), w.astype(np.float32))
    assert np.array_equal(packing.unpack_hf_u8(ours, n_rows=n - 1), w[:n - 1])


def test_hf_u8_docstring_example():
    # transformers' unpack_weights docstring: rows unpack in blocks of P = 2 (blocked, not interleaved)
    packed = np.array([[0b10100001, 0b00011000], [0b10010000, 0b00001010]], np.uint8)
    want = [[0, -1], [-1, 1], [-1, 1], [-1, 1], [1, 0], [0, -1], [1, -1], [1, -1]]
    assert packing.unpack_hf_u8(packed).tolist() == want


def test_pack_hf_u8_needs_rows_divisible_by_4():
    with pytest.raises(ValueError):
        packing.pack_hf_u8(np.zeros((6, 2), np.int8))


def test_quantize_rows_int8_error_and_zero_rows():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((9, 37)).astype(np.float32)
    w[3] = 0
    w8, scale = packing.quantize_rows_int8(w)
    assert w8.dtype == np.int8 and scale.dtype == np.float32
    assert scale[3] == 1 and not w8[3].any()
    assert np.all(np.abs(w8.astype(np.float32) * scale[:, None] - w) <= scale[:, None] / 2 + 1e-7)
    assert np.abs(w8).max() == 127


def test_bf16_conversions_match_torch():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 100,
                        # exact ties between two bf16 values: round half to even
                        (np.arange(1, 200, dtype=np.uint32) << 16 | 0x8000).view(np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38], np.float32)])
    ours = packing.f32_to_bf16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)
    assert np.array_equal(packing.bf16_to_f32(ours), torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_packing_for_chooses_the_cpus_packing_unless_a_matrix_is_too_wide():
    """The layout asked, else the one this CPU decodes fastest (1.6-bit tiles with VNNI, kernel_paths.py); a matrix
    wider than the 1.6-bit kernels' int32 sums allow (TRIT5_MAX_KP, _kernels/kernels.h) takes 2-bit tiles, and
    asking for 1.6 bits there is an error."""
    from bitnet_app import _engine
    from bitnet_app.engine import kernel_paths
    vnni = kernel_paths.BY_NAME[_engine.kernel_name("")].trit_tiles
    assert packing.packing_for(6912) == kernel_paths.preferred_packing() == ("1.6bit" if vnni else "2bit")
    assert packing.packing_for(6912, "2bit") == "2bit" and packing.packing_for(6912, "1.6bit") == "1.6bit"
    assert packing.packing_for(6912, None, "1.6bit") == "1.6bit" and packing.packing_for(6912, None, "2bit") == "2bit"
    assert packing.packing_for(packing.TRIT5_MAX_KP, None, "1.6bit") == "1.6bit"
    assert packing.packing_for(packing.TRIT5_MAX_KP + 1, None, "1.6bit") == "2bit"
    assert [p.name for p in kernel_paths.PATHS if p.trit_tiles] == [kernel_paths.AMX, kernel_paths.AVX512,
                                                                    kernel_paths.AVXVNNI]


def test_a_model_that_decodes_from_cache_takes_2bit_tiles():
    """Up to CACHED_MODEL_WEIGHTS ternary weights a model is not memory bound, so the five-a-byte unpack would only
    cost: 2-bit tiles whatever the CPU prefers; above it the CPU's preference; asking still wins."""
    from bitnet_app.engine import kernel_paths
    small, big = packing.CACHED_MODEL_WEIGHTS, packing.CACHED_MODEL_WEIGHTS + 1
    assert packing.packing_for(2560, n_weights=small) == "2bit"
    assert packing.packing_for(2560, n_weights=big) == kernel_paths.preferred_packing()
    assert packing.packing_for(2560, None, "1.6bit", n_weights=small) == "1.6bit"
    assert packing.packing_for(2560, "1.6bit", n_weights=small) == "1.6bit"
    assert packing.packing_for(2560, n_weights=2_090_000_000) == kernel_paths.preferred_packing()
    with pytest.raises(ValueError, match="too wide"):
        packing.packing_for(40000, "1.6bit")
    with pytest.raises(ValueError, match="unknown ternary packing"):
        packing.packing_for(64, "4bit")
