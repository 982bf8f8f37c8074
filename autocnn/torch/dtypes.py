"""The tensor dtypes autocnn's kernels take, the precision each computes at, and torch.autocast's casts.

A kernel problem's precision follows its tensors: float32 tensors compute at the layer's (or the
operator's) float32 precision, "fp32" or "tf32"; bfloat16 tensors at BF16 and float16 tensors at
FP16 (16-bit operands and outputs, FP32 sums: autocnn.precision), whatever that float32 precision
says. Pooling forms no products, so float32 pooling is FP32.

Under ``torch.autocast("cuda", dtype=...)`` PyTorch's conv2d casts its floating-point inputs,
weight and bias (float64 excepted) to the autocast dtype and computes there; autocnn.torch.Conv2d
does the same by casting in its forward (``autocast_inputs``), with differentiable casts, so the
gradients reach FP32 parameters through them. PyTorch's ``torch.library.register_autocast`` is not
used: it fixes one cast dtype per operator at registration, while autocast's (bfloat16 or float16)
is chosen per region. The autocast state is read with ``torch.is_autocast_enabled`` and
``torch.get_autocast_dtype``, which torch.compile folds into guards, so a compiled graph stays one
graph; the casts are ordinary ops that a CUDA graph captures. Average pooling runs in its input's
dtype under autocast, as PyTorch's avg_pool2d does.
"""
from __future__ import annotations

from typing import Any

import torch

from autocnn.precision import BF16, BFLOAT16, FLOAT16, FLOAT32, FP16, FP32, ElementType, Precision, precision_named
from autocnn.torch.geometry import check_precision

# Each dtype the kernels take, with what its elements are stored as (autocnn.precision's ElementType).
ELEMENTS: dict[torch.dtype, ElementType] = {torch.float32: FLOAT32, torch.bfloat16: BFLOAT16,
                                            torch.float16: FLOAT16}
# The precision of the 16-bit dtypes (float32's is the layer's choice, fp32 or tf32).
SIXTEEN_BIT: dict[torch.dtype, Precision] = {torch.bfloat16: BF16, torch.float16: FP16}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


DTYPE_NAMES = ", ".join(dtype_name(d) for d in ELEMENTS)


def precision_of_call(dtype: torch.dtype, float32_precision: str) -> str:
    """The name of the precision a call of ``dtype`` tensors computes at (``float32_precision`` for
    float32), unchecked: the key of a layer's refusals (support.py), in a forward that torch.compile
    traces (dictionary lookups only, which it folds)."""
    return SIXTEEN_BIT[dtype].name if dtype in SIXTEEN_BIT else float32_precision


def conv_precision(where: str, dtype: torch.dtype, float32_precision: Any) -> Precision:
    """The precision a convolution of ``dtype`` tensors computes at: ``float32_precision`` (fp32 or
    tf32, checked whatever the dtype) for float32, BF16 / FP16 for the 16-bit dtypes; TypeError for a
    dtype the kernels do not take."""
    name = check_precision(where, float32_precision)
    if dtype == torch.float32:
        return precision_named(name)
    if dtype in SIXTEEN_BIT:
        return SIXTEEN_BIT[dtype]
    raise TypeError(f"{where}: autocnn's kernels take {DTYPE_NAMES} tensors, not {dtype_name(dtype)}")


def pool_precision(where: str, dtype: torch.dtype) -> Precision:
    """The precision average pooling of ``dtype`` tensors runs at (its storage's)."""
    return FP32 if dtype == torch.float32 else conv_precision(where, dtype, FP32.name)


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype torch.autocast casts a CUDA convolution's inputs to, None outside CUDA autocast or for
    an input off CUDA. Meta tensors count as CUDA ones (as for the operators' choice), so that a
    shape trace under autocast sees the dtypes a CUDA run has."""
    if x.device.type not in ("cuda", "meta") or not torch.is_autocast_enabled("cuda"):
        return None
    return torch.get_autocast_dtype("cuda")


def autocast_inputs(dtype: torch.dtype | None, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The tensors as autocast hands them to a convolution: floating-point ones other than float64
    cast to ``dtype`` (a tensor already of it is returned as is), the others unchanged; all unchanged
    where ``dtype`` is None."""
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in tensors)


def same_dtype(where: str, named: dict[str, torch.Tensor | None]) -> torch.dtype:
    """The one dtype of these tensors (None entries skipped), or TypeError naming each one's."""
    given = {name: t.dtype for name, t in named.items() if t is not None}
    dtypes = set(given.values())
    if len(dtypes) > 1:
        listed = ", ".join(f"{name} {dtype_name(d)}" for name, d in given.items())
        raise TypeError(f"{where}: the tensors must have one dtype ({listed}); cast them alike (e.g. "
                        f".to(torch.bfloat16)) or run the layer under torch.autocast, which casts them")
    dtype = dtypes.pop()
    if dtype not in ELEMENTS:
        raise TypeError(f"{where}: autocnn's kernels take {DTYPE_NAMES} tensors, not {dtype_name(dtype)}")
    return dtype
