"""Running autocnn's kernels on PyTorch tensors: zero-copy views, PyTorch's stream, one backend a GPU.

The kernels are those the training library's cuda backend runs, from the same path
(``autocnn.dispatch.kernels.GpuKernels``): ``prepare`` looks each problem up in the tuning
database (exact record, same architecture, nearest tuned shape, heuristic default), tunes it where
no record of it exists, compiles it through NVRTC and allocates its workspaces; ``run`` launches it
on CuPy's current stream over named buffers. Here the buffers are PyTorch's own memory seen
through CuPy arrays (the pointer, shape and device the CUDA array interface carries, wrapped
without a copy), and CuPy's current stream is made PyTorch's current stream for the launch, so
autocnn's kernels are ordered with PyTorch's work, follow ``torch.cuda.stream(...)`` and are
recorded by a CUDA-graph capture. The operators (autocnn.torch.ops) check their tensors before
they get here.

Tuning: the autotune mode is $AUTOCNN_AUTOTUNE's, else "quick" (autocnn.dispatch.quick), as
for the training library. A converted model prepares all its problems at its first step under one
budget (autocnn.torch.first_use); a problem met one at a time here (a functional call, a compiled
graph run before any eager step) is quick-tuned on the spot, the problems so met on one device
sharing one budget of the same size, and each tuning says so in one line on stderr.

Capture: nothing here allocates or waits while a kernel runs (outputs are PyTorch tensors; the
workspaces are made when a problem is prepared). A problem met for the first time
during a capture cannot be compiled there, and says so: run the step once before capturing,
as PyTorch's own capture recipe does.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from autocnn.dispatch.quick import TuningBudget, model_budget
from autocnn.errors import DeviceError
from autocnn.measurement.element_arrays import storage_dtype
from autocnn.torch.dtypes import ELEMENTS


def _cupy() -> Any:
    from autocnn.gpu import require_cupy

    return require_cupy()


def as_cupy(cp: Any, t: torch.Tensor) -> Any:
    """A CuPy array over a contiguous CUDA tensor's memory (no copy; the tensor stays its owner), of
    the dtype the project's arrays hold its elements in (measurement.element_arrays: float32,
    float16, and bfloat16 as its uint16 bit patterns, which CuPy has no type for).

    The device is given, not looked up from the pointer, so that wrapping makes no CUDA call (it
    may happen inside a stream capture)."""
    memory = cp.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t, t.device.index)
    return cp.ndarray(tuple(t.shape), dtype=storage_dtype(ELEMENTS[t.dtype]), memptr=cp.cuda.MemoryPointer(memory, 0))


@dataclass
class DeviceKernels:
    """autocnn's kernels of one GPU (autocnn.dispatch's GpuKernels), and the CuPy views of its streams."""

    index: int
    kernels: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    # CuPy's view of each PyTorch stream met, kept: the library steps' resources are bound to the
    # view (StreamBound), which must live as long as the stream (PyTorch's live as the process).
    streams: dict[int, Any] = field(default_factory=dict)
    # What the problems met one at a time (not through a model's prepare) spend tuning, together.
    met_budget: TuningBudget | None = None

    def cupy_stream(self, cp: Any, stream: torch.cuda.Stream) -> Any:
        view = self.streams.get(stream.cuda_stream)
        if view is None:
            view = self.streams[stream.cuda_stream] = _cupy_stream(cp, stream.cuda_stream, self.index)
        return view

    def prepare(self, problems: Sequence[Any], *, mode: str | None = None, budget: TuningBudget | None = None,
                progress: Any = None) -> Any:
        """Look up, tune (by ``mode``, default the device's), compile and load these problems' kernels
        (before a capture, or ahead of a step); their tuning shares ``budget``, by default the one
        of problems met one at a time. A PrepareOutcome (autocnn.dispatch.kernels)."""
        missing = [p for p in problems if p not in self.kernels.dispatch]
        if missing and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"autocnn.torch: {missing[0].op} ({missing[0].shape_string()}) was not prepared before this "
                f"CUDA-graph capture, and a kernel cannot be compiled inside one: run the step once before "
                f"capturing (PyTorch's warm-up), or call autocnn.torch.prepare(model, example_input) (inside the "
                f"same torch.autocast region as the step, if any, or with precision='bf16' / 'fp16')")
        if budget is None and missing:
            if self.met_budget is None:
                self.met_budget = TuningBudget(model_budget())
            budget = self.met_budget
        with self.lock, self.kernels.cp.cuda.Device(self.index):
            return self.kernels.prepare_all(problems, mode=mode, budget=budget, progress=progress)

    def run(self, problem: Any, **tensors: torch.Tensor | None) -> None:
        """Launch ``problem``'s kernel on PyTorch's current stream of this device, over its buffers
        by name (e.g. x, w, bias, y for conv_fwd; an absent optional one as None)."""
        cp = _cupy()
        stream = torch.cuda.current_stream(self.index)
        with cp.cuda.Device(self.index), self.cupy_stream(cp, stream):
            if problem not in self.kernels.dispatch:
                # On PyTorch's stream: what loading a plan queues (and a library GEMM's handle) is for it.
                _say_tuned(outside_the_forward(self.prepare, [problem]))
            self.kernels.run(problem, {name: None if t is None else as_cupy(cp, t) for name, t in tensors.items()})

    def forget(self, problems: Iterable[Any]) -> None:
        with self.lock:
            self.kernels.forget(list(problems))


def outside_the_forward(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` run in a generator's frame, whose link back to its caller lasts only while it runs.

    Preparing kernels happens inside a model's forward (the first-use hook, a problem met one at a
    time); what the preparation imports for the first time may
    keep a traceback (Optuna keeps the ImportError of each optional module it tries), and a frame
    finished as a plain call keeps its caller, so the forward's frames, and with them the step's
    output and its autograd graph, would stay alive for good: the parameters' AccumulateGrad nodes,
    made on the stream of that first step, would then break a later CUDA-graph capture. A
    generator's frame does not keep its caller once it is suspended, so the chain stops there."""
    def run() -> Any:
        yield fn(*args)
    return next(run())


def _say_tuned(outcome: Any) -> None:
    """One line on stderr for each problem tuned on the spot: the pause it made has a reason."""
    for p in outcome.problems:
        if p.tuned_now:
            print(f"autocnn.torch: {p.problem.op} {p.problem.shape_string()} met for the first time, tuned in "
                  f"{p.tune_s:.1f} s ({p.dispatch.source}; autocnn.torch.prepare tunes a model's kernels ahead)",
                  file=sys.stderr, flush=True)


class _StreamHandle:
    """A raw cudaStream_t through the CUDA stream protocol (``__cuda_stream__``: version 0, address)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.ptr


def _cupy_stream(cp: Any, ptr: int, index: int) -> Any:
    """CuPy's view of PyTorch's stream: ``Stream.from_external`` where CuPy has it (14 and later, which
    deprecate ``ExternalStream`` with a warning on every call), else ``ExternalStream``."""
    if hasattr(cp.cuda.Stream, "from_external"):
        return cp.cuda.Stream.from_external(_StreamHandle(ptr))
    return cp.cuda.ExternalStream(ptr, index)


_DEVICES: dict[int, DeviceKernels] = {}
_DEVICES_LOCK = threading.Lock()


def kernels_for(device: torch.device) -> DeviceKernels:
    """The kernels of one CUDA device (its backend made on first use)."""
    if device.type != "cuda":
        raise DeviceError(f"autocnn's kernels run on CUDA devices, not {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _DEVICES.get(index)
    if found is not None:
        return found
    with _DEVICES_LOCK:
        if index not in _DEVICES:
            # Often first called inside a forward: what it imports must not keep the forward's frames.
            _DEVICES[index] = outside_the_forward(_device_kernels, index)
        return _DEVICES[index]


def _device_kernels(index: int) -> DeviceKernels:
    from autocnn.device import current_device
    from autocnn.dispatch.kernels import GpuKernels
    from autocnn.dispatch.quick import autotune_mode
    from autocnn.store import TuningDatabase

    autotune = autotune_mode()   # $AUTOCNN_AUTOTUNE checked before the GPU is touched
    cp = _cupy()
    with cp.cuda.Device(index):
        return DeviceKernels(index, GpuKernels(cp, index, current_device(index), TuningDatabase(), autotune))


def forget(problems: Iterable[Any]) -> None:
    """Drop the kernels chosen for these problems on every device (after tuning: the next call looks again)."""
    problems = list(problems)
    for kernels in list(_DEVICES.values()):
        kernels.forget(problems)


def dispatch_rows() -> list[tuple[str, str, str, str, str]]:
    """(device, op, shape, source, detail) of every problem prepared so far."""
    rows = []
    for index, on_device in sorted(_DEVICES.items()):
        for problem, found in on_device.kernels.dispatch.items():
            rows.append((f"cuda:{index}", problem.op, problem.shape_string(), found.source, found.detail))
    return rows


def launch_counts() -> dict[str, int]:
    """Generated-kernel launches per op, over every device, since the process started (graph replays
    are not counted: a replay does not pass through Python)."""
    total: dict[str, int] = {}
    for on_device in _DEVICES.values():
        for op, n in on_device.kernels.generated_launches.items():
            total[op] = total.get(op, 0) + n
    return total
