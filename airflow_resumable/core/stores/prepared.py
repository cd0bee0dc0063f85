"""The checkpoint's UPDATE as a server-side prepared statement (PostgreSQL through psycopg2).

A run sends the same fenced UPDATE after every chunk. Sent as text, the server parses and plans it
every time; prepared once per connection (``PREPARE``, in the same round trip as the first
checkpoint) and then sent by name (``EXECUTE``), it is planned once, and its text on the wire is a
few bytes: about 45 µs less of the server's time per checkpoint here, which a loop of
millisecond chunks on a small server feels (``make bench`` rows 1 and 2). psycopg 3 prepares
repeated statements by itself; SQLite keeps its compiled statements in a cache already.

A pooler that hands the connection's statements to another server process between two
transactions (PgBouncer in transaction mode) does not keep ``PREPARE``: the statement is then
unknown on the next server process (SQLSTATE 26000) or already there from another client (42P05).
Such a failure changes nothing (the statement did not run: in autocommit mode it is its own
transaction), so the checkpoint is sent again as text, and this connection sends text from then on.
Inside a handler's transaction (``ctx.transaction()``) the text is sent: a failed statement there
would undo the handler's pending writes.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

#: SQLSTATEs of a prepared statement the server process does not have (26000) or already has (42P05).
_POOLED = ("26000", "42P05")
_NAMED = re.compile(r"%\((\w+)\)s")


def preparable(conn: Any) -> bool:
    """Whether ``conn`` takes a ``PREPARE`` and an ``EXECUTE`` in one query with client-side
    parameters (psycopg2's connections; psycopg 3 binds on the server and prepares by itself)."""
    try:
        from psycopg2.extensions import connection
    except ImportError:  # pragma: no cover - the PostgreSQL store then connects with psycopg 3 only
        return False
    return isinstance(conn, connection)


class PreparedStatement:
    """One statement with named ``%(name)s`` parameters, prepared on one connection on first use.

    :meth:`text` says what to send with the statement's parameters; after sending,
    :meth:`sent` records that it was prepared, and :meth:`gone` tells whether a failure was the
    server process not having it (send :attr:`plain` instead, and from now on).
    """

    def __init__(self, sql: str, *, enabled: bool = True):
        #: The statement as text, for a connection that cannot keep it prepared.
        self.plain = sql
        names: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m[1] not in names:
                names.append(m[1])
            return f"${names.index(m[1]) + 1}"

        body = _NAMED.sub(number, sql)
        name = "resumable_" + hashlib.sha1(sql.encode()).hexdigest()[:12]
        self._execute = f"EXECUTE {name} ({', '.join(f'%({n})s' for n in names)})"
        self._first = f"PREPARE {name} AS {body}; {self._execute}"
        #: None: not prepared on this connection yet; True: prepared; False: send the text.
        self.prepared: bool | None = None if enabled and names else False

    def text(self, *, autocommit: bool) -> str:
        """What to send now: the first time ``PREPARE`` and ``EXECUTE`` together, then ``EXECUTE``;
        the plain text in a transaction, or once this connection could not keep it."""
        if self.prepared is False or not autocommit:
            return self.plain
        return self._execute if self.prepared else self._first

    def sent(self, text: str) -> None:
        """``text`` (from :meth:`text`) ran: the statement is prepared on this connection."""
        if text is self._first:
            self.prepared = True

    def gone(self, exc: BaseException, text: str) -> bool:
        """Whether sending ``text`` failed only because this connection's server process does not
        keep prepared statements as this one expects (a pooler): then nothing ran, the statement
        is to be sent again as :attr:`plain`, and is sent so from now on."""
        if text is self.plain or getattr(exc, "pgcode", None) not in _POOLED:
            return False
        self.prepared = False
        return True
