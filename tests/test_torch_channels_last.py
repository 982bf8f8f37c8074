"""autocnn.torch on channels_last tensors, on the CPU: the layout each combination of memory formats
makes, the strides of the fake implementations' outputs (and of the autograd gradients), a
torch.compile(fullgraph=True) trace of a converted channels_last model, convert's decisions and
report (a depthwise layer converts to NHWC, a dense one stays with PyTorch for the kernels' reason),
the problems a channels_last model's step collects, and the operators and a converted channels_last
layer run in the CPU emulator against PyTorch's float64 results. The GPU half is
test_torch_channels_last_gpu.py.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import autocnn.torch as at  # noqa: E402
from autocnn.layout import NCHW, NHWC  # noqa: E402
from autocnn.torch.memory_formats import as_layout, call_layout, tensor_layout  # noqa: E402
from tests.cuda_emulator import needs_gxx  # noqa: E402

META = torch.device("meta")
CL = torch.channels_last


def _meta(shape, channels_last=False, **kw):
    # (Tensor.contiguous(memory_format=...) keeps the strides of a tensor contiguous in both formats.)
    return torch.empty(shape, device=META, memory_format=CL if channels_last else torch.contiguous_format, **kw)


def _is_cl(t) -> bool:
    """Strictly channels_last strides, as PyTorch's own channels_last tensors have them."""
    return t.stride() == torch.empty(t.shape, device=META).contiguous(memory_format=CL).stride()


def _is_plain(t) -> bool:
    return t.stride() == torch.empty(t.shape, device=META).stride()


# -- which layout a call's tensors make ------------------------------------------------------------------

@pytest.mark.parametrize("x_cl,w_cl,expected", [
    (False, False, NCHW), (True, True, NHWC),
    (True, False, NHWC), (False, True, NHWC),   # one channels_last tensor makes the call so, as PyTorch's conv
])
def test_a_call_is_nhwc_where_its_input_or_weight_is_channels_last(x_cl, w_cl, expected):
    x, w = _meta((2, 6, 9, 7), x_cl), _meta((4, 6, 3, 3), w_cl)
    assert call_layout("t", {"x": x, "weight": w}) is expected


def test_a_tensor_whose_memory_is_both_layouts_goes_by_its_strides_and_then_by_the_others():
    depthwise = _meta((6, 1, 3, 3))                  # K x 1 x R x S: KCRS and KRSC are one memory
    assert depthwise.is_contiguous() and depthwise.is_contiguous(memory_format=CL)
    assert tensor_layout(depthwise) is NCHW and tensor_layout(_meta((6, 1, 3, 3), True)) is NHWC
    one_pixel = _meta((2, 8, 1, 1))                   # a 1 x 1 image (a squeeze-excite block's)
    assert tensor_layout(one_pixel) is NCHW and tensor_layout(_meta((2, 8, 1, 1), True)) is NHWC
    # model.to(memory_format=channels_last) gives even such weights channels_last strides: the call follows.
    x = _meta((2, 6, 9, 7))
    assert call_layout("t", {"x": x, "weight": _meta((6, 1, 3, 3), True)}) is NHWC
    assert call_layout("t", {"x": x, "weight": depthwise}) is NCHW


def test_a_strided_view_is_refused_with_what_to_call():
    x = torch.empty(2, 6, 18, 7, device=META)[:, :, ::2]
    with pytest.raises(ValueError, match=r"autocnn::conv2d: x .* contiguous neither as NCHW nor as channels_last.*"
                                         r"\.contiguous\(memory_format=torch.channels_last\)"):
        torch.ops.autocnn.conv2d(x, _meta((4, 6, 3, 3)), None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
    with pytest.raises(ValueError, match="autocnn::avg_pool2d: x"):
        torch.ops.autocnn.avg_pool2d(x.permute(0, 1, 3, 2), [2, 2], [2, 2], [0, 0, 0, 0], True)


def test_an_incoming_gradient_is_brought_to_the_forwards_layout_with_strides_that_say_so():
    broadcast = torch.ones((), device=META).expand(2, 8, 5, 5)
    assert _is_cl(as_layout(broadcast, NHWC)) and _is_plain(as_layout(broadcast, NCHW))
    one_pixel = _meta((2, 8, 1, 1))
    assert tensor_layout(as_layout(one_pixel, NHWC)) is NHWC
    cl = _meta((2, 8, 5, 5), True)
    assert as_layout(cl, NHWC) is cl and _is_plain(as_layout(cl, NCHW))


# -- the fake implementations' strides ------------------------------------------------------------------

@pytest.mark.parametrize("x_cl,w_cl", [(True, True), (True, False), (False, True), (False, False)],
                         ids=["both", "input", "weight", "neither"])
def test_fake_outputs_and_autograd_gradients_have_the_calls_layout(x_cl, w_cl):
    x = _meta((3, 6, 11, 9), x_cl).requires_grad_()
    w = _meta((6, 1, 3, 3), w_cl).requires_grad_()    # depthwise: NHWC is served
    b = torch.empty(6, device=META, requires_grad=True)
    y = torch.ops.autocnn.conv2d(x, w, b, [2, 1], [1, 1, 1, 1], [1, 1], 6, "fp32")
    channels_last = x_cl or w_cl
    assert y.shape == (3, 6, 6, 9) and (_is_cl(y) if channels_last else _is_plain(y))
    # A gradient of the other layout, and a broadcast one, come back in the forward's.
    for dy in (_meta(y.shape, not channels_last), torch.ones((), device=META).expand(y.shape)):
        y = torch.ops.autocnn.conv2d(x, w, b, [2, 1], [1, 1, 1, 1], [1, 1], 6, "fp32")
        # As the operators give them (a leaf's .grad would take the leaf's strides, whatever they are).
        dx, dw, db = torch.autograd.grad(y, [x, w, b], dy)
        assert (_is_cl(dx) if channels_last else _is_plain(dx)), dx.stride()
        assert tensor_layout(dw) is (NHWC if channels_last else NCHW) and db.shape == (6,)
    p = torch.ops.autocnn.avg_pool2d(x, [3, 2], [2, 1], [1, 0, 1, 0], False)
    assert _is_cl(p) if x_cl else _is_plain(p)
    dx, = torch.autograd.grad(p, [x], torch.ones((), device=META).expand(p.shape))
    assert _is_cl(dx) if x_cl else _is_plain(dx)


def test_the_backward_operators_take_the_layout_of_their_tensors():
    dy, w = _meta((2, 8, 5, 5), True), _meta((8, 4, 3, 3))
    dx = torch.ops.autocnn.conv2d_backward_data(dy, w, [5, 5], [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
    assert dx.shape == (2, 4, 5, 5) and _is_cl(dx)
    dw, db = torch.ops.autocnn.conv2d_weight_grad(_meta((2, 8, 5, 5)), dy, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 8,
                                                  "fp32", True)
    assert dw.shape == (8, 1, 3, 3) and tensor_layout(dw) is NHWC and db.shape == (8,)
    dxp = torch.ops.autocnn.avg_pool2d_backward(_meta((2, 8, 3, 3), True), [7, 7], [3, 3], [2, 2], [0, 0, 0, 0], True)
    assert dxp.shape == (2, 8, 7, 7) and _is_cl(dxp)


def test_opcheck_passes_on_channels_last_tensors():
    x, w = _meta((2, 6, 9, 7), True).requires_grad_(), _meta((6, 1, 3, 3), True).requires_grad_()
    b = torch.empty(6, device=META, requires_grad=True)
    torch.library.opcheck(torch.ops.autocnn.conv2d.default, (x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 6, "fp32"))
    torch.library.opcheck(torch.ops.autocnn.avg_pool2d.default, (x, [2, 2], [2, 2], [0, 0, 0, 0], True))


def test_a_dense_nhwc_weight_gradient_is_refused_with_the_kernels_reason_at_trace_time():
    x, dy = _meta((2, 8, 5, 5), True), _meta((2, 4, 5, 5), True)
    # The forward and the input gradient are served in NHWC; the dense weight gradient is not (yet).
    assert _is_cl(torch.ops.autocnn.conv2d(x, _meta((4, 8, 3, 3), True), None, [1, 1], [1, 1, 1, 1], [1, 1], 1,
                                           "fp32"))
    with pytest.raises(ValueError, match=r"conv_wgrad .*layout=nhwc: no conv_wgrad kernel of autocnn computes it.*"
                                         r"channels_last, which makes an NHWC problem"):
        torch.ops.autocnn.conv2d_weight_grad(x, dy, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32", False)


# -- convert, the layers, compile ------------------------------------------------------------------------

def channels_last_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6),   # depthwise: NHWC kernels
                         nn.ReLU(), nn.AvgPool2d(2),
                         nn.Conv2d(6, 8, 3, padding=1),                          # dense: no NHWC weight gradient
                         nn.Conv2d(8, 8, 5, padding=2, groups=8, bias=False)).to(memory_format=CL)


def test_convert_decides_a_channels_last_model_by_the_kernels_refusals_and_says_so():
    model = channels_last_model()
    report = at.convert(model, verbose=False)
    replaced = {m.name: m for m in report.replaced}
    left = {m.name: m.detail for m in report.left}
    assert set(replaced) == {"0", "2", "4"} and set(left) == {"3"}
    assert all(m.layout is NHWC and "in NHWC (channels_last)" in m.detail for m in replaced.values())
    assert "channels_last (NHWC): no conv_wgrad kernel of autocnn computes it" in left["3"]
    assert type(model[3]) is nn.Conv2d
    assert report.to_dict()["replaced"][0]["layout"] == "nhwc" and "NHWC" in str(report)
    # Converted again after its dense layer became autocnn's in NCHW: the report says where its calls go.
    converted = channels_last_model().to(memory_format=torch.contiguous_format)
    at.convert(converted, verbose=False)
    again = at.convert(converted.to(memory_format=CL), verbose=False)
    dense = next(m for m in again.replaced if m.name == "3")
    assert "its calls run PyTorch's operator: channels_last (NHWC): no conv_wgrad" in dense.detail
    # The same model in NCHW converts whole, as before.
    plain = at.convert(channels_last_model().to(memory_format=torch.contiguous_format), verbose=False)
    assert not plain.left and all(m.layout is NCHW for m in plain.replaced)


def test_a_layer_converted_for_nchw_runs_pytorchs_operator_for_a_channels_last_call(monkeypatch):
    """Converted before model.to(memory_format=channels_last): each call reads the refusals at its own
    layout, so the dense layer's channels_last call goes to PyTorch and the depthwise one's to autocnn."""
    model = channels_last_model().to(memory_format=torch.contiguous_format)
    at.convert(model, verbose=False)
    model = model.to(META, memory_format=CL)
    graphs: dict = {}
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=_recording_backend(graphs))
    out = compiled(_meta((2, 6, 12, 10), True).requires_grad_())
    assert _is_cl(out)
    calls = [n for n in graphs["forward"][0].graph.nodes if str(n.target).startswith("autocnn.conv2d")]
    assert len(calls) == 2   # layers 0 and 4; layer 3 ran PyTorch's convolution


def test_compile_fullgraph_traces_a_converted_channels_last_model_forward_and_backward():
    model = channels_last_model()
    at.convert(model, verbose=False)
    model = model.to(META)
    graphs: dict = {}
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=_recording_backend(graphs))
    x = _meta((3, 6, 13, 11), True).requires_grad_()
    out = compiled(x)
    assert out.shape == (3, 8, 6, 5) and _is_cl(out)
    out.sum().backward()
    assert _autocnn_ops(graphs["forward"][0]) == {"conv2d", "avg_pool2d"}
    assert _autocnn_ops(graphs["backward"][0]) == {"conv2d_backward_data", "conv2d_weight_grad",
                                                   "avg_pool2d_backward"}
    assert _is_cl(x.grad) and all(tensor_layout(m.weight.grad) is NHWC for m in (model[0], model[3], model[4]))


def test_a_channels_last_steps_problems_are_nhwc_where_served():
    uses = at.collect_problems(channels_last_model(), _meta((4, 6, 12, 10), True).requires_grad_())
    by_op = {}
    for u in uses:
        by_op.setdefault(u.problem.op, []).append(u.problem)
    assert sorted(by_op) == ["avgpool_bwd", "avgpool_fwd", "conv_bwd_data", "conv_fwd", "conv_wgrad"]
    assert all(p.layout is NHWC for ps in by_op.values() for p in ps)
    assert all(p.groups > 1 for p in by_op["conv_fwd"])   # the dense layer runs PyTorch's operator
    # An NCHW input of a channels_last model: its first layer's call is channels_last by its weight.
    uses = at.collect_problems(channels_last_model(), _meta((4, 6, 12, 10)))
    assert {u.problem.layout for u in uses} == {NHWC}


def test_the_command_line_traces_a_torch_model_in_channels_last():
    from autocnn.torch.tuning import factory_problems

    spec = f"{__name__}:channels_last_model"
    nhwc = factory_problems(spec, "6,12,10", 4, None, "nhwc")
    assert nhwc and all(u.problem.layout is NHWC for u in nhwc)
    nchw = factory_problems(spec, "6,12,10", 4, None)   # the factory's channels_last weights decide too
    assert {u.problem.layout for u in nchw} == {NHWC}


def nchw_model() -> nn.Module:
    """channels_last_model as a factory builds it, in NCHW (for --layout nhwc)."""
    return channels_last_model().to(memory_format=torch.contiguous_format)


def test_tune_torch_model_layout_nhwc_traces_the_model_in_channels_last(no_gpu_source, monkeypatch):
    from autocnn import cli

    seen = {}
    real = at.factory_problems

    def spy(*args):
        seen["uses"] = real(*args)
        return seen["uses"]

    monkeypatch.setattr(at, "factory_problems", spy)
    with pytest.raises(no_gpu_source):
        cli.main(["tune", "--torch-model", f"{__name__}:nchw_model", "--input-shape", "6,12,10", "--batch", "4",
                  "--layout", "nhwc"])
    assert seen["uses"] and all(u.problem.layout is NHWC for u in seen["uses"])
    assert {u.modules[0] for u in seen["uses"]} == {"0", "2", "4"}   # the dense layer is left to PyTorch


def _recording_backend(graphs: dict):
    from tests.test_torch_frontend import _recording_backend as backend

    return backend(graphs)


def _autocnn_ops(gm) -> set[str]:
    from tests.test_torch_frontend import _autocnn_ops as ops

    return ops(gm)


# -- the operators and a layer in the CPU emulator -------------------------------------------------------

@pytest.fixture
def emulated(monkeypatch, tmp_path):
    from tests.test_torch_emulated import EmulatedKernels
    from autocnn.torch import ops

    kernels = EmulatedKernels(tmp_path)
    monkeypatch.setattr(ops, "kernels_for", lambda device: kernels)
    monkeypatch.setattr(ops, "_check", lambda *args: None)   # CPU tensors stand in for CUDA ones
    return kernels


def _check_against(problem, name, got, ref, scale):
    """test_torch_emulated's check of one output, on the memory of a tensor of ``problem``'s layout."""
    from tests.test_torch_emulated import _check

    assert tensor_layout(got) is problem.layout
    _check(problem, name, got, ref, scale)


def _seeded() -> torch.Generator:
    return torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))


@needs_gxx
def test_channels_last_depthwise_conv_and_its_gradients_in_the_emulator(emulated):
    """A dilated, strided depthwise layer with two filters a channel, its input and weight channels_last
    and the incoming gradient contiguous (brought to NHWC): NHWC problems, channels_last results, each
    element against PyTorch's float64 results."""
    g = _seeded()
    x = torch.randn(3, 5, 13, 11, generator=g).contiguous(memory_format=CL).requires_grad_()
    w = torch.empty(10, 1, 3, 3, memory_format=CL).copy_(torch.randn(10, 1, 3, 3, generator=g)).requires_grad_()
    b = torch.randn(10, generator=g).requires_grad_()
    y = torch.ops.autocnn.conv2d(x, w, b, [2, 2], [2, 2, 2, 2], [2, 2], 5, "fp32")
    dy = torch.randn(y.shape, generator=g)
    y.backward(dy)
    assert [p.op for p in emulated.ran] == ["conv_fwd", "conv_bwd_data", "conv_wgrad"]
    assert all(p.layout is NHWC for p in emulated.ran)
    refs, scales = _conv64(x, w, b, dy), _conv64(x.abs(), w.abs(), b.abs(), dy.abs())
    fwd, bwd, wgrad = emulated.ran
    for problem, name, got in ((fwd, "y", y), (bwd, "dx", x.grad), (wgrad, "dw", w.grad)):
        _check_against(problem, name, got, refs[name], scales[name])
    torch.testing.assert_close(b.grad.double(), refs["db"], rtol=1e-5, atol=1e-5)


def _conv64(x, w, b, dy):
    x, w, b = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = F.conv2d(x, w, b, 2, 2, 2, 5)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], dy.double())
    return {"y": y.detach(), "dx": dx, "dw": dw, "db": db}


@needs_gxx
def test_a_converted_channels_last_pool_in_bfloat16_in_the_emulator(emulated, monkeypatch):
    from autocnn.torch import modules, support

    def as_meta(t):
        return None if t is None else torch.empty_like(t, device="meta")

    monkeypatch.setattr(modules, "runs_on_autocnn", lambda x, *ps: support.runs_on_autocnn(as_meta(x)))
    pool = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
    at.convert(pool, verbose=False)
    x = torch.randn(2, 7, 11, 9, generator=_seeded()).to(torch.bfloat16).contiguous(memory_format=CL)
    x.requires_grad_()
    y = pool(x)
    dy = torch.randn(y.shape).to(torch.bfloat16)   # contiguous: brought to NHWC
    y.backward(dy)
    assert [(p.op, p.layout) for p in emulated.ran] == [("avgpool_fwd", NHWC), ("avgpool_bwd", NHWC)]

    def ref(xs, dys):
        x64 = xs.detach().double().requires_grad_()
        y64 = F.avg_pool2d(x64, 3, 2, 1, count_include_pad=False)
        return {"y": y64.detach(), "dx": torch.autograd.grad(y64, x64, dys.double())[0]}

    refs, scales = ref(x, dy), ref(x.abs(), dy.abs())
    _check_against(emulated.ran[0], "y", y, refs["y"], scales["y"])
    _check_against(emulated.ran[1], "dx", x.grad, refs["dx"], scales["dx"])


# -- preparing a channels_last model's kernels ----------------------------------------------------------

def test_the_first_step_of_each_memory_format_prepares_its_own_layouts_kernels(tmp_path, monkeypatch):
    """The first-use hook on fake kernels (tests/torch_fake_gpu.py): a channels_last step quick-tunes and
    stores NHWC records; the same shapes in NCHW are another step, prepared again, in NCHW."""
    from autocnn.torch import first_use
    from tests import torch_fake_gpu as fake

    for name in ("AUTOCNN_AUTOTUNE", "AUTOCNN_QUICK_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    kernels = fake.fake_kernels(tmp_path / "db", fake.RecordedSource())
    monkeypatch.setattr(first_use, "_cuda_step", lambda args, kwargs: torch.device("cuda", 0))
    monkeypatch.setattr(first_use, "kernels_for", lambda device: kernels)
    model = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1, groups=6), nn.AvgPool2d(2)).to(memory_format=CL)
    at.convert(model, verbose=False)
    x = torch.randn(2, 6, 9, 7).contiguous(memory_format=CL).requires_grad_()
    model(x)
    nhwc = set(kernels.kernels.dispatch)
    assert len(nhwc) == 5 and all(p.layout is NHWC for p in nhwc)
    stored = kernels.kernels.db.records()
    assert len(stored) == 5 and all(r.quick and r.key.problem["layout"] == "nhwc" for r in stored)
    model(x)                                           # the same step: nothing more
    assert set(kernels.kernels.dispatch) == nhwc
    model.to(memory_format=torch.contiguous_format)(x.detach().contiguous().requires_grad_())
    assert {p.layout for p in set(kernels.kernels.dispatch) - nhwc} == {NCHW}
