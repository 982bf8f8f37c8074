"""`autocnn tune --torch-model`: the model is built and traced before any GPU is touched, and its
mistakes are reported as such (runs where PyTorch is installed)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the torch front end needs PyTorch (pip install 'autocnn[torch]')")

from autocnn import cli  # noqa: E402


def small_net():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
                               torch.nn.Conv2d(8, 4, 3, padding=1, padding_mode="reflect"))   # left to PyTorch


def test_the_model_is_traced_before_the_gpu_is_opened(no_gpu_source, monkeypatch):
    import autocnn.torch as autocnn_torch

    seen = {}
    real = autocnn_torch.factory_problems

    def spy(spec, shape, batch, precision, layout):
        seen["uses"] = real(spec, shape, batch, precision, layout)
        return seen["uses"]

    monkeypatch.setattr(autocnn_torch, "factory_problems", spy)
    with pytest.raises(no_gpu_source):
        cli.main(["tune", "--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--batch", "4",
                  "--precision", "tf32"])
    ops = sorted({u.problem.op for u in seen["uses"]})
    assert ops == ["avgpool_bwd", "avgpool_fwd", "conv_fwd", "conv_wgrad"]   # first layer: no dX needed
    conv = next(u.problem for u in seen["uses"] if u.problem.op == "conv_fwd")
    assert (conv.N, conv.C, conv.H, conv.K, conv.precision) == (4, 3, 16, 8, "tf32")


@pytest.mark.parametrize("argv, message", [
    (["--torch-model", "torch.nn:Identity"], "--torch-model and --input-shape go together"),
    (["--torch-model", "nosuch_pkg.models:net", "--input-shape", "3,8,8"], "cannot import 'nosuch_pkg.models'"),
    (["--torch-model", f"{__name__}:small_net", "--input-shape", "3,8"], "C,H,W"),
    (["--torch-model", f"{__name__}:small_net", "--input-shape", "3,8,8", "--batch", "0"], "--batch"),
    # the reflecting layer stays with PyTorch and the first needs no dX: no backward-data kernel at all
    (["--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--ops", "conv_bwd_data"],
     "runs no conv_bwd_data kernel"),
    (["--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--fix", "formulation=nosuch"],
     "no problem of this run offers formulation=nosuch"),
])
def test_mistakes_are_named_before_the_gpu_is_opened(no_gpu_source, capsys, argv, message):
    assert cli.main(["tune", *argv]) != 0
    assert message in capsys.readouterr().err


def test_ops_and_held_parameters_choose_among_the_models_kernels(no_gpu_source, monkeypatch, capsys):
    """--ops keeps the named operations; --fix leaves out the kernels whose operation does not offer
    the held value (the weight gradient has no halo) and says so."""
    seen = {}
    real = cli.tune._tune_problems

    def spy(args, precision, op_problem, torch_uses):
        seen["ops"] = sorted(u.problem.op for u in torch_uses)
        return real(args, precision, op_problem, torch_uses)

    monkeypatch.setattr(cli.tune, "_tune_problems", spy)
    with pytest.raises(no_gpu_source):
        cli.main(["tune", "--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--batch", "4",
                  "--ops", "conv_fwd,conv_wgrad"])
    assert seen["ops"] == ["conv_fwd", "conv_wgrad"]
    with pytest.raises(no_gpu_source):
        cli.main(["tune", "--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--batch", "4",
                  "--ops", "conv_fwd,conv_wgrad", "--fix", "formulation=halo"])
    assert seen["ops"] == ["conv_fwd"]
    assert "1 problems (conv_wgrad) left out" in capsys.readouterr().err
