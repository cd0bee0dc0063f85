"""``control.act``, the REST API's one request on one connection, attacked as a hostile caller would:
a slot another DAG's task takes over between the permission check and the write, rows edited by
hand into what this release does not read, an answer that cannot be read after the write, and
arguments no query can carry. On both stores; Airflow's metadata database is not used (the retry's
clearing of the task instance is recorded instead of done).
"""

from __future__ import annotations

import pytest

from airflow_resumable import control
from airflow_resumable.core.model.checkpoint import Checkpoint, DeadLetter
from airflow_resumable.core.model.errors import (
    ConfigurationError,
    CorruptCheckpoint,
    ReadBackFailed,
    SlotNotFound,
)
from airflow_resumable.core.stores import Store
from support.slots import SLOT, run_slot

JOB = "shared.export"  # a job name two DAGs may both use (job= given explicitly)


class Forbidden(Exception):
    """What the REST API's check raises (its 403) for a DAG the caller may not change."""


@pytest.fixture
def cleared(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The owning DAGs of the task instances a retry cleared (none is cleared for real)."""
    done: list[str] = []

    def clear(row: Checkpoint, *, wait: float) -> tuple[bool, str]:
        done.append(str(row.dag_id))
        return True, f"cleared in {row.dag_id}"

    monkeypatch.setattr(control, "_clear_finished", clear)
    return done


def failed_slot(store: Store, job: str = JOB, *, skipped: bool = True) -> None:
    """A failed slot of dag_a, with one skipped item that can be replayed."""
    run_slot(store, job, "dag_a", fail_at=10)
    if skipped:
        with store.open(autocommit=True) as s:
            s.skips.record(DeadLetter(job=job, slot=SLOT, position=3, item={"i": 3}, item_format="json",
                                      error="ValueError: bad", attempt=1))
            s.commit()


def edit(store: Store, table: str, sets: str, job: str = JOB) -> None:
    """A hand edit of the slot's rows in ``table``."""
    with store.open(autocommit=True) as s:
        s.execute(f"UPDATE {table} SET {sets} WHERE job = %(job)s", {"job": job})
        s.commit()


def recorded(store: Store, job: str = JOB) -> list[tuple[str, str | None]]:
    with store.open() as s:
        return [(h.outcome, h.requested_by) for h in s.listings.history(job, SLOT)]


def skipped_states(store: Store, job: str = JOB) -> list[str]:
    with store.open() as s:
        return [d.status for d in s.skips.items(job, SLOT, status=None)]


@pytest.mark.parametrize("action", ["pause", "retry_skipped"])
def test_a_request_is_not_written_on_a_slot_another_dag_took_over_after_the_check(
        checkpoints: Store, cleared: list[str], action: str) -> None:
    # Given a failed slot of dag_a, and a caller who may change dag_a's task instances only
    failed_slot(checkpoints)
    checked: list[str | None] = []

    def check(dag_id: str | None) -> None:
        checked.append(dag_id)
        if dag_id != "dag_a":
            raise Forbidden(dag_id)
        # When dag_b's task takes the slot over (the same job name) right after the caller was let through
        edit(checkpoints, "resumable_checkpoints", "dag_id = 'dag_b'")

    with pytest.raises(Forbidden):
        control.act(JOB, SLOT, action, by="alice", check=check)
    # Then the write did not take the slot on dag_a's permission: the new row was checked, and refused
    assert checked == ["dag_a", "dag_b"]
    assert recorded(checkpoints) == [("failed", None)] and skipped_states(checkpoints) == ["skipped"]
    assert cleared == [] and control.get(JOB, SLOT).request is None  # dag_b's task instance was not cleared


@pytest.mark.parametrize("action", ["pause", "retry_skipped"])
def test_a_request_checked_again_on_the_new_owner_goes_through_when_that_one_allows_it(
        checkpoints: Store, cleared: list[str], action: str) -> None:
    # Given a caller who may change both DAGs, and the slot taken over by dag_b after the first check
    failed_slot(checkpoints)
    checked: list[str | None] = []

    def check(dag_id: str | None) -> None:
        checked.append(dag_id)
        if len(checked) == 1:
            edit(checkpoints, "resumable_checkpoints", "dag_id = 'dag_b'")

    body = control.act(JOB, SLOT, action, by="admin", check=check)
    # Then the request was made once, for the owner checked last
    assert checked == ["dag_a", "dag_b"] and body["dag_id"] == "dag_b"
    assert recorded(checkpoints)[1:] == [(f"{action}_requested", "admin")]
    assert cleared == (["dag_b"] if action == "retry_skipped" else [])


def test_a_row_that_names_no_dag_takes_a_request_checked_on_it(checkpoints: Store) -> None:
    failed_slot(checkpoints, skipped=False)
    edit(checkpoints, "resumable_checkpoints", "dag_id = NULL")
    checked: list[str | None] = []
    body = control.act(JOB, SLOT, "pause", by="admin", check=lambda dag_id: checked.append(dag_id))
    assert checked == [None] and body["request"] == "pause" and body["dag_id"] is None


#: Rows edited by hand into a status or a request no release writes, and a request some rule of the
#: store would have taken on them (before: written, then answered with a 500 saying the row "was left as it is").
_HAND_EDITED = [
    ("release", "status = 'bogus', lease_owner = 'gone@host', lease_expires_at = NULL"),
    ("resume", "status = 'bogus', request = 'pause'"),
    ("release", "request = 'bogus', status = 'running', lease_owner = 'gone@host', lease_expires_at = NULL"),
    ("retry_skipped", "status = 'bogus'"),
    ("retry_skipped", "request = 'bogus'"),
]


def _by_its_own_function(action: str) -> None:
    """The request as the CLI and the Python API make it (``control.release(...)``, ...)."""
    if action == "retry_skipped":
        control.request_retry_skipped(JOB, SLOT, by="op", clear=False)
    else:
        getattr(control, action)(JOB, SLOT, by="op")


@pytest.mark.parametrize("through", ["act", "its own function"])
@pytest.mark.parametrize(("action", "sets"), _HAND_EDITED)
def test_a_row_edited_into_a_status_or_request_no_release_writes_is_refused_before_anything_is_written(
        checkpoints: Store, cleared: list[str], action: str, sets: str, through: str) -> None:
    failed_slot(checkpoints)
    edit(checkpoints, "resumable_checkpoints", sets)
    with checkpoints.open() as s:
        before = s.execute("SELECT status, request, lease_owner FROM resumable_checkpoints").fetchall()
    with pytest.raises(CorruptCheckpoint) as err:
        if through == "act":
            control.act(JOB, SLOT, action, by="op")
        else:
            _by_its_own_function(action)
    assert (err.value.job, err.value.slot) == (JOB, SLOT) and "'bogus' is not one of" in err.value.message
    assert "The row was left as it is" in str(err.value)
    with checkpoints.open() as s:
        assert s.execute("SELECT status, request, lease_owner FROM resumable_checkpoints").fetchall() == before
    assert recorded(checkpoints) == [("failed", None)] and skipped_states(checkpoints) == ["skipped"] and cleared == []


@pytest.mark.parametrize("action", ["pause", "retry_skipped"])
def test_a_request_whose_answer_cannot_be_read_says_it_was_applied_and_recorded(
        checkpoints: Store, cleared: list[str], action: str) -> None:
    # Given a slot whose other skipped item was edited by hand into text that is not JSON
    failed_slot(checkpoints)
    with checkpoints.open(autocommit=True) as s:
        s.skips.record(DeadLetter(job=JOB, slot=SLOT, position=4, item=4, item_format="json", error="E", attempt=1))
        s.commit()
        s.execute("UPDATE resumable_dead_letters SET item = '{bad' WHERE position = '4'")
        s.commit()
    # When a request is made: it is taken, then the slot cannot be read back for the answer
    with pytest.raises(ReadBackFailed) as err:
        control.act(JOB, SLOT, action, by="op")
    # Then the error says the request stands (the caller must not ask again), and why the answer failed
    assert (err.value.job, err.value.slot) == (JOB, SLOT)
    assert err.value.message.startswith(f"{action} requested by op: applied and recorded in the slot's history")
    assert "do not ask again" in str(err.value) and isinstance(err.value.cause, CorruptCheckpoint)
    assert "the stored item '{bad' of a record in resumable_dead_letters is not valid JSON" in err.value.message
    assert recorded(checkpoints)[-1] == (f"{action}_requested", "op")
    assert cleared == (["dag_a"] if action == "retry_skipped" else [])


def test_what_no_query_can_carry_is_refused_before_anything_is_read(checkpoints: Store) -> None:
    # Given a slot (PostgreSQL's text cannot hold a NUL: act's load failed there with the driver's own error)
    failed_slot(checkpoints, skipped=False)
    for job, slot, by in ((f"{JOB}\x00", SLOT, "op"), (JOB, "a\udc80", "op"), (JOB, SLOT, "o\x00p"), (JOB, SLOT, " ")):
        with pytest.raises(ConfigurationError):
            control.act(job, slot, "pause", by=by)
    # And a request that has no forced form, with force: refused, not silently taken unforced
    for action in ("pause", "cancel", "retry_skipped"):
        with pytest.raises(ConfigurationError, match=f"force applies to release only, not to {action}"):
            control.act(JOB, SLOT, action, by="op", force=True)
    # And what is not a request, however close to one
    for action in ("PAUSE", "retry_skipped ", "", None):
        with pytest.raises(ConfigurationError, match="no request"):
            control.act(JOB, SLOT, action, by="op")  # type: ignore[arg-type]
    # And a name too long to be stored is a slot that does not exist, as GET says (not a 400)
    with pytest.raises(SlotNotFound):
        control.act("j" * 5000, SLOT, "pause", by="op")
    assert recorded(checkpoints) == [("failed", None)]


def test_a_request_given_as_the_enum_or_its_value_is_the_same_request(checkpoints: Store) -> None:
    from airflow_resumable.core.model.request_rules import Action

    failed_slot(checkpoints, skipped=False)
    assert control.act(JOB, SLOT, Action.PAUSE, by="op")["request"] == "pause"
    assert control.act(JOB, SLOT, "resume", by="op")["request"] == "resume"  # the pending pause withdrawn
    assert [o for o, _ in recorded(checkpoints)] == ["failed", "pause_requested", "resume_requested"]
