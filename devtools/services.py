"""What ``make test`` needs running beside it, checked before the whole suite starts: PostgreSQL
(the server on 127.0.0.1:5432, ``RESUMABLE_TEST_PG_DSN``, or PostgreSQL's binaries for a throwaway
cluster, as :mod:`devtools.postgres` finds them) and Redis on 127.0.0.1:6379 (the Celery tests'
broker). Without them those tests fail, after the rest of the suite has run for half an hour; this
says so in the first second, with what to install or start.

    python -m devtools.services    # exits 1, naming what is missing
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Callable
from contextlib import closing

from devtools.postgres import DEFAULT_DSN, _can_connect, _pg_bin

REDIS = ("127.0.0.1", 6379)


def _redis_answers(address: tuple[str, int]) -> str | None:
    """None when Redis answers PING at ``address``, else why not."""
    try:
        with closing(socket.create_connection(address, timeout=3)) as conn:
            conn.sendall(b"PING\r\n")
            reply = conn.recv(64)
    except OSError as exc:
        return str(exc) or type(exc).__name__
    return None if reply.startswith(b"+PONG") else f"it answered {reply[:40]!r} to PING"


def _secrets(dsn: str) -> set[str]:
    """The passwords written in ``dsn`` (a URI's ``user:password@`` or ``?password=``, a keyword
    string's ``password=``), as written and unquoted, even where the rest of it does not parse."""
    found = set()
    for shape in (r"^[A-Za-z][A-Za-z0-9+.-]*://([^@/?#]*)@", r"^[A-Za-z][A-Za-z0-9+.-]*://(.*)@"):  # first @, last @
        userinfo = re.match(shape, dsn)
        if userinfo and ":" in userinfo.group(1):
            found.add(userinfo.group(1).split(":", 1)[1])
    found.update(re.findall(r"[?&]password=([^&#]*)", dsn))
    for value in re.findall(r"password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)", dsn):
        found.update({value, value.strip("'")})
    return {secret for secret in found if secret}


def _redacted(text: str, dsn: str) -> str:
    """``text`` (a driver's error about ``dsn``, which may echo the DSN or a part of it) with the
    passwords ``dsn`` holds replaced by ``***``."""
    for secret in sorted(_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def missing(*, pg_dsn: str | None = None, redis: tuple[str, int] = REDIS,
            pg_bin: Callable[[str], str | None] = _pg_bin) -> list[str]:
    """What the whole suite needs and does not find, each with what to do (empty: all there)."""
    found = []
    given = os.environ.get("RESUMABLE_TEST_PG_DSN") if pg_dsn is None else pg_dsn
    problem = _can_connect(given or DEFAULT_DSN)
    if problem is not None:
        if given:
            found.append(f"PostgreSQL: RESUMABLE_TEST_PG_DSN does not answer ({_redacted(problem, given)}); fix it or "
                         "unset it")
        elif pg_bin("initdb") is None or pg_bin("pg_ctl") is None:
            found.append(f"PostgreSQL: nothing answers at {DEFAULT_DSN} ({problem}) and PostgreSQL's binaries "
                         "(initdb, pg_ctl) are not installed for a throwaway cluster: apt-get install postgresql "
                         "(the tests start a cluster of their own from its binaries), or start the server")
    problem = _redis_answers(redis)
    if problem is not None:
        found.append(f"Redis: nothing answers at {redis[0]}:{redis[1]} ({problem}), the Celery tests' broker: "
                     "apt-get install redis-server, then redis-server --daemonize yes")
    return found


def main() -> int:
    found = missing()
    for line in found:
        print(f"make test needs {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
