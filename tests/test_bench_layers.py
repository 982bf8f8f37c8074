"""scripts/bench_layers.py: a model's problems are traced and bad input refused before any device
work; on a GPU, each convolution problem is timed with its looked-up kernel beside cuDNN."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="tracing a model's problems needs PyTorch (pip install 'autocnn[torch]')")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_layers  # noqa: E402


def small_net():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 4, 3, dilation=2))   # dilation: left to PyTorch


@pytest.mark.parametrize("argv, message", [
    (["--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--batch", "2", "--ops", "conv_fwdd"],
     "conv_fwdd"),
    (["--torch-model", f"{__name__}:small_net", "--input-shape", "3,16", "--batch", "2"], "C,H,W"),
    (["--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--batch", "0"], "--batch"),
    (["--torch-model", "nosuch_pkg.models:net", "--input-shape", "3,8,8", "--batch", "2"], "nosuch_pkg"),
    # no pooling layer in the model
    (["--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--batch", "2", "--ops", "avgpool_fwd"],
     "runs none of avgpool_fwd"),
])
def test_bad_input_is_refused_before_any_device_work(argv, message, capsys, device_untouched):
    with pytest.raises(SystemExit) as exc:
        bench_layers.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.gpu
def test_every_convolution_problem_is_timed_beside_cudnn(tmp_path, capsys):
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA for the cuDNN times")
    out = tmp_path / "layers.json"
    assert bench_layers.main(["--torch-model", f"{__name__}:small_net", "--input-shape", "3,16,16", "--batch", "2",
                              "--precision", "tf32", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    # conv 1: forward and weight gradient; conv 2: all three; the dilated conv is PyTorch's
    assert sorted(r["op"] for r in rows) == ["conv_bwd_data", "conv_fwd", "conv_fwd", "conv_wgrad", "conv_wgrad"]
    for r in rows:
        assert r["ok"] and r["us"] > 0 and r["cudnn_us"] > 0 and r["problem"]["precision"] == "tf32", r
    table = capsys.readouterr().out
    assert table.count("| conv_") == len(rows) and "per step, problems timed by both" in table
