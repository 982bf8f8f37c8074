#!/usr/bin/env python3
"""Train the cost model (autocnn/cost_model) on the tuning records, and on replay files and Optuna
studies where given; report its held-out rank correlation beside the nearest-shape rule's, and
write the model file (by default the shipped one, autocnn/cost_model/cost_model.json.gz).

Run it again whenever the shipped records change (scripts/ship_records.py); the shipped model is
trained with the tests' replay files too. The model file holds the sha256 of every file it was
trained on; ``--check`` trains nothing and exits 1 when one of the files given differs from them.

    python scripts/train_cost_model.py --replay tests/data/replay/*.json.gz [--check]
    python scripts/train_cost_model.py --db DIR --storage sqlite:///optuna.db --out model.json.gz --folds 5
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.cost_model.evaluation import DEFAULT_FOLDS, spearman, train_and_evaluate  # noqa: E402
from autocnn.cost_model.model_file import SHIPPED_MODEL, CostModel, CostModelRefused  # noqa: E402
from autocnn.cost_model.training import (DEFAULT_GAP, database_records, distinct, record_measurements,  # noqa: E402
                                         replay_measurements, study_measurements, tuned_over_default)
from autocnn.measurement.sources import ReplayFile  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", type=Path, action="append", default=None,
                   help="a database directory or file of records (default: the shipped tuning_db/); repeatable")
    p.add_argument("--replay", type=Path, nargs="*", default=[], help="replay files (scripts/record_replay.py)")
    p.add_argument("--storage", action="append", default=[], help="an Optuna storage URL whose studies to learn from")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS, help="leave-shapes-out folds (default %(default)s)")
    p.add_argument("--out", type=Path, default=SHIPPED_MODEL, help="the model file (default: the shipped one)")
    p.add_argument("--groups", action="store_true", help="print each held-out problem of 3+ configs")
    p.add_argument("--check", action="store_true",
                   help="train nothing: exit 1 unless --out was trained on exactly the files given")
    args = p.parse_args(argv)
    if args.folds < 2:
        p.error("--folds must be 2 or more")

    files_given = [f for place in args.db or [REPO / "tuning_db"]
                   for f in (sorted(place.glob("*.json")) if place.is_dir() else [place])] + list(args.replay)
    digests = {_named(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files_given}
    if args.check:
        return _check(args.out, digests)

    measurements, sources, defaults = [], [], []
    for place in args.db or [REPO / "tuning_db"]:
        files = sorted(place.glob("*.json")) if place.is_dir() else [place]
        records = database_records(files)
        measurements += record_measurements(records)
        defaults += tuned_over_default(records)
        sources += [_named(f) for f in files]
    replays = [ReplayFile.load(path) for path in args.replay]
    measurements += replay_measurements(replays)
    sources += [_named(path) for path in args.replay]
    for url in args.storage:
        measurements += study_measurements(url)
        sources.append(url)
    measurements = distinct(measurements)
    if not measurements:
        p.error("no verified measurement found in what was given")

    model, evaluation = train_and_evaluate(measurements, sources, args.folds, defaults)
    assert model.metadata is not None
    model = CostModel(model.booster, model.schema, dataclasses.replace(
        model.metadata, extra={**model.metadata.extra, "sources_sha256": digests}))
    if args.groups:
        for g in evaluation.groups:
            if len(g.times) >= 3:
                print(f"{g.group}: {len(g.times)} configs, Spearman model {spearman(g.model, g.times):.3f}, "
                      f"rule {spearman(g.rule, g.times):.3f}")
    print(model.metadata.summary())
    slow = model.metadata.extra["top_pick_slowdown"]
    print(f"first-ranked config's time over the fastest (geometric mean, problems of 3+ configs): "
          f"model {slow['model']:.3f}x, nearest-shape rule {slow['nearest_shape']:.3f}x")
    right, asked = evaluation.tuned_first
    print(f"held-out records whose default ran {DEFAULT_GAP:g}x slower or more: the model ranks the tuned config "
          f"first for {right} of {asked}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")
    return 0


def _check(path: Path, digests: dict[str, str]) -> int:
    try:
        trained = CostModel.load(path).metadata
    except CostModelRefused as exc:
        print(exc)
        return 1
    assert trained is not None
    before = trained.extra.get("sources_sha256", {})
    changed = sorted(name for name in set(before) | set(digests) if before.get(name) != digests.get(name))
    for name in changed:
        if name in before and name in digests:
            print(f"{name}: changed since the model was trained")
        elif name in before:
            print(f"{name}: trained on, not given now")
        else:
            print(f"{name}: given, not trained on")
    print(f"{path}: " + ("trained on the files given" if not changed else
                         f"{len(changed)} files differ: run scripts/train_cost_model.py again"))
    return 1 if changed else 0


def _named(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
