"""The convolution layer, Conv2d: forward, backward-data and weight-gradient kernels, each a
ConvProblem at the layer's precision."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from autocnn.errors import InvalidProblemError
from autocnn.kernels.problem import DEFAULT_PRECISION, ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem
from autocnn.nn.backend import Array, Backend, KernelProblem
from autocnn.nn.layer_base import (Shape, WeightedLayer, check_activation, check_int, check_pair, check_padding,
                                   check_precision, init_weights)


class Conv2d(WeightedLayer):
    """2-D convolution with fused bias and activation: y = act(conv(x, W) + b).

    ``padding``: an int, (height, width) or (top, left, bottom, right) (asymmetric padding, as
    an even filter needs to keep the size: 8x8 with (4, 4, 3, 3)).

    ``precision``: what this layer's three convolutions (forward, backward-data, weight gradient)
    must be as accurate as on a GPU. None (the default) takes the model's (``Sequential(...,
    precision=)``, itself "fp32" unless told otherwise); "fp32" or "tf32" overrides it for this
    layer only. "fp32" is FP32-accurate whatever kernel runs; "tf32" lets tensor cores round the
    operands to TF32 (faster, with a looser bound). The layer's kernel problems carry the
    effective precision (``precision``), so tuning, lookups and dispatch use the records of it.
    The numpy backend ignores it: it computes in the model's dtype (float32 or float64) either way.
    """

    trainable = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, bias: bool = True,
                 activation: str = "none", name: str | None = None, precision: str | None = None) -> None:
        super().__init__(name)
        owner = "Conv2d"
        self.precision_override = check_precision(owner, precision, inherit=True)
        self._model_precision = DEFAULT_PRECISION
        self.in_channels = check_int(owner, "in_channels", in_channels, 1)
        self.out_channels = check_int(owner, "out_channels", out_channels, 1)
        self.kernel_size = check_pair(owner, "kernel_size", kernel_size)
        self.stride = check_pair(owner, "stride", stride)
        self.padding = check_padding(owner, padding)
        if not isinstance(bias, bool):
            raise ValueError(f"{owner}: bias must be True or False, got {bias!r}")
        self.use_bias = bias
        self.activation = check_activation(owner, activation)
        R, S = self.kernel_size
        pt, pl, pb, pr = self.padding
        # The kernels assume every window touches the image; padding of a whole filter size would not.
        if max(pt, pb) >= R or max(pl, pr) >= S:
            raise ValueError(f"{owner}: padding {self.padding} must be smaller than the kernel "
                             f"{self.kernel_size} on every side")
        self._x: Array | None = None

    def config_text(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        if self.stride != (1, 1):
            text += f", stride={self.stride}"
        if any(self.padding):
            text += f", padding={self.padding}"
        text += self._epilogue_text()
        return text + (f", precision={self.precision_override!r}" if self.precision_override else "")

    @property
    def precision(self) -> str:
        """The precision this layer's convolutions run at: its own, else the model's."""
        return self.precision_override or self._model_precision

    def use_model_precision(self, precision: str) -> None:
        self._model_precision = precision

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3 or input_shape[0] != self.in_channels:
            raise self._shape_error(f"({self.in_channels}, H, W)", input_shape)
        try:
            p = self._fwd_problem(input_shape, 1)
        except InvalidProblemError as exc:
            raise self._problem_error(exc, input_shape) from exc
        return (self.out_channels, p.P, p.Q)

    def param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {"weight": (self.out_channels, self.in_channels, *self.kernel_size)}
        if self.use_bias:
            shapes["bias"] = (self.out_channels,)
        return shapes

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        R, S = self.kernel_size
        shapes = self.param_shapes()
        params = {"weight": init_weights(rng, shapes["weight"], self.in_channels * R * S,
                                         self.out_channels * R * S, self.activation)}
        if self.use_bias:
            params["bias"] = np.zeros(shapes["bias"])
        return params

    def _fwd_problem(self, input_shape: Shape, batch_size: int) -> ConvFwdProblem:
        C, H, W = input_shape
        R, S = self.kernel_size
        return ConvFwdProblem(N=batch_size, C=C, H=H, W=W, K=self.out_channels, R=R, S=S,
                              stride=self.stride, padding=self.padding, bias=self.use_bias,
                              activation=self.activation, precision=self.precision)

    def make_problems(self, input_shape: Shape, batch_size: int) -> list[KernelProblem]:
        fwd = self._fwd_problem(input_shape, batch_size)
        problems: list[KernelProblem] = [fwd]
        if self.needs_input_grad:
            problems.append(fwd.with_op("conv_bwd_data"))
        problems.append(fwd.with_op("conv_wgrad", bias=self.use_bias))
        return problems

    @property
    def forward_problem(self) -> ConvFwdProblem:
        return self._by_type(ConvFwdProblem)

    @property
    def backward_data_problem(self) -> ConvBwdDataProblem | None:
        return self._by_type(ConvBwdDataProblem, required=False)

    @property
    def wgrad_problem(self) -> ConvWgradProblem:
        return self._by_type(ConvWgradProblem)

    def _by_type(self, cls: type, required: bool = True) -> Any:
        self._require_built()
        for p in self._problems:
            if type(p) is cls:
                return p
        if required:
            raise RuntimeError(f"{self.describe()} has no {cls.__name__}")
        return None

    def _allocate(self, backend: Backend, batch_size: int) -> None:
        assert self.output_shape is not None and self.input_shape is not None
        self._y = backend.zeros((batch_size, *self.output_shape))
        # dL/dz (before the activation) needs its own buffer unless the activation is the identity.
        self._dz = backend.zeros(self._y.shape) if self.activation != "none" else None
        self._dx = backend.zeros((batch_size, *self.input_shape)) if self.needs_input_grad else None
        self._x = None

    def forward(self, x: Array) -> Array:
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        self._x = x  # kept (not copied) for the weight gradient: the buffer lives until the next step
        backend.conv_fwd(self.forward_problem, x, self._params["weight"], self._params.get("bias"), self._y)
        return self._y

    def backward(self, dy: Array) -> Array | None:
        backend = self._require_built()
        dz = self._through_activation(dy)
        # The weight gradient may run beside the input gradient and the layers below (on a GPU).
        with backend.parameter_gradients():
            backend.conv_wgrad(self.wgrad_problem, self._x, dz, self._grads["weight"], self._grads.get("bias"))
        if not self.needs_input_grad:
            return None
        backend.conv_bwd_data(self.backward_data_problem, dz, self._params["weight"], self._dx)
        return self._dx
