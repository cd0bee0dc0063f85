"""The example DAGs in ``dags/``: each file imports cleanly, and each DAG runs to success with
``dag.test()`` against PostgreSQL (checkpoints, and the customer export's source and warehouse);
the UI tour's first DAG (the readings import) on the embedded default alone, as a newcomer's
``make standalone`` runs it, its skip policy proven by the test kit.

The customer export is also interrupted mid-run, once as a deploy would (the run's signal fires
after two batches) and once as a crash would (an error after a batch's upsert, before its
checkpoint): after Airflow's retry the warehouse holds every customer exactly once, with the
source's values, and the batches attempt 1 had committed were not exported again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from devtools.postgres import Server, dsn
from support.examples import SCHEDULED
from support.paths import ROOT
from support.xcoms import xcom as support_xcom

DAGS_DIR = ROOT / "dags"
DAG_FILES = sorted(DAGS_DIR.glob("*.py"))
EXAMPLE_DAG_IDS = [
    "async_export", "chunked_example", "customer_export", "loan_report", "mapped_partitions", "partitioned_export",
    "partitioned_export_decorated", "readings_import", "taskflow_example",
]


# -- helpers --------------------------------------------------------------------------------------


def query(params: dict[str, Any], sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with closing(psycopg2.connect(**params)) as conn, conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall()


def checkpoint_rows(params: dict[str, Any], job_like: str) -> list[dict[str, Any]]:
    """The store's rows whose job matches the LIKE pattern, in job order, JSON columns decoded."""
    cols = ["job", "slot", "position", "state", "processed", "total", "status", "attempt", "attempts", "resumed_from"]
    rows = query(
        params, f"SELECT {', '.join(cols)} FROM resumable_checkpoints WHERE job LIKE %s ORDER BY job", (job_like,)
    )
    out = []
    for row in rows:
        item = dict(zip(cols, row, strict=False))
        for key in ("position", "state", "resumed_from"):
            item[key] = None if item[key] is None else json.loads(item[key])
        out.append(item)
    return out


def state_of(run: Any) -> str:
    return str(getattr(run, "state", "")).rsplit(".", 1)[-1].lower()


def task_instances(run: Any) -> dict[tuple[str, int], tuple[str, int]]:
    """(task_id, map_index) -> (state, try_number) of the run's task instances."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == run.dag_id, TaskInstance.run_id == run.run_id)
        ).all()
        return {(ti.task_id, ti.map_index): (str(ti.state).rsplit(".", 1)[-1].lower(), ti.try_number) for ti in tis}


def xcom(run: Any, task_id: str, *, key: str = "return_value", map_index: int = -1) -> Any:
    return support_xcom(run, task_id, key, map_index, required=True)


def assert_succeeded(run: Any) -> dict[tuple[str, int], tuple[str, int]]:
    tis = task_instances(run)
    assert state_of(run) == "success", f"{run.dag_id} ended {state_of(run)}: {tis}"
    assert tis and all(state == "success" for state, _ in tis.values()), tis
    return tis


@pytest.fixture
def pg_checkpoints(pg_database: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``resumable_default`` points at a fresh PostgreSQL database; ``export_source`` is unset.

    A database, not a schema (tests/conftest.py ``pg_params``): the customer export's source
    connection takes host, port, login, database and sslmode only, so it would not see a schema."""
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", dsn(pg_database))
    monkeypatch.delenv("AIRFLOW_CONN_EXPORT_SOURCE", raising=False)
    return pg_database


# -- every file imports -------------------------------------------------------------------------

_IMPORT_PROBE = r"""
import json, sys
try:
    from airflow.dag_processing.dagbag import DagBag  # Airflow 3.2 and later
except ImportError:
    from airflow.models.dagbag import DagBag  # Airflow 3.1

bag = DagBag(dag_folder=sys.argv[1])
files = {}
for dag in bag.dags.values():
    files.setdefault(dag.fileloc, []).append({
        "dag_id": dag.dag_id,
        "tags": sorted(dag.tags),
        "catchup": dag.catchup,
        "doc_md": bool((dag.doc_md or "").strip()),
        "tasks": len(dag.tasks),
        "scheduled": type(dag.timetable).__name__ != "NullTimetable",
    })
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "files": files}))
"""


def test_every_dag_file_imports_without_errors_or_a_database(tmp_path: Path) -> None:
    """Parse dags/ as the dag-processor does, in a plain environment: no connections, and a
    metadata database that cannot be reached (so touching a database at import time fails)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__", "LOANS_DB"))}
    env.update(
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS_DIR),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg2://nobody@127.0.0.1:1/unreachable",
    )
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, str(DAGS_DIR)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert DAG_FILES, "dags/ has no DAG files"
    for path in DAG_FILES:
        dags = report["files"].get(str(path))
        assert dags, f"{path.name} defines no DAG"
        for dag in dags:
            assert dag["tasks"] >= 1, dag
            assert {"resumable", "example"} <= set(dag["tags"]), dag
            assert dag["catchup"] is False, dag
            assert dag["doc_md"], dag
    found = sorted(d["dag_id"] for dags in report["files"].values() for d in dags)
    assert found == EXAMPLE_DAG_IDS, "a DAG added to dags/ needs a run test in this file"
    scheduled = sorted(d["dag_id"] for dags in report["files"].values() for d in dags if d["scheduled"])
    assert scheduled == sorted(SCHEDULED), ("support/examples.py's SCHEDULED lists the examples whose scheduled "
                                            "run the standalone test starts beside a manual one")


def test_snippet_markers_are_balanced() -> None:
    """Every ``# [START name]`` the README quotes has one ``# [END name]`` after it, names unique."""
    seen: dict[str, str] = {}
    for path in DAG_FILES:
        text = path.read_text()
        starts = re.findall(r"#\s*\[START (\w+)\]", text)
        ends = re.findall(r"#\s*\[END (\w+)\]", text)
        assert sorted(starts) == sorted(ends), path.name
        for name in starts:
            assert name not in seen, f"{name} in both {seen.get(name)} and {path.name}"
            seen[name] = path.name
            assert text.index(f"[START {name}]") < text.index(f"[END {name}]"), name
    assert {"customer_export_handler", "customer_export_dag", "mapped_partitions_dag", "taskflow_example_task",
            "chunked_example_dag", "loan_report_dag"} <= set(seen)


# -- every DAG runs -------------------------------------------------------------------------------


def test_loan_report_resumes_and_totals_right(
    run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOANS_DB", str(tmp_path / "loans.db"))
    run = run_dag("loan_report")
    tis = assert_succeeded(run)
    assert tis[("loan_report", -1)] == ("success", 2)  # cancelled at 40 %, resumed by the retry
    [row] = checkpoint_rows(pg_checkpoints, "loan_report.%")
    assert row["status"] == "done"
    assert (row["processed"], row["total"], row["resumed_from"]) == (30_000, 30_000, 12_000)
    assert row["state"] == {"total": 435_000}
    # The attempt history tells the whole story: who ran it, how each try ended, and from where.
    from airflow_resumable.core.stores import PostgresStore

    with PostgresStore(**pg_checkpoints).open() as s:
        history = s.listings.history(row["job"], row["slot"])
    assert [(h.attempt, h.outcome, h.stop_reason, h.processed_start, h.processed_end, h.resumed_from)
            for h in history] == [(1, "cancelled", "user", 0, 12_000, None), (2, "done", None, 12_000, 30_000, 12_000)]
    assert all(h.dag_id == "loan_report" and h.task_id == "loan_report" and h.run_id == run.run_id and h.host
               for h in history)


def test_chunked_example_totals_every_order(run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any]) -> None:
    run = run_dag("chunked_example")
    assert_succeeded(run)
    expected = sum((i * 7919) % 5_000 + 100 for i in range(1, 5_001))
    [row] = checkpoint_rows(pg_checkpoints, "chunked_example.%")
    assert row["job"] == "chunked_example.total_revenue"
    assert (row["status"], row["position"], row["processed"], row["total"]) == ("done", 5_000, 5_000, 5_000)
    assert row["state"] == {"revenue_cents": expected}
    summary = xcom(run, "total_revenue")
    assert (summary["status"], summary["processed"], summary["position"]) == ("done", 5_000, 5_000)
    assert xcom(run, "total_revenue", key="checkpoint")["state"] == {"revenue_cents": expected}


def test_async_export_sends_every_customer_once_50_requests_at_once(
        run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the API's sink in a file of the test's own
    sink = tmp_path / "sink.db"
    monkeypatch.setenv("ASYNC_EXPORT_SINK", str(sink))
    # When the DAG runs
    run = run_dag("async_export")
    # Then every customer was sent once, and the checkpoint is at the last one
    assert_succeeded(run)
    assert sqlite_rows(sink, "SELECT count(*), min(id), max(id), max(sent) FROM exported") == [(1_000, 1, 1_000, 1)]
    [row] = checkpoint_rows(pg_checkpoints, "async_export.%")
    # with its total from the start: the Checkpoint tab's percent and ETA
    assert (row["status"], row["position"], row["processed"], row["total"]) == ("done", 1_000, 1_000, 1_000)
    assert xcom(run, "export_customers") == {"exported": 1_000}


def test_taskflow_example_returns_the_sum(run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any]) -> None:
    run = run_dag("taskflow_example")
    assert_succeeded(run)
    expected = sum(i * i for i in range(1, 10_001))
    assert xcom(run, "sum_of_squares") == expected
    [row] = checkpoint_rows(pg_checkpoints, "taskflow_example.%")
    assert row["job"] == "taskflow_example.sum_of_squares"
    assert (row["status"], row["position"], row["processed"], row["total"]) == ("done", 10_000, 10_000, 10_000)
    assert row["state"] == {"sum": expected}
    assert row["slot"] == run.data_interval_start.isoformat()


def test_mapped_partitions_keeps_one_checkpoint_per_partition(
    run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any]
) -> None:
    run = run_dag("mapped_partitions")
    tis = assert_succeeded(run)
    regions = {"north": 1_200, "south": 800, "east": 500, "west": 1_500}
    assert sorted(i for (task_id, i) in tis if task_id == "sum_partition") == [0, 1, 2, 3]

    def amount(region: str) -> int:
        return sum((i * 37 + len(region) * 101) % 10_000 for i in range(1, regions[region] + 1))

    rows = checkpoint_rows(pg_checkpoints, "mapped_partitions.%")
    assert [r["job"] for r in rows] == [f"mapped_partitions.sum_partition[{i}]" for i in range(4)]
    assert {r["slot"] for r in rows} == {run.data_interval_start.isoformat()}
    for index, (row, region) in enumerate(zip(rows, regions, strict=False)):
        assert (row["status"], row["processed"], row["total"], row["position"]) == (
            "done", regions[region], regions[region], regions[region],
        ), row
        assert row["state"] == {"region": region, "amount_cents": amount(region)}
        assert xcom(run, "sum_partition", map_index=index) == {
            "region": region, "orders": regions[region], "amount_cents": amount(region),
        }
    assert xcom(run, "combine") == sum(amount(r) for r in regions)


def test_mapped_partitions_retry_resumes_only_the_failed_partition(
    run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
    load_dag: Callable[[str], Any],
) -> None:
    """Partition 1 (south) fails once after its second checkpoint (order 500): only that mapped
    instance is retried, and it resumes after order 500 with the sum so far."""
    module_globals = load_dag("mapped_partitions").get_task("list_partitions").python_callable.__globals__
    real = module_globals["order_amount"]
    failed: list[int] = []

    def order_amount(region: str, order_id: int) -> int:
        if region == "south" and order_id == 501 and not failed:
            failed.append(order_id)
            raise RuntimeError("the partition's worker died (test)")
        return real(region, order_id)

    monkeypatch.setitem(module_globals, "order_amount", order_amount)
    run = run_dag("mapped_partitions")
    tis = assert_succeeded(run)
    assert failed == [501]
    assert [tis[("sum_partition", i)][1] for i in range(4)] == [1, 2, 1, 1]
    rows = checkpoint_rows(pg_checkpoints, "mapped_partitions.%")
    assert [(r["attempts"], r["resumed_from"]) for r in rows] == [(1, None), (2, 500), (1, None), (1, None)]
    south = sum((i * 37 + len("south") * 101) % 10_000 for i in range(1, 801))
    assert rows[1]["state"] == {"region": "south", "amount_cents": south}


@pytest.mark.parametrize("dag_id", ["partitioned_export", "partitioned_export_decorated"])
def test_partitioned_export_exports_every_order_once_in_four_partitions(
    run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any], dag_id: str
) -> None:
    run = run_dag(dag_id)
    tis = assert_succeeded(run)
    assert sorted(i for t, i in tis if t == "export_orders.partition") == [0, 1, 2, 3]
    summary = xcom(run, "export_orders.summary")
    assert (summary["partitions"], summary["done"], summary["failed"]) == (4, 4, [])
    assert summary["processed"] == summary["total"] == 2_000
    exported = query(pg_checkpoints, "SELECT partition_job, count(*) FROM orders_export GROUP BY 1 ORDER BY 1")
    assert [job for job, _ in exported] == [f"{dag_id}.export_orders[{i}]" for i in range(4)]
    assert sorted(n for _, n in exported) == [500, 500, 500, 500]
    assert query(pg_checkpoints, "SELECT count(*), count(DISTINCT id) FROM orders_export") == [(2_000, 2_000)]


# -- the customer export --------------------------------------------------------------------------

CUSTOMERS = 1_000
BATCH = 200


def warehouse(params: dict[str, Any]) -> list[tuple[Any, ...]]:
    return query(params, "SELECT id, name, email, country, export_attempt FROM warehouse_customers ORDER BY id")


def source(params: dict[str, Any]) -> list[tuple[Any, ...]]:
    return query(params, "SELECT id, name, email, country FROM customers ORDER BY id")


def assert_exported_exactly_once(warehouse_db: dict[str, Any], source_db: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = warehouse(warehouse_db)
    customers = source(source_db)
    assert len(customers) == CUSTOMERS
    assert [r[:4] for r in rows] == customers  # every customer, once, with the source's values
    return rows


def test_customer_export_copies_every_customer(run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any]) -> None:
    """Without ``export_source`` the customers come from the checkpoint database."""
    run = run_dag("customer_export")
    tis = assert_succeeded(run)
    assert tis[("export_customers", -1)] == ("success", 1)
    rows = assert_exported_exactly_once(pg_checkpoints, pg_checkpoints)
    assert {r[4] for r in rows} == {1}
    [row] = checkpoint_rows(pg_checkpoints, "customer_export.%")
    assert row["job"] == "customer_export.export_customers"
    assert (row["status"], row["position"][1], row["processed"], row["total"]) == ("done", CUSTOMERS, CUSTOMERS, CUSTOMERS)
    assert xcom(run, "export_customers")["status"] == "done"


def test_customer_export_sends_only_what_changed_since_the_previous_hour(
    run_dag: Callable[..., Any], pg_checkpoints: dict[str, Any]
) -> None:
    """Hour 1 exports every customer; three customers change; hour 2 (its ``ctx.previous`` is hour
    1) exports those three only; hour 3, with nothing changed, exports nothing and ends where hour 2 did."""
    from datetime import datetime, timezone

    hours = [datetime(2026, 3, 1, h, tzinfo=timezone.utc) for h in (1, 2, 3)]
    assert_succeeded(run_dag("customer_export", logical_date=hours[0]))
    assert len(warehouse(pg_checkpoints)) == CUSTOMERS
    changed = (5, 500, 999)
    with closing(psycopg2.connect(**pg_checkpoints)) as conn, conn, conn.cursor() as cur:
        cur.execute("UPDATE customers SET name = name || ' (moved)', updated_at = now() WHERE id = ANY(%s)",
                    (list(changed),))
    assert_succeeded(run_dag("customer_export", logical_date=hours[1]))
    assert_succeeded(run_dag("customer_export", logical_date=hours[2]))
    rows = checkpoint_rows(pg_checkpoints, "customer_export.%")
    by_slot = {r["slot"]: r for r in rows}
    second, third = by_slot[hours[1].isoformat()], by_slot[hours[2].isoformat()]
    assert (second["processed"], second["total"], second["position"][1]) == (3, 3, 999)
    assert (third["processed"], third["position"]) == (0, second["position"])
    exported = query(pg_checkpoints, "SELECT id, name, export_slot FROM warehouse_customers WHERE export_slot = %s "
                     "ORDER BY id", (hours[1].isoformat(),))
    assert [(r[0], r[1].endswith("(moved)")) for r in exported] == [(i, True) for i in changed]


@pytest.fixture
def separate_source(
    pg_server: Server, pg_checkpoints: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """``export_source`` points at its own database, apart from the checkpoints and the warehouse."""
    params = pg_server.create_database(prefix="resumable_source")
    monkeypatch.setenv("AIRFLOW_CONN_EXPORT_SOURCE", dsn(params))
    return params


@pytest.fixture
def export_batch_hook(monkeypatch: pytest.MonkeyPatch,
                      load_dag: Callable[[str], Any]) -> Iterator[Callable[[Callable[..., None]], None]]:
    """Replace ``export_batch`` in the DAG file's module with ``wrap(real)``, for this test only."""
    handler = load_dag("customer_export").get_task("export_customers").handler
    module_globals = handler.__globals__

    def install(wrap: Callable[..., Any]) -> None:
        monkeypatch.setitem(module_globals, "export_batch", wrap(module_globals["export_batch"]))

    yield install


def test_customer_export_interrupted_like_a_deploy_resumes_after_the_last_batch(
    run_dag: Callable[..., Any],
    pg_checkpoints: dict[str, Any],
    separate_source: dict[str, Any],
    export_batch_hook: Callable[..., None],
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Attempt 1's signal fires after two batches (as on a worker shutdown): it stops at that
    batch boundary; the retry continues after customer 400 and exports the rest."""
    stopped_after = 2
    calls: list[tuple[int, int]] = []

    def wrap(real: Callable[..., None]) -> Callable[..., None]:
        def export_batch(ctx: Any, batch: Any) -> None:
            real(ctx, batch)
            calls.append((ctx.attempt, batch[0][0]))
            if ctx.attempt == 1 and len(calls) == stopped_after:
                ctx.signal.cancel("shutdown", "the worker is shutting down (test)")

        return export_batch

    export_batch_hook(wrap)
    run = run_dag("customer_export")
    tis = assert_succeeded(run)
    assert tis[("export_customers", -1)] == ("success", 2)
    cut = stopped_after * BATCH
    # Attempt 1 exported its two batches; attempt 2 started after them, not from the beginning.
    assert calls == [(1, 1), (1, 201)] + [(2, first) for first in range(cut + 1, CUSTOMERS + 1, BATCH)]
    rows = assert_exported_exactly_once(pg_checkpoints, separate_source)
    assert [r[4] for r in rows] == [1] * cut + [2] * (CUSTOMERS - cut)
    [row] = checkpoint_rows(pg_checkpoints, "customer_export.%")
    assert (row["status"], row["processed"], row["attempt"], row["resumed_from"][1]) == ("done", CUSTOMERS, 2, cut)
    # The source database got no warehouse table, the warehouse database no customers.
    assert query(separate_source, "SELECT to_regclass('warehouse_customers')") == [(None,)]
    assert query(pg_checkpoints, "SELECT to_regclass('customers')") == [(None,)]
    out, err = capfd.readouterr()
    assert f"attempt 2, continuing after customer {cut}" in out + err


def test_customer_export_crash_mid_batch_loses_the_batch_with_its_checkpoint(
    run_dag: Callable[..., Any],
    pg_checkpoints: dict[str, Any],
    separate_source: dict[str, Any],
    export_batch_hook: Callable[..., None],
) -> None:
    """Attempt 1 fails after upserting its third batch but before that batch's checkpoint. The
    batch's rows were in the checkpoint's transaction, so they are gone with it: the retry finds
    exactly the 400 customers of the two checkpointed batches, and exports the rest once."""
    seen_by_retry: list[int] = []

    def wrap(real: Callable[..., None]) -> Callable[..., None]:
        def export_batch(ctx: Any, batch: Any) -> None:
            if ctx.attempt == 2 and not seen_by_retry:
                seen_by_retry.append(query(pg_checkpoints, "SELECT count(*) FROM warehouse_customers")[0][0])
            real(ctx, batch)
            if ctx.attempt == 1 and batch[0][0] == 2 * BATCH + 1:
                raise RuntimeError("the worker died mid-batch (test)")

        return export_batch

    export_batch_hook(wrap)
    run = run_dag("customer_export")
    tis = assert_succeeded(run)
    assert tis[("export_customers", -1)] == ("success", 2)
    assert seen_by_retry == [2 * BATCH]
    rows = assert_exported_exactly_once(pg_checkpoints, separate_source)
    assert [r[4] for r in rows] == [1] * (2 * BATCH) + [2] * (CUSTOMERS - 2 * BATCH)
    [row] = checkpoint_rows(pg_checkpoints, "customer_export.%")
    assert (row["status"], row["processed"], row["resumed_from"][1]) == ("done", CUSTOMERS, 2 * BATCH)


def test_customer_export_with_sqlite_checkpoints_keeps_the_warehouse_beside_them(
    run_dag: Callable[..., Any], pg_database: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded checkpoint store works too: customers come from PostgreSQL (``export_source``),
    the warehouse table is written through ``ctx.transaction()`` into the SQLite file."""
    import sqlite3

    path = tmp_path / "checkpoints.db"
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{path}")
    monkeypatch.setenv("AIRFLOW_CONN_EXPORT_SOURCE", dsn(pg_database))
    run = run_dag("customer_export")
    assert_succeeded(run)
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT id, name, email, country FROM warehouse_customers ORDER BY id").fetchall()
        status = db.execute("SELECT status, processed FROM resumable_checkpoints").fetchall()
    assert rows == source(pg_database)
    assert status == [("done", CUSTOMERS)]


def test_customer_export_without_a_postgresql_source_fails_with_a_hint(
    run_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """With SQLite checkpoints and no ``export_source`` there is no PostgreSQL to read customers
    from: the run fails at once (no retries spent) and says which connection to create."""
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{tmp_path / 'checkpoints.db'}")
    monkeypatch.delenv("AIRFLOW_CONN_EXPORT_SOURCE", raising=False)
    run = run_dag("customer_export")
    assert state_of(run) == "failed"
    tis = task_instances(run)
    assert tis[("prepare_source", -1)] == ("failed", 1)
    assert tis[("export_customers", -1)][0] == "upstream_failed"
    out, err = capfd.readouterr()
    assert "Create the connection 'export_source'" in out + err


# -- the UI tour's readings import: the embedded default alone ------------------------------------

UI_PAGE = ROOT / "docs" / "how-to" / "ui.md"
READINGS_JOB = "readings_import.import_readings"


@pytest.fixture
def embedded_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Only the embedded default is configured: ``resumable_default`` is a SQLite file, no other
    connection (no ``export_source``), no PostgreSQL; ``make standalone``'s default store."""
    for key in [k for k in os.environ if k.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))]:
        monkeypatch.delenv(key)
    path = tmp_path / "checkpoints.db"
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{path}")
    return path


def sqlite_rows(path: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import sqlite3

    with closing(sqlite3.connect(path)) as db:
        return db.execute(sql, args).fetchall()


def first_tour_dag() -> str:
    """The DAG the UI page's walkthrough starts with: the first example DAG id its steps name."""
    text = UI_PAGE.read_text()
    steps = text[text.index("## Try it in the Airflow UI"):]
    named = [m.group(1) for m in re.finditer(r"`(\w+)`", steps) if m.group(1) in EXAMPLE_DAG_IDS]
    assert named, "the UI page's walkthrough names no example DAG"
    return named[0]


def test_the_ui_pages_first_dag_succeeds_with_only_the_embedded_default_configured(
    run_dag: Callable[..., Any], embedded_default: Path, load_dag: Callable[[str], Any]
) -> None:
    """Given no PostgreSQL and no connection but the embedded default, when the UI tour's first DAG
    runs (fast pace), then it succeeds: every good reading imported once, the four readings in °F
    in the dead letters with their error, not the task's failure; and its default pace lasts minutes."""
    dag_id = first_tour_dag()
    assert dag_id == "readings_import"
    dag = load_dag(dag_id)
    module = dag.get_task("import_readings").process.__globals__
    assert 120 <= module["READING_COUNT"] * dag.params["seconds_per_reading"] <= 600  # minutes to watch

    run = run_dag(dag_id, conf={"seconds_per_reading": 0})
    tis = assert_succeeded(run)
    assert tis[("import_readings", -1)] == ("success", 1)
    bad = module["FAHRENHEIT_IDS"]
    assert len(bad) == 4
    imported = sqlite_rows(embedded_default, "SELECT id FROM imported_readings ORDER BY id")
    assert [r[0] for r in imported] == [i for i in range(1, 601) if i not in bad]
    [(status, processed, total, state)] = sqlite_rows(
        embedded_default, "SELECT status, processed, total, state FROM resumable_checkpoints WHERE job = ?",
        (READINGS_JOB,))
    assert (status, processed, total) == ("done", 600, 600)
    assert json.loads(state)["count"] == 596
    letters = sqlite_rows(embedded_default, "SELECT position, status, error FROM resumable_dead_letters "
                          "WHERE job = ? ORDER BY id", (READINGS_JOB,))
    assert [(json.loads(p), s) for p, s, _ in letters] == [(i, "skipped") for i in bad]
    assert all("readings_import_fahrenheit" in e for _, _, e in letters)
    summary = xcom(run, "import_readings")
    assert summary["skipped"] == 4


def test_readings_import_retry_of_skipped_items_replays_them_once_fahrenheit_is_allowed(
    run_dag: Callable[..., Any], embedded_default: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tour's skip policy step: Retry skipped items replays them through the task's own code;
    refused again, they stay skipped with the new try's error; with the Variable set, the next retry
    imports them and marks them replayed (nothing else is imported again)."""
    from datetime import datetime, timezone

    from airflow_resumable import control

    when = datetime(2026, 3, 1, 9, tzinfo=timezone.utc)
    conf = {"seconds_per_reading": 0}
    assert_succeeded(run_dag("readings_import", conf=conf, logical_date=when))
    [(slot,)] = sqlite_rows(embedded_default, "SELECT slot FROM resumable_checkpoints WHERE job = ?", (READINGS_JOB,))

    def letters() -> list[tuple[str, int]]:
        return [(s, a) for s, a in sqlite_rows(embedded_default, "SELECT status, attempt FROM resumable_dead_letters "
                                                "WHERE job = ? ORDER BY id", (READINGS_JOB,))]

    # When a person asks to retry them, with °F still refused: they are replayed and refused again
    control.retry_skipped(READINGS_JOB, slot, by="alice", clear=False)
    assert [s for s, _ in letters()] == ["retry_requested"] * 4
    assert_succeeded(run_dag("readings_import", conf=conf, logical_date=when))
    assert [s for s, _ in letters()] == ["skipped"] * 4
    assert len(sqlite_rows(embedded_default, "SELECT id FROM imported_readings")) == 596
    # When the Variable allows °F and they retry again: imported, replayed
    monkeypatch.setenv("AIRFLOW_VAR_READINGS_IMPORT_FAHRENHEIT", "true")
    control.retry_skipped(READINGS_JOB, slot, by="alice", clear=False)
    assert_succeeded(run_dag("readings_import", conf=conf, logical_date=when))
    assert [s for s, _ in letters()] == ["replayed"] * 4
    rows = dict(sqlite_rows(embedded_default, "SELECT id, celsius_tenths FROM imported_readings"))
    assert sorted(rows) == list(range(1, 601))
    assert all(150 <= rows[i] < 350 for i in (73, 222, 371, 520)), rows  # converted from °F
    [(state,)] = sqlite_rows(embedded_default, "SELECT state FROM resumable_checkpoints WHERE job = ?",
                             (READINGS_JOB,))
    assert json.loads(state)["count"] == 600


def test_readings_import_with_its_skip_policy_is_resumable_by_the_test_kit(airflow_home: Path) -> None:
    """The test kit interrupts the import at checkpoints around each refused reading (every kind of
    interruption): the same readings imported, the same state, and each refused reading in the dead
    letters once, as in an uninterrupted run."""
    import functools
    import importlib
    import sqlite3

    from airflow_resumable.testing import ALL_INTERRUPTIONS, check_chunked

    # Imported by its name from dags/ (not loaded as a DAG file under a private name): the kit's
    # process_death resumes in a new process that imports the handler again by its module path.
    dags = str(ROOT / "dags")
    if dags not in sys.path:
        sys.path.append(dags)
    sys.modules.pop("readings_import", None)
    task = importlib.import_module("readings_import").dag.get_task("import_readings")
    module = task.process.__globals__

    def snapshot(store: Any) -> Any:
        with closing(sqlite3.connect(store.path)) as db:
            readings = db.execute("SELECT id, sensor, celsius_tenths FROM imported_readings ORDER BY id").fetchall()
            letters = db.execute("SELECT position, status, error FROM resumable_dead_letters").fetchall()
        return readings, sorted(letters, key=lambda letter: json.loads(letter[0]))

    # The checkpoints just before and just after each refused reading's chunk, and the first and last.
    around = sorted({1, 60} | {(i - 1) // module["CHUNK"] + k for i in module["FAHRENHEIT_IDS"] for k in (0, 1, 2)})
    report = check_chunked(
        task.read, functools.partial(task.process, seconds_per_reading=0, accept_fahrenheit="false"),
        chunk_size=task.chunk_size,
        chunked={"position": task.position, "total": task.total, "skip_on": task.skip_on,
                 "skip_limit": task.skip_limit},
        snapshot=snapshot, points=around,
    )
    report.assert_ok()
    readings, letters = report.snapshot  # the uninterrupted run's, which every trial matched
    assert len(readings) == 596
    assert [(json.loads(p), s) for p, s, _ in letters] == [(i, "skipped") for i in module["FAHRENHEIT_IDS"]]
    assert len(report.trials) == len(around) * len(ALL_INTERRUPTIONS), report.summary()


def test_readings_import_logs_its_rate_and_eta_as_the_tutorial_says(
    run_dag: Callable[..., Any], embedded_default: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The tutorial sends a reader who wants rate and ETA in a task log to this DAG: at a pace slow
    enough for two chunks over a second, its progress lines have them (every 5 s)."""
    run = run_dag("readings_import", conf={"seconds_per_reading": 0.012})  # about 7 s
    assert_succeeded(run)
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if "progress " in line and "rate=" in line and "eta=" in line]
    assert lines, (out + err)[-3000:]
    assert re.search(r"progress \d+% processed=\d+/600 rate=\d+/s eta=\d", lines[0]), lines[0]
