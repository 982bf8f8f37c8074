"""The end of a search: the winner timed again, interleaved with the runner-up, the default, the
incumbent and the config of the GPU's stored record, and stored in the tuning database only when it
is faster than what the database holds for its key (so of several tuners sharing a study the fastest
confirmed winner stays, whichever finished last). The stored record's time is not taken on trust:
its config measured here is the evidence, so a record whose time was never real (an imported
1e-9 us) is replaced by what this tune measured. Where the database cannot take the record (a full
disk, a permission error mid-run), it is written to a file of the database format instead
(``store.fallback``), named in the outcome, and the run goes on."""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping

from autocnn import __version__
from autocnn.kernels.space import Config
from autocnn.search.settings import TuneOutcome, TuneSettings
from autocnn.measurement.sources import MeasurementSource, TrialResult


def contenders(known: Mapping[str, TrialResult], *others: Config | None) -> list[Config]:
    """The two fastest verified configs, and each of ``others`` (given, and not failed in the search).
    The others are what a lookup answers without this tune's record: the op's default, and the
    incumbent, a record of another GPU of this architecture or this GPU's quick record
    (Tuner._incumbent), either of which this tune's record would replace. The search may never
    have measured them (held parameters: --fix formulation=wgmma), so they are timed here, and a
    winner slower than them never becomes the record (on an H100, a wgmma weight gradient held to its
    formulation was 259 us where the default ran 213 us)."""
    ranked = sorted((r for r in known.values() if r.ok and r.time_us is not None), key=lambda r: r.time_us)
    out = [r.config for r in ranked[:2]]
    for other in others:
        if other is not None and other.key() not in {c.key() for c in out} and \
                (other.key() not in known or known[other.key()].ok):
            out.append(other)
    return out


def retime(source: MeasurementSource, op: str, problem: Any, configs: list[Config],
           rounds: int) -> tuple[dict[str, float], dict[str, TrialResult]]:
    """Median times of interleaved rounds (a config that fails once is out), and each config's last
    result (a failure's too; a replay miss, which says nothing of the config, leaves none)."""
    times: dict[str, list[float]] = {c.key(): [] for c in configs}
    last: dict[str, TrialResult] = {}
    for r in source.measure(op, problem, [c for _ in range(rounds) for c in configs]):
        if r.replay_miss:
            continue
        if r.ok and r.time_us is not None:
            times[r.config.key()].append(r.time_us)
            last[r.config.key()] = r
        else:
            times[r.config.key()].append(math.inf)
            last.setdefault(r.config.key(), r)
    medians = {k: statistics.median(v) for k, v in times.items() if v}
    return {k: v for k, v in medians.items() if math.isfinite(v)}, last


def confirm_and_store(source: MeasurementSource, db: Any, settings: TuneSettings, operation: Any, problem: Any,
                      default: Config, known: Mapping[str, TrialResult], study_measured: int,
                      outcome: TuneOutcome, incumbent: Config | None = None, stored: Any = None) -> TuneOutcome:
    """Time the winner again with the runner-up, the default, the incumbent and the config of
    ``stored`` (this GPU's own record, a LookupResult), then store the fastest (keeping a faster
    record, unless that record is ``stored`` and its config was measured here: then what was
    measured decides)."""
    stored_config = stored.config if stored is not None else None
    finite, last = retime(source, outcome.op, problem, contenders(known, default, incumbent, stored_config),
                          settings.confirm_rounds)
    # Evidence on the stored record: its config measured now (timed, or failed in the search or here).
    checked = stored_config is not None and (
        stored_config.key() in last
        or (stored_config.key() in known and not known[stored_config.key()].ok
            and not known[stored_config.key()].replay_miss))
    if not finite:
        outcome.best = None
        outcome.stopped_because += "; no contender verified again, nothing stored"
        return outcome
    winner_key = min(finite, key=finite.get)
    winner = last[winner_key]
    outcome.best = TrialResult(winner.config, True, finite[winner_key], timing=winner.timing)
    others = {c.key() for c in (default, incumbent, stored_config) if c is not None}
    runner = [k for k in finite if k != winner_key and k not in others]
    if default.key() in finite:
        outcome.default = TrialResult(default, True, finite[default.key()])
    if db is None:
        return outcome
    from autocnn.store import DatabaseError, RecordKey, TuningRecord, now_utc
    from autocnn.search.storage import default_storage_url

    timing = winner.timing or {}
    record = TuningRecord(
        key=RecordKey.for_(source.device, problem, operation.config_fingerprint(winner.config)),
        config=winner.config.as_dict(),
        time_us=finite[winner_key],
        spread=float(timing.get("spread", 0.0)),
        default_time_us=finite.get(default.key()),
        cudnn_time_us=None,
        trials=study_measured,
        tuned_at=now_utc(),
        autocnn_version=__version__,
        sampler=settings.sampler,
        study=outcome.study_name,
        storage=settings.storage or default_storage_url(),   # the record redacts any password
        runner_up={"config": last[runner[0]].config.as_dict(), "time_us": finite[runner[0]]} if runner else None,
        workspace_bytes=operation.workspace_bytes(problem, winner.config),
        plan_digest=operation.code_digest(problem, winner.config),   # the code measured (records.validate_record)
    )
    if checked and stored_config.key() in finite:
        outcome.stored_retimed_us = finite[stored_config.key()]
    superseded = [stored.record] if checked else []
    try:
        put = db.put_many([record], keep_faster=True, superseded=superseded)
    except (OSError, DatabaseError) as exc:   # disk full, permissions changed, a lock held too long
        from autocnn.store.fallback import keep_unstored

        outcome.unsaved_path = keep_unstored(record)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        outcome.stopped_because += (f"; the database could not take the record ({reason}): it was written to "
                                    f"{outcome.unsaved_path}, which `autocnn db import` adds")
        return outcome
    if put:
        outcome.record = put[0]
    else:
        kept = db.record_for(record.key)
        outcome.stopped_because += (f"; the database keeps its faster record ({kept.time_us:.1f} us)"
                                    if kept is not None else "; the database keeps its faster record")
    return outcome
