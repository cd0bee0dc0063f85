"""What the real-Airflow test modules (scheduler, Celery) set up alike: a metadata database, a
checkpoint database with the tests' sink tables, and the Airflow settings that point at them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import psycopg2

from airflow_resumable.core.stores import PostgresStore
from devtools.postgres import Server, dsn

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
