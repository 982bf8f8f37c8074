"""Several problems (a network's kernels): the budget split where the network spends its time, and
the problems tuned one after another on one tuner (``devices`` spreads them over several GPUs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from autocnn.kernels import get_operation
from autocnn.search.settings import TuneOutcome, check_timeout

if TYPE_CHECKING:
    from autocnn.search.tuner import Tuner

# Rough rates that turn a problem into an expected share of a training step's time.
_EXPECTED_FLOPS = 25e12
_EXPECTED_BYTES = 3e12
MIN_SHARE_S = 5.0   # no problem gets less wall-clock time than this out of a network's timeout


def expected_seconds(op: str, problem: Any) -> float:
    operation = get_operation(op)
    if op.startswith("conv"):
        return operation.flops(problem) / _EXPECTED_FLOPS
    return operation.min_bytes(problem) / _EXPECTED_BYTES


def split_budget(problems: Sequence[Any], total: int, minimum: int = 8) -> list[int]:
    """Trials per problem in proportion to its expected time, at least ``minimum`` each."""
    if not problems:
        return []
    weights = [expected_seconds(p.op, p) for p in problems]
    spare = max(0, total - minimum * len(problems))
    whole = sum(weights) or 1.0
    return [minimum + int(round(spare * w / whole)) for w in weights]


@dataclass(frozen=True)
class ProblemBudget:
    problem: Any
    trials: int
    timeout_s: float | None
    weight: float            # expected seconds per run: the order in which problems are started


def plan_budgets(problems: Sequence[Any], total_trials: int, timeout_s: float | None = None) -> list[ProblemBudget]:
    """Each distinct problem once, with its share of the trials and of the wall-clock budget."""
    check_timeout(timeout_s)
    if isinstance(total_trials, bool) or not isinstance(total_trials, int) or total_trials < 1:
        raise ValueError(f"trials must be a whole number of at least 1, not {total_trials!r}")
    unique: list[Any] = []
    for p in problems:
        if p not in unique:
            unique.append(p)
    trials = split_budget(unique, total_trials)
    weights = [expected_seconds(p.op, p) for p in unique]
    whole = sum(weights) or 1.0
    return [ProblemBudget(p, n, None if timeout_s is None else max(MIN_SHARE_S, timeout_s * w / whole), w)
            for p, n, w in zip(unique, trials, weights)]


def tune_problems(tuner: "Tuner", problems: Sequence[Any], total_trials: int,
                  timeout_s: float | None = None, log: Callable[[str], None] | None = None) -> list[TuneOutcome]:
    """Tune every distinct problem, spending the budget where the network spends its time."""
    outcomes = []
    for b in plan_budgets(problems, total_trials, timeout_s):
        if log:
            log(f"{b.problem.op} {b.problem.shape_string()}: {b.trials} trials")
        outcomes.append(tuner.tune(b.problem.op, b.problem, trials=b.trials, timeout_s=b.timeout_s))
    return outcomes
