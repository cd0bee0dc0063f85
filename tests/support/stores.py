"""Build a store from a command-line spec, for tests that run attempts in subprocesses."""

from __future__ import annotations

import json
from typing import Any

from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store


def spec_of(store: Store) -> str:
    if isinstance(store, SQLiteStore):
        return json.dumps({"sqlite": store.path, "busy_timeout": store.busy_timeout})
    assert isinstance(store, PostgresStore)
    if getattr(store, "psycopg3_params", None) is not None:
        return json.dumps({"psycopg3": store.psycopg3_params})  # type: ignore[attr-defined]
    return json.dumps({"postgres": store._params})


def psycopg3_store(params: dict[str, Any]) -> PostgresStore:
    """A PostgreSQL store whose connections are psycopg 3's (as the Postgres provider's hook opens them)."""
    import psycopg

    params = {k: v for k, v in params.items() if k != "application_name"}
    store = PostgresStore.from_connect(lambda: psycopg.connect(**params), host=params.get("host"),
                                       dbname=params.get("dbname"))
    store.psycopg3_params = params  # type: ignore[attr-defined]
    return store


def store_of(spec: str) -> Store:
    data = json.loads(spec)
    if "sqlite" in data:
        return SQLiteStore(data["sqlite"], busy_timeout=data.get("busy_timeout", 30.0))
    if "psycopg3" in data:
        return psycopg3_store(data["psycopg3"])
    params = dict(data["postgres"])
    params.pop("application_name", None)
    return PostgresStore(**params)


def empty_store(store_kind: str, tmp_path: Any, request: Any, filename: str = "checkpoints.db") -> tuple[Store, str]:
    """An empty store of ``store_kind`` and its Airflow connection URI (a PostgreSQL schema from the
    ``pg_params`` fixture, or a SQLite file ``filename`` under ``tmp_path``)."""
    if store_kind == "sqlite":
        path = tmp_path / filename
        return SQLiteStore(path), f"sqlite:///{path}"
    from devtools.postgres import dsn

    params = request.getfixturevalue("pg_params")
    return PostgresStore(**params), dsn(params)
