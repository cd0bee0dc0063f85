"""How the job's lock (``Connection.execute_locked``: the overlap check, and a new slot's start with its
lease) fails on PostgreSQL when something other than the lock's holder ends the wait: the error names
the job and the slot, says nothing was written, and the next attempt decides again."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core.attempt.runner import Attempt, Identity, Options
from airflow_resumable.core.model.errors import StoreBusy
from airflow_resumable.core.stores.postgres import PostgresStore
from tests.support.stores import psycopg3_store


def _store(pg_params: dict[str, Any], driver: str, setting: str) -> PostgresStore:
    params = {**pg_params, "options": f"{pg_params.get('options', '')} -c {setting}"}
    return PostgresStore(**params) if driver == "psycopg2" else psycopg3_store(params)


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
def test_a_statement_timeout_while_the_job_lock_waits_is_a_clear_error_and_writes_nothing(
    pg_params: dict[str, Any], driver: str
) -> None:
    # Given a checkpoint connection with a short statement_timeout (no lock_timeout), and the job's lock held elsewhere
    store = _store(pg_params, driver, "statement_timeout=200")
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
    assert "statement_timeout" in str(raised.value) and "nothing was written" in str(raised.value)
    assert "a retry decides again" in (raised.value.hint or "")
    with store.open(autocommit=True) as s:
        assert s.checkpoints.load("slow job", "s1") is None and s.listings.history("slow job", "s1") == []
    # And once the lock is free, the next attempt runs
    ran: list[str] = []
    Attempt(store, Identity(job="slow job", slot="s1", attempt=2, owner="o"),
            options=Options(overlap="skip", lease=30)).run(lambda ctx: ran.append(ctx.slot))
    assert ran == ["s1"]
