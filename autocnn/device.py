"""What identifies a GPU, and the limits that make a config feasible on it.

Static feasibility needs only ``DeviceLimits``, which exist for an architecture without a GPU
(CI checks configs for sm_80 and sm_90 with nvcc); ``DeviceInfo`` is read off a real device and
goes into every tuning record's key.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceLimits:
    arch: str                      # "sm_90": what nvcc targets and ptxas reports for
    max_threads_per_block: int = 1024
    max_smem_per_block: int = 48 * 1024   # the opt-in limit for dynamic shared memory
    smem_per_sm: int = 100 * 1024
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    sm_count: int = 1

    @staticmethod
    def for_arch(arch: str) -> "DeviceLimits":
        try:
            return _KNOWN_ARCHES[arch]
        except KeyError:
            raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(_KNOWN_ARCHES)}") from None


# Figures from NVIDIA's CUDA programming guide (compute capability tables).
_KNOWN_ARCHES = {
    "sm_80": DeviceLimits("sm_80", max_smem_per_block=163 * 1024, smem_per_sm=164 * 1024, sm_count=108),
    "sm_86": DeviceLimits("sm_86", max_smem_per_block=99 * 1024, smem_per_sm=100 * 1024, sm_count=84),
    "sm_89": DeviceLimits("sm_89", max_smem_per_block=99 * 1024, smem_per_sm=100 * 1024, sm_count=128),
    "sm_90": DeviceLimits("sm_90", max_smem_per_block=227 * 1024, smem_per_sm=228 * 1024, sm_count=132),
}


@dataclass(frozen=True)
class DeviceInfo:
    """Everything about a GPU that makes a timing true; part of every tuning record's key."""

    name: str
    compute_capability: str      # "9.0"
    sm_count: int
    cuda_runtime: int            # e.g. 13000
    driver: int                  # e.g. 13000
    l2_bytes: int = 0
    max_smem_per_block: int = 48 * 1024
    smem_per_sm: int = 100 * 1024
    regs_per_sm: int = 65536

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability.split(".")
        return f"sm_{major}{minor}"

    def limits(self) -> DeviceLimits:
        return DeviceLimits(self.arch, max_threads_per_block=1024,
                            max_smem_per_block=self.max_smem_per_block, smem_per_sm=self.smem_per_sm,
                            regs_per_sm=self.regs_per_sm, sm_count=self.sm_count)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "DeviceInfo":
        return DeviceInfo(**data)

    def slug(self) -> str:
        """A file-name-safe identifier of the GPU kind, e.g. ``nvidia-h100-80gb-hbm3_sm90``."""
        safe = "".join(ch if ch.isalnum() else "-" for ch in self.name.lower()).strip("-")
        while "--" in safe:
            safe = safe.replace("--", "-")
        return f"{safe}_{self.arch.replace('_', '')}"


def current_device(device_id: int = 0) -> DeviceInfo:
    """Read the identity of a CUDA device through CuPy (raises DeviceError without one)."""
    from autocnn.gpu import require_cupy

    cp = require_cupy()
    with cp.cuda.Device(device_id) as dev:
        props = cp.cuda.runtime.getDeviceProperties(device_id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        attrs = dev.attributes
        return DeviceInfo(
            name=name,
            compute_capability=f"{props['major']}.{props['minor']}",
            sm_count=int(props["multiProcessorCount"]),
            cuda_runtime=int(cp.cuda.runtime.runtimeGetVersion()),
            driver=int(cp.cuda.runtime.driverGetVersion()),
            l2_bytes=int(props.get("l2CacheSize", 0)),
            max_smem_per_block=int(attrs.get("MaxSharedMemoryPerBlockOptin", 48 * 1024)),
            smem_per_sm=int(attrs.get("MaxSharedMemoryPerMultiprocessor", 100 * 1024)),
            regs_per_sm=int(attrs.get("MaxRegistersPerMultiprocessor", 65536)),
        )
