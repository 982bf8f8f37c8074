"""What identifies a GPU, and the limits that make a config feasible on it.

Static feasibility needs only ``DeviceLimits``, which exist for an architecture without a GPU
(CI checks configs for sm_80 and sm_90 with nvcc); ``DeviceInfo`` is read off a real device and
goes into every tuning record's key.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any

# The scratch memory one kernel plan may ask for (a two-pass weight gradient's partial sums, the
# unrolled or NHWC copies of an operand, FFT spectra), unless `--workspace-limit` or
# $AUTOCNN_WORKSPACE_LIMIT say otherwise. 256 MiB keeps every formulation available on the seed
# shapes and stays small beside a training run's activations on today's 24-141 GiB GPUs.
DEFAULT_WORKSPACE_BYTES = 256 * 1024 * 1024
WORKSPACE_LIMIT_ENV = "AUTOCNN_WORKSPACE_LIMIT"
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
               "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def parse_workspace_limit(text: Any, source: str = "--workspace-limit") -> int:
    """A workspace limit in bytes from e.g. "256MiB", "1GiB", "64M", "0" or 1048576 (bytes).

    0 allows no workspace: only formulations that need none remain. Raises ValueError naming
    ``source`` and the accepted forms."""
    if isinstance(text, bool):
        raise ValueError(f"{source}: {text!r} is not a size")
    if isinstance(text, int):
        value = text
    else:
        if str(text).strip().startswith("-"):
            raise ValueError(f"{source}: {text!r} is negative; give a size >= 0")
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise ValueError(f"{source}: {text!r} is not a size; give bytes or a number with a unit "
                             f"(KiB, MiB, GiB, or KB, MB, GB), e.g. 256MiB")
        value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value < 0:
        raise ValueError(f"{source}: {text!r} is negative; give a size >= 0")
    return value


def set_workspace_limit(size: Any) -> int:
    """Set this process's workspace limit (and its measuring workers', which inherit the
    environment) from a size as parse_workspace_limit takes it; returns the bytes. What the command
    line's --workspace-limit calls; in Python, call it before the first lookup or tuning."""
    value = parse_workspace_limit(size)
    os.environ[WORKSPACE_LIMIT_ENV] = str(value)
    return value


def workspace_limit() -> int:
    """This process's workspace limit in bytes: $AUTOCNN_WORKSPACE_LIMIT, else the default. The
    command line's --workspace-limit sets the variable, so measuring workers inherit it."""
    text = os.environ.get(WORKSPACE_LIMIT_ENV, "").strip()
    return DEFAULT_WORKSPACE_BYTES if not text else parse_workspace_limit(text, f"${WORKSPACE_LIMIT_ENV}")


@dataclass(frozen=True)
class DeviceLimits:
    arch: str                      # "sm_90": what nvcc targets and ptxas reports for
    max_threads_per_block: int = 1024
    max_smem_per_block: int = 48 * 1024   # the opt-in limit for dynamic shared memory
    smem_per_sm: int = 100 * 1024
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    sm_count: int = 1
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES   # the most scratch memory one kernel plan may use

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
class PeakRates:
    """What no kernel on a GPU can beat: its memory bandwidth and its dense TF32 tensor-core rate
    (the fastest arithmetic any of autocnn's kernels uses: fp32 problems run 3xTF32, tf32 ones one
    TF32 product). Datasheet figures, not measured ones (those are ``autocnn bench``'s ceilings): a
    floor under stored times (``store.evidence``), not a target."""

    copy_bytes_per_s: float
    tensor_flops_per_s: float
    source: str


# The fastest GPU of each architecture, from NVIDIA's datasheets (dense, without sparsity): sm_80
# A100 SXM 80GB, sm_86 RTX A6000 / 3090 Ti, sm_89 L40S / RTX 4090, sm_90 H200 (H100 SXM has its TF32
# rate and 3.35 TB/s), sm_100 B200, sm_120 RTX 5090. A GPU of an architecture not listed is held
# to the fastest figures of all, so that no real time falls under its floor.
_PEAK_RATES = {
    "sm_80": PeakRates(2.04e12, 156e12, "A100 SXM 80GB datasheet"),
    "sm_86": PeakRates(1.01e12, 80e12, "RTX A6000 / RTX 3090 Ti datasheets"),
    "sm_89": PeakRates(1.01e12, 183e12, "L40S / RTX 4090 datasheets"),
    "sm_90": PeakRates(4.8e12, 495e12, "H200 datasheet"),
    "sm_100": PeakRates(8.0e12, 1.2e15, "B200 datasheet"),
    "sm_120": PeakRates(1.8e12, 105e12, "RTX 5090 datasheet"),
}
_FASTEST = PeakRates(max(r.copy_bytes_per_s for r in _PEAK_RATES.values()),
                     max(r.tensor_flops_per_s for r in _PEAK_RATES.values()), "the fastest GPU listed")


def peak_rates(arch: str) -> PeakRates:
    """The ceilings of the fastest GPU of an architecture ("sm_90"); the fastest of all for one
    not listed."""
    return _PEAK_RATES.get(arch, _FASTEST)


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

    def limits(self, workspace_bytes: int | None = None) -> DeviceLimits:
        """The device's limits, with the given workspace limit (None: this process's, workspace_limit())."""
        return DeviceLimits(self.arch, max_threads_per_block=1024,
                            max_smem_per_block=self.max_smem_per_block, smem_per_sm=self.smem_per_sm,
                            regs_per_sm=self.regs_per_sm, sm_count=self.sm_count,
                            workspace_bytes=workspace_limit() if workspace_bytes is None else workspace_bytes)

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
