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
