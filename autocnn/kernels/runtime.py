"""Loading compiled kernel plans and running them on the current CUDA device (through CuPy): the
generated kernels' launches, and the library GEMMs between them (kernels/cublas_gemm.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping

import numpy as np

from autocnn.errors import CompileError, DeviceError, LaunchError
from autocnn.gpu import require_cupy
from autocnn.kernels.compiler import NvrtcCompiler
from autocnn.kernels.plan import KernelPlan
from autocnn.kernels.steps import WORKSPACE_ELEMENT, LibraryComplexGemm, LibraryFft, LibraryGemm

# Shared memory a block may use without opting in to more (CUDA's static limit).
DEFAULT_DYNAMIC_SMEM = 48 * 1024

# CUresult codes of a launch the driver refused before running it (more registers, threads or shared
# memory than the device gives a block): the context stays usable and the config alone is at fault.
# Every other code of a failed launch is a device error. Told by CuPy's CUDADriverError.status, not
# by its message.
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701
REFUSED_LAUNCH_STATUSES = frozenset({CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES})


class LoadedPlan:
    """A KernelPlan whose kernels are loaded; calling it runs every launch in order."""

    def __init__(self, plan: KernelPlan, module: Any):
        self.cp = require_cupy()
        self.plan = plan
        self.functions: dict[str, Any] = {}
        for name in plan.kernel_names:
            try:
                fn = module.get_function(name)
            except Exception as exc:  # CuPy raises CUDADriverError / CompileException
                raise CompileError(f"kernel {name} is not in the compiled module: {exc}") from exc
            need = max(l.shared_bytes for l in plan.launches if l.kernel == name)
            # The 48 KB a block gets without opting in hold its static shared memory too (the tma
            # kernel's mbarriers): 48 KB of dynamic memory beside them is refused unless raised.
            if need + fn.shared_size_bytes > DEFAULT_DYNAMIC_SMEM:
                try:
                    fn.max_dynamic_shared_size_bytes = need
                except Exception as exc:
                    raise LaunchError(f"{name}: cannot raise dynamic shared memory to {need} bytes: {exc}") from exc
            self.functions[name] = fn
        # Absent optional buffers (no bias, no workspace) are passed as this one-float placeholder.
        self._placeholder = self.cp.zeros(1, dtype=self.cp.float32)
        self._gemm = self._fft = None
        self._maps: Any = None   # a TensorMapLauncher, made at the first launch that reads through TMA
        if plan.library_gemms or plan.library_complex_gemms:
            from autocnn.kernels.cublas_gemm import gemm_engine

            self._gemm = gemm_engine(self.cp)
        if plan.library_ffts:
            from autocnn.kernels.cufft_steps import fft_engine

            self._fft = fft_engine(self.cp)
        self.prepare_stream(self.cp.cuda.get_current_stream())

    def prepare_stream(self, stream: Any) -> None:
        """Ready the plan's library steps (cuBLAS handles, cuFFT plans) for ``stream``: before a
        CUDA graph captures on it, they cannot be made."""
        if self._gemm is not None:
            self._gemm.prepare(stream)
        if self._fft is not None:
            self._fft.prepare(stream, self.plan.library_ffts)

    def workspaces(self) -> dict[str, Any]:
        return {name: self.cp.empty(max(1, n), dtype=WORKSPACE_ELEMENT.name) for name, n in self.plan.workspaces}

    def __call__(self, buffers: Mapping[str, Any], stream: Any = None, skip_zero: Collection[str] = ()) -> None:
        """Run the plan; ``skip_zero`` names outputs the caller has already zeroed (on this stream's
        way here), which the plan would otherwise clear before its kernels."""
        cp = self.cp
        for name in self.plan.zero_first:
            if name in skip_zero:
                continue
            buf = buffers.get(name)
            if buf is not None:
                cp.cuda.runtime.memsetAsync(buf.data.ptr, 0, buf.nbytes,
                                            (stream or cp.cuda.get_current_stream()).ptr)
        for launch in self.plan.steps:
            self.run_step(launch, buffers, stream)

    def run_step(self, launch: Any, buffers: Mapping[str, Any], stream: Any = None) -> None:
        """One step of the plan (a kernel launch or a library GEMM or FFT): the plan runs them in
        order; a profiler may time one alone (scripts/profile_plan.py)."""
        cp = self.cp
        if isinstance(launch, (LibraryGemm, LibraryComplexGemm)):
            self._gemm(launch, buffers, stream or cp.cuda.get_current_stream())
            return
        if isinstance(launch, LibraryFft):
            self._fft(launch, buffers, stream or cp.cuda.get_current_stream())
            return
        args = tuple(buffers.get(a) if buffers.get(a) is not None else self._placeholder for a in launch.args)
        if launch.tensor_maps or launch.programmatic:   # launches CuPy's launcher cannot make
            self._launch_with_maps(launch, args, buffers, stream)
            return
        args += tuple(np.int32(v) for v in launch.scalars)
        try:
            self.functions[launch.kernel](launch.grid, launch.block, args,
                                          shared_mem=launch.shared_bytes, stream=stream)
        except cp.cuda.driver.CUDADriverError as exc:
            if getattr(exc, "status", None) in REFUSED_LAUNCH_STATUSES:
                raise LaunchError(f"{launch.kernel} launch refused: {exc}") from exc
            raise DeviceError(f"{launch.kernel}: {exc}") from exc


    def _launch_with_maps(self, launch: Any, args: tuple, buffers: Mapping[str, Any], stream: Any) -> None:
        """A launch whose kernel reads through TMA tensor maps (kernels/tensor_maps.py), passed by value
        ahead of its buffers, or that is launched as a programmatic dependent of the previous one."""
        if self._maps is None:
            from autocnn.kernels.tensor_maps import TensorMapLauncher

            self._maps = TensorMapLauncher()
        bases = {}
        for spec in launch.tensor_maps:
            buf = buffers.get(spec.buffer)
            if buf is None:
                raise LaunchError(f"{launch.kernel}: its tensor map reads {spec.buffer}, which the call does not pass")
            bases[spec.buffer] = buf.data.ptr
        s = stream or self.cp.cuda.get_current_stream()
        status = self._maps.launch(self.functions[launch.kernel], launch, [a.data.ptr for a in args], launch.scalars,
                                   s.ptr, bases)
        if status in REFUSED_LAUNCH_STATUSES:
            raise LaunchError(f"{launch.kernel} launch refused (CUresult {status})")
        if status != 0:
            raise DeviceError(f"{launch.kernel}: cuLaunchKernel failed (CUresult {status})")


class KernelLoader:
    """Turns plans into loaded kernels: from an nvcc cubin when one is given, else through NVRTC."""

    def __init__(self) -> None:
        self.cp = require_cupy()
        self._nvrtc: NvrtcCompiler | None = None
        self._cubins: dict[str, Any] = {}

    def load(self, plan: KernelPlan, cubin_path: str | None = None) -> LoadedPlan:
        if cubin_path is not None:
            module = self._cubins.get(cubin_path)
            if module is None:
                try:
                    module = self.cp.RawModule(path=cubin_path)
                except Exception as exc:
                    raise CompileError(f"cannot load {cubin_path}: {exc}", config=plan.config) from exc
                self._cubins[cubin_path] = module
        else:
            if self._nvrtc is None:
                self._nvrtc = NvrtcCompiler()
            arch = None
            if plan.target_suffix:   # an architecture-specific target: this device's (sm_90 -> sm_90a)
                arch = plan.compile_arch(f"sm_{self.cp.cuda.Device().compute_capability}")
            module = self._nvrtc.load(plan.source, config=plan.config, arch=arch)
        return LoadedPlan(plan, module)


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple[int, ...]


def output_specs(plan: KernelPlan) -> list[BufferSpec]:
    from autocnn.kernels import reference

    shapes = reference.output_shapes(plan.problem)
    return [BufferSpec(name, tuple(shape)) for name, shape in shapes.items()]
