"""What the library steps of kernel plans (cuBLAS GEMMs, cuFFT transforms) share: loading a CUDA
library through ctypes, checking the buffers a step reaches, and refusing to make per-stream
resources while a stream is captured (StreamBound: made before a CUDA graph captures the step, or
taken over from another stream)."""
from __future__ import annotations

import ctypes
import weakref
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
        out[operand] = buf.data.ptr + buf.itemsize * offsets[operand]
    return out


class StreamBound:
    """Library resources of one engine (cuBLAS handles with their workspaces, cuFFT plans with their
    work areas), each bound to one stream at a time and found by (what it is for, stream address).

    Making one allocates device memory, which a CUDA graph capture forbids. A stream met first
    under capture (PyTorch's recipe warms up on a side stream and captures on another) therefore
    takes over a resource of the same kind made outside the capture for another stream that is not
    being captured: only the stream it is bound to changes, a host-side call. That stream makes a
    new one at its next call outside a capture, so no two streams share a work area afterwards.

    Whether another stream is being captured is asked of the CUDA runtime only while that stream
    exists: asking about a destroyed stream is undefined (it crashed the process on an H200). So
    each binding watches the stream object it was made for through a weak reference (a strong one
    where the object takes none, keeping its stream alive): once a CuPy ``Stream`` is collected,
    its CUDA stream is destroyed, and its resource can be taken over under a capture without a
    query. A stream another library owns is seen through a CuPy object that must live as long as
    the stream does, or longer (autocnn.torch keeps one for each of PyTorch's streams, which live
    as long as the process).
    """

    def __init__(self, cp: Any, what: str, make: Callable[[Any, int], Any],
                 rebind: Callable[[Any, int], None]) -> None:
        self.cp, self.what, self._make, self._rebind = cp, what, make, rebind
        # (key, stream address) -> (resource, the watch on the stream object it is bound for)
        self._bound: dict[tuple[Any, int], tuple[Any, Callable[[], Any]]] = {}

    @staticmethod
    def _watch(stream: Any) -> Callable[[], Any]:
        """What gives the stream object back while it lives, and None once it has gone."""
        try:
            return weakref.ref(stream)
        except TypeError:   # an object without weak references: held, so its stream stays
            return lambda: stream

    @staticmethod
    def _gone(watch: Callable[[], Any]) -> bool:
        return watch() is None

    def _capturing(self, stream_ptr: int) -> bool:
        return bool(self.cp.cuda.runtime.streamIsCapturing(stream_ptr))

    def _free(self, stream_ptr: int, watch: Callable[[], Any]) -> bool:
        """Whether a resource's stream runs nothing now: it is gone, or it exists and is not being
        captured."""
        if self._gone(watch):
            return True
        try:
            return not self._capturing(stream_ptr)
        except self.cp.cuda.runtime.CUDARuntimeError:   # a context that went: nothing runs on it
            return True

    def _take_over(self, key: Any, stream: Any) -> Any:
        """Rebind to ``stream`` a resource of kind ``key`` whose stream runs nothing now, if any."""
        for bound_key, other in list(self._bound):
            if bound_key != key:
                continue
            resource, watch = self._bound[(key, other)]
            if self._free(other, watch):
                del self._bound[(key, other)]
                self._rebind(resource, stream.ptr)
                self._bound[(key, stream.ptr)] = (resource, self._watch(stream))
                return resource
        return None

    def get(self, key: Any, stream: Any) -> Any:
        """The resource of kind ``key`` for ``stream`` (an object with the stream's address as
        ``ptr``: a CuPy stream), made, reused or taken over as the class says."""
        found = self._bound.get((key, stream.ptr))
        if found is not None:
            resource, watch = found
            if watch() is not stream:   # another object for this address (the first one gone)
                self._bound[(key, stream.ptr)] = (resource, self._watch(stream))
            return resource
        # The caller's stream exists (it is running this call): asking about it is safe.
        if not self._capturing(stream.ptr):
            # Not a gone stream's resource, though it would save memory: a graph captured on that
            # stream may still replay with it, beside this stream's work.
            resource = self._make(key, stream.ptr)
            self._bound[(key, stream.ptr)] = (resource, self._watch(stream))
            return resource
        resource = self._take_over(key, stream)
        if resource is not None:
            return resource
        raise DeviceError(f"a {self.what} step runs on a stream that is being captured, and no {self.what} "
                          f"resource for it was made before the capture: run the step once outside the "
                          f"capture (a warm-up) or call LoadedPlan.prepare_stream(stream) first")

    def values(self) -> list[Any]:
        return [resource for resource, _watch in self._bound.values()]


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
