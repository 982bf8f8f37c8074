"""Running autocnn's kernels on PyTorch tensors: zero-copy views, PyTorch's stream, one backend a GPU.

The kernels are those the training library's cuda backend runs, from the same path
(``autocnn.dispatch.kernels.GpuKernels``): ``prepare`` looks each problem up in the tuning
database (exact record, same architecture, nearest tuned shape, heuristic default), compiles it
through NVRTC and allocates its workspaces; ``run`` launches it on CuPy's current stream over
named buffers. Here the buffers are PyTorch's own memory seen through CuPy arrays (the pointer,
shape and device the CUDA array interface carries, wrapped without a copy), and CuPy's current
stream is made PyTorch's current stream for the launch, so autocnn's kernels are ordered with
PyTorch's work, follow ``torch.cuda.stream(...)`` and are recorded by a CUDA-graph capture. The
operators (autocnn.torch.ops) check their tensors before they get here.

Capture: nothing here allocates or waits while a kernel runs (outputs are PyTorch tensors; the
workspaces are made when a problem is prepared). A problem met for the first time
during a capture cannot be compiled there, and says so: run the step once before capturing,
as PyTorch's own capture recipe does.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from autocnn.errors import DeviceError


def _cupy() -> Any:
    from autocnn.gpu import require_cupy

    return require_cupy()


def as_cupy(cp: Any, t: torch.Tensor) -> Any:
    """A CuPy array over a contiguous float32 CUDA tensor's memory (no copy; the tensor stays its owner).

    The device is given, not looked up from the pointer, so that wrapping makes no CUDA call (it
    may happen inside a stream capture)."""
    memory = cp.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t, t.device.index)
    return cp.ndarray(tuple(t.shape), dtype=cp.float32, memptr=cp.cuda.MemoryPointer(memory, 0))


@dataclass
class DeviceKernels:
    """autocnn's kernels of one GPU (autocnn.dispatch's GpuKernels), and the CuPy views of its streams."""

    index: int
    kernels: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    # CuPy's view of each PyTorch stream met, kept: the library steps' resources are bound to the
    # view (StreamBound), which must live as long as the stream (PyTorch's live as the process).
    streams: dict[int, Any] = field(default_factory=dict)

    def cupy_stream(self, cp: Any, stream: torch.cuda.Stream) -> Any:
        view = self.streams.get(stream.cuda_stream)
        if view is None:
            view = self.streams[stream.cuda_stream] = _cupy_stream(cp, stream.cuda_stream, self.index)
        return view

    def prepare(self, problems: Sequence[Any]) -> list[Any]:
        """Look up, compile and load these problems' kernels (before a capture, or ahead of a step)."""
        missing = [p for p in problems if p not in self.kernels.dispatch]
        if missing:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"autocnn.torch: {missing[0].op} ({missing[0].shape_string()}) was not prepared before this "
                    f"CUDA-graph capture, and a kernel cannot be compiled inside one: run the step once before "
                    f"capturing (PyTorch's warm-up), or call autocnn.torch.prepare(model, example_input)")
            cp = _cupy()
            with self.lock, cp.cuda.Device(self.index):
                self.kernels.prepare(missing)
        return [self.kernels.dispatch[p] for p in problems]

    def run(self, problem: Any, **tensors: torch.Tensor | None) -> None:
        """Launch ``problem``'s kernel on PyTorch's current stream of this device, over its buffers
        by name (e.g. x, w, bias, y for conv_fwd; an absent optional one as None)."""
        cp = _cupy()
        stream = torch.cuda.current_stream(self.index)
        with cp.cuda.Device(self.index), self.cupy_stream(cp, stream):
            if problem not in self.kernels.dispatch:
                # On PyTorch's stream: what loading a plan queues (and a library GEMM's handle) is for it.
                self.prepare([problem])
            self.kernels.run(problem, {name: None if t is None else as_cupy(cp, t) for name, t in tensors.items()})

    def forget(self, problems: Iterable[Any]) -> None:
        with self.lock:
            self.kernels.forget(list(problems))


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
            import os

            from autocnn.device import current_device
            from autocnn.dispatch.kernels import GpuKernels
            from autocnn.dispatch.quick import AUTOTUNE_ENV
            from autocnn.store import TuningDatabase

            # Inside a PyTorch model, kernels are what the tuning database hands out unless the user
            # asks for more: AUTOCNN_AUTOTUNE=quick|full (or autocnn.torch.tune ahead of training).
            # Quick tuning here would measure in worker processes on a model's first step.
            autotune = os.environ.get(AUTOTUNE_ENV) or "off"
            cp = _cupy()
            with cp.cuda.Device(index):
                kernels = GpuKernels(cp, index, current_device(index), TuningDatabase(), autotune)
                _DEVICES[index] = DeviceKernels(index, kernels)
        return _DEVICES[index]


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
