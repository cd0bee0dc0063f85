"""What the readers' tests share (tests/unit/core/readers/, tests/unit/test_readers.py,
tests/unit/core/attempt/test_previous.py): an attempt of the readers' job, the events table with
ties on its first key column, a plain sink that can crash before a chunk, numbered lines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import Store
from support.sources import Source

JOB = "readers"
SLOT = "2026-01-01T00:00:00+00:00"


def events_table(source: Source, rows: list[tuple[int, str]]) -> None:
    """``events(id, updated_at)``: many rows share an ``updated_at`` (ties), ``id`` is unique."""
    source.run("CREATE TABLE events (id INTEGER PRIMARY KEY, updated_at TEXT NOT NULL, note TEXT)")
    source.run("CREATE INDEX events_k ON events (updated_at, id)")
    source.run("INSERT INTO events (id, updated_at, note) VALUES (%s, %s, %s)", [(i, t, f"n{i}") for i, t in rows])


def attempt(store: Store, n: int, slot: str = SLOT, **kwargs: Any) -> Attempt:
    return Attempt(store, Identity(job=JOB, slot=slot, attempt=n, owner=f"owner-{n}"), **kwargs)


class Crash(Exception):
    """Stands for the worker dying mid-run."""


def collect(seen: list[Any], *, crash_before_chunk: int | None = None) -> Callable[[Any, list[Any]], None]:
    """A plain sink: remembers the items of every chunk; raises before chunk ``crash_before_chunk``."""
    chunks = [0]

    def process(ctx: Any, batch: list[Any]) -> None:
        chunks[0] += 1
        if crash_before_chunk is not None and chunks[0] == crash_before_chunk:
            raise Crash(f"crash before chunk {chunks[0]}")
        seen.extend(row[0] for row in batch)

    return process

TIES = [(i, f"2026-01-0{1 + i // 15} 00:00:00") for i in range(1, 61)]  # 4 timestamps, 15 rows each

LINES = b"".join(f"line {i:03d}\n".encode() for i in range(100))  # 9 bytes a line


def _sinks(seen: list[Any], first: Any) -> tuple[Callable[..., None], Callable[..., None]]:
    """(a sink that dies at the batch starting with ``first``, a sink that takes everything)."""
    return (lambda c, b: _crash_on(seen, b, first)), (lambda c, b: seen.extend(b))


def _crash_on(seen: list[Any], batch: list[Any], first: Any) -> None:
    if batch[0] == first:
        raise Crash(f"crash at {first}")
    seen.extend(batch)


def _load(store: Store, slot: str) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, slot)
