"""What autocnn's kernels can run: one message per reason a torch.nn layer stays with PyTorch.

The same checks decide three things: whether ``autocnn.torch.Conv2d(...)`` accepts its arguments,
what ``convert`` replaces (and the report line of what it leaves), and, at call time, whether a
tensor goes to autocnn's operator or to PyTorch's (``runs_on_autocnn``, and the layer's table of
``refusals`` per precision and layout, ``LayerRefusals``).

Whether a layer's channel groups, dilation and precision can be computed is asked of the kernels,
never decided here: a convolution runs on autocnn when each of conv_fwd, conv_bwd_data and
conv_wgrad has a formulation that serves its problem (``Operation.refusals``, which formulations
fill in by their rules: ``rules.Refusal``, ``OpFormulation.grouping_refusal``), and a pooling layer
when avgpool_fwd and avgpool_bwd have one. The question is asked of the layer's arguments on a
one-image problem of the smallest input its filter fits: refusals concern precision, groups and
dilation, not the image's size, so the answer holds for every input, and is known before one is
seen (convert runs before the first step, and a compiled forward reads the table, not the kernels).

The layout is asked likewise: a channels_last layer (NHWC problems) runs on autocnn where each of
its operations has a formulation serving NHWC (``OpFormulation.layouts``), which no list here names.
A layer's layout is that of its tensors, known only at a call: ``convert`` decides by its weight's
(channels_last after ``model.to(memory_format=torch.channels_last)``; a pooling layer, which has
none, by the model's), and each call reads the table again at its own tensors' layout.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autocnn.device import DeviceLimits
from autocnn.errors import InvalidProblemError
from autocnn.kernels.registry import get_operation
from autocnn.layout import DEFAULT_LAYOUT, LAYOUTS, Layout
from autocnn.precision import FP32, PRECISIONS, Precision, without_products
from autocnn.torch.dtypes import DTYPE_NAMES, ELEMENTS, dtype_name, precision_of_call
from autocnn.torch.geometry import conv_padding, conv_problem, filter_extent, pair, pool_padding, pool_problem
from autocnn.torch.memory_formats import in_either_layout, tensor_layout

CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
POOL_OPS = ("avgpool_fwd", "avgpool_bwd")
# Formulations refuse a problem by its precision, channel groups and dilation, whatever the GPU (as
# the tuner's problems_offering asks them).
_LIMITS = DeviceLimits.for_arch("sm_90")
POOL_PRECISIONS: tuple[Precision, ...] = tuple(dict.fromkeys(without_products(p) for p in PRECISIONS))


@functools.lru_cache(maxsize=4096)
def _formulations_refusing(problem: Any) -> str | None:
    """Each formulation's reason for refusing ``problem``, those of one reason named together; None
    where some formulation of its operation serves it."""
    operation = get_operation(problem.op)
    refusals = operation.refusals(problem, _LIMITS)
    if not set(operation.formulation_names) <= set(refusals):
        return None
    by_reason: dict[str, list[str]] = {}
    for name, why in refusals.items():
        # Each reason begins with its formulation's name: one reason given by several is said once.
        tail = why[len(name) + 1:] if why.startswith(name + " ") else why
        names = by_reason.setdefault(tail, [])
        if name not in names:
            names.append(name)
    return "; ".join(f"{', '.join(names)}: {tail}" for tail, names in by_reason.items())


def kernels_refusal(problem: Any) -> str | None:
    """Why no formulation of ``problem``'s operation can compute it, None where one can."""
    listed = _formulations_refusing(problem)
    return None if listed is None else f"no {problem.op} kernel of autocnn computes it ({listed})"


def _layer_refusal(what: str, problems: list[Any]) -> str | None:
    unserved = [(p, _formulations_refusing(p)) for p in problems]
    unserved = [(p, listed) for p, listed in unserved if listed is not None]
    if not unserved:
        return None
    first, listed = unserved[0]
    ops = ", ".join(p.op for p, _ in unserved)
    return f"{what}: no {ops} kernel of autocnn computes it at {first.precision} ({first.op}: {listed})"


@functools.lru_cache(maxsize=1024)
def conv_layer_refusal(in_channels: int, out_channels: int, kernel_size: tuple[int, int], stride: tuple[int, int],
                       padding: tuple[int, ...], dilation: tuple[int, int], groups: int,
                       precision: str, layout: Layout = DEFAULT_LAYOUT) -> str | None:
    """Why autocnn's kernels cannot compute this convolution layer at ``precision`` in ``layout``
    (None where every one of its three operations has a formulation that serves it)."""
    x_shape = (1, in_channels, filter_extent(kernel_size[0], dilation[0]), filter_extent(kernel_size[1], dilation[1]))
    w_shape = (out_channels, in_channels // groups, *kernel_size)
    try:
        problems = [conv_problem(op, x_shape, w_shape, stride, padding, precision, False, dilation, groups, layout)
                    for op in CONV_OPS]
    except (InvalidProblemError, ValueError) as exc:
        return str(exc)
    what = ", ".join([f"groups={groups}"] * (groups != 1) + [f"dilation={dilation}"] * (dilation != (1, 1))
                     + [_layout_words(layout)] * layout.channels_last)
    return _layer_refusal(what or "this layer", problems)


def _layout_words(layout: Layout) -> str:
    return f"channels_last ({layout.label})"


@dataclass(frozen=True)
class LayerRefusals:
    """A layer's refusal (None: the kernels serve it) at each precision, by name, in each layout: the
    table its forward reads to choose autocnn's operator or PyTorch's for a call."""

    by_layout: dict[Layout, dict[str, str | None]]

    def at(self, precision: str, layout: Layout) -> str | None:
        return self.by_layout[layout][precision]

    def served(self, layout: Layout) -> list[str]:
        """The precisions served in ``layout``, by name."""
        return [name for name, refusal in self.by_layout[layout].items() if refusal is None]


def conv_refusals(module: nn.Conv2d) -> LayerRefusals:
    """The layer's LayerRefusals (precisions by name: fp32 and tf32 for float32 tensors, bf16, fp16)."""
    args = (module.in_channels, module.out_channels, pair("kernel_size", module.kernel_size),
            pair("stride", module.stride), conv_padding(module.padding, module.kernel_size, module.dilation),
            pair("dilation", module.dilation), module.groups)
    return LayerRefusals({layout: {p.name: conv_layer_refusal(*args, p.name, layout) for p in PRECISIONS}
                          for layout in LAYOUTS})


@functools.lru_cache(maxsize=1024)
def pool_layer_refusal(window: tuple[int, int], stride: tuple[int, int], padding: tuple[int, ...], count_pad: bool,
                       precision: str, layout: Layout = DEFAULT_LAYOUT) -> str | None:
    """Why autocnn's kernels cannot compute this average-pooling layer at ``precision`` in ``layout``."""
    x_shape = (1, 1, window[0], window[1])
    try:
        problems = [pool_problem(op, x_shape, window, stride, padding, count_pad, precision, layout)
                    for op in POOL_OPS]
    except (InvalidProblemError, ValueError) as exc:
        return str(exc)
    return _layer_refusal(_layout_words(layout) if layout.channels_last else "this layer", problems)


def pool_refusals(module: nn.AvgPool2d) -> LayerRefusals:
    """As conv_refusals, for average pooling (fp32, bf16, fp16: its storage's precisions)."""
    window = pair("kernel_size", module.kernel_size)
    stride = pair("stride", module.stride if module.stride is not None else module.kernel_size)
    args = (window, stride, pool_padding(module.padding), bool(module.count_include_pad))
    return LayerRefusals({layout: {p.name: pool_layer_refusal(*args, p.name, layout) for p in POOL_PRECISIONS}
                          for layout in LAYOUTS})


def layer_precision(weight: Any, float32_precision: str) -> str | None:
    """The precision a layer of this weight computes at outside autocast (None for a dtype the kernels
    do not take)."""
    if weight.dtype not in ELEMENTS:
        return None
    return precision_of_call(weight.dtype, float32_precision)


def _weight_reasons(weight: Any) -> list[str]:
    if isinstance(weight, nn.parameter.UninitializedParameter):
        return ["a lazy module whose weight is not initialized yet (run one forward pass, then convert)"]
    reasons = []
    if weight.dtype not in ELEMENTS:
        reasons.append(f"dtype {dtype_name(weight.dtype)} (autocnn's kernels run {DTYPE_NAMES})")
    if weight.dim() == 4 and tensor_layout(weight) is None:
        reasons.append(f"a weight of strides {tuple(weight.stride())}, contiguous neither as KCRS nor as "
                       f"channels_last (KRSC)")
    return reasons


def conv_layout(module: nn.Conv2d) -> Layout:
    """The layout convert decides a convolution for: its weight's (NCHW for one of neither)."""
    weight = module.weight
    if isinstance(weight, nn.parameter.UninitializedParameter) or weight.dim() != 4:
        return DEFAULT_LAYOUT
    return tensor_layout(weight) or DEFAULT_LAYOUT


def conv_reasons(module: nn.Conv2d, precision: str) -> list[str]:
    """Why autocnn cannot run this nn.Conv2d (empty when it can), with float32 weights at ``precision``
    (fp32 or tf32) and 16-bit ones at their dtype's, in its weight's layout (conv_layout)."""
    reasons = []
    if module.padding_mode != "zeros":
        reasons.append(f"padding_mode={module.padding_mode!r} (autocnn pads with zeros only)")
    r, s = pair("kernel_size", module.kernel_size)
    dh, dw = pair("dilation", module.dilation)
    top, left, bottom, right = conv_padding(module.padding, module.kernel_size, module.dilation)
    padding_fits = max(top, bottom) < filter_extent(r, dh) and max(left, right) < filter_extent(s, dw)
    if not padding_fits:
        reasons.append(f"padding={module.padding!r} is not smaller than the kernel {r}x{s}"
                       + ("" if (dh, dw) == (1, 1) else f" dilated by {(dh, dw)}")
                       + " (autocnn's kernels need padding below the filter's extent)")
    reasons += _weight_reasons(module.weight)
    if not reasons:
        refusal = conv_refusals(module).at(layer_precision(module.weight, precision), conv_layout(module))
        if refusal is not None:
            reasons.append(refusal)
    return reasons


def pool_reasons(module: nn.AvgPool2d, layout: Layout = DEFAULT_LAYOUT) -> list[str]:
    """Why autocnn cannot run this nn.AvgPool2d (empty when it can) on inputs of ``layout``."""
    reasons = []
    if module.ceil_mode:
        reasons.append("ceil_mode=True (autocnn's pooling rounds the output size down)")
    if module.divisor_override is not None:
        reasons.append(f"divisor_override={module.divisor_override} (autocnn divides by the window "
                       f"or by its positions inside the image)")
    kh, kw = pair("kernel_size", module.kernel_size)
    top, left, _, _ = pool_padding(module.padding)
    if top >= kh or left >= kw:
        reasons.append(f"padding={module.padding!r} is not smaller than the window {kh}x{kw}")
    if not reasons:
        refusal = pool_refusals(module).at(FP32.name, layout)
        if refusal is not None:
            reasons.append(refusal)
    return reasons


def check_arguments(kind: str, reasons: list[str]) -> None:
    """The drop-in modules refuse what their kernels cannot run, naming torch.nn's module for it."""
    if reasons:
        raise ValueError(f"autocnn.torch.{kind} cannot run {'; '.join(reasons)}: use torch.nn.{kind} for "
                         f"this layer (autocnn.torch.convert leaves such layers to it)")


def runs_on_autocnn(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether a call goes to autocnn's operator: a batch (or single image) contiguous as NCHW or as
    channels_last, of a dtype the kernels take (float32, bfloat16, float16) on a CUDA device, with
    parameters alike in device and contiguous in either layout (the operator brings a tensor of the
    other layout to the call's; tensors of different dtypes go to it too, and it says what to change). Meta
    tensors count as CUDA ones, so that shapes are traced through the operators' fake
    implementations. Kept to tensor attributes: torch.compile traces it into guards, without a
    graph break."""
    if x.device.type not in ("cuda", "meta") or x.dtype not in ELEMENTS or x.dim() not in (3, 4):
        return False
    if not in_either_layout(x):
        return False
    for p in params:
        if p is not None and (p.device != x.device or p.dtype not in ELEMENTS or not in_either_layout(p)):
            return False
    return True
