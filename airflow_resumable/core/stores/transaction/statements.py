"""Which statements the handler may send through ``ctx.transaction()``, judged by the database's own
grammar: never by a lexer of ours.

Writes through ``ctx.transaction()`` commit with the next checkpoint (guarantee 3). A statement that
ends or opens a transaction (``COMMIT``, ``END``, ``ROLLBACK``, ``ABORT``, ``BEGIN``, ``START
TRANSACTION``, ``PREPARE TRANSACTION``, ``COMMIT``/``ROLLBACK PREPARED``) would commit or undo writes
the checkpoint does not cover; one that names a savepoint of the run's own (``resumable_...``) would
undo or release what the run keeps to undo a chunk or to tell that its transaction is intact. Both
are refused before they run. The handler's own ``SAVEPOINT``, ``RELEASE`` and ``ROLLBACK TO``
stay inside the transaction and pass. So are statements that would make the session read-only (the
run could then record neither its checkpoint nor its failure) and those that touch the run's witness
of the chunk's transaction (the ``resumable.*`` settings on PostgreSQL, the ``resumable_witness``
table on SQLite: see ``stores/connection.py``), so that no ordinary code forges it by accident.

* **PostgreSQL**: the text the driver is about to send (parameters merged, ``psycopg2.sql``/
  ``psycopg.sql`` objects rendered) is parsed by PostgreSQL's own parser, libpg_query through
  `pglast <https://pypi.org/project/pglast/>`_, and refused if any of its top-level statements is a
  ``TransactionStmt`` of the kinds above, a ``SET``/``RESET`` of a read-only or ``resumable.*``
  setting (``SET TRANSACTION``, ``SET SESSION CHARACTERISTICS``, ``RESET ALL`` included) or of a
  setting that changes how the server reads a statement's text (:data:`WIRE_SETTINGS`:
  ``client_encoding``, ``SET NAMES``, ``standard_conforming_strings``), a ``SHOW`` of a
  ``resumable.*`` setting, or calls ``set_config()`` on any of those or ``current_setting()`` on a
  read-only or ``resumable.*`` one (or either on a name that is not a constant). A text that parser
  cannot read is refused too (fail closed): a text the server accepts but pglast's PostgreSQL cannot
  read (syntax newer than pglast's) is not sent.

  **The text is judged as the server will read it.** The server converts the bytes it receives from
  the session's client encoding and lexes them with its ``standard_conforming_strings``; the check
  decodes the bytes the driver sends in the driver's encoding and parses them with that setting on.
  The two agree only while both settings stay what they were when the connection was lent: the
  cursors compare the server's own report of them (libpq's parameter status, updated after every
  statement, no round trip) with the lent values before each statement, and the run does before it
  commits a chunk (``stores/connection.py``); a change (only server-side code can make one: a
  function body is not parsed here) refuses the statement or the chunk. The lent encoding must be
  one whose bytes below 0x80 are always ASCII (not the client-only ``SJIS``, ``BIG5``, ``GBK``,
  ``UHC``, ``GB18030``, ``JOHAB``, where a character's second byte can be a quote or a backslash).
  The verdict is cached per text
  (texts up to :data:`CACHED_LENGTH` characters); a text holding none of the words a transaction
  statement needs is passed without parsing (a keyword token is made of those letters; sound).
* **SQLite**: the engine judges every statement as it compiles it: ``sqlite3``'s authorizer denies
  ``SQLITE_TRANSACTION``, the savepoint actions on the run's names, setting a pragma of
  :data:`GUARDED_PRAGMAS` and any use of the witness table while the connection is lent
  to the handler (see :func:`sqlite_denial` and ``stores/sqlite.py``). The handler's statements,
  and its raw driver calls (``commit()``, ``executescript()``...), fail with SQLite's "not
  authorized"; the run's own statements are marked as its own and pass.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sqlite3
from typing import Any

from airflow_resumable.core.model.errors import ConfigurationError, TransactionRefused

#: Every savepoint the run opens on the handler's connection starts with this (case does not matter).
RUN_SAVEPOINTS = "resumable_"

#: Texts longer than this are judged every time (a ``execute_values`` page is unique anyway).
CACHED_LENGTH = 8192

#: A statement the check refuses needs one of these words: a transaction statement's keyword, or the
#: name of a guarded setting or function (an identifier: as written, or spelled with Unicode escapes,
#: ``U&"..."``). PostgreSQL folds only ASCII letters to match keywords and identifiers, so a text
#: without any of them (in any case) holds no such statement. (``str.lower()`` turns every ASCII
#: capital into its small letter; what else it turns into ASCII letters only adds matches, and a
#: match only means the text is parsed.)
_WORDS = ("begin", "start", "commit", "end", "abort", "rollback", "savepoint", "release", "prepare", "read_only",
          "transaction", "set_config", "current_setting", "resumable", "reset", "u&", "client_encoding", "names",
          "standard_conforming_strings", "datestyle")

#: Settings the handler may not change: a read-only session would leave the run unable to record
#: its own checkpoint or failure; ``resumable.*`` holds the run's witness of the chunk's transaction.
GUARDED_SETTINGS = frozenset({"default_transaction_read_only", "transaction_read_only"})
#: Settings that change how the server reads a statement's text: the session's client encoding (``SET
#: NAMES`` too) and whether a backslash escapes in ``'...'``. The check reads the text as the server does
#: only while they stay as lent, so the handler may not change them. And ``DateStyle``, how the server
#: writes the timestamps the run reads back on the same connection: both drivers parse only its ISO
#: output, so a handler's ``SET DateStyle`` (committed with a checkpoint) made every later statement of the
#: run fail, recording its failure included, and left the row ``running`` until its lease ran out.
WIRE_SETTINGS = frozenset({"client_encoding", "standard_conforming_strings", "datestyle"})
#: PostgreSQL's client-only encodings: a character's second byte can be below 0x80 (a quote, a
#: backslash), so a text in them is not lexed alike by a parser that reads another encoding. A connection
#: in one of them is not lent (:func:`wire_refusal`).
UNSAFE_ENCODINGS = frozenset({"sjis", "shift_jis_2004", "big5", "gbk", "uhc", "gb18030", "johab"})
#: The prefix of the run's own settings (the chunk's witness: ``stores/connection.py``).
RUN_SETTINGS = "resumable."
#: Functions that read or write a setting by name: refused on a guarded or run's setting, and on a
#: name that is not a constant (it could be either).
_SETTING_FUNCTIONS = frozenset({"set_config", "current_setting"})
#: The run's witness table on SQLite (a TEMP table: ``stores/sqlite.py``).
WITNESS_TABLE = "resumable_witness"
#: SQLite pragmas the handler may not set: ``query_only`` would leave the run unable to record its
#: checkpoint or failure; the others change how (or whether) the run's commits are durable.
GUARDED_PRAGMAS = frozenset({"query_only", "journal_mode", "locking_mode", "synchronous", "writable_schema"})

_RUN_NAMES = re.compile(r"resumable_(?:chunk|item)_[0-9a-z]+(?:_[0-9]+)?", re.IGNORECASE)


def scrubbed(text: str) -> str:
    """``text`` (a driver's error) without the names of the run's own savepoints: they are for the
    run alone, and a message is read by more than the handler's author."""
    return _RUN_NAMES.sub("<a savepoint of the run's>", text)

#: libpg_query's TransactionStmtKind -> the statement, as a person writes it.
_KINDS = {
    "TRANS_STMT_BEGIN": "BEGIN",
    "TRANS_STMT_START": "START TRANSACTION",
    "TRANS_STMT_COMMIT": "COMMIT",
    "TRANS_STMT_ROLLBACK": "ROLLBACK",
    "TRANS_STMT_SAVEPOINT": "SAVEPOINT",
    "TRANS_STMT_RELEASE": "RELEASE SAVEPOINT",
    "TRANS_STMT_ROLLBACK_TO": "ROLLBACK TO SAVEPOINT",
    "TRANS_STMT_PREPARE": "PREPARE TRANSACTION",
    "TRANS_STMT_COMMIT_PREPARED": "COMMIT PREPARED",
    "TRANS_STMT_ROLLBACK_PREPARED": "ROLLBACK PREPARED",
}
#: The kinds that stay inside the transaction when they name a savepoint of the handler's own.
_OWN_SAVEPOINT_KINDS = frozenset({"TRANS_STMT_SAVEPOINT", "TRANS_STMT_RELEASE", "TRANS_STMT_ROLLBACK_TO"})


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a statement may not run through ``ctx.transaction()``.

    Attributes:
        what: the statement's kind (``COMMIT``, ``ROLLBACK TO SAVEPOINT resumable_item_...``), or
            what could not be read.
        unreadable: the parser could not read the text (not sent: the server might have run it).
        setting: it reads or changes a setting the handler may not touch (see :data:`GUARDED_SETTINGS`).
    """

    what: str
    unreadable: bool = False
    #: A setting the handler may not change (read-only, or the run's own), not a transaction statement.
    setting: bool = False


def postgres_refusal(sql: str) -> Refusal | None:
    """Why PostgreSQL's own parser says ``sql`` may not run through ``ctx.transaction()``, or None.

    >>> postgres_refusal("insert into t values (1); commit").what
    'COMMIT'
    >>> postgres_refusal("select 'commit'; savepoint mine; rollback to savepoint mine") is None
    True

    Raises:
        ConfigurationError: pglast is not installed (the ``postgres`` extra).
    """
    if "\x00" in sql:  # libpq and libpg_query both stop reading there: refuse rather than guess
        return Refusal("a text holding a NUL character", unreadable=True)
    low = sql.lower()
    if not ("begin" in low or "start" in low or "commit" in low or "end" in low or "abort" in low
            or "rollback" in low or "savepoint" in low or "release" in low or "prepare" in low
            or "read_only" in low or "transaction" in low or "set_config" in low or "current_setting" in low
            or "resumable" in low or "reset" in low or "u&" in low or "client_encoding" in low or "names" in low
            or "standard_conforming_strings" in low or "datestyle" in low):
        return None  # _WORDS, spelled out: a generator would cost more than the test
    if len(sql) > CACHED_LENGTH:
        return _judge(sql)
    return _cached(sql)


@functools.lru_cache(maxsize=4096)
def _cached(sql: str) -> Refusal | None:
    return _judge(sql)


def _judge(sql: str) -> Refusal | None:
    parser = _parser()
    try:
        tree = parser.parse_sql_json(sql)
    except parser.ParseError as exc:
        return Refusal(f"a text PostgreSQL's parser (pglast, PostgreSQL {_server_grammar()}) cannot read: {exc}",
                       unreadable=True)
    if ('"TransactionStmt"' not in tree and '"VariableSetStmt"' not in tree and '"FuncCall"' not in tree
            and '"VariableShowStmt"' not in tree):
        return None  # the common case: no JSON to load
    for raw in json.loads(tree).get("stmts", ()):
        stmt = raw.get("stmt", {})
        refusal = (_transaction_refusal(stmt.get("TransactionStmt")) or _setting_refusal(stmt.get("VariableSetStmt"))
                   or _show_refusal(stmt.get("VariableShowStmt")))
        if refusal is None and '"FuncCall"' in tree:
            refusal = _function_refusal(stmt)
        if refusal is not None:
            return refusal
    return None


def _transaction_refusal(stmt: dict[str, Any] | None) -> Refusal | None:
    if stmt is None:
        return None
    kind = stmt.get("kind", "")
    name = stmt.get("savepoint_name") or ""
    what = _KINDS.get(kind, kind)
    if kind in _OWN_SAVEPOINT_KINDS:
        if not name.lower().startswith(RUN_SAVEPOINTS):
            return None  # the handler's own savepoint: inside the transaction
        what = f"{what} on a savepoint of the run's own ({RUN_SAVEPOINTS}...)"
    return Refusal(what)


def _guarded_setting(name: str, *, reading: bool = False) -> bool:
    """Whether the handler may not set (or, ``reading``, read) the setting ``name``: the read-only
    settings and the run's own, and, to set, the :data:`WIRE_SETTINGS`."""
    low = name.lower()
    return low in GUARDED_SETTINGS or low.startswith(RUN_SETTINGS) or (not reading and low in WIRE_SETTINGS)


def _setting_refusal(stmt: dict[str, Any] | None) -> Refusal | None:
    """``SET``/``RESET`` of a read-only setting or of the run's own; ``SET TRANSACTION``, ``SET SESSION
    CHARACTERISTICS`` and ``RESET ALL`` (they change those too)."""
    if stmt is None:
        return None
    kind, name = stmt.get("kind", ""), stmt.get("name") or ""
    if kind == "VAR_SET_MULTI":  # SET TRANSACTION ..., SET SESSION CHARACTERISTICS AS TRANSACTION ...
        return Refusal(f"SET {name.upper()}", setting=True)
    if kind == "VAR_RESET_ALL":
        return Refusal("RESET ALL", setting=True)
    if _guarded_setting(name):
        return Refusal(f"{'RESET' if kind == 'VAR_RESET' else 'SET'} {_shown(name)}", setting=True)
    return None


def _show_refusal(stmt: dict[str, Any] | None) -> Refusal | None:
    """``SHOW`` of a setting of the run's own (its value is the chunk's witness)."""
    if stmt is None:
        return None
    name = stmt.get("name") or ""
    if name.lower().startswith(RUN_SETTINGS):
        return Refusal(f"SHOW {_shown(name)}", setting=True)
    return None


def _shown(name: str) -> str:
    """A setting's name as a message may show it (the run's own are named by their prefix only)."""
    return f"{RUN_SETTINGS}..." if name.lower().startswith(RUN_SETTINGS) else name.lower()


def _function_refusal(node: Any) -> Refusal | None:
    """A call of ``set_config()`` or ``current_setting()`` anywhere in the statement, on a guarded
    setting, a setting of the run's, or a name that is not a constant."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        call = item.get("FuncCall")
        if isinstance(call, dict):
            names = call.get("funcname") or [{}]
            function = (names[-1].get("String") or {}).get("sval", "").lower()
            if function in _SETTING_FUNCTIONS:
                args = call.get("args") or [{}]
                const = (args[0].get("A_Const") or {}).get("sval")
                setting = const.get("sval") if isinstance(const, dict) else None
                if setting is None:
                    return Refusal(f"{function}() of a setting named by an expression", setting=True)
                if _guarded_setting(setting, reading=function == "current_setting"):
                    return Refusal(f"{function}('{_shown(setting)}')", setting=True)
        stack.extend(item.values())
    return None


@functools.cache
def _parser() -> Any:
    try:
        import pglast.parser
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            "ctx.transaction() on PostgreSQL checks each statement with PostgreSQL's own parser, pglast, which is "
            "not installed",
            hint="Install it with: pip install 'airflow-resumable[postgres]' (or pglast)",
        ) from exc
    return pglast.parser


@functools.cache
def _server_grammar() -> str:
    version = int(_parser().get_postgresql_version()[0])
    return str(version)


def sqlite_denial(action: int, arg1: str | None, arg2: str | None) -> Refusal | None:
    """What SQLite's authorizer refuses to compile for the handler: a transaction statement, a
    savepoint action on one of the run's savepoints (``resumable_...``), setting a pragma of
    :data:`GUARDED_PRAGMAS`, or any use of the run's witness table; None for anything else.

    Args:
        action: the authorizer's action code.
        arg1: ``BEGIN``/``COMMIT``/``ROLLBACK`` (``SQLITE_TRANSACTION``), ``BEGIN``/``RELEASE``/
            ``ROLLBACK`` (``SQLITE_SAVEPOINT``), the pragma (``SQLITE_PRAGMA``), the table.
        arg2: the savepoint's name (``SQLITE_SAVEPOINT``), the pragma's value (None: read), the
            table (``SQLITE_ALTER_TABLE``).
    """
    if action == sqlite3.SQLITE_TRANSACTION:
        return Refusal(arg1 or "a transaction statement")
    if action == sqlite3.SQLITE_SAVEPOINT:
        if (arg2 or "").lower().startswith(RUN_SAVEPOINTS):
            verb = {"BEGIN": "SAVEPOINT", "RELEASE": "RELEASE", "ROLLBACK": "ROLLBACK TO"}.get(arg1 or "", arg1)
            return Refusal(f"{verb} on a savepoint of the run's own ({RUN_SAVEPOINTS}...)")
        return None
    if action == sqlite3.SQLITE_PRAGMA:
        if arg2 is not None and (arg1 or "").lower() in GUARDED_PRAGMAS:
            return Refusal(f"PRAGMA {(arg1 or '').lower()} = ...", setting=True)
        return None
    if (arg1 or "").lower() == WITNESS_TABLE or (arg2 or "").lower() == WITNESS_TABLE:
        return Refusal(f"a statement on the run's table {WITNESS_TABLE}", setting=True)
    return None


@dataclasses.dataclass(frozen=True)
class Wire:
    """How the server reads the statement texts of a session and writes the timestamps it returns, as it
    reports them (libpq's parameter status): its client encoding (PostgreSQL's name, ``UTF8``),
    ``standard_conforming_strings`` and ``DateStyle``."""

    encoding: str
    conforming: str
    datestyle: str = ""

    def changed(self, lent: Wire) -> str:
        """What differs from ``lent``, as a message says it (``client_encoding is SJIS where it was UTF8``)."""
        names = {"encoding": "client_encoding", "conforming": "standard_conforming_strings", "datestyle": "DateStyle"}
        return ", ".join(f"{names[f.name]} is {getattr(self, f.name)} where it was {getattr(lent, f.name)}"
                         for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(lent, f.name))


def wire_refusal(lent: Wire, now: Wire, job: str | None, slot: str | None) -> TransactionRefused | None:
    """Why no statement may be judged (and sent) on a session whose settings read its text unlike the
    check does, or None: the encoding lent is a client-only one (:data:`UNSAFE_ENCODINGS`),
    ``standard_conforming_strings`` is off, or either changed since the connection was lent."""
    if lent.encoding.lower() in UNSAFE_ENCODINGS:
        return TransactionRefused(
            f"the checkpoint connection's client_encoding is {lent.encoding}: in it a character's second byte "
            "can be a quote or a backslash, so a statement's text is not read by the server as PostgreSQL's parser "
            "reads it here, and a COMMIT or ROLLBACK hidden in a string could run; nothing was sent",
            job=job, slot=slot,
            hint="Connect the checkpoint store with client_encoding UTF8 (the drivers' default: remove the "
            "PGCLIENTENCODING environment variable, or the role's or database's client_encoding setting)",
        )
    if now.conforming != "on":
        return TransactionRefused(
            f"standard_conforming_strings is {now.conforming!r} on the checkpoint connection: its statements cannot "
            "be checked for a COMMIT or ROLLBACK hidden in a string (PostgreSQL's parser reads strings only as with "
            "it on); nothing was sent",
            job=job, slot=slot,
            hint="Leave standard_conforming_strings on (the default since PostgreSQL 9.1) for the checkpoint "
            "database's role and database, and do not set it off through ctx.transaction() or a function",
        )
    if now != lent:
        return TransactionRefused(
            f"the session's {now.changed(lent)} when the connection was lent to the handler: the server now reads a statement's bytes unlike the check that judges them (a COMMIT or "
            "ROLLBACK could hide in a string), or writes timestamps the run cannot read back. Statements that set "
            "them are refused, so server-side code changed one (a function's body or a DO block calling "
            "set_config('client_encoding', ...)); nothing was sent",
            job=job, slot=slot,
            hint="Leave client_encoding, standard_conforming_strings and DateStyle to the run: do not change them in "
            "functions called through ctx.transaction() (format dates with to_char()). Raise (or let this error propagate) to undo the chunk; its "
            "transaction's rollback restores them",
        )
    return None


def statement_refused(refusal: Refusal, job: str | None, slot: str | None) -> TransactionRefused:
    """The error of a statement refused before it ran."""
    if refusal.unreadable:
        return TransactionRefused(
            f"a statement sent through ctx.transaction() is {refusal.what}; it was not sent, since whether it "
            "would end the chunk's transaction cannot be told",
            job=job,
            slot=slot,
            hint="Fix the statement's syntax. If your server accepts it (a newer PostgreSQL), upgrade pglast to one "
            "built on that PostgreSQL's parser",
        )
    if refusal.setting:
        return TransactionRefused(
            f"a {refusal.what} statement was sent through ctx.transaction(): it would make the session read-only "
            "(the run could then record neither the checkpoint nor the failure), change how the run's commits are "
            "kept, how the server reads the statements' text or writes the timestamps the run reads back, or touch "
            "what the run keeps to tell that the "
            "chunk's writes are intact; nothing was run",
            job=job,
            slot=slot,
            hint="Leave the session's settings to the run: do not set default_transaction_read_only, "
            "transaction_read_only, client_encoding (SET NAMES), standard_conforming_strings, DateStyle (format "
            "dates with to_char()), SET TRANSACTION / "
            "SET SESSION CHARACTERISTICS or RESET ALL (PostgreSQL), "
            "PRAGMA query_only, journal_mode, locking_mode, synchronous, writable_schema (SQLite), nor anything "
            "named resumable.* / resumable_witness. Set your own settings with SET LOCAL; to read data without "
            "writing, just do not write. Writes commit with the next ctx.checkpoint(); to undo part of a chunk "
            "use 'with ctx.savepoint():'",
        )
    return TransactionRefused(
        f"a {refusal.what} statement was sent through ctx.transaction(): it would end the chunk's transaction on "
        "its own, outside the checkpoint (committing or undoing writes the checkpoint does not cover), or undo "
        "what the run keeps to undo a chunk; nothing was run",
        job=job,
        slot=slot,
        hint="Leave the transaction to the run: its writes commit with the next ctx.checkpoint(), and raising "
        "undoes them; to undo part of a chunk use 'with ctx.savepoint():'. Your own SAVEPOINT / ROLLBACK TO / "
        "RELEASE (any name not starting with 'resumable_') stay inside it and are allowed",
    )
