"""The zoo's networks with depthwise layers, mobilenetv2_cifar and convnext_cifar: their layers, their
kernel problems (depthwise, groups == C == K, where the architecture has a depthwise convolution),
that they learn a small batch on the numpy backend, and that `autocnn tune --network` and `autocnn
train --network` take them. On a GPU: tests/test_zoo_depthwise_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn import nn
from tests.zoo_checks import small_batch_losses
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem
from autocnn.precision import BF16

NETWORKS = ("mobilenetv2_cifar", "convnext_cifar")
# Each network's depthwise layers as (channels, kernel size, stride, padding, activation).
DEPTHWISE = {
    "mobilenetv2_cifar": [(96, 3, 2, 1, "relu"), (144, 3, 1, 1, "relu"), (144, 3, 2, 1, "relu"),
                          (192, 3, 1, 1, "relu")],
    "convnext_cifar": [(32, 7, 1, 3, "none"), (64, 7, 1, 3, "none"), (128, 7, 1, 3, "none")],
}


def _convs(model: nn.Sequential) -> list[nn.Conv2d]:
    return [layer for layer in model.layers if isinstance(layer, nn.Conv2d)]


def test_mobilenetv2_cifar_layers():
    convs = _convs(nn.build_network("mobilenetv2_cifar"))
    stem, blocks, last = convs[0], convs[1:-1], convs[-1]
    assert (stem.in_channels, stem.out_channels, stem.kernel_size, stem.stride) == (3, 16, (3, 3), (1, 1))
    assert len(blocks) == 12
    for expand, depthwise, project in zip(blocks[0::3], blocks[1::3], blocks[2::3]):
        # 1x1 expansion by 6 (relu), 3x3 depthwise (relu), linear 1x1 projection.
        assert expand.kernel_size == (1, 1) and expand.out_channels == 6 * expand.in_channels
        assert expand.activation == "relu" and expand.groups == 1
        assert depthwise.groups == depthwise.in_channels == depthwise.out_channels == expand.out_channels
        assert project.kernel_size == (1, 1) and project.activation == "none" and project.groups == 1
    assert [b.out_channels for b in blocks[2::3]] == [24, 24, 32, 32]
    assert (last.in_channels, last.out_channels, last.kernel_size) == (32, 128, (1, 1))


def test_convnext_cifar_layers():
    convs = _convs(nn.build_network("convnext_cifar"))
    assert (convs[0].kernel_size, convs[0].stride, convs[0].out_channels) == ((2, 2), (2, 2), 32)   # patchify
    downsampling = [c for c in convs[1:] if c.kernel_size == (2, 2)]
    assert [(c.in_channels, c.out_channels, c.stride) for c in downsampling] == [(32, 64, (2, 2)), (64, 128, (2, 2))]
    blocks = [c for c in convs[1:] if c.kernel_size != (2, 2)]
    for depthwise, expand, project in zip(blocks[0::3], blocks[1::3], blocks[2::3]):
        assert depthwise.groups == depthwise.in_channels and depthwise.activation == "none"
        assert expand.out_channels == 4 * depthwise.out_channels and expand.activation == "relu"
        assert project.out_channels == depthwise.out_channels and project.activation == "none"


@pytest.mark.parametrize("name", NETWORKS)
def test_depthwise_layers_and_their_problems(name):
    model = nn.build_network(name)
    depthwise = [c for c in _convs(model) if c.groups != 1]
    assert [(c.in_channels, c.kernel_size[0], c.stride[0], c.padding[0], c.activation) for c in depthwise] \
        == DEPTHWISE[name]
    assert all(c.groups == c.in_channels == c.out_channels for c in depthwise)
    problems = model.problems(128, alternatives=True)
    grouped = [p for p in problems if getattr(p, "groups", 1) != 1]
    # Each depthwise layer's three convolutions, each depthwise (groups == C == K); nothing else grouped.
    assert len(grouped) == 3 * len(depthwise)
    assert all(p.depthwise and p.groups == p.C == p.K for p in grouped)
    assert {p.op for p in grouped} == {"conv_fwd", "conv_bwd_data", "conv_wgrad"}
    # No fused form of a depthwise layer is offered; the dense ones keep theirs.
    assert not any(p.op in ("conv_pool_fwd", "conv_bwd_fused") and p.groups != 1
                   for p in problems if hasattr(p, "groups"))
    assert any(p.op == "conv_bwd_fused" for p in problems)


def test_the_expected_problems_at_batch_128():
    mobile = nn.build_network("mobilenetv2_cifar").problems(128)
    assert ConvFwdProblem(N=128, C=96, H=32, W=32, K=96, R=3, S=3, stride=2, padding=1, groups=96, bias=True,
                          activation="relu") in mobile
    assert ConvBwdDataProblem(N=128, C=144, H=16, W=16, K=144, R=3, S=3, padding=1, groups=144) in mobile
    assert ConvWgradProblem(N=128, C=192, H=8, W=8, K=192, R=3, S=3, padding=1, groups=192, bias=True) in mobile
    assert ConvFwdProblem(N=128, C=16, H=32, W=32, K=96, R=1, S=1, bias=True, activation="relu") in mobile
    convnext = nn.build_network("convnext_cifar").problems(128)
    assert ConvFwdProblem(N=128, C=64, H=8, W=8, K=64, R=7, S=7, padding=3, groups=64, bias=True) in convnext
    assert ConvWgradProblem(N=128, C=128, H=4, W=4, K=128, R=7, S=7, padding=3, groups=128, bias=True) in convnext
    assert ConvFwdProblem(N=128, C=3, H=32, W=32, K=32, R=2, S=2, stride=2, bias=True) in convnext
    # The first layer's input is the data: nothing needs its gradient.
    assert all(p.C != 3 for p in convnext if p.op == "conv_bwd_data")


@pytest.mark.parametrize("name", NETWORKS)
def test_learns_a_small_batch_on_the_numpy_backend(name):
    losses = small_batch_losses(name, 2e-3)
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("name", NETWORKS)
def test_autocnn_tune_network_takes_them(name):
    from autocnn.cli import build_parser
    from autocnn.cli.tune import tune_command

    parser = build_parser()
    for precision, fused in (("fp32", True), ("bf16", False)):
        command = tune_command(parser.parse_args(["tune", "--network", name, "--batch", "32", "--precision",
                                                  precision, "--no-progress"]))
        problems = command.problems
        assert command.whole_budget and problems
        depthwise = [p for p in problems if getattr(p, "groups", 1) != 1]
        assert len(depthwise) == 3 * len(DEPTHWISE[name]) and all(p.depthwise and p.N == 32 for p in depthwise)
        assert any(p.op == "conv_bwd_fused" for p in problems) == fused   # a 16-bit model offers none
        if precision == "bf16":
            assert all(p.precision is BF16 for p in problems if p.op.startswith("conv_") and p.op != "conv_pool_dz")


@pytest.mark.parametrize("name", NETWORKS)
def test_autocnn_train_network_takes_them(name, tmp_path, capsys):
    from autocnn.cli import main
    from tests.test_nn_data import write_mnist_like

    write_mnist_like(tmp_path / "fashion", n_train=8, n_test=4, seed=1)
    assert main(["train", "--network", name, "--data-root", str(tmp_path / "fashion"), "--epochs", "1",
                 "--batch-size", "4", "--backend", "numpy", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name} on Fashion-MNIST (8 train / 4 test samples)")
    assert "loss nan" not in out
    assert sum(line.startswith("conv2d_") for line in out.splitlines()) >= 3 * len(DEPTHWISE[name])


@pytest.mark.parametrize("name", NETWORKS)
def test_the_training_benchmarks_pytorch_twin_computes_the_same_function(name):
    """scripts/bench_training.py times these networks against a PyTorch twin: groups and dilation
    reach its nn.Conv2d layers."""
    torch = pytest.importorskip("torch", reason="the PyTorch twin needs PyTorch (pip install 'autocnn[torch]')")
    from tests.bench_module import load_bench

    bench = load_bench()
    model = nn.build_network(name, backend=nn.NumpyBackend(np.float64), seed=3)
    model.build(2)
    twin = bench.torch_model(model, device="cpu").double()
    assert sorted(m.groups for m in twin.modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1) == \
        sorted(c for c, *_ in DEPTHWISE[name])
    bench.copy_weights(model, twin)
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32))
    ours = model.predict(x, batch_size=2)
    with torch.no_grad():
        theirs = torch.softmax(twin(torch.from_numpy(x)), dim=1).numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-9, atol=1e-12)
