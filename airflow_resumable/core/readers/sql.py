"""The SQL checks: which names a reader writes into SQL, and whether the user's SQL text fits the driver.

A reader writes its own conditions in the driver's placeholder style and passes the user's
``where=``/``query=`` text through untouched, so both must agree with the driver (DB-API
``paramstyle``) before the first statement is sent.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

from airflow_resumable.core.model.checkpoint import short

__all__ = ["IDENTIFIER", "MARKERS", "paramstyle_of", "placeholder_problems", "placeholders"]

#: A column or table name, optionally qualified (``schema.table``); no quoting, no expressions.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$")

#: DB-API paramstyles and the marker of each that readers can write.
MARKERS = {"format": "%s", "pyformat": "%s", "qmark": "?"}

#: A ``%`` and the character after it: a format driver reads ``%s`` as a value, ``%%`` as a ``%``.
_PERCENT = re.compile(r"%(.?)", re.S)

#: Quoted text and names, and comments: where a qmark driver's database does not look for ``?``.
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?\*/", re.S)


def paramstyle_of(conn: Any) -> str:
    """The DB-API paramstyle of the driver whose module made ``conn`` (``format`` if it declares none)."""
    module = sys.modules.get(type(conn).__module__.split(".")[0])
    return getattr(module, "paramstyle", "format")


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


def placeholder_problems(marker: str, texts: Sequence[str | None], given: int) -> list[str]:
    """What is wrong with the placeholders of the user's SQL ``texts`` for ``marker``, for ``given`` params.

    ``texts`` are ``query=``, ``where=`` and the column list, in the order their values come in
    ``params=``; a missing one is None.
    """
    counted = [placeholders(t, marker) for t in texts if t]
    problems = [p for _, found in counted for p in found]
    wanted = sum(n for n, _ in counted)
    if wanted != given:
        problems.append(f"where= and query= have {wanted} placeholder{'s' if wanted != 1 else ''} ({marker}) "
                        f"but params= gives {given} value{'s' if given != 1 else ''}: give one value per "
                        "placeholder, in order")
    return problems
