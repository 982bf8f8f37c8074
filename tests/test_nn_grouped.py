"""Grouped, depthwise and dilated Conv2d layers in the training library: construction errors, the
numpy backend's forward pass against a float64 loop over the groups (every element, at the
precision's bound), finite-difference gradients, their kernel problems (and no separable or fused
form), 16-bit layers, the JSON format and parameter files, and the kernels the cuda backend would
run: a default config of every problem planned for sm_90 and sm_80, and one layer's kernels run by
the CPU's CUDA emulator against float64."""
from __future__ import annotations

import json

import numpy as np
import pytest

from autocnn import nn
from autocnn.nn import AvgPool2d, Conv2d, Dense, Flatten, NumpyBackend, Sequential
from autocnn.precision import BF16, FP32
from tests.cuda_emulator import needs_gxx
from tests.test_nn_gradients import check_layer

# (constructor arguments, input shape): shapes that divide no tile, stride or window evenly.
GROUPED = (dict(in_channels=15, out_channels=9, kernel_size=3, stride=2, padding=(1, 2, 0, 1), groups=3,
                activation="relu"), (15, 11, 13))                                 # 3 groups of 5 channels
DEPTHWISE = (dict(in_channels=7, out_channels=14, kernel_size=3, padding=1, groups=7, activation="tanh"),
             (7, 9, 10))                                                         # channel multiplier 2
DILATED = (dict(in_channels=4, out_channels=5, kernel_size=(3, 2), stride=3, padding=(2, 1, 1, 2), dilation=2,
                activation="logistic"), (4, 13, 11))                             # dilation 2, stride 3
LAYERS = {"grouped": GROUPED, "depthwise": DEPTHWISE, "dilated": DILATED}


def conv_loop(x: np.ndarray, w: np.ndarray, bias: np.ndarray, stride, padding, groups: int, dilation) -> np.ndarray:
    """The convolution in float64 by the definition, a loop over groups, filters, channels and taps
    (independent of autocnn.kernels.reference's batched products)."""
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = stride, padding, dilation
    P = (H + pt + pb - (R - 1) * dh - 1) // sh + 1
    Q = (W + pl + pr - (S - 1) * dw - 1) // sw + 1
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    y = np.zeros((N, K, P, Q))
    per_group = K // groups
    for g in range(groups):
        for k in range(g * per_group, (g + 1) * per_group):
            y[:, k] = bias[k]
            for c in range(Cg):
                for r in range(R):
                    for s in range(S):
                        rows = slice(r * dh, r * dh + sh * (P - 1) + 1, sh)
                        cols = slice(s * dw, s * dw + sw * (Q - 1) + 1, sw)
                        y[:, k] += w[k, c, r, s] * xp[:, g * Cg + c, rows, cols]
    return y


def _built(kwargs: dict, input_shape, batch: int, dtype, rng) -> Conv2d:
    layer = Conv2d(**{**kwargs, "activation": "none"})
    layer.build(input_shape, batch, NumpyBackend(dtype), rng)
    for p in layer.params().values():
        p[...] = rng.normal(0, 0.5, size=p.shape)
    return layer


# -- construction -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(groups=4), r"Conv2d: groups=4 must divide in_channels=15 and out_channels=9 .*allowed: 1, 3$"),
    (dict(out_channels=10, groups=3), r"groups=3 must divide in_channels=15 and out_channels=10.*allowed: 1, 5$"),
    (dict(groups=0), r"Conv2d: groups must be an integer >= 1, got 0"),
    (dict(groups=True), r"groups must be an integer >= 1, got True"),
    (dict(groups=1.5), r"groups must be an integer >= 1, got 1.5"),
    (dict(dilation=0), r"Conv2d: dilation must be an integer >= 1, got 0"),
    (dict(dilation=(2, -1)), r"dilation must be an integer >= 1, got -1"),
    (dict(dilation=(1, 2, 3)), r"dilation must be an integer or \(height, width\), got \(1, 2, 3\)"),
    (dict(dilation="2"), r"dilation must be an integer >= 1, got '2'"),
    (dict(padding=5, dilation=2), r"padding \(5, 5, 5, 5\) must be smaller than the kernel \(3, 3\) \(dilated by "
                                  r"\(2, 2\): it spans 5x5\)"),
    (dict(name="block1_dw", groups=2), r"Conv2d 'block1_dw': groups=2 must divide in_channels=15"),
    (dict(groups=3, separable=1), r"separable=1 needs a dense, undilated layer.*this layer has groups=3"),
    (dict(dilation=2, separable="energy"), r"needs a dense, undilated layer.*dilation=\(2, 2\)"),
])
def test_construction_errors_name_the_layer_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Conv2d(**{"in_channels": 15, "out_channels": 9, "kernel_size": 3, **kwargs})


def test_arguments_weights_and_description():
    layer = Conv2d(15, 9, 3, padding=4, groups=3, dilation=(2, 4), name="g")   # padding under the 5x9 span
    assert layer.groups == 3 and layer.dilation == (2, 4) and layer.filter_extent == (5, 9)
    assert layer.param_shapes() == {"weight": (9, 5, 3, 3), "bias": (9,)}
    assert "groups=3, dilation=(2, 4)" in repr(layer)
    assert "groups" not in repr(Conv2d(15, 9, 3)) and Conv2d(15, 9, 3).param_shapes()["weight"] == (9, 15, 3, 3)
    assert layer.compute_output_shape((15, 8, 8)) == (9, 12, 8)
    with pytest.raises(ValueError, match=r"cannot run on input \(15, 2, 2\)"):
        Conv2d(15, 9, 3, groups=3, dilation=2).compute_output_shape((15, 2, 2))


def _mixed_model(**options) -> Sequential:
    return Sequential([Conv2d(3, 15, 3, padding=1, activation="relu"), Conv2d(15, 9, 3, groups=3, activation="relu"),
                       AvgPool2d(2), Conv2d(9, 9, 3, padding=2, dilation=2, activation="relu"), AvgPool2d(2),
                       Conv2d(9, 9, 3, padding=1, activation="relu"), AvgPool2d(2), Flatten(), Dense(9, 10)],
                      (3, 16, 16), **options)


def test_problems_carry_groups_and_dilation_and_offer_no_fused_form():
    problems = _mixed_model().problems(4, alternatives=True)
    grouped = [p for p in problems if getattr(p, "groups", 1) == 3]
    dilated = [p for p in problems if getattr(p, "dilation", (1, 1)) == (2, 2)]
    assert sorted(p.op for p in grouped) == sorted(p.op for p in dilated) == ["conv_bwd_data", "conv_fwd",
                                                                              "conv_wgrad"]
    assert all(p.w_shape == (9, 5, 3, 3) for p in grouped)
    # The dense layers are fused with the pooling after them and have a one-pass backward (the first
    # needs no input gradient); the grouped and dilated ones have neither.
    fused = [p for p in problems if p.op in ("conv_pool_fwd", "conv_bwd_fused")]
    assert sorted((p.op, p.C, p.H) for p in fused) == [("conv_bwd_fused", 9, 3), ("conv_pool_fwd", 9, 3)]


def test_grouped_and_dilated_layers_stay_2d_under_the_models_separable_setting():
    with pytest.warns(UserWarning, match=r"conv2d_2 \(groups=3 \(separable kernels run dense, undilated filters\)\); "
                                         r"conv2d_3 \(dilation=\(2, 2\) "):
        model = _mixed_model(separable=1)
        convs = [layer for layer in model.layers if isinstance(layer, Conv2d)]
        assert [c.separable.enabled for c in convs] == [True, False, False, True]
        problems = model.problems(4)
    assert {p.op for p in problems if p.op.startswith("sep_")} and all(
        not p.op.startswith("sep_") for p in problems if getattr(p, "groups", 1) != 1)


# -- the numpy backend -------------------------------------------------------------------------------

@pytest.mark.parametrize("which", sorted(LAYERS))
def test_numpy_forward_matches_a_float64_loop_over_groups(which, rng):
    kwargs, shape = LAYERS[which]
    for dtype, bound in ((np.float64, 1e-12), (np.float32, None)):
        layer = _built(kwargs, shape, 3, dtype, rng)
        x = rng.standard_normal((3, *shape)).astype(dtype)
        y = layer.forward(x).astype(np.float64)
        w, b = (layer.params()[k].astype(np.float64) for k in ("weight", "bias"))
        want = conv_loop(x.astype(np.float64), w, b, layer.stride, layer.padding, layer.groups, layer.dilation)
        assert y.shape == want.shape and np.isfinite(y).all()
        if bound is None:   # float32: the FP32 bound over one output's reduction
            bound = FP32.error_bound(w.shape[1] * w.shape[2] * w.shape[3])
        err = np.linalg.norm(y - want) / np.linalg.norm(want)
        assert err <= bound, (which, dtype, err)
        np.testing.assert_allclose(y, want, rtol=0, atol=50 * bound * np.abs(want).max())   # every element


@pytest.mark.parametrize("which", sorted(LAYERS))
def test_finite_difference_gradients(which, rng):
    kwargs, shape = LAYERS[which]
    check_layer(Conv2d(**kwargs), shape, rng)


def test_a_bf16_model_with_grouped_and_dilated_layers_steps_on_the_numpy_emulation(rng):
    model = Sequential([Conv2d(**GROUPED[0]), Conv2d(9, 9, 3, padding=2, dilation=2, groups=9, activation="relu"),
                        Flatten(), Dense(9 * 5 * 7, 10)], GROUPED[1], precision="bf16", seed=1)
    model.build(2).compile("adam", lr=1e-3)
    convs = [p for p in model.problems() if p.op.startswith("conv")]
    assert convs and all(p.precision is BF16 for p in convs) and {p.groups for p in convs} == {3, 9}
    x = rng.standard_normal((2, *GROUPED[1])).astype(np.float32)
    losses = [model.train_step(x, np.array([1, 7])).loss for _ in range(3)]
    assert np.isfinite(losses).all()
    out = model.layers[1].output_buffer
    np.testing.assert_array_equal(out, model.backend.round_to(BF16.x, out.copy()))   # stored as bf16 values


# -- the JSON format and parameter files -----------------------------------------------------------

NETWORK_JSON = {
    "input_shape": [15, 11, 13],
    "layers": [
        {"type": "conv2d", "out_channels": 9, "kernel_size": 3, "stride": 2, "padding": [1, 2, 0, 1], "groups": 3,
         "activation": "relu"},
        {"type": "conv2d", "out_channels": 18, "kernel_size": 3, "padding": 2, "groups": 9, "dilation": [2, 1]},
        {"type": "flatten"},
        {"type": "dense", "out_features": 10},
    ],
}


def _python_twin() -> Sequential:
    return Sequential([Conv2d(**GROUPED[0]), Conv2d(9, 18, 3, padding=2, groups=9, dilation=(2, 1)), Flatten(),
                       Dense(18 * 5 * 9, 10)], GROUPED[1])


def test_json_networks_and_parameter_files_round_trip(tmp_path, rng):
    path = tmp_path / "grouped.json"
    path.write_text(json.dumps(NETWORK_JSON))
    from_json = nn.network_from_json(path, seed=4)
    twin = _python_twin()
    assert from_json.problems(3) == twin.problems(3)
    assert [repr(a) for a in from_json.layers] == [repr(b) for b in twin.layers]
    from_json.build(3)
    saved = from_json.save(tmp_path / "weights.npz")
    twin.load(saved)
    x = rng.standard_normal((3, *GROUPED[1])).astype(np.float32)
    np.testing.assert_array_equal(twin.predict(x, batch_size=3), from_json.predict(x, batch_size=3))
    # A dense twin's weights are another shape: the file is refused with both shapes.
    dense = Sequential([Conv2d(**{**GROUPED[0], "groups": 1}), Conv2d(9, 18, 3, padding=2, dilation=(2, 1)),
                        Flatten(), Dense(18 * 5 * 9, 10)], GROUPED[1])
    with pytest.raises(ValueError, match=r"'conv2d_1.weight' has shape \(9, 5, 3, 3\) in the file, the model "
                                         r"expects \(9, 15, 3, 3\)"):
        dense.load(saved)


@pytest.mark.parametrize("change,message", [
    ({"groups": "3"}, r"layers\[0\] \(conv2d\): groups must be an integer, got '3'"),
    ({"groups": 4}, r"layers\[0\] \(conv2d\): Conv2d: groups=4 must divide in_channels=15 and out_channels=9"),
    ({"dilation": [2, "1"]}, r"layers\[0\] \(conv2d\): dilation must be an integer or a list of integers"),
    ({"dilation": 0}, r"layers\[0\] \(conv2d\): Conv2d: dilation must be an integer >= 1, got 0"),
])
def test_json_errors_for_groups_and_dilation(tmp_path, change, message):
    spec = json.loads(json.dumps(NETWORK_JSON))
    spec["layers"][0].update(change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=message):
        nn.network_from_json(path)


# -- what the cuda backend runs --------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_problem_of_the_layers_has_a_planned_default_on_sm90_and_sm80(precision):
    from autocnn.device import DeviceLimits
    from autocnn.kernels import get_operation

    model = Sequential([Conv2d(**GROUPED[0]), Conv2d(9, 18, 3, padding=1, groups=9, activation="tanh"),
                        Conv2d(18, 5, (3, 2), stride=3, padding=(2, 1, 1, 2), dilation=2, activation="logistic"),
                        Flatten(), Dense(5 * 2 * 3, 10)], GROUPED[1], precision=precision)
    problems = model.problems(5, alternatives=True)
    assert {p.groups for p in problems} == {1, 3, 9} and {p.dilation for p in problems} == {(1, 1), (2, 2)}
    for arch in ("sm_90", "sm_80"):
        limits = DeviceLimits.for_arch(arch)
        for p in problems:
            operation = get_operation(p.op)
            config = operation.default_config(p, limits)
            plan = operation.plan(p, config)
            assert plan.launches, (arch, p.shape_string())
            if p.groups == 9:   # groups == C: depthwise's kernels first
                assert config["formulation"] == "depthwise", (arch, p.op)


@needs_gxx
@pytest.mark.parametrize("which,precision", [
    ("grouped", "fp32"),
    pytest.param("depthwise", "bf16", marks=pytest.mark.slow),
    pytest.param("dilated", "fp16", marks=pytest.mark.slow),
])
def test_the_layers_kernels_verify_under_emulation(which, precision, tmp_path):
    """The forward (bias and activation fused), backward-data and weight-gradient problems the layer
    makes, each by its default config on sm_90, run by the CPU's CUDA emulator on fresh random inputs
    and verified against float64, every element, at the precision's bound."""
    import random

    from autocnn.device import DeviceLimits
    from autocnn.kernels import get_operation
    from autocnn.precision import precision_named
    from tests.cuda_emulator import emulated_failure

    kwargs, shape = LAYERS[which]
    layer = Conv2d(**kwargs, precision=precision)
    problems = layer.make_problems(shape, 2)
    assert [p.op for p in problems] == ["conv_fwd", "conv_bwd_data", "conv_wgrad"]
    assert all(p.precision is precision_named(precision) for p in problems)
    limits, seed = DeviceLimits.for_arch("sm_90"), random.randrange(2**31)
    failures = []
    for i, p in enumerate(problems):
        operation = get_operation(p.op)
        why = emulated_failure(operation, p, operation.default_config(p, limits), tmp_path, seed + i)
        if why:
            failures.append(why)
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)
