"""The test kit (airflow_resumable.testing): each example DAG's handler proves itself with it, and a
handler that is not resumable is caught, named with the interruption, the checkpoint and the
position where it first goes wrong."""

from __future__ import annotations

import functools
import importlib
import operator
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from airflow_resumable.core import Options
from airflow_resumable.core.attempt.runner import Attempt
from airflow_resumable.core.attempt.skip_policy import replay, request_retry
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from airflow_resumable.core.work.chunk_loop import chunk_loop
from airflow_resumable.testing import (
    ALL_INTERRUPTIONS,
    IN_PROCESS_INTERRUPTIONS,
    Interruption,
    NotResumable,
    check_chunked,
    check_partitioned,
    check_resumable,
)
from airflow_resumable.testing.splits import SplitStep
from support.paths import ROOT


def example(name: str) -> Any:
    """An example DAG's module, imported anew from dags/ by its name (as a new process of the kit's
    process_death imports it again: dags/ is on sys.path)."""
    dags = str(ROOT / "dags")
    if dags not in sys.path:
        sys.path.append(dags)
    sys.modules.pop(name, None)  # its module-level settings read the environment as the test set it
    return importlib.import_module(name)


def test_the_chunked_example_is_resumable_at_every_checkpoint_under_every_interruption(airflow_home: Path) -> None:
    m = example("chunked_example")
    report = check_chunked(m.read_orders, m.add_revenue, chunk_size=500,
                           chunked={"position": operator.itemgetter("id"), "total": m.ORDER_COUNT}).assert_ok()
    # 5,000 orders in chunks of 500: ten checkpoints, each interrupted by each kind in turn
    assert report.checkpoints == 10 and len(report.trials) == 10 * len(ALL_INTERRUPTIONS)
    assert all(t.struck for t in report.trials)
    assert report.state == {"revenue_cents": sum(m.order(i)["amount_cents"] for i in range(1, m.ORDER_COUNT + 1))}


def test_the_loan_report_with_its_keyset_reader_and_its_own_cancel_is_resumable(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOANS_DB", str(tmp_path / "loans.db"))
    m = example("loan_report")
    report = check_chunked(m.read_loans, m.add_to_report, chunk_size=m.CHUNK,
                           chunked={"total": m.count_loans},
                           points=[1, 4, 5, 10]).assert_ok()
    # the lesson's report: 14.5 days a loan on average; its first attempt cancels itself at 40 %
    assert report.state == {"total": 435000} and report.checkpoints >= 10


def test_the_mapped_partitions_handler_is_resumable(airflow_home: Path) -> None:
    m = example("mapped_partitions")
    handler = functools.partial(m.sum_partition, region="south", orders=m.REGIONS["south"])
    report = check_resumable(handler, name="sum_partition(south)").assert_ok()
    assert report.result == {"region": "south", "orders": 800,
                             "amount_cents": sum(m.order_amount("south", i) for i in range(1, 801))}


def test_the_taskflow_example_is_resumable_at_every_checkpoint_under_every_interruption(airflow_home: Path) -> None:
    m = example("taskflow_example")
    bounds = m.pick_range.function()
    handler = functools.partial(m.sum_of_squares.function, bounds=bounds)
    report = check_resumable(handler, name="sum_of_squares").assert_ok()
    # 10,000 numbers in chunks of 1,000: ten checkpoints, each interrupted by each kind in turn
    assert report.checkpoints == 10 and len(report.trials) == 10 * len(ALL_INTERRUPTIONS)
    assert all(t.struck for t in report.trials)
    assert report.result == sum(i * i for i in range(1, 10_001)) and report.state == {"sum": report.result}


def partition_task(dag: Any) -> dict[str, Any]:
    """What a partitioned job's mapped partition task runs: its reader, its chunk function (with
    the decorator's arguments), its chunk size, and the planning task's partition count."""
    partial = dag.task_dict["export_orders.partition"].partial_kwargs
    process = partial["process"]
    if partial.get("handler_kwargs"):
        process = functools.partial(process, **partial["handler_kwargs"])
    return {"read": partial["read"], "process": process, "chunk_size": partial["chunk_size"],
            "partitions": dag.task_dict["export_orders.plan"].partitions}


def exported(store: Store) -> list[tuple[Any, ...]]:
    """The partitioned export's sink (without the partition that wrote each row: the kit's job)."""
    with store.open() as s:
        return [tuple(r) for r in s.execute("SELECT id, placed_on, amount_cents FROM orders_export ORDER BY id")]


def empty_export(store: Store) -> None:
    with store.open(autocommit=True) as s:
        s.execute("DELETE FROM orders_export")


def test_each_partition_of_the_partitioned_export_is_resumable_on_both_stores(
    airflow_home: Path, checkpoints: Store, store_kind: str
) -> None:
    """Split as the planning task splits a run (4 ranges of the key (placed_on, id), ties
    included), each partition runs its range through the kit, interrupted at each of its
    checkpoints by each kind: its upserts commit with its checkpoint, so the sink is the same.
    On PostgreSQL the first and the last partition (the ranges open at one end) are enough: the
    partitions differ only in their bounds, the stores in the SQL every partition runs."""
    m = example("partitioned_export")
    m.prepare_orders.function()  # the orders and the export table, in the checkpoint database
    only = None if store_kind == "sqlite" else [0, 3]
    report = check_partitioned(**partition_task(m.dag), only=only, store=checkpoints, snapshot=exported,
                               reset=empty_export, name="export_orders").assert_ok()
    assert (report.plan.partitions, report.plan.rows, report.empty) == (4, m.ORDER_COUNT, [])
    # 500 orders a partition in chunks of 100: five checkpoints each, each interrupted by each kind,
    # and asked for a split at each, each step of the split struck (at the last checkpoint nothing
    # is left to give away: the split is declined there)
    assert {i: r.checkpoints for i, r in report.reports.items()} == {i: 5 for i in only or range(4)}
    assert all(len(r.trials) == 5 * (len(ALL_INTERRUPTIONS) + len(SplitStep)) for r in report.reports.values())
    assert all(t.struck for r in report.reports.values() for t in r.trials
               if not isinstance(t.interruption, SplitStep) or t.point < 5)
    assert not any(t.struck for r in report.reports.values() for t in r.trials
                   if isinstance(t.interruption, SplitStep) and t.point == 5)
    # the partitions' uninterrupted runs export every order of their ranges once: all of them together
    ids = sorted(row[0] for r in report.reports.values() for row in r.snapshot)
    assert len(ids) == len(set(ids)) == 500 * len(report.reports)
    if only is None:
        assert ids == list(range(1, m.ORDER_COUNT + 1))


@pytest.mark.one_store("the decorator's chunk function, not the store: the test above runs both", kind="sqlite")
def test_the_decorated_partitioned_export_proves_one_partition_with_the_kit(
    airflow_home: Path, checkpoints: Store
) -> None:
    m = example("partitioned_export")
    m.prepare_orders.function()
    report = check_partitioned(**partition_task(m.decorated_dag), only=[2], store=checkpoints, snapshot=exported,
                               reset=empty_export, name="export_orders").assert_ok()
    assert list(report.reports) == [2] and len(report.reports[2].trials) == 5 * (len(ALL_INTERRUPTIONS) + len(SplitStep))
    assert "export_orders: 2000 rows in 4 partitions, 1 checked" in report.summary()


def test_a_partition_that_is_not_idempotent_is_caught_and_named(airflow_home: Path, checkpoints: Store) -> None:
    m = example("partitioned_export")
    m.prepare_orders.function()
    task = partition_task(m.dag)
    seen: list[int] = []

    def appends(ctx: Any, batch: list[tuple[Any, ...]]) -> None:  # outside the transaction: not idempotent
        seen.extend(row[0] for row in batch)

    report = check_partitioned(task["read"], appends, partitions=task["partitions"], chunk_size=task["chunk_size"],
                               only=[1], snapshot=lambda: sorted(seen), reset=seen.clear, name="appends",
                               interruptions=[Interruption.CRASH_BEFORE_CHECKPOINT])
    # the crashes before a checkpoint, and a split's taker taken over (its fenced-out chunk runs again)
    assert not report.ok and {i for i, _ in report.failures} == {1}
    assert {(t.interruption, t.point) for _, t in report.failures} == {
        *((Interruption.CRASH_BEFORE_CHECKPOINT, p) for p in range(1, 6)),
        *((SplitStep.TAKER_TAKEN_OVER, p) for p in range(1, 5))}
    with pytest.raises(NotResumable, match=r"^partition 1 of 4: appends \(partition 1 of 4\) is not resumable: "
                                           r"crash_before_checkpoint at checkpoint 1"):
        report.assert_ok()


def warehouse(store: Store) -> list[tuple[Any, ...]]:
    """The export's sink, without the attempt that wrote each row (it differs by design)."""
    with store.open() as s:
        return [tuple(r) for r in s.execute("SELECT id, name, email, country FROM warehouse_customers ORDER BY id")]


def test_the_customer_export_writing_through_its_transaction_is_resumable_on_both_stores(
    airflow_home: Path, store: Store, pg_database: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export upserts each batch through ctx.transaction() into the checkpoint store: the rows
    commit with their checkpoint, so every interruption leaves the same warehouse."""
    monkeypatch.setenv("AIRFLOW_CONN_EXPORT_SOURCE", _uri(pg_database))
    m = example("customer_export")
    count = m.prepare_customers()

    def reset(s: Store) -> None:
        with s.open(autocommit=True) as session:
            session.execute("DROP TABLE IF EXISTS warehouse_customers")

    handler = functools.partial(m.export_customers)
    report = check_resumable(handler, store=lambda _: store, reset=reset, snapshot=warehouse,
                             points=[1, 2, 3], name="export_customers").assert_ok()
    assert len(report.snapshot) == count and report.checkpoints >= 3


def _uri(params: dict[str, Any]) -> str:
    return (f"postgresql://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}:"
            f"{params.get('port', 5432)}/{params['dbname']}")


# -- what the kit catches -------------------------------------------------------------------------


SINK: list[int] = []


def appends_outside_the_transaction(ctx: Any) -> int:
    """Not idempotent: a crash before its checkpoint appends its chunk a second time."""
    i = ctx.position or 0
    while i < 20:
        SINK.extend(range(i, i + 5))
        i += 5
        ctx.checkpoint(i, processed=i)
    return len(SINK)


def test_a_handler_whose_chunks_are_not_idempotent_is_caught_at_the_first_point_with_the_difference() -> None:
    report = check_resumable(appends_outside_the_transaction, snapshot=lambda: sorted(SINK), reset=SINK.clear)
    assert not report.ok
    with pytest.raises(NotResumable) as err:
        report.assert_ok()
    text = str(err.value)
    assert text.startswith("appends_outside_the_transaction is not resumable: crash_before_checkpoint at "
                           "checkpoint 1 (position 5)"), text
    assert "25 items instead of 20" in text and "repeated: 0, 1, 2" in text and "ctx.transaction()" in text
    # a cancel or a pause stops after the checkpoint: nothing repeats, and the kit says so too
    by_kind = {k: [t for t in report.trials if t.interruption is k] for k in Interruption}
    assert all(not t.differences for t in by_kind[Interruption.CANCEL] + by_kind[Interruption.PAUSE_RESUME])
    assert all(t.differences for t in by_kind[Interruption.CRASH_BEFORE_CHECKPOINT])


def keeps_progress_in_a_local(ctx: Any) -> dict[str, int]:
    """Wrong: the running total lives in a local variable, not in ctx.state, so a resumed attempt
    starts it from zero."""
    i, total = ctx.position or 0, 0
    while i < 30:
        total += sum(range(i, i + 10))
        i += 10
        ctx.checkpoint(i, processed=i)
    return {"total": total}


def test_progress_kept_outside_the_checkpoint_is_caught_in_the_result() -> None:
    report = check_resumable(keeps_progress_in_a_local, interruptions=[Interruption.CRASH_AFTER_CHECKPOINT])
    first = report.failures[0]
    assert (first.point, first.position) == (1, 10)
    assert first.differences == ["the result differs ('total': expected 435, got 390)"]


def test_a_pipelined_checkpoint_lost_in_flight_repeats_its_chunk_and_an_idempotent_sink_does_not_care() -> None:
    rows: dict[int, int] = {}

    def upserts(ctx: Any) -> int:
        i = ctx.position or 0
        while i < 40:
            for j in range(i, i + 10):
                rows[j] = j * j  # an upsert by key: idempotent
            i += 10
            ctx.checkpoint(i, processed=i)
        return i

    report = check_resumable(upserts, snapshot=lambda: dict(rows), reset=rows.clear,
                             options=Options(pipeline_checkpoints=True),
                             interruptions=[Interruption.PIPELINED_WRITE_LOST, Interruption.LEASE_LOST]).assert_ok()
    assert len(report.trials) == 8 and all(t.struck and t.attempts == 2 for t in report.trials)


def test_random_points_are_reproducible_from_the_seed() -> None:
    a = check_resumable(keeps_progress_in_a_local, points="every", seed=7, samples=2,
                        interruptions=[Interruption.CANCEL])
    b = check_resumable(keeps_progress_in_a_local, points="every", seed=7, samples=2,
                        interruptions=[Interruption.CANCEL])
    assert [t.point for t in a.trials] == [t.point for t in b.trials] and len(a.trials) == 2


def test_a_handler_that_never_checkpoints_is_not_called_resumable() -> None:
    report = check_resumable(lambda ctx: 42, name="one_big_chunk")
    assert (report.checkpoints, report.trials, report.result) == (0, [], 42)
    with pytest.raises(NotResumable, match="one_big_chunk made no checkpoint .* Call ctx.checkpoint"):
        report.assert_ok()


def test_points_outside_the_run_are_refused_with_the_range() -> None:
    with pytest.raises(ValueError, match=r"points \[7\] are outside the run's checkpoints 1..3"):
        check_resumable(keeps_progress_in_a_local, points=[1, 7])


@pytest.mark.parametrize("asked", [{"points": []}, {"points": ()}, {"interruptions": []}, {"samples": 0}],
                         ids=["no_points", "no_points_tuple", "no_kinds", "no_samples"])
def test_a_check_that_would_interrupt_no_run_is_refused_not_passed(asked: dict[str, Any]) -> None:
    # A check that tries nothing proves nothing: refused before it runs, naming the argument
    with pytest.raises(ValueError, match="keeps_progress_in_a_local: (points names no checkpoint|interruptions names "
                       "no kind|samples must be)"):
        check_resumable(keeps_progress_in_a_local, **asked)


def test_a_report_without_an_interrupted_run_does_not_pass() -> None:
    from airflow_resumable.testing.report import Report

    report = Report(name="h", checkpoints=3, positions=[1, 2, 3], result=None, state={}, snapshot=None, trials=[])
    with pytest.raises(NotResumable, match="h: no interrupted run was tried, so nothing was proven"):
        report.assert_ok()


def test_check_partitioned_refuses_partitions_it_does_not_have_and_does_not_pass_having_checked_none(
    tmp_path: Path,
) -> None:
    import sqlite3

    from airflow_resumable.core.readers import KeysetReader

    db = tmp_path / "source.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE ids (id INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO ids VALUES (?)", [(i,) for i in range(1, 4)])
    read = KeysetReader(connect=functools.partial(sqlite3.connect, str(db)), table="ids", key="id")
    # Given 3 rows in 4 partitions (partition 0 empty): a partition the plan does not have is refused
    with pytest.raises(ValueError, match=r"only= must name partitions of the plan \(0..3\), got \[7\]"):
        check_partitioned(read, sum_ids, partitions=4, chunk_size=1, only=[7], interruptions=["cancel"])
    # and a check of the empty partition alone proves nothing: it does not pass
    report = check_partitioned(read, sum_ids, partitions=4, chunk_size=1, only=[0], interruptions=["cancel"])
    assert (report.reports, report.empty) == ({}, [0])
    with pytest.raises(NotResumable, match="no partition was checked"):
        report.assert_ok()


def sum_ids(ctx: Any, batch: list[Any]) -> None:
    ctx.state["sum"] = ctx.state.get("sum", 0) + sum(row[0] for row in batch)


# -- the pytest plugin, as a user's test suite meets it ------------------------------------------


def test_the_pytest_plugin_is_registered_and_its_fixtures_fail_a_non_idempotent_handler(tmp_path: Path) -> None:
    (tmp_path / "test_users_handler.py").write_text(textwrap.dedent('''
        SINK = []

        def good(ctx):
            i = ctx.position or 0
            while i < 10:
                ctx.state["n"] = ctx.state.get("n", 0) + 5
                i += 5
                ctx.checkpoint(i, processed=i)
            return ctx.state["n"]

        def bad(ctx):
            i = ctx.position or 0
            while i < 10:
                SINK.append(i)
                i += 5
                ctx.checkpoint(i, processed=i)

        def test_good(resumable_check, resumable_store):
            assert resumable_check(good).result == 10
            assert resumable_store.path.endswith("resumable-checkpoints.db")

        def test_bad(resumable_check):
            resumable_check(bad, snapshot=lambda: list(SINK), reset=SINK.clear)
    '''))
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                            capture_output=True, text=True, cwd=tmp_path)
    out = result.stdout + result.stderr
    assert "1 failed, 1 passed" in out, out
    assert "NotResumable: bad is not resumable: crash_before_checkpoint at checkpoint 1 (position 5)" in out, out


def test_the_plugins_store_option_runs_the_fixtures_on_postgresql(tmp_path: Path, pg_params: dict[str, Any]) -> None:
    from devtools.postgres import dsn

    (tmp_path / "test_on_postgres.py").write_text(textwrap.dedent('''
        def total(ctx):
            i = ctx.position or 0
            while i < 10:
                ctx.state["n"] = ctx.state.get("n", 0) + 5
                i += 5
                ctx.checkpoint(i, processed=i)
            return ctx.state["n"]

        def test_on_the_given_store(resumable_check, resumable_store):
            assert type(resumable_store).__name__ == "PostgresStore"
            assert resumable_check(total).result == 10
    '''))
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path),
                             f"--resumable-store={dsn(pg_params)}"], capture_output=True, text=True, cwd=tmp_path)
    out = result.stdout + result.stderr
    assert "1 passed" in out, out
    # the kit's runs wrote their slot in that database (the schema the URL names), not in a file
    with PostgresStore(**pg_params).open() as s:
        row = s.checkpoints.load("test_kit.handler", "2026-01-01T00:00:00+00:00")
    assert row is not None and (row.status, row.state) == ("done", {"n": 10})


def test_a_store_url_of_another_kind_is_refused_saying_what_is_taken() -> None:
    with pytest.raises(ValueError, match=r"sqlite:////absolute/path.db or postgresql://.*got mysql:"):
        check_resumable(keeps_progress_in_a_local, store="mysql://db/x")


def test_a_dag_run_interrupted_by_a_crash_after_its_third_checkpoint_ends_as_an_uninterrupted_one(
    checkpoints: Store, run_dag, resumable_dag_test, airflow_home: Path, load_dag: Callable[[str], Any]
) -> None:
    dag = load_dag("chunked_example")
    run = resumable_dag_test(dag, "total_revenue", Interruption.CRASH_AFTER_CHECKPOINT, at=3,
                             logical_date=datetime(2026, 2, 1, tzinfo=timezone.utc))
    assert str(run.state) == "success"
    with checkpoints.open() as s:
        row = s.checkpoints.load("chunked_example.total_revenue", "2026-02-01T00:00:00+00:00")
        history = s.listings.history(row.job, row.slot)
    m = example("chunked_example")
    assert row.status == "done" and row.processed == m.ORDER_COUNT
    assert row.state == {"revenue_cents": sum(m.order(i)["amount_cents"] for i in range(1, m.ORDER_COUNT + 1))}
    # the crashed attempt left its history record running; the next one resumed after checkpoint 3
    assert history[-1].resumed_from == 1500 and history[-1].outcome == "done"


# -- a sink that is not reset ----------------------------------------------------------------------


def inserts_through_its_transaction(ctx: Any) -> int:
    """Right: each chunk's row commits with its checkpoint (exactly once in the checkpoint database)."""
    tx = ctx.transaction()
    tx.execute("CREATE TABLE IF NOT EXISTS kit_sink (n INTEGER NOT NULL)")
    i = ctx.position or 0
    while i < 5:
        i += 1
        tx.execute("INSERT INTO kit_sink (n) VALUES (%s)", (i,))
        ctx.checkpoint(i, processed=i)
    return i


def sink_rows(store: Store) -> list[int]:
    with store.open() as s:
        return [r[0] for r in s.execute("SELECT n FROM kit_sink ORDER BY n")]


def test_a_sink_not_reset_between_runs_is_named_instead_of_blaming_the_handler(tmp_path: Path) -> None:
    # Given a correct handler, a store shared by every run, its sink table in it, and no reset=
    shared = SQLiteStore(tmp_path / "shared.db")
    report = check_resumable(inserts_through_its_transaction, store=shared, snapshot=sink_rows)
    # Then the runs differ, but the kit names the sink that still held the earlier run's rows, and reset=
    assert not report.ok and all(t.sink_not_reset for t in report.trials)
    with pytest.raises(NotResumable) as err:
        report.assert_ok()
    text = str(err.value)
    assert text.startswith("inserts_through_its_transaction cannot be judged: crash_before_checkpoint at checkpoint 1 "
                           "(position 1): the sink's snapshot differs (10 items instead of 5"), text
    assert "the sink was not reset: when this run began it still held what the run before it wrote" in text
    assert "Pass reset=" in text and "idempotent" not in text
    # A reset that leaves some of them is named too
    with pytest.raises(NotResumable, match="reset= left rows of an earlier run in it"):
        check_resumable(inserts_through_its_transaction, store=shared, snapshot=sink_rows, interruptions=["cancel"],
                        reset=lambda s: _delete_sink(s, "n > 2")).assert_ok()
    # And with a reset that empties it, the same handler is resumable under every interruption
    report = check_resumable(inserts_through_its_transaction, store=shared, snapshot=sink_rows,
                             reset=lambda s: _delete_sink(s, "1 = 1")).assert_ok()
    assert report.snapshot == [1, 2, 3, 4, 5] and not any(t.sink_not_reset for t in report.trials)


def _delete_sink(store: Store, where: str) -> None:
    with store.open(autocommit=True) as s:
        s.execute("CREATE TABLE IF NOT EXISTS kit_sink (n INTEGER NOT NULL)")
        s.execute(f"DELETE FROM kit_sink WHERE {where}")


# -- what the kit costs ------------------------------------------------------------------------------


CHUNKS_RUN = [0]


def counts_its_chunks(ctx: Any, checkpoints: int) -> int:
    i = ctx.position or 0
    while i < checkpoints:
        CHUNKS_RUN[0] += 1
        i += 1
        ctx.state["total"] = ctx.state.get("total", 0) + i
        ctx.checkpoint(i, processed=i)
    return int(ctx.state["total"])


def test_a_long_run_is_sampled_at_its_first_last_and_seeded_checkpoints_and_the_seed_replays_them(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = functools.partial(counts_its_chunks, checkpoints=60)
    report = check_resumable(handler, interruptions=["cancel"], name="counts_its_chunks")
    # 60 checkpoints: 12 of them, the first and the last among them, and the seed that chose the others
    assert len(report.points) == 12 and report.points[0] == 1 and report.points[-1] == 60
    assert report.seed is not None and f"sampled with seed={report.seed}" in report.summary()
    assert check_resumable(handler, interruptions=["cancel"], seed=report.seed).points == report.points
    monkeypatch.setenv("RESUMABLE_KIT_SEED", str(report.seed))
    assert check_resumable(handler, interruptions=["cancel"]).points == report.points
    every = check_resumable(handler, interruptions=["cancel"], points="every")
    assert every.points == list(range(1, 61)) and every.seed is None
    short = check_resumable(functools.partial(counts_its_chunks, checkpoints=12), interruptions=["cancel"])
    assert short.points == list(range(1, 13)) and short.seed is None
    # a failure in a sample says how to try the same points again
    with pytest.raises(NotResumable, match=rf"sampled with seed={report.seed}: pass seed={report.seed} \(or set "
                                           rf"RESUMABLE_KIT_SEED={report.seed}\) .* points='every' to try them all"):
        check_resumable(functools.partial(forgets_its_total, checkpoints=30),
                        interruptions=[Interruption.CRASH_AFTER_CHECKPOINT]).assert_ok()


def forgets_its_total(ctx: Any, checkpoints: int) -> int:
    i, total = ctx.position or 0, 0
    while i < checkpoints:
        i += 1
        total += i
        ctx.checkpoint(i, processed=i)
    return total


def test_the_kits_default_cost_grows_with_the_runs_length_not_its_square() -> None:
    # Given a correct handler of N checkpoints, one chunk each: each trial runs the whole job once, so
    # the chunks a check runs are about kinds x points x N
    chunks = {}
    for n in (40, 80):
        CHUNKS_RUN[0] = 0
        report = check_resumable(functools.partial(counts_its_chunks, checkpoints=n),
                                 interruptions=IN_PROCESS_INTERRUPTIONS).assert_ok()
        chunks[n] = CHUNKS_RUN[0]
        assert len(report.points) == 12
        # the reference, then each trial's whole run plus the chunk or two an interruption repeats
        assert len(report.trials) * n < chunks[n] <= (len(report.trials) + 1) * (n + 2)
    # twice the checkpoints, twice the chunks (every checkpoint of each: four times)
    assert 1.9 < chunks[80] / chunks[40] < 2.1


# -- replayed items: what comes back ------------------------------------------------------------


def test_a_replayed_item_comes_back_exactly_as_the_skip_policy_guide_shows(tmp_path: Path) -> None:
    # Given the guide's example: an item as the reader gives it, and what it says a replay gives back
    guide = (ROOT / "docs" / "guides" / "skip-policy.md").read_text()
    found = re.search(r"<!-- replayed item:[^>]*-->\s*```python\n(.*?)```", guide, re.S)
    assert found, "the skip policy guide shows a replayed item"
    example: dict[str, Any] = {"date": date, "datetime": datetime, "timezone": timezone, "Decimal": Decimal,
                               "UUID": UUID}
    exec(found.group(1), example)
    item, documented = example["item"], example["replayed"]
    # When a chunk loop with skip_on skips it, then it is replayed on purpose and by the task's next attempt
    store = SQLiteStore(tmp_path / "checkpoints.db")

    def read(ctx: Any, after: Any, limit: int) -> list[Any]:
        return [] if after is not None else [item]

    def refuse(ctx: Any, batch: list[Any]) -> None:
        raise ValueError("bad item")

    loop = chunk_loop(read, refuse, chunk_size=10, skip_on=ValueError)
    Attempt(store, Identity(job="kit.replay", slot="s", attempt=1, owner="o1")).run(loop)
    by_hand: list[Any] = []
    assert replay(store, "kit.replay", "s", by_hand.append).failed == []
    request_letters = SQLiteStore(tmp_path / "again.db")
    Attempt(request_letters, Identity(job="kit.replay", slot="s", attempt=1, owner="o1")).run(loop)
    request_retry(request_letters, "kit.replay", "s", by="test")
    by_the_task: list[Any] = []
    Attempt(request_letters, Identity(job="kit.replay", slot="s", attempt=2, owner="o2")).run(
        lambda ctx: ctx.replay_skipped(by_the_task.append) and None)
    # Then both give exactly what the guide says
    assert by_hand == [documented] and by_the_task == [documented]

