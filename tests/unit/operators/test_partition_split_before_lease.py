"""A partition whose range a split narrowed between its read of the plan and its taking of the
slot's lease (the slot's holder of the moment agreed the split in that window) runs on the range as
the plan holds it once it holds the lease; a reader changed for real is still refused."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core.model.errors import ReaderChanged
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partitions import load_plan
from support.partition_source import table
from support.rebalancing import DAY, SLOT, give_away_then_stop, run_range
from support.sources import Source

JOB = "pt_export.export"
ROWS = [("a" if i < 30 else "b", i) for i in range(40)]


def race_partition_1(monkeypatch: pytest.MonkeyPatch, checkpoints: Store, **holder_reader: Any) -> dict[str, Any]:
    """Right after partition 1's task reads the slot's plan (before its attempt takes the slot's
    lease), the slot's holder of the moment (its reader: ``pt_source`` on (grp, id), with
    ``holder_reader``'s options) reads two chunks, gives the upper part of what it has left to a
    thief at the second one's checkpoint, and fails in its third; the thief runs what it took. What
    happened, by name, once it has."""
    from airflow_resumable.operators.partitioned import PartitionOperator
    from airflow_resumable.readers import sql_reader

    original = PartitionOperator._plan_now
    raced: dict[str, Any] = {}

    def plan_now(self: Any, slot: str) -> Any:
        plan = original(self, slot)
        if raced or self._taking is not None or self.partition_range["partition"] != 1:
            return plan
        reader = sql_reader("resumable_default", table="pt_source", key=("grp", "id"), **holder_reader)
        raced["before"] = plan
        raced["holder"] = give_away_then_stop(checkpoints, f"{JOB}[1]", reader, plan.current()["1"])
        with checkpoints.open(autocommit=True) as s:
            after = load_plan(s, JOB, SLOT)
        assert after is not None and [cut.of for cut in after.splits] == ["1"]
        raced["after"] = after
        thief = after.current()["1.1"]
        raced["thief"] = run_range(checkpoints, f"{JOB}[1].1", reader, thief, chunk=3, rows=True)
        return plan

    monkeypatch.setattr(PartitionOperator, "_plan_now", plan_now)
    return raced


def partition_rows(source: Source, part: int) -> list[tuple[Any, ...]]:
    """The rows partition ``part``'s task wrote (the DAG writes each row with its partition's index; the holder and the thief write none)."""
    return sorted((g, i) for g, i, p, _ in source.run("SELECT grp, id, part, attempt FROM pt_sink") if p == part)


def test_a_split_agreed_between_the_plan_s_read_and_the_lease_narrows_the_range_the_partition_runs(
    checkpoints: Store, source: Source, run_dag: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 40 rows in 4 partitions (partition 1: ids 10..19), and a holder of partition 1's slot
    # that, right after partition 1's task read the plan, reads ids 10..15, gives the upper part of
    # the rest to a thief (who runs it) and fails
    table(source, ROWS)
    raced = race_partition_1(monkeypatch, checkpoints)

    # When the run goes
    run = run_dag("pt_export", logical_date=DAY)

    # Then partition 1 succeeded on its first try, reading on from the holder's checkpoint up to
    # the cut, as the plan held its range once it held the lease: nothing past the cut
    assert raced["holder"] == [("a", i) for i in range(10, 16)]
    cut = raced["after"].current()["1"].until
    assert cut[0] == "a" and 15 < cut[1] < 19
    assert str(run.get_task_instance("export.partition", map_index=1).state) == "success"
    thief = raced["thief"]
    assert thief == [("a", i) for i in range(cut[1] + 1, 20)]
    assert partition_rows(source, 1) == [("a", i) for i in range(16, cut[1] + 1)]
    with checkpoints.open() as s:
        row = s.checkpoints.load(f"{JOB}[1]", SLOT)
    assert row is not None
    assert (row.status, row.position, row.processed, row.total) == ("done", cut, cut[1] - 9, cut[1] - 9)
    assert row.reader is not None and row.reader["range"]["until"] == cut

    # And the run succeeded with every row read once: the holder's, the thief's and the partitions'
    assert str(run.state) == "success"
    read = raced["holder"] + thief + [tuple(r) for r in source.run("SELECT grp, id FROM pt_sink")]
    assert sorted(read) == sorted(ROWS)


def test_a_reader_changed_for_real_is_refused_though_a_split_narrowed_the_range_in_that_window(
    checkpoints: Store, source: Source, run_dag: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the same race, but the holder read with another reader than the DAG's (its where=):
    # its checkpoint holds positions of that reader, narrowed by the split
    table(source, ROWS)
    raced = race_partition_1(monkeypatch, checkpoints, where="id >= 0")

    # When the run goes
    run = run_dag("pt_export", logical_date=DAY)

    # Then partition 1 refused before it read anything, naming the reader's change, not the range's
    assert raced["holder"] == [("a", i) for i in range(10, 16)]
    assert str(run.get_task_instance("export.partition", map_index=1).state) == "failed"
    assert partition_rows(source, 1) == []
    with checkpoints.open() as s:
        row = s.checkpoints.load(f"{JOB}[1]", SLOT)
    assert row is not None and (row.status, row.position, row.processed) == ("failed", ["a", 15], 6)
    assert ReaderChanged.__name__ in (row.last_error or "")
    assert "where" in (row.last_error or "")


def test_a_plan_row_changed_by_hand_before_the_second_read_is_named_not_hidden_behind_the_refusal(
    checkpoints: Store, source: Source, run_dag: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the same race, and the plan row changed by hand (its seal no longer matching) after the
    # split was agreed, before partition 1 reads the plan again once it holds the lease
    import json

    from airflow_resumable.operators.partitioned import PartitionOperator

    table(source, ROWS)
    raced = race_partition_1(monkeypatch, checkpoints)
    racing = PartitionOperator._plan_now
    edited: list[bool] = []

    def plan_now(self: Any, slot: str) -> Any:
        if "after" in raced and not edited and self._taking is None and self.partition_range["partition"] == 1:
            edited.append(True)
            with checkpoints.open(autocommit=True) as s:
                row = s.checkpoints.load(f"{JOB}#plan", SLOT)
                assert row is not None
                state = dict(row.state, rows=row.state["rows"] + 1)
                s.execute("UPDATE resumable_checkpoints SET state = %s WHERE job = %s", (json.dumps(state), f"{JOB}#plan"))
        return racing(self, slot)

    monkeypatch.setattr(PartitionOperator, "_plan_now", plan_now)

    # When the run goes
    run = run_dag("pt_export", logical_date=DAY)

    # Then partition 1 failed before it read anything (its row holds the holder's checkpoint), and
    # its error names the plan row's edit (what to put back), not only the checkpoint's refusal of
    # the range it read before the lease
    assert edited == [True]
    assert str(run.get_task_instance("export.partition", map_index=1).state) == "failed"
    with checkpoints.open() as s:
        row = s.checkpoints.load(f"{JOB}[1]", SLOT)
    assert row is not None and (row.status, row.position, row.processed) == ("failed", ["a", 15], 6)
    assert "changed after the plan was stored" in (row.last_error or ""), row.last_error
