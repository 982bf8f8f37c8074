"""TMA tensor maps: what a kernel's bulk tensor copies read, described by the plan and encoded for
the driver when the plan runs.

Hopper's Tensor Memory Accelerator copies a box of a tensor in global memory into shared memory on
one thread's request, and signals an mbarrier when the bytes have landed. What it reads is a
128-byte descriptor, the tensor map, that only the driver can write (``cuTensorMapEncodeTiled``,
``cuTensorMapEncodeIm2col``), and it holds the tensor's address. A plan names its buffers, not their
addresses, so a Launch carries ``TensorMap`` specs; the runtime encodes them against the buffers of
each call (cached by address, so a loop over the same buffers encodes once) and passes each map by
value as a ``__grid_constant__`` kernel parameter, before the launch's buffer arguments.

Every map here is over float32 data laid out densely (innermost dimension first), read in
128-byte rows with the 128-byte swizzle, which is the layout the wgmma descriptors name; elements
past the tensor's bounds land as zeros.

- tiled: a box of ``box`` elements per dimension.
- im2col: the tensor is NHWC (dims C, W, H, N) and a request copies ``box = (channels, pixels)``:
  ``pixels`` consecutive filter-window positions of the bounding box (the positions from ``lower`` to
  W - 1 + ``upper_w`` along W, likewise along H, then across images), each ``channels`` channels from
  its window's start plus the request's filter offset (zeros outside the image). That is the
  implicit GEMM's A tile of one filter tap, padding included, in one request.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

from autocnn.errors import DeviceError, LaunchError

MAP_BYTES = 128          # sizeof(CUtensorMap)
FLOAT_BYTES = 4
SWIZZLE_ROW_BYTES = 128  # the 128-byte swizzle: a box row is at most 128 bytes
MAX_BOX = 256            # elements along any tiled box dimension, and im2col channels per pixel
MAX_PIXELS = 1024        # im2col pixels per request
IM2COL_CORNER = 128      # a rank-4 im2col map's corners lie in [-128, 127]

# cuda.h enumerations
_FLOAT32 = 7
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3
_L2_PROMOTION_128B = 2
_OOB_FILL_ZERO = 0
_CUDA_SUCCESS = 0


@dataclass(frozen=True)
class TensorMap:
    """A tensor map over the float32 buffer ``buffer`` from its element ``offset`` on: a dense
    tensor of ``dims`` (innermost first). ``lower`` / ``upper`` (one per spatial dimension, W
    then H) make it an im2col map, whose ``box`` is (channels, pixels); otherwise ``box`` is the
    tiled box, one extent per dimension."""

    buffer: str
    offset: int
    dims: tuple[int, ...]
    box: tuple[int, ...]
    lower: tuple[int, ...] = ()
    upper: tuple[int, ...] = ()

    @property
    def im2col(self) -> bool:
        return bool(self.lower)

    @property
    def box_bytes(self) -> int:
        """Bytes one request lands in shared memory (a box past the tensor's bounds counts whole)."""
        n = FLOAT_BYTES
        for extent in self.box:
            n *= extent
        return n

    def problems(self) -> list[str]:
        """What the driver would refuse in this map, in words (empty when it encodes)."""
        out = []
        if self.offset * FLOAT_BYTES % 16:
            out.append(f"the tensor starts {self.offset} floats into {self.buffer}: not 16-byte aligned")
        if self.dims[0] * FLOAT_BYTES % 16:
            out.append(f"rows of {self.dims[0]} floats are not a multiple of 16 bytes")
        if self.box[0] * FLOAT_BYTES > SWIZZLE_ROW_BYTES:
            out.append(f"a box row of {self.box[0]} floats is past the 128-byte swizzle row")
        if self.im2col:
            if len(self.dims) != 4 or len(self.lower) != 2 or len(self.upper) != 2 or len(self.box) != 2:
                out.append("an im2col map here is NHWC (4 dimensions, 2 corners each side, box channels x pixels)")
            elif not 1 <= self.box[1] <= MAX_PIXELS:
                out.append(f"{self.box[1]} pixels a request (1 to {MAX_PIXELS})")
            for corner in (*self.lower, *self.upper):
                if not -IM2COL_CORNER <= corner < IM2COL_CORNER:
                    out.append(f"bounding-box corner {corner} outside [-{IM2COL_CORNER}, {IM2COL_CORNER - 1}]")
        elif len(self.box) != len(self.dims) or any(not 1 <= b <= MAX_BOX for b in self.box):
            out.append(f"box {self.box} for dims {self.dims}: one extent of 1 to {MAX_BOX} per dimension")
        return out


def _driver() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise DeviceError(f"TMA tensor maps need the CUDA driver (libcuda.so.1): {exc}") from exc
    u32, u64, ptr = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
    lib.cuTensorMapEncodeTiled.argtypes = [ptr, ctypes.c_int, u32, ptr, ctypes.POINTER(u64), ctypes.POINTER(u64),
                                           ctypes.POINTER(u32), ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_int]
    lib.cuTensorMapEncodeIm2col.argtypes = [ptr, ctypes.c_int, u32, ptr, ctypes.POINTER(u64), ctypes.POINTER(u64),
                                            ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), u32, u32,
                                            ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                            ctypes.c_int]
    lib.cuLaunchKernel.argtypes = [ptr, u32, u32, u32, u32, u32, u32, u32, ptr, ctypes.POINTER(ptr), ptr]
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ptr, ctypes.POINTER(ptr), ptr]
    for fn in (lib.cuTensorMapEncodeTiled, lib.cuTensorMapEncodeIm2col, lib.cuLaunchKernel, lib.cuLaunchKernelEx):
        fn.restype = ctypes.c_int
    return lib


class _Map(ctypes.Structure):
    _fields_ = [("raw", ctypes.c_uint64 * (MAP_BYTES // 8))]


# cuda.h's CUlaunchAttribute (an id, padding to 8 bytes, a 64-byte value union) and CUlaunchConfig, for
# cuLaunchKernelEx with one attribute: programmatic stream serialization (a programmatic dependent launch).
_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("value_pad", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("shared_bytes", ctypes.c_uint32),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint32)]


def _array(ctype: Any, values: Sequence[int]) -> Any:
    return (ctype * len(values))(*values)


class TensorMapLauncher:
    """Encodes a launch's tensor maps against the buffers of a call and launches the kernel with
    them (cuLaunchKernel: CuPy's launcher passes no structs by value), and makes the launches that
    are programmatic dependents of the previous kernel (cuLaunchKernelEx), maps or not."""

    CACHE_LIMIT = 64

    def __init__(self) -> None:
        self._lib = _driver()
        self._maps: dict[tuple[TensorMap, int], _Map] = {}

    def encode(self, spec: TensorMap, base: int) -> _Map:
        """The map of ``spec`` over a buffer at device address ``base``."""
        key = (spec, base)
        out = self._maps.get(key)
        if out is not None:
            return out
        bad = spec.problems()
        if bad:
            raise LaunchError(f"tensor map over {spec.buffer}: " + "; ".join(bad))
        out = _Map()
        address = ctypes.c_void_p(base + FLOAT_BYTES * spec.offset)
        dims = _array(ctypes.c_uint64, spec.dims)
        strides, stride = [], FLOAT_BYTES
        for extent in spec.dims[:-1]:
            stride *= extent
            strides.append(stride)
        strides_c = _array(ctypes.c_uint64, strides)
        ones = _array(ctypes.c_uint32, [1] * len(spec.dims))
        if spec.im2col:
            status = self._lib.cuTensorMapEncodeIm2col(
                ctypes.byref(out), _FLOAT32, len(spec.dims), address, dims, strides_c,
                _array(ctypes.c_int, spec.lower), _array(ctypes.c_int, spec.upper), spec.box[0], spec.box[1], ones,
                _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B, _OOB_FILL_ZERO)
        else:
            status = self._lib.cuTensorMapEncodeTiled(
                ctypes.byref(out), _FLOAT32, len(spec.dims), address, dims, strides_c,
                _array(ctypes.c_uint32, spec.box), ones, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B,
                _OOB_FILL_ZERO)
        if status != _CUDA_SUCCESS:
            raise LaunchError(f"the driver refused the tensor map over {spec.buffer} (CUresult {status}): {spec}")
        if len(self._maps) >= self.CACHE_LIMIT:
            self._maps.clear()
        self._maps[key] = out
        return out

    def launch(self, function: Any, launch: Any, pointers: Sequence[int], scalars: Sequence[int], stream: int,
               bases: dict[str, int]) -> int:
        """Launch ``function`` (a CuPy Function) as ``launch`` says: its tensor maps (over the
        buffers at ``bases``) by value first, then the buffer ``pointers``, then int ``scalars``.
        Returns the driver's CUresult (the runtime tells a refused launch from a broken context)."""
        values: list[Any] = [self.encode(spec, bases[spec.buffer]) for spec in launch.tensor_maps]
        values += [ctypes.c_void_p(p) for p in pointers]
        values += [ctypes.c_int32(v) for v in scalars]
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        (gx, gy, gz), (bx, by, bz) = launch.grid, launch.block
        handle = getattr(function, "kernel", function).ptr   # a RawKernel's CUfunction (NVRTC), or a Function's
        if launch.programmatic:
            attribute = _LaunchAttribute(id=_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
            config = _LaunchConfig((ctypes.c_uint32 * 3)(gx, gy, gz), (ctypes.c_uint32 * 3)(bx, by, bz),
                                   launch.shared_bytes, ctypes.c_void_p(stream), ctypes.pointer(attribute), 1)
            return self._lib.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(handle), params, None)
        return self._lib.cuLaunchKernel(ctypes.c_void_p(handle), gx, gy, gz, bx, by, bz, launch.shared_bytes,
                                        ctypes.c_void_p(stream), params, None)
