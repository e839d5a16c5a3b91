"""Weight layouts of the engine file, in plain numpy (the reference the C kernels must agree with).

Shapes: a linear layer is W (N, K) with ternary values in {-1, 0, +1}; its *codes* are W + 1 in {0, 1, 2}.

Ternary tile layout (what `_kernels/*` read), chosen so that one 512-bit register holds 16 rows x 4
consecutive k, i.e. one int32 lane per row, and `vpdpbusd` needs no horizontal sums:
    Np = ceil16(N), Kp = ceil16(K)
    packed: uint8 (Np/16, Kp/16, 64)
    byte packed[t, g, 4*i + j], bits 2*s..2*s+1  =  code of row 16*t + i, column 16*g + 4*s + j
    (i = 0..15 row in tile, s = 0..3 shift, j = 0..3 column in the 4-group)
Padding rows and columns hold code 1 (weight 0); activations are zero-padded to Kp as well.

Int8 head layout (lm_head with one float scale per row):
    int8 (Np/16, Kp/4, 64): byte [t, g, 4*i + j] = w8[16*t + i, 4*g + j]; padding is 0.

1.6-bit ternary tile layout ("1.6bit": 5 codes a byte, 3^5 = 243 <= 256), the 2-bit layout's quads of 4 columns
taken five to a byte instead of four:
    Np = ceil16(N), Kp = ceil16(K), Q = Kp/4 quads of columns, G5 = ceil(Q/5) groups of 5 quads (20 columns)
    packed: uint8 (Np/16, G5, 64)
    byte packed[t, g, 4*i + j] = encode(c_0 .. c_4), c_d = code of row 16*t + i, column 4*(5*g + d) + j
    encode(c_0 .. c_4) = ceil(256 * v / 243), v = sum_d c_d * 3^(4-d)        (c_0 the most significant digit)
    decode: digit d of byte q is c_d = (3 * t_d) >> 8 with t_d = q * 3^d mod 256   (exact for all 243 values)
So one digit of a 64-byte group is, byte for byte, one 2-bit field of a 2-bit group (the same rows and columns in
each int32 lane): a kernel decodes digit d into the register the 2-bit kernels get from shift 2*s. Padding rows
and columns, and the digits of the last group past Q, hold code 1 (weight 0). Two facts the kernels build on:
t_{d+1} = 3 * t_d mod 256 (wrapping byte adds), and 256 * c_d = 3 * t_d - t_{d+1} (a dot product of the codes is
a linear combination of dot products of the t_d, kernels_avx512.c). PACKINGS names both layouts; pack_tiles and
unpack_tiles take either. In memory, the AVX-512 kernels of a CPU with VBMI and GFNI read these bytes translated
into another code of the same 243 tuples, each digit a table lookup of 7 of the byte's bits (_kernels/trit5_windows.c,
done when the engine loads the file: engine/runtime.py); the file always holds the code above.

Hugging Face packed U8 layout (transformers `pack_weights`): blocked along output rows,
    W[s*P + r, c] = ((packed[r, c] >> 2*s) & 3) - 1,  P = N / 4.
"""
import numpy as np

TILE_ROWS = 16  # rows per tile: one int32 lane each in a 512-bit register
TILE_COLS = 16  # columns per 64-byte group: 4 shifts x 4 bytes
TRITS = 5       # codes per byte of the 1.6-bit layout (one digit each in base 3)
PACKING_2BIT, PACKING_16BIT = "2bit", "1.6bit"
PACKINGS = (PACKING_2BIT, PACKING_16BIT)  # the ternary layouts an engine file may hold (engine/file.py)
TRIT5_MAX_KP = 32752                      # the widest padded K of a 1.6-bit matrix (_kernels/kernels.h BN_TRIT5_MAX_KP)
# A model of at most this many ternary weights (16 MiB of 2-bit tiles) decodes from the CPU's caches, not from
# memory: fewer bytes per weight gain it nothing, and unpacking five weights a byte costs. So it takes 2-bit tiles
# (the 3.2 M demo model of phases 1-5 on Zen 4: AR 59-62 against 69-70 us a token, a diffusion step 226-270 against
# 325-414 us).
CACHED_MODEL_WEIGHTS = 64 * 2**20
_POW3 = 3 ** np.arange(TRITS)            # 1, 3, 9, 27, 81


def ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def unpack_hf_u8(packed: np.ndarray, n_rows: int | None = None) -> np.ndarray:
    """HF packed uint8 (P, K) -> ternary int8 (4P, K) (or its first n_rows rows)."""
    packed = np.asarray(packed, dtype=np.uint8)
    parts = [((packed >> (2 * s)) & 3).astype(np.int8) - 1 for s in range(4)]
    w = np.concatenate(parts, axis=0)
    return w if n_rows is None else w[:n_rows]


def pack_hf_u8(w: np.ndarray) -> np.ndarray:
    """Ternary (N, K), N divisible by 4 -> HF packed uint8 (N/4, K). Inverse of unpack_hf_u8."""
    n = w.shape[0]
    if n % 4:
        raise ValueError(f"row count {n} is not divisible by 4")
    codes = (np.asarray(w, dtype=np.int16) + 1).astype(np.uint8)
    p = n // 4
    out = np.zeros((p,) + w.shape[1:], dtype=np.uint8)
    for s in range(4):
        out |= codes[s * p:(s + 1) * p] << (2 * s)
    return out


def pack_ternary_tiles(w: np.ndarray) -> np.ndarray:
    """Ternary int (N, K) -> tile-packed uint8 (Np/16, Kp/16, 64); see the module docstring."""
    n, k = w.shape
    np_, kp = ceil_to(n, TILE_ROWS), ceil_to(k, TILE_COLS)
    codes = np.ones((np_, kp), dtype=np.uint8)
    codes[:n, :k] = (np.asarray(w, dtype=np.int16) + 1).astype(np.uint8)
    if codes.max() > 2:
        raise ValueError("weights are not ternary")
    # (t, i, g, s, j) -> (t, g, i, j, s): byte (t, g, 4i+j) collects the four shifts s
    c = codes.reshape(np_ // 16, 16, kp // 16, 4, 4).transpose(0, 2, 1, 4, 3)
    packed = c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)
    return np.ascontiguousarray(packed.reshape(np_ // 16, kp // 16, 64))


def unpack_ternary_tiles(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    """Tile-packed uint8 (Np/16, Kp/16, 64) -> ternary int8 (N, K). Inverse of pack_ternary_tiles."""
    nt, gt, _ = packed.shape
    b = packed.reshape(nt, gt, 16, 4)                       # (t, g, i, j)
    c = np.stack([(b >> (2 * s)) & 3 for s in range(4)], axis=-1)  # (t, g, i, j, s)
    codes = c.transpose(0, 2, 1, 4, 3).reshape(nt * 16, gt * 16)   # (t, i, g, s, j)
    return codes[:n, :k].astype(np.int8) - 1


def trit5_groups(kp: int) -> int:
    """Groups of 5 quads (64 bytes each, per row tile) of a 1.6-bit matrix whose padded width is kp."""
    return (kp // 4 + TRITS - 1) // TRITS


def encode_trits(c: np.ndarray) -> np.ndarray:
    """Codes (..., 5) in {0, 1, 2} -> bytes (...,) uint8: ceil(256 v / 243), v the base-3 number c_0 c_1 .. c_4."""
    v = (np.asarray(c, dtype=np.int64) * _POW3[::-1]).sum(axis=-1)
    return ((v * 256 + 242) // 243).astype(np.uint8)


def decode_trits(q: np.ndarray) -> np.ndarray:
    """Bytes (...,) of encode_trits -> codes (..., 5) uint8, digit d by t = q 3^d mod 256, c = 3t >> 8."""
    t = (np.asarray(q, dtype=np.int64)[..., None] * _POW3) % 256
    return ((3 * t) >> 8).astype(np.uint8)


def pack_ternary5_tiles(w: np.ndarray) -> np.ndarray:
    """Ternary int (N, K) -> 1.6-bit tiles uint8 (Np/16, G5, 64); see the module docstring."""
    n, k = w.shape
    np_, kp = ceil_to(n, TILE_ROWS), ceil_to(k, TILE_COLS)
    g5 = trit5_groups(kp)
    codes = np.ones((np_, g5 * TRITS * 4), dtype=np.uint8)   # the columns past kp: code 1 too
    codes[:n, :k] = (np.asarray(w, dtype=np.int16) + 1).astype(np.uint8)
    if codes.max() > 2:
        raise ValueError("weights are not ternary")
    # (t, i, g, d, j) -> (t, g, i, j, d): byte (t, g, 4i+j) encodes the five digits d
    c = codes.reshape(np_ // 16, 16, g5, TRITS, 4).transpose(0, 2, 1, 4, 3)
    return np.ascontiguousarray(encode_trits(c).reshape(np_ // 16, g5, 64))


def unpack_ternary5_tiles(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    """1.6-bit tiles uint8 (Np/16, G5, 64) -> ternary int8 (N, K). Inverse of pack_ternary5_tiles."""
    nt, g5, _ = packed.shape
    c = decode_trits(np.asarray(packed).reshape(nt, g5, 16, 4))        # (t, g, i, j, d)
    codes = c.transpose(0, 2, 1, 4, 3).reshape(nt * 16, g5 * TRITS * 4)  # (t, i, g, d, j)
    return codes[:n, :k].astype(np.int8) - 1


def ternary_tile_shape(n: int, k: int, packing: str = PACKING_2BIT) -> tuple[int, int, int]:
    """The shape of the tiles of a ternary (n, k) matrix in either layout."""
    kp = ceil_to(k, TILE_COLS)
    groups = kp // TILE_COLS if packing == PACKING_2BIT else trit5_groups(kp)
    return ceil_to(n, TILE_ROWS) // TILE_ROWS, groups, 64


def packing_for(widest_k: int, asked: str | None = None, preferred: str | None = None,
                n_weights: int | None = None) -> str:
    """The layout a conversion writes: `asked` (one of PACKINGS), else `preferred` (None: 2-bit for a model of at
    most CACHED_MODEL_WEIGHTS ternary weights `n_weights`, else what this CPU decodes fastest,
    kernel_paths.preferred_packing); a matrix wider than TRIT5_MAX_KP columns takes 2-bit tiles (the 1.6-bit
    kernels' int32 sums would overflow). ValueError when 1.6-bit is asked for such a matrix."""
    if asked is not None and asked not in PACKINGS:
        raise ValueError(f"unknown ternary packing {asked!r}; use one of {', '.join(PACKINGS)}")
    fits = ceil_to(widest_k, TILE_COLS) <= TRIT5_MAX_KP
    if asked == PACKING_16BIT and not fits:
        raise ValueError(f"a matrix of {widest_k} columns is too wide for 1.6-bit tiles (at most {TRIT5_MAX_KP}); "
                         "use the 2-bit packing")
    if asked:
        return asked
    if preferred is None and n_weights is not None and n_weights <= CACHED_MODEL_WEIGHTS:
        preferred = PACKING_2BIT
    if preferred is None:
        from .kernel_paths import preferred_packing
        preferred = preferred_packing()
    return preferred if fits else PACKING_2BIT


def pack_tiles(w: np.ndarray, packing: str = PACKING_2BIT) -> np.ndarray:
    """Ternary (N, K) -> its tiles in the layout `packing` (one of PACKINGS)."""
    return pack_ternary_tiles(w) if packing == PACKING_2BIT else pack_ternary5_tiles(w)


def unpack_tiles(packed: np.ndarray, n: int, k: int, packing: str = PACKING_2BIT) -> np.ndarray:
    """Tiles in the layout `packing` -> ternary int8 (N, K)."""
    return unpack_ternary_tiles(packed, n, k) if packing == PACKING_2BIT else unpack_ternary5_tiles(packed, n, k)


def pack_int8_tiles(w8: np.ndarray) -> np.ndarray:
    """int8 (N, K) -> tile layout int8 (Np/16, Kp/4, 64) with Kp = ceil16(K)."""
    n, k = w8.shape
    np_, kp = ceil_to(n, TILE_ROWS), ceil_to(k, TILE_COLS)
    full = np.zeros((np_, kp), dtype=np.int8)
    full[:n, :k] = w8
    t = full.reshape(np_ // 16, 16, kp // 4, 4).transpose(0, 2, 1, 3)  # (t, g, i, j)
    return np.ascontiguousarray(t.reshape(np_ // 16, kp // 4, 64))


def unpack_int8_tiles(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    nt, gt, _ = packed.shape
    full = packed.reshape(nt, gt, 16, 4).transpose(0, 2, 1, 3).reshape(nt * 16, gt * 4)
    return full[:n, :k]


def quantize_rows_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float (N, K) -> (int8 (N, K), scale float32 (N,)) with w ~= w8 * scale (absmax per row)."""
    w = np.asarray(w, dtype=np.float32)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    w8 = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return w8, scale


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even (as torch does)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)
