"""Every float a conversion reads or writes must be a finite number in the range real weights have: a NaN or an
infinity in one norm weight makes every logit NaN, and a flipped exponent bit (0.84 -> 2.9e38) overflows the
forward, so the reply is random ids with no word. The converter refuses such a tensor, naming it and the first
bad index.

    check_weights(name, arr, where)   ConvertError unless every value of arr (float16/32/64, or bfloat16 bits as
                                      uint16) is finite with |x| <= MAX_WEIGHT; where: the checkpoint folder, or
                                      "the converted engine file" for what is written
"""
import numpy as np

from ..engine.packing import bf16_to_f32
from ..engine.values import MAX_WEIGHT
from .config import ConvertError

BF16_LARGEST_OK = 0x477F   # |bits| above this (65536 and up, infinities, NaNs) is past MAX_WEIGHT


def _bad(arr: np.ndarray) -> np.ndarray:
    """A bool mask of the entries that are not finite numbers within MAX_WEIGHT (bfloat16 bits when uint16)."""
    if arr.dtype == np.uint16:
        return (arr & 0x7FFF) > BF16_LARGEST_OK
    return ~(np.abs(arr) <= MAX_WEIGHT)   # NaN compares false


def check_weights(name: str, arr: np.ndarray, where: str, first_row: int = 0) -> None:
    """first_row: arr is the tensor's rows from this one on (a chunk), for the index in the message."""
    bad = _bad(arr)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        value = arr[at]
        if arr.dtype == np.uint16:
            x = float(bf16_to_f32(np.array([value]))[0])
            shown = "NaN" if np.isnan(x) else "infinity" if np.isinf(x) else f"{x:.3g}"
            value = f"bfloat16 0x{int(value):04X} ({shown})"
        at = (at[0] + first_row,) + at[1:]
        raise ConvertError(f"tensor {name!r} in {where} holds {value} at index {list(at)}: weights are finite numbers "
                           f"no larger than {MAX_WEIGHT:g} (fp16's range; a real model's are far smaller). The "
                           "checkpoint is damaged: download it again.")
