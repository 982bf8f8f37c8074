"""What the library steps of kernel plans (cuBLAS GEMMs, cuFFT transforms) share: loading a CUDA
library through ctypes, checking the buffers a step reaches, and refusing to make per-stream
resources while a stream is captured (StreamBound: made before a CUDA graph captures the step, or
taken over from another stream)."""
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


class StreamBound:
    """Library resources of one engine (cuBLAS handles with their workspaces, cuFFT plans with their
    work areas), each bound to one stream at a time and found by (what it is for, stream).

    Making one allocates device memory, which a CUDA graph capture forbids. A stream met first
    under capture (PyTorch's recipe warms up on a side stream and captures on another) therefore
    takes over a resource of the same kind made outside the capture for another stream that is not
    being captured: only the stream it is bound to changes, a host-side call. That stream makes a
    new one at its next call outside a capture, so no two streams share a work area afterwards.
    """

    def __init__(self, cp: Any, what: str, make: Callable[[Any, int], Any],
                 rebind: Callable[[Any, int], None]) -> None:
        self.cp, self.what, self._make, self._rebind = cp, what, make, rebind
        self._bound: dict[tuple[Any, int], Any] = {}

    def _capturing(self, stream_ptr: int) -> bool:
        return bool(self.cp.cuda.runtime.streamIsCapturing(stream_ptr))

    def _idle(self, stream_ptr: int) -> bool:
        """Whether a resource's stream is not being captured: one destroyed since (its query fails;
        a test's streams, a model's that went) runs nothing, and its resource can be taken over."""
        try:
            return not self._capturing(stream_ptr)
        except self.cp.cuda.runtime.CUDARuntimeError:
            return True

    def get(self, key: Any, stream_ptr: int) -> Any:
        found = self._bound.get((key, stream_ptr))
        if found is not None:
            return found
        if not self._capturing(stream_ptr):
            found = self._bound[(key, stream_ptr)] = self._make(key, stream_ptr)
            return found
        for bound_key, other in list(self._bound):
            if bound_key == key and self._idle(other):
                found = self._bound.pop((key, other))
                self._rebind(found, stream_ptr)
                self._bound[(key, stream_ptr)] = found
                return found
        raise DeviceError(f"a {self.what} step runs on a stream that is being captured, and no {self.what} "
                          f"resource for it was made before the capture: run the step once outside the "
                          f"capture (a warm-up) or call LoadedPlan.prepare_stream(stream) first")

    def values(self) -> list[Any]:
        return list(self._bound.values())


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
