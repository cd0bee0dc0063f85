"""Partitioned jobs: the split, the stored plan, the partitions' ranges, and the job as a whole.

The split and the plan's store run on both stores' databases without Airflow; the DAG runs
(``dag.test()``, tests/dags/partition_dags.py) read and write the checkpoint store's own database.
Tests marked ``one_store`` run on SQLite only: the Clear test asserts that the planning task reads
the stored plan (the insert-if-absent itself is proved on both stores by
``test_the_first_plan_stored_for_a_slot_is_its_plan_for_good``), and the tolerated-failure tests
assert the summary's arithmetic on rows whose storage the contract suite owns.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work import partitions
from airflow_resumable.core.work.partition_summary import summarize
from airflow_resumable.core.work.partitions import Plan, allowed_failures, load_plan, save_plan, split
from airflow_resumable.operators.task_instance import RESTART_CONF_KEY
from support.partition_source import table
from support.paths import TESTS
from support.sources import Source
from support.xcoms import xcom

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()


# -- helpers --------------------------------------------------------------------------------------


def reader_of(source: Source, key: Any = ("grp", "id"), name: str = "pt_source") -> KeysetReader:
    return KeysetReader(connect=source.connect, table=name, key=key)


def read_range(reader: KeysetReader, rng: partitions.Range, chunk: int = 4) -> list[tuple[Any, ...]]:
    """Every row of one partition's range, page by page, as a partition's task reads it."""
    if rng.empty:
        return []
    bounded, after, rows = reader.within(rng.until, after=rng.after), rng.after, []
    while True:
        batch = bounded.read(None, after, chunk)  # type: ignore[arg-type]  # no run context: no error expected
        if not batch:
            bounded.close()
            return rows
        rows += [tuple(r) for r in batch]
        after = batch.position


def partition_rows(source: Source, plan: Plan, **kwargs: Any) -> list[list[tuple[Any, ...]]]:
    reader = reader_of(source, **kwargs)
    return [read_range(reader, rng) for rng in plan.ranges()]


def assert_every_row_once(source: Source, parts: list[list[tuple[Any, ...]]], name: str = "pt_source") -> None:
    everything = sorted(tuple(r) for r in source.run(f"SELECT grp, id FROM {name}"))
    assert sorted(r for part in parts for r in part) == everything


SKEWED = [("a", i) for i in range(90)] + [("b", 1000 + i) for i in range(7)] + [("c", i) for i in range(3)]


# -- the split --------------------------------------------------------------------------------------


def test_a_composite_key_with_ties_and_skew_is_split_into_ranges_within_one_row_of_each_other(
    store: Store, source: Source
) -> None:
    # Given 100 rows, 90 of them sharing the first key column (ties), on a composite key
    table(source, SKEWED)

    # When the job is split into 7 partitions
    plan = split(reader_of(source), 7, job="pt", slot=SLOT)

    # Then every boundary is a key of the source, every row is in exactly one range, and the
    # ranges' sizes differ by one row at most although most rows share one grp value
    assert plan.rows == 100 and len(plan.boundaries) == 6
    assert all(tuple(b) in set(SKEWED) for b in plan.boundaries)
    parts = partition_rows(source, plan)
    assert_every_row_once(source, parts)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1, [len(p) for p in parts]
    assert [b[0] for b in plan.boundaries].count("a") >= 5  # the ties were cut through, by the second column


def test_a_single_column_key_is_split_by_rows_not_by_the_key_s_span(store: Store, source: Source) -> None:
    # Given ids 0..9 and 1,000,000..1,000,089: a split of the key's span would put 90 rows in one range
    source.run("CREATE TABLE pt_ids (id INTEGER PRIMARY KEY)")
    ids = list(range(10)) + list(range(1_000_000, 1_000_090))
    source.run("INSERT INTO pt_ids (id) VALUES (%s)", [(i,) for i in ids])
    reader = KeysetReader(connect=source.connect, table="pt_ids", key="id")

    plan = split(reader, 4, job="pt", slot=SLOT)

    assert plan.boundaries == (1_000_014, 1_000_039, 1_000_064)  # rows 25, 50 and 75 of 100
    parts = [[r[0] for r in read_range(reader, rng)] for rng in plan.ranges()]
    assert [len(p) for p in parts] == [25, 25, 25, 25] and sorted(sum(parts, [])) == ids


@pytest.mark.parametrize("rows", [0, 1, 3])
def test_fewer_rows_than_partitions_give_empty_partitions_and_lose_no_row(store: Store, source: Source,
                                                                          rows: int) -> None:
    table(source, [("a", i) for i in range(rows)])

    plan = split(reader_of(source), 5, job="pt", slot=SLOT)

    ranges = plan.ranges()
    parts = partition_rows(source, plan)
    assert_every_row_once(source, parts)
    assert len(ranges) == 5 and sum(1 for p in parts if p) == rows
    assert all(len(p) <= 1 for p in parts)
    # The last range always reaches the end: rows written after the split are read too
    assert ranges[-1].until is None and not ranges[-1].empty


def test_rows_written_after_the_split_fall_in_exactly_one_range(store: Store, source: Source) -> None:
    # Given a plan made on the source as it was
    table(source, SKEWED)
    plan = split(reader_of(source), 4, job="pt", slot=SLOT)

    # When rows arrive before the first key, between boundaries, on a boundary's first column and after the last
    source.run("INSERT INTO pt_source (grp, id) VALUES (%s, %s)",
               [("0", 1), ("a", -1), ("a", 45_000), ("b", 1), ("bb", 0), ("z", 9)])

    # Then each is read by exactly one partition
    assert_every_row_once(source, partition_rows(source, plan))


def test_a_null_key_is_refused_before_anything_is_split_naming_the_job_the_slot_and_the_fix(
    store: Store, source: Source
) -> None:
    source.run("CREATE TABLE pt_nulls (grp TEXT, id INTEGER)")
    source.run("INSERT INTO pt_nulls (grp, id) VALUES (%s, %s)", [("a", 1), ("a", None), ("b", 2)])

    with pytest.raises(ConfigurationError, match="NULL key") as err:
        split(reader_of(source, name="pt_nulls"), 2, job="pt.export", slot=SLOT)

    assert err.value.job == "pt.export" and err.value.slot == SLOT
    assert "where='grp IS NOT NULL AND id IS NOT NULL'" in str(err.value)


def test_a_key_whose_values_have_no_json_form_is_refused_when_split_naming_the_job_the_slot_and_the_fix(
    store: Store, source: Source
) -> None:
    # A boundary is stored as JSON: bytes have no exact JSON form (the split used to end in a bare TypeError)
    source.run(f"CREATE TABLE pt_bytes (id {'BLOB' if source.kind == 'sqlite' else 'BYTEA'} PRIMARY KEY)")
    source.run("INSERT INTO pt_bytes (id) VALUES (%s)", [(bytes([i]),) for i in range(10)])

    with pytest.raises(ConfigurationError, match="has no exact JSON form") as err:
        split(KeysetReader(connect=source.connect, table="pt_bytes", key="id"), 3, job="pt.export", slot=SLOT)

    assert err.value.job == "pt.export" and err.value.slot == SLOT
    assert "pt_bytes" in str(err.value) and "Nothing was split" in str(err.value)
    assert err.value.hint and "Partition on columns whose values are numbers, text" in err.value.hint


def test_a_bounded_reader_still_refuses_a_null_key_outside_its_range(store: Store, source: Source) -> None:
    # A NULL key is in no range: a partition that looked only inside its own would lose that row silently
    source.run("CREATE TABLE pt_nulls (grp TEXT, id INTEGER)")
    source.run("INSERT INTO pt_nulls (grp, id) VALUES (%s, %s)", [("a", 1), ("a", 2), (None, 5)])
    bounded = reader_of(source, name="pt_nulls").within(["a", 2])

    with pytest.raises(ConfigurationError, match="NULL key"):
        bounded.read(None, None, 10)  # type: ignore[arg-type]


def test_until_takes_only_a_key_of_the_reader_s_columns(store: Store, source: Source) -> None:
    reader = reader_of(source)
    with pytest.raises(ConfigurationError, match="not a key of 2 values"):
        reader.within("a")
    with pytest.raises(ConfigurationError, match="NULL value"):
        reader.within(["a", None])


# -- the plan, kept on the slot ------------------------------------------------------------------------


def test_the_first_plan_stored_for_a_slot_is_its_plan_for_good(store: Store) -> None:
    first, second = Plan(3, (["a", 9], ["b", 2]), 30), Plan(3, (["a", 1], ["a", 2]), 99)
    with store.open(autocommit=True) as session:
        session.ensure_schema()
        assert load_plan(session, "pt.export", SLOT) is None

        assert save_plan(session, "pt.export", SLOT, first) == first
        # A second planner (a Clear of the planning task, a retry, a race) gets the first plan back
        assert save_plan(session, "pt.export", SLOT, second) == first
        assert save_plan(session, "pt.export", "another-slot", second) == second

        row = session.checkpoints.load("pt.export#plan", SLOT)
    assert row is not None and row.status == "done" and row.state["boundaries"] == [["a", 9], ["b", 2]]


# -- the job as a whole -----------------------------------------------------------------------------------


def _row(status: str, processed: int, total: int | None) -> Checkpoint:
    return Checkpoint(job="j", slot=SLOT, status=status, processed=processed, total=total)


@pytest.mark.parametrize(("tolerated", "partitions_", "allowed"), [
    (0, 4, 0), (2, 4, 2), ("25%", 4, 1), ("10%", 16, 1), ("0%", 10, 0), ("100%", 3, 3), ("33.4%", 3, 1),
])
def test_tolerated_failure_is_a_count_or_a_share_of_the_partitions(tolerated: Any, partitions_: int,
                                                                   allowed: int) -> None:
    assert allowed_failures(tolerated, partitions_) == allowed


def test_the_summary_counts_unfinished_partitions_as_failed_and_adds_up_the_figures() -> None:
    rows = [_row("done", 10, 10), _row("failed", 3, 10), None, _row("done", 7, 7)]

    tolerant = summarize("pt.export", SLOT, rows, tolerated=2)
    strict = summarize("pt.export", SLOT, rows, tolerated="25%")

    assert tolerant.ok and tolerant.as_json() == {
        "summary": "2 of 4 partitions done; rows: 20 processed, 0 skipped (dead letters)",
        "job": "pt.export", "slot": SLOT, "partitions": 4, "done": 2, "failed": [1, 2], "cancelled": [], "tolerated": 2,
        "planned": None, "processed": 20, "skipped": 0, "unfinished": 0, "gone": 0, "shortfall": 0, "short": [],
        "tolerated_shortfall": 0, "more": 0, "total": 27}
    assert not strict.ok
    error = strict.error()
    assert error is not None and error.job == "pt.export" and error.slot == SLOT
    assert "pt.export[1], pt.export[2]" in str(error) and "Clear the failed partitions" in str(error)


# -- bad arguments -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "said"), [
    ({"partitions": 0}, "partitions must be a whole number of partitions from 1"),
    ({"partitions": math.nan}, "partitions must be a whole number of partitions from 1"),
    ({"partitions": "4"}, "partitions must be a whole number"),
    ({"tolerated_failure": -1}, "tolerated_failure must be how many partitions may fail"),
    ({"tolerated_failure": "110%"}, "tolerated_failure must be how many partitions may fail"),
    ({"tolerated_failure": math.nan}, "tolerated_failure must be how many partitions may fail"),
    ({"read": lambda ctx, after, limit: []}, "read must be a reader with a key to split"),
    ({"start": 5}, "start= is not taken by a partitioned job"),
])
def test_bad_arguments_are_refused_when_the_dag_is_parsed_naming_the_job_and_the_fix(
    airflow_home: Any, tmp_path: Any, arguments: dict[str, Any], said: str
) -> None:
    import sqlite3

    from airflow.sdk import DAG

    from airflow_resumable.operators.partitioned import partitioned

    given: dict[str, Any] = {
        "read": KeysetReader(connect=lambda: sqlite3.connect(tmp_path / "s.db"), table="t", key="id"),
        "process": lambda ctx, batch: None, "partitions": 4, "chunk_size": 10, **arguments,
    }
    with DAG("pt_bad", schedule=None, start_date=DAY), pytest.raises(ConfigurationError, match=said) as err:
        partitioned(task_id="export", **given)
    assert err.value.job == "pt_bad.export" and "Fix the arguments of partitioned(...)" in str(err.value)


def test_a_reader_without_a_key_cannot_be_made(tmp_path: Any) -> None:
    import sqlite3

    with pytest.raises(ConfigurationError, match="key must be a column name"):
        KeysetReader(connect=lambda: sqlite3.connect(tmp_path / "s.db"), table="t", key=())


# -- in DAG runs --------------------------------------------------------------------------------------------


def sink(source: Source) -> list[tuple[Any, ...]]:
    return source.run("SELECT grp, id, part, attempt FROM pt_sink")


def plan_row(store: Store) -> Any:
    with store.open() as s:
        return s.checkpoints.load("pt_export.export#plan", SLOT)


def test_every_row_is_written_once_through_the_transaction_when_one_partition_fails_and_retries(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    # Given 40 rows on a composite key with ties (30 share grp "a")
    table(source, [("a" if i < 30 else "b", i) for i in range(40)])

    # When the job runs in 4 partitions and partition 1's second chunk fails on its first attempt
    # (after writing its rows through ctx.transaction())
    run = run_dag("pt_export", conf={"fail": {"1": [1]}}, logical_date=DAY)

    # Then the run succeeds, every source row is in the sink exactly once, partition 1 finished on
    # its retry from its own checkpoint, and the summary adds the partitions up
    assert str(run.state) == "success"
    written = sink(source)
    assert sorted((g, i) for g, i, _, _ in written) == sorted(source.run("SELECT grp, id FROM pt_source"))
    assert {p for _, _, p, a in written if a == 2} == {1}
    assert xcom(run, "export.summary", required=True) == {
        "summary": "4 of 4 partitions done; of 40 planned rows: 40 processed, 0 skipped (dead letters)",
        "job": "pt_export.export", "slot": SLOT, "partitions": 4, "done": 4, "failed": [], "cancelled": [], "tolerated": 0,
        "planned": 40, "processed": 40, "skipped": 0, "unfinished": 0, "gone": 0, "shortfall": 0, "short": [],
        "tolerated_shortfall": 0, "more": 0, "total": 40}
    with checkpoints.open() as s:
        rows = [s.checkpoints.load(f"pt_export.export[{i}]", SLOT) for i in range(4)]
    assert [(r.status, r.processed, r.attempt) for r in rows] == [
        ("done", 10, 1), ("done", 10, 2), ("done", 10, 1), ("done", 10, 1)]
    assert len(xcom(run, "export.plan", required=True)) == 4


@pytest.mark.one_store("asserts that the planning task reads the stored plan", kind="sqlite")
def test_a_clear_of_the_whole_run_reads_the_ranges_planned_when_the_run_first_started(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    # Given a run that split 40 rows into 4 partitions
    table(source, [("a", i) for i in range(40)])
    first = run_dag("pt_export", logical_date=DAY)
    assert str(first.state) == "success"
    planned = plan_row(checkpoints).state
    ranges = xcom(first, "export.plan", required=True)

    # When 60 rows arrive before every key and the run is run again for the same date (its
    # planning task too), its partitions asked to start over: a split made now would move every boundary
    source.run("INSERT INTO pt_source (grp, id) VALUES (%s, %s)", [("0", i) for i in range(60)])
    again = run_dag("pt_export", conf={RESTART_CONF_KEY: True}, logical_date=DAY)

    # Then the planning task returns the ranges stored on the slot, and the new rows all fall in
    # the first partition's range
    assert str(again.state) == "success"
    assert plan_row(checkpoints).state == planned
    assert xcom(again, "export.plan", required=True) == ranges
    assert ranges[0]["after"] is None and ranges[0]["until"] == ["a", 9]
    assert {p for g, _, p, _ in sink(source) if g == "0"} == {0}
    with checkpoints.open() as s:
        processed = [s.checkpoints.load(f"pt_export.export[{i}]", SLOT).processed for i in range(4)]
    assert processed == [70, 10, 10, 10]


@pytest.mark.one_store("asserts the summary's outcome in Airflow", kind="sqlite")
@pytest.mark.parametrize(("failing", "outcome"), [(["2"], "success"), (["1", "2"], "failed")])
def test_tolerated_failure_lets_the_job_succeed_with_that_many_failed_partitions_and_no_more(
    checkpoints: Store, source: Source, run_dag: Any, failing: list[str], outcome: str
) -> None:
    # Given a job of 4 partitions that tolerates 25% of them failing (one), with no retries
    table(source, [("a", i) for i in range(40)])

    # When one partition fails (or two)
    run = run_dag("pt_tolerant", conf={"fail": {p: [1] for p in failing}}, logical_date=DAY)

    # Then the summary task, and the run, succeed with one and fail with two; the other
    # partitions finished either way
    summary = run.get_task_instance("export.summary")
    assert (str(run.state), str(summary.state)) == (outcome, outcome)
    with checkpoints.open() as s:
        statuses = [s.checkpoints.load(f"pt_tolerant.export[{i}]", SLOT).status for i in range(4)]
    assert statuses == ["failed" if str(i) in failing else "done" for i in range(4)]
    if outcome == "success":
        result = xcom(run, "export.summary", required=True)
        assert (result["done"], result["failed"], result["tolerated"]) == (3, [2], 1)
        assert json.dumps(result)  # plain JSON


# -- with a real scheduler ------------------------------------------------------------------------------


@pytest.mark.scheduler
def test_with_a_real_scheduler_a_failed_partition_is_cleared_alone_and_resumes_from_its_own_checkpoint(
    pg_server: Any,
) -> None:

    from support.deployment import databases
    from support.standalone import Standalone

    dag_id, run_id = "pt_workers", "pt_workers_1"
    with databases(pg_server, "partitions") as db:
        with db.sink.cursor() as cur:
            cur.execute("CREATE TABLE pt_source (grp TEXT NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (grp, id))")
            cur.execute("INSERT INTO pt_source SELECT CASE WHEN i < 30 THEN 'a' ELSE 'b' END, i "
                        "FROM generate_series(0, 39) i")
            # Made here: partitions starting at once would race PostgreSQL's CREATE TABLE IF NOT EXISTS
            cur.execute("CREATE TABLE pt_sink (grp TEXT, id INTEGER, part INTEGER, attempt INTEGER)")
        airflow = Standalone(metadata_uri=db.metadata_uri, dag_files=[TESTS / "dags" /
                                                                       "partition_dags.py"], env=db.env)
        try:
            airflow.start()
            airflow.serve((dag_id,))
            api = airflow.api
            assert api is not None

            def run_state(states: tuple[str, ...]) -> str:
                return api.run_state(dag_id, run_id, states, timeout=300, on_timeout=lambda: airflow.tail(60))

            def rows() -> list[Checkpoint]:
                with db.store.open(autocommit=True) as s:
                    found = [s.checkpoints.load(f"{dag_id}.export[{i}]", run_id) for i in range(4)]
                assert all(found), found
                return [r for r in found if r is not None]

            # Given a run whose partition 2 fails in its second chunk (no retries)
            api.trigger(dag_id, run_id=run_id, conf={"fail": {"2": [1]}, "delay": 1.0})

            # Then the job fails: three partitions done, partition 2 failed after its first chunk
            assert run_state(("success", "failed")) == "failed"
            first = rows()
            assert [r.status for r in first] == ["done", "done", "failed", "done"], [(r.status, r.last_error) for r in first]
            assert first[2].processed == 5
            with db.store.open(autocommit=True) as s:
                plan = s.checkpoints.load(f"{dag_id}.export#plan", run_id)

            # When partition 2 and the summary are cleared, as the UI's Clear does
            api.clear(dag_id, run_id, [["export.partition", 2], "export.summary"])  # type: ignore[list-item]

            # Then partition 2 resumes after its first chunk, the others are not run again, the
            # plan is the same, and every row was committed once
            assert run_state(("success", "failed")) == "success"
            again = rows()
            assert [(r.status, r.attempt) for r in again] == [("done", 1), ("done", 1), ("done", 2), ("done", 1)]
            assert again[2].resumed_from == first[2].position
            with db.store.open(autocommit=True) as s:
                assert s.checkpoints.load(f"{dag_id}.export#plan", run_id).state == plan.state  # type: ignore[union-attr]
            with db.sink.cursor() as cur:
                cur.execute("SELECT grp, id, count(*) FROM pt_sink GROUP BY grp, id")
                written = cur.fetchall()
            assert len(written) == 40 and {n for _, _, n in written} == {1}
            def span(r: Checkpoint) -> tuple[Any, Any]:
                return r.started_at, r.finished_at or r.updated_at

            overlapping = sum(1 for a in first for b in first if a is not b and span(a)[0] < span(b)[1]
                              and span(b)[0] < span(a)[1])
            print(f"\n[partitions] pairs of partitions that ran at the same time: {overlapping // 2} of 6")
        finally:
            airflow.close()


def test_the_decorator_declares_the_same_job_its_calls_arguments_reaching_every_partition(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    # Given 40 rows, and pt_decorated: @task.resumable.partitioned over them in 4 partitions, its
    # function called with offset=1000
    table(source, [("a" if i < 30 else "b", i) for i in range(40)])

    # When it runs and partition 3's second chunk fails on its first attempt
    run = run_dag("pt_decorated", conf={"fail": {"3": [1]}}, logical_date=DAY)

    # Then it is the same task group as partitioned(...)'s, every row is written once with the
    # call's argument, partition 3 finished on its retry, and the summary adds them up
    assert str(run.state) == "success"
    assert {ti.task_id for ti in run.get_task_instances()} == {"export.plan", "export.partition", "export.summary"}
    written = sink(source)
    assert sorted((g, i - 1000) for g, i, _, _ in written) == sorted(source.run("SELECT grp, id FROM pt_source"))
    assert {p for _, _, p, a in written if a == 2} == {3}
    summary = xcom(run, "export.summary", required=True)
    assert (summary["job"], summary["done"], summary["processed"]) == ("pt_decorated.export", 4, 40)


def test_the_decorator_refuses_positional_arguments_and_a_function_without_ctx_and_batch() -> None:
    from airflow_resumable.decorators.partitioned import partitioned_task

    reader = KeysetReader(connect=lambda: None, table="t", key="id")
    with pytest.raises(ConfigurationError, match="must take the run context and the batch first"):
        partitioned_task(read=reader, partitions=2)(lambda ctx: None)
    with pytest.raises(ConfigurationError, match="keyword arguments only"):
        partitioned_task(read=reader, partitions=2)(lambda ctx, batch, n=1: None)(5)
    with pytest.raises(ConfigurationError, match="takes no process="):
        partitioned_task(read=reader, partitions=2, process=print)


@pytest.mark.one_store("asserts the summary's outcome in Airflow", kind="sqlite")
@pytest.mark.parametrize(("cancelled", "failing", "outcome"), [(["2"], [], "success"), (["2"], ["1"], "failed")])
def test_a_cancelled_partition_counts_as_failed_against_tolerated_failure_and_the_summary_names_it(
    checkpoints: Store, source: Source, run_dag: Any, cancelled: list[str], failing: list[str], outcome: str
) -> None:
    # Given a job of 4 partitions that tolerates one failing (25%)
    table(source, [("a", i) for i in range(40)])

    # When a person cancels partition 2 while it runs (and partition 1 fails, or not)
    run = run_dag("pt_tolerant", conf={"cancel": cancelled, "fail": {p: [1] for p in failing}}, logical_date=DAY)

    # Then the cancelled partition stops after its chunk, its task instance fails, and it counts
    # against tolerated_failure like a failed one: alone it is tolerated and the run succeeds,
    # with a failure besides the run fails; the summary names it as cancelled either way
    with checkpoints.open() as s:
        row = s.checkpoints.load("pt_tolerant.export[2]", SLOT)
    assert (row.status, row.processed) == ("cancelled", 3)
    assert str(run.get_task_instance("export.partition", map_index=2).state) == "failed"
    summary = run.get_task_instance("export.summary")
    assert (str(run.state), str(summary.state)) == (outcome, outcome)
    if outcome == "success":
        result = xcom(run, "export.summary", required=True)
        assert (result["done"], result["failed"], result["cancelled"], result["tolerated"]) == (3, [2], [2], 1)
    else:
        with checkpoints.open() as s:
            rows = [s.checkpoints.load(f"pt_tolerant.export[{i}]", SLOT) for i in range(4)]
        error = summarize("pt_tolerant.export", SLOT, rows, tolerated="25%").error()
        assert error is not None and "pt_tolerant.export[2] (cancelled by carol)" in str(error)
        assert "a cancelled partition counts as failed" in str(error)


# -- on the Celery deployment ---------------------------------------------------------------------------


@pytest.mark.celery
@pytest.mark.scheduler
def test_on_celery_a_million_rows_in_16_partitions_are_each_written_once_though_a_worker_is_killed(
    pg_server: Any,
) -> None:
    import time

    from support.celery_cluster import CeleryDeployment, redis_client
    from support.deployment import HEARTBEAT_TIMEOUT, databases
    from support.standalone import wait_for

    dag_id, run_id, rows, parts = "pt_celery", f"pt_celery_{time.time_ns() % 10**8}", 1_000_000, 16
    redis_client()
    with databases(pg_server, "pt_celery") as db:
        with db.sink.cursor() as cur:
            cur.execute("CREATE TABLE pt_big (id BIGINT PRIMARY KEY, payload INTEGER NOT NULL)")
            cur.execute(f"INSERT INTO pt_big SELECT i, i % 97 FROM generate_series(1, {rows}) i")
            cur.execute("ANALYZE pt_big")
            cur.execute("CREATE TABLE pt_big_sink (id BIGINT NOT NULL, part INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        with db.store.open(autocommit=True) as s:
            s.ensure_schema()  # here: 16 partitions starting at once would all create it
        cluster = CeleryDeployment(metadata_uri=db.metadata_uri, env=db.env, triggerer=False,
                                   dag_files=[TESTS / "dags" / "partition_dags.py"])
        try:
            cluster.start()
            cluster.serve((dag_id,))
            api = cluster.api
            assert api is not None

            def partition_rows() -> list[Checkpoint | None]:
                with db.store.open(autocommit=True) as s:
                    return [s.checkpoints.load(f"{dag_id}.copy[{i}]", run_id) for i in range(parts)]

            # Given 1,000,000 rows, and a run of the job in 16 partitions on two workers
            started = time.monotonic()
            api.trigger(dag_id, run_id=run_id, conf={"delay": 0.4})

            # When a worker running partitions that saved chunks is killed (SIGKILL, like a lost machine)
            def busy_worker() -> tuple[Any, list[int]] | None:
                running = {i: r for i, r in enumerate(partition_rows()) if r and r.status == "running" and r.processed}
                tis = api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
                on: dict[str, list[int]] = {}
                for ti in tis["task_instances"]:
                    if ti["task_id"] == "copy.partition" and ti["state"] == "running" and ti["map_index"] in running:
                        try:
                            on.setdefault(cluster.worker_running(ti).name, []).append(ti["map_index"])
                        except AssertionError:
                            pass  # it just finished
                name = max(on, key=lambda n: len(on[n]), default=None)
                return (cluster.components[name], sorted(on[name])) if name else None

            victim, lost = wait_for(busy_worker, timeout=300, interval=0.3, what="a worker running partitions",
                                    on_timeout=cluster.tail)
            before = {i: r for i, r in enumerate(partition_rows()) if i in lost}
            killed = time.monotonic()
            cluster.crash(victim)

            # Then the run succeeds: every partition done, the killed ones on a later try that resumed
            # from their checkpoints, and every row is in the sink exactly once
            state = wait_for(lambda: (s := api.dag_run(dag_id, run_id)["state"]) in ("success", "failed") and s,
                             timeout=HEARTBEAT_TIMEOUT + 420, interval=1.0, what=f"{run_id} to end",
                             on_timeout=lambda: cluster.tail(40))
            wall = time.monotonic() - started
            assert state == "success", cluster.tail(60)
            final = partition_rows()
            # every range of the plan as it stands (the partitions' and those idle partitions took
            # from them: rebalancing) ended done, and together they read every row
            with db.store.open(autocommit=True) as s:
                plan = load_plan(s, f"{dag_id}.copy", run_id)
                assert plan is not None
                ranges = [s.checkpoints.load(rng.job(f"{dag_id}.copy"), run_id) for rng in plan.current().values()]
            assert all(r is not None and r.status == "done" for r in ranges), [
                (r and (r.job, r.status, r.last_error)) for r in ranges]
            assert sum(r.processed for r in ranges if r) == rows
            for i in lost:
                row = final[i]
                assert row is not None and row.attempt >= 2, (i, row)
                assert row.resumed_from is not None and row.resumed_from >= before[i].position, (i, row, before[i])
            with db.sink.cursor() as cur:
                cur.execute("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM pt_big_sink")
                count, distinct, low, high = cur.fetchone()
                cur.execute("SELECT count(*) FROM pt_big_sink WHERE attempt > 1")
                (later,) = cur.fetchone()
            assert (count, distinct, low, high) == (rows, rows, 1, rows), "every row exactly once"
            print(f"\n[partitions/celery] {rows:,} rows in {parts} partitions on 2 workers, {victim.name} killed "
                  f"{killed - started:.1f}s in while running partitions {lost}: run succeeded in {wall:.1f}s; "
                  f"{later:,} rows written by later tries, none twice; {len(plan.splits)} split(s) agreed")
        finally:
            cluster.close()
