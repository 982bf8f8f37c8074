"""autocnn.torch on channels_last tensors, on a GPU (pytest -m gpu): converted depthwise convolutions and
average pools of a channels_last model, forward and backward, in float32 at fp32 and tf32 and under
torch.autocast(bfloat16), each output against float64 of the values the kernels read and against
PyTorch's (same strides as PyTorch's outputs and gradients); the operators on mixed memory formats
and on dense NHWC layers (forward and input gradient served, the weight gradient refused before any
device work); a converted channels_last model's training step under autocast(bfloat16) captured in a
CUDA graph against eager steps; torch.compile(fullgraph=True) of it. Shapes divide nothing evenly.
The CPU half is test_torch_channels_last.py.
"""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import autocnn.torch as at  # noqa: E402
from autocnn.kernels import reference  # noqa: E402
from autocnn.layout import NHWC  # noqa: E402
from autocnn.torch.geometry import conv_problem, pool_problem  # noqa: E402
from autocnn.torch.memory_formats import tensor_layout  # noqa: E402
from tests.bench_module import load_bench  # noqa: E402
from tests.torch_references import check_output, conv64, cuda_without_tf32, relative_error  # noqa: E402,F401  (autouse)

pytestmark = pytest.mark.gpu
CL = torch.channels_last


def _problems(x_shape, conv: nn.Conv2d, precision: str) -> dict:
    """The layer's three NHWC problems at ``precision``, by the outputs they write."""
    args = (tuple(x_shape), tuple(conv.weight.shape), tuple(conv.stride), (conv.padding[0], conv.padding[1]) * 2,
            precision)
    bias = conv.bias is not None
    grouping = (tuple(conv.dilation), conv.groups, NHWC)
    wgrad = conv_problem("conv_wgrad", *args, bias, *grouping)
    return {"y": conv_problem("conv_fwd", *args, bias, *grouping),
            "dx": conv_problem("conv_bwd_data", *args, False, *grouping), "dw": wgrad, "db": wgrad}


def _step(conv, x, dy, cast):
    """Forward and backward on a fresh channels_last leaf copy of ``x``: output, gradients by name."""
    x = x.detach().clone(memory_format=CL).requires_grad_()
    conv.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=cast or torch.bfloat16, enabled=cast is not None):
        y = conv(x)
    y.backward(dy if dy is not None else torch.zeros_like(y))
    return y.detach(), {"dx": x.grad, "dw": conv.weight.grad, "db": conv.bias.grad}


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16_autocast"])
@pytest.mark.parametrize("kernel,stride,dilation,multiplier", [(3, 1, 1, 2), (3, 2, 2, 1), (7, 2, 1, 1)])
def test_a_channels_last_depthwise_layer_is_pytorchs_in_nhwc(kernel, stride, dilation, multiplier, mode):
    torch.manual_seed(kernel + 5 * stride + 11 * dilation)
    precision, cast = {"fp32": ("fp32", None), "tf32": ("tf32", None),
                       "bf16_autocast": ("bf16", torch.bfloat16)}[mode]
    pad = dilation * (kernel // 2)
    plain = nn.Conv2d(6, 6 * multiplier, kernel, stride, pad, dilation, groups=6).cuda().to(memory_format=CL)
    ours = copy.deepcopy(plain)
    report = at.convert(nn.Sequential(ours), precision="tf32" if mode == "tf32" else "fp32", verbose=False)
    assert report.replaced and report.replaced[0].layout is NHWC, str(report)
    x = torch.randn(3, 6, 15, 13, device="cuda").contiguous(memory_format=CL)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cast is not None):
        shape = plain(x).shape
    dy = torch.randn(shape, device="cuda").to(cast or torch.float32)   # contiguous: brought to NHWC
    before = at.launch_counts()
    y, grads = _step(ours, x, dy, cast)
    after = at.launch_counts()
    assert all(after.get(op, 0) > before.get(op, 0) for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad"))
    assert "layout=nhwc" in at.dispatch_report()
    theirs_y, theirs = _step(plain, x, dy, cast)
    assert y.dtype == theirs_y.dtype and y.stride() == theirs_y.stride() and tensor_layout(y) is NHWC
    assert all(grads[k].stride() == theirs[k].stride() and grads[k].dtype == theirs[k].dtype for k in grads)
    dtype = cast or torch.float32
    x_in, w_in, b_in = x.to(dtype), ours.weight.detach().to(dtype), ours.bias.detach().to(dtype)
    geometry = (tuple(ours.stride), tuple(ours.padding), tuple(ours.dilation), ours.groups)
    refs = conv64(x_in, w_in, b_in, *geometry, dy)
    scales = conv64(x_in.abs(), w_in.abs(), b_in.abs(), *geometry, dy.abs())
    problems = _problems(x.shape, ours, precision)
    outputs = {"y": y, **grads}
    for name, ref in refs.items():
        # tf32's kernels meet tf32's bound; the element-wise check is for the FP32-accurate ones.
        if mode != "tf32":
            check_output(problems[name], name, outputs[name], ref, scales[name])
        bound = problems[name].precision.error_bound(reference.reduction_length(problems[name], name))
        assert relative_error(outputs[name], ref) <= bound, name
        theirs_out = theirs_y if name == "y" else theirs[name]
        assert relative_error(theirs_out, ref) <= 4 * max(bound, 1e-5), f"{name}: PyTorch's {relative_error(theirs_out, ref):.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window,stride,padding,count_pad", [(3, 2, 1, False), ((3, 2), (1, 2), (1, 0), True)])
def test_a_channels_last_pool_is_pytorchs_in_nhwc(window, stride, padding, count_pad, dtype):
    pool = at.AvgPool2d(window, stride, padding, count_include_pad=count_pad)
    x = torch.randn(3, 5, 13, 11, device="cuda").to(dtype).contiguous(memory_format=CL).requires_grad_()
    before = at.launch_counts().get("avgpool_bwd", 0)
    y = pool(x)
    expected = F.avg_pool2d(x, window, stride, padding, count_include_pad=count_pad)
    assert y.stride() == expected.stride() and tensor_layout(y) is NHWC
    dy = torch.randn(y.shape, device="cuda").to(dtype)
    dx, = torch.autograd.grad(y, [x], dy)
    assert at.launch_counts().get("avgpool_bwd", 0) > before and tensor_layout(dx) is NHWC

    def ref(xs, dys):
        x64 = xs.detach().double().requires_grad_()
        y64 = F.avg_pool2d(x64, window, stride, padding, count_include_pad=count_pad)
        return {"y": y64.detach(), "dx": torch.autograd.grad(y64, x64, dys.double())[0]}

    refs, scales = ref(x, dy), ref(x.abs(), dy.abs())
    pair = (lambda v: (v, v) if isinstance(v, int) else tuple(v))
    pad4 = pair(padding) * 2
    fwd = pool_problem("avgpool_fwd", tuple(x.shape), pair(window), pair(stride), pad4, count_pad,
                       "fp32" if dtype == torch.float32 else "bf16", NHWC)
    check_output(fwd, "y", y, refs["y"], scales["y"])
    check_output(fwd.with_op("avgpool_bwd"), "dx", dx, refs["dx"], scales["dx"])


def test_the_operators_on_mixed_and_dense_channels_last_tensors():
    """Mixed formats are brought to the call's layout (channels_last where one tensor is); a dense NHWC
    forward and input gradient run autocnn's kernels, its weight gradient is refused before any launch."""
    torch.manual_seed(3)
    x = torch.randn(2, 5, 11, 9, device="cuda")
    w = torch.randn(7, 5, 3, 3, device="cuda")
    b = torch.randn(7, device="cuda")
    geometry = ((2, 1), (1, 1), (1, 1), 1)
    for xi, wi in ((x.contiguous(memory_format=CL), w), (x, w.contiguous(memory_format=CL)),
                   (x.contiguous(memory_format=CL), w.contiguous(memory_format=CL))):
        y = torch.ops.autocnn.conv2d(xi, wi, b, [2, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
        assert tensor_layout(y) is NHWC
        dy = torch.randn(y.shape, device="cuda")
        dx = torch.ops.autocnn.conv2d_backward_data(dy, wi, [11, 9], [2, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")
        refs = conv64(x, w, b, *geometry, dy)
        scales = conv64(x.abs(), w.abs(), b.abs(), *geometry, dy.abs())
        args = (tuple(x.shape), tuple(w.shape), (2, 1), (1, 1, 1, 1), "fp32")
        check_output(conv_problem("conv_fwd", *args, True, (1, 1), 1, NHWC), "y", y, refs["y"], scales["y"])
        check_output(conv_problem("conv_bwd_data", *args, False, (1, 1), 1, NHWC), "dx", dx, refs["dx"], scales["dx"])
    before = dict(at.launch_counts())
    with pytest.raises(ValueError, match="no conv_wgrad kernel of autocnn computes it"):
        torch.ops.autocnn.conv2d_weight_grad(x.contiguous(memory_format=CL), dy, [3, 3], [2, 1], [1, 1, 1, 1],
                                             [1, 1], 1, "fp32", True)
    assert at.launch_counts() == before
    with pytest.raises(ValueError, match="contiguous neither as NCHW nor as channels_last"):
        torch.ops.autocnn.conv2d(x[..., ::2], w, b, [1, 1], [1, 1, 1, 1], [1, 1], 1, "fp32")


def _mobile_channels_last() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 12, 3, 2, 1), nn.ReLU(),                      # dense: left to PyTorch
                         nn.Conv2d(12, 12, 3, 1, 1, groups=12), nn.ReLU(),
                         nn.Conv2d(12, 12, 5, 2, 4, dilation=2, groups=12, bias=False), nn.ReLU(),
                         nn.AvgPool2d(3, 2, 1, count_include_pad=False),
                         nn.Flatten(), nn.Linear(12 * 3 * 3, 10)).cuda().to(memory_format=CL)


def test_a_channels_last_training_step_under_autocast_bf16_captured_in_a_cuda_graph_matches_eager_steps():
    bench = load_bench()
    torch.manual_seed(17)
    model = _mobile_channels_last()
    report = at.convert(model, verbose=False)
    assert [m.name for m in report.replaced] == ["2", "4", "6"] and [m.name for m in report.left] == ["0"]
    twin = copy.deepcopy(model)
    g = torch.Generator(device="cuda").manual_seed(18)
    data = [(torch.randn(5, 3, 23, 21, device="cuda", generator=g).contiguous(memory_format=CL),
             torch.randint(0, 10, (5,), device="cuda", generator=g)) for _ in range(4)]
    x, y = data[0][0].clone(memory_format=CL), data[0][1].clone()

    def step_of(net):
        opt = torch.optim.Adam(net.parameters(), lr=1e-3, capturable=True)

        def step(zero: bool = True):
            if zero:
                opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        return step, opt

    graph = bench.capture_step(*step_of(model))
    twin_step, _ = step_of(twin)
    before = at.launch_counts()
    for _ in range(3):
        twin_step()
    after = at.launch_counts()
    assert all(after.get(op, 0) > before.get(op, 0) for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad",
                                                                "avgpool_fwd", "avgpool_bwd"))
    for xb, yb in data[1:]:
        x.copy_(xb)
        y.copy_(yb)
        graph.replay()
        twin_step()
    torch.cuda.synchronize()
    for (name, p), q in zip(twin.named_parameters(), model.parameters()):
        assert q.dtype == torch.float32 and relative_error(q, p) <= 1e-3, name
        if q.dim() == 4:
            assert tensor_layout(q) is NHWC and q.grad.stride() == q.stride(), name


def test_compile_fullgraph_of_a_channels_last_model_runs_autocnns_nhwc_kernels():
    torch._dynamo.reset()
    torch.manual_seed(19)
    model = _mobile_channels_last()
    at.convert(model, verbose=False)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(5, 3, 23, 21, device="cuda").contiguous(memory_format=CL)
    results = []
    for net in (eager, compiled):
        out = net(x)
        out.square().mean().backward()
        results.append(out)
    before = at.launch_counts()
    compiled(x)
    assert sum(at.launch_counts().values()) > sum(before.values())
    assert relative_error(results[1], results[0]) <= 1e-5
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert relative_error(q.grad, p.grad) <= 1e-5 and q.grad.stride() == p.grad.stride(), name
