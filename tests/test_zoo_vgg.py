"""vgg_cifar, the zoo's network with today's layer shapes: its layers, its kernel problems at the
benchmark's batch, that it learns, that the benchmark's PyTorch twin computes the same function,
and (GPU) that the cuda backend trains it as the numpy backend does."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn import nn
from tests.zoo_checks import small_batch_losses
from autocnn.kernels.problem import AvgPoolFwdProblem, ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem
from tests.bench_module import load_bench



def test_vgg_cifar_layers():
    model = nn.build_network("vgg_cifar", seed=0)
    convs = [layer for layer in model.layers if isinstance(layer, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(3, 64), (64, 64), (64, 128), (128, 128),
                                                                (128, 256), (256, 256)]
    for c in convs:
        assert c.kernel_size == (3, 3) and c.stride == (1, 1) and c.padding == (1, 1, 1, 1)
        assert c.activation == "relu" and c.use_bias
    pools = [layer for layer in model.layers if isinstance(layer, nn.AvgPool2d)]
    assert [(p.window, p.stride) for p in pools] == [((2, 2), (2, 2))] * 3
    model.build(2)
    # 3x3 filters of the six convolutions, the two dense layers, every bias.
    assert sum(int(np.prod(w.shape)) for w in model.get_weights().values()) == 2_196_810


def test_vgg_cifar_problems_at_the_benchmark_batch():
    problems = nn.build_network("vgg_cifar").problems(128)
    by_op: dict[str, list] = {}
    for p in problems:
        by_op.setdefault(p.op, []).append(p)
    assert {op: len(ps) for op, ps in by_op.items()} == {
        "conv_fwd": 6, "conv_wgrad": 6, "conv_bwd_data": 5, "avgpool_fwd": 3, "avgpool_bwd": 3}
    assert ConvFwdProblem(N=128, C=128, H=16, W=16, K=128, R=3, S=3, padding=(1, 1, 1, 1), bias=True,
                          activation="relu") in problems
    assert ConvWgradProblem(N=128, C=256, H=8, W=8, K=256, R=3, S=3, padding=(1, 1, 1, 1), bias=True) in problems
    # The first layer's input is the data: nothing needs its gradient.
    assert all(p.C != 3 for p in by_op["conv_bwd_data"])
    assert ConvBwdDataProblem(N=128, C=64, H=32, W=32, K=64, R=3, S=3, padding=(1, 1, 1, 1)) in problems
    assert AvgPoolFwdProblem(N=128, C=256, H=8, W=8, window=(2, 2)) in problems


def test_vgg_cifar_learns_a_small_batch():
    losses = small_batch_losses("vgg_cifar", 1e-3)
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses



def test_the_benchmarks_pytorch_twin_computes_the_same_function():
    torch = pytest.importorskip("torch", reason="the PyTorch twin needs PyTorch (pip install 'autocnn[torch]')")
    bench = load_bench()
    model = nn.build_network("vgg_cifar", backend=nn.NumpyBackend(np.float64), seed=3)
    model.build(2)
    twin = bench.torch_model(model, device="cpu").double()
    bench.copy_weights(model, twin)
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32))
    ours = model.predict(x, batch_size=2)
    with torch.no_grad():
        theirs = torch.softmax(twin(torch.from_numpy(x)), dim=1).numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-9, atol=1e-12)


@pytest.mark.gpu
def test_vgg_cifar_on_the_cuda_backend_matches_numpy():
    from tests import test_gpu_training as gpu

    # The zoo's GPU checks, on this network: forward, loss, gradients and three SGD steps against the
    # numpy backend, and every convolution and pooling call a generated kernel.
    gpu.test_cuda_matches_numpy_forward_gradients_and_steps("vgg_cifar")
    gpu.test_every_conv_and_pool_call_runs_a_generated_kernel("vgg_cifar")


def test_relu_decisions_at_rounding_explain_the_backends_gradient_differences():
    # The GPU check above compares backward passes at the same ReLU decisions (tests.relu_decisions).
    # Here on the CPU, float32 against float64: seeds are drawn until one has a decision that
    # differs; its first-layer gradient differs by far more than the check's 1e-4 as it is, and by
    # rounding once the decisions are taken from float64's forward. Every seed tried meets 1e-4 so.
    from tests.relu_decisions import relu_decisions_taken_from

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    for seed in range(40):
        rng = np.random.default_rng(seed)
        models = {}
        for dtype in (np.float64, np.float32, np.float32):
            m = nn.build_network("vgg_cifar", backend=nn.NumpyBackend(dtype, blas_threads=1), seed=seed).build(6)
            models.setdefault(dtype, []).append(m)
        exact, (plain, aligned) = models[np.float64][0], models[np.float32]
        x = rng.standard_normal((6, 3, 32, 32)).astype(np.float32)
        y = rng.integers(0, 10, 6)
        exact.loss_and_gradients(x.astype(np.float64), y)
        plain.loss_and_gradients(x, y)
        with relu_decisions_taken_from(exact, aligned, 1e-4) as taken:
            aligned.loss_and_gradients(x, y)
        want = exact.grads()
        for k, g in aligned.grads().items():
            assert rel(g, want[k]) <= 1e-4, (seed, k)
        if taken[0]:
            assert max(rel(g, want[k]) for k, g in plain.grads().items()) > 1e-4
            break
    else:
        pytest.fail("no seed of 40 had a ReLU decision that differs between float32 and float64")
