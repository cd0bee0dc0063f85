"""``ctx.previous`` for runs that continue from the last one: the last done slot before this one, read
only when asked and once, inside the handler's transaction without committing it, and an
incremental chunked run that starts where the previous one ended.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from airflow_resumable.core import Attempt, chunk_loop
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import SequenceReader
from airflow_resumable.core.stores import Store
from support.readers import JOB, Crash

HOUR = [f"2026-01-01T{h:02d}:00:00+00:00" for h in range(6)]


def _hourly(store: Store, slot: str, n: int, handler: Callable[[Any], Any], *, scheduled: bool = True) -> Any:
    when = datetime.fromisoformat(slot) if scheduled else None
    return Attempt(store, Identity(job=JOB, slot=slot, attempt=n, owner=f"{slot}-{n}", scheduled_at=when)).run(handler)


def test_ctx_previous_is_the_last_done_slot_before_this_one_so_a_backfill_continues_from_its_own_past(
    store: Store,
) -> None:
    seen: dict[str, Any] = {}

    def remember(position: Any) -> Callable[[Any], None]:
        def handler(ctx: Any) -> None:
            seen[ctx.slot] = ctx.previous
            ctx.checkpoint(position)
        return handler

    # Given hours 0 and 1 done, and hour 3 failed
    _hourly(store, HOUR[0], 1, remember(10))
    _hourly(store, HOUR[1], 1, remember(20))
    with pytest.raises(Crash):
        _hourly(store, HOUR[3], 1, _crash)
    # When hour 4 runs: its previous is hour 1 (hour 3 did not finish)
    _hourly(store, HOUR[4], 1, remember(40))
    assert (seen[HOUR[4]].slot, seen[HOUR[4]].position, seen[HOUR[4]].status) == (HOUR[1], 20, "done")
    assert seen[HOUR[4]].finished_at is not None
    # and a backfill of hour 2, run after hour 4, continues from hour 1, not from hour 4
    _hourly(store, HOUR[2], 1, remember(30))
    assert seen[HOUR[2]].slot == HOUR[1]
    # and the first hour has none
    assert seen[HOUR[0]] is None
    # A run without a logical date (its slot is its run id) gets the slot that finished last
    _hourly(store, "manual__2026-01-01T09:00:00", 1, remember(99), scheduled=False)
    assert seen["manual__2026-01-01T09:00:00"].slot == HOUR[2]


def _previous_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements that read a job's previous finished run, as the attempts send them."""
    from airflow_resumable.core.stores.connection import Connection

    sent: list[str] = []
    execute = Connection.execute

    def recording(self: Connection, sql: str, params: Any = ()) -> Any:
        if "status = 'done'" in sql and "LIMIT 1" in sql:
            sent.append(sql)
        return execute(self, sql, params)

    monkeypatch.setattr(Connection, "execute", recording)
    return sent


def test_ctx_previous_costs_a_round_trip_only_for_a_handler_that_reads_it_and_only_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given hour 0 done
    _hourly(store, HOUR[0], 1, lambda ctx: ctx.checkpoint(10))
    sent = _previous_reads(monkeypatch)
    # When hour 1 runs a handler that never asks for ctx.previous
    _hourly(store, HOUR[1], 1, lambda ctx: ctx.checkpoint(20))
    # Then the attempt sent no statement for it
    assert sent == []
    # When hour 2's handler reads it three times, it is read once, and it is hour 1
    seen: list[Any] = []

    def reads(ctx: Any) -> None:
        seen.extend(ctx.previous for _ in range(3))
        ctx.checkpoint(30)

    _hourly(store, HOUR[2], 1, reads)
    assert len(sent) == 1
    assert [p.slot for p in seen] == [HOUR[1]] * 3 and seen[0] is seen[2]


def test_ctx_previous_read_inside_the_handlers_transaction_does_not_commit_its_pending_writes(
    store: Store,
) -> None:
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER PRIMARY KEY)")
        s.commit()
    _hourly(store, HOUR[0], 1, lambda ctx: ctx.checkpoint(10))

    # Given a handler that writes through ctx.transaction(), then reads ctx.previous, then fails
    def handler(ctx: Any) -> None:
        ctx.transaction().cursor().execute("INSERT INTO sink (item) VALUES (%s)", (1,))
        assert ctx.previous is not None and ctx.previous.slot == HOUR[0]
        raise Crash("after the write, before its checkpoint")

    with pytest.raises(Crash):
        _hourly(store, HOUR[1], 1, handler)
    # Then the write went with the failed chunk: reading ctx.previous committed nothing
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT item FROM sink")
        assert cur.fetchall() == []


def test_ctx_previous_first_asked_after_the_handler_returned_says_the_attempt_ended(store: Store) -> None:
    from airflow_resumable.core.model.errors import AttemptEnded

    kept: list[Any] = []
    _hourly(store, HOUR[0], 1, lambda ctx: kept.append(ctx))
    with pytest.raises(AttemptEnded, match="ctx.previous was called after attempt 1's handler returned"):
        assert kept[0].previous is None  # not reached: reading it raises


def test_an_incremental_chunked_run_starts_where_the_previous_one_ended_and_a_run_with_nothing_new_keeps_it(
    store: Store,
) -> None:
    data = list(range(10))
    seen: list[list[int]] = []

    def run(slot: str) -> Any:
        batches: list[int] = []
        handler = chunk_loop(SequenceReader(data), lambda c, b: batches.extend(b), chunk_size=4,
                             start=lambda ctx: ctx.previous.position if ctx.previous else None)
        out = _hourly(store, slot, 1, handler)
        seen.append(batches)
        return out

    run(HOUR[0])
    data += [10, 11, 12]  # new items arrive
    run(HOUR[1])
    third = run(HOUR[2])  # nothing new
    assert seen == [list(range(10)), [10, 11, 12], []]
    assert third.checkpoint.position == 12, "a run that read nothing still ends where it started"
    data.append(13)
    run(HOUR[3])
    assert seen[-1] == [13]


def _crash(ctx: Any) -> None:
    raise Crash("the worker died")
