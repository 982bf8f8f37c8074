"""The numpy backend: training on the CPU, every kernel operation computed by the float64-checked
NumPy reference (``autocnn.kernels.reference``), the element-wise work by the generic code of
``Backend``.
"""
from __future__ import annotations

import importlib
from typing import Any, ClassVar, Sequence

import numpy as np

from autocnn.dispatch.kernels import KernelDispatch
from autocnn.nn.backend import Backend, KernelProblem
from autocnn.nn.blas import set_blas_threads

NUMPY_SOURCE = "numpy reference (CPU)"


class NumpyBackend(Backend):
    """The CPU backend: numpy arrays, the kernel operations computed by ``autocnn.kernels.reference``.

    float32 by default; float64 is allowed so that finite-difference gradient checks are exact
    enough (kernel problems still say float32: they describe the GPU kernels, which this
    backend does not use). A problem of a 16-bit precision (mixed precision, bf16 or fp16) is
    emulated: its tensors are arrays of this dtype holding 16-bit values, and every output is
    rounded to the 16-bit type as a kernel stores it (``Backend.round_to``).
    """

    name: ClassVar[str] = "numpy"
    DTYPES: ClassVar[tuple[str, ...]] = ("float32", "float64")

    def __init__(self, dtype: Any = np.float32, blas_threads: int | None = None):
        """``blas_threads``: set numpy's OpenBLAS to this many threads (process-wide; see
        autocnn.nn.blas for why 1 is often fastest on small VMs); None leaves it as it is."""
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is None or dt.name not in self.DTYPES:
            raise ValueError(f"NumpyBackend dtype must be float32 (training) or float64 (gradient "
                             f"checks); got {dtype!r}")
        super().__init__(np, dt)
        self._reference = None
        self.blas_threads = blas_threads
        if blas_threads is not None:
            set_blas_threads(blas_threads)

    @property
    def reference(self) -> Any:
        # Imported on first use so that importing autocnn.nn never depends on it.
        if self._reference is None:
            self._reference = importlib.import_module("autocnn.kernels.reference")
        return self._reference

    def prepare(self, problems: Sequence[KernelProblem]) -> list[KernelDispatch]:
        return [KernelDispatch(p, NUMPY_SOURCE, f"autocnn.kernels.reference.{p.op}") for p in problems]

    def _conv_fwd(self, problem, x, w, bias, out):
        out[...] = self.reference.conv_fwd(x, w, stride=problem.stride, padding=problem.padding,
                                           bias=bias, activation=problem.activation, groups=problem.groups,
                                           dilation=problem.dilation)

    def _conv_bwd_data(self, problem, dy, w, out):
        out[...] = self.reference.conv_bwd_data(dy, w, input_hw=(problem.H, problem.W),
                                                stride=problem.stride, padding=problem.padding,
                                                groups=problem.groups, dilation=problem.dilation)

    def _conv_wgrad(self, problem, x, dy, dw_out, db_out):
        dw, db = self.reference.conv_wgrad(x, dy, kernel_hw=(problem.R, problem.S), stride=problem.stride,
                                           padding=problem.padding, bias=problem.bias, groups=problem.groups,
                                           dilation=problem.dilation)
        dw_out[...] = dw
        if db_out is not None:
            db_out[...] = db

    def _avgpool_fwd(self, problem, x, out):
        out[...] = self.reference.avgpool_fwd(x, window=problem.window, stride=problem.stride,
                                              padding=problem.padding, count_pad=problem.count_pad)

    def _avgpool_bwd(self, problem, dy, out):
        out[...] = self.reference.avgpool_bwd(dy, input_hw=(problem.H, problem.W), window=problem.window,
                                              stride=problem.stride, padding=problem.padding,
                                              count_pad=problem.count_pad)
