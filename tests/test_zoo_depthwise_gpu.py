"""Depthwise, grouped and dilated layers on the cuda backend (run on a GPU host: pytest -m gpu
tests/test_zoo_depthwise_gpu.py): mobilenetv2_cifar and convnext_cifar, and a small model of a
grouped, a depthwise (channel multiplier 2) and a dilated strided layer, each trained a few steps in
a CUDA graph and compared with the numpy backend, in fp32 and bf16.

fp32: the zoo's checks of tests/test_gpu_training.py (forward, loss, gradients and three SGD steps
against the numpy backend at 1e-4, at the same ReLU decisions; graphed steps against eager ones;
every convolution and pooling call a generated kernel). bf16: against the numpy backend's emulation
(every 16-bit tensor rounded as a kernel stores it), within the bound tests/test_amp_gpu.py derives:
the two round the same values up to FP32 sums in another order, so each 16-bit tensor on the way
may differ by one 16-bit step, and a result that passes through n of them by at most n times the
precision's ``output_rounding`` (``_roundings``). ReLU decisions a rounding flips are taken over
as in fp32 (tests/relu_decisions.py), read from the 16-bit buffers' values.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from autocnn.precision import BF16
from tests.relu_decisions import relu_decisions_taken_from

pytestmark = pytest.mark.gpu

NETWORKS = ["mobilenetv2_cifar", "convnext_cifar"]
BATCH = 6   # not a tuned batch size: the kernels run on database fallbacks, which must be right too


def _rel(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _small_model(backend: str, seed: int, precision: str) -> Any:
    """A grouped (3 groups of 5 channels), a depthwise (multiplier 2) and a dilated strided layer."""
    from autocnn.nn import AvgPool2d, Conv2d, Dense, Flatten, Sequential

    return Sequential([Conv2d(3, 15, 3, padding=1, activation="tanh"),
                       Conv2d(15, 9, 3, stride=2, padding=(1, 2, 0, 1), groups=3, activation="relu"),
                       Conv2d(9, 18, 3, padding=1, groups=9, activation="tanh"),
                       Conv2d(18, 5, (3, 2), stride=3, padding=(2, 1, 1, 2), dilation=2, activation="logistic"),
                       AvgPool2d(2, padding=(0, 0, 1, 1)), Flatten(), Dense(5 * 1 * 2, 4)],
                      (3, 11, 13), seed=seed, precision=precision, backend=backend)


def _model(name: str, backend: str, seed: int, precision: str) -> Any:
    from autocnn import nn

    if name == "grouped_dilated":
        return _small_model(backend, seed, precision)
    model = nn.build_network(name, backend=backend, seed=seed)
    model.precision = precision
    return model


def _roundings(model: Any) -> int:
    """The 16-bit tensors the forward pass's result may pass through: the input's cast, each weighted
    layer's weight copy and output, each pooling's output (a gradient: as many again back). Added in
    the worst case, so on these deep networks the bound is loose (bf16: 0.25 for mobilenetv2_cifar's
    logits): it catches a kernel that computes something else, while the fp32 comparison at 1e-4
    and the kernels' own elementwise checks against float64 hold them to rounding."""
    from autocnn.nn import AvgPool2d

    weighted = sum(bool(layer.param_shapes()) for layer in model.layers)
    pools = sum(isinstance(layer, AvgPool2d) for layer in model.layers)
    return 1 + 2 * weighted + pools


def _values_of(gpu: Any) -> Any:
    """``gpu`` as relu_decisions reads a reference model: its layers, its buffers as float32 values
    (a 16-bit buffer holds bit patterns)."""
    from autocnn.measurement import element_arrays

    elements = {id(layer.output_buffer): layer.element for layer in gpu.layers if hasattr(layer, "output_buffer")}

    def to_numpy(a: Any) -> np.ndarray:
        element = elements.get(id(a))
        stored = gpu.backend.to_numpy(a)
        return stored if element is None or stored.dtype == np.float32 else element_arrays.values(stored, element, np)

    return SimpleNamespace(layers=gpu.layers, backend=SimpleNamespace(to_numpy=to_numpy))


def _per_layer(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    # Weights and bias together: a bias alone starts at zero (tests/test_amp_gpu.py says why).
    layers = sorted({k.rsplit(".", 1)[0] for k in b})
    return {layer: _rel(np.concatenate([a[k].ravel() for k in sorted(b) if k.rsplit(".", 1)[0] == layer]),
                        np.concatenate([b[k].ravel() for k in sorted(b) if k.rsplit(".", 1)[0] == layer]))
            for layer in layers}


@pytest.mark.parametrize("name", NETWORKS)
def test_fp32_zoo_network_matches_numpy_and_its_graphed_steps_its_eager_ones(name):
    from tests import test_gpu_training as gpu

    gpu.test_cuda_matches_numpy_forward_gradients_and_steps(name)
    gpu.test_every_conv_and_pool_call_runs_a_generated_kernel(name)
    gpu.test_graphed_steps_match_eager_steps_and_count_their_kernels(name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", NETWORKS + ["grouped_dilated"])
def test_a_step_matches_numpy_and_graphed_training_runs_generated_kernels(name, precision):
    from autocnn import nn

    rng = np.random.default_rng()
    seed = int(rng.integers(2**31))
    cpu = _model(name, "numpy", seed, precision).build(BATCH)
    gpu = _model(name, "cuda", seed, precision).build(BATCH)
    forward_bound = 1e-4 if precision == "fp32" else _roundings(cpu) * BF16.output_rounding
    bound = 1e-4 if precision == "fp32" else 2 * forward_bound
    grouped = [p for p in gpu.problems() if getattr(p, "groups", 1) != 1]
    assert grouped and all(p.precision.name == precision for p in grouped)
    x = rng.standard_normal((BATCH, *cpu.input_shape)).astype(np.float32)
    y = rng.integers(0, cpu.num_classes, BATCH)
    assert _rel(gpu.predict(x, batch_size=BATCH), cpu.predict(x, batch_size=BATCH)) <= forward_bound
    loss_gpu = gpu.loss_and_gradients(x, y)
    with relu_decisions_taken_from(_values_of(gpu), cpu, bound):
        loss_cpu = cpu.loss_and_gradients(x, y)
    assert abs(loss_gpu - loss_cpu) <= forward_bound * max(1.0, abs(loss_cpu))
    for k, g in cpu.grads().items():
        got = gpu.backend.to_numpy(gpu.grads()[k])
        assert got.dtype == np.float32 and _rel(got, g) <= bound, (name, precision, k, _rel(got, g))

    # A few steps: eager, captured, then replays of the CUDA graph; every convolution and pooling
    # call ran a generated kernel.
    for model in (cpu, gpu):
        model.compile(nn.SGD(0.01, momentum=0.9))
    be = gpu.backend
    be.kernel_calls.clear()
    be.generated_launches.clear()
    for _ in range(4):
        xb = rng.standard_normal((BATCH, *cpu.input_shape)).astype(np.float32)
        yb = rng.integers(0, cpu.num_classes, BATCH)
        loss = gpu.train_step(xb, yb).loss
        with relu_decisions_taken_from(_values_of(gpu), cpu, bound):
            cpu.train_step(xb, yb)
        assert np.isfinite(loss)
    assert gpu._graph is not None
    assert be.generated_launches == be.kernel_calls and set(be.kernel_calls) == {p.op for p in gpu.problems()}
    errors = _per_layer(gpu.get_weights(), cpu.get_weights())
    assert max(errors.values()) <= bound, (name, precision, errors)


@pytest.mark.parametrize("name", NETWORKS)
def test_bf16_zoo_network_learns_in_a_cuda_graph(name):
    from autocnn import nn

    model = _model(name, "cuda", 3, "bf16")
    model.compile(nn.Adam(2e-3)).build(16)
    rng = np.random.default_rng()
    y = np.array([0, 1] * 8)
    x = (rng.standard_normal((16, 3, 32, 32)) + np.where(y == 0, -0.5, 0.5)[:, None, None, None]).astype(np.float32)
    losses = [model.train_step(x, y).loss for _ in range(15)]
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses
    assert model._graph is not None
    assert all(w.dtype == np.float32 for w in model.get_weights().values())
    depthwise = [p for p in model.problems() if getattr(p, "groups", 1) != 1]
    assert depthwise and all(p.depthwise and p.precision is BF16 for p in depthwise)
