"""Mixed precision on the cuda backend (run on a GPU host: pytest -m gpu tests/test_amp_gpu.py).

The mixed-precision kernels (autocnn.nn.fused_sixteen_bit) against the numpy backend's emulation
of them, bit for bit where the arithmetic is the same (casts, the loss scale's state machine);
a bf16 and an fp16 training step against the numpy backend's emulation of it, within a bound
derived from the precision; the graphed step against the eager one; fp16 overflow handled by the
loss scaler inside the CUDA graph; convnet18 training a few steps in bf16.

The bound of a whole step: every 16-bit tensor on the way (the input's cast, the weights' copies,
each layer's output, the gradients back, the weight gradients) is rounded once to nearest, which
moves it by at most the precision's ``output_rounding`` (twice the unit roundoff) of itself; the
GPU and the emulation round the same values up to FP32 sums against float64 ones, so they may
differ by one 16-bit step in any of those tensors, and a result that passes through ROUNDINGS of
them by at most ROUNDINGS times ``output_rounding`` (adding in the worst case). tanh throughout:
no ReLU decision a rounding could flip (tests/relu_decisions.py says why those escape any bound).
"""
from __future__ import annotations

import numpy as np
import pytest

from autocnn.measurement import element_arrays
from autocnn.nn.mixed_precision import FOUND, LossScaling, ScaleUse
from autocnn.precision import BF16, BFLOAT16, FLOAT16, FLOAT32, FP16

pytestmark = pytest.mark.gpu

SHAPE = (3, 11, 13)   # sizes that divide no tile or window evenly
BATCH = 5
CLASSES = 4
# forward: the input's cast, the weights' copies, two convolution outputs, the pooling's and the
# Dense layer's (its GEMM on 16-bit operands); back: their gradients; the weight gradients themselves.
ROUNDINGS = 6 + 6 + 2
PRECISIONS = [BF16, FP16]
# fp16's scale in the comparisons: one that no gradient of these small models overflows (2^16 can,
# now and then, in a weight gradient summed over the batch: a skipped step is the scaler's test below).
COMPARED_SCALING = LossScaling(init_scale=2.0 ** 12)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def _convnet(precision, backend: str, seed: int, **options):
    from autocnn.nn import AvgPool2d, Conv2d, Dense, Flatten, Sequential

    return Sequential([Conv2d(3, 6, 3, padding=1, activation="tanh"), AvgPool2d(2, padding=(0, 1, 1, 0)),
                       Conv2d(6, 8, 3, activation="tanh"), Flatten(), Dense(8 * 4 * 5, CLASSES)],
                      input_shape=SHAPE, seed=seed, precision=precision, backend=backend, **options)


def _per_layer(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    """Relative error of each layer's weights and bias together: a bias alone starts at zero, and a
    gradient element within rounding of zero, of one sign here and the other there, moves it far in
    relative terms (tests/test_gpu_training.py saw it in FP32 too)."""
    errors = {}
    for layer in sorted({k.rsplit(".", 1)[0] for k in b}):
        keys = sorted(k for k in b if k.rsplit(".", 1)[0] == layer)
        errors[layer] = _rel(np.concatenate([a[k].ravel() for k in keys]), np.concatenate([b[k].ravel() for k in keys]))
    return errors


def _batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((BATCH, *SHAPE)).astype(np.float32), rng.integers(0, CLASSES, BATCH)


# -- the kernels against the emulation ---------------------------------------------------------------

@pytest.mark.parametrize("element", [BFLOAT16, FLOAT16], ids=["bf16", "fp16"])
def test_casts_round_as_the_emulation_does_bit_for_bit(element):
    import cupy as cp

    from autocnn.nn import NumpyBackend
    from autocnn.nn.cuda_backend import CudaBackend

    gpu, cpu = CudaBackend(), NumpyBackend()
    rng = np.random.default_rng()
    values = (rng.standard_normal(1237) * 3000).astype(np.float32)
    values[:4] = [70000.0, -65520.0, np.nan, 1e-9]    # fp16 overflow to +-Inf, NaN, a subnormal
    state = np.array([64.0, 0, 0, 0], np.float32)
    for use in ScaleUse:
        dst = cp.zeros(values.size, dtype=gpu.storage_dtype(element))
        gpu.cast(cp.asarray(values), FLOAT32, dst, element, cp.asarray(state), use)
        expected = cpu.cast(values, FLOAT32, np.zeros_like(values), element, state, use)
        stored = element_arrays.values(cp.asnumpy(dst), element, np)
        np.testing.assert_array_equal(stored, expected, err_msg=f"{element.name} {use}")
        back = cp.zeros(values.size, dtype=np.float32)
        gpu.cast(dst, element, back, FLOAT32, cp.asarray(state), use)
        np.testing.assert_array_equal(cp.asnumpy(back), cpu.cast(expected, element, np.zeros_like(values), FLOAT32,
                                                                 state, use))


@pytest.mark.parametrize("element", [BFLOAT16, FLOAT16], ids=["bf16", "fp16"])
def test_gradients_reach_fp32_with_the_scale_divided_out_and_overflow_flagged(element):
    import cupy as cp

    from autocnn.nn.cuda_backend import CudaBackend

    gpu = CudaBackend()
    rng = np.random.default_rng()
    n = 1001
    runs = ((3, 400), (517, 900))
    g16_values = rng.standard_normal(n).astype(np.float32) * 512
    g16 = cp.asarray(element_arrays.rounded(g16_values, element, np))
    own = rng.standard_normal(n).astype(np.float32)   # what FP32 layers wrote, outside the runs
    g32 = cp.asarray(own)
    state = cp.asarray(np.array([256.0, 5, 0, 0], np.float32))
    gpu.gradients_to_fp32(g32, g16, element, runs, state)
    expected = own.copy()
    exact = element_arrays.values(cp.asnumpy(g16), element, np)
    for lo, hi in runs:
        expected[lo:hi] = exact[lo:hi] * np.float32(1 / 256)
    np.testing.assert_array_equal(cp.asnumpy(g32), expected)
    assert float(state[FOUND]) == 0.0
    own[950] = np.inf   # outside the runs: an FP32 layer's gradient
    gpu.gradients_to_fp32(cp.asarray(own), g16, element, runs, state)
    assert float(state[FOUND]) == 1.0
    gpu.gradients_to_fp32(g32, g16, element, runs, None)   # no scaler (bf16): nothing divided, nothing flagged
    np.testing.assert_array_equal(cp.asnumpy(g32)[3:400], exact[3:400])


def test_the_loss_scale_kernel_follows_the_numpy_state_machine():
    import cupy as cp

    from autocnn.nn import NumpyBackend
    from autocnn.nn.cuda_backend import CudaBackend

    gpu, cpu = CudaBackend(), NumpyBackend()
    settings = LossScaling(init_scale=2.0 ** 16, growth_interval=3)
    host = np.array([settings.init_scale, 0, 0, 0], np.float32)
    device = cp.asarray(host)
    for found in [0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]:
        host[FOUND] = found
        device[FOUND] = found
        cpu.loss_scale_update(host, settings)
        gpu.loss_scale_update(device, settings)
        np.testing.assert_array_equal(cp.asnumpy(device), host)
    # halved at the third step, doubled three clean steps later, halved twice, doubled twice
    np.testing.assert_array_equal(host, [2.0 ** 16, 1, 0, 0])


def test_a_flagged_step_leaves_the_optimizer_and_its_device_step_count():
    import cupy as cp

    from autocnn.nn import Adam

    p = cp.ones(777, dtype=cp.float32)
    g = cp.full(777, 0.25, dtype=cp.float32)
    opt = Adam(lr=0.1)
    opt.setup({"p": p})
    flag = cp.ones(1, dtype=cp.float32)
    opt.begin_step()
    opt.apply({"p": p}, {"p": g}, skip=flag)
    assert bool((p == 1).all()) and int(opt._device_step[0]) == 0 and not bool(opt.state("p")["m"].any())
    flag[0] = 0
    opt.apply({"p": p}, {"p": g}, skip=flag)
    assert bool((p < 1).all()) and int(opt._device_step[0]) == 1


@pytest.mark.parametrize("element", [BFLOAT16, FLOAT16], ids=["bf16", "fp16"])
def test_gemm_ex_on_sixteen_bit_operands_sums_in_fp32(element):
    """cuBLAS GemmEx as the 16-bit Dense layers call it (transposed views included), against float64
    products of the 16-bit values: FP32 sums (FP32's bound over the reduction) and, into a 16-bit
    result, its one rounding (the precision's output_rounding)."""
    import cupy as cp

    from autocnn.nn.cuda_backend import CudaBackend

    gpu = CudaBackend()
    precision = BF16 if element == BFLOAT16 else FP16
    rng = np.random.default_rng()
    m, k, n = 37, 131, 19
    a16 = element_arrays.rounded(rng.standard_normal((m, k)).astype(np.float32), element, np)
    b16 = element_arrays.rounded(rng.standard_normal((k, n)).astype(np.float32), element, np)
    a, b = (element_arrays.values(x, element, np).astype(np.float64) for x in (a16, b16))
    cases = [("x @ W", cp.asarray(a16), cp.asarray(b16), a @ b),
             ("x.T @ dz", cp.asarray(np.ascontiguousarray(a16.T)).T, cp.asarray(b16), a @ b),
             ("dz @ W.T", cp.asarray(a16), cp.asarray(np.ascontiguousarray(b16.T)).T, a @ b)]
    for what, da, db, reference in cases:
        out32 = cp.full((m, n), np.nan, dtype=cp.float32)
        gpu.matmul(da, db, out=out32)
        assert _rel(cp.asnumpy(out32), reference) <= precision.base_bound * max(1.0, (k / 1024) ** 0.5), what
        out16 = cp.zeros((m, n), dtype=gpu.storage_dtype(element))
        gpu.matmul(da, db, out=out16)
        assert _rel(element_arrays.values(cp.asnumpy(out16), element, np), reference) <= precision.error_bound(k), what


# -- whole steps --------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", PRECISIONS, ids=["bf16", "fp16"])
def test_a_sixteen_bit_step_matches_the_numpy_emulation(precision):
    from autocnn import nn

    rng = np.random.default_rng()
    seed = int(rng.integers(2**31))
    cpu = _convnet(precision, "numpy", seed, loss_scaling=COMPARED_SCALING)
    gpu = _convnet(precision, "cuda", seed, loss_scaling=COMPARED_SCALING)
    cpu.build(BATCH)
    gpu.build(BATCH)
    bound = ROUNDINGS * precision.output_rounding
    x, y = _batch(rng)
    loss_gpu, loss_cpu = gpu.loss_and_gradients(x, y), cpu.loss_and_gradients(x, y)
    assert abs(loss_gpu - loss_cpu) <= bound * abs(loss_cpu)
    for name, grad in cpu.grads().items():
        got = gpu.backend.to_numpy(gpu.grads()[name])
        assert got.dtype == np.float32
        assert _rel(got, grad) <= bound, (precision.name, name, _rel(got, grad))
    for model in (cpu, gpu):
        model.compile(nn.Adam(1e-3))
    for _ in range(3):
        xb, yb = _batch(rng)
        gpu.train_step(xb, yb)
        cpu.train_step(xb, yb)
    assert gpu._graph is not None   # the later steps replayed a CUDA graph
    errors = _per_layer(gpu.get_weights(), cpu.get_weights())
    assert max(errors.values()) <= bound, (precision.name, errors)


@pytest.mark.parametrize("precision", PRECISIONS, ids=["bf16", "fp16"])
def test_the_graphed_step_matches_the_eager_one(precision):
    from autocnn import nn

    rng = np.random.default_rng()
    seed = int(rng.integers(2**31))
    graphed = _convnet(precision, "cuda", seed, loss_scaling=COMPARED_SCALING)
    eager = _convnet(precision, "cuda", seed, loss_scaling=COMPARED_SCALING)
    eager.use_graphs = False
    for model in (graphed, eager):
        model.compile(nn.SGD(0.02, momentum=0.9)).build(BATCH)
    for _ in range(5):
        xb, yb = _batch(rng)
        a, b = graphed.train_step(xb, yb), eager.train_step(xb, yb)
        assert abs(a.loss - b.loss) <= ROUNDINGS * precision.output_rounding * abs(b.loss)
    assert graphed._graph is not None and eager._graph is None
    errors = _per_layer(graphed.get_weights(), eager.get_weights())
    assert max(errors.values()) <= ROUNDINGS * precision.output_rounding, errors
    if precision is FP16:
        np.testing.assert_array_equal(graphed.backend.to_numpy(graphed.loss_scaler.state),
                                      eager.backend.to_numpy(eager.loss_scaler.state))


def test_fp16_overflow_is_skipped_inside_the_graph_until_the_scale_fits():
    """A scale of 2^40 overflows every scaled gradient in float16: the steps are skipped on the
    device (weights and the optimizer's device step count as they were, the scale halved each time,
    nothing read by the host) until the scale fits; then the model learns."""
    from autocnn import nn

    rng = np.random.default_rng()
    model = _convnet(FP16, "cuda", int(rng.integers(2**31)), loss_scaling=LossScaling(init_scale=2.0 ** 40))
    model.compile(nn.Adam(3e-3)).build(BATCH)
    x, y = _batch(rng)
    start = model.get_weights()
    scaler = model.loss_scaler
    skipped, losses = 0, []
    for step in range(60):
        losses.append(model.train_step(x, y).loss)
        skipped += scaler.last_step_skipped
        if step < 3:   # eager, captured, replayed: all skipped, nothing moved
            assert scaler.last_step_skipped and scaler.scale == 2.0 ** (39 - step)
            assert all(np.array_equal(start[k], v) for k, v in model.get_weights().items())
    assert model._graph is not None
    assert 10 <= skipped < 45 and not scaler.last_step_skipped
    assert int(model.optimizer._device_step[0]) == 60 - skipped
    assert np.isfinite(losses[-1]) and losses[-1] < losses[skipped]


def test_convnet18_trains_a_few_steps_in_bf16():
    from autocnn import nn

    model = nn.build_network("convnet18", backend="cuda", seed=3)
    model.precision = "bf16"
    model.compile(nn.Adam(1e-3)).build(32)
    rng = np.random.default_rng()
    x = rng.standard_normal((32, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, 32)
    be = model.backend
    be.kernel_calls.clear()
    be.generated_launches.clear()
    losses = [model.train_step(x, y).loss for _ in range(12)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
    assert model._graph is not None
    assert all(w.dtype == np.float32 for w in model.get_weights().values())
    conv_ops = {p.op for p in model.problems()}
    assert all(p.precision is BF16 for p in model.problems() if p.op.startswith("conv"))
    assert set(be.generated_launches) == conv_ops and be.generated_launches == be.kernel_calls
    assert "bf16" in model.dispatch_report()
    assert model.loss_scaler is None
    # Activations between the layers are 16-bit buffers (bfloat16 as uint16): the only casts are the
    # input's and the logits' (the boundaries), and the weights' once a step.
    outputs = [layer.output_buffer for layer in model.layers if hasattr(layer, "output_buffer")]
    assert outputs and all(buffer.dtype == np.uint16 for buffer in outputs)
    assert sorted(model._boundaries) == [0, len(model.layers)]
    assert model._sixteen.weights.dtype == np.uint16 and model._arena.params.dtype == np.float32


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_autocnn_train_on_the_cuda_backend_in_sixteen_bits(tmp_path, capsys, name):
    """`autocnn train --precision bf16|fp16 --backend cuda` end to end (fit, evaluation, the report)
    on a small Fashion-MNIST-like set: every convolution, pooling and Dense row of the dispatch
    table at the precision, the loss finite, the saved weights FP32."""
    from autocnn.cli import main
    from tests.test_nn_data import write_mnist_like

    write_mnist_like(tmp_path / "fashion", n_train=64, n_test=32, seed=3)
    saved = tmp_path / "weights.npz"
    assert main(["train", "--network", "lenet5", "--data-root", str(tmp_path / "fashion"), "--epochs", "2",
                 "--batch-size", "16", "--backend", "cuda", "--precision", name, "--seed", "0",
                 "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"precision {name}, mixed: FP32 master weights" in out.splitlines()[0]
    assert "loss nan" not in out and "loss inf" not in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("conv2d_", "avgpool2d_", "dense_"))]
    assert rows and {row[2] for row in rows} == {name}
    with np.load(saved) as weights:
        params = [k for k in weights.files if k.startswith("layers/")]
        assert params and all(weights[k].dtype == np.float32 for k in params)
