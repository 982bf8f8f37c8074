"""The cuda backend against the numpy backend (run on a GPU host: pytest -m gpu).

For every zoo network: the same initial weights on both backends give the same logits, loss and
gradients, and the same weights after a few SGD steps (relative error <= 1e-4); every convolution
and pooling call of a cuda training step ran a generated kernel (counted, not assumed).
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

NETWORKS = ["kriz09", "scherer10", "convnet18", "chellapilla06", "lenet5"]
BATCH = 6   # not a tuned batch size: the kernels run on database fallbacks, which must be right too
TOL = 1e-4


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _pair(name: str, seed: int):
    from autocnn import nn

    cpu = nn.build_network(name, backend="numpy", seed=seed)
    gpu = nn.build_network(name, backend="cuda", seed=seed)
    cpu.build(BATCH)
    gpu.build(BATCH)
    return cpu, gpu


@pytest.mark.parametrize("name", NETWORKS)
def test_cuda_matches_numpy_forward_gradients_and_steps(name):
    from autocnn import nn

    rng = np.random.default_rng()
    seed = int(rng.integers(2**31))
    cpu, gpu = _pair(name, seed)
    for a, b in zip(cpu.get_weights().values(), gpu.get_weights().values()):
        np.testing.assert_array_equal(a, b)   # the same initial weights
    x = rng.standard_normal((BATCH, *cpu.input_shape)).astype(np.float32)
    y = rng.integers(0, cpu.num_classes, BATCH)

    assert _rel(gpu.predict(x, batch_size=BATCH), cpu.predict(x, batch_size=BATCH)) <= TOL
    loss_cpu = cpu.loss_and_gradients(x, y)
    loss_gpu = gpu.loss_and_gradients(x, y)
    assert abs(loss_gpu - loss_cpu) <= TOL * max(1.0, abs(loss_cpu))
    g_cpu = {k: cpu.backend.to_numpy(v) for k, v in cpu.grads().items()}
    g_gpu = {k: gpu.backend.to_numpy(v) for k, v in gpu.grads().items()}
    for k in g_cpu:
        assert _rel(g_gpu[k], g_cpu[k]) <= TOL, f"{name} gradient {k}"

    cpu.compile(nn.SGD(0.01, momentum=0.9))
    gpu.compile(nn.SGD(0.01, momentum=0.9))
    for _ in range(3):
        xb = rng.standard_normal((BATCH, *cpu.input_shape)).astype(np.float32)
        yb = rng.integers(0, cpu.num_classes, BATCH)
        cpu.train_step(xb, yb)
        gpu.train_step(xb, yb)
    w_cpu, w_gpu = cpu.get_weights(), gpu.get_weights()
    for k in w_cpu:
        assert _rel(w_gpu[k], w_cpu[k]) <= TOL, f"{name} weight {k} after 3 steps"


@pytest.mark.parametrize("name", NETWORKS)
def test_every_conv_and_pool_call_runs_a_generated_kernel(name):
    from autocnn import nn

    model = nn.build_network(name, backend="cuda", seed=1)
    model.build(BATCH)
    be = model.backend
    be.kernel_calls.clear()
    be.generated_launches.clear()
    rng = np.random.default_rng()
    model.compile(nn.Adam(1e-3))
    model.train_step(rng.standard_normal((BATCH, *model.input_shape)).astype(np.float32),
                     rng.integers(0, model.num_classes, BATCH))
    assert sum(be.kernel_calls.values()) > 0
    assert be.generated_launches == be.kernel_calls
    expected_ops = {p.op for p in model.problems()}
    assert set(be.generated_launches) == expected_ops
    assert all(d.source for d in model.dispatch)


def test_cuda_backend_refuses_float64():
    from autocnn.nn.cuda_backend import CudaBackend

    with pytest.raises(ValueError, match="float32"):
        CudaBackend(dtype=np.float64)
