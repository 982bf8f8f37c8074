"""Sequential: a stack of layers trained with softmax cross-entropy.

The model is built for one batch size (``build``): every layer allocates its buffers and kernel
problems for it, and the backend is told all the problems up front (``Backend.prepare``), so a
GPU backend can pick and compile its kernels before the first step. Every step then runs at
exactly that batch size: a short last batch is padded with zero images whose weight is 0, so
they count for nothing in the loss, the gradients and the metrics.

Asking for another batch size (``build(n)``, ``fit(batch_size=n)``, ``evaluate(..., n)``)
rebuilds the buffers and problems; parameters, their gradients and the optimizer state stay.
The first build moves every parameter into one flat buffer and every gradient into another (a
ParameterArena), so an optimizer updates the whole model in one pass.

On a backend that can capture CUDA graphs (cuda), the device work of a training step (forward,
loss, backward, update) is captured once, at the second step after a build or an optimizer
change, and replayed from then on: one launch per step instead of dozens, with the host doing
only the staging of the batch and the optimizer's bookkeeping. ``use_graphs = False`` runs every
step kernel by kernel instead (the results are the same).

A training step never waits for a GPU: loss and accuracy stay on the device as 0-d arrays
(``StepResult`` reads them when asked), ``fit`` keeps its data on the device when it fits there
and gathers each batch on the device, and reads its metrics only when the progress bar is
refreshed and at the end of an epoch. Device arrays given to ``train_step``, ``evaluate`` and
``predict`` are used as they are, without the host checks that host arrays get.
"""
from __future__ import annotations

import collections
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from autocnn.nn.arena import ParameterArena
from autocnn.nn.backend import Array, Backend, CapturedStep, KernelDispatch, KernelProblem, get_backend
from autocnn.nn.layers import Dense, Layer
from autocnn.nn.losses import Accuracy, SoftmaxCrossEntropy, softmax
from autocnn.nn.optim import Adam, Optimizer, get_optimizer
from autocnn.nn.validation import check_batch_size, check_images, check_labels, check_weights

DEFAULT_BATCH_SIZE = 32
FILE_FORMAT = "autocnn.nn.Sequential/1"
# fit keeps its data on a GPU when it takes at most this share of the free device memory.
DEVICE_DATA_FRACTION = 0.25
# fit reads the running metrics from the device (a wait) every this many batches, with verbose.
PROGRESS_EVERY = 20


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


def _metric_views(metrics: Array, dtype: Any) -> tuple[Array, Array]:
    """0-d views of a float64 pair: the loss (in the model's dtype, at the first element's bytes)
    and the accuracy (the second element)."""
    return metrics[0:1].view(dtype)[0, ...], metrics[1, ...]


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


class Sequential:
    """Layers applied in order; the last one must output one score per class (logits).

    ``backend``: "numpy", "cuda" or a Backend instance. ``dtype``: float32 by default (float64 on
    the numpy backend for gradient checks). ``seed`` makes the initial weights and the shuffling
    reproducible.
    """

    def __init__(self, layers: Sequence[Layer], input_shape: Sequence[int], backend: str | Backend = "numpy",
                 seed: int | None = None, dtype: Any = None) -> None:
        layers = list(layers)
        if not layers:
            raise ValueError("Sequential needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"layer {i} is {layer!r}, not an autocnn.nn Layer")
            if layer._model is not None or layers.index(layer) != i:
                raise ValueError(f"layer {i} ({layer!r}) already belongs to a model: create a new layer "
                                 f"(layers own their buffers)")
        try:
            self.input_shape = tuple(int(s) for s in input_shape)
        except (TypeError, ValueError):
            raise ValueError(f"input_shape must be a tuple of positive integers, got {input_shape!r}") from None
        if not self.input_shape or any(s < 1 for s in self.input_shape):
            raise ValueError(f"input_shape must be a tuple of positive integers, got {input_shape!r}")
        self.layers = layers
        self.backend: Backend = get_backend(backend, dtype=dtype)
        self.dtype = self.backend.dtype
        self.seed = seed
        init_seed, shuffle_seed = np.random.SeedSequence(seed).spawn(2)
        self._init_rng = np.random.default_rng(init_seed)
        self._shuffle_rng = np.random.default_rng(shuffle_seed)

        self._name_layers()
        # A layer needs dL/dx only if some layer before it has parameters to train.
        trainable_before = False
        for layer in layers:
            layer.needs_input_grad = trainable_before
            trainable_before = trainable_before or layer.trainable
        self.layer_output_shapes = self._infer_shapes()
        self.output_shape = self.layer_output_shapes[-1]
        if len(self.output_shape) != 1:
            raise ValueError(f"the last layer must output one score per class, shape (classes,); "
                             f"{layers[-1].describe()} outputs {self.output_shape}: end the model with "
                             f"Flatten() and Dense(features, classes)")
        self.num_classes = self.output_shape[0]
        for layer in layers:
            layer._model = self
        self.loss = SoftmaxCrossEntropy()
        self.metric = Accuracy()
        self._weights_n: int | None = None  # the weight buffer holds n ones, then zeros (None: other)
        self.optimizer: Optimizer | None = None
        self.batch_size: int | None = None
        self.dispatch: list[KernelDispatch] = []
        self._pending_params: dict[int, dict[str, np.ndarray]] = {}
        self._arena: ParameterArena | None = None
        # Whether training steps are captured and replayed as CUDA graphs where the backend can.
        self.use_graphs = True
        self._build_count = 0
        self._graph: CapturedStep | None = None
        self._graph_key: tuple[Any, ...] | None = None
        self._eager_key: tuple[Any, ...] | None = None  # the last key that ran an eager (warm-up) step
        self._ready_key: tuple[Any, ...] | None = None  # the last key _ready_optimizer checked

    # -- description ---------------------------------------------------------------------------
    def _name_layers(self) -> None:
        counts: collections.Counter[str] = collections.Counter()
        for layer in self.layers:
            kind = type(layer).__name__.lower()
            counts[kind] += 1
            if layer.name is None:
                layer.name = f"{kind}_{counts[kind]}"
        names = [layer.name for layer in self.layers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"layer names must be unique; repeated: {', '.join(map(str, duplicates))}")

    def _infer_shapes(self) -> list[tuple[int, ...]]:
        shapes = []
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.compute_output_shape(shape)
            shapes.append(shape)
        return shapes

    def __repr__(self) -> str:
        return (f"Sequential({len(self.layers)} layers, input {self.input_shape}, {self.num_classes} classes, "
                f"backend={self.backend.name}, dtype={self.dtype.name})")

    def summary(self) -> str:
        """A table of the layers: name, configuration, output shape and parameter count."""
        rows = [("layer", "configuration", "output", "params")]
        total = 0
        for layer, shape in zip(self.layers, self.layer_output_shapes):
            count = sum(int(np.prod(s)) for s in layer.param_shapes().values())
            total += count
            rows.append((str(layer.name), repr(layer), "x".join(map(str, shape)), f"{count:,}"))
        text = _table(rows)
        return f"{text}\ninput {'x'.join(map(str, self.input_shape))}, {total:,} parameters"

    @property
    def built(self) -> bool:
        return self.batch_size is not None

    # -- building ------------------------------------------------------------------------------
    def build(self, batch_size: int, verbose: bool = False) -> "Sequential":
        """Allocate every buffer for ``batch_size`` and let the backend prepare every kernel problem.

        ``verbose`` prints the dispatch report (which kernel runs each layer's operations).
        """
        batch_size = check_batch_size(batch_size)
        if self.batch_size == batch_size:
            if verbose:
                print(self.dispatch_report())
            return self
        self.batch_size = None  # until the rebuild has finished: a failed one leaves the model unbuilt
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.build(shape, batch_size, self.backend, self._init_rng)
        be = self.backend
        if self._arena is None:
            self._arena = ParameterArena.gather(self.layers, be)
        self._apply_pending_params()
        self._x_buf = be.zeros((batch_size, *self.input_shape))
        self._labels_buf = be.zeros((batch_size,), dtype=np.int64)
        self._weights_buf = be.zeros((batch_size,))
        self._weights_n = None
        self._dlogits = be.zeros((batch_size, self.num_classes))
        # Where every training step leaves its loss and accuracy (a graphed step writes only here).
        # Both in one 16-byte buffer (loss as the first float32, accuracy as the second float64),
        # so that a StepResult takes its values with a single copy.
        self._step_metrics = be.zeros((2,), dtype=np.float64)
        self._step_loss, self._step_acc = _metric_views(self._step_metrics, self.dtype)
        self._graph = None  # captured on the buffers just replaced
        self._build_count += 1
        problems = self._collect_problems(layer.problems() for layer in self.layers)
        dispatch = list(be.prepare(problems))
        if len(dispatch) != len(problems) or not all(isinstance(d, KernelDispatch) for d in dispatch):
            raise TypeError(f"{be!r}.prepare must return one KernelDispatch per problem "
                            f"({len(problems)}), got {len(dispatch)} items")
        self.dispatch = dispatch
        self.batch_size = batch_size
        if verbose:
            print(self.dispatch_report())
        return self

    @staticmethod
    def _collect_problems(per_layer: Iterator[list[KernelProblem]]) -> list[KernelProblem]:
        seen: dict[KernelProblem, None] = {}
        for problems in per_layer:
            for p in problems:
                seen.setdefault(p, None)
        return list(seen)

    def problems(self, batch_size: int | None = None) -> list[KernelProblem]:
        """Every kernel problem of a training step at ``batch_size`` (default: the built one), deduplicated."""
        if batch_size is None:
            self._require_built()
            return self._collect_problems(layer.problems() for layer in self.layers)
        batch_size = check_batch_size(batch_size)
        inputs = [self.input_shape, *self.layer_output_shapes[:-1]]
        return self._collect_problems(layer.make_problems(shape, batch_size)
                                      for layer, shape in zip(self.layers, inputs))

    def tune(self, batch_size: int, trials: int = 200, timeout_s: float | None = None, device: int = 0,
             storage: str | None = None, sampler: str = "tpe", progress: bool = True) -> list[Any]:
        """Tune every kernel this model runs at ``batch_size`` on a GPU and keep the winners.

        ``trials`` is the budget for the whole model, spent where the model spends its time. The
        winners go to the tuning database; a model built on the cuda backend picks them up at once.
        Returns one ``autocnn.tuning.tuner.TuneOutcome`` per kernel problem.
        """
        from autocnn.store.database import TuningDatabase
        from autocnn.tuning.sources import GpuSource
        from autocnn.tuning.tuner import TuneSettings, Tuner, tune_problems

        problems = self.problems(batch_size)
        source = GpuSource(device)
        try:
            tuner = Tuner(source, TuningDatabase(), TuneSettings(trials=max(1, trials), sampler=sampler,
                                                                 storage=storage), progress=progress)
            outcomes = tune_problems(tuner, problems, trials, timeout_s=timeout_s)
        finally:
            source.close()
        if self.backend.name == "cuda" and self.batch_size is not None:
            # Forget the kernels chosen before tuning, then build again so the winners are used.
            reset = getattr(self.backend, "forget", None)
            if reset is not None:
                reset(problems)
            size, self.batch_size = self.batch_size, None
            self.build(size)
        return outcomes

    def dispatch_report(self) -> str:
        """Which implementation runs each kernel of each layer, as a table (Dense layers too)."""
        self._require_built()
        by_problem = {d.problem: d for d in self.dispatch}
        rows = [("layer", "op", "shape", "kernel", "detail")]
        for i, layer in enumerate(self.layers):
            for p in layer.problems():
                d = by_problem[p]
                rows.append((str(layer.name), p.op, p.shape_string(), d.source, d.detail))
            if isinstance(layer, Dense):
                head = i == len(self.layers) - 1 and layer.can_end_with_loss
                source, detail = self.backend.dense_dispatch(layer.in_features, layer.out_features, head)
                shape = f"N={self.batch_size},in={layer.in_features},out={layer.out_features}"
                rows.append((str(layer.name), "dense+loss" if head else "dense", shape, source, detail))
        title = f"kernels on the {self.backend.name} backend at batch size {self.batch_size}"
        if not self.dispatch:
            title += " (no convolution or pooling layers)"
        if len(rows) == 1:
            return title
        return title + ":\n" + _table(rows)

    def _require_built(self) -> int:
        if self.batch_size is None:
            raise RuntimeError("the model is not built: call build(batch_size) or fit(...) first")
        return self.batch_size

    # -- parameters ----------------------------------------------------------------------------
    def params(self) -> dict[str, Array]:
        """Every parameter by qualified name ("conv2d_1.weight"), as backend arrays (live, not copies)."""
        return {f"{layer.name}.{k}": v for layer in self.layers for k, v in layer.params().items()}

    def grads(self) -> dict[str, Array]:
        return {f"{layer.name}.{k}": v for layer in self.layers for k, v in layer.grads().items()}

    def get_weights(self) -> dict[str, np.ndarray]:
        """Host copies of every parameter."""
        self._require_built()
        return {k: self.backend.to_numpy(v).copy() for k, v in self.params().items()}

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

    # -- where the data lives ------------------------------------------------------------------
    def _device_array(self, a: Any) -> bool:
        """Whether ``a`` is an array on the backend's device (a CuPy array on the cuda backend).

        Never true on the numpy backend, whose arrays are host arrays and get validated; tests
        patch this method to send numpy arrays down the device-array path.
        """
        xp = self.backend.xp
        return xp is not np and isinstance(a, xp.ndarray)

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

    # -- computation ---------------------------------------------------------------------------
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

    def _forward(self, upto: int | None = None) -> Array:
        """The staged batch through the layers before index ``upto`` (all by default)."""
        out = self._x_buf
        for layer in self.layers[:upto]:
            out = layer.forward(out)
        return out

    def _backward(self, grad: Array | None, below: int | None = None) -> None:
        """Backward through the layers before index ``below`` (all by default), from ``grad``."""
        for layer in reversed(self.layers[:below]):
            if grad is None or (not layer.trainable and not layer.needs_input_grad):
                break  # nothing (further) before it has parameters
            grad = layer.backward(grad)
        # Weight gradients may have run beside the backward pass: every one is done after this.
        self.backend.join_parameter_gradients()

    def _forward_backward(self, loss_out: Array | None = None, acc_out: Array | None = None) -> tuple[Array, Array]:
        """Forward and backward on the staged batch: fills every layer's grads().

        Returns (loss, accuracy) as 0-d device arrays (written into ``loss_out``/``acc_out`` when
        given, else new ones) without waiting for the device.
        """
        be = self.backend
        loss = be.zeros(()) if loss_out is None else loss_out
        acc = be.zeros((), dtype=np.float64) if acc_out is None else acc_out
        if self._arena is not None:
            be.zero_gradients(self._arena.grads)
        head = self.layers[-1]
        if isinstance(head, Dense) and head.can_end_with_loss:
            # The last layer, the loss and its backward in one call (one fused kernel on a GPU).
            features = self._forward(upto=-1)
            be.gradients_ready()
            grad = head.loss_step(features, self._labels_buf, self._weights_buf, self.loss, self.metric, loss, acc,
                                  self._dlogits)
            self._backward(grad, below=len(self.layers) - 1)
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
        step buffers. Nothing here may wait for the device or allocate what outlives the step:
        this is what a CUDA graph captures."""
        self._forward_backward(self._step_loss, self._step_acc)
        optimizer.apply(self.params(), self.grads())

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
        loss, acc = _metric_views(be.copy(self._step_metrics), self.dtype)
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

    def input_buffers(self) -> tuple[Array, Array]:
        """The device arrays a training step reads its batch from: inputs (batch, *input_shape)
        and int64 labels (batch,), for the built batch size.

        A loop that writes each batch straight into them and passes them to ``train_step`` (or
        ``train_step_async``) saves the staging copies: the step reads the batch where it lies,
        like the static inputs of a CUDA graph. As with any device batch, nothing is checked.
        """
        self._require_built()
        return self._x_buf, self._labels_buf

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
        return float(self._gradients(xb, yb, w)[0])

    def _check_batch(self, xb: Any, yb: Any, weights: Any) -> tuple[Array, Array, np.ndarray | None]:
        xb = self._images(xb, "xb")
        yb = self._labels(yb, len(xb), "yb")
        w = None if weights is None else check_weights(_host(weights), len(xb), self.dtype)
        return xb, yb, w

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

    # -- persistence ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write every parameter to a .npz file at exactly ``path``; returns the path."""
        if not self.built and not self._pending_params:
            raise RuntimeError("the model has no parameters yet: call build(batch_size) or fit(...) first")
        arrays: dict[str, np.ndarray] = {
            "__format__": np.array(FILE_FORMAT),
            "__layers__": np.array([type(layer).__name__ for layer in self.layers]),
        }
        for i, layer in enumerate(self.layers):
            values = ({k: self.backend.to_numpy(v) for k, v in layer.params().items()} if self.built
                      else self._pending_params.get(i, {}))
            for name, value in values.items():
                arrays[f"layers/{i}/{name}"] = np.asarray(value)
        path = Path(path)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        return path

    def load(self, path: str | Path) -> "Sequential":
        """Read parameters written by ``save``; every shape must match this model's."""
        path = Path(path)
        try:
            archive = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise FileNotFoundError(f"no model file at {path}") from None
        except (ValueError, OSError) as exc:
            raise ValueError(f"{path} is not an autocnn model file (.npz): {exc}") from None
        with archive:
            data = {k: archive[k] for k in archive.files}
        if "__format__" not in data or str(data["__format__"]) != FILE_FORMAT:
            raise ValueError(f"{path} is not an autocnn model file (no {FILE_FORMAT!r} marker)")
        file_layers = [str(s) for s in data["__layers__"]]
        model_layers = [type(layer).__name__ for layer in self.layers]
        if len(file_layers) != len(model_layers):
            raise ValueError(f"{path} holds {len(file_layers)} layers ({', '.join(file_layers)}), the model has "
                             f"{len(model_layers)} ({', '.join(model_layers)})")
        for i, (got, want) in enumerate(zip(file_layers, model_layers)):
            if got != want:
                raise ValueError(f"{path}: layer {i} is a {got} in the file but a {want} "
                                 f"('{self.layers[i].name}') in the model")
        loaded: dict[int, dict[str, np.ndarray]] = {}
        for i, layer in enumerate(self.layers):
            expected = layer.param_shapes()
            prefix = f"layers/{i}/"
            in_file = {k[len(prefix):]: v for k, v in data.items() if k.startswith(prefix)}
            missing = sorted(set(expected) - set(in_file))
            extra = sorted(set(in_file) - set(expected))
            if missing or extra:
                raise ValueError(f"{path}: layer {i} ('{layer.name}') has parameters {sorted(in_file)} in the "
                                 f"file, the model expects {sorted(expected)}")
            for name, shape in expected.items():
                value = in_file[name]
                qualified = f"{layer.name}.{name}"
                if value.dtype.kind != "f":
                    raise ValueError(f"{path}: parameter {qualified!r} has dtype {value.dtype}, not a float")
                if tuple(value.shape) != tuple(shape):
                    raise ValueError(f"{path}: parameter {qualified!r} has shape {tuple(value.shape)} in the "
                                     f"file, the model expects {tuple(shape)}")
                if not np.isfinite(value).all():
                    raise ValueError(f"{path}: parameter {qualified!r} contains NaN or infinite values")
            loaded[i] = {name: in_file[name].astype(self.dtype) for name in expected}
        self._pending_params = loaded
        if self.built:
            self._apply_pending_params()
        return self

    def _apply_pending_params(self) -> None:
        # Copy into the existing arrays, so the optimizer's and the layers' references stay valid.
        for i, values in self._pending_params.items():
            params = self.layers[i].params()
            for name, value in values.items():
                self.backend.upload(value, params[name])
        self._pending_params = {}


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
