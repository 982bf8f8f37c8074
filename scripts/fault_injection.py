#!/usr/bin/env python3
"""Fault injection: a tuning run whose candidates include an out-of-bounds kernel and a hanging one.

Two valid configs of the problem get planted faults in their generated source (an illegal write,
and an endless loop) and are enqueued first, right after the default. The run must finish, classify
both failures (device error, timeout), and store a winner that is neither of them and that verifies
again in a fresh worker.

    python scripts/fault_injection.py --shape kriz09 --trials 24
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FAULTS = {
    # An illegal address: poisons the CUDA context, so the worker must be restarted.
    "out_of_bounds": "if (threadIdx.x == 0 && blockIdx.x == 0) { *reinterpret_cast<volatile float*>(16) = 1.0f; }",
    # Never finishes: only the parent's timeout can end it.
    # clock64() is an asm volatile read, so the compiler cannot drop the loop; it never ends in practice.
    "hang": "if (threadIdx.x == 0) { const long long t0 = clock64(); while (clock64() - t0 >= 0) { __nanosleep(1000); } }",
}


def plant(source: str, kernel: str, code: str) -> str:
    match = re.search(rf"\b{kernel}\([^)]*\)\s*\{{", source)
    if not match:
        raise ValueError(f"kernel {kernel} not found in the source")
    return source[:match.end()] + "\n    " + code + "\n" + source[match.end():]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="conv_fwd")
    ap.add_argument("--shape", default="kriz09", help="a seed shape name")
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds before a variant counts as hung")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="autocnn-faults-"))
    os.environ["AUTOCNN_TUNING_DB"] = str(work / "db")
    from autocnn.store import TuningDatabase
    from autocnn.kernels import get_operation
    from autocnn.measurement.sources import GpuSource
    from autocnn.kernels.suite import seed_shape
    from autocnn.search.tuner import TuneSettings, Tuner, enqueue_params, make_sampler, open_storage, study_name
    from autocnn.measurement.worker import MeasureJob, MeasureWorker
    import optuna

    problem = seed_shape(args.shape).problem(args.op)
    operation = get_operation(args.op)

    class FaultySource(GpuSource):
        def __init__(self, faults, **kw):
            super().__init__(**kw)
            self.faults = faults

        def plan_for(self, operation, problem, config):
            plan = super().plan_for(operation, problem, config)
            kind = self.faults.get(config.key())
            if kind is None:
                return plan
            return dataclasses.replace(plan, source=plant(plan.source, plan.launches[0].kernel, FAULTS[kind]))

    source = FaultySource({}, timeout_s=args.timeout, budget_s=0.1)
    space = operation.space(problem, source.device.limits())
    default = operation.default_config(problem, source.device.limits())
    bad = space.sample(random.Random(7), 2, exclude=[default])
    source.faults = {bad[0].key(): "out_of_bounds", bad[1].key(): "hang"}
    settings = TuneSettings(trials=args.trials, storage=f"sqlite:///{work / 'optuna.db'}", batch=8)
    name = study_name(source.device, args.op, problem, operation.fingerprint(), {})
    study = optuna.create_study(study_name=name, storage=open_storage(settings.storage), direction="minimize",
                                sampler=make_sampler("tpe", None), load_if_exists=True)
    for config in bad:
        study.enqueue_trial(enqueue_params(space, config))
    print(f"planted: out_of_bounds in {bad[0]}\n         hang in {bad[1]}", flush=True)

    db = TuningDatabase()
    outcome = Tuner(source, db, settings, progress=False).tune(args.op, problem)
    source.close()
    print(f"finished: {outcome.measured} measured, failures {dict(outcome.failures)}, "
          f"stopped after {outcome.stopped_because}; worker restarts {source.worker.restarts}")
    failures = {t.user_attrs.get("result", {}).get("failure") for t in study.get_trials()}
    checks = {
        "run finished with a winner": outcome.best is not None,
        "out-of-bounds variant failed as a device error": "device_error" in failures,
        "hanging variant failed as a timeout": "timeout" in failures,
    }
    # The user database of this run (the shipped records are not part of the run).
    mine = [r for r in TuningDatabase(shipped_dir=work / "no-shipped").records()
            if r.key.op == args.op and r.key.problem == problem.to_dict()]
    checks["no planted variant stored"] = all(r.config != b.as_dict() for r in mine for b in bad)
    checks["one record stored for the problem"] = len(mine) == 1
    stored = mine[0] if mine else None
    if stored is not None:
        with MeasureWorker(0, timeout_s=60) as w:
            again = w.run(MeasureJob(args.op, problem.to_dict(), stored.config, time_it=False))
        checks["stored config verifies again in a fresh worker (NVRTC)"] = again.ok
    for what, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
