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

Hugging Face packed U8 layout (transformers `pack_weights`): blocked along output rows,
    W[s*P + r, c] = ((packed[r, c] >> 2*s) & 3) - 1,  P = N / 4.
"""
import numpy as np

TILE_ROWS = 16  # rows per tile: one int32 lane each in a 512-bit register
TILE_COLS = 16  # columns per 64-byte group: 4 shifts x 4 bytes


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
