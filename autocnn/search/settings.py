"""What a tuning run is asked to do (TuneSettings, checked on construction, before any device is
touched) and what it did (TuneOutcome)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from autocnn.search.samplers import SAMPLERS
from autocnn.measurement.sources import TrialResult
from autocnn.search.storage import StorageSpec, parse_storage


def check_timeout(seconds: float | None, what: str = "--timeout") -> float | None:
    """A wall-clock budget in seconds: positive and finite, or None for none."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"{what} must be a number of seconds, not {seconds!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {seconds}")
    return float(seconds)


@dataclass(frozen=True)
class TuneSettings:
    trials: int = 100                    # measured trials per study (a re-run continues to this total)
    timeout_s: float | None = None       # wall-clock budget per study
    sampler: str = "tpe"
    seed: int | None = None
    storage: str | None = None           # see search/storage.py; None: SQLite in the cache
    batch: int = 16                      # configs proposed at once (compiled in parallel)
    fixed: Mapping[str, Any] = field(default_factory=dict)   # parameters held at one value
    warm_start: bool = True              # enqueue the default, old winners of the shape, nearest shapes' winners
    confirm_rounds: int = 3              # interleaved re-timing rounds of winner, runner-up and default
    # Parameters along which the warm start's earlier winners (the shape's record, current or stale,
    # and the nearest shapes') are also tried at every other choice: after a parameter is added, a
    # retune measures the old winner with each of its values instead of leaving that to the sampler.
    vary: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler {self.sampler!r} is not one of {', '.join(SAMPLERS)}")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"trials must be a whole number of at least 1, not {self.trials!r}")
        check_timeout(self.timeout_s, "timeout")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"batch must be a whole number of at least 1, not {self.batch!r}")
        if isinstance(self.vary, str) or not all(isinstance(v, str) and v for v in self.vary):
            raise ValueError(f"vary must be a sequence of parameter names, not {self.vary!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**32):
            raise ValueError(f"seed must be a whole number from 0 to {2**32 - 1}, not {self.seed!r}")
        if self.confirm_rounds < 1:
            raise ValueError(f"confirm_rounds must be at least 1, not {self.confirm_rounds}")
        if self.storage is not None:
            parse_storage(self.storage)   # StorageUrlError naming the accepted forms

    @property
    def storage_spec(self) -> StorageSpec:
        return parse_storage(self.storage)


@dataclass
class TuneOutcome:
    op: str
    problem: Any
    study_name: str
    best: TrialResult | None
    default: TrialResult | None
    measured: int = 0                    # trials this tuner measured
    infeasible: int = 0
    reused: int = 0
    failures: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    record: Any = None                   # the record stored (None: none, or the stored one was as fast)
    stopped_because: str = ""
    study_measured: int = 0              # measured trials in the whole study (every process, every run)
    recovered: int = 0                   # trials of ended tuners this one failed and queued again
    device: str = ""                     # the GPU (or replay source) that measured, for several devices
    replay_misses: int = 0               # configs proposed that the replay file does not hold
    # Where the record went when the database could not take it (a full disk, a permission error
    # mid-run): a file in the database format that `autocnn db import` adds later; None otherwise.
    unsaved_path: Any = None
    stored_retimed_us: float | None = None   # the GPU's stored record's config, measured again here

    @property
    def speedup(self) -> float | None:
        if self.best and self.default and self.default.ok and self.best.time_us:
            return self.default.time_us / self.best.time_us
        return None

    def summary(self) -> str:
        """One line for a finished problem (what a tuner writes when its output is not a terminal)."""
        shape = self.problem.shape_string() if hasattr(self.problem, "shape_string") else str(self.problem)
        if self.best is None:
            result = "no verified config"
        else:
            result = f"{self.best.time_us:.1f} us"
            if self.speedup is not None:
                result += f" ({self.speedup:.2f}x the default's {self.default.time_us:.1f} us)"
        failed = sum(self.failures.values())
        where = f" on {self.device}" if self.device else ""
        # Which classes failed, so that a wrong result is never hidden among compile or launch errors.
        classes = ", ".join(f"{name} {n}" for name, n in sorted(self.failures.items()))
        return (f"{self.op} {shape}: {result}; {self.measured} trials measured{where}"
                + (f", {failed} failed ({classes})" if failed else "")
                + (f", {self.replay_misses} not in the replay file" if self.replay_misses else "")
                + f", {self.seconds:.1f} s; stopped after {self.stopped_because}"
                + ("" if self.record is not None or self.best is None or self.unsaved_path is not None
                   else "; not stored"))
