"""The seed networks build, train one step and have their documented shapes; JSON networks; backends."""
from __future__ import annotations

import json

import numpy as np
import pytest

from autocnn import nn
from autocnn.gpu import gpu_available
from autocnn.nn import BackendUnavailableError, NumpyBackend, get_backend, network_from_json
from autocnn.kernels.problem import ConvFwdProblem

# name -> (input shape, per-layer output shapes, kernel calls of one training step)
DOCUMENTED = {
    "kriz09": ((3, 32, 32), [(64, 32, 32), (64, 8, 8), (4096,), (10,)],
               {"conv_fwd": 1, "conv_wgrad": 1, "avgpool_fwd": 1, "avgpool_bwd": 1}),
    "scherer10": ((1, 256, 256), [(8, 128, 128), (8, 64, 64), (8, 32, 32), (8192,), (100,), (10,)],
                  {"conv_fwd": 3, "conv_wgrad": 3, "conv_bwd_data": 2}),
    "convnet18": ((3, 32, 32), [(32, 32, 32), (32, 16, 16), (32, 16, 16), (32, 8, 8), (64, 8, 8), (64, 4, 4),
                                (1024,), (10,)],
                  {"conv_fwd": 3, "conv_wgrad": 3, "conv_bwd_data": 2, "avgpool_fwd": 3, "avgpool_bwd": 3}),
    "chellapilla06": ((1, 29, 29), [(5, 13, 13), (50, 5, 5), (1250,), (100,), (10,)],
                      {"conv_fwd": 2, "conv_wgrad": 2, "conv_bwd_data": 1}),
    "lenet5": ((1, 28, 28), [(6, 28, 28), (6, 14, 14), (16, 10, 10), (16, 5, 5), (400,), (120,), (84,), (10,)],
               {"conv_fwd": 2, "conv_wgrad": 2, "conv_bwd_data": 1, "avgpool_fwd": 2, "avgpool_bwd": 2}),
    "conv4": ((3, 32, 32), [(64, 32, 32), (64, 16, 16), (64, 16, 16), (64, 8, 8), (64, 8, 8), (32, 8, 8), (2048,),
                            (10,)],
              {"conv_fwd": 4, "conv_wgrad": 4, "conv_bwd_data": 3, "avgpool_fwd": 2, "avgpool_bwd": 2}),
    # Its own tests: tests/test_zoo_vgg.py.
    "vgg_cifar": ((3, 32, 32), [(64, 32, 32), (64, 32, 32), (64, 16, 16), (128, 16, 16), (128, 16, 16), (128, 8, 8),
                                (256, 8, 8), (256, 8, 8), (256, 4, 4), (4096,), (256,), (10,)],
                  {"conv_fwd": 6, "conv_wgrad": 6, "conv_bwd_data": 5, "avgpool_fwd": 3, "avgpool_bwd": 3}),
    # These two: tests/test_zoo_depthwise.py.
    "mobilenetv2_cifar": ((3, 32, 32), [(16, 32, 32), (96, 32, 32), (96, 16, 16), (24, 16, 16), (144, 16, 16),
                                        (144, 16, 16), (24, 16, 16), (144, 16, 16), (144, 8, 8), (32, 8, 8),
                                        (192, 8, 8), (192, 8, 8), (32, 8, 8), (128, 8, 8), (128, 1, 1), (128,), (10,)],
                          {"conv_fwd": 14, "conv_wgrad": 14, "conv_bwd_data": 13, "avgpool_fwd": 1, "avgpool_bwd": 1}),
    "convnext_cifar": ((3, 32, 32), [(32, 16, 16), (32, 16, 16), (128, 16, 16), (32, 16, 16), (64, 8, 8), (64, 8, 8),
                                     (256, 8, 8), (64, 8, 8), (128, 4, 4), (128, 4, 4), (512, 4, 4), (128, 4, 4),
                                     (128, 1, 1), (128,), (10,)],
                       {"conv_fwd": 12, "conv_wgrad": 12, "conv_bwd_data": 11, "avgpool_fwd": 1, "avgpool_bwd": 1}),
}


def test_every_network_is_documented():
    assert set(nn.NETWORKS) == set(DOCUMENTED)


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_network_builds_and_trains_one_step(name):
    input_shape, shapes, calls = DOCUMENTED[name]
    model = nn.build_network(name, seed=0)
    assert nn.input_shape(name) == input_shape == model.input_shape
    assert model.layer_output_shapes == shapes
    model.build(2).compile("sgd", lr=0.01)
    for layer, shape in zip(model.layers, shapes):
        assert layer.output_shape == shape
    rng = np.random.default_rng(0)
    x = rng.random((2, *input_shape), dtype=np.float32)
    y = np.array([3, 7])
    before = model.get_weights()
    model.backend.kernel_calls.clear()
    step = model.train_step(x, y)
    assert dict(model.backend.kernel_calls) == calls
    assert np.isfinite(step.loss) and step.loss > 0
    after = model.get_weights()
    assert all(not np.array_equal(before[k], after[k]) for k in before), "every parameter should move"
    probs = model.predict(x)
    assert probs.shape == (2, 10)
    # Every problem in the dispatch table is one the layers run.
    assert len(model.dispatch) == len(model.problems())


def test_kriz09_problem_is_the_papers_layer():
    model = nn.build_network("kriz09")
    fwd = model.problems(128)[0]
    assert fwd == ConvFwdProblem(N=128, C=3, H=32, W=32, K=64, R=8, S=8, padding=(4, 4, 3, 3), bias=True,
                                 activation="logistic")


def test_unknown_network():
    with pytest.raises(ValueError, match="known: kriz09"):
        nn.build_network("alexnet")


# -- JSON networks ------------------------------------------------------------------------------------

LENET_JSON = {
    "name": "lenet5",
    "input_shape": [1, 28, 28],
    "layers": [
        {"type": "conv2d", "out_channels": 6, "kernel_size": 5, "padding": 2, "activation": "relu"},
        {"type": "avgpool2d", "window": 2},
        {"type": "conv2d", "in_channels": 6, "out_channels": 16, "kernel_size": [5, 5], "activation": "relu"},
        {"type": "avgpool2d", "window": 2, "stride": 2},
        {"type": "flatten"},
        {"type": "dense", "out_features": 120, "activation": "relu"},
        {"type": "dense", "out_features": 84, "activation": "relu"},
        {"type": "dense", "in_features": 84, "out_features": 10},
    ],
}


def _write(tmp_path, spec, name="net.json"):
    path = tmp_path / name
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return path


def test_network_from_json_matches_the_zoo(tmp_path):
    model = network_from_json(_write(tmp_path, LENET_JSON), seed=0)
    zoo = nn.build_network("lenet5")
    assert model.layer_output_shapes == zoo.layer_output_shapes
    assert model.problems(4) == zoo.problems(4)
    assert nn.load_network(tmp_path / "net.json").num_classes == 10


@pytest.mark.parametrize("mutate,message", [
    (lambda s: s["layers"].append({"type": "maxpool2d", "window": 2}), r"layers\[8\]: unknown type 'maxpool2d'"),
    (lambda s: s["layers"][0].update(filters=6), r"layers\[0\] \(conv2d\): unknown key\(s\) filters"),
    (lambda s: s["layers"][1].pop("window"), r"layers\[1\] \(avgpool2d\): missing required key\(s\) window"),
    (lambda s: s["layers"][0].update(kernel_size="5"), r"kernel_size must be an integer or a list"),
    (lambda s: s["layers"][0].update(activation="softmax"), r"layers\[0\].*activation must be one of"),
    (lambda s: s["layers"][0].update(bias=1), r"bias must be true or false"),
    (lambda s: s["layers"].pop(4), r"layers\[4\] \(dense\): dense needs a flat input.*flatten"),
    (lambda s: s["layers"][2].update(in_channels=5), r"layers\[2\] \(conv2d\):.*expects input \(5, H, W\)"),
    (lambda s: s.update(input_shape=[28, 28, "a"]), r"input_shape must be a list of positive integers"),
    (lambda s: s.update(layer=[]), r"unknown top-level key\(s\) layer"),
    (lambda s: s.update(layers=[]), r"layers must be a non-empty list"),
    (lambda s: s.update(layers=s["layers"][:4]), r"one score per class"),
])
def test_network_from_json_errors(tmp_path, mutate, message):
    spec = json.loads(json.dumps(LENET_JSON))
    mutate(spec)
    with pytest.raises(ValueError, match=message):
        network_from_json(_write(tmp_path, spec))


def test_network_from_json_bad_files(tmp_path):
    with pytest.raises(ValueError, match="invalid JSON at line 1"):
        network_from_json(_write(tmp_path, "{not json"))
    with pytest.raises(ValueError, match="top level must be an object"):
        network_from_json(_write(tmp_path, "[]"))
    with pytest.raises(FileNotFoundError):
        network_from_json(tmp_path / "missing.json")


# -- backends -----------------------------------------------------------------------------------------

def test_get_backend():
    b = get_backend("numpy")
    assert isinstance(b, NumpyBackend) and b.dtype == np.float32 and b.name == "numpy"
    assert get_backend("numpy", dtype=np.float64).dtype == np.float64
    assert get_backend(b) is b
    with pytest.raises(ValueError, match="disagrees"):
        get_backend(b, dtype=np.float64)
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        get_backend("tpu")
    for dtype in (np.float16, np.int32, "complex64"):
        with pytest.raises(ValueError, match="float32.*float64"):
            NumpyBackend(dtype)


@pytest.mark.skipif(gpu_available(), reason="a GPU with CuPy is present: the cuda backend may start")
def test_cuda_backend_unavailable_names_numpy():
    with pytest.raises(BackendUnavailableError, match="backend='numpy'"):
        get_backend("cuda")
    with pytest.raises(RuntimeError):  # BackendUnavailableError is a RuntimeError
        nn.build_network("lenet5", backend="cuda")


def test_backend_checks_buffers_and_counts_calls():
    backend = NumpyBackend()
    p = ConvFwdProblem(N=2, C=1, H=5, W=5, K=2, R=3, S=3, bias=True, activation="relu")
    x = np.ones(p.x_shape, np.float32)
    w = np.ones(p.w_shape, np.float32)
    b = np.full(2, -1.0, np.float32)
    out = np.empty(p.y_shape, np.float32)
    backend.conv_fwd(p, x, w, b, out)
    np.testing.assert_allclose(out, 8.0)  # 9 ones, bias -1, relu
    assert backend.kernel_calls == {"conv_fwd": 1}
    with pytest.raises(ValueError, match=r"out has shape \(2, 2, 4, 4\), expected \(2, 2, 3, 3\)"):
        backend.conv_fwd(p, x, w, b, np.empty((2, 2, 4, 4), np.float32))
    with pytest.raises(TypeError, match="float64"):
        backend.conv_fwd(p, x.astype(np.float64), w, b, out)
    with pytest.raises(ValueError, match="no bias array"):
        backend.conv_fwd(p, x, w, None, out)
    assert backend.kernel_calls == {"conv_fwd": 1}  # refused calls are not counted
    dispatch = backend.prepare([p, p.with_op("conv_wgrad")])
    assert [d.source for d in dispatch] == ["numpy reference (CPU)"] * 2
    assert dispatch[1].problem.op == "conv_wgrad"


def test_numpy_backend_can_set_blas_threads():
    from autocnn.nn.blas import get_blas_threads, set_blas_threads

    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS this process can find")
    try:
        NumpyBackend(blas_threads=1)
        assert get_blas_threads() == 1
    finally:
        set_blas_threads(before)
    assert get_blas_threads() == before
    with pytest.raises(ValueError, match="blas_threads"):
        set_blas_threads(0)


def test_summary_counts_parameters(capsys):
    model = nn.build_network("lenet5")
    text = model.summary()
    assert "61,706 parameters" in text and "dense_3" in text and "16x5x5" in text
    model.build(2, verbose=True)
    assert "conv_wgrad" in capsys.readouterr().out
