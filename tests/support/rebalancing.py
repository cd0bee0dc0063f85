"""The rebalancing tests' shared setup: a table of ids, one attempt over a range, job ``rb``'s plan
with range ``0`` split after id 10, and an ask written at a chosen chunk."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core import Attempt, chunk_loop
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work import rebalance
from airflow_resumable.core.work.partitions import range_chunks, save_plan, split
from support.sources import Source

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()


def ids_table(source: Source, n: int = 100) -> KeysetReader:
    source.run("CREATE TABLE rb_ids (id INTEGER PRIMARY KEY)")
    source.run("INSERT INTO rb_ids (id) VALUES (%s)", [(i,) for i in range(1, n + 1)])
    return KeysetReader(connect=source.connect, table="rb_ids", key="id")


def run_range(store: Store, job: str, reader: KeysetReader, rng: Any, *, during: Any = None, chunk: int = 5,
              rows: bool = False) -> list[Any]:
    """Every id one attempt of ``job`` processes over ``rng`` (``rows``: every row, as a tuple);
    ``during(chunk_number)`` is called in each chunk's process, before its checkpoint."""
    seen: list[Any] = []
    chunks = [0]

    def process(ctx: Any, batch: Any) -> None:
        chunks[0] += 1
        if during is not None:
            during(chunks[0])
        seen.extend(tuple(r) if rows else r[0] for r in batch)

    handler = chunk_loop(process=process, chunk_size=chunk, **range_chunks(reader, rng))
    Attempt(store, Identity(job=job, slot=SLOT, attempt=1, owner=f"{job}-1")).run(handler)
    return seen


def split_after_10(store: Store, source: Source, *, partitions: int = 1) -> tuple[KeysetReader, Any]:
    """40 ids in ``partitions`` ranges, stored as job ``rb``'s plan with range ``0`` split after id 10
    by ``t1`` (the taken range ``0.1``, not started); the reader and the plan."""
    reader = ids_table(source, 40)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        plan = save_plan(s, "rb", SLOT, split(reader, partitions, job="rb", slot=SLOT).with_split(of="0", at=10, by="t1"))
    return reader, plan


def ask_at(store: Store, job: str, when: int, by: str = "thief") -> Any:
    asked: list[bool] = []

    def during(n: int) -> None:
        if n == when:
            with store.open(autocommit=True) as s:
                asked.append(rebalance.ask(s, job, SLOT, by))

    during.asked = asked  # type: ignore[attr-defined]
    return during


class Stopped(RuntimeError):
    """The failure :func:`give_away_then_stop` injects in its attempt's third chunk."""


def give_away_then_stop(store: Store, job: str, reader: KeysetReader, rng: Any, *, by: str = "thief",
                        chunk: int = 3) -> list[tuple[Any, ...]]:
    """One attempt of ``job`` over ``rng``, as the slot's holder of the moment: ``by`` asks it for a
    split during its second chunk, it agrees the split at that chunk's checkpoint (narrowing its
    range and its row's reader), and its third chunk fails, undone, so its row keeps the checkpoint
    after the second. Returns the rows of its first two chunks (the ones it committed)."""
    seen: list[tuple[Any, ...]] = []
    chunks = [0]
    asked = ask_at(store, job, 2, by)

    def process(ctx: Any, batch: Any) -> None:
        chunks[0] += 1
        asked(chunks[0])
        if chunks[0] == 3:
            raise Stopped(f"{job} stops in its third chunk")
        seen.extend(tuple(r) for r in batch)

    handler = chunk_loop(process=process, chunk_size=chunk, **range_chunks(reader, rng))
    try:
        Attempt(store, Identity(job=job, slot=SLOT, attempt=1, owner=f"{job}-holder")).run(handler)
    except Stopped:
        pass
    else:
        raise AssertionError(f"{job}'s holder finished its range: nothing was left for a split")
    assert asked.asked == [True], f"{by} could not ask {job} for a split"  # type: ignore[attr-defined]
    return seen
