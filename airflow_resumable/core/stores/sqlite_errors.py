"""What the SQLite store's errors say: a ``file:`` URI read or refused, a read-only file or folder
named with its fix, and who holds the write lock a writer waited for past its busy timeout.

The holder is found in the operating system's own lock table (``/proc/locks`` on Linux), where
SQLite's write lock is a POSIX lock on byte 120 of the ``-shm`` file (its WAL-index format), and
the turnstile (:class:`~airflow_resumable.core.stores.sqlite.WriteTurns`) an ``flock`` on the
``-turns`` file: it names any holder, a program outside airflow-resumable too, costs nothing until
a writer has waited the whole busy timeout, and is never stale. No file descriptor is opened on
the database or its ``-shm`` file to ask (closing one would drop the process's own POSIX locks on
it); the attempt the holder runs is read from the attempt history (host and pid) through a
read-only connection of SQLite's own.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sqlite3
from collections.abc import Mapping
from contextlib import closing
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from airflow_resumable.core.model.errors import ConfigurationError, StoreBusy, StoreUnavailable
from airflow_resumable.core.model.process import RUNS, read_stat

__all__ = ["Location", "live_writer", "locked", "parse_location", "readonly", "unwritable"]

#: SQLite's URI query parameters (https://sqlite.org/uri.html), and what the store does with each.
URI_PARAMS = ("mode", "cache", "vfs", "immutable", "nolock", "psow", "modeof")
#: Those the store honours, with the values it takes (``synchronous`` is the store's own).
ACCEPTED = {"mode": ("rw", "rwc"), "cache": ("private",)}
_REFUSED = {
    ("mode", "ro"): "a read-only database cannot hold checkpoints: the store writes one after every chunk",
    ("mode", "memory"): "an in-memory database is not shared by the run's connections and is gone when the "
                        "attempt ends",
    ("cache", "shared"): "a shared cache replaces SQLite's file locks with table locks, which the store's turns at "
                         "the write lock do not cover",
    ("immutable", None): "it tells SQLite the file never changes, and the store writes to it",
    ("nolock", None): "without file locks two writers would corrupt the file",
}

#: SQLite's WAL-index write lock: byte 120 of the ``-shm`` file (https://sqlite.org/walformat.html).
WAL_WRITE_LOCK = 120
_PROC_LOCKS = "/proc/locks"


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a SQLite store's file is: its absolute ``path``, and how to open it (``mode``: ``rwc``
    creates the file and its folder, ``rw`` wants it to exist)."""

    path: str
    mode: str = "rwc"
    synchronous: str | None = None

    def uri(self) -> str:
        """The file as a SQLite URI, for ``sqlite3.connect(..., uri=True)``."""
        return f"file:{quote(self.path)}?mode={self.mode}"


def parse_location(text: str, params: Mapping[str, str] | None = None) -> Location:
    """A store's file from a path or a ``file:`` URI (``file:/abs/x.db``, ``file:///abs/x.db``,
    ``file://localhost/abs/x.db``, query parameters as SQLite reads them), with ``params``: SQLite
    URI parameters from elsewhere (an Airflow connection's extras, where ``?mode=rwc`` of its URI lands).

    Raises:
        ConfigurationError: a URI naming another host, or a parameter the store cannot honour
            (``mode=ro``, ``mode=memory``, ``immutable``, ``nolock``, ``cache=shared``, ``vfs``...),
            naming it and why.
    """
    query: dict[str, str] = {}
    if text.startswith("file:"):
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"the SQLite URI {text!r} names the host {parts.netloc!r}: SQLite opens local files only",
                hint="Write file:/absolute/path.db (or file:///absolute/path.db)",
            )
        if parts.fragment:
            raise ConfigurationError(f"the SQLite URI {text!r} has a fragment ('#{parts.fragment}')",
                                     hint="Write file:/absolute/path.db?mode=rwc, without '#...'")
        text = unquote(parts.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query.update({k: str(v) for k, v in (params or {}).items()})
    synchronous = query.pop("synchronous", None)
    for key, value in query.items():
        problem = _REFUSED.get((key, value)) or _REFUSED.get((key, None))
        if problem is None and value not in ACCEPTED.get(key, ()):
            problem = "the store opens the file itself, with SQLite's default file system and locks"
        if problem is not None:
            raise ConfigurationError(
                f"the SQLite checkpoint file {text!r} is given {key}={value}, which the store cannot honour: {problem}",
                hint="Leave it out, or use one of: mode=rwc (the default: create the file and its folder), mode=rw "
                "(the file must exist), cache=private, synchronous=" + "|".join(("OFF", "NORMAL", "FULL", "EXTRA")),
            )
    return Location(text, mode=query.get("mode", "rwc"), synchronous=synchronous)


# -- a read-only file or folder -------------------------------------------------------------------


def _who() -> str:
    try:
        import pwd

        name = pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):  # pragma: no cover - no user database
        name = "?"
    return f"user {name}, uid {os.geteuid()}"


def _read_only_mount(folder: str) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def unwritable(location: Location) -> StoreUnavailable | None:
    """The error for a store whose file, companion files or folder this process cannot write, or
    None: SQLite opens an unwritable file read-only without a word and fails at the first write
    with ``attempt to write a readonly database``, naming nothing. A few ``access()`` calls."""
    path = location.path
    folder = os.path.dirname(path)
    fix = ("Give the user the workers run as write access to it (e.g. chown <that user> {what}; chmod u+w {what}), "
           "or point the connection at a writable file, e.g. sqlite:////var/lib/airflow/checkpoints.db; a retry "
           "resumes from the last checkpoint")
    if not os.path.isdir(folder):
        if location.mode == "rw":
            return _missing(location)
        parent = os.path.dirname(folder)
        while parent != os.path.dirname(parent) and not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
            return StoreUnavailable(
                f"the folder {folder!r} of the SQLite checkpoint file {path!r} does not exist, and this process "
                f"({_who()}) cannot create it in {parent!r}", hint=fix.format(what=parent))
        return None  # created by connect()
    if _read_only_mount(folder):
        return StoreUnavailable(
            f"the SQLite checkpoint file {path!r} is on a read-only file system ({folder!r}): the store writes a "
            "checkpoint after every chunk",
            hint="Mount it read-write, or point the connection at a file on a writable volume, e.g. "
            "sqlite:////var/lib/airflow/checkpoints.db; a retry resumes from the last checkpoint",
        )
    if os.path.exists(path):
        if _refused(path):
            return StoreUnavailable(f"the SQLite checkpoint file {path!r} is read-only for this process ({_who()}): "
                                    "the store writes a checkpoint after every chunk",
                                    hint=fix.format(what=path))
    elif location.mode == "rw":
        return _missing(location)
    if not os.access(folder, os.W_OK | os.X_OK):
        return StoreUnavailable(
            f"the folder {folder!r} of the SQLite checkpoint file {path!r} is not writable for this process "
            f"({_who()}): SQLite keeps {os.path.basename(path)}-wal and -shm beside the file while it is open, "
            "and the store its turnstile, -turns",
            hint=fix.format(what=folder),
        )
    for suffix in ("-wal", "-shm", "-turns"):
        companion = path + suffix
        if _refused(companion):
            return StoreUnavailable(
                f"{companion!r}, beside the SQLite checkpoint file {path!r}, is read-only for this process "
                f"({_who()}): it was made by another user",
                hint=fix.format(what=companion),
            )
    return None


def _refused(path: str) -> bool:
    """Whether ``path`` is there and this process may not read and write it. SQLite deletes the
    ``-wal`` and ``-shm`` files when another process closes the file's last connection, and may
    create them again at once, so a file seen and then gone (``access()`` says no for a missing
    file too) is asked again: only a file that is there after a refusal, three times over, is
    refused; a race that turns a file another process just deleted into "read-only" is not."""
    for _ in range(3):
        if os.access(path, os.R_OK | os.W_OK) or not os.path.exists(path):
            return False
    return True


def _missing(location: Location) -> StoreUnavailable:
    return StoreUnavailable(f"the SQLite checkpoint file {location.path!r} does not exist, and mode=rw does not "
                            "create it", hint="Create it (or its folder), or drop mode=rw to let the store create it")


def readonly(exc: sqlite3.Error, location: Location) -> StoreUnavailable | None:
    """The store's error for SQLite's ``SQLITE_READONLY`` (any of its kinds), or None for another."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or code & 0xFF != sqlite3.SQLITE_READONLY:
        return None
    found = unwritable(location)
    if found is not None:
        return found
    return StoreUnavailable(
        f"the SQLite checkpoint file {location.path!r} cannot be written ({getattr(exc, 'sqlite_errorname', '?')}: "
        f"{exc}): it, its -wal or -shm file or its folder became read-only, or was moved or replaced while open",
        hint="Make the file and its folder writable by the user the workers run as; a retry resumes from the last "
        "checkpoint",
    )


# -- who holds the write lock ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Holder:
    """A process holding a lock on a file of this host, as the lock table names it."""

    pid: int
    kind: str  # "write lock" or "turn"

    def describe(self, db_path: str, record: tuple[object, ...] | None = None) -> str:
        """Who holds it, in words (``record``: its running record of the attempt history when the
        caller read it already, else read here)."""
        host = socket.gethostname()
        if self.pid <= 0:
            return f"held ({self.kind}) by a process in another container or PID namespace (the lock table gives no pid)"
        if self.pid == os.getpid() and self.kind != "the write lock":
            return (f"held ({self.kind}) by this very process (pid {self.pid} on {host}): another of its connections "
                    "(a lease renewal, a control request) waits for the write lock")
        if self.pid == os.getpid():
            return (f"held ({self.kind}) by this very process (pid {self.pid} on {host}): another of its connections "
                    "to the file, opened by the handler or another thread, has a transaction open")
        if record is None:
            record = _running_record(db_path, host, self.pid)
        return f"held ({self.kind}) by pid {self.pid} on {host}{_process(self.pid)}{_attempt_of(record)}"


def _process(pid: int) -> str:
    """`` (python3, stopped: ...)``: the process's name and any state worth saying, from /proc."""
    found = read_stat(pid)
    if found is None:
        return ""
    name, state = found.name, found.state
    says = {"T": "stopped: SIGSTOP, a debugger or Ctrl-Z", "t": "stopped by a debugger", "D": "waiting on the disk",
            "Z": "a zombie"}.get(state)
    return f" ({name}{', ' + says if says else ''})"


_RUNS_ATTEMPT = ", which runs attempt "


def _running_record(db_path: str, host: str, pid: int) -> tuple[object, ...] | None:
    """The attempt history's running record of that process (its attempt, job, slot, dag_id,
    task_id, run_id, map_index, started_at), read through a read-only connection (SQLite keeps its
    own locks on the file whole); None when there is none or it cannot be read."""
    try:
        with closing(sqlite3.connect(f"file:{quote(db_path)}?mode=ro", uri=True, timeout=1.0)) as conn:
            row = conn.execute(
                "SELECT attempt, job, slot, dag_id, task_id, run_id, map_index, started_at FROM resumable_attempts "
                "WHERE host = ? AND pid = ? AND ended_at IS NULL ORDER BY id DESC LIMIT 1", (host, pid)).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else tuple(row)


def _attempt_of(row: tuple[object, ...] | None) -> str:
    """``, which runs attempt 2 of job=... slot=...``: the attempt history's running record of the
    holder's process (:func:`_running_record`), or that it has none."""
    if row is None:
        return ", which runs no attempt this store knows of (a lease keeper's or control request's would; a program " \
               "outside airflow-resumable, a backup, the sqlite3 shell?)"
    attempt, job, slot, dag_id, task_id, run_id, map_index, _ = row
    task = f" (DAG {dag_id}, task {task_id}{'' if map_index in (None, -1) else f'[{map_index}]'}, run {run_id})" \
        if dag_id else ""
    return f"{_RUNS_ATTEMPT}{attempt} of job={job!r} slot={slot!r}{task}"


def _lock_table() -> list[list[str]] | None:
    try:
        with open(_PROC_LOCKS) as f:
            return [line.split() for line in f if "->" not in line]
    except OSError:
        return None


def _holder(path: str, kind: str, table: list[list[str]], *, posix_byte: int | None) -> Holder | None:
    """The process holding a write lock on ``path`` in the lock table (a POSIX lock covering
    ``posix_byte``, or an ``flock``)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for fields in table:  # "1: POSIX  ADVISORY  WRITE 14257 fe:00:2147319 120 120"
        if len(fields) < 8 or fields[5] != dev or fields[3] != "WRITE":
            continue
        if posix_byte is None and fields[1] == "FLOCK":
            return Holder(_int(fields[4]), kind)
        if posix_byte is not None and fields[1] == "POSIX":
            start, end = _int(fields[6]), fields[7]
            if start <= posix_byte and (end == "EOF" or posix_byte <= _int(end)):
                return Holder(_int(fields[4]), kind)
    return None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


def live_writer(db_path: str) -> str | None:
    """Whether a writer that has waited its busy timeout should go on waiting, and for whom.

    Returns the holder of the write lock (or, while nobody holds it, of the turn at it: a writer
    about to take it), described, when that is another process of this host that is running and
    runs an attempt of this store (the attempt history's running record of its host and pid): it
    will commit its chunk and let go, as one writer at a time is what SQLite allows. None when
    waiting on would not help or cannot be judged: the lock table is unknown (not Linux), the holder
    is this very process (another of its connections), a process in another PID namespace, one that
    is stopped (SIGSTOP, a debugger), a zombie or gone, or one that runs no attempt (a program
    outside airflow-resumable, such as a shell with a transaction open). The lock momentarily free reads as worth
    waiting (:data:`NOBODY`), and so does the turn at it held by this process while nobody holds the lock
    (:data:`OWN_TURN`: the writer itself between two polls, or another thread's short write next).
    """
    table = _lock_table()
    if table is None:
        return None
    held = _holder(f"{db_path}-shm", "the write lock", table, posix_byte=WAL_WRITE_LOCK)
    if held is None:
        held = _holder(f"{db_path}-turns", "the turn at the write lock", table, posix_byte=None)
        if held is not None and held.pid == os.getpid():
            # The write lock is free and a connection of this process holds the turn: this writer
            # itself, polling for the lock, or another thread's (the lease keeper's renewal, a
            # control request) about to take it. Neither holds the lock, so neither is a deadlock.
            return OWN_TURN
    if held is None:
        return NOBODY
    if held.pid <= 0 or held.pid == os.getpid():
        return None
    found = read_stat(held.pid)
    if found is None or found.state not in RUNS:
        return None
    record = _running_record(db_path, socket.gethostname(), held.pid)
    if record is None:
        return None  # a program outside airflow-resumable (a shell's open transaction) may hold it for good
    started = found.started
    if started is not None and isinstance(record[-1], int | float) and started > float(record[-1]) + 2.0:
        return None  # the pid is another process's now: the attempt recorded under it was killed long ago
    return held.describe(db_path, record)


#: What :func:`live_writer` says when nobody holds the write lock and a connection of this very
#: process holds the turn at it (it takes the lock next, and lets go of it after a short write).
OWN_TURN = "nobody (the lock was just let go; a connection of this process has the turn at it)"

#: What :func:`live_writer` says when the lock table names no holder: the lock was just let go, or
#: its holder is not to be seen from here (another PID namespace leaves no line in ``/proc/locks``).
NOBODY = "nobody (the lock was just let go, or its holder cannot be seen from here)"


def locked(db_path: str, timeout: float, *, turn: bool, waited: float | None = None) -> StoreBusy:
    """The error of a writer that waited ``timeout`` seconds for SQLite's write lock (``turn``: for
    the turnstile, while another writer waited for the lock), naming who holds it and how to find it;
    ``waited``: a patient writer's whole wait, when it gave up on a holder that ran all along."""
    table = _lock_table()
    held = None
    if table is not None:
        held = (_holder(f"{db_path}-shm", "the write lock", table, posix_byte=WAL_WRITE_LOCK)
                or _holder(f"{db_path}-turns", "the turn at the write lock", table, posix_byte=None))
    how_long = f"{timeout:g}s (the busy timeout)" if waited is None else (
        f"{waited:.0f}s, as long as this attempt waits for one holder that runs and keeps the lock (ten busy "
        "timeouts: a chunk that long, or a deadlock: a holder that waits for something this attempt holds)")
    waited_text = (f"another writer of {db_path!r} kept its turn at the write lock for {how_long}"
                   if turn else f"the write lock of {db_path!r} stayed taken for {how_long}")
    if held is not None:
        who = held.describe(db_path)
        find = (f"Find it with `ps -o pid,stat,etime,args -p {held.pid}`" if held.pid > 0 else
                f"Find it with `fuser -v {db_path}-shm` (or lsof) where the file is shared")
        if held.pid == os.getpid():
            find = "Commit or close that connection before the chunk's checkpoint"
        if held.pid > 0 and "stopped" in who:
            find += f"; a stopped process continues with `kill -CONT {held.pid}`"
    else:
        who = "by a process the lock table does not name" + ("" if table is not None else " (this system has no "
                                                            f"{_PROC_LOCKS})")
        find = f"Find the processes that have the file open with `fuser -v {db_path}-shm` or `lsof {db_path}-shm`"
    return StoreBusy(
        f"database is locked: {waited_text}, {who}",
        hint=f"{find}. An attempt's own writes wait as long as a holder that runs (another attempt's long chunk); "
        "this wait ended at the busy timeout because the holder is stopped, gone, this process or not to be seen, "
        "or the writer is a control request or a lease renewal (the connection's busy_timeout extra sets it). A "
        "retry resumes from the last checkpoint",
    )
