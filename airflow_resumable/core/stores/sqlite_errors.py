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

from airflow_resumable.core.model.errors import ConfigurationError, StoreUnavailable

__all__ = ["Location", "locked", "parse_location", "readonly", "unwritable"]

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
        if not os.access(path, os.R_OK | os.W_OK):
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
        if os.path.exists(companion) and not os.access(companion, os.R_OK | os.W_OK):
            return StoreUnavailable(
                f"{companion!r}, beside the SQLite checkpoint file {path!r}, is read-only for this process "
                f"({_who()}): it was made by another user",
                hint=fix.format(what=companion),
            )
    return None


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

    def describe(self, db_path: str) -> str:
        host = socket.gethostname()
        if self.pid <= 0:
            return f"held ({self.kind}) by a process in another container or PID namespace (the lock table gives no pid)"
        if self.pid == os.getpid():
            return (f"held ({self.kind}) by this very process (pid {self.pid} on {host}): another of its connections "
                    "to the file, opened by the handler or another thread, has a transaction open")
        return f"held ({self.kind}) by pid {self.pid} on {host}{_process(self.pid)}{_attempt_of(db_path, host, self.pid)}"


def _process(pid: int) -> str:
    """`` (python3, stopped: ...)``: the process's name and any state worth saying, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return ""
    name, _, rest = stat.partition("(")[2].rpartition(")")
    state = rest.split()[0] if rest.split() else "?"
    says = {"T": "stopped: SIGSTOP, a debugger or Ctrl-Z", "t": "stopped by a debugger", "D": "waiting on the disk",
            "Z": "a zombie"}.get(state)
    return f" ({name}{', ' + says if says else ''})"


def _attempt_of(db_path: str, host: str, pid: int) -> str:
    """``, which runs attempt 2 of job=... slot=...``: the attempt history's running record of that
    process, read through a read-only connection (SQLite keeps its own locks on the file whole)."""
    try:
        with closing(sqlite3.connect(f"file:{quote(db_path)}?mode=ro", uri=True, timeout=1.0)) as conn:
            row = conn.execute(
                "SELECT attempt, job, slot, dag_id, task_id, run_id, map_index FROM resumable_attempts "
                "WHERE host = ? AND pid = ? AND ended_at IS NULL ORDER BY id DESC LIMIT 1", (host, pid)).fetchone()
    except sqlite3.Error:
        return ""
    if row is None:
        return ", which runs no attempt this store knows of (a lease keeper's or control request's would; a program " \
               "outside airflow-resumable, a backup, the sqlite3 shell?)"
    attempt, job, slot, dag_id, task_id, run_id, map_index = row
    task = f" (DAG {dag_id}, task {task_id}{'' if map_index in (None, -1) else f'[{map_index}]'}, run {run_id})" \
        if dag_id else ""
    return f", which runs attempt {attempt} of job={job!r} slot={slot!r}{task}"


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


def locked(db_path: str, timeout: float, *, turn: bool) -> StoreUnavailable:
    """The error of a writer that waited ``timeout`` seconds for SQLite's write lock (``turn``: for
    the turnstile, while another writer waited for the lock), naming who holds it and how to find it."""
    table = _lock_table()
    held = None
    if table is not None:
        held = (_holder(f"{db_path}-shm", "the write lock", table, posix_byte=WAL_WRITE_LOCK)
                or _holder(f"{db_path}-turns", "the turn at the write lock", table, posix_byte=None))
    waited = (f"another writer of {db_path!r} kept its turn at the write lock for {timeout:g}s (the busy timeout)"
              if turn else f"the write lock of {db_path!r} stayed taken for {timeout:g}s (the busy timeout)")
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
    return StoreUnavailable(
        f"database is locked: {waited}, {who}",
        hint=f"{find}. A chunk writing through ctx.transaction() holds the lock until its checkpoint: keep such "
        "chunks well under the busy timeout (or use PostgreSQL). A retry resumes from the last checkpoint",
    )
