"""Arrays of the element types a kernel reads and writes (autocnn.precision.ElementType), in NumPy
or CuPy alike: float32 as float32, float16 as float16, and bfloat16, which neither has, as the bit
patterns of its values in uint16 (a bfloat16 is the upper half of the float32 of the same value).

Verification draws float32 values, rounds them to the element type as the kernel's buffers hold
them (``rounded``), computes its float64 reference from exactly those values (``values``) and reads
the outputs back the same way; outputs start as the type's NaN (``nans``), so an element a kernel
never writes fails.
"""
from __future__ import annotations

from typing import Any

import numpy

from autocnn.precision import BFLOAT16, FLOAT16, FLOAT32, ElementType

# A quiet NaN of bfloat16 (sign 0, exponent all ones, the top mantissa bit set), as cvt.rn gives it.
BFLOAT16_NAN_BITS = 0x7FC0


def storage_dtype(element: ElementType) -> str:
    """The dtype of the arrays that hold ``element``'s values."""
    if element == FLOAT32 or element == FLOAT16:
        return element.name
    if element == BFLOAT16:
        return "uint16"
    raise ValueError(f"no array dtype holds {element.name} values (known: float32, float16, bfloat16)")


def rounded(values: Any, element: ElementType, xp: Any) -> Any:
    """float32 ``values`` rounded to nearest even in ``element``, as its storage array: what
    __float2bfloat16_rn / __float2half_rn store. NaN stays NaN; float16 overflows to +-Inf beyond
    65504 (from 65520 on, round to nearest), as the GPU's conversion does."""
    values = xp.asarray(values, dtype=xp.float32)
    if element == FLOAT32:
        return values.copy()
    if element == FLOAT16:
        with numpy.errstate(over="ignore"):   # NumPy warns of the overflow that is the rounding asked for
            return values.astype(xp.float16)
    if element == BFLOAT16:
        bits = values.view(xp.uint32)
        # Round to nearest, ties to even: add half an ulp of the kept part, less one, plus its lowest bit.
        kept = (bits + xp.uint32(0x7FFF) + ((bits >> xp.uint32(16)) & xp.uint32(1))) >> xp.uint32(16)
        return xp.where(xp.isnan(values), xp.uint32(BFLOAT16_NAN_BITS), kept).astype(xp.uint16)
    raise ValueError(f"cannot round to {element.name}")


def values(stored: Any, element: ElementType, xp: Any) -> Any:
    """The float32 values a storage array of ``element`` holds (exactly: every 16-bit value is one)."""
    if element == FLOAT32:
        return stored
    if element == FLOAT16:
        return stored.astype(xp.float32)
    if element == BFLOAT16:
        return (stored.astype(xp.uint32) << xp.uint32(16)).view(xp.float32)
    raise ValueError(f"cannot read {element.name} values")


def nans(shape: tuple[int, ...], element: ElementType, xp: Any) -> Any:
    """A storage array of ``element`` filled with its NaN."""
    if element == BFLOAT16:
        return xp.full(shape, BFLOAT16_NAN_BITS, dtype=xp.uint16)
    return xp.full(shape, xp.nan, dtype=storage_dtype(element))

