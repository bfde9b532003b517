"""The element types Q, K, V and O come in (a configuration's `dtype`), as NumPy and CuPy arrays hold them.

fp16 is the arrays' own float16. bf16 has no dtype in CuPy (nor NumPy): a bf16 array is a uint16 array
of the bf16 bit patterns, the top half of the float32 each rounds from, which is what a kernel reads and
writes and what torch's bfloat16 views the same memory as. Every reading of such an array as numbers
goes through `to_float32`, every writing through `from_float32`: nowhere is a uint16 array's integer
value taken for the number it holds.
"""
from __future__ import annotations

from . import FlashbenchError

ELEMENT_TYPES = ("fp16", "bf16")
# The largest relative rounding error of one value (half an ulp at 1: 2^-(mantissa bits + 1))
HALF_ULP = {"fp16": 2.0**-11, "bf16": 2.0**-8}
NAN_BITS = {"fp16": 0x7E00, "bf16": 0x7FC0}  # a quiet NaN: an element a kernel does not write stays NaN
TORCH_NAMES = {"fp16": "float16", "bf16": "bfloat16"}  # torch's dtype of each


def _known(dtype: str) -> str:
    if dtype not in ELEMENT_TYPES:
        raise FlashbenchError(f"element type {dtype!r}: one of {', '.join(ELEMENT_TYPES)}")
    return dtype


def storage(xp, dtype: str):
    """The array dtype that holds `dtype`'s elements: float16, or uint16 bit patterns for bf16."""
    return xp.float16 if _known(dtype) == "fp16" else xp.uint16


def of_array(a) -> str:
    """The element type an array holds, by its dtype: float16 fp16, uint16 bf16 (this module's form)."""
    name = str(a.dtype)
    if name == "float16":
        return "fp16"
    if name == "uint16":
        return "bf16"
    raise FlashbenchError(f"an array of {name} holds neither fp16 (float16) nor bf16 (uint16 bit patterns)")


def from_float32(x, dtype: str, xp):
    """float32 values rounded to `dtype` (to nearest, ties to even), in the array form that holds it."""
    if _known(dtype) == "fp16":
        return x.astype(xp.float16)
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = (bits + (xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1)))) >> 16
    return xp.where(xp.isnan(x), xp.uint32(NAN_BITS["bf16"]), rounded).astype(xp.uint16)


def to_float32(a, xp):
    """An fp16 or bf16 array's values as float32 (exactly: both are subsets of float32); float32 as is."""
    if str(a.dtype) == "float32":
        return a
    if of_array(a) == "fp16":
        return a.astype(xp.float32)
    return (a.astype(xp.uint32) << 16).view(xp.float32)


def rounded(x, dtype: str, xp):
    """float32 values rounded to `dtype` and back: what storing them in `dtype` leaves."""
    return to_float32(from_float32(x, dtype, xp), xp)


def nan_filled(xp, shape: tuple, dtype: str):
    """An array of `shape` of `dtype`'s quiet NaN."""
    return xp.full(shape, NAN_BITS[_known(dtype)], dtype=xp.uint16).view(storage(xp, dtype))
