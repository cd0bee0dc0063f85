"""On a real CeleryExecutor deployment: worker crashes, deploys, mapped tasks and overlap across workers.

One deployment (tests/support/celery_cluster.py: api-server, scheduler, dag-processor, triggerer,
two Celery workers of concurrency 2, Redis broker, PostgreSQL metadata and result backend, a short
task-instance heartbeat timeout) runs for the whole module; the checkpoint store is another
PostgreSQL database. A worker a test killed or stopped is started again before the next test.

Measured times are printed (run with ``-s``): a whole worker SIGKILLed -> the retry resuming on the
other worker (noticed only by Airflow's heartbeat timeout), and a worker's SIGTERM (a deploy) ->
the attempt stopped and -> the worker exited (the drain of airflow_resumable.executors.celery).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_resumable.core.attempt.lease import STOP_POLL
from airflow_resumable.core.model.checkpoint import Checkpoint
from devtools.postgres import Server
from support.celery_cluster import CeleryDeployment, Component, redis_client
from support.deployment import HEARTBEAT_TIMEOUT, Env, assert_exactly_once, databases
from support.paths import ROOT
from support.standalone import wait_for

pytestmark = [pytest.mark.celery, pytest.mark.scheduler]

DAG_FILES = [ROOT / "tests" / "dags" / "celery_dags.py", ROOT / "tests" / "dags" / "scheduler_dags.py"]
SLOW = "celery_slow"
MAPPED = "celery_mapped"
TASK_ID = "work"
CHUNK = 2
DELAY = 0.25  # seconds per item: a chunk takes CHUNK * DELAY
#: What "a few seconds" after the chunk means for a worker's exit: the attempt's last writes, the
#: supervisor's final report to the API server, and Celery closing its pool and connections.
EXIT_SLACK = 20.0
PARTITIONS, PARTITION_ITEMS = 8, 24

MEASURED: dict[str, float] = {}
#: Items started by a try and started again by the next one, per scenario.
REPEATED: dict[str, int] = {}


class CeleryEnv(Env):
    """The scheduler tests' Env (support/deployment.py: checkpoint rows, sink tables, REST API), for any
    DAG of the deployment."""

    @property
    def cluster(self) -> CeleryDeployment:
        assert isinstance(self.airflow, CeleryDeployment)
        return self.airflow

    def start_run(self, dag_id: str, prefix: str, **conf: Any) -> str:
        run_id = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.api.trigger(dag_id, run_id=run_id, conf={"items": 60, "chunk": CHUNK, "delay": DELAY, **conf})
        return run_id

    def ti(self, run_id: str, dag_id: str = SLOW) -> dict[str, Any]:
        return self.api.task_instance(dag_id, run_id, TASK_ID)

    def explain(self, run_id: str, dag_id: str = SLOW) -> str:
        parts = [f"row: {self.row(run_id, f'{dag_id}.{TASK_ID}')}"]
        try:
            ti = self.ti(run_id, dag_id)
            parts.append(f"task instance: state={ti['state']} try={ti['try_number']} pid={ti['pid']}")
            for n in range(1, ti["try_number"] + 1):
                parts.append(f"--- task log, try {n} ---\n{self.airflow.task_log(dag_id, run_id, TASK_ID, n)[-3000:]}")
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            parts.append(f"(task instance unavailable: {exc!r})")
        parts.append(self.cluster.tail(25))
        return "\n".join(parts)

    def first_rows(self, run_id: str, job: str, attempt: int, timeout: float) -> tuple[float, float, Checkpoint]:
        """Wait for try ``attempt`` to take the row over, then for its first saved chunk.

        Returns the monotonic times of both and the row after that chunk."""

        def took_over() -> Checkpoint | None:
            row = self.row(run_id, job)
            return row if row and row.attempt == attempt and row.status == "running" else None

        wait_for(took_over, timeout=timeout, interval=0.05, what=f"try {attempt} of {run_id} to resume",
                 on_timeout=lambda: self.explain(run_id, job.split(".")[0]))
        resumed = time.monotonic()
        first = self.row(run_id, job)
        assert first is not None

        def saved() -> Checkpoint | None:
            row = self.row(run_id, job)
            return row if row and row.attempt == attempt and row.processed > first.processed else None

        row = wait_for(saved, timeout=60, interval=0.05, what=f"try {attempt} of {run_id} to save a chunk",
                       on_timeout=lambda: self.explain(run_id, job.split(".")[0]))
        return resumed, time.monotonic(), row


def repeated_items(env: Env, slot: str, job: str) -> list[int]:
    """Items started by an earlier try and started again by a later one (work a crash repeated)."""
    seen = env.seen(slot, job)
    tries = sorted({a for _, a in seen})
    repeated: set[int] = set()
    for earlier in tries:
        for later in tries:
            if later > earlier:
                repeated |= {i for i, a in seen if a == earlier} & {i for i, a in seen if a == later}
    return sorted(repeated)


@pytest.fixture(scope="module")
def env(pg_server: Server) -> Iterator[CeleryEnv]:
    redis_client()  # fail at once, and clearly, without the broker
    with databases(pg_server, "celery") as db:
        cluster = CeleryDeployment(metadata_uri=db.metadata_uri, dag_files=DAG_FILES, env=db.env)
        dag_ids = [SLOW, MAPPED] + [
            f"celery_{policy}_on_{worker}" for policy in ("skip", "replace") for worker in ("worker_a", "worker_b")
        ]
        try:
            cluster.start()
            cluster.serve(dag_ids)
            with db.store.open(autocommit=True) as session:
                session.ensure_schema()
                yield CeleryEnv(airflow=cluster, session=session, sink=db.sink)
        finally:
            cluster.close()
    if MEASURED:
        print("\n[celery] measured: " + ", ".join(f"{k} = {v:.2f}s" for k, v in MEASURED.items()))
    if REPEATED:
        print("[celery] items repeated: " + ", ".join(f"{k}: {v}" for k, v in REPEATED.items()))


@pytest.fixture(autouse=True)
def two_workers(env: CeleryEnv) -> CeleryEnv:
    """Every scenario starts with both workers up (a previous one may have killed or stopped one)."""
    for name in CeleryDeployment.WORKERS:
        component = env.cluster.components[name]
        if not component.alive():
            env.cluster.restart_worker(component)
    return env


def start_slow_run(env: CeleryEnv, prefix: str) -> tuple[str, dict[str, Any], Component, Checkpoint]:
    """A ``celery_slow`` run with a few chunks saved; its task instance and the worker running it."""
    run_id = env.start_run(SLOW, prefix)
    before = env.running_with_progress(run_id, job=f"{SLOW}.{TASK_ID}")
    ti = env.ti(run_id)
    assert ti["state"] == "running" and ti["try_number"] == 1, ti
    return run_id, ti, env.cluster.worker_running(ti), before


def assert_finished_on(env: CeleryEnv, run_id: str, stopped: Checkpoint) -> Checkpoint:
    """The run succeeded with try 2, which resumed where try 1 stopped, and each item once."""
    job = f"{SLOW}.{TASK_ID}"
    assert env.run_state(run_id, ("success", "failed"), dag_id=SLOW) == "success", env.explain(run_id)
    final = env.row(run_id, job)
    assert final is not None and final.status == "done" and final.attempt == 2, final
    assert final.resumed_from is not None and final.resumed_from >= stopped.position, (final, stopped)
    assert_exactly_once(env, run_id, 60, job=job)
    later = [item for item, attempt in env.seen(run_id, job) if attempt == 2]
    assert later and min(later) == final.resumed_from, f"try 2 started at {min(later)}, not {final.resumed_from}"
    log = env.airflow.task_log(SLOW, run_id, TASK_ID, 2)
    assert "resuming from position" in log, log[-3000:]
    return final


# -- 1. a worker crashes ---------------------------------------------------------------------------


def test_a_crashed_worker_s_task_resumes_on_the_other_worker_each_item_written_once(env: CeleryEnv) -> None:
    run_id, ti, victim, before = start_slow_run(env, "crash")
    other = env.cluster.other_worker(victim)
    killed = env.cluster.crash(victim)  # the worker's process group and its task processes' groups

    resumed, first_chunk, row = env.first_rows(run_id, f"{SLOW}.{TASK_ID}", 2, timeout=HEARTBEAT_TIMEOUT + 150)
    MEASURED["worker SIGKILL -> retry resumed"] = resumed - killed
    MEASURED["worker SIGKILL -> first resumed chunk saved"] = first_chunk - killed
    print(f"\n[celery] worker SIGKILL -> retry resumed on the other worker: {resumed - killed:.2f}s, "
          f"-> its first chunk saved: {first_chunk - killed:.2f}s "
          f"(task_instance_heartbeat_timeout={HEARTBEAT_TIMEOUT}s)")
    assert env.cluster.worker_running(env.ti(run_id)) is other, "the retry runs on the surviving worker"
    assert row.resumed_from is not None and row.resumed_from >= before.position, (row, before)

    assert_finished_on(env, run_id, before)
    repeated = repeated_items(env, run_id, f"{SLOW}.{TASK_ID}")
    REPEATED["worker SIGKILL"] = len(repeated)
    assert len(repeated) <= CHUNK, f"more than one chunk repeated: {repeated}"
    assert resumed - killed < HEARTBEAT_TIMEOUT + 60, "the retry should follow the heartbeat timeout closely"


# -- 2. a deploy: the worker is asked to stop ------------------------------------------------------


@pytest.mark.parametrize(
    "how",
    [
        # A deploy's `kill -TERM <worker>`, `airflow celery stop`, docker stop, or a pod stop whose init
        # signals the main process only: Celery's warm shutdown, drained by our worker_shutting_down hook.
        "main",
        # A pod stop through the official image's dumb-init (DUMB_INIT_SETSID=1): SIGTERM to the worker's
        # whole process group, supervisors included; they forward it to their task processes.
        "group",
    ],
)
def test_sigterm_to_the_worker_drains_the_task_at_a_chunk_boundary_and_the_retry_resumes_elsewhere(
    env: CeleryEnv, how: str
) -> None:
    run_id, ti, victim, _ = start_slow_run(env, f"drain_{how}")
    other = env.cluster.other_worker(victim)
    with env.sink.cursor() as cur:  # the database's clock, to read the retry's lease_acquired_at against
        cur.execute("SELECT clock_timestamp()")
        sent_db = cur.fetchone()[0]
    sent = time.monotonic()
    if how == "main":
        os.kill(victim.pid, signal.SIGTERM)
    else:
        os.killpg(victim.pid, signal.SIGTERM)

    row = env.stopped(run_id, attempt=1, job=f"{SLOW}.{TASK_ID}")
    stopped = time.monotonic()
    assert victim.process is not None
    victim.process.wait(timeout=CHUNK * DELAY + STOP_POLL + EXIT_SLACK + 30)
    exited = time.monotonic()
    MEASURED[f"SIGTERM ({how}) -> attempt stopped"] = stopped - sent
    MEASURED[f"SIGTERM ({how}) -> worker exited"] = exited - sent
    print(f"\n[celery] SIGTERM to the worker ({how}): attempt stopped after {stopped - sent:.2f}s, "
          f"worker exited after {exited - sent:.2f}s (a chunk is {CHUNK * DELAY:g}s)")

    assert row.status == "cancelled" and row.stop_reason == "shutdown", row
    assert row.position == row.processed and 0 < row.processed < 60, row
    assert stopped - sent < CHUNK * DELAY + STOP_POLL + 3, f"the attempt stopped {stopped - sent:.1f}s after SIGTERM"
    assert exited - sent < CHUNK * DELAY + STOP_POLL + EXIT_SLACK, victim.tail()
    assert victim.process.returncode == 0, f"not a clean warm shutdown\n{victim.tail()}"

    # A retryable failure: Airflow itself starts try 2 (nobody cleared anything); try 1 is recorded failed.
    took_over = env.first_rows(run_id, f"{SLOW}.{TASK_ID}", 2, timeout=120)[2]
    assert took_over.lease_acquired_at is not None, took_over
    MEASURED[f"SIGTERM ({how}) -> retry took the slot"] = (took_over.lease_acquired_at - sent_db).total_seconds()
    first_try = env.api.task_try(SLOW, run_id, TASK_ID, 1)
    assert first_try is not None and first_try["state"] == "failed", first_try
    log = env.airflow.task_log(SLOW, run_id, TASK_ID, 1)
    assert "cancelled (shutdown)" in log, log[-3000:]
    assert env.cluster.worker_running(env.ti(run_id)) is other, "the retry runs on the other worker"
    final = assert_finished_on(env, run_id, row)
    assert final.resumed_from == row.position, (final, row)
    # The drained attempt dropped its unfinished chunk (its writes rolled back): at most that is redone.
    repeated = repeated_items(env, run_id, f"{SLOW}.{TASK_ID}")
    REPEATED[f"SIGTERM ({how})"] = len(repeated)
    assert len(repeated) <= CHUNK, f"more than the unfinished chunk was repeated: {repeated}"


# -- 3. a mapped task across both workers ----------------------------------------------------------


def test_a_mapped_task_finishes_every_partition_once_when_a_worker_dies_half_way(env: CeleryEnv) -> None:
    run_id = f"mapped_{uuid.uuid4().hex[:8]}"
    env.api.trigger(MAPPED, run_id=run_id)
    jobs = [f"{MAPPED}.{TASK_ID}[{i}]" for i in range(PARTITIONS)]

    def half_way() -> list[Checkpoint] | None:
        """Both workers run partitions, and those have saved some chunks."""
        running = [r for r in (env.row(run_id, job) for job in jobs) if r and r.status == "running"]
        return running if len([r for r in running if r.processed >= 3 * CHUNK]) >= 3 else None

    wait_for(half_way, timeout=240, interval=0.2, what="partitions to make progress on both workers",
             on_timeout=env.cluster.tail)
    tis = env.api.get(f"/dags/{MAPPED}/dagRuns/{run_id}/taskInstances", params={"limit": 100})["task_instances"]
    running = [ti for ti in tis if ti["state"] == "running"]
    by_worker = {}
    for ti in running:
        try:
            by_worker.setdefault(env.cluster.worker_running(ti).name, []).append(ti["map_index"])
        except AssertionError:
            pass  # it just finished
    victim = env.cluster.components[max(by_worker, key=lambda name: len(by_worker[name]))]
    lost = sorted(by_worker[victim.name])
    env.cluster.crash(victim)
    print(f"\n[celery] mapped: killed {victim.name} running partitions {lost}; partitions per worker {by_worker}")

    assert env.run_state(run_id, ("success", "failed"), timeout=HEARTBEAT_TIMEOUT + 300, dag_id=MAPPED) == "success"
    resumed = []
    for i, job in enumerate(jobs):
        row = env.row(run_id, job)
        assert row is not None and row.status == "done" and row.processed == PARTITION_ITEMS, (job, row)
        assert_exactly_once(env, run_id, PARTITION_ITEMS, job=job)
        repeated = repeated_items(env, run_id, job)
        assert len(repeated) <= CHUNK, f"partition {i} repeated more than one chunk: {repeated}"
        if row.attempt > 1:
            resumed.append(i)
            assert row.resumed_from, f"partition {i} started over instead of resuming: {row}"
    assert set(lost) <= set(resumed), f"the killed worker's partitions {lost} did not resume (resumed: {resumed})"


# -- 4. overlap between runs on different workers --------------------------------------------------


def test_overlap_skip_skips_the_newer_run_on_the_other_worker(env: CeleryEnv) -> None:
    job = "celery-skip"
    older = env.start_run("celery_skip_on_worker_a", "older", items=120)
    env.running_with_progress(older, job=job)
    ti = env.api.task_instance("celery_skip_on_worker_a", older, TASK_ID)
    assert env.cluster.worker_running(ti).name == "worker-a"

    newer = env.start_run("celery_skip_on_worker_b", "newer", items=6)
    assert env.run_state(newer, ("success", "failed"), dag_id="celery_skip_on_worker_b") == "success"
    skipped = env.api.task_instance("celery_skip_on_worker_b", newer, TASK_ID)
    assert skipped["state"] == "skipped" and skipped["queue"] == "worker-b", skipped
    log = env.airflow.task_log("celery_skip_on_worker_b", newer, TASK_ID, 1)
    assert f"(slot {older}) of this job began first" in log, log[-3000:]
    assert env.row(newer, job) is None, "a skipped run leaves no checkpoint behind"
    row = env.row(older, job)
    assert row is not None and row.status in ("running", "done") and row.attempt == 1, "the older run goes on"

    assert env.run_state(older, ("success", "failed"), dag_id="celery_skip_on_worker_a") == "success"
    assert_exactly_once(env, older, 120, job=job)


def test_overlap_replace_stops_the_older_run_on_the_other_worker_and_proceeds(env: CeleryEnv) -> None:
    job = "celery-replace"
    older = env.start_run("celery_replace_on_worker_a", "older", items=400)
    env.running_with_progress(older, job=job)
    ti = env.api.task_instance("celery_replace_on_worker_a", older, TASK_ID)
    assert env.cluster.worker_running(ti).name == "worker-a"

    newer = env.start_run("celery_replace_on_worker_b", "newer", items=6)
    stopped = env.stopped(older, attempt=1, job=job)
    assert (stopped.status, stopped.stop_reason) == ("cancelled", "superseded"), stopped
    assert stopped.position == stopped.processed, stopped
    assert_exactly_once(env, older, stopped.position, job=job)

    assert env.run_state(newer, ("success", "failed"), dag_id="celery_replace_on_worker_b") == "success"
    done = env.row(newer, job)
    assert done is not None and done.status == "done" and done.processed == 6, done
    assert env.api.task_instance("celery_replace_on_worker_b", newer, TASK_ID)["queue"] == "worker-b"
    # The replaced run fails without a retry (a retry would fight the newer run); Clear resumes it.
    assert env.run_state(older, ("success", "failed"), dag_id="celery_replace_on_worker_a") == "failed"
    old_ti = env.api.task_instance("celery_replace_on_worker_a", older, TASK_ID)
    assert old_ti["state"] == "failed" and old_ti["try_number"] == 1, old_ti
