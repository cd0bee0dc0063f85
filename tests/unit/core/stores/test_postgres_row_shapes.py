"""The PostgreSQL store on connections whose rows are not tuples: an Airflow Postgres connection's
``cursor`` extra (``dictcursor``, ``namedtuplecursor``; psycopg2's ``realdictcursor``) makes the hook
open them with psycopg 3's ``row_factory`` or psycopg2's ``cursor_factory`` set. The store reads its
own rows as tuples whatever the connection's default; the handler's cursors on ``ctx.transaction()``
keep the connection's row shape."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core.attempt.runner import Attempt, Identity, Options
from airflow_resumable.core.stores.postgres import PostgresStore


def _connect(pg_params: dict[str, Any], shape: str) -> Any:
    params = {k: v for k, v in pg_params.items() if k != "application_name"}
    if shape.startswith("psycopg2"):
        import psycopg2
        import psycopg2.extras

        factory = {"psycopg2 realdictcursor": psycopg2.extras.RealDictCursor,
                   "psycopg2 dictcursor": psycopg2.extras.DictCursor}[shape]
        return lambda: psycopg2.connect(**params, cursor_factory=factory)
    import psycopg
    from psycopg.rows import dict_row, namedtuple_row

    factory = {"psycopg3 dictcursor": dict_row, "psycopg3 namedtuplecursor": namedtuple_row}[shape]
    return lambda: psycopg.connect(**params, row_factory=factory)


@pytest.mark.parametrize("shape", ["psycopg3 dictcursor", "psycopg3 namedtuplecursor", "psycopg2 realdictcursor",
                                   "psycopg2 dictcursor"])
@pytest.mark.parametrize("policy", ["skip", "allow"])
def test_an_attempt_runs_on_connections_whose_rows_are_not_tuples(pg_params: dict[str, Any], shape: str,
                                                                  policy: str) -> None:
    # Given a store whose connections return rows as the Airflow connection's cursor extra asks
    store = PostgresStore.from_connect(_connect(pg_params, shape), host=pg_params.get("host"),
                                       dbname=pg_params.get("dbname"))
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (n INT)")
    seen: list[Any] = []

    def handler(ctx: Any) -> None:
        cur = ctx.transaction().cursor()
        cur.execute("INSERT INTO sink VALUES (1)")
        cur.execute("SELECT n FROM sink")
        seen.append(cur.fetchone())
        ctx.checkpoint(position={"done": 1}, processed=1)

    # When an attempt of a new slot runs, and a second attempt of the same slot after it
    Attempt(store, Identity(job="rows", slot="s", attempt=1, owner="o"), options=Options(overlap=policy)).run(handler)
    again = Attempt(store, Identity(job="rows", slot="s", attempt=2, owner="o"), options=Options(overlap=policy))
    again.run(handler)
    # Then the handler ran once, its cursor gave the connection's row shape, and the slot is done
    key = "n" if shape in ("psycopg3 dictcursor", "psycopg2 realdictcursor") else 0
    assert len(seen) == 1 and seen[0][key] == 1
    with PostgresStore(**pg_params).open(autocommit=True) as s:
        row = s.checkpoints.load("rows", "s")
        assert row is not None and (row.status, row.position, row.processed) == ("done", {"done": 1}, 1)
