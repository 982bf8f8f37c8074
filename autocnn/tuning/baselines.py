"""What autocnn's kernels are compared with: cuDNN through PyTorch, and the device's own ceilings.

cuDNN runs with ``cudnn.benchmark = True`` (it picks its fastest algorithm per shape) and TF32 off,
so it computes in FP32 like the generated kernels. PyTorch pads symmetrically only; an asymmetric
padding (the 2009 network's 4/4/3/3) is applied to the input beforehand, outside the timed region,
which favours cuDNN slightly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def torch_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _torch():
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def cudnn_runner(op: str, problem: Any) -> Callable[[], None] | None:
    """A closure that enqueues PyTorch's version of the operation, or None where it has none."""
    torch = _torch()
    F = torch.nn.functional
    dev = "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(1234)

    def randn(*shape):
        return torch.randn(*shape, device=dev, dtype=torch.float32, generator=g)

    if op in ("conv_fwd", "conv_bwd_data", "conv_wgrad"):
        p = problem
        pt, pl, pb, pr = p.padding
        symmetric = pt == pb and pl == pr
        x = randn(*p.x_shape)
        if not symmetric:
            x = F.pad(x, (pl, pr, pt, pb))
        pad = [pt, pl] if symmetric else [0, 0]
        w = randn(*p.w_shape)
        stride = list(p.stride)
        if op == "conv_fwd":
            bias = randn(p.K) if getattr(p, "bias", False) else None
            act = {"none": None, "relu": torch.relu, "tanh": torch.tanh, "logistic": torch.sigmoid}[p.activation]

            def run():
                y = F.conv2d(x, w, bias, stride, pad)
                if act is not None:
                    act(y)
            return run
        dy = randn(*p.y_shape)
        mask = [True, False, False] if op == "conv_bwd_data" else [False, True, bool(getattr(p, "bias", False))]
        bias_sizes = [p.K] if mask[2] else None

        def run():
            torch.ops.aten.convolution_backward(dy, x, w, bias_sizes, stride, pad, [1, 1], False, [0, 0], 1, mask)
        return run

    if op in ("avgpool_fwd", "avgpool_bwd"):
        p = problem
        pt, pl, pb, pr = p.padding
        if pt != pb or pl != pr or pt * 2 > p.window[0] or pl * 2 > p.window[1]:
            return None   # PyTorch pools pad symmetrically, by at most half the window
        x = randn(*p.x_shape)
        kernel, stride, pad = list(p.window), list(p.stride), [pt, pl]
        if op == "avgpool_fwd":
            def run():
                F.avg_pool2d(x, kernel, stride, pad, False, p.count_pad)
            return run
        dy = randn(*p.y_shape)

        def run():
            torch.ops.aten.avg_pool2d_backward(dy, x, kernel, stride, pad, False, p.count_pad, None)
        return run
    raise ValueError(f"no PyTorch baseline for {op}")


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float          # device-to-device copy, bytes read plus bytes written
    sgemm_tflops: float       # FP32 matrix product (TF32 off)

    def to_dict(self) -> dict[str, float]:
        return {"copy_gbps": self.copy_gbps, "sgemm_tflops": self.sgemm_tflops}


def measure_ceilings(flusher: Any = None) -> Ceilings:
    """The two numbers every kernel is placed against, measured on this device now."""
    from autocnn.gpu import require_cupy
    from autocnn.tuning.measure import time_callable

    cp = require_cupy()
    n = 256 * 1024 * 1024   # 1 GiB of float32
    src = cp.ones(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    copy = time_callable(lambda: dst.__setitem__(Ellipsis, src), flusher=None, budget_s=0.3)
    copy_gbps = 2 * 4 * n / (copy.median_us * 1e-6) / 1e9
    del src, dst
    torch = _torch()
    m = 8192
    a = torch.randn(m, m, device="cuda")
    b = torch.randn(m, m, device="cuda")
    gemm = time_callable(lambda: torch.mm(a, b), flusher=None, budget_s=0.5, min_reps=5)
    return Ceilings(copy_gbps, 2 * m**3 / (gemm.median_us * 1e-6) / 1e12)
