"""What autocnn's kernels are compared with: cuDNN through PyTorch, and the device's own ceilings.

cuDNN runs with ``cudnn.benchmark = True`` (it picks its fastest algorithm per shape) at the
problem's precision: for fp32 with TF32 off (``torch.backends.cudnn.allow_tf32`` and
``torch.backends.cuda.matmul.allow_tf32`` False), so it computes in FP32 like the generated
kernels; for tf32 with both on, PyTorch's own default for convolutions; for bf16 and fp16 on tensors
of that type (cuDNN accumulates them in FP32, as the generated kernels do). PyTorch pads symmetrically
only; an asymmetric padding (the 2009 network's 4/4/3/3) is applied to the input beforehand,
outside the timed region, which favours cuDNN slightly.

Operations PyTorch has no single operator for are timed as the operators they replace, in the
order a PyTorch model runs them (``BASELINE_NOTES`` names each such sequence, and the tables show it
as a footnote): conv_pool_fwd as conv2d, the activation and avg_pool2d; conv_pool_dz as
avg_pool2d's backward and the activation's backward; conv_bwd_fused as one convolution_backward
for dx, dw and db. An operation or problem PyTorch cannot express (a separable convolution, a pool
padded by more than half its window) has no baseline: ``no_baseline_reason`` says why, without
PyTorch, and its cell stays empty with that reason. A baseline that fails when it runs (PyTorch
missing, an operator error, out of memory) is a reason too, never an error of the run.

The ceilings: the copy bandwidth, and large square matrix products, one in FP32 (SGEMM), one with
TF32 tensor cores and, for a run of 16-bit precisions, one of bfloat16 or float16 matrices each,
timed under the same protocol as the kernels.

Everything here needs a GPU and PyTorch; what is made of the numbers (tables, rates, shares) is
in ``autocnn.benchmark.table``, which needs neither.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

from autocnn.layout import layout_of
from autocnn.precision import BF16, DEFAULT_PRECISION, FP16, FP32, TF32, Precision, precision_named, precision_of


def torch_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _torch(precision: Precision | str = DEFAULT_PRECISION):
    """torch, with cuDNN's benchmark mode on and TF32 allowed exactly for a precision of TF32
    products (a Precision or its name)."""
    precision = precision_named(precision)
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = precision.tf32
    torch.backends.cuda.matmul.allow_tf32 = precision.tf32
    return torch


def problem_precision(problem: Any) -> Precision:
    """A problem's precision (pooling's is the storage of its tensors)."""
    return precision_of(problem)


def torch_dtype(torch: Any, precision: Precision) -> Any:
    """PyTorch's dtype for a precision's tensors: float32, bfloat16 or float16."""
    return getattr(torch, precision.x.name)


@contextlib.contextmanager
def torch_precision(precision: Precision | str) -> Iterator[Any]:
    """PyTorch's convolutions and matrix products in FP32 (fp32; bf16 and fp16 tensors too) or on TF32
    tensor cores (tf32) inside the block; the flags as they were after it. Yields the torch module."""
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
    timing protocol of ``time_callable``), or None where PyTorch has none. PyTorch's errors pass
    through: ``time_baseline`` is the form that turns them into a reason."""
    from autocnn.measurement.measure import time_callable

    if no_baseline_reason(op, problem) is not None:
        return None
    with torch_precision(problem_precision(problem)):
        runner = cudnn_runner(op, problem)
        return time_callable(runner, flusher=flusher, budget_s=budget_s).median_us


@dataclass(frozen=True)
class BaselineTime:
    """PyTorch's time for one problem, or why there is none (one line, for a table's footnote)."""

    us: float | None
    reason: str | None = None


def time_baseline(op: str, problem: Any, *, flusher: Any = None, budget_s: float = 0.2) -> BaselineTime:
    """``time_cudnn``, with every way it can fail turned into an empty cell and its reason: a
    baseline is a comparison, and no failure of it may end a run or cost the records it sits beside."""
    reason = no_baseline_reason(op, problem)
    if reason is not None:
        return BaselineTime(None, reason)
    try:
        return BaselineTime(time_cudnn(op, problem, flusher=flusher, budget_s=budget_s))
    except Exception as exc:   # ImportError, a CUDA error, torch.OutOfMemoryError, a RuntimeError of an operator
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        return BaselineTime(None, f"PyTorch failed: {type(exc).__name__}" + (f": {first}" if first else ""))


class BaselineProvider(Protocol):
    """Where a command's cuDNN column comes from (``open_baselines``; the tests give their own)."""

    available: bool   # False: every cell will be empty, for the reason each time gives

    def time(self, op: str, problem: Any) -> BaselineTime:
        ...


@dataclass
class CudnnBaselines:
    """cuDNN through PyTorch on the current device, each problem timed by ``time_baseline``."""

    flusher: Any = None
    budget_s: float = 0.2
    available: bool = True

    def time(self, op: str, problem: Any) -> BaselineTime:
        return time_baseline(op, problem, flusher=self.flusher, budget_s=self.budget_s)


@dataclass(frozen=True)
class NoBaselines:
    """No PyTorch with CUDA here: every cell empty, for one reason."""

    reason: str
    available: bool = False

    def time(self, op: str, problem: Any) -> BaselineTime:
        return BaselineTime(None, self.reason)


def open_baselines(budget_s: float = 0.2) -> BaselineProvider:
    """The cuDNN column's provider for the current device, or ``NoBaselines`` saying why there is none."""
    if not torch_available():
        return NoBaselines("no PyTorch with CUDA in this environment")
    from autocnn.device import current_device
    from autocnn.measurement.measure import L2Flusher

    return CudnnBaselines(L2Flusher(current_device().l2_bytes), budget_s)


def cudnn_draw(device: int, l2_bytes: int, jobs: list[tuple[str, dict[str, Any]]], budget_s: float) -> list[float | None]:
    """``time_cudnn`` of each (op, problem as ``to_dict``) in the calling process, on one device.

    Run in a fresh process (``autocnn bench --cudnn-processes``): benchmark mode chooses cuDNN's
    algorithm for a shape once per process, from one noisy timing of each candidate, and on small
    layers it does not always choose the same one, so one process's time is one draw of that choice."""
    from autocnn.gpu import require_cupy
    from autocnn.kernels.problem import problem_from_dict
    from autocnn.measurement.measure import L2Flusher

    require_cupy().cuda.Device(device).use()
    import torch

    torch.cuda.set_device(device)
    flusher = L2Flusher(l2_bytes)
    return [time_baseline(op, problem_from_dict(problem), flusher=flusher, budget_s=budget_s).us
            for op, problem in jobs]


CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
POOL_OPS = ("avgpool_fwd", "avgpool_bwd")

# The operations timed as a sequence of PyTorch operators (the ones they replace), as the tables'
# footnotes name them.
BASELINE_NOTES: dict[str, str] = {
    "conv_pool_fwd": "PyTorch's conv2d, activation and avg_pool2d in sequence",
    "conv_pool_dz": "PyTorch's avg_pool2d backward, then the activation's backward",
    "conv_bwd_fused": "PyTorch's convolution_backward computing dx, dw (and db) in one call",
}


def _pool_reason(window: tuple[int, int], padding: tuple[int, int, int, int]) -> str | None:
    pt, pl, pb, pr = padding
    if pt != pb or pl != pr or pt * 2 > window[0] or pl * 2 > window[1]:
        return (f"PyTorch pools pad symmetrically by at most half the window "
                f"(padding {pt},{pl},{pb},{pr}, window {window[0]}x{window[1]})")
    return None


def no_baseline_reason(op: str, problem: Any) -> str | None:
    """Why PyTorch has no version of ``op`` for this problem (one line), or None where it has one.
    Decided without PyTorch, so a table can say it whether or not PyTorch is installed."""
    if op in CONV_OPS or op == "conv_bwd_fused":
        return None
    if op in POOL_OPS or op == "conv_pool_dz":
        return _pool_reason(problem.window, problem.padding)
    if op == "conv_pool_fwd":
        return _pool_reason(problem.pool_window, problem.pool_padding)
    if op.startswith("sep_conv"):
        return "PyTorch has no operator for a convolution by rank-r separable filters"
    return f"PyTorch has no operator for {op}"


def cudnn_runner(op: str, problem: Any) -> Callable[[], None]:
    """A closure that enqueues PyTorch's version of the operation (``no_baseline_reason`` says
    where there is none; asking for one there is a ValueError).

    It sets PyTorch's TF32 flags for the problem's precision, which the closure needs when it runs:
    time it before anything changes them (``time_cudnn`` does, and puts them back after)."""
    reason = no_baseline_reason(op, problem)
    if reason is not None:
        raise ValueError(f"no PyTorch baseline for {op}: {reason}")
    torch = _torch(problem_precision(problem))
    F = torch.nn.functional
    dev = "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(1234)
    dtype = torch_dtype(torch, problem_precision(problem))

    # The problem's layout: an NHWC problem's tensors are channels_last, as a PyTorch user in that
    # layout holds them (cuDNN then runs its NHWC kernels); their logical shapes stay NCHW's.
    memory_format = torch.channels_last if layout_of(problem).channels_last else torch.contiguous_format

    def randn(*shape):
        t = torch.randn(*shape, device=dev, dtype=torch.float32, generator=g).to(dtype)
        return t.contiguous(memory_format=memory_format) if t.dim() == 4 else t

    activations = {"none": None, "relu": torch.relu, "tanh": torch.tanh, "logistic": torch.sigmoid}
    if op in ("conv_fwd", "conv_pool_fwd"):
        x, pad = _conv_input(F, randn, problem, memory_format)
        w = randn(*problem.w_shape)
        bias = randn(problem.K) if getattr(problem, "bias", False) else None
        act = activations[problem.activation]
        stride = list(problem.stride)
        if op == "conv_fwd":
            def run():
                y = F.conv2d(x, w, bias, stride, pad)
                if act is not None:
                    act(y)
            return run
        kernel, pool_stride = list(problem.pool_window), list(problem.pool_stride)
        pool_pad = list(problem.pool_padding[:2])

        def run():
            a = F.conv2d(x, w, bias, stride, pad)
            if act is not None:
                a = act(a)
            F.avg_pool2d(a, kernel, pool_stride, pool_pad, False, problem.count_pad)
        return run
    if op in ("conv_bwd_data", "conv_wgrad", "conv_bwd_fused"):
        x, pad = _conv_input(F, randn, problem, memory_format)
        w = randn(*problem.w_shape)
        stride = list(problem.stride)
        dy = randn(*problem.y_shape)
        bias = bool(getattr(problem, "bias", False))
        mask = {"conv_bwd_data": [True, False, False], "conv_wgrad": [False, True, bias],
                "conv_bwd_fused": [True, True, bias]}[op]
        bias_sizes = [problem.K] if mask[2] else None

        def run():
            torch.ops.aten.convolution_backward(dy, x, w, bias_sizes, stride, pad, [1, 1], False, [0, 0], 1, mask)
        return run
    # the pools and conv_pool_dz (a pool's backward, then the activation's)
    p = problem
    x = randn(*p.x_shape)
    kernel, stride, pad = list(p.window), list(p.stride), list(p.padding[:2])
    if op == "avgpool_fwd":
        def run():
            F.avg_pool2d(x, kernel, stride, pad, False, p.count_pad)
        return run
    dy = randn(*p.y_shape)
    if op == "avgpool_bwd":
        def run():
            torch.ops.aten.avg_pool2d_backward(dy, x, kernel, stride, pad, False, p.count_pad, None)
        return run
    activation = getattr(p, "activation", "none")
    a = torch.sigmoid(x) if activation == "logistic" else torch.tanh(x) if activation == "tanh" else torch.relu(x)
    grad = {"none": None,
            "relu": lambda g_: torch.ops.aten.threshold_backward(g_, a, 0.0),
            "tanh": lambda g_: torch.ops.aten.tanh_backward(g_, a),
            "logistic": lambda g_: torch.ops.aten.sigmoid_backward(g_, a)}[activation]

    def run():
        g_ = torch.ops.aten.avg_pool2d_backward(dy, x, kernel, stride, pad, False, p.count_pad, None)
        if grad is not None:
            grad(g_)
    return run


def _conv_input(F: Any, randn: Callable[..., Any], problem: Any, memory_format: Any) -> tuple[Any, list[int]]:
    """The convolution's input and the padding to give PyTorch: its own where the padding is
    symmetric, else the input padded beforehand (outside the timed region) and none."""
    pt, pl, pb, pr = problem.padding
    x = randn(*problem.x_shape)
    if pt == pb and pl == pr:
        return x, [pt, pl]
    return F.pad(x, (pl, pr, pt, pb)).contiguous(memory_format=memory_format), [0, 0]


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float          # device-to-device copy, bytes read plus bytes written
    sgemm_tflops: float       # FP32 matrix product (TF32 off)
    tf32_tflops: float        # the same matrix product on TF32 tensor cores
    bf16_tflops: float | None = None   # the same product of bfloat16 matrices (measured where asked)
    fp16_tflops: float | None = None   # the same product of float16 matrices (measured where asked)

    def to_dict(self) -> dict[str, float | None]:
        return {"copy_gbps": self.copy_gbps, "sgemm_tflops": self.sgemm_tflops, "tf32_tflops": self.tf32_tflops,
                "bf16_tflops": self.bf16_tflops, "fp16_tflops": self.fp16_tflops}


# The matrix products' size: large enough to be bound by arithmetic on every GPU the project targets.
GEMM_SIZE = 8192


def measure_ceilings(flusher: Any = None, budget_s: float = 0.5, sixteen_bit: Sequence[Precision | str] = ()) -> Ceilings:
    """The numbers every kernel is placed against, measured on this device now, each timed like the
    kernels (``time_callable``, with the L2 flusher given); the GEMM of each 16-bit precision named in
    ``sixteen_bit`` too."""
    from autocnn.gpu import require_cupy
    from autocnn.benchmark.table import gemm_tflops
    from autocnn.measurement.measure import time_callable

    cp = require_cupy()
    n = 256 * 1024 * 1024   # 1 GiB of float32: far larger than any L2, so no flush is needed
    src = cp.ones(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    copy = time_callable(lambda: dst.__setitem__(Ellipsis, src), flusher=None, budget_s=0.3)
    copy_gbps = 2 * 4 * n / (copy.median_us * 1e-6) / 1e9
    del src, dst
    rates = {}
    for precision in (FP32, TF32, *dict.fromkeys(precision_named(p) for p in sixteen_bit)):
        with torch_precision(precision) as torch:
            dtype = torch_dtype(torch, precision)
            a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda").to(dtype)
            b = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda").to(dtype)
            timing = time_callable(lambda: torch.matmul(a, b), flusher=flusher, budget_s=budget_s, min_reps=5)
            rates[precision] = gemm_tflops(GEMM_SIZE, timing.median_us)
            del a, b
    return Ceilings(copy_gbps, rates[FP32], rates[TF32], rates.get(BF16), rates.get(FP16))
