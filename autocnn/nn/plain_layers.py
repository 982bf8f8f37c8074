"""Layers without parameters or kernels of their own: Flatten (a view) and Activation (element-wise)."""
from __future__ import annotations

import math

from autocnn.nn.backend import Array, Backend, activation_grad
from autocnn.nn.layer_base import Layer, Shape, check_activation


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
        self.activation = check_activation("Activation", activation)

    def config_text(self) -> str:
        return repr(self.activation)

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) < 1:
            raise self._shape_error("a per-sample shape", input_shape)
        return tuple(input_shape)

    def _allocate(self, backend: Backend, batch_size: int) -> None:
        self._y = self._zeros(backend, (batch_size, *self.output_shape))  # type: ignore[misc]
        self._dx = self._zeros(backend, self._y.shape) if self.needs_input_grad else None

    def forward(self, x: Array) -> Array:
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        # In the element type of what arrives (a 16-bit layer's output stays 16-bit).
        return backend.round_to(self.element, backend.activation(self.activation, x, out=self._y))

    @property
    def output_buffer(self) -> Array:
        """The buffer forward() returns: y, the activation's output (the backward reads it)."""
        self._require_built()
        return self._y

    def backward(self, dy: Array) -> Array | None:
        backend = self._require_built()
        self._check_batch("output gradient", dy, self.output_shape)  # type: ignore[arg-type]
        if not self.needs_input_grad:
            return None
        return backend.round_to(self.element, activation_grad(backend, self.activation, self._y, dy, out=self._dx))
