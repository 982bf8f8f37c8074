"""The lock under which a study hands out configs, so two tuners never take the same one, and the
storage each process opens once under the storage's lock.

Between reading what a study holds (finished and in-flight configs) and marking a new config as
in flight, no other tuner may do the same. For a storage on this host (SQLite, journal) a file lock
per study beside it (in ``PATH.locks/``; flock, so a killed holder releases it) orders
processes; for PostgreSQL a session-level advisory lock keyed by the study name
orders processes on every host (the server releases it when a holder's connection dies, so a killed
tuner never leaves it held). Threads of one process (one tuner per GPU) also take a lock of their
own, since a file lock is re-entrant within a process.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from autocnn.search.storage import POSTGRES_CONNECT_TIMEOUT_S, StorageSpec, open_storage

STORAGE_LOCK = "(the storage itself)"   # the name whose lock guards creating a storage's tables
LOCK_TIMEOUT_S = 600.0   # holders keep it for one proposal (milliseconds); minutes means a stuck process
_POLL_S = 0.05

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()
_engines: dict[str, Any] = {}
_shared: dict[str, Any] = {}
_shared_guard = threading.Lock()


class StudyLockTimeout(RuntimeError):
    """Another tuner held a study's lock for longer than LOCK_TIMEOUT_S."""


def _thread_lock(name: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(name, threading.Lock())


def lock_file(spec: StorageSpec, study_name: str) -> Path:
    """The file lock of one study of a local storage: one per study, so that tuners of different
    problems (one per GPU) never wait for each other's proposals."""
    digest = hashlib.sha256(study_name.encode()).hexdigest()[:20]
    return Path(f"{spec.path}.locks") / f"{digest}.lock"


def advisory_key(study_name: str) -> int:
    """A signed 64-bit key for pg_advisory_lock, the same on every host for one study."""
    return int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def study_lock(spec: StorageSpec, study_name: str, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the study's lock for the block (see the module's text for which lock)."""
    local = _thread_lock(f"{spec.path or spec.url}|{study_name}")
    if not local.acquire(timeout=timeout_s):
        raise StudyLockTimeout(f"another thread held the lock of study {study_name} for {timeout_s:.0f} s")
    try:
        if spec.local:
            from filelock import FileLock, Timeout

            path = lock_file(spec, study_name)
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with FileLock(str(path), timeout=timeout_s):
                    yield
            except Timeout:
                raise StudyLockTimeout(f"{path} (the lock of study {study_name}) was held for {timeout_s:.0f} s "
                                       f"by another process") from None
        elif spec.kind == "postgresql":
            with _advisory_lock(spec, advisory_key(study_name), study_name, timeout_s):
                yield
        else:
            yield   # memory: one process, and the thread lock above orders its threads
    finally:
        local.release()


@contextlib.contextmanager
def _advisory_lock(spec: StorageSpec, key: int, study_name: str, timeout_s: float) -> Iterator[None]:
    from sqlalchemy import text

    engine = _engine(spec)
    with engine.connect() as conn:
        deadline = time.monotonic() + timeout_s
        # pg_try_advisory_lock in a loop rather than pg_advisory_lock: a wait that can time out.
        while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
            if time.monotonic() > deadline:
                raise StudyLockTimeout(f"the advisory lock of study {study_name} was held for {timeout_s:.0f} s "
                                       f"by another tuner")
            time.sleep(_POLL_S)
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()


def _engine(spec: StorageSpec) -> Any:
    """One small engine per PostgreSQL URL for the lock's connections (apart from Optuna's pool)."""
    engine = _engines.get(spec.url)
    if engine is None:
        from sqlalchemy import create_engine

        engine = _engines[spec.url] = create_engine(spec.url, pool_pre_ping=True, pool_size=2, max_overflow=4,
                                                    connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S})
    return engine


def shared_storage(spec: StorageSpec) -> Any:
    """This process's one storage object for a URL (tuners of several GPUs share it: Optuna's
    storages are thread-safe), opened under the storage's lock: processes that start together
    would otherwise race to create the same tables. ``memory`` is a new, empty storage each time."""
    if spec.kind == "memory":
        return open_storage(spec.url)
    with _shared_guard:
        storage = _shared.get(spec.url)
        if storage is None:
            with study_lock(spec, STORAGE_LOCK):
                storage = _shared[spec.url] = open_storage(spec.url)
        return storage
