"""The keyset reader: rows of a table or a query, paged on a unique key (one column or a composite key)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_resumable.core.model.checkpoint import short
from airflow_resumable.core.model.errors import ConfigurationError, ResumableError
from airflow_resumable.core.model.keys import json_key, json_keys
from airflow_resumable.core.model.observe import Source
from airflow_resumable.core.readers.base import Batch, Reader, check_arguments, close_quietly, plain
from airflow_resumable.core.readers.sql import IDENTIFIER, MARKERS, paramstyle_of, placeholder_problems

if TYPE_CHECKING:
    from airflow_resumable.core.attempt.context import RunContext

__all__ = ["KeysetReader", "SplitKeys"]

#: How often a page whose guard failed is read again when the failure is gone by the time it is asked
#: about (the source changed in between).
_GUARD_TRIES = 3

#: A SQL condition and the values of its placeholders.
_Condition = tuple[str, Sequence[Any]]


class KeysetReader(Reader):
    """Rows of a table or a query, paged on a unique key: correct and in constant time per page.

    Each page is ``SELECT ... WHERE (k1, k2) > (<last key>) ORDER BY k1, k2 LIMIT n``: with an
    index on the key columns (the primary key, or ``CREATE INDEX ... (k1, k2)``), one index range
    scan reading ``n`` rows wherever the position is. The key must be **unique**: a run of equal
    keys across a page boundary would be skipped. Make it unique by adding a unique column
    (``key=("updated_at", "id")``); the reader checks every page (and the row after it) and fails
    on duplicates instead of skipping rows. Unique **for the database**: it decides the page
    boundary, so it also decides equality. A text key in a collation that calls ``'a'`` and ``'A'``
    equal (SQLite's ``NOCASE``, a nondeterministic ICU collation, most of MySQL's) is refused when
    a page ends on a key the database calls equal to another row's. Key values must not be NULL: a
    NULL is neither before nor after a position, and the databases sort it at different ends.

    Each page asks the database, in the page's own statement, whether the previous page's last key
    has a twin and whether a NULL key sits where this page's ``>`` cannot see it (index look-ups,
    evaluated once per page); if so the page comes back empty and one more query names the rows.

    Args:
        connect: opens a DB-API connection (kept for the attempt, closed when the loop ends).
        table: a table (or view) name; or
        query: a SELECT whose rows to page (wrapped as a subquery: the database pushes the key
            condition into it, so an index on the underlying table still serves).
        key: the key column, or columns for a composite key, in the index's order. They must be
            among the selected columns.
        columns: the columns to select from ``table`` (default all).
        where: an extra condition on ``table``'s rows (or ``query``'s), in the driver's
            placeholder style, its values in ``params``.
        params: values for the placeholders of ``query`` and then ``where``, in that order.
        as_dict: rows as dicts of column name to value instead of the driver's tuples.
        paramstyle: the driver's DB-API paramstyle (``format``/``pyformat``: ``%s``, ``qmark``:
            ``?``); default: read from the driver's module on first connect.
        name: names the source in errors (default the table, or "query").
        until: the last key to read, inclusive (a position, as the reader checkpoints it): the
            reader stops after it, so ``(after, until]`` is one range of the key, compared as
            the pages compare (a row value for a composite key; ties and collations decide as
            the database does). None (the default): to the end. :meth:`within` gives a copy
            that also reads one range only; a partitioned job's partitions read their ranges
            this way, within the reader's own ``until``, ``where`` and ``params``.

    Raises:
        ConfigurationError: bad arguments, all of them named at once; the placeholders of
            ``query``/``where`` that do not match ``params`` or the driver (checked here when
            ``paramstyle`` is given, else before the first page is read).
    """

    def __init__(
        self,
        *,
        connect: Callable[[], Any],
        key: str | Sequence[str],
        table: str | None = None,
        query: str | None = None,
        columns: str | Sequence[str] = "*",
        where: str | None = None,
        params: Sequence[Any] = (),
        as_dict: bool = False,
        paramstyle: str | None = None,
        name: str | None = None,
        until: Any = None,
    ):
        super().__init__()
        keys = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, (list, tuple)) else ()
        cols = columns if isinstance(columns, str) else ", ".join(columns)
        problems = []
        if not callable(connect):
            problems.append(f"connect must be a function opening a DB-API connection, got {type(connect).__name__}")
        if not keys:
            problems.append(f"key must be a column name or a list of them, got {key!r}")
        problems += [f"key column {k!r} is not a plain column name" for k in keys
                     if not isinstance(k, str) or not IDENTIFIER.match(k)]
        if (table is None) == (query is None):
            problems.append("give exactly one of table= and query=")
        if table is not None and not (isinstance(table, str) and IDENTIFIER.match(table)):
            problems.append(f"table {table!r} is not a plain (optionally schema-qualified) table name")
        if query is not None and (not isinstance(query, str) or not query.strip()):
            problems.append("query must be the text of a SELECT")
        if query is not None and cols.strip() != "*":
            problems.append("columns= applies to table=; select the columns in the query instead")
        if paramstyle is not None and paramstyle not in MARKERS:
            problems.append(f"paramstyle must be one of {', '.join(MARKERS)}, got {paramstyle!r}")
        elif paramstyle is not None and not problems:
            problems += placeholder_problems(MARKERS[paramstyle], (query, where, cols), len(params))
        check_arguments("keyset", problems)
        self.connect = connect
        self.keys: tuple[str, ...] = keys
        self.table, self.query, self.columns, self.where = table, query, cols, where
        self.params = tuple(params)
        self.as_dict = as_dict
        self.paramstyle = paramstyle
        self.name = name or table or "query"
        self.until: Any = None
        if until is not None:
            self.until = self._bound_values(until)
        #: The range of :meth:`within` (keys after ``[0]``, up to ``[1]``; None: unbounded), on top
        #: of the reader's own bounds; None: the whole source.
        self.range: tuple[Any, Any] | None = None
        self._conn: Any = None
        self._key_index: tuple[int, ...] | None = None
        self._checked_marker: str | None = MARKERS[paramstyle] if paramstyle else None

    def source(self) -> Source:
        """The table, or the query, this reader pages through; with the Airflow connection its
        ``connect`` names (``sql_reader(conn_id, ...)``'s), if any."""
        connection = getattr(self.connect, "conn_id", None)
        if self.table is not None:
            return Source("table", self.table, connection)
        return Source("query", self.query or "", connection)

    def within(self, until: Any, *, after: Any = None) -> KeysetReader:
        """A copy of this reader that reads only the keys after ``after`` (None: from the first)
        up to ``until`` (inclusive; None: to the last) **and** within this reader's own bounds:
        its ``until``, ``where`` and ``params`` still apply, so a range reaching past them reads
        nothing there. Both ends are compared as the pages are (by the database).

        The copy holds no connection of this one: each partition of a job opens its own.

        Raises:
            ConfigurationError: ``until`` or ``after`` is not a key of this reader's columns.
        """
        bounded = copy.copy(self)
        bounded._conn, bounded._ctx = None, None
        bounded.range = (None if after is None else self._bound_values(after, "after"),
                         None if until is None else self._bound_values(until))
        return bounded

    def identity(self) -> dict[str, Any]:
        """What this reader's positions are positions of (see :meth:`Reader.identity`): the
        table or the query, the key columns, ``where``, ``params``, ``until``, the Airflow
        connection of a :func:`~airflow_resumable.readers.sql_reader`, and the range of
        :meth:`within`. Not ``columns``, ``as_dict`` or ``name``: they change what a row looks
        like, not which rows come in which order."""
        out: dict[str, Any] = {"reader": "keyset"}
        connection = getattr(self.connect, "conn_id", None)
        if isinstance(connection, str):
            out["connection"] = connection
        out.update({"table": self.table} if self.table is not None else {"query": self.query})
        out["key"] = list(self.keys)
        if self.where:
            out["where"] = self.where
        if self.params:
            out["params"] = plain(self.params)
        if self.until is not None:
            out["until"] = plain(self.until)
        if self.range is not None:
            out["range"] = {"after": plain(self.range[0]), "until": plain(self.range[1])}
        return out

    def _bound_values(self, until: Any, what: str = "until") -> Any:
        if len(self.keys) > 1 and not (isinstance(until, (list, tuple)) and len(until) == len(self.keys)):
            check_arguments("keyset", [f"{what} {short(until)} is not a key of {len(self.keys)} values "
                                       f"({', '.join(self.keys)})"])
        if (until if len(self.keys) > 1 else [until]).count(None):
            check_arguments("keyset", [f"{what} {short(until)} has a NULL value: no key is before or after it"])
        return list(until) if len(self.keys) > 1 else until

    # -- SQL --------------------------------------------------------------------------------------

    def _source(self, what: str | None = None) -> str:
        """The rows to page, selecting ``what`` (default: the columns to return)."""
        if self.table is not None:
            return f"SELECT {what or self.columns} FROM {self.table}"
        return f"SELECT {what or '*'} FROM ({self.query}) AS keyset_source"

    def _rows(self, conditions: Sequence[_Condition], what: str | None = None, *, marker: str = "%s",
              bounded: bool = True) -> tuple[str, list[Any]]:
        """The source's rows that pass ``where``, ``until`` and the range of :meth:`within` (when
        ``bounded``) and ``conditions`` (each a SQL text and its values)."""
        if bounded:
            bounds = [] if self.until is None else [self._up_to(self.until, marker)]
            if self.range is not None:
                after, until = self.range
                bounds += [] if after is None else [self._after(after if len(self.keys) > 1 else [after], marker)]
                bounds += [] if until is None else [self._up_to(until, marker)]
            conditions = [*bounds, *conditions]
        texts = ([f"({self.where})"] if self.where else []) + [c for c, _ in conditions]
        sql = self._source(what) + (f" WHERE {' AND '.join(texts)}" if texts else "")
        return sql, [*self.params, *(v for _, values in conditions for v in values)]

    def _up_to(self, until: Any, marker: str) -> _Condition:
        """Rows up to ``until``, inclusive: the mirror of :meth:`_after`."""
        if len(self.keys) == 1:
            return f"{self.keys[0]} <= {marker}", [until]
        return f"({', '.join(self.keys)}) <= ({', '.join([marker] * len(self.keys))})", list(until)

    def _after(self, values: Sequence[Any], marker: str) -> _Condition:
        """Rows after the position: a row value for a composite key, compared as the index is ordered."""
        if len(self.keys) == 1:
            return f"{self.keys[0]} > {marker}", values
        return f"({', '.join(self.keys)}) > ({', '.join([marker] * len(self.keys))})", values

    def _equal(self, values: Sequence[Any], marker: str) -> _Condition:
        """Rows whose key the database calls equal to the position (its collation decides, not Python)."""
        return " AND ".join(f"{k} = {marker}" for k in self.keys), values

    def _unseen_nulls(self, values: Sequence[Any] | None, marker: str) -> list[_Condition]:
        """The NULL keys no page after the position can see, one index look-up each.

        ``(a, b) > (x, y)`` is neither true nor false for a NULL ``a``, nor for ``(x, NULL)``: such
        rows are never on a page after a position in their group. PostgreSQL sorts NULLs last, so
        that is where they are; SQLite sorts them first, behind the position once the first page
        is read. So each page looks for ``a IS NULL``, and for ``a = x AND b IS NULL`` (and so on,
        column by column, for longer keys), which an index on the key answers at once.
        """
        probes: list[_Condition] = [(f"{self.keys[0]} IS NULL", ())]
        for i in range(1, len(self.keys) if values is not None else 0):
            prefix = " AND ".join(f"{k} = {marker}" for k in self.keys[:i])
            probes.append((f"{prefix} AND {self.keys[i]} IS NULL", values[:i]))  # type: ignore[index]
        return probes

    def _guard(self, values: Sequence[Any] | None, marker: str) -> list[_Condition]:
        """The conditions under which a page is safe to read: no twin of the position's key, no
        NULL key out of the page's sight.

        Each is a subquery that names no column of the page's rows, so the database runs it once
        per page (PostgreSQL: a one-time filter above the index scan; SQLite: a cached result,
        tested again on each row for a few instructions), and a page whose guard fails comes back
        empty (see :meth:`_diagnose`). Not in ``LIMIT CASE WHEN ... END``, which SQLite would test
        once only: PostgreSQL plans a ``LIMIT`` it cannot read for a tenth of the table, which can
        turn a page into a sort.

        Each look-up is ordered by the key with a constant ``LIMIT``, so the key's index is the
        cheaper plan whatever the statistics say. A plain ``NOT EXISTS (... key IS NULL)`` is not:
        on a PostgreSQL table never analyzed (a bulk load read before autovacuum's first look, or
        autovacuum off) the planner guesses that 0.5 % of the keys are NULL and scans the whole
        table for the first one, on every page (40 ms a page at 800,000 rows, growing with the
        table); ordered by the key, the index answers in one look-up."""
        guard: list[_Condition] = []
        order = f"ORDER BY {', '.join(self.keys)}"
        if values is not None:
            sql, args = self._rows([self._equal(values, marker)], what="1", marker=marker)
            guard.append((f"(SELECT count(*) FROM ({sql} {order} LIMIT 2) AS keyset_equal) < 2", args))
        # A NULL key is in no range: a bounded reader looks for it in the whole source.
        for probe in self._unseen_nulls(values, marker):
            sql, args = self._rows([probe], what="1", bounded=False)
            guard.append((f"({sql} {order} LIMIT 1) IS NULL", args))
        return guard

    def statement(self, after: Any, limit: int, *, marker: str = "%s", guarded: bool = True
                  ) -> tuple[str, tuple[Any, ...]]:
        """The SQL of one page and its parameters (``marker``: the driver's placeholder).

        ``guarded`` (the default, what :meth:`read` runs): the page is empty unless its guard holds
        (see :meth:`_guard`).
        """
        values = None if after is None else self._after_values(after)
        conditions = [] if values is None else [self._after(values, marker)]
        if guarded:
            conditions += self._guard(values, marker)
        sql, args = self._rows(conditions, marker=marker)
        return f"{sql} ORDER BY {', '.join(self.keys)} LIMIT {marker}", (*args, int(limit))

    def _after_values(self, after: Any, ctx: RunContext | None = None) -> list[Any]:
        if len(self.keys) == 1:
            return [after]
        if not isinstance(after, (list, tuple)) or len(after) != len(self.keys):
            raise self._error(
                ctx, f"the position {short(after)} is not a key of {len(self.keys)} values ({', '.join(self.keys)})",
                "The checkpoint was written by another read function or another key; restart the slot on purpose "
                "(restart=True) or give start= a position of this key",
            )
        return list(after)

    def count(self, ctx: RunContext | None = None, after: Any = None) -> int:
        """How many rows come after ``after`` (all of them for None): a ``total=`` for progress."""
        self._bind(ctx)
        conn = self._connection()
        sql, args = self.statement(after, 0, marker=self._marker(conn), guarded=False)
        sql = sql[: sql.rindex(" ORDER BY ")]
        cur = conn.cursor()
        try:
            cur.execute(f"SELECT count(*) FROM ({sql}) AS keyset_count", args[:-1])
            return int(cur.fetchone()[0])
        finally:
            self._end_read(cur)

    # -- reading ----------------------------------------------------------------------------------

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self.connect()
        return self._conn

    def _marker(self, conn: Any) -> str:
        style = self.paramstyle if self.paramstyle is not None else paramstyle_of(conn)
        marker = MARKERS.get(style)
        if marker is None:
            raise self._error(None, f"the driver's paramstyle {style!r} is not one a reader writes",
                              f"Use a driver with one of {', '.join(MARKERS)}, or pass paramstyle=")
        if self._checked_marker != marker:  # once: before the first statement of this driver
            problems = placeholder_problems(marker, (self.query, self.where, self.columns), len(self.params))
            if problems:
                raise self._error(self._ctx, "; ".join(problems),
                                  f"Fix where=/query=/params= (this driver's placeholder is {marker}); nothing was read")
            self._checked_marker = marker
        return marker

    def _end_read(self, cur: Any) -> None:
        """End the read's transaction: an open one would hold a snapshot (and locks) between chunks."""
        try:
            cur.close()
            self._conn.rollback()
        except Exception:  # an autocommit connection, or one already broken: nothing to end
            pass

    def read(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        if after is not None:
            self._after_values(after, ctx)  # a position of another key: say so, naming the job and slot
        conn = self._connection()
        marker = self._marker(conn)
        # The driver's own marker: the user's where=/query= text is passed through untouched.
        sql, args = self.statement(after, limit + 1, marker=marker)  # one row more: the boundary check
        for _ in range(_GUARD_TRIES):
            rows, names = self._fetch(sql, args)
            # An empty page is the end, or its guard failed: ask which (once a run, at its end)
            if rows or not self._diagnose(ctx, after, marker):
                break
        else:
            raise ResumableError(
                f"{self.name}: the page after position {short(after)} came back empty {_GUARD_TRIES} times while "
                "rows after it exist: the source keeps changing its NULL keys or the rows equal to the position",
                job=ctx.job, slot=ctx.slot, hint="A retry reads the page again",
            )
        index = self._index(ctx, names)
        single = len(index) == 1
        # At C speed: each row's key (a value, or a tuple of values for a composite key).
        keys = list(map(operator.itemgetter(*index), rows))
        self._check_keys(ctx, after, keys, limit, single=single)
        rows, keys = rows[:limit], keys[:limit]
        items = [dict(zip(names, row, strict=True)) for row in rows] if self.as_dict else list(rows)
        batch = Batch(items, keys=keys, convert=json_key if single else json_keys)
        try:
            batch.position  # noqa: B018 - the last key's JSON form: the column's values have one, or say so now
        except TypeError as exc:
            raise self._error(ctx, str(exc), "Page on columns whose values are numbers, text, timestamps, dates, "
                              "decimals or UUIDs") from None
        return batch

    def _fetch(self, sql: str, args: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """One statement's rows and column names, the read's transaction ended."""
        cur = self._conn.cursor()
        try:
            cur.execute(sql, args)
            return cur.fetchall(), [d[0] for d in cur.description or ()]
        finally:
            self._end_read(cur)

    def _diagnose(self, ctx: RunContext, after: Any, marker: str) -> bool:
        """Why a guarded page came back empty: one query for a NULL key out of sight, the rows the
        database calls equal to the position, and whether any row comes after it.

        Returns:
            Whether rows come after the position (then the guard failed only for a moment: the
            source changed between the page's subqueries and this query; read the page again).

        Raises:
            ConfigurationError: a NULL key, or a key the database calls equal to the position's.
        """
        values = None if after is None else self._after_values(after, ctx)
        probes = self._unseen_nulls(values, marker)
        nulls: _Condition = (" OR ".join(f"({c})" for c, _ in probes), [v for _, vs in probes for v in vs])
        checks: list[tuple[str, list[_Condition], int]] = [("null", [nulls], 1)]
        if values is not None:
            checks += [("equal", [self._equal(values, marker)], 2), ("after", [self._after(values, marker)], 1)]
        else:
            checks.append(("after", [], 1))
        parts, args = [], []
        for i, (tag, conditions, n) in enumerate(checks):
            sql, part_args = self._rows(conditions, what=", ".join(self.keys), marker=marker, bounded=tag != "null")
            parts.append(f"SELECT '{tag}' AS keyset_check, d{i}.* FROM ({sql} LIMIT {n}) AS d{i}")
            args += part_args
        found: dict[str, list[tuple[Any, ...]]] = {}
        for tag, *key in self._fetch(" UNION ALL ".join(parts), args)[0]:
            found.setdefault(tag, []).append(tuple(key))
        if "null" in found:
            raise self._null_key(ctx, after, found["null"][0])
        if len(found.get("equal", ())) > 1:
            raise self._twins(ctx, after, *found["equal"])
        return bool(found.get("after"))

    def _index(self, ctx: RunContext, names: list[str]) -> tuple[int, ...]:
        if self._key_index is None:
            lowered = [n.lower() for n in names]
            missing = [k for k in self.keys if k.split(".")[-1].lower() not in lowered]
            if missing:
                raise self._error(ctx, f"the key column(s) {', '.join(missing)} are not among the selected columns "
                                  f"({', '.join(names)})", "Select the key columns too")
            self._key_index = tuple(lowered.index(k.split(".")[-1].lower()) for k in self.keys)
        return self._key_index

    def _check_keys(self, ctx: RunContext, after: Any, keys: list[Any], limit: int, *, single: bool) -> None:
        """Refuse NULL keys and equal keys: within the page, and between its last row and the next.

        Rows come ordered by the key, so equal keys are neighbours. The row after the page is read
        for this check only: a run of equal keys across the boundary would otherwise be skipped
        by the next page's ``>``. ``keys`` are values (``single``) or tuples of values.

        A page that passes costs two passes at C speed (``None in``, a set); one that fails is
        gone through row by row to name the first bad key.
        """
        try:
            values = keys if single else list(itertools.chain.from_iterable(keys))
            if None not in values and len(set(keys)) == len(keys):
                return
        except TypeError:  # a key value that cannot be hashed: compare neighbours
            pass
        rows = [(k,) for k in keys] if single else keys
        for i, key in enumerate(rows):
            if any(v is None for v in key):
                raise self._null_key(ctx, after, key)
            if i and key == rows[i - 1]:
                at = "at the page boundary" if i == limit else f"within the page of {limit}"
                raise self._not_unique(ctx, after, f"two rows have {self._show(key)} ({at}, after position "
                                       f"{short(after)})")
        # Equal keys that the database did not put side by side (e.g. its collation and Python disagree).
        seen: set[Any] = set()
        for key in rows:
            if key in seen:
                raise self._not_unique(ctx, after, f"two rows of the page after position {short(after)} have "
                                       f"{self._show(key)}")
            seen.add(key)

    def _not_unique(self, ctx: RunContext, after: Any, which: str) -> ConfigurationError:
        return self._error(
            ctx, f"the key ({', '.join(self.keys)}) is not unique: {which}; paging on it would skip rows. Nothing "
            "of this page was processed and the checkpoint did not move",
            "Add a unique column to the key, e.g. key=(" + ", ".join(repr(k) for k in self.keys)
            + ", 'id'), with an index on those columns; then Clear the task to resume",
        )

    def _null_key(self, ctx: RunContext, after: Any, key: tuple[Any, ...]) -> ConfigurationError:
        return self._error(
            ctx, f"a row has a NULL key ({self._show(key)}), reading "
            + ("from the start" if after is None else f"after position {short(after)}")
            + ": a NULL is neither before nor after any position, so no page would read that row. Nothing of this page was "
            "processed and the checkpoint did not move",
            "Rows with a NULL key cannot be paged: filter them out (where='"
            + " AND ".join(f"{k} IS NOT NULL" for k in self.keys)
            + "') or page on columns that are NOT NULL; then Clear the task to resume",
        )

    def _twins(self, ctx: RunContext, after: Any, first: tuple[Any, ...], second: tuple[Any, ...]
               ) -> ConfigurationError:
        if first == second:
            return self._not_unique(ctx, after, f"two rows have {self._show(first)} (at position {short(after)})")
        column = next(k for k, a, b in zip(self.keys, first, second, strict=True) if a != b).split(".")[-1]
        return self._error(
            ctx, f"the key ({', '.join(self.keys)}) is not unique for the database: it calls {self._show(first)} "
            f"and {self._show(second)} equal (a collation that ignores case or accents, such as SQLite's NOCASE or "
            "a nondeterministic ICU collation), and it decides where a page starts, so the page after position "
            f"{short(after)} would skip the rows it calls equal to that key. The rows up to the position were "
            "processed, none after it",
            "Page on a key the database compares byte for byte: add a unique column to the key (key=("
            + ", ".join(repr(k) for k in self.keys) + ", 'id')), or select the column in a binary collation with "
            f"query= (PostgreSQL: {column} COLLATE \"C\" AS {column}_c; SQLite: {column} COLLATE BINARY AS "
            f"{column}_c) and page on that, with an index on it. The checkpoint holds a position of this key: then start the slot over "
            "on purpose (restart=True)",
        )

    # -- a split into ranges ----------------------------------------------------------------------

    def split_keys(self, parts: int) -> SplitKeys:
        """Where ``parts`` ranges of about equal size (within one row) end in this reader's rows,
        counted by the source's database now, on a connection of its own (ended before returning).

        Part ``j`` (0-based) ends at row ``floor((j + 1) * n / parts)`` of the key's order (1-based);
        each boundary's key is read at its row number: on PostgreSQL in one pass over the key (an
        index scan in its order, ``row_number()``), elsewhere one ``OFFSET`` query per boundary, each
        from the boundary before (so boundaries come in the key's order, whatever is written meanwhile). A
        row whose key is NULL stops it first (``null_key``): such a row is neither before nor after a
        boundary. ``where``/``query``/``until`` apply.

        Raises:
            ConfigurationError: ``parts`` is not a whole number from 1 to :data:`MAX_PARTS` (nothing is read).
        """
        if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= MAX_PARTS:
            raise ConfigurationError(
                f"{self.name}: parts must be a whole number from 1 to {MAX_PARTS:,} (how many ranges to split the "
                f"rows into), got {short(parts)}; nothing was read", hint="Give the number of ranges, e.g. split_keys(4)")
        with self._own_connection() as conn:
            marker = self._marker(conn)
            keys = ", ".join(self.keys)
            nulls = " OR ".join(f"{k} IS NULL" for k in self.keys)
            sql, args = self._rows([(f"({nulls})", ())], what=keys, marker=marker, bounded=False)
            null = _one(conn, f"{sql} LIMIT 1", args)
            if null is not None:
                return SplitKeys(rows=0, at=(), keys={}, null_key=null)
            sql, args = self._rows([], what=keys, marker=marker)
            count = _one(conn, f"SELECT count(*) FROM ({sql}) AS keyset_count", args)
            rows = int(count[0]) if count else 0
            at = tuple((j * rows) // parts for j in range(1, parts))
            return SplitKeys(rows=rows, at=at, keys=self._keys_at(conn, sorted({r for r in at if r > 0}), marker))

    def split_point(self, after: Any) -> SplitPoint | None:
        """Where to cut the rows after ``after`` (None: all of them) in two of about equal size: the
        key of the middle row, up to which (inclusive) the rows are kept and after which they are
        taken, counted by the source's database now on a connection of its own (ended before
        returning): a count and one ``OFFSET`` look-up, both over the key's index. ``where``,
        ``query``, ``until`` and the range of :meth:`within` apply. None when fewer than two rows
        remain (nothing to cut), or the middle row was deleted between the two queries.

        Raises:
            ConfigurationError: ``after`` is not a position of this reader's key.
        """
        values = None if after is None else self._after_values(after)
        with self._own_connection() as conn:
            marker = self._marker(conn)
            keys = ", ".join(self.keys)
            sql, args = self._rows([] if values is None else [self._after(values, marker)], what=keys, marker=marker)
            count = _one(conn, f"SELECT count(*) FROM ({sql}) AS keyset_count", args)
            rows = int(count[0]) if count else 0
            if rows < 2:
                return None
            kept = rows // 2
            key = _one(conn, f"{sql} ORDER BY {keys} LIMIT 1 OFFSET {marker}", [*args, kept - 1])
            return None if key is None else SplitPoint(key=key, kept=kept, taken=rows - kept)

    @contextlib.contextmanager
    def _own_connection(self) -> Iterator[Any]:
        """A connection of its own for a look at the rows (the split's): its transaction rolled back
        and the connection closed at the end, whatever happened."""
        conn = self.connect()
        try:
            yield conn
        finally:
            try:
                conn.rollback()
            except Exception:  # an autocommit connection, or one already broken
                pass
            close_quietly(conn)

    def _keys_at(self, conn: Any, at: list[int], marker: str) -> dict[int, tuple[Any, ...]]:
        """The key of each row number in ``at`` (1-based, in the key's order)."""
        if not at:
            return {}
        keys = ", ".join(self.keys)
        if type(conn).__module__.split(".")[0] in ("psycopg2", "psycopg"):  # window functions, one pass
            sql, args = self._rows([], what=f"{keys}, row_number() OVER (ORDER BY {keys}) AS keyset_rn", marker=marker)
            wanted = ", ".join(str(int(r)) for r in at)
            cur = conn.cursor()
            try:
                cur.execute(f"SELECT * FROM ({sql}) AS keyset_plan WHERE keyset_rn IN ({wanted})", args)
                return {int(row[-1]): tuple(row[:-1]) for row in cur.fetchall()}
            finally:
                cur.close()
        # Each boundary is looked for after the one before (its key, then the rows between): the
        # queries are statements apart, and rows written between them (keys before a boundary
        # already read) must not bring a later boundary back before it, where the ranges would overlap.
        out: dict[int, tuple[Any, ...]] = {}
        previous_at, previous = 0, None
        for r in at:
            sql, args = self._rows([] if previous is None else [self._after(list(previous), marker)], what=keys,
                                   marker=marker)
            row = _one(conn, f"{sql} ORDER BY {keys} LIMIT 1 OFFSET {marker}", [*args, r - previous_at - 1])
            if row is None:  # rows deleted while the split was made
                break
            out[r] = row
            previous_at, previous = r, row
        return out

    def _show(self, key: tuple[Any, ...]) -> str:
        return ", ".join(f"{k}={short(v, 40)}" for k, v in zip(self.keys, key, strict=True))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        close_quietly(conn)
        super().close()


#: The most ranges :meth:`KeysetReader.split_keys` splits rows into (a partitioned job's most
#: partitions): the boundaries' row numbers are held in memory at once.
MAX_PARTS = 10_000


@dataclasses.dataclass(frozen=True)
class SplitKeys:
    """What :meth:`KeysetReader.split_keys` found: ``rows`` counted, the row number each range ends
    at (``at``: 0 stands before every key), the key found at each (``keys``; a row number missing:
    rows deleted while the split was made), or a row whose key is NULL (``null_key``, and nothing else
    read)."""

    rows: int
    at: tuple[int, ...]
    keys: dict[int, tuple[Any, ...]]
    null_key: tuple[Any, ...] | None = None


@dataclasses.dataclass(frozen=True)
class SplitPoint:
    """What :meth:`KeysetReader.split_point` found: the middle row's ``key`` (a tuple of the key's
    columns), and how many of the rows counted are ``kept`` (up to it) and ``taken`` (after it)."""

    key: tuple[Any, ...]
    kept: int
    taken: int


def _one(conn: Any, sql: str, args: Sequence[Any]) -> tuple[Any, ...] | None:
    cur = conn.cursor()
    try:
        cur.execute(sql, tuple(args))
        row = cur.fetchone()
        return None if row is None else tuple(row)
    finally:
        cur.close()
