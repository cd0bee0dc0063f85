"""PostgreSQL checkpoint store (psycopg2): for many workers and production."""

from __future__ import annotations

import math
import select
import time
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.model.errors import ConfigurationError, StoreUnavailable
from airflow_resumable.core.stores.base import Store
from airflow_resumable.core.stores.dialect import Dialect


class PostgresDialect(Dialect):
    """PostgreSQL: TIMESTAMPTZ from the server's clock, ``%s`` markers, an advisory lock for DDL."""

    name = "postgres"
    marker = "%s"
    timestamp_type = "TIMESTAMPTZ"
    aware_timestamps = True
    writable_ctes = True
    prepares = True
    id_type = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    # Two workers creating or migrating the schema at once would race on the DDL.
    schema_lock = ("SELECT pg_catalog.pg_advisory_xact_lock(7241730117)",)
    # Two int4 keys (a space apart from the schema lock's one bigint key): the product's class, the job's hash.
    # Qualified: a function of the same name in a schema the search path puts before pg_catalog is not the lock.
    job_lock = "SELECT pg_catalog.pg_advisory_xact_lock(724173011, pg_catalog.hashtext(%(job)s))"
    # A database or role whose default_transaction_isolation is 'repeatable read' would otherwise take
    # the locked statement's snapshot before the lock is granted.
    job_lock_isolation = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
    # ALTER TABLE waits for every open transaction on the table (a long transactional chunk) and
    # blocks the table's readers meanwhile: give up after a while instead, and retry.
    migration_setup = ("SET LOCAL lock_timeout = '30s'",)

    def now(self) -> str:
        return "clock_timestamp()"

    def now_plus(self, seconds: str) -> str:
        return f"(clock_timestamp() + {seconds} * interval '1 second')"

    def storage(self, fillfactor: int) -> str:
        return f" WITH (fillfactor = {int(fillfactor)})"

    def set_fillfactor(self, table: str, fillfactor: int) -> list[str]:
        return [f"ALTER TABLE {table} SET (fillfactor = {int(fillfactor)})"]


DIALECT = PostgresDialect()

#: Connection parameters that may come from an Airflow connection's extras.
_EXTRA_KEYS = {
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "options",
    "connect_timeout",
    "application_name",
    "target_session_attrs",
    "keepalives",
    "keepalives_idle",
}


def _psycopg2() -> Any:
    try:
        import psycopg2
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            "the PostgreSQL checkpoint store needs psycopg2",
            hint="Install it with: pip install 'airflow-resumable[postgres]' (or psycopg2-binary)",
        ) from exc
    return psycopg2


def _wait_for_fd(fd: int, events: int, timeout: float | None) -> None:
    """Wait until ``fd`` is ready for ``events`` (``select.POLLIN``/``POLLOUT``) or ``timeout`` seconds
    passed. :func:`select.poll`, not :func:`select.select`: a worker may hold more than 1,024 open
    files, and ``select()`` refuses any descriptor numbered past that ("filedescriptor out of range")."""
    poller = select.poll()
    poller.register(fd, events)
    poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000)))


class PostgresStore(Store):
    """Checkpoints in a PostgreSQL table.

    Args:
        host, port, user, password, dbname: where to connect. The password is never logged.
        **params: further libpq parameters (``sslmode``, ``options``, ``connect_timeout`` ...).
    """

    dialect = DIALECT

    def __init__(
        self,
        *,
        host: str | None = None,
        port: int | None = None,
        user: str | None = None,
        password: str | None = None,
        dbname: str | None = None,
        **params: Any,
    ):
        self._params: dict[str, Any] = {
            k: v
            for k, v in dict(host=host, port=port, user=user, password=password, dbname=dbname).items()
            if v not in (None, "")
        }
        unknown = set(params) - _EXTRA_KEYS
        if unknown:
            raise ConfigurationError(
                f"unknown PostgreSQL connection parameter(s) {sorted(unknown)}",
                hint=f"Use one of {sorted(_EXTRA_KEYS)}",
            )
        self._params.update(params)
        self._params.setdefault("connect_timeout", 10)
        self._params.setdefault("application_name", "airflow-resumable")
        self._connect: Callable[[], Any] | None = None

    @classmethod
    def from_connect(cls, connect: Callable[[], Any], *, host: Any = None, port: Any = None, user: Any = None,
                     dbname: Any = None) -> PostgresStore:
        """A store whose connections come from ``connect()`` (a DB-API connection of psycopg2 or
        psycopg 3), e.g. the Postgres provider's hook. The other arguments only name the database
        in logs and errors."""
        store = cls(host=host, port=port, user=user, dbname=dbname)
        store._connect = connect
        return store

    @classmethod
    def from_dsn(cls, dsn: str) -> PostgresStore:
        """Build from a libpq DSN or URI (``postgresql://user@host:5432/db``)."""
        from psycopg2.extensions import parse_dsn

        return cls(**parse_dsn(dsn))

    def connect(self, *, autocommit: bool = False) -> Any:
        if self._connect is not None:
            try:
                conn = self._connect()
            except ConfigurationError:
                raise
            except Exception as exc:  # the driver's own error; its text names no password
                raise self._cannot_connect(f"{type(exc).__name__}: {str(exc).strip()}") from exc
            conn.autocommit = autocommit
            return conn
        psycopg2 = _psycopg2()
        try:
            conn = psycopg2.connect(**self._params)
        except psycopg2.OperationalError as exc:
            # libpq's message names host, port and user, never the password.
            raise self._cannot_connect(str(exc).strip()) from exc
        conn.autocommit = autocommit
        return conn

    def set_autocommit(self, conn: Any, on: bool) -> None:
        conn.autocommit = on

    def connect_nowait(self, like: Any = None) -> Any | None:
        """A psycopg2 connection in asynchronous mode, still connecting: :meth:`wait` finishes it,
        and each statement it is given returns at once, its result collected by :meth:`wait`.

        Its parameters are this store's, or for a store built on a connect function (a hook)
        those of ``like``, a connection that function opened. None when the driver offers no
        asynchronous mode (``like`` is not a psycopg2 connection).

        Raises:
            StoreUnavailable: the connection could not be started.
        """
        psycopg2 = _psycopg2()
        params = self._params
        if self._connect is not None:
            info = getattr(like, "info", None)
            if not isinstance(like, psycopg2.extensions.connection) or info is None:
                return None
            params = dict(info.dsn_parameters)
            if info.password:
                params["password"] = info.password
        try:
            return psycopg2.connect(**params, async_=True)
        except psycopg2.OperationalError as exc:
            raise self._cannot_connect(str(exc).strip()) from exc

    def _cannot_connect(self, detail: str) -> StoreUnavailable:
        """The error of a connection that could not be made (the driver's text names no password)."""
        return StoreUnavailable(
            f"cannot connect to the PostgreSQL checkpoint database {self.describe()}: {detail}",
            hint="Check the Airflow connection's host, port, login and database, and that the server runs",
        )

    def wait(self, conn: Any, *, connecting: bool = False) -> None:
        """Wait until an asynchronous connection (:meth:`connect_nowait`) is connected (within
        libpq's ``connect_timeout``, 10 s unless set), or its statement in flight has finished;
        its error, if any, is raised here.

        Raises:
            StoreUnavailable: the connection took longer than ``connect_timeout`` (it is then unusable).
            psycopg2.Error: what the connection or the statement failed with.
        """
        from psycopg2 import extensions

        timeout = self._connect_timeout() if connecting else None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = conn.poll()
            if state == extensions.POLL_OK:
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise StoreUnavailable(
                    f"the PostgreSQL checkpoint database {self.describe()} did not answer within {timeout:g}s",
                    hint="Check that the server runs and is reachable from the worker",
                )
            if state == extensions.POLL_READ:
                _wait_for_fd(conn.fileno(), select.POLLIN, left)
            elif state == extensions.POLL_WRITE:
                _wait_for_fd(conn.fileno(), select.POLLOUT, left)
            else:  # pragma: no cover - psycopg2 raises for a failed poll
                raise extensions.OperationalError(f"unexpected poll state {state!r}")

    def _connect_timeout(self) -> float:
        """Seconds a connection may take: libpq's ``connect_timeout`` (set to 10 unless given)."""
        try:
            return float(self._params["connect_timeout"])
        except (TypeError, ValueError):  # libpq would have refused it at the first connect
            return 10.0

    def describe(self) -> str:
        p = self._params
        user = f"{p['user']}@" if p.get("user") else ""
        port = f":{p['port']}" if p.get("port") else ""
        return f"postgresql://{user}{p.get('host', '')}{port}/{p.get('dbname', '')}"
