"""The one place that imports CuPy, so that everything else imports on machines without a GPU."""
from __future__ import annotations

from typing import Any

from autocnn.errors import DeviceError

_cupy: Any = None


def require_cupy() -> Any:
    """CuPy with a usable CUDA device, or DeviceError saying what is missing and what to do."""
    global _cupy
    if _cupy is not None:
        return _cupy
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError as exc:
        raise DeviceError(
            "CuPy is not installed: install autocnn with the extra for your CUDA version, "
            "pip install 'autocnn[cuda12]' or 'autocnn[cuda13]' (or use the numpy backend)") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver
        raise DeviceError(f"no usable CUDA device: {exc}") from exc
    if count < 1:
        raise DeviceError("no CUDA device is present")
    _cupy = cupy
    return cupy


def gpu_available() -> bool:
    try:
        require_cupy()
    except DeviceError:
        return False
    return True
