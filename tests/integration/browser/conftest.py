"""One ``airflow standalone`` (PostgreSQL metadata, the embedded SQLite checkpoint store) and one
headless Chromium for every browser test of this folder, and the folder for the screenshots.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import SQLiteStore
from devtools.postgres import Server, dsn
from support.browser import DAG_FILE, DAG_ID, MARKUP_USER, TOUR_DAG_FILE, Env, chromium, need_chromium, screenshots
from support.standalone import Standalone


@pytest.fixture(scope="package")
def env(pg_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    need_chromium()
    metadata = pg_server.create_database("resumable_browser_meta")
    store = SQLiteStore(tmp_path_factory.mktemp("browser") / "checkpoints.db")
    with store.open() as session:
        session.ensure_schema()  # the test reads the table before the first attempt creates it
    airflow = Standalone(
        metadata_uri=dsn(metadata).replace("postgresql://", "postgresql+psycopg2://", 1),
        dag_files=[DAG_FILE, TOUR_DAG_FILE],
        env={"AIRFLOW_CONN_RESUMABLE_DEFAULT": f"sqlite:///{store.path}",
             "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"admin:admin,viewer:viewer,{MARKUP_USER}:admin"},
    )
    try:
        airflow.start()
        airflow.serve([DAG_ID, "readings_import", "ui_parts", "ui_overlap", "ui_partitioned"])
        warm_up(airflow)
        yield Env(airflow, store)
    finally:
        airflow.close()


def warm_up(airflow: Standalone) -> None:
    """One short run to its end before the tests. A fresh api-server on a busy machine has been
    seen to answer its first task's Execution API calls too late (the supervisor then kills the
    task): that is the machine, not the page, and must not read as the first test's failure. A
    second and third run are tried; a third failure fails the module, saying so."""
    assert airflow.api is not None
    api = airflow.api
    states = []
    for n in range(3):
        run_id = f"warm_up_{n}_{uuid.uuid4().hex[:6]}"
        api.trigger(DAG_ID, run_id=run_id, conf={"items": 1, "delay": 0})
        state = api.run_state(DAG_ID, run_id, timeout=300, interval=1.0, what="a warm-up run to end",
                              on_timeout=airflow.tail)
        states.append(state)
        if state == "success":
            return
    pytest.fail(f"three warm-up runs of {DAG_ID} failed ({states}): the standalone cannot run a task\n"
                f"{airflow.tail()}", pytrace=False)


@pytest.fixture(scope="package")
def browser(env: Env) -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="package")
def shots() -> Path:
    return screenshots()
