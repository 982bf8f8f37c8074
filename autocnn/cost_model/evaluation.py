"""How well a ranking of configs holds on problems it never saw: leave-shapes-out folds.

Every distinct problem (operation and shape, all GPU kinds together) falls in one of ``folds``
folds; for each fold a model is trained on the others' measurements and ranks the held-out
groups' configs (a group: one problem on one GPU kind). The nearest-shape rule ranks the same
configs as the lookup orders borrowed configs: by the distance (``store.lookup.shape_distance``)
to the nearest training problem of the same operation and architecture where that very config was
measured, then by its time there over that problem's roofline; a config measured nowhere comes
last. Both rankings are scored against the measured times per group by Spearman's rho and
Kendall's tau-b (ties averaged), and averaged over groups.
"""
from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from autocnn.cost_model.features import Measurement, target
from autocnn.cost_model.model_file import CostModel, HeldOut, ModelMetadata
from autocnn.cost_model.training import TunedOverDefault, config_identity, fit
from autocnn.store.lookup import shape_distance

# Ten folds: the replay files' problems (hundreds of configs each) fall in folds of their own.
DEFAULT_FOLDS = 10


def ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties given their average rank."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="mergesort")
    out = np.empty(len(v))
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        out[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho; 0 where either side is constant (a ranking that tells nothing apart)."""
    ra, rb = ranks(a), ranks(b)
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return 0.0
    return float(((ra - ra.mean()) * (rb - rb.mean())).mean() / (sa * sb))


def kendall(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b; 0 where either side is constant."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    upper = np.triu_indices(len(x), 1)
    dx, dy = dx[upper], dy[upper]
    denom = math.sqrt(float(np.count_nonzero(dx)) * float(np.count_nonzero(dy)))
    return float((dx * dy).sum() / denom) if denom else 0.0


@dataclass(frozen=True)
class GroupScore:
    """One held-out group's configs: measured times and the two rankings' scores (lower: faster)."""

    group: str
    times: tuple[float, ...]
    model: tuple[float, ...]
    rule: tuple[float, ...]

    def top_pick_slowdown(self, scores: Sequence[float]) -> float:
        """The measured time of the config ranked first over the fastest measured time."""
        return self.times[int(np.argmin(scores))] / min(self.times)


@dataclass(frozen=True)
class Evaluation:
    """Per-group scores of a leave-shapes-out run and their averages; ``tuned_first``: of the
    held-out records whose default ran clearly slower (``training.tuned_over_default``), how many
    the model ranks the tuned config first for, and how many were asked."""

    folds: int
    groups: tuple[GroupScore, ...]
    tuned_first: tuple[int, int] = (0, 0)

    def held_out(self, which: Callable[[GroupScore], Sequence[float]]) -> HeldOut:
        big = [g for g in self.groups if len(g.times) >= 3]
        pairs = [g for g in self.groups if len(g.times) >= 2]

        def mean(values: list[float]) -> float:
            return float(np.mean(values)) if values else math.nan

        return HeldOut(len(big), mean([spearman(which(g), g.times) for g in big]),
                       mean([kendall(which(g), g.times) for g in big]), len(pairs),
                       mean([kendall(which(g), g.times) for g in pairs]))

    @property
    def model(self) -> HeldOut:
        return self.held_out(lambda g: g.model)

    @property
    def nearest_shape(self) -> HeldOut:
        return self.held_out(lambda g: g.rule)

    def slowdowns(self) -> tuple[float, float]:
        """Geometric means over groups of 3+ configs of the first-ranked config's time over the
        fastest: the model's, the rule's."""
        big = [g for g in self.groups if len(g.times) >= 3]
        if not big:
            return math.nan, math.nan
        gm = lambda xs: float(np.exp(np.mean(np.log(xs))))   # noqa: E731
        return (gm([g.top_pick_slowdown(g.model) for g in big]), gm([g.top_pick_slowdown(g.rule) for g in big]))


def problem_identity(m: Measurement) -> str:
    """The problem apart from the GPU kind: a fold holds a shape out on every GPU."""
    return m.group.split("|", 1)[1]


def nearest_shape_scores(held: Sequence[Measurement], training: Sequence[Measurement]) -> list[float]:
    """The nearest-shape rule's order of one group's configs as scores (lower: ranked earlier)."""
    problem, arch = held[0].problem, held[0].arch
    measured: dict[str, list[Measurement]] = defaultdict(list)
    for m in training:
        if m.problem.op == problem.op and m.arch == arch:
            measured[config_identity(m.config)].append(m)
    keys = []
    for h in held:
        seen = measured.get(config_identity(h.config), [])
        keys.append(min(((shape_distance(problem, m.problem), target(m)) for m in seen),
                        default=(math.inf, math.inf)))
    order = sorted(set(keys))
    return [float(order.index(k)) for k in keys]


def leave_shapes_out(measurements: Sequence[Measurement], folds: int = DEFAULT_FOLDS,
                     held_out: Callable[[Measurement], bool] = lambda m: True,
                     defaults: Sequence[TunedOverDefault] = ()) -> Evaluation:
    """Train one model per fold on the other folds' problems and score both rankings on its groups.
    ``held_out`` picks the measurements whose groups are scored (all by default); every
    measurement trains the folds it is not in. ``defaults`` of the fold's problems are asked of its model."""
    # Problems dealt round the folds, those with the most configs first (then by hash: the same
    # folds on every run): problems measured in depth fall in different folds, so that each is
    # ranked with the others of its kind in training. With as many folds as problems, each is
    # left out alone.
    sizes: dict[str, int] = defaultdict(int)
    for m in measurements:
        sizes[problem_identity(m)] += 1
    identities = sorted(sizes, key=lambda i: (-sizes[i], hashlib.sha256(i.encode()).hexdigest()))
    fold_of = {identity: i % folds for i, identity in enumerate(identities)}
    by_fold: dict[int, list[Measurement]] = defaultdict(list)
    for m in measurements:
        by_fold[fold_of[problem_identity(m)]].append(m)
    scores: list[GroupScore] = []
    right = asked = 0
    for fold in sorted(by_fold):
        held = [m for m in by_fold[fold] if held_out(m)]
        if not held:
            continue
        training = [m for f, ms in by_fold.items() if f != fold for m in ms]
        booster, schema = fit(training)
        model = CostModel(booster, schema)
        for d in defaults:
            if fold_of.get(d.group.split("|", 1)[1]) == fold:
                tuned, default = model.predict(d.problem, [d.tuned, d.default], d.arch, d.sm_count)
                right += int(tuned < default)
                asked += 1
        groups: dict[str, list[Measurement]] = defaultdict(list)
        for m in held:
            groups[m.group].append(m)
        for name in sorted(groups):
            g = groups[name]
            if len(g) < 2:
                continue
            predicted = model.predict_rows(np.array([schema.row(m.problem, m.config, m.arch, m.sm_count) for m in g]))
            scores.append(GroupScore(name, tuple(m.time_us for m in g), tuple(float(p) for p in predicted),
                                     tuple(nearest_shape_scores(g, training))))
    return Evaluation(folds, tuple(scores), (right, asked))


def train_and_evaluate(measurements: Sequence[Measurement], sources: Sequence[str], folds: int = DEFAULT_FOLDS,
                       defaults: Sequence[TunedOverDefault] = ()) -> tuple[CostModel, Evaluation]:
    """The model of all ``measurements``, with its held-out figures (``leave_shapes_out``) and
    the nearest-shape rule's in its metadata."""
    import datetime

    evaluation = leave_shapes_out(measurements, folds, defaults=defaults)
    booster, schema = fit(measurements)
    model_slowdown, rule_slowdown = evaluation.slowdowns()
    metadata = ModelMetadata(
        trained_at=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        measurements=len(measurements), problems=len({problem_identity(m) for m in measurements}),
        sources=tuple(sources), model=evaluation.model, nearest_shape=evaluation.nearest_shape, folds=folds,
        extra={"top_pick_slowdown": {"model": model_slowdown, "nearest_shape": rule_slowdown},
               "tuned_over_default": {"right": evaluation.tuned_first[0], "asked": evaluation.tuned_first[1]}})
    return CostModel(booster, schema, metadata), evaluation
