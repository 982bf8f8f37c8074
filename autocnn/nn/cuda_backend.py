"""The cuda backend: CuPy arrays, and every convolution and pooling run by a generated kernel.

``prepare`` (called when a model is built for a batch size) looks each kernel problem up in the
tuning database (exact record, same architecture, nearest tuned shape, or the heuristic default),
compiles it through NVRTC and allocates its workspaces, so the training step only launches.
"""
from __future__ import annotations

import collections
from typing import Any, ClassVar, Sequence

import numpy as np

from ..errors import DeviceError
from .backend import Backend, KernelDispatch

# What the training library says about where a kernel's config came from.
SOURCE_LABELS = {
    "exact": "tuned",
    "same_arch": "tuned on another GPU of this architecture",
    "nearest_shape": "tuned config of the nearest shape",
    "default": "heuristic default (not tuned)",
}


class CudaBackend(Backend):
    name: ClassVar[str] = "cuda"

    def __init__(self, dtype: Any = np.float32, device_id: int = 0, database: Any = None):
        from ..device import current_device
        from ..gpu import require_cupy
        from ..runtime import KernelLoader

        if np.dtype(dtype) != np.float32:
            raise ValueError(f"the cuda backend runs float32 kernels; dtype {np.dtype(dtype).name} is not "
                             f"supported (use the numpy backend for float64 gradient checks)")
        cp = require_cupy()
        cp.cuda.Device(device_id).use()
        super().__init__(cp, np.float32)
        self.cp = cp
        self.device = current_device(device_id)
        if database is None:
            from ..db import TuningDatabase

            database = TuningDatabase()
        self.db = database
        self.loader = KernelLoader()
        self._plans: dict[Any, Any] = {}
        self._workspaces: dict[Any, dict[str, Any]] = {}
        self._dispatch: dict[Any, KernelDispatch] = {}
        # Launches of generated kernels per op: the tests compare it with kernel_calls.
        self.generated_launches: collections.Counter[str] = collections.Counter()

    # -- memory ----------------------------------------------------------------------------------
    def to_numpy(self, a: Any) -> np.ndarray:
        return self.cp.asnumpy(a)

    def upload(self, host: np.ndarray, out: Any) -> Any:
        out.set(np.ascontiguousarray(host, dtype=out.dtype))
        return out

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    # -- kernels ---------------------------------------------------------------------------------
    def prepare(self, problems: Sequence[Any]) -> list[KernelDispatch]:
        from ..ops import get_operation

        out = []
        for problem in problems:
            if problem not in self._plans:
                found = self.db.lookup(self.device, problem)
                plan = get_operation(problem.op).plan(problem, found.config)
                loaded = self.loader.load(plan)
                self._plans[problem] = loaded
                self._workspaces[problem] = loaded.workspaces()
                label = SOURCE_LABELS.get(found.source, found.source)
                self._dispatch[problem] = KernelDispatch(problem, label, f"{found.config} ({found.detail})")
            out.append(self._dispatch[problem])
        return out

    def forget(self, problems: Sequence[Any]) -> None:
        """Drop the kernels chosen for these problems (after tuning, so the next prepare looks again)."""
        for problem in problems:
            self._plans.pop(problem, None)
            self._workspaces.pop(problem, None)
            self._dispatch.pop(problem, None)

    def _run(self, problem: Any, buffers: dict[str, Any]) -> None:
        loaded = self._plans.get(problem)
        if loaded is None:
            # A problem the model did not announce at build time (e.g. an ad-hoc call).
            self.prepare([problem])
            loaded = self._plans[problem]
        for name, array in buffers.items():
            if array is not None and not array.flags.c_contiguous:
                raise ValueError(f"{problem.op}: {name} must be C-contiguous for a generated kernel")
        loaded({**buffers, **self._workspaces[problem]})
        self.generated_launches[problem.op] += 1

    def _conv_fwd(self, problem, x, w, bias, out):
        self._run(problem, {"x": x, "w": w, "bias": bias, "y": out})

    def _conv_bwd_data(self, problem, dy, w, out):
        self._run(problem, {"dy": dy, "w": w, "dx": out})

    def _conv_wgrad(self, problem, x, dy, dw_out, db_out):
        self._run(problem, {"x": x, "dy": dy, "dw": dw_out, "db": db_out})

    def _avgpool_fwd(self, problem, x, out):
        self._run(problem, {"x": x, "y": out})

    def _avgpool_bwd(self, problem, dy, out):
        self._run(problem, {"dy": dy, "dx": out})


__all__ = ["CudaBackend", "DeviceError"]
