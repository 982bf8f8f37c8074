"""Conv2d's one-pass backward (conv_bwd_fused) in training: tuning covers it (Sequential.problems
with alternatives, `autocnn tune --network`), a backend runs it instead of conv_bwd_data +
conv_wgrad where its tuning records say it is faster (CudaBackend.tuned_faster, judged
here on records alone), and a layer that runs it gives the split pair's gradients."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from autocnn import nn
from autocnn.kernels.conv_bwd_fused import ConvBwdFusedProblem
from autocnn.nn import Conv2d, NumpyBackend
from autocnn.nn.cuda_backend import CudaBackend
from autocnn.store import TuningDatabase
from tests.test_db import H100, H200, make_record


class FusedWhereAsked(NumpyBackend):
    """The numpy backend, told that the fused backward is faster everywhere."""

    def tuned_faster(self, alternative, replaced):
        return True


def _model(backend):
    layers = [Conv2d(2, 4, 3, padding=1, activation="relu"), Conv2d(4, 5, 5, stride=2, padding=2, activation="tanh"),
              Conv2d(5, 3, 3, bias=False), nn.Flatten(), nn.Dense(18, 4)]
    return nn.Sequential(layers, (2, 9, 7), backend=backend, seed=3)


def test_tuning_covers_the_fused_backward_of_layers_that_need_their_input_gradient():
    model = _model(NumpyBackend(np.float64))
    plain = model.problems(6)
    every = model.problems(6, alternatives=True)
    fused = [p for p in every if isinstance(p, ConvBwdFusedProblem)]
    assert not any(isinstance(p, ConvBwdFusedProblem) for p in plain)
    assert [p for p in every if not isinstance(p, ConvBwdFusedProblem)] == plain
    # conv2d_1 needs no input gradient: only the other two have a one-pass backward.
    assert [(p.C, p.K, p.R, p.stride, p.bias) for p in fused] == [(4, 5, 5, (2, 2), True), (5, 3, 3, (1, 1), False)]
    assert all(p.N == 6 for p in fused)


def test_a_layer_runs_the_fused_backward_where_the_backend_says_and_gets_the_split_gradients():
    fused, split = _model(FusedWhereAsked(np.float64)), _model(NumpyBackend(np.float64))
    fused.build(3)
    split.build(3)
    assert [layer.fused_backward for layer in fused.layers[:3]] == [False, True, True]
    assert [p.op for p in fused.layers[1].problems()] == ["conv_fwd", "conv_bwd_fused"]
    assert not any(layer.fused_backward for layer in split.layers[:3])
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 2, 9, 7))
    y = np.array([0, 3, 1])
    assert fused.loss_and_gradients(x, y) == pytest.approx(split.loss_and_gradients(x, y), rel=1e-12)
    for name, g in split.grads().items():
        np.testing.assert_allclose(fused.grads()[name], g, rtol=1e-10, atol=1e-12, err_msg=name)
    calls = fused.backend.kernel_calls
    assert calls["conv_bwd_fused"] == 2 and calls["conv_bwd_data"] == 0 and calls["conv_wgrad"] == 1


def test_the_fused_backward_is_refused_wrong_buffers():
    backend = NumpyBackend(np.float64)
    p = ConvBwdFusedProblem(N=2, C=3, H=5, W=5, K=4, R=3, S=3, padding=1, bias=False)
    x, dy, w = np.zeros(p.x_shape), np.zeros(p.y_shape), np.zeros(p.w_shape)
    with pytest.raises(ValueError, match="bias=False but a db_out"):
        backend.conv_bwd_fused(p, x, dy, w, np.zeros(p.x_shape), np.zeros(p.w_shape), np.zeros(4))
    with pytest.raises(ValueError, match="dx_out"):
        backend.conv_bwd_fused(p, x, dy, w, np.zeros(p.y_shape), np.zeros(p.w_shape), None)


@pytest.mark.parametrize("fused_us,split_us,gpus,expected", [
    (90.0, (50.0, 50.0), ("h100",) * 3, True),      # faster than the pair's sum
    (110.0, (50.0, 50.0), ("h100",) * 3, False),    # slower
    (90.0, (50.0, None), ("h100",) * 3, False),     # a split problem not tuned: no comparison
    (None, (50.0, 50.0), ("h100",) * 3, False),     # the fused problem not tuned
    (90.0, (50.0, 50.0), ("h100", "h200", "h100"), False),   # times of two GPU models
])
def test_records_decide_the_cuda_route(tmp_path, fused_us, split_us, gpus, expected):
    geometry = dict(N=8, C=16, H=12, W=12, K=16, R=3, S=3, padding=1)
    fused = ConvBwdFusedProblem(**geometry)
    layer_problems = Conv2d(16, 16, 3, padding=1).make_problems((16, 12, 12), 8)
    split = [p for p in layer_problems if p.op != "conv_fwd"]
    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "none", resource_check=lambda p, d: [])
    devices = {"h100": H100, "h200": H200}
    for problem, us, gpu in zip((fused, *split), (fused_us, *split_us), gpus):
        if us is not None:
            db.put(make_record(devices[gpu], problem, time_us=us))
    backend = SimpleNamespace(db=db, device=H100)
    assert CudaBackend.tuned_faster(backend, [fused], split) is expected
