"""The library GEMM steps of kernel plans: cuBLAS strided-batched SGEMM (operation.LibraryGemm) and
complex GEMM (operation.LibraryComplexGemm, through cublasGemmStridedBatchedEx) on raw pointers into
the plan's buffers, callable while a CUDA graph is being captured.

Why not cupy.matmul: CuPy refuses every cuBLAS call while a stream captures, and the training
step is captured as a CUDA graph. cuBLAS itself supports capture when a handle has a workspace of
its own and was made before the capture, so each stream gets a handle and a fixed workspace here
(two streams must not share a workspace: a weight gradient runs beside an input gradient).
``prepare(stream)`` makes a stream's handle ahead of a capture on it; a stream first met under a
capture takes over the handle of a stream that is not capturing (library_steps.StreamBound).

Precision: each call sets the handle's math mode. FP32 steps run with CUBLAS_DEFAULT_MATH (no
TF32, whatever CUPY_TF32 or NVIDIA_TF32_OVERRIDE say: CuPy's variable does not reach this handle,
and NVIDIA's can only turn TF32 off); a step of a tf32 problem that asks for it runs with
CUBLAS_TF32_TENSOR_OP_MATH. Complex steps name their compute type as well: CUBLAS_COMPUTE_32F, or
CUBLAS_COMPUTE_32F_FAST_TF32 for a tf32 step.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

from autocnn.errors import DeviceError
from autocnn.kernels.library_steps import StreamBound, device_engine, load_library, pointers, release_all
from autocnn.kernels.steps import LibraryComplexGemm, LibraryGemm

# cuBLAS's enums (cublas_api.h).
CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C = 0, 1, 2
CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH = 0, 3
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 77
CUDA_C_32F = 4                  # cudaDataType of complex float32
CUBLAS_GEMM_DEFAULT = -1
# A row-major operand stored as op(X) ("n"), its transpose ("t") or its conjugate transpose ("h") is,
# seen column-major, op(X)^T, op(X) or conj(op(X)): cuBLAS's op that makes op(X)^T of it.
STORED_OPS = {"n": CUBLAS_OP_N, "t": CUBLAS_OP_T, "h": CUBLAS_OP_C}
# What NVIDIA recommends for Hopper; with it cuBLAS never allocates while a stream captures.
HANDLE_WORKSPACE_BYTES = 32 * 1024 * 1024
NEEDED = ("cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2",
          "cublasSetMathMode", "cublasSgemmStridedBatched", "cublasGemmStridedBatchedEx")
LIBRARY_NAMES = tuple(f"libcublas.so{suffix}" for suffix in (".13", ".12", ".11", "")) + \
    tuple(f"cublas64_{v}.dll" for v in (13, 12, 11))


@functools.lru_cache(maxsize=1)
def cublas_library() -> ctypes.CDLL:
    """The cuBLAS shared library with every entry point the GEMM steps call."""
    lib = load_library("cuBLAS for the library GEMM steps", LIBRARY_NAMES, NEEDED)
    _declare(lib)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.cublasSgemmStridedBatched.argtypes = [vp, i, i, i, i, i, vp, vp, i, ll, vp, i, ll, vp, vp, i, ll, i]
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll,
                                               i, i, i]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasSetMathMode.argtypes = [vp, i]
    lib.cublasDestroy_v2.argtypes = [vp]


def _status(code: int, what: str) -> None:
    if code != 0:
        raise DeviceError(f"{what} failed with cuBLAS status {code}")


class CublasGemm:
    """Runs LibraryGemm steps on the current device, a handle and workspace per stream."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        # Loading cuBLAS through CuPy first makes the library name resolve to the one CuPy uses.
        cp.cuda.device.get_cublas_handle()
        self.lib = cublas_library()
        self._handles = StreamBound(cp, "cuBLAS GEMM", self._make_handle, self._bind)
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._cone, self._czero = (ctypes.c_float * 2)(1.0, 0.0), (ctypes.c_float * 2)(0.0, 0.0)

    def prepare(self, stream: Any) -> None:
        """Make a stream's handle now: before a capture on the stream (making one is not captured)."""
        self._handle(stream)

    def _handle(self, stream: Any) -> ctypes.c_void_p:
        return self._handles.get(None, stream)[0]

    def _make_handle(self, _key: Any, stream_ptr: int) -> tuple[ctypes.c_void_p, Any]:
        handle = ctypes.c_void_p()
        _status(self.lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        entry = (handle, self.cp.empty(HANDLE_WORKSPACE_BYTES, dtype=self.cp.uint8))
        self._bind(entry, stream_ptr)
        return entry

    def _bind(self, entry: tuple[ctypes.c_void_p, Any], stream_ptr: int) -> None:
        handle, workspace = entry
        # Setting the stream resets the handle's workspace to cuBLAS's own pool: stream first.
        _status(self.lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
        _status(self.lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace.data.ptr),
                                               HANDLE_WORKSPACE_BYTES), "cublasSetWorkspace")

    def __call__(self, step: LibraryGemm | LibraryComplexGemm, buffers: dict[str, Any], stream: Any) -> None:
        """Run one step on the buffers it names (float32 device arrays), on the given (CuPy) stream."""
        ptr = pointers(self.cp, step, {name: step.FLOATS * getattr(step, name).offset for name in "abc"}, buffers)
        lib, handle = self.lib, self._handle(stream)
        # Complex steps name their compute type instead (below); their math mode stays the default.
        tf32_math = isinstance(step, LibraryGemm) and step.tf32
        _status(lib.cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH if tf32_math else CUBLAS_DEFAULT_MATH),
                "cublasSetMathMode")
        # Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B goes first, and a row-major
        # matrix stored as op(X) is op(X)^T to cuBLAS (STORED_OPS).
        a, b, c = step.a, step.b, step.c
        op_b, op_a = STORED_OPS[step.stored_op("b")], STORED_OPS[step.stored_op("a")]
        if isinstance(step, LibraryComplexGemm):
            _status(lib.cublasGemmStridedBatchedEx(
                handle, op_b, op_a, step.n, step.m, step.k, self._cone,
                ctypes.c_void_p(ptr["b"]), CUDA_C_32F, b.ld, b.batch_stride,
                ctypes.c_void_p(ptr["a"]), CUDA_C_32F, a.ld, a.batch_stride,
                self._cone if step.accumulate else self._czero,
                ctypes.c_void_p(ptr["c"]), CUDA_C_32F, c.ld, c.batch_stride, step.batch,
                CUBLAS_COMPUTE_32F_FAST_TF32 if step.tf32 else CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), step.kernel)
            return
        _status(lib.cublasSgemmStridedBatched(
            handle, op_b, op_a, step.n, step.m, step.k, ctypes.byref(self._one),
            ctypes.c_void_p(ptr["b"]), b.ld, b.batch_stride,
            ctypes.c_void_p(ptr["a"]), a.ld, a.batch_stride,
            ctypes.byref(self._one if step.accumulate else self._zero),
            ctypes.c_void_p(ptr["c"]), c.ld, c.batch_stride, step.batch), step.kernel)

    # release_all is bound at definition: at interpreter exit this module's globals may be None.
    def __del__(self, _release_all: Any = release_all) -> None:
        handles = getattr(self, "_handles", None)
        _release_all(self.lib.cublasDestroy_v2, (handle for handle, _ in (handles.values() if handles else ())))


def gemm_engine(cp: Any) -> CublasGemm:
    """The process's cuBLAS GEMM steps for the current device."""
    return device_engine(cp, CublasGemm)
