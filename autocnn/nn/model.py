"""Sequential: a stack of layers trained with softmax cross-entropy.

The model is built for one batch size (``build``): every layer allocates its buffers and kernel
problems for it, and the backend is told all the problems up front (``Backend.prepare``), so a
GPU backend can pick and compile its kernels before the first step. Every step then runs at
exactly that batch size: a short last batch is padded with zero images whose weight is 0, so
they count for nothing in the loss, the gradients and the metrics.

Asking for another batch size (``build(n)``, ``fit(batch_size=n)``, ``evaluate(..., n)``)
rebuilds the buffers and problems; parameters, their gradients and the optimizer state stay.
"""
from __future__ import annotations

import collections
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from .backend import Array, Backend, KernelDispatch, KernelProblem, get_backend
from .layers import Layer
from .losses import SoftmaxCrossEntropy, accuracy, softmax
from .optim import Adam, Optimizer, get_optimizer
from .validation import check_batch_size, check_images, check_labels, check_weights

DEFAULT_BATCH_SIZE = 32
FILE_FORMAT = "autocnn.nn.Sequential/1"


@dataclass(frozen=True)
class StepResult:
    """One training step: the batch's loss and accuracy, over ``samples`` (the sum of the weights)."""

    loss: float
    accuracy: float
    samples: float


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
        self.optimizer: Optimizer | None = None
        self.batch_size: int | None = None
        self.dispatch: list[KernelDispatch] = []
        self._pending_params: dict[int, dict[str, np.ndarray]] = {}

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
        self._apply_pending_params()
        be = self.backend
        self._x_buf = be.zeros((batch_size, *self.input_shape))
        self._labels_buf = be.zeros((batch_size,), dtype=np.int64)
        self._weights_buf = be.zeros((batch_size,))
        self._dlogits = be.zeros((batch_size, self.num_classes))
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
        Returns one ``autocnn.tuner.TuneOutcome`` per kernel problem.
        """
        from ..db import TuningDatabase
        from ..sources import GpuSource
        from ..tuner import TuneSettings, Tuner, tune_problems

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
        """Which implementation runs each kernel of each layer, as a table."""
        self._require_built()
        by_problem = {d.problem: d for d in self.dispatch}
        rows = [("layer", "op", "shape", "kernel", "detail")]
        for layer in self.layers:
            for p in layer.problems():
                d = by_problem[p]
                rows.append((str(layer.name), p.op, p.shape_string(), d.source, d.detail))
        head = f"kernels on the {self.backend.name} backend at batch size {self.batch_size}:"
        if len(rows) == 1:
            return head + " (no convolution or pooling layers)"
        return head + "\n" + _table(rows)

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
        params = self.params()
        if not self.optimizer.matches(params):
            self.optimizer.setup(params)
        return self.optimizer

    # -- computation ---------------------------------------------------------------------------
    def _stage(self, xb: np.ndarray, yb: np.ndarray | None, weights: np.ndarray | None) -> int:
        """Copy a (possibly short) batch into the input buffers, zero-padded; returns its size."""
        bs = self._require_built()
        n = len(xb)
        if n > bs:
            raise ValueError(f"a batch of {n} samples does not fit the model built for batch size {bs}")
        be = self.backend
        if n == bs:
            be.upload(xb, self._x_buf)
        else:
            padded = np.zeros((bs, *self.input_shape), dtype=self.dtype)
            padded[:n] = xb
            be.upload(padded, self._x_buf)
        w = np.zeros(bs, dtype=self.dtype)
        w[:n] = 1.0 if weights is None else weights
        be.upload(w, self._weights_buf)
        labels = np.zeros(bs, dtype=np.int64)
        if yb is not None:
            labels[:n] = yb
        be.upload(labels, self._labels_buf)
        return n

    def _forward(self) -> Array:
        out = self._x_buf
        for layer in self.layers:
            out = layer.forward(out)
        return out

    def _backward(self, dlogits: Array) -> None:
        grad: Array | None = dlogits
        for layer in reversed(self.layers):
            if not layer.trainable and not layer.needs_input_grad:
                break  # nothing before it has parameters
            grad = layer.backward(grad)
            if grad is None:
                break

    def _gradients(self, xb: np.ndarray, yb: np.ndarray, weights: np.ndarray | None) -> tuple[float, float]:
        """Forward and backward on one batch: fills every layer's grads(); returns (loss, accuracy)."""
        self._stage(xb, yb, weights)
        logits = self._forward()
        loss, _ = self.loss.loss_and_grad(logits, self._labels_buf, self._weights_buf, out=self._dlogits,
                                          check=False)
        acc = accuracy(logits, self._labels_buf, self._weights_buf)
        self._backward(self._dlogits)
        return loss, acc

    def _train_batch(self, xb: np.ndarray, yb: np.ndarray, weights: np.ndarray | None) -> StepResult:
        optimizer = self._ready_optimizer()
        loss, acc = self._gradients(xb, yb, weights)
        optimizer.step(self.params(), self.grads())
        samples = float(len(xb)) if weights is None else float(np.sum(weights))
        return StepResult(loss=loss, accuracy=acc, samples=samples)

    def train_step(self, xb: Any, yb: Any, weights: Any = None) -> StepResult:
        """One forward, backward and update on a batch of at most the built batch size."""
        self._require_built()
        xb, yb, w = self._check_batch(xb, yb, weights)
        return self._train_batch(xb, yb, w)

    def loss_and_gradients(self, xb: Any, yb: Any, weights: Any = None) -> float:
        """The batch's loss, with every parameter's gradient left in grads(); no update.

        For gradient checks and custom training loops.
        """
        self._require_built()
        xb, yb, w = self._check_batch(xb, yb, weights)
        return self._gradients(xb, yb, w)[0]

    def _check_batch(self, xb: Any, yb: Any, weights: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        xb = check_images(xb, self.input_shape, self.dtype, "xb")
        yb = check_labels(yb, len(xb), self.num_classes, "yb")
        w = None if weights is None else check_weights(weights, len(xb), self.dtype)
        return xb, yb, w

    def _batches(self, n: int, batch_size: int, order: np.ndarray | None = None) -> Iterator[slice | np.ndarray]:
        for start in range(0, n, batch_size):
            yield slice(start, start + batch_size) if order is None else order[start:start + batch_size]

    def fit(self, x: Any, y: Any, epochs: int = 1, batch_size: int = DEFAULT_BATCH_SIZE,
            optimizer: str | Optimizer | None = None, validation_data: tuple[Any, Any] | None = None,
            shuffle: bool = True, verbose: bool = True) -> History:
        """Train for ``epochs`` passes over (x, y); returns the per-epoch History.

        ``optimizer``: a name ("adam", "sgd", "rprop") or an Optimizer; None keeps the compiled
        one (Adam when there is none). ``validation_data``: (x_val, y_val), evaluated after
        every epoch.
        """
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
            raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
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

        history = History()
        n = len(x)
        n_batches = -(-n // self.batch_size)  # type: ignore[operator]
        for epoch in range(1, int(epochs) + 1):
            start = time.perf_counter()
            order = self._shuffle_rng.permutation(n) if shuffle else None
            loss_sum = correct_sum = seen = 0.0
            with tqdm(total=n_batches, desc=f"epoch {epoch}/{epochs}", unit="batch", disable=not verbose,
                      leave=True, dynamic_ncols=True) as bar:
                for idx in self._batches(n, self.batch_size, order):  # type: ignore[arg-type]
                    step = self._train_batch(x[idx], y[idx], None)
                    loss_sum += step.loss * step.samples
                    correct_sum += step.accuracy * step.samples
                    seen += step.samples
                    bar.set_postfix_str(f"loss={loss_sum / seen:.4f} acc={correct_sum / seen:.4f}", refresh=False)
                    bar.update(1)
                self.backend.synchronize()
                seconds = time.perf_counter() - start
                val_loss = val_acc = None
                if val is not None:
                    val_loss, val_acc = self._evaluate(*val)
                    bar.set_postfix_str(f"loss={loss_sum / seen:.4f} acc={correct_sum / seen:.4f} "
                                        f"val_loss={val_loss:.4f} val_acc={val_acc:.4f}")
            history.append(loss_sum / seen, correct_sum / seen, val_loss, val_acc, seconds)
        return history

    def _inference_batch_size(self, batch_size: int | None) -> None:
        if batch_size is not None:
            self.build(check_batch_size(batch_size))
        elif not self.built:
            self.build(DEFAULT_BATCH_SIZE)

    def _evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        loss_sum = correct_sum = 0.0
        for idx in self._batches(len(x), self.batch_size):  # type: ignore[arg-type]
            n = self._stage(x[idx], y[idx], None)
            logits = self._forward()
            loss_sum += self.loss.loss(logits, self._labels_buf, self._weights_buf, check=False) * n
            correct_sum += accuracy(logits, self._labels_buf, self._weights_buf) * n
        return loss_sum / len(x), correct_sum / len(x)

    def evaluate(self, x: Any, y: Any, batch_size: int | None = None) -> tuple[float, float]:
        """(mean loss, accuracy) over (x, y); batch_size defaults to the built one."""
        x = check_images(x, self.input_shape, self.dtype, "x")
        y = check_labels(y, len(x), self.num_classes, "y")
        self._inference_batch_size(batch_size)
        return self._evaluate(x, y)

    def predict(self, x: Any, batch_size: int | None = None) -> np.ndarray:
        """Class probabilities, shape (n, classes), as a host array."""
        x = check_images(x, self.input_shape, self.dtype, "x")
        self._inference_batch_size(batch_size)
        out = np.empty((len(x), self.num_classes), dtype=self.dtype)
        for idx in self._batches(len(x), self.batch_size):  # type: ignore[arg-type]
            n = self._stage(x[idx], None, None)
            out[idx] = self.backend.to_numpy(softmax(self._forward()[:n]))
        return out

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
