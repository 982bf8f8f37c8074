"""Tuner processes for the tests of shared studies and crash recovery: each runs a Tuner on a
replay file (recorded GPU measurements) in a process of its own, paced like a GPU, and logs every
measurement the moment the source hands it out (one O_APPEND write a line, so the log survives a
SIGKILL of the process). Started with ``spawn(job)``; the job is a JSON-able dict (see ``main``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def spawn(job: dict[str, Any]) -> subprocess.Popen:
    """A real process running ``main(job)`` (killable with SIGKILL)."""
    code = "import json, sys; from tests.replay_workers import main; main(json.loads(sys.argv[1]))"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(job)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_log(path: Path) -> list[tuple[str, str, str]]:
    """(pid, phase, config key) of every measurement logged; a torn last line is dropped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
    return out


def main(job: dict[str, Any]) -> None:
    """Tune one replayed problem. Job keys: replay, storage, db_dir, trials, batch, pace_s, log,
    result (a JSON file written at the end), go (a file to wait for before starting, optional),
    seed (optional), device_name (optional: a replay device of another name, i.e. another GPU kind)."""
    os.environ["AUTOCNN_TUNING_DB"] = job["db_dir"]
    import dataclasses

    import autocnn.search.tuner as tuner_module
    from autocnn.store import TuningDatabase
    from autocnn.measurement.sources import ReplayFile, ReplaySource
    from autocnn.search.tuner import TuneSettings, Tuner

    rf = ReplayFile.load(Path(job["replay"]))
    if job.get("device_name"):
        rf = dataclasses.replace(rf, device=dataclasses.replace(rf.device, name=job["device_name"]))
    log_fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pid = os.getpid()

    class PacedSource(ReplaySource):
        phase = "search"

        def measure(self, op, problem, configs):
            for r in super().measure(op, problem, configs):
                time.sleep(job["pace_s"])   # a GPU measurement takes time: tuners overlap
                os.write(log_fd, f"{pid} {self.phase} {r.config.key()}\n".encode())
                yield r

    source = PacedSource([rf])
    confirm = tuner_module.confirm_and_store

    def confirm_phase(*args, **kwargs):
        source.phase = "confirm"
        return confirm(*args, **kwargs)

    tuner_module.confirm_and_store = confirm_phase
    settings = TuneSettings(trials=job["trials"], storage=job["storage"], fixed=rf.space_filter,
                            batch=job["batch"], confirm_rounds=1, seed=job.get("seed"))
    if job.get("go"):
        Path(job["log"] + ".ready").write_text("ready")
        deadline = time.monotonic() + 120
        while not Path(job["go"]).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    # No shipped records: a faster shipped record of the replayed shape would keep the tuned one out.
    db = TuningDatabase(shipped_dir=Path(job["db_dir"]) / "no-shipped")
    outcome = Tuner(source, db, settings, progress=False).tune(rf.op, rf.problem)
    Path(job["result"]).write_text(json.dumps({
        "pid": pid, "measured": outcome.measured, "study_measured": outcome.study_measured,
        "recovered": outcome.recovered, "best_us": outcome.best.time_us if outcome.best else None,
        "stored": outcome.record is not None, "stopped": outcome.stopped_because}))
