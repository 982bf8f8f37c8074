"""The loops over a data set of a Sequential model: fit (with History and a progress bar),
evaluate and predict; and what they accept as input (host arrays are checked, device arrays used
as they are).

``fit`` keeps its data on the device when it fits there and gathers each batch on the device,
and reads its metrics only when the progress bar is refreshed and at the end of an epoch. Device
arrays given to ``train_step``, ``evaluate`` and ``predict`` are used as they are, without the host
checks that host arrays get.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from autocnn.nn.backend import Array, Backend
from autocnn.nn.losses import softmax
from autocnn.nn.optim import Adam, Optimizer, get_optimizer
from autocnn.nn.validation import check_batch_size, check_images, check_labels, check_weights

DEFAULT_BATCH_SIZE = 32
# fit keeps its data on a GPU when it takes at most this share of the free device memory.
DEVICE_DATA_FRACTION = 0.25
# fit reads the running metrics from the device (a wait) every this many batches, with verbose.
PROGRESS_EVERY = 20


class _Totals:
    """Running sums of an epoch (or an evaluation) over batches of the given sizes.

    The per-batch loss and accuracy sit in device arrays (one slot per batch); ``read`` copies the
    slots not read yet to the host, which waits for the device to get that far.
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = sizes
        self.done = 0
        self.loss_sum = self.correct_sum = self.seen = 0.0

    def read(self, backend: Backend, losses: Array, accs: Array, upto: int) -> None:
        if upto <= self.done:
            return
        loss_values = backend.to_numpy(losses[self.done:upto])
        acc_values = backend.to_numpy(accs[self.done:upto])
        for i in range(upto - self.done):
            samples = float(self.sizes[self.done + i])
            self.loss_sum += float(loss_values[i]) * samples
            self.correct_sum += float(acc_values[i]) * samples
            self.seen += samples
        self.done = upto

    @property
    def loss(self) -> float:
        return self.loss_sum / self.seen

    @property
    def accuracy(self) -> float:
        return self.correct_sum / self.seen

    def text(self) -> str:
        return f"loss={self.loss:.4f} acc={self.accuracy:.4f}"


def _host(a: Any) -> Any:
    # A CuPy array's host copy (numpy refuses to convert one implicitly); anything else as it is.
    return a.get() if type(a).__module__.split(".")[0] == "cupy" else a


@dataclass
class History:
    """Per-epoch metrics of ``fit``; validation entries are None without validation data.

    ``loss`` and ``accuracy`` are the running means over the epoch's training batches (as the
    progress bar shows them); ``seconds`` is the epoch's training time, validation excluded.
    """

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    val_loss: list[float | None] = field(default_factory=list)
    val_accuracy: list[float | None] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    @property
    def epochs(self) -> int:
        return len(self.loss)

    def append(self, loss: float, accuracy: float, val_loss: float | None, val_accuracy: float | None,
               seconds: float) -> None:
        self.loss.append(loss)
        self.accuracy.append(accuracy)
        self.val_loss.append(val_loss)
        self.val_accuracy.append(val_accuracy)
        self.seconds.append(seconds)

    def to_dict(self) -> dict[str, list[Any]]:
        return asdict(self)


class FitLoop:
    """Sequential's fit, evaluate and predict (mixed into ``autocnn.nn.model.Sequential``; the
    batches go through its staging and training step)."""

    # -- what the loops and train_step accept: device arrays as they are, host arrays checked ------
    def _device_images(self, x: Any) -> bool:
        # A device array the model stages as it is: its dtype, its per-sample shape, not empty.
        return (self._device_array(x) and x.dtype == self.dtype and x.ndim == len(self.input_shape) + 1
                and tuple(x.shape[1:]) == self.input_shape and x.shape[0] > 0)

    def _device_labels(self, y: Any, n: int) -> bool:
        return self._device_array(y) and y.ndim == 1 and y.shape[0] == n and np.dtype(y.dtype).kind in "iu"

    def _images(self, x: Any, what: str) -> Array:
        """``x`` as it is when it is a device array of the model's dtype and input shape (unchecked:
        device-resident inputs are the caller's responsibility), else validated on the host."""
        return x if self._device_images(x) else check_images(x, self.input_shape, self.dtype, what)

    def _labels(self, y: Any, n: int, what: str) -> Array:
        """``y`` as it is when it is a device array of n integer labels (unchecked), else validated."""
        return y if self._device_labels(y, n) else check_labels(y, n, self.num_classes, what)

    def _device_data_fits(self, nbytes: int) -> bool:
        """Whether fit keeps a data set of ``nbytes`` on the device (``fit(device_data=None)``).

        Never on the numpy backend (its data already is in the memory it computes from); on a GPU
        when the data takes at most DEVICE_DATA_FRACTION of the free device memory, counting the
        memory that CuPy's pool holds unused as free.
        """
        xp = self.backend.xp
        if xp is np:
            return False
        try:
            free, _total = xp.cuda.runtime.memGetInfo()
            free += xp.get_default_memory_pool().free_bytes()
        except (AttributeError, RuntimeError, OSError):
            return False
        return nbytes <= DEVICE_DATA_FRACTION * free

    def _check_batch(self, xb: Any, yb: Any, weights: Any) -> tuple[Array, Array, np.ndarray | None]:
        xb = self._images(xb, "xb")
        yb = self._labels(yb, len(xb), "yb")
        w = None if weights is None else check_weights(_host(weights), len(xb), self.dtype)
        return xb, yb, w

    # -- the loops ---------------------------------------------------------------------------------
    def _batches(self, n: int, batch_size: int, order: Array | None = None) -> Iterator[slice | Array]:
        for start in range(0, n, batch_size):
            yield slice(start, start + batch_size) if order is None else order[start:start + batch_size]

    def fit(self, x: Any, y: Any, epochs: int = 1, batch_size: int = DEFAULT_BATCH_SIZE,
            optimizer: str | Optimizer | None = None, validation_data: tuple[Any, Any] | None = None,
            shuffle: bool = True, verbose: bool = True, device_data: bool | None = None,
            lr_schedule: str | None = None) -> History:
        """Train for ``epochs`` passes over (x, y); returns the per-epoch History.

        ``lr_schedule``: None keeps the optimizer's learning rate; "cosine" anneals it over the
        epochs from its value at the start of fit to zero (half a cosine, set at each epoch start).

        ``optimizer``: a name ("adam", "sgd", "rprop") or an Optimizer; None keeps the compiled
        one (Adam when there is none). ``validation_data``: (x_val, y_val), evaluated after
        every epoch.

        The data is validated once, up front. ``device_data``: True keeps it on the device for
        the whole fit (uploaded once; each batch gathered there by the epoch's shuffled indices,
        uploaded once per epoch), False uploads every batch from the host, None (default) keeps
        it on a GPU when training and validation data take at most DEVICE_DATA_FRACTION of the
        free device memory, never on the numpy backend. The results are the same either way. The
        metrics stay on the device and are read when the progress bar is refreshed (every
        PROGRESS_EVERY batches, with verbose) and at the end of each epoch.
        """
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
            raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
        if lr_schedule not in (None, "none", "cosine"):
            raise ValueError(f"lr_schedule must be None, 'none' or 'cosine', got {lr_schedule!r}")
        if device_data is not None and not isinstance(device_data, bool):
            raise ValueError(f"device_data must be True, False or None, got {device_data!r}")
        x = check_images(x, self.input_shape, self.dtype, "x")
        y = check_labels(y, len(x), self.num_classes, "y")
        val = None
        if validation_data is not None:
            if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
                raise ValueError("validation_data must be a pair (x_val, y_val)")
            vx = check_images(validation_data[0], self.input_shape, self.dtype, "x_val")
            val = (vx, check_labels(validation_data[1], len(vx), self.num_classes, "y_val"))
        self.build(check_batch_size(batch_size))
        if optimizer is not None:
            self.optimizer = get_optimizer(optimizer)
        elif self.optimizer is None:
            self.optimizer = Adam()

        be = self.backend
        if device_data is None:
            nbytes = x.nbytes + y.nbytes + (val[0].nbytes + val[1].nbytes if val is not None else 0)
            device_data = self._device_data_fits(nbytes)
        if device_data:
            # One upload per fit; from here on the data is only read on the device.
            x, y = be.asarray(x), be.asarray(y, dtype=np.int64)
            if val is not None:
                val = (be.asarray(val[0]), be.asarray(val[1], dtype=np.int64))

        opt = self._ready_optimizer()
        if lr_schedule == "cosine" and not hasattr(opt, "lr"):
            raise ValueError(f"{type(opt).__name__} has no learning rate to schedule (RPROP adapts its own steps)")
        base_lr = getattr(opt, "lr", None)
        history = History()
        n = len(x)
        bs: int = self.batch_size  # type: ignore[assignment]
        sizes = [min(bs, n - start) for start in range(0, n, bs)]
        n_batches = len(sizes)
        # One slot per batch: each step writes its loss and accuracy there, on the device.
        losses = be.zeros((n_batches,))
        accs = be.zeros((n_batches,), dtype=np.float64)
        for epoch in range(1, int(epochs) + 1):
            if lr_schedule == "cosine":
                opt.lr = base_lr * 0.5 * (1.0 + math.cos(math.pi * (epoch - 1) / epochs))
            start = time.perf_counter()
            order = self._shuffle_rng.permutation(n) if shuffle else None
            if device_data and order is not None:
                order = be.asarray(order, dtype=np.int64)  # one upload per epoch
            totals = _Totals(sizes)
            with tqdm(total=n_batches, desc=f"epoch {epoch}/{epochs}", unit="batch", disable=not verbose,
                      leave=True, dynamic_ncols=True) as bar:
                for i, rows in enumerate(self._batches(n, bs, order)):
                    if device_data:
                        self._stage_rows(x, y, rows)
                    else:
                        self._stage(x[rows], y[rows], None)
                    self._run_step(opt)
                    be.copy_into(losses[i, ...], self._step_loss)
                    be.copy_into(accs[i, ...], self._step_acc)
                    if verbose and ((i + 1) % PROGRESS_EVERY == 0 or i + 1 == n_batches):
                        totals.read(be, losses, accs, i + 1)  # waits for the device to get here
                        bar.set_postfix_str(totals.text(), refresh=False)
                    bar.update(1)
                totals.read(be, losses, accs, n_batches)
                be.synchronize()
                seconds = time.perf_counter() - start
                val_loss = val_acc = None
                if val is not None:
                    val_loss, val_acc = self._evaluate(*val)
                    bar.set_postfix_str(f"{totals.text()} val_loss={val_loss:.4f} val_acc={val_acc:.4f}")
            history.append(totals.loss, totals.accuracy, val_loss, val_acc, seconds)
        return history

    def _inference_batch_size(self, batch_size: int | None) -> None:
        if batch_size is not None:
            self.build(check_batch_size(batch_size))
        elif not self.built:
            self.build(DEFAULT_BATCH_SIZE)

    def _evaluate(self, x: Array, y: Array) -> tuple[float, float]:
        be = self.backend
        bs: int = self.batch_size  # type: ignore[assignment]
        sizes = [min(bs, len(x) - start) for start in range(0, len(x), bs)]
        losses = be.zeros((len(sizes),))
        accs = be.zeros((len(sizes),), dtype=np.float64)
        for i, idx in enumerate(self._batches(len(x), bs)):
            self._stage(x[idx], y[idx], None)
            # The gradient goes to the training buffer, unused here: one fused pass on a GPU.
            self.loss.loss_grad_accuracy(self._forward(), self._labels_buf, self._weights_buf,
                                         grad_out=self._dlogits, loss_out=losses[i, ...], acc_out=accs[i, ...],
                                         metric=self.metric)
        totals = _Totals(sizes)
        totals.read(be, losses, accs, len(sizes))  # the one wait for the device
        return totals.loss, totals.accuracy

    def evaluate(self, x: Any, y: Any, batch_size: int | None = None) -> tuple[float, float]:
        """(mean loss, accuracy) over (x, y); batch_size defaults to the built one.

        Device arrays of the model's dtype and input shape (and device labels) are used as they
        are, unchecked, like in ``train_step``.
        """
        x = self._images(x, "x")
        y = self._labels(y, len(x), "y")
        self._inference_batch_size(batch_size)
        return self._evaluate(x, y)

    def predict(self, x: Any, batch_size: int | None = None) -> np.ndarray:
        """Class probabilities, shape (n, classes), as a host array.

        A device array of the model's dtype and input shape is used as it is, unchecked.
        """
        x = self._images(x, "x")
        self._inference_batch_size(batch_size)
        out = self.backend.zeros((len(x), self.num_classes))
        for idx in self._batches(len(x), self.batch_size):  # type: ignore[arg-type]
            n = self._stage(x[idx], None, None)
            out[idx] = softmax(self._forward()[:n])
        return self.backend.to_numpy(out)
