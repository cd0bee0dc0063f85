"""With a real scheduler: UI actions, worker shutdown and a killed task process, end to end.

One ``airflow standalone`` (LocalExecutor, PostgreSQL metadata database, a short task-instance
heartbeat timeout) runs for the whole module; the checkpoint store is another PostgreSQL database.
The scenarios run one after another against DAG ``sched_slow`` (and ``sched_mapped`` for a mapped
task; tests/dags/scheduler_dags.py), each on its own manual DAG run (slot = run id), and drive
Airflow only as a user or an operator would: through the REST API and with signals to the worker's
processes.

Measured times are printed (run with ``-s``): from the UI's *mark failed* to the handler
stopping (and, within it, from the supervisor's SIGTERM), from a SIGKILL of the task process to
the retry resuming, and from a crash of the whole worker (supervisor and task SIGKILLed, noticed
only by the heartbeat timeout) to the retry resuming.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import datetime

import psutil
import pytest

from airflow_resumable.core.control import requests as control
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.errors import RequestRefused
from devtools.postgres import Server
from support.deployment import (
    CHUNK,
    DAG_ID,
    HEARTBEAT_TIMEOUT,
    ITEMS,
    JOB,
    TASK_ID,
    Env,
    assert_exactly_once,
    databases,
)
from support.paths import ROOT
from support.standalone import Standalone, wait_for

pytestmark = pytest.mark.scheduler

DAG_FILE = ROOT / "tests" / "dags" / "scheduler_dags.py"
MAPPED_DAG_ID = "sched_mapped"
END_DAG_ID = "sched_end"
PAUSE_DAG_ID, POOL_DAG_ID, THROTTLE_DAG_ID, SLICES_DAG_ID = "sched_pause", "sched_pool_other", "sched_throttle", "sched_slices"
POOL = "resumable_pool_one"
#: sched_pause heartbeats every second (lease 3) and a chunk takes 2 x 0.2 s.
PAUSE_HEARTBEAT, PAUSE_CHUNK = 1.0, 0.4
#: Airflow's supervisor heartbeats at most every [workers] min_heartbeat_interval (5 s), and
#: escalates SIGTERM to SIGKILL after 5 s (hard-coded in the task SDK's supervisor).
SUPERVISOR_HEARTBEAT = 5.0
SIGKILL_ESCALATION = 5.0


MEASURED: dict[str, float] = {}

#: What the task log says when the supervisor terminates the task, and when our handler stops.
SUPERVISOR_TERMINATES = "Server indicated the task shouldn't be running anymore"
CANCELLED_USER = "cancelled (user)"


def log_time(log: str, needle: str) -> datetime:
    """The timestamp of the first JSON log line whose event contains ``needle``."""
    for line in log.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if needle in str(event.get("event", "")):
            return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
    raise AssertionError(f"no log line with {needle!r}:\n{log[-3000:]}")


def assert_no_repeats_before(env: Env, slot: str, position: int, attempt: int) -> None:
    """Try ``attempt`` started at ``position``: it did not touch an item before it."""
    later = [item for item, a in env.seen(slot) if a == attempt]
    assert later, f"try {attempt} processed nothing"
    assert min(later) == position, f"try {attempt} started at item {min(later)}, its checkpoint was {position}"


@pytest.fixture(scope="module")
def env(pg_server: Server) -> Iterator[Env]:
    with databases(pg_server, "sched") as db:
        airflow = Standalone(metadata_uri=db.metadata_uri, dag_files=[DAG_FILE], env=db.env)
        try:
            airflow.start()
            airflow.serve((DAG_ID, MAPPED_DAG_ID, END_DAG_ID, PAUSE_DAG_ID, POOL_DAG_ID, THROTTLE_DAG_ID,
                           SLICES_DAG_ID))
            airflow.api.request("POST", "/pools", json={"name": POOL, "slots": 1, "include_deferred": False},
                                expect=(201,))
            with db.store.open(autocommit=True) as session:
                session.ensure_schema()
                yield Env(airflow=airflow, session=session, sink=db.sink)
        finally:
            airflow.close()
    if MEASURED:
        print("\nmeasured: " + ", ".join(f"{k} = {v:.2f}s" for k, v in MEASURED.items()))


@pytest.fixture(scope="module")
def marked_failed(env: Env) -> tuple[str, Checkpoint]:
    """Scenario a: a running task marked failed through the REST API, as the UI's button does."""
    run_id = env.trigger("markfailed")
    env.running_with_progress(run_id)
    ti = env.ti(run_id)
    assert ti["state"] == "running" and ti["try_number"] == 1
    patched = time.monotonic()
    env.api.set_task_state(DAG_ID, run_id, TASK_ID, "failed")
    row = env.stopped(run_id, attempt=1)
    MEASURED["mark failed -> handler stopped"] = time.monotonic() - patched
    print(f"\n[scheduler] mark failed -> handler stopped: {MEASURED['mark failed -> handler stopped']:.2f}s")
    # Of which: the supervisor's next heartbeat learning of it, then its SIGTERM -> the handler stopping.
    log = wait_for(
        lambda: (text := env.airflow.task_log(DAG_ID, run_id, TASK_ID, 1)) and CANCELLED_USER in text and text,
        timeout=30, what="the task log to show the cancel",
    )
    terminated, cancelled = log_time(log, SUPERVISOR_TERMINATES), log_time(log, CANCELLED_USER)
    MEASURED["SIGTERM -> handler stopped"] = (cancelled - terminated).total_seconds()
    print(f"[scheduler] supervisor's SIGTERM -> handler stopped: {MEASURED['SIGTERM -> handler stopped']:.3f}s")
    return run_id, row


def test_mark_failed_stops_the_handler_as_user_with_the_checkpoint_intact(
    env: Env, marked_failed: tuple[str, Checkpoint]
) -> None:
    run_id, row = marked_failed
    assert row.status == "cancelled", row
    assert row.stop_reason == "user", row
    # Stopped at a chunk boundary before Airflow's SIGKILL: the last chunk's checkpoint is intact.
    assert row.position == row.processed, row
    assert 0 < row.processed < ITEMS and row.processed % CHUNK == 0, row
    assert row.lease_owner is None, row
    assert_exactly_once(env, run_id, row.position)
    elapsed = MEASURED["mark failed -> handler stopped"]
    assert elapsed < SUPERVISOR_HEARTBEAT + SIGKILL_ESCALATION, f"stopped after {elapsed:.1f}s"
    assert MEASURED["SIGTERM -> handler stopped"] < SIGKILL_ESCALATION, MEASURED
    # The person's decision stands: the task instance stays failed, nothing retried it.
    wait_for(lambda: env.ti(run_id)["state"] == "failed", timeout=30, what="the task instance to stay failed")
    ti = env.ti(run_id)
    assert ti["try_number"] == 1, ti


def test_clear_resumes_from_the_checkpoint(env: Env, marked_failed: tuple[str, Checkpoint]) -> None:
    run_id, cancelled = marked_failed
    # The old task process is gone before we clear (the supervisor waits for it).
    wait_for(lambda: env.ti(run_id)["state"] == "failed", timeout=30, what="the task instance to be failed")
    env.api.clear(DAG_ID, run_id, [TASK_ID])
    assert env.run_state(run_id, ("success", "failed")) == "success", env.explain(run_id)
    row = env.row(run_id)
    assert row is not None
    assert row.status == "done" and row.attempt == 2, row
    assert row.resumed_from == cancelled.position, row
    assert row.processed == ITEMS and row.position == ITEMS, row
    assert_exactly_once(env, run_id, ITEMS)
    assert_no_repeats_before(env, run_id, cancelled.position, attempt=2)
    ti = env.ti(run_id)
    assert ti["state"] == "success" and ti["try_number"] == 2, ti


def test_worker_shutdown_fails_retryable_and_the_retry_resumes(env: Env) -> None:
    run_id = env.trigger("shutdown")
    env.running_with_progress(run_id)
    ti = env.ti(run_id)
    _, supervisor = env.airflow.processes_of(ti["id"])
    assert "LocalExecutor" in " ".join(supervisor.cmdline()), supervisor.cmdline()
    supervisor.send_signal(signal.SIGTERM)  # the worker is stopping: it forwards SIGTERM to the task
    row = env.stopped(run_id, attempt=1)
    assert row.status == "cancelled", row
    assert row.stop_reason == "shutdown", row
    assert row.position == row.processed and 0 < row.processed < ITEMS, row
    # The attempt failed as retryable (never success), and the retry resumed and finished.
    states = env.states_of_try(run_id, 1)
    print(f"\n[scheduler] worker SIGTERM: try 1 went through {states}")
    assert "up_for_retry" in states and "success" not in states, states
    assert env.run_state(run_id, ("success", "failed")) == "success", env.explain(run_id)
    final = env.row(run_id)
    assert final is not None and final.status == "done" and final.attempt == 2, final
    assert final.resumed_from == row.position, final
    assert_exactly_once(env, run_id, ITEMS)
    assert_no_repeats_before(env, run_id, row.position, attempt=2)


def test_sigkill_of_the_task_process_is_retried_and_resumes(env: Env) -> None:
    run_id = env.trigger("sigkill")
    env.running_with_progress(run_id)
    ti = env.ti(run_id)
    task, _ = env.airflow.processes_of(ti["id"])
    before = env.row(run_id)
    assert before is not None
    task.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    psutil.wait_procs([task], timeout=10)

    def resumed() -> Checkpoint | None:
        row = env.row(run_id)
        return row if row and row.attempt == 2 and row.status == "running" else None

    states = env.states_of_try(run_id, 1)
    print(f"\n[scheduler] task SIGKILL: try 1 went through {states}")
    assert "up_for_retry" in states and "success" not in states, states
    row = wait_for(resumed, timeout=HEARTBEAT_TIMEOUT + 120, interval=0.05, what="the retry to resume",
                   on_timeout=lambda: env.explain(run_id))
    MEASURED["SIGKILL -> retry resumed"] = time.monotonic() - killed
    print(f"\n[scheduler] SIGKILL of the task process -> retry resumed: {MEASURED['SIGKILL -> retry resumed']:.2f}s")
    assert row.resumed_from is not None and row.resumed_from >= before.position, (row, before)
    assert env.run_state(run_id, ("success", "failed")) == "success", env.explain(run_id)
    final = env.row(run_id)
    assert final is not None and final.status == "done" and final.attempt == 2, final
    # Committed work exactly once; repeated work (started by try 1, redone by try 2) at most a chunk.
    assert_exactly_once(env, run_id, ITEMS)
    assert_no_repeats_before(env, run_id, row.resumed_from, attempt=2)
    seen = env.seen(run_id)
    first_try = {item for item, a in seen if a == 1}
    second_try = {item for item, a in seen if a == 2}
    repeated = sorted(first_try & second_try)
    assert len(repeated) <= CHUNK, f"more than one chunk repeated: {repeated}"


def test_worker_crash_is_caught_by_the_heartbeat_timeout_and_the_retry_resumes(env: Env) -> None:
    """The whole worker dies (supervisor and task SIGKILLed): only the heartbeat timeout notices."""
    run_id = env.trigger("crash")
    env.running_with_progress(run_id)
    ti = env.ti(run_id)
    task, supervisor = env.airflow.processes_of(ti["id"])
    before = env.row(run_id)
    assert before is not None
    supervisor.send_signal(signal.SIGKILL)  # first, so that nobody reports the task's death
    task.send_signal(signal.SIGKILL)
    crashed = time.monotonic()
    psutil.wait_procs([supervisor, task], timeout=10)

    def resumed() -> Checkpoint | None:
        row = env.row(run_id)
        return row if row and row.attempt == 2 and row.status == "running" else None

    states = env.states_of_try(run_id, 1)
    print(f"\n[scheduler] worker crash: try 1 went through {states}")
    assert "success" not in states, states
    row = wait_for(resumed, timeout=HEARTBEAT_TIMEOUT + 120, interval=0.05, what="the retry to resume",
                   on_timeout=lambda: env.explain(run_id))
    MEASURED["worker crash -> retry resumed"] = elapsed = time.monotonic() - crashed
    print(f"\n[scheduler] SIGKILL of the worker and its task -> retry resumed: {elapsed:.2f}s "
          f"(task_instance_heartbeat_timeout={HEARTBEAT_TIMEOUT}s)")
    assert row.resumed_from is not None and row.resumed_from >= before.position, (row, before)
    assert env.run_state(run_id, ("success", "failed")) == "success", env.explain(run_id)
    final = env.row(run_id)
    assert final is not None and final.status == "done" and final.attempt == 2, final
    assert_exactly_once(env, run_id, ITEMS)
    assert_no_repeats_before(env, run_id, row.resumed_from, attempt=2)
    seen = env.seen(run_id)
    repeated = sorted({i for i, a in seen if a == 1} & {i for i, a in seen if a == 2})
    assert len(repeated) <= CHUNK, f"more than one chunk repeated: {repeated}"


def test_mark_failed_on_a_mapped_task_is_also_user(env: Env) -> None:
    """The cancel of one mapped task instance is classified by *its* state (map index 1 runs on)."""
    run_id = f"mapped_{uuid.uuid4().hex[:8]}"
    env.api.trigger(MAPPED_DAG_ID, run_id=run_id)
    first, second = f"{MAPPED_DAG_ID}.{TASK_ID}[0]", f"{MAPPED_DAG_ID}.{TASK_ID}[1]"
    env.running_with_progress(run_id, job=first)
    env.api.set_task_state(MAPPED_DAG_ID, run_id, TASK_ID, "failed", map_index=0)
    row = env.stopped(run_id, attempt=1, job=first)
    assert row.status == "cancelled" and row.stop_reason == "user", row
    assert row.position == row.processed and 0 < row.processed < ITEMS, row
    assert env.run_state(run_id, ("success", "failed"), timeout=120, dag_id=MAPPED_DAG_ID) == "failed"
    assert_exactly_once(env, run_id, row.position, job=first)
    other = env.row(run_id, second)
    assert other is not None and other.status == "done" and other.processed == ITEMS, other
    assert_exactly_once(env, run_id, ITEMS, job=second)


def test_clear_of_a_running_task_stops_it_as_user_and_the_next_try_resumes(env: Env) -> None:
    """Clear while running: Airflow sets RESTARTING, terminates the try, and runs a new one."""
    run_id = env.trigger("clearrunning")
    env.running_with_progress(run_id)
    cleared = time.monotonic()
    env.api.clear(DAG_ID, run_id, [TASK_ID])
    row = env.stopped(run_id, attempt=1)
    print(f"\n[scheduler] Clear of a running task -> handler stopped: {time.monotonic() - cleared:.2f}s")
    assert row.status == "cancelled" and row.stop_reason == "user", row
    assert row.position == row.processed and 0 < row.processed < ITEMS, row
    assert env.run_state(run_id, ("success", "failed")) == "success", env.explain(run_id)
    final = env.row(run_id)
    assert final is not None and final.status == "done" and final.attempt == 2, final
    assert final.resumed_from == row.position, final
    assert_exactly_once(env, run_id, ITEMS)
    assert_no_repeats_before(env, run_id, row.position, attempt=2)


def test_clear_after_success_runs_the_finished_slot_again(env: Env) -> None:
    """A Clear of a task instance Airflow recorded as successful means "do it again"."""
    run_id = f"again_{uuid.uuid4().hex[:8]}"
    env.api.trigger(DAG_ID, run_id=run_id, conf={"items": 6, "chunk": 2, "delay": 0.05})
    assert env.run_state(run_id, ("success", "failed")) == "success", env.explain(run_id)
    first = env.row(run_id)
    assert first is not None and first.status == "done" and first.confirmed_at is not None, first
    env.api.clear(DAG_ID, run_id, [TASK_ID])
    wait_for(lambda: env.ti(run_id)["try_number"] == 2, timeout=60, what="the Clear to start try 2")
    assert env.run_state(run_id, ("success", "failed")) == "success", env.explain(run_id)
    row = env.row(run_id)
    assert row is not None and (row.status, row.attempt, row.runs) == ("done", 2, 2), row
    assert [i for i, a in env.seen(run_id) if a == 2] == list(range(6)), "the Clear ran every item again"
    assert env.committed(run_id) == {i: 2 for i in range(6)}
    assert [(h.attempt, h.outcome) for h in env.session.listings.history(JOB, run_id)] == [(1, "done"), (2, "done")]


def test_clear_after_a_failure_past_done_finishes_without_redoing_the_work(env: Env) -> None:
    """The try failed after its slot was done (the end-of-run window): a Clear means "finish it"."""
    run_id = f"endwindow_{uuid.uuid4().hex[:8]}"
    job = f"{END_DAG_ID}.{TASK_ID}"
    env.api.trigger(END_DAG_ID, run_id=run_id, conf={"items": 6, "fail_after_done": True})
    assert env.run_state(run_id, ("success", "failed"), dag_id=END_DAG_ID) == "failed"
    done = env.row(run_id, job)
    assert done is not None and done.status == "done" and done.confirmed_at is None, done
    env.api.clear(END_DAG_ID, run_id, [TASK_ID])
    assert env.run_state(run_id, ("success", "failed"), dag_id=END_DAG_ID) == "success"
    assert env.api.task_instance(END_DAG_ID, run_id, TASK_ID)["try_number"] == 2
    assert [a for _, a in env.seen(run_id, job)] == [1] * 6, "try 2 did not run the handler"
    assert env.committed(run_id, job) == {i: 1 for i in range(6)}
    history = [(h.attempt, h.outcome) for h in env.session.listings.history(job, run_id)]
    assert history == [(1, "done"), (2, "already_done")], history
    log = env.airflow.task_log(END_DAG_ID, run_id, TASK_ID, 2)
    assert "already finished" in log and "not running it again" in log, log[-3000:]


# -- pause, throttle and time slices with the real triggerer ------------------------------------


def history_of(env: Env, job: str, slot: str) -> list[tuple[str, str | None, int]]:
    return [(r.outcome, r.requested_by, r.attempt) for r in env.session.listings.history(job, slot)]


def test_a_pause_defers_the_task_frees_its_pool_slot_and_resume_continues_it_in_the_same_try(env: Env) -> None:
    # Given a resumable task running in a pool of one worker slot
    run_id, job = f"pause_{uuid.uuid4().hex[:8]}", f"{PAUSE_DAG_ID}.{TASK_ID}"
    env.api.trigger(PAUSE_DAG_ID, run_id=run_id, conf={"items": 60})
    env.running_with_progress(run_id, job=job)
    # When a person pauses it
    asked = time.monotonic()
    control.pause(env.session.store, job, run_id, by="pauser")
    paused = wait_for(lambda: (r := env.row(run_id, job)) and r.status == "paused" and r, timeout=30, interval=0.05,
                      what="the pause", on_timeout=lambda: env.explain(run_id))
    MEASURED["pause -> checkpoint saved, paused"] = time.monotonic() - asked
    wait_for(lambda: env.api.task_instance(PAUSE_DAG_ID, run_id, TASK_ID)["state"] == "deferred", timeout=30,
             interval=0.05, what="the task to defer")
    MEASURED["pause -> deferred"] = time.monotonic() - asked
    print(f"\n[scheduler] pause -> paused row {MEASURED['pause -> checkpoint saved, paused']:.2f}s, "
          f"-> deferred {MEASURED['pause -> deferred']:.2f}s")
    # Then it stopped within one heartbeat and one chunk (plus the time Airflow takes to record it)
    assert MEASURED["pause -> checkpoint saved, paused"] < PAUSE_HEARTBEAT + PAUSE_CHUNK + 1.5
    assert MEASURED["pause -> deferred"] < PAUSE_HEARTBEAT + PAUSE_CHUNK + 5.0
    assert paused.lease_owner is None and 0 < paused.processed < 60
    with pytest.raises(RequestRefused, match="already paused"):
        control.pause(env.session.store, job, run_id)
    # And it holds no worker slot: another task runs in the pool of one meanwhile
    other = f"other_{uuid.uuid4().hex[:8]}"
    env.api.trigger(POOL_DAG_ID, run_id=other)
    assert env.run_state(other, ("success", "failed"), timeout=120, dag_id=POOL_DAG_ID) == "success"
    assert env.api.task_instance(PAUSE_DAG_ID, run_id, TASK_ID)["state"] == "deferred"
    assert env.row(run_id, job).processed == paused.processed
    # When it is resumed
    asked = time.monotonic()
    control.resume(env.session.store, job, run_id, by="resumer")
    wait_for(lambda: env.api.task_instance(PAUSE_DAG_ID, run_id, TASK_ID)["state"] == "running", timeout=60,
             interval=0.05, what="the task to run again")
    MEASURED["resume -> running"] = time.monotonic() - asked
    wait_for(lambda: (r := env.row(run_id, job)) and r.status == "running" and r, timeout=60, interval=0.05,
             what="the slot to run again")
    MEASURED["resume -> slot running"] = time.monotonic() - asked
    print(f"[scheduler] resume -> task running {MEASURED['resume -> running']:.2f}s, "
          f"-> slot running {MEASURED['resume -> slot running']:.2f}s")
    # Then it continues from the checkpoint in the same try and finishes, each item once
    assert env.run_state(run_id, ("success", "failed"), dag_id=PAUSE_DAG_ID) == "success"
    assert env.api.task_instance(PAUSE_DAG_ID, run_id, TASK_ID)["try_number"] == 1
    assert_exactly_once(env, run_id, 60, job)
    assert env.row(run_id, job).resumed_from == paused.position
    assert history_of(env, job, run_id) == [
        ("paused", None, 1), ("pause_requested", "pauser", 1), ("resume_requested", "resumer", 1), ("done", None, 1),
    ]


def deferrals(env: Env, dag_id: str, run_id: str) -> int:
    """Poll the task instance until the run ends; how many times it entered ``deferred``."""
    seen: list[str] = []

    def ended() -> bool:
        state = env.api.task_instance(dag_id, run_id, TASK_ID)["state"]
        if not seen or seen[-1] != state:
            seen.append(state)
        return env.api.dag_run(dag_id, run_id)["state"] in ("success", "failed")

    def explain() -> str:
        log = env.airflow.task_log(dag_id, run_id, TASK_ID, 1)
        return f"states: {seen}\n--- task log ---\n{log[-6000:]}\n{env.airflow.tail(60)}"

    wait_for(ended, timeout=180, interval=0.1, what=f"{run_id} to end", on_timeout=explain)
    return seen.count("deferred")


def test_a_throttle_that_asks_for_long_waits_defers_twice_and_finishes_in_one_try(env: Env) -> None:
    run_id, job = f"throttle_{uuid.uuid4().hex[:8]}", f"{THROTTLE_DAG_ID}.{TASK_ID}"
    env.api.trigger(THROTTLE_DAG_ID, run_id=run_id)
    assert deferrals(env, THROTTLE_DAG_ID, run_id) == 2
    assert env.api.dag_run(THROTTLE_DAG_ID, run_id)["state"] == "success"
    assert env.api.task_instance(THROTTLE_DAG_ID, run_id, TASK_ID)["try_number"] == 1
    assert_exactly_once(env, run_id, 30, job)
    assert [o for o, _, _ in history_of(env, job, run_id)] == ["paused", "paused", "done"]


def test_max_runtime_gives_the_worker_back_between_slices_and_finishes_in_one_try(env: Env) -> None:
    run_id, job = f"slices_{uuid.uuid4().hex[:8]}", f"{SLICES_DAG_ID}.{TASK_ID}"
    env.api.trigger(SLICES_DAG_ID, run_id=run_id)
    slices = deferrals(env, SLICES_DAG_ID, run_id)
    assert env.api.dag_run(SLICES_DAG_ID, run_id)["state"] == "success"
    assert env.api.task_instance(SLICES_DAG_ID, run_id, TASK_ID)["try_number"] == 1
    assert_exactly_once(env, run_id, 30, job)
    outcomes = [o for o, _, _ in history_of(env, job, run_id)]
    assert slices >= 1 and outcomes.count("paused") == slices and outcomes[-1] == "done"
