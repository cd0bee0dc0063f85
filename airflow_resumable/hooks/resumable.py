"""The hook that turns an Airflow connection into a checkpoint store."""

from __future__ import annotations

import os
from typing import Any

from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.checkpoint import short
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from airflow_resumable.core.stores.sqlite_errors import URI_PARAMS
from airflow_resumable.version_compat import AirflowNotFoundException, BaseHook

DEFAULT_CONN_ID = defaults.CONN_ID

_HOW_TO = (
    "Configure it, e.g. AIRFLOW_CONN_{env}='sqlite:////absolute/path/checkpoints.db' for the embedded "
    "store, or AIRFLOW_CONN_{env}='postgresql://user:password@host:5432/dbname' for PostgreSQL "
    "(or `airflow connections add {conn_id} --conn-uri ...`)"
)


class ResumableHook(BaseHook):
    """Opens the checkpoint store named by an Airflow connection.

    The connection's type picks the store: ``sqlite`` (the file is the connection's host or schema,
    i.e. ``sqlite:////abs/path.db``, or a SQLite ``file:`` URI, ``sqlite:///file:/abs/path.db?mode=rwc``) or ``postgres``, Airflow's standard PostgreSQL connection:
    the Postgres provider's hook connects, so every extra it supports works here too (``sslmode``
    and other libpq options, ``iam`` for AWS RDS, ``options``...).

    :param resumable_conn_id: the connection's id (default ``resumable_default``).
    """

    conn_name_attr = "resumable_conn_id"
    default_conn_name = DEFAULT_CONN_ID

    def __init__(self, resumable_conn_id: str = DEFAULT_CONN_ID, *, job: str | None = None, slot: str | None = None):
        super().__init__()
        self.resumable_conn_id = resumable_conn_id
        self._job, self._slot = job, slot

    def get_store(self) -> Store:
        """The store for this connection.

        Raises:
            ConfigurationError: the connection is missing or of a type no store serves.
        """
        try:
            conn = self.get_connection(self.resumable_conn_id)
        except AirflowNotFoundException:
            env = self.resumable_conn_id.upper()
            raise ConfigurationError(
                f"the Airflow connection {self.resumable_conn_id!r} for the checkpoint store does not exist",
                job=self._job,
                slot=self._slot,
                hint=_HOW_TO.format(env=env, conn_id=self.resumable_conn_id),
            ) from None
        return store_from_connection(conn, job=self._job, slot=self._slot)


def store_from_connection(conn: Any, *, job: str | None = None, slot: str | None = None) -> Store:
    """Build a store from an Airflow ``Connection`` (or anything with the same attributes)."""
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "sqlite":
        path = conn.host or conn.schema
        if not path:
            raise ConfigurationError(
                f"the SQLite connection {conn.conn_id!r} names no database file",
                job=job,
                slot=slot,
                hint="Use a URI with an absolute path: sqlite:////absolute/path/checkpoints.db",
            )
        if not path.startswith("file:") and not os.path.isabs(path):  # a file: URI is read (and checked) by the store
            # sqlite:///var/lib/x.db (three slashes) parses to the relative path var/lib/x.db.
            raise ConfigurationError(
                f"the SQLite connection {conn.conn_id!r} names the relative path {path!r}",
                job=job,
                slot=slot,
                hint=f"Use four slashes for an absolute path: sqlite:///{os.path.join(os.sep, path)} "
                "(sqlite:/// followed by the absolute path)",
            )
        extra = conn.extra_dejson or {}
        # A URI's query lands in the extras: sqlite:///file:/abs/x.db?mode=rwc gives {"mode": "rwc"}.
        params = {k: str(v) for k, v in extra.items() if k in URI_PARAMS}
        given = extra.get("busy_timeout", 30.0)
        try:
            if isinstance(given, bool) or (isinstance(given, str) and "_" in given):
                raise ValueError(given)
            busy = float(given)
            if not 0.1 <= busy <= 86400:
                raise ValueError(busy)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"the SQLite connection {conn.conn_id!r} gives busy_timeout={outward_text(short(given), 80)}", job=job,
                slot=slot, hint="Give the seconds a writer waits for another's write lock before it names the holder "
                "and gives up, a number from 0.1 to 86400 (the default 30), e.g. ?busy_timeout=60",
            ) from None
        try:
            return SQLiteStore(path, synchronous=str(extra.get("synchronous", "FULL")), params=params,
                               busy_timeout=busy)
        except ConfigurationError as exc:  # name the connection, the job and the slot too
            raise ConfigurationError(f"the SQLite connection {conn.conn_id!r}: {exc.message}", job=job, slot=slot,
                                     hint=exc.hint) from None
    if conn_type in ("postgres", "postgresql"):
        try:
            from airflow_resumable.version_compat import PostgresHook
        except ImportError:
            raise ConfigurationError(
                f"the PostgreSQL connection {conn.conn_id!r} needs Airflow's Postgres provider",
                job=job,
                slot=slot,
                hint="Install it with: pip install 'airflow-resumable[postgres]'",
            ) from None
        # The connection already read: no second lookup, and none from the lease keeper's thread.
        hook = PostgresHook(postgres_conn_id=conn.conn_id, connection=conn)
        return PostgresStore.from_connect(hook.get_conn, host=conn.host, port=conn.port, user=conn.login,
                                          dbname=conn.schema)
    raise ConfigurationError(
        f"the connection {conn.conn_id!r} has type {conn.conn_type!r}, which no checkpoint store serves",
        job=job,
        slot=slot,
        hint="Use a connection of type 'sqlite' (embedded, one machine) or 'postgres'",
    )
