"""A failed launch is classed by its CUresult status, not by its message: a refused launch (invalid
value, out of resources) is a LaunchError that leaves the tuner running; anything else a DeviceError."""
from types import SimpleNamespace

import numpy as np
import pytest

from autocnn.errors import DeviceError, FailureClass, LaunchError
from autocnn.kernels.operation import Launch
from autocnn.kernels.runtime import (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, LoadedPlan)


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
