"""A convolution layer fused with the average pooling after it, in training (nn.layer_fusion):
which pairs qualify, the problems tuning covers, the two independent choices at build (forward:
conv_pool_fwd with keep_activation; backward: conv_pool_dz), and that a fused model's loss and
gradients are the split model's (numpy backend, float64; the backend's default hooks run the pair
each fused kernel replaces, so what is checked here is the wiring between the layers)."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn import nn
from autocnn.kernels.conv_pool_problems import ConvPoolDzProblem, ConvPoolFwdProblem
from autocnn.nn import Conv2d, NumpyBackend
from autocnn.nn.layer_fusion import conv_pool_pairs
from tests.relu_decisions import relu_decisions_taken_from


class Fuses(NumpyBackend):
    """The numpy backend, told that the alternatives of the given ops are tuned faster; it records
    what it was asked."""

    def __init__(self, ops):
        super().__init__(np.float64)
        self.ops, self.asked = set(ops), []

    def tuned_faster(self, alternative, replaced):
        self.asked.append(([p.op for p in alternative], [p.op for p in replaced]))
        return all(p.op in self.ops for p in alternative)


def _model(backend):
    layers = [Conv2d(2, 4, 3, padding=1, activation="relu"), nn.AvgPool2d(2),
              Conv2d(4, 6, 3, padding=1, activation="tanh"), nn.AvgPool2d(3, stride=2, padding=1, count_pad=False),
              Conv2d(6, 5, 1), nn.AvgPool2d(2), nn.Flatten(), nn.Dense(5, 3)]
    return nn.Sequential(layers, (2, 10, 9), backend=backend, seed=5)


def test_pairs_and_the_problems_tuning_covers():
    model = _model(NumpyBackend(np.float64))
    inputs = [model.input_shape, *model.layer_output_shapes[:-1]]
    pairs = conv_pool_pairs(model.layers, inputs, 4)
    assert [p.index for p in pairs] == [0, 2, 4]
    assert all(p.forward.keep_activation and p.forward.N == 4 for p in pairs)
    # The first pooling needs its input gradient (conv2d_1 has weights); the last convolution has
    # no activation, so its pooling's backward has nothing to fuse.
    assert [p.dz is not None for p in pairs] == [True, True, False]
    assert pairs[1].forward.pool_window == (3, 3) and pairs[1].forward.pool_stride == (2, 2)
    assert pairs[1].dz == ConvPoolDzProblem(N=4, C=6, H=5, W=4, window=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1),
                                            count_pad=False, activation="tanh")
    every = model.problems(4, alternatives=True)
    assert sum(isinstance(p, ConvPoolFwdProblem) for p in every) == 3
    assert sum(isinstance(p, ConvPoolDzProblem) for p in every) == 2
    assert not any(isinstance(p, (ConvPoolFwdProblem, ConvPoolDzProblem)) for p in model.problems(4))


@pytest.mark.parametrize("ops", [("conv_pool_fwd",), ("conv_pool_dz",), ("conv_pool_fwd", "conv_pool_dz")])
def test_a_fused_model_trains_as_the_split_one(ops):
    backend = Fuses(ops)
    fused, split = _model(backend), _model(NumpyBackend(np.float64))
    fused.build(4)
    split.build(4)
    forward, dz = "conv_pool_fwd" in ops, "conv_pool_dz" in ops
    assert ([], []) not in backend.asked
    assert (["conv_pool_fwd"], ["conv_fwd", "avgpool_fwd"]) in backend.asked
    assert (["conv_pool_dz"], ["avgpool_bwd"]) in backend.asked
    convs = [fused.layers[i] for i in (0, 2, 4)]
    expected = [tuple(name for name, on in (("conv_pool_fwd", forward), ("conv_pool_dz", dz and i < 2)) if on)
                for i in range(3)]
    assert [c.fusions for c in convs] == expected
    ops_of = {layer.name: [p.op for p in layer.problems()] for layer in fused.layers[:2]}
    assert ops_of["conv2d_1"][0] == ("conv_pool_fwd" if forward else "conv_fwd")
    assert ops_of["avgpool2d_1"] == ([] if forward else ["avgpool_fwd"]) + (["conv_pool_dz"] if dz else ["avgpool_bwd"])
    rng = np.random.default_rng()
    for _ in range(2):   # twice: the second pass reads buffers the first one left
        x = rng.standard_normal((4, 2, 10, 9))
        y = rng.integers(0, 3, size=4)
        assert fused.loss_and_gradients(x, y) == pytest.approx(split.loss_and_gradients(x, y), rel=1e-12)
        for name, g in split.grads().items():
            np.testing.assert_allclose(fused.grads()[name], g, rtol=1e-10, atol=1e-13, err_msg=name)
    np.testing.assert_allclose(fused.predict(x), split.predict(x), rtol=1e-12)
    calls = backend.kernel_calls
    assert calls["conv_pool_fwd"] == (3 * 3 if forward else 0)   # two training passes and a prediction
    assert calls["conv_pool_dz"] == (2 * 2 if dz else 0)
    assert calls["avgpool_fwd"] == (0 if forward else 9)


def test_nothing_is_fused_where_the_backend_does_not_say_so():
    model = _model(NumpyBackend(np.float64))
    model.build(2)
    assert all(not getattr(layer, "fusions", ()) for layer in model.layers)
    assert sum(p.op.startswith("conv_pool") for p in model.problems()) == 0


def test_the_fused_pooling_layer_refuses_another_input():
    model = _model(Fuses(("conv_pool_fwd",)))
    model.build(2)
    pool = model.layers[1]
    with pytest.raises(RuntimeError, match="fused forward"):
        pool.forward(np.zeros((2, 4, 10, 9)))


# -- on a GPU -------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_fused_kernels_train_on_the_gpu_as_the_numpy_backend():
    """conv_pool_fwd, conv_pool_dz and conv_bwd_fused in a CUDA model (every fusion taken), against
    the split float64 model on the CPU; then graphed training steps run and lower the loss."""
    pytest.importorskip("cupy")
    from autocnn.nn.cuda_backend import CudaBackend

    class CudaFusesAll(CudaBackend):
        def tuned_faster(self, alternative, replaced):
            return True

    gpu, cpu = _model(CudaFusesAll()), _model(NumpyBackend(np.float64))
    gpu.build(4)
    cpu.build(4)
    for model in (gpu, cpu):   # the same weights in both
        for name, array in model.params().items():
            model.backend.upload(cpu.get_weights()[name].astype(model.dtype), array)
    assert gpu.layers[2].fusions == ("conv_bwd_fused", "conv_pool_fwd", "conv_pool_dz")
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 2, 10, 9))
    y = rng.integers(0, 3, size=4)
    loss_gpu = gpu.loss_and_gradients(x.astype(np.float32), y)
    with relu_decisions_taken_from(gpu, cpu, 1e-4):   # a ReLU input at zero: one side's rounding
        loss_cpu = cpu.loss_and_gradients(x, y)
    assert loss_gpu == pytest.approx(loss_cpu, rel=1e-4)
    for name, g in cpu.grads().items():
        got = gpu.backend.to_numpy(gpu.grads()[name])
        assert np.linalg.norm(got - g) <= 1e-4 * np.linalg.norm(g), name
    for op in ("conv_pool_fwd", "conv_pool_dz", "conv_bwd_fused"):
        assert gpu.backend.generated_launches[op] >= 1, op
    gpu.compile("adam", lr=1e-2)
    losses = [gpu.train_step(x.astype(np.float32), y).loss for _ in range(6)]   # later steps replay a graph
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_fuse_false_keeps_every_layer_on_its_own_kernels():
    """Sequential(fuse=False) asks the backend nothing and fuses nothing, the one-pass backward
    included; turning it on rebuilds the model with the fusions, weights kept."""
    backend = Fuses(("conv_pool_fwd", "conv_pool_dz", "conv_bwd_fused"))
    model = _model(backend)
    model.fuse = False
    model.build(2)
    assert backend.asked == []
    assert all(not getattr(layer, "fusions", ()) for layer in model.layers)
    before = {k: v.copy() for k, v in model.get_weights().items()}
    model.fuse = True
    # The first convolution has no input gradient: no one-pass backward to run there.
    assert [model.layers[i].fusions for i in (0, 2, 4)] == [
        ("conv_pool_fwd", "conv_pool_dz"), ("conv_bwd_fused", "conv_pool_fwd", "conv_pool_dz"),
        ("conv_bwd_fused", "conv_pool_fwd")]
    for name, w in model.get_weights().items():
        np.testing.assert_array_equal(w, before[name], err_msg=name)
    with pytest.raises(TypeError, match="fuse must be True or False"):
        model.fuse = "no"
    with pytest.raises(TypeError, match="fuse must be True or False"):
        nn.Sequential([nn.Flatten(), nn.Dense(4, 2)], (1, 2, 2), fuse=1)


def test_step_variants_script_refuses_bad_arguments_before_any_gpu_work(tmp_path, capsys):
    from tests.bench_module import load_script

    script = load_script("bench_step_variants")
    (tmp_path / "f").write_text("")
    for bad in (["--networks", "alexnet"], ["--variants", "fused,sep-2"], ["--steps", "0"],
                ["--out", str(tmp_path / "f")]):
        with pytest.raises(SystemExit):
            script.main(bad)
        assert "error" in capsys.readouterr().err
