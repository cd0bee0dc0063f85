"""``make test`` checks, before the whole suite starts, that PostgreSQL and Redis are there, naming
what to install or start: without them the Celery and PostgreSQL tests failed after the rest of the
suite had run for half an hour."""

from __future__ import annotations

import socket
from contextlib import closing

from devtools.services import missing


def _closed_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_what_the_suite_needs_and_does_not_find_is_named_with_what_to_do() -> None:
    port = _closed_port()
    found = missing(pg_dsn=f"postgresql://postgres@127.0.0.1:{port}/postgres", redis=("127.0.0.1", port),
                    pg_bin=lambda name: None)
    assert len(found) == 2, found
    assert found[0].startswith("PostgreSQL: RESUMABLE_TEST_PG_DSN does not answer"), found
    assert found[1].startswith(f"Redis: nothing answers at 127.0.0.1:{port}") and "redis-server" in found[1], found


def test_postgresql_s_binaries_are_enough_where_no_server_answers(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    port = _closed_port()
    monkeypatch.setattr("devtools.services.DEFAULT_DSN", f"postgresql://postgres@127.0.0.1:{port}/postgres")
    monkeypatch.delenv("RESUMABLE_TEST_PG_DSN", raising=False)
    assert [p for p in missing(pg_bin=lambda name: f"/usr/bin/{name}") if p.startswith("PostgreSQL")] == []
    found = missing(pg_bin=lambda name: None)
    assert any(p.startswith("PostgreSQL: nothing answers") and "apt-get install postgresql" in p for p in found), found


def test_this_machine_has_what_the_suite_needs() -> None:
    """CI's machine and a newcomer's after the README's steps: nothing missing."""
    assert missing() == []
