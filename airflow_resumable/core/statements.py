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
"""

from __future__ import annotations

import functools
import re

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
