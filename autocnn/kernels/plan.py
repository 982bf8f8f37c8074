"""The plan that turns (problem, config) into launches, and the digest of the code it runs.

A KernelPlan is everything a runtime needs: CUDA source, kernels in launch order with grid/block/
shared memory and argument names, the library steps between them, buffers to zero first, and
scratch workspaces. Its code digest says whether two plans run the same code the same way.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

from autocnn.kernels.space import Config
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch, LibraryComplexGemm, LibraryFft, LibraryGemm, Step

# Bumped when what code_digest hashes, or how, changes (every stored plan digest is then stale).
CODE_DIGEST_VERSION = 1
# Lines of the rendered source that name the config and the template fingerprint
# (templates/_common.cuh.j2) rather than say what the code does.
_HEADER_PREFIXES = ("// config: ", "// Do not edit: rendered from")


def code_text(source: str) -> str:
    """The rendered source without its header lines naming the config and the fingerprint.

    They are left out of the code digest because they change whenever a parameter is added to a
    formulation (the config text gains it) or any template of it is edited (the fingerprint), even
    where the code they describe stays the same; every other line, comments included, is kept."""
    return "".join(line for line in source.splitlines(keepends=True) if not line.startswith(_HEADER_PREFIXES))


@dataclass(frozen=True)
class KernelPlan:
    op: str
    problem: Any
    config: Config
    source: str
    fingerprint: str
    launches: tuple[Launch, ...]     # the generated kernels' launches, in order
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    zero_first: tuple[str, ...] = ()
    workspaces: tuple[tuple[str, int], ...] = ()   # (name, float32 elements)
    steps: tuple[Step, ...] = ()     # all the plan runs, in order: its launches and library GEMMs between them
    # "a": compiled for the architecture-specific target (sm_90 -> sm_90a), whose instructions
    # (wgmma) run on that architecture only; "" for the portable target.
    target_suffix: str = ""

    def __post_init__(self) -> None:
        # A formulation's launches() is the whole sequence (Operation.plan passes it as
        # ``launches``): it becomes the steps, and ``launches`` keeps the generated kernels' only,
        # which is what everything that inspects kernels (resources, block sizes) means by it.
        if not self.steps:
            object.__setattr__(self, "steps", tuple(self.launches))
        object.__setattr__(self, "launches", tuple(s for s in self.launches if isinstance(s, Launch)))

    def compile_arch(self, arch: str) -> str:
        """The compiler's target for a device of architecture ``arch`` (e.g. sm_90 -> sm_90a)."""
        return arch + self.target_suffix

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """The generated kernels the plan launches (library GEMMs are not in its source)."""
        seen: list[str] = []
        for launch in self.launches:
            if launch.kernel not in seen:
                seen.append(launch.kernel)
        return tuple(seen)

    @property
    def library_gemms(self) -> tuple[LibraryGemm, ...]:
        return tuple(step for step in self.steps if isinstance(step, LibraryGemm))

    @property
    def library_complex_gemms(self) -> tuple[LibraryComplexGemm, ...]:
        return tuple(step for step in self.steps if isinstance(step, LibraryComplexGemm))

    @property
    def library_ffts(self) -> tuple[LibraryFft, ...]:
        return tuple(step for step in self.steps if isinstance(step, LibraryFft))

    @property
    def workspace_bytes(self) -> int:
        """Device memory the plan needs besides its inputs and outputs."""
        return WORKSPACE_ELEMENT.size * sum(n for _, n in self.workspaces)

    @property
    def max_shared_bytes(self) -> int:
        return max((launch.shared_bytes for launch in self.launches), default=0)

    @functools.cached_property
    def code_digest(self) -> str:
        """A hash of everything the plan runs: its source (``code_text``: without the header
        lines naming the config and the fingerprint), every step as launched (kernel, grid, block,
        shared memory, arguments; library calls with their operands), its inputs, outputs, buffers
        zeroed first and workspaces. Equal digests mean the same kernels launched the same way, so
        a record whose digest equals its config's plan's now measured the code that would run
        (``autocnn.store.records.validate_record``). Not the config nor the fingerprint: both change
        where the code does not."""
        h = hashlib.sha256()
        h.update(f"code-digest:{CODE_DIGEST_VERSION}\n".encode())
        h.update(code_text(self.source).encode())
        for part in (self.steps, self.inputs, self.outputs, self.zero_first, self.workspaces):
            h.update(b"\0")
            h.update(repr(part).encode())
        maps = [(i, step.tensor_maps) for i, step in enumerate(self.steps) if getattr(step, "tensor_maps", ())]
        if maps:
            h.update(b"\0")
            h.update(repr(maps).encode())
        early = [i for i, step in enumerate(self.steps) if getattr(step, "programmatic", False)]
        if early:
            h.update(b"\0programmatic")
            h.update(repr(early).encode())
        return h.hexdigest()[:16]
