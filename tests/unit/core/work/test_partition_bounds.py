"""A partition keeps to its reader's own bounds, and a checkpoint keeps to the reader it was written with.

Every partition of a partitioned job reads its range *within* the reader's ``until``, ``where`` and
``params`` (the first and the last range, open at one end, included); a slot driven by a reader
records the reader's identity on its row, and an attempt whose reader differs (another key,
table, query, ``where``, ``params``, ``until``, range or connection) refuses before it reads. The
plan records its reader and is sealed, so a changed reader or a hand-edited plan is refused by the
planning task; a restart requested on the plan row splits the job anew on purpose.

On both stores (the readers read the store's own database); the DAG runs (``dag.test()``,
tests/dags/partition_dags.py) too.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options, chunk_loop
from airflow_resumable.core.model.errors import ConfigurationError, ReaderChanged
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import KeysetReader, SequenceReader
from airflow_resumable.core.readers.base import identity_digest
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partitions import Plan, load_plan, range_chunks, split
from support.sources import Source
from support.xcoms import xcom

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()


def ids_table(source: Source, n: int = 100, name: str = "pt_ids") -> None:
    source.run(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, code INTEGER NOT NULL UNIQUE)")
    source.run(f"INSERT INTO {name} (id, code) VALUES (%s, %s)", [(i, 1000 - i) for i in range(1, n + 1)])


def read_all(store: Store, job: str, read: Any, **loop: Any) -> list[int]:
    """Every id the chunk loop hands ``process`` in one attempt of ``job`` (a fresh slot)."""
    seen: list[int] = []
    handler = chunk_loop(read, lambda ctx, batch: seen.extend(r[0] for r in batch), chunk_size=7, **loop)
    Attempt(store, Identity(job=job, slot=SLOT, attempt=1, owner=f"{job}-1")).run(handler)
    return seen


# -- 1. every partition within the reader's own bounds -----------------------------------------------------


def test_every_partition_reads_within_the_reader_s_until_where_and_params_the_first_and_the_last_included(
    store: Store, source: Source
) -> None:
    # Given ids 1..100, and a reader of ids up to 50, not 7 (a parameter) nor 21 (in the text)
    ids_table(source)
    reader = KeysetReader(connect=source.connect, table="pt_ids", key="id", until=50,
                          where=f"id <> {source.marker} AND id <> 21", params=(7,))
    wanted = [i for i in range(1, 51) if i not in (7, 21)]

    # When it is split into 4 partitions and each runs its range as a partition's task does
    plan = split(reader, 4, job="pt", slot=SLOT)
    parts = [read_all(store, f"pt[{r.index}]", **range_chunks(reader, r)) for r in plan.ranges()]

    # Then the plan counted the reader's rows, and every partition (the last, open above, and the
    # first, open below) read only those, each once
    assert plan.rows == len(wanted) == 48
    assert parts[-1] and max(parts[-1]) == 50, parts[-1]
    assert sorted(sum(parts, [])) == wanted
    assert [len(p) for p in parts] == plan.planned()


def test_an_until_below_the_smallest_key_leaves_every_partition_empty(store: Store, source: Source) -> None:
    ids_table(source)
    reader = KeysetReader(connect=source.connect, table="pt_ids", key="id", until=0)

    plan = split(reader, 3, job="pt", slot=SLOT)

    assert (plan.rows, plan.boundaries) == (0, (None, None))
    assert [read_all(store, f"pt[{r.index}]", **range_chunks(reader, r)) for r in plan.ranges()] == [[], [], []]


def test_a_checkpoint_below_its_range_cannot_read_the_previous_partition_s_rows(store: Store, source: Source) -> None:
    # A hand-edited position before the range's start: the range's lower bound still holds
    ids_table(source, 20)
    reader = KeysetReader(connect=source.connect, table="pt_ids", key="id")
    bounded = reader.within(15, after=10)
    assert [r[0] for r in bounded.read(None, 2, 100)] == [11, 12, 13, 14, 15]  # type: ignore[arg-type]


@pytest.mark.parametrize("dag_id", ["pt_bounded", "pt_bounded_decorated"])
def test_the_partitioned_dag_keeps_to_the_reader_s_bounds(checkpoints: Store, source: Source, run_dag: Any,
                                                         dag_id: str) -> None:
    # Given ids 1..100 and a reader of ids up to 50 but 7 and 21, in 4 partitions (the operator's
    # form, and the decorator's)
    ids_table(source)
    source.run("CREATE TABLE pt_ids_sink (id INTEGER NOT NULL)")

    # When the job runs
    run = run_dag(dag_id, logical_date=DAY)

    # Then every partition wrote only ids of the reader's, each once, and the summary accounts for them
    assert str(run.state) == "success"
    assert sorted(r[0] for r in source.run("SELECT id FROM pt_ids_sink")) == [i for i in range(1, 51) if i not in (7, 21)]
    summary = xcom(run, "export.summary", required=True)
    assert (summary["planned"], summary["processed"], summary["shortfall"], summary["more"]) == (48, 48, 0, 0)


def test_check_partitioned_keeps_to_the_reader_s_bounds(tmp_path: Path, checkpoints: Store) -> None:
    import sqlite3

    from airflow_resumable.testing import Interruption, check_partitioned

    path = tmp_path / "ids.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE pt_ids (id INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO pt_ids VALUES (?)", [(i,) for i in range(1, 101)])
    reader = KeysetReader(connect=lambda: sqlite3.connect(path), table="pt_ids", key="id", until=50,
                          where="id <> ?", params=(7,))
    seen: set[int] = set()  # an idempotent sink: a repeated chunk writes the same ids
    report = check_partitioned(reader, lambda ctx, batch: seen.update(r[0] for r in batch), partitions=4,
                               chunk_size=10, store=checkpoints, snapshot=lambda: sorted(seen), reset=seen.clear,
                               interruptions=[Interruption.CRASH_BEFORE_CHECKPOINT], name="bounded")
    report.assert_ok()
    ids = sorted(i for r in report.reports.values() for i in r.snapshot)
    assert ids == [i for i in range(1, 51) if i != 7]


# -- 2. a checkpoint keeps to its reader ------------------------------------------------------------------


def test_a_reader_s_identity_names_what_its_positions_depend_on_and_nothing_else() -> None:
    from airflow_resumable.readers import sql_reader

    def ident(conn_id: str = "warehouse", **options: Any) -> Any:
        return sql_reader(conn_id, **{"table": "orders", "key": "id", **options}).identity()

    base = ident()
    assert base == {"reader": "keyset", "connection": "warehouse", "table": "orders", "key": ["id"]}
    # what a row looks like is not where a position points
    assert ident(columns=("id", "amount"), as_dict=True) == base
    named = KeysetReader(connect=lambda: None, table="orders", key="id", name="orders!").identity()
    assert named == KeysetReader(connect=lambda: None, table="orders", key="id").identity()
    # where it points is
    changed = [ident("replica"), ident(key=("placed_on", "id")), ident(table="orders_v2"), ident(where="id > 0"),
               ident(where="id > %s", params=(5,)), ident(where="id > %s", params=(6,)), ident(until=99),
               sql_reader("warehouse", key="id", query="SELECT * FROM orders").identity()]
    assert all(c != base for c in changed) and len({json.dumps(c, sort_keys=True) for c in changed}) == len(changed)
    assert base != {**base, "range": {"after": None, "until": 9}}
    bounded = KeysetReader(connect=lambda: None, table="orders", key="id").within(9, after=3).identity()
    assert bounded["range"] == {"after": 3, "until": 9}


class Fail(Exception):
    """The first attempt's failure, after its third chunk."""


def failing_run(store: Store, reader: Any, seen: list[int], *, fail_after: int | None = 3, attempt: int = 1,
                restart: bool = False) -> Any:
    """One attempt of the slot ``keyed`` with ``reader``: fails after ``fail_after`` chunks (None: runs to its end)."""
    chunks = [0]

    def process(ctx: Any, batch: list[Any]) -> None:
        seen.extend(r[0] for r in batch)
        chunks[0] += 1
        if fail_after is not None and chunks[0] > fail_after:
            raise Fail("the worker died")

    handler = chunk_loop(reader, process, chunk_size=5)
    return Attempt(
        store, Identity(job="keyed", slot=SLOT, attempt=attempt, owner=f"o{attempt}"), options=Options(restart=restart),
    ).run(handler)


CHANGES = {
    "key": {"key": "code"},
    "table": {"table": "pt_ids_copy"},
    "where": {"where": "id > 0"},
    "until": {"until": 90},
    "params": {"where": "id <> {m}", "params": (1000,)},
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_an_attempt_whose_reader_changed_refuses_before_reading_naming_both_readers_and_the_choices(
    store: Store, source: Source, change: str
) -> None:
    # Given a slot whose first attempt read 15 ids with a reader on id, then failed
    ids_table(source)
    ids_table(source, name="pt_ids_copy")
    base: dict[str, Any] = {"table": "pt_ids", "key": "id"}
    if change == "params":
        base.update(where=f"id <> {source.marker}", params=(999,))
    first: list[int] = []
    with pytest.raises(Fail):
        failing_run(store, KeysetReader(connect=source.connect, **base), first)
    with store.open() as s:
        before = s.checkpoints.load("keyed", SLOT)
    assert before.position == 15 and before.reader["key"] == ["id"]

    # When the next attempt's reader differs in its key, table, where, until or params
    options = {k: (v.format(m=source.marker) if isinstance(v, str) else v) for k, v in CHANGES[change].items()}
    again: list[int] = []
    with pytest.raises(ReaderChanged) as err:
        failing_run(store, KeysetReader(connect=source.connect, **{**base, **options}), again, attempt=2)

    # Then it read nothing, the checkpoint is as it was (failed, not done), and the error names both
    # readers, what differs, the job, the slot and the two ways on
    assert again == []
    text = str(err.value)
    assert f"{change}:" in text and "job='keyed'" in text and f"slot='{SLOT}'" in text
    assert err.value.stored == before.reader and err.value.current != before.reader
    assert "Put the reader back as it was" in text and "airflow resumable restart 'keyed'" in text
    with store.open() as s:
        after = s.checkpoints.load("keyed", SLOT)
    assert (after.status, after.position, after.processed, after.reader) == ("failed", 15, 15, before.reader)
    assert "ReaderChanged" in (after.last_error or "")

    # And with the reader put back the slot resumes where it stopped and reads the rest once
    rest: list[int] = []
    failing_run(store, KeysetReader(connect=source.connect, **base), rest, fail_after=None, attempt=3)
    assert rest[0] == 16 and len(rest) == len(set(rest)) and set(first + rest) >= set(range(1, 101)) - {999}


def test_a_slot_restarted_on_purpose_takes_the_new_reader(store: Store, source: Source) -> None:
    ids_table(source)
    with pytest.raises(Fail):
        failing_run(store, KeysetReader(connect=source.connect, table="pt_ids", key="id"), [])
    seen: list[int] = []
    outcome = failing_run(store, KeysetReader(connect=source.connect, table="pt_ids", key="code"), seen, fail_after=None,
                          attempt=2, restart=True)
    assert outcome.checkpoint.status == "done" and outcome.checkpoint.reader["key"] == ["code"]
    assert sorted(seen) == list(range(1, 101))


def test_a_row_without_a_reader_resumes_and_records_the_reader_from_then_on(store: Store, source: Source) -> None:
    # Given a slot stopped at id 15 by a release that recorded no reader
    ids_table(source)
    with pytest.raises(Fail):
        failing_run(store, KeysetReader(connect=source.connect, table="pt_ids", key="id"), [])
    with store.open() as s:
        s.execute("UPDATE resumable_checkpoints SET reader = NULL")
        s.commit()

    # When the next attempt runs, it resumes and records its reader; one after it with another key refuses
    seen: list[int] = []
    with pytest.raises(Fail):
        failing_run(store, KeysetReader(connect=source.connect, table="pt_ids", key="id"), seen, attempt=2)
    assert seen[0] == 16
    with store.open() as s:
        assert s.checkpoints.load("keyed", SLOT).reader["key"] == ["id"]
    with pytest.raises(ReaderChanged):
        failing_run(store, KeysetReader(connect=source.connect, table="pt_ids", key="code"), [], attempt=3)


def test_a_handler_that_owns_its_loop_is_held_to_its_reader_through_chunks(store: Store) -> None:
    def handler_of(name: str) -> Any:
        def handler(ctx: Any) -> None:
            reader = SequenceReader(list(range(20)), name=name)
            for batch in reader.chunks(ctx, 5):
                ctx.checkpoint(batch.position, processed=ctx.processed + len(batch))
                if ctx.attempt == 1 and batch.position >= 9:
                    raise Fail("stop")
        return handler

    with pytest.raises(Fail):
        Attempt(store, Identity(job="own", slot=SLOT, attempt=1, owner="o1")).run(handler_of("orders"))
    with pytest.raises(ReaderChanged, match="name: 'orders' -> 'invoices'"):
        Attempt(store, Identity(job="own", slot=SLOT, attempt=2, owner="o2")).run(handler_of("invoices"))
    assert Attempt(
        store, Identity(job="own", slot=SLOT, attempt=3, owner="o3"),
    ).run(handler_of("orders")).checkpoint.processed == 20


def test_a_partition_s_checkpoint_records_its_range_and_refuses_another(store: Store, source: Source) -> None:
    ids_table(source)
    reader = KeysetReader(connect=source.connect, table="pt_ids", key="id")
    seen: list[int] = []
    chunks = [0]

    def process(ctx: Any, batch: list[Any]) -> None:
        seen.extend(r[0] for r in batch)
        chunks[0] += 1
        if chunks[0] == 2 and ctx.attempt == 1:
            raise Fail("stop")

    def run(rng: Any, attempt: int) -> Any:
        return Attempt(store, Identity(job="pt[1]", slot=SLOT, attempt=attempt, owner=f"o{attempt}")).run(
            chunk_loop(process=process, chunk_size=5, **range_chunks(reader, rng)))

    ranges = split(reader, 4, job="pt", slot=SLOT).ranges()
    with pytest.raises(Fail):
        run(ranges[1], 1)
    moved = type(ranges[1])(1, 20, 60)  # a hand-edited plan's range
    with pytest.raises(ReaderChanged, match="range:") as err:
        run(moved, 2)
    assert "restart the whole job instead: `airflow resumable restart 'pt#plan'" in str(err.value)
    assert run(ranges[1], 3).checkpoint.processed == 25


def test_an_older_database_with_an_unfinished_slot_upgrades_and_the_slot_resumes_under_its_reader(
    store: Store, store_kind: str
) -> None:
    from airflow_resumable.core.stores.migrations import SCHEMA_VERSION
    from fixtures import schema_v1

    # Given the first release's tables with a slot stopped at item 12,000 of 30,000 (no reader recorded)
    with store.open() as s:
        schema_v1.create(s.conn, store_kind)
    seen: list[int] = []

    def handler_with(name: str) -> Any:
        return chunk_loop(SequenceReader(range(30_000), name=name), lambda ctx, batch: seen.extend(batch),
                          chunk_size=3000)

    # When this release runs the slot's next attempt with a reader
    outcome = Attempt(
        store, Identity(job=schema_v1.JOB, slot=schema_v1.SLOT, attempt=2, owner="new"),
    ).run(handler_with("loans"))

    # Then the database was migrated, the slot resumed after its position, and its row names the reader
    with store.open() as s:
        assert s.execute("SELECT value FROM resumable_meta WHERE key = 'schema_version'").fetchone()[0] == str(
            SCHEMA_VERSION)
    assert seen[0] == 12_001 and outcome.checkpoint.status == "done"
    assert outcome.checkpoint.reader == {"reader": "sequence", "name": "loans"}


# -- the plan keeps to its reader ----------------------------------------------------------------------


def test_the_plan_records_its_reader_and_refuses_a_hand_edited_plan(store: Store, source: Source) -> None:
    from airflow_resumable.core.work.partitions import save_plan

    ids_table(source)
    reader = KeysetReader(connect=source.connect, table="pt_ids", key="id")
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "pt", SLOT, split(reader, 4, job="pt", slot=SLOT))
        assert plan.reader == json.loads(json.dumps(reader.identity()))
        state = s.checkpoints.load("pt#plan", SLOT).state
        state["boundaries"][1] = 80  # ranges (25, 80] and (75, 100] would both read 76..80
        s.execute("UPDATE resumable_checkpoints SET state = %s WHERE job = 'pt#plan'", (json.dumps(state),))
        s.commit()
        with pytest.raises(ConfigurationError, match="changed after the plan was stored") as err:
            load_plan(s, "pt", SLOT)
    assert "airflow resumable restart 'pt#plan'" in str(err.value)


def _fresh_dag(dag_id: str, key: str | None, monkeypatch: pytest.MonkeyPatch, tag: str) -> Any:
    """The DAG ``dag_id`` as its file reads with ``PT_TEST_KEY`` = ``key`` (None: unset): the file
    parsed anew, as a worker does after someone changed it."""
    import os
    from pathlib import Path

    from devtools.dags import DagFolder

    if key is None:
        monkeypatch.delenv("PT_TEST_KEY", raising=False)
    else:
        monkeypatch.setenv("PT_TEST_KEY", key)
    return DagFolder(Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]), f"_pt_bounds_{tag}_").load(dag_id)


def test_a_range_planned_with_another_reader_is_refused_before_its_partition_reads(source: Source) -> None:
    """What a partition checks first, before its checkpoint is even looked at: a partition that
    failed before its first checkpoint has no progress for its row to protect, and the plan task is
    not run again by "Re-run failed partitions", so its range (planned with the old key) must not
    be read with a new one."""
    from airflow_resumable.core.work.partitions import check_range_reader

    old = KeysetReader(connect=source.connect, table="pt_ids", key="id")
    new = KeysetReader(connect=source.connect, table="pt_ids", key="code")
    rng = Plan(2, (50,), 100, old.identity()).ranges()[1]
    check_range_reader(rng, old, job="pt[1]", slot=SLOT)
    with pytest.raises(ReaderChanged) as err:
        check_range_reader(rng, new, job="pt[1]", slot=SLOT, planned_with=old.identity())
    text = str(err.value)
    assert "key: ['id'] -> ['code']" in text and "job='pt[1]'" in text
    assert "airflow resumable restart 'pt#plan'" in text
    with pytest.raises(ReaderChanged, match="a reader whose identity's digest is"):
        check_range_reader(rng, new, job="pt[1]", slot=SLOT)  # the plan row unreadable: its digest named


def test_a_changed_key_refuses_the_plan_and_the_partition_and_a_restart_of_the_plan_splits_anew(
    checkpoints: Store, source: Source, airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_resumable import control
    from support.partition_source import table

    # Given 40 rows on (grp, id), and a run whose partition 2 failed in its second chunk (one tolerated)
    table(source, [("a" if i < 30 else "b", i) for i in range(40)])
    job = "pt_tolerant.export"
    first = _fresh_dag("pt_tolerant", None, monkeypatch, "a").test(run_conf={"fail": {"2": [1]}}, logical_date=DAY)
    assert str(first.state) == "success"
    with checkpoints.open() as s:
        stopped = s.checkpoints.load(f"{job}[2]", SLOT)
    assert (stopped.status, stopped.processed) == ("failed", 3)

    # When the DAG file pages on another unique column (id) and the run runs again
    again = _fresh_dag("pt_tolerant", "id", monkeypatch, "b").test(logical_date=DAY)

    # Then the planning task refuses, naming both keys: nothing was read and nothing is done
    assert str(again.state) == "failed"
    assert str(again.get_task_instance("export.plan").state) == "failed"
    with checkpoints.open() as s:
        row = s.checkpoints.load(f"{job}[2]", SLOT)
    assert (row.status, row.position, row.processed) == ("failed", stopped.position, 3)

    # And a partition whose plan records no reader (made before plans recorded one, sealed) refuses on its own
    with checkpoints.open() as s:
        plan = s.checkpoints.load(f"{job}#plan", SLOT).state
        legacy = {k: v for k, v in plan.items() if k not in ("reader", "seal")}
        legacy["seal"] = identity_digest(legacy)
        s.execute("UPDATE resumable_checkpoints SET state = %s WHERE job = %s", (json.dumps(legacy), f"{job}#plan"))
        s.commit()
    third = _fresh_dag("pt_tolerant", "id", monkeypatch, "c").test(logical_date=DAY)
    assert str(third.get_task_instance("export.partition", map_index=2).state) == "failed"
    with checkpoints.open() as s:
        row = s.checkpoints.load(f"{job}[2]", SLOT)
    assert (row.status, row.processed) == ("failed", 3) and "ReaderChanged" in (row.last_error or "")
    assert "key: ['grp', 'id'] -> ['id']" in row.last_error

    # When the job is restarted on purpose with the new key: its plan is split anew, every partition starts over
    control.restart(f"{job}#plan", SLOT, by="dora")
    fourth = _fresh_dag("pt_tolerant", "id", monkeypatch, "d").test(logical_date=DAY)
    assert str(fourth.state) == "success"
    with checkpoints.open() as s:
        rows = [s.checkpoints.load(f"{job}[{i}]", SLOT) for i in range(4)]
        replanned = load_plan(s, job, SLOT)
    assert replanned is not None and replanned.reader["key"] == ["id"]
    assert [(r.status, r.processed, r.reader["key"]) for r in rows] == [("done", 10, ["id"])] * 4
    summary = xcom(fourth, "export.summary", required=True)
    assert (summary["planned"], summary["processed"], summary["shortfall"]) == (40, 40, 0)
