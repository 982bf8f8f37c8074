"""Who is measuring a trial, and whether they still are.

Every trial a tuner takes is marked with its owner: the host (name and boot), the process (pid and
its start time, so a reused pid is not mistaken for the owner) and the tuner within the process
(one per GPU). A RUNNING trial is in flight while its owner lives; once the owner is gone the trial
is abandoned, and the next tuner to look fails it and queues its config again (``trials``).

How an owner is known to be gone:
- on this host: its process no longer exists (or the pid now belongs to another process), or, in
  this very process, its tuner has ended;
- on another host (a shared PostgreSQL storage): its process stopped writing the heartbeat it
  keeps in the study's attributes every HEARTBEAT_S for HEARTBEAT_GRACE_S (a host that lost power);
- a trial without an owner: at once, since tuners take trials and mark them under the study's
  lock (``study_lock``), which whoever asks holds: its tuner died while taking it;
- a trial of a remote process that never wrote a heartbeat, after STALE_TRIAL_S (no measurement
  takes that long).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

OWNER_ATTR = "owner"
HEARTBEAT_PREFIX = "heartbeat:"
HEARTBEAT_S = 15.0
HEARTBEAT_GRACE_S = 120.0     # eight missed beats, and room for clocks a minute apart
STALE_TRIAL_S = 900.0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()[:8]
    except OSError:
        return "0"


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None when it does not exist. Where
    /proc is missing, 0 for any process that exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] == b"Z":
        return None   # a zombie: dead, its parent has not reaped it yet
    return int(fields[19])


@dataclass(frozen=True)
class Owner:
    host: str         # host name and boot id
    pid: int
    started: int      # the process's start time (process_start); 0 where unknown
    tuner: str        # a tuner of that process

    @property
    def process(self) -> str:
        return f"{self.host}/{self.pid}/{self.started}"

    def to_attr(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started": self.started, "tuner": self.tuner}

    @staticmethod
    def from_attr(value: Any) -> "Owner | None":
        try:
            return Owner(str(value["host"]), int(value["pid"]), int(value["started"]), str(value["tuner"]))
        except (KeyError, TypeError, ValueError):
            return None

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host.split('/')[0]}"


def this_host() -> str:
    return f"{socket.gethostname()}/{_boot_id()}"


def new_owner() -> Owner:
    """A new owner identity for a tuner of this process; registered live until ``retire``."""
    pid = os.getpid()
    owner = Owner(this_host(), pid, process_start(pid) or 0, uuid.uuid4().hex[:12])
    with _guard:
        _live_tuners.add(owner.tuner)
    return owner


def retire(owner: Owner) -> None:
    """The tuner has ended: trials it still holds RUNNING are abandoned from now on."""
    with _guard:
        _live_tuners.discard(owner.tuner)


_guard = threading.Lock()
_live_tuners: set[str] = set()


@dataclass(frozen=True)
class Liveness:
    """Judges owners of RUNNING trials at one moment, from the study's heartbeats."""

    heartbeats: Mapping[str, float]      # process -> time of its last beat (seconds since the epoch)
    now: float
    host: str

    @staticmethod
    def of(study_user_attrs: Mapping[str, Any]) -> "Liveness":
        beats = {k[len(HEARTBEAT_PREFIX):]: float(v) for k, v in study_user_attrs.items()
                 if k.startswith(HEARTBEAT_PREFIX) and isinstance(v, (int, float))}
        return Liveness(beats, time.time(), this_host())

    def gone(self, owner: Owner | None, trial_started: _dt.datetime | None) -> str | None:
        """Why the owner of a RUNNING trial is gone, or None while it may still be measuring."""
        if owner is not None and owner.host == self.host:
            if owner.pid == os.getpid() and owner.started == (process_start(owner.pid) or 0):
                with _guard:
                    return None if owner.tuner in _live_tuners else f"its tuner in {owner} has ended"
            started = process_start(owner.pid)
            if started is None or (owner.started and started != owner.started):
                return f"{owner} has ended"
            return None
        if owner is None:
            # Tuners take trials and mark their owners under the study's lock, which the caller
            # holds: an owner-less RUNNING trial is one whose tuner died while taking it.
            return "its tuner ended while taking it"
        if owner.process in self.heartbeats:
            silent = self.now - self.heartbeats[owner.process]
            return f"{owner} sent no heartbeat for {silent:.0f} s" if silent > HEARTBEAT_GRACE_S else None
        if trial_started is None:
            return None
        age = (_dt.datetime.now() - trial_started).total_seconds()
        return f"it has been running for {age:.0f} s" if age > STALE_TRIAL_S else None


class Heartbeats:
    """One thread per process that writes this process's heartbeat into every study it works on
    in a remote storage, every HEARTBEAT_S."""

    def __init__(self) -> None:
        self._studies: dict[tuple[int, int], tuple[Any, int, int]] = {}   # (id(storage), study) -> (storage, study, uses)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._key = HEARTBEAT_PREFIX + Owner(this_host(), os.getpid(), process_start(os.getpid()) or 0, "").process

    @contextlib.contextmanager
    def beating(self, storage: Any, study_id: int) -> Iterator[None]:
        slot = (id(storage), study_id)
        storage.set_study_user_attr(study_id, self._key, time.time())   # peers see this process at once
        with self._lock:
            _, _, uses = self._studies.get(slot, (storage, study_id, 0))
            self._studies[slot] = (storage, study_id, uses + 1)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="autocnn-heartbeat", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                storage, study_id, uses = self._studies[slot]
                if uses <= 1:
                    del self._studies[slot]
                else:
                    self._studies[slot] = (storage, study_id, uses - 1)

    def _run(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                targets = [(s, i) for s, i, _ in self._studies.values()]
            for storage, study_id in targets:
                try:
                    storage.set_study_user_attr(study_id, self._key, time.time())
                except Exception:  # noqa: BLE001 - a dropped connection: the next beat tries again
                    pass


HEARTBEATS = Heartbeats()
