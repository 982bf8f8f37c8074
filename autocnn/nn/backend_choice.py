"""A backend by name: ``get_backend("numpy")`` or ``get_backend("cuda")``.

Kept apart from the backend interface (backend.py), which the backends themselves import: the
cuda backend is imported here only when asked for, so that importing autocnn.nn never needs
CuPy, and a machine without it gets an error that names the numpy backend.
"""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from autocnn.errors import DeviceError
from autocnn.nn.backend import Backend, BackendUnavailableError
from autocnn.nn.numpy_backend import NumpyBackend

BACKEND_NAMES = ("numpy", "cuda")


def get_backend(name_or_backend: str | Backend = "numpy", dtype: Any = None) -> Backend:
    """A backend by name ("numpy" or "cuda"), or the given Backend instance itself.

    ``dtype`` None means float32 (or, for an instance, whatever it has); a dtype that disagrees
    with a given instance is an error rather than a silent choice.
    """
    if isinstance(name_or_backend, Backend):
        if dtype is not None and np.dtype(dtype) != name_or_backend.dtype:
            raise ValueError(f"dtype={np.dtype(dtype).name} disagrees with the given backend "
                             f"{name_or_backend!r}")
        return name_or_backend
    if not isinstance(name_or_backend, str):
        raise TypeError(f"backend must be one of {', '.join(BACKEND_NAMES)} or a Backend instance; "
                        f"got {name_or_backend!r}")
    name = name_or_backend.lower()
    dtype = np.float32 if dtype is None else dtype
    if name == "numpy":
        return NumpyBackend(dtype=dtype)
    if name == "cuda":
        return _cuda_backend(dtype)
    raise ValueError(f"unknown backend {name_or_backend!r}; choose one of {', '.join(BACKEND_NAMES)}")


def _cuda_backend(dtype: Any) -> Backend:
    try:
        module = importlib.import_module("autocnn.nn.cuda_backend")
        cls = module.CudaBackend
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailableError(
            f"the cuda backend is not available ({exc}); install CuPy with "
            f"pip install 'autocnn[cuda12]' (or [cuda13]) on a machine with an NVIDIA GPU, "
            f"or use backend='numpy'") from exc
    try:
        return cls(dtype=dtype)
    except BackendUnavailableError:
        raise
    except (ImportError, RuntimeError, OSError, DeviceError) as exc:
        # No CuPy, no driver, no device: CuPy's CUDA errors are RuntimeErrors, ours DeviceError.
        raise BackendUnavailableError(f"the cuda backend cannot start: {exc}; use backend='numpy' "
                                      f"to train on the CPU") from exc
