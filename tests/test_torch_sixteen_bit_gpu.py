"""autocnn.torch in 16 bits and on depthwise layers, on a GPU (pytest -m gpu): converted convolutions and
average pools under torch.autocast(bfloat16 / float16) against float64 references of the 16-bit
values the kernels read (and PyTorch's results under the same autocast), forward and backward
(input, weight and bias gradients, reaching the float32 parameters); depthwise 3x3 and 7x7 layers,
stride 1 and 2, dilation 1 and 2, in float32 and bfloat16; and a converted model's training step
under autocast(bfloat16) captured in a CUDA graph, replayed against the same steps run eagerly.
Shapes divide nothing evenly. The CPU half is test_torch_sixteen_bit.py.
"""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import autocnn.torch as at  # noqa: E402
from autocnn.kernels import reference  # noqa: E402
from autocnn.torch.geometry import conv_problem, pool_problem  # noqa: E402
from tests.bench_module import load_bench  # noqa: E402
from tests.torch_references import check_output, conv64, cuda_without_tf32, relative_error  # noqa: E402,F401  (autouse)

pytestmark = pytest.mark.gpu

AUTOCAST = [torch.bfloat16, torch.float16]
PRECISION = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}   # the problems' names


def _problems(x_shape, conv: nn.Conv2d, precision: str) -> dict:
    """The layer's three problems at ``precision``, by the outputs they write."""
    stride, dilation = tuple(conv.stride), tuple(conv.dilation)
    padding = (conv.padding[0], conv.padding[1]) * 2
    args = (tuple(x_shape), tuple(conv.weight.shape), stride, padding, precision)
    bias = conv.bias is not None
    fwd = conv_problem("conv_fwd", *args, bias, dilation, conv.groups)
    bwd = conv_problem("conv_bwd_data", *args, False, dilation, conv.groups)
    wgrad = conv_problem("conv_wgrad", *args, bias, dilation, conv.groups)
    return {"y": fwd, "dx": bwd, "dw": wgrad, "db": wgrad}


def _run_conv(conv: nn.Conv2d, x: torch.Tensor, dy_of, cast: torch.dtype | None):
    """Forward and backward of ``conv`` on a fresh leaf copy of ``x`` (under autocast at ``cast``):
    the output, the gradients by name, and the output's gradient used."""
    x = x.detach().clone().requires_grad_()
    conv.zero_grad(set_to_none=True)
    if cast is None:
        y = conv(x)
    else:
        with torch.autocast("cuda", dtype=cast):
            y = conv(x)
    dy = dy_of(y)
    y.backward(dy)
    grads = {"dx": x.grad, "dw": conv.weight.grad, **({"db": conv.bias.grad} if conv.bias is not None else {})}
    return y.detach(), grads, dy


AUTOCAST_CONVS = [  # in, out, kernel, stride, padding, bias; inputs of batch 3 and odd sizes
    (5, 7, 3, 2, 1, True),
    (5, 7, (5, 3), (2, 1), (2, 1), False),
    (5, 7, 1, 1, 0, True),
]


@pytest.mark.parametrize("cast", AUTOCAST, ids=["bf16", "fp16"])
@pytest.mark.parametrize("c_in,c_out,kernel,stride,padding,bias", AUTOCAST_CONVS)
def test_a_converted_conv_under_autocast_is_pytorchs_conv_in_16_bits(c_in, c_out, kernel, stride, padding, bias,
                                                                    cast):
    plain = nn.Conv2d(c_in, c_out, kernel, stride, padding, bias=bias).cuda()
    ours = copy.deepcopy(plain)
    assert at.convert(nn.Sequential(ours), verbose=False).replaced
    x = torch.randn(3, c_in, 13, 11, device="cuda")
    before = at.launch_counts()
    dy16 = {}

    def dy_of(y):
        dy16.setdefault("dy", torch.randn(y.shape, device="cuda").to(y.dtype))
        return dy16["dy"]

    y, grads, dy = _run_conv(ours, x, dy_of, cast)
    after = at.launch_counts()
    assert all(after.get(op, 0) > before.get(op, 0) for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad"))
    theirs_y, theirs, _ = _run_conv(plain, x, dy_of, cast)
    assert y.dtype == theirs_y.dtype == cast and y.shape == theirs_y.shape
    assert all(grads[k].dtype == theirs[k].dtype == torch.float32 for k in grads)   # through the casts
    # The reference: float64 of the 16-bit values autocast handed the kernels.
    x16, w16 = x.to(cast), ours.weight.detach().to(cast)
    b16 = None if ours.bias is None else ours.bias.detach().to(cast)
    geometry = (tuple(ours.stride), tuple(ours.padding), tuple(ours.dilation), ours.groups)
    refs = conv64(x16, w16, b16, *geometry, dy)
    scales = conv64(x16.abs(), w16.abs(), None if b16 is None else b16.abs(), *geometry, dy.abs())
    problems = _problems(x.shape, ours, PRECISION[cast])
    outputs = {"y": y, **grads}
    for name, ref in refs.items():
        ours_err = check_output(problems[name], name, outputs[name], ref, scales[name])
        theirs_out = theirs_y if name == "y" else theirs[name]
        bound = problems[name].precision.error_bound(reference.reduction_length(problems[name], name))
        # PyTorch's result is of the same function (the reference's semantics are PyTorch's).
        assert relative_error(theirs_out, ref) <= 4 * bound, f"{name}: PyTorch's {relative_error(theirs_out, ref):.3g}, ours {ours_err:.3g}"


@pytest.mark.parametrize("cast", AUTOCAST, ids=["bf16", "fp16"])
@pytest.mark.parametrize("input_dtype", [torch.float32, "autocast"], ids=["float32_input", "16_bit_input"])
@pytest.mark.parametrize("window,stride,padding,count_pad", [(3, 2, 1, False), ((3, 2), (1, 2), (1, 0), True)])
def test_a_converted_pool_under_autocast_runs_in_its_inputs_dtype(window, stride, padding, count_pad, input_dtype,
                                                                 cast):
    dtype = cast if input_dtype == "autocast" else input_dtype
    pool = at.AvgPool2d(window, stride, padding, count_include_pad=count_pad)
    x = torch.randn(3, 5, 13, 11, device="cuda").to(dtype).requires_grad_()
    before = at.launch_counts().get("avgpool_bwd", 0)
    with torch.autocast("cuda", dtype=cast):
        y = pool(x)
        expected = F.avg_pool2d(x, window, stride, padding, count_include_pad=count_pad)
    assert y.dtype == expected.dtype == dtype
    dy = torch.randn(y.shape, device="cuda").to(dtype)
    y.backward(dy)
    assert at.launch_counts().get("avgpool_bwd", 0) > before and x.grad.dtype == dtype

    def ref(xs, dys):
        x64 = xs.detach().double().requires_grad_()
        y64 = F.avg_pool2d(x64, window, stride, padding, count_include_pad=count_pad)
        return {"y": y64.detach(), "dx": torch.autograd.grad(y64, x64, dys.double())[0]}

    refs, scales = ref(x, dy), ref(x.abs(), dy.abs())
    pad4 = (padding, padding) * 2 if isinstance(padding, int) else padding * 2
    pair = (lambda v: (v, v) if isinstance(v, int) else tuple(v))
    fwd = pool_problem("avgpool_fwd", tuple(x.shape), pair(window), pair(stride), pad4, count_pad, PRECISION[dtype])
    check_output(fwd, "y", y, refs["y"], scales["y"])
    check_output(fwd.with_op("avgpool_bwd"), "dx", x.grad, refs["dx"], scales["dx"])
    assert relative_error(expected, refs["y"]) <= 4 * fwd.precision.error_bound(reference.reduction_length(fwd, "y"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", [3, 7])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dilation", [1, 2])
def test_depthwise_layers_match_pytorch(kernel, stride, dilation, dtype):
    """A depthwise layer (6 channels, two filters each for the 3x3) converted from torch.nn, forward and
    all three gradients in the layer's own dtype, against float64 and PyTorch's."""
    torch.manual_seed(kernel * 10 + stride * 3 + dilation)
    multiplier = 2 if kernel == 3 else 1
    pad = dilation * (kernel // 2)
    plain = nn.Conv2d(6, 6 * multiplier, kernel, stride, pad, dilation, groups=6).cuda().to(dtype)
    ours = copy.deepcopy(plain)
    report = at.convert(nn.Sequential(ours), verbose=False)
    assert report.replaced and report.replaced[0].precision == PRECISION[dtype], str(report)
    x = torch.randn(3, 6, 15, 13, device="cuda").to(dtype)
    dys = {}

    def dy_of(y):
        dys.setdefault("dy", torch.randn(y.shape, device="cuda").to(y.dtype))
        return dys["dy"]

    before = at.launch_counts()
    y, grads, dy = _run_conv(ours, x, dy_of, None)
    after = at.launch_counts()
    assert all(after.get(op, 0) > before.get(op, 0) for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad"))
    theirs_y, theirs, _ = _run_conv(plain, x, dy_of, None)
    assert y.dtype == theirs_y.dtype == dtype and y.shape == theirs_y.shape
    geometry = (tuple(ours.stride), tuple(ours.padding), tuple(ours.dilation), ours.groups)
    refs = conv64(x, ours.weight.detach(), ours.bias.detach(), *geometry, dy)
    scales = conv64(x.abs(), ours.weight.detach().abs(), ours.bias.detach().abs(), *geometry, dy.abs())
    problems = _problems(x.shape, ours, PRECISION[dtype])
    outputs = {"y": y, **grads}
    for name, ref in refs.items():
        check_output(problems[name], name, outputs[name], ref, scales[name])
        theirs_out = theirs_y if name == "y" else theirs[name]
        bound = problems[name].precision.error_bound(reference.reduction_length(problems[name], name))
        assert relative_error(theirs_out, ref) <= 4 * bound, f"{name}: PyTorch's {relative_error(theirs_out, ref):.3g}"


def _mobile() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 12, 3, 2, 1), nn.ReLU(),
                         nn.Conv2d(12, 12, 3, 1, 1, groups=12), nn.ReLU(),
                         nn.Conv2d(12, 12, 5, 2, 4, dilation=2, groups=12, bias=False), nn.ReLU(),
                         nn.Conv2d(12, 16, 1), nn.ReLU(), nn.AvgPool2d(3, 2, 1, count_include_pad=False),
                         nn.Flatten(), nn.Linear(16 * 3 * 3, 10))


def test_a_training_step_under_autocast_bf16_captured_in_a_cuda_graph_matches_eager_steps():
    """A converted MobileNet-like model's whole step (autocast(bfloat16) forward and loss, backward,
    capturable Adam on float32 parameters) as one CUDA graph, replayed on new batches, against the
    same steps run eagerly on a twin; autocnn's bf16 kernels run in both."""
    bench = load_bench()
    torch.manual_seed(7)
    model = _mobile().cuda()
    report = at.convert(model, verbose=False)
    assert len(report.replaced) == 5 and not report.left, str(report)
    twin = copy.deepcopy(model)
    g = torch.Generator(device="cuda").manual_seed(8)
    data = [(torch.randn(5, 3, 23, 21, device="cuda", generator=g),
             torch.randint(0, 10, (5,), device="cuda", generator=g)) for _ in range(4)]
    x, y = (t.clone() for t in data[0])

    def step_of(net):
        opt = torch.optim.Adam(net.parameters(), lr=1e-3, capturable=True)

        def step(zero: bool = True):
            if zero:
                opt.zero_grad(set_to_none=True)
            # No autocast cast cache inside a graph capture (PyTorch's advice for autocast in graphs).
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        return step, opt

    graph = bench.capture_step(*step_of(model))   # three warm-up steps on the first batch, then the capture
    twin_step, _ = step_of(twin)
    before = at.launch_counts()
    for _ in range(3):
        twin_step()
    after = at.launch_counts()
    assert all(after.get(op, 0) > before.get(op, 0) for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad",
                                                                "avgpool_fwd", "avgpool_bwd"))
    assert "precision=bf16" in at.dispatch_report()
    for xb, yb in data[1:]:
        x.copy_(xb)
        y.copy_(yb)
        graph.replay()
        twin_step()
    torch.cuda.synchronize()
    for (name, p), q in zip(twin.named_parameters(), model.parameters()):
        assert q.dtype == torch.float32
        assert relative_error(q, p) <= 1e-3, name


def test_compile_fullgraph_under_autocast_runs_autocnns_16_bit_kernels():
    """torch.compile(fullgraph=True) of a converted model called under autocast(bfloat16): one graph
    whose autocnn operators compute in bf16, as the same model does eagerly (the same kernels: each
    output within a bf16 rounding of the eager one, gradients of the float32 parameters likewise)."""
    torch._dynamo.reset()
    torch.manual_seed(9)
    model = _mobile().cuda()
    at.convert(model, verbose=False)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(5, 3, 23, 21, device="cuda")
    results = []
    for net in (eager, compiled):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = net(x)
        out.float().square().mean().backward()
        results.append(out)
    before = at.launch_counts()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        again = compiled(x)
    assert sum(at.launch_counts().values()) > sum(before.values())   # the compiled graph ran autocnn's operators
    assert results[1].dtype == again.dtype == torch.bfloat16
    assert relative_error(results[1], results[0]) <= 2.0 ** -7
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert q.grad.dtype == torch.float32 and relative_error(q.grad, p.grad) <= 2.0 ** -6, name
