"""The PostgreSQL store on psycopg 3 connections that prepare every statement (``prepare_threshold=0``,
a keyword the Postgres provider's hook passes on from the Airflow connection's extras): the run's
queries of several statements (the job's lock and the start, a chunk's commit and the next one's
opening, the loan's first round trip) are never sent as prepared statements, which hold one."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core.attempt.runner import Attempt, Identity, Options
from airflow_resumable.core.stores.postgres import PostgresStore


@pytest.mark.parametrize("threshold", [0, None])
@pytest.mark.parametrize("policy", ["skip", "allow"])
def test_an_attempt_that_writes_through_ctx_transaction_runs_when_psycopg3_prepares_every_statement(
    pg_params: dict[str, Any], threshold: int | None, policy: str
) -> None:
    import psycopg

    params = {k: v for k, v in pg_params.items() if k != "application_name"}
    store = PostgresStore.from_connect(lambda: psycopg.connect(**params, prepare_threshold=threshold),
                                       host=params.get("host"), dbname=params.get("dbname"))
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (n INT)")

    def handler(ctx: Any) -> None:
        for i in range(3):
            ctx.transaction().execute("INSERT INTO sink VALUES (%s)", (i,))
            if i == 1:
                with pytest.raises(ZeroDivisionError), ctx.savepoint():
                    ctx.transaction().execute("INSERT INTO sink VALUES (%s)", (99,))
                    raise ZeroDivisionError
            ctx.checkpoint(position=i, processed=i + 1)

    Attempt(store, Identity(job="prepared", slot="s", attempt=1, owner="o"), options=Options(overlap=policy)).run(handler)
    with PostgresStore(**pg_params).open(autocommit=True) as s:
        assert [r[0] for r in s.execute("SELECT n FROM sink ORDER BY n").fetchall()] == [0, 1, 2]
        row = s.checkpoints.load("prepared", "s")
        assert row is not None and (row.status, row.position, row.processed) == ("done", 2, 3)
