"""The test harness itself: with nothing on the default port, a throwaway cluster serves the tests."""

from __future__ import annotations

from contextlib import closing

import psycopg2
import pytest

import devtools.postgres as harness


def test_a_throwaway_cluster_starts_when_nothing_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESUMABLE_TEST_PG_DSN", raising=False)
    monkeypatch.setattr(harness, "DEFAULT_DSN", f"postgresql://postgres@127.0.0.1:{harness._free_port()}/postgres")
    server = harness.Server().start()
    try:
        assert server.throwaway is not None
        params = server.create_database()
        with closing(psycopg2.connect(**params)) as conn:
            cur = conn.cursor()
            cur.execute("SELECT current_database()")
            assert cur.fetchone()[0] == params["dbname"]
    finally:
        server.stop()


def test_an_explicit_server_that_does_not_answer_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESUMABLE_TEST_PG_DSN", f"postgresql://postgres@127.0.0.1:{harness._free_port()}/postgres")
    with pytest.raises(RuntimeError, match="RESUMABLE_TEST_PG_DSN does not answer"):
        harness.Server().start()


def test_two_schemas_of_the_session_database_keep_their_checkpoints_apart_also_through_a_connection_uri(
    pg_server: harness.Server,
) -> None:
    from airflow.sdk import Connection

    from airflow_resumable.core.stores import PostgresStore
    from airflow_resumable.hooks.resumable import store_from_connection

    # Given two tests' schemas in the one database of the session
    first, second = pg_server.create_schema(), pg_server.create_schema()
    assert first["dbname"] == second["dbname"] and first["options"] != second["options"]
    # When one holds a slot in its checkpoint table
    with PostgresStore(**first).open(autocommit=True) as s:
        s.ensure_schema()
        assert s.leases.acquire("job", "slot", "a", 30) is not None
    # Then the other's checkpoint table is its own, empty: the same slot is free there
    with PostgresStore(**second).open(autocommit=True) as s:
        s.ensure_schema()
        assert s.checkpoints.load("job", "slot") is None and s.leases.acquire("job", "slot", "b", 30) is not None
    # and the schema reaches a store built from the test's connection URI (options=...), as
    # AIRFLOW_CONN_RESUMABLE_DEFAULT gives it to a task, through the Postgres provider's hook
    store = store_from_connection(Connection.from_uri(harness.dsn(first), conn_id="resumable_default"))
    with store.open() as s:
        row = s.checkpoints.load("job", "slot")
        assert row is not None and row.lease_owner == "a"
