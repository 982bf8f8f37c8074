"""Separable Conv2d layers (autocnn.separable + nn.Conv2d(separable=)): validation, the network
option, gradient checks of gu/gv and of the projected update on the numpy backend (float64), conv4,
and on a GPU the cuda backend against the numpy one."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from autocnn import nn
from autocnn.kernels import reference
from autocnn.nn import Conv2d, NumpyBackend
from autocnn.separable.projection import factor_gradients, projection_from_svd, tangent_projection
from autocnn.separable.setting import SeparableSetting, parse_separable, parse_separable_text
from autocnn.separable.svd import SvdSettings, effective_filters
from tests.relu_decisions import relu_decisions_taken_from

TIGHT = SvdSettings(tolerance=1e-24, max_iterations=100_000)
EPS = 1e-6


def rank_r_weights(rng, K, C, R, S, rank):
    """Filters of rank exactly ``rank``, with well separated singular values."""
    a = rng.standard_normal((K, C, rank, R))
    b = rng.standard_normal((K, C, rank, S))
    scale = 2.0 ** -np.arange(rank)
    return np.einsum("kcjy,j,kcjx->kcyx", a, scale, b)


def numeric_derivative(loss, array, idx):
    """The central difference of ``loss()`` in ``array[idx]`` (put back afterwards)."""
    old = array[idx]
    values = []
    for step in (EPS, -EPS):
        array[idx] = old + step
        values.append(loss())
    array[idx] = old
    return (values[0] - values[1]) / (2 * EPS)


def sampled_indices(rng, shape, count=10):
    size = int(np.prod(shape))
    return [np.unravel_index(flat, shape) for flat in rng.choice(size, min(count, size), replace=False)]


def built_layer(rng, layer, input_shape, batch=2, weights=None):
    layer.build(input_shape, batch, NumpyBackend(np.float64), rng)
    params = layer.params()
    if weights is not None:
        params["weight"][...] = weights
    if "bias" in params:
        params["bias"][...] = rng.normal(0, 0.5, size=params["bias"].shape)
    return layer


# -- settings and validation -------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    (True, SeparableSetting(rank=1)), (1, SeparableSetting(rank=1)), (3, SeparableSetting(rank=3)),
    ("energy", SeparableSetting(energy_share=0.9)), (0.95, SeparableSetting(energy_share=0.95)),
    ("energy:0.8", SeparableSetting(energy_share=0.8)), (False, SeparableSetting()), ("off", SeparableSetting()),
])
def test_separable_values(value, expected):
    assert parse_separable("t", value) == expected
    assert parse_separable("t", expected.value()) == expected


@pytest.mark.parametrize("text,expected", [
    ("off", SeparableSetting()), ("1", SeparableSetting(rank=1)), ("2", SeparableSetting(rank=2)),
    ("energy", SeparableSetting(energy_share=0.9)), ("energy:0.95", SeparableSetting(energy_share=0.95)),
    ("0.95", SeparableSetting(energy_share=0.95)), ("1.0", SeparableSetting(energy_share=1.0)),
])
def test_command_line_values(text, expected):
    assert parse_separable_text(text) == expected


@pytest.mark.parametrize("text", ["0", "rank1", "energy:2", "1.5", "-1", ""])
def test_bad_command_line_values(text):
    with pytest.raises(ValueError, match="--separable"):
        parse_separable_text(text)


@pytest.mark.parametrize("value", [0, -2, 1.5, 0.0, "rank", "energy:x", [1]])
def test_bad_layer_values(value):
    with pytest.raises(ValueError, match="separable"):
        Conv2d(3, 4, 3, separable=value)


@pytest.mark.parametrize("kwargs,match", [
    (dict(kernel_size=3, stride=2), "stride 2x2"),
    (dict(kernel_size=(1, 5)), "1x5 filter"),
    (dict(kernel_size=3, separable=4), "rank 4 exceeds"),
])
def test_ineligible_layers_refuse_an_explicit_setting(kwargs, match):
    kwargs.setdefault("separable", True)
    with pytest.raises(ValueError, match=match):
        Conv2d(3, 4, **kwargs)


def test_svd_settings_must_be_svd_settings():
    with pytest.raises(TypeError, match="SvdSettings"):
        Conv2d(3, 4, 3, separable=1, svd={"tolerance": 1e-6})


def test_network_option_applies_to_eligible_layers_and_names_the_others_once():
    layers = [Conv2d(1, 4, 3, padding=1), Conv2d(4, 4, 3, stride=2), Conv2d(4, 4, (1, 3)),
              Conv2d(4, 4, 3, padding=1, separable=False), Conv2d(4, 4, 2, padding=(1, 1, 0, 0)),
              nn.Flatten(), nn.Dense(12, 10)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = nn.Sequential(layers, (1, 8, 8), separable=3)
    messages = [str(w.message) for w in caught if "separable" in str(w.message)]
    assert len(messages) == 1
    assert "conv2d_2 (stride 2x2" in messages[0] and "conv2d_3 (a 1x3 filter" in messages[0]
    assert "conv2d_5 (rank 3 exceeds" in messages[0] and "conv2d_4" not in messages[0]
    assert [layer.separable_rank for layer in layers[:5]] == [3, None, None, None, None]
    assert model.separable == SeparableSetting(rank=3)
    model.build(2)
    assert [p.op for p in layers[1].problems()][0] == "conv_fwd"
    with pytest.warns(UserWarning, match="leaves 2 convolution layer"):
        model.separable = 1   # rebuilt: every eligible layer at rank 1 now
    assert model.built and [layer.separable_rank for layer in layers[:5]] == [1, None, None, None, 1]
    with pytest.raises(ValueError, match="Sequential: separable"):
        model.separable = "sometimes"


# -- gradient checks (float64, numpy backend) -------------------------------------------------------

def _loss_of_factors(layer, x, R, u, v, bias):
    fwd = layer._fwd_problem(layer.input_shape, x.shape[0])
    y = reference.conv_fwd(x, effective_filters(u, v), stride=fwd.stride, padding=fwd.padding, bias=bias,
                           activation=fwd.activation)
    return float(np.sum(y * R))


def inputs_away_from_kinks(rng, layer, shape, margin=1e-3):
    """Fresh inputs whose pre-activations all lie at least ``margin`` from relu's kink. A central
    difference whose step carries a pre-activation across zero measures neither one-sided slope (a
    CI run drew one: 0.534 against the analytic 0.571); a step of EPS in one factor moves each
    pre-activation by far less than the margin. Other activations take the first draw."""
    x = rng.standard_normal(shape)
    if layer.activation != "relu":
        return x
    fwd = layer._fwd_problem(layer.input_shape, shape[0])
    u, v = layer.factors()
    for _ in range(100):
        z = reference.conv_fwd(x, effective_filters(u, v), stride=fwd.stride, padding=fwd.padding,
                               bias=layer.params().get("bias"), activation="none")
        if np.abs(z).min() >= margin:
            return x
        x = rng.standard_normal(shape)
    raise AssertionError(f"no input of 100 draws keeps its pre-activations {margin} from zero")


@pytest.mark.parametrize("kwargs,input_shape,rank", [
    (dict(kernel_size=3, padding=1, activation="tanh"), (2, 6, 5), 1),
    (dict(kernel_size=(4, 3), padding=(2, 1, 1, 1), activation="relu"), (3, 7, 6), 2),
    (dict(kernel_size=5, padding=2, bias=False), (2, 6, 6), 3),
])
def test_factor_gradients_match_finite_differences(rng, kwargs, input_shape, rank):
    layer = built_layer(rng, Conv2d(input_shape[0], 3, separable=rank, **kwargs), input_shape)
    x = inputs_away_from_kinks(rng, layer, (2, *input_shape))
    y = layer.forward(x).copy()
    R = rng.standard_normal(y.shape)
    layer.backward(R)
    u, v = (a.copy() for a in layer.factors())
    gu, gv = (a.copy() for a in layer.factor_gradients())
    bias = layer.params().get("bias")
    assert _loss_of_factors(layer, x, R, u, v, bias) == pytest.approx(float(np.sum(y * R)), rel=1e-10)
    for name, array, analytic in (("u", u, gu), ("v", v, gv)):
        for idx in sampled_indices(rng, array.shape):
            numeric = numeric_derivative(lambda: _loss_of_factors(layer, x, R, u, v, bias), array, idx)
            assert numeric == pytest.approx(analytic[idx], rel=1e-5, abs=1e-8), f"d/d{name}{idx}"


@pytest.mark.parametrize("kwargs,input_shape,rank", [
    (dict(kernel_size=3, padding=1, activation="tanh"), (2, 6, 5), 1),
    (dict(kernel_size=(4, 5), padding=(2, 1, 1, 2), activation="logistic"), (2, 7, 7), 2),
    (dict(kernel_size=5, padding=2, activation="none"), (1, 6, 6), 4),
])
def test_projected_update_is_the_gradient_at_rank_r_filters(rng, kwargs, input_shape, rank):
    """At filters of rank r the rank-r approximation is the identity and its derivative the tangent
    projection, so the layer's weight gradient must match finite differences of the loss in W."""
    K, C = 3, input_shape[0]
    R, S = Conv2d(C, K, **kwargs).kernel_size
    w = rank_r_weights(rng, K, C, R, S, rank)
    layer = built_layer(rng, Conv2d(C, K, separable=rank, svd=TIGHT, **kwargs), input_shape, weights=w)
    x = rng.standard_normal((2, *input_shape))
    y = layer.forward(x).copy()
    R_ = rng.standard_normal(y.shape)
    dx = layer.backward(R_).copy()
    grads = {k: g.copy() for k, g in layer.grads().items()}
    params = layer.params()

    def loss() -> float:
        return float(np.sum(layer.forward(x) * R_))

    targets = [("x", x, dx)] + [(k, params[k], grads[k]) for k in params]
    for name, array, analytic in targets:
        for idx in sampled_indices(rng, array.shape):
            numeric = numeric_derivative(loss, array, idx)
            assert numeric == pytest.approx(analytic[idx], rel=1e-5, abs=1e-7), f"d/d{name}{idx}"


def test_projection_formula_against_lapack(rng):
    w = rng.standard_normal((4, 3, 5, 6))
    g = rng.standard_normal(w.shape)
    layer = built_layer(rng, Conv2d(3, 4, (5, 6), separable=2, svd=TIGHT), (3, 8, 8), weights=w)
    layer.forward(rng.standard_normal((2, 3, 8, 8)))
    u, v = layer.factors()
    gu, gv = factor_gradients(g, u, v)
    projected = tangent_projection(gu, gv, u, v)
    np.testing.assert_allclose(projected, projection_from_svd(g, w, 2), atol=1e-9)
    gu2, gv2 = factor_gradients(projected, u, v)
    np.testing.assert_allclose(tangent_projection(gu2, gv2, u, v), projected, atol=1e-10)   # a projection


def test_the_energy_rank_is_chosen_at_the_first_build_and_kept(rng):
    layer = Conv2d(4, 6, 5, padding=2, separable="energy")
    model = nn.Sequential([layer, nn.Flatten(), nn.Dense(6 * 6 * 6, 10)], (4, 6, 6), seed=1)
    assert layer.separable_rank is None
    with pytest.raises(RuntimeError, match="energy-chosen rank"):
        model.problems(2)
    model.build(2)
    choice = layer.rank_choice
    assert choice is not None and layer.separable_rank == choice.rank
    assert choice.kept[choice.rank - 1] >= 0.9 and (choice.rank == 1 or choice.kept[choice.rank - 2] < 0.9)
    model.build(3)
    assert layer.rank_choice is choice
    assert layer.factors()[0].shape == (6, 4, choice.rank, 5)


def test_training_steps_update_the_2d_filters_and_report_the_svd(rng):
    layers = [Conv2d(1, 4, 3, padding=1, activation="relu", separable=1), nn.AvgPool2d(2),
              Conv2d(4, 4, 3, padding=1, activation="relu"), nn.Flatten(), nn.Dense(4 * 4 * 4, 10)]
    model = nn.Sequential(layers, (1, 8, 8), seed=0, separable=2)
    model.build(4).compile("adam", lr=1e-2)
    x = rng.random((4, 1, 8, 8), dtype=np.float32)
    y = np.array([0, 1, 2, 3])
    before = model.get_weights()
    losses = [model.train_step(x, y).loss for _ in range(5)]
    assert losses[-1] < losses[0]
    after = model.get_weights()
    assert not np.array_equal(before["conv2d_1.weight"], after["conv2d_1.weight"])
    report = layers[0].svd_report()
    assert report.filters == 4 and report.rank == 1 and layers[2].svd_report().rank == 2
    assert model.backend.kernel_calls["sep_conv_fwd"] == 10 and model.backend.kernel_calls["conv_fwd"] == 0
    # The layer's output is the 2D convolution with W_eff.
    u, v = layers[0].factors()
    w_eff = effective_filters(u, v)
    assert np.linalg.matrix_rank(w_eff[0, 0].astype(np.float64), tol=1e-5) == 1


# -- the zoo and JSON ----------------------------------------------------------------------------------

@pytest.mark.parametrize("separable", [None, 1, "energy"])
def test_conv4_builds_and_trains_a_step(separable):
    model = nn.build_network("conv4", seed=0, separable=separable)
    assert model.input_shape == (3, 32, 32)
    assert model.layer_output_shapes == [(64, 32, 32), (64, 16, 16), (64, 16, 16), (64, 8, 8), (64, 8, 8),
                                         (32, 8, 8), (2048,), (10,)]
    convs = [layer for layer in model.layers if isinstance(layer, Conv2d)]
    assert [c.kernel_size for c in convs] == [(5, 5), (5, 5), (3, 3), (3, 3)]
    model.build(2).compile("sgd", lr=0.01)
    rng = np.random.default_rng(0)
    x = rng.random((2, 3, 32, 32), dtype=np.float32)
    before = model.get_weights()
    model.backend.kernel_calls.clear()
    step = model.train_step(x, np.array([3, 7]))
    assert np.isfinite(step.loss) and step.loss > 0
    after = model.get_weights()
    assert all(not np.array_equal(before[k], after[k]) for k in before)
    calls = model.backend.kernel_calls
    prefix = "" if separable is None else "sep_"
    assert calls[prefix + "conv_fwd"] == 4 and calls[prefix + "conv_wgrad"] == 4
    assert calls[prefix + "conv_bwd_data"] == 3
    if separable is not None:
        assert all(c.separable_rank is not None for c in convs)


def test_json_separable_keys(tmp_path):
    spec = {"input_shape": [1, 8, 8], "separable": "energy", "layers": [
        {"type": "conv2d", "out_channels": 4, "kernel_size": 3, "padding": 1, "separable": 2},
        {"type": "conv2d", "out_channels": 4, "kernel_size": 3, "padding": 1},
        {"type": "conv2d", "out_channels": 4, "kernel_size": 3, "padding": 1, "separable": False},
        {"type": "flatten"}, {"type": "dense", "out_features": 10}]}
    path = tmp_path / "net.json"
    path.write_text(json.dumps(spec))
    model = nn.network_from_json(path)
    assert model.separable == SeparableSetting(energy_share=0.9)
    convs = model.layers[:3]
    assert [c.separable for c in convs] == [SeparableSetting(rank=2), SeparableSetting(energy_share=0.9),
                                            SeparableSetting()]
    spec["layers"][0]["separable"] = "often"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"layers\[0\] \(conv2d\).*separable"):
        nn.network_from_json(path)


# -- on a GPU -------------------------------------------------------------------------------------------

def _pair_of_models(separable, backend_seed=0):
    def layers():
        return [Conv2d(3, 8, 5, padding=2, activation="relu"), nn.AvgPool2d(2),
                Conv2d(8, 8, 3, padding=1, activation="tanh"), nn.Flatten(), nn.Dense(8 * 6 * 6, 10)]

    gpu = nn.Sequential(layers(), (3, 12, 12), backend="cuda", seed=backend_seed, separable=separable)
    cpu = nn.Sequential(layers(), (3, 12, 12), backend=NumpyBackend(np.float64), seed=backend_seed,
                        separable=separable)
    return gpu, cpu


def _built_pair_with_separated_spectra(separable, rng):
    """The two models built at batch 4 with the same filters, whose singular values are well
    separated, so that float32 and float64 factor alike."""
    gpu, cpu = _pair_of_models(separable)
    gpu.build(4)
    cpu.build(4)
    weights = {k: v.astype(np.float64) for k, v in cpu.get_weights().items()}
    for name in ("conv2d_1.weight", "conv2d_2.weight"):
        K, C, R, S = weights[name].shape
        weights[name] = rank_r_weights(rng, K, C, R, S, min(R, S)) * 0.2
    for model in (gpu, cpu):
        for name, array in model.params().items():
            model.backend.upload(weights[name].astype(model.dtype), array)
    return gpu, cpu


@pytest.mark.gpu
@pytest.mark.parametrize("separable", [1, 2])
def test_cuda_separable_layers_match_the_numpy_backend(separable):
    rng = np.random.default_rng()
    gpu, cpu = _built_pair_with_separated_spectra(separable, rng)
    x = rng.random((4, 3, 12, 12), dtype=np.float32)
    y = np.array([1, 2, 3, 4])
    loss_gpu = gpu.loss_and_gradients(x, y)
    with relu_decisions_taken_from(gpu, cpu, 1e-4):   # a ReLU input at zero: one side's rounding
        loss_cpu = cpu.loss_and_gradients(x.astype(np.float64), y)
    assert loss_gpu == pytest.approx(loss_cpu, rel=1e-4)
    g_gpu = {k: gpu.backend.to_numpy(v) for k, v in gpu.grads().items()}
    for k, g in cpu.grads().items():
        assert np.linalg.norm(g_gpu[k] - g) <= 1e-4 * np.linalg.norm(g), k
    for layer in (gpu.layers[0], gpu.layers[2]):
        report = layer.svd_report()
        assert report.rank == separable and report.filters == layer.in_channels * layer.out_channels
    assert gpu.backend.generated_launches["sep_conv_fwd"] >= 2


@pytest.mark.gpu
def test_cuda_separable_training_steps():
    gpu, _ = _pair_of_models("energy")
    gpu.build(8).compile("adam", lr=1e-2)
    rng = np.random.default_rng()
    x = rng.random((8, 3, 12, 12), dtype=np.float32)
    y = rng.integers(0, 10, size=8)
    losses = [gpu.train_step(x, y).loss for _ in range(6)]   # the third and later replay a CUDA graph
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    report = gpu.layers[0].svd_report()
    assert report.mean_iterations[0] < 20


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["factored", "dense"])
def test_cuda_update_routes_match_the_numpy_backend(route):
    """Both weight-gradient routes give the numpy backend's gradients; the build measured both and
    took the faster."""
    rng = np.random.default_rng()
    gpu, cpu = _built_pair_with_separated_spectra(2, rng)
    convs = (gpu.layers[0], gpu.layers[2])
    for layer in convs:
        measured = layer._separable.route_us
        assert set(measured) == {"factored", "dense"} and all(t > 0 for t in measured.values())
        assert layer.separable_update_route == min(measured, key=measured.get)
        layer._separable.route = route
    x = rng.random((4, 3, 12, 12), dtype=np.float32)
    y = np.array([1, 2, 3, 4])
    calls = dict(gpu.backend.kernel_calls)
    gpu.loss_and_gradients(x, y)
    with relu_decisions_taken_from(gpu, cpu, 1e-4):
        cpu.loss_and_gradients(x.astype(np.float64), y)
    op = "conv_wgrad" if route == "dense" else "sep_conv_wgrad"
    assert gpu.backend.kernel_calls[op] - calls.get(op, 0) == 2
    g_gpu = {k: gpu.backend.to_numpy(v) for k, v in gpu.grads().items()}
    for k, g in cpu.grads().items():
        assert np.linalg.norm(g_gpu[k] - g) <= 1e-4 * np.linalg.norm(g), k
    for layer in convs:   # the factor gradients too, whichever route formed them
        gu, gv = (gpu.backend.to_numpy(a) for a in layer.factor_gradients())
        assert np.isfinite(gu).all() and np.isfinite(gv).all() and np.abs(gu).max() > 0


# -- scripts/separable_accuracy.py ------------------------------------------------------------------

def _accuracy_script():
    from tests.bench_module import load_script

    return load_script("separable_accuracy")


def test_accuracy_script_trains_each_setting_and_writes_its_runs(tmp_path, capsys):
    """On the numpy backend and a tiny written data set: one run per setting, the 2D baseline first,
    each layer's rank as the setting makes it, the table comparing with the baseline, the JSON."""
    import json

    from tests.test_nn_data import write_mnist_like

    write_mnist_like(tmp_path / "data", n_train=24, n_test=8)
    script = _accuracy_script()
    assert script.main(["--backend", "numpy", "--networks", "conv4", "--settings", "off,1,energy", "--epochs", "1",
                        "--batch-size", "8", "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "o")]) == 0
    runs = json.loads((tmp_path / "o" / "separable_accuracy.json").read_text())["runs"]
    assert [r["separable"] for r in runs] == ["off", "1", "energy"]
    assert [layer["rank"] for layer in runs[0]["layers"]] == [None] * 4
    assert [layer["rank"] for layer in runs[1]["layers"]] == [1] * 4
    energy = runs[2]["layers"]
    assert all(1 <= layer["rank"] <= min(layer["kernel"]) and layer["energy_kept"] >= 0.9 for layer in energy)
    assert all(0.0 <= r["final_test_accuracy"] <= 1.0 and len(r["epoch_seconds"]) == 1 for r in runs)
    table = capsys.readouterr().out
    assert "| conv4 | separable 1 | 1/1/1/1 |" in table and "vs 2D (points)" in table


def test_accuracy_script_refuses_bad_arguments_before_training(tmp_path, capsys):
    script = _accuracy_script()
    (tmp_path / "f").write_text("")
    for bad in (["--networks", "alexnet"], ["--settings", "rank1"], ["--epochs", "0"], ["--out", str(tmp_path / "f")]):
        with pytest.raises(SystemExit):
            script.main(bad)
        assert "error" in capsys.readouterr().err
