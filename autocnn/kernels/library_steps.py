"""What the library steps of kernel plans (cuBLAS GEMMs, cuFFT transforms) share: loading a CUDA
library through ctypes, checking the buffers a step reaches, and refusing to make per-stream
resources while the stream is captured (they must exist before a CUDA graph captures the step)."""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Iterable, Mapping, Sequence

from autocnn.errors import DeviceError


def load_library(what: str, names: Sequence[str], needed: Sequence[str]) -> ctypes.CDLL:
    """The first of ``names`` that loads and has every entry point in ``needed``."""
    tried = []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            tried.append(f"{name}: {exc}")
            continue
        missing = [f for f in needed if not hasattr(lib, f)]
        if not missing:
            return lib
        tried.append(f"{name} lacks {', '.join(missing)}")
    raise DeviceError(f"cannot load {what}: " + "; ".join(tried))


def pointers(cp: Any, step: Any, offsets: Mapping[str, int], buffers: Mapping[str, Any]) -> dict[str, int]:
    """Device addresses of a step's operands (``step.extents()``: operand -> (buffer, elements
    reached)), each checked to be a C-contiguous float32 array long enough for the step."""
    out = {}
    for operand, (name, extent) in step.extents().items():
        buf = buffers.get(name)
        if buf is None:
            raise ValueError(f"the {step.kernel} step's {operand} is in buffer {name!r}, which was not given")
        if buf.dtype != cp.float32 or not buf.flags.c_contiguous:
            raise ValueError(f"buffer {name!r} must be a C-contiguous float32 array, not {buf.dtype}")
        if extent > buf.size:
            raise ValueError(f"the {step.kernel} step reaches element {extent} of {name!r}, which has {buf.size}")
        out[operand] = buf.data.ptr + 4 * offsets[operand]
    return out


def refuse_in_capture(cp: Any, stream_ptr: int, what: str) -> None:
    """A per-stream library resource cannot be made while its stream is captured."""
    if cp.cuda.runtime.streamIsCapturing(stream_ptr):
        raise DeviceError(f"a {what} step runs on a stream that is being captured and was not prepared: "
                          "call LoadedPlan.prepare_stream(stream) before the capture")


def release_all(destroy: Callable[[Any], Any], resources: Iterable[Any]) -> None:
    """Destroy library handles or plans when their owner goes (at interpreter exit the library may
    already be gone: nothing is left to release then)."""
    for resource in resources:
        try:
            destroy(resource)
        except Exception:  # noqa: BLE001
            pass


_ENGINES: dict[tuple[type, int], Any] = {}


def device_engine(cp: Any, kind: type) -> Any:
    """The process's one engine of a kind for the current device (library handles and plans belong
    to a device's context)."""
    key = (kind, cp.cuda.runtime.getDevice())
    if key not in _ENGINES:
        _ENGINES[key] = kind(cp)
    return _ENGINES[key]
