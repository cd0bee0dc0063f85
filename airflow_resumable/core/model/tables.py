"""The tables of a checkpoint database, from their one definition (the row classes)."""

from __future__ import annotations

from airflow_resumable.core.model.checkpoint import AttemptRecord, Checkpoint, DeadLetter
from airflow_resumable.core.model.columns import Table

#: The schema stamp and the record of applied migrations: key/value text.
META = "resumable_meta"

#: One row per (job, slot).
#:
#: Every checkpoint rewrites the row (position, state, counters, ``updated_at``) and every heartbeat
#: its lease columns. PostgreSQL updates a row in place (a HOT update: no new index entries, the old
#: version pruned within the page, far less WAL) only when no indexed column changes and the page has
#: room. So the indexes cover only columns that change when a run starts or ends: the primary key,
#: and ``(job, started_at, slot)`` for a job's latest slots (``list_slots``); nothing indexes
#: ``updated_at``, ``heartbeat_at`` or the lease. ``fillfactor`` keeps a fifth of each page free for
#: the new versions of the rows inserted there.
CHECKPOINTS = Table("resumable_checkpoints", Checkpoint, key=("job", "slot"),
                    indexes=[("job_started", "job, started_at DESC, slot DESC")], fillfactor=80)

#: One row per attempt of a slot.
ATTEMPTS = Table("resumable_attempts", AttemptRecord, key=(), indexes=[("slot", "job, slot, id")])

#: One row per item skipped under a skip policy, unique per (job, slot, item position).
DEAD_LETTERS = Table("resumable_dead_letters", DeadLetter, key=(), unique=[("item", "job, slot, position")])


def all_tables() -> tuple[Table, ...]:
    return (CHECKPOINTS, ATTEMPTS, DEAD_LETTERS)
