"""autocnn.torch with bfloat16 and float16 tensors, torch.autocast, and grouped, depthwise and dilated
layers, on the CPU: the operators' fake implementations (dtypes, shapes, autograd, opcheck),
refusals of mixed and unsupported dtypes, the convert report for 16-bit and depthwise models, the
kernels' own refusals deciding what converts, problem collection at the dtype a model computes in,
and autocast's dispatch on meta tensors, eager and under torch.compile(fullgraph=True). A CPU build
of PyTorch cannot enter torch.autocast("cuda"), so the tests set CUDA's autocast state directly
(``cuda_autocast``), which is what the layers read. The GPU half is test_torch_sixteen_bit_gpu.py.
"""
from __future__ import annotations

import contextlib
import warnings

import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import autocnn.torch as at  # noqa: E402
from autocnn import cli  # noqa: E402
from autocnn.errors import InfeasibleConfigError  # noqa: E402
from autocnn.precision import BF16, FP16  # noqa: E402
from autocnn.search.tuner import problems_offering  # noqa: E402
from autocnn.torch import first_use, support  # noqa: E402
from autocnn.torch.first_use import FirstUse  # noqa: E402
from autocnn.torch.geometry import conv_problem  # noqa: E402
from tests import torch_fake_gpu as fake  # noqa: E402
from tests.test_torch_frontend import _autocnn_ops, _recording_backend  # noqa: E402

META = torch.device("meta")
SIXTEEN = [(torch.bfloat16, BF16), (torch.float16, FP16)]


@contextlib.contextmanager
def cuda_autocast(dtype: torch.dtype):
    """CUDA's autocast state on, at ``dtype``, as torch.autocast("cuda", dtype=dtype) sets it (which a
    CPU build of PyTorch refuses to enter); restored after."""
    enabled, before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", before)


def mobilenet_like() -> nn.Sequential:
    """MobileNetV2's pattern, small: a strided stem, inverted residual blocks (1x1 expand, depthwise 3x3
    of stride 1 and 2, 1x1 project), a depthwise 5x5 with a channel multiplier, a dilated depthwise
    3x3, and an average pool."""
    def block(c_in: int, c_out: int, stride: int, expand: int = 4) -> list[nn.Module]:
        hidden = c_in * expand
        return [nn.Conv2d(c_in, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
                nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                nn.ReLU6(), nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out)]

    return nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
                         *block(8, 8, 1), *block(8, 16, 2),
                         nn.Conv2d(16, 32, 5, padding=2, groups=16),     # K = 2C: two filters a channel
                         nn.Conv2d(32, 32, 3, padding=2, dilation=2, groups=32),
                         nn.AvgPool2d(3, 2, 1, count_include_pad=False))


_CACHED = (support._formulations_refusing, support.conv_layer_refusal, support.pool_layer_refusal)


def _offered(problem) -> bool:
    """Whether the tuner finds a formulation that serves ``problem`` (its own question of the kernels)."""
    try:
        return problems_offering({}, [problem]) == [problem]
    except InfeasibleConfigError:
        return False


def _clear_refusal_caches() -> None:
    for cached in _CACHED:
        cached.cache_clear()


@pytest.fixture
def kernels_refusing(monkeypatch):
    """Makes the kernels refuse the problems ``refuses(problem)`` picks, with a reason naming them, and
    serve those ``serves`` picks; the others are the kernels' to answer."""
    def install(refuses, serves=lambda problem: False):
        real = support._formulations_refusing

        def refusing(problem):
            if refuses(problem):
                return f"test refusal of {problem.op} at {problem.precision}"
            return None if serves(problem) else real(problem)
        monkeypatch.setattr(support, "_formulations_refusing", refusing)
        _clear_refusal_caches()
    yield install
    _clear_refusal_caches()


# -- the operators' fake implementations ---------------------------------------------------------------

@pytest.mark.parametrize("dtype,precision", SIXTEEN)
def test_sixteen_bit_operators_give_their_dtype_on_meta(dtype, precision):
    x = torch.empty(3, 5, 13, 9, device=META, dtype=dtype, requires_grad=True)
    w = torch.empty(7, 5, 5, 3, device=META, dtype=dtype, requires_grad=True)
    b = torch.empty(7, device=META, dtype=dtype, requires_grad=True)
    y = torch.ops.autocnn.conv2d(x, w, b, [2, 1], [2, 1, 2, 1], [1, 1], 1, "fp32")
    assert y.shape == (3, 7, 7, 9) and y.dtype == dtype
    y.sum().backward()
    assert (x.grad.dtype, w.grad.dtype, b.grad.dtype) == (dtype,) * 3
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    pooled = torch.ops.autocnn.avg_pool2d(x, [3, 3], [2, 2], [1, 1, 1, 1], False)
    assert pooled.dtype == dtype and pooled.shape == (3, 5, 7, 5)
    for op, args in ((torch.ops.autocnn.conv2d.default, (x, w, b, [2, 1], [2, 1, 2, 1], [1, 1], 1, "tf32")),
                     (torch.ops.autocnn.avg_pool2d.default, (x, [3, 3], [2, 2], [1, 1, 1, 1], False))):
        torch.library.opcheck(op, args)
    # The problems the real operator builds are the dtype's, whatever the float32 precision says.
    assert conv_problem("conv_fwd", (3, 5, 13, 9), (7, 5, 5, 3), (2, 1), (2, 1, 2, 1), precision.name).precision \
        is precision


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stride,dilation", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_depthwise_and_dilated_fake_shapes_are_pytorchs(dtype, stride, dilation):
    x = torch.empty(3, 6, 15, 11, device=META, dtype=dtype, requires_grad=True)
    w = torch.empty(12, 1, 7, 7, device=META, dtype=dtype, requires_grad=True)   # a multiplier of 2
    pad = 3 * dilation
    y = torch.ops.autocnn.conv2d(x, w, None, [stride] * 2, [pad] * 4, [dilation] * 2, 6, "fp32")
    expected = F.conv2d(torch.empty(3, 6, 15, 11, device=META, dtype=dtype), torch.empty(12, 1, 7, 7, device=META,
                        dtype=dtype), stride=stride, padding=pad, dilation=dilation, groups=6)
    assert y.shape == expected.shape and y.dtype == dtype
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    torch.library.opcheck(torch.ops.autocnn.conv2d.default,
                          (x.detach().requires_grad_(), w, None, [stride] * 2, [pad] * 4, [dilation] * 2, 6, "fp32"))
    # The backward operators (no autograd of their own): given tensors that need no gradient.
    dy = torch.empty(y.shape, device=META, dtype=dtype)
    geometry = ([stride] * 2, [pad] * 4, [dilation] * 2, 6, "fp32")
    for op, args in ((torch.ops.autocnn.conv2d_backward_data.default, (dy, w.detach(), [15, 11], *geometry)),
                     (torch.ops.autocnn.conv2d_weight_grad.default, (x.detach(), dy, [7, 7], *geometry, True))):
        out = op(*args)
        assert all(t.dtype == dtype for t in (out if isinstance(out, tuple) else (out,)))
        torch.library.opcheck(op, args)
    assert torch.ops.autocnn.conv2d_weight_grad(x.detach(), dy, [7, 7], *geometry, True)[1].shape == (12,)


def test_mixed_and_unsupported_dtypes_are_refused_with_what_to_do():
    x16 = torch.empty(1, 4, 8, 8, device=META, dtype=torch.bfloat16)
    w32 = torch.empty(4, 4, 3, 3, device=META)
    with pytest.raises(TypeError, match=r"one dtype \(x bfloat16, weight float32\).*torch.autocast"):
        torch.ops.autocnn.conv2d(x16, w32, None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
    with pytest.raises(TypeError, match=r"x bfloat16, weight bfloat16, bias float16"):
        torch.ops.autocnn.conv2d(x16, w32.bfloat16(), torch.empty(4, device=META, dtype=torch.float16), [1, 1],
                                 [1, 1, 1, 1], [1, 1], 1, "fp32")
    with pytest.raises(TypeError, match="take float32, bfloat16, float16 tensors, not float64"):
        torch.ops.autocnn.conv2d(x16.double(), w32.double(), None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
    with pytest.raises(TypeError, match="not float64"):
        torch.ops.autocnn.avg_pool2d(x16.double(), [2, 2], [2, 2], [0, 0, 0, 0], True)
    with pytest.raises(ValueError, match="precision='bf16' is not one of fp32, tf32.*bfloat16 and float16 tensors"):
        torch.ops.autocnn.conv2d(x16, w32.bfloat16(), None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "bf16")
    with pytest.raises(ValueError, match=r"expects 1 x groups=2 = 2"):
        torch.ops.autocnn.conv2d(x16, torch.empty(4, 1, 3, 3, device=META, dtype=torch.bfloat16), None, [1, 1],
                                 [1, 1, 1, 1], [1, 1], 2, "fp32")
    # A converted float32 layer given a bfloat16 input outside autocast: the operator's message.
    conv = at.Conv2d(4, 4, 3, padding=1).to(META)
    with pytest.raises(TypeError, match=r"x bfloat16, weight float32, bias float32"):
        conv(x16)


def test_an_operator_refuses_what_no_kernel_computes_before_any_device_work(kernels_refusing, device_untouched):
    kernels_refusing(lambda p: p.groups == 2)
    x = torch.empty(1, 4, 8, 8, device=META)
    w = torch.empty(4, 2, 3, 3, device=META)
    with pytest.raises(ValueError, match="conv_fwd N=1,C=4.*groups=2.*test refusal of conv_fwd at fp32"):
        torch.ops.autocnn.conv2d(x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 2, "fp32")
    with pytest.raises(ValueError, match="test refusal of conv_bwd_data"):   # the real operator, on the CPU
        torch.ops.autocnn.conv2d_backward_data(torch.empty(1, 4, 8, 8), torch.empty(4, 2, 3, 3), [8, 8], [1, 1],
                                               [1, 1, 1, 1], [1, 1], 2, "fp32")


# -- what converts, and the report -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype,precision", SIXTEEN)
def test_a_sixteen_bit_mobilenet_converts_whole_and_the_report_names_its_precision(dtype, precision):
    model = mobilenet_like().to(dtype)
    report = at.convert(model, verbose=False)
    convs = [m for m in report.modules if m.kind == "Conv2d"]
    assert len(convs) == 9 and not report.left, str(report)
    assert all(m.precision == precision.name for m in convs)
    assert all(f"{str(dtype).replace('torch.', '')} at {precision.name}" in m.detail for m in convs)
    pool = report.modules[-1]
    assert pool.kind == "AvgPool2d" and pool.replaced and "in its input's dtype" in pool.detail
    assert all(isinstance(m, at.Conv2d) for m in model.modules() if isinstance(m, nn.Conv2d))
    # Shapes and dtypes through the converted model on meta: every layer on autocnn's operators.
    graphs: dict = {}
    torch._dynamo.reset()
    compiled = torch.compile(model.to(META), fullgraph=True, backend=_recording_backend(graphs))
    out = compiled(torch.empty(3, 3, 33, 31, device=META, dtype=dtype))
    assert out.dtype == dtype and out.shape == (3, 32, 5, 4)
    assert _autocnn_ops(graphs["forward"][0]) == {"conv2d", "avg_pool2d"}


def test_float32_layers_report_their_precision_and_autocast_and_float64_is_left():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                          nn.Conv2d(8, 4, 1).double())
    report = at.convert(model, "tf32", verbose=False)
    assert [m.name for m in report.replaced] == ["0", "1"]
    assert all(m.precision == "tf32" for m in report.replaced)
    assert "float32 at tf32; under torch.autocast at its dtype (bf16 or fp16)" in report.replaced[1].detail
    assert "dtype float64 (autocnn's kernels run float32, bfloat16, float16)" in report.left[0].detail
    assert report.to_dict()["replaced"][0]["precision"] == "tf32"
    with pytest.raises(ValueError, match="dtype float64"):
        at.Conv2d(3, 4, 3, dtype=torch.float64)
    assert at.Conv2d(3, 4, 3, dtype=torch.bfloat16).weight.dtype == torch.bfloat16
    assert at.Conv2d(6, 12, 3, padding=2, dilation=2, groups=6).groups == 6


@pytest.mark.parametrize("layer", [nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.Conv2d(16, 16, 3, padding=2,
                                                                                           dilation=2),
                                   nn.Conv2d(16, 32, 3, padding=1, groups=16), nn.Conv2d(12, 24, 3, groups=3)],
                         ids=["groups4", "dense_dilated", "depthwise_x2", "groups3"])
def test_what_converts_is_what_the_kernels_serve(layer):
    """convert's answer for a grouped or dilated layer agrees with the tuner's own question of the
    kernels (problems_offering: which problems some formulation serves), whichever it is."""
    problems = [conv_problem(op, (2, layer.in_channels, 9, 9), tuple(layer.weight.shape), (1, 1),
                             tuple(layer.padding) * 2, "fp32", False, tuple(layer.dilation), layer.groups)
                for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad")]
    served = all(_offered(p) for p in problems)
    report = at.convert(nn.Sequential(layer), verbose=False)
    assert bool(report.replaced) == served, str(report)
    if not served:
        reason = report.left[0].detail
        grouping = f"groups={layer.groups}" if layer.groups != 1 else "dilation=(2, 2)"
        assert reason.startswith(grouping) and "kernel of autocnn computes it at fp32" in reason
        with pytest.raises(ValueError, match="use torch.nn.Conv2d"):
            at.Conv2d(layer.in_channels, layer.out_channels, 3, padding=layer.padding, dilation=layer.dilation,
                      groups=layer.groups)
    if layer.groups == layer.in_channels:
        assert served   # depthwise has a formulation of its own for all three operations


def test_a_layer_the_kernels_refuse_is_left_with_their_reason(kernels_refusing):
    kernels_refusing(lambda p: p.groups == 4 and p.op == "conv_wgrad", serves=lambda p: p.groups == 4)
    report = at.convert(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.Conv2d(16, 16, 1)),
                        verbose=False)
    assert [m.name for m in report.replaced] == ["1"]
    assert report.left[0].detail == ("groups=4: no conv_wgrad kernel of autocnn computes it at fp32 "
                                     "(conv_wgrad: test refusal of conv_wgrad at fp32)")
    with pytest.raises(ValueError, match="groups=4: no conv_wgrad kernel.*use torch.nn.Conv2d"):
        at.Conv2d(16, 16, 3, groups=4)


def test_a_precision_the_kernels_refuse_for_a_layer_runs_pytorchs_operator(kernels_refusing):
    """A float32 depthwise layer whose kernels are (here) refused at bf16: converted, and under
    autocast(bfloat16) its calls run PyTorch's operator; at fp16 autocnn's. The report says so."""
    kernels_refusing(lambda p: getattr(p, "groups", 1) > 1 and p.precision is BF16)   # depthwise serves fp16
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8)).to(META)
    report = at.convert(model, verbose=False)
    assert report.replaced and "under torch.autocast to bf16: PyTorch's" in report.replaced[0].detail
    x = torch.empty(2, 8, 9, 9, device=META)
    for dtype, ours in ((torch.bfloat16, False), (torch.float16, True)):
        graphs: dict = {}
        torch._dynamo.reset()
        with cuda_autocast(dtype):
            out = torch.compile(model, fullgraph=True, backend=_recording_backend(graphs))(x)
        assert ("conv2d" in _autocnn_ops(graphs["forward"][0])) == ours
        assert out.dtype == (dtype if ours else torch.float32)   # meta tensors: PyTorch's autocast passes them by


def test_torchvision_mobilenet_v2_converts_in_bf16():
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed with this PyTorch")
    model = torchvision.models.mobilenet_v2().to(torch.bfloat16)
    report = at.convert(model, verbose=False)
    convs = [m for m in report.modules if m.kind == "Conv2d"]
    assert len(convs) == 52 and all(m.replaced and m.precision == "bf16" for m in convs), str(report)


# -- autocast ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_converted_convolutions_compute_in_its_dtype_and_pools_in_their_inputs(dtype):
    model = nn.Sequential(nn.AvgPool2d(2), nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                          nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)).to(META)
    at.convert(model, verbose=False)
    x = torch.empty(4, 3, 16, 16, device=META, requires_grad=True)
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((type(m).__name__, i[0].dtype, o.dtype)))
             for m in model if isinstance(m, (at.Conv2d, at.AvgPool2d))]
    with cuda_autocast(dtype):
        out = model(x)
    for h in hooks:
        h.remove()
    assert seen == [("AvgPool2d", torch.float32, torch.float32), ("Conv2d", torch.float32, dtype),
                    ("AvgPool2d", dtype, dtype), ("Conv2d", dtype, dtype)]
    out.float().sum().backward()   # outside autocast, as PyTorch's recipe does
    assert x.grad.dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 and p.grad.shape == p.shape for p in model.parameters())
    # Compiled whole: the casts and autocnn's operators in one forward graph, the backward in another.
    graphs: dict = {}
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=_recording_backend(graphs))
    with cuda_autocast(dtype):
        out = compiled(x)
    assert out.dtype == dtype
    out.float().sum().backward()
    forward = graphs["forward"][0]
    assert _autocnn_ops(forward) == {"conv2d", "avg_pool2d"}
    casts = [n for n in forward.graph.nodes if "_to_copy" in str(n.target)]
    assert {n.kwargs.get("dtype") for n in casts} == {dtype} and len(casts) == 5   # x, two weights, two biases
    assert _autocnn_ops(graphs["backward"][0]) == {"conv2d_backward_data", "conv2d_weight_grad",
                                                   "avg_pool2d_backward"}
    # Outside autocast again: a new graph, in float32.
    assert compiled(x).dtype == torch.float32


def test_a_float64_input_under_autocast_is_left_to_pytorch():
    conv = at.Conv2d(3, 4, 3).to(META).double()
    with cuda_autocast(torch.bfloat16):
        assert conv(torch.empty(1, 3, 5, 5, device=META, dtype=torch.float64)).dtype == torch.float64


# -- problems at the dtype a model computes in -------------------------------------------------------------

def test_problems_are_collected_at_the_dtype_the_model_computes_in():
    model = mobilenet_like()
    x = torch.empty(2, 3, 32, 32)
    float32 = at.collect_problems(model, x)
    assert {u.problem.precision.name for u in float32} == {"fp32"}
    for dtype, precision in SIXTEEN:
        traced = at.collect_problems(model, x, precision=precision.name)
        assert {u.problem.precision for u in traced} == {precision}
        assert len(traced) == len(float32)
        assert [u.problem.op for u in traced] == [u.problem.op for u in float32]
        with cuda_autocast(dtype):
            assert at.collect_problems(model, x) == traced
        assert at.collect_problems(mobilenet_like().to(dtype), x.to(dtype)) == traced
    depthwise = [u.problem for u in float32 if getattr(u.problem, "groups", 1) > 1]
    assert {(p.groups == p.C, p.dilation) for p in depthwise} == {(True, (1, 1)), (True, (2, 2))}
    assert len(depthwise) == 3 * 4   # the blocks' two, the 5x5 and the dilated 3x3, all three operations
    assert not any(u.problem.op.startswith("avgpool") for u in float32[:3])
    with pytest.raises(ValueError, match="precision='fp64'"):
        at.collect_problems(model, x, precision="fp64")
    # As under autocast: a pool on the float32 input runs in float32, after a convolution (converted or
    # not) or a linear layer in the autocast dtype.
    pools = nn.Sequential(nn.AvgPool2d(2), nn.Conv2d(3, 4, 3), nn.AvgPool2d(2), nn.Linear(2, 2), nn.AvgPool2d(1))
    at.convert(pools[:2], verbose=False)
    found = [(u.problem.op, u.problem.precision.name) for u in at.collect_problems(pools, torch.empty(2, 3, 14, 14),
                                                                                   precision="fp16")]
    assert found == [("avgpool_fwd", "fp32"), ("conv_fwd", "fp16"), ("conv_wgrad", "fp16"),
                     ("avgpool_fwd", "fp16"), ("avgpool_bwd", "fp16"), ("avgpool_fwd", "fp16"),
                     ("avgpool_bwd", "fp16")]


def test_the_first_step_under_autocast_prepares_the_autocast_dtypes_problems(tmp_path, monkeypatch):
    source = fake.RecordedSource()
    kernels = fake.fake_kernels(tmp_path / "db", source)
    monkeypatch.setattr(first_use, "_cuda_step", lambda args, kwargs: torch.device("cuda", 0))
    monkeypatch.setattr(first_use, "kernels_for", lambda device: kernels)
    model = fake.model()
    at.convert(model, verbose=False, budget_s=600)
    assert [h for h in model._forward_pre_hooks.values() if isinstance(h, FirstUse)]
    x = torch.randn(4, 3, 32, 32)   # on the CPU: the hook is told it is on a GPU
    with cuda_autocast(torch.bfloat16):
        model(x)
    assert len(kernels.kernels.dispatch) == 7   # test_torch_quick's PROBLEMS: the model's training step
    assert {p.precision for p in kernels.kernels.dispatch} == {BF16}
    first = len(kernels.kernels.dispatch)
    model(x)   # outside autocast: float32's problems, prepared in their turn
    assert {p.precision.name for p in kernels.kernels.dispatch} == {"bf16", "fp32"}
    assert len(kernels.kernels.dispatch) == 2 * first


def test_prepare_ahead_of_an_autocast_step_takes_its_precision(tmp_path):
    source = fake.RecordedSource()
    kernels = fake.fake_kernels(tmp_path / "db", source)
    settings = first_use.PrepareSettings.resolve(budget_s=600, verbose=False)
    with pytest.raises(ValueError, match="precision='fp64'"):
        first_use.prepare_on(kernels, fake.model(), (torch.empty(fake.INPUT_SHAPE),), settings, precision="fp64")
    assert not source.measured   # refused before any measurement
    report = first_use.prepare_on(kernels, fake.model(), (torch.empty(fake.INPUT_SHAPE),), settings,
                                  precision="fp16")
    assert len(report.problems) == 7 and {p.problem.precision for p in report.problems} == {FP16}
    assert len(report.tuned) == 7 and source.measured


def test_the_command_line_tunes_a_models_sixteen_bit_problems(no_gpu_source, monkeypatch):
    seen = {}
    real = at.factory_problems

    def spy(spec, shape, batch, precision, layout):
        seen["uses"] = real(spec, shape, batch, precision, layout)
        return seen["uses"]

    monkeypatch.setattr(at, "factory_problems", spy)
    with pytest.raises(no_gpu_source):
        cli.main(["tune", "--torch-model", f"{__name__}:mobilenet_like", "--input-shape", "3,32,32", "--batch", "4",
                  "--precision", "bf16"])
    problems = [u.problem for u in seen["uses"]]
    assert problems and {p.precision for p in problems} == {BF16}
    assert any(p.groups > 1 for p in problems) and {"avgpool_fwd", "conv_wgrad"} <= {p.op for p in problems}


def test_sixteen_bit_models_compute_the_same_on_the_cpu():
    """On the CPU a converted bf16 model runs PyTorch's own operators: what it computed before."""
    torch.manual_seed(3)
    model = mobilenet_like().to(torch.bfloat16).eval()
    x = torch.randn(2, 3, 17, 15, dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            expected = model(x)
            at.convert(model, verbose=False)
            with warnings.catch_warnings():
                warnings.simplefilter("error")   # the CPU runs PyTorch's operator without a word
                torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    finally:
        torch.set_num_threads(threads)
