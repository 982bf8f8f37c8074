"""One kernel of a plan under Nsight Compute (`ncu`), read back as the few figures that say what
bounds it: its time and clock, the SM's and the memory system's throughput at each level, the
busiest pipe, how many warps were ready to issue, and what capped the occupancy.

scripts/profile_plan.py --ncu KERNEL runs itself again under ncu for each config and prints this
summary under the config's step times. The sections asked for are ncu's own (SpeedOfLight,
ComputeWorkloadAnalysis, MemoryWorkloadAnalysis, SchedulerStats, WarpStateStats, Occupancy); the
summary is read from their text report, so a metric ncu leaves out (another GPU, another ncu) is
shown as missing, not guessed.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autocnn.errors import DeviceError

SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "SchedulerStats",
            "WarpStateStats", "Occupancy")
# Where CUDA installs ncu, after PATH.
NCU_PLACES = ("/usr/local/cuda/bin/ncu",)

_SECTION = re.compile(r"^\s*Section: (?P<name>.+?)\s*$")
# the rule's words: one space between a pipe's words, more before them (after "INF")
_BUSIEST = re.compile(r"(?P<pipe>[A-Za-z][\w/]*(?: [\w/]+)*) is the highest-utilized pipeline \((?P<pct>[\d.]+)%\)")
_TIME_UNITS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


class NcuMissingError(DeviceError):
    """Nsight Compute is not installed where it was looked for (a tool of the GPU host's, so its
    absence is the device's failure class)."""


def find_ncu(given: str | None = None) -> str:
    """The ncu executable: the path given, else ncu on PATH, else CUDA's own place; an error naming
    every place looked at when none is there."""
    places = [given] if given else [shutil.which("ncu"), *NCU_PLACES]
    for place in places:
        if place and Path(place).is_file() and os.access(place, os.X_OK):
            return place
    looked = given if given else "PATH, " + ", ".join(NCU_PLACES)
    raise NcuMissingError(f"Nsight Compute (ncu) was not found (looked in {looked}); install it or name it with --ncu-path")


def ncu_command(ncu: str, kernel: str, program: list[str]) -> list[str]:
    """ncu profiling the first launch of the kernel named exactly ``kernel`` in ``program``."""
    sections = [arg for name in SECTIONS for arg in ("--section", name)]
    return [ncu, "--kernel-name", f"regex:^{re.escape(kernel)}$", "--launch-count", "1", *sections, *program]


def parse_sections(text: str) -> dict[str, dict[str, tuple[str, float]]]:
    """Each section's metric rows, {section: {metric: (unit, value)}}; rows whose value is not a
    number ("no data") are left out."""
    out: dict[str, dict[str, tuple[str, float]]] = {}
    current = None
    for line in text.splitlines():
        heading = _SECTION.match(line)
        if heading:
            current = out.setdefault(heading.group("name"), {})
            continue
        if current is None or not line.startswith("    ") or line.strip().startswith(("-", "Metric Name")):
            continue
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) not in (2, 3) or line.startswith("          "):   # folded rule text is indented further
            continue
        name, unit, value = (parts[0], "", parts[1]) if len(parts) == 2 else parts
        try:
            current[name] = (unit, float(value.replace(",", "")))
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class NsightSummary:
    """What one profiled launch says of itself; None where the report holds no such figure."""
    kernel: str
    duration_us: float | None
    sm_ghz: float | None
    sm_pct: float | None
    memory_pct: float | None
    l1_pct: float | None
    l2_pct: float | None
    dram_pct: float | None
    busiest_pipe: str | None
    busiest_pipe_pct: float | None
    issue_busy_pct: float | None
    eligible_warps: float | None
    active_warps: float | None
    occupancy_pct: float | None
    theoretical_occupancy_pct: float | None
    block_limits: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The summary as three lines of text."""
        def pct(v):
            return "?" if v is None else f"{v:.1f}%"

        def num(v, fmt="{:.2f}"):
            return "?" if v is None else fmt.format(v)

        limits = ", ".join(f"{k} {v:g}" for k, v in self.block_limits.items())
        return [
            f"ncu {self.kernel}: {num(self.duration_us, '{:.1f}')} us at SM {num(self.sm_ghz)} GHz (the profiler's "
            f"clocks); SM {pct(self.sm_pct)}, memory {pct(self.memory_pct)} (L1/shared {pct(self.l1_pct)}, "
            f"L2 {pct(self.l2_pct)}, DRAM {pct(self.dram_pct)})",
            f"busiest pipe {self.busiest_pipe or '?'} {pct(self.busiest_pipe_pct)}; issue slots busy "
            f"{pct(self.issue_busy_pct)}; {num(self.eligible_warps)} eligible of {num(self.active_warps)} active "
            "warps a scheduler",
            f"occupancy {pct(self.occupancy_pct)} of a theoretical {pct(self.theoretical_occupancy_pct)}"
            + (f" (blocks a SM by {limits})" if limits else ""),
        ]

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(text: str, kernel: str) -> NsightSummary:
    """The summary of ncu's text report of one launch (ncu_command's sections); an error when the
    report holds no profiled launch (the kernel never ran, or ncu failed)."""
    sections = parse_sections(text)
    if "GPU Speed Of Light Throughput" not in sections:
        tail = "\n".join(text.strip().splitlines()[-5:])
        raise DeviceError(f"ncu profiled no launch of {kernel}; its output ended with:\n{tail}")

    def get(section, metric):
        row = sections.get(section, {}).get(metric)
        return None if row is None else row[1]

    sol = "GPU Speed Of Light Throughput"
    duration = sections[sol].get("Duration")
    scale = None if duration is None else _TIME_UNITS.get(duration[0])   # a unit not known: no figure
    duration_us = None if scale is None else duration[1] * scale
    busiest = _BUSIEST.search(text)
    occupancy = sections.get("Occupancy", {})
    limits = {name.removeprefix("Block Limit ").lower(): value for name, (_, value) in occupancy.items()
              if name.startswith("Block Limit ") and name not in ("Block Limit SM", "Block Limit Barriers")}
    return NsightSummary(
        kernel=kernel, duration_us=duration_us, sm_ghz=get(sol, "SM Frequency"), sm_pct=get(sol, "Compute (SM) Throughput"),
        memory_pct=get(sol, "Memory Throughput"), l1_pct=get(sol, "L1/TEX Cache Throughput"),
        l2_pct=get(sol, "L2 Cache Throughput"), dram_pct=get(sol, "DRAM Throughput"),
        busiest_pipe=busiest.group("pipe").strip() if busiest else None,
        busiest_pipe_pct=float(busiest.group("pct")) if busiest else None,
        issue_busy_pct=get("Compute Workload Analysis", "Issue Slots Busy"),
        eligible_warps=get("Scheduler Statistics", "Eligible Warps Per Scheduler"),
        active_warps=get("Scheduler Statistics", "Active Warps Per Scheduler"),
        occupancy_pct=get("Occupancy", "Achieved Occupancy"),
        theoretical_occupancy_pct=get("Occupancy", "Theoretical Occupancy"),
        block_limits=limits)
