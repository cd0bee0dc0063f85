"""An accepted request to retry skipped items is carried out by the slot's next run, or reported as
not done; never left pending for good.

"Retry skipped items" on a partition, through each entry point: Airflow's CLI (the operator's
form), ``python -m airflow_resumable`` (the decorator's form) and the REST API (tests/unit/plugins/test_api.py);
the next run of the partition replays them through its own ``process``, and a replayed item says
so, keeping the error it had failed with. Around it: a run that finishes the slot without carrying
a request out puts the items back saying so; a request is refused in the same write while an
attempt holds the slot; two requests at once take one; a request made while the try that released
the slot is still finishing in Airflow waits for it and clears it. On both stores.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable import control
from airflow_resumable.core import Attempt, chunk_loop
from airflow_resumable.core.attempt.skip_policy import request_retry
from airflow_resumable.core.model.errors import RequestRefused
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import SequenceReader
from airflow_resumable.core.stores import Store
from support.module_cli import module_cli, resumable_cli
from support.partition_source import table
from support.sources import Source
from support.xcoms import xcom

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()
ROWS = [("a" if i < 30 else "b", i) for i in range(40)]


def states(job: str) -> dict[Any, tuple[str, str]]:
    """Each skipped item of the slot: its position -> (state, error)."""
    return {tuple(i["position"]): (i["state"], i["error"]) for i in control.skipped_view(job, SLOT)["skipped_items"]}


def written(source: Source, ident: int) -> int:
    return len(source.run(f"SELECT id FROM pt_sink WHERE id = {ident}"))


# -- through the entry points ------------------------------------------------------------------------------


def test_retry_of_a_partition_s_skipped_items_through_the_cli_is_replayed_by_its_next_run(
    checkpoints: Store, source: Source, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a partitioned run that skipped row 13 (partition 1) and row 27 (partition 2)
    table(source, ROWS)
    first = run_dag("pt_skips", conf={"bad": [13, 27]}, logical_date=DAY)
    assert str(first.state) == "success"
    job = "pt_skips.export[1]"

    # When someone asks for partition 1's skipped items to be retried, with Airflow's own CLI
    code, out, err = resumable_cli("skipped", "retry", job, SLOT, capsys=capsys)

    # Then it is accepted, says that the partition's task instance was cleared for it, and the item waits
    assert code == 0, err
    assert "retry of 1 skipped item(s) requested: its task instance" in out and "was cleared" in out
    assert states(job) == {("a", 13): ("retry_requested", "ValueError: bad row a/13")}

    # When the partition runs again (row 13 fixed; row 27 still bad)
    again = run_dag("pt_skips", conf={"bad": [27]}, logical_date=DAY)

    # Then it replayed row 13 through its process (written once), which now says it was replayed and
    # what it had failed with; partition 2's item, not asked for, is still skipped
    assert str(again.state) == "success"
    [(state, error)] = states(job).values()
    assert state == "replayed" and error.startswith("replayed at ")
    assert "by the task's own code (attempt 1), as requested; it had failed with: ValueError: bad row a/13" in error
    assert written(source, 13) == 1
    assert [s for s, _ in states("pt_skips.export[2]").values()] == ["skipped"]
    summary = xcom(again, "export.summary", required=True)
    assert (summary["processed"], summary["skipped"]) == (39, 1)
    # and a second request finds nothing left to retry there
    code, _, err = resumable_cli("skipped", "retry", job, SLOT, capsys=capsys)
    assert code == 1 and "no skipped item that can be replayed" in err


def test_retry_of_a_decorated_partition_s_skipped_items_through_python_m_is_replayed_by_its_next_run(
    checkpoints: Store, source: Source, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    table(source, ROWS)
    assert str(run_dag("pt_skips_decorated", conf={"bad": [27]}, logical_date=DAY).state) == "success"
    job = "pt_skips_decorated.export[2]"

    code, out, err = module_cli(capsys, "skipped", "retry", job, SLOT)

    assert code == 0 and "was cleared" in out, err
    again = run_dag("pt_skips_decorated", conf={"bad": []}, logical_date=DAY)
    assert str(again.state) == "success"
    [(state, error)] = states(job).values()
    assert state == "replayed" and "it had failed with: ValueError: bad row a/27" in error
    assert written(source, 27) == 1


# -- never pending for good ---------------------------------------------------------------------------------

JOB = "retries"


def bad_items(store: Store, *, attempt: int = 1, crash_after: int | None = None, wait: threading.Event | None = None,
              entered: threading.Event | None = None, bad: tuple[int, ...] = (7, 19)) -> Any:
    """An attempt over 0..29 in chunks of 5 that skips ``bad`` (7 and 19); it crashes after
    ``crash_after`` items, or holds the slot until ``wait`` is set (``entered`` set once it holds it)."""

    def process(ctx: Any, batch: list[int]) -> None:
        if entered is not None and wait is not None:
            entered.set()
            wait.wait(30)
        for i in batch:
            if i in bad:
                raise ValueError(f"bad item {i}")
            if crash_after is not None and i >= crash_after:
                raise RuntimeError("the worker died")

    handler = chunk_loop(SequenceReader(list(range(30))), process, chunk_size=5, skip_on=ValueError, skip_limit=5)
    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=attempt, owner=f"o{attempt}")).run(handler)


def test_a_run_that_finishes_the_slot_without_replaying_requested_items_puts_them_back_saying_so(store: Store) -> None:
    # Given a done slot with two skipped items whose retry was requested
    bad_items(store)
    assert request_retry(store, JOB, SLOT, by="alice") == 2

    # When its next run is a handler without a replay step (it resumes at the end and finishes)
    outcome = bad_items(store, attempt=2)

    # Then nothing stays requested: the items are skipped again, saying the retry was not carried
    # out, by which attempt, and the error they had; and a new request is taken
    assert outcome.checkpoint.status == "done"
    with store.open() as s:
        letters = s.skips.items(JOB, SLOT, status=None)
    assert [d.status for d in letters] == ["skipped", "skipped"]
    assert letters[0].error.startswith("retry requested but not carried out: attempt 2 finished the slot at ")
    assert letters[0].error.endswith("Before: ValueError: bad item 7")
    assert request_retry(store, JOB, SLOT, by="alice") == 2


def test_a_slot_started_over_forgets_items_whose_retry_was_requested_and_finds_them_again(store: Store) -> None:
    from airflow_resumable.core.control import requests as core_control

    # Given a done slot with two skipped items whose retry was requested, then a restart of the slot
    bad_items(store)
    assert request_retry(store, JOB, SLOT, by="alice") == 2
    core_control.restart(store, JOB, SLOT, by="bob")

    # When its next run starts over and reads every item again, 7 processed now and 19 still bad
    outcome = bad_items(store, attempt=2, bad=(19,))

    # Then what that run found is all there is: 19 skipped again with its error, 7 no longer a dead
    # letter (it was processed); neither is put back as a retry "not carried out" (the run read them)
    assert (outcome.checkpoint.status, outcome.checkpoint.processed) == ("done", 30)
    with store.open() as s:
        letters = s.skips.items(JOB, SLOT, status=None)
    assert [(d.position, d.status, d.attempt, d.error) for d in letters] == [(19, "skipped", 2, "ValueError: bad item 19")]
    # and a retry of the skipped items retries 19 only
    assert request_retry(store, JOB, SLOT, by="alice") == 1


def test_an_item_replayed_on_purpose_says_so_and_keeps_the_error_it_had(store: Store) -> None:
    from airflow_resumable.core.attempt.skip_policy import replay

    bad_items(store)
    assert replay(store, JOB, SLOT, lambda item: None).replayed == [7, 19]
    with store.open() as s:
        letters = s.skips.items(JOB, SLOT, status="replayed")
    assert letters[0].error.startswith("replayed at ") and letters[0].replayed_at is not None
    assert "by a replay on purpose; it had failed with: ValueError: bad item 7" in letters[0].error


def test_a_request_is_refused_in_its_own_write_while_an_attempt_holds_the_slot(store: Store) -> None:
    # Given a slot that skipped 7 and then crashed, and its next attempt holding the slot now
    with pytest.raises(RuntimeError):
        bad_items(store, crash_after=12)
    with store.open() as s:
        before = s.checkpoints.load(JOB, SLOT)  # read while nothing held it
    go, entered = threading.Event(), threading.Event()
    holder = threading.Thread(target=bad_items, args=(store,), kwargs={"attempt": 2, "wait": go, "entered": entered})
    holder.start()
    try:
        assert entered.wait(30)
        # When a request that checked the row before the attempt took it writes now
        with store.open(autocommit=True) as s:
            taken = s.skips.request_retry(before, by="bob")
        # Then the write itself refuses it: the attempt past its replay step would never see it
        assert taken == 0
        with pytest.raises(RequestRefused, match="running now"):
            request_retry(store, JOB, SLOT, by="bob")
    finally:
        go.set()
        holder.join(30)
    assert [d.status for d in control_letters(store)] == ["skipped", "skipped"]


def control_letters(store: Store) -> list[Any]:
    with store.open() as s:
        return s.skips.items(JOB, SLOT, status=None)


def test_two_requests_at_once_take_one_and_the_other_is_told_why(store: Store) -> None:
    bad_items(store)
    start = threading.Barrier(2)
    results: list[Any] = []

    def ask(who: str) -> None:
        start.wait(10)
        try:
            results.append(request_retry(store, JOB, SLOT, by=who))
        except RequestRefused as exc:
            results.append(exc)

    threads = [threading.Thread(target=ask, args=(who,)) for who in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(map(type, results), key=str) == sorted([int, RequestRefused], key=str), results
    refused = next(r for r in results if isinstance(r, RequestRefused))
    assert "already requested" in str(refused)
    with store.open() as s:
        asked = [h for h in s.listings.history(JOB, SLOT) if h.outcome == "retry_skipped_requested"]
    assert len(asked) == 1


def _set_state(run: Any, task_id: str, map_index: int, state: Any) -> None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id,
                                                   map_index=map_index).one()
        ti.state = state


def test_a_request_made_while_the_try_that_released_the_slot_is_finishing_waits_for_it_and_clears_it(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    from airflow.utils.state import TaskInstanceState

    # Given partition 1 done with row 13 skipped, its task instance still running in Airflow's eyes
    # (the try has released the slot; Airflow has not recorded its success yet)
    table(source, ROWS)
    run = run_dag("pt_skips", conf={"bad": [13]}, logical_date=DAY)
    job = "pt_skips.export[1]"
    _set_state(run, "export.partition", 1, TaskInstanceState.RUNNING)
    finisher = threading.Timer(1.5, _set_state, args=(run, "export.partition", 1, TaskInstanceState.SUCCESS))
    finisher.start()

    # When a retry is requested
    began = time.monotonic()
    asked = control.request_retry_skipped(job, SLOT, by="erin")
    finisher.join()

    # Then the request waited for the try to finish and cleared its task instance: the next run replays it
    assert asked.cleared and "was cleared" in asked.next_run, asked
    assert time.monotonic() - began >= 1.4
    assert str(run.get_task_instance("export.partition", map_index=1).state) in ("None", "none")

    # And when it does not finish in time, the answer says the retry is not carried out and what to do
    rerun = run_dag("pt_skips", conf={"bad": [13]}, logical_date=DAY)  # 13 fails again: skipped again
    assert states(job)[("a", 13)][0] == "skipped"
    _set_state(rerun, "export.partition", 1, TaskInstanceState.RUNNING)
    late = control.request_retry_skipped(job, SLOT, by="erin", wait=0.5)
    assert not late.cleared and late.next_run.startswith("not carried out yet: the task instance"), late
    assert "Clear it once it ends" in late.next_run
