"""What every layer shares: the Layer base class, the checks of constructor arguments, weight
initialisation, and the fused-activation backward step of the weighted layers (Conv2d, Dense).

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
from autocnn.kernels.problem import ACTIVATIONS
from autocnn.precision import FLOAT32, PRECISION_NAMES, PRECISIONS, ElementType, Precision, precision_named
from autocnn.nn.backend import Array, Backend, KernelProblem, activation_grad

Shape = tuple[int, ...]


# -- argument normalisation -----------------------------------------------------------------------

def check_int(owner: str, name: str, value: Any, minimum: int) -> int:
    # bool is an int in Python, but True as a size is a mistake rather than 1.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_pair(owner: str, name: str, value: Any, minimum: int = 1) -> tuple[int, int]:
    vals = tuple(value) if isinstance(value, (list, tuple)) else (value, value)
    if len(vals) != 2:
        raise ValueError(f"{owner}: {name} must be an integer or (height, width), got {value!r}")
    return (check_int(owner, name, vals[0], minimum), check_int(owner, name, vals[1], minimum))


def check_groups(owner: str, value: Any, in_channels: int, out_channels: int) -> int:
    """A convolution's channel groups: an integer >= 1 dividing both channel counts."""
    groups = check_int(owner, "groups", value, 1)
    if in_channels % groups or out_channels % groups:
        allowed = [g for g in range(1, min(in_channels, out_channels) + 1)
                   if in_channels % g == 0 and out_channels % g == 0]
        raise ValueError(f"{owner}: groups={groups} must divide in_channels={in_channels} and "
                         f"out_channels={out_channels} (each group takes in_channels/groups channels and makes "
                         f"out_channels/groups maps); allowed: {', '.join(map(str, allowed))}")
    return groups


def check_padding(owner: str, value: Any) -> tuple[int, int, int, int]:
    vals = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if len(vals) == 1:
        vals = vals * 4
    elif len(vals) == 2:  # (height, width): the same on both sides
        vals = (vals[0], vals[1], vals[0], vals[1])
    if len(vals) != 4:
        raise ValueError(f"{owner}: padding must be an integer, (height, width) or "
                         f"(top, left, bottom, right), got {value!r}")
    return tuple(check_int(owner, "padding", v, 0) for v in vals)  # type: ignore[return-value]


def check_activation(owner: str, name: Any) -> str:
    if name is None:
        return "none"
    if not isinstance(name, str) or name.lower() not in ACTIVATIONS:
        raise ValueError(f"{owner}: activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    return name.lower()


def check_precision(owner: str, value: Any, inherit: bool = False) -> Precision | None:
    """The Precision a name ("fp32", "tf32", "bf16" or "fp16", any case) or a Precision stands for;
    with ``inherit``, None (take the model's) is allowed too."""
    if inherit and value is None:
        return None
    if isinstance(value, Precision) and value in PRECISIONS:
        return value
    if not isinstance(value, (str, Precision)) or str(value).lower() not in PRECISION_NAMES:
        allowed = ", ".join(PRECISION_NAMES) + (" or None (the model's)" if inherit else "")
        raise ValueError(f"{owner}: precision must be one of {allowed}, got {value!r}")
    return precision_named(str(value).lower())


def shape_text(shape: Sequence[Any]) -> str:
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
        # The element type its input and output are stored in (set by the model before each build:
        # mixed_precision.layer_elements), and the 16-bit copies of its parameters and gradients that
        # its kernels use in a 16-bit layer (None: the FP32 parameters themselves).
        self.element: ElementType = FLOAT32
        self._kernel_params: dict[str, Array] | None = None
        self._kernel_grads: dict[str, Array] | None = None

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

    def use_model_precision(self, precision: str) -> None:
        """Told the model's precision (by Sequential, before the next build). Only layers whose
        kernels have a precision (Conv2d, AvgPool2d) keep it; the others ignore it."""

    def takes_element(self, arriving: ElementType) -> ElementType:
        """The element type this layer stores its input and output in, given what the layer before
        gives (``arriving``): a layer without a precision of its own keeps what arrives; one with a
        precision takes its storage, and the model casts at the boundary."""
        return arriving

    def use_kernel_tensors(self, params: dict[str, Array] | None, grads: dict[str, Array] | None) -> None:
        """The 16-bit copies of the parameters and gradients the layer's kernels use (by the model,
        mixed_precision.SixteenBitCopies), or None: the FP32 parameters and gradients themselves."""
        self._kernel_params, self._kernel_grads = params, grads

    def _kernel_param(self, name: str) -> Array | None:
        """The parameter ``name`` as the layer's kernels take it (None when the layer has none such)."""
        return (self._params if self._kernel_params is None else self._kernel_params).get(name)

    def _kernel_grad(self, name: str) -> Array | None:
        """Where the layer's kernels write the gradient of parameter ``name`` (None: no such)."""
        return (self._grads if self._kernel_grads is None else self._kernel_grads).get(name)

    def _zeros(self, backend: Backend, shape: Sequence[int]) -> Array:
        """A zeroed activation buffer of the layer's element type."""
        return backend.zeros(tuple(shape), dtype=backend.storage_dtype(self.element))

    # -- allocation ------------------------------------------------------------------------------
    def build(self, input_shape: Sequence[int], batch_size: int, backend: Backend,
              rng: np.random.Generator) -> Shape:
        """Allocate parameters (first build only), buffers and problems; returns the output shape."""
        input_shape = tuple(int(s) for s in input_shape)
        batch_size = check_int(self.describe(), "batch_size", batch_size, 1)
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

    def alternative_problems(self, input_shape: Shape, batch_size: int) -> list[KernelProblem]:
        """Problems of other ways to run this layer, which tuning covers and a backend may pick at
        build time where they are tuned faster (none by default)."""
        return []

    def replaced_by(self, alternative: KernelProblem) -> list[KernelProblem]:
        """The built layer's problems that ``alternative`` (one of ``alternative_problems``) runs
        instead of: what ``Backend.tuned_faster`` compares it with."""
        raise NotImplementedError(f"{type(self).__name__} offers no alternative problems")

    def use_alternative(self, alternative: KernelProblem) -> None:
        """Run ``alternative`` instead of ``replaced_by(alternative)`` from now on (at build)."""
        raise NotImplementedError(f"{type(self).__name__} offers no alternative problems")

    # -- helpers -------------------------------------------------------------------------------
    def _require_built(self) -> Backend:
        if self.backend is None or self.batch_size is None:
            raise RuntimeError(f"{self.describe()} is not built: call build(input_shape, batch_size, "
                               f"backend, rng) first (a Sequential model does this)")
        return self.backend

    def _check_batch(self, what: str, array: Array, sample_shape: Shape) -> None:
        expected = (self.batch_size, *sample_shape)
        if tuple(array.shape) != expected:
            raise ValueError(f"{self.describe()}: {what} has shape {shape_text(array.shape)}, expected "
                             f"{shape_text(expected)} (batch {self.batch_size} x {shape_text(sample_shape)})")

    def _shape_error(self, expected: str, given: Shape, hint: str = "") -> ValueError:
        text = f"{self.describe()} expects input {expected}, got {shape_text(given)}"
        return ValueError(text + (f": {hint}" if hint else ""))

    def _problem_error(self, exc: InvalidProblemError, input_shape: Shape) -> ValueError:
        return ValueError(f"{self.describe()} cannot run on input {shape_text(input_shape)}: {exc}")


class OwnPrecision:
    """What a layer whose kernels have a precision (Conv2d, AvgPool2d, Dense) shares: its own
    precision (``precision_override``, set by its constructor; None: the model's) over the model's,
    and its tensors stored in that precision's element type (the model casts at the boundary).
    Placed before Layer among a layer's bases, so that these answer instead of Layer's."""

    precision_override: Precision | None
    _model_precision: Precision

    @property
    def precision(self) -> Precision:
        """The layer's precision: its own, else the model's."""
        return self.precision_override or self._model_precision

    def use_model_precision(self, precision: Precision) -> None:
        self._model_precision = precision

    def takes_element(self, arriving: ElementType) -> ElementType:
        return self.precision.x

    def precision_text(self) -> str:
        """The constructor argument that sets its own precision, for config_text (empty for none)."""
        return f", precision={self.precision_override.name!r}" if self.precision_override else ""


class WeightedLayer(Layer):
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
            return self.backend.activation_grad_bias(self.activation, self._y, dy, self._dz, bias_grad, self.element)
        if self._dz is None:
            return dy
        dz = activation_grad(self.backend, self.activation, self._y, dy, out=self._dz)
        return self.backend.round_to(self.element, dz)   # stored in the layer's type (emulated on the CPU)
