"""Fused kernels in training, chosen at build (``choose_fusions``, unless ``Sequential.fuse`` is
False): a layer's own alternatives (``Layer.alternative_problems``: Conv2d's one-pass backward,
conv_bwd_fused), and a convolution layer fused with the average pooling right after it
(kernels.conv_pool): which pairs qualify, the problems tuning covers for them, and the choice.

Every choice is made from the backend's tuning records (``Backend.tuned_faster``), and so only
where the fused kernel was tuned and found faster. For a convolution and its pooling, two:

* forward: conv_pool_fwd with ``keep_activation`` (the pooled output and the activation the
  backward needs, in one kernel) instead of conv_fwd then avgpool_fwd;
* backward: conv_pool_dz (supersampling and the activation gradient in one pass) instead of
  avgpool_bwd then the convolution layer's activation gradient. Only the avgpool_bwd record is
  compared (the activation pass has none), which leans toward the pair. A convolution without an
  activation has nothing to fuse there.

The two are independent: the backward reads ``a`` from the convolution layer's output buffer,
which the fused forward fills as the split one does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from autocnn.errors import InvalidProblemError
from autocnn.nn.backend import Backend, KernelProblem
from autocnn.nn.conv_layer import Conv2d
from autocnn.nn.layer_base import Layer, Shape
from autocnn.nn.pool_layer import AvgPool2d


@dataclass(frozen=True)
class ConvPoolPair:
    """A 2D Conv2d at ``index`` and the AvgPool2d after it, with the fused problems at one batch
    size (``dz`` None where the pooling needs no input gradient or the convolution no activation)."""

    index: int
    conv: Conv2d
    pool: AvgPool2d
    forward: Any          # ConvPoolFwdProblem, keep_activation=True
    dz: Any | None        # ConvPoolDzProblem

    def problems(self) -> list[KernelProblem]:
        return [self.forward] + ([self.dz] if self.dz is not None else [])


def conv_pool_pairs(layers: Sequence[Layer], input_shapes: Sequence[Shape], batch_size: int) -> list[ConvPoolPair]:
    """Every Conv2d (2D, not separable, neither grouped nor dilated) followed directly by an AvgPool2d whose fused kernel can
    take the pair (``input_shapes[i]``: layer i's input shape)."""
    from autocnn.kernels.conv_pool_problems import ConvPoolFwdProblem

    pairs = []
    for i in range(len(layers) - 1):
        conv, pool = layers[i], layers[i + 1]
        if not isinstance(conv, Conv2d) or not isinstance(pool, AvgPool2d) or conv.separable.enabled:
            continue
        if conv.grouped_or_dilated:
            continue   # conv_pool_fwd has no grouped or dilated form: the pair stays split
        if conv.precision.sixteen_bit or pool.precision.sixteen_bit:
            continue   # the fused kernels take float32 tensors: mixed-precision layers stay split
        fwd = conv._fwd_problem(input_shapes[i], batch_size)
        try:
            fused = ConvPoolFwdProblem(**fwd.geometry(), bias=fwd.bias, activation=fwd.activation,
                                       pool_window=pool.window, pool_stride=pool.stride, pool_padding=pool.padding,
                                       count_pad=pool.count_pad, keep_activation=True)
        except InvalidProblemError:
            continue   # a window too large for one block of the fused kernel: the pair stays split
        dz = fused.dz if pool.needs_input_grad and conv.activation != "none" else None
        pairs.append(ConvPoolPair(i, conv, pool, fused, dz))
    return pairs


def choose_conv_pool_fusions(layers: Sequence[Layer], backend: Backend, batch_size: int) -> list[ConvPoolPair]:
    """At build, after every layer is built: fuse the pairs whose fused kernels the backend finds
    tuned faster (each direction on its own). Returns the pairs considered."""
    shapes = [layer.input_shape for layer in layers]
    pairs = conv_pool_pairs(layers, shapes, batch_size)
    for pair in pairs:
        conv, pool = pair.conv, pair.pool
        if backend.tuned_faster([pair.forward], [conv.forward_problem, pool.forward_problem]):
            conv.fuse_pool_forward(pair.forward, pool)
        if pair.dz is not None and backend.tuned_faster([pair.dz], [pool.backward_problem]):
            pool.fuse_activation_gradient(pair.dz, conv)
    return pairs


def choose_fusions(layers: Sequence[Layer], backend: Backend, batch_size: int) -> None:
    """At build, after every layer is built: each layer's alternatives where the backend finds them
    tuned faster than what they replace, then the convolution + averaging pairs."""
    for layer in layers:
        for alternative in layer.alternative_problems(layer.input_shape, batch_size):
            if backend.tuned_faster([alternative], layer.replaced_by(alternative)):
                layer.use_alternative(alternative)
    choose_conv_pool_fusions(layers, backend, batch_size)
