"""Starters of one job at once on new slots, on a database whose sessions default to REPEATABLE READ
(``default_transaction_isolation``, a role's or a database's setting the store does not override):
the overlap policy must still let one handler run, as it did with a lease and a check of their own."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core.stores.postgres import PostgresStore
from tests.support.stores import psycopg3_store
from tests.unit.core.attempt.test_overlap_at_once import STARTERS, _at_once

ROUNDS = 15


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
def test_starters_at_once_under_repeatable_read_run_one_handler(pg_params: dict[str, Any], driver: str) -> None:
    params = {**pg_params, "options": f"{pg_params.get('options', '')} -c default_transaction_isolation=repeatable\\ read"}
    store = PostgresStore(**params) if driver == "psycopg2" else psycopg3_store(params)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    for n in range(ROUNDS):
        ran, yielded, failed = _at_once([store] * STARTERS, f"rr-{n}", "skip")
        assert not failed, failed
        assert len(ran) == 1, f"round {n}: handlers ran on {sorted(ran)} at once; yielded: {sorted(yielded)}"
