"""The process behind a lease, where the operating system can say: a holder killed with SIGKILL is
gone at once, not only when its lease lapses, and a holder whose lease lapsed while its process still
runs (waiting for SQLite's write lock behind another partition's chunk) is not taken for dead.

An attempt an Airflow task runs holds its lease under the owner ``<ti id>/try<N>@<host>:<pid>``
(``operators/task_instance.py``). When that host is this one and ``/proc`` is there, the process is
looked up by its pid; a pid reused by a process started after the lease was taken is the holder
gone. Anything else (another host, an owner of another form, no ``/proc``) is unknown, and a slot is
then judged by its lease alone.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import time
from datetime import datetime

__all__ = ["HolderProcess", "ProcessStat", "exists", "holder_process", "process_started", "read_stat", "RUNS"]

#: States of a process that runs or waits for something that comes (sleep, disk, idle).
RUNS = frozenset("RSDIW")
#: Stopped: SIGSTOP, Ctrl-Z or a debugger. It holds what it held, and does nothing.
_STOPPED = frozenset("Tt")
#: Slack between the database's clock (the lease's acquisition) and this host's (the process's start
#: time): a PostgreSQL server elsewhere may be that far apart, and a pid is not reused that fast.
_CLOCK_SLACK = 60.0
#: A pid as the owner writes it: ASCII digits only (``str.isdigit`` takes ``'²'``, ``int`` does not).
_PID = re.compile(r"[0-9]{1,7}")
#: Linux's largest pid (``/proc/sys/kernel/pid_max`` is at most 2**22).
_PID_MAX = 2**22


@dataclasses.dataclass(frozen=True)
class HolderProcess:
    """The holder's process on this host: ``state`` is ``runs``, ``stopped`` or ``gone``."""

    host: str
    pid: int
    state: str

    def describe(self) -> str:
        return f"its process (pid {self.pid} on {self.host}) " + {
            "runs": "still runs", "stopped": "is stopped (SIGSTOP, Ctrl-Z or a debugger)", "gone": "is gone",
        }[self.state]


def holder_process(owner: str | None, acquired_at: datetime | None) -> HolderProcess | None:
    """The process of this host behind the lease ``owner`` (``...@host:pid``) taken at ``acquired_at``,
    or None when the system cannot say (see the module docstring)."""
    if not owner or "@" not in owner or acquired_at is None:
        return None
    host, _, pid_text = owner.rpartition("@")[2].rpartition(":")
    if not _PID.fullmatch(pid_text) or host != socket.gethostname() or not os.path.isdir("/proc/self"):
        return None
    pid = int(pid_text)
    if not 1 < pid <= _PID_MAX or pid == os.getpid():
        return None  # no process of a task (pid 1 is a container's init; this reader is not the holder)
    acquired = acquired_at.timestamp()
    if acquired > time.time() + _CLOCK_SLACK:
        return None  # a lease taken in the future: a clock apart, or a hand-edited row
    found = read_stat(pid)
    if found is None:
        return None if exists(pid) else HolderProcess(host, pid, "gone")
    state, started = found.state, found.started
    if state not in RUNS | _STOPPED or (started is not None and started > acquired + _CLOCK_SLACK):
        return HolderProcess(host, pid, "gone")  # a zombie, or the pid taken by a process started since
    return HolderProcess(host, pid, "stopped" if state in _STOPPED else "runs")


@dataclasses.dataclass(frozen=True)
class ProcessStat:
    """What ``/proc/<pid>/stat`` says of a process of this host: its ``name``, its ``state`` letter
    (``R``, ``S``, ``T``, ``Z``...) and when it ``started`` (seconds since the epoch; None if unknown)."""

    name: str
    state: str
    started: float | None


def read_stat(pid: int) -> ProcessStat | None:
    """The one reading of ``/proc/<pid>/stat`` (the holder's process on the screens, SQLite's lock
    holder in its errors): None when there is no such process or it cannot be read (:func:`exists`
    tells the two apart)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    head, _, rest = stat.rpartition(")")
    fields = rest.split()
    if not fields:
        return None
    try:
        started = _since_boot(int(fields[19]))
    except (IndexError, ValueError):
        started = None
    return ProcessStat(head.partition("(")[2], fields[0], started)


def exists(pid: int) -> bool:
    """Whether ``/proc`` has process ``pid`` (readable or not)."""
    return os.path.exists(f"/proc/{pid}")


def process_started(pid: int) -> float | None:
    """When process ``pid`` of this host started (seconds since the epoch), or None if unknown."""
    found = read_stat(pid)
    return None if found is None else found.started


def _since_boot(ticks: int) -> float | None:
    """A process's start time (seconds since the epoch) from ``/proc/<pid>/stat``'s start time in
    clock ticks since boot."""
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None
