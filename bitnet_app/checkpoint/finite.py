"""Every float a conversion reads or writes must be a finite number: a NaN or an infinity in one norm weight makes
every logit NaN (the reply is then random ids, with no word), so the converter refuses it, naming the tensor and
the first bad index.

    check_finite(name, arr, where)   ConvertError unless arr (float16/32/64, or bfloat16 bits as uint16) is all
                                     finite; where: the checkpoint folder, or "the engine file" for what is written
"""
import numpy as np

from .config import ConvertError

BF16_EXPONENT = 0x7F80   # all eight exponent bits set: an infinity or a NaN


def _non_finite(arr: np.ndarray) -> np.ndarray:
    """A bool mask of the entries that are not finite numbers (bfloat16 bits when arr is uint16)."""
    if arr.dtype == np.uint16:
        return (arr & BF16_EXPONENT) == BF16_EXPONENT
    return ~np.isfinite(arr)


def check_finite(name: str, arr: np.ndarray, where: str, first_row: int = 0) -> None:
    """first_row: arr is the tensor's rows from this one on (a chunk), for the index in the message."""
    bad = _non_finite(arr)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        value = arr[at]
        at = (at[0] + first_row,) + at[1:]
        if arr.dtype == np.uint16:
            value = f"bfloat16 0x{int(value):04X} ({'NaN' if value & 0x7F else 'infinity'})"
        raise ConvertError(f"tensor {name!r} in {where} holds {value} at index {list(at)}: weights must be finite "
                           "numbers. The checkpoint is damaged: download it again.")
