"""The checkpoint store: a :class:`Store` per database, and the :class:`StoreSession` a run opens on it.

A :class:`Store` is a factory bound to one database; :meth:`Store.session` opens a
:class:`StoreSession`, one DB-API connection (:class:`~airflow_resumable.core.stores.connection.Connection`)
with the operations the run needs, one small object per aggregate:

======================  ==============================================================
``session.leases``       acquire, heartbeat, release (``stores/leases.py``)
``session.checkpoints``  load, and an attempt's start, save, finish (``stores/checkpoints.py``)
``session.requests``     control requests and what a slot offers (``stores/requests.py``)
``session.listings``     reads across slots and the attempt history (``stores/listings.py``)
``session.retention``    clean finished slots, delete one (``stores/retention.py``)
``session.skips``        skipped items (dead letters) and their replays (``stores/skips.py``)
``session.plans``        a partitioned job's split per slot (``stores/plans.py``)
======================  ==============================================================

The run holds two sessions: the main one (checkpoints, and the handler's writes through
``ctx.transaction()``) and the lease keeper's (heartbeats, on its own thread).

Every write made on behalf of an attempt is *fenced*: it names the attempt's
:class:`~airflow_resumable.core.model.fence.Fence` (job, slot, lease owner, lease token) and matches no
row once another attempt has taken the lease over.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_resumable.core.model.tables import META, all_tables
from airflow_resumable.core.stores.checkpoints import Checkpoints
from airflow_resumable.core.stores.connection import Connection, row_deleted, save_rejected
from airflow_resumable.core.stores.dialect import Dialect
from airflow_resumable.core.stores.leases import Leases
from airflow_resumable.core.stores.listings import Listings
from airflow_resumable.core.stores.migrations import SCHEMA_VERSION, migrate
from airflow_resumable.core.stores.plans import Plans
from airflow_resumable.core.stores.requests import Requests
from airflow_resumable.core.stores.retention import Cleaned, Retention
from airflow_resumable.core.stores.skips import Skips

__all__ = ["SCHEMA_VERSION", "Cleaned", "Dialect", "Store", "StoreSession", "row_deleted", "save_rejected"]


class Store(abc.ABC):
    """A checkpoint database. Subclasses open connections; the logic lives in the parts of :class:`StoreSession`."""

    dialect: Dialect
    #: A connection may be used only by the thread that opened it (SQLite's driver refuses others).
    thread_bound = False

    @abc.abstractmethod
    def connect(self, *, autocommit: bool = False) -> Any:
        """Open a DB-API connection. With ``autocommit`` every statement commits on its own."""

    @abc.abstractmethod
    def set_autocommit(self, conn: Any, on: bool) -> None:
        """Switch a connection of this store between autocommit and transactions."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the checkpoints live, for logs: never includes a password."""

    def lost(self, conn: Any) -> bool:
        """Whether ``conn`` is gone for good (see :attr:`Connection.lost`): psycopg2 and psycopg 3
        mark a connection ``closed`` once the server or the network dropped it; a SQLite
        connection has no server to lose."""
        return bool(getattr(conn, "closed", False))

    def connect_nowait(self, like: Any = None) -> Any | None:
        """A connection whose statements return before the database answers (see
        :meth:`PostgresStore.connect_nowait`), or None when the driver has no such mode: pipelined
        checkpoints then use a writer thread."""
        return None

    def wait(self, conn: Any, *, connecting: bool = False) -> None:
        """Wait for a :meth:`connect_nowait` connection to connect, or for its statement in flight."""
        raise NotImplementedError(f"{type(self).__name__} has no connections that do not wait")

    def session(self, *, autocommit: bool = False) -> StoreSession:
        return StoreSession(self, self.connect(autocommit=autocommit), autocommit=autocommit)

    @contextmanager
    def open(self, *, autocommit: bool = False) -> Iterator[StoreSession]:
        """A session that is closed on exit."""
        s = self.session(autocommit=autocommit)
        try:
            yield s
        finally:
            s.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


class StoreSession(Connection):
    """One connection on the checkpoint database, with the operations of a run, by aggregate."""

    def __init__(self, store: Store, conn: Any, *, autocommit: bool = False):
        super().__init__(store, conn, autocommit=autocommit)
        self.store: Store = store
        self.leases = Leases(self)
        self.checkpoints = Checkpoints(self)
        self.requests = Requests(self)
        self.listings = Listings(self)
        self.retention = Retention(self)
        self.skips = Skips(self)
        self.plans = Plans(self, self.checkpoints)

    def ensure_schema(self, *, apply: bool = True) -> int:
        """Create the tables on first use, or apply the migrations an older database lacks; refuse a
        schema newer than this code. Returns the version. See :mod:`airflow_resumable.core.stores.migrations`.

        Raises:
            SchemaVersionError: the database's schema is newer than this code, or damaged.
        """
        if self._probe() == SCHEMA_VERSION:  # the common case, in one round trip
            return SCHEMA_VERSION
        return migrate(self, apply=apply)

    def _probe(self) -> int | None:
        """The stamped schema version when every table has every column of the current schema, in
        one statement (the stamp, left-joined to an empty product that names every column); None
        when that cannot be told in one go (no tables, a missing column, another version): the
        migrations then look closer and say what is wrong."""
        empty = ", ".join(f"(SELECT {t.select} FROM {t.name} WHERE 1 = 0) t{i}" for i, t in enumerate(all_tables()))
        try:
            row = self.execute(f"SELECT m.value FROM {META} m LEFT JOIN (SELECT 1 AS one FROM {empty}) shape "
                               "ON 1 = 1 WHERE m.key = 'schema_version'").fetchone()
            self.commit()
        except Exception:
            self.rollback()
            return None
        try:
            return None if row is None else int(row[0])
        except ValueError:
            return None
