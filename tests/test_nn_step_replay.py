"""The parameter arena, flat optimizer updates and the captured-step orchestration, on the CPU.

A model keeps every parameter in one flat buffer (and every gradient in another); optimizers set
up on it update the whole model in one pass, bit for bit like per-parameter updates. On a backend
that can capture a step (CUDA graphs on the cuda backend), the first step after a build or an
optimizer change runs eagerly, the second is captured and replayed, later ones only replay. Here
a numpy backend stands in for the GPU: its "capture" records the step function and its replay
runs it again, so the control flow, the counters and the results can be checked without a GPU.
The fused GPU kernels themselves are compiled here with nvcc and checked on a GPU host
(tests/test_gpu_training.py).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest

from autocnn.nn import RPROP, SGD, Adam, AvgPool2d, Conv2d, Dense, Flatten, NumpyBackend, Sequential
from autocnn.nn.arena import ParameterArena
from autocnn.nn.backend import CapturedStep


def images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 1.0, size=(n, 2, 8, 8)).astype(np.float32), rng.integers(0, 3, size=n)


def net(backend=None, seed: int = 0) -> Sequential:
    return Sequential([Conv2d(2, 4, 3, padding=1, activation="relu"), AvgPool2d(2),
                       Conv2d(4, 4, 3, padding=1, activation="tanh"), Flatten(),
                       Dense(64, 8, activation="logistic"), Dense(8, 3)],
                      input_shape=(2, 8, 8), seed=seed, backend=backend or "numpy")


OPTIMIZERS = {
    "adam": lambda: Adam(lr=0.01, weight_decay=0.001),
    "sgd": lambda: SGD(lr=0.05, momentum=0.9, nesterov=True),
    "rprop": lambda: RPROP(step_init=0.01),
}


# -- the arena ------------------------------------------------------------------------------------

def test_parameters_and_gradients_live_in_one_flat_buffer_each():
    model = net(seed=3)
    before = {k: v.copy() for k, v in net(seed=3).build(4).get_weights().items()}
    model.build(4)
    arena = model._arena
    assert arena is not None and arena.size == sum(v.size for v in before.values())
    assert list(arena.slots) == list(model.params())
    for name, p in model.params().items():
        np.testing.assert_array_equal(p, before[name])      # values kept by the move
        assert np.shares_memory(p, arena.params) and np.shares_memory(model.grads()[name], arena.grads)
        assert p is arena.param_views[name]
    # Writing through a layer's parameter writes the arena, and rebuilding keeps the arena.
    model.layers[0].params()["weight"][...] = 7.0
    assert np.count_nonzero(arena.params == 7.0) == model.layers[0].params()["weight"].size
    model.build(6)
    assert model._arena is arena and model.params()["conv2d_1.weight"] is arena.param_views["conv2d_1.weight"]


def test_a_model_without_parameters_has_no_arena():
    model = Sequential([AvgPool2d(1), Flatten()], input_shape=(3, 1, 1)).build(2)
    assert model._arena is None and model.params() == {}
    assert ParameterArena.gather(model.layers, model.backend) is None
    with pytest.raises(ValueError, match="at least one parameter"):
        ParameterArena(NumpyBackend(), {})


def test_load_writes_into_the_arena(tmp_path):
    a, b = net(seed=1).build(4), net(seed=2).build(4)
    path = a.save(tmp_path / "a.npz")
    arena = b._arena
    b.load(path)
    assert b._arena is arena
    for name, value in a.get_weights().items():
        np.testing.assert_array_equal(b.params()[name], value)
        assert b.params()[name] is arena.param_views[name]


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_flat_updates_match_per_parameter_updates_bit_for_bit(make):
    rng = np.random.default_rng(4)
    shapes = {"a.weight": (3, 2, 2, 2), "a.bias": (3,), "b.weight": (12, 5)}
    arena = ParameterArena(NumpyBackend(), shapes)
    arena.params[...] = rng.normal(size=arena.size)
    loose = {k: arena.param_views[k].copy() for k in shapes}
    flat_opt, loose_opt = make(), make()
    flat_opt.setup(arena.param_views, arena=arena)
    for step in range(6):
        arena.grads[...] = rng.normal(size=arena.size) * (rng.random(arena.size) > 0.2)
        grads = {k: arena.grad_views[k].copy() for k in shapes}
        if step == 3 and hasattr(flat_opt, "lr"):
            flat_opt.lr = loose_opt.lr = flat_opt.lr / 2   # a schedule changes it between steps
        flat_opt.step(arena.param_views, arena.grad_views)
        loose_opt.step(loose, grads)
        for k in shapes:
            np.testing.assert_array_equal(arena.param_views[k], loose[k], err_msg=f"{k} step {step}")
            for key, value in loose_opt.state(k).items():
                if key != "scratch":
                    np.testing.assert_array_equal(flat_opt.state(k)[key], value, err_msg=f"{k} {key}")
    assert flat_opt.iterations == loose_opt.iterations == 6


def test_setup_refuses_an_arena_the_parameters_are_not_views_of():
    arena = ParameterArena(NumpyBackend(), {"w": (2,)})
    with pytest.raises(ValueError, match="arena"):
        Adam().setup({"w": np.zeros(2, dtype=np.float32)}, arena=arena)


def test_steps_on_other_arrays_fall_back_to_per_parameter_updates():
    # An optimizer set up on an arena, stepped with copies: it updates the copies (views of its state).
    arena = ParameterArena(NumpyBackend(), {"w": (3,)})
    arena.params[...] = 1.0
    opt = SGD(lr=0.1, momentum=0.9)
    opt.setup(arena.param_views, arena=arena)
    copies = {"w": arena.param_views["w"].copy()}
    opt.step(copies, {"w": np.full(3, 0.5, dtype=np.float32)})
    np.testing.assert_allclose(copies["w"], 0.95)
    np.testing.assert_array_equal(arena.params, 1.0)
    np.testing.assert_allclose(opt.state("w")["velocity"], 0.5)


def test_sgd_momentum_switched_on_after_setup():
    p = {"w": np.ones(2, dtype=np.float32)}
    opt = SGD(lr=0.1)
    opt.step(p, {"w": np.full(2, 1.0, dtype=np.float32)})   # set up without momentum
    opt.momentum = 0.5
    opt.step(p, {"w": np.full(2, 1.0, dtype=np.float32)})
    np.testing.assert_allclose(p["w"], 1.0 - 0.1 - 0.1)   # velocity starts from zero: v = g
    opt.step(p, {"w": np.full(2, 1.0, dtype=np.float32)})
    np.testing.assert_allclose(p["w"], 0.8 - 0.15)        # v = 0.5 * 1 + 1


# -- captured steps -------------------------------------------------------------------------------

class ReplayStep(CapturedStep):
    def __init__(self, backend: "RecordingBackend", step) -> None:
        self.backend, self.step = backend, step

    def replay(self) -> None:
        self.backend.replays += 1
        self.step()


class RecordingBackend(NumpyBackend):
    """A numpy backend that 'captures' by keeping the step function (replay runs it again)."""

    can_capture = True

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.captures = self.replays = 0
        self.fail = fail

    def capture(self, step):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        return ReplayStep(self, step)


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_replayed_steps_give_the_eager_results(make):
    x, y = images(40, seed=5)
    be = RecordingBackend()
    replayed, eager = net(be, seed=6).build(8).compile(make()), net(seed=6).build(8).compile(make())
    for start in range(0, 40, 8):
        a = replayed.train_step(x[start:start + 8], y[start:start + 8])
        b = eager.train_step(x[start:start + 8], y[start:start + 8])
        assert (a.loss, a.accuracy) == (b.loss, b.accuracy)
    assert (be.captures, be.replays) == (1, 4)   # step 1 eager, step 2 captured and replayed, 3-5 replayed
    for k, v in eager.get_weights().items():
        np.testing.assert_array_equal(replayed.get_weights()[k], v, err_msg=k)


def test_a_rebuild_or_a_new_optimizer_captures_again():
    x, y = images(16, seed=7)
    be = RecordingBackend()
    model = net(be).build(8).compile(Adam(0.01))
    for _ in range(3):
        model.train_step(x[:8], y[:8])
    assert be.captures == 1
    model.build(4)                       # new buffers: warm-up, then a new capture
    model.train_step(x[:4], y[:4])
    assert be.captures == 1
    model.train_step(x[:4], y[:4])
    assert be.captures == 2
    model.compile(SGD(0.01))             # another optimizer: its state is new
    model.train_step(x[:4], y[:4])
    model.train_step(x[:4], y[:4])
    assert be.captures == 3
    model.use_graphs = False             # switched off: eager from now on
    replays = be.replays
    model.train_step(x[:4], y[:4])
    assert be.replays == replays and be.captures == 3


def test_fit_replays_and_matches_eager_fit():
    x, y = images(45, seed=8)            # two batches of 16, one padded batch of 13
    be = RecordingBackend()
    replayed, eager = net(be, seed=9), net(seed=9)
    h1 = replayed.fit(x, y, epochs=2, batch_size=16, optimizer=Adam(0.01), verbose=False, lr_schedule="cosine")
    h2 = eager.fit(x, y, epochs=2, batch_size=16, optimizer=Adam(0.01), verbose=False, lr_schedule="cosine")
    assert h1.loss == h2.loss and h1.accuracy == h2.accuracy
    assert be.captures == 1 and be.replays == 6 - 1   # every step but the first (eager)
    for k, v in eager.get_weights().items():
        np.testing.assert_array_equal(replayed.get_weights()[k], v, err_msg=k)


def test_a_step_that_cannot_be_captured_runs_eagerly_with_one_warning():
    x, y = images(8, seed=10)
    model = net(RecordingBackend(fail=True), seed=11).build(8).compile(Adam(0.01))
    reference = net(seed=11).build(8).compile(Adam(0.01))
    model.train_step(x, y)
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        model.train_step(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.train_step(x, y)
    for _ in range(3):
        reference.train_step(x, y)
    assert model.use_graphs is False
    for k, v in reference.get_weights().items():
        np.testing.assert_array_equal(model.get_weights()[k], v, err_msg=k)


def test_the_numpy_backend_cannot_capture():
    be = NumpyBackend()
    assert not be.can_capture
    with pytest.raises(NotImplementedError, match="numpy"):
        be.capture(lambda: None)


# -- the fused GPU kernels compile --------------------------------------------------------------

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_fused_kernels_compile_without_warnings(tmp_path, arch):
    from autocnn.nn import fused

    source = tmp_path / "nn_step.cu"
    source.write_text(fused.render_source())
    result = subprocess.run(["nvcc", "-std=c++17", f"-arch={arch}", "-cubin", "-Xptxas", "-v", str(source),
                             "-o", str(tmp_path / "nn_step.cubin")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    for kernel in ("nn_activation", "nn_bias_activation", "nn_activation_grad", "nn_activation_grad_colsum",
                   "nn_softmax_xent",
                   "nn_dense_softmax_xent", "nn_adam", "nn_sgd", "nn_rprop"):
        assert f"Function properties for {kernel}" in result.stderr
    assert not re.search(r"[1-9][0-9]* bytes spill", result.stderr), result.stderr


def test_which_classifier_heads_the_fused_kernel_takes():
    from autocnn.nn import fused

    # The zoo's heads: 100x10 (scherer10, chellapilla06), 84x10 (lenet5), 1024x10 (convnet18) fit;
    # kriz09's 4096x10 has too many input features for one row of registers a warp.
    assert all(fused.head_fits(f, 10) for f in (100, 84, 1024))
    assert not fused.head_fits(4096, 10)
    assert fused.head_fits(320, 32) and not fused.head_fits(321, 32)     # 10240 weights at most
    assert not fused.head_fits(10, 33) and not fused.head_fits(0, 10) and not fused.head_fits(10, 0)
