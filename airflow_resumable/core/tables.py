"""The tables of a checkpoint database, from their one definition (the row classes)."""

from __future__ import annotations

from airflow_resumable.core.checkpoint import AttemptRecord, Checkpoint, DeadLetter
from airflow_resumable.core.schema import Table

#: The schema stamp and the record of applied migrations: key/value text.
META = "resumable_meta"

#: One row per (job, slot).
CHECKPOINTS = Table("resumable_checkpoints", Checkpoint, key=("job", "slot"),
                    indexes=[("job_updated", "job, updated_at DESC")])

#: One row per attempt of a slot.
ATTEMPTS = Table("resumable_attempts", AttemptRecord, key=(), indexes=[("slot", "job, slot, id")])

#: One row per item skipped under a skip policy, unique per (job, slot, item position).
DEAD_LETTERS = Table("resumable_dead_letters", DeadLetter, key=(), unique=[("item", "job, slot, position")])


def all_tables() -> tuple[Table, ...]:
    return (CHECKPOINTS, ATTEMPTS, DEAD_LETTERS)
