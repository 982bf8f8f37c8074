"""torch.nn's layer arguments as autocnn problems: sizes, padding, output shapes, precision.

PyTorch spells a size as an int or a pair and a convolution's padding also as "same" or "valid";
autocnn's problems take pairs and an explicit (top, left, bottom, right) padding. This module
turns one into the other and builds the (cached) kernel problems the operators run, with their
channel groups, dilation, precision (the tensors' dtype decides it: autocnn.torch.dtypes) and layout
(their memory format decides it: autocnn.torch.memory_formats). It imports
no torch, so that the arithmetic the fake (meta) implementations share with the real ones is
plain Python over ints, or over PyTorch's symbolic ints under ``torch.compile``.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

from autocnn.kernels.problem import (
    AvgPoolBwdProblem,
    AvgPoolFwdProblem,
    ConvBwdDataProblem,
    ConvFwdProblem,
    ConvWgradProblem,
    beyond_index_limit,
    conv_index_extents,
    pool_index_extents,
)
from autocnn.errors import ProblemTooLargeError
from autocnn.layout import DEFAULT_LAYOUT, Layout
from autocnn.precision import DEFAULT_PRECISION, FLOAT32_PRECISION_NAMES, Precision, precision_named

Pair = tuple[int, int]
Padding = tuple[int, int, int, int]   # top, left, bottom, right


def check_precision(where: str, precision: Any) -> str:
    """The name of a float32 precision (fp32 or tf32), which the layers and operators take as an
    argument (a Precision is taken for its name), or ValueError naming the allowed ones. It is the
    precision of float32 tensors: bfloat16 and float16 tensors compute at bf16 and fp16."""
    name = precision.name if isinstance(precision, Precision) else precision
    if name not in FLOAT32_PRECISION_NAMES:
        raise ValueError(f"{where}: precision={precision!r} is not one of {', '.join(FLOAT32_PRECISION_NAMES)} "
                         f"(the precision of float32 tensors; fp32: FP32-accurate, the default; tf32: opt-in, one "
                         f"TF32 product per term); bfloat16 and float16 tensors compute at bf16 and fp16, by "
                         f"their dtype")
    return name


def pair(name: str, value: Any) -> Pair:
    """An int or a sequence of two ints as a pair (how torch.nn takes sizes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if (isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"{name} must be an int or a pair of ints, not {value!r}")


def conv_padding(padding: Any, kernel_size: Any, dilation: Any = 1) -> Padding:
    """torch.nn.Conv2d's padding as (top, left, bottom, right).

    "same" pads dilation*(k-1) in all per dimension, the smaller half first, as PyTorch does (an
    even filter gets one more row at the bottom and one more column at the right).
    """
    r, s = pair("kernel_size", kernel_size)
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            dh, dw = pair("dilation", dilation)
            total_h, total_w = dh * (r - 1), dw * (s - 1)
            return (total_h // 2, total_w // 2, total_h - total_h // 2, total_w - total_w // 2)
        raise ValueError(f"padding must be an int, a pair of ints, 'same' or 'valid', not {padding!r}")
    ph, pw = pair("padding", padding)
    return (ph, pw, ph, pw)


def pool_padding(padding: Any) -> Padding:
    ph, pw = pair("padding", padding)
    return (ph, pw, ph, pw)


def output_size(size: Any, window: int, stride: int, before: int, after: int) -> Any:
    """Outputs along one dimension; ``size`` may be a symbolic int (fake tensors under compile)."""
    return (size + before + after - window) // stride + 1


def filter_extent(size: int, dilation: int) -> int:
    """The input rows (or columns) one dilated filter window spans."""
    return (size - 1) * dilation + 1


def conv_output_shape(x_shape: Sequence[Any], w_shape: Sequence[Any], stride: Sequence[int],
                      padding: Sequence[int], dilation: Sequence[int] = (1, 1)) -> tuple[Any, ...]:
    n, _, h, w = x_shape
    k, _, r, s = w_shape
    return (n, k, output_size(h, filter_extent(r, dilation[0]), stride[0], padding[0], padding[2]),
            output_size(w, filter_extent(s, dilation[1]), stride[1], padding[1], padding[3]))


def pool_output_shape(x_shape: Sequence[Any], window: Sequence[int], stride: Sequence[int],
                      padding: Sequence[int]) -> tuple[Any, ...]:
    n, c, h, w = x_shape
    return (n, c, output_size(h, window[0], stride[0], padding[0], padding[2]),
            output_size(w, window[1], stride[1], padding[1], padding[3]))


def concrete(*shapes: Sequence[Any]) -> bool:
    """Whether every size is a plain int (not a symbolic one of a dynamic-shape trace)."""
    return all(type(v) is int for shape in shapes for v in shape)


# -- problems -------------------------------------------------------------------------------------

def _conv_geometry(where: str, x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                   padding: Sequence[int], dilation: Sequence[int], groups: int, precision: Any) -> dict[str, Any]:
    if len(x_shape) != 4:
        raise ValueError(f"{where}: the input must be N x C x H x W, not of shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"{where}: the weight must be K x C x R x S, not of shape {tuple(w_shape)}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{where}: groups must be a positive integer, not {groups!r}")
    if x_shape[1] != w_shape[1] * groups:
        expects = f"{w_shape[1]}" if groups == 1 else f"{w_shape[1]} x groups={groups} = {w_shape[1] * groups}"
        raise ValueError(f"{where}: the input has {x_shape[1]} channels (shape {tuple(x_shape)}) but the "
                         f"weight of shape {tuple(w_shape)} expects {expects}")
    if len(stride) != 2 or len(padding) != 4 or len(dilation) != 2:
        raise ValueError(f"{where}: stride and dilation must have 2 entries and padding 4 (top, left, bottom, "
                         f"right); got stride={list(stride)}, dilation={list(dilation)}, padding={list(padding)}")
    n, c, h, w = (int(v) for v in x_shape)
    return dict(N=n, C=c, H=h, W=w, K=int(w_shape[0]), R=int(w_shape[2]), S=int(w_shape[3]),
                stride=tuple(int(v) for v in stride), padding=tuple(int(v) for v in padding),
                dilation=tuple(int(v) for v in dilation), groups=int(groups),
                precision=precision_named(precision, where))


@functools.lru_cache(maxsize=4096)
def conv_problem(op: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], precision: str = DEFAULT_PRECISION.name, bias: bool = False,
                 dilation: tuple[int, ...] = (1, 1), groups: int = 1, layout: Layout = DEFAULT_LAYOUT) -> Any:
    """The problem of one convolution operation (conv_fwd, conv_bwd_data or conv_wgrad) of the layer
    with input ``x_shape`` and weight ``w_shape`` (K x C/groups x R x S, logical: the same in every
    layout) at ``precision`` (any of autocnn's: the tensors' dtype chose it), its tensors in ``layout``
    (their memory format chose it: autocnn.torch.memory_formats); InvalidProblemError / ValueError when
    the shapes or arguments do not make a problem (cached: the operators ask once per call)."""
    geometry = _conv_geometry(f"autocnn {op}", x_shape, w_shape, stride, padding, dilation, groups, precision)
    geometry["layout"] = layout
    if op == "conv_fwd":
        return ConvFwdProblem(**geometry, bias=bias)
    if op == "conv_bwd_data":
        return ConvBwdDataProblem(**geometry)
    if op == "conv_wgrad":
        return ConvWgradProblem(**geometry, bias=bias)
    raise ValueError(f"conv_problem: op {op!r} is not conv_fwd, conv_bwd_data or conv_wgrad")


@functools.lru_cache(maxsize=4096)
def pool_problem(op: str, x_shape: tuple[int, ...], window: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], count_pad: bool, precision: str = DEFAULT_PRECISION.name,
                 layout: Layout = DEFAULT_LAYOUT) -> Any:
    """The problem of average pooling forward or backward over an input of ``x_shape`` (logical), at
    its storage's ``precision`` (fp32, bf16 or fp16), in ``layout``."""
    if len(x_shape) != 4:
        raise ValueError(f"autocnn {op}: the input must be N x C x H x W, not of shape {tuple(x_shape)}")
    if len(window) != 2 or len(stride) != 2 or len(padding) != 4:
        raise ValueError(f"autocnn {op}: kernel_size and stride must have 2 entries and padding 4 "
                         f"(top, left, bottom, right); got {list(window)}, {list(stride)}, {list(padding)}")
    n, c, h, w = (int(v) for v in x_shape)
    cls = {"avgpool_fwd": AvgPoolFwdProblem, "avgpool_bwd": AvgPoolBwdProblem}.get(op)
    if cls is None:
        raise ValueError(f"pool_problem: op {op!r} is not avgpool_fwd or avgpool_bwd")
    return cls(N=n, C=c, H=h, W=w, window=tuple(int(v) for v in window), stride=tuple(int(v) for v in stride),
               padding=tuple(int(v) for v in padding), count_pad=bool(count_pad), precision=precision,
               layout=layout)


# -- layers larger than autocnn's kernels address --------------------------------------------------

def conv_beyond_index_limit(x_shape: Sequence[Any], w_shape: Sequence[Any], stride: Sequence[int],
                            padding: Sequence[int], dilation: Sequence[int] = (1, 1)) -> bool:
    """Whether the convolution is larger than autocnn's kernels address (the extents ConvProblem
    checks, kernels.problem.conv_index_extents). Arithmetic only: on a torch.compile trace's
    symbolic sizes it becomes a guard, so a dynamic-shape graph stays one graph."""
    N, C, H, W = x_shape
    K, R, S = w_shape[0], w_shape[2], w_shape[3]
    P = (H + padding[0] + padding[2] - filter_extent(R, dilation[0])) // stride[0] + 1
    Q = (W + padding[1] + padding[3] - filter_extent(S, dilation[1])) // stride[1] + 1
    # The filters hold C/groups channels a filter: the groups are what the input has beyond them.
    return beyond_index_limit(conv_index_extents(N, C, H, W, K, R, S, P, Q, C // w_shape[1]))


def pool_beyond_index_limit(x_shape: Sequence[Any], window: Sequence[int], stride: Sequence[int],
                            padding: Sequence[int]) -> bool:
    """As conv_beyond_index_limit, for average pooling."""
    N, C, H, W = x_shape
    P = (H + padding[0] + padding[2] - window[0]) // stride[0] + 1
    Q = (W + padding[1] + padding[3] - window[1]) // stride[1] + 1
    return beyond_index_limit(pool_index_extents(N, C, H, W, P, Q))


def size_refusal(build: Any) -> str:
    """The message of the ProblemTooLargeError that building the problem raises (outside a trace)."""
    try:
        build()
    except ProblemTooLargeError as exc:
        return str(exc)
    return "larger than autocnn's kernels address"
