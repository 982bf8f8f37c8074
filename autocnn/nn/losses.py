"""Softmax cross-entropy on logits, with per-sample weights, and the accuracy metric.

Weights serve two purposes: class or sample weighting, and masking. Every training step runs at
the built batch size, so a short last batch is padded with zero images whose weight is 0: they
then count for nothing in the loss, the gradient and the metrics.

The loss is the weighted mean  sum_i w_i * l_i / sum_i w_i  (the plain mean when every weight
is 1); a batch whose weights are all zero has loss 0 and gradient 0.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .backend import Array, array_module


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


class SoftmaxCrossEntropy:
    """-log softmax(logits)[label], averaged with per-sample weights.

    ``loss_and_grad`` returns the loss and dL/dlogits; ``loss`` only the value. Both take arrays
    of one backend (numpy or cupy) and compute with its array module.
    """

    def __call__(self, logits: Array, labels: Array, weights: Array | None = None) -> tuple[float, Array]:
        return self.loss_and_grad(logits, labels, weights)

    def loss(self, logits: Array, labels: Array, weights: Array | None = None, *, check: bool = True) -> float:
        if check:
            _check_inputs(logits, labels, weights)
        xp = array_module(logits)
        shifted, lse = self._log_softmax_parts(xp, logits)
        w, wsum = self._weights(xp, logits, weights)
        picked = xp.take_along_axis(shifted, labels[:, None], axis=1)[:, 0]
        return float(xp.sum(w * (lse[:, 0] - picked)) / wsum)

    def loss_and_grad(self, logits: Array, labels: Array, weights: Array | None = None, *,
                      out: Array | None = None, check: bool = True) -> tuple[float, Array]:
        """(loss, dL/dlogits); the gradient goes into ``out`` when given (the model's buffer)."""
        if check:
            _check_inputs(logits, labels, weights)
        xp = array_module(logits)
        shifted, lse = self._log_softmax_parts(xp, logits)
        w, wsum = self._weights(xp, logits, weights)
        picked = xp.take_along_axis(shifted, labels[:, None], axis=1)[:, 0]
        loss = float(xp.sum(w * (lse[:, 0] - picked)) / wsum)
        grad = out if out is not None else xp.empty_like(logits)
        # softmax - onehot, scaled by each sample's share of the weight.
        xp.exp(shifted - lse, out=grad)
        grad -= (xp.arange(logits.shape[1])[None, :] == labels[:, None]).astype(grad.dtype)
        grad *= (w / wsum)[:, None]
        return loss, grad

    @staticmethod
    def _log_softmax_parts(xp: Any, logits: Array) -> tuple[Array, Array]:
        # log-sum-exp after subtracting the row maximum: exp never overflows.
        shifted = logits - logits.max(axis=1, keepdims=True)
        lse = xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        return shifted, lse

    @staticmethod
    def _weights(xp: Any, logits: Array, weights: Array | None) -> tuple[Array, Array]:
        if weights is None:
            w = xp.ones(logits.shape[0], dtype=logits.dtype)
        else:
            w = weights.astype(logits.dtype, copy=False)
        # max(sum, tiny) instead of a branch: an all-zero batch gives 0/tiny = 0 without a host sync.
        wsum = xp.maximum(w.sum(), np.finfo(logits.dtype).tiny)
        return w, wsum


def softmax(logits: Array) -> Array:
    """Row-wise class probabilities, computed stably."""
    xp = array_module(logits)
    e = xp.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def accuracy(logits: Array, labels: Array, weights: Array | None = None) -> float:
    """Weighted fraction of rows whose arg-max is the label (logits or probabilities alike)."""
    xp = array_module(logits)
    correct = (xp.argmax(logits, axis=1) == labels).astype(logits.dtype)
    if weights is None:
        return float(correct.mean()) if correct.size else 0.0
    total = float(weights.sum())
    return float((correct * weights).sum()) / total if total > 0 else 0.0
