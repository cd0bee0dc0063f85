"""The checkpoint store an Airflow connection names (hooks/resumable.py): a connection no store
serves, an unreachable server or a relative SQLite path is a clear error without its password; a
PostgreSQL connection takes every extra the Postgres provider supports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("mysql://user:pw@db/x", "has type 'mysql', which no checkpoint store serves"),
        ("sqlite://", "names no database file"),
    ],
)
def test_a_connection_no_store_serves_is_a_clear_error_without_its_password(uri: str, message: str) -> None:
    from airflow.sdk import Connection

    from airflow_resumable.core.model.errors import ConfigurationError
    from airflow_resumable.hooks.resumable import store_from_connection

    conn = Connection.from_uri(uri, conn_id="resumable_default")
    with pytest.raises(ConfigurationError, match=message) as err:
        store_from_connection(conn, job="j", slot="s")
    assert "pw" not in str(err.value) and "job='j'" in str(err.value)


def test_an_unreachable_postgres_names_host_but_not_password(airflow_home: Path) -> None:
    from airflow.sdk import Connection

    from airflow_resumable.core.model.errors import StoreUnavailable
    from airflow_resumable.hooks.resumable import store_from_connection

    conn = Connection.from_uri("postgresql://someone:hunter2-secret@127.0.0.1:1/db", conn_id="resumable_default")
    store = store_from_connection(conn)
    with pytest.raises(StoreUnavailable) as err:
        store.connect()
    assert "127.0.0.1" in str(err.value) and "hunter2-secret" not in str(err.value)
    assert "hunter2-secret" not in repr(store) and "hunter2-secret" not in store.describe()


def test_a_relative_sqlite_path_is_refused_naming_the_four_slash_form() -> None:
    from airflow.sdk import Connection

    from airflow_resumable.core.model.errors import ConfigurationError
    from airflow_resumable.hooks.resumable import store_from_connection

    # Given the three-slash URI, which Airflow parses to the relative path var/lib/x.db
    conn = Connection.from_uri("sqlite:///var/lib/x.db", conn_id="resumable_default")
    with pytest.raises(ConfigurationError) as err:
        store_from_connection(conn, job="j", slot="s")
    text = str(err.value)
    assert "relative path 'var/lib/x.db'" in text and "sqlite:////var/lib/x.db" in text and "job='j'" in text


@pytest.mark.parametrize(("query", "busy"), [("", 30.0), ("?busy_timeout=2.5", 2.5), ("?busy_timeout=0", None), ("?busy_timeout=1e-9", None), ("?busy_timeout=5_0", None),
                                             ("?busy_timeout=soon", None), ("?busy_timeout=nan", None)])
def test_a_sqlite_connection_s_busy_timeout_extra_sets_how_long_a_writer_waits(
    tmp_path: Path, query: str, busy: float | None,
) -> None:
    from airflow.sdk import Connection

    from airflow_resumable.core.model.errors import ConfigurationError
    from airflow_resumable.hooks.resumable import store_from_connection

    conn = Connection.from_uri(f"sqlite:///{tmp_path}/x.db{query}", conn_id="resumable_default")
    if busy is None:
        with pytest.raises(ConfigurationError, match="gives busy_timeout=") as err:
            store_from_connection(conn, job="j", slot="s")
        assert "job='j'" in str(err.value) and "?busy_timeout=60" in str(err.value)
        return
    assert store_from_connection(conn).busy_timeout == busy  # type: ignore[attr-defined]


def test_a_postgres_connection_takes_every_extra_the_postgres_provider_supports(pg_params: dict[str, Any]) -> None:
    from airflow.sdk import Connection

    from airflow_resumable.hooks.resumable import store_from_connection

    # client_encoding and keepalives_count were never on a list of ours: the provider passes them on
    # (and options, which puts the tables in this test's schema)
    conn = Connection(
        conn_id="ck", conn_type="postgres", host=pg_params["host"], port=int(pg_params["port"]),
        login=pg_params["user"], schema=pg_params["dbname"],
        extra=json.dumps({"client_encoding": "LATIN1", "keepalives_count": 3, "application_name": "ck-test",
                          "options": pg_params["options"]}),
    )
    store = store_from_connection(conn)
    with store.open() as s:
        assert s.execute("SHOW client_encoding").fetchone()[0] == "LATIN1"
        assert s.execute("SHOW application_name").fetchone()[0] == "ck-test"
        assert f"search_path={s.execute('SHOW search_path').fetchone()[0]}" in pg_params["options"]
        s.ensure_schema()
    assert store.describe() == f"postgresql://{pg_params['user']}@{pg_params['host']}:{pg_params['port']}/{pg_params['dbname']}"
