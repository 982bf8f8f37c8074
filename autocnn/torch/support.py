"""What autocnn's kernels can run: one message per reason a torch.nn layer stays with PyTorch.

The same checks decide three things: whether ``autocnn.torch.Conv2d(...)`` accepts its arguments,
what ``convert`` replaces (and the report line of what it leaves), and, at call time, whether a
tensor goes to autocnn's operator or to PyTorch's (``runs_on_autocnn``).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autocnn.torch.geometry import conv_padding, pair, pool_padding


def _weight_reasons(weight: Any) -> list[str]:
    if isinstance(weight, nn.parameter.UninitializedParameter):
        return ["a lazy module whose weight is not initialized yet (run one forward pass, then convert)"]
    reasons = []
    if weight.dtype != torch.float32:
        reasons.append(f"dtype {str(weight.dtype).replace('torch.', '')} (autocnn's kernels run float32)")
    if (weight.dim() == 4 and not weight.is_contiguous()
            and weight.is_contiguous(memory_format=torch.channels_last)):
        reasons.append("channels_last weight (autocnn's kernels take contiguous NCHW / KCRS tensors)")
    return reasons


def conv_reasons(module: nn.Conv2d) -> list[str]:
    """Why autocnn cannot run this nn.Conv2d (empty when it can)."""
    reasons = []
    if module.groups != 1:
        reasons.append(f"groups={module.groups} (autocnn computes groups=1)")
    if tuple(module.dilation) != (1, 1):
        reasons.append(f"dilation={tuple(module.dilation)} (autocnn computes dilation 1)")
    if module.padding_mode != "zeros":
        reasons.append(f"padding_mode={module.padding_mode!r} (autocnn pads with zeros only)")
    r, s = pair("kernel_size", module.kernel_size)
    top, left, bottom, right = conv_padding(module.padding, module.kernel_size, module.dilation)
    if max(top, bottom) >= r or max(left, right) >= s:
        reasons.append(f"padding={module.padding!r} is not smaller than the kernel {r}x{s} "
                       f"(autocnn's kernels need padding below the filter size)")
    return reasons + _weight_reasons(module.weight)


def pool_reasons(module: nn.AvgPool2d) -> list[str]:
    """Why autocnn cannot run this nn.AvgPool2d (empty when it can)."""
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
    return reasons


def check_arguments(kind: str, reasons: list[str]) -> None:
    """The drop-in modules refuse what their kernels cannot run, naming torch.nn's module for it."""
    if reasons:
        raise ValueError(f"autocnn.torch.{kind} cannot run {'; '.join(reasons)}: use torch.nn.{kind} for "
                         f"this layer (autocnn.torch.convert leaves such layers to it)")


def runs_on_autocnn(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether a call goes to autocnn's operator: a contiguous float32 batch (or single image) on a
    CUDA device, with parameters alike, outside autocast. Meta tensors count as CUDA ones, so that
    shapes are traced through the operators' fake implementations. Kept to tensor attributes and
    the autocast state: torch.compile traces it into guards, without a graph break."""
    if x.device.type not in ("cuda", "meta") or x.dtype != torch.float32 or x.dim() not in (3, 4):
        return False
    if not x.is_contiguous():
        return False
    if x.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        return False   # autocast's lower precision is PyTorch's to apply; the operators run float32
    for p in params:
        if p is not None and (p.device != x.device or p.dtype != torch.float32 or not p.is_contiguous()):
            return False
    return True
