"""Numbered, forward-only schema migrations, applied under a lock.

A database records its schema version in ``resumable_meta`` (key ``schema_version``) and, for every
migration it went through, when and by whom (key ``migration:<n>``). :func:`migrate` brings a
database to :data:`SCHEMA_VERSION`:

* a fresh database gets the current tables straight from their definition
  (:mod:`airflow_resumable.core.model.tables`), stamped with the current version;
* an older one gets each missing migration in turn, **each in its own transaction**, under a lock
  that serializes every process doing the same (PostgreSQL: an advisory transaction lock; SQLite:
  ``BEGIN IMMEDIATE``). After taking the lock the version is read again, so when many tasks start
  at once exactly one applies a step and the others find it done and go on;
* a newer one is refused: the code would misread it.

The steps below are history: once released, a step never changes. A change of the tables is a new
step at the end *and* the matching change of the dataclass; ``tests/unit/core/stores/test_migrations.py`` checks
that a database migrated from version 1 has exactly the columns a fresh one has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from airflow_resumable.core.model.errors import SchemaVersionError, StoreUnavailable
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS, DEAD_LETTERS, META, all_tables

if TYPE_CHECKING:  # importing the stores package at run time would run stores/base, which imports this module
    from airflow_resumable.core.stores.dialect import Dialect


class _Described(Protocol):
    def describe(self) -> str: ...


class SchemaSession(Protocol):
    """What a migration needs of a session (:class:`airflow_resumable.core.stores.base.StoreSession`
    is one): typed here so that this module does not import the store, which runs it."""

    @property
    def d(self) -> Dialect: ...
    @property
    def store(self) -> _Described: ...
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def transaction(self, *, lock: bool = ...) -> AbstractContextManager[Any]: ...
    def who(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    summary: str
    statements: Callable[[Dialect], list[str]]


def _v1(d: Dialect) -> list[str]:
    """The first release's tables, as it created them."""
    ts = d.timestamp_type
    return [
        f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS {CHECKPOINTS.name} (
            job TEXT NOT NULL, slot TEXT NOT NULL, position TEXT, state TEXT NOT NULL DEFAULT '{{}}',
            processed BIGINT NOT NULL DEFAULT 0, total BIGINT, status TEXT NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, runs INTEGER NOT NULL DEFAULT 1,
            resumed_from TEXT, started_at {ts}, updated_at {ts} NOT NULL, finished_at {ts}, last_error TEXT,
            cancel_reason TEXT, cancel_request TEXT, lease_owner TEXT, lease_token BIGINT NOT NULL DEFAULT 0,
            lease_expires_at {ts}, heartbeat_at {ts}, lease_acquired_at {ts},
            PRIMARY KEY (job, slot)
        )""",
        f"CREATE INDEX IF NOT EXISTS {CHECKPOINTS.name}_job_updated ON {CHECKPOINTS.name} (job, updated_at DESC)",
    ]


def _v2(d: Dialect) -> list[str]:
    """The owning task instance and the handler's result on the row; the attempt history."""
    ts, t = d.timestamp_type, CHECKPOINTS.name
    return [
        f"ALTER TABLE {t} ADD COLUMN dag_id TEXT",
        f"ALTER TABLE {t} ADD COLUMN task_id TEXT",
        f"ALTER TABLE {t} ADD COLUMN run_id TEXT",
        f"ALTER TABLE {t} ADD COLUMN map_index INTEGER",
        f"ALTER TABLE {t} ADD COLUMN result TEXT",
        f"ALTER TABLE {t} ADD COLUMN confirmed_at {ts}",
        f"""CREATE TABLE IF NOT EXISTS {ATTEMPTS.name} (
            id {d.id_type}, job TEXT NOT NULL, slot TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0,
            owner TEXT, host TEXT, pid INTEGER, dag_id TEXT, task_id TEXT, run_id TEXT, map_index INTEGER,
            lease_token BIGINT NOT NULL DEFAULT 0, started_at {ts} NOT NULL, ended_at {ts}, outcome TEXT NOT NULL,
            cancel_reason TEXT, resumed_from TEXT, position_start TEXT, processed_start BIGINT NOT NULL DEFAULT 0,
            position_end TEXT, processed_end BIGINT, error TEXT
        )""",
        f"CREATE INDEX IF NOT EXISTS {ATTEMPTS.name}_slot ON {ATTEMPTS.name} (job, slot, id)",
    ]


def _v3(d: Dialect) -> list[str]:
    """Control requests (pause, resume, restart) and who made them; when a paused slot continues."""
    ts, t = d.timestamp_type, CHECKPOINTS.name
    return [
        f"ALTER TABLE {t} ADD COLUMN request TEXT",
        f"ALTER TABLE {t} ADD COLUMN requested_by TEXT",
        f"ALTER TABLE {t} ADD COLUMN requested_at {ts}",
        f"ALTER TABLE {t} ADD COLUMN resume_at {ts}",
        f"ALTER TABLE {ATTEMPTS.name} ADD COLUMN requested_by TEXT",
    ]


def _v4(d: Dialect) -> list[str]:
    """The dead-letter table: items skipped under a skip policy, one row per (job, slot, position)."""
    ts, t = d.timestamp_type, DEAD_LETTERS.name
    return [
        f"""CREATE TABLE IF NOT EXISTS {t} (
            id {d.id_type}, job TEXT NOT NULL, slot TEXT NOT NULL, position TEXT NOT NULL, item TEXT,
            item_format TEXT NOT NULL DEFAULT 'json', error TEXT, attempt INTEGER NOT NULL DEFAULT 0,
            recorded_at {ts} NOT NULL, status TEXT NOT NULL DEFAULT 'skipped', replayed_at {ts}
        )""",
        f"CREATE UNIQUE INDEX IF NOT EXISTS {t}_item ON {t} (job, slot, position)",
    ]


def _v5(d: Dialect) -> list[str]:
    """Checkpoints as in-place (HOT) updates: no index covers a column a checkpoint or a heartbeat
    changes, and PostgreSQL pages keep room for new row versions (see ``core/model/tables.py``).

    The listing index moves from ``updated_at`` (every checkpoint changes it) to ``started_at``
    (a run's start changes it); rows without a start time get their last write's. The new fill
    factor applies to the pages filled from now on: existing rows are not rewritten (no long lock
    on a big table); a row on a full page moves once, on its first update, then stays in place.
    """
    t = CHECKPOINTS.name
    return [
        f"UPDATE {t} SET started_at = updated_at WHERE started_at IS NULL",
        f"DROP INDEX IF EXISTS {t}_job_updated",
        f"CREATE INDEX IF NOT EXISTS {t}_job_started ON {t} (job, started_at DESC, slot DESC)",
        *d.set_fillfactor(t, 80),
    ]


def _v6(d: Dialect) -> list[str]:
    """``cancel_reason`` becomes ``stop_reason`` on both tables: it also holds why an attempt paused,
    was throttled or ended its time slice, not only why it was cancelled. A rename keeps every value
    and is a catalog change on both databases (no table rewrite)."""
    return [
        f"ALTER TABLE {CHECKPOINTS.name} RENAME COLUMN cancel_reason TO stop_reason",
        f"ALTER TABLE {ATTEMPTS.name} RENAME COLUMN cancel_reason TO stop_reason",
    ]


def _v7(d: Dialect) -> list[str]:
    """The rate the holder measured, written with each checkpoint: every reader of the row shows
    the holder's one number instead of measuring its own."""
    return [f"ALTER TABLE {CHECKPOINTS.name} ADD COLUMN rate DOUBLE PRECISION"]


def _v8(d: Dialect) -> list[str]:
    """The identity of the reader whose positions a checkpoint holds: an attempt whose reader differs
    (another key, source, condition or bound) refuses instead of reading from a foreign position.
    Existing rows have none and resume as before; their next attempt records its reader."""
    return [f"ALTER TABLE {CHECKPOINTS.name} ADD COLUMN reader TEXT"]


def _v9(d: Dialect) -> list[str]:
    """Rebalancing: an idle partition's ask for part of a running one's range, returned to the holder
    by its checkpoint. A plan row may now hold splits, which an older release would not see (it
    would hand out the ranges as planned): from this version on it refuses the database instead."""
    return [f"ALTER TABLE {CHECKPOINTS.name} ADD COLUMN split_request TEXT"]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "checkpoint table and schema stamp", _v1),
    Migration(2, "owning task instance, result and success confirmation on the row; attempt history table", _v2),
    Migration(3, "control requests (pause, resume, restart) with who asked; resume time of a paused slot", _v3),
    Migration(4, "dead-letter table for items skipped under a skip policy", _v4),
    Migration(5, "checkpoints as in-place (HOT) updates: listing index on started_at, fill factor 80", _v5),
    Migration(6, "cancel_reason renamed stop_reason (it also says why an attempt paused or was throttled)", _v6),
    Migration(7, "the holder's measured rate on the row, written with each checkpoint", _v7),
    Migration(8, "the identity of the reader whose positions the checkpoint holds", _v8),
    Migration(9, "a pending ask to split a running partition's range (rebalancing)", _v9),
)

#: The schema this code reads and writes.
SCHEMA_VERSION = MIGRATIONS[-1].version

HOW_TO_MIGRATE = (
    "To apply it by hand (for a role that may run DDL): python -m airflow_resumable migrate --conn-id <conn_id>; "
    "print the SQL with --sql"
)


def current_version(session: SchemaSession) -> int | None:
    """The database's schema version; None for a database without our tables.

    Raises:
        SchemaVersionError: the tables were damaged by hand (the stamp or the checkpoint table is
            missing while the other is there).
    """
    try:
        version = _read(session, f"SELECT value FROM {META} WHERE key = 'schema_version'")
    except Exception as exc:
        if not _is_missing_table(exc):
            raise
        session.rollback()
        if _exists(session, CHECKPOINTS.name):
            raise SchemaVersionError(
                f"the checkpoint table {CHECKPOINTS.name} exists but {META}, which records its schema version, "
                f"is missing in {session.store.describe()}",
                hint="It was dropped by hand; nothing was changed. Restore it from a backup, or recreate it "
                f"with the version the tables have (1 if it has no dag_id column, 2 if it has no request column, 3 if "
                f"{DEAD_LETTERS.name} is missing, 4 if it has the index {CHECKPOINTS.name}_job_updated, 5 if it has a cancel_reason "
                f"column, 6 if it has no rate column, 7 if it has no reader column, else "
                f"{SCHEMA_VERSION}): "
                f"CREATE TABLE {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL); "
                f"INSERT INTO {META} VALUES ('schema_version', '<version>')",
            ) from None
        return None
    if version is None:
        return None
    try:
        return int(version)
    except ValueError:
        raise SchemaVersionError(
            f"{META} holds a schema version that is not a number: {version!r}",
            hint=f"Set it to the version the tables have: UPDATE {META} SET value = '<n>' WHERE key = 'schema_version'",
        ) from None


def migrate(session: SchemaSession, *, apply: bool = True) -> int:
    """Bring the database to :data:`SCHEMA_VERSION`; return the version it has now.

    With ``apply=False`` nothing is changed: an older database raises instead (for workers denied DDL).

    Raises:
        SchemaVersionError: the database is newer than this code, damaged, or older and ``apply``
            is False or the migration failed (nothing of the failed step stays).
    """
    try:
        version = current_version(session)
    except SchemaVersionError:
        # The stamp missing beside a live checkpoint table is also what two reads see when another
        # process commits the fresh tables between them (several tasks starting at once on an
        # empty database). Wait for the schema lock, which that process holds until its tables
        # and stamp are committed, and look again: a database damaged by hand fails again.
        _wait_for_schema_work(session)
        version = current_version(session)
    if version == SCHEMA_VERSION:
        _check_shape(session, version)
        return version
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the checkpoint database {session.store.describe()} has schema version {version}, "
            f"newer than this airflow-resumable understands ({SCHEMA_VERSION})",
            hint="Upgrade airflow-resumable on this worker to the version that created it; "
            "the checkpoints were left untouched",
        )
    if not apply:
        raise SchemaVersionError(
            f"the checkpoint database {session.store.describe()} has schema version {version or 0}; "
            f"this airflow-resumable needs {SCHEMA_VERSION}",
            hint=HOW_TO_MIGRATE,
        )
    try:
        if version is None:
            return _step(session, None, _create_fresh, "created")
        for m in MIGRATIONS:
            if m.version > version:
                version = _step(session, m.version, m.statements, f"migration {m.version}: {m.summary}")
    except SchemaVersionError:
        raise
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = session.store.describe()
        if "lock timeout" in text or "database is locked" in text:
            raise StoreUnavailable(
                f"could not upgrade the checkpoint database {where} to schema {SCHEMA_VERSION}: {text}",
                hint="A long transaction held the table; nothing was changed and a retry tries again",
            ) from exc
        raise SchemaVersionError(
            f"could not upgrade the checkpoint database {where} from schema {version or 0} to {SCHEMA_VERSION}: "
            f"{type(exc).__name__}: {text}",
            hint="Nothing of the failed step was kept. If this role may not run DDL, apply it once with one that "
            "may: python -m airflow_resumable migrate --conn-id <conn_id> (or print the SQL with --sql)",
        ) from exc
    return version


def _wait_for_schema_work(session: SchemaSession) -> None:
    """Return once no other process creates or migrates the schema (an empty transaction under the lock)."""
    with session.transaction(lock=True):
        pass


def plan(session: SchemaSession) -> list[str]:
    """The SQL :func:`migrate` would run on this database, without running it."""
    version = current_version(session)
    if version is None:
        return _create_fresh(session.d) + [_stamp_sql(session.d, SCHEMA_VERSION)]
    out: list[str] = []
    for m in MIGRATIONS:
        if m.version > version:
            out += m.statements(session.d) + [_stamp_sql(session.d, m.version)]
    return out


def _create_fresh(d: Dialect) -> list[str]:
    stmts = [f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"]
    for table in all_tables():
        stmts += table.ddl(d.type_of, d.storage)
    return stmts


def _stamp_sql(d: Dialect, version: int) -> str:
    return (
        f"INSERT INTO {META} (key, value) VALUES ('schema_version', '{version}') "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    )


def _step(session: SchemaSession, target: int | None, statements: Callable[[Dialect], list[str]], what: str) -> int:
    """One step in one transaction, under the lock; skipped when another process did it meanwhile."""
    d = session.d
    with session.transaction(lock=True):
        # Creating the stamp table first means reading the version cannot fail inside the transaction.
        session.execute(f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        found = _read(session, f"SELECT value FROM {META} WHERE key = 'schema_version'")
        version = None if found is None else int(found)
        if version is not None and (target is None or version >= target):
            return version  # another process did it while this one waited for the lock
        for stmt in d.migration_setup:
            session.execute(stmt)
        for stmt in statements(d):
            session.execute(stmt)
        version = target if target is not None else SCHEMA_VERSION
        session.execute(_stamp_sql(d, version))
        session.execute(
            f"INSERT INTO {META} (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (f"migration:{version}", f"{what}; applied by {session.who()}"),
        )
    return version


def _shape_sql() -> str:
    """One statement that names every column of every table: it fails when one is missing (a table
    dropped, a column renamed by hand), and costs what probing one table did."""
    empty = ", ".join(f"(SELECT {t.select} FROM {t.name} WHERE 1 = 0) t{i}" for i, t in enumerate(all_tables()))
    return f"SELECT 1 FROM {empty}"


def _check_shape(session: SchemaSession, version: int) -> None:
    """Refuse tables that do not have the columns of the ``version`` the stamp records.

    Raises:
        SchemaVersionError: a table or a column is missing (dropped or renamed by hand), naming it,
            the columns found instead, and the statement that puts it back. Nothing is changed.
    """
    try:
        session.execute(_shape_sql()).fetchall()
        session.commit()
        return
    except Exception as exc:
        if not (_is_missing_table(exc) or _is_missing_column(exc)):
            raise
        session.rollback()
        failure = exc
    where = session.store.describe()
    if not _exists(session, CHECKPOINTS.name):
        raise SchemaVersionError(
            f"the checkpoint table {CHECKPOINTS.name} is missing from {where} although "
            f"{META} says schema version {version}: it was dropped or renamed by hand",
            hint="Its checkpoints are gone unless you restore them from a backup (then the slots resume). "
            f"To start over with empty tables: DELETE FROM {META} WHERE key = 'schema_version' "
            "(the next task recreates them)",
        )
    for table in all_tables():
        found = _columns(session, table.name)
        if found is None:
            raise SchemaVersionError(
                f"the table {table.name} is missing from {where} although {META} says schema version {version}: "
                "it was dropped or renamed by hand",
                hint="Nothing was changed. Restore it from a backup, or create it empty: "
                + "; ".join(table.ddl(session.d.type_of, session.d.storage)),
            )
        missing = [c for c in table.names if c not in found]
        if not missing:
            continue
        extra = [c for c in found if c not in table.names]
        if len(missing) == 1 and len(extra) == 1:
            fix = f"Rename it back: ALTER TABLE {table.name} RENAME COLUMN {extra[0]} TO {missing[0]}"
        else:
            fix = (f"Give it back the column(s) {', '.join(missing)} as schema version {version} defines them "
                   "(the docs' tables reference, docs/reference/tables.md), e.g. from a backup")
        raise SchemaVersionError(
            f"the table {table.name} in {where} does not match schema version {version}, which {META} records: "
            f"it has no column {', '.join(missing)}"
            + (f", and has {', '.join(extra)}, which that version does not (renamed by hand?)" if extra else ""),
            hint=f"Nothing was changed; no attempt can run until it matches. {fix}, then Clear the task: it "
            "resumes from its checkpoint",
        )
    raise failure  # pragma: no cover - every table looks whole: the driver's error says what else failed


def _columns(session: SchemaSession, table: str) -> list[str] | None:
    """The table's column names as the database has them (None: no such table), from the cursor's
    description: the same on every DB-API driver."""
    try:
        cur = session.execute(f"SELECT * FROM {table} WHERE 1 = 0")
        names = [d[0] for d in cur.description]
        cur.fetchall()
        session.commit()
    except Exception as exc:
        if not _is_missing_table(exc):
            raise
        session.rollback()
        return None
    return names


def _is_missing_column(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "no such column" in text or ("column" in text and "does not exist" in text)


def _read(session: SchemaSession, sql: str) -> str | None:
    cur = session.execute(sql)
    row = cur.fetchone()
    session.commit()
    return None if row is None else row[0]


def _exists(session: SchemaSession, table: str) -> bool:
    try:
        session.execute(f"SELECT 1 FROM {table} WHERE 1 = 0").fetchall()
        session.commit()
    except Exception as exc:
        if not _is_missing_table(exc):
            raise
        session.rollback()
        return False
    return True


def _is_missing_table(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)
