"""autocnn.torch on a GPU (pytest -m gpu): the operators against PyTorch's own convolution and pooling
in float64 on CUDA (every element), gradcheck and opcheck, a converted model's training steps
against the original's, torch.compile(fullgraph=True), CUDA-graph capture, streams and fallbacks.
The CPU half is test_torch_frontend.py.
"""
from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import autocnn.torch as at  # noqa: E402
from autocnn.kernels import reference  # noqa: E402
from autocnn.torch.geometry import conv_problem, pool_problem  # noqa: E402
from autocnn.measurement.measure import verify_outputs  # noqa: E402
from tests.bench_module import load_bench  # noqa: E402
from tests.torch_references import cuda_without_tf32  # noqa: E402,F401  (autouse)

pytestmark = pytest.mark.gpu


def _cupy(t):
    import cupy as cp

    return cp.asarray(t.detach().contiguous())


def _poison(*shapes) -> None:
    """Fill blocks of the outputs' sizes with NaN and free them: PyTorch's caching allocator hands them
    to the operator next, so an element its kernel does not write stays NaN."""
    blocks = [torch.full(s, float("nan"), device="cuda") for s in shapes]
    del blocks


def _check(problem, inputs: dict, outputs: dict, refs: dict, scales: dict) -> None:
    """autocnn's verification (every element finite, relative error within error_bound for the problem's
    precision) against PyTorch's float64 results, and each element within the worst-case rounding of
    its own sum: |out - ref| <= (n * 2^-23 + e) * sum of |terms|, e the error of one product (2^-10 for
    TF32 operands; 2^-20 for fp32, which 3xTF32 tensor-core kernels reach, not exact FP32 products)."""
    result = verify_outputs(problem, {k: _cupy(v) for k, v in inputs.items()},
                            {k: _cupy(v) for k, v in outputs.items()}, ref={k: _cupy(v) for k, v in refs.items()})
    assert result.passed, f"{problem.op} {problem.shape_string()}: {result.message}"
    for name, ref in refs.items():
        n = reference.reduction_length(problem, name)
        per_term = 2.0 ** -10 if getattr(problem, "precision", "fp32") == "tf32" else 2.0 ** -20
        tol = (n * 2.0 ** -23 + per_term) * scales[name] + 1e-30
        err = (outputs[name].double() - ref).abs()
        worst = float((err / tol).max())
        assert worst <= 1.0, f"{problem.op} {problem.shape_string()} {name}: an element is {worst:.3g} x its bound"


def _conv64(x, w, b, stride, padding, dy):
    """PyTorch's float64 convolution (asymmetric padding as a zero pad) and its three gradients for dy."""
    x, w = x.double().requires_grad_(), w.double().requires_grad_()
    b = None if b is None else b.double().requires_grad_()
    t, l, bo, r = padding
    y = F.conv2d(F.pad(x, (l, r, t, bo)), w, b, stride)
    grads = torch.autograd.grad(y, [x, w] + ([b] if b is not None else []), dy.double())
    out = {"y": y.detach(), "dx": grads[0], "dw": grads[1]}
    if b is not None:
        out["db"] = grads[2]
    return out


CONV_CASES = [  # x shape, w shape, stride, padding (top, left, bottom, right), bias
    ((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1, 1, 1), True),
    ((3, 5, 13, 9), (7, 5, 5, 3), (2, 1), (2, 1, 2, 1), False),
    ((2, 3, 32, 32), (16, 3, 8, 8), (1, 1), (4, 4, 3, 3), True),      # kriz09's asymmetric padding
    ((2, 16, 9, 9), (8, 16, 1, 1), (2, 2), (0, 0, 0, 0), False),     # a ResNet projection
    ((4, 64, 14, 14), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), False),  # a ResNet block
    ((2, 3, 29, 31), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), False),     # a ResNet stem, odd sizes
]


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("x_shape,w_shape,stride,padding,bias", CONV_CASES)
def test_conv_operators_match_pytorch_float64(x_shape, w_shape, stride, padding, bias, precision):
    x = torch.randn(x_shape, device="cuda")
    w = torch.randn(w_shape, device="cuda")
    b = torch.randn(w_shape[0], device="cuda") if bias else None
    fwd = conv_problem("conv_fwd", x_shape, w_shape, stride, padding, precision, bias)
    dy = torch.randn(fwd.y_shape, device="cuda")
    refs = _conv64(x, w, b, stride, padding, dy)
    scales = _conv64(x.abs(), w.abs(), None if b is None else b.abs(), stride, padding, dy.abs())

    _poison(fwd.y_shape)
    y = torch.ops.autocnn.conv2d(x, w, b, stride, padding, [1, 1], 1, precision)
    _check(fwd, {"x": x}, {"y": y}, {"y": refs["y"]}, scales)
    bwd = conv_problem("conv_bwd_data", x_shape, w_shape, stride, padding, precision)
    _poison(x_shape)
    dx = torch.ops.autocnn.conv2d_backward_data(dy, w, list(x_shape[2:]), stride, padding, [1, 1], 1, precision)
    _check(bwd, {"dy": dy}, {"dx": dx}, {"dx": refs["dx"]}, scales)
    wgrad = conv_problem("conv_wgrad", x_shape, w_shape, stride, padding, precision, bias)
    _poison(w_shape, (w_shape[0],))
    dw, db = torch.ops.autocnn.conv2d_weight_grad(x, dy, list(w_shape[2:]), stride, padding, [1, 1], 1, precision,
                                                  bias)
    outputs = {"dw": dw, **({"db": db} if bias else {})}
    _check(wgrad, {"x": x}, outputs, {k: refs[k] for k in outputs}, scales)
    assert db.shape == ((w_shape[0],) if bias else (0,))


@pytest.mark.parametrize("window,stride,padding,count_pad", [((2, 2), (2, 2), (0, 0), True),
                                                             ((3, 3), (2, 2), (1, 1), False),
                                                             ((3, 3), (2, 2), (1, 1), True),
                                                             ((3, 2), (1, 2), (1, 0), True)])
def test_pool_operators_match_pytorch_float64(window, stride, padding, count_pad):
    x = torch.randn(3, 6, 15, 14, device="cuda")
    pad4 = (padding[0], padding[1], padding[0], padding[1])
    fwd = pool_problem("avgpool_fwd", tuple(x.shape), window, stride, pad4, count_pad)
    dy = torch.randn(fwd.y_shape, device="cuda")

    def ref(xs, dys):
        x64 = xs.double().requires_grad_()
        y64 = F.avg_pool2d(x64, window, stride, padding, count_include_pad=count_pad)
        return {"y": y64.detach(), "dx": torch.autograd.grad(y64, x64, dys.double())[0]}

    refs, scales = ref(x, dy), ref(x.abs(), dy.abs())
    _poison(fwd.y_shape)
    y = torch.ops.autocnn.avg_pool2d(x, window, stride, pad4, count_pad)
    _check(fwd, {"x": x}, {"y": y}, {"y": refs["y"]}, scales)
    _poison(tuple(x.shape))
    dx = torch.ops.autocnn.avg_pool2d_backward(dy, list(x.shape[2:]), window, stride, pad4, count_pad)
    _check(fwd.with_op("avgpool_bwd"), {"dy": dy}, {"dx": dx}, {"dx": refs["dx"]}, scales)


def test_gradcheck_and_opcheck():
    # The operators are linear in each input, so float32 finite differences with a large step are
    # exact up to rounding; nondet_tol admits the weight gradient's atomic (unordered) sums.
    x = torch.randn(2, 3, 7, 6, device="cuda", requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(4, device="cuda", requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # gradcheck's note on float32 inputs
        assert torch.autograd.gradcheck(
            lambda x, w, b: torch.ops.autocnn.conv2d(x, w, b, [2, 1], [1, 2, 0, 1], [1, 1], 1, "fp32"), (x, w, b),
            eps=1e-2, atol=2e-3, rtol=2e-3, nondet_tol=1e-5)
        assert torch.autograd.gradcheck(
            lambda x: torch.ops.autocnn.avg_pool2d(x, [3, 3], [2, 2], [1, 1, 1, 1], False), (x,),
            eps=1e-2, atol=2e-3, rtol=2e-3)
    # The backward operators have no autograd of their own (no double backward): given no inputs that
    # require gradients. The output of the convolution above is 2 x 4 x 3 x 7.
    dy = torch.randn(2, 4, 3, 7, device="cuda")
    for op, args in ((torch.ops.autocnn.conv2d.default, (x, w, b, [2, 1], [1, 2, 0, 1], [1, 1], 1, "fp32")),
                     (torch.ops.autocnn.conv2d_backward_data.default, (dy, w.detach(), [7, 6], [2, 1], [1, 2, 0, 1],
                                                                       [1, 1], 1, "fp32")),
                     (torch.ops.autocnn.conv2d_weight_grad.default, (x.detach(), dy, [3, 3], [2, 1], [1, 2, 0, 1],
                                                                     [1, 1], 1, "fp32", True)),
                     (torch.ops.autocnn.avg_pool2d.default, (x, [2, 2], [2, 2], [0, 0, 0, 0], True)),
                     (torch.ops.autocnn.avg_pool2d_backward.default, (torch.randn(2, 3, 3, 3, device="cuda"), [7, 6],
                                                                      [2, 2], [2, 2], [0, 0, 0, 0], True))):
        torch.library.opcheck(op, args)


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.Tanh(), nn.AvgPool2d(3, 2, 1, count_include_pad=False),
                         nn.Conv2d(32, 32, 3, stride=2, padding=1, bias=False), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 4 * 4, 10)).cuda()


def _pair():
    torch.manual_seed(0)
    original = _cnn()
    converted = copy.deepcopy(original)
    report = at.convert(converted, verbose=False)
    assert len(report.replaced) == 5 and not report.left
    return original, converted


def _batches(n: int, batch: int = 32):
    g = torch.Generator(device="cuda").manual_seed(1)
    return [(torch.randn(batch, 3, 32, 32, device="cuda", generator=g),
             torch.randint(0, 10, (batch,), device="cuda", generator=g)) for _ in range(n)]


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def test_converted_model_trains_as_the_original():
    original, converted = _pair()
    before = at.launch_counts()
    curves = []
    for model in (original, converted):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        # One batch eight times: memorising it must lower its loss (fresh random batches with random
        # labels need not), so "it did learn" below can be asserted.
        for x, y in _batches(1) * 8:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        curves.append(losses)
    after = at.launch_counts()
    for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad", "avgpool_fwd", "avgpool_bwd"):
        assert after.get(op, 0) > before.get(op, 0), f"no {op} kernel ran: the converted model used PyTorch's"
    for step, (a, b) in enumerate(zip(*curves)):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(a)), f"step {step}: loss {b} converted, {a} original"
    assert curves[0][-1] < curves[0][0]   # it did learn
    for (name, p), q in zip(original.named_parameters(), converted.parameters()):
        assert _rel(q, p) <= 1e-3, name


def test_compile_fullgraph_of_a_converted_model():
    torch._dynamo.reset()
    _, converted = _pair()
    eager = copy.deepcopy(converted)
    compiled = torch.compile(converted, fullgraph=True)
    before = sum(at.launch_counts().values())
    x, _ = _batches(1)[0]
    out = compiled(x)
    out.square().mean().backward()
    ref = eager(x)
    ref.square().mean().backward()
    assert sum(at.launch_counts().values()) > before   # the compiled graph ran autocnn's operators
    assert _rel(out, ref) <= 1e-5
    for (name, p), q in zip(eager.named_parameters(), converted.parameters()):
        assert _rel(q.grad, p.grad) <= 1e-4, name



def test_cuda_graph_of_a_converted_training_step():
    # The benchmark's capture (PyTorch's recipe: warm-up on a side stream, capturable Adam, the whole
    # step in one graph), replayed on new batches, against the same steps run eagerly on a twin.
    bench = load_bench()
    _, model = _pair()
    twin = copy.deepcopy(model)
    data = _batches(4)
    x, y = (t.clone() for t in data[0])
    graph = bench.capture_torch_step(model, x, y)   # three warm-up steps on the first batch
    twin_step, _ = bench.torch_step(twin, x, y, capturable=True)
    for _ in range(3):
        twin_step()
    for xb, yb in data[1:]:
        x.copy_(xb)
        y.copy_(yb)
        graph.replay()
        twin_step()
    for (name, p), q in zip(twin.named_parameters(), model.parameters()):
        assert _rel(q, p) <= 1e-4, name


def test_a_kernel_first_met_inside_a_capture_is_an_error_that_says_what_to_do():
    x = torch.randn(3, 7, 19, 23, device="cuda")
    w = torch.randn(5, 7, 3, 3, device="cuda")   # a shape no other test runs
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError) as err:
        with torch.cuda.graph(graph):
            torch.ops.autocnn.conv2d(x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
    texts = [str(err.value), str(err.value.__context__)]
    assert any("was not prepared before this CUDA-graph capture" in t and "autocnn.torch.prepare" in t for t in texts)
    torch.cuda.synchronize()
    # prepare compiles every kernel of the model ahead: a capture then needs no warm-up of autocnn's.
    model = nn.Sequential(at.Conv2d(7, 5, 3, padding=1), at.AvgPool2d(2)).cuda()
    report = at.prepare(model, x, training=False)
    assert [d.problem.op for d in report.dispatch] == ["conv_fwd", "avgpool_fwd"]
    assert report.settings.autotune == "off"   # tests/conftest.py: GPU tests run the lookup's answer
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        eager = model(x)
        with torch.cuda.graph(graph):
            captured = model(x)
    graph.replay()
    torch.testing.assert_close(captured, eager)
    assert "conv_fwd" in at.dispatch_report()


def test_prepare_quick_tunes_an_unseen_model_once_and_a_fresh_reader_of_the_database_tunes_nothing(tmp_path):
    """autocnn.torch's prepare on the GPU, on a database of its own: every problem of an unseen model
    quick-tuned and stored; kernels made afresh over the same database (as in a new process) find
    the quick records and tune nothing."""
    import cupy as cp

    from autocnn.device import current_device
    from autocnn.dispatch.kernels import GpuKernels
    from autocnn.store import TuningDatabase
    from autocnn.torch.first_use import PrepareSettings, prepare_on
    from autocnn.torch.launch import DeviceKernels

    def fresh() -> DeviceKernels:
        db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped")
        return DeviceKernels(0, GpuKernels(cp, 0, current_device(0), db, "quick"))

    model = nn.Sequential(at.Conv2d(5, 11, 3, padding=1), nn.ReLU(), at.AvgPool2d(2)).cuda()
    x = torch.randn(3, 5, 13, 17, device="cuda")
    settings = PrepareSettings.resolve(autotune="quick", budget_s=300, verbose=False)
    first = prepare_on(fresh(), model, (x,), settings)
    assert len(first.tuned) == len(first.problems) == 4 and not first.over_budget, str(first)
    assert all(d.source == "quick-tuned" for d in first.dispatch) and first.tune_s > 0
    second = prepare_on(fresh(), model, (x,), settings)
    assert not second.tuned and len(second.from_database) == 4 and second.tune_s == 0, str(second)


def test_kernels_run_on_pytorchs_current_stream():
    w = torch.randn(8, 4, 3, 3, device="cuda")
    src = torch.randn(2, 4, 16, 16, device="cuda")
    x = torch.zeros_like(src)
    expected = torch.ops.autocnn.conv2d(src, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)   # the copy lands long after a launch on another stream would run
        x.copy_(src)
        y = torch.ops.autocnn.conv2d(x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
    stream.synchronize()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_tf32_layer_meets_the_tf32_bound():
    conv = at.Conv2d(64, 64, 3, padding=1, precision="tf32").cuda()
    x = torch.randn(4, 64, 14, 14, device="cuda")
    with torch.no_grad():
        y = conv(x)
    problem = conv_problem("conv_fwd", tuple(x.shape), tuple(conv.weight.shape), (1, 1), (1, 1, 1, 1), "tf32", True)
    refs = _conv64(x, conv.weight.detach(), conv.bias.detach(), (1, 1), (1, 1, 1, 1), torch.zeros_like(y))
    scales = _conv64(x.abs(), conv.weight.detach().abs(), conv.bias.detach().abs(), (1, 1), (1, 1, 1, 1),
                     torch.zeros_like(y))
    _check(problem, {"x": x}, {"y": y}, {"y": refs["y"]}, scales)


def test_inputs_autocnn_cannot_take_run_pytorchs_operator_with_one_warning():
    torch.manual_seed(2)
    conv = at.Conv2d(4, 8, 3, padding=1).cuda()
    plain = nn.Conv2d(4, 8, 3, padding=1).cuda()
    plain.load_state_dict(conv.state_dict())
    x = torch.randn(2, 4, 10, 20, device="cuda")[..., ::2]   # a strided view
    with pytest.warns(RuntimeWarning, match="non-contiguous .* runs PyTorch's operator"):
        torch.testing.assert_close(conv(x), plain(x), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # once per layer
        conv(x)
    fresh = at.Conv2d(4, 8, 3, padding=1).cuda()
    with pytest.warns(RuntimeWarning, match="float64 input .* runs PyTorch's operator"):
        assert fresh.double()(x.contiguous().double()).dtype == torch.float64
    # A dense layer in channels_last: no NHWC weight gradient yet, so PyTorch's, with the kernels' reason.
    dense = at.Conv2d(4, 8, 3, padding=1).cuda()
    with pytest.warns(RuntimeWarning, match=r"runs PyTorch's operator: .*channels_last \(NHWC\): no conv_wgrad"):
        dense(x.contiguous(memory_format=torch.channels_last))


def test_a_layer_beyond_32_bit_indexing_computes_pytorchs_result_on_cuda():
    """104 images of 64 x 64 x 64 with 9x9 filters: the unrolled input has 2.2e9 elements, beyond the
    kernels' 32-bit indexing. On CUDA the drop-in layer warns once and returns exactly what
    torch.nn.Conv2d returns (cuDNN in deterministic mode, so both calls sum alike), gradients
    included; 2 images of the same layer run autocnn's kernel."""
    torch.manual_seed(5)
    conv = at.Conv2d(64, 64, 9, padding=4).cuda()
    plain = nn.Conv2d(64, 64, 9, padding=4).cuda()
    plain.load_state_dict(conv.state_dict())
    x = torch.randn(104, 64, 64, 64, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        with pytest.warns(RuntimeWarning, match=r"unrolled input N\*P\*Q\*C\*R\*S.*PyTorch's operator computes"):
            y = conv(x)
        expected = plain(x)
        torch.testing.assert_close(y, expected, rtol=0, atol=0)
        grad = torch.randn_like(y)
        y.backward(grad)
        expected.backward(grad)
    torch.testing.assert_close(conv.weight.grad, plain.weight.grad, rtol=0, atol=0)
    torch.testing.assert_close(conv.bias.grad, plain.bias.grad, rtol=0, atol=0)
    small = x[:2].contiguous()
    refs = _conv64(small, conv.weight.detach(), conv.bias.detach(), (1, 1), (4, 4, 4, 4),
                   torch.zeros(2, 64, 64, 64, device="cuda"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # said once per layer; the small batch is autocnn's
        out = conv(small)
    assert torch.linalg.norm((out.double() - refs["y"]).ravel()) <= 1e-5 * torch.linalg.norm(refs["y"].ravel())


@pytest.mark.slow
def test_tune_a_converted_model_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    torch.manual_seed(4)
    plain = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Conv2d(8, 8, 3)).cuda()
    model = copy.deepcopy(plain)
    at.convert(model, verbose=False)
    x = torch.randn(16, 3, 12, 12, device="cuda")
    uses = at.collect_problems(model, x)
    outcomes = at.tune(model, x, trials=8 * len(uses), storage="memory", progress=False)
    assert [o.problem for o in outcomes] == [u.problem for u in uses]
    assert all(o.best is not None for o in outcomes)
    # After tuning the layers look their kernels up again, and still compute the same function.
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x), rtol=1e-4, atol=1e-5)
