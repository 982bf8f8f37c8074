"""Drop-in layers: autocnn.torch.Conv2d and AvgPool2d take torch.nn's arguments and run autocnn's kernels.

They are subclasses of torch.nn.Conv2d / AvgPool2d with the same parameters, buffers, state_dict
keys, initialisation and repr (plus ``precision`` for the convolution), so an optimizer, a saved
state_dict or a hook sees no difference. ``convert`` turns existing torch.nn modules into them in
place (``adopt``), keeping every parameter object.

A call runs autocnn's operator for a float32, bfloat16 or float16 input on a CUDA device (or a
meta one, for shape tracing), contiguous as NCHW or as channels_last, in that dtype: float32 at the
layer's ``precision`` (fp32 or tf32), 16-bit at bf16 / fp16; channels_last tensors (the input's or
the weight's) make NHWC problems and channels_last outputs (autocnn.torch.memory_formats). Under
torch.autocast("cuda") the convolution casts its input, weight and bias to the autocast dtype
first, as PyTorch's conv2d does (autocnn.torch.dtypes), and pooling runs in its input's dtype.
Whether the kernels serve the call is read, per call, from the layer's table of refusals at the
call's precision and layout: a layer converted for one layout still runs PyTorch's operator for a
call in a layout its kernels refuse (a dense layer in channels_last, whose weight gradient no NHWC
kernel computes yet). Any other call runs PyTorch's own operator: on the CPU silently (autocnn has
no CPU kernels), on a CUDA device with a warning once per layer (a float64 or strided input, or a
precision or layout the kernels refuse for this layer), since there the user expected autocnn's
kernels.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from autocnn.layout import DEFAULT_LAYOUT, Layout
from autocnn.precision import DEFAULT_PRECISION, FP32
from autocnn.torch.dtypes import autocast_dtype, autocast_inputs, precision_of_call
from autocnn.torch.geometry import (check_precision, conv_beyond_index_limit, conv_padding, conv_problem, pair,
                                   pool_beyond_index_limit, pool_padding, pool_problem, size_refusal)
from autocnn.torch.memory_formats import call_layout, in_either_layout
from autocnn.torch.support import (check_arguments, conv_reasons, conv_refusals, pool_reasons, pool_refusals,
                                   runs_on_autocnn)


def _warn_fallback(module: nn.Module, x: torch.Tensor, refusal: str | None = None) -> None:
    if x.device.type != "cuda" or torch.compiler.is_compiling() or getattr(module, "_autocnn_warned", False):
        return
    module._autocnn_warned = True
    if refusal is not None:
        cast = autocast_dtype(x)
        what = (f"a {x.dtype} input" + (f" (computed in {cast} under torch.autocast)" if cast is not None else "")
                + f" runs PyTorch's operator: {refusal}")
    else:
        layout = "contiguous" if in_either_layout(x) else "non-contiguous (a strided view)"
        what = (f"a {layout} {x.dtype} input of {x.dim()} dimensions runs PyTorch's operator; autocnn's kernels "
                f"take float32, bfloat16 or float16 N x C x H x W tensors contiguous as NCHW or channels_last")
    warnings.warn(f"autocnn.torch.{type(module).__name__}: {what}", RuntimeWarning, stacklevel=3)


def _warn_too_large(module: nn.Module, build: Any) -> None:
    """Say once per layer, outside a compile trace, why PyTorch's operator runs it: ``build`` makes
    the problem, whose ProblemTooLargeError names the extent."""
    if torch.compiler.is_compiling() or getattr(module, "_autocnn_size_warned", False):
        return
    module._autocnn_size_warned = True
    warnings.warn(f"autocnn.torch.{type(module).__name__}: {size_refusal(build)}; PyTorch's operator computes "
                  f"this layer", RuntimeWarning, stacklevel=3)


def _batch_shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape) if x.dim() == 4 else (1, *x.shape)


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 4 else x.unsqueeze(0)


def _batched(x: torch.Tensor, run: Any) -> torch.Tensor:
    """torch.nn's layers also take one image (C x H x W); the kernels take a batch of one."""
    if x.dim() == 3:
        return run(x.unsqueeze(0)).squeeze(0)
    return run(x)


class Conv2d(nn.Conv2d):
    """torch.nn.Conv2d on autocnn's tuned kernels (forward, backward-data, weight gradient).

    Arguments are torch.nn.Conv2d's, plus ``precision``: "fp32" (default, FP32-accurate) or
    "tf32" (opt-in, one TF32 product per term), as ``ConvProblem.precision``, for float32 inputs;
    bfloat16 and float16 ones compute at bf16 and fp16. Channel groups and dilation are taken where
    autocnn's kernels compute them (depthwise layers, groups == in_channels, have a formulation of
    their own); padding modes other than "zeros", padding not smaller than the (dilated) kernel,
    dtypes other than float32, bfloat16 and float16, and groups or dilation that no kernel computes
    at the layer's precision are refused with a message; torch.nn.Conv2d computes those. A call on
    channels_last tensors runs autocnn's NHWC kernels where they serve the layer, PyTorch's operator
    with a warning otherwise (``convert`` after ``model.to(memory_format=torch.channels_last)`` leaves
    such a layer to PyTorch instead, and says why).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None, *, precision: str = DEFAULT_PRECISION.name) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device=device, dtype=dtype)
        self.precision = check_precision("autocnn.torch.Conv2d", precision)
        check_arguments("Conv2d", conv_reasons(self, self.precision))
        self._autocnn_refusals = conv_refusals(self)

    @classmethod
    def adopt(cls, module: nn.Conv2d, precision: str = DEFAULT_PRECISION.name) -> "Conv2d":
        """Turn a supported torch.nn.Conv2d into this class in place (same object, parameters, hooks)."""
        precision = check_precision("autocnn.torch.Conv2d", precision)
        check_arguments("Conv2d", conv_reasons(module, precision))
        module.__class__ = cls
        module.precision = precision
        module._autocnn_refusals = conv_refusals(module)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under autocast, the dtype PyTorch's conv2d would compute in: the operator then runs there.
        xc, weight, bias = autocast_inputs(autocast_dtype(x), x, self.weight, self.bias)
        if not runs_on_autocnn(xc, weight, bias):
            _warn_fallback(self, x)
            return super().forward(x)
        # The layout the operator will take (channels_last where the input or the weight is), read per call.
        layout = call_layout("autocnn.torch.Conv2d", {"x": _as_batch(xc), "weight": weight})
        refusal = self._autocnn_refusals.at(precision_of_call(xc.dtype, self.precision), layout)
        if refusal is not None:
            _warn_fallback(self, x, refusal)
            return super().forward(x)
        stride = pair("stride", self.stride)
        dilation = pair("dilation", self.dilation)
        padding = conv_padding(self.padding, self.kernel_size, self.dilation)
        if conv_beyond_index_limit(_batch_shape(xc), weight.shape, stride, padding, dilation):
            _warn_too_large(self, lambda: conv_problem("conv_fwd", tuple(_batch_shape(xc)), tuple(weight.shape),
                                                       stride, padding, precision_of_call(xc.dtype, self.precision),
                                                       False, dilation, self.groups, layout))
            return super().forward(x)
        return _batched(xc, lambda b: torch.ops.autocnn.conv2d(b, weight, bias, stride, padding, dilation,
                                                                self.groups, self.precision))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", precision={self.precision}"


class AvgPool2d(nn.AvgPool2d):
    """torch.nn.AvgPool2d on autocnn's pooling kernels (forward and backward).

    Arguments are torch.nn.AvgPool2d's; ceil_mode=True and divisor_override are refused with a
    message (torch.nn.AvgPool2d computes those). It computes in its input's dtype (float32,
    bfloat16 or float16), under torch.autocast too. ``count_include_pad`` chooses the divisor as in
    PyTorch (autocnn's ``PoolProblem.count_pad``).
    """

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        check_arguments("AvgPool2d", pool_reasons(self))
        self._autocnn_refusals = pool_refusals(self)

    @classmethod
    def adopt(cls, module: nn.AvgPool2d, layout: Layout = DEFAULT_LAYOUT) -> "AvgPool2d":
        """Turn a supported torch.nn.AvgPool2d into this class in place, for inputs of ``layout``."""
        check_arguments("AvgPool2d", pool_reasons(module, layout))
        module.__class__ = cls
        module._autocnn_refusals = pool_refusals(module)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under autocast too, in the input's dtype (PyTorch's avg_pool2d is on no autocast list).
        if not runs_on_autocnn(x):
            _warn_fallback(self, x)
            return super().forward(x)
        layout = call_layout("autocnn.torch.AvgPool2d", {"x": _as_batch(x)})
        refusal = self._autocnn_refusals.at(precision_of_call(x.dtype, FP32.name), layout)
        if refusal is not None:
            _warn_fallback(self, x, refusal)
            return super().forward(x)
        window = pair("kernel_size", self.kernel_size)
        stride = pair("stride", self.stride if self.stride is not None else self.kernel_size)
        padding = pool_padding(self.padding)
        if pool_beyond_index_limit(_batch_shape(x), window, stride, padding):
            _warn_too_large(self, lambda: pool_problem("avgpool_fwd", tuple(_batch_shape(x)), window, stride, padding,
                                                       bool(self.count_include_pad), FP32.name, layout))
            return super().forward(x)
        return _batched(x, lambda b: torch.ops.autocnn.avg_pool2d(b, window, stride, padding,
                                                                   bool(self.count_include_pad)))
