"""What differs between the checkpoint databases, as one :class:`Dialect` object per backend.

The store's queries are written once, with named DB-API ``pyformat`` parameters (``%(job)s``) and
a dict of values; :meth:`Dialect.placeholders` gives them this driver's marker (``:job`` for
SQLite), translated once per text and cached, so a statement that repeats (the checkpoint) costs
a dict lookup. Positional ``%s`` placeholders (``ctx.transaction()``, the migrations) translate the
same way.

This module imports nothing of the store: the migrations and the sessions both build on it.
"""

from __future__ import annotations

import re

from airflow_resumable.core.model.columns import Column

__all__ = ["Dialect", "to_qmark", "writes"]


class Dialect:
    """What differs between backends, as methods: time arithmetic, types, placeholders, locks.

    Queries are written once, in Python f-strings that call these methods, with DB-API ``pyformat``
    placeholders (``%(name)s``, or ``%s``); :meth:`placeholders` gives them this driver's marker.
    The ``%s`` style is what ``ctx.transaction()`` offers handlers.
    """

    #: Name of the backend.
    name: str = ""
    #: DB-API parameter marker of the driver: ``%s`` (pyformat, ``%(name)s`` too) or ``?`` (qmark,
    #: ``:name`` for named parameters).
    marker: str = "%s"
    #: Column type of timestamps, and of an auto-numbered primary key.
    timestamp_type: str = "TIMESTAMPTZ"
    id_type: str = ""
    #: Statements that serialize schema changes between processes, run first in their transaction.
    schema_lock: tuple[str, ...] = ()
    #: A statement that takes a lock on one job (named parameter ``job``) until its transaction
    #: ends, or None where a write transaction already excludes every other writer (SQLite). An
    #: attempt's overlap check reads the job's other live slots under it, and so does a start made
    #: with the lease in one statement (``stores/leases.py``): two starters of one job take turns,
    #: and each sees the other's lease once the first committed.
    job_lock: str | None = None
    #: A statement that makes the transaction :attr:`job_lock` opens read what was committed before
    #: each of its statements (PostgreSQL: ``READ COMMITTED``, whatever the session's default): a
    #: snapshot taken once for the whole transaction (``REPEATABLE READ``, ``SERIALIZABLE``) would be
    #: taken before the lock is granted, and miss what the lock's previous holder committed.
    job_lock_isolation: str | None = None
    #: Statements run at the start of every migration step's transaction (e.g. a lock timeout).
    migration_setup: tuple[str, ...] = ()
    #: Whether the database has one writer at a time (SQLite): the store's connections then open
    #: every transaction themselves and take turns at the write lock (see ``stores/sqlite.py``).
    one_writer: bool = False
    #: Whether the driver reads timestamps back as timezone-aware datetimes (nothing to convert).
    aware_timestamps: bool = False
    #: Whether a statement may chain writes in its WITH clause (PostgreSQL): an attempt's start and
    #: end, each with its history record, are then one statement, one round trip.
    writable_ctes: bool = False
    #: Whether a statement the store repeats (the checkpoint) is worth preparing on the server,
    #: once per connection (PostgreSQL; see ``stores/prepared.py``).
    prepares: bool = False

    def __init__(self) -> None:
        self._translated: dict[str, str] = {}

    def now(self) -> str:
        """The database's current time, in the type of the timestamp columns."""
        raise NotImplementedError

    def now_plus(self, seconds: str) -> str:
        """The database's current time plus ``seconds`` (an SQL expression, e.g. a placeholder)."""
        raise NotImplementedError

    def placeholders(self, sql: str) -> str:
        """``sql`` with this driver's parameter marker (translations cached: queries repeat)."""
        if self.marker == "%s":
            return sql
        out = self._translated.get(sql)
        if out is None:
            out = self._translated[sql] = to_qmark(sql)
        return out

    def storage(self, fillfactor: int) -> str:
        """The CREATE TABLE suffix giving a table this fill factor ("" where there is none: SQLite)."""
        return ""

    def set_fillfactor(self, table: str, fillfactor: int) -> list[str]:
        """Statements giving an existing table this fill factor (for the pages it fills from now on)."""
        return []

    def type_of(self, column: Column) -> str:
        return {
            "text": "TEXT", "json": "TEXT", "int": "INTEGER", "bigint": "BIGINT", "float": "DOUBLE PRECISION",
            "timestamp": self.timestamp_type, "id": self.id_type,
        }[column.kind]


_FORMAT_MARK = re.compile(r"%(?:\((\w+)\))?([s%])")

#: The store's own statements that write: on a one-writer database they wait their turn for the lock.
_WRITES = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE|SAVEPOINT|CREATE|DROP|ALTER)\b", re.IGNORECASE)


def writes(sql: str) -> bool:
    """Whether one of the store's own statements writes (user SQL goes through ``ctx.transaction()``)."""
    return _WRITES.match(sql) is not None


def _qmark(m: re.Match[str]) -> str:
    name, kind = m.group(1), m.group(2)
    if kind == "%":
        return "%"
    return "?" if name is None else f":{name}"


def to_qmark(sql: str) -> str:
    """DB-API ``format``/``pyformat`` placeholders as ``qmark``/``named`` ones: ``%s`` -> ``?``,
    ``%(job)s`` -> ``:job``, ``%%`` -> ``%``."""
    return _FORMAT_MARK.sub(_qmark, sql)
