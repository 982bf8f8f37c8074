"""What the command line checks before a command starts work (``autocnn.preflight`` does the
probing), and how it shows what library code warns about.

``autocnn tune`` checks the cache directory (compiled kernels), the tuning database directory, the
Optuna storage (opened, and kept for the run) and its replay files (each readable, one for every
problem of the run, recorded with held parameters that --fix does not contradict) before a
measurement source opens; ``db import`` and ``db remove`` the database directory; ``train`` its
``--seed``, ``--batch-size`` and ``--save`` and, on the cuda backend, the directories it writes
into. Each failure is one sentence naming the path, the URL or the value.
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

from autocnn.preflight import check_cache, check_database, check_storage, writable_file

MAX_SEED = 2**32 - 1   # what the samplers (NumPy's generators) take


def check_seed(seed: int | None, what: str = "--seed") -> None:
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{what} must be a whole number from 0 to {MAX_SEED}, not {seed}")


def say(text: str) -> None:
    """A line for the user on stderr (said with --json too: it is not the command's result)."""
    print(f"autocnn: {text}", file=sys.stderr)


def quiet_database(**kwargs: Any) -> Any:
    """The user's TuningDatabase, saying on stderr when it waits for a lock held elsewhere."""
    from autocnn.store import TuningDatabase

    db = TuningDatabase(**kwargs)
    db.on_lock_wait = say
    return db


def tune_preflight(db: Any, storage: str | None, replay: Sequence[Path] | None, problems: Sequence[Any] | None,
                   fixed: dict[str, Any]) -> None:
    """Everything ``autocnn tune`` needs at its end, before a source opens (see the module's text)."""
    check_cache()
    check_database(db)
    check_storage(storage)
    if replay:
        for note in replay_notes(replay, problems, fixed):
            say(note)


def replay_notes(paths: Sequence[Any], problems: Sequence[Any] | None, fixed: dict[str, Any]) -> list[str]:
    """Check the --replay files against the run (ReplayFileError or ValueError naming the file) and
    say which held parameters they bring: each was recorded over a space with some parameters
    held (its ``space_filter``), answers nothing outside it, and the tuner holds them too."""
    from autocnn.measurement.sources import ReplayFile, ReplayFileError
    from autocnn.search.tuner import fixed_text

    files = [ReplayFile.load(p) for p in paths]
    used = files
    if problems is not None:
        missing = [p for p in problems if not any(f.op == p.op and f.problem == p for f in files)]
        if missing:
            have = "; ".join(f"{f.path}: {f.op} {f.problem.shape_string()}" for f in files)
            raise ReplayFileError(f"--replay: no file given holds {missing[0].op} {missing[0].shape_string()} "
                                  f"({len(missing)} of the run's {len(problems)} problems have none); the files "
                                  f"hold {have}")
        used = [f for f in files if any(f.op == p.op and f.problem == p for p in problems)]
    notes = []
    for f in used:
        clash = sorted(k for k in f.held if k in fixed and fixed[k] != f.held[k])
        if clash:
            raise ValueError(f"--replay {f.path} was recorded with {fixed_text(f.held)} held, but --fix holds "
                             f"{', '.join(f'{k}={fixed[k]}' for k in clash)}: it holds no measurement of such "
                             f"configs; give --fix {fixed_text({**fixed, **f.held})} or leave those out")
        extra = {k: v for k, v in f.held.items() if k not in fixed}
        if extra:
            notes.append(f"holding {fixed_text(extra)} for {f.op} {f.problem.shape_string()}: {f.path} was "
                         f"recorded with them held and holds no other config")
    return notes


def train_preflight(seed: int | None, batch_size: int, epochs: int, limit: int | None, save: Path | None,
                    backend: str, autotune: str | None) -> None:
    """``autocnn train``'s values and the places it writes into, before any data is read."""
    check_seed(seed)
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, not {batch_size}")
    if epochs < 1:
        raise ValueError(f"--epochs must be at least 1, not {epochs}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, not {limit}")
    if save is not None:
        writable_file(save, "--save")
    if backend == "cuda":
        check_cache()   # compiled kernels
        if autotune != "off":
            from autocnn.store import TuningDatabase

            check_database(TuningDatabase())   # quick tuning stores its records


def _one_line_warning(message: Any, category: Any, filename: str, lineno: int, line: str | None = None) -> str:
    # What a user acts on is the message; the Python line that warned is not theirs to read.
    name = getattr(category, "__name__", "Warning")
    kind = "note" if name in ("StaleRecordWarning",) else "warning"
    return f"autocnn: {kind}: {message}\n"


@contextlib.contextmanager
def plain_warnings() -> Iterator[None]:
    """Warnings printed as one ``autocnn: warning: ...`` line, without the source line that warned."""
    previous = warnings.formatwarning
    warnings.formatwarning = _one_line_warning   # type: ignore[assignment]
    try:
        yield
    finally:
        warnings.formatwarning = previous
