"""Checks on what users pass to a model: images, labels and sample weights.

Every check raises with a message that says what was given and what is expected, because the
alternative (numpy broadcasting or casting silently) trains on garbage without a word.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _shape_text(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_images(x: Any, input_shape: tuple[int, ...], dtype: np.dtype, what: str = "x") -> np.ndarray:
    """``x`` as a C-contiguous array of ``dtype`` with shape (n, *input_shape), all finite.

    Any float dtype is converted (float64 given to a float32 model is fine); integer, bool and
    object arrays are refused, since image bytes need scaling to [0, 1] first.
    """
    if not isinstance(x, np.ndarray):
        if type(x).__module__.split(".")[0] == "cupy":
            x = x.get()
        else:
            x = np.asarray(x)
    if x.dtype.kind != "f":
        hint = " (scale image bytes first, e.g. x.astype(np.float32) / 255)" if x.dtype.kind in "iub" else ""
        raise TypeError(f"{what} must be a floating-point array, got dtype {x.dtype}{hint}")
    expected = (None, *input_shape)
    if x.ndim != len(expected) or tuple(x.shape[1:]) != tuple(input_shape):
        hint = ""
        if tuple(x.shape) == tuple(input_shape):
            hint = f": that is one sample; pass a batch, e.g. {what}[None]"
        elif x.ndim == len(input_shape) and len(input_shape) == 3 and tuple(x.shape[1:]) == tuple(input_shape[1:]) \
                and input_shape[0] == 1:
            hint = f": add the channel axis, e.g. {what}[:, None]"
        raise ValueError(f"{what} has shape {_shape_text(x.shape)}, the model expects "
                         f"(n, {', '.join(map(str, input_shape))}){hint}")
    if x.shape[0] == 0:
        raise ValueError(f"{what} is empty (no samples)")
    x = np.ascontiguousarray(x, dtype=dtype)
    # In chunks: a whole-array isfinite would need a boolean copy of a possibly huge data set.
    per_chunk = max(1, (1 << 24) // max(1, x[0].size))
    for start in range(0, len(x), per_chunk):
        chunk = x[start:start + per_chunk].reshape(-1, x[0].size)
        finite = np.isfinite(chunk).all(axis=1)
        if not finite.all():
            bad = start + np.flatnonzero(~finite)
            raise ValueError(f"{what} contains NaN or infinite values, first in sample {int(bad[0])} "
                             f"(index {int(bad[0])})")
    return x


def check_labels(y: Any, n: int, classes: int, what: str = "y") -> np.ndarray:
    """``y`` as int64 class indices of shape (n,), each in [0, classes)."""
    if not isinstance(y, np.ndarray):
        if type(y).__module__.split(".")[0] == "cupy":
            y = y.get()
        else:
            y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == classes and y.shape[0] == n:
        raise ValueError(f"{what} looks one-hot encoded {_shape_text(y.shape)}; pass class indices, "
                         f"e.g. {what}.argmax(axis=1)")
    if y.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array of class indices, got shape {_shape_text(y.shape)}")
    if len(y) != n:
        raise ValueError(f"{what} has {len(y)} labels for {n} samples")
    if y.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integer class indices, got dtype {y.dtype} "
                        f"(convert with {what}.astype(np.int64))")
    if n and (y.min() < 0 or y.max() >= classes):
        bad = np.flatnonzero((y < 0) | (y >= classes))
        raise ValueError(f"{what} must lie in [0, {classes}) for a model with {classes} classes; "
                         f"{len(bad)} label(s) do not, first {what}[{int(bad[0])}] = {int(y[bad[0]])}")
    return y.astype(np.int64, copy=False)


def check_weights(weights: Any, n: int, dtype: np.dtype, what: str = "weights") -> np.ndarray:
    """Per-sample weights of shape (n,), finite and >= 0."""
    w = np.asarray(weights)
    if w.dtype.kind not in "fiub":
        raise TypeError(f"{what} must be numbers, got dtype {w.dtype}")
    if w.shape != (n,):
        raise ValueError(f"{what} must have shape ({n},), one per sample, got {_shape_text(w.shape)}")
    w = w.astype(dtype)
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"{what} must be finite and >= 0")
    return w


def check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return int(batch_size)
