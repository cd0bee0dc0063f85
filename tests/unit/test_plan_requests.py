"""A job split anew into fewer partitions: the partitions past the new plan keep their rows, history
and dead letters, but their task instances are ``removed`` in Airflow and nothing runs them. They
count for nothing in the job's line (its ``skipped`` too) and take no request, refused naming the
plan; a retry of skipped items stuck on one (asked before the split) can be withdrawn. On both
stores, through the core, ``airflow_resumable.control`` and Airflow's CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_resumable import control
from airflow_resumable.core.attempt.skip_policy import request_retry, withdraw_retry
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.checkpoint import DeadLetter
from airflow_resumable.core.model.errors import RequestRefused
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partitions import Plan, outside_plan, replace_plan, save_plan
from support.module_cli import resumable_cli
from support.plan_race import replan_while_checked
from support.slots import SLOT, run_slot

JOB = "d.exp"
PLAN_MESSAGE = f"partition 3 is not in job {JOB}'s current plan of 2 partition(s) (planned at "


def _skip(store: Store, job: str, position: int) -> None:
    """One dead letter of ``job``'s slot, as a skip policy records it."""
    with store.open(autocommit=True) as s:
        s.skips.record(DeadLetter(job=job, slot=SLOT, position=position, item=position,
                                  error=f"ValueError: bad row {position}", attempt=1))
        s.commit()


def split_into_four_then_two(store: Store, *, retry_on_3: bool = False) -> None:
    """Given ``d.exp`` split into 4 partitions that all finished, one bad row skipped in [0] and one in
    [3] (its retry requested before the split, with ``retry_on_3``), then split anew into 2 on purpose
    (a restart of ``d.exp#plan``): [0] started over and skipped its bad row again, [1] as it was."""
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, JOB, SLOT, Plan(4, (10, 20, 30), 40))
    for i in range(4):
        run_slot(store, f"{JOB}[{i}]", "d", task_id="exp.partition", map_index=i, n=10)
    _skip(store, f"{JOB}[0]", 3)
    _skip(store, f"{JOB}[3]", 33)
    if retry_on_3:
        assert request_retry(store, f"{JOB}[3]", SLOT, by="alice") == 1
    core_control.restart(store, f"{JOB}#plan", SLOT, by="planner")
    with store.open(autocommit=True) as s:
        assert replace_plan(s, JOB, SLOT, Plan(2, (25,), 50))


def letters(store: Store, job: str) -> list[tuple[Any, str]]:
    with store.open() as s:
        return [(d.position, d.status) for d in s.skips.items(job, SLOT)]


def test_a_dead_letter_of_a_partition_past_the_plan_counts_for_nothing_in_the_job_s_line(store: Store) -> None:
    """Before: the line said 2 skipped for the one bad row of the plan's partitions (the summary, 1)."""
    split_into_four_then_two(store)
    line = core_control.jobs(store)[0]
    detail, _rows = core_control.job_partitions(store, JOB, "run_1")
    assert (line["job"], line["skipped"], detail["skipped"]) == (JOB, 1, 1), line
    # and the dead letter itself is kept, as the partition's row and history are
    assert letters(store, f"{JOB}[3]") == [(33, "skipped")]


def test_a_retry_of_a_partition_past_the_plan_is_refused_naming_the_plan_and_nothing_changes(
        checkpoints: Store) -> None:
    """Before: accepted (1 item retry_requested), though its task instance is removed: nothing ran it."""
    split_into_four_then_two(checkpoints)
    with pytest.raises(RequestRefused) as refused:
        control.request_retry_skipped(f"{JOB}[3]", SLOT, by="alice", clear=False)
    assert str(refused.value.message).startswith(PLAN_MESSAGE), refused.value.message
    assert "nothing runs it any more" in refused.value.message and f"restart '{JOB}#plan'" in refused.value.hint
    assert letters(checkpoints, f"{JOB}[3]") == [(33, "skipped")]
    with checkpoints.open() as s:
        assert [h.outcome for h in s.listings.history(f"{JOB}[3]", SLOT)] == ["done"]
    # a partition of the plan takes it, and a job that is not partitioned is no partition of a plan
    assert control.request_retry_skipped(f"{JOB}[0]", SLOT, by="alice", clear=False).items == 1
    with checkpoints.open() as s:
        assert outside_plan(s.checkpoints.load, f"{JOB}[1]", SLOT) is None
        assert outside_plan(s.checkpoints.load, "other.job[7]", SLOT) is None
        assert outside_plan(s.checkpoints.load, JOB, SLOT) is None


@pytest.mark.parametrize("action", ["pause", "cancel", "restart", "release", "retry_skipped"])
def test_every_request_of_a_partition_past_the_plan_is_refused_through_control_and_the_cli(
        checkpoints: Store, action: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: pause and restart of the finished [3] were accepted (exit 0), nothing to act on them."""
    split_into_four_then_two(checkpoints)
    with pytest.raises(RequestRefused, match="is not in job d.exp's current plan of 2 partition"):
        control.act(f"{JOB}[3]", SLOT, action, by="alice")
    argv = ("skipped", "retry") if action == "retry_skipped" else (action,)
    code, _out, err = resumable_cli(*argv, f"{JOB}[3]", SLOT, "--by", "alice", capsys=capsys)
    assert code == 1 and "is not in job d.exp's current plan of 2 partition" in err, (code, err)
    with checkpoints.open() as s:
        row = s.checkpoints.load(f"{JOB}[3]", SLOT)
        assert (row.status, row.request) == ("done", None)
        assert [h.outcome for h in s.listings.history(f"{JOB}[3]", SLOT)] == ["done"]
    # the slot's offers say so: nothing but the withdrawal of a retry (none pending here)
    offers, notes = control.explained_offers(f"{JOB}[3]", SLOT)
    assert not any(offers.values()), offers
    assert notes["restart"].startswith("Not now: " + PLAN_MESSAGE)
    # a partition of the plan still takes it where its rules do
    if action == "restart":
        assert control.restart(f"{JOB}[1]", SLOT, by="alice").request == "restart"


def test_a_retry_stuck_on_a_partition_past_the_plan_is_withdrawn_through_the_cli(
        checkpoints: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """Given a retry of [3]'s skipped row asked before the split (its task instance removed since),
    When alice withdraws it with the CLI, Then the row is skipped again, who withdrew it is in the
    history, and a retry can be asked again where a run carries it out (before: no way back; the item
    stayed retry_requested for good, and every later request was refused as already requested)."""
    split_into_four_then_two(checkpoints, retry_on_3=True)
    assert letters(checkpoints, f"{JOB}[3]") == [(33, "retry_requested")]
    assert control.explained_offers(f"{JOB}[3]", SLOT)[0]["withdraw_retry"] is True
    code, out, err = resumable_cli("skipped", "withdraw", f"{JOB}[3]", SLOT, "--by", "alice", "--output", "json",
                                   capsys=capsys)
    assert code == 0, err
    body = json.loads(out)
    assert body["withdrawn"] == {"items": 1} and [i["state"] for i in body["skipped_items"]] == ["skipped"]
    assert body["skipped_items"][0]["error"] == "ValueError: bad row 33"  # its error as it was
    with checkpoints.open() as s:
        asked = [(h.outcome, h.requested_by, h.error) for h in s.listings.history(f"{JOB}[3]", SLOT)]
    assert asked[-1] == ("retry_skipped_withdrawn", "alice", "retry of 1 skipped item(s) withdrawn"), asked
    # nothing left to withdraw: refused, exit 1
    code, _out, err = resumable_cli("skipped", "withdraw", f"{JOB}[3]", SLOT, capsys=capsys)
    assert code == 1 and "no retry of its skipped items is pending" in err


def test_a_withdrawal_is_refused_while_an_attempt_holds_the_slot_and_a_retry_can_be_asked_again(store: Store) -> None:
    run_slot(store, "e.one", "e", n=10)
    _skip(store, "e.one", 4)
    with pytest.raises(RequestRefused, match="no retry of its skipped items is pending"):
        withdraw_retry(store, "e.one", SLOT, by="alice")
    assert request_retry(store, "e.one", SLOT, by="alice") == 1
    with store.open(autocommit=True) as s:  # an attempt holds the slot now: it may be replaying them
        s.execute(f"UPDATE resumable_checkpoints SET lease_owner = 'w2', lease_expires_at = {s.d.now_plus('3600')} "
                  "WHERE job = 'e.one'")
        s.commit()
    with pytest.raises(RequestRefused, match="the slot is running now"):
        withdraw_retry(store, "e.one", SLOT, by="alice")
    assert letters(store, "e.one") == [(4, "retry_requested")]
    with store.open(autocommit=True) as s:
        s.execute("UPDATE resumable_checkpoints SET lease_owner = NULL, lease_expires_at = NULL WHERE job = 'e.one'")
        s.commit()
    assert withdraw_retry(store, "e.one", SLOT, by="alice") == 1
    assert letters(store, "e.one") == [(4, "skipped")]
    assert request_retry(store, "e.one", SLOT, by="bob") == 1


def test_a_plan_row_edited_by_hand_so_that_it_cannot_be_read_blocks_no_request_of_its_partitions() -> None:
    from airflow_resumable.core.model.errors import CorruptCheckpoint
    from airflow_resumable.core.work.partitions import outside_plan

    def load(job: str, slot: str) -> Any:
        raise CorruptCheckpoint("the stored heartbeat_at 'garbage' is not a timestamp", job=job, slot=slot)

    assert outside_plan(load, "d.exp[3]", "s") is None


@pytest.mark.parametrize("through", ["request_retry_skipped", "act"])
def test_a_replan_waits_for_a_retry_checked_against_the_plan_so_none_lands_past_the_new_plan(
        checkpoints: Store, through: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """[3] is in the plan of 4 when alice's retry of its skipped items is checked; the job is split anew
    into 2 by another connection while the retry is between its check and its write. The replan must
    wait for the write (the plan checked is the plan written under): a retry written after it would sit
    on [3], whose task instance is removed, and nothing would ever replay it."""
    with checkpoints.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, JOB, SLOT, Plan(4, (10, 20, 30), 40))
    for i in range(4):
        run_slot(checkpoints, f"{JOB}[{i}]", "d", task_id="exp.partition", map_index=i, n=10)
    _skip(checkpoints, f"{JOB}[3]", 33)
    if through == "act":
        def ask() -> Any:
            return control.act(f"{JOB}[3]", SLOT, "retry_skipped", by="alice")
    else:
        def ask() -> Any:
            return control.request_retry_skipped(f"{JOB}[3]", SLOT, by="alice", clear=False)
    # When the job is split anew while the retry is between its check and its write
    waited, errors = replan_while_checked(checkpoints, JOB, SLOT, f"{JOB}[3]", ask, monkeypatch)
    # Then the replan waited for the retry's write (without the hold it was done in well under 5 s)
    assert waited, "the replan went in between the retry's check and its write"
    assert not [e for e in errors if not isinstance(e, RequestRefused)], errors


@pytest.mark.parametrize("action", ["pause", "cancel"])
def test_a_range_a_split_took_takes_requests_and_one_no_split_of_the_plan_took_takes_none(
        checkpoints: Store, action: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a request of ``<job>[1].2``, a range of no split of the current plan (a row an earlier
    plan left), was taken (exit 0): nothing runs it, and the job's line counted it as a fourth
    partition."""
    from support.slots import hold, split_job

    # Given a job of 3 partitions whose [2] took part of [1]'s range (<job>[1].1, running), and the
    # row of a range <job>[1].2 that no split of the current plan took, held by a live attempt
    split_job(checkpoints, JOB, "d", own="done", taken="running")
    run_slot(checkpoints, f"{JOB}[1].2", "d", task_id="exp.partition", map_index=0, n=5)
    hold(checkpoints, f"{JOB}[1].2", processed=1)
    with checkpoints.open() as s:
        assert outside_plan(s.checkpoints.load, f"{JOB}[1].1", SLOT) is None
        refused = outside_plan(s.checkpoints.load, f"{JOB}[1].2", SLOT)
        assert refused is not None and refused.message.startswith(f"range 1.2 is not in job {JOB}'s current plan")
        assert f"restart '{JOB}#plan'" in refused.hint
    # When a request is made of each through the CLI
    code, _out, err = resumable_cli(action, f"{JOB}[1].2", SLOT, "--by", "alice", capsys=capsys)
    # Then the range outside the plan takes none, naming the plan, and nothing changed
    assert code == 1 and f"range 1.2 is not in job {JOB}'s current plan" in err, (code, err)
    with checkpoints.open() as s:
        row = s.checkpoints.load(f"{JOB}[1].2", SLOT)
        assert (row.status, row.request, row.cancel_request) == ("running", None, None)
    offers, notes = control.explained_offers(f"{JOB}[1].2", SLOT)
    assert not any(offers.values()) and notes[action].startswith("Not now: range 1.2 is not in job"), notes
    # And the range the plan's split took takes it as any running slot does
    code, _out, err = resumable_cli(action, f"{JOB}[1].1", SLOT, "--by", "alice", capsys=capsys)
    assert code == 0, err
    with checkpoints.open() as s:
        row = s.checkpoints.load(f"{JOB}[1].1", SLOT)
        assert (row.request if action == "pause" else row.cancel_request) is not None, row
        assert s.listings.history(f"{JOB}[1].1", SLOT)[-1].requested_by == "alice"
    # And the job's line counts the plan's 3 partitions, nothing of the range outside it
    line = core_control.jobs(checkpoints)[0]
    assert (line["job"], line["partitions"]["total"], line["processed"]) == (JOB, 3, 10 + 5 + 10 + 2), line
    assert [s["job"] for s in line["splits"]] == [f"{JOB}[1].1"]
