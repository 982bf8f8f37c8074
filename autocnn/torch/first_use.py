"""Preparing a model's kernels before its first step: looked up, quick-tuned under one budget,
compiled, and what that cost reported.

``prepare(model, example_input)`` finds the problems of a step (autocnn.torch.tuning's
``collect_problems``, on meta tensors) and has the device's kernels (autocnn.dispatch's
GpuKernels) look each up in the tuning database, tune it where no record of it exists, compile and
load it, so that the first step, or a CUDA-graph capture, compiles nothing. The tuning is the
training library's (autocnn.dispatch.quick): by default "quick", a handful of candidates measured
per problem, the fastest verified one kept as a quick record, so that a later process finds it and
tunes nothing. cudnn.benchmark measures again in every process; here a model pays once per GPU
model. The problems are tuned in the order of their share of the step (count x expected time), so
that a budget spent early leaves the smallest untuned.

What it returns, and prints once unless ``verbose`` is false, is a PrepareReport: the seconds spent
tuning and compiling before the first step, how many problems were tuned, found in the database,
or left untuned by the budget. While it works, a progress line (tqdm, on stderr) says which
problem of how many it is at, the time so far and what the last one found.

``convert`` installs a ``FirstUse`` hook on the model: its first call on a CUDA input (of each
input shape, in training and in inference) runs ``prepare`` with the settings given to
``convert``, so quick tuning at first use needs no call at all.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autocnn.dispatch.kernels import PrepareOutcome
from autocnn.dispatch.quick import AutotuneMode, TuningBudget, autotune_mode, model_budget
from autocnn.torch.launch import kernels_for, outside_the_forward
from autocnn.torch.tuning import MetaTraceError, as_args, collect_problems

# Where a config came from, for the report's counts (autocnn.dispatch.quick's choice sources).
_FROM_DATABASE = ("exact", "same_arch", "quick")


@dataclass(frozen=True)
class PrepareSettings:
    """How ``prepare`` tunes: the autotune mode, the model's tuning budget in seconds, and whether
    it shows its progress line and report."""

    autotune: AutotuneMode
    budget_s: float
    verbose: bool = True

    @staticmethod
    def resolve(autotune: str | None = None, budget_s: float | None = None, verbose: bool = True) -> "PrepareSettings":
        """From arguments, else $AUTOCNN_AUTOTUNE / $AUTOCNN_QUICK_BUDGET, else the defaults
        ("quick", MODEL_QUICK_BUDGET_S); a ValueError naming what is allowed for a bad value."""
        if not isinstance(verbose, bool):
            raise TypeError(f"verbose must be True or False, not {verbose!r}")
        return PrepareSettings(autotune_mode(autotune), model_budget(budget_s), verbose)


@dataclass(frozen=True)
class PrepareReport:
    """What one ``prepare`` did: a PreparedProblem (autocnn.dispatch.kernels) per problem of the
    step, in the model's order, and the seconds it took before the first step could run."""

    device: str
    settings: PrepareSettings
    problems: tuple[Any, ...]
    seconds: float

    @property
    def dispatch(self) -> list[Any]:
        """One KernelDispatch per problem: which config runs, and where it came from."""
        return [p.dispatch for p in self.problems]

    @property
    def prepared_now(self) -> list[Any]:
        return [p for p in self.problems if p.prepared_now]

    @property
    def tuned(self) -> list[Any]:
        return [p for p in self.problems if p.tuned_now]

    @property
    def over_budget(self) -> list[Any]:
        """Problems that tuning was due for, left with the lookup's answer: the budget was spent."""
        return [p for p in self.problems if p.over_budget]

    @property
    def from_database(self) -> list[Any]:
        """Problems prepared now whose config a record of this problem gave (tuned or quick-tuned before)."""
        return [p for p in self.prepared_now if not p.tuned_now and p.source in _FROM_DATABASE]

    @property
    def untuned(self) -> list[Any]:
        """Problems prepared now with a borrowed or default config, not for want of budget (autotune
        off, or tuning found nothing verified)."""
        return [p for p in self.prepared_now if not p.tuned_now and not p.over_budget
                and p.source not in _FROM_DATABASE]

    @property
    def tune_s(self) -> float:
        return PrepareOutcome(self.problems).tune_s

    @property
    def compile_s(self) -> float:
        return PrepareOutcome(self.problems).compile_s

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "autotune": self.settings.autotune, "budget_s": self.settings.budget_s,
                "seconds": self.seconds, "tune_s": self.tune_s, "compile_s": self.compile_s,
                "problems": len(self.problems), "prepared_now": len(self.prepared_now), "tuned": len(self.tuned),
                "from_database": len(self.from_database), "over_budget": len(self.over_budget),
                "untuned": len(self.untuned)}

    def __str__(self) -> str:
        now = self.prepared_now
        head = f"autocnn.torch.prepare ({self.device}, autotune {self.settings.autotune})"
        if not now:
            return f"{head}: all {len(self.problems)} kernels were ready; nothing to do"
        parts = [f"{len(self.tuned)} tuned now"]
        if self.over_budget:
            parts.append(f"{len(self.over_budget)} left untuned: the {self.settings.budget_s:g} s tuning budget was "
                         f"spent, so they run the lookup's answer and the next prepare tunes them")
        if self.from_database:
            parts.append(f"{len(self.from_database)} from the tuning database")
        if self.untuned:
            parts.append(f"{len(self.untuned)} on the lookup's answer, untuned")
        ready = len(self.problems) - len(now)
        if ready:
            parts.append(f"{ready} ready before")
        return (f"{head}: {len(now)} kernels ready in {self.seconds:.1f} s before the first step "
                f"({self.tune_s:.1f} s tuning, {self.compile_s:.1f} s looking up and compiling): " + "; ".join(parts))


def found_text(prepared: Any) -> str:
    """What preparing one problem found, in a few words (the progress line's)."""
    if prepared.over_budget:
        return "budget spent: the lookup's answer, untuned"
    text = prepared.dispatch.source
    if prepared.time_us is not None:
        text += f" {prepared.time_us:.1f} us"
    if prepared.tuned_now:
        text += f" (tuned in {prepared.tune_s:.1f} s)"
    return text


class ProgressLine:
    """prepare's progress line on stderr (tqdm): the time so far, problem i of n, and what the
    problem before found; the line is made at the first problem, so nothing shows when all are ready."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.last = ""

    def start(self, index: int, total: int, problem: Any) -> None:
        text = f"problem {index + 1} of {total}, {problem.op} {problem.shape_string()}" + self.last
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=text, file=sys.stderr, mininterval=0.5, dynamic_ncols=True,
                            bar_format="autocnn.torch prepare [{elapsed}]: {desc}")
        else:
            self.bar.set_description_str(text, refresh=True)

    def done(self, index: int, total: int, prepared: Any) -> None:
        self.last = f"; the one before: {found_text(prepared)}"
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"{self.bar.total} problems{self.last.replace('the one before', 'the last')}",
                                         refresh=False)
            self.bar.close()


def _share(use: Any) -> float:
    from autocnn.search.network import expected_seconds

    return use.count * expected_seconds(use.problem.op, use.problem)


def prepare_on(kernels: Any, model: nn.Module, args: tuple[torch.Tensor, ...], settings: PrepareSettings,
               training: bool = True, precision: str | None = None) -> PrepareReport:
    """``prepare`` on one device's kernels (autocnn.torch.launch.DeviceKernels), with resolved settings."""
    clock = kernels.kernels.clock
    start = clock()
    uses = collect_problems(model, args, training=training, precision=precision)
    by_share = sorted(uses, key=_share, reverse=True)
    progress = ProgressLine() if settings.verbose else None
    try:
        outcome = kernels.prepare([u.problem for u in by_share], mode=settings.autotune,
                                  budget=TuningBudget(settings.budget_s), progress=progress)
    finally:
        if progress is not None:
            progress.close()
    prepared = {p.problem: p for p in outcome.problems}
    report = PrepareReport(f"cuda:{kernels.index}", settings, tuple(prepared[u.problem] for u in uses),
                           clock() - start)
    if settings.verbose and report.prepared_now:
        print(report, flush=True)
    return report


def prepare(model: nn.Module, example_input: Any, *, training: bool = True, autotune: str | None = None,
            budget_s: float | None = None, verbose: bool = True, precision: str | None = None) -> PrepareReport:
    """Look up, tune where no record exists, and compile every kernel a step of ``model`` on
    ``example_input`` runs, on the input's CUDA device, so that the first step (or a CUDA-graph
    capture) compiles and measures nothing. Returns a PrepareReport (printed once with ``verbose``,
    which also shows a progress line while it works).

    ``autotune``: "quick" (the default, else $AUTOCNN_AUTOTUNE), "full" or "off" (the lookup's
    answer, untuned). ``budget_s``: the seconds the whole model's tuning may take (default
    $AUTOCNN_QUICK_BUDGET, else 120): problems are tuned in order of their share of the step, and
    once the budget is spent the rest run the lookup's answer, which the report counts; a problem
    left so is tuned by the next prepare, in this process or another. A problem that this GPU's
    database already holds (a tuned record, or an earlier quick-tuned one) is not tuned again.
    ``training``: the backward's problems too. The kernels are those of the dtypes the model computes
    in: its parameters' and inputs', and under torch.autocast("cuda") (prepare called inside the
    region, as the hook is) the autocast dtype's; ``precision`` "bf16" or "fp16" prepares what the
    model computes in that dtype from outside the region (collect_problems). Bad values are refused
    before any GPU work."""
    settings = PrepareSettings.resolve(autotune, budget_s, verbose)
    args = as_args(example_input)
    if args[0].device.type != "cuda":
        raise ValueError(f"prepare needs the example input on the CUDA device the model will run on, "
                         f"not on {args[0].device}")
    return prepare_on(kernels_for(args[0].device), model, args, settings, training, precision)


def _cuda_step(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """The CUDA device of a forward call that ``FirstUse`` prepares for: tensors alone, on a CUDA
    device, outside a compile trace and a CUDA-graph capture; None otherwise."""
    if torch.compiler.is_compiling() or kwargs or not args:
        return None
    if not all(isinstance(a, torch.Tensor) for a in args) or args[0].device.type != "cuda":
        return None
    if torch.cuda.is_current_stream_capturing():
        return None
    return args[0].device


class FirstUse:
    """A converted model's forward pre-hook: the first call on a CUDA input of each input shape and
    memory format, in training and in inference, and of each torch.autocast dtype (it runs inside the region, so the
    problems are the autocast dtype's), prepares the whole model (``prepare``, with ``convert``'s
    settings); a call it passes over (under torch.compile or a capture, with keyword arguments)
    leaves each kernel to be prepared when its layer first runs it."""

    def __init__(self, autotune: str | None = None, budget_s: float | None = None, verbose: bool = True):
        PrepareSettings.resolve(autotune, budget_s, verbose)   # refused at convert, not at the first step
        self.autotune, self.budget_s, self.verbose = autotune, budget_s, verbose
        self.seen: set[Any] = set()

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        device = _cuda_step(args, kwargs)
        if device is None:
            return None
        training = module.training and torch.is_grad_enabled()
        autocast = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        # The strides too: a channels_last input makes other (NHWC) problems than a contiguous one.
        key = (device, training, autocast,
               tuple((tuple(a.shape), a.stride(), a.dtype, a.requires_grad) for a in args))
        if key in self.seen:
            return None
        self.seen.add(key)
        settings = PrepareSettings.resolve(self.autotune, self.budget_s, self.verbose)
        try:
            outside_the_forward(lambda: prepare_on(kernels_for(device), module, args, settings, training))
        except MetaTraceError as exc:
            warnings.warn(f"{exc}; autocnn.torch prepares each kernel when its layer first runs instead",
                          RuntimeWarning, stacklevel=2)
        return None


def install(model: nn.Module, autotune: str | None, budget_s: float | None, verbose: bool) -> FirstUse:
    """``model``'s FirstUse hook, made or given these settings (a model converted twice has one)."""
    for hook in model._forward_pre_hooks.values():
        if isinstance(hook, FirstUse):
            fresh = FirstUse(autotune, budget_s, verbose)
            hook.autotune, hook.budget_s, hook.verbose = fresh.autotune, fresh.budget_s, fresh.verbose
            return hook
    hook = FirstUse(autotune, budget_s, verbose)
    model.register_forward_pre_hook(hook, with_kwargs=True)
    return hook
