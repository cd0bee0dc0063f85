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
from airflow_resumable.core.errors import ConfigurationError

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

#: A column or table name, optionally qualified (``schema.table``); no quoting, no expressions.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$")

#: DB-API paramstyles and the marker of each that readers can write.
_MARKERS = {"format": "%s", "pyformat": "%s", "qmark": "?"}


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
    on duplicates instead of skipping rows. Key values must not be NULL.

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
        ConfigurationError: bad arguments, all of them named at once.
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

    # -- SQL --------------------------------------------------------------------------------------

    def statement(self, after: Any, limit: int, *, marker: str = "%s") -> tuple[str, tuple[Any, ...]]:
        """The SQL of one page and its parameters (``marker``: the driver's placeholder)."""
        source = (f"SELECT {self.columns} FROM {self.table}" if self.table is not None
                  else f"SELECT * FROM ({self.query}) AS keyset_source")
        conditions = [f"({self.where})"] if self.where else []
        args: list[Any] = list(self.params)
        if after is not None:
            values = self._after_values(after)
            if len(self.keys) == 1:
                conditions.append(f"{self.keys[0]} > {marker}")
            else:  # a row value: compared column by column, as the index is ordered
                conditions.append(f"({', '.join(self.keys)}) > ({', '.join([marker] * len(self.keys))})")
            args += values
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        sql = f"{source}{where} ORDER BY {', '.join(self.keys)} LIMIT {marker}"
        return sql, (*args, int(limit))

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
        sql, args = self.statement(after, 0, marker=self._marker(conn))
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
        cur = conn.cursor()
        try:
            cur.execute(sql, args)
            rows = cur.fetchall()
            names = [d[0] for d in cur.description or ()]
        finally:
            self._end_read(cur)
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
                raise self._error(
                    ctx, f"a row has a NULL key ({self._show(key)}) after position {short(after)}",
                    "Rows with a NULL key cannot be paged: filter them out (where='... IS NOT NULL') or "
                    "page on columns that are NOT NULL",
                )
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


class FileReader(Reader):
    """Records of a file by byte offset: a resume seeks to the offset instead of reading the start.

    Formats: ``lines`` (each line as text, without its line break), ``jsonl`` (each non-blank line
    parsed as JSON) and ``csv`` (each record, which may span lines inside quotes; as a dict by the
    header when ``header`` is true, else as a list). With a header, the header is read once per
    attempt from the start of the file (one record), then the reader seeks to the position.

    The position of a record is the byte offset just after it. The file is read as bytes and
    decoded line by line, so the encoding must keep ``\\n`` a single byte (UTF-8, Latin-1, ASCII...).
    A file that changes while it is read (other than growing at its end) breaks positions: read
    files that are complete.

    Args:
        open: opens the file for reading in **binary** mode (``lambda: open(path, "rb")``); kept
            open for the attempt and closed when the loop ends.
        format: ``lines``, ``csv`` or ``jsonl``.
        encoding: the file's text encoding.
        header: CSV only: the first record names the columns (records become dicts).
        csv_options: CSV only: keyword arguments of :func:`csv.reader` (``delimiter``, ``quotechar``...).
        name: names the file in errors.

    Raises:
        ConfigurationError: bad arguments, all of them named at once.
    """

    def __init__(
        self,
        *,
        open: Callable[[], BinaryIO],
        format: str = "lines",
        encoding: str = "utf-8",
        header: bool = True,
        csv_options: dict[str, Any] | None = None,
        name: str | None = None,
    ):
        super().__init__()
        problems = []
        if not callable(open):
            problems.append(f"open must be a function returning a binary file object, got {type(open).__name__}")
        if format not in FORMATS:
            problems.append(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        try:
            codecs.lookup(encoding)
        except (LookupError, TypeError):
            problems.append(f"unknown encoding {encoding!r}")
        if csv_options and format != "csv":
            problems.append("csv_options apply to format='csv' only")
        if problems:
            raise ConfigurationError("file reader: " + "; ".join(problems), hint="Fix the reader's arguments")
        self.open = open
        self.format = format
        self.encoding = encoding
        self.header = header and format == "csv"
        self.csv_options = dict(csv_options or {})
        self.name = name or "file"
        self._file: BinaryIO | None = None
        self._offset = 0  # of the next byte self._file gives
        self._records: Iterator[Any] | None = None
        self._columns: list[str] | None = None
        self._data_start = 0  # the offset after the CSV header

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
        return Batch(items, positions)

    def _seek(self, ctx: RunContext, offset: int) -> None:
        if self._file is None:
            self._file = self.open()
        f = self._file
        if self.header and self._columns is None:  # once per attempt: one record from the start
            f.seek(0)
            self._offset = 0
            first = next(csv.reader(self._lines(), **self.csv_options), None)
            self._columns = list(first or [])
            self._data_start = self._offset
        offset = max(offset, self._data_start)  # a fresh start begins after the header
        if f.tell() != offset:
            f.seek(offset)
        self._offset = offset
        self._records = self._parse(ctx)

    def _lines(self) -> Iterator[str]:
        """The file's lines from the current offset, decoded, line breaks kept; each line moves
        ``_offset`` past its bytes as it is handed out (csv pulls exactly the lines of a record)."""
        assert self._file is not None
        readline, encoding = self._file.readline, self.encoding
        while True:
            raw = readline()
            if not raw:
                return
            self._offset += len(raw)
            yield raw.decode(encoding)

    def _parse(self, ctx: RunContext) -> Iterator[Any]:
        if self.format == "lines":
            for line in self._lines():
                yield line.rstrip("\r\n")
        elif self.format == "jsonl":
            for line in self._lines():
                if line.strip():
                    start = self._offset - len(line.encode(self.encoding))
                    try:
                        yield json.loads(line)
                    except ValueError as exc:
                        raise self._error(ctx, f"the line at byte {start} is not JSON ({exc}): {short(line, 60)}",
                                          "Fix the file, or read it with format='lines'") from None
        else:
            columns = self._columns
            for record in csv.reader(self._lines(), **self.csv_options):
                if not record:
                    continue  # a blank line
                yield dict(zip(columns, record, strict=False)) if columns is not None else record

    def close(self) -> None:
        f, self._file = self._file, None
        self._records, self._columns, self._offset, self._data_start = None, None, 0, 0
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
