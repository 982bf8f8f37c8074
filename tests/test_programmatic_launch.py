"""Programmatic dependent launches (Launch.programmatic, the tma formulation's PDL): made through
cuLaunchKernelEx with one launch attribute, whose ctypes structures must match cuda.h's byte for
byte; launches without it stay on cuLaunchKernel or CuPy's launcher. On the CPU the driver is a fake
that records what it is given (the GPU side runs in tests/test_tma.py's verification, and below: a
programmatic plan captured into a CUDA graph and replayed)."""
from __future__ import annotations

import ctypes
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.runtime import LoadedPlan
from autocnn.kernels.steps import Launch
from autocnn.kernels.tensor_maps import (_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, TensorMapLauncher,
                                         _LaunchAttribute, _LaunchConfig)
from tests.graph_capture import warm_up_then_capture


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed (its cuda.h is the reference)")
def test_the_launch_structures_match_cuda_h(tmp_path):
    source = tmp_path / "layout.cu"
    source.write_text(
        "#include <cuda.h>\n#include <stdio.h>\n#include <stddef.h>\n"
        "int main(void) { printf(\"%zu %zu %zu %zu %zu %zu %zu %d\\n\", sizeof(CUlaunchAttribute),"
        " offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, sharedMemBytes),"
        " offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),"
        " (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION); return 0; }\n")
    binary = tmp_path / "layout"
    subprocess.run([nvcc_path(), str(source), "-o", str(binary)], check=True, capture_output=True)
    expected = [int(v) for v in subprocess.run([str(binary)], check=True, capture_output=True,
                                               text=True).stdout.split()]
    ours = [ctypes.sizeof(_LaunchAttribute), _LaunchAttribute.value.offset, ctypes.sizeof(_LaunchConfig),
            _LaunchConfig.shared_bytes.offset, _LaunchConfig.stream.offset, _LaunchConfig.attrs.offset,
            _LaunchConfig.num_attrs.offset, _LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
    assert ours == expected


class RecordingDriver:
    """libcuda's two launch calls, recording their arguments (copied out of the ctypes structures)."""

    def __init__(self):
        self.calls = []

    def cuLaunchKernel(self, handle, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.calls.append(("cuLaunchKernel", handle.value, (gx, gy, gz), (bx, by, bz), smem, stream.value))
        return 0

    def cuLaunchKernelEx(self, config_ref, handle, params, extra):
        c = config_ref._obj
        attrs = [(c.attrs[i].id, c.attrs[i].value) for i in range(c.num_attrs)]
        self.calls.append(("cuLaunchKernelEx", handle.value, tuple(c.grid), tuple(c.block), c.shared_bytes,
                           c.stream, attrs))
        return 0


def launcher() -> tuple[TensorMapLauncher, RecordingDriver]:
    out = object.__new__(TensorMapLauncher)   # no driver library: the fake records the calls
    out._lib, out._maps = RecordingDriver(), {}
    return out, out._lib


def test_a_programmatic_launch_goes_through_cuLaunchKernelEx_with_its_one_attribute():
    maps, driver = launcher()
    function = SimpleNamespace(ptr=0x1234)
    early = Launch("conv_bwd_data", (98, 2, 1), (288, 1, 1), 113664, ("dx",), programmatic=True)
    assert maps.launch(function, early, [0x7000], [], 0x55, {}) == 0
    assert driver.calls == [("cuLaunchKernelEx", 0x1234, (98, 2, 1), (288, 1, 1), 113664, 0x55,
                             [(_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1)])]
    maps.launch(function, Launch("conv_bwd_data", (98, 2, 1), (288, 1, 1), 113664, ("dx",)), [0x7000], [], 0x55, {})
    assert driver.calls[1] == ("cuLaunchKernel", 0x1234, (98, 2, 1), (288, 1, 1), 113664, 0x55)


def test_the_runtime_hands_a_programmatic_launch_without_maps_to_the_driver_launcher():
    """CuPy's launcher cannot make a programmatic launch: the runtime routes it to the driver's."""
    maps, driver = launcher()
    cupy_calls = []
    plan = object.__new__(LoadedPlan)   # no device: only run_step's launch path is exercised
    plan.cp = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=0x99)))
    plan.functions = {"k": type("Fn", (), {"ptr": 0x42, "__call__": lambda self, *a, **k: cupy_calls.append(a)})()}
    plan._placeholder = SimpleNamespace(data=SimpleNamespace(ptr=0))
    plan._maps = maps
    buffer = SimpleNamespace(data=SimpleNamespace(ptr=0x7000))
    plan.run_step(Launch("k", (4, 1, 1), (128, 1, 1), 0, ("x",), programmatic=True), {"x": buffer})
    assert [c[0] for c in driver.calls] == ["cuLaunchKernelEx"] and driver.calls[0][5] == 0x99
    assert not cupy_calls
    plan.run_step(Launch("k", (4, 1, 1), (128, 1, 1), 0, ("x",)), {"x": np.zeros(4, dtype=np.float32)})
    assert len(cupy_calls) == 1 and len(driver.calls) == 1


@pytest.mark.gpu
def test_a_programmatic_plan_replays_from_a_cuda_graph():
    """The trainer captures its steps into CUDA graphs: a tma plan with PDL=1 (the staging, then the
    GEMM launched through cuLaunchKernelEx as its programmatic dependent) captured on a stream and
    replayed gives dX bit for bit as run directly, and that dX is within the FP32 bound of float64.
    The capture records the launches without running them (dX stays NaN until the replay)."""
    cp = pytest.importorskip("cupy")
    import dataclasses

    from autocnn.device import current_device
    from autocnn.kernels import OPERATIONS
    from autocnn.kernels.formulations.tma import FORMULATION_TMA
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.kernels.suite import seed_problems
    from autocnn.measurement.measure import check_candidate, plan_buffers

    device = current_device(0)
    if device.arch != "sm_90":
        pytest.skip(f"the tma formulation needs an sm_90 GPU, not {device.arch}")
    operation = OPERATIONS["conv_bwd_data"]
    problem = dataclasses.replace(dict(seed_problems("conv_bwd_data"))["modern_56"], N=3)
    space = operation.space(problem, device.limits())
    default = operation.default_config(problem, device.limits(), formulation=FORMULATION_TMA).as_dict()
    config = space.validate({**default, "A_TILES": "halo", "ASLOTS": 1, "STAGE_PIXELS": 64, "PDL": 1})
    loaded = KernelLoader().load(operation.plan(problem, config))
    assert [step.programmatic for step in loaded.plan.launches] == [False, True]
    assert check_candidate(loaded, problem, time_it=False).verification.passed
    _, outputs, buffers = plan_buffers(loaded, problem, seed=5)
    eager, graph, capture = warm_up_then_capture(cp, loaded, buffers, outputs["dx"])
    assert not bool(cp.isnan(eager).any())
    for _ in range(2):   # replayed twice: the second replay's GEMM again waits for its own staging
        outputs["dx"].fill(cp.nan)
        graph.launch(stream=capture)
        capture.synchronize()
        assert bool(cp.array_equal(outputs["dx"], eager))
