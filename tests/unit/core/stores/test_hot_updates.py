"""The checkpoint table's layout on PostgreSQL: a checkpoint and a heartbeat rewrite the row in
place (a HOT update: no new index entries, the old version pruned within its page), so a slot
checkpointing all day neither bloats the table and its indexes nor writes index WAL.
"""

from __future__ import annotations

import json
import time
from typing import Any

from airflow_resumable.core.model.checkpoint import Write
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.stores import PostgresStore

JOB, SLOT, OWNER = "export", "2026-01-01T00:00:00+00:00", "a"


def _updates(store: PostgresStore, expected: int) -> tuple[int, int]:
    """(updates, HOT updates) of the checkpoint table once the statistics count ``expected``
    updates: the server publishes each backend's counts within about a second."""
    deadline = time.monotonic() + 30
    with store.open(autocommit=True) as s:
        while True:
            s.execute("SELECT pg_stat_clear_snapshot()").fetchall()
            n, hot = s.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'resumable_checkpoints'"
            ).fetchone()
            if n >= expected or time.monotonic() > deadline:
                return n, hot
            s.execute("SELECT pg_sleep(0.1)").fetchall()


def test_checkpoints_and_heartbeats_are_in_place_updates(pg_database: dict[str, Any]) -> None:
    # Given a running slot
    store = PostgresStore(**pg_database)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        row = s.leases.acquire(JOB, SLOT, OWNER, 30).row  # type: ignore[union-attr]
        fence = Fence.of(row)
        s.checkpoints.start(fence, 1, reset=True, resumed_from=None)
        # When it saves 500 checkpoints and renews its lease in between
        for i in range(500):
            s.checkpoints.save(
                fence, Write(position=json.dumps(i), state=json.dumps({"sum": i * i}), processed=i, total=500),
            )
            if i % 50 == 0:
                s.leases.heartbeat(fence, 30)
        s.execute("SELECT pg_stat_force_next_flush()").fetchall()
        # Then (nearly) every one of those updates stayed in place. The start moved the row's
        # started_at: not HOT. And an update can only be HOT once its page's old versions are dead to
        # every transaction on the server: another database's writer (a test running beside this
        # one) may hold a few back, so the proof is the share, not all of them.
        updates, hot = _updates(store, 500 + 10 + 1)
        assert updates == 511 and hot >= 0.95 * 510, (updates, hot)
        # and the indexes did not grow: an in-place update adds no index entry
        sizes = dict(s.execute(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c WHERE c.relname LIKE 'resumable_checkpoints%%' "
            "AND c.relkind = 'i'"
        ).fetchall())
    assert sizes and all(size <= 2 * 8192 for size in sizes.values()), sizes
