"""Staging a batch into a Sequential model's input buffers (images, labels and sample weights).

Every step runs at the built batch size: a short batch is padded with zero images whose weight
is 0, so they count for nothing in the loss, the gradients and the metrics. Host arrays are
uploaded; device arrays are copied (or gathered) on the device.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from autocnn.nn.backend import Array


class BatchStaging:
    """Sequential's input buffers (mixed into ``autocnn.nn.model.Sequential``, which allocates them
    in ``build``)."""

    def _device_array(self, a: Any) -> bool:
        """Whether ``a`` is an array on the backend's device (a CuPy array on the cuda backend).

        Never true on the numpy backend, whose arrays are host arrays and get validated; tests
        patch this method to send numpy arrays down the device-array path.
        """
        xp = self.backend.xp
        return xp is not np and isinstance(a, xp.ndarray)

    def _stage(self, xb: Array, yb: Array | None, weights: np.ndarray | None) -> int:
        """Copy a (possibly short) batch into the input buffers, zero-padded; returns its size.

        Host arrays (validated by the caller) are uploaded; device arrays are copied on the
        device. ``yb`` None leaves the label buffer as it is (predict reads no labels).
        """
        bs = self._require_built()
        n = len(xb)
        if n > bs:
            raise ValueError(f"a batch of {n} samples does not fit the model built for batch size {bs}")
        be = self.backend
        if self._device_array(xb):
            self._copy_rows(self._x_buf, xb, n)
        elif n == bs:
            be.upload(xb, self._x_buf)
        else:
            padded = np.zeros((bs, *self.input_shape), dtype=self.dtype)
            padded[:n] = xb
            be.upload(padded, self._x_buf)
        if yb is not None:
            if self._device_array(yb):
                self._copy_rows(self._labels_buf, yb, n)
            else:
                labels = np.zeros(bs, dtype=np.int64)
                labels[:n] = yb
                be.upload(labels, self._labels_buf)
        self._stage_weights(n, weights)
        return n

    def _copy_rows(self, buf: Array, src: Array, n: int) -> None:
        # Device to device: the first n rows from src, zeros after them.
        xp = self.backend.xp
        if src is buf:
            return   # the batch was written into the input buffer itself (input_buffers)
        if n == len(buf) and src.dtype == buf.dtype and src.shape == buf.shape:
            self.backend.copy_into(buf, src)
        elif n == len(buf):
            xp.copyto(buf, src)
        else:
            xp.copyto(buf[:n], src)
            buf[n:].fill(0)

    def _stage_rows(self, x: Array, y: Array, rows: slice | Array) -> int:
        """Stage rows of device-resident x and y: a slice (copies) or device indices (a gather)."""
        if isinstance(rows, slice):
            return self._stage(x[rows], y[rows], None)
        bs = self._require_built()
        n = len(rows)
        if n > bs:
            raise ValueError(f"a batch of {n} samples does not fit the model built for batch size {bs}")
        xp = self.backend.xp
        if n == bs:
            xp.take(x, rows, axis=0, out=self._x_buf)
            xp.take(y, rows, axis=0, out=self._labels_buf)
        else:
            xp.take(x, rows, axis=0, out=self._x_buf[:n])
            xp.take(y, rows, axis=0, out=self._labels_buf[:n])
            self._x_buf[n:].fill(0)
            self._labels_buf[n:].fill(0)
        self._stage_weights(n, None)
        return n

    def _stage_weights(self, n: int, weights: np.ndarray | None) -> None:
        # Weight 1 for the batch's n samples (or the given weights) and 0 for the padding. The
        # unweighted case is filled on the device, and only when n changes.
        if weights is None:
            if self._weights_n != n:
                self._weights_buf[:n].fill(1)
                if n < len(self._weights_buf):
                    self._weights_buf[n:].fill(0)
                self._weights_n = n
            return
        w = np.zeros(len(self._weights_buf), dtype=self.dtype)
        w[:n] = weights
        self.backend.upload(w, self._weights_buf)
        self._weights_n = None

    def input_buffers(self) -> tuple[Array, Array]:
        """The device arrays a training step reads its batch from: inputs (batch, *input_shape)
        and int64 labels (batch,), for the built batch size.

        A loop that writes each batch straight into them and passes them to ``train_step`` (or
        ``train_step_async``) saves the staging copies: the step reads the batch where it lies,
        like the static inputs of a CUDA graph. As with any device batch, nothing is checked.
        """
        self._require_built()
        return self._x_buf, self._labels_buf
