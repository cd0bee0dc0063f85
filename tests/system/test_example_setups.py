"""The example DAGs' setup steps, two at once: what a scheduled run beside a manual one does.

Triggering a paused scheduled example from the UI with its default "unpause" starts its scheduled
run too, and both runs' first task sets up the example's tables at the same moment (so do the two
partitioned exports, whose daily runs start together). ``dag.test()`` runs one run at a time, so
this runs each setup step itself in two processes released together by a barrier, several rounds
on an empty database each, on both checkpoint stores: every call succeeds and the tables hold
their rows once. Without the setups' lock PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` fails one of
them (``UniqueViolation ... pg_type_typname_nsp_index``) and both fill the same table.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sqlite3
import sys
import traceback
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from devtools.postgres import dsn
from support.paths import ROOT

ROUNDS = 5
#: (DAG file, its setup function, the table it fills, the rows it holds afterwards)
SETUPS = {
    "customer_export": ("prepare_customers", "customers", 1_000),
    "customer_export.warehouse": ("prepare_warehouse", "warehouse_customers", 0),
    "partitioned_export": ("prepare_orders", "orders", 2_000),
}
TABLES = ("customers", "warehouse_customers", "orders", "orders_export")


def _setup(module: str, function: str, env: dict[str, str], barrier: Any, results: Any) -> None:
    """In a process of its own: import the DAG file, wait for the other one, run its setup."""
    os.environ.update(env)
    sys.path.insert(0, str(ROOT / "dags"))
    try:
        target = getattr(importlib.import_module(module), function)
        target = getattr(target, "function", target)  # a @task: the function it wraps
        barrier.wait(timeout=120)
        target()
        results.put("ok")
    except BaseException:  # every failure is the test's finding, reported to it
        results.put(traceback.format_exc())


def _drop(store_kind: str, store_uri: str, pg: dict[str, Any]) -> None:
    with closing(psycopg2.connect(**pg)) as conn, conn, conn.cursor() as cur:
        for table in TABLES:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
    if store_kind == "sqlite":
        with closing(sqlite3.connect(store_uri[len("sqlite:///"):])) as db, db:
            for table in TABLES:
                db.execute(f"DROP TABLE IF EXISTS {table}")


def _count(store_kind: str, store_uri: str, pg: dict[str, Any], table: str, on_store: bool) -> int:
    if on_store and store_kind == "sqlite":
        with closing(sqlite3.connect(store_uri[len("sqlite:///"):])) as db:
            return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    with closing(psycopg2.connect(**pg)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table}")
        return int(cur.fetchone()[0])


@pytest.mark.trials  # 60 fresh interpreters importing Airflow: minutes, run beside the built wheel's tests
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_two_runs_setting_up_an_example_at_once_both_succeed_and_fill_it_once(
    setup: str, airflow_home: Path, store_kind: str, store_uri: str, pg_database: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    """Each round: an empty database, the setup step in two processes at once; both succeed and
    the table holds its rows once (a second fill would fail on the primary key or double them)."""
    module = setup.split(".")[0]
    function, table, rows = SETUPS[setup]
    # The customer export's source is PostgreSQL (export_source); the rest live in the store.
    env = {"AIRFLOW_CONN_RESUMABLE_DEFAULT": store_uri, "AIRFLOW_CONN_EXPORT_SOURCE": dsn(pg_database)}
    on_store = table != "customers"
    pg = request.getfixturevalue("pg_params") if store_kind == "postgres" and on_store else pg_database
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter each, as two task processes are
    for round_ in range(ROUNDS):
        _drop(store_kind, store_uri, pg)
        barrier, results = spawn.Barrier(2), spawn.Queue()
        procs = [spawn.Process(target=_setup, args=(module, function, env, barrier, results)) for _ in range(2)]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=300) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        assert outcomes == ["ok", "ok"], f"round {round_}:\n" + "\n".join(outcomes)
        assert _count(store_kind, store_uri, pg, table, on_store) == rows, f"round {round_}"

