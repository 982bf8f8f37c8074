"""What autocnn's kernels are compared with: cuDNN through PyTorch, and the device's own ceilings.

cuDNN runs with ``cudnn.benchmark = True`` (it picks its fastest algorithm per shape) at the
problem's precision: for fp32 with TF32 off (``torch.backends.cudnn.allow_tf32`` and
``torch.backends.cuda.matmul.allow_tf32`` False), so it computes in FP32 like the generated
kernels; for tf32 with both on, PyTorch's own default for convolutions. PyTorch pads symmetrically
only; an asymmetric padding (the 2009 network's 4/4/3/3) is applied to the input beforehand,
outside the timed region, which favours cuDNN slightly.

The ceilings: the copy bandwidth, and two large square matrix products, one in FP32 (SGEMM) and
one with TF32 tensor cores, each timed under the same protocol as the kernels.

Everything here needs a GPU and PyTorch; what is made of the numbers (tables, rates, shares) is
in ``autocnn.tuning.bench_table``, which needs neither.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator


def torch_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _torch(precision: str = "fp32"):
    """torch, with cuDNN's benchmark mode on and TF32 allowed exactly for the "tf32" precision."""
    if precision not in ("fp32", "tf32"):
        raise ValueError(f"precision {precision!r}: fp32 or tf32")
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    return torch


def problem_precision(problem: Any) -> str:
    """A problem's precision; "fp32" for pooling, which has none (it computes in FP32)."""
    return getattr(problem, "precision", "fp32")


@contextlib.contextmanager
def torch_precision(precision: str) -> Iterator[Any]:
    """PyTorch's convolutions and matrix products in FP32 ("fp32") or on TF32 tensor cores ("tf32")
    inside the block; the flags as they were after it. Yields the torch module."""
    import torch

    flags = (torch.backends.cudnn, torch.backends.cuda.matmul)
    saved = [f.allow_tf32 for f in flags]
    try:
        yield _torch(precision)
    finally:
        for f, value in zip(flags, saved):
            f.allow_tf32 = value


def time_cudnn(op: str, problem: Any, *, flusher: Any = None, budget_s: float = 0.2) -> float | None:
    """Median microseconds of PyTorch's version of the operation at the problem's precision (the
    timing protocol of ``time_callable``), or None where PyTorch has none."""
    from autocnn.tuning.measure import time_callable

    with torch_precision(problem_precision(problem)):
        runner = cudnn_runner(op, problem)
        if runner is None:
            return None
        return time_callable(runner, flusher=flusher, budget_s=budget_s).median_us


def cudnn_draw(device: int, l2_bytes: int, jobs: list[tuple[str, dict[str, Any]]], budget_s: float) -> list[float | None]:
    """``time_cudnn`` of each (op, problem as ``to_dict``) in the calling process, on one device.

    Run in a fresh process (``autocnn bench --cudnn-processes``): benchmark mode chooses cuDNN's
    algorithm for a shape once per process, from one noisy timing of each candidate, and on small
    layers it does not always choose the same one, so one process's time is one draw of that choice."""
    from autocnn.gpu import require_cupy
    from autocnn.kernels.problem import problem_from_dict
    from autocnn.tuning.measure import L2Flusher

    require_cupy().cuda.Device(device).use()
    import torch

    torch.cuda.set_device(device)
    flusher = L2Flusher(l2_bytes)
    return [time_cudnn(op, problem_from_dict(problem), flusher=flusher, budget_s=budget_s) for op, problem in jobs]


def cudnn_runner(op: str, problem: Any) -> Callable[[], None] | None:
    """A closure that enqueues PyTorch's version of the operation, or None where it has none.

    It sets PyTorch's TF32 flags for the problem's precision, which the closure needs when it runs:
    time it before anything changes them (``time_cudnn`` does, and puts them back after)."""
    torch = _torch(problem_precision(problem))
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
    tf32_tflops: float        # the same matrix product on TF32 tensor cores

    def to_dict(self) -> dict[str, float]:
        return {"copy_gbps": self.copy_gbps, "sgemm_tflops": self.sgemm_tflops, "tf32_tflops": self.tf32_tflops}


# The matrix products' size: large enough to be bound by arithmetic on every GPU the project targets.
GEMM_SIZE = 8192


def measure_ceilings(flusher: Any = None, budget_s: float = 0.5) -> Ceilings:
    """The numbers every kernel is placed against, measured on this device now, each timed like the
    kernels (``time_callable``, with the L2 flusher given)."""
    from autocnn.gpu import require_cupy
    from autocnn.tuning.bench_table import gemm_tflops
    from autocnn.tuning.measure import time_callable

    cp = require_cupy()
    n = 256 * 1024 * 1024   # 1 GiB of float32: far larger than any L2, so no flush is needed
    src = cp.ones(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    copy = time_callable(lambda: dst.__setitem__(Ellipsis, src), flusher=None, budget_s=0.3)
    copy_gbps = 2 * 4 * n / (copy.median_us * 1e-6) / 1e9
    del src, dst
    rates = {}
    for precision in ("fp32", "tf32"):
        with torch_precision(precision) as torch:
            a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda")
            b = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda")
            timing = time_callable(lambda: torch.matmul(a, b), flusher=flusher, budget_s=budget_s, min_reps=5)
            rates[precision] = gemm_tflops(GEMM_SIZE, timing.median_us)
            del a, b
    return Ceilings(copy_gbps, rates["fp32"], rates["tf32"])
