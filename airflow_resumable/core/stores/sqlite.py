"""SQLite checkpoint store: the embedded default for one machine (WAL, no server)."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from airflow_resumable.core.errors import ConfigurationError, StoreUnavailable
from airflow_resumable.core.stores.base import Dialect, Store

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"

#: Bytes the WAL file is cut back to after a checkpoint of the WAL into the database. SQLite's
#: default automatic checkpoint (every 1,000 pages, ~4 MB) keeps the WAL small while checkpoints
#: are small commits, but the file never shrinks by itself: one large transaction (a big chunk
#: written through ``ctx.transaction()``) would leave it that large for good.
WAL_SIZE_LIMIT = 16 * 1024 * 1024


class SQLiteDialect(Dialect):
    """SQLite: timestamps as REAL epoch seconds, ``?`` markers, the write lock taken up front."""

    name = "sqlite"
    marker = "?"
    timestamp_type = "REAL"
    id_type = "INTEGER PRIMARY KEY AUTOINCREMENT"
    begin = "BEGIN IMMEDIATE"

    def now(self) -> str:
        return _NOW

    def now_plus(self, seconds: str) -> str:
        return f"({_NOW} + {seconds})"


DIALECT = SQLiteDialect()


class SQLiteStore(Store):
    """Checkpoints in one SQLite file, in WAL mode so the lease keeper can write beside the run.

    Args:
        path: the database file, an absolute path; its folder is created if missing.
        busy_timeout: seconds a connection waits for another's write lock.
        synchronous: SQLite's ``synchronous`` pragma. ``FULL`` (the default) makes a checkpoint
            survive a power loss; ``NORMAL`` survives a process crash only, and is faster.
    """

    dialect = DIALECT

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, synchronous: str = "FULL"):
        self.path = os.fspath(path)
        if not self.path or self.path == ":memory:":
            raise ValueError("a SQLite checkpoint store needs a file path (':memory:' is not shared by the run's threads)")
        if not os.path.isabs(self.path):
            raise ConfigurationError(
                f"the SQLite checkpoint file {self.path!r} is a relative path, which would depend on each "
                "worker's current directory",
                hint=f"Give an absolute path, e.g. {os.path.join(os.sep, self.path)!r}",
            )
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"unknown SQLite synchronous mode {synchronous!r}")
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous.upper()

    def connect(self, *, autocommit: bool = False) -> Any:
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            # None: every statement commits itself; "": the driver opens a transaction before DML.
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
            if not autocommit:
                self.set_autocommit(conn, False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(
                f"cannot open the SQLite checkpoint file {self.path!r}: {exc}",
                hint="Check that the path is absolute, its folder writable, and the file a SQLite database",
            ) from exc
        return conn

    def set_autocommit(self, conn: Any, on: bool) -> None:
        # None: every statement commits itself; "": the driver opens a transaction before DML.
        conn.isolation_level = None if on else ""

    def describe(self) -> str:
        return f"sqlite:///{self.path}"
