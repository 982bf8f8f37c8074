"""The cuda backend against the numpy backend (run on a GPU host: pytest -m gpu).

For every zoo network: the same initial weights on both backends give the same logits, loss and
gradients, and the same weights after a few SGD steps (relative error <= 1e-4); every convolution
and pooling call of a cuda training step ran a generated kernel (counted, not assumed).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.relu_decisions import relu_decisions_taken_from

pytestmark = pytest.mark.gpu

NETWORKS = ["kriz09", "scherer10", "convnet18", "chellapilla06", "lenet5"]
BATCH = 6   # not a tuned batch size: the kernels run on database fallbacks, which must be right too
TOL = 1e-4


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _pair(name: str, seed: int):
    from autocnn import nn

    cpu = nn.build_network(name, backend="numpy", seed=seed)
    gpu = nn.build_network(name, backend="cuda", seed=seed)
    cpu.build(BATCH)
    gpu.build(BATCH)
    return cpu, gpu


@pytest.mark.parametrize("name", NETWORKS)
def test_cuda_matches_numpy_forward_gradients_and_steps(name):
    from autocnn import nn

    rng = np.random.default_rng()
    seed = int(rng.integers(2**31))
    cpu, gpu = _pair(name, seed)
    for a, b in zip(cpu.get_weights().values(), gpu.get_weights().values()):
        np.testing.assert_array_equal(a, b)   # the same initial weights
    x = rng.standard_normal((BATCH, *cpu.input_shape)).astype(np.float32)
    y = rng.integers(0, cpu.num_classes, BATCH)

    assert _rel(gpu.predict(x, batch_size=BATCH), cpu.predict(x, batch_size=BATCH)) <= TOL
    loss_gpu = gpu.loss_and_gradients(x, y)
    with relu_decisions_taken_from(gpu, cpu, TOL):
        loss_cpu = cpu.loss_and_gradients(x, y)
    assert abs(loss_gpu - loss_cpu) <= TOL * max(1.0, abs(loss_cpu))
    g_cpu = {k: cpu.backend.to_numpy(v) for k, v in cpu.grads().items()}
    g_gpu = {k: gpu.backend.to_numpy(v) for k, v in gpu.grads().items()}
    for k in g_cpu:
        assert _rel(g_gpu[k], g_cpu[k]) <= TOL, f"{name} gradient {k}"

    cpu.compile(nn.SGD(0.01, momentum=0.9))
    gpu.compile(nn.SGD(0.01, momentum=0.9))
    for _ in range(3):
        xb = rng.standard_normal((BATCH, *cpu.input_shape)).astype(np.float32)
        yb = rng.integers(0, cpu.num_classes, BATCH)
        gpu.train_step(xb, yb)
        # The steps too. On vgg_cifar (H200, 80 seeds each way) decisions at zero in the steps put
        # a layer 1.1e-4 to 1.3e-3 apart after three in 13 seeds (conv2d_4, or dense_1, whose
        # gradient one unit's decision moves most); at the same decisions (0-3 taken over a step)
        # no layer was more than 2.1e-7 apart.
        with relu_decisions_taken_from(gpu, cpu, TOL):
            cpu.train_step(xb, yb)
    # After the steps, per layer (weight and bias together): a bias alone starts at zero and its
    # gradient is a sum with much cancellation, so one ReLU input within rounding of zero, on one
    # side on the CPU and on the other on the GPU, moves it far in relative terms (seen: 6e-3 in
    # 2 of 30 seeds, the same with and without graphs). The bias gradients themselves were
    # compared one by one above, before any step.
    w_cpu, w_gpu = cpu.get_weights(), gpu.get_weights()
    for layer in {k.rsplit(".", 1)[0] for k in w_cpu}:
        keys = sorted(k for k in w_cpu if k.rsplit(".", 1)[0] == layer)
        a = np.concatenate([w_gpu[k].ravel() for k in keys])
        b = np.concatenate([w_cpu[k].ravel() for k in keys])
        assert _rel(a, b) <= TOL, f"{name} layer {layer} after 3 steps"


@pytest.mark.parametrize("name", NETWORKS)
def test_every_conv_and_pool_call_runs_a_generated_kernel(name):
    from autocnn import nn

    model = nn.build_network(name, backend="cuda", seed=1)
    model.build(BATCH)
    be = model.backend
    be.kernel_calls.clear()
    be.generated_launches.clear()
    rng = np.random.default_rng()
    model.compile(nn.Adam(1e-3))
    model.train_step(rng.standard_normal((BATCH, *model.input_shape)).astype(np.float32),
                     rng.integers(0, model.num_classes, BATCH))
    assert sum(be.kernel_calls.values()) > 0
    assert be.generated_launches == be.kernel_calls
    expected_ops = {p.op for p in model.problems()}
    assert set(be.generated_launches) == expected_ops
    assert all(d.source for d in model.dispatch)


def test_cuda_backend_refuses_float64():
    from autocnn.nn.cuda_backend import CudaBackend

    with pytest.raises(ValueError, match="float32"):
        CudaBackend(dtype=np.float64)


# -- fused kernels against the numpy code they replace --------------------------------------------

@pytest.mark.parametrize("act", ["relu", "tanh", "logistic"])
def test_fused_activations_match_numpy(act):
    import cupy as cp

    from autocnn.nn import NumpyBackend
    from autocnn.nn import fused

    rng = np.random.default_rng()
    ref = NumpyBackend()
    z = (rng.standard_normal((37, 29)) * 30).astype(np.float32)   # odd sizes, |z| up to ~150
    bias = rng.standard_normal(29).astype(np.float32)
    dy = rng.standard_normal(z.shape).astype(np.float32)

    y = fused.activation(act, cp.asarray(z), cp.empty(z.shape, cp.float32))
    want = ref.activation(act, z, np.empty_like(z))
    np.testing.assert_allclose(y.get(), want, rtol=2e-6, atol=1e-7)

    yb = cp.asarray(z)
    fused.bias_activation(yb, cp.asarray(bias), act)
    np.testing.assert_allclose(yb.get(), ref.activation(act, z + bias, np.empty_like(z)), rtol=2e-6, atol=1e-7)

    dz = fused.activation_grad(act, cp.asarray(want), cp.asarray(dy), cp.empty(z.shape, cp.float32))
    want_dz = ref.activation_grad(act, want, dy, np.empty_like(z))
    np.testing.assert_allclose(dz.get(), want_dz, rtol=1e-6, atol=1e-7)

    # A Dense layer's backward epilogue: dz and its column sums in one launch (odd column count).
    db = cp.full(29, cp.nan, dtype=cp.float32)
    dz2 = fused.activation_grad_colsum(act, cp.asarray(want), cp.asarray(dy), cp.empty(z.shape, cp.float32), db)
    np.testing.assert_allclose(dz2.get(), want_dz, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(db.get(), want_dz.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,cols", [(1, 1), (128, 10), (60, 100), (300, 33)])
def test_fused_column_sums_without_activation(rows, cols):
    import cupy as cp

    from autocnn.nn import fused

    dy = np.random.default_rng().standard_normal((rows, cols)).astype(np.float32)
    db = cp.full(cols, cp.nan, dtype=cp.float32)
    g = cp.asarray(dy)
    assert fused.activation_grad_colsum("none", g, g, None, db) is g
    np.testing.assert_allclose(db.get(), dy.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(g.get(), dy)


@pytest.mark.parametrize("n,classes", [(1, 2), (7, 10), (300, 10), (33, 131)])
def test_fused_softmax_cross_entropy_matches_numpy(n, classes):
    import cupy as cp

    from autocnn.nn import fused
    from autocnn.nn.losses import Accuracy, SoftmaxCrossEntropy

    rng = np.random.default_rng()
    logits = (rng.standard_normal((n, classes)) * 6).astype(np.float32)
    logits[0, :] = 1.0                                   # a tie: the first maximum counts, as argmax
    labels = rng.integers(0, classes, n).astype(np.int64)
    for weights in (np.ones(n, np.float32), (rng.random(n) * (rng.random(n) > 0.3)).astype(np.float32),
                    np.zeros(n, np.float32)):
        grad, loss, acc = cp.empty((n, classes), cp.float32), cp.empty((), cp.float32), cp.empty((), cp.float64)
        fused.softmax_xent(cp.asarray(logits), cp.asarray(labels), cp.asarray(weights), grad, loss, acc)
        want_loss, want_grad = SoftmaxCrossEntropy().loss_and_grad(logits, labels, weights)
        want_acc = float(Accuracy()(logits, labels, weights))
        assert float(loss) == pytest.approx(float(want_loss), rel=1e-5, abs=1e-6)
        np.testing.assert_allclose(grad.get(), want_grad, rtol=1e-4, atol=1e-7)
        # The kernel sums in float64, the numpy code in float32 before its float64 division.
        assert float(acc) == pytest.approx(want_acc, rel=1e-6, abs=0)


@pytest.mark.parametrize("flat", [True, False], ids=["one kernel", "a kernel per parameter"])
@pytest.mark.parametrize("kind", ["adam", "sgd", "nesterov", "rprop"])
def test_fused_optimizers_match_numpy_over_steps_with_a_schedule(kind, flat):
    import cupy as cp

    from autocnn import nn
    from autocnn.nn import NumpyBackend
    from autocnn.nn.arena import ParameterArena

    def make():
        return {"adam": lambda: nn.Adam(lr=0.01, weight_decay=0.01),
                "sgd": lambda: nn.SGD(lr=0.05, weight_decay=0.001),
                "nesterov": lambda: nn.SGD(lr=0.05, momentum=0.9, nesterov=True),
                "rprop": lambda: nn.RPROP(step_init=0.01)}[kind]()

    rng = np.random.default_rng()
    shapes = {"c.weight": (5, 3, 3, 3), "c.bias": (5,), "d.weight": (17, 4)}
    cpu, gpu = ParameterArena(NumpyBackend(), shapes), ParameterArena(nn.get_backend("cuda"), shapes)
    start = rng.standard_normal(cpu.size).astype(np.float32)
    cpu.params[...] = start
    gpu.params.set(start)
    opt_cpu, opt_gpu = make(), make()
    opt_cpu.setup(cpu.param_views, arena=cpu)
    # Without the arena the GPU update is one kernel per parameter: only the first of a step may
    # advance the step counter (Adam's bias correction would be wrong otherwise).
    opt_gpu.setup(gpu.param_views, arena=gpu if flat else None)
    for step in range(8):
        g = (rng.standard_normal(cpu.size) * (rng.random(cpu.size) > 0.2)).astype(np.float32)
        if step % 3 == 2:
            g = -g   # sign flips for RPROP
        cpu.grads[...] = g
        gpu.grads.set(g)
        if step == 4 and hasattr(opt_cpu, "lr"):
            opt_cpu.lr = opt_gpu.lr = opt_cpu.lr * 0.3
        opt_cpu.step(cpu.param_views, cpu.grad_views)
        opt_gpu.step(gpu.param_views, gpu.grad_views)
    np.testing.assert_allclose(gpu.params.get(), cpu.params, rtol=2e-5, atol=2e-6)
    assert opt_gpu.iterations == 8 and opt_gpu._device_step.get().tolist() == [8, 0]


@pytest.mark.parametrize("n,features,classes", [(37, 100, 10), (128, 84, 10), (5, 1, 2), (300, 1024, 10),
                                                (64, 33, 32), (9, 320, 1)])
def test_fused_classifier_head_matches_the_composed_numpy_step(n, features, classes):
    import cupy as cp

    from autocnn.nn import NumpyBackend, get_backend
    from autocnn.nn.losses import Accuracy, SoftmaxCrossEntropy

    rng = np.random.default_rng()
    x = rng.standard_normal((n, features)).astype(np.float32)
    w = (rng.standard_normal((features, classes)) / np.sqrt(features)).astype(np.float32)
    b = rng.standard_normal(classes).astype(np.float32)
    labels = rng.integers(0, classes, n).astype(np.int64)
    weights = (rng.random(n) * (rng.random(n) > 0.25)).astype(np.float32)
    gpu = get_backend("cuda")
    for bias, want_dx in ((b, True), (None, False)):
        ref = {"dlogits": np.empty((n, classes), np.float32), "db": np.empty(classes, np.float32),
               "dx": np.empty((n, features), np.float32), "loss": np.empty((), np.float32),
               "acc": np.empty((), np.float64)}
        NumpyBackend().dense_loss_step(x, w, bias, labels, weights, logits=np.empty((n, classes), np.float32),
                                       dlogits=ref["dlogits"], db=ref["db"] if bias is not None else None,
                                       dx=ref["dx"], loss_out=ref["loss"], acc_out=ref["acc"],
                                       loss=SoftmaxCrossEntropy(), metric=Accuracy())
        for repeat in range(2):   # the second launch checks that the accumulators were zeroed again
            out = {"dlogits": cp.full((n, classes), cp.nan, cp.float32), "db": cp.full(classes, cp.nan, cp.float32),
                   "dx": cp.full((n, features), cp.nan, cp.float32), "loss": cp.empty((), cp.float32),
                   "acc": cp.empty((), cp.float64)}
            gpu.dense_loss_step(cp.asarray(x), cp.asarray(w), None if bias is None else cp.asarray(bias),
                                cp.asarray(labels), cp.asarray(weights), logits=cp.empty((n, classes), cp.float32),
                                dlogits=out["dlogits"], db=out["db"] if bias is not None else None,
                                dx=out["dx"] if want_dx else None, loss_out=out["loss"], acc_out=out["acc"],
                                loss=SoftmaxCrossEntropy(), metric=Accuracy())
            np.testing.assert_allclose(out["dlogits"].get(), ref["dlogits"], rtol=1e-4, atol=1e-6)
            assert float(out["loss"]) == pytest.approx(float(ref["loss"]), rel=1e-5, abs=1e-6)
            assert float(out["acc"]) == pytest.approx(float(ref["acc"]), rel=1e-6, abs=0)
            if bias is not None:
                np.testing.assert_allclose(out["db"].get(), ref["db"], rtol=1e-4, atol=1e-5)
            else:
                assert np.isnan(out["db"].get()).all()          # no bias: db untouched
            if want_dx:
                np.testing.assert_allclose(out["dx"].get(), ref["dx"], rtol=1e-4, atol=1e-5)
            else:
                assert np.isnan(out["dx"].get()).all()          # no dx asked for: untouched


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (6, 400, 120), (128, 8192, 100), (37, 5, 513)])
def test_cublas_sgemm_of_every_operand_layout_matches_numpy(m, k, n):
    import cupy as cp

    from autocnn.nn.cublas import Gemm

    rng = np.random.default_rng()
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    gemm = Gemm(cp)
    for ga in (cp.asarray(a), cp.asarray(np.ascontiguousarray(a.T)).T):      # C- and F-contiguous
        for gb in (cp.asarray(b), cp.asarray(np.ascontiguousarray(b.T)).T):
            out = cp.full((m, n), cp.nan, dtype=cp.float32)
            gemm(ga, gb, out)
            err = np.abs(out.get() - want).max() / max(1.0, np.abs(want).max())
            assert err <= 1e-5 * max(1.0, np.sqrt(k / 1024)), (ga.flags.c_contiguous, gb.flags.c_contiguous, err)


# -- training steps replayed as CUDA graphs -------------------------------------------------------

@pytest.mark.parametrize("name", NETWORKS)
def test_graphed_steps_match_eager_steps_and_count_their_kernels(name):
    from autocnn import nn

    rng = np.random.default_rng()
    seed = int(rng.integers(2**31))
    graphed = nn.build_network(name, backend="cuda", seed=seed).build(BATCH).compile(nn.Adam(3e-3))
    eager = nn.build_network(name, backend="cuda", seed=seed).build(BATCH).compile(nn.Adam(3e-3))
    eager.use_graphs = False
    steps = 6
    batches = [(rng.standard_normal((BATCH, *graphed.input_shape)).astype(np.float32),
                rng.integers(0, graphed.num_classes, BATCH)) for _ in range(steps)]
    be = graphed.backend
    graphed.train_step(*batches[0])                   # eager warm-up step
    per_step = dict(be.kernel_calls)
    be.kernel_calls.clear()
    be.generated_launches.clear()
    losses_g, losses_e = [], []
    eager_result = eager.train_step(*batches[0])
    losses_e.append(eager_result.loss)
    losses_g.append(None)
    for i, (xb, yb) in enumerate(batches[1:], start=1):
        if i == 3:
            graphed.optimizer.lr = eager.optimizer.lr = 1e-3   # read by the graph from device memory
        losses_g.append(graphed.train_step(xb, yb).loss)
        losses_e.append(eager.train_step(xb, yb).loss)
    assert graphed._graph is not None and eager._graph is None
    # Every replay counts the kernels the graph holds: the same as running them one by one.
    assert dict(be.kernel_calls) == {op: n * (steps - 1) for op, n in per_step.items()}
    assert be.generated_launches == be.kernel_calls
    # The replays counted Adam's steps on the device (its bias correction depends on them).
    assert int(graphed.optimizer._device_step[0]) == graphed.optimizer.iterations == steps
    for a, b in zip(losses_g[1:], losses_e[1:]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    # Split-K weight gradients add in a varying order, and Adam turns gradients near zero into
    # steps of about lr either way: weights agree to 1e-3 (seen: 4e-5), not to rounding. A lost
    # learning-rate change or a wrong step count moves them by 1e-1 or more.
    w_g, w_e = graphed.get_weights(), eager.get_weights()
    for k in w_e:
        assert _rel(w_g[k], w_e[k]) <= 1e-3, f"{name} weight {k}"


def test_graphed_fit_matches_eager_fit():
    from autocnn import nn

    rng = np.random.default_rng()
    x = rng.standard_normal((70, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 70)
    histories, weights = [], []
    for graphs in (True, False):
        model = nn.build_network("lenet5", backend="cuda", seed=3)
        model.use_graphs = graphs
        histories.append(model.fit(x, y, epochs=3, batch_size=16, optimizer=nn.Adam(2e-3), verbose=False,
                                   lr_schedule="cosine", validation_data=(x[:20], y[:20])))
        weights.append(model.get_weights())
        assert (model._graph is not None) == graphs
    # As above, Adam and split-K sums: losses to 1e-4, accuracies to one sample (of 70 training and
    # 20 validation samples), weights to 1e-3.
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(getattr(histories[0], key), getattr(histories[1], key), rtol=1e-4, atol=1e-6)
    for key, samples in (("accuracy", 70), ("val_accuracy", 20)):
        np.testing.assert_allclose(getattr(histories[0], key), getattr(histories[1], key), rtol=0,
                                   atol=1.01 / samples)
    for k in weights[1]:
        assert _rel(weights[0][k], weights[1][k]) <= 1e-3, k


@pytest.mark.parametrize("name", ["chellapilla06", "lenet5"])
def test_batches_written_into_the_input_buffers_train_like_staged_batches(name):
    """The zero-copy path: graphed steps reading batches written into input_buffers() follow the
    same losses and weights as steps that stage the same batches from other device arrays."""
    import cupy as cp

    from autocnn import nn

    rng = np.random.default_rng()
    seed = int(rng.integers(2**31))
    staged = nn.build_network(name, backend="cuda", seed=seed).build(BATCH).compile(nn.Adam(3e-3))
    direct = nn.build_network(name, backend="cuda", seed=seed).build(BATCH).compile(nn.Adam(3e-3))
    x_buf, y_buf = direct.input_buffers()
    for _ in range(5):
        x = cp.asarray(rng.standard_normal((BATCH, *staged.input_shape)).astype(np.float32))
        y = cp.asarray(rng.integers(0, staged.num_classes, BATCH).astype(np.int64))
        a = staged.train_step(x, y)
        x_buf[...] = x
        y_buf[...] = y
        b = direct.train_step(x_buf, y_buf)
        assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-6)
    assert staged._graph is not None and direct._graph is not None
    w_s, w_d = staged.get_weights(), direct.get_weights()
    for k in w_s:
        assert _rel(w_s[k], w_d[k]) <= 1e-3, f"{name} weight {k}"
