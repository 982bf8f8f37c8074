"""What a command needs at its end, checked before it starts any search, compile or device work.

A tuning run that measures for an hour and then cannot write its record has lost the hour; so has
a training run whose weights cannot be saved. Each check here fails with one sentence
(EnvironmentCheckError) naming the path or URL and what to do:

- a directory the command writes into (the tuning database, the cache with compiled kernels and
  the default Optuna storage, the folder of ``--save`` or ``--out``) is probed by creating and
  removing a file in it, or, where it does not exist yet, in its nearest existing ancestor: a
  permission bit says nothing for root, a read-only or full file system only answers a write;
- an Optuna storage is opened, as the tuner will open it (``storage.shared_storage``, which keeps
  it for the run): an unreachable server, a database that does not exist, a user the server
  refuses or a schema of another Optuna version are named with the URL (password hidden).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from autocnn.errors import EnvironmentCheckError

CACHE_REMEDY = "set AUTOCNN_CACHE_DIR (or XDG_CACHE_HOME) to a directory you can write"
DATABASE_REMEDY = "make it writable, or set AUTOCNN_TUNING_DB to a directory you can write"


def os_reason(exc: OSError) -> str:
    """An OSError in a few words: "Permission denied", "No space left on device"."""
    return exc.strerror or str(exc) or type(exc).__name__


def _nearest_existing(path: Path) -> Path:
    current = path
    while not current.exists() and current.parent != current:
        current = current.parent
    return current


def writable_directory(path: Path, what: str, remedy: str) -> None:
    """Raise EnvironmentCheckError unless files can be created in ``path``, or ``path`` can be
    created (its nearest existing ancestor is then probed; nothing is left behind)."""
    path = Path(path).expanduser()
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise EnvironmentCheckError(f"{what} {path} cannot be a directory: {existing} is a file; {remedy}")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".autocnn-probe-")
        try:
            os.write(fd, b"probe")   # a full file system may take the name and refuse the bytes
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        where = "" if existing == path else f" (it would be made in {existing})"
        raise EnvironmentCheckError(f"{what} {path} is not writable{where}: {os_reason(exc)}; {remedy}") from None


def writable_file(path: Path, what: str) -> None:
    """Raise EnvironmentCheckError unless a file can be written at ``path``: its directory exists and
    takes a file, and ``path`` is not a directory."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise EnvironmentCheckError(f"{what} {path} is a directory; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise EnvironmentCheckError(f"{what} {path}: the directory {parent} does not exist; create it first "
                                    f"or give a path in an existing directory")
    writable_directory(parent, f"{what} {path}: the directory", "give a path in a directory you can write")


def check_cache() -> Path:
    """The autocnn cache directory (compiled kernels, the default Optuna storage), writable."""
    from autocnn.kernels.compiler import cache_root

    root = cache_root()
    writable_directory(root, "the autocnn cache directory", CACHE_REMEDY)
    return root


def check_database(db) -> None:   # noqa: ANN001 - a TuningDatabase (imported lazily by callers)
    """The user tuning database directory of ``db`` takes new files."""
    writable_directory(db.user_dir, "the tuning database directory", DATABASE_REMEDY)


def check_storage(url: str | None) -> None:
    """Open the Optuna storage the tuner will use (kept open for the run) or say in one sentence why
    it cannot be; for a SQLite or journal file, its directory must take files first."""
    from autocnn.search.storage import parse_storage, storage_failure
    from autocnn.search.study_lock import shared_storage

    if url is None:
        check_cache()   # the default SQLite file lives in the cache directory
    spec = parse_storage(url)   # StorageUrlError for a form autocnn does not take
    if spec.kind == "memory":
        return
    if spec.local:
        writable_directory(Path(spec.path).expanduser().resolve().parent, "the Optuna storage's directory",
                           "give --storage a file in a directory you can write")
    try:
        shared_storage(spec)
    except Exception as exc:  # noqa: BLE001 - every way a storage fails to open is told in one sentence
        if isinstance(exc, EnvironmentCheckError):
            raise
        raise EnvironmentCheckError(storage_failure(spec, exc)) from None
