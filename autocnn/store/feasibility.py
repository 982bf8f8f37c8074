"""Whether a config borrowed from another shape can run on a device: checked from ptxas's report
of its source (registers per block, shared memory, spills), before a lookup hands it out.

A config tuned for one shape is a point of this shape's search space only by its parameters; the
code it generates for this shape may need more registers than a multiprocessor holds for its
block, or spill. The report comes from ``kernels.compiler.ResourceReporter`` (nvcc, or NVRTC
through CuPy), cached by the source's hash, so a lookup compiles a borrowed config once per host.
"""
from __future__ import annotations

from typing import Any, Callable

from autocnn.device import DeviceInfo
from autocnn.errors import CompileError

# Why a plan cannot run on a device (empty: it can).
ResourceCheck = Callable[[Any, DeviceInfo], "list[str]"]


def ptxas_check(plan: Any, device: DeviceInfo) -> list[str]:
    """The reasons ``plan`` cannot run on ``device``, from its ptxas report; a config that cannot be
    checked (no compiler on this host) is not borrowed either."""
    from autocnn.kernels.compiler import CompiledModule, resource_reporter, resource_violations

    arch = plan.compile_arch(device.arch)
    reporter = resource_reporter(arch)
    if reporter is None:
        return [f"no compiler (nvcc, or NVRTC through CuPy) here to check its registers and spills on {arch}"]
    try:
        reports = reporter.reports(plan.source)
    except CompileError as exc:
        return [f"does not compile for {arch}: {exc}"]
    module = CompiledModule("", arch, "ptxas report", None, reports)
    return resource_violations(module, plan, device.regs_per_sm, device.max_smem_per_block)


def approve_all(plan: Any, device: DeviceInfo) -> list[str]:
    """No check: for callers that only read records (listings, reports), never to run a kernel."""
    return []
