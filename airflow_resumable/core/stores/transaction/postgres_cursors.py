"""``ctx.transaction()`` on PostgreSQL: the cursors of psycopg2 and psycopg 3 as the handler gets
them, each statement judged by PostgreSQL's own parser exactly as it is sent (see
:mod:`airflow_resumable.core.stores.transaction.handle` for the handle, :mod:`airflow_resumable.core.stores.transaction.statements` for the
verdict)."""

from __future__ import annotations

import codecs
import functools
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from airflow_resumable.core.stores.transaction.handle import Driver, Loan, TransactionConnection, forwarded, from_driver
from airflow_resumable.core.stores.transaction.statements import Wire, postgres_refusal, statement_refused, wire_refusal

# -- psycopg2 ------------------------------------------------------------------------------------


class Psycopg2Driver(Driver):
    """How ``ctx.transaction()`` lends a psycopg2 connection."""

    readable = frozenset({
        "autocommit", "closed", "deferrable", "dsn", "encoding", "get_backend_pid", "get_dsn_parameters",
        "get_parameter_status", "get_transaction_status", "info", "isolation_level", "notices", "protocol_version",
        "readonly", "server_version", "status",
    })

    def cursor(self, guard: TransactionConnection, name: str | None = None, cursor_factory: Any = None,
               withhold: bool = False, scrollable: bool | None = None) -> Any:
        conn = guard._conn
        cur = conn.cursor(name, cursor_factory=_checked_class(cursor_factory or conn.cursor_factory),
                          withhold=withhold, scrollable=scrollable)
        object.__setattr__(cur, "_resumable_guard", guard)
        return cur

    @staticmethod
    def wire(conn: Any) -> Wire:
        """How the server reads this session's texts now (libpq's parameter status: no round trip)."""
        status = conn.get_parameter_status
        return Wire(status("client_encoding") or "", status("standard_conforming_strings") or "",
                    status("DateStyle") or "")


#: A connection's settings, refused on a cursor too (where psycopg2's own cursor class would refuse
#: them as unknown, a Python subclass would keep them, doing nothing).
_CONNECTION_SETTINGS = frozenset({"autocommit", "isolation_level", "readonly", "deferrable", "cursor_factory",
                                  "encoding"})

#: psycopg2 cursor class -> its checked class (made once per class).
_CHECKED: dict[Any, Any] = {}


def _checked_class(base: Any) -> Any:
    """The checked class of a psycopg2 cursor class: the check sits *beneath* ``base`` in the method
    order, right above psycopg2's C cursor, so what ``base``'s own methods send through ``super()`` is
    judged too (``class Mine(cursor): def execute(self, q, v=None): super().execute("COMMIT")`` is
    refused), and its rows keep their shape (``DictCursor``, ``NamedTupleCursor``...)."""
    check = _check_class()
    if base is None or base is check.__mro__[1]:
        return check
    checked = _CHECKED.get(base)
    if checked is None:
        checked = _CHECKED[base] = type(f"Checked{base.__name__}", (base, check), {"__module__": base.__module__})
    return checked


@functools.cache
def _check_class() -> Any:
    import psycopg2
    from psycopg2 import sql as pgsql
    from psycopg2.extensions import cursor as c_cursor
    from psycopg2.extensions import quote_ident

    real_connection = c_cursor.connection  # the C attribute's descriptor
    real_rowcount = c_cursor.rowcount
    real_mogrify = c_cursor.mogrify

    class CheckedCursor(c_cursor):
        """psycopg2's C cursor whose every statement is judged by PostgreSQL's parser before it is
        sent, exactly as it is sent (parameters merged by the C cursor itself); ``.connection`` is the
        handle. Every checked class has it right above the C cursor in its method order."""

        _resumable_guard: TransactionConnection | None = None
        _resumable_many: int | None = None

        @property
        def connection(self) -> Any:
            if from_driver():
                return real_connection.__get__(self)
            return self._resumable_guard

        @property
        def rowcount(self) -> int:
            many = self._resumable_many
            return real_rowcount.__get__(self) if many is None else many

        def __setattr__(self, name: str, value: Any) -> None:
            if name.startswith("_resumable"):
                raise AttributeError(f"{name!r} cannot be set on a cursor of ctx.transaction()")
            if name in _CONNECTION_SETTINGS:  # a cursor has none: set on it, they would change nothing, silently
                guard = self._resumable_guard
                assert guard is not None
                raise guard._loan.refuse_set(name)
            super().__setattr__(name, value)

        def _resumable_text(self, query: Any, vars: Any = None) -> bytes:  # noqa: A002 - psycopg2's name
            guard = self._resumable_guard
            assert guard is not None
            loan = guard._loan
            loan.check()
            conn = real_connection.__get__(self)
            if isinstance(query, pgsql.Composable):
                query = query.as_string(conn)
            text = real_mogrify(self, query, vars)  # the C cursor's: what its execute() would send
            judge(Psycopg2Driver.wire(conn), text.decode(_codec(conn.encoding)), loan)
            return text

        def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 - psycopg2's name
            text = self._resumable_text(query, vars)
            object.__setattr__(self, "_resumable_many", None)
            return super().execute(text)

        def executemany(self, query: Any, vars_list: Any) -> Any:
            if self.name is not None:
                raise psycopg2.ProgrammingError("can't call .executemany() on named cursors")
            texts = [self._resumable_text(query, v) for v in vars_list]  # all judged before any runs
            guard = self._resumable_guard
            assert guard is not None
            conn = real_connection.__get__(self)
            total = 0
            for text in texts:
                # judged as the session read texts then: a text before it may have changed that (a function's body)
                unchanged(Psycopg2Driver.wire(conn), guard._loan)
                super().execute(text)
                n = real_rowcount.__get__(self)
                total = -1 if n < 0 or total < 0 else total + n
            object.__setattr__(self, "_resumable_many", total)

        def callproc(self, procname: str, parameters: Any = None) -> Any:
            conn = real_connection.__get__(self)
            if isinstance(parameters, Mapping):
                args = ", ".join(f"{quote_ident(k, conn)}:=%s" for k in parameters)
                values: Any = list(parameters.values())
            else:
                values = list(parameters or ())
                args = ", ".join(["%s"] * len(values))
            self.execute(f"SELECT * FROM {procname}({args})", values)
            return parameters

        def copy_expert(self, sql: Any, file: Any, size: int = 8192) -> Any:
            guard = self._resumable_guard
            assert guard is not None
            guard._loan.check()
            conn = real_connection.__get__(self)
            if isinstance(sql, pgsql.Composable):
                sql = sql.as_string(conn)
            text = sql.decode(_codec(conn.encoding)) if isinstance(sql, bytes) else sql
            judge(Psycopg2Driver.wire(conn), text, guard._loan)
            object.__setattr__(self, "_resumable_many", None)
            return super().copy_expert(sql, file, size)

        def copy_from(self, file: Any, table: str, sep: str = "\t", null: str = "\\N", size: int = 8192,
                      columns: Any = None) -> Any:
            return self.copy_expert(pgsql.SQL("COPY {}{} FROM stdin WITH DELIMITER AS {} NULL AS {}").format(
                pgsql.Identifier(table), _columns(columns), pgsql.Literal(sep), pgsql.Literal(null)), file, size)

        def copy_to(self, file: Any, table: str, sep: str = "\t", null: str = "\\N", columns: Any = None) -> Any:
            return self.copy_expert(pgsql.SQL("COPY {}{} TO stdout WITH DELIMITER AS {} NULL AS {}").format(
                pgsql.Identifier(table), _columns(columns), pgsql.Literal(sep), pgsql.Literal(null)), file)

    def _columns(columns: Any) -> Any:
        if not columns:
            return pgsql.SQL("")
        return pgsql.SQL("({})").format(pgsql.SQL(",").join(pgsql.Identifier(c) for c in columns))

    return CheckedCursor


@functools.cache
def _codec(encoding: str) -> str:
    """Python's name of a PostgreSQL client encoding (its canonical one: ``bytes.decode`` takes
    ``utf-8`` by a fast path, ``utf_8`` through the codec registry)."""
    from psycopg2.extensions import encodings

    return codecs.lookup(encodings.get(encoding, encoding)).name


def unchanged(now: Wire, loan: Loan) -> None:
    """Refuse to send anything while the session reads texts unlike the check does (see :func:`judge`):
    checked again right before each text a call judged up front is sent, since a text sent before it
    (a function's body) may have changed how the server reads the next.

    Raises:
        TransactionRefused: nothing was sent.
    """
    wrong = wire_refusal(loan.wire, now, loan.job, loan.slot)
    if wrong is not None:
        raise wrong


def judge(now: Wire, text: str, loan: Loan) -> None:
    """Refuse ``text`` if PostgreSQL's parser finds a statement in it that would end the chunk's
    transaction, or if the session reads texts unlike that parser does: ``standard_conforming_strings``
    off (``'\\'`` would quote differently), or a client encoding other than the one lent (the server
    would convert the bytes unlike the check decoded them).

    Raises:
        TransactionRefused: nothing was sent.
    """
    unchanged(now, loan)
    refusal = postgres_refusal(text)
    if refusal is not None:
        raise statement_refused(refusal, loan.job, loan.slot)


# -- psycopg 3 -----------------------------------------------------------------------------------


class Psycopg3Driver(Driver):
    """How ``ctx.transaction()`` lends a psycopg 3 connection (the Postgres provider's hook).

    **The handler's adapters are its own.** ``tx.adapters`` is a copy of the connection's adapter map,
    taken when the connection is lent, and the handler's cursors adapt through (copies of) it: a dumper
    or loader the handler registers there serves its own statements and never the run's, whose cursors
    copy the connection's map, left as it was (a ``str`` dumper registered on the live map would
    rewrite the checkpoint's own position).
    """

    readable = frozenset({"adapters", "autocommit", "broken", "closed", "prepare_threshold"})

    def __init__(self) -> None:
        self._mogrifier: Any = None
        self._adapters: Any = None

    def adapters(self, conn: Any) -> Any:
        """The handler's adapter map: a copy of ``conn``'s, taken once per loan."""
        if self._adapters is None:
            from psycopg.adapt import AdaptersMap

            self._adapters = AdaptersMap(conn.adapters)
        return self._adapters

    def cursor(self, guard: TransactionConnection, *args: Any, **kwargs: Any) -> Psycopg3Cursor:
        return Psycopg3Cursor(self._lent(guard._conn.cursor(*args, **kwargs), guard._conn), guard)

    def _lent(self, cur: Any, conn: Any) -> Any:
        """``cur`` (new, nothing sent yet) adapting through the handler's map instead of the connection's.
        psycopg has no argument for it: the cursor's map is replaced as its own ``__init__`` sets it."""
        from psycopg.adapt import AdaptersMap

        adapters = AdaptersMap(self.adapters(conn))
        adapters._register_loader_callback = functools.partial(cur._loaders_changed, weakref.ref(cur))
        cur._adapters = adapters
        return cur

    def read(self, conn: Any, name: str) -> Any:
        if name == "adapters":
            return self.adapters(conn)
        return super().read(conn, name)

    @staticmethod
    def wire(conn: Any) -> Wire:
        """How the server reads this session's texts now (libpq's parameter status: no round trip)."""
        status = conn.info.parameter_status  # str in psycopg 3
        return Wire(str(status("client_encoding") or ""), str(status("standard_conforming_strings") or ""),
                    str(status("DateStyle") or ""))

    def merged(self, conn: Any, query: Any, params: Any) -> str:
        """``query`` with ``params`` merged into it, as psycopg's client-side cursors send it (through the
        handler's adapters)."""
        if self._mogrifier is None:
            import psycopg

            self._mogrifier = psycopg.ClientCursor(conn)
            self._mogrifier._adapters = self.adapters(conn)  # the handler's map itself: what it registers later too
        return self._mogrifier.mogrify(query, params)


class Psycopg3Cursor:
    """A psycopg 3 cursor, allow-listed: each statement is judged before it is sent, as the server
    parses it: with its parameters merged where they are merged client-side (a ``ClientCursor``, a
    ``COPY``), else with ``$1``, ``$2``... in their places (server-side parameters: the server never
    parses their values)."""

    __slots__ = ("_cur", "_guard", "_many")
    _SETTABLE = frozenset({"arraysize", "row_factory"})
    _READABLE = frozenset({
        "adapters", "arraysize", "close", "closed", "description", "fetchall", "fetchmany", "fetchone", "format",
        "name", "nextset", "row_factory", "rownumber", "scroll", "statusmessage",
    })

    def __init__(self, cur: Any, guard: TransactionConnection):
        object.__setattr__(self, "_cur", cur)
        object.__setattr__(self, "_guard", guard)
        object.__setattr__(self, "_many", None)

    @property
    def connection(self) -> Any:
        if from_driver():
            return self._guard._conn
        return self._guard

    @property
    def rowcount(self) -> int:
        many = self._many
        return self._cur.rowcount if many is None else many

    def _sent(self, query: Any, params: Any) -> tuple[Any, Any]:
        """What to send (query, params), once the text the server parses is judged.

        Raises:
            TransactionRefused: nothing was sent.
        """
        import psycopg

        guard = self._guard
        guard._loan.check()
        conn = guard._conn
        if isinstance(query, psycopg.sql.Composable):
            query = query.as_string(conn)
        text = query
        if params is not None:
            client = isinstance(self._cur, psycopg.ClientCursor)
            if client or not params:
                # merged by the cursor itself where it merges (its own dumpers), else by one on the connection;
                # the text is what goes (simple query protocol): send what was judged
                text = self._cur.mogrify(query, params) if client else guard._driver.merged(conn, query, params)
                query, params = text, None
            else:
                # Server-side parameters: the server parses the query with $1, $2... in their places, never the
                # values, so that text is judged (values merged in would be read otherwise: '/*' in a comment
                # opens a nested one, which hid what followed from the check)
                cur = self._cur  # converted as the cursor itself converts it (its query class, its adapters)
                converted = cur._query_cls(psycopg.adapt.Transformer(cur))
                converted.convert(query, params)
                text = converted.query
        if isinstance(text, bytes):
            text = text.decode(conn.info.encoding)
        judge(Psycopg3Driver.wire(conn), text, guard._loan)
        object.__setattr__(self, "_many", None)
        return query, params

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Psycopg3Cursor:
        query, params = self._sent(query, params)
        self._cur.execute(query, params, **kwargs)
        return self

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        import psycopg

        params_seq = list(params_seq)
        if params_seq and not isinstance(self._cur, psycopg.ClientCursor) and all(params_seq):
            # Server-side parameters: one statement for every set (the server takes one statement with
            # parameters), judged as the server parses it before any is sent; sent by psycopg's own
            # executemany (pipelined). The server parses the query with $1, $2... in the values' places,
            # one text for every set of one shape (its names, or how many): judged once a shape, not once
            # a set (each would be dumped twice: for the check, then by psycopg)
            shapes = {frozenset(p) if isinstance(p, Mapping) else len(p): p for p in params_seq}
            for params in shapes.values():
                self._sent(query, params)
            self._cur.executemany(query, params_seq, **kwargs)
            return
        sent = [self._sent(query, p) for p in params_seq]  # all judged before any runs
        guard = self._guard
        total = 0
        for q, p in sent:
            # judged as the session read texts then: a text before it may have changed that (a function's body)
            unchanged(Psycopg3Driver.wire(guard._conn), guard._loan)
            self._cur.execute(q, p)
            total += max(self._cur.rowcount, 0)
        object.__setattr__(self, "_many", total)

    def stream(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        query, params = self._sent(query, params)
        return self._cur.stream(query, params, **kwargs)

    @contextmanager
    def copy(self, statement: Any, params: Any = None, **kwargs: Any) -> Iterator[Any]:
        import psycopg

        guard = self._guard
        if params is not None:  # psycopg merges COPY's parameters client-side
            if isinstance(statement, psycopg.sql.Composable):
                statement = statement.as_string(guard._conn)
            statement = guard._driver.merged(guard._conn, statement, params)
        statement, _ = self._sent(statement, None)
        with self._cur.copy(statement, **kwargs) as copy:
            yield _Copy(copy)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur)

    def __enter__(self) -> Psycopg3Cursor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cur.close()

    def __getattr__(self, name: str) -> Any:
        if name in self._READABLE:
            return forwarded(getattr(self._cur, name))
        raise AttributeError(f"a cursor of ctx.transaction() has no {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._SETTABLE:
            raise AttributeError(f"{name!r} cannot be set on a cursor of ctx.transaction()")
        setattr(self._cur, name, value)


class _Copy:
    """psycopg 3's ``Copy`` object, without its ``connection`` and ``cursor``."""

    __slots__ = ("_copy",)
    _READABLE = frozenset({"read", "read_row", "rows", "set_types", "write", "write_row"})

    def __init__(self, copy: Any):
        object.__setattr__(self, "_copy", copy)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._copy)

    def __getattr__(self, name: str) -> Any:
        if name in self._READABLE:
            return forwarded(getattr(self._copy, name))
        raise AttributeError(f"a COPY of ctx.transaction() has no {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{name!r} cannot be set on a COPY of ctx.transaction()")
