"""Records the database could not take (a full disk, a directory made read-only mid-run, a lock
held too long): written to a file of the database format instead, so that nothing measured is lost
and ``autocnn db import FILE`` adds them later.

One file per process, rewritten with every record kept so far (a network run that cannot store
twenty records leaves one file), in the working directory or, where that cannot be written either,
the temporary directory.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

from autocnn.store.files import atomic_write_json, file_document
from autocnn.store.records import TuningRecord

_kept: list[TuningRecord] = []
_path: Path | None = None
_guard = threading.Lock()   # tuners of several GPUs store from their own threads


def _candidates() -> list[Path]:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"autocnn-unstored-records-{stamp}-{os.getpid()}.json"
    return [Path.cwd() / name, Path(tempfile.gettempdir()) / name]


def keep_unstored(record: TuningRecord) -> Path:
    """Write ``record`` (and those kept before in this process) to this process's fallback file;
    returns its path. OSError only when neither the working nor the temporary directory takes it."""
    global _path
    with _guard:
        _kept.append(record)
        document = file_document([r.to_dict() for r in _kept])
        tried = [_path] if _path is not None else _candidates()
        error: OSError | None = None
        for path in tried + [p for p in _candidates() if p not in tried]:
            try:
                atomic_write_json(path, document)
            except OSError as exc:
                error = exc
                continue
            _path = path
            return path
        assert error is not None
        raise error
