"""Lookup with fallback, and the records that say what to tune again.

Lookup falls back in a fixed chain and says which step answered:
exact GPU identity -> same compute capability -> nearest tuned shape -> the heuristic default.
A config borrowed from a nearest shape is handed out only when its ptxas report shows it can run
on the device (``feasibility``). Where a cost model is in use (``autocnn.cost_model``), the two
last steps are one: the nearest shapes' configs and each formulation's default, in the model's
order of predicted time. A record whose template fingerprint is old and whose config no longer
generates the code it was tuned with (its plan digest) is stale and never run; it names a shape to
tune again and offers its config as a first guess.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from autocnn.cost_model.ranking import predicted_order
from autocnn.device import DeviceInfo
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import get_operation, problem_from_dict
from autocnn.kernels.space import Config, SearchSpace
from autocnn.layout import layout_of
from autocnn.precision import precision_of
from autocnn.store.feasibility import ResourceCheck, ptxas_check
from autocnn.store.files import CorruptFile, Entry, ForeignFormat, Origin, file_signature, read_raw
from autocnn.store.records import RecordError, RecordKey, StaleRecordError, TuningRecord, validate_record

# A tuned config is borrowed for another shape only this close (see shape_distance): e.g. H and W
# both 4x larger (4) and C 4x smaller (2) plus a different padding (1). Farther away, the op's
# problem-adaptive heuristic default is the better guess.
NEAREST_SHAPE_MAX_DISTANCE = 8.0
# How much farther an fp32 record stands from a tf32 request than its shape alone says (as if one
# size were doubled): its config meets the tf32 bound but was tuned for the cost of 3xTF32 or FP32.
PRECISION_DISTANCE = 1.0
# Borrowed configs checked (each compiled once per host, then cached) before the default answers.
MAX_CHECKED_NEIGHBOURS = 4
# The nearest shapes' distinct configs the cost model ranks beside the formulations' defaults.
MAX_RANKED_NEIGHBOURS = 8

LookupSource = Literal["exact", "same_arch", "nearest_shape", "default"]


@dataclass(frozen=True)
class LookupResult:
    """The config to run, where it came from, and a sentence for people about why."""

    config: Config
    source: LookupSource
    record: TuningRecord | None
    detail: str


def shape_distance(a: Any, b: Any) -> float:
    """How far apart two problems of the same operation are, for borrowing a tuned config.

    Sizes count by ratio: each of N, C, H, W, K, R, S (conv) or N, C, H, W, window height and width
    (pooling) adds |log2(a / b)|, so doubling any one size costs 1. Strides change the access
    pattern more than sizes do (alignment, reuse of staged input), so each axis adds
    2 * |log2(stride_a / stride_b)|. Each padding side that differs adds 0.25, and so does each
    differing flag (bias, activation, count_pad). Different dtypes are infinitely far apart. So is a
    tf32 record from an fp32 request ``a``: a tf32 config must never serve fp32 (its error bound is
    looser). An fp32 record may serve a tf32 request, PRECISION_DISTANCE further away: its config
    runs as the tf32 problem's code, which meets the looser bound as well; it was tuned for another
    cost, so a tf32 record of a shape as near wins. Problems of different grouping classes
    (grouping_class: dense, depthwise, grouped) are infinitely far apart; within one, the number
    of groups counts as a size, and each axis's dilation as its stride does. Problems of different
    layouts are infinitely far apart: a config indexes its tensors in one layout's order.
    """
    if a.op != b.op or a.dtype != b.dtype or layout_of(a) is not layout_of(b):
        return math.inf
    d = 0.0
    pa, pb = precision_of(a), precision_of(b)
    if pa is not pb:
        if not pb.can_serve(pa):
            return math.inf
        d += PRECISION_DISTANCE
    if grouping_class(a) != grouping_class(b):
        return math.inf
    ga, gb = a.geometry(), b.geometry()
    sizes = ["N", "C", "H", "W"]
    pairs = [(ga[n], gb[n]) for n in sizes]
    if "K" in ga:
        pairs += [(ga[n], gb[n]) for n in ("K", "R", "S")]
    else:
        pairs += list(zip(ga["window"], gb["window"]))
    d += sum(abs(math.log2(x / y)) for x, y in pairs)
    d += 2.0 * sum(abs(math.log2(x / y)) for x, y in zip(ga["stride"], gb["stride"]))
    d += 0.25 * sum(1 for x, y in zip(ga["padding"], gb["padding"]) if x != y)
    if "K" in ga:
        # A depthwise problem's groups follow its C, which has counted already.
        if grouping_class(a) == "grouped":
            d += abs(math.log2(ga["groups"] / gb["groups"]))
        d += 2.0 * sum(abs(math.log2(x / y)) for x, y in zip(ga.get("dilation", (1, 1)), gb.get("dilation", (1, 1))))
    for flag in ("bias", "activation", "count_pad"):
        if getattr(a, flag, None) != getattr(b, flag, None):
            d += 0.25
    return d


def grouping_class(problem: Any) -> str:
    """Which kind of channel grouping a convolution has: "dense" (groups=1, and every pooling
    problem), "depthwise" (a group per input channel) or "grouped" (the rest). A config is
    borrowed only within one class: each needs formulations of its own."""
    groups = getattr(problem, "groups", 1)
    if groups == 1:
        return "dense"
    return "depthwise" if groups == problem.C else "grouped"


def _gpu_text(key: RecordKey) -> str:
    return f"{key.gpu}, {key.sm_count} SMs, CUDA {key.cuda_runtime}, driver {key.driver}"


class RecordLookup:
    """The queries of TuningDatabase that choose configs: lookup, neighbours, stale records.

    A mixin: it reads the database through ``_entries()`` (every valid record), ``_files()`` (every
    file with its origin) and ``records()``, which TuningDatabase provides.
    """

    def _entries(self) -> list[Entry]:
        raise NotImplementedError

    def _files(self) -> list[tuple[Path, Origin]]:
        raise NotImplementedError

    def records(self, device: DeviceInfo | None = None, op: str | None = None, *,
                gpu: str | None = None, arch: str | None = None) -> list[TuningRecord]:
        raise NotImplementedError

    resource_check: ResourceCheck = staticmethod(ptxas_check)

    def tuned(self, device: DeviceInfo, problem: Any) -> LookupResult | None:
        """The record that ran this very problem's code on ``device``'s GPU (exact) or on another GPU
        of its architecture (same_arch), valid for this device; None when there is none. Nothing is
        compiled: the cheap first steps of ``lookup``."""
        operation = get_operation(problem.op)
        operation.check_problem(problem)
        space = operation.space(problem, device.limits())
        return self._tuned(device, problem, space, self._entries_of(problem.op))

    def _entries_of(self, op: str) -> list[Entry]:
        return [e for e in self._entries() if e.record.key.op == op]

    def _tuned(self, device: DeviceInfo, problem: Any, space: SearchSpace,
               entries: list[Entry]) -> LookupResult | None:
        key = RecordKey.for_(device, problem)
        identity = key.identity()
        canonical = problem.to_dict()
        arch = device.arch

        def usable(record: TuningRecord) -> Config | None:
            # Feasibility is checked again against this device's limits (shared memory may differ).
            try:
                return space.validate(record.config)
            except (InvalidConfigError, InfeasibleConfigError):
                return None

        for e in entries:
            if e.record.key.identity() == identity:
                config = usable(e.record)
                if config is not None:
                    return LookupResult(config, "exact", e.record,
                                        f"tuned on this GPU ({_gpu_text(e.record.key)}) on "
                                        f"{e.record.tuned_at}: {e.record.time_us:.1f} us ({e.origin} record)")

        same_problem = sorted(
            (e for e in entries if e.record.key.arch == arch and e.record.key.problem == canonical),
            key=lambda e: (e.record.time_us, e.record.key.identity()))
        for e in same_problem:
            config = usable(e.record)
            if config is not None:
                return LookupResult(config, "same_arch", e.record,
                                    f"tuned on another {arch} GPU ({_gpu_text(e.record.key)}): "
                                    f"{e.record.time_us:.1f} us there ({e.origin} record)")
        return None

    def lookup(self, device: DeviceInfo, problem: Any) -> LookupResult:
        """The config to run ``problem`` on ``device``: exact > same_arch > nearest_shape > default.

        Exact and same-architecture records ran this very problem's code; a nearest shape's config
        is handed out only when ``resource_check`` (ptxas's report) shows it can run here, else the
        next one is tried (MAX_CHECKED_NEIGHBOURS in all), then the op's heuristic default, whose
        candidates fit by construction."""
        operation = get_operation(problem.op)
        operation.check_problem(problem)
        limits = device.limits()
        space = operation.space(problem, limits)
        entries = self._entries_of(problem.op)
        found = self._tuned(device, problem, space, entries)
        if found is not None:
            return found
        predicted = self._predicted(device, problem, space, entries)
        if predicted is not None:
            return predicted
        arch = device.arch

        # A borrowed config runs code generated for this shape, which no one has compiled: its ptxas
        # report (cached) must show it fits this device (registers, shared memory, no spills).
        skipped: list[str] = []
        checked: set[str] = set()
        for distance, e, config in self._nearest(entries, problem, arch, space):
            if config.key() in checked:
                continue
            if len(checked) >= MAX_CHECKED_NEIGHBOURS:
                break
            checked.add(config.key())
            reasons = self.resource_check(operation.plan(problem, config), device)
            if reasons:
                skipped.append(f"{e.valid.problem.shape_string()}'s config {reasons[0]}")
                continue
            return LookupResult(config, "nearest_shape", e.record,
                                f"borrowed from the nearest tuned {problem.op} shape "
                                f"{e.valid.problem.shape_string()} on {_gpu_text(e.record.key)} "
                                f"(distance {distance:.2f}; {e.origin} record"
                                + (f"; {len(skipped)} nearer cannot run here" if skipped else "") + ")")

        return self.heuristic_default(device, problem,
                                      [f"nearest shapes that cannot run here: {'; '.join(skipped)}"] if skipped else [])

    def _predicted(self, device: DeviceInfo, problem: Any, space: SearchSpace,
                   entries: list[Entry]) -> LookupResult | None:
        """Where a cost model is in use: the nearest shapes' configs and each formulation's default
        in its order, the first whose ptxas report shows it runs here (MAX_CHECKED_NEIGHBOURS
        checked); None without a model, or when none of those checked can run (the rule's chain
        answers then)."""
        operation = get_operation(problem.op)
        candidates: list[tuple[Config, Entry | None, float]] = []
        seen: set[str] = set()
        for distance, e, config in self._nearest(entries, problem, device.arch, space):
            if config.key() not in seen:
                seen.add(config.key())
                candidates.append((config, e, distance))
            if len(candidates) >= MAX_RANKED_NEIGHBOURS:
                break
        borrowed = len(candidates)
        for _, config in formulation_defaults(operation, problem, device):
            if config.key() not in seen:
                seen.add(config.key())
                candidates.append((config, None, math.inf))
        ranked = predicted_order(problem, device, candidates, lambda c: c[0])
        if ranked is None:
            return None
        pool = f"ranked first by the cost model of {borrowed} nearest shapes' configs and {len(candidates) - borrowed} " \
               f"formulations' defaults"
        passed_over: list[str] = []
        for config, e, distance in ranked[:MAX_CHECKED_NEIGHBOURS]:
            reasons = self.resource_check(operation.plan(problem, config), device)
            if reasons:
                passed_over.append(reasons[0])
                continue
            after = f"; {len(passed_over)} ranked higher cannot run here" if passed_over else ""
            if e is None:
                form = operation.formulation_of(config)
                return LookupResult(config, "default", None,
                                    f"no tuned {problem.op} record of {problem.shape_string()} on {device.arch}: "
                                    f"the {form.formulation if form else problem.op} default, {pool}{after}")
            return LookupResult(config, "nearest_shape", e.record,
                                f"borrowed from the tuned {problem.op} shape {e.valid.problem.shape_string()} on "
                                f"{_gpu_text(e.record.key)} (distance {distance:.2f}; {e.origin} record), {pool}{after}")
        return None

    def heuristic_default(self, device: DeviceInfo, problem: Any, notes: Sequence[str] = ()) -> LookupResult:
        """The operation's heuristic default for ``problem`` on ``device``: the first default
        candidate whose ptxas report shows it runs here without spills (a candidate's static model
        of registers can be wrong for one shape: conv_bwd_data's gather default spills on
        chellapilla06_c2, on an H100 and with nvcc 13), else the first. What ``lookup`` hands out
        where no record serves, and what the kernel benchmark times as "default"."""
        operation = get_operation(problem.op)
        operation.check_problem(problem)
        first, passed_over = None, []
        for i, config in enumerate(operation.default_configs(problem, device.limits())):
            if first is None:
                first = config
            if i >= MAX_CHECKED_NEIGHBOURS:
                break
            reasons = self.resource_check(operation.plan(problem, config), device)
            if not reasons:
                first = config
                break
            # An operation with one formulation has no "formulation" parameter in its configs.
            form = operation.formulation_of(config)
            passed_over.append(f"default candidate {i + 1} ({form.formulation if form else problem.op}) {reasons[0]}")
        notes = [*notes, *passed_over]
        return LookupResult(first, "default", None,
                            f"no tuned {problem.op} record usable for {problem.shape_string()} on {device.arch}: "
                            f"heuristic default" + (f" ({'; '.join(notes)})" if notes else ""))

    def _nearest(self, entries: Iterable[Entry], problem: Any, arch: str,
                 space: SearchSpace) -> Iterable[tuple[float, Entry, Config]]:
        """Tuned shapes of the same operation and architecture within NEAREST_SHAPE_MAX_DISTANCE,
        nearest first, whose configs are valid (and feasible) for ``problem``; the exact problem
        itself is not a neighbour."""
        canonical = problem.to_dict()
        ranked = []
        for e in entries:
            if e.record.key.arch != arch or e.record.key.problem == canonical:
                continue
            d = shape_distance(problem, e.valid.problem)
            if d <= NEAREST_SHAPE_MAX_DISTANCE:
                ranked.append((d, e.record.time_us, e.record.key.identity(), e))
        ranked.sort(key=lambda t: t[:3])
        precision = precision_of(problem)
        known = {p.name for p in space.params}   # the parameters a borrowed config may keep
        for d, _, _, e in ranked:
            try:
                if precision_of(e.valid.problem) is not precision:
                    # An fp32 config for a tf32 problem: parameters only tf32 has (TF32_ROUND) at
                    # their first choice, the conservative one; those only fp32 has (how the 3xTF32
                    # split is made, e.g. A_REGS or a formulation's CROSS) dropped, as tf32 has no split.
                    config = space.complete({k: v for k, v in e.record.config.items() if k in known})
                else:
                    config = space.validate(e.record.config)
            except (InvalidConfigError, InfeasibleConfigError):
                continue
            yield d, e, config

    def neighbour_configs(self, device: DeviceInfo, problem: Any, space: SearchSpace,
                          limit: int = 3) -> list[Config]:
        """Up to ``limit`` distinct configs of the nearest tuned shapes (same op and architecture)
        that are valid in ``space``: good first guesses for a search."""
        entries = [e for e in self._entries() if e.record.key.op == problem.op]
        out: list[Config] = []
        seen: set[str] = set()
        for _, _, config in self._nearest(entries, problem, device.arch, space):
            if config.key() not in seen:
                seen.add(config.key())
                out.append(config)
            if len(out) >= limit:
                break
        return out

    # -- stale records: tuned with templates that have changed since --
    def stale_records(self) -> list[tuple[TuningRecord, Any]]:
        """Every record (shipped and user) skipped only because its template fingerprint is old
        (and its plan digest, where it has one, is not its config's now), with its parsed problem.
        They are never run; they say which shapes to tune again. A file is read again only when it
        changed: the tuner asks once a problem, and validating thousands of shipped records each
        time cost more than the search of a small problem."""
        cache: dict[Path, tuple[Any, list[tuple[TuningRecord, Any]]]] = self.__dict__.setdefault("_stale_scans", {})
        out: list[tuple[TuningRecord, Any]] = []
        for path, _origin in self._files():
            sig = file_signature(path)
            hit = cache.get(path)
            if sig is None or hit is None or hit[0] != sig:
                hit = (sig, _stale_in(path))
                if sig is not None:
                    cache[path] = hit
            out += hit[1]
        return out

    def stale_problems(self, device: DeviceInfo, ops: Sequence[str] | None = None) -> list[Any]:
        """The problems of this GPU kind whose records are stale and that have no current record
        of this kind yet: what ``autocnn tune --stale`` tunes again. Each problem once."""
        def ident(op: str, problem: Any) -> str:
            return f"{op}|{json.dumps(problem.to_dict(), sort_keys=True)}"

        slug = device.slug()
        fresh = {ident(r.key.op, problem_from_dict(r.key.problem)) for r in self.records() if r.key.slug() == slug}
        out, seen = [], set(fresh)
        for record, problem in self.stale_records():
            if record.key.slug() != slug or (ops is not None and record.key.op not in ops):
                continue
            i = ident(record.key.op, problem)
            if i not in seen:
                seen.add(i)
                out.append(problem)
        return out

    def stale_configs(self, device: DeviceInfo, problem: Any, space: SearchSpace) -> list[Config]:
        """Configs of stale records of this problem on this architecture that the current space
        still accepts, completed with the first choice of parameters added since (SearchSpace.complete):
        first guesses for tuning it again (measured anew, never trusted)."""
        canonical = problem.to_dict()
        out: list[Config] = []
        for record, p in self.stale_records():
            if record.key.op != problem.op or record.key.arch != device.arch or p.to_dict() != canonical:
                continue
            try:
                config = space.complete(record.config)
            except (InvalidConfigError, InfeasibleConfigError):
                continue
            if all(config.key() != c.key() for c in out):
                out.append(config)
        return out


def formulation_defaults(operation: Any, problem: Any, device: DeviceInfo) -> list[tuple[str, Config]]:
    """Each formulation's first default candidate for ``problem``, in the operation's order; a
    formulation that cannot serve the problem (winograd for a 5x3 filter) has none."""
    limits = device.limits()
    out = []
    for name in operation.formulation_names:
        try:
            config = next(iter(operation.default_configs(problem, limits, name)), None)
        except (InfeasibleConfigError, InvalidConfigError, KeyError):
            continue
        if config is not None:
            out.append((name, config))
    return out


def _stale_in(path: Path) -> list[tuple[TuningRecord, Any]]:
    """The stale records of one file (``RecordLookup.stale_records``); none of an unreadable one."""
    try:
        raws = read_raw(path)
    except (CorruptFile, ForeignFormat, OSError):
        return []
    out = []
    for raw in raws:
        try:
            validate_record(TuningRecord.from_dict(raw))
        except StaleRecordError:
            record = TuningRecord.from_dict(raw)
            out.append((record, problem_from_dict(record.key.problem)))
        except RecordError:
            continue
    return out
