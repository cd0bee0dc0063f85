"""Ready-made ``read`` functions that page correctly and resume from the checkpoint's position.

Hand-written paging is where the bugs of this field live: cursors on a column that is not unique
skip or repeat rows, a missing ``ORDER BY`` loses some, an ``OFFSET`` reads the whole start again,
a cursor saved before the work is done loses a batch. A reader is correct by construction:

* :class:`KeysetReader`: rows of a table or a query, paged on a unique key (one column, or a
  composite key compared as a row value ``(a, b) > (%s, %s)``, so ties on the first column are
  neither skipped nor repeated). The position is the last row's key, as JSON. Each page is one
  index range scan: resuming at row 900,000 costs what resuming at row 10 does.
* :class:`FileReader`: lines, CSV records or JSON lines of a binary file object (a local file,
  or an object store's through the Airflow layer's ``object_reader``). The position is the byte
  offset after the last record: a resume seeks there instead of reading the start again.
* :class:`SequenceReader`: items of a sequence, or of an iterable a function makes, by index.

A reader is what ``ChunkedOperator(read=...)`` takes (``reader(ctx, after, limit)``); each batch
it returns is a :class:`Batch`, a list that also carries every item's position, so the chunk loop
needs no ``position=`` function. A handler that owns its loop iterates
``reader.chunks(ctx, size)`` and checkpoints ``batch.position`` after each batch.

No Airflow here: readers take a function that opens a DB-API connection or a binary file;
``airflow_resumable.readers`` builds those from Airflow connections and ``ObjectStoragePath``.
"""

from __future__ import annotations

import abc
import codecs
import csv
import datetime as dt
import decimal
import itertools
import json
import operator
import re
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from airflow_resumable.core.checkpoint import short
from airflow_resumable.core.errors import ConfigurationError, ResumableError

if TYPE_CHECKING:
    from airflow_resumable.core.context import RunContext

__all__ = ["Batch", "FileReader", "KeysetReader", "Reader", "SequenceReader"]

_UNSET: Any = object()


class Batch(list[Any]):
    """One chunk of items, and the position of each (``positions``, ascending in the reader's order).

    ``position`` is the last item's: where the next batch starts, what to checkpoint.

    ``positions`` may also be given as ``keys`` and a function turning one into a position: the
    list is then built only when asked for (the skip policy's item-by-item pass), and a chunk
    that goes well converts its last key only.
    """

    def __init__(self, items: Iterable[Any] = (), positions: Iterable[Any] = (), *,
                 keys: Sequence[Any] | None = None, convert: Callable[[Any], Any] | None = None):
        super().__init__(items)
        self._keys, self._convert = keys, convert
        self._positions: list[Any] | None = None if keys is not None and convert is not None else list(positions)

    @property
    def positions(self) -> list[Any]:
        if self._positions is None:
            assert self._keys is not None and self._convert is not None
            self._positions = list(map(self._convert, self._keys))
        return self._positions

    @property
    def position(self) -> Any:
        """The last item's position (None for an empty batch)."""
        if self._positions is None:
            assert self._keys is not None and self._convert is not None
            return self._convert(self._keys[-1]) if self._keys else None
        return self._positions[-1] if self._positions else None


class Reader(abc.ABC):
    """A ``read(ctx, after, limit)`` that knows its items' positions.

    Subclasses implement :meth:`read`; what they hold open between chunks (a connection, a file)
    belongs to one attempt: it is opened on the first read of a run context and closed by
    :meth:`close`, which the chunk loop calls when it ends, whichever way.
    """

    #: Names the source in errors and logs (never a password).
    name: str = ""

    def __init__(self) -> None:
        self._ctx: Any = None

    def __call__(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        """Up to ``limit`` items after position ``after`` (None: from the start), in order.

        Raises:
            ConfigurationError: the source cannot be paged correctly (e.g. a key that is not
                unique); nothing of the batch was returned.
        """
        self._bind(ctx)
        return self.read(ctx, after, limit)

    def _bind(self, ctx: RunContext | None) -> None:
        if ctx is not self._ctx:  # a new attempt: nothing held by an earlier one is reused
            self.close()
            self._ctx = ctx

    @abc.abstractmethod
    def read(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        """See :meth:`__call__`."""

    def close(self) -> None:
        """Release what is held between chunks. Safe to call more than once."""
        self._ctx = None

    def chunks(self, ctx: RunContext, size: int, *, after: Any = _UNSET) -> Iterator[Batch]:
        """The batches from ``after`` (default: ``ctx.position``, the checkpoint) to the end.

        For a handler that owns its loop: process each batch, then
        ``ctx.checkpoint(batch.position, ...)``. The signal is checked before every read.
        """
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ConfigurationError(f"the chunk size must be a positive integer, got {size!r}", job=ctx.job,
                                     slot=ctx.slot)
        position = ctx.position if after is _UNSET else after
        try:
            while True:
                ctx.signal.raise_if_cancelled()
                batch = self(ctx, position, size)
                if not batch:
                    return
                yield batch
                position = batch.position
        finally:
            self.close()

    def _error(self, ctx: RunContext, message: str, hint: str) -> ConfigurationError:
        return ConfigurationError(f"{self.name}: {message}", job=ctx.job, slot=ctx.slot, hint=hint)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


# -- SQL keyset ---------------------------------------------------------------------------------

#: How often a page whose guard failed is read again when the failure is gone by the time it is asked
#: about (the source changed in between).
_GUARD_TRIES = 3

#: A SQL condition and the values of its placeholders.
_Condition = tuple[str, Sequence[Any]]

#: A column or table name, optionally qualified (``schema.table``); no quoting, no expressions.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$")

#: DB-API paramstyles and the marker of each that readers can write.
_MARKERS = {"format": "%s", "pyformat": "%s", "qmark": "?"}

#: A ``%`` and the character after it: a format driver reads ``%s`` as a value, ``%%`` as a ``%``.
_PERCENT = re.compile(r"%(.?)", re.S)

#: Quoted text and names, and comments: where a qmark driver's database does not look for ``?``.
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?\*/", re.S)


def placeholders(text: str, marker: str) -> tuple[int, list[str]]:
    """How many values ``text`` takes with the driver's ``marker`` (``%s`` or ``?``), and its problems.

    A ``%s`` driver (psycopg2, MySQL's) formats the whole text with ``%``, quoted text included, as
    soon as there are parameters (and a reader always has some: the position, the page size), so
    every ``%`` must be ``%s`` or ``%%``. A ``?`` driver (sqlite3) binds each ``?`` outside quotes
    and comments. Positional placeholders only: the reader adds its own values after the user's.
    """
    problems: list[str] = []
    if marker == "%s":
        found = [m.group(1) for m in _PERCENT.finditer(text)]
        if "(" in found:
            problems.append(f"a named placeholder %(...)s in {short(text, 60)}: readers take %s placeholders, their "
                            "values in params= in order")
        elif any(c not in ("s", "%") for c in found):
            doubled = _PERCENT.sub(lambda m: m.group() if m.group(1) in ("s", "%") else "%%" + m.group(1), text)
            problems.append(f"a '%' that is not a placeholder in {short(text, 60)}: this driver reads every '%' as the "
                            f"start of one; write %% for a literal % ({short(doubled, 60)})")
        return found.count("s"), problems
    bare = _QUOTED.sub(" ", text)
    if re.search(r"\?\d|(?<![\w$])[:@$][A-Za-z_]", bare):
        problems.append(f"a numbered or named placeholder in {short(text, 60)}: readers take ? placeholders, their "
                        "values in params= in order")
    if "%s" in bare:
        problems.append(f"%s is not this driver's placeholder (in {short(text, 60)}): write ?")
    return bare.count("?"), problems


def json_key(value: Any) -> Any:
    """A key value as JSON: timestamps and dates as ISO-8601 text, decimals and UUIDs as text.

    The database converts the text back when it compares it with the column (PostgreSQL casts an
    untyped literal to the column's type; SQLite stores timestamps as text already), so the
    position is exact: ``isoformat()`` keeps the microseconds.

    Raises:
        TypeError: a value that has no exact JSON form (bytes, a float NaN).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TypeError(f"the key value {value!r} has no JSON form")
        return value
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    raise TypeError(f"the key value {short(value)} ({type(value).__name__}) has no exact JSON form")


def _json_keys(values: Sequence[Any]) -> list[Any]:
    """A composite key as a JSON position: the list of its values' JSON forms."""
    return [json_key(v) for v in values]


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
                     if not isinstance(k, str) or not _IDENTIFIER.match(k)]
        if (table is None) == (query is None):
            problems.append("give exactly one of table= and query=")
        if table is not None and not (isinstance(table, str) and _IDENTIFIER.match(table)):
            problems.append(f"table {table!r} is not a plain (optionally schema-qualified) table name")
        if query is not None and (not isinstance(query, str) or not query.strip()):
            problems.append("query must be the text of a SELECT")
        if query is not None and cols.strip() != "*":
            problems.append("columns= applies to table=; select the columns in the query instead")
        if paramstyle is not None and paramstyle not in _MARKERS:
            problems.append(f"paramstyle must be one of {', '.join(_MARKERS)}, got {paramstyle!r}")
        elif paramstyle is not None and not problems:
            problems += self._placeholder_problems(_MARKERS[paramstyle], query, where, cols, len(params))
        if problems:
            raise ConfigurationError("keyset reader: " + "; ".join(problems), hint="Fix the reader's arguments")
        self.connect = connect
        self.keys: tuple[str, ...] = keys
        self.table, self.query, self.columns, self.where = table, query, cols, where
        self.params = tuple(params)
        self.as_dict = as_dict
        self.paramstyle = paramstyle
        self.name = name or table or "query"
        self._conn: Any = None
        self._key_index: tuple[int, ...] | None = None
        self._checked_marker: str | None = _MARKERS[paramstyle] if paramstyle else None

    # -- SQL --------------------------------------------------------------------------------------

    @staticmethod
    def _placeholder_problems(marker: str, query: str | None, where: str | None, columns: str,
                              given: int) -> list[str]:
        """What is wrong with the placeholders of the user's SQL text for ``marker``, for ``given`` params."""
        texts = [t for t in (query, where, columns) if t]
        counted = [placeholders(t, marker) for t in texts]
        problems = [p for _, found in counted for p in found]
        wanted = sum(n for n, _ in counted)
        if wanted != given:
            problems.append(f"where= and query= have {wanted} placeholder{'s' if wanted != 1 else ''} ({marker}) "
                            f"but params= gives {given} value{'s' if given != 1 else ''}: give one value per "
                            "placeholder, in order")
        return problems

    def _source(self, what: str | None = None) -> str:
        """The rows to page, selecting ``what`` (default: the columns to return)."""
        if self.table is not None:
            return f"SELECT {what or self.columns} FROM {self.table}"
        return f"SELECT {what or '*'} FROM ({self.query}) AS keyset_source"

    def _rows(self, conditions: Sequence[_Condition], what: str | None = None
              ) -> tuple[str, list[Any]]:
        """The source's rows that pass ``where`` and ``conditions`` (each a SQL text and its values)."""
        texts = ([f"({self.where})"] if self.where else []) + [c for c, _ in conditions]
        sql = self._source(what) + (f" WHERE {' AND '.join(texts)}" if texts else "")
        return sql, [*self.params, *(v for _, values in conditions for v in values)]

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
        turn a page into a sort."""
        guard: list[_Condition] = []
        if values is not None:
            sql, args = self._rows([self._equal(values, marker)], what="1")
            guard.append((f"(SELECT count(*) FROM ({sql} LIMIT 2) AS keyset_equal) < 2", args))
        for probe in self._unseen_nulls(values, marker):
            sql, args = self._rows([probe], what="1")
            guard.append((f"NOT EXISTS ({sql})", args))
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
        sql, args = self._rows(conditions)
        return f"{sql} ORDER BY {', '.join(self.keys)} LIMIT {marker}", (*args, int(limit))

    def _after_values(self, after: Any, ctx: RunContext | None = None) -> list[Any]:
        if len(self.keys) == 1:
            return [after]
        if not isinstance(after, (list, tuple)) or len(after) != len(self.keys):
            raise ConfigurationError(
                f"{self.name}: the position {short(after)} is not a key of {len(self.keys)} values "
                f"({', '.join(self.keys)})",
                job=ctx.job if ctx else None,
                slot=ctx.slot if ctx else None,
                hint="The checkpoint was written by another read function or another key; restart the slot "
                "on purpose (restart=True) or give start= a position of this key",
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
        style = self.paramstyle
        if style is None:
            module = sys.modules.get(type(conn).__module__.split(".")[0])
            style = getattr(module, "paramstyle", "format")
        marker = _MARKERS.get(style)
        if marker is None:
            raise ConfigurationError(
                f"{self.name}: the driver's paramstyle {style!r} is not one a reader writes",
                hint=f"Use a driver with one of {', '.join(_MARKERS)}, or pass paramstyle=",
            )
        if self._checked_marker != marker:  # once: before the first statement of this driver
            problems = self._placeholder_problems(marker, self.query, self.where, self.columns, len(self.params))
            if problems:
                ctx = self._ctx
                raise ConfigurationError(
                    f"{self.name}: " + "; ".join(problems), job=getattr(ctx, "job", None),
                    slot=getattr(ctx, "slot", None),
                    hint=f"Fix where=/query=/params= (this driver's placeholder is {marker}); nothing was read",
                )
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
        batch = Batch(items, keys=keys, convert=json_key if single else _json_keys)
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
            sql, part_args = self._rows(conditions, what=", ".join(self.keys))
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

    def _show(self, key: tuple[Any, ...]) -> str:
        return ", ".join(f"{k}={short(v, 40)}" for k, v in zip(self.keys, key, strict=True))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        _close_quietly(conn)
        super().close()


def _close_quietly(resource: Any) -> None:
    """Close a connection or a file held between chunks; one already broken has nothing to give back."""
    if resource is not None:
        try:
            resource.close()
        except Exception:  # pragma: no cover - closing a broken connection or file
            pass


# -- files --------------------------------------------------------------------------------------

FORMATS = ("lines", "csv", "jsonl")

#: How much of a file the reader decodes when an attempt starts at its first byte: a wrong encoding
#: fails there, before any record, instead of deep into the run.
_HEAD = 64 * 1024

#: Byte order marks of encodings whose line break is not one byte (UTF-32 LE's first: it begins with UTF-16 LE's).
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
              (codecs.BOM_UTF16_BE, "UTF-16"))


class FileReader(Reader):
    """Records of a file by byte offset: a resume seeks to the offset instead of reading the start.

    Formats: ``lines`` (each line as text, without its line break), ``jsonl`` (each non-blank line
    parsed as JSON) and ``csv`` (each record, which may span lines inside quotes; as a dict by the
    header when ``header`` is true, else as a list). With a header, the header is read once per
    attempt from the start of the file (one record), then the reader seeks to the position. A CSV
    record with more fields than the header is refused (a value would have no column).

    The position of a record is the byte offset just after it. The file is read as bytes and
    decoded line by line, so the encoding must keep ``\\n`` a single byte (UTF-8, Latin-1, ASCII...;
    UTF-16 and UTF-32 are refused). When an attempt starts at the first byte, the reader checks
    the first 64 KiB: a UTF-16/UTF-32 byte order mark, NUL bytes, or bytes the encoding cannot
    decode fail before any record is read (a UTF-8 byte order mark is skipped); a byte that cannot
    be decoded later fails at its line. A file that changes while it is read (other than growing
    at its end) breaks positions.

    **A record ends with its line break.** A last line without one (or, in CSV, a record whose
    quoted field runs into the end of the file) may still be being written, so it is never
    returned in part. ``complete`` says what it is:

    * ``None`` (default): the reader cannot tell. The records before it are returned; the next
      read fails (``ConfigurationError``) naming the file, the byte and both choices. The
      checkpoint is before the line, so a Clear after choosing continues there.
    * ``True``: the file is complete: a last line without a line break is a record (and a quoted
      field open at the end is an error: a quote is missing).
    * ``False``: the file is still written at its end (a log, a feed): the unfinished record is
      held back; the run ends before it, and the next attempt or run (``start=`` the position)
      reads it once its line break has arrived.

    Args:
        open: opens the file for reading in **binary** mode (``lambda: open(path, "rb")``); kept
            open for the attempt and closed when the loop ends.
        format: ``lines``, ``csv`` or ``jsonl``.
        encoding: the file's text encoding.
        header: CSV only: the first record names the columns (records become dicts).
        csv_options: CSV only: keyword arguments of :func:`csv.reader` (``delimiter``, ``quotechar``...).
        complete: whether the file is complete (see above); None: the reader cannot tell.
        name: names the file in errors (default: the opened file's ``name``, e.g. its path).

    Raises:
        ConfigurationError: bad arguments, all of them named at once. When reading: a record cut
            by the end of the file (with ``complete=None``), a CSV record with more fields than
            the header, bad JSON, a wrong encoding; each naming the file and the byte.
    """

    def __init__(
        self,
        *,
        open: Callable[[], BinaryIO],
        format: str = "lines",
        encoding: str = "utf-8",
        header: bool = True,
        csv_options: dict[str, Any] | None = None,
        complete: bool | None = None,
        name: str | None = None,
    ):
        super().__init__()
        problems = []
        if not callable(open):
            problems.append(f"open must be a function returning a binary file object, got {type(open).__name__}")
        if format not in FORMATS:
            problems.append(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        try:
            codec = codecs.lookup(encoding)
        except (LookupError, TypeError):
            problems.append(f"unknown encoding {encoding!r}")
        else:
            encoder = codec.incrementalencoder()
            encoder.encode("x")  # past a byte order mark the encoder may write first
            line_break = encoder.encode("\n")
            if line_break != b"\n":
                problems.append(f"encoding {encoding!r} writes a line break as {len(line_break)} bytes; this reader "
                                "reads the file line by line, at its b'\\n' bytes (convert the file to UTF-8, e.g. "
                                "iconv -f UTF-16 -t UTF-8)")
        if csv_options and format != "csv":
            problems.append("csv_options apply to format='csv' only")
        if complete not in (None, True, False):
            problems.append(f"complete must be True, False or None, got {complete!r}")
        if problems:
            raise ConfigurationError("file reader: " + "; ".join(problems), hint="Fix the reader's arguments")
        self.open = open
        self.format = format
        self.encoding = encoding
        self.header = header and format == "csv"
        self.csv_options = dict(csv_options or {})
        self.complete = complete
        self.name = name or "file"
        self._named = name is not None
        self._utf8 = codec.name == "utf-8"
        self._file: BinaryIO | None = None
        self._offset = 0  # of the next byte self._file gives
        self._line: int | None = None  # the number of the line at self._offset, when the attempt knows it
        self._records: Iterator[Any] | None = None
        self._columns: list[str] | None = None
        self._data_start = 0  # the offset after the CSV header
        self._held: tuple[int, str] | None = None  # an unfinished last record: its offset, and what it lacks
        self._end = False  # the lines read so far reached the end of what the file holds

    def read(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        offset = 0 if after is None else after
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise self._error(ctx, f"the position {short(after)} is not a byte offset",
                              "The checkpoint was written by another read function; restart the slot on purpose")
        if self._records is None or offset != self._offset:
            self._seek(ctx, offset)
        assert self._records is not None
        items, positions = [], []
        for record in itertools.islice(self._records, limit):
            items.append(record)
            positions.append(self._offset)
        if not items and self._held is not None and self.complete is None:
            at, lacking = self._held
            raise self._error(
                ctx, f"the last {'line' if self.format != 'csv' else 'record'} (at byte {at}) {lacking}: the file may "
                "still be being written, or it ends without one. The records before it were read; the checkpoint "
                "is before it",
                "Pass complete=True if the file is complete (its last line is a record too), or complete=False if "
                "it is still written at its end (the line is read once its line break has arrived); then Clear the "
                "task to resume",
            )
        return Batch(items, positions)

    def _seek(self, ctx: RunContext, offset: int) -> None:
        if self._file is None:
            self._file = self.open()
            if not self._named and isinstance(getattr(self._file, "name", None), str):
                self.name = self._file.name  # the path: what an error should name
            if offset == 0 and self._file.seekable():  # the attempt starts the file: check it before any record
                self._check_start(ctx)
        f = self._file
        self._held, self._end = None, False
        if self.header and self._columns is None:  # once per attempt: one record from the start
            f.seek(0)
            self._offset, self._line = 0, 1
            first = next(csv.reader(self._lines(ctx), **self.csv_options), None)
            self._columns = list(first or [])
            self._data_start = self._offset
            self._held, self._end = None, False
        offset = max(offset, self._data_start)  # a fresh start begins after the header
        if f.tell() != offset:
            f.seek(offset)
        if offset == 0:
            self._line = 1
        elif offset != self._offset:
            self._line = None  # resumed at a byte offset: the line numbers before it were not counted
        self._offset = offset
        self._records = self._parse(ctx)

    def _check_start(self, ctx: RunContext) -> None:
        """Fail on the file's first 64 KiB, before any record: a wide encoding's byte order mark, NUL
        bytes (UTF-16 without a mark, or not text), bytes ``encoding`` cannot decode."""
        assert self._file is not None
        head = self._file.read(_HEAD)
        self._file.seek(0)
        for mark, wide in _WIDE_BOMS:
            if head.startswith(mark):
                raise self._error(
                    ctx, f"the file starts with a {wide} byte order mark: it is {wide}, whose line breaks are not one "
                    f"byte, so it cannot be read line by line (encoding={self.encoding!r})",
                    f"Convert it to UTF-8 (e.g. iconv -f {wide} -t UTF-8) and read it with encoding='utf-8'",
                )
        if head.startswith(codecs.BOM_UTF8) and codecs.lookup(self.encoding).name not in ("utf-8", "utf-8-sig"):
            raise self._error(ctx, f"the file starts with a UTF-8 byte order mark, but encoding={self.encoding!r}",
                              "Read it with encoding='utf-8'")
        nul = head.find(b"\0")
        if nul >= 0:
            raise self._error(
                ctx, f"the file has a NUL byte at byte {nul}: it is UTF-16 or UTF-32 without a byte "
                f"order mark, or not text (encoding={self.encoding!r})",
                "Convert it to UTF-8 (e.g. iconv -f UTF-16LE -t UTF-8) and read it with encoding='utf-8', or check "
                "the path",
            )
        try:
            codecs.getincrementaldecoder(self.encoding)().decode(head, final=len(head) < _HEAD)
        except UnicodeDecodeError as exc:
            raise self._error(ctx, f"the file is not {self.encoding}: byte {exc.start} (0x{head[exc.start]:02x}) "
                              f"cannot be decoded ({exc.reason})", self._encoding_hint()) from None

    def _encoding_hint(self) -> str:
        return (f"Pass the file's encoding, e.g. encoding='cp1252' (a Windows export) or 'latin-1', or convert the "
                f"file to {self.encoding}; then Clear the task")

    def _where(self, offset: int, line: int | None) -> str:
        return f"byte {offset}" + (f" (line {line})" if line is not None else "")

    def _lines(self, ctx: RunContext) -> Iterator[str]:
        """The file's lines from the current offset, decoded, line breaks kept; each line moves
        ``_offset`` past its bytes as it is handed out (csv pulls exactly the lines of a record).

        A last line without its line break is not handed out unless the file is ``complete``: it
        may still be being written. ``_held`` then says where it starts (``_offset`` stays there),
        and ``_end`` that the lines ran out.
        """
        assert self._file is not None
        readline, encoding, whole = self._file.readline, self.encoding, self.complete is True
        while True:
            raw = readline()
            if not raw or not (whole or raw.endswith(b"\n")):
                if raw:
                    self._held = (self._offset, "has no line break")
                self._end = True
                return
            start = self._offset
            self._offset += len(raw)
            if self._line is not None:
                self._line += 1
            if start == 0 and self._utf8 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]  # a byte order mark, not data
            try:
                text = raw.decode(encoding)
            except UnicodeDecodeError as exc:
                raise self._error(ctx, f"the line at {self._where(start, self._line and self._line - 1)} is not "
                                  f"{encoding} (byte {start + exc.start}, 0x{raw[exc.start]:02x}: {exc.reason})",
                                  self._encoding_hint()) from None
            yield text

    def _parse(self, ctx: RunContext) -> Iterator[Any]:
        if self.format == "lines":
            for line in self._lines(ctx):
                yield line.rstrip("\r\n")
        elif self.format == "jsonl":
            for line in self._lines(ctx):
                if line.strip():
                    try:
                        value = json.loads(line)
                    except ValueError as exc:
                        start = self._offset - len(line.encode(self.encoding))
                        raise self._error(ctx, f"the line at byte {start} is not JSON ({exc}): {short(line, 60)}",
                                          "Fix the file, or read it with format='lines'") from None
                    yield value
        else:
            yield from self._csv_records(ctx)

    def _csv_records(self, ctx: RunContext) -> Iterator[Any]:
        columns = self._columns
        records = csv.reader(self._lines(ctx), **self.csv_options)
        while True:
            start, line = self._offset, self._line
            try:
                record = next(records)
            except StopIteration:
                return
            except csv.Error as exc:
                raise self._error(ctx, f"the record at {self._where(start, line)} is not CSV ({exc})",
                                  "Fix the file, or pass csv_options= that match it (delimiter=, quotechar=...)") from None
            if self._end:
                # csv asked for a line past the last one while in this record: a quoted field is still
                # open at the end of the file (csv would hand out the record cut there)
                if self.complete:
                    raise self._error(ctx, f"the record at {self._where(start, line)} ends inside a quoted field: a "
                                      "closing quote is missing", "Fix the file (a quote inside a quoted field is "
                                      "written twice: \"\"), or pass csv_options= that match it")
                self._held = (start, "ends inside a quoted field")
                return
            if not record:
                continue  # a blank line
            if columns is None:
                yield record
            elif len(record) > len(columns):
                text = self.csv_options.get("delimiter", ",").join(record)
                raise self._error(
                    ctx, f"the record at {self._where(start, line)} has {len(record)} fields but the header has "
                    f"{len(columns)} ({', '.join(columns)}): {short(text, 80)}; the extra value would have no column",
                    "Quote the field that holds the delimiter (\"Smith, Bob\"), add the column to the header, or "
                    "read with header=False (records as lists); then Clear the task to resume",
                )
            else:
                yield dict(zip(columns, record, strict=False))

    def close(self) -> None:
        f, self._file = self._file, None
        self._records, self._columns, self._offset, self._data_start = None, None, 0, 0
        self._line, self._held, self._end = None, None, False
        _close_quietly(f)
        super().close()


# -- sequences ----------------------------------------------------------------------------------


class SequenceReader(Reader):
    """Items of a sequence, or of the iterable a function makes, by index.

    The position of an item is its index (from 0). A sequence (a list, a range...) is sliced, so a
    resume costs nothing; an iterable made by ``items()`` is consumed from its start up to the
    position on resume (an iterator cannot seek), then kept for the attempt.

    Args:
        items: a sequence, or a function of no arguments returning an iterable (called once per
            attempt). A bare iterator is refused: a retry could not read it again.
        name: names the source in errors.

    Raises:
        ConfigurationError: ``items`` is neither.
    """

    def __init__(self, items: Sequence[Any] | Callable[[], Iterable[Any]], *, name: str | None = None):
        super().__init__()
        if isinstance(items, Iterator) or not (isinstance(items, Sequence) or callable(items)):
            raise ConfigurationError(
                f"sequence reader: items must be a sequence or a function returning an iterable, "
                f"got {type(items).__name__}",
                hint="Pass the list itself, or a function that makes the iterator (a retry reads it again)",
            )
        self.items = items
        self.name = name or type(items).__name__
        self._iter: Iterator[Any] | None = None
        self._next = 0  # the index of the item self._iter gives next

    def read(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        first = 0 if after is None else after + 1 if isinstance(after, int) and not isinstance(after, bool) else None
        if first is None or first < 0:
            raise self._error(ctx, f"the position {short(after)} is not an index",
                              "The checkpoint was written by another read function; restart the slot on purpose")
        if isinstance(self.items, Sequence):
            items = self.items[first:first + limit]
        else:
            if self._iter is None or self._next != first:
                self._iter = iter(self.items())
                self._next = 0
                for _ in itertools.islice(self._iter, first):  # an iterator cannot seek: skip, once per attempt
                    self._next += 1
            items = list(itertools.islice(self._iter, limit))
            self._next = first + len(items)
        return Batch(items, range(first, first + len(items)))

    def count(self, ctx: RunContext | None = None) -> int | None:
        """The number of items, for a sequence (None for an iterable)."""
        return len(self.items) if isinstance(self.items, Sequence) else None

    def close(self) -> None:
        self._iter, self._next = None, 0
        super().close()
