"""autocnn.torch's operators run end to end on the CPU, their generated kernels in the CPU emulator
(tests/cuda_emulator.py) in place of a GPU: the real implementations (problems built from the
tensors' dtypes, groups and dilation, buffers handed over by name in their storage types) and the
autograd that chains them, in bfloat16 and float16, on a depthwise dilated strided layer and a dense
one of odd sizes, each output checked against float64 of the 16-bit values, every element. Where
g++ is absent, skipped with the reason.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import torch.nn.functional as F  # noqa: E402

import autocnn.torch  # noqa: E402,F401  (registers torch.ops.autocnn.*)
from autocnn.device import DeviceLimits  # noqa: E402
from autocnn.kernels import get_operation, reference  # noqa: E402
from autocnn.measurement.measure import verify_outputs  # noqa: E402
from autocnn.torch import ops  # noqa: E402
from tests.cuda_emulator import run_emulated  # noqa: E402
from tests.torch_references import conv64  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
LIMITS = DeviceLimits.for_arch("sm_90")


def _storage(t: torch.Tensor) -> np.ndarray:
    """The NumPy array of a CPU tensor's elements as the kernels' buffers hold them (bfloat16 as its
    uint16 bit patterns, measurement.element_arrays' convention), sharing its memory."""
    t = t.detach().contiguous()
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


class EmulatedKernels:
    """Stands in for a device's kernels (autocnn.torch.launch.DeviceKernels): each problem's default
    config planned and its kernels run by the emulator on the tensors' memory; what it ran is kept."""

    def __init__(self, cache):
        self.cache = cache
        self.ran: list = []

    def run(self, problem, **tensors):
        operation = get_operation(problem.op)
        plan = operation.plan(problem, operation.default_config(problem, LIMITS))
        outputs = reference.output_shapes(problem)
        inputs = {name: _storage(t) for name, t in tensors.items() if t is not None and name not in outputs}
        given = {name: t for name, t in tensors.items() if t is not None and name in outputs}
        for t in given.values():
            t.fill_(float("nan"))   # an output the kernels do not write stays NaN and fails
        for name, result in run_emulated(plan, inputs, self.cache).items():
            if name in given:
                _storage(given[name])[...] = result   # the operator's own output tensor, in place
        self.ran.append(problem)


@pytest.fixture
def emulated(monkeypatch, tmp_path):
    """The operators' real implementations on CPU tensors, their kernels emulated."""
    kernels = EmulatedKernels(tmp_path)
    monkeypatch.setattr(ops, "kernels_for", lambda device: kernels)
    monkeypatch.setattr(ops, "_check", lambda *args: None)   # CPU tensors stand in for CUDA ones
    return kernels


def _check(problem, name: str, got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> None:
    """autocnn's verification of one output (finite, within the precision's bound for its reduction
    length) and each element within its own rounding: output_rounding * |ref| + (n * 2^-23 + 2^-20) *
    its sum of |terms|."""
    got = got.detach()
    result = verify_outputs(problem, {"ref": ref.numpy()}, {name: _storage(got)}, ref={name: ref.numpy()})
    assert result.passed, f"{problem.op} {problem.shape_string()} {name}: {result.message}"
    n = reference.reduction_length(problem, name)
    tol = problem.precision.output_rounding * ref.abs() + (n * 2.0 ** -23 + 2.0 ** -20) * scale + 1e-30
    worst = float(((got.double() - ref).abs() / tol).max())
    assert worst <= 1.0, f"{problem.op} {problem.shape_string()} {name}: an element is {worst:.3g} x its bound"


@pytest.mark.parametrize("dtype,x_shape,w_shape,stride,padding,dilation,groups", [
    (torch.bfloat16, (3, 6, 15, 13), (12, 1, 3, 3), 2, 2, 2, 6),   # depthwise, two filters a channel
    (torch.float16, (3, 5, 9, 7), (7, 5, 3, 3), 2, 1, 1, 1),
], ids=["bf16_depthwise_dilated", "fp16_dense"])
def test_the_operators_and_their_autograd_compute_the_layer(emulated, dtype, x_shape, w_shape, stride, padding,
                                                            dilation, groups):
    g = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    x = torch.randn(x_shape, generator=g).to(dtype).requires_grad_()
    w = torch.randn(w_shape, generator=g).to(dtype).requires_grad_()
    b = torch.randn(w_shape[0], generator=g).to(dtype).requires_grad_()
    args = ([stride] * 2, [padding] * 4, [dilation] * 2, groups, "fp32")
    y = torch.ops.autocnn.conv2d(x, w, b, *args)
    assert y.dtype == dtype
    dy = torch.randn(y.shape, generator=g).to(dtype)
    y.backward(dy)
    assert [p.op for p in emulated.ran] == ["conv_fwd", "conv_bwd_data", "conv_wgrad"]
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    assert all(p.precision.name == name and p.groups == groups for p in emulated.ran)
    geometry = (stride, padding, dilation, groups)
    refs = conv64(x.detach(), w.detach(), b.detach(), *geometry, dy)
    scales = conv64(x.detach().abs(), w.detach().abs(), b.detach().abs(), *geometry, dy.abs())
    problems = {"y": emulated.ran[0], "dx": emulated.ran[1], "dw": emulated.ran[2], "db": emulated.ran[2]}
    for out, got in (("y", y), ("dx", x.grad), ("dw", w.grad), ("db", b.grad)):
        assert got.dtype == dtype
        _check(problems[out], out, got, refs[out], scales[out])


def test_average_pooling_and_its_gradient_in_bfloat16(emulated):
    x = torch.randn(3, 5, 13, 11).to(torch.bfloat16).requires_grad_()
    y = torch.ops.autocnn.avg_pool2d(x, [3, 2], [2, 1], [1, 0, 1, 0], False)
    dy = torch.randn(y.shape).to(torch.bfloat16)
    y.backward(dy)
    assert [p.op for p in emulated.ran] == ["avgpool_fwd", "avgpool_bwd"]
    assert all(p.precision.name == "bf16" for p in emulated.ran) and x.grad.dtype == torch.bfloat16

    def ref(xs, dys):
        x64 = xs.detach().double().requires_grad_()
        y64 = F.avg_pool2d(x64, (3, 2), (2, 1), (1, 0), count_include_pad=False)
        return {"y": y64.detach(), "dx": torch.autograd.grad(y64, x64, dys.double())[0]}

    refs, scales = ref(x, dy), ref(x.abs(), dy.abs())
    _check(emulated.ran[0], "y", y, refs["y"], scales["y"])
    _check(emulated.ran[1], "dx", x.grad, refs["dx"], scales["dx"])


@pytest.fixture
def cpu_as_cuda(monkeypatch):
    """The layers take CPU tensors as they take CUDA ones (what they ask of the device answered as for
    meta tensors, which count as CUDA), so a converted layer reaches the emulated operators."""
    from autocnn.torch import dtypes, modules, support

    def as_meta(t):
        return None if t is None else torch.empty_like(t, device="meta")

    monkeypatch.setattr(modules, "runs_on_autocnn",
                        lambda x, *params: support.runs_on_autocnn(as_meta(x), *map(as_meta, params)))
    monkeypatch.setattr(modules, "autocast_dtype", lambda x: dtypes.autocast_dtype(as_meta(x)))


@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_converted_conv_under_autocast_computes_in_its_dtype_and_its_gradients_reach_the_parameters(
        emulated, cpu_as_cuda, cast):
    """A converted depthwise, dilated, strided layer called on float32 tensors under CUDA's autocast
    state: its output in the autocast dtype, each element against float64 of the cast values, and the
    float32 parameters' and input's gradients the 16-bit ones the kernels wrote; a pool after it runs
    in that dtype too."""
    from torch import nn

    from autocnn.torch import convert
    from tests.test_torch_sixteen_bit import cuda_autocast

    model = nn.Sequential(nn.Conv2d(6, 6, 5, stride=2, padding=4, dilation=2, groups=6), nn.AvgPool2d(2))
    assert len(convert(model, verbose=False).replaced) == 2
    conv = model[0]
    x = torch.randn(3, 6, 15, 13, requires_grad=True)
    with cuda_autocast(cast):
        y = conv(x)
        pooled = model[1](y)
    assert y.dtype == pooled.dtype == cast
    dy = torch.randn(y.shape).to(cast)
    torch.autograd.backward([y, pooled], [dy, torch.zeros_like(pooled)])
    assert [p.op for p in emulated.ran] == ["conv_fwd", "avgpool_fwd", "avgpool_bwd", "conv_bwd_data", "conv_wgrad"]
    assert x.grad.dtype == conv.weight.grad.dtype == conv.bias.grad.dtype == torch.float32
    x16, w16, b16 = x.detach().to(cast), conv.weight.detach().to(cast), conv.bias.detach().to(cast)
    geometry = (2, 4, 2, 6)
    refs = conv64(x16, w16, b16, *geometry, dy)
    scales = conv64(x16.abs(), w16.abs(), b16.abs(), *geometry, dy.abs())
    fwd, _, _, bwd, wgrad = emulated.ran
    for problem, out, got in ((fwd, "y", y), (bwd, "dx", x.grad), (wgrad, "dw", conv.weight.grad),
                              (wgrad, "db", conv.bias.grad)):
        # A float32 gradient holds the 16-bit values the kernels wrote: read back in their type exactly.
        assert torch.equal(got.to(cast).to(got.dtype), got)
        _check(problem, out, got.to(cast), refs[out], scales[out])
