"""Mixed precision in the training library on the CPU (autocnn.nn.mixed_precision): bf16 and fp16
models on the numpy backend, which emulates the 16-bit tensors by rounding every tensor a 16-bit
layer writes; the FP32 master weights; fp16's dynamic loss scaling; the refusals. The cuda
backend's kernels are compiled here with nvcc and run on a GPU host (tests/test_amp_gpu.py)."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from autocnn.measurement import element_arrays
from autocnn.nn import Adam, AvgPool2d, Conv2d, Dense, Flatten, NumpyBackend, Sequential
from autocnn.nn.mixed_precision import (CLEAN_STEPS, FOUND, SCALE, SKIPPED, LossScaler, LossScaling, ScaleUse)
from autocnn.precision import BF16, BFLOAT16, FLOAT16, FLOAT32, FP16, FP32

SHAPE = (3, 11, 13)   # sizes that divide no tile or window evenly
CLASSES = 4


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random images whose label the mean of two channels decides: a convnet learns it in a few steps."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *SHAPE)).astype(np.float32)
    y = (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)
    return x, y


def convnet(precision, seed: int = 1, activation: str = "relu", **options) -> Sequential:
    return Sequential([Conv2d(3, 6, 3, padding=1, activation=activation), AvgPool2d(2, padding=(0, 1, 1, 0)),
                       Conv2d(6, 8, 3, activation=activation), Flatten(), Dense(8 * 4 * 5, CLASSES)],
                      input_shape=SHAPE, seed=seed, precision=precision, **options)


def on_grid(a: np.ndarray, element) -> bool:
    """Whether every value of ``a`` is a value of ``element`` (what its storage holds)."""
    back = element_arrays.values(element_arrays.rounded(a, element, np), element, np)
    return bool(np.array_equal(back, a.astype(np.float32), equal_nan=True))


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# -- training ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", [BF16, FP16])
def test_a_convnet_trains_in_sixteen_bits_with_fp32_master_weights(precision):
    x, y = data(64, seed=5)
    model = convnet(precision).compile(Adam(lr=3e-3))
    model.build(32)
    losses = [model.train_step(x[i % 2 * 32:][:32], y[i % 2 * 32:][:32]).loss for i in range(40)]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4]), losses
    weights = model.get_weights()
    assert all(w.dtype == np.float32 for w in weights.values())
    # The masters moved off the 16-bit grid (updates smaller than a 16-bit step accumulate there) ...
    assert not on_grid(weights["conv2d_1.weight"], precision.x)
    # ... the kernels' copies are the masters rounded (cast at each forward pass), and every tensor a
    # 16-bit layer stores is on the grid.
    model.loss_and_gradients(x[:32], y[:32])
    conv = model.layers[0]
    np.testing.assert_array_equal(conv._kernel_param("weight"),
                                  element_arrays.values(element_arrays.rounded(weights["conv2d_1.weight"],
                                                                                precision.x, np), precision.x, np))
    for layer in (*model.layers[:3], model.layers[4]):   # the Dense layer too (its GEMMs on 16-bit operands)
        assert layer.element == precision.x and on_grid(layer.output_buffer, precision.x)
    assert on_grid(conv._kernel_grad("weight"), precision.x) and on_grid(model.layers[4]._kernel_grad("weight"),
                                                                         precision.x)
    assert not model.layers[4].can_end_with_loss   # 16-bit logits reach the FP32 loss through a cast
    assert sorted(model._boundaries) == [0, 5]
    assert (model.loss_scaler is not None) == (precision is FP16)
    if model.loss_scaler is not None:
        assert model.loss_scaler.scale == 2.0 ** 16 and not model.loss_scaler.last_step_skipped


def test_sixteen_bit_gradients_follow_the_fp32_ones_within_the_roundings():
    """One batch's gradients at bf16 and fp16 against fp32's, from the same weights: tanh (no ReLU
    decision a rounding could flip). Each 16-bit tensor on the way is rounded once, moving it by
    at most the precision's output_rounding (twice the unit roundoff) of itself; the gradients of
    the first layer pass through every such tensor forward and back, so they may be off by at most
    their count times it (errors adding in the worst case, not in quadrature)."""
    x, y = data(16, seed=9)
    reference = convnet(FP32, activation="tanh")
    reference.build(16)
    reference.loss_and_gradients(x, y)
    # input cast, weights, conv, pool, conv, dense outputs; their gradients back, and the weight gradients
    roundings = 6 + 6 + 2
    for precision in (BF16, FP16):
        model = convnet(precision, activation="tanh")
        model.build(16)
        model.loss_and_gradients(x, y)
        for name, grad in model.grads().items():
            assert grad.dtype == np.float32
            error = rel(grad, reference.grads()[name])
            assert error <= roundings * precision.output_rounding, (precision.name, name, error)
            assert error > 0, (precision.name, name)   # the emulation rounded


def test_fp32_layers_in_a_sixteen_bit_model_are_cast_at_their_boundaries():
    model = Sequential([Conv2d(3, 6, 3, padding=1, activation="tanh"), AvgPool2d(2),
                        Conv2d(6, 4, 3, activation="tanh", precision="fp32"), Flatten(),
                        Dense(4 * 3 * 4, CLASSES, precision="fp32")],
                       input_shape=SHAPE, seed=2, precision="bf16")
    model.build(8)
    assert [layer.element for layer in model.layers] == [BFLOAT16, BFLOAT16, FLOAT32, FLOAT32, FLOAT32]
    assert sorted(model._boundaries) == [0, 2]   # the input into bf16, bf16 into the fp32 convolution
    assert model._boundaries[0].backward is None   # nothing before the first layer takes a gradient
    assert model._boundaries[2].backward_use is ScaleUse.SCALE_UP
    assert model.layers[4].can_end_with_loss   # an FP32 Dense last layer keeps the fused head
    x, y = data(8, seed=3)
    model.loss_and_gradients(x, y)
    assert on_grid(model.layers[1].output_buffer, BFLOAT16) and on_grid(model._boundaries[2].backward, BFLOAT16)
    assert model._sixteen.runs == ((0, 6 * 3 * 9 + 6),)   # the first convolution's weight and bias


def test_a_sixteen_bit_last_layer_hands_fp32_logits_to_the_loss():
    model = Sequential([Conv2d(3, CLASSES, (11, 13), activation="none"), Flatten()], input_shape=SHAPE, seed=4,
                       precision="fp16")
    model.compile(Adam(lr=1e-2)).build(8)
    assert sorted(model._boundaries) == [0, 2]
    assert model._boundaries[2].backward_use is ScaleUse.SCALE_UP
    x, y = data(8, seed=1)
    losses = [model.train_step(x, y).loss for _ in range(15)]
    assert losses[-1] < losses[0]


def test_changing_the_precision_rebuilds_with_the_weights_kept():
    x, y = data(8, seed=2)
    model = convnet(FP32).compile("sgd")
    model.build(8)
    model.train_step(x, y)
    before = model.get_weights()
    model.precision = "bf16"
    assert model._sixteen is not None and model.layers[0].element == BFLOAT16
    assert all(np.array_equal(before[k], v) for k, v in model.get_weights().items())
    model.train_step(x, y)
    model.precision = FP32
    assert model._sixteen is None and model.layers[0]._kernel_params is None and model.loss_scaler is None
    assert "precision='fp32'" in repr(model)


def test_the_report_says_the_precision():
    from autocnn.nn.training import describe_precision

    model = Sequential([Conv2d(3, 4, 3, activation="tanh"), Conv2d(4, 4, 3, precision="fp32"), Flatten(),
                        Dense(4 * 7 * 9, CLASSES)], input_shape=SHAPE, precision="fp16")
    model.build(2)
    text = describe_precision(model)
    assert text.startswith("fp16 (conv2d_2 fp32)") and "FP32 master weights" in text and "loss scale 65536" in text
    report = model.dispatch_report()
    assert re.search(r"dense_1\s+dense\s+fp16 .*float16 values \(emulated\)", report), report
    assert "precision fp16" in model.summary()
    assert "'fp16'" in repr(model)


# -- dynamic loss scaling ---------------------------------------------------------------------------

def test_the_loss_scaler_halves_on_inf_skips_and_grows_after_clean_steps():
    backend = NumpyBackend()
    scaler = LossScaler(backend, LossScaling(init_scale=1024.0, growth_interval=3))
    g32, g16 = np.zeros(6, np.float32), np.array([2.0, 4.0, 8.0, 16.0, 0.0, 0.0], np.float32)
    backend.gradients_to_fp32(g32, g16, FLOAT16, ((0, 4),), scaler.state)
    np.testing.assert_array_equal(g32, [2 / 1024, 4 / 1024, 8 / 1024, 16 / 1024, 0, 0])
    assert scaler.state[FOUND] == 0
    g16[1] = np.inf
    backend.gradients_to_fp32(g32, g16, FLOAT16, ((0, 4),), scaler.state)
    assert scaler.state[FOUND] == 1
    scaler.update()
    assert (scaler.scale, scaler.clean_steps, scaler.last_step_skipped) == (512.0, 0, True)
    assert scaler.state[FOUND] == 0
    g16[1] = 4.0
    g32[5] = np.nan   # a non-finite gradient of an FP32 layer flags the step as well
    backend.gradients_to_fp32(g32, g16, FLOAT16, ((0, 4),), scaler.state)
    assert scaler.state[FOUND] == 1
    scaler.update()
    g32[5] = 0.0
    assert scaler.scale == 256.0
    for step in range(3):
        backend.gradients_to_fp32(g32, g16, FLOAT16, ((0, 4),), scaler.state)
        scaler.update()
        assert not scaler.last_step_skipped
    assert (scaler.scale, scaler.clean_steps) == (512.0, 0)   # doubled after three clean steps in a row


def test_a_skipped_step_leaves_weights_state_and_step_count():
    backend = NumpyBackend()
    p, g = np.ones(5, np.float32), np.full(5, 0.5, np.float32)
    opt = Adam(lr=0.1)
    opt.setup({"p": p})
    flag = np.array([1.0], np.float32)
    opt.begin_step()
    opt.apply({"p": p}, {"p": g}, skip=flag)
    assert opt.iterations == 0 and np.array_equal(p, np.ones(5)) and not opt.state("p")["m"].any()
    flag[0] = 0.0
    opt.begin_step()
    opt.apply({"p": p}, {"p": g}, skip=flag)
    assert opt.iterations == 1 and (p < 1).all()
    del backend


def test_an_overflowing_fp16_model_skips_until_the_scale_fits_then_learns():
    """A scale of 2^40 makes every scaled gradient overflow float16: the first steps are skipped
    (weights as they were, the scale halved each time) until it fits; then the model learns, and
    with a growth interval of 4 the scale grows again after four clean steps."""
    x, y = data(32, seed=7)
    model = convnet(FP16, loss_scaling=LossScaling(init_scale=2.0 ** 40, growth_interval=4)).compile(Adam(lr=3e-3))
    model.build(32)
    start = model.get_weights()
    model.train_step(x, y)
    scaler = model.loss_scaler
    assert scaler.last_step_skipped and scaler.scale == 2.0 ** 39
    assert all(np.array_equal(start[k], v) for k, v in model.get_weights().items())
    assert model.optimizer.iterations == 0
    skipped = 1
    for _ in range(60):
        model.train_step(x, y)
        skipped += scaler.last_step_skipped
    assert 10 <= skipped < 40 and not scaler.last_step_skipped
    assert scaler.scale < 2.0 ** 30
    losses = [model.train_step(x, y).loss for _ in range(20)]
    assert losses[-1] < losses[0]
    grown = scaler.scale
    state = scaler.state.copy()
    assert state[SCALE] == grown and 0 <= state[CLEAN_STEPS] < 4 and state[SKIPPED] in (0, 1)


# -- refusals ---------------------------------------------------------------------------------------

def test_refusals_name_what_is_allowed():
    with pytest.raises(ValueError, match="fp32, tf32, bf16, fp16"):
        Conv2d(3, 4, 3, precision="int8")
    with pytest.raises(ValueError, match="fp32, tf32, bf16, fp16"):
        Sequential([Flatten(), Dense(3 * 11 * 13, 2)], input_shape=SHAPE, precision="half")
    with pytest.raises(ValueError, match="fp32, tf32, bf16, fp16 or None"):
        AvgPool2d(2, precision="fp8")
    with pytest.raises(ValueError, match=r"share one 16-bit precision.*conv2d_1 bfloat16, conv2d_2 float16"):
        Sequential([Conv2d(3, 4, 3, precision="bf16"), Conv2d(4, 4, 3, precision="fp16"), Flatten(),
                    Dense(4 * 7 * 9, 2)], input_shape=SHAPE, backend="cuda")   # refused before a GPU is asked for
    model = Sequential([Conv2d(3, 4, 3, precision="bf16"), Conv2d(4, 4, 3), Flatten(), Dense(4 * 7 * 9, 2)],
                       input_shape=SHAPE)
    with pytest.raises(ValueError, match=r"share one 16-bit precision.*conv2d_1 bfloat16, conv2d_2 float16, "
                                         r"flatten_1 float16, dense_1 float16"):
        model.precision = "fp16"
    assert model.precision == "fp32" and model.layers[1].precision == "fp32"   # as it was
    separable = Sequential([Conv2d(3, 4, 3, separable=1), Flatten(), Dense(4 * 9 * 11, 2)], input_shape=SHAPE,
                           precision="bf16")
    with pytest.raises(ValueError, match="separable layer runs float32 factors"):
        separable.build(2)
    with pytest.raises(ValueError, match="growth_factor must be a number > 1"):
        LossScaling(growth_factor=0.5)
    with pytest.raises(ValueError, match="growth_interval must be an integer"):
        LossScaling(growth_interval=0)
    with pytest.raises(TypeError, match="loss_scaling must be"):
        convnet(FP16, loss_scaling={"init_scale": 8.0})


def test_the_train_command_takes_the_sixteen_bit_precisions():
    import argparse

    from autocnn.cli.train import add_parser, train_command

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert train_command(parser.parse_args(["train", "--network", "lenet5", "--precision", "bf16"])).precision == "bf16"
    assert train_command(parser.parse_args(["train", "--network", "lenet5", "--precision", "fp16"])).precision == "fp16"
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--network", "lenet5", "--precision", "int8"])


# -- the kernels compile ----------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_mixed_precision_kernels_compile_without_spills(tmp_path, arch):
    from autocnn.kernels.compiler import cuda_include_dir
    from autocnn.nn import fused_sixteen_bit

    source = tmp_path / "nn_sixteen_bit.cu"
    source.write_text(fused_sixteen_bit.render_source())
    include = cuda_include_dir()
    result = subprocess.run(["nvcc", "-std=c++17", f"-arch={arch}", "-cubin", "-Xptxas", "-v", str(source),
                             *([f"-I{include}"] if include else []), "-o", str(tmp_path / "nn16.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    for suffix in ("bf16", "fp16"):
        for kernel in ("nn_cast_f32_to_", "nn_cast_", "nn_gradients_to_f32_", "nn_activation_", "nn_activation_grad_",
                       "nn_bias_activation_to_", "nn_activation_grad_colsum_"):
            name = f"{kernel}{suffix}" + ("_to_f32" if kernel == "nn_cast_" else "")
            assert f"Function properties for {name}" in result.stderr, name
    assert "Function properties for nn_loss_scale_update" in result.stderr
    assert not re.search(r"[1-9][0-9]* bytes spill", result.stderr), result.stderr


def test_autocnn_train_runs_a_sixteen_bit_model_end_to_end(tmp_path, capsys):
    """`autocnn train --precision bf16|fp16` on the numpy backend (its emulation): the report says
    the precision, every convolution and the Dense layers dispatch at it, the weights saved are FP32."""
    from autocnn.cli import main
    from tests.test_nn_data import write_mnist_like

    write_mnist_like(tmp_path / "fashion", n_train=32, n_test=16, seed=3)
    for name in ("bf16", "fp16"):
        saved = tmp_path / f"{name}.npz"
        assert main(["train", "--network", "lenet5", "--data-root", str(tmp_path / "fashion"), "--epochs", "1",
                     "--batch-size", "16", "--backend", "numpy", "--precision", name, "--seed", "0",
                     "--save", str(saved)]) == 0
        out = capsys.readouterr().out
        assert f"precision {name}, mixed: FP32 master weights" in out.splitlines()[0]
        rows = [line.split() for line in out.splitlines() if line.startswith(("conv2d_", "dense_"))]
        assert rows and {row[2] for row in rows} == {name}
        with np.load(saved) as weights:
            params = [k for k in weights.files if k.startswith("layers/")]
            assert params and all(weights[k].dtype == np.float32 for k in params)


def test_a_json_network_sets_the_precision_of_pooling_and_dense_layers():
    from autocnn.nn.zoo import network_from_dict

    layers = [{"type": "conv2d", "out_channels": 4, "kernel_size": 3, "activation": "tanh"},
              {"type": "avgpool2d", "window": 2, "precision": "fp32"},
              {"type": "flatten"}, {"type": "dense", "out_features": 3, "precision": "fp32"}]
    model = network_from_dict({"input_shape": list(SHAPE), "layers": layers})
    model.precision = "bf16"
    model.build(2)
    assert [layer.element for layer in model.layers] == [BFLOAT16, FLOAT32, FLOAT32, FLOAT32]
    assert model.layers[3].can_end_with_loss and sorted(model._boundaries) == [0, 1]
    assert "precision='fp32'" in repr(model.layers[1]) and "precision='fp32'" in repr(model.layers[3])


@pytest.mark.parametrize("precision", [BF16, FP16])
def test_a_replayed_sixteen_bit_step_gives_the_eager_results(precision):
    """On a stand-in backend whose 'capture' keeps the step (tests/test_nn_step_replay.py), the
    replayed mixed-precision steps, the weights' cast, the casts at the boundaries, the gradients'
    way into FP32 and the loss scaler's update included, match eager steps bit for bit, and an
    overflowing fp16 step is skipped inside the replayed step too."""
    from tests.test_nn_step_replay import RecordingBackend

    x, y = data(40, seed=5)
    be = RecordingBackend()
    scaling = LossScaling(init_scale=2.0 ** 30)   # the first steps overflow fp16 and are skipped
    replayed = convnet(precision, backend=be, loss_scaling=scaling).compile(Adam(lr=3e-3)).build(8)
    eager = convnet(precision, loss_scaling=scaling).compile(Adam(lr=3e-3)).build(8)
    for start in range(0, 40, 8):
        a = replayed.train_step(x[start:start + 8], y[start:start + 8])
        b = eager.train_step(x[start:start + 8], y[start:start + 8])
        assert (a.loss, a.accuracy) == (b.loss, b.accuracy)
    assert (be.captures, be.replays) == (1, 4)
    for k, v in eager.get_weights().items():
        np.testing.assert_array_equal(replayed.get_weights()[k], v, err_msg=k)
    if precision is FP16:
        assert replayed.loss_scaler.scale == eager.loss_scaler.scale < 2.0 ** 30
        np.testing.assert_array_equal(replayed.loss_scaler.state, eager.loss_scaler.state)
        assert replayed.optimizer.iterations == eager.optimizer.iterations < 5


@pytest.mark.parametrize("precision", [BF16, FP16])
def test_one_sixteen_bit_layer_in_an_fp32_model_trains(precision):
    """Per layer: only the second convolution at 16 bits; casts before and after it, the loss
    scaler there for fp16 alone, and the FP32 layers' parameters updated from unscaled gradients."""
    x, y = data(32, seed=11)
    model = Sequential([Conv2d(3, 6, 3, padding=1, activation="tanh"), AvgPool2d(2),
                        Conv2d(6, 8, 3, activation="tanh", precision=precision), Flatten(),
                        Dense(8 * 3 * 4, CLASSES)], input_shape=SHAPE, seed=3)
    model.compile(Adam(lr=3e-3)).build(16)
    assert [layer.element for layer in model.layers] == [FLOAT32, FLOAT32, precision.x, precision.x, FLOAT32]
    assert sorted(model._boundaries) == [2, 4]
    assert (model.loss_scaler is not None) == (precision is FP16)
    reference = Sequential([Conv2d(3, 6, 3, padding=1, activation="tanh"), AvgPool2d(2),
                            Conv2d(6, 8, 3, activation="tanh"), Flatten(), Dense(8 * 3 * 4, CLASSES)],
                           input_shape=SHAPE, seed=3).build(16)
    model.loss_and_gradients(x[:16], y[:16])
    reference.loss_and_gradients(x[:16], y[:16])
    for name, grad in reference.grads().items():   # unscaled: within the layer's roundings of FP32's
        assert rel(model.grads()[name], grad) <= 6 * precision.output_rounding, name
    losses = [model.train_step(x[i % 2 * 16:][:16], y[i % 2 * 16:][:16]).loss for i in range(30)]
    assert losses[-1] < 0.7 * losses[0]
    assert "precision=" in repr(model.layers[2]) and repr(precision.name) in repr(model.layers[2])


def test_a_sixteen_bit_model_offers_tuning_no_fused_problem():
    """Tuning a bf16 model (``problems(alternatives=True)``, ``autocnn tune --network``) covers the
    kernels it runs: its layers at bf16, no fused alternative (those take float32 tensors)."""
    from autocnn.nn.zoo import load_network

    model = load_network("convnet18")
    model.precision = "bf16"
    problems = model.problems(16, alternatives=True)
    assert problems and {p.op for p in problems} == {"conv_fwd", "conv_bwd_data", "conv_wgrad", "avgpool_fwd",
                                                     "avgpool_bwd"}
    assert all(p.precision is BF16 for p in problems)
    model.precision = "fp32"
    assert {"conv_pool_fwd", "conv_pool_dz"} <= {p.op for p in model.problems(16, alternatives=True)}
