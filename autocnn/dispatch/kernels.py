"""The kernels of one GPU: each problem looked up, tuned where the autotune mode asks, planned,
compiled and loaded once, then launched on named buffers.

``GpuKernels.prepare`` is the one path from a problem to a runnable kernel that the training
library's cuda backend (autocnn.nn.cuda_backend) and the PyTorch front end (autocnn.torch.launch)
share: the tuning database's lookup (exact record, same architecture, nearest tuned shape, or the
heuristic default; autocnn.store.lookup), quick or full tuning of a problem no record covers
(``Autotuner``, autocnn.dispatch.quick), the plan of the chosen config, its compilation through
NVRTC and loading (autocnn.kernels.runtime), and its workspaces reserved in its operation's
shared buffer (autocnn.dispatch.workspace_arena), so that a launch allocates nothing.

``prepare_all`` says what that cost: per problem, the seconds tuning and the seconds looking up,
planning and compiling, whether it was tuned now or left untuned by a spent TuningBudget; a
progress object hears of each problem as it starts and ends (autocnn.torch's progress line).
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from autocnn.dispatch.quick import QUICK_BUDGET_S, Autotuner, TuningBudget, autotune_mode
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


@dataclass(frozen=True)
class PreparedProblem:
    """What one ``prepare_all`` did for one problem."""

    dispatch: KernelDispatch
    source: str              # the choice's: a lookup source, or "quick" / "full" (a quick record found counts)
    prepared_now: bool       # False: it was ready before, and nothing was done
    tuned_now: bool          # measured by this prepare
    over_budget: bool        # tuning was due, but the TuningBudget was spent: the lookup's answer runs
    tune_s: float = 0.0      # starting the worker and measuring
    compile_s: float = 0.0   # the rest: looking up, planning, compiling and loading
    time_us: float | None = None   # its kernel's time on this GPU, where known (tuned now, or a record of it)

    @property
    def problem(self) -> Any:
        return self.dispatch.problem


@dataclass(frozen=True)
class PrepareOutcome:
    """One ``prepare_all``: a PreparedProblem per problem, in the order given."""

    problems: tuple[PreparedProblem, ...]

    @property
    def dispatch(self) -> list[KernelDispatch]:
        return [p.dispatch for p in self.problems]

    @property
    def tune_s(self) -> float:
        return sum(p.tune_s for p in self.problems)

    @property
    def compile_s(self) -> float:
        return sum(p.compile_s for p in self.problems)


class PrepareProgress(Protocol):
    """Told of each problem ``prepare_all`` prepares (``total``: those not ready before)."""

    def start(self, index: int, total: int, problem: Any) -> None: ...

    def done(self, index: int, total: int, prepared: PreparedProblem) -> None: ...


class GpuKernels:
    """The loaded kernel of every problem prepared on one GPU, with their shared workspaces.

    ``autotune``: what ``prepare`` does for a problem that no record of this problem covers (the
    lookup borrowed a nearest shape's config or fell back to the default): "quick", "full" or
    "off" (autocnn.dispatch.quick); None reads $AUTOCNN_AUTOTUNE, else "quick". It applies to the
    problems prepared after it is set. ``quick_budget_s``: quick tuning's budget per problem;
    ``clock``: what prepare's seconds (and a TuningBudget) are measured with.
    """

    def __init__(self, cp: Any, device_id: int, device: Any, database: Any, autotune: str | None = None):
        from autocnn.kernels.runtime import KernelLoader

        self.autotune = autotune
        self.cp = cp
        self.device_id = device_id
        self.device = device
        self.db = database
        self.quick_budget_s = QUICK_BUDGET_S
        self.clock: Callable[[], float] = time.monotonic
        self.loader = KernelLoader()
        self.plans: dict[Any, Any] = {}          # problem -> LoadedPlan
        self.dispatch: dict[Any, KernelDispatch] = {}
        self.sources: dict[Any, str] = {}          # problem -> where its config came from (a choice's source)
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
        return self.prepare_all(problems).dispatch

    def prepare_all(self, problems: Sequence[Any], *, mode: str | None = None, budget: TuningBudget | None = None,
                    progress: PrepareProgress | None = None) -> PrepareOutcome:
        """``prepare`` with what it cost per problem. ``mode``: the autotune mode of this call
        (default: ``autotune``'s); ``budget``: the seconds the problems' tuning shares, after which
        the rest run the lookup's answer untuned; ``progress``: told of each problem prepared now."""
        from autocnn.kernels import get_operation

        mode = self.autotune if mode is None else autotune_mode(mode)
        todo = [p for p in dict.fromkeys(problems) if p not in self.plans]
        done: dict[Any, PreparedProblem] = {}
        # The measuring worker starts only when some problem is tuned, and stops when all are ready.
        tuner = Autotuner(mode, self.db, self.device, self.measurement_source, self.quick_budget_s, shared=budget,
                          clock=self.clock)
        try:
            for index, problem in enumerate(todo):
                if progress is not None:
                    progress.start(index, len(todo), problem)
                start = self.clock()
                chosen = tuner.choose(problem)
                plan = get_operation(problem.op).plan(problem, chosen.config)
                loaded = self.loader.load(plan)
                self.plans[problem] = loaded
                self.workspaces.reserve(problem, problem.op, loaded.plan.workspaces)
                self.dispatch[problem] = KernelDispatch(problem, SOURCE_LABELS.get(chosen.source, chosen.source),
                                                        f"{chosen.config} ({chosen.detail})")
                self.sources[problem] = chosen.source
                done[problem] = PreparedProblem(self.dispatch[problem], chosen.source, True, chosen.tuned_now,
                                                chosen.over_budget, chosen.tune_s,
                                                max(0.0, self.clock() - start - chosen.tune_s), chosen.time_us)
                if progress is not None:
                    progress.done(index, len(todo), done[problem])
        finally:
            tuner.close()
        ready_before = {p: PreparedProblem(self.dispatch[p], self.sources[p], False, False, False)
                        for p in problems if p not in done}
        return PrepareOutcome(tuple(done.get(p) or ready_before[p] for p in problems))

    def measurement_source(self) -> Any:
        from autocnn.measurement.sources import GpuSource

        return GpuSource(self.device_id)

    def forget(self, problems: Sequence[Any]) -> None:
        """Drop the kernels chosen for these problems (after tuning, so the next prepare looks again)."""
        for problem in problems:
            self.plans.pop(problem, None)
            self.workspaces.forget(problem)
            self.dispatch.pop(problem, None)
            self.sources.pop(problem, None)

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
