"""GEMMs through cuBLAS, callable while a CUDA graph is being captured.

CuPy refuses every cuBLAS call while a stream captures (its wrappers check before setting the
stream), although cuBLAS itself supports capture when the handle has a workspace of its own.
So the Dense layers of a captured training step call cuBLAS here, through ctypes, on a handle of
their own with a fixed workspace: ``cublasSgemm_v2`` for float32 (the same routine CuPy would use
for a float32 matmul, without TF32: the default math mode), and for mixed precision's 16-bit
Dense layers ``cublasGemmEx`` with bfloat16 or float16 operands, FP32 compute
(CUBLAS_COMPUTE_32F: every product and sum in FP32) and an FP32 or 16-bit result (rounded once).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

# cuBLAS's own enums (cublas_api.h, library_types.h).
OP_N, OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
# cudaDataType of each array dtype the training library stores: bfloat16 is held as the uint16 bit
# patterns of its values (autocnn.measurement.element_arrays), so uint16 means CUDA_R_16BF here.
CUDA_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 2, np.dtype(np.uint16): 14}
# The workspace NVIDIA recommends for Hopper; cuBLAS then never allocates during a capture.
WORKSPACE_BYTES = 32 * 1024 * 1024
SONAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so", "cublas64_13.dll",
           "cublas64_12.dll", "cublas64_11.dll")


class CublasUnavailableError(RuntimeError):
    """No cuBLAS shared library with the needed entry points could be loaded."""


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    from autocnn.errors import DeviceError
    from autocnn.kernels.library_steps import load_library

    try:   # cublasSetWorkspace_v2: cuBLAS 11.1 or later
        return load_library("cuBLAS for graph-capturable GEMMs", SONAMES,
                            ("cublasCreate_v2", "cublasSetStream_v2", "cublasSgemm_v2", "cublasSetWorkspace_v2",
                             "cublasGemmEx"))
    except DeviceError as exc:
        raise CublasUnavailableError(str(exc)) from None


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


class Gemm:
    """Row-major ``out = a @ b`` on the current CuPy stream (one per device): float32 operands and
    result by SGEMM; 16-bit operands (both of one type) into a float32 or same-type result by
    GemmEx with FP32 compute.

    ``a`` and ``b`` may be C-contiguous or transposed views of C-contiguous arrays (F-contiguous),
    as a Dense layer's ``x.T`` and ``W.T`` are; ``out`` must be C-contiguous.

    Each stream gets a handle and workspace of its own: GEMMs on two streams at once (a weight
    gradient beside an input gradient) must not share a workspace.
    """

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        # Loading cuBLAS through CuPy first makes the soname resolve to the library CuPy uses.
        cp.cuda.device.get_cublas_handle()
        lib = _library()
        self.lib = lib
        self._handles: dict[int, tuple[ctypes.c_void_p, Any]] = {}   # stream pointer -> handle, workspace
        self._alpha = ctypes.c_float(1.0)
        self._beta = ctypes.c_float(0.0)
        lib.cublasSgemm_v2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_int]
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasGemmEx.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]

    def prepare(self, stream_ptr: int) -> None:
        """Make the handle of a stream now (before a capture on it: creating one may not be captured)."""
        self._handle(stream_ptr)

    def _handle(self, stream_ptr: int) -> ctypes.c_void_p:
        entry = self._handles.get(stream_ptr)
        if entry is None:
            lib = self.lib
            handle = ctypes.c_void_p()
            _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
            workspace = self.cp.empty(WORKSPACE_BYTES, dtype=self.cp.uint8)
            # The stream first: cublasSetStream puts the handle back on cuBLAS's own workspace pool,
            # which would undo a workspace set before it (and allocate during a graph capture).
            _check(lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
            _check(lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace.data.ptr),
                                             ctypes.c_size_t(WORKSPACE_BYTES)), "cublasSetWorkspace")
            entry = self._handles[stream_ptr] = (handle, workspace)
        return entry[0]

    def __del__(self) -> None:
        for handle, _workspace in getattr(self, "_handles", {}).values():
            try:
                self.lib.cublasDestroy_v2(handle)
            except Exception:  # noqa: BLE001 -- at interpreter exit the library may be gone
                pass

    @staticmethod
    def _operand(x: Any) -> tuple[int, int]:
        """(cuBLAS op, leading dimension) of a row-major operand seen column-major."""
        rows, cols = x.shape
        if x.flags.c_contiguous:
            return OP_N, max(1, cols)
        if x.flags.f_contiguous:
            return OP_T, max(1, rows)
        raise ValueError(f"matmul operands must be C- or F-contiguous, got strides {x.strides}")

    def __call__(self, a: Any, b: Any, out: Any) -> Any:
        if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
            raise ValueError("Gemm multiplies 2-D arrays")
        m, k = a.shape
        k2, n = b.shape
        if k != k2 or out.shape != (m, n):
            raise ValueError(f"matmul shapes do not fit: {a.shape} @ {b.shape} -> {out.shape}")
        sixteen = a.dtype != np.float32
        if not ((a.dtype == b.dtype == out.dtype == np.float32)
                or (sixteen and a.dtype == b.dtype and a.dtype in CUDA_TYPES and out.dtype in (a.dtype, np.float32))):
            raise TypeError(f"Gemm multiplies float32 arrays into float32, or 16-bit ones (float16, or bfloat16 "
                            f"as uint16) of one type into float32 or that type; got {a.dtype} @ {b.dtype} -> "
                            f"{out.dtype}")
        if not out.flags.c_contiguous:
            raise ValueError("matmul output must be C-contiguous")
        if m == 0 or n == 0:
            return out
        if k == 0:
            out.fill(0)
            return out
        # Row-major out = a @ b is column-major out^T = b^T a^T: b comes first.
        op_b, ld_b = self._operand(b)
        op_a, ld_a = self._operand(a)
        handle = self._handle(self.cp.cuda.get_current_stream().ptr)
        if sixteen:
            operand, result = CUDA_TYPES[np.dtype(a.dtype)], CUDA_TYPES[np.dtype(out.dtype)]
            _check(self.lib.cublasGemmEx(handle, op_b, op_a, n, m, k, ctypes.byref(self._alpha),
                                         ctypes.c_void_p(b.data.ptr), operand, ld_b, ctypes.c_void_p(a.data.ptr),
                                         operand, ld_a, ctypes.byref(self._beta), ctypes.c_void_p(out.data.ptr),
                                         result, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "cublasGemmEx")
            return out
        _check(self.lib.cublasSgemm_v2(handle, op_b, op_a, n, m, k, ctypes.byref(self._alpha),
                                  ctypes.c_void_p(b.data.ptr), ld_b, ctypes.c_void_p(a.data.ptr), ld_a,
                                  ctypes.byref(self._beta), ctypes.c_void_p(out.data.ptr), n), "cublasSgemm")
        return out
