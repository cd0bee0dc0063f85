"""The store of each driver the tests of ctx.transaction()'s guard run on."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from support.escapes import make_sink
from support.stores import psycopg3_store


@pytest.fixture
def driver_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """An empty store on the driver named by the test's ``driver`` parameter."""
    kind = request.param
    if kind == "sqlite":
        store: Store = SQLiteStore(tmp_path / "checkpoints.db")
    elif kind == "psycopg2":
        store = PostgresStore(**request.getfixturevalue("pg_params"))
    else:
        store = psycopg3_store(request.getfixturevalue("pg_params"))
    make_sink(store)
    return store
