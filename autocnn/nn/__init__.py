"""autocnn.nn: a small CNN training library running on the tuned kernels (or numpy on the CPU).

    from autocnn import nn
    model = nn.build_network("lenet5", seed=0)
    data = nn.load_fashion_mnist()
    history = model.fit(data.x_train, data.y_train, epochs=5, batch_size=128,
                        optimizer=nn.Adam(1e-3), validation_data=(data.x_test, data.y_test))
    print(model.dispatch_report())
"""
from __future__ import annotations

from autocnn.dispatch.kernels import KernelDispatch  # noqa: F401
from autocnn.nn.backend import Backend, BackendUnavailableError  # noqa: F401
from autocnn.nn.backend_choice import get_backend  # noqa: F401
from autocnn.nn.blas import get_blas_threads, set_blas_threads  # noqa: F401
from autocnn.nn.data import (  # noqa: F401
    ImageDataset,
    fit_to_input,
    load_cifar10,
    load_fashion_mnist,
    load_mnist,
    read_cifar10_batch,
    read_idx,
    resize,
    to_channels,
)
from autocnn.nn.fitting import History  # noqa: F401
from autocnn.nn.layers import Activation, AvgPool2d, Conv2d, Dense, Flatten, Layer  # noqa: F401
from autocnn.nn.losses import SoftmaxCrossEntropy, accuracy, softmax  # noqa: F401
from autocnn.nn.mixed_precision import LossScaler, LossScaling  # noqa: F401
from autocnn.nn.model import Sequential  # noqa: F401
from autocnn.nn.numpy_backend import NumpyBackend  # noqa: F401
from autocnn.nn.optim import RPROP, SGD, Adam, Optimizer, get_optimizer  # noqa: F401
from autocnn.nn.training import TrainingReport, load_dataset, train  # noqa: F401
from autocnn.nn.training_step import StepResult  # noqa: F401
from autocnn.nn.zoo import NETWORKS, build_network, input_shape, load_network, network_from_json  # noqa: F401

__all__ = [
    "Backend", "BackendUnavailableError", "KernelDispatch", "NumpyBackend", "get_backend",
    "get_blas_threads", "set_blas_threads",
    "ImageDataset", "fit_to_input", "load_cifar10", "load_fashion_mnist", "load_mnist", "read_cifar10_batch",
    "read_idx", "resize", "to_channels",
    "Activation", "AvgPool2d", "Conv2d", "Dense", "Flatten", "Layer",
    "SoftmaxCrossEntropy", "accuracy", "softmax",
    "History", "Sequential", "StepResult", "LossScaler", "LossScaling",
    "RPROP", "SGD", "Adam", "Optimizer", "get_optimizer",
    "TrainingReport", "load_dataset", "train",
    "NETWORKS", "build_network", "input_shape", "load_network", "network_from_json",
]
