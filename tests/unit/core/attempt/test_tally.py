"""Progress as an attempt counts and reports it, without Airflow: the tally the context reads, the
reporter's lines, rows and saves, each reported after its checkpoint is durable.

Given / When / Then, against both stores.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Cancelled, Options, Signal, Store, chunk_loop
from airflow_resumable.core.model.identity import Identity
from support.attempts import JOB, SLOT, Items, attempt


def test_the_checkpoint_is_durable_before_progress_is_reported(store: Store) -> None:
    """Write order: whoever hears of progress can already read it from another connection."""
    from airflow_resumable.core.attempt.reporter import Reporter

    observed: list[tuple[int, int]] = []

    class Witness(Reporter):
        def on_checkpoint(self, cp, progress) -> None:
            with store.open() as other:
                observed.append((progress.processed, other.checkpoints.load(JOB, SLOT).processed))

    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="w"), reporter=Witness()).run(Items(20, 5))
    assert observed == [(5, 5), (10, 10), (15, 15), (20, 20)]


def test_progress_lines_carry_percent_and_counts(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="airflow_resumable"):
        attempt(store, 1, progress_interval=0).run(Items(20, 5))
    messages = [r.getMessage() for r in caplog.records]
    lines = [m for m in messages if m.startswith("progress")]
    assert len(lines) == 4
    # The first line has nothing measured yet: no rate, no ETA; it alone names the job and slot
    assert lines[0] == f"progress 25% processed=5/20 [job={JOB} slot={SLOT}]"
    # Four chunks in well under a second measure no rate yet (two chunk cycles over 1 s are needed:
    # tests/unit/core/attempt/test_reporter.py measures the rate and the ETA)
    assert lines[1] == "progress 50% processed=10/20" and "rate=" not in lines[3]
    assert "job=" not in lines[1] and "slot=" not in lines[3]
    # And a last line says the run is done
    assert [m for m in messages if m.startswith("done:")] == [
        f"done: processed=20/20 in {messages[-1].split(' in ')[1].split()[0]} [job={JOB} slot={SLOT}]"]


def test_progress_lines_are_throttled_but_the_last_one_is_always_logged(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="airflow_resumable"):
        attempt(store, 1, progress_interval=3600).run(Items(20, 5))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress")]
    assert [line.split()[1] for line in lines] == ["25%", "100%"]


def test_checkpoint_interval_saves_less_often_but_before_stopping_and_at_the_end(store: Store) -> None:
    items = list(range(1, 101))
    saves: list[int] = []
    from airflow_resumable.core.attempt.reporter import Reporter

    class Count(Reporter):
        def due(self, processed, total) -> bool:
            saves.append(processed)
            return False

    def process(ctx, batch):
        if ctx.attempt == 1 and batch[-1] == 60:
            ctx.signal.cancel("shutdown")

    handler = chunk_loop(
        lambda ctx, after, limit: [i for i in items if i > (after or 0)][:limit], process, chunk_size=10,
        checkpoint_interval=3600,
    )
    with pytest.raises(Cancelled):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a"), reporter=Count()).run(handler)
    assert saves == [60], "no save within the interval, but the pending position before stopping"
    saves.clear()
    outcome = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="b"), reporter=Count()).run(handler)
    assert outcome.resumed_from == 60 and saves == [100]
    assert (outcome.checkpoint.position, outcome.checkpoint.processed) == (100, 100)


def test_progress_reports_carry_the_row_as_stored_with_its_heartbeat_moving_on(store: Store) -> None:
    # Given a reporter that keeps every row it is handed, and heartbeats every 0.2 s
    from airflow_resumable.core.attempt.reporter import Reporter

    class Keep(Reporter):
        rows: list[Any] = []

        def due(self, processed: int, total: int | None) -> bool:
            return True

        def on_checkpoint(self, cp, progress) -> None:
            self.rows.append(cp)

    def handler(ctx) -> None:
        for i in range(3):
            ctx.signal.wait(0.5)  # two heartbeats or more between checkpoints
            ctx.checkpoint(i + 1, processed=i + 1)

    reporter = Keep()
    Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o"), options=Options(lease=0.6), reporter=reporter,
    ).run(handler)
    # Then each report is the stored row: the heartbeat and the lease expiry move forward
    beats = [r.heartbeat_at for r in reporter.rows]
    assert beats == sorted(beats) and len(set(beats)) == 3, beats
    assert all(r.lease_expires_at > r.heartbeat_at for r in reporter.rows)
    assert [r.position for r in reporter.rows] == [1, 2, 3]


def test_a_checkpoint_makes_one_call_into_the_attempt_and_the_tally_holds_the_progress() -> None:
    """The context encodes and hands over; the attempt saves, records, reports and checks the
    signal in that one call (no re-entry into the context, no second or third call)."""
    from airflow_resumable.core import Checkpoint
    from airflow_resumable.core.attempt.context import RunContext
    from airflow_resumable.core.attempt.tally import Tally
    from airflow_resumable.core.model.checkpoint import Write
    from airflow_resumable.core.model.identity import Identity

    calls: list[tuple[str, tuple[Any, ...]]] = []

    tally = Tally(Checkpoint(job=JOB, slot=SLOT, position=3, processed=3, state={"sum": 1}))

    class Run:  # the attempt behind the context: what it reads of it, and every call recorded
        resumed = True

        def __init__(self) -> None:
            self.tally = tally
            self.given = types.SimpleNamespace(identity=Identity(job=JOB, slot=SLOT, attempt=2, owner="o"),
                                               signal=Signal(), log=logging.getLogger("test"))

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: calls.append((name, args))

    ctx = RunContext(Run())  # type: ignore[arg-type]
    assert (ctx.job, ctx.slot, ctx.attempt, ctx.position, ctx.processed, ctx.state) == (JOB, SLOT, 2, 3, 3, {"sum": 1})
    ctx.checkpoint([4, "x"], state={"sum": 2}, processed=4, total=9)
    [(name, (write, state))] = calls
    # One value, encoded once: what the store writes, and the dict ctx.state stays
    assert name == "after_chunk" and state == {"sum": 2}
    assert write == Write(position='[4,"x"]', state='{"sum":2}', processed=4, total=9, rate=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        write.processed = 5  # type: ignore[misc]
    assert tally.processed == 3  # the context kept nothing: recording is the attempt's step
    tally.saved(write, state)
    assert (ctx.position, ctx.processed, ctx.total, ctx.state, ctx.row.position) == ([4, "x"], 4, 9, {"sum": 2}, [4, "x"])
