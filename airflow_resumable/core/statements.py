"""Which statements would end the chunk's transaction: found before they are sent.

Writes through ``ctx.transaction()`` commit with the next checkpoint (guarantee 3). A ``COMMIT``
(or ``END``, ``ROLLBACK``, ``ABORT``, ``BEGIN``, ``START TRANSACTION``, ``PREPARE TRANSACTION``)
sent through that connection would commit or undo the chunk's writes on its own, outside the
checkpoint: such a statement is refused before it reaches the database. Savepoints of the
handler's own (``SAVEPOINT``, ``RELEASE``, ``ROLLBACK TO``) stay inside the transaction and pass.

The scan skips what cannot start a statement: quoted strings and identifiers, dollar quoting,
comments; it looks at the first word of every statement of the text (psycopg2 sends
``INSERT ...; COMMIT`` as one call). Its answer is cached per SQL text, so a statement sent once per
item costs one dictionary look-up (~0.1 µs) after the first.

:func:`guarded_cursor` gives ``ctx.transaction()`` its PostgreSQL cursors with the check in front of
``execute``/``executemany`` (the SQLite cursor of :mod:`~airflow_resumable.core.context` calls
:func:`check_statement` itself, beside its placeholder translation).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from airflow_resumable.core.errors import TransactionRefused

#: The first words of statements that end (or open) a transaction.
_ENDS = frozenset({"COMMIT", "END", "ABORT", "BEGIN", "START", "ROLLBACK", "PREPARE"})
#: Cheap first look: a text without any of these words has nothing to refuse.
_MAYBE = re.compile(r"(?i)\b(?:commit|end|abort|begin|start|rollback|prepare)\b")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


def ending_statement(sql: str | bytes) -> str | None:
    """The words of the first statement in ``sql`` that would end the transaction, or None.

    >>> ending_statement("insert into t values (1); commit")
    'COMMIT'
    >>> ending_statement("rollback to savepoint s") is None
    True
    """
    if isinstance(sql, bytes | bytearray | memoryview):
        sql = bytes(sql).decode("latin-1")
    if not isinstance(sql, str):
        return None
    return _cached(sql)


@functools.lru_cache(maxsize=1024)
def _cached(sql: str) -> str | None:
    return _scan(sql) if _MAYBE.search(sql) else None


def _scan(sql: str) -> str | None:
    i, n = 0, len(sql)
    at_start = True  # the next word is a statement's first
    first: str | None = None  # the current statement's first word, when it is one of _ENDS
    while i < n:
        c = sql[i]
        if c in " \t\r\n\f":
            i += 1
        elif c == ";":
            at_start, first = True, None
            i += 1
        elif c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "/" and sql.startswith("/*", i):
            i = _comment_end(sql, i)
        elif c in "'\"`":
            i = _quote_end(sql, i, c)
        elif c == "[":  # SQLite's [identifier]
            j = sql.find("]", i + 1)
            i = n if j < 0 else j + 1
        elif c == "$" and (m := _DOLLAR.match(sql, i)):
            j = sql.find(m.group(0), m.end())
            i = n if j < 0 else j + len(m.group(0))
            at_start = False
        elif (m := _WORD.match(sql, i)) is not None:
            word = m.group(0).upper()
            i = m.end()
            if at_start:
                at_start = False
                if word in _ENDS:
                    first = word
                    if word not in ("ROLLBACK", "PREPARE"):
                        return word
                continue
            if first == "ROLLBACK":
                if word == "TO":  # ROLLBACK TO [SAVEPOINT] name: stays inside the transaction
                    first = None
                elif word not in ("WORK", "TRANSACTION"):
                    return "ROLLBACK"
                continue
            if first == "PREPARE":
                if word == "TRANSACTION":
                    return "PREPARE TRANSACTION"
                first = None  # PREPARE name AS ...: a prepared statement
        else:
            if first == "ROLLBACK":
                return "ROLLBACK"
            at_start = False
            first = None
            i += 1
    return "ROLLBACK" if first == "ROLLBACK" else None


def check_statement(sql: Any, job: str | None, slot: str | None) -> None:
    """Refuse a statement that would end the chunk's transaction (see :func:`ending_statement`).

    Raises:
        TransactionRefused: ``sql`` holds a ``COMMIT``, ``ROLLBACK``, ``BEGIN``...; nothing was sent.
    """
    word = ending_statement(sql)
    if word is not None:
        raise TransactionRefused(
            f"a {word} statement was sent through ctx.transaction(): it would end the chunk's transaction on its "
            "own, outside the checkpoint (committing or undoing writes the checkpoint does not cover); nothing was "
            "sent",
            job=job,
            slot=slot,
            hint="Leave the transaction to the run: its writes commit with the next ctx.checkpoint(), and raising "
            "undoes them; your own SAVEPOINT / ROLLBACK TO / RELEASE stay inside it and are allowed",
        )


class _GuardedCursor:
    """A driver cursor (PostgreSQL) whose statements are checked by :func:`_check_statement` first."""

    def __init__(self, cur: Any, job: str | None, slot: str | None):
        self._cur = cur
        self._job, self._slot = job, slot

    def execute(self, sql: Any, params: Any = None) -> Any:
        check_statement(sql, self._job, self._slot)
        return self._cur.execute(sql) if params is None else self._cur.execute(sql, params)

    def executemany(self, sql: Any, seq_of_params: Any) -> Any:
        check_statement(sql, self._job, self._slot)
        return self._cur.executemany(sql, seq_of_params)

    def __iter__(self) -> Any:
        return iter(self._cur)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cur.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def guarded_cursor(conn: Any, job: str | None, slot: str | None) -> Any:
    """A checked cursor on ``conn``: for psycopg2 a subclass of the connection's own cursor class
    (its ``cursor_factory``, e.g. a hook's ``RealDictCursor``), so rows keep their shape and helpers
    such as ``psycopg2.extras.execute_values`` keep working; for other drivers a wrapper."""
    if type(conn).__module__.startswith("psycopg2"):
        cur = conn.cursor(cursor_factory=_checked_class(conn.cursor_factory))
        cur.resumable_where = (job, slot)
        return cur
    return _GuardedCursor(conn.cursor(), job, slot)


#: psycopg2 cursor class -> its checked subclass (made once per class).
_CHECKED: dict[Any, Any] = {}


def _checked_class(base: Any) -> Any:
    if base is None:
        import psycopg2.extensions  # only reached with a psycopg2 connection in hand

        base = psycopg2.extensions.cursor
    checked = _CHECKED.get(base)
    if checked is None:

        class CheckedCursor(base):
            resumable_where: tuple[str | None, str | None] = (None, None)

            def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 - psycopg2's name
                check_statement(query, *self.resumable_where)
                return super().execute(query, vars)

            def executemany(self, query: Any, vars_list: Any) -> Any:
                check_statement(query, *self.resumable_where)
                return super().executemany(query, vars_list)

        checked = _CHECKED[base] = CheckedCursor
    return checked


def _comment_end(sql: str, i: int) -> int:
    depth, i = 1, i + 2  # PostgreSQL nests block comments
    while i < len(sql) and depth:
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql.startswith("*/", i):
            depth, i = depth - 1, i + 2
        else:
            i += 1
    return i


def _quote_end(sql: str, i: int, quote: str) -> int:
    # E'...' strings take backslash escapes; a doubled quote is a quote in every dialect.
    escapes = quote == "'" and i > 0 and sql[i - 1] in "eE"
    i += 1
    while i < len(sql):
        c = sql[i]
        if escapes and c == "\\":
            i += 2
            continue
        if c == quote:
            if i + 1 < len(sql) and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return i
