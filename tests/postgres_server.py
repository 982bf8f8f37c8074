"""A throwaway PostgreSQL server for the tests: initdb and pg_ctl from Debian's postgresql package
(/usr/lib/postgresql/<version>/bin) in a temporary directory, listening only on a Unix socket in
that directory (no TCP port is opened; the socket's name still carries a free port number).

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` user that the
package creates, in a directory handed to that user.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60


def postgres_bin() -> Path | None:
    """The newest installed server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(found[-1]).parent if found else None


def unavailable_reason() -> str | None:
    """Why no server can be started here, or None."""
    bindir = postgres_bin()
    if bindir is None:
        return "PostgreSQL server binaries are not installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    if not any(importlib.util.find_spec(d) for d in ("psycopg", "psycopg2")):
        return "no PostgreSQL driver is installed (pip install 'psycopg[binary]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    bindir: Path
    root: Path          # holds the data directory and the socket
    port: int
    _user: pwd.struct_passwd | None

    @staticmethod
    def start() -> "PostgresServer":
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        bindir = postgres_bin()
        user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="autocnn-pg-"))
        if user is not None:
            os.chown(root, user.pw_uid, user.pw_gid)
        server = PostgresServer(bindir, root, _free_port(), user)
        server._run("initdb", "-D", str(root / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                    "--no-sync")
        options = f"-c listen_addresses='' -c unix_socket_directories={root} -p {server.port} -c fsync=off"
        try:
            server._run("pg_ctl", "-D", str(root / "data"), "-o", options, "-l", str(root / "log"),
                        "-w", "-t", str(START_TIMEOUT_S), "start")
        except RuntimeError:
            log = (root / "log").read_text() if (root / "log").exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"the PostgreSQL server did not start:\n{log[-2000:]}") from None
        return server

    def _run(self, tool: str, *args: str) -> str:
        cmd = [str(self.bindir / tool), *args]
        kwargs = {}
        if self._user is not None:
            uid, gid = self._user.pw_uid, self._user.pw_gid

            def drop() -> None:
                os.setgid(gid)
                os.setuid(uid)

            kwargs["preexec_fn"] = drop
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S + 30,
                              cwd=self.root, **kwargs)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc.stdout

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL of a database of this server (through its Unix socket)."""
        return f"postgresql://postgres@/{database}?host={self.root}&port={self.port}"

    def create_database(self, name: str) -> str:
        from sqlalchemy import create_engine, text

        from autocnn.search.storage import parse_storage

        engine = create_engine(parse_storage(self.url()).url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
