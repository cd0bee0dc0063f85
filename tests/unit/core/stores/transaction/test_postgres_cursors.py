"""Statements through ``ctx.transaction()`` on PostgreSQL (stores/transaction/postgres_cursors.py):
PostgreSQL's own parser refuses exactly the statements that would end the transaction, a text it
cannot read is not sent, nothing is sent with ``standard_conforming_strings`` off, every psycopg2
cursor method that sends SQL is judged, and a transactional checkpoint costs no extra round trip.
"""

from __future__ import annotations

import io
import re
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.errors import TransactionRefused
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, Store
from support.escapes import make_sink, sink
from support.guard import JOB, SLOT, _drivers
from support.stores import psycopg3_store

PG_REFUSED = [
    "COMMIT", "commit work", "END", "ROLLBACK", "rollback transaction", "ABORT", "BEGIN", "START TRANSACTION",
    "PREPARE TRANSACTION 'x'", "INSERT INTO sink (item, attempt) VALUES (99, 1); COMMIT", "COMMIT AND CHAIN",
    "SELECT name'\\'; COMMIT; --'", "SELECT ARRAY[']']; COMMIT; --'", "SELECT $é$'$é$; COMMIT; --'",
    "SELECT $q$ ; end $q$; commit", "select 1;\n  begin", "ROLLBACK TO SAVEPOINT resumable_item",
    'RELEASE "resumable_chunk_1"', "SAVEPOINT resumable_mine",
    # read-only sessions (the run could record neither its checkpoint nor its failure) and the run's witness
    "SET default_transaction_read_only = on", "SET SESSION default_transaction_read_only TO on",
    "SET LOCAL transaction_read_only = on", "SET transaction_read_only TO on", "SET TRANSACTION READ ONLY",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "RESET ALL", 'SET "DEFAULT_TRANSACTION_READ_ONLY" = on',
    "SELECT set_config('default_transaction_read_only', 'on', false)", "SELECT set_config('resumable.chunk', 'x', true)",
    "SELECT pg_catalog.set_config('resumable.chunk', 'x', true)", "SET LOCAL resumable.chunk = 'x'",
    "RESET resumable.chunk", "SELECT current_setting('resumable.chunk', true)",
    "SELECT set_config(lower('RESUMABLE.CHUNK'), 'x', true)",
    r'SELECT U&"set\005fconfig"(' + "'resumable.chunk', 'x', true)",
    # how the server reads the text (the check reads it as lent) and the witness's value
    "SET client_encoding TO 'SJIS'", "SET NAMES 'GBK'", "SET SESSION client_encoding = 'BIG5'", "RESET client_encoding",
    "SET LOCAL client_encoding TO DEFAULT", "SELECT set_config('client_encoding', 'SJIS', false)",
    """SET "client_encoding" = 'UHC'""", "SET standard_conforming_strings = off",
    "SET LOCAL standard_conforming_strings TO off", "SELECT set_config('standard_conforming_strings', 'off', true)",
    "SHOW resumable.chunk", 'SHOW "resumable".chunk', "SHOW RESUMABLE.CHUNK",
    # how the server writes the timestamps the run reads back
    "SET DateStyle = 'SQL, DMY'", "SET LOCAL datestyle TO German", "RESET DateStyle",
    "SELECT set_config('DateStyle', 'Postgres', false)",
]

PG_ALLOWED = [
    "SELECT 1 /* ; commit /* nested */ ; */", "SELECT E'\\'; commit'", "SELECT 'x; commit'", 'SELECT 1 AS "commit"',
    "SELECT $$; commit$$", "DO $$ BEGIN PERFORM 1; END $$", "SAVEPOINT mine", "ROLLBACK TO SAVEPOINT mine",
    "RELEASE SAVEPOINT mine", "PREPARE p AS SELECT 1", "DEALLOCATE p", "SELECT 1 /* /* */ COMMIT --*/",
    "UPDATE sink SET item = CASE WHEN item = 1 THEN 1 END WHERE false",
    "SET LOCAL statement_timeout = '5s'", "SELECT current_setting('TimeZone')", "SET LOCAL work_mem = '8MB'",
    "SELECT set_config('application_name', 'mine', true)", "SELECT 'set_config(''resumable.chunk'')'",
    "SHOW client_encoding", "SELECT current_setting('client_encoding')", "SHOW standard_conforming_strings",
    "SHOW search_path", "SHOW ALL", "SELECT 'set names sjis'", "SHOW DateStyle", "SET LOCAL TimeZone = 'Asia/Kathmandu'",
]


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_postgresql_s_own_parser_refuses_exactly_the_statements_that_would_end_the_transaction(
    driver_store: Store,
) -> None:
    results: dict[str, str] = {}

    def send_all(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        for sql in PG_REFUSED + PG_ALLOWED:
            try:
                cur.execute(sql)
            except TransactionRefused:
                results[sql] = "refused"
            else:
                results[sql] = "ran"
        cur.execute("SAVEPOINT last")
        ctx.checkpoint(1, processed=1)

    # When a handler sends each through its cursor, then those that would end the transaction (or
    # touch a savepoint of the run's) are refused before they are sent, and the rest run inside it
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(send_all)
    assert results == {**dict.fromkeys(PG_REFUSED, "refused"), **dict.fromkeys(PG_ALLOWED, "ran")}
    assert sink(driver_store) == [1]


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_text_postgresql_s_parser_cannot_read_is_not_sent(driver_store: Store) -> None:
    def garbled(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        with pytest.raises(TransactionRefused, match="cannot read") as caught:
            cur.execute("SELEC 1; COMMIT")  # would the server run the COMMIT? it is never asked
        assert "pglast" in str(caught.value) and JOB in str(caught.value)
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (2, ctx.attempt))  # the transaction is intact
        ctx.checkpoint(2, processed=2)

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(garbled)
    assert sink(driver_store) == [1, 2]


#: A function whose body changes a setting: the parser judges the call, not the body (server-side code).
_SETS_IN_BODY = ("CREATE FUNCTION pg_temp.sets(name text, value text) RETURNS text LANGUAGE sql AS "
                 "$$ SELECT set_config(name, value, false) $$")

#: Texts with a COMMIT (or the silent-loss pair: the run's savepoint rolled back to and its witness set
#: again) that only a reader of SJIS sees: in UTF-8, the character before the backslash ends with a byte
#: that SJIS takes for the first of two, swallowing the backslash, so the quote after it ends the string.
#: psycopg2 keeps sending UTF-8 after the server switched to SJIS (Á); psycopg 3 follows the switch and
#: encodes ¥ as the byte of a backslash.
_HIDDEN = {
    "psycopg2": ["SELECT E'Á\\'; COMMIT; --'",
                 "SELECT E'Á\\'; ROLLBACK TO SAVEPOINT resumable_chunk_0; SET LOCAL resumable.chunk = '0'; --'"],
    "psycopg3": ["SELECT E'¥\\'; COMMIT; --'",
                 "SELECT E'¥\\'; ROLLBACK TO SAVEPOINT resumable_chunk_0; SET LOCAL resumable.chunk = '0'; --'"],
}


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
@pytest.mark.parametrize(("setting", "value", "named"), [
    ("client_encoding", "SJIS", "client_encoding is SJIS where it was UTF8"),
    ("standard_conforming_strings", "off", "standard_conforming_strings is 'off'"),
    ("DateStyle", "SQL, DMY", "DateStyle is SQL, DMY where it was ISO, MDY"),
])
def test_a_setting_changed_by_server_side_code_refuses_every_statement_after_it_and_the_chunk(
    driver_store: Store, request: pytest.FixtureRequest, setting: str, value: str, named: str,
) -> None:
    driver = request.node.callspec.params["driver_store"]
    seen: list[str] = []

    # Given a handler that cannot change how the server reads its texts with a statement (refused), so
    # has a function's body do it, then sends texts whose COMMIT or ROLLBACK TO only that reading sees
    def sneaky(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        with pytest.raises(TransactionRefused, match=setting):
            cur.execute(f"SET {setting} = '{value}'")
        cur.execute(_SETS_IN_BODY)
        cur.execute("SELECT pg_temp.sets(%s, %s)", (setting, value))
        for text in [*_HIDDEN[driver], "INSERT INTO sink (item, attempt) VALUES (2, 1)"]:
            with pytest.raises(TransactionRefused, match=re.escape(named)) as caught:
                cur.execute(text)
            seen.append(str(caught.value))
        ctx.checkpoint(2, processed=2)  # the errors were caught: the run still refuses the chunk

    # Then every text after the change is refused, not sent; the chunk's checkpoint is refused too
    with pytest.raises(TransactionRefused, match="server-side code") as failed:
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(sneaky)
    assert len(seen) == 3 and all(f"job={JOB!r}" in m for m in seen), seen
    assert "NOT written" in str(failed.value)
    # and nothing of the chunk was committed: its rollback also restored the session's setting
    assert sink(driver_store) == []

    # When the next attempt behaves, the chunk is written once
    def behaves(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        cur.execute("SELECT E'Á\\\\'")  # the same text, in UTF-8 as lent: one string
        ctx.checkpoint(1, processed=1)

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=2, owner="b")).run(behaves)
    assert sink(driver_store) == [1]


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_handler_s_datestyle_never_keeps_the_run_from_reading_its_row_and_recording_its_end(driver_store: Store) -> None:
    # Given a handler that sets DateStyle for its own output (a session setting: it would be committed with
    # the chunk), which the drivers cannot read the run's timestamps back in
    def formats(ctx: Any) -> None:
        tx = ctx.transaction()
        tx.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        tx.execute("SET DateStyle = 'SQL, DMY'")
        ctx.checkpoint(1, processed=1)
        tx.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (2, ctx.attempt))
        ctx.checkpoint(2, processed=2)

    # Then it is refused, naming it, and the attempt's failure is recorded: the row is not left running
    # (before, the failure could not be written either, and the row stayed running until its lease ran out)
    with pytest.raises(TransactionRefused, match="(?i)datestyle") as caught:
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(formats)
    assert f"job={JOB!r}" in str(caught.value) and "to_char" in (caught.value.hint or "")
    with driver_store.open() as s:
        assert s.checkpoints.load(JOB, SLOT).status == "failed"
    assert sink(driver_store) == []

    # and the next attempt, formatting its dates with to_char(), does the chunk once and ends done
    def behaves(ctx: Any) -> None:
        tx = ctx.transaction()
        tx.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        assert tx.execute("SELECT to_char(timestamptz '2026-12-06 00:00+00', 'DD/MM/YYYY')").fetchone() == (
            "06/12/2026",)
        ctx.checkpoint(1, processed=1)

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=2, owner="b")).run(behaves)
    assert sink(driver_store) == [1]
    with driver_store.open() as s:
        assert s.checkpoints.load(JOB, SLOT).status == "done"


#: A function whose body changes the client encoding the first time it is called in the session only.
_SETS_ONCE = ("CREATE TEMP SEQUENCE calls; CREATE FUNCTION pg_temp.sets_once() RETURNS boolean LANGUAGE plpgsql AS "
              "$$ BEGIN IF nextval('pg_temp.calls') = 1 THEN PERFORM set_config('client_encoding', 'SJIS', false); "
              "END IF; RETURN true; END $$")


@pytest.mark.parametrize("driver_store", _drivers("psycopg2", "psycopg3"), indirect=True)
def test_a_setting_changed_by_one_text_of_an_executemany_refuses_the_texts_after_it(
    driver_store: Store, request: pytest.FixtureRequest,
) -> None:
    hidden = _HIDDEN[request.node.callspec.params["driver_store"]][0].removeprefix("SELECT ")
    caught: list[str] = []

    # Given a handler whose executemany sends one text twice: the first time, a function's body changes the
    # session's client encoding; read the second time in SJIS, the same text holds a COMMIT
    def sneaky(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        cur.execute(_SETS_ONCE)
        with pytest.raises(TransactionRefused, match="client_encoding is SJIS where it was UTF8") as refused:
            cur.executemany(f"SELECT pg_temp.sets_once(), {hidden} IS NULL", [(), ()])
        caught.append(str(refused.value))
        raise RuntimeError("the handler fails after the refusal")

    # Then the second text is not sent: nothing of the chunk was committed, and the handler's error undoes it
    with pytest.raises(RuntimeError, match="the handler fails"):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(sneaky)
    assert caught and f"job={JOB!r}" in caught[0]
    assert sink(driver_store) == []


@pytest.mark.parametrize("driver_store", _drivers("psycopg3"), indirect=True)
def test_a_statement_with_server_side_parameters_is_judged_as_the_server_parses_it(driver_store: Store) -> None:
    from psycopg.types.json import Jsonb

    # A COMMIT after a comment holding a parameter: with the value '/*' merged into the text (a literal inside
    # the comment), the comment would nest and seem to run to the end; the server never reads the value there
    commits = "/* %s */ COMMIT -- */"
    sent: list[str] = []

    def sneaky(ctx: Any) -> None:
        tx = ctx.transaction()
        cur = tx.cursor()
        cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        for send in (lambda: cur.execute(commits, [Jsonb("/*")]), lambda: cur.executemany(commits, [[Jsonb("/*")]]),
                     lambda: tx.cursor(binary=True).execute(commits, [Jsonb("/*")]),
                     lambda: list(cur.stream(commits, [Jsonb("/*")]))):
            with pytest.raises(TransactionRefused, match="COMMIT"):
                send()
            sent.append("refused")
        cur.execute("SELECT %s::jsonb /* a comment */", [Jsonb("/*")])  # what is not a COMMIT still runs
        assert cur.fetchone() == ("/*",)
        raise RuntimeError("the handler fails: the chunk is undone")

    # Then each is refused before it is sent: the chunk's writes were never committed
    with pytest.raises(RuntimeError, match="the handler fails"):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(sneaky)
    assert sent == ["refused"] * 4
    assert sink(driver_store) == []


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
@pytest.mark.postgres
def test_a_connection_in_a_client_only_encoding_is_not_lent(
    driver: str, pg_params: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a checkpoint store whose sessions start in SJIS (libpq takes PGCLIENTENCODING)
    monkeypatch.setenv("PGCLIENTENCODING", "SJIS")
    store = PostgresStore(**pg_params) if driver == "psycopg2" else psycopg3_store(pg_params)
    make_sink(store)

    def writes(ctx: Any) -> None:
        ctx.transaction().execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        ctx.checkpoint(1, processed=1)

    # Then no statement of the handler is sent, with an error that says what to change
    with pytest.raises(TransactionRefused, match="client_encoding is SJIS") as caught:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(writes)
    assert "UTF8" in (caught.value.hint or "") and f"job={JOB!r}" in str(caught.value)
    monkeypatch.delenv("PGCLIENTENCODING")
    assert sink(store) == []


@pytest.mark.parametrize("driver_store", _drivers("psycopg2"), indirect=True)
def test_every_psycopg2_cursor_method_that_sends_sql_is_judged_and_its_helpers_still_work(driver_store: Store) -> None:
    import psycopg2.extras
    from psycopg2 import sql

    def helpers(ctx: Any) -> None:
        tx = ctx.transaction()
        cur = tx.cursor()
        # the helpers of psycopg2.extras and psycopg2.sql, given the handle's cursor
        psycopg2.extras.execute_values(cur, "INSERT INTO sink (item, attempt) VALUES %s", [(1, 1), (2, 1)])
        psycopg2.extras.execute_values(cur, sql.SQL(  # rendered by psycopg2.sql with the cursor: a Literal needs the
            # real connection, which psycopg2's own modules get from the cursor's .connection
            "INSERT INTO {} (item, attempt) SELECT v.i, v.a FROM (VALUES %s) AS v(i, a) WHERE v.a = {}").format(
            sql.Identifier("sink"), sql.Literal(1)), [(3, 1)])
        assert sql.SQL("{}").format(sql.Literal("it's")).as_string(cur) == "'it''s'"
        psycopg2.extras.execute_batch(cur, "INSERT INTO sink (item, attempt) VALUES (%s, %s)", [(4, 1), (5, 1)])
        cur.execute(sql.SQL("INSERT INTO {} VALUES ({}, {})").format(sql.Identifier("sink"), sql.Literal(6),
                                                                    sql.Literal(1)))
        cur.copy_from(io.StringIO("7\t1\n"), "sink")
        cur.copy_expert("COPY sink FROM STDIN", io.StringIO("8\t1\n"))
        out = io.StringIO()
        cur.copy_to(out, "sink", columns=("item",))
        assert len(out.getvalue().split()) == 8
        cur.callproc("pg_sleep", (0,))
        named = tx.cursor(name="reader")
        named.execute("SELECT item FROM sink ORDER BY item")
        assert [r[0] for r in named.fetchall()] == list(range(1, 9))
        # and each of them refuses a text that would end the transaction
        for send in (
            lambda: psycopg2.extras.execute_values(cur, "INSERT INTO sink VALUES %s; COMMIT", [(9, 1)]),
            lambda: psycopg2.extras.execute_batch(cur, "INSERT INTO sink VALUES (%s, %s); COMMIT", [(9, 1)]),
            lambda: cur.execute(sql.SQL("COMMIT")),
            lambda: cur.executemany("INSERT INTO sink VALUES (%s, %s); COMMIT", [(9, 1)]),
            lambda: cur.copy_expert("COPY sink FROM STDIN; COMMIT", io.StringIO("")),
            lambda: cur.callproc("pg_sleep(0); COMMIT; SELECT * FROM pg_sleep", (0,)),
            lambda: tx.cursor(name="evil").execute("SELECT 1; COMMIT"),
            lambda: cur.execute("SELECT %s", ("'; COMMIT; --",)) or cur.execute("SELECT '%s'", ("; COMMIT; --",)),
        ):
            with pytest.raises(TransactionRefused):
                send()
        ctx.checkpoint(8, processed=8)

    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(helpers)
    assert sink(driver_store) == list(range(1, 9))


@pytest.mark.parametrize("driver_store", _drivers("psycopg2"), indirect=True)
def test_what_a_cursor_factory_sends_through_super_is_judged_too_and_its_rows_keep_their_shape(
    driver_store: Store,
) -> None:
    import psycopg2.extensions
    import psycopg2.extras

    class Committing(psycopg2.extensions.cursor):
        """A cursor class of the handler's own that sends a COMMIT of its own through ``super()``."""

        def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 - psycopg2's name
            super().execute("COMMIT")
            return super().execute(query, vars)

    class Auditing(psycopg2.extras.DictCursor):
        def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 - psycopg2's name
            return super().execute(f"{query}; ROLLBACK", vars)

    def handler(ctx: Any) -> None:
        tx = ctx.transaction()
        tx.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (1, ctx.attempt))
        # Given the handler's cursor classes, whose own methods send a COMMIT or a ROLLBACK through super()
        for factory in (Committing, Auditing):
            with pytest.raises(TransactionRefused, match="COMMIT|ROLLBACK"):
                tx.cursor(cursor_factory=factory).execute("SELECT 1")
        # and psycopg2's own classes still give their rows' shapes
        rows = tx.cursor(cursor_factory=psycopg2.extras.RealDictCursor)
        rows.execute("SELECT item FROM sink")
        assert rows.fetchall() == [{"item": 1}]
        named = tx.cursor(cursor_factory=psycopg2.extras.NamedTupleCursor)
        named.execute("SELECT item FROM sink")
        assert named.fetchone().item == 1
        ctx.checkpoint(1, processed=1)

    # Then the check sits beneath them: nothing they send ends the chunk's transaction
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(handler)
    assert sink(driver_store) == [1]


@pytest.mark.parametrize("driver_store", _drivers("psycopg3"), indirect=True)
def test_a_dumper_registered_on_the_lent_adapters_serves_the_handler_and_never_the_run_s_statements(
    driver_store: Store,
) -> None:
    from psycopg.types.string import StrDumper

    class Shifted(StrDumper):
        """Ordinary psycopg 3 code: a dumper for ``str``, here one that changes what it sends."""

        def dump(self, obj: str) -> Any:
            return super().dump(obj.replace("15", "20"))

    def handler(ctx: Any) -> None:
        tx = ctx.transaction()
        # Given a handler that registers a str dumper on ctx.transaction()'s adapters in its first chunk
        tx.adapters.register_dumper(str, Shifted)
        cur = tx.cursor()
        cur.execute("INSERT INTO sink (item, attempt) SELECT %s::int, %s", ("15", ctx.attempt))
        ctx.checkpoint(15, processed=15, state={"note": "15"})
        tx.cursor().execute("SELECT %s", ("15",))  # a cursor made after the checkpoint adapts through it still
        raise RuntimeError("the process is interrupted after the checkpoint")

    with pytest.raises(RuntimeError, match="interrupted"):
        Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(handler)
    # Then its own statement went through it, and the run's own statements did not: the checkpoint
    # holds what the handler gave it, so the retry resumes at item 15, not past it
    assert sink(driver_store) == [20]
    resumed: list[Any] = []
    Attempt(driver_store, Identity(job=JOB, slot=SLOT, attempt=2, owner="b")).run(
        lambda ctx: resumed.append((ctx.position, ctx.state)))
    assert resumed == [(15, {"note": "15"})]
    with driver_store.open() as s:
        s.execute("SELECT 1")  # a new connection of the store: the process's adapters are untouched


def test_a_transactional_checkpoint_on_postgresql_costs_no_extra_round_trip(pg_params: dict[str, Any]) -> None:
    import psycopg2
    import psycopg2.extensions as ext

    count = dict.fromkeys(("statements", "begins", "commits"), 0)

    class Cursor(ext.cursor):  # the driver's cursor class: the handle's cursors derive from it too
        def execute(self, sql: Any, args: Any = None) -> Any:
            count["statements"] += 1
            conn = ext.cursor.connection.__get__(self)
            if not conn.autocommit and conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE:
                count["begins"] += 1  # psycopg2 sends BEGIN first, in its own round trip
            return super().execute(sql, args)

    class Counted(ext.connection):
        def commit(self) -> None:
            if self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
                count["commits"] += 1
            super().commit()

    store = PostgresStore.from_connect(lambda: psycopg2.connect(**pg_params, connection_factory=Counted,
                                                                 cursor_factory=Cursor), host="h", dbname="d")
    make_sink(store)
    per_chunk: list[dict[str, int]] = []

    def write(ctx: Any) -> None:
        for i in range(1, 8):
            before = dict(count)
            ctx.transaction().execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (i, ctx.attempt))
            ctx.checkpoint(i, processed=i)
            per_chunk.append({k: count[k] - before[k] for k in count})

    # When a handler writes one row through ctx.transaction() and checkpoints, chunk after chunk
    Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a"), options=Options(progress_interval=3600),
    ).run(write)
    assert sink(store) == list(range(1, 8))
    # Then from the second chunk on each costs its own INSERT, the checkpoint's UPDATE, and one round trip
    # that checks the chunk's savepoint, commits, and opens the next chunk's transaction and savepoint:
    # no BEGIN and no COMMIT of the driver's (which would take 3 round trips besides the INSERT)
    assert per_chunk[1:] == [{"statements": 3, "begins": 0, "commits": 0}] * 6
