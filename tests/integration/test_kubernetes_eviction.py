"""A Kubernetes node drain without a cluster: a task's pod (the KubernetesExecutor's pod command, the
task SDK's ``execute_workload`` supervisor, on a host of its own) gets SIGTERM, then SIGKILL once
the grace period ran out; so does a Celery worker pod whose main process is dumb-init.

The task's chunks are uninterruptible work (it stops only at a checkpoint), so a stop takes up to
one chunk. With a grace period longer than a chunk the attempt stops at a chunk boundary (reason
``shutdown``), fails retryable and the retry resumes there; with a shorter one the SIGKILL lands in
the chunk, which the retry repeats: nothing is lost. Measured times are printed (``-s``); the
settings they lead to are in docs/how-to/kubernetes.md.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from devtools.postgres import Server
from support.chaos.cluster import Chaos, chaos_cluster
from support.chaos.pod import Pod, next_workload
from support.ci import in_ci
from support.standalone import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.celery]

REDIS_DB = 10  # not the chaos trials' broker database: both may run at once
ITEMS, CHUNK, DELAY = 24, 4, 0.5  # a chunk is 2 s of work that does not look at the signal
CHUNK_SECONDS = CHUNK * DELAY
#: A grace period longer than a chunk, plus what the supervisor needs after the task stopped (it
#: reports the try's end to the API server and exits: seconds on a loaded machine); one shorter
#: than a chunk.
LONG_GRACE, SHORT_GRACE = CHUNK_SECONDS + 30, CHUNK_SECONDS / 4
#: How to install dumb-init, the init the official image runs (Debian's package: the same 1.2.5).
DUMB_INIT_HINT = "install Debian's package: make chaos-deps (apt-get install -y dumb-init)"
MEASURED: dict[str, float] = {}
#: Items written twice (the plain sink's log), per eviction.
REPEATED: dict[str, int] = {}


@pytest.fixture(scope="module")
def chaos(pg_server: Server) -> Iterator[Chaos]:
    with chaos_cluster(pg_server.admin_dsn, redis_db=REDIS_DB, extra_hosts={"pod": 21},
                       dag_ids=["chaos_pod", "chaos_podworker"]) as chaos:
        yield chaos
    if MEASURED:
        print("\n[kubernetes] measured: " + ", ".join(f"{k} = {v:.2f}s" for k, v in MEASURED.items()))
    if REPEATED:
        print("[kubernetes] items repeated: " + ", ".join(f"{k}: {v}" for k, v in REPEATED.items()))


def find_dumb_init() -> Path | None:
    """dumb-init wherever it is installed: ``RESUMABLE_DUMB_INIT`` if set, else the first on ``PATH``."""
    named = os.environ.get("RESUMABLE_DUMB_INIT") or shutil.which("dumb-init")
    return Path(named) if named and os.access(named, os.X_OK) else None


@pytest.fixture(scope="module")
def dumb_init() -> Path:
    """The dumb-init binary. Missing, the test fails in CI (``CI=true``; ``make test`` installs it first)
    and is skipped elsewhere, saying how to install it."""
    found = find_dumb_init()
    if found is None:
        why = f"dumb-init is not on PATH ({os.environ.get('PATH', '')}): {DUMB_INIT_HINT}"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    return found


def _row(chaos: Chaos, job: str, slot: str) -> dict[str, Any] | None:
    with closing(chaos.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT status, position, processed, attempt, stop_reason, resumed_from, last_error "
                    "FROM resumable_checkpoints WHERE job = %s AND slot = %s", (job, slot))
        found = cur.fetchone()
        if not found:
            return None
        row = dict(zip([d[0] for d in cur.description], found, strict=True))
        for key in ("position", "resumed_from"):  # JSON columns
            row[key] = None if row[key] is None else json.loads(row[key])
        return row


def _writes(chaos: Chaos, job: str, slot: str) -> tuple[list[tuple[int, int]], set[int]]:
    with closing(chaos.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT item, attempt FROM chaos_plain_log WHERE job = %s AND slot = %s", (job, slot))
        log = cur.fetchall()
        cur.execute("SELECT item FROM chaos_upsert WHERE job = %s AND slot = %s", (job, slot))
        return log, {r[0] for r in cur.fetchall()}


def _trigger(chaos: Chaos, dag_id: str) -> str:
    run_id = f"evict_{uuid.uuid4().hex[:8]}"
    assert chaos.cluster.api is not None
    chaos.cluster.api.trigger(dag_id, run_id=run_id, conf={"items": ITEMS, "chunk": CHUNK, "delay": DELAY})
    return run_id


def _running_with_progress(chaos: Chaos, job: str, slot: str, attempt: int = 1) -> dict[str, Any]:
    def progressed() -> dict[str, Any] | None:
        row = _row(chaos, job, slot)
        return row if row and row["status"] == "running" and row["attempt"] == attempt and row["processed"] >= CHUNK \
            else None

    return wait_for(progressed, timeout=180, interval=0.1, what=f"{job} {slot} to save a chunk")


def _inside_a_chunk(chaos: Chaos, job: str, slot: str) -> dict[str, Any]:
    """Wait for a saved chunk, then for the first item of the next one to be written: the attempt is
    then inside that chunk, its next boundary most of a chunk away. Returns the row."""
    row = _running_with_progress(chaos, job, slot)

    def next_item_written() -> bool:
        log, _ = _writes(chaos, job, slot)
        return any(item == row["processed"] for item, _ in log)

    wait_for(next_item_written, timeout=60, interval=0.02, what=f"{job} {slot} to start its next chunk")
    return row


def _pod(chaos: Chaos, tag: str) -> Pod:
    workload = next_workload("pod", redis_db=REDIS_DB)
    return Pod.task(chaos.network.hosts["pod"], workload, chaos.cluster.host_env(),
                    chaos.cluster.home / f"pod-{tag}.log")


def _finish_in_a_new_pod(chaos: Chaos, job: str, run_id: str) -> tuple[dict[str, Any], float]:
    """The retry: Airflow queues try 2, the executor starts it in a new pod; it runs to the end.

    Returns the final row and the monotonic time the retry's pod started."""
    retry = _pod(chaos, f"{run_id}-retry")
    started = time.monotonic()
    assert retry.wait(timeout=300) == 0, retry.log()[-3000:]
    assert chaos.cluster.api is not None
    api = chaos.cluster.api
    state = wait_for(lambda: (s := api.dag_run("chaos_pod", run_id)["state"]) in ("success", "failed") and s,
                     timeout=240, what=f"the run {run_id} to finish",
                     on_timeout=lambda: f"task instance: {api.task_instance('chaos_pod', run_id, 'work')}\n"
                                        f"retry pod:\n{retry.log()[-3000:]}\n{chaos.cluster.tail(20)}")
    assert state == "success", retry.log()[-3000:]
    final = _row(chaos, job, run_id)
    assert final is not None and final["status"] == "done" and final["processed"] == ITEMS, final
    return final, started


def _evict_watching(chaos: Chaos, pod: Pod, grace: float, job: str, slot: str) -> dict[str, float]:
    """Evict ``pod`` (in a thread) while watching the row: adds ``stopped``, when the attempt's row
    left ``running`` (if it did before the eviction ended)."""
    import threading

    times: dict[str, float] = {}
    evicting = threading.Thread(target=lambda: times.update(pod.evict(grace)))
    evicting.start()
    while evicting.is_alive():
        row = _row(chaos, job, slot)
        if "stopped" not in times and row and row["status"] != "running":
            times["stopped"] = time.monotonic()
        evicting.join(timeout=0.05)
    return times


@pytest.mark.parametrize("grace", ["long", "short"])
def test_a_pod_evicted_by_a_node_drain_resumes_in_the_next_pod_and_loses_nothing(chaos: Chaos, grace: str) -> None:
    job, run_id = "chaos_pod.work", _trigger(chaos, "chaos_pod")
    pod = _pod(chaos, run_id)
    before = _inside_a_chunk(chaos, job, run_id)
    seconds = LONG_GRACE if grace == "long" else SHORT_GRACE
    times = _evict_watching(chaos, pod, seconds, job, run_id)

    if grace == "long":
        # The supervisor forwards SIGTERM to the task process; the attempt finishes its chunk,
        # checkpoints and stops there; the pod exits before the grace period ran out.
        assert "sigkill" not in times, f"the pod did not exit within {seconds:g}s\n{pod.log()[-3000:]}"
        stopped = _row(chaos, job, run_id)
        assert stopped is not None, "no row"
        assert (stopped["status"], stopped["stop_reason"]) == ("cancelled", "shutdown"), stopped
        assert stopped["position"] == stopped["processed"] and stopped["processed"] >= before["processed"], stopped
        MEASURED["pod SIGTERM -> attempt stopped at a chunk boundary"] = times["stopped"] - times["sigterm"]
        MEASURED["pod SIGTERM -> pod exited"] = times["exited"] - times["sigterm"]
        assert times["stopped"] - times["sigterm"] < CHUNK_SECONDS + 3, times
        assert chaos.cluster.api is not None
        first = wait_for(lambda: (t := chaos.cluster.api.task_try("chaos_pod", run_id, "work", 1))
                         and t["state"] in ("failed", "up_for_retry") and t, timeout=60, what="try 1 to end")
        assert first["state"] in ("up_for_retry", "failed"), first  # retryable: try 2 follows on its own
    else:
        # The SIGKILL lands in the chunk: nothing of it is checkpointed; the task instance is failed
        # only when its heartbeats stop counting (the heartbeat timeout), then retried.
        assert "sigkill" in times, "a grace period shorter than a chunk should have ended in SIGKILL"
        stopped = _row(chaos, job, run_id)
        assert stopped is not None and stopped["status"] == "running" and stopped["attempt"] == 1, stopped

    final, started = _finish_in_a_new_pod(chaos, job, run_id)
    MEASURED[f"eviction ({grace} grace) -> retry pod started"] = started - times["sigterm"]
    MEASURED[f"eviction ({grace} grace) -> retry done"] = time.monotonic() - times["sigterm"]
    assert final["attempt"] == 2 and final["resumed_from"] == stopped["position"], (final, stopped)
    log, upserted = _writes(chaos, job, run_id)
    assert upserted == set(range(ITEMS)), f"items lost: {sorted(set(range(ITEMS)) - upserted)}"
    repeated = len(log) - len({item for item, _ in log})
    REPEATED[f"{grace} grace"] = repeated
    assert repeated <= CHUNK, f"{repeated} items written twice: more than one chunk"
    if grace == "short":
        assert repeated > 0 or stopped["processed"] % CHUNK == 0, "the killed chunk should have been repeated"


# -- a Celery worker pod under dumb-init -------------------------------------------------------------


@pytest.mark.parametrize("setsid", ["1", "0"])
def test_a_celery_worker_pod_under_dumb_init_drains_within_a_grace_longer_than_a_chunk(dumb_init: Path, chaos: Chaos,
                                                                                        setsid: str) -> None:
    """DUMB_INIT_SETSID=1 (the official image): dumb-init signals the worker's whole process group;
    0: the worker only. Either way the drain stops the task at a chunk boundary before the SIGKILL,
    and the retry (on the next worker pod) resumes there."""
    name = f"podworker{setsid}"
    airflow = str(Path(sys.executable).parent / "airflow")
    argv = [str(dumb_init), airflow, "celery", "worker", "--celery-hostname", f"{name}@%h", "--pid",
            str(chaos.cluster.home / f"{name}-{uuid.uuid4().hex[:4]}.pid"), "--concurrency", "1",
            "--queues", "podworker", "--without-mingle", "--without-gossip"]
    env = {**chaos.cluster.host_env(), "DUMB_INIT_SETSID": setsid}
    host = chaos.network.hosts["pod"]

    def worker_pod(tag: str) -> Pod:
        pod = Pod(host, argv, env, chaos.cluster.home / f"{name}-{tag}.log")
        wait_for(lambda: " ready." in pod.log(), timeout=180, what=f"the worker pod {name} to be ready",
                 on_timeout=lambda: pod.log()[-3000:])
        return pod

    pod = worker_pod("1")
    job, run_id = "chaos_podworker.work", _trigger(chaos, "chaos_podworker")
    before = _running_with_progress(chaos, job, run_id)
    times = pod.evict(LONG_GRACE * 2)
    stopped = _row(chaos, job, run_id)
    assert stopped is not None and (stopped["status"], stopped["stop_reason"]) == ("cancelled", "shutdown"), (
        stopped, pod.log()[-3000:])
    assert stopped["position"] == stopped["processed"] >= before["processed"], stopped
    assert "sigkill" not in times, f"the worker pod did not exit within {LONG_GRACE * 2:g}s\n{pod.log()[-3000:]}"
    MEASURED[f"dumb-init (DUMB_INIT_SETSID={setsid}) SIGTERM -> worker pod exited"] = times["exited"] - times["sigterm"]

    retry = worker_pod("2")
    try:
        assert chaos.cluster.api is not None
        state = wait_for(lambda: (s := chaos.cluster.api.dag_run("chaos_podworker", run_id)["state"])
                         in ("success", "failed") and s, timeout=300, what=f"the run {run_id} to finish")
        assert state == "success", retry.log()[-3000:]
        final = _row(chaos, job, run_id)
        assert final is not None and final["status"] == "done" and final["resumed_from"] == stopped["position"], final
        _, upserted = _writes(chaos, job, run_id)
        assert upserted == set(range(ITEMS))
    finally:
        retry.evict(LONG_GRACE * 2)
