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


def test_a_dsn_that_does_not_parse_is_named_without_its_password() -> None:
    """libpq echoes a URI it cannot parse, or the token it choked on, in its error: the check's
    line goes to a CI log and must not carry the password."""
    port = _closed_port()
    for dsn in ("postgresql://postgres:s3cretpw@[::1", f"postgresql://postgres:s3c%zzpw@127.0.0.1:{port}/postgres",
                f"postgresql://postgres:s3c%00pw@127.0.0.1:{port}/postgres",
                f"host=127.0.0.1 port={port} password='s3cretpw"):
        found = missing(pg_dsn=dsn, redis=("127.0.0.1", port), pg_bin=lambda name: None)
        assert found[0].startswith("PostgreSQL: RESUMABLE_TEST_PG_DSN does not answer"), found
        assert "s3c" not in found[0], found[0]
    # What does not parse is still named
    assert "IPv6" in missing(pg_dsn="postgresql://postgres:s3cretpw@[::1", redis=("127.0.0.1", port))[0]


def test_a_port_that_takes_the_connection_and_never_answers_is_named_within_seconds() -> None:
    import time

    with closing(socket.socket()) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = int(silent.getsockname()[1])
        started = time.monotonic()
        found = missing(pg_dsn=f"postgresql://postgres@127.0.0.1:{port}/postgres", redis=("127.0.0.1", port),
                        pg_bin=lambda name: None)
        assert time.monotonic() - started < 20, "each check has a timeout of its own"
    assert [line.split(":")[0] for line in found] == ["PostgreSQL", "Redis"], found
    assert "timed out" in found[1] and "timeout expired" in found[0], found
