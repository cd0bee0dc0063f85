"""Build a store from a command-line spec, for tests that run attempts in subprocesses."""

from __future__ import annotations

import json

from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store


def spec_of(store: Store) -> str:
    if isinstance(store, SQLiteStore):
        return json.dumps({"sqlite": store.path})
    assert isinstance(store, PostgresStore)
    return json.dumps({"postgres": store._params})


def store_of(spec: str) -> Store:
    data = json.loads(spec)
    if "sqlite" in data:
        return SQLiteStore(data["sqlite"])
    params = dict(data["postgres"])
    params.pop("application_name", None)
    return PostgresStore(**params)
