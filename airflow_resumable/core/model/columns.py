"""The tables, defined once: each column is a field of the value class that a row becomes.

:class:`~airflow_resumable.core.model.checkpoint.Checkpoint` (one row per slot) and
:class:`~airflow_resumable.core.model.checkpoint.AttemptRecord` (one row per attempt) declare their
columns with :func:`column`; :class:`Table` reads them back, and everything else follows from it:
the DDL of a fresh database, the SELECT list, the decoder from a DB-API row to the value, and the
docs' column table (a test compares them). Migrations (:mod:`airflow_resumable.core.stores.migrations`)
are the history of how a database got to this shape; a test checks that applying them all gives
exactly these columns.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

#: Column kinds. ``json`` is text holding a JSON value, decoded on read; ``timestamp`` is the
#: dialect's timestamp type (TIMESTAMPTZ, or REAL epoch seconds on SQLite), an aware datetime on read.
KINDS = ("text", "json", "int", "bigint", "float", "timestamp", "id")

#: The largest whole number a number column may hold when a row is read back, by its kind: what
#: PostgreSQL's ``INTEGER`` (``int``) and ``BIGINT`` (``bigint``, ``id``) hold. Every count the product
#: writes stays within it (``ctx.checkpoint()`` refuses a ``processed`` or ``total`` over 2**63-1 with
#: ``InvalidCheckpoint``; try numbers, process ids and map indexes are Airflow's and the system's
#: 32-bit ones). SQLite's ``INTEGER`` keeps 64 bits whatever type a column was declared with, so a
#: hand-edited row there may hold what no PostgreSQL store could; it is refused on both. The least
#: is 0 (every number column is a count, a try number, a lease token, a process id or an id), or the
#: column's own ``least`` (``map_index``: -1, not mapped). A ``float`` column (``rate``) holds a
#: finite number from 0.
MAX_NUMBER: dict[str, int] = {"int": 2**31 - 1, "bigint": 2**63 - 1, "id": 2**63 - 1}


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    kind: str
    nullable: bool = True
    #: SQL literal used as the column's DEFAULT (and for NOT NULL columns added by a migration).
    default: str | None = None
    doc: str = ""
    #: A number column's least value (the most is its kind's, :data:`MAX_NUMBER`).
    least: int = 0
    #: A text column that holds one of these values only (a status, an outcome), in the order the
    #: release declares them; None: any text.
    values: tuple[str, ...] | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (read back, not None) in this column, as the end of a
        sentence ("is ..."), or None: a number outside the column's range (see :data:`MAX_NUMBER`),
        a float that is not finite and >= 0, or a text none of :attr:`values`. Types are the
        decoder's business (``Table.decode``); this judges what a value of the right type means."""
        kind = self.kind
        if kind in MAX_NUMBER:
            if type(value) is int and self.least <= value <= MAX_NUMBER[kind]:
                return None
            return f"out of the column's range ({self.least:,} to {MAX_NUMBER[kind]:,})"
        if kind == "float":
            if value >= 0.0 and value != float("inf"):  # NaN compares false
                return None
            return "not a finite number >= 0"
        if self.values is not None and value not in self.values:
            return f"not one of {', '.join(self.values)}"
        return None

    def kept(self) -> str:
        """This column's value where :meth:`problem` would find nothing wrong with it, else NULL, as
        SQL: the decoder's own rule for a statement that adds rows up in the database (the jobs
        line), so that a number edited by hand out of its range counts there for nothing, as the
        decoder refuses it. Both stores (a text in a SQLite number column is not between two numbers, a
        fraction there is not its own whole part; PostgreSQL's NaN is greater than every number)."""
        name, kind = self.name, self.kind
        if kind in MAX_NUMBER:  # a whole number (SQLite keeps 5.5 in an INTEGER column), within the range
            return (f"CASE WHEN {name} BETWEEN {self.least} AND {MAX_NUMBER[kind]} AND CAST({name} AS INTEGER) = {name} "
                    f"THEN {name} END")
        if kind == "float":
            return f"CASE WHEN {name} >= 0 AND {name} < 1e308 THEN {name} END"
        raise ValueError(f"column {name} is not a number column")


def column(kind: str, doc: str, *, nullable: bool = True, default: Any = dataclasses.MISSING,
           sql_default: str | None = None, factory: Any = dataclasses.MISSING, least: int = 0,
           values: Any = None) -> Any:
    """A dataclass field that is also a table column. ``least``: a number column's least value
    (0 unless given); ``values``: the only values a text column holds (an enum, or strings)."""
    assert kind in KINDS, kind
    allowed = None if values is None else tuple(str(getattr(v, "value", v)) for v in values)
    meta = {"column": (kind, nullable, sql_default, doc, least, allowed)}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def to_datetime(value: Any) -> datetime | None:
    """Normalize a timestamp read from a store (datetime, or epoch seconds) to an aware datetime."""
    if value is None:
        return None
    if type(value) is float:  # SQLite's REAL epoch seconds: the common case, first
        return datetime.fromtimestamp(value, tz=timezone.utc)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    raise TypeError(f"not a timestamp: {value!r}")


_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__: the C scanner


def _loads(text: str) -> Any:
    """``json.loads`` for the texts the stores wrote (hot: a listing decodes hundreds of them).

    The C scanner alone, without ``loads``' Python wrappers: three times faster on a short value.
    Anything it does not take whole (whitespace around the value, text edited by hand) goes
    through ``json.loads``, which decides, and raises ``ValueError`` where the text is not JSON.
    """
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError, TypeError):
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


class Table:
    """A table whose rows are instances of ``cls`` (a frozen dataclass declared with :func:`column`)."""

    def __init__(self, name: str, cls: type, *, key: Sequence[str], indexes: Sequence[tuple[str, str]] = (),
                 unique: Sequence[tuple[str, str]] = (), fillfactor: int | None = None):
        self.name = name
        self.cls = cls
        self.key = tuple(key)
        #: (index name suffix, column list) pairs; ``unique`` ones are UNIQUE indexes.
        self.indexes = tuple(indexes)
        self.unique = tuple(unique)
        #: Percent of each page filled by inserts (PostgreSQL), leaving room for in-page (HOT) updates.
        self.fillfactor = fillfactor
        self.columns: tuple[Column, ...] = tuple(
            Column(f.name, *f.metadata["column"]) for f in dataclasses.fields(cls) if "column" in f.metadata
        )
        self.names: tuple[str, ...] = tuple(c.name for c in self.columns)
        #: The SELECT list, in declaration order: what :meth:`decode` takes.
        self.select = ", ".join(self.names)
        self._json = tuple(i for i, c in enumerate(self.columns) if c.kind == "json")
        self._times = tuple(i for i, c in enumerate(self.columns) if c.kind == "timestamp")
        self._ints = tuple(i for i, c in enumerate(self.columns) if c.kind in ("int", "bigint"))
        self._floats = tuple(i for i, c in enumerate(self.columns) if c.kind == "float")
        #: The columns whose values :meth:`Column.problem` judges (numbers, closed texts), by index.
        self.judged: tuple[tuple[int, Column], ...] = tuple(
            (i, c) for i, c in enumerate(self.columns)
            if c.kind in MAX_NUMBER or c.kind == "float" or c.values is not None)

    def ddl(self, type_of: Callable[[Column], str], storage: Callable[[int], str] | None = None) -> list[str]:
        """CREATE statements for this table in its current shape (a fresh database).

        ``storage(fillfactor)`` gives the dialect's table options (PostgreSQL's ``WITH (...)``).
        """
        cols = []
        for c in self.columns:
            text = f"{c.name} {type_of(c)}"
            if not c.nullable and c.kind != "id":
                text += " NOT NULL"
            if c.default is not None:
                text += f" DEFAULT {c.default}"
            cols.append(text)
        if self.key:
            cols.append(f"PRIMARY KEY ({', '.join(self.key)})")
        body = ",\n    ".join(cols)
        options = storage(self.fillfactor) if storage is not None and self.fillfactor is not None else ""
        out = [f"CREATE TABLE IF NOT EXISTS {self.name} (\n    {body}\n){options}"]
        out += [f"CREATE INDEX IF NOT EXISTS {self.name}_{suffix} ON {self.name} ({cols_})"
                for suffix, cols_ in self.indexes]
        out += [f"CREATE UNIQUE INDEX IF NOT EXISTS {self.name}_{suffix} ON {self.name} ({cols_})"
                for suffix, cols_ in self.unique]
        return out

    def decode(self, row: Sequence[Any], *, aware: bool = False) -> Any:
        """A DB-API row of :attr:`select` as an instance of the class (hot: listings decode many).

        ``aware``: the driver gives timestamps as timezone-aware datetimes already (PostgreSQL's
        TIMESTAMPTZ), so they are taken as they are.

        Raises:
            ValueError / TypeError: a JSON column holds text that is not JSON, or (``aware`` false: SQLite,
                whose columns take any value) a number column holds something else (the caller names it).
        """
        values = list(row)
        for i in self._json:
            v = values[i]
            if v is not None:
                values[i] = _loads(v)
        if not aware:
            for i in self._times:
                v = values[i]
                if v is not None:
                    values[i] = to_datetime(v)
            # SQLite keeps whatever a hand-edit put in a number column ('abc' in an INTEGER); a
            # typed server (PostgreSQL) refuses it at the UPDATE.
            for i in self._ints:
                if type(values[i]) is not int and values[i] is not None:
                    raise TypeError(f"{self.names[i]} is not an integer")
            for i in self._floats:
                if type(values[i]) not in (float, int) and values[i] is not None:
                    raise TypeError(f"{self.names[i]} is not a number")
        # Filling __dict__ builds the same frozen value as __init__, in a fraction of the time.
        obj: Any = object.__new__(self.cls)
        obj.__dict__.update(zip(self.names, values, strict=True))
        return obj

    def markdown(self) -> str:
        """The docs' column table."""
        lines = ["| column | type | meaning |", "|---|---|---|"]
        for c in self.columns:
            lines.append(f"| `{c.name}` | {c.kind} | {c.doc} |")
        return "\n".join(lines)
