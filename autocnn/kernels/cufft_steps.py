"""The library FFT steps of kernel plans (operation.LibraryFft): batched 2-D real FFTs by cuFFT on
raw pointers into the plan's buffers, callable while a CUDA graph is being captured.

cuFFT plans are made once per (kind, size, batch, layout) and stream and kept (a plan's work area must not
serve two streams at once); making one allocates, so a stream that a CUDA graph will capture is
prepared first (``prepare``), or takes over a plan made for another stream (StreamBound). cuFFT
computes in FP32 and its C2R transform is unnormalised.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any, Iterable

from autocnn.errors import DeviceError
from autocnn.kernels.library_steps import StreamBound, device_engine, load_library, pointers, release_all
from autocnn.kernels.steps import LibraryFft

# cuFFT's enums (cufft.h).
CUFFT_R2C, CUFFT_C2R = 0x2A, 0x2C
NEEDED = ("cufftPlanMany", "cufftSetStream", "cufftExecR2C", "cufftExecC2R", "cufftDestroy")
LIBRARY_NAMES = tuple(f"libcufft.so{suffix}" for suffix in (".12", ".11", ".13", "")) + \
    tuple(f"cufft64_{v}.dll" for v in (12, 11, 13))


@functools.lru_cache(maxsize=1)
def cufft_library() -> ctypes.CDLL:
    lib = load_library("cuFFT for the library FFT steps", LIBRARY_NAMES, NEEDED)
    vp, i, ip = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)
    lib.cufftPlanMany.argtypes = [ctypes.POINTER(i), i, ip, ip, i, i, ip, i, i, i, i]
    lib.cufftSetStream.argtypes = [i, vp]
    lib.cufftExecR2C.argtypes = [i, vp, vp]
    lib.cufftExecC2R.argtypes = [i, vp, vp]
    lib.cufftDestroy.argtypes = [i]
    return lib


def _status(code: int, what: str) -> None:
    if code != 0:
        raise DeviceError(f"{what} failed with cuFFT status {code}")


class CufftSteps:
    """Runs LibraryFft steps on the current device, plans kept per shape, batch and stream."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        import cupy.cuda.cufft  # noqa: F401 -- loads the cuFFT CuPy uses, so the names resolve to it

        self.lib = cufft_library()
        self._plans = StreamBound(cp, "cuFFT", self._make_plan, self._bind)

    def prepare(self, stream: Any, steps: Iterable[LibraryFft]) -> None:
        """Make the plans of these steps for a stream now, before a capture on it."""
        for step in steps:
            self._plan(step, stream)

    def _plan(self, step: LibraryFft, stream: Any) -> ctypes.c_int:
        return self._plans.get((step.kind, step.height, step.width, step.batch, step.frequency_major), stream)

    def _make_plan(self, key: tuple[str, int, int, int, bool], stream_ptr: int) -> ctypes.c_int:
        kind_name, height, width, batch, frequency_major = key
        plan = ctypes.c_int()
        n = (ctypes.c_int * 2)(height, width)
        kind = CUFFT_R2C if kind_name == "r2c" else CUFFT_C2R
        if not frequency_major:
            # Null embeddings: planes packed one after another, real height*width, half spectra
            # height*(width//2+1) (the layouts LibraryFft describes).
            _status(self.lib.cufftPlanMany(ctypes.byref(plan), 2, n, None, 1, 0, None, 1, 0, kind, batch),
                    "cufftPlanMany")
        else:
            # Real planes packed (stride 1, height*width apart); half spectra frequency-major: element
            # (plane b, frequency f) at f*batch + b, so stride batch and planes 1 apart.
            real = (ctypes.c_int * 2)(height, width)
            half = (ctypes.c_int * 2)(height, width // 2 + 1)
            layout = ((real, 1, height * width), (half, batch, 1))
            (inembed, istride, idist), (onembed, ostride, odist) = layout if kind == CUFFT_R2C else layout[::-1]
            _status(self.lib.cufftPlanMany(ctypes.byref(plan), 2, n, inembed, istride, idist, onembed, ostride, odist,
                                           kind, batch), "cufftPlanMany")
        self._bind(plan, stream_ptr)
        return plan

    def _bind(self, plan: ctypes.c_int, stream_ptr: int) -> None:
        _status(self.lib.cufftSetStream(plan, ctypes.c_void_p(stream_ptr)), "cufftSetStream")

    def __call__(self, step: LibraryFft, buffers: dict[str, Any], stream: Any) -> None:
        ptr = pointers(self.cp, step, {"src": step.src_offset, "dst": step.dst_offset}, buffers)
        plan = self._plan(step, stream)
        run = self.lib.cufftExecR2C if step.kind == "r2c" else self.lib.cufftExecC2R
        _status(run(plan, ctypes.c_void_p(ptr["src"]), ctypes.c_void_p(ptr["dst"])), step.kernel)

    # release_all is bound at definition: at interpreter exit this module's globals may be None.
    def __del__(self, _release_all: Any = release_all) -> None:
        plans = getattr(self, "_plans", None)
        _release_all(self.lib.cufftDestroy, plans.values() if plans else ())


def fft_engine(cp: Any) -> CufftSteps:
    """The process's cuFFT steps for the current device."""
    return device_engine(cp, CufftSteps)
