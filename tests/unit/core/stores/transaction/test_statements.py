"""The statement check against the database itself (issue 31): generated SQL texts that hide a
transaction statement behind quoting, comments, dollar quotes, typed literals, E-strings, arrays,
identifiers and Unicode, or do not hide it, are each sent through a cursor of
``ctx.transaction()`` inside a throwaway transaction of the real database (PostgreSQL, SQLite).
Whatever the check lets through must leave the transaction open with its savepoint (no text the
database commits or rolls back passes), and whatever it refuses the database would indeed have
ended the transaction with, or rejected (no refusal of a harmless statement).
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_resumable.core.model.errors import TransactionRefused
from airflow_resumable.core.stores import SQLiteStore
from airflow_resumable.core.stores.dialect import to_qmark
from airflow_resumable.core.stores.transaction.handle import Loan, SQLiteDriver, TransactionConnection
from airflow_resumable.core.stores.transaction.postgres_cursors import Psycopg2Driver

#: What may hide a statement, in one grammar or the other: (what comes before, opener, closer).
_HIDERS = [
    (", ", "'", "'"), (", ", "E'", "'"), (", ", "e'", "'"), (", ", "name'", "'"), (", ", "text '", "'"),
    (", ", "U&'", "'"), (", ", "$$", "$$"), (", ", "$a$", "$a$"), (", ", "$é$", "$é$"), (", ", "$_1$", "$_1$"),
    (", ", "ARRAY['", "']"), (", ", "'{", "}'"), (" AS ", '"', '"'), (" AS ", 'U&"', '"'), (" AS ", "[", "]"),
    (" AS ", "`", "`"), (" ", "/*", "*/"), (" ", "/* /*", "*/ */"), (" ", "--", "\n"),
]
#: What goes inside them, and around them.
_PIECES = ["'", "''", "\\", "\\'", "$", "$$", "$a$", "$é$", "é", "ß", ";", " COMMIT", " rollback", " END", " begin",
           "--", "/*", "*/", "\n", '"', "[", "]", "a", " ", "1", "::text"]
#: The statements that would end the transaction, as the text's last part.
_TAILS = ["", "; COMMIT", "; COMMIT; --'", "; ROLLBACK", "; END", "; BEGIN", "; ABORT", "\nCOMMIT", "; commit --*/",
          " COMMIT", "\nEND --", " rollback", "COMMIT",
          "; ROLLBACK TO SAVEPOINT resumable_item", "; RELEASE SAVEPOINT resumable_chunk", "; SELECT 2"]

_body = st.lists(st.sampled_from(_PIECES), max_size=4).map("".join)
_hider = st.tuples(st.sampled_from(_HIDERS), _body, st.integers(0, 5)).map(
    lambda t: t[0][0] + t[0][1] + t[1] + (t[0][2] if t[2] else ""))  # one in six left open


def _text(lead: str, hiders: list[str], tail: str, trail: str) -> str:
    hidden = "".join(hiders)
    if not lead:  # the text starts with what hides (a comment, most usefully)
        hidden = hidden.removeprefix(", ").removeprefix(" AS ").lstrip()
    return lead + hidden + tail + trail


texts = st.builds(
    _text,
    st.sampled_from(["SELECT 1", "SELECT 1", "/* */ SELECT 1", "", ""]),
    st.lists(_hider, max_size=3),
    st.sampled_from(_TAILS),
    st.sampled_from(["", "", "", "", " --'", "'", "*/", "\n", ";", "$$", "]"]),
)

#: The issue's own texts, and their neighbours.
_KNOWN = ["SELECT name'\\'; COMMIT; --'", "SELECT ARRAY[']']; COMMIT; --'", "SELECT $é$'$é$; COMMIT; --'",
          "/* /* */ COMMIT --*/", "SELECT E'\\'; COMMIT; --'", "SELECT '\\'; COMMIT; --'", "SELECT $é$; COMMIT; $é$",
          "SELECT 1 -- ; COMMIT\n; COMMIT", "SELECT [a]; COMMIT; --]", "SELECT \"a\"\"\"; COMMIT; --\""]

# derandomize: the same examples on every run (a CI gate must not flake); widen max_examples to explore
_SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _known(test: Any) -> Any:
    for text in _KNOWN:
        test = example(text)(test)
    return test


# -- PostgreSQL ----------------------------------------------------------------------------------


class _Postgres:
    """One psycopg2 connection; each text runs in a throwaway transaction that opens with the
    savepoint ``resumable_chunk`` (a name of the run's, as its own savepoint has) (the run's own savepoint stands for it)."""

    def __init__(self, params: dict[str, Any]):
        import psycopg2

        self.errors = psycopg2.Error
        self.conn = psycopg2.connect(**params)
        loan = Loan("property", "slot")
        loan.wire = Psycopg2Driver.wire(self.conn)  # as lent: judged only while the session reads texts so
        self.handle = TransactionConnection(self.conn, Psycopg2Driver(), loan)

    def fresh(self) -> None:
        self.conn.rollback()
        self.conn.cursor().execute("SAVEPOINT resumable_chunk")

    def ended(self) -> bool:
        """Whether the throwaway transaction was ended (committed or rolled back) or its savepoint lost."""
        import psycopg2.extensions as ext

        status = self.conn.info.transaction_status
        if status == ext.TRANSACTION_STATUS_IDLE:
            return True
        check = "ROLLBACK TO SAVEPOINT resumable_chunk" if status == ext.TRANSACTION_STATUS_INERROR else "RELEASE SAVEPOINT resumable_chunk"
        try:
            self.conn.cursor().execute(check)
        except self.errors:
            return True
        return False

    def through_the_handle(self, text: str) -> str:
        self.fresh()
        try:
            self.handle.cursor().execute(text)
        except TransactionRefused as exc:
            # PostgreSQL ignores a BEGIN inside a transaction (a warning): refused all the same, to keep
            # the rule one line long and the message clear
            return "refused begin" if str(exc).startswith(("a BEGIN ", "a START TRANSACTION ")) else "refused"
        except self.errors:
            return "error"
        return "ran"

    def raw(self, text: str) -> str:
        self.fresh()
        try:
            self.conn.cursor().execute(text)
        except self.errors:
            return "error" if not self.ended() else "ended"
        return "ended" if self.ended() else "intact"


@pytest.fixture(scope="module")
def postgres(pg_server: Any) -> Any:
    db = _Postgres(pg_server.create_schema())
    yield db
    db.conn.close()


@pytest.mark.postgres
@_SETTINGS
@given(text=texts)
@_known
def test_no_text_postgresql_would_end_the_transaction_with_passes_the_check(postgres: _Postgres, text: str) -> None:
    verdict = postgres.through_the_handle(text)
    if not verdict.startswith("refused"):
        # what was let through ran (or failed) inside the transaction, which stands with its savepoint
        assert not postgres.ended(), f"{text!r} ended the transaction yet passed the check"
        return
    # what was refused, the database would indeed have ended the transaction with, or rejected
    allowed = ("ended", "error", "intact") if verdict == "refused begin" else ("ended", "error")
    assert postgres.raw(text) in allowed, f"{text!r} was refused but runs harmlessly"


# -- SQLite --------------------------------------------------------------------------------------


class _SQLite:
    """One connection of the SQLite store, lent as to a handler; each text runs in a throwaway
    transaction that opens with the chunk's witness (a row the run inserts after BEGIN)."""

    def __init__(self, path: Path):
        self.conn = SQLiteStore(path).connect()
        self.loan = Loan("property", "slot")
        self.handle = TransactionConnection(self.conn, SQLiteDriver(to_qmark), self.loan)

    def reset(self) -> None:
        with self.conn.own():
            self.conn.rollback()
        self.conn.chunk_done()

    def ended(self) -> bool:
        if not self.conn.in_transaction:
            return True
        with self.conn.own():
            try:
                found = self.conn.execute("SELECT count(*) FROM temp.resumable_witness WHERE token = ?",
                                          (self.conn.witness,)).fetchone()[0]
            except sqlite3.Error:
                return True
        return bool(found != 1)

    def through_the_handle(self, text: str) -> str:
        self.reset()
        self.conn.lend(self.loan)
        try:
            self.handle.cursor().execute(text)
        except TransactionRefused:
            return "refused"
        except sqlite3.Error:
            return "error"
        finally:
            self.conn.unlend()
        return "ran"

    def raw(self, text: str) -> str:
        self.reset()
        self.conn.begin()
        try:
            self.conn.execute(text)
        except sqlite3.Error:
            return "ended" if self.ended() else "error"
        return "ended" if self.ended() else "intact"


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Any:
    db = _SQLite(tmp_path_factory.mktemp("property") / "checkpoints.db")
    yield db
    db.conn.close()


@_SETTINGS
@given(text=texts)
@_known
def test_no_text_sqlite_would_end_the_transaction_with_passes_the_check(lite: _SQLite, text: str) -> None:
    verdict = lite.through_the_handle(text)
    if verdict != "refused":
        assert not lite.ended(), f"{text!r} ended the transaction yet passed the check"
        return
    assert lite.raw(text) in ("ended", "error"), f"{text!r} was refused but runs harmlessly"


def test_the_generated_texts_hide_and_show_transaction_statements_alike(postgres: _Postgres, lite: _SQLite) -> None:
    """The property above is only worth its examples: among the generated texts, the databases
    end the transaction with some and keep it with some (at least 10 of 300 each)."""
    seen: dict[str, Counter[str]] = {"postgres": Counter(), "sqlite": Counter()}

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(text=texts)
    def tally(text: str) -> None:
        seen["postgres"][postgres.raw(text)] += 1
        seen["sqlite"][lite.raw(text)] += 1

    tally()
    for db, outcomes in seen.items():
        assert outcomes["ended"] >= 10 and outcomes["intact"] >= 10, (db, outcomes)
