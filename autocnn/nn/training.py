"""End-to-end training of a network on a data set: what ``autocnn train`` runs.

``train`` loads the data set, fits the images to the network's input (resizing, channels),
trains with the test split as validation data, and returns a TrainingReport with the history,
the test accuracy after every epoch, the wall time and the kernel dispatch table.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from autocnn.nn.backend import Backend
from autocnn.nn.data import ImageDataset, load_cifar10, load_fashion_mnist, load_mnist
from autocnn.nn.fitting import History
from autocnn.nn.layer_base import check_precision
from autocnn.nn.model import Sequential
from autocnn.nn.optim import Optimizer, get_optimizer
from autocnn.nn.zoo import load_network
from autocnn.dispatch.quick import check_autotune


def _fashion(root: str | Path | None) -> ImageDataset:
    return load_fashion_mnist() if root is None else load_fashion_mnist(root)


def _needs_root(name: str, loader: Callable[[Any], ImageDataset]) -> Callable[[str | Path | None], ImageDataset]:
    def load(root: str | Path | None) -> ImageDataset:
        if root is None:
            raise ValueError(f"the {name} data set has no default location: pass data_root=")
        return loader(root)

    return load


DATASETS: dict[str, Callable[[str | Path | None], ImageDataset]] = {
    "fashion-mnist": _fashion,
    "mnist": _needs_root("mnist", load_mnist),
    "cifar10": _needs_root("cifar10", load_cifar10),
}


@dataclass
class TrainingReport:
    """What a training run did and reached."""

    network: str
    dataset: str
    backend: str
    optimizer: str
    epochs: int
    batch_size: int
    train_samples: int
    test_samples: int
    history: History
    test_accuracy: list[float]
    seconds: float
    dispatch_report: str
    precision: str = "fp32"    # the model's; layers that set their own are named in precision_text
    precision_text: str = "fp32"
    model: Sequential | None = field(default=None, repr=False, compare=False)   # the trained model

    @property
    def final_test_accuracy(self) -> float:
        return self.test_accuracy[-1]

    def summary(self) -> str:
        lines = [f"{self.network} on {self.dataset} ({self.train_samples} train / {self.test_samples} test "
                 f"samples), {self.backend} backend, {self.optimizer}, batch {self.batch_size}, "
                 f"precision {self.precision_text}"]
        for e in range(self.history.epochs):
            lines.append(f"  epoch {e + 1}: loss {self.history.loss[e]:.4f}, train acc "
                         f"{self.history.accuracy[e]:.4f}, test loss {self.history.val_loss[e]:.4f}, "
                         f"test acc {self.test_accuracy[e]:.4f} ({self.history.seconds[e]:.1f} s)")
        lines.append(f"final test accuracy {self.final_test_accuracy:.4f} in {self.seconds:.1f} s")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"network": self.network, "dataset": self.dataset, "backend": self.backend,
                "optimizer": self.optimizer, "epochs": self.epochs, "batch_size": self.batch_size,
                "train_samples": self.train_samples, "test_samples": self.test_samples,
                "history": self.history.to_dict(), "test_accuracy": list(self.test_accuracy),
                "seconds": self.seconds, "precision": self.precision, "precision_text": self.precision_text,
                "dispatch_report": self.dispatch_report}


def load_dataset(name: str, root: str | Path | None = None) -> ImageDataset:
    """A data set by name (see DATASETS); ``root`` overrides its default location."""
    if not isinstance(name, str) or name.lower() not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[name.lower()](root)


def train(network: str | Path | Sequential, dataset: str = "fashion-mnist", epochs: int = 10,
          batch_size: int = 64, backend: str | Backend = "numpy", optimizer: str | Optimizer = "adam",
          lr: float | None = None, seed: int | None = None, data_root: str | Path | None = None,
          limit: int | None = None, verbose: bool = True, memory_limit_gib: float = 8.0,
          standardize: bool = True, lr_schedule: str | None = "cosine", precision: str | None = None,
          autotune: str | None = None, separable: Any = None, fuse: bool | None = None) -> TrainingReport:
    """Train ``network`` (a seed network name, a .json file or a Sequential) on ``dataset``.

    ``limit`` keeps the first ``limit`` samples of each split (quick runs). A ``batch_size`` larger
    than the training split is clipped to it, with a warning. The fitted images
    are held in memory; a run that would need more than ``memory_limit_gib`` (scherer10's
    256x256 inputs: 256 KiB per image) is refused with the number, so pass ``limit``.
    ``backend`` and ``seed`` apply when the network is given by name or file.
    ``precision`` ("fp32", "tf32", "bf16" or "fp16") becomes the model's precision (``Sequential.precision``:
    layers that set their own keep it); None keeps the model's, fp32 for a network by name or file.
    ``autotune`` ("off", "quick" or "full") becomes the model's (``Sequential.autotune``: on the
    cuda backend, how kernel problems no record covers are tuned when the model is built); None
    keeps the model's: $AUTOCNN_AUTOTUNE, else "quick".
    ``separable`` (a SeparableSetting, or text as ``autocnn train --separable`` takes it: off, a rank,
    energy, energy:SHARE) becomes the model's (``Sequential.separable``); None keeps the model's.
    ``fuse`` (True or False) becomes the model's ``Sequential.fuse``: whether fused kernels run where
    the tuning records show them faster; None keeps the model's (True unless it says otherwise).
    """
    if fuse is not None and not isinstance(fuse, bool):
        raise TypeError(f"train: fuse must be True, False or None, got {fuse!r}")   # before any data is read
    if isinstance(separable, str):
        from autocnn.separable.setting import parse_separable_text

        separable = parse_separable_text(separable)   # before any data is read
    if precision is not None:
        check_precision("train", precision)   # before any data is read
    if autotune is not None:
        check_autotune(autotune)
    model = network if isinstance(network, Sequential) else load_network(network, backend=backend, seed=seed)
    network_name = "model" if isinstance(network, Sequential) else str(network)
    if precision is not None:
        model.precision = precision
    if autotune is not None:
        model.autotune = autotune
    if separable is not None:
        model.separable = separable
    if fuse is not None:
        model.fuse = fuse
    opt = get_optimizer(optimizer, lr)
    data = load_dataset(dataset, data_root).limit(limit)
    if data.num_classes != model.num_classes:
        raise ValueError(f"{network_name} has {model.num_classes} outputs but {data.name} has "
                         f"{data.num_classes} classes")
    samples = len(data.x_train) + len(data.x_test)
    needed = samples * math.prod(model.input_shape) * 4 / 2**30
    if needed > memory_limit_gib:
        raise ValueError(f"{data.name} fitted to {network_name}'s input {model.input_shape} needs {needed:.1f} GiB "
                         f"for {samples} images, over memory_limit_gib={memory_limit_gib}; pass limit= (e.g. "
                         f"limit={int(len(data.x_train) * memory_limit_gib / needed)}) or raise the limit")
    if batch_size > len(data.x_train):
        # A batch past the data set would build every buffer at that size and run each step on
        # padded rows: the whole training split is one batch instead.
        warnings.warn(f"batch size {batch_size} is larger than the {len(data.x_train)} training images; "
                      f"training with batches of {len(data.x_train)}", UserWarning, stacklevel=2)
        batch_size = len(data.x_train)
    data = data.fit_to(model.input_shape)
    if standardize:
        # Zero-mean, unit-variance inputs (training-split statistics): Adam and SGD converge faster.
        data = data.standardize()

    start = time.perf_counter()
    if not hasattr(opt, "lr"):
        lr_schedule = None   # RPROP adapts its own step sizes
    history = model.fit(data.x_train, data.y_train, epochs=epochs, batch_size=batch_size, optimizer=opt,
                        validation_data=(data.x_test, data.y_test), verbose=verbose, lr_schedule=lr_schedule)
    seconds = time.perf_counter() - start
    return TrainingReport(
        network=network_name, dataset=data.name, backend=model.backend.name, optimizer=repr(opt),
        epochs=epochs, batch_size=batch_size, train_samples=len(data.x_train), test_samples=len(data.x_test),
        history=history, test_accuracy=[float(a) for a in history.val_accuracy],  # type: ignore[arg-type]
        seconds=seconds, dispatch_report=model.dispatch_report(), precision=model.precision.name,
        precision_text=describe_precision(model), model=model)


def describe_precision(model: Sequential) -> str:
    """The model's precision, and the layers that differ from it: "tf32 (conv2d_1 fp32)"; for a
    mixed-precision model what stays FP32, and fp16's loss scale (reading it waits for the device)."""
    own = [f"{layer.name} {layer.precision}" for layer in model.layers
           if getattr(layer, "precision", model.precision) != model.precision]
    text = model.precision.name + (f" ({', '.join(own)})" if own else "")
    if any(layer.element.size == 2 for layer in model.layers):
        text += ", mixed: FP32 master weights, optimizer and loss"
        if model.loss_scaler is not None:
            text += f", dynamic loss scale {model.loss_scaler.scale:g}"
    return text
