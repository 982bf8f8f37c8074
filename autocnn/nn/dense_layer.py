"""The fully connected layer, Dense (a cuBLAS SGEMM on a GPU: FP32, without TF32; at bf16 and fp16
cuBLAS GemmEx on 16-bit operands with FP32 compute), with the model's last FP32 layer run
together with the loss."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from autocnn.nn.backend import Array, Backend
from autocnn.nn.layer_base import Shape, WeightedLayer, check_activation, check_int, init_weights
from autocnn.nn.layer_base import OwnPrecision, check_precision
from autocnn.precision import DEFAULT_PRECISION, FLOAT32, Precision


class Dense(OwnPrecision, WeightedLayer):
    """Fully connected: y = act(x @ W + b), W of shape (in_features, out_features).

    ``precision``: None (the default) takes the model's; a precision overrides it for this layer.
    fp32 and tf32 are the same here: FP32 SGEMM (no TF32). At bf16 and fp16 (mixed precision,
    autocnn.nn.mixed_precision) the layer's input, output and gradients are 16-bit tensors: the
    GEMMs take 16-bit operands (the weights' 16-bit copy) and compute in FP32 (cuBLAS GemmEx,
    CUBLAS_COMPUTE_32F), the forward's FP32 result gets the bias and activation in FP32 and is
    rounded once, the weight gradient is rounded once into the 16-bit gradient copy, and the bias
    gradient sums the rounded dL/dz in FP32. The last layer of a 16-bit model hands 16-bit logits
    to the FP32 loss (as autocast does), so it does not run as the fused FP32 classifier head.
    """

    trainable = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "none",
                 name: str | None = None, precision: str | None = None) -> None:
        super().__init__(name)
        owner = "Dense"
        self.precision_override = check_precision(owner, precision, inherit=True)
        self._model_precision: Precision = DEFAULT_PRECISION
        self.in_features = check_int(owner, "in_features", in_features, 1)
        self.out_features = check_int(owner, "out_features", out_features, 1)
        if not isinstance(bias, bool):
            raise ValueError(f"{owner}: bias must be True or False, got {bias!r}")
        self.use_bias = bias
        self.activation = check_activation(owner, activation)
        self._x: Array | None = None

    def config_text(self) -> str:
        text = f"{self.in_features}, {self.out_features}" + self._epilogue_text()
        return text + self.precision_text()

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
        self._y = self._zeros(backend, (batch_size, self.out_features))
        self._dz = self._zeros(backend, self._y.shape) if self.activation != "none" else None
        self._dx = self._zeros(backend, (batch_size, self.in_features)) if self.needs_input_grad else None
        # A 16-bit layer's GEMM writes its FP32 result here; the epilogue rounds it into y.
        self._z32 = backend.zeros(self._y.shape, dtype=backend.storage_dtype(FLOAT32)) if self._sixteen else None
        self._x = None

    @property
    def _sixteen(self) -> bool:
        return self.element.size == 2

    def forward(self, x: Array) -> Array:
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        self._x = x
        if self._sixteen:
            backend.matmul(x, self._kernel_param("weight"), out=self._z32)
            backend.bias_activation_into(self._z32, self._kernel_param("bias"), self._y, self.activation, self.element)
            return self._y
        backend.matmul(x, self._params["weight"], out=self._y)
        if self.use_bias or self.activation != "none":
            backend.bias_activation(self._y, self._params.get("bias"), self.activation)
        return self._y

    @property
    def output_buffer(self) -> Array:
        """The buffer forward() returns: y, the activation's output (the backward reads it)."""
        self._require_built()
        return self._y

    def backward(self, dy: Array) -> Array | None:
        backend = self._require_built()
        dz = self._through_activation(dy, bias_grad=self._kernel_grad("bias"))
        with backend.parameter_gradients():
            backend.round_to(self.element, backend.matmul(self._x.T, dz, out=self._kernel_grad("weight")))
        if not self.needs_input_grad:
            return None
        backend.round_to(self.element, backend.matmul(dz, self._kernel_param("weight").T, out=self._dx))
        return self._dx


    @property
    def can_end_with_loss(self) -> bool:
        """Whether the model may run this layer together with the loss (``loss_step``)."""
        return self.activation == "none" and not self._sixteen

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
