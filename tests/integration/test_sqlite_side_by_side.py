"""The embedded store (SQLite) holding the product's own headline use, through a real scheduler: a
partitioned job of four partitions side by side (LocalExecutor), every row written through
``ctx.transaction()``, a skip policy replaying the chunk with a bad row item by item, each chunk
holding the write lock longer than the busy timeout and the replayed one longer than the lease
(tests/dags/sqlite_side_by_side_dags.py). The partitions take turns at the lock and finish, every
row once, none failing on a lock wait and none losing its lease to an attempt that does not exist.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from devtools.postgres import Server, dsn
from support.paths import TESTS
from support.standalone import Standalone

DAG_ID = "sqlite_side_by_side"
ROWS, BAD = 160, 57

pytestmark = pytest.mark.scheduler


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
        return conn.execute(sql).fetchall()


def test_four_partitions_side_by_side_on_sqlite_with_a_skip_policy_finish_with_every_row_once(
    pg_server: Server, tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "checkpoints.db"
    metadata = dsn(pg_server.create_database("resumable_side_meta")).replace("postgresql://", "postgresql+psycopg2://", 1)
    airflow = Standalone(metadata_uri=metadata, dag_files=[TESTS / "dags" / "sqlite_side_by_side_dags.py"], env={
        # A busy timeout of 1 s: shorter than one chunk's hold of the write lock (about 1.5 s)
        "AIRFLOW_CONN_RESUMABLE_DEFAULT": f"sqlite:///{checkpoints}?busy_timeout=1",
        "AIRFLOW__CORE__PARALLELISM": "8",
    })
    try:
        airflow.start()
        airflow.serve((DAG_ID,))
        api = airflow.api
        assert api is not None
        # Given the newcomer's job, triggered once
        api.trigger(DAG_ID, run_id="side_1")
        # When it runs to its end
        state = api.run_state(DAG_ID, "side_1", timeout=300, interval=1.0, what="the run to end",
                              on_timeout=lambda: airflow.tail(80))
        # Then it succeeded: every partition done, no attempt lost its lease or failed
        slots = _rows(checkpoints, "SELECT job, status, last_error FROM resumable_checkpoints "
                                   "WHERE job LIKE 'sqlite_side_by_side.export[%' ORDER BY job")
        history = _rows(checkpoints, "SELECT job, attempt, outcome, error, started_at, ended_at FROM resumable_attempts "
                                     "WHERE job LIKE 'sqlite_side_by_side.export[%' ORDER BY id")
        assert state == "success", (slots, history, airflow.tail(80))
        # (4 partitions, and any range one of them took from another once its own was done: rebalancing)
        assert len(slots) >= 4 and {(status, error) for _, status, error in slots} == {("done", None)}, slots
        assert len(history) == len(slots), history
        assert {(attempt, outcome) for _, attempt, outcome, *_ in history} == {(1, "done")}, history
        # And every row was written exactly once, the bad one skipped (recorded once)
        written = _rows(checkpoints, "SELECT id, count(*) FROM side_export GROUP BY id")
        assert sorted(i for i, _ in written) == [i for i in range(1, ROWS + 1) if i != BAD]
        assert {n for _, n in written} == {1}
        assert [tuple(r) for r in _rows(checkpoints, "SELECT count(*) FROM resumable_dead_letters")] == [(1,)]
        # And the partitions ran side by side (their attempts overlapped), taking turns at the lock
        spans = [(started, ended) for *_, started, ended in history]
        overlapping = sum(1 for a in spans for b in spans if a is not b and a[0] < b[1] and b[0] < a[1]) // 2
        assert overlapping >= 1, spans
    finally:
        airflow.close()
