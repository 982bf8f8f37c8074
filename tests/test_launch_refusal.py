"""A failed launch is classed by its CUresult status, not by its message: a refused launch (invalid
value, out of resources) is a LaunchError that leaves the tuner running; anything else a DeviceError."""
from types import SimpleNamespace

import numpy as np
import pytest

from autocnn.errors import DeviceError, FailureClass, LaunchError
from autocnn.kernels.runtime import (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, LoadedPlan)
from autocnn.kernels.steps import Launch


class FakeDriverError(RuntimeError):
    """Stands in for CuPy's CUDADriverError: a status, and a message that names some other error."""

    def __init__(self, status: int):
        self.status = status
        super().__init__("CUDA_ERROR_SOMETHING_ELSE: the text is not what classes the failure")


def loaded_plan_raising(status: int) -> LoadedPlan:
    def kernel(*_args, **_kwargs):
        raise FakeDriverError(status)

    plan = object.__new__(LoadedPlan)   # no device: only run_step's launch path is exercised
    plan.cp = SimpleNamespace(cuda=SimpleNamespace(driver=SimpleNamespace(CUDADriverError=FakeDriverError)))
    plan.functions = {"conv_fwd": kernel}
    plan._placeholder = np.zeros(1, dtype=np.float32)
    return plan


LAUNCH = Launch("conv_fwd", (1, 1, 1), (1024, 1, 1), 0, ("x",))


@pytest.mark.parametrize("status", [CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES])
def test_refused_launch_is_a_launch_error(status):
    with pytest.raises(LaunchError) as info:
        loaded_plan_raising(status).run_step(LAUNCH, {"x": np.zeros(4, dtype=np.float32)})
    assert info.value.failure_class is FailureClass.LAUNCH_ERROR
    assert "conv_fwd launch refused" in str(info.value)


@pytest.mark.parametrize("status", [700, 719, 999])   # illegal address, launch failure, unknown
def test_other_launch_failures_are_device_errors(status):
    with pytest.raises(DeviceError) as info:
        loaded_plan_raising(status).run_step(LAUNCH, {"x": np.zeros(4, dtype=np.float32)})
    assert info.value.failure_class is FailureClass.DEVICE_ERROR


@pytest.mark.gpu
def test_a_block_too_large_is_refused_and_the_context_still_runs():
    """On the GPU: the same launch with 2048 threads a block (more than any device allows) is refused by
    the driver as a LaunchError, and the plan then still runs and verifies in the same context."""
    import dataclasses

    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels import get_operation
    from autocnn.kernels.problem import parse_shape
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate, plan_buffers

    operation = get_operation("conv_fwd")
    problem = parse_shape("conv_fwd", "N=3,C=5,H=13,W=11,K=7,R=3,S=3,stride=1,pad=1")
    config = operation.default_config(problem, current_device(0).limits(), formulation="direct")
    loaded = KernelLoader().load(operation.plan(problem, config))
    launch = next(step for step in loaded.plan.steps if isinstance(step, Launch))
    _, _, buffers = plan_buffers(loaded, problem)
    with pytest.raises(LaunchError):
        loaded.run_step(dataclasses.replace(launch, block=(2048, 1, 1)), buffers)
    check = check_candidate(loaded, problem, time_it=False)
    assert check.verification.passed, check.verification.message
