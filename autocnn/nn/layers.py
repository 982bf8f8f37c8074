"""Layers: Conv2d, AvgPool2d, Dense, Flatten and Activation.

A layer is configured in its constructor, and ``build(input_shape, batch_size, backend, rng)``
then allocates everything it will touch: its parameters (once; a rebuild for another batch size
keeps them), the parameter gradients (once), the output buffer, the input-gradient buffer and its
kernel problems for that batch size. ``forward`` and ``backward`` only write into those buffers,
through the backend, so the same layer code runs on the CPU and on a GPU.

Shapes given to ``build`` are per sample, (C, H, W) or (F,); arrays passed to ``forward`` and
``backward`` carry the batch dimension first and must have exactly the built batch size.

Gradient buffers hold the gradients of the last ``backward`` call (they are overwritten, not
accumulated).
"""
from __future__ import annotations

import abc
import math
import numbers
from typing import Any, ClassVar, Sequence

import numpy as np

from autocnn.errors import InvalidProblemError
from autocnn.kernels.problem import (
    ACTIVATIONS,
    AvgPoolFwdProblem,
    ConvBwdDataProblem,
    ConvFwdProblem,
    ConvWgradProblem,
)
from autocnn.nn.backend import Array, Backend, KernelProblem, activation_grad

Shape = tuple[int, ...]


# -- argument normalisation -----------------------------------------------------------------------

def _int(owner: str, name: str, value: Any, minimum: int) -> int:
    # bool is an int in Python, but True as a size is a mistake rather than 1.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _pair(owner: str, name: str, value: Any, minimum: int = 1) -> tuple[int, int]:
    vals = tuple(value) if isinstance(value, (list, tuple)) else (value, value)
    if len(vals) != 2:
        raise ValueError(f"{owner}: {name} must be an integer or (height, width), got {value!r}")
    return (_int(owner, name, vals[0], minimum), _int(owner, name, vals[1], minimum))


def _padding(owner: str, value: Any) -> tuple[int, int, int, int]:
    vals = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if len(vals) == 1:
        vals = vals * 4
    elif len(vals) == 2:  # (height, width): the same on both sides
        vals = (vals[0], vals[1], vals[0], vals[1])
    if len(vals) != 4:
        raise ValueError(f"{owner}: padding must be an integer, (height, width) or "
                         f"(top, left, bottom, right), got {value!r}")
    return tuple(_int(owner, "padding", v, 0) for v in vals)  # type: ignore[return-value]


def _activation(owner: str, name: Any) -> str:
    if name is None:
        return "none"
    if not isinstance(name, str) or name.lower() not in ACTIVATIONS:
        raise ValueError(f"{owner}: activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    return name.lower()


def _shape_text(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


# -- initialisation ---------------------------------------------------------------------------------

def init_weights(rng: np.random.Generator, shape: Shape, fan_in: int, fan_out: int, activation: str
                 ) -> np.ndarray:
    """He normal for relu (keeps the variance of rectified units), Glorot uniform otherwise."""
    if activation == "relu":
        return rng.normal(0.0, math.sqrt(2.0 / fan_in), size=shape)
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape)


# -- base class -------------------------------------------------------------------------------------

class Layer(abc.ABC):
    """One stage of a Sequential model.

    ``needs_input_grad`` is set by the model: False for a layer with no trainable layer before
    it, which then skips computing dX (for Conv2d, the whole backward-data kernel).
    """

    trainable: ClassVar[bool] = False

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self.needs_input_grad = True
        self.backend: Backend | None = None
        self.input_shape: Shape | None = None
        self.output_shape: Shape | None = None
        self.batch_size: int | None = None
        self._params: dict[str, Array] = {}
        self._grads: dict[str, Array] = {}
        self._problems: list[KernelProblem] = []
        self._model: Any = None  # the Sequential that owns this layer's buffers, once there is one

    # -- description ---------------------------------------------------------------------------
    @abc.abstractmethod
    def config_text(self) -> str:
        """The constructor arguments, as shown in repr and error messages."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config_text()})"

    def describe(self) -> str:
        """How errors name this layer: its name in the model, or its repr before it has one."""
        if self.name:
            return f"{type(self).__name__} '{self.name}'"
        return repr(self)

    # -- shapes and problems (pure: no allocation) ----------------------------------------------
    @abc.abstractmethod
    def compute_output_shape(self, input_shape: Shape) -> Shape:
        """The per-sample output shape for ``input_shape``; ValueError when the input does not fit."""

    def param_shapes(self) -> dict[str, Shape]:
        """Name -> shape of each parameter (empty for layers without parameters)."""
        return {}

    def make_problems(self, input_shape: Shape, batch_size: int) -> list[KernelProblem]:
        """The kernel problems this layer runs at ``batch_size`` (none for non-kernel layers)."""
        return []

    # -- allocation ------------------------------------------------------------------------------
    def build(self, input_shape: Sequence[int], batch_size: int, backend: Backend,
              rng: np.random.Generator) -> Shape:
        """Allocate parameters (first build only), buffers and problems; returns the output shape."""
        input_shape = tuple(int(s) for s in input_shape)
        batch_size = _int(self.describe(), "batch_size", batch_size, 1)
        output_shape = self.compute_output_shape(input_shape)
        if self.backend is not None and backend is not self.backend:
            raise ValueError(f"{self.describe()} was built on {self.backend!r} and cannot move to "
                             f"{backend!r}: create a new layer")
        self.backend = backend
        self._problems = self.make_problems(input_shape, batch_size)
        if not self._params and self.param_shapes():
            host = self.init_params(rng)
            self._params = {k: backend.asarray(v) for k, v in host.items()}
            self._grads = {k: backend.zeros(v.shape) for k, v in host.items()}
        self.input_shape, self.output_shape, self.batch_size = input_shape, output_shape, batch_size
        self._allocate(backend, batch_size)
        return output_shape

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Host (float64) initial values of the parameters."""
        return {}

    @abc.abstractmethod
    def _allocate(self, backend: Backend, batch_size: int) -> None:
        """Allocate the activation buffers for ``batch_size`` (input/output shapes are set)."""

    @property
    def built(self) -> bool:
        return self.batch_size is not None

    # -- computation ---------------------------------------------------------------------------
    @abc.abstractmethod
    def forward(self, x: Array) -> Array:
        """The layer's output for a batch, written into (and returned as) its output buffer."""

    @abc.abstractmethod
    def backward(self, dy: Array) -> Array | None:
        """Parameter gradients into grads(); returns dL/dx (None when needs_input_grad is False)."""

    def params(self) -> dict[str, Array]:
        return dict(self._params)

    def grads(self) -> dict[str, Array]:
        return dict(self._grads)

    def problems(self) -> list[KernelProblem]:
        return list(self._problems)

    # -- helpers -------------------------------------------------------------------------------
    def _require_built(self) -> Backend:
        if self.backend is None or self.batch_size is None:
            raise RuntimeError(f"{self.describe()} is not built: call build(input_shape, batch_size, "
                               f"backend, rng) first (a Sequential model does this)")
        return self.backend

    def _check_batch(self, what: str, array: Array, sample_shape: Shape) -> None:
        expected = (self.batch_size, *sample_shape)
        if tuple(array.shape) != expected:
            raise ValueError(f"{self.describe()}: {what} has shape {_shape_text(array.shape)}, expected "
                             f"{_shape_text(expected)} (batch {self.batch_size} x {_shape_text(sample_shape)})")

    def _shape_error(self, expected: str, given: Shape, hint: str = "") -> ValueError:
        text = f"{self.describe()} expects input {expected}, got {_shape_text(given)}"
        return ValueError(text + (f": {hint}" if hint else ""))

    def _problem_error(self, exc: InvalidProblemError, input_shape: Shape) -> ValueError:
        return ValueError(f"{self.describe()} cannot run on input {_shape_text(input_shape)}: {exc}")


# -- convolution ------------------------------------------------------------------------------------

class _WeightedLayer(Layer):
    """A layer with weights and a fused activation (Conv2d, Dense): their backward passes begin alike."""

    def _epilogue_text(self) -> str:
        """The bias and activation part of the layer's description."""
        text = "" if self.use_bias else ", bias=False"
        if self.activation != "none":
            text += f", activation={self.activation!r}"
        return text

    def _through_activation(self, dy: Array, bias_grad: Array | None = None) -> Array:
        """dL/dz from dL/dy, through the fused activation (dy itself when there is none).

        ``bias_grad``: also sum dL/dz over the batch into it, in the same pass (a Dense layer's
        bias gradient; one fused kernel on a GPU).
        """
        if self._x is None:
            raise RuntimeError(f"{self.describe()}: backward called before forward")
        self._check_batch("output gradient", dy, self.output_shape)  # type: ignore[arg-type]
        if bias_grad is not None:
            return self.backend.activation_grad_bias(self.activation, self._y, dy, self._dz, bias_grad)
        if self._dz is None:
            return dy
        return activation_grad(self.backend, self.activation, self._y, dy, out=self._dz)


class Conv2d(_WeightedLayer):
    """2-D convolution with fused bias and activation: y = act(conv(x, W) + b).

    ``padding``: an int, (height, width) or (top, left, bottom, right) (asymmetric padding, as
    an even filter needs to keep the size: 8x8 with (4, 4, 3, 3)).
    """

    trainable = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, bias: bool = True,
                 activation: str = "none", name: str | None = None) -> None:
        super().__init__(name)
        owner = "Conv2d"
        self.in_channels = _int(owner, "in_channels", in_channels, 1)
        self.out_channels = _int(owner, "out_channels", out_channels, 1)
        self.kernel_size = _pair(owner, "kernel_size", kernel_size)
        self.stride = _pair(owner, "stride", stride)
        self.padding = _padding(owner, padding)
        if not isinstance(bias, bool):
            raise ValueError(f"{owner}: bias must be True or False, got {bias!r}")
        self.use_bias = bias
        self.activation = _activation(owner, activation)
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
        return text + self._epilogue_text()

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
                              activation=self.activation)

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


# -- pooling ----------------------------------------------------------------------------------------

class AvgPool2d(Layer):
    """Average pooling over ``window`` (stride defaults to the window: non-overlapping).

    ``count_pad``: True divides by the full window size everywhere (PyTorch's
    count_include_pad); False divides by the positions inside the image only.
    """

    def __init__(self, window: int | Sequence[int], stride: int | Sequence[int] | None = None,
                 padding: int | Sequence[int] = 0, count_pad: bool = True, name: str | None = None) -> None:
        super().__init__(name)
        owner = "AvgPool2d"
        self.window = _pair(owner, "window", window)
        self.stride = self.window if stride is None else _pair(owner, "stride", stride)
        self.padding = _padding(owner, padding)
        if not isinstance(count_pad, bool):
            raise ValueError(f"{owner}: count_pad must be True or False, got {count_pad!r}")
        self.count_pad = count_pad
        kh, kw = self.window
        pt, pl, pb, pr = self.padding
        if max(pt, pb) >= kh or max(pl, pr) >= kw:
            raise ValueError(f"{owner}: padding {self.padding} must be smaller than the window "
                             f"{self.window} on every side")

    def config_text(self) -> str:
        text = f"window={self.window}"
        if self.stride != self.window:
            text += f", stride={self.stride}"
        if any(self.padding):
            text += f", padding={self.padding}"
        if not self.count_pad:
            text += ", count_pad=False"
        return text

    def _fwd_problem(self, input_shape: Shape, batch_size: int) -> AvgPoolFwdProblem:
        C, H, W = input_shape
        return AvgPoolFwdProblem(N=batch_size, C=C, H=H, W=W, window=self.window, stride=self.stride,
                                 padding=self.padding, count_pad=self.count_pad)

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise self._shape_error("(C, H, W)", input_shape)
        try:
            p = self._fwd_problem(input_shape, 1)
        except InvalidProblemError as exc:
            raise self._problem_error(exc, input_shape) from exc
        return (input_shape[0], p.P, p.Q)

    def make_problems(self, input_shape: Shape, batch_size: int) -> list[KernelProblem]:
        fwd = self._fwd_problem(input_shape, batch_size)
        # Without a trainable layer before it, nothing needs the pooled input's gradient.
        return [fwd, fwd.with_op("avgpool_bwd")] if self.needs_input_grad else [fwd]

    def _allocate(self, backend: Backend, batch_size: int) -> None:
        self._y = backend.zeros((batch_size, *self.output_shape))  # type: ignore[misc]
        self._dx = backend.zeros((batch_size, *self.input_shape)) if self.needs_input_grad else None  # type: ignore[misc]

    def forward(self, x: Array) -> Array:
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        backend.avgpool_fwd(self._problems[0], x, self._y)
        return self._y

    def backward(self, dy: Array) -> Array | None:
        backend = self._require_built()
        self._check_batch("output gradient", dy, self.output_shape)  # type: ignore[arg-type]
        if not self.needs_input_grad:
            return None
        backend.avgpool_bwd(self._problems[1], dy, self._dx)
        return self._dx


# -- dense ------------------------------------------------------------------------------------------

class Dense(_WeightedLayer):
    """Fully connected: y = act(x @ W + b), W of shape (in_features, out_features)."""

    trainable = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "none",
                 name: str | None = None) -> None:
        super().__init__(name)
        owner = "Dense"
        self.in_features = _int(owner, "in_features", in_features, 1)
        self.out_features = _int(owner, "out_features", out_features, 1)
        if not isinstance(bias, bool):
            raise ValueError(f"{owner}: bias must be True or False, got {bias!r}")
        self.use_bias = bias
        self.activation = _activation(owner, activation)
        self._x: Array | None = None

    def config_text(self) -> str:
        text = f"{self.in_features}, {self.out_features}"
        return text + self._epilogue_text()

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 1:
            hint = (f"add a Flatten() layer before it ({math.prod(input_shape)} features)"
                    if len(input_shape) > 1 else "")
            raise self._shape_error(f"({self.in_features},)", input_shape, hint)
        if input_shape[0] != self.in_features:
            raise self._shape_error(f"({self.in_features},)", input_shape)
        return (self.out_features,)

    def param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {"weight": (self.in_features, self.out_features)}
        if self.use_bias:
            shapes["bias"] = (self.out_features,)
        return shapes

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        params = {"weight": init_weights(rng, (self.in_features, self.out_features), self.in_features,
                                         self.out_features, self.activation)}
        if self.use_bias:
            params["bias"] = np.zeros(self.out_features)
        return params

    def _allocate(self, backend: Backend, batch_size: int) -> None:
        self._y = backend.zeros((batch_size, self.out_features))
        self._dz = backend.zeros(self._y.shape) if self.activation != "none" else None
        self._dx = backend.zeros((batch_size, self.in_features)) if self.needs_input_grad else None
        self._x = None

    def forward(self, x: Array) -> Array:
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        self._x = x
        backend.matmul(x, self._params["weight"], out=self._y)
        if self.use_bias or self.activation != "none":
            backend.bias_activation(self._y, self._params.get("bias"), self.activation)
        return self._y

    def backward(self, dy: Array) -> Array | None:
        backend = self._require_built()
        dz = self._through_activation(dy, bias_grad=self._grads.get("bias"))
        with backend.parameter_gradients():
            backend.matmul(self._x.T, dz, out=self._grads["weight"])
        if not self.needs_input_grad:
            return None
        backend.matmul(dz, self._params["weight"].T, out=self._dx)
        return self._dx


    @property
    def can_end_with_loss(self) -> bool:
        """Whether the model may run this layer together with the loss (``loss_step``)."""
        return self.activation == "none"

    def loss_step(self, x: Array, labels: Array, weights: Array, loss: Any, metric: Any, loss_out: Array,
                  acc_out: Array, dlogits: Array) -> Array | None:
        """Forward, softmax cross-entropy and backward of the model's last layer in one go.

        Fills the parameter gradients, ``dlogits`` (dL/d of this layer's output), ``loss_out`` and
        ``acc_out``; returns dL/dx (None when needs_input_grad is False). On a GPU the forward, the
        loss and dL/dx are one fused kernel (the output buffer is then not written) and the weight
        gradient runs beside the layers below.
        """
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        if not self.can_end_with_loss:
            raise RuntimeError(f"{self.describe()} has an activation: it cannot run with the loss")
        self._x = x
        dx = self._dx if self.needs_input_grad else None
        backend.dense_loss_step(x, self._params["weight"], self._params.get("bias"), labels, weights,
                                logits=self._y, dlogits=dlogits, db=self._grads.get("bias"), dx=dx,
                                loss_out=loss_out, acc_out=acc_out, loss=loss, metric=metric)
        with backend.parameter_gradients():
            backend.matmul(x.T, dlogits, out=self._grads["weight"])
        return dx


# -- reshaping and element-wise ---------------------------------------------------------------------

class Flatten(Layer):
    """(C, H, W) -> (C*H*W,): a view of the input, in C-H-W order (no copy, no kernel)."""

    def config_text(self) -> str:
        return ""

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) < 1:
            raise self._shape_error("(C, H, W) or any per-sample shape", input_shape)
        return (math.prod(input_shape),)

    def _allocate(self, backend: Backend, batch_size: int) -> None:
        pass  # outputs are views of the inputs

    def forward(self, x: Array) -> Array:
        self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        return x.reshape(self.batch_size, -1)

    def backward(self, dy: Array) -> Array | None:
        self._require_built()
        self._check_batch("output gradient", dy, self.output_shape)  # type: ignore[arg-type]
        if not self.needs_input_grad:
            return None
        return dy.reshape(self.batch_size, *self.input_shape)  # type: ignore[misc]


class Activation(Layer):
    """A stand-alone element-wise activation (Conv2d and Dense fuse theirs)."""

    def __init__(self, activation: str, name: str | None = None) -> None:
        super().__init__(name)
        self.activation = _activation("Activation", activation)

    def config_text(self) -> str:
        return repr(self.activation)

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) < 1:
            raise self._shape_error("a per-sample shape", input_shape)
        return tuple(input_shape)

    def _allocate(self, backend: Backend, batch_size: int) -> None:
        self._y = backend.zeros((batch_size, *self.output_shape))  # type: ignore[misc]
        self._dx = backend.zeros(self._y.shape) if self.needs_input_grad else None

    def forward(self, x: Array) -> Array:
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        return backend.activation(self.activation, x, out=self._y)

    def backward(self, dy: Array) -> Array | None:
        backend = self._require_built()
        self._check_batch("output gradient", dy, self.output_shape)  # type: ignore[arg-type]
        if not self.needs_input_grad:
            return None
        return activation_grad(backend, self.activation, self._y, dy, out=self._dx)


LAYER_TYPES: dict[str, type[Layer]] = {
    "conv2d": Conv2d,
    "avgpool2d": AvgPool2d,
    "dense": Dense,
    "flatten": Flatten,
    "activation": Activation,
}
