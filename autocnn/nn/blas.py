"""The thread count of numpy's OpenBLAS, for the numpy backend (best effort, Linux).

Why: the reference convolutions run many medium-sized matrix products (one per filter offset
and batch chunk). On small virtual machines a multi-threaded OpenBLAS can make each of those
10-100x slower than one thread when the vCPUs are not scheduled together (measured on a 2-core
VM: a LeNet-5 step at batch 128 took 0.06 s with one thread, 0.2-0.9 s with two). Setting
OPENBLAS_NUM_THREADS before Python starts does the same for the whole process; this module
does it at run time, like threadpoolctl, without the dependency.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

# (setter, getter) symbol pairs: plain OpenBLAS, and the scipy-openblas build numpy wheels bundle.
_SYMBOLS = (
    ("openblas_set_num_threads", "openblas_get_num_threads"),
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
)


def _loaded_openblas() -> list[tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]]:  # type: ignore[name-defined]
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    import numpy  # noqa: F401  (numpy loads its BLAS on import: it must be mapped before we look)

    paths = sorted({line.split()[-1] for line in maps.read_text().splitlines()
                    if "openblas" in line.rsplit("/", 1)[-1].lower() and line.split()[-1].startswith("/")})
    found = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)  # already loaded: this returns the same library
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], None
                getter.argtypes, getter.restype = [], ctypes.c_int
                found.append((setter, getter))
                break
    return found


def get_blas_threads() -> int | None:
    """OpenBLAS's current thread count, or None where it cannot be found."""
    libs = _loaded_openblas()
    return int(libs[0][1]()) if libs else None


def set_blas_threads(threads: int) -> bool:
    """Set OpenBLAS's thread count for this process; False where no OpenBLAS could be found."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"blas_threads must be an integer >= 1, got {threads!r}")
    libs = _loaded_openblas()
    for setter, _ in libs:
        setter(threads)
    return bool(libs)
