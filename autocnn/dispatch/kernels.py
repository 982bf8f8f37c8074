"""The kernels of one GPU: each problem looked up, tuned where the autotune mode asks, planned,
compiled and loaded once, then launched on named buffers.

``GpuKernels.prepare`` is the one path from a problem to a runnable kernel that the training
library's cuda backend (autocnn.nn.cuda_backend) and the PyTorch front end (autocnn.torch.launch)
share: the tuning database's lookup (exact record, same architecture, nearest tuned shape, or the
heuristic default; autocnn.store.lookup), quick or full tuning of a problem no record covers
(``Autotuner``, autocnn.dispatch.quick), the plan of the chosen config, its compilation through
NVRTC and loading (autocnn.kernels.runtime), and its workspaces reserved in its operation's
shared buffer (autocnn.dispatch.workspace_arena), so that a launch allocates nothing.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Sequence

from autocnn.dispatch.quick import QUICK_BUDGET_S, Autotuner, autotune_mode
from autocnn.dispatch.workspace_arena import WorkspaceArenas

# What the training library and the PyTorch front end say about where a kernel's config came from.
SOURCE_LABELS = {
    "exact": "tuned",
    "same_arch": "tuned on another GPU of this architecture",
    "nearest_shape": "tuned config of the nearest shape",
    "default": "heuristic default (not tuned)",
    "quick": "quick-tuned",
    "full": "tuned",
}


@dataclass(frozen=True)
class KernelDispatch:
    """Which implementation a backend will run for one kernel problem.

    ``source`` is a short category ("numpy reference (CPU)", "tuned", "default config", ...);
    ``detail`` says more (the function, the tuned config, the database record).
    """

    problem: Any
    source: str
    detail: str = ""


class GpuKernels:
    """The loaded kernel of every problem prepared on one GPU, with their shared workspaces.

    ``autotune``: what ``prepare`` does for a problem that no record of this problem covers (the
    lookup borrowed a nearest shape's config or fell back to the default): "quick", "full" or
    "off" (autocnn.dispatch.quick); None reads $AUTOCNN_AUTOTUNE, else "quick". It applies to the
    problems prepared after it is set. ``quick_budget_s``: quick tuning's budget per problem.
    """

    def __init__(self, cp: Any, device_id: int, device: Any, database: Any, autotune: str | None = None):
        from autocnn.kernels.runtime import KernelLoader

        self.autotune = autotune
        self.cp = cp
        self.device_id = device_id
        self.device = device
        self.db = database
        self.quick_budget_s = QUICK_BUDGET_S
        self.loader = KernelLoader()
        self.plans: dict[Any, Any] = {}          # problem -> LoadedPlan
        self.dispatch: dict[Any, KernelDispatch] = {}
        # Scratch memory, allocated when plans are prepared: one buffer per operation (workspace_arena).
        self.workspaces = WorkspaceArenas(cp)
        # Launches of generated kernels per op: the tests compare it with a backend's kernel_calls.
        self.generated_launches: collections.Counter[str] = collections.Counter()

    @property
    def autotune(self) -> str:
        return self._autotune

    @autotune.setter
    def autotune(self, value: str | None) -> None:
        self._autotune = autotune_mode(value)

    def prepare(self, problems: Sequence[Any]) -> list[KernelDispatch]:
        """Look up (and tune, by the mode), plan, compile and load each problem not prepared yet;
        one KernelDispatch per problem, in order."""
        from autocnn.kernels import get_operation

        out = []
        # The measuring worker starts only when some problem is tuned, and stops when all are ready.
        tuner = Autotuner(self.autotune, self.db, self.device, self.measurement_source, self.quick_budget_s)
        try:
            for problem in problems:
                if problem not in self.plans:
                    chosen = tuner.choose(problem)
                    plan = get_operation(problem.op).plan(problem, chosen.config)
                    loaded = self.loader.load(plan)
                    self.plans[problem] = loaded
                    self.workspaces.reserve(problem, problem.op, loaded.plan.workspaces)
                    self.dispatch[problem] = KernelDispatch(problem, SOURCE_LABELS.get(chosen.source, chosen.source),
                                                            f"{chosen.config} ({chosen.detail})")
                out.append(self.dispatch[problem])
        finally:
            tuner.close()
        return out

    def measurement_source(self) -> Any:
        from autocnn.measurement.sources import GpuSource

        return GpuSource(self.device_id)

    def forget(self, problems: Sequence[Any]) -> None:
        """Drop the kernels chosen for these problems (after tuning, so the next prepare looks again)."""
        for problem in problems:
            self.plans.pop(problem, None)
            self.workspaces.forget(problem)
            self.dispatch.pop(problem, None)

    def run(self, problem: Any, buffers: dict[str, Any], prezeroed: frozenset[str] = frozenset()) -> None:
        """Launch ``problem``'s kernel on the current stream over named buffers (the plan's inputs
        and outputs, an optional one as None); ``prezeroed``: outputs already cleared, which the
        plan need not zero. A problem not prepared yet is prepared first."""
        loaded = self.plans.get(problem)
        if loaded is None:
            # A problem the model did not announce at build time (e.g. an ad-hoc call).
            self.prepare([problem])
            loaded = self.plans[problem]
        for name, array in buffers.items():
            if array is not None and not array.flags.c_contiguous:
                raise ValueError(f"{problem.op}: {name} must be C-contiguous for a generated kernel")
        loaded({**buffers, **self.workspaces.views(problem)}, skip_zero=prezeroed)
        self.generated_launches[problem.op] += 1
