"""Where Optuna keeps a study's trials: the storage URLs autocnn accepts, and opening them.

Several tuner processes share a study by pointing at one storage. What each form is for:

- ``sqlite:///PATH``: a SQLite file (the default, in the autocnn cache directory); processes on
  one host share it.
- ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB``: the way to share studies between hosts. Needs
  psycopg 3 (``pip install 'psycopg[binary]'``) or psycopg2; a URL naming no driver gets the one
  installed (``postgresql+psycopg://`` or ``postgresql+psycopg2://`` choose).
- ``journal:PATH`` or a path ending in ``.log``, ``.journal`` or ``.jsonl``: Optuna's journal file;
  processes on one host share it.
- ``memory``: nothing kept (replay experiments).

Anything else is refused by ``parse_storage`` with the list above, before any device is touched:
every accepted form has a lock that hands each config to one process (``study_lock``), which a
storage autocnn does not know could not promise.
"""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal

import optuna

StorageKind = Literal["sqlite", "postgresql", "journal", "memory"]
JOURNAL_SUFFIXES = (".log", ".journal", ".jsonl")
ACCEPTED_FORMS = ("sqlite:///PATH (a SQLite file, shared by the processes of one host); "
                  "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (shared between hosts; needs psycopg); "
                  "journal:PATH or a PATH ending in .log, .journal or .jsonl (an Optuna journal file, "
                  "shared by the processes of one host); memory (nothing kept)")
# SQLite waits this long for another process's write before giving up.
SQLITE_BUSY_TIMEOUT_S = 60
# A PostgreSQL host that drops packets (a firewall, a host that is down) fails the connection after
# this long, instead of the TCP stack's minutes.
POSTGRES_CONNECT_TIMEOUT_S = 10


class StorageUrlError(ValueError):
    """A --storage value autocnn cannot use; says what was given and which forms are accepted."""

    def __init__(self, url: str, why: str):
        from autocnn.store import redact_storage_url

        self.url, self.why = url, why
        super().__init__(f"--storage {redact_storage_url(url)!r}: {why}. Accepted forms: {ACCEPTED_FORMS}")


@dataclass(frozen=True)
class StorageSpec:
    """A parsed storage: its kind, the URL Optuna opens (RDB) and the file behind it (local kinds)."""

    kind: StorageKind
    url: str                  # as given (with the postgres:// spelling normalised)
    path: str | None = None   # the SQLite or journal file; None for PostgreSQL and memory

    @property
    def local(self) -> bool:
        """True when every process sharing it runs on this host (a file lock orders them)."""
        return self.kind in ("sqlite", "journal")


def default_storage_url() -> str:
    from autocnn.kernels.compiler import cache_root

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'optuna.db'}"


def parse_storage(url: str | None) -> StorageSpec:
    """Check a storage URL and say what it is; StorageUrlError naming the accepted forms otherwise."""
    if url is None:
        url = default_storage_url()
    if not isinstance(url, str) or not url.strip():
        raise StorageUrlError(str(url), "is empty")
    url = url.strip()
    if url == "memory":
        return StorageSpec("memory", url)
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        if not path:
            raise StorageUrlError(url, "names no journal file after 'journal:'")
        return StorageSpec("journal", url, path)
    if "://" not in url:
        if url.endswith(JOURNAL_SUFFIXES):
            return StorageSpec("journal", url, url)
        raise StorageUrlError(url, "is neither a URL nor a journal file name")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        if not url.startswith("sqlite:///"):
            raise StorageUrlError(url, "a SQLite URL has three slashes before its path (sqlite:///PATH)")
        path = urllib.parse.unquote(url[len("sqlite:///"):].split("?", 1)[0])
        if path in ("", ":memory:"):
            raise StorageUrlError(url, "names no SQLite file (an in-memory SQLite database is not shared)")
        return StorageSpec("sqlite", url, path)
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        if scheme == "postgres":   # libpq's spelling, which SQLAlchemy does not take
            url = "postgresql" + url[len("postgres"):]
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port   # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as exc:
            raise StorageUrlError(url, f"does not parse ({exc})") from None
        if not parts.path.strip("/"):
            raise StorageUrlError(url, "names no database (postgresql://USER@HOST/DATABASE)")
        if not parts.hostname and "host=" not in parts.query:
            raise StorageUrlError(url, "names no host (postgresql://USER@HOST/DATABASE, or ?host=/socket/dir)")
        return StorageSpec("postgresql", _with_driver(url) if scheme in ("postgresql", "postgres") else url)
    raise StorageUrlError(url, f"the scheme {scheme!r} is not one autocnn shares studies through")


POSTGRES_DRIVERS = ("psycopg", "psycopg2")   # in order of preference


def _with_driver(url: str) -> str:
    """A postgresql:// URL with the installed driver named: SQLAlchemy's default differs between its
    versions (psycopg2 before 2.1, psycopg 3 since), and either may be the one installed."""
    import importlib.util

    for driver in POSTGRES_DRIVERS:
        if importlib.util.find_spec(driver) is not None:
            return f"postgresql+{driver}://" + url.split("://", 1)[1]
    return url   # _require_driver says what to install


def open_storage(url: str | None) -> Any:
    """The Optuna storage for a URL (see ``parse_storage``)."""
    spec = parse_storage(url)
    if spec.kind == "memory":
        return optuna.storages.InMemoryStorage()   # nothing kept: studies of replay experiments
    if spec.kind == "journal":
        from optuna.storages import JournalStorage

        try:
            from optuna.storages.journal import JournalFileBackend as _Backend
        except ImportError:  # Optuna < 4
            from optuna.storages import JournalFileStorage as _Backend
        return JournalStorage(_Backend(spec.path))
    if spec.kind == "sqlite":
        _sqlite_pragmas()
        return optuna.storages.RDBStorage(spec.url, engine_kwargs={"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}})
    _require_driver(spec)
    # pool_pre_ping: a connection the server dropped (restart, idle timeout) is replaced, not failed on.
    return optuna.storages.RDBStorage(spec.url, engine_kwargs={
        "pool_pre_ping": True, "connect_args": {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}})


def _driver_reason(exc: BaseException) -> str:
    """The first line of what the database driver said (SQLAlchemy wraps it in ``orig``), less
    libpq's "connection to server ... failed:" and "FATAL:" preambles."""
    inner = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(inner).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(inner).__name__
    if "failed: " in text:
        text = text.rsplit("failed: ", 1)[1]
    for preamble in ("FATAL:", "ERROR:"):
        if text.startswith(preamble):
            text = text[len(preamble):].strip()
    return text.rstrip(".")


def storage_failure(spec: StorageSpec, exc: BaseException) -> str:
    """One sentence on why a storage did not open: the URL (password hidden), what the server or
    the file said, and what to do."""
    from autocnn.store import redact_storage_url

    url = redact_storage_url(spec.url)
    reason = _driver_reason(exc)
    low = reason.lower()
    if "no longer compatible with the table schema" in str(exc) or "optuna storage upgrade" in str(exc):
        return (f"the Optuna storage {url} has tables of another Optuna version; upgrade them with "
                f"`optuna storage upgrade --storage {url}` or give another --storage")
    if spec.kind == "postgresql":
        if "does not exist" in low and "database" in low:
            return (f"the PostgreSQL server of --storage {url} says: {reason}; create the database (createdb) "
                    f"or name one that exists")
        if "role" in low or "password" in low or "authentication" in low or "permission denied" in low:
            return (f"the PostgreSQL server of --storage {url} refused the connection: {reason}; check the user "
                    f"and password in the URL and the server's access rules")
        if "timeout" in low or "timed out" in low or "refused" in low or "could not translate" in low \
                or "no route" in low or "unreachable" in low or "connect" in low:
            return (f"cannot reach the PostgreSQL server of --storage {url}: {reason}; start the server or check "
                    f"the host and port in the URL")
        return f"the PostgreSQL storage {url} cannot be used: {reason}; check the URL and the server"
    return f"the Optuna storage {url} cannot be opened: {reason}; give --storage a file you can write"


def _require_driver(spec: StorageSpec) -> None:
    """A PostgreSQL URL without its driver fails with the install line, not a SQLAlchemy traceback."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(spec.url).get_dialect().import_dbapi()
    except (NoSuchModuleError, ArgumentError) as exc:
        raise StorageUrlError(spec.url, f"no SQLAlchemy dialect for it ({exc})") from None
    except ImportError as exc:
        raise StorageUrlError(spec.url, f"its database driver is not installed ({exc}); "
                                        f"pip install 'psycopg[binary]'") from None


_PRAGMAS_INSTALLED = False


def _sqlite_pragmas() -> None:
    """WAL journaling with synchronous=FULL: readers never block the writer, and every commit is on
    disk before it returns, so a host that loses power loses no told trial (with synchronous=NORMAL
    it could lose every commit since the last checkpoint). In WAL mode a commit costs one fsync of
    the log, appended sequentially."""
    global _PRAGMAS_INSTALLED
    if _PRAGMAS_INSTALLED:
        return
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _pragmas(dbapi_connection, _record):  # noqa: ANN001
        if isinstance(dbapi_connection, sqlite3.Connection):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.close()

    _PRAGMAS_INSTALLED = True
