"""autocnn's kernels as PyTorch operators: torch.ops.autocnn.*.

Five functional operators (they allocate their outputs with PyTorch, so a CUDA-graph capture takes
them from its private pool):

    conv2d(x, weight, bias?, stride, padding, dilation, groups, precision)              -> y
    conv2d_backward_data(dy, weight, input_size, stride, padding, dilation, groups, precision)  -> dx
    conv2d_weight_grad(x, dy, kernel_size, stride, padding, dilation, groups, precision, bias)  -> (dw, db)
    avg_pool2d(x, kernel_size, stride, padding, count_include_pad)    -> y
    avg_pool2d_backward(dy, input_size, kernel_size, stride, padding, count_include_pad) -> dx

``padding`` is (top, left, bottom, right); the weight is K x C/groups x R x S, as torch.nn's;
``db`` is an empty tensor when ``bias`` is false. The tensors of one call share one dtype,
float32, bfloat16 or float16, which the outputs have too and which decides the kernels' precision
(autocnn.torch.dtypes): ``precision`` ("fp32" or "tf32") is that of float32 tensors, bfloat16 and
float16 ones compute at bf16 and fp16. A convolution none of whose kernels (formulations) can
compute it, for its channel groups, dilation or precision, is refused with the kernels' reason. The
two forward operators have autograd registered (their backward calls the backward operators, so
``torch.compile`` sees autocnn's operators in the backward graph too), and every operator has a
fake implementation giving its outputs' shapes, so that ``torch.compile(fullgraph=True)`` and
``torch.export`` trace them, and meta tensors run through them.

The tensors are CUDA tensors contiguous as NCHW (weights KCRS) or as torch.channels_last (NHWC;
a channels_last weight is KRSC): a call with a channels_last tensor is an NHWC problem, its outputs
channels_last, the others of the call brought to it with one copy, as PyTorch's convolution
decides (autocnn.torch.memory_formats); a strided view is refused with what to call. The real
implementations say what to change otherwise; the fake ones check the dtypes, the layout and, for
concrete shapes, the problem, so a bad call fails at trace time, and give the outputs the strides
the real ones do. The operators
compute in their tensors' dtype, torch.autocast or not: autocnn.torch.Conv2d casts for autocast
(autocnn.torch.dtypes says why there rather than by an autocast rule here). This module
deliberately does not use ``from __future__ import annotations``: custom_op reads the annotations.
"""
from typing import Optional, Sequence

import torch

from autocnn.layout import NCHW
from autocnn.torch.dtypes import conv_precision, pool_precision, same_dtype
from autocnn.torch.geometry import concrete, conv_output_shape, conv_problem, pool_output_shape, pool_problem
from autocnn.torch.launch import kernels_for
from autocnn.torch.memory_formats import arranged, as_layout, call_layout, empty, memory_view
from autocnn.torch.support import kernels_refusal

Tensor = torch.Tensor


def _check(op: str, name: str, t: Tensor, device: torch.device) -> None:
    """A tensor a real implementation can hand to a generated kernel, or a message saying what to change."""
    if t.device.type != "cuda":
        raise ValueError(f"autocnn::{op}: {name} is on {t.device}; autocnn's kernels run on CUDA tensors "
                         f"(move the model and its input with .cuda(), or use torch.nn's layers on the CPU)")
    if t.device != device:
        raise ValueError(f"autocnn::{op}: {name} is on {t.device} but the input is on {device}")
    if t.dim() != 4 and not t.is_contiguous():   # a 4-D tensor's layout is call_layout's to check
        raise ValueError(f"autocnn::{op}: {name} must be contiguous, call .contiguous() first")


def _ints(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _served(op: str, problem) -> None:
    """Refuse, before any device work, a problem that no formulation of its operation computes (its
    channel groups, dilation or precision: the kernels' own refusals)."""
    reason = kernels_refusal(problem)
    if reason is not None:
        layout = (f" (its tensors are channels_last, which makes an {problem.layout.label} problem; contiguous "
                  f"ones make an NCHW one)" if problem.layout.channels_last else "")
        raise ValueError(f"autocnn::{op}: {problem.op} {problem.shape_string()}: {reason}{layout}; "
                         f"torch.nn.functional's operator computes it (autocnn.torch.convert leaves such layers "
                         f"to PyTorch)")


def _conv(op: str, kind: str, x_shape, w_shape, stride, padding, dilation, groups, precision, dtype, bias=False,
          layout=NCHW):
    """The problem of one convolution call in ``dtype``'s precision and ``layout``, refused where no
    kernel serves it."""
    computed = conv_precision(f"autocnn::{op}", dtype, precision)
    problem = conv_problem(kind, tuple(x_shape), tuple(w_shape), _ints(stride), _ints(padding), computed.name, bias,
                           _ints(dilation), int(groups), layout)
    _served(op, problem)
    return problem


# -- convolution ------------------------------------------------------------------------------------

@torch.library.custom_op("autocnn::conv2d", mutates_args=())
def conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: Sequence[int], padding: Sequence[int],
           dilation: Sequence[int], groups: int, precision: str) -> Tensor:
    dtype = same_dtype("autocnn::conv2d", {"x": x, "weight": weight, "bias": bias})
    layout = call_layout("autocnn::conv2d", {"x": x, "weight": weight})
    problem = _conv("conv2d", "conv_fwd", x.shape, weight.shape, stride, padding, dilation, groups, precision, dtype,
                    bias is not None, layout)
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            _check("conv2d", name, t, x.device)
    if bias is not None and tuple(bias.shape) != (problem.K,):
        raise ValueError(f"autocnn::conv2d: bias has shape {tuple(bias.shape)}, the layer has {problem.K} filters")
    x, weight = arranged(x, layout), arranged(weight, layout)
    y = empty(x, problem.y_shape, layout)
    kernels_for(x.device).run(problem, x=memory_view(x, layout), w=memory_view(weight, layout, filters=True),
                              bias=bias, y=memory_view(y, layout))
    return y


@conv2d.register_fake
def _conv2d_fake(x, weight, bias, stride, padding, dilation, groups, precision):
    dtype = same_dtype("autocnn::conv2d", {"x": x, "weight": weight, "bias": bias})
    layout = call_layout("autocnn::conv2d", {"x": x, "weight": weight})
    if concrete(x.shape, weight.shape):
        # The same checks as the real operator, at trace time: a bad layer fails before any device work.
        _conv("conv2d", "conv_fwd", x.shape, weight.shape, stride, padding, dilation, groups, precision, dtype,
              bias is not None, layout)
    return empty(x, conv_output_shape(x.shape, weight.shape, stride, padding, dilation), layout)


@torch.library.custom_op("autocnn::conv2d_backward_data", mutates_args=())
def conv2d_backward_data(dy: Tensor, weight: Tensor, input_size: Sequence[int], stride: Sequence[int],
                         padding: Sequence[int], dilation: Sequence[int], groups: int, precision: str) -> Tensor:
    dtype = same_dtype("autocnn::conv2d_backward_data", {"dy": dy, "weight": weight})
    layout = call_layout("autocnn::conv2d_backward_data", {"dy": dy, "weight": weight})
    x_shape = (dy.shape[0], weight.shape[1] * groups, *_ints(input_size))
    problem = _conv("conv2d_backward_data", "conv_bwd_data", x_shape, weight.shape, stride, padding, dilation, groups,
                    precision, dtype, False, layout)
    _expect_dy("conv2d_backward_data", dy, problem.y_shape)
    _check("conv2d_backward_data", "weight", weight, dy.device)
    dy, weight = arranged(dy, layout), arranged(weight, layout)
    dx = empty(dy, problem.x_shape, layout)
    kernels_for(dy.device).run(problem, dy=memory_view(dy, layout), w=memory_view(weight, layout, filters=True),
                               dx=memory_view(dx, layout))
    return dx


@conv2d_backward_data.register_fake
def _conv2d_backward_data_fake(dy, weight, input_size, stride, padding, dilation, groups, precision):
    dtype = same_dtype("autocnn::conv2d_backward_data", {"dy": dy, "weight": weight})
    layout = call_layout("autocnn::conv2d_backward_data", {"dy": dy, "weight": weight})
    x_shape = (dy.shape[0], weight.shape[1] * groups, *input_size)
    if concrete(x_shape, weight.shape):
        _conv("conv2d_backward_data", "conv_bwd_data", x_shape, weight.shape, stride, padding, dilation, groups,
              precision, dtype, False, layout)
    return empty(dy, x_shape, layout)


@torch.library.custom_op("autocnn::conv2d_weight_grad", mutates_args=())
def conv2d_weight_grad(x: Tensor, dy: Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                       padding: Sequence[int], dilation: Sequence[int], groups: int, precision: str,
                       bias: bool) -> tuple[Tensor, Tensor]:
    dtype = same_dtype("autocnn::conv2d_weight_grad", {"x": x, "dy": dy})
    layout = call_layout("autocnn::conv2d_weight_grad", {"x": x, "dy": dy})
    w_shape = (dy.shape[1], x.shape[1] // groups, *_ints(kernel_size))
    problem = _conv("conv2d_weight_grad", "conv_wgrad", x.shape, w_shape, stride, padding, dilation, groups,
                    precision, dtype, bias, layout)
    _check("conv2d_weight_grad", "x", x, x.device)
    _expect_dy("conv2d_weight_grad", dy, problem.y_shape, x.device)
    x, dy = arranged(x, layout), arranged(dy, layout)
    dw = empty(x, problem.w_shape, layout)
    db = x.new_empty((problem.K,) if bias else (0,))
    kernels_for(x.device).run(problem, x=memory_view(x, layout), dy=memory_view(dy, layout),
                              dw=memory_view(dw, layout, filters=True), db=db if bias else None)
    return dw, db


@conv2d_weight_grad.register_fake
def _conv2d_weight_grad_fake(x, dy, kernel_size, stride, padding, dilation, groups, precision, bias):
    dtype = same_dtype("autocnn::conv2d_weight_grad", {"x": x, "dy": dy})
    layout = call_layout("autocnn::conv2d_weight_grad", {"x": x, "dy": dy})
    w_shape = (dy.shape[1], x.shape[1] // groups, *kernel_size)
    if concrete(x.shape, w_shape):
        _conv("conv2d_weight_grad", "conv_wgrad", x.shape, w_shape, stride, padding, dilation, groups, precision,
              dtype, bias, layout)
    return (empty(x, w_shape, layout),
            x.new_empty((dy.shape[1],) if bias else (0,)))


def _expect_dy(op: str, dy: Tensor, shape: Sequence[int], device: Optional[torch.device] = None) -> None:
    _check(op, "dy", dy, dy.device if device is None else device)
    if tuple(dy.shape) != tuple(shape):
        raise ValueError(f"autocnn::{op}: dy has shape {tuple(dy.shape)}, the layer's output shape is {tuple(shape)}")


def _conv2d_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups, precision = inputs
    ctx.save_for_backward(x, weight)
    ctx.geometry = (_ints(stride), _ints(padding), _ints(dilation), int(groups), precision)
    ctx.has_bias = bias is not None
    ctx.layout = call_layout("autocnn::conv2d", {"x": x, "weight": weight})


def _conv2d_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups, precision = ctx.geometry
    # The incoming gradient may be a broadcast or strided view (e.g. of y.sum()), or of the other layout:
    # brought to the forward's, so that both backward calls take it and give PyTorch's gradient layouts.
    dy = as_layout(dy, ctx.layout)
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = torch.ops.autocnn.conv2d_backward_data(dy, weight, list(x.shape[2:]), stride, padding, dilation, groups,
                                                    precision)
    if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
        dw, db = torch.ops.autocnn.conv2d_weight_grad(x, dy, list(weight.shape[2:]), stride, padding, dilation,
                                                       groups, precision, ctx.has_bias)
        if not ctx.has_bias:
            db = None
    return dx, dw, db, None, None, None, None, None


conv2d.register_autograd(_conv2d_backward, setup_context=_conv2d_setup)


# -- average pooling ----------------------------------------------------------------------------------

@torch.library.custom_op("autocnn::avg_pool2d", mutates_args=())
def avg_pool2d(x: Tensor, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
               count_include_pad: bool) -> Tensor:
    layout = call_layout("autocnn::avg_pool2d", {"x": x})
    problem = pool_problem("avgpool_fwd", tuple(x.shape), _ints(kernel_size), _ints(stride), _ints(padding),
                           count_include_pad, pool_precision("autocnn::avg_pool2d", x.dtype).name, layout)
    _served("avg_pool2d", problem)
    _check("avg_pool2d", "x", x, x.device)
    y = empty(x, problem.y_shape, layout)
    kernels_for(x.device).run(problem, x=memory_view(x, layout), y=memory_view(y, layout))
    return y


@avg_pool2d.register_fake
def _avg_pool2d_fake(x, kernel_size, stride, padding, count_include_pad):
    precision = pool_precision("autocnn::avg_pool2d", x.dtype)
    layout = call_layout("autocnn::avg_pool2d", {"x": x})
    if concrete(x.shape):
        _served("avg_pool2d", pool_problem("avgpool_fwd", tuple(x.shape), _ints(kernel_size), _ints(stride),
                                           _ints(padding), count_include_pad, precision.name, layout))
    return empty(x, pool_output_shape(x.shape, kernel_size, stride, padding), layout)


@torch.library.custom_op("autocnn::avg_pool2d_backward", mutates_args=())
def avg_pool2d_backward(dy: Tensor, input_size: Sequence[int], kernel_size: Sequence[int], stride: Sequence[int],
                        padding: Sequence[int], count_include_pad: bool) -> Tensor:
    layout = call_layout("autocnn::avg_pool2d_backward", {"dy": dy})
    x_shape = (dy.shape[0], dy.shape[1], *_ints(input_size))
    problem = pool_problem("avgpool_bwd", x_shape, _ints(kernel_size), _ints(stride), _ints(padding),
                           count_include_pad, pool_precision("autocnn::avg_pool2d_backward", dy.dtype).name, layout)
    _served("avg_pool2d_backward", problem)
    _expect_dy("avg_pool2d_backward", dy, problem.y_shape)
    dx = empty(dy, problem.x_shape, layout)
    kernels_for(dy.device).run(problem, dy=memory_view(dy, layout), dx=memory_view(dx, layout))
    return dx


@avg_pool2d_backward.register_fake
def _avg_pool2d_backward_fake(dy, input_size, kernel_size, stride, padding, count_include_pad):
    pool_precision("autocnn::avg_pool2d_backward", dy.dtype)
    layout = call_layout("autocnn::avg_pool2d_backward", {"dy": dy})
    return empty(dy, (dy.shape[0], dy.shape[1], *input_size), layout)


def _avg_pool2d_setup(ctx, inputs, output):
    x, kernel_size, stride, padding, count_include_pad = inputs
    ctx.geometry = (list(x.shape[2:]), _ints(kernel_size), _ints(stride), _ints(padding), count_include_pad)
    ctx.layout = call_layout("autocnn::avg_pool2d", {"x": x})


def _avg_pool2d_backward(ctx, dy):
    dx = torch.ops.autocnn.avg_pool2d_backward(as_layout(dy, ctx.layout), *ctx.geometry)
    return dx, None, None, None, None


avg_pool2d.register_autograd(_avg_pool2d_backward, setup_context=_avg_pool2d_setup)
