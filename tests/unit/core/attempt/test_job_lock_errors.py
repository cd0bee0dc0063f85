"""How the job's lock (``Connection.execute_locked``: the overlap check, and a new slot's start with its
lease) fails on PostgreSQL when something other than the lock's holder ends the wait, and how a job or
slot name the connection's client encoding cannot carry as given is refused before anything is sent:
the error names the job and the slot and says nothing was written."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core.attempt.runner import Attempt, Identity, Options
from airflow_resumable.core.model.errors import ConfigurationError, StoreBusy, StoreUnavailable
from airflow_resumable.core.stores.postgres import PostgresStore
from tests.support.stores import psycopg3_store


def _store(pg_params: dict[str, Any], driver: str, setting: str) -> PostgresStore:
    params = {**pg_params, "options": f"{pg_params.get('options', '')} -c {setting}"}
    return PostgresStore(**params) if driver == "psycopg2" else psycopg3_store(params)


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
@pytest.mark.parametrize("timeout", ["lock_timeout", "statement_timeout"])
def test_a_timeout_while_the_job_lock_waits_is_a_clear_error_and_writes_nothing(
    pg_params: dict[str, Any], driver: str, timeout: str
) -> None:
    # Given a checkpoint connection with a short lock_timeout or statement_timeout, and the job's lock held elsewhere
    store = _store(pg_params, driver, f"{timeout}=200")
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    holder = PostgresStore(**pg_params).session()
    try:
        holder.execute(PostgresStore.dialect.job_lock, {"job": "slow job"})  # a transaction left open
        # When an attempt of that job starts on a new slot under a policy that looks at the job's other slots
        with pytest.raises(StoreBusy) as raised:
            Attempt(store, Identity(job="slow job", slot="s1", attempt=1, owner="o"),
                    options=Options(overlap="skip", lease=30)).run(lambda ctx: None)
    finally:
        holder.rollback()
        holder.close()
    # Then the error names the job, the slot, the timeout and what to do, and nothing was written
    assert (raised.value.job, raised.value.slot) == ("slow job", "s1")
    assert timeout in str(raised.value) and "nothing was written" in str(raised.value)
    assert "a retry decides again" in (raised.value.hint or "") and timeout in (raised.value.hint or "")
    with store.open(autocommit=True) as s:
        assert s.checkpoints.load("slow job", "s1") is None and s.listings.history("slow job", "s1") == []
    # And once the lock is free, the next attempt runs
    ran: list[str] = []
    Attempt(store, Identity(job="slow job", slot="s1", attempt=2, owner="o"),
            options=Options(overlap="skip", lease=30)).run(lambda ctx: ran.append(ctx.slot))
    assert ran == ["s1"]


@pytest.mark.parametrize(("driver", "encoding", "job"), [
    ("psycopg3", "SJIS", "sales\u00a5report"),  # the yen sign: Python's shift_jis sends a backslash's byte for it
    ("psycopg3", "LATIN1", "\u65e5\u672c"),  # characters LATIN1 lacks
    ("psycopg2", "LATIN1", "\u65e5\u672c"),
    ("psycopg2", "SJIS", "sales\u00a5report"),
    # the wave dash: Python's codecs send it as the byte pair PostgreSQL's conversion reads as a fullwidth tilde
    ("psycopg3", "SJIS", "q4 10\u6708\u301c12\u6708"),
    ("psycopg2", "EUC_JP", "q4 10\u6708\u301c12\u6708"),
    ("psycopg2", "SJIS", "x\x80"),  # psycopg2's cp932 sends bytes PostgreSQL's SJIS refuses
])
@pytest.mark.parametrize("policy", ["skip", "allow"])
def test_a_name_the_client_encoding_cannot_carry_as_given_is_refused_naming_it_and_writes_nothing(
    pg_params: dict[str, Any], driver: str, encoding: str, job: str, policy: str
) -> None:
    # Given a checkpoint connection in a client encoding other than UTF8
    store = _store(pg_params, driver, f"client_encoding={encoding}")
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    # When an attempt starts whose job name that encoding cannot carry as given
    with pytest.raises(ConfigurationError) as raised:
        Attempt(store, Identity(job=job, slot="s1", attempt=1, owner="o"),
                options=Options(overlap=policy, lease=30)).run(lambda ctx: None)
    # Then the error names the job, the slot and the encoding, and nothing was written under any name
    assert (raised.value.job, raised.value.slot) == (job, "s1")
    assert f"client_encoding is {encoding}" in str(raised.value) and "nothing was written" in str(raised.value)
    assert "UTF8" in (raised.value.hint or "")
    with PostgresStore(**pg_params).open(autocommit=True) as s:
        assert s.execute("SELECT count(*) FROM resumable_checkpoints").fetchone()[0] == 0
        assert s.execute("SELECT count(*) FROM resumable_attempts").fetchone()[0] == 0


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
def test_a_name_the_client_encoding_carries_is_stored_as_given(pg_params: dict[str, Any], driver: str) -> None:
    # Given a checkpoint connection in LATIN1, and a job name of LATIN1's characters, quotes and backslashes
    store = _store(pg_params, driver, "client_encoding=LATIN1")
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    job = "caf\u00e9 \\'\u00a5"
    ran: list[str] = []
    Attempt(store, Identity(job=job, slot="s\u00fc", attempt=1, owner="o"),
            options=Options(overlap="skip", lease=30)).run(lambda ctx: ran.append(ctx.slot))
    # Then it ran, and the row holds the names as given (read back in UTF8)
    assert ran == ["s\u00fc"]
    with PostgresStore(**pg_params).open(autocommit=True) as s:
        assert s.execute("SELECT job, slot FROM resumable_checkpoints").fetchall() == [(job, "s\u00fc")]


def test_a_psycopg3_connection_in_sql_ascii_is_refused_before_anything_is_written(pg_params: dict[str, Any]) -> None:
    # Given a checkpoint connection through psycopg 3 in SQL_ASCII (it then reads every text column as bytes)
    store = _store(pg_params, "psycopg3", "client_encoding=SQL_ASCII")
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    # When an attempt starts
    with pytest.raises(ConfigurationError) as raised:
        Attempt(store, Identity(job="plain", slot="s1", attempt=1, owner="o"),
                options=Options(overlap="skip", lease=30)).run(lambda ctx: None)
    # Then the error names the encoding and the fix, and no row holds a lease nobody will give back
    assert (raised.value.job, raised.value.slot) == ("plain", "s1")
    assert "SQL_ASCII" in str(raised.value) and "nothing was written" in str(raised.value)
    assert "UTF8" in (raised.value.hint or "")
    with PostgresStore(**pg_params).open(autocommit=True) as s:
        assert s.execute("SELECT count(*) FROM resumable_checkpoints").fetchone()[0] == 0


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
@pytest.mark.parametrize("policy", ["skip", "allow"])
def test_a_read_only_checkpoint_connection_is_named_as_such_and_writes_nothing(
    pg_params: dict[str, Any], driver: str, policy: str
) -> None:
    # Given a checkpoint connection whose transactions are read-only (as on a hot standby)
    with PostgresStore(**pg_params).open(autocommit=True) as s:
        s.ensure_schema()
    store = _store(pg_params, driver, "default_transaction_read_only=on")
    # When an attempt starts on a new slot
    with pytest.raises(StoreUnavailable) as raised:
        Attempt(store, Identity(job="ro job", slot="s1", attempt=1, owner="o"),
                options=Options(overlap=policy, lease=30)).run(lambda ctx: None)
    # Then the error names the job, the slot and the read-only session (not "cannot execute SELECT"), nothing written
    assert (raised.value.job, raised.value.slot) == ("ro job", "s1")
    assert "read-only" in str(raised.value) and "nothing was written" in str(raised.value)
    assert "default_transaction_read_only" in (raised.value.hint or "")
    with PostgresStore(**pg_params).open(autocommit=True) as s:
        assert s.checkpoints.load("ro job", "s1") is None


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
def test_a_name_the_database_encoding_lacks_is_refused_naming_it_and_writes_nothing(pg_server: Any, driver: str) -> None:
    import uuid
    from contextlib import closing

    import psycopg2

    # Given a checkpoint database in LATIN1, its connection in UTF8
    name = f"resumable_test_latin1_{uuid.uuid4().hex[:10]}"
    with closing(psycopg2.connect(pg_server.admin_dsn)) as admin:
        admin.autocommit = True
        admin.cursor().execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    pg_server.databases.append(name)  # dropped with the others
    params = {**psycopg2.extensions.parse_dsn(pg_server.admin_dsn), "dbname": name}
    store = _store(params, driver, "client_encoding=UTF8")
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    # When an attempt starts whose job name holds characters LATIN1 lacks
    with pytest.raises(ConfigurationError) as raised:
        Attempt(store, Identity(job="\u65e5\u672c", slot="s1", attempt=1, owner="o"),
                options=Options(overlap="skip", lease=30)).run(lambda ctx: None)
    # Then the error names the job, the slot and the database's encoding, and nothing was written
    assert (raised.value.job, raised.value.slot) == ("\u65e5\u672c", "s1")
    assert "LATIN1" in str(raised.value) and "nothing was written" in str(raised.value)
    with PostgresStore(**params).open(autocommit=True) as s:
        assert s.execute("SELECT count(*) FROM resumable_checkpoints").fetchone()[0] == 0


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
def test_the_job_lock_is_postgresql_s_own_whatever_functions_the_search_path_finds_first(
    pg_params: dict[str, Any], driver: str
) -> None:
    # Given functions named like the job lock's, in a schema the search path looks in before pg_catalog
    schema = pg_params["options"].split("search_path=")[1].split()[0]
    with PostgresStore(**pg_params).open(autocommit=True) as s:
        s.ensure_schema()
        for signature in ("pg_advisory_xact_lock(integer, integer) RETURNS void", "hashtext(text) RETURNS integer"):
            s.execute(f"CREATE FUNCTION {schema}.{signature} LANGUAGE plpgsql AS "
                      "$$ BEGIN RAISE EXCEPTION 'a function of the search path ran'; END $$")
    params = {**pg_params, "options": f"{pg_params['options']} -c search_path={schema},pg_catalog"}
    store = PostgresStore(**params) if driver == "psycopg2" else psycopg3_store(params)
    # When an attempt starts on a new slot under a policy that takes the job's lock
    ran: list[str] = []
    Attempt(store, Identity(job="shadowed", slot="s1", attempt=1, owner="o"),
            options=Options(overlap="skip", lease=30)).run(lambda ctx: ran.append(ctx.slot))
    # Then the lock taken is PostgreSQL's own (the functions of the search path never run)
    assert ran == ["s1"]
