"""What the real-Airflow test modules (scheduler, Celery) set up and drive alike: a metadata database,
a checkpoint database with the tests' sink tables, and the Airflow settings that point at them; and
:class:`Env`, their handle on the deployment once it runs (the checkpoint rows, the sink tables, the
REST API; the runs of ``sched_slow``, tests/dags/scheduler_dags.py, by default)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import psycopg2

from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.stores import PostgresStore
from airflow_resumable.core.stores.base import StoreSession
from devtools.postgres import Server, dsn
from support.standalone import Standalone, wait_for

#: The tables the test DAGs write to in the checkpoint database: ``sched_items`` through
#: ``ctx.transaction()`` (how often each item was committed), ``sched_seen`` on a separate connection
#: (every item an attempt started).
TABLES = (
    "CREATE TABLE sched_items (job TEXT NOT NULL, slot TEXT NOT NULL, item INTEGER NOT NULL, "
    "writes INTEGER NOT NULL, attempt INTEGER NOT NULL, PRIMARY KEY (job, slot, item))",
    "CREATE TABLE sched_seen (job TEXT NOT NULL, slot TEXT NOT NULL, item INTEGER NOT NULL, "
    "attempt INTEGER NOT NULL, seen_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
)

#: [scheduler] task_instance_heartbeat_timeout for these deployments (300 s by default).
HEARTBEAT_TIMEOUT = 15


@dataclasses.dataclass
class Databases:
    metadata_uri: str  # SQLAlchemy URI of the Airflow metadata database
    store: PostgresStore  # the checkpoint database
    sink: Any  # an autocommit psycopg2 connection on it
    env: dict[str, str]  # Airflow settings: the checkpoint connection, the heartbeat timeout


@contextmanager
def databases(pg_server: Server, name: str) -> Iterator[Databases]:
    """``resumable_<name>_meta`` and ``resumable_<name>_ckpt``, the sink tables created."""
    metadata = pg_server.create_database(f"resumable_{name}_meta")
    checkpoints = pg_server.create_database(f"resumable_{name}_ckpt")
    with closing(psycopg2.connect(dsn(checkpoints))) as sink:
        sink.autocommit = True
        with sink.cursor() as cur:
            for statement in TABLES:
                cur.execute(statement)
        yield Databases(
            metadata_uri=dsn(metadata).replace("postgresql://", "postgresql+psycopg2://", 1),
            store=PostgresStore(**checkpoints),
            sink=sink,
            env={
                "AIRFLOW_CONN_RESUMABLE_DEFAULT": dsn(checkpoints),
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            },
        )


# -- driving it -------------------------------------------------------------------------------------

#: The scheduler tests' DAG (tests/dags/scheduler_dags.py) whose runs :class:`Env` triggers and explains.
DAG_ID = "sched_slow"
TASK_ID = "work"
JOB = f"{DAG_ID}.{TASK_ID}"
ITEMS = 80
CHUNK = 2
DELAY = 0.2  # seconds per item: a chunk takes CHUNK * DELAY


@dataclasses.dataclass
class Env:
    """A running deployment as the tests drive it: its checkpoint rows and sink tables, its REST API,
    and ``sched_slow``'s runs (triggered, waited for, explained when a wait fails)."""

    airflow: Standalone
    session: StoreSession
    sink: Any  # autocommit psycopg2 connection on the checkpoint database

    @property
    def api(self) -> Any:
        assert self.airflow.api is not None
        return self.airflow.api

    # -- the checkpoint database -----------------------------------------------------------------

    def row(self, slot: str, job: str = JOB) -> Checkpoint | None:
        return self.session.checkpoints.load(job, slot)

    def committed(self, slot: str, job: str = JOB) -> dict[int, int]:
        """item -> how many times its write was committed (through ctx.transaction())."""
        with self.sink.cursor() as cur:
            cur.execute("SELECT item, writes FROM sched_items WHERE job = %s AND slot = %s", (job, slot))
            return dict(cur.fetchall())

    def seen(self, slot: str, job: str = JOB) -> list[tuple[int, int]]:
        """(item, attempt) for every item an attempt started, in order."""
        with self.sink.cursor() as cur:
            cur.execute(
                "SELECT item, attempt FROM sched_seen WHERE job = %s AND slot = %s ORDER BY seen_at", (job, slot)
            )
            return [tuple(r) for r in cur.fetchall()]

    # -- Airflow ---------------------------------------------------------------------------------

    def trigger(self, prefix: str) -> str:
        run_id = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.api.trigger(DAG_ID, run_id=run_id, conf={"items": ITEMS, "chunk": CHUNK, "delay": DELAY})
        return run_id

    def ti(self, run_id: str) -> dict[str, Any]:
        return self.api.task_instance(DAG_ID, run_id, TASK_ID)

    def running_with_progress(
        self, run_id: str, at_least: int = 3 * CHUNK, attempt: int = 1, job: str = JOB
    ) -> Checkpoint:
        """Wait until the task runs try ``attempt`` and has committed ``at_least`` items."""

        def ready() -> Checkpoint | None:
            row = self.row(run_id, job)
            if row and row.status == "running" and row.attempt == attempt and row.processed >= at_least:
                return row
            return None

        return wait_for(ready, timeout=180, interval=0.1, what=f"{run_id} try {attempt} to make progress",
                        on_timeout=lambda: self.explain(run_id))

    def run_state(self, run_id: str, states: tuple[str, ...], timeout: float = 180, dag_id: str = DAG_ID) -> str:
        return self.api.run_state(dag_id, run_id, states, timeout=timeout, on_timeout=lambda: self.explain(run_id))

    def explain(self, run_id: str) -> str:
        """What to look at when a wait fails: the row, the task instance, the logs."""
        parts = [f"row: {self.row(run_id)}"]
        try:
            ti = self.ti(run_id)
            parts.append(f"task instance: state={ti['state']} try={ti['try_number']} pid={ti['pid']}")
            for n in range(1, ti["try_number"] + 1):
                parts.append(f"--- task log, try {n} ---\n{self.airflow.task_log(DAG_ID, run_id, TASK_ID, n)[-4000:]}")
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            parts.append(f"(task instance unavailable: {exc!r})")
        parts.append(self.airflow.tail(40))
        return "\n".join(parts)

    def states_of_try(self, run_id: str, try_number: int) -> list[str]:
        """Poll the task instance until its next try starts; the states try ``try_number`` went through.

        (Airflow's try history records a retried try as ``failed``; only the live task instance
        shows ``up_for_retry``.)
        """
        states: list[str] = []

        def next_try() -> bool:
            ti = self.ti(run_id)
            if ti["try_number"] == try_number and (not states or states[-1] != ti["state"]):
                states.append(ti["state"])
            return ti["try_number"] > try_number

        wait_for(next_try, timeout=120, interval=0.05, what=f"try {try_number + 1} of {run_id} to start",
                 on_timeout=lambda: f"states of try {try_number}: {states}\n{self.explain(run_id)}")
        return states

    def stopped(self, run_id: str, *, attempt: int, job: str = JOB) -> Checkpoint:
        """Poll until try ``attempt`` no longer runs on the row; the row as that try left it."""

        def ended() -> Checkpoint | None:
            row = self.row(run_id, job)
            return row if row and (row.attempt != attempt or row.status != "running") else None

        row = wait_for(ended, timeout=60, interval=0.05, what=f"try {attempt} of {run_id} to stop",
                       on_timeout=lambda: self.explain(run_id))
        assert row.attempt == attempt, f"a new try started before try {attempt} was seen to stop: {row}"
        return row


def assert_exactly_once(env: Env, slot: str, upto: int, job: str = JOB) -> None:
    """Items ``0 .. upto-1`` were committed, each exactly once."""
    committed = env.committed(slot, job)
    assert sorted(committed) == list(range(upto)), f"committed items {sorted(committed)} != 0..{upto - 1}"
    repeated = {item: n for item, n in committed.items() if n != 1}
    assert not repeated, f"items committed more than once: {repeated}"
