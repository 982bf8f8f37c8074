"""What the autocnn.torch tests that check kernels against PyTorch share: PyTorch's float32
arithmetic without TF32 on a CUDA build (the GPU tests' references), and PyTorch's float64
convolution with its three gradients."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import torch.nn.functional as F  # noqa: E402


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
