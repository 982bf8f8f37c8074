"""What the autocnn.torch tests that check kernels against PyTorch share: PyTorch's float32
arithmetic without TF32 on a CUDA build (the GPU tests' references), and PyTorch's float64
convolution with its three gradients."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import torch.nn.functional as F  # noqa: E402

from autocnn.kernels import reference  # noqa: E402
from autocnn.measurement.measure import verify_outputs  # noqa: E402
from autocnn.torch.dtypes import ELEMENTS  # noqa: E402
from autocnn.torch.launch import as_cupy  # noqa: E402

DTYPE_OF_ELEMENT = {element: dtype for dtype, element in ELEMENTS.items()}


@pytest.fixture(autouse=True)
def cuda_without_tf32():
    """A CUDA build of PyTorch, and its float32 convolutions and matmuls without TF32 (the float32
    comparisons). Autouse: a test module that imports it runs every test under it."""
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA (a CPU build?): install a CUDA build of PyTorch for these tests")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def conv64(x, w, b, stride, padding, dilation, groups, dy) -> dict:
    """PyTorch's float64 convolution of these values and its three gradients for dy (db where there
    is a bias), by the names of autocnn's buffers."""
    x, w = x.double().requires_grad_(), w.double().requires_grad_()
    b = None if b is None else b.double().requires_grad_()
    y = F.conv2d(x, w, b, stride, padding, dilation, groups)
    grads = torch.autograd.grad(y, [x, w] + ([b] if b is not None else []), dy.double())
    return {"y": y.detach(), "dx": grads[0], "dw": grads[1], **({"db": grads[2]} if b is not None else {})}


def check_output(problem, name: str, got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> float:
    """One output of ``problem`` against its float64 reference: autocnn's verification (every element
    finite, the relative error within the precision's error_bound for the output's reduction length)
    and each element within its own rounding: |got - ref| <= output_rounding * |ref| + (n * 2^-23 +
    2^-20) * (its sum of |terms|). ``got`` is read back as the problem's element type (a float32
    parameter's gradient holds the 16-bit values exactly). Returns the relative error."""
    import cupy as cp

    stored = got.detach().to(DTYPE_OF_ELEMENT[problem.precision.y]).contiguous()
    result = verify_outputs(problem, {"ref": cp.asarray(ref)}, {name: as_cupy(cp, stored)},
                            ref={name: cp.asarray(ref)})
    assert result.passed, f"{problem.op} {problem.shape_string()} {name}: {result.message}"
    n = reference.reduction_length(problem, name)
    tol = problem.precision.output_rounding * ref.abs() + (n * 2.0 ** -23 + 2.0 ** -20) * scale + 1e-30
    worst = float(((got.double() - ref).abs() / tol).max())
    assert worst <= 1.0, f"{problem.op} {problem.shape_string()} {name}: an element is {worst:.3g} x its bound"
    return result.errors[name]


def relative_error(a, b) -> float:
    """|a - b| / |b| in float64 (the norm of the whole tensor)."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))
