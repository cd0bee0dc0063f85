"""Rebalancing, the victim's side: an ask written in a running partition's row comes back with its
next checkpoint, and the partition cuts what is left of its range at the middle of the rows after
its saved position, agrees the split with the plan in one transaction fenced by its lease, and
reads on only up to the cut. The taken range, run as a slot of its own, holds exactly the rest.

On both stores (the readers read the store's own database).
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core import Attempt, chunk_loop
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work import rebalance
from airflow_resumable.core.work.partitions import load_plan, range_chunks, save_plan, split
from support.rebalancing import DAY, SLOT, ask_at, ids_table, run_range, split_after_10
from support.sources import Source


def test_an_asked_partition_gives_the_upper_half_of_what_it_has_left_and_every_row_is_read_once(
    store: Store, source: Source
) -> None:
    # Given ids 1..100 split in two ranges (1..50, 51..100), stored as the slot's plan
    reader = ids_table(source)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "rb", SLOT, split(reader, 2, job="rb", slot=SLOT))
    first, second = plan.ranges()

    # When partition 0 is asked for part of its range during its second chunk (5 rows per chunk)
    during = ask_at(store, "rb[0]", 2)
    kept = run_range(store, "rb[0]", reader, first, during=during)

    # Then the ask was accepted, and at that chunk's checkpoint (10 rows read, 40 left) it cut the
    # 40 rows after id 10 in two: it read on up to id 30 only
    assert during.asked == [True]
    assert kept == list(range(1, 31))
    with store.open(autocommit=True) as s:
        agreed = load_plan(s, "rb", SLOT)
        row = s.checkpoints.load("rb[0]", SLOT)
    assert agreed is not None and len(agreed.splits) == 1
    cut = agreed.splits[0]
    assert (cut.number, cut.of, cut.at, cut.by) == (1, "0", 30, "thief")
    # its row names the range it kept (a retry's reader must be that one) and its total is what it read
    assert row is not None and row.split_request is None
    assert row.reader["range"] == {"after": None, "until": 30}
    assert (row.status, row.processed, row.total) == ("done", 30, 30)

    # And the taken range, run as a slot of its own, holds exactly the rest: every row once
    taken = agreed.current()["0.1"]
    assert taken.job("rb") == "rb[0].1"
    stolen = run_range(store, taken.job("rb"), reader, taken)
    rest = run_range(store, "rb[1]", reader, second)
    assert sorted(kept + stolen + rest) == list(range(1, 101))
    assert stolen == list(range(31, 51))


def test_a_split_range_is_split_again_from_its_own_slot(store: Store, source: Source) -> None:
    reader = ids_table(source)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "rb", SLOT, split(reader, 1, job="rb", slot=SLOT))
    kept = run_range(store, "rb[0]", reader, plan.ranges()[0], during=ask_at(store, "rb[0]", 1, by="a"))
    with store.open(autocommit=True) as s:
        taken = load_plan(s, "rb", SLOT).current()["0.1"]  # type: ignore[union-attr]
    stolen = run_range(store, "rb[0].1", reader, taken, during=ask_at(store, "rb[0].1", 1, by="b"))
    with store.open(autocommit=True) as s:
        agreed = load_plan(s, "rb", SLOT)
    assert agreed is not None and [(c.of, c.by) for c in agreed.splits] == [("0", "a"), ("0.1", "b")]
    again = run_range(store, "rb[0].2", reader, agreed.current()["0.2"])
    assert sorted(kept + stolen + again) == list(range(1, 101))
    assert all(seen for seen in (kept, stolen, again))


def test_an_ask_the_thief_withdrew_before_the_checkpoint_changes_nothing(store: Store, source: Source) -> None:
    reader = ids_table(source, 20)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "rb", SLOT, split(reader, 1, job="rb", slot=SLOT))

    def during(n: int) -> None:
        if n == 1:
            with store.open(autocommit=True) as s:
                assert rebalance.ask(s, "rb[0]", SLOT, "thief")
                assert rebalance.withdraw(s, "rb[0]", SLOT, "thief")

    seen = run_range(store, "rb[0]", reader, plan.ranges()[0], during=during)
    with store.open(autocommit=True) as s:
        assert load_plan(s, "rb", SLOT).splits == ()  # type: ignore[union-attr]
    assert seen == list(range(1, 21))


@pytest.mark.parametrize("why", ["no plan range", "too few rows"])
def test_a_split_that_cannot_be_agreed_is_declined_and_the_ask_cleared(store: Store, source: Source, why: str) -> None:
    reader = ids_table(source, 6)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "rb", SLOT, split(reader, 1, job="rb", slot=SLOT))
    job = "other[0]" if why == "no plan range" else "rb[0]"
    # "too few rows": asked in the last full chunk, when one row is left after it
    seen = run_range(store, job, reader, plan.ranges()[0], during=ask_at(store, job, 1))
    with store.open(autocommit=True) as s:
        assert load_plan(s, "rb", SLOT).splits == ()  # type: ignore[union-attr]
        row = s.checkpoints.load(job, SLOT)
    assert seen == list(range(1, 7))
    assert row is not None and row.split_request is None and row.total == 6


def test_an_ask_is_taken_only_by_a_running_holder_and_the_attempt_s_end_clears_it(store: Store, source: Source) -> None:
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        assert not rebalance.ask(s, "rb[0]", SLOT, "thief")  # no row
    seen: list[bool] = []

    def handler(ctx: Any) -> None:  # asked, and never checkpoints again
        with store.open(autocommit=True) as s:
            seen.append(rebalance.ask(s, "rb[0]", SLOT, "thief"))
            seen.append(rebalance.ask(s, "rb[0]", SLOT, "another"))  # one ask at a time

    Attempt(store, Identity(job="rb[0]", slot=SLOT, attempt=1, owner="o")).run(handler)
    with store.open(autocommit=True) as s:
        row = s.checkpoints.load("rb[0]", SLOT)
        assert not rebalance.ask(s, "rb[0]", SLOT, "thief")  # done
    assert seen == [True, False]
    assert row is not None and row.status == "done" and row.split_request is None


# -- in DAG runs ------------------------------------------------------------------------------------------


def split_partition_1(checkpoints: Store, source: Source, *, job: str = "pt_export.export", rows: int = 40,
                      kept: int = 5) -> None:
    """``rows`` rows in ``pt_source`` (40: 10 a partition), planned for ``job``'s run in 4
    partitions, and partition 1's range split after its first ``kept`` rows (5: its middle) by an
    idle partition that died before it started the taken range (``1.1``: no row; the split records
    no time, so it is nobody's at once)."""
    from airflow_resumable.readers import sql_reader
    from support.partition_source import table

    table(source, [("a" if i < 30 else "b", i) for i in range(rows)])
    reader = sql_reader("resumable_default", table="pt_source", key=("grp", "id"))
    with checkpoints.open(autocommit=True) as s:
        s.ensure_schema()
        plan = split(reader, 4, job=job, slot=SLOT)
        middle = plan.boundaries[0][:1] + [plan.boundaries[0][1] + kept]
        save_plan(s, job, SLOT, plan.with_split(of="1", at=middle, by="a thief that died"))


def test_a_range_a_split_took_and_nobody_started_is_run_by_an_idle_partition_and_counted_once(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    from support.xcoms import xcom

    # Given 40 rows, planned for the run in 4 partitions, and partition 1's range split at the
    # middle by an idle partition that died before it started the taken range ("1.1": no row)
    split_partition_1(checkpoints, source)

    # When the run goes (dag.test(): one task instance at a time)
    run = run_dag("pt_export", logical_date=DAY)

    # Then partition 1 read only what it kept, an idle partition ran the taken range as its own
    # slot, every row is in the sink once, and the summary counts partition 1's line whole
    assert str(run.state) == "success"
    written = source.run("SELECT grp, id FROM pt_sink")
    assert sorted(written) == sorted(source.run("SELECT grp, id FROM pt_source"))
    with checkpoints.open() as s:
        kept = s.checkpoints.load("pt_export.export[1]", SLOT)
        taken = s.checkpoints.load("pt_export.export[1].1", SLOT)
    assert kept is not None and taken is not None
    assert (kept.status, kept.processed, taken.status, taken.processed) == ("done", 5, "done", 5)
    summary = xcom(run, "export.summary", required=True)
    assert (summary["done"], summary["planned"], summary["processed"], summary["unfinished"]) == (4, 40, 40, 0)
    # And the summary, and the job's line, show the range as it is now: taken from [1], by whom, and
    # run by the idle partition's task instance, done; the line counts the plan's 4 partitions. Which
    # one is Airflow's order of the mapped task instances, which it does not fix: partition 1 itself,
    # when it runs first, is idle once it has read what it kept, and takes the range up
    runner = taken.map_index
    assert runner is not None and 0 <= runner < 4
    split_view = {"range": "1.1", "job": "pt_export.export[1].1", "from": "pt_export.export[1]",
                  "by": "a thief that died", "map_index": runner, "status": "done", "processed": 5, "total": 5}
    assert [{k: s[k] for k in split_view} for s in summary["splits"]] == [split_view], summary["splits"]
    from airflow_resumable.core.control import requests as core_control

    line = next(j for j in core_control.jobs(checkpoints) if j["job"] == "pt_export.export")
    assert {k: v for k, v in line["partitions"].items() if v} == {"done": 4, "total": 4}, line
    assert (line["processed"], line["total"]) == (40, 40)
    assert [{k: s[k] for k in split_view} for s in line["splits"]] == [split_view], line["splits"]


def test_a_taken_range_a_person_paused_or_cancelled_is_not_claimed_by_an_idle_partition(
    store: Store, source: Source
) -> None:
    from airflow_resumable.core.control import requests as control

    reader, plan = split_after_10(store, source)
    agreed = plan.with_split(of="0.1", at=25, by="t2")
    with store.open(autocommit=True) as s:
        with s.transaction():
            s.plans.hold("rb", SLOT, exclusive=True)
            s.plans.write("rb", SLOT, agreed.state())
    # "rb[0].1" never started; "rb[0].2" paused by a person mid-way
    paused: list[bool] = []
    from airflow_resumable.core.model.errors import Paused

    def pause_once(n: int) -> None:
        if n == 1 and not paused:
            control.pause(store, "rb[0].2", SLOT, by="carol")
            paused.append(True)

    with pytest.raises(Paused):
        run_range(store, "rb[0].2", reader, agreed.current()["0.2"], during=pause_once)
    with store.open(autocommit=True) as s:
        free = rebalance.unclaimed(s, "rb", SLOT, agreed)
    assert [r.name for r in free] == ["0.1"]


@pytest.mark.parametrize("reason", ["shutdown", "timeout", "handover"])
def test_a_taken_range_its_runner_stopped_for_a_retry_is_claimed_by_an_idle_partition(
    store: Store, source: Source, reason: str
) -> None:
    # Given a range a split took, whose runner stopped at a chunk for a reason its task retries (its
    # worker drained, its timeout): the row is cancelled with that reason and its lease released
    from airflow_resumable.core.model.errors import Cancelled

    reader, plan = split_after_10(store, source)

    def stop(n: int) -> None:
        raise Cancelled(reason)

    with pytest.raises(Cancelled):
        run_range(store, "rb[0].1", reader, plan.current()["0.1"], during=stop)
    # When an idle partition (the task's retry among them) looks for work
    with store.open(autocommit=True) as s:
        row = s.checkpoints.load("rb[0].1", SLOT)
        free = rebalance.unclaimed(s, "rb", SLOT, plan)
    # Then it runs that range: nothing else would (a person's cancel alone is left as they asked)
    assert row is not None and (row.status, row.stop_reason, row.lease_owner) == ("cancelled", reason, None)
    assert [r.name for r in free] == ["0.1"]


@pytest.mark.parametrize("agreed", [False, True], ids=["declined by the plan", "agreed"])
def test_a_victim_writing_through_its_transaction_answers_a_split_and_reads_on(
    store: Store, source: Source, agreed: bool
) -> None:
    # Given a partition that writes each chunk through ctx.transaction() (its writes commit with its
    # checkpoints), asked for a split during its first chunk: one the plan agrees, or one it refuses
    # (the plan's range "0" of job "other" is not the range the attempt reads)
    reader = ids_table(source, 20)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        s.execute("CREATE TABLE rb_sink (id INTEGER PRIMARY KEY)")
        plan = save_plan(s, "rb", SLOT, split(reader, 1, job="rb", slot=SLOT))
        save_plan(s, "other", SLOT, split(reader, 2, job="other", slot=SLOT))
    job = "rb[0]" if agreed else "other[0]"
    asked = ask_at(store, job, 1)
    chunks = [0]

    def process(ctx: Any, batch: Any) -> None:
        chunks[0] += 1
        asked(chunks[0])
        for r in batch:
            ctx.transaction().execute("INSERT INTO rb_sink (id) VALUES (%s)", (r[0],))

    handler = chunk_loop(process=process, chunk_size=5, **range_chunks(reader, plan.ranges()[0]))
    Attempt(store, Identity(job=job, slot=SLOT, attempt=1, owner="o")).run(handler)

    # Then the answer undid nothing of the chunk's writes (a refusal used to roll the chunk's
    # transaction back, and the attempt failed at its next checkpoint), and the attempt read what
    # it kept once
    assert asked.asked == [True]
    with store.open(autocommit=True) as s:
        row = s.checkpoints.load(job, SLOT)
        written = [r[0] for r in s.execute("SELECT id FROM rb_sink ORDER BY id").fetchall()]
        splits = load_plan(s, "rb", SLOT).splits  # type: ignore[union-attr]
    kept = 12 if agreed else 20  # agreed at id 5: the 15 rows after it cut after the 7th
    assert row is not None and (row.status, row.processed, row.split_request) == ("done", kept, None)
    assert written == list(range(1, kept + 1))
    assert [(c.of, c.at) for c in splits] == ([("0", 12)] if agreed else [])


def test_an_ask_withdrawn_while_the_victim_cuts_is_not_agreed(
    store: Store, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a partition asked for a split during its first chunk, whose thief withdraws the ask
    # (its wait ran out: withdraw() says it was not answered, so the thief goes away) after the
    # checkpoint read the ask back, while the victim is still counting where to cut
    reader = ids_table(source, 20)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "rb", SLOT, split(reader, 1, job="rb", slot=SLOT))
    withdrawn: list[bool] = []
    cut = KeysetReader.split_point

    def split_point(self: KeysetReader, after: Any) -> Any:
        with store.open(autocommit=True) as s:
            withdrawn.append(rebalance.withdraw(s, "rb[0]", SLOT, "thief"))
        return cut(self, after)

    monkeypatch.setattr(KeysetReader, "split_point", split_point)
    seen = run_range(store, "rb[0]", reader, plan.ranges()[0], during=ask_at(store, "rb[0]", 1))

    # Then the victim did not agree a split nobody waits for (it would leave a taken range that
    # its asker never runs): it read its whole range
    assert withdrawn == [True]
    with store.open(autocommit=True) as s:
        assert load_plan(s, "rb", SLOT).splits == ()  # type: ignore[union-attr]
        row = s.checkpoints.load("rb[0]", SLOT)
    assert seen == list(range(1, 21))
    assert row is not None and (row.processed, row.total, row.split_request) == (20, 20, None)


def test_a_partition_that_ran_a_taken_range_confirms_its_own_slot_too(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:

    # Given a plan whose partition 1 gave a range away to a thief that died before starting it
    split_partition_1(checkpoints, source)

    # When the run goes, an idle partition running the taken range after its own
    run = run_dag("pt_export", logical_date=DAY)

    # Then every slot a task instance finished is marked confirmed once Airflow recorded its
    # success: its own range's as well as the taken one's (the success callback of the taken
    # range replaced its own, so a later Clear of that partition found its row done and
    # unconfirmed, and finished without redoing the work it was cleared to redo)
    assert str(run.state) == "success"
    with checkpoints.open() as s:
        rows = {job: s.checkpoints.load(job, SLOT) for job in [f"pt_export.export[{i}]" for i in range(4)]
                + ["pt_export.export[1].1"]}
    assert {job: (r.status, r.confirmed_at is not None) for job, r in rows.items() if r is not None} == {
        job: ("done", True) for job in rows}


def test_a_restart_of_the_plan_starts_the_taken_ranges_of_the_old_plan_over_too(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    from airflow_resumable import control
    from support.partition_source import table

    # Given a run in which partition 1 gave half of what it had left to an asker that went away,
    # and ran that range ("1.1") itself once its own was done
    rows = [("a" if i < 30 else "b", i) for i in range(40)]
    table(source, rows)
    conf = {"ask": {"1": "a thief that went away"}}
    assert str(run_dag("pt_export", conf=conf, logical_date=DAY).state) == "success"
    with checkpoints.open() as s:
        first = s.checkpoints.load("pt_export.export[1].1", SLOT)
    assert first is not None and first.status == "done" and first.processed > 0
    source.run("DELETE FROM pt_sink")

    # When someone restarts the job's plan (every partition starts over) and the run runs again,
    # partition 1 again giving half of what it has left away (split "1.1" of the new plan)
    control.restart("pt_export.export#plan", SLOT, by="dora")
    again = run_dag("pt_export", conf=conf, logical_date=DAY)

    # Then the new plan's taken range was read in this run: the old plan's done row of the same
    # name did not stand in for it (nobody ran it, and the summary counted the old row's rows)
    assert str(again.state) == "success"
    assert sorted(source.run("SELECT grp, id FROM pt_sink")) == sorted(rows)
    with checkpoints.open() as s:
        plan = load_plan(s, "pt_export.export", SLOT)
    assert plan is not None and [(c.of, c.by) for c in plan.splits] == [("1", "a thief that went away")]


def test_an_answer_that_records_a_narrowed_reader_without_the_plan_s_agreement_is_refused(
    store: Store, source: Source
) -> None:
    from airflow_resumable.core.model.errors import ConfigurationError

    reader = ids_table(source, 10)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "rb", SLOT, split(reader, 1, job="rb", slot=SLOT))
    refused: list[str] = []

    def handler(ctx: Any) -> None:
        with store.open(autocommit=True) as s:
            assert rebalance.ask(s, "rb[0]", SLOT, "thief")
        try:
            ctx.answer_split(reader.within(5, after=None), total=5)  # no agree=: the plan would not hold it
        except ConfigurationError as exc:
            refused.append(exc.message)
        ctx.answer_split()  # declined instead

    Attempt(store, Identity(job="rb[0]", slot=SLOT, attempt=1, owner="o")).run(handler)
    with store.open(autocommit=True) as s:
        row = s.checkpoints.load("rb[0]", SLOT)
        stored = load_plan(s, "rb", SLOT)
    assert refused and "without agree=" in refused[0]
    assert row is not None and row.reader is None and row.split_request is None and row.total is None
    assert stored == plan


def test_the_ranges_rows_are_read_at_once_whatever_their_number(store: Store, source: Source) -> None:
    # (an idle partition looks at every range of the plan at each poll: 10,000 partitions must not
    # cost 10,000 statements; the look-up goes 500 names at a time)
    reader = ids_table(source, 12)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "rb", SLOT, split(reader, 2, job="rb", slot=SLOT))
    for rng in plan.ranges():
        run_range(store, rng.job("rb"), reader, rng)
    names = [f"rb[{i}]" for i in range(1200)]
    with store.open(autocommit=True) as s:
        found = s.plans.rows(names, SLOT)
    assert sorted(found) == ["rb[0]", "rb[1]"]
    assert {job: (row.status, row.processed) for job, row in found.items()} == {"rb[0]": ("done", 6),
                                                                                "rb[1]": ("done", 6)}


def _taken_row(checkpoints: Store, job: str) -> Any:
    with checkpoints.open() as s:
        return s.checkpoints.load(job, SLOT)


def _person(steps: dict[str, Any], checkpoints: Store, job: str, then: str) -> Any:
    """A person who pauses ``job`` once it made progress, waits for the pause, then does ``then``
    (``resume`` or ``cancel``); what went wrong is kept in ``steps["error"]``."""
    import threading

    from airflow_resumable import control
    from support.waits import wait_until

    def act() -> None:
        try:
            wait_until(lambda: (r := _taken_row(checkpoints, job)) is not None and r.processed >= 5, "progress",
                       timeout=120)
            control.pause(job, SLOT, by="alice")
            steps["paused"] = wait_until(lambda: (r := _taken_row(checkpoints, job)).status == "paused" and r,
                                         "the pause", timeout=60)
            getattr(control, then)(job, SLOT, by="bob")
        except BaseException as exc:  # surfaced by the test's assertions
            steps["error"] = exc

    helper = threading.Thread(target=act)
    helper.start()
    return helper


TAKEN = "pt_workers.export[1].1"


def _run_with_a_person(checkpoints: Store, source: Source, run_dag: Any, then: str) -> tuple[Any, dict[str, Any]]:
    """80 rows in 4 partitions, partition 1's range split after its first 2 rows, the taken range
    (``TAKEN``: 18 rows, 4 chunks) nobody's; the run, with a person who pauses the taken range
    while an idle partition runs it, then does ``then``. The run and what the person saw."""
    split_partition_1(checkpoints, source, job="pt_workers.export", rows=80, kept=2)
    steps: dict[str, Any] = {}
    helper = _person(steps, checkpoints, TAKEN, then)
    run = run_dag("pt_workers", conf={"delay": 0.3}, logical_date=DAY)
    helper.join(60)
    assert "error" not in steps, steps.get("error")
    return run, steps


def test_a_taken_range_a_person_pauses_defers_its_runner_which_goes_on_with_it_once_resumed(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    from support.xcoms import xcom

    # Given a range a split took, nobody's; when a person pauses it while an idle partition runs
    # it, then resumes it
    run, steps = _run_with_a_person(checkpoints, source, run_dag, "resume")
    # Then the range paused mid-way, the task instance running it waited (deferred, no retry used)
    # and went on with it from its checkpoint: every row once, the range done, the run a success
    paused = steps["paused"]
    assert paused.stop_reason == "paused" and 5 <= paused.processed < 18
    assert str(run.state) == "success"
    assert sorted(source.run("SELECT grp, id FROM pt_sink")) == sorted(source.run("SELECT grp, id FROM pt_source"))
    row = _taken_row(checkpoints, TAKEN)
    assert (row.status, row.processed, row.resumed_from) == ("done", 18, paused.position)
    ti = run.get_task_instance("export.partition", map_index=row.map_index)
    assert ti.try_number == 1
    # And that task instance returns its own range's summary
    own = _taken_row(checkpoints, f"pt_workers.export[{row.map_index}]")
    mine = xcom(run, "export.partition", map_index=row.map_index, required=True)
    assert (mine["status"], mine["processed"]) == ("done", own.processed), mine


def test_a_taken_range_cancelled_while_paused_is_taken_up_again_by_a_clear_of_the_task_instance_that_ran_it(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    # Given the taken range of the test above, paused by a person mid-way, then cancelled
    first, _ = _run_with_a_person(checkpoints, source, run_dag, "cancel")
    # Then the task instance running it fails (the cancel is carried out), nobody else claims the
    # range, and the job is not a success over rows it did not read
    row = _taken_row(checkpoints, TAKEN)
    assert row.status == "cancelled" and row.processed < 18
    assert str(first.get_task_instance("export.partition", map_index=row.map_index).state) == "failed"
    assert str(first.state) == "failed"
    # When the run goes again (a Clear of it)
    again = run_dag("pt_workers", conf={"delay": 0}, logical_date=DAY)
    # Then the task instance that ran the range takes it up from its checkpoint: every row once
    assert str(again.state) == "success"
    assert sorted(source.run("SELECT grp, id FROM pt_sink")) == sorted(source.run("SELECT grp, id FROM pt_source"))
    done = _taken_row(checkpoints, TAKEN)
    assert (done.status, done.processed, done.map_index) == ("done", 18, row.map_index)


def test_an_idle_partition_whose_time_is_spent_takes_nothing_and_asks_nobody(store: Store, source: Source) -> None:
    import time

    # Given a plan with a range a split took that nobody runs
    _, plan = split_after_10(store, source, partitions=2)
    with store.open(autocommit=True) as s:
        assert [r.name for r in rebalance.unclaimed(s, "rb", SLOT, plan)] == ["0.1"]
    ran: list[str] = []

    def run(rng: Any) -> bool:
        ran.append(rng.name)
        return False

    # When an idle partition looks for work with its time (its try's cooperative timeout) spent
    took = rebalance.take_more(store, "rb", SLOT, "rb[1] (try 1)", run, more_than=0, until=time.monotonic())
    # Then it runs nothing, and the range is left for another (as it is taken once there is time)
    assert (took, ran) == (0, [])
    assert rebalance.take_more(store, "rb", SLOT, "rb[1] (try 1)", run, more_than=0,
                               until=time.monotonic() + 60) == 1
    assert ran == ["0.1"]
