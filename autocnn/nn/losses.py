"""Softmax cross-entropy on logits, with per-sample weights, and the accuracy metric.

Weights serve two purposes: class or sample weighting, and masking. Every training step runs at
the built batch size, so a short last batch is padded with zero images whose weight is 0: they
then count for nothing in the loss, the gradient and the metrics.

The loss is the weighted mean  sum_i w_i * l_i / sum_i w_i  (the plain mean when every weight
is 1); a batch whose weights are all zero has loss 0 and gradient 0.

Values stay on the device: ``loss_and_grad``, ``loss_array`` and ``accuracy`` return 0-d arrays
of the inputs' array module (numpy or cupy), so a training step queues their computation and
never waits for the GPU. ``float(value)`` copies one to the host, which waits for the work queued
before it; ``SoftmaxCrossEntropy.loss`` is the float-returning convenience. The work buffers
(softmax, one-hot, per-sample terms) are allocated once per batch shape and reused.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from autocnn.nn.backend import Array, array_module


def _check_inputs(logits: Array, labels: Array, weights: Array | None) -> None:
    if logits.ndim != 2:
        raise ValueError(f"logits must be (batch, classes), got shape {tuple(logits.shape)}")
    n, classes = logits.shape
    if tuple(labels.shape) != (n,):
        raise ValueError(f"labels must have shape ({n},) for logits {tuple(logits.shape)}, "
                         f"got {tuple(labels.shape)}")
    if np.dtype(labels.dtype).kind not in "iu":
        raise TypeError(f"labels must be integer class indices, got dtype {labels.dtype}")
    if n and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ValueError(f"labels must lie in [0, {classes}), got values from {int(labels.min())} "
                         f"to {int(labels.max())}")
    if weights is not None:
        if tuple(weights.shape) != (n,):
            raise ValueError(f"weights must have shape ({n},), got {tuple(weights.shape)}")
        if n and float(weights.min()) < 0:
            raise ValueError("weights must be >= 0")


class Scratch:
    """Named work buffers, allocated on first use and reused for the same shape, dtype and array module.

    ``get`` returns an uninitialised buffer (the caller overwrites it); ``constant`` one filled once
    by ``init`` (e.g. an arange) and never written afterwards.
    """

    MAX_BUFFERS = 64  # callers with ever new shapes (tests, ad-hoc use) must not grow it without bound

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], Array] = {}

    def _lookup(self, xp: Any, name: str, shape: tuple[int, ...], dtype: Any,
                init: Callable[[], Array] | None) -> Array:
        key = (name, xp.__name__, shape, np.dtype(dtype).str)
        buf = self._buffers.get(key)
        if buf is None:
            if len(self._buffers) >= self.MAX_BUFFERS:
                self._buffers.clear()
            buf = xp.empty(shape, dtype=dtype) if init is None else init()
            self._buffers[key] = buf
        return buf

    def get(self, xp: Any, name: str, shape: tuple[int, ...], dtype: Any) -> Array:
        return self._lookup(xp, name, shape, dtype, None)

    def constant(self, xp: Any, name: str, shape: tuple[int, ...], dtype: Any, init: Callable[[], Array]) -> Array:
        return self._lookup(xp, name, shape, dtype, init)

    def clear(self) -> None:
        self._buffers.clear()


def _float_dtype(a: Array) -> np.dtype:
    return np.dtype(a.dtype) if np.dtype(a.dtype).kind == "f" else np.dtype(np.float64)


class SoftmaxCrossEntropy:
    """-log softmax(logits)[label], averaged with per-sample weights.

    ``loss_and_grad`` returns the loss (a 0-d array) and dL/dlogits; ``loss_array`` only the
    value, as a 0-d array; ``loss`` the value as a float (which waits for the device). All take
    arrays of one backend (numpy or cupy) and compute with its array module.

    With ``check=False`` (the model's training step) the labels are not checked: they must lie in
    [0, classes), and out-of-range labels give a wrong loss rather than an error.
    """

    def __init__(self) -> None:
        self.scratch = Scratch()

    def __call__(self, logits: Array, labels: Array, weights: Array | None = None) -> tuple[Array, Array]:
        return self.loss_and_grad(logits, labels, weights)

    def loss(self, logits: Array, labels: Array, weights: Array | None = None, *, check: bool = True) -> float:
        """The loss as a Python float (copied to the host: waits for the device)."""
        return float(self.loss_array(logits, labels, weights, check=check))

    def loss_array(self, logits: Array, labels: Array, weights: Array | None = None, *,
                   out: Array | None = None, check: bool = True) -> Array:
        """The loss as a 0-d array of the logits' array module (into ``out`` when given)."""
        if check:
            _check_inputs(logits, labels, weights)
        xp = array_module(logits)
        shifted, lse, w, wsum, labels64 = self._parts(xp, logits, labels, weights)
        return self._value(xp, shifted, lse, labels64, w, wsum, out)

    def loss_and_grad(self, logits: Array, labels: Array, weights: Array | None = None, *,
                      out: Array | None = None, loss_out: Array | None = None,
                      check: bool = True) -> tuple[Array, Array]:
        """(loss, dL/dlogits), the loss a 0-d array (into ``loss_out`` when given, else a new one),
        the gradient into ``out`` when given (the model's buffer)."""
        if check:
            _check_inputs(logits, labels, weights)
        xp = array_module(logits)
        shifted, lse, w, wsum, labels64 = self._parts(xp, logits, labels, weights)
        loss = self._value(xp, shifted, lse, labels64, w, wsum, loss_out)
        grad = out if out is not None else xp.empty_like(logits)
        n, classes = logits.shape
        # softmax - onehot, scaled by each sample's share of the weight.
        xp.subtract(shifted, lse, out=grad)
        xp.exp(grad, out=grad)
        cols = self.scratch.constant(xp, f"cols{classes}", (1, classes), np.int64,
                                     lambda: xp.arange(classes, dtype=np.int64)[None, :])
        onehot = self.scratch.get(xp, "onehot", (n, classes), grad.dtype)
        xp.equal(cols, labels64[:, None], out=onehot)   # 1.0 at each row's label, 0.0 elsewhere
        grad -= onehot
        scale = self.scratch.get(xp, "scale", (n,), w.dtype)
        xp.divide(w, wsum, out=scale)
        grad *= scale[:, None]
        return loss, grad

    def loss_grad_accuracy(self, logits: Array, labels: Array, weights: Array, *, grad_out: Array,
                           loss_out: Array, acc_out: Array, metric: "Accuracy") -> None:
        """The model's step: loss into ``loss_out``, dL/dlogits into ``grad_out`` and the weighted
        accuracy (by ``metric``) into ``acc_out``, labels unchecked (as ``check=False``).

        On a GPU with float32 logits this is one fused kernel (autocnn.nn.fused.softmax_xent);
        elsewhere ``loss_and_grad`` and ``metric``, with the same results to rounding.
        """
        xp = array_module(logits)
        if (xp is not np and logits.dtype == np.float32 and weights.dtype == np.float32
                and labels.dtype == np.int64 and loss_out.dtype == np.float32 and acc_out.dtype == np.float64):
            from autocnn.nn import fused

            fused.softmax_xent(logits, labels, weights, grad_out, loss_out, acc_out)
            return
        self.loss_and_grad(logits, labels, weights, out=grad_out, loss_out=loss_out, check=False)
        metric(logits, labels, weights, out=acc_out)

    def _parts(self, xp: Any, logits: Array, labels: Array, weights: Array | None
               ) -> tuple[Array, Array, Array, Array, Array]:
        """(logits - row max, log-sum-exp of that (n, 1), weights, max(sum of weights, tiny), labels as int64)."""
        n, classes = logits.shape
        dt = _float_dtype(logits)
        s = self.scratch
        # log-sum-exp after subtracting the row maximum: exp never overflows.
        rowmax = s.get(xp, "rowmax", (n, 1), logits.dtype)
        xp.max(logits, axis=1, keepdims=True, out=rowmax)
        shifted = s.get(xp, "shifted", (n, classes), dt)
        xp.subtract(logits, rowmax, out=shifted)
        e = s.get(xp, "exp", (n, classes), dt)
        xp.exp(shifted, out=e)
        lse = s.get(xp, "lse", (n, 1), dt)
        xp.sum(e, axis=1, keepdims=True, out=lse)
        xp.log(lse, out=lse)
        if weights is None:
            w = s.constant(xp, "ones", (n,), dt, lambda: xp.ones(n, dtype=dt))
        else:
            w = weights.astype(dt, copy=False)
        # max(sum, tiny) instead of a branch: an all-zero batch gives 0/tiny = 0 without a host sync.
        wsum = s.get(xp, "wsum", (), dt)
        xp.sum(w, out=wsum)
        xp.maximum(wsum, np.finfo(dt).tiny, out=wsum)
        labels64 = labels if labels.dtype == np.int64 else labels.astype(np.int64)
        return shifted, lse, w, wsum, labels64

    def _value(self, xp: Any, shifted: Array, lse: Array, labels64: Array, w: Array, wsum: Array,
               out: Array | None) -> Array:
        # sum_i w_i * (lse_i - shifted[i, label_i]) / wsum; the picked logits by a flat gather.
        n, classes = shifted.shape
        s = self.scratch
        offsets = s.constant(xp, f"row_offsets{classes}", (n,), np.int64,
                             lambda: xp.arange(n, dtype=np.int64) * classes)
        flat = s.get(xp, "flat_index", (n,), np.int64)
        xp.add(offsets, labels64, out=flat)
        per_sample = s.get(xp, "per_sample", (n,), shifted.dtype)
        xp.take(shifted.reshape(-1), flat, out=per_sample)
        xp.subtract(lse[:, 0], per_sample, out=per_sample)
        per_sample *= w
        total = xp.empty((), dtype=shifted.dtype) if out is None else out
        xp.sum(per_sample, out=total)
        xp.divide(total, wsum, out=total)
        return total


def softmax(logits: Array) -> Array:
    """Row-wise class probabilities, computed stably."""
    xp = array_module(logits)
    e = xp.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class Accuracy:
    """Weighted fraction of rows whose arg-max is the label, as a 0-d float64 array.

    Keeps its work buffers between calls (the model holds one); ``accuracy`` is the one-off
    function. The ratio is taken in float64 (the two sums are in the logits' dtype), and a batch
    whose weights are all zero has accuracy 0.
    """

    def __init__(self) -> None:
        self.scratch = Scratch()

    def __call__(self, logits: Array, labels: Array, weights: Array | None = None, *,
                 out: Array | None = None) -> Array:
        if not hasattr(logits, "ndim"):
            logits = np.asarray(logits)
        xp = array_module(logits)
        if not hasattr(labels, "ndim"):
            labels = xp.asarray(labels)
        s = self.scratch
        n = logits.shape[0]
        result = xp.empty((), dtype=np.float64) if out is None else out
        if n == 0:
            result.fill(0.0)
            return result
        dt = _float_dtype(logits)
        arg = s.get(xp, "argmax", (n,), np.int64)
        xp.argmax(logits, axis=1, out=arg)
        correct = s.get(xp, "correct", (n,), dt)
        xp.equal(arg, labels, out=correct)      # 1.0 where right, 0.0 where wrong
        if weights is None:
            mean = s.get(xp, "mean", (), dt)
            xp.mean(correct, out=mean)
            xp.copyto(result, mean)
            return result
        if weights.dtype.kind not in "f":
            weights = weights.astype(dt)
        pdt = np.result_type(correct.dtype, weights.dtype)
        weighted = s.get(xp, "weighted", (n,), pdt)
        xp.multiply(correct, weights, out=weighted)
        num = s.get(xp, "num", (), pdt)
        xp.sum(weighted, out=num)
        den = s.get(xp, "den", (), weights.dtype)
        xp.sum(weights, out=den)
        den64 = s.get(xp, "den64", (), np.float64)
        xp.copyto(den64, den)
        # num / den when den > 0; when every weight is 0, num is 0 too and 0 / tiny = 0.
        xp.maximum(den64, np.finfo(np.float64).tiny, out=den64)
        xp.copyto(result, num)
        xp.divide(result, den64, out=result)
        return result


def accuracy(logits: Array, labels: Array, weights: Array | None = None) -> Array:
    """Weighted fraction of rows whose arg-max is the label (logits or probabilities alike).

    A 0-d float64 array of the logits' array module: ``float()`` it for a number (on a GPU that
    waits for the device).
    """
    return Accuracy()(logits, labels, weights)
