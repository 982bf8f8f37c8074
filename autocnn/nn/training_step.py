"""One training step of a Sequential model: forward, loss, backward and update, on the staged batch.

On a backend that can capture CUDA graphs (cuda), the device work of a training step (forward,
loss, backward, update) is captured once, at the second step after a build or an optimizer
change, and replayed from then on: one launch per step instead of dozens, with the host doing
only the staging of the batch and the optimizer's bookkeeping. ``use_graphs = False`` runs every
step kernel by kernel instead (the results are the same).

A training step never waits for a GPU: loss and accuracy stay on the device as 0-d arrays
(``StepResult`` reads them when asked).
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from autocnn.nn.backend import Array
from autocnn.nn.layers import Dense
from autocnn.nn.mixed_precision import ScaleUse
from autocnn.nn.optim import Optimizer, get_optimizer


class StepResult:
    """One training step: the batch's loss and accuracy, over ``samples`` (the sum of the weights).

    The step leaves loss and accuracy on the device, as 0-d arrays (``loss_array``,
    ``accuracy_array``), and returns without waiting for it. ``loss`` and ``accuracy`` read them as
    floats on first use: that read waits for the device to finish the step, on purpose, and only
    when a caller asks.
    """

    __slots__ = ("loss_array", "accuracy_array", "samples", "_values")

    def __init__(self, loss: Array, accuracy: Array, samples: float) -> None:
        self.loss_array = loss
        self.accuracy_array = accuracy
        self.samples = float(samples)
        self._values: tuple[float, float] | None = None

    def _read(self) -> tuple[float, float]:
        if self._values is None:
            self._values = (float(self.loss_array), float(self.accuracy_array))
        return self._values

    @property
    def loss(self) -> float:
        return self._read()[0]

    @property
    def accuracy(self) -> float:
        return self._read()[1]

    def __repr__(self) -> str:
        return f"StepResult(loss={self.loss:.6g}, accuracy={self.accuracy:.6g}, samples={self.samples:g})"


def metric_views(metrics: Array, dtype: Any) -> tuple[Array, Array]:
    """0-d views of a float64 pair: the loss (in the model's dtype, at the first element's bytes)
    and the accuracy (the second element)."""
    return metrics[0:1].view(dtype)[0, ...], metrics[1, ...]


class TrainingStep:
    """Sequential's training step (mixed into ``autocnn.nn.model.Sequential``, whose layers,
    backend, buffers and graph state it uses)."""

    def compile(self, optimizer: str | Optimizer = "adam", lr: float | None = None) -> "Sequential":
        """Choose the optimizer used by train_step and fit."""
        self.optimizer = get_optimizer(optimizer, lr)
        return self

    def _ready_optimizer(self) -> Optimizer:
        if self.optimizer is None:
            raise RuntimeError("no optimizer: call compile(optimizer) or pass optimizer= to fit")
        opt = self.optimizer
        key = self._step_key(opt)
        if key == self._ready_key:
            return opt  # parameters never change shape after a build: checked once per key
        params = self.params()
        if not opt.matches(params):
            arena = self._arena if self._arena is not None and self._arena.holds(params) else None
            opt.setup(params, arena=arena)
        self._ready_key = self._step_key(opt)
        return opt

    def _step_key(self, optimizer: Optimizer) -> tuple[Any, ...]:
        """What a prepared step depends on: the build (its buffers) and the optimizer's state."""
        return (self._build_count, id(optimizer), optimizer.generation)

    def _forward(self, upto: int | None = None) -> Array:
        """The staged batch through the layers before index ``upto`` (all by default, then cast to
        FP32 for the loss where the last layer is 16-bit). Casts the master weights into the 16-bit
        layers' copies first, and the activations at each change of element type
        (autocnn.nn.mixed_precision)."""
        if self._sixteen is not None:
            self._sixteen.cast_weights()
        out = self._x_buf
        stop = len(self.layers) if upto is None else range(len(self.layers))[upto]
        for index, layer in enumerate(self.layers[:stop]):
            out = layer.forward(self._cast_forward(index, out))
        return out if upto is not None else self._cast_forward(stop, out)

    def _cast_forward(self, index: int, x: Array) -> Array:
        """``x`` as layer ``index`` takes it: cast into the boundary's buffer where there is one."""
        boundary = self._boundaries.get(index)
        if boundary is None:
            return x
        return self.backend.cast(x, boundary.before, boundary.forward, boundary.after, None, ScaleUse.KEEP)

    def _cast_backward(self, index: int, grad: Array | None) -> Array | None:
        """The gradient layer ``index`` hands back, as the layer before it takes it: cast (times the
        loss scale into 16 bits, divided by it out of them) where a boundary lies before ``index``."""
        boundary = self._boundaries.get(index)
        if boundary is None or grad is None or boundary.backward is None:
            return grad
        scaler = self.loss_scaler
        return self.backend.cast(grad, boundary.after, boundary.backward, boundary.before,
                                 None if scaler is None else scaler.state, boundary.backward_use)

    def _backward(self, grad: Array | None, below: int | None = None) -> None:
        """Backward through the layers before index ``below`` (all by default), from ``grad`` (the
        gradient of layer ``below - 1``'s output, in the element type that follows it)."""
        below = len(self.layers) if below is None else below
        grad = self._cast_backward(below, grad)
        for index in reversed(range(below)):
            layer = self.layers[index]
            if grad is None or (not layer.trainable and not layer.needs_input_grad):
                break  # nothing (further) before it has parameters
            grad = self._cast_backward(index, layer.backward(grad))
        # Weight gradients may have run beside the backward pass: every one is done after this.
        self.backend.join_parameter_gradients()
        if self._sixteen is not None:
            # The 16-bit layers' weight gradients into the FP32 ones, the loss scale divided out
            # (and, with a scaler, the step flagged where any gradient is not finite).
            self._sixteen.gradients_to_fp32(self.loss_scaler)

    def _forward_backward(self, loss_out: Array | None = None, acc_out: Array | None = None) -> tuple[Array, Array]:
        """Forward and backward on the staged batch: fills every layer's grads().

        Returns (loss, accuracy) as 0-d device arrays (written into ``loss_out``/``acc_out`` when
        given, else new ones) without waiting for the device.
        """
        if self.loss_scaler is not None:
            # fp16 overflows are expected (the loss scaler finds them and skips the step): NumPy's
            # warnings of them (the numpy backend's emulation) say nothing the scaler does not.
            with np.errstate(over="ignore", invalid="ignore"):
                return self._forward_backward_once(loss_out, acc_out)
        return self._forward_backward_once(loss_out, acc_out)

    def _forward_backward_once(self, loss_out: Array | None, acc_out: Array | None) -> tuple[Array, Array]:
        be = self.backend
        loss = be.zeros(()) if loss_out is None else loss_out
        acc = be.zeros((), dtype=np.float64) if acc_out is None else acc_out
        if self._arena is not None:
            be.zero_gradients(self._arena.grads)
        head = self.layers[-1]
        if isinstance(head, Dense) and head.can_end_with_loss:
            # The last layer, the loss and its backward in one call (one fused kernel on a GPU).
            last = len(self.layers) - 1
            features = self._cast_forward(last, self._forward(upto=-1))
            be.gradients_ready()
            grad = head.loss_step(features, self._labels_buf, self._weights_buf, self.loss, self.metric, loss, acc,
                                  self._dlogits)
            self._backward(grad, below=last)
            return loss, acc
        logits = self._forward()
        be.gradients_ready()
        self.loss.loss_grad_accuracy(logits, self._labels_buf, self._weights_buf, grad_out=self._dlogits,
                                     loss_out=loss, acc_out=acc, metric=self.metric)
        self._backward(self._dlogits)
        return loss, acc

    def _device_step(self, optimizer: Optimizer) -> None:
        """Every device operation of a training step on the staged batch, after the optimizer's
        ``begin_step``: forward, loss, backward and update, the loss and accuracy left in the
        step buffers; with fp16's loss scaler, the update skipped on the device where a gradient
        is not finite, and the scale's step after it. Nothing here may wait for the device or
        allocate what outlives the step: this is what a CUDA graph captures."""
        self._forward_backward(self._step_loss, self._step_acc)
        scaler = self.loss_scaler
        optimizer.apply(self.params(), self.grads(), skip=None if scaler is None else scaler.found_flag)
        if scaler is not None:
            scaler.update()

    def _run_step(self, optimizer: Optimizer) -> None:
        """One training step on the staged batch, as a replayed CUDA graph where possible.

        The first step for a (build, optimizer, optimizer setup) runs kernel by kernel: it
        compiles and allocates whatever is used for the first time. The second captures the
        step and replays it; every later one only replays. A capture that fails (a backend
        operation that cannot be captured) is reported once, and the model goes on without graphs.
        """
        optimizer.begin_step()
        key = self._step_key(optimizer)
        graphs = self.use_graphs and self.backend.can_capture
        if graphs and self._graph is not None and self._graph_key == key:
            self._graph.replay()
            return
        if not graphs or self._eager_key != key:
            self._eager_key = key
            self._device_step(optimizer)
            return
        try:
            graph = self.backend.capture(lambda: self._device_step(optimizer))
        except Exception as exc:  # noqa: BLE001 -- any capture failure means: run without graphs
            warnings.warn(f"the training step could not be captured as a CUDA graph ({type(exc).__name__}: "
                          f"{exc}); running it kernel by kernel from now on", RuntimeWarning, stacklevel=3)
            self.use_graphs = False
            self._device_step(optimizer)
            return
        self._graph, self._graph_key = graph, key
        graph.replay()

    def _gradients(self, xb: Array, yb: Array, weights: np.ndarray | None) -> tuple[Array, Array]:
        """Stage one batch, then forward and backward; returns (loss, accuracy) as 0-d arrays."""
        self._stage(xb, yb, weights)
        return self._forward_backward()

    def _train_batch(self, xb: Array, yb: Array, weights: np.ndarray | None) -> StepResult:
        optimizer = self._ready_optimizer()
        self._stage(xb, yb, weights)
        self._run_step(optimizer)
        samples = float(len(xb)) if weights is None else float(np.sum(weights))
        # Copies: the next step overwrites the step buffers.
        be = self.backend
        loss, acc = metric_views(be.copy(self._step_metrics), self.dtype)
        return StepResult(loss, acc, samples)

    def train_step(self, xb: Any, yb: Any, weights: Any = None) -> StepResult:
        """One forward, backward and update on a batch of at most the built batch size.

        Returns without waiting for the device: the StepResult's ``loss`` and ``accuracy`` are
        read (which waits for the step to finish) when first asked for.

        Host arrays are checked (shape, dtype, finite values, labels in range) and uploaded. A
        device array (CuPy, on the cuda backend) of the model's dtype and input shape is copied
        into the input buffer on the device *without any check*, and so are device labels:
        device-resident inputs are the caller's responsibility (``fit`` validates its data once,
        before uploading it). Device arrays of another dtype or shape take the host path, with
        its checks and error messages.
        """
        self._require_built()
        xb, yb, w = self._check_batch(xb, yb, weights)
        return self._train_batch(xb, yb, w)

    def train_step_async(self, xb: Any, yb: Any, weights: Any = None) -> StepResult:
        """``train_step``, named for loops that must never wait for the device.

        Nothing in it reads a value back: use ``StepResult.loss_array``/``accuracy_array`` (0-d
        device arrays) to keep the metrics on the device; reading ``.loss`` or ``.accuracy``
        synchronises. With device-resident ``xb``/``yb`` nothing is copied from the host either.
        """
        return self.train_step(xb, yb, weights)

    def loss_and_gradients(self, xb: Any, yb: Any, weights: Any = None) -> float:
        """The batch's loss, with every parameter's gradient left in grads(); no update.

        For gradient checks and custom training loops (returns a float: waits for the device).
        """
        self._require_built()
        xb, yb, w = self._check_batch(xb, yb, weights)
        loss = float(self._gradients(xb, yb, w)[0])
        if self.loss_scaler is not None:
            self.loss_scaler.forget_found()   # no update follows: the flag is this call's alone
        return loss
