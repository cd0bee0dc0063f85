"""The readers through Airflow (airflow_resumable/readers.py): an object storage path read through
Airflow's ObjectStoragePath, a SQL reader paging through an Airflow connection of either kind, and a
missing connection named with the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_resumable.core import chunk_loop
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.stores import Store
from support.readers import LINES, TIES, Crash, _crash_on, attempt, events_table
from support.sources import Source


def test_an_object_storage_path_is_read_through_airflow(airflow_home: Path, tmp_path: Path, store: Store) -> None:
    from airflow_resumable.readers import object_reader

    path = tmp_path / "lines.txt"
    path.write_bytes(LINES)
    reader = object_reader(f"file://{path}")
    seen: list[str] = []
    attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=30))
    assert seen == [f"line {i:03d}" for i in range(100)]


def test_sql_reader_pages_through_an_airflow_connection_of_either_kind(
    airflow_home: Path, store: Store, store_uri: str, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_resumable.readers import sql_reader

    # Given the events table in a database named by an Airflow connection (PostgreSQL: through the
    # Postgres provider's hook, whichever driver it uses; SQLite: sqlite3)
    events_table(source, TIES)
    monkeypatch.setenv("AIRFLOW_CONN_EVENTS_SOURCE", store_uri)
    reader = sql_reader("events_source", table="events", columns=("id", "updated_at"), key=("updated_at", "id"),
                        as_dict=True)
    seen: list[int] = []
    with pytest.raises(Crash):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: _crash_on(seen, b, {"id": 22, "updated_at": TIES[21][1]}),
                                         chunk_size=7))
    attempt(store, 2).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=7))
    assert [r["id"] for r in seen] == [i for i, _ in TIES]


def test_a_missing_reader_connection_is_named_with_the_fix(airflow_home: Path, store: Store) -> None:
    from airflow_resumable.readers import sql_reader

    reader = sql_reader("no_such_source", table="events", key="id")  # nothing is looked up at parse time
    with pytest.raises(ConfigurationError, match="'no_such_source' a reader reads from does not exist") as err:
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: None, chunk_size=7))
    assert "AIRFLOW_CONN_NO_SUCH_SOURCE" in str(err.value)
