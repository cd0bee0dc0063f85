"""The attempt loop, without Airflow: resume, at most one chunk repeated, timeout, re-runs, bad input.

Given / When / Then, against both stores.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_resumable.core import (
    Attempt,
    Cancelled,
    ConfigurationError,
    InvalidCheckpoint,
    Options,
    Signal,
    Store,
    chunk_loop,
)
from airflow_resumable.core.model.checkpoint import MAX_DEPTH, short
from airflow_resumable.core.model.identity import Hooks, Identity

JOB, SLOT = "loans", "2026-01-01T00:00:00+00:00"
#: Deeper than the product's nesting limit, and shallow enough for every supported Python's own
#: JSON and repr: the refusal is the product's, the same on 3.11 and 3.13.
TOO_DEEP = MAX_DEPTH + 100


def attempt(store: Store, n: int, **options: Any) -> Attempt:
    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=n, owner=f"owner-{n}"), options=Options(**options))


class Items:
    """A handler over items 0..n-1 that records every item it processes (the side effect)."""

    def __init__(self, n: int, chunk: int, *, fail: tuple[int, int] | None = None):
        self.n, self.chunk, self.fail = n, chunk, fail
        self.seen: list[int] = []

    def __call__(self, ctx) -> int:
        i = ctx.position or 0
        ctx.total = self.n
        while i < self.n:
            ctx.signal.raise_if_cancelled()
            batch = list(range(i, min(i + self.chunk, self.n)))
            self.seen.extend(batch)
            if self.fail and (ctx.attempt, i // self.chunk) == self.fail:
                raise RuntimeError(f"injected failure in chunk {i // self.chunk}")
            ctx.state["sum"] = ctx.state.get("sum", 0) + sum(batch)
            i = batch[-1] + 1
            ctx.checkpoint(i, processed=i)
        return ctx.state["sum"]


def test_a_retry_resumes_and_repeats_at_most_the_failed_chunk(store: Store) -> None:
    # Given a handler that fails on attempt 1 in chunk 3 (after 3 checkpoints)
    work = Items(50, 5, fail=(1, 3))
    with pytest.raises(RuntimeError, match="injected"):
        attempt(store, 1).run(work)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.status, row.position, row.processed) == ("failed", 15, 15)
    assert "injected failure in chunk 3" in row.last_error and row.lease_owner is None
    # When attempt 2 runs
    outcome = attempt(store, 2).run(work)
    # Then it started at chunk 3, only chunk 3's items were processed twice, and the total is exact
    assert outcome.resumed_from == 15
    assert outcome.result == sum(range(50))
    twice = sorted({i for i in work.seen if work.seen.count(i) == 2})
    assert twice == list(range(15, 20)) and set(work.seen) == set(range(50))
    assert outcome.checkpoint.status == "done" and outcome.checkpoint.attempts == 2


def test_the_cooperative_timeout_stops_at_a_chunk_boundary_and_the_retry_finishes(store: Store) -> None:
    def slow(ctx) -> int:
        i = ctx.position or 0
        while i < 40:  # the checkpoint is the boundary: it saves, then raises once the timeout fired
            ctx.state["sum"] = ctx.state.get("sum", 0) + sum(range(i, i + 4))
            i += 4
            ctx.signal.wait(0.05)  # a chunk takes ~50 ms: ten of them outlast the 0.3 s timeout
            ctx.checkpoint(i, processed=i, total=40)
        return ctx.state["sum"]

    with pytest.raises(Cancelled) as stopped:
        attempt(store, 1, timeout=0.3).run(slow)
    assert stopped.value.reason == "timeout"
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert row.status == "cancelled" and row.stop_reason == "timeout" and 0 < row.processed < 40
    outcome = attempt(store, 2).run(slow)
    assert outcome.result == sum(range(40)) and outcome.resumed_from == row.position


def test_the_signal_is_checked_after_the_save_so_the_chunk_is_kept(store: Store) -> None:
    def handler(ctx) -> None:
        ctx.checkpoint(1, processed=1)
        ctx.signal.cancel("user", "user cancelled")
        ctx.checkpoint(2, processed=2)  # saved, then raises
        raise AssertionError("not reached")

    with pytest.raises(Cancelled, match="user cancelled"):
        attempt(store, 1).run(handler)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.position, row.status, row.stop_reason) == (2, "cancelled", "user")


def test_a_done_slot_is_not_run_again_and_gives_back_its_stored_result(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a slot that finished with a result
    first = attempt(store, 1).run(Items(10, 5))
    assert (first.checkpoint.status, first.result) == ("done", 45)
    # When another attempt reaches it (a retry after the end-of-run window, a duplicate)
    again = Items(10, 5)
    with caplog.at_level(logging.WARNING):
        outcome = attempt(store, 2).run(again)
    # Then the handler does not run, the stored result comes back, and the log says how to re-run
    assert again.seen == [] and outcome.already_done and outcome.result == 45
    assert outcome.checkpoint.runs == 1 and outcome.checkpoint.lease_owner is None
    assert "already finished" in caplog.text and "resumable_restart" in caplog.text
    with store.open() as s:
        assert [(h.attempt, h.outcome) for h in s.listings.history(JOB, SLOT)] == [(1, "done"), (2, "already_done")]
        assert s.checkpoints.load(JOB, SLOT).lease_owner is None


def test_a_done_slot_runs_again_when_restart_is_asked_or_the_embedding_says_so(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    attempt(store, 1).run(Items(10, 5))
    restarted = Items(10, 5)
    with caplog.at_level(logging.WARNING):
        outcome = attempt(store, 2, restart=True).run(restarted)
    assert restarted.seen == list(range(10)) and not outcome.already_done and outcome.checkpoint.runs == 2
    assert "running it again from the start because restart requested" in caplog.text
    asked = Items(10, 5)
    run = Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=3, owner="o3"), hooks=Hooks(rerun=lambda row: "a person asked"),
    )
    assert run.run(asked).checkpoint.runs == 3 and asked.seen == list(range(10))
    declined = Items(10, 5)
    run = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=4, owner="o4"), hooks=Hooks(rerun=lambda row: None))
    assert run.run(declined).already_done and declined.seen == []


def test_a_result_that_cannot_be_stored_fails_before_the_slot_is_marked_done(store: Store) -> None:
    # Given a handler that does all its work and returns something that is not JSON
    def handler(ctx) -> object:
        ctx.checkpoint(10, processed=10)
        return object()

    with pytest.raises(InvalidCheckpoint, match="return value .* cannot be stored.*not marked done"):
        attempt(store, 1).run(handler)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    # Then the slot is not done (a later attempt would not find a finished slot with no result)
    assert (row.status, row.position, row.lease_owner) == ("failed", 10, None)
    assert "cannot be stored" in row.last_error


def test_restart_discards_an_unfinished_checkpoint_on_purpose_and_says_so(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(RuntimeError):
        attempt(store, 1).run(Items(20, 5, fail=(1, 2)))
    fresh = Items(20, 5)
    with caplog.at_level(logging.WARNING):
        outcome = attempt(store, 2, restart=True).run(fresh)
    assert fresh.seen == list(range(20)) and outcome.resumed_from is None
    assert "restart requested: discarding the unfinished checkpoint at position=10" in caplog.text


def test_transaction_writes_commit_with_the_checkpoint_and_vanish_with_a_failed_chunk(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER PRIMARY KEY)")
        s.commit()

    def handler(ctx) -> None:
        conn = ctx.transaction()
        start = ctx.position or 0
        for i in range(start, 6):
            conn.cursor().execute("INSERT INTO sink (item) VALUES (%s)", (i,))
            if i % 2 == 1:
                ctx.checkpoint(i + 1, processed=i + 1)
            if i == 4 and ctx.attempt == 1:
                raise RuntimeError("crash after writing item 4, before its checkpoint")

    with pytest.raises(RuntimeError):
        attempt(store, 1).run(handler)
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT item FROM sink ORDER BY item")
        assert [r[0] for r in cur.fetchall()] == [0, 1, 2, 3]
    attempt(store, 2).run(handler)
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT item FROM sink ORDER BY item")
        assert [r[0] for r in cur.fetchall()] == [0, 1, 2, 3, 4, 5]


def test_the_transaction_cannot_be_committed_behind_the_checkpoint_s_back(store: Store) -> None:
    def handler(ctx) -> None:
        ctx.transaction().commit()

    with pytest.raises(RuntimeError, match="commits with the next ctx.checkpoint"):
        attempt(store, 1).run(handler)


@pytest.mark.parametrize(
    ("position", "state", "message"),
    [
        (object(), None, "position"),
        ({1, 2}, None, "position"),
        (float("nan"), None, "position"),
        (1, {"when": __import__("datetime").datetime(2026, 1, 1)}, "state"),
        (1, {1: "non-string key"}, "non-string keys"),
        (1, ["not", "a", "dict"], "state must be a dict"),
    ],
)
def test_a_position_or_state_that_is_not_json_is_refused_and_nothing_is_written(
    store: Store, position: Any, state: Any, message: str
) -> None:
    def handler(ctx) -> None:
        ctx.checkpoint(7, processed=7)
        ctx.checkpoint(position, state=state, processed=8)

    with pytest.raises(InvalidCheckpoint) as err:
        attempt(store, 1).run(handler)
    assert message in str(err.value) and JOB in str(err.value) and SLOT in str(err.value)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.position, row.processed, row.status) == (7, 7, "failed")


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("position", 10**5000, "holds an int of more than 4300 digits"),
        ("position", _nested(TOO_DEEP), f"nested too deeply for JSON to write and read back (more than {MAX_DEPTH} levels)"),
        ("state", {"total": 10**5000}, "holds an int of more than 4300 digits"),
        ("state", {"path": _nested(TOO_DEEP)}, f"nested too deeply for JSON to write and read back (more than {MAX_DEPTH} levels)"),
    ],
    ids=["huge-int-position", "deep-position", "huge-int-state", "deep-state"],
)
def test_a_position_or_state_too_big_or_deep_for_json_is_invalid_and_not_retried(
    store: Store, where: str, value: Any, message: str
) -> None:
    from airflow_resumable.operators.outcome import to_airflow
    from airflow_resumable.version_compat import AirflowFailException

    # Given a handler whose second checkpoint has a value JSON cannot carry
    def handler(ctx) -> None:
        ctx.checkpoint(7, processed=7)
        if where == "position":
            ctx.checkpoint(value, processed=8)
        ctx.checkpoint(8, state=value, processed=8)

    # When it saves it, then the error names the value's kind of problem, the job, the slot and the fix
    with pytest.raises(InvalidCheckpoint) as err:
        attempt(store, 1).run(handler)
    text = str(err.value)
    assert f"the {where} {short(value)} cannot be stored" in text and message in text and "nothing was written" in text
    assert f"job='{JOB}'" in text and f"slot='{SLOT}'" in text
    # and nothing was written past the last good checkpoint, and it is not retried
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.position, row.processed, row.status) == (7, 7, "failed") and "InvalidCheckpoint" in row.last_error
    assert isinstance(to_airflow(err.value, job=JOB, slot=SLOT), AirflowFailException)


def test_a_handler_that_is_not_callable_is_refused(store: Store) -> None:
    with pytest.raises(ConfigurationError, match=r"handler must be callable.*job='loans'"):
        attempt(store, 1).run("not a function")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_size": 0}, "chunk_size must be a positive integer"),
        ({"chunk_size": -3}, "chunk_size must be a positive integer"),
        ({"chunk_size": 2.5}, "chunk_size must be a positive integer"),
        ({"chunk_size": 10, "total": -1}, "total must be"),
    ],
)
def test_bad_chunk_arguments_are_refused_before_anything_runs(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        chunk_loop(lambda ctx, after, limit: [], lambda ctx, batch: None, **kwargs)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overlap": "sometimes"}, "overlap must be one of skip, allow, wait, replace"),
        ({"lease": 0.1}, "lease must be at least"),
        ({"timeout": -1}, "timeout must be a positive number"),
        ({"lease_wait": -1}, "lease_wait must be a non-negative"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Options(**options)


def test_the_chunk_loop_reads_after_the_position_and_checkpoints_each_chunk(store: Store) -> None:
    rows = [{"id": i * 10, "v": i} for i in range(1, 24)]
    reads: list[Any] = []

    def read(ctx, after, limit):
        reads.append(after)
        return [r for r in rows if after is None or r["id"] > after][:limit]

    def process(ctx, batch):
        ctx.state["v"] = ctx.state.get("v", 0) + sum(r["v"] for r in batch)
        if ctx.attempt == 1 and batch[-1]["id"] >= 100:
            ctx.signal.cancel("shutdown")

    handler = chunk_loop(read, process, chunk_size=5, total=len(rows))
    with pytest.raises(Cancelled):
        attempt(store, 1).run(handler)
    reads.clear()
    outcome = attempt(store, 2).run(handler)
    assert reads[0] == 100 and outcome.resumed_from == 100
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert row.state == {"v": sum(range(1, 24))} and (row.processed, row.total) == (23, 23)


def test_a_read_that_does_not_advance_is_an_error_not_an_endless_loop(store: Store) -> None:
    handler = chunk_loop(lambda ctx, after, limit: [{"id": 1}], lambda ctx, batch: None, chunk_size=5)
    with pytest.raises(ConfigurationError, match="did not advance"):
        attempt(store, 1).run(handler)


# -- the signal ------------------------------------------------------------------------------


def test_the_first_reason_wins() -> None:
    sig = Signal()
    assert sig.cancel("user") and not sig.cancel("timeout")
    assert sig.reason == "user"
    with pytest.raises(Cancelled) as err:
        sig.raise_if_cancelled()
    assert err.value.reason == "user"


def test_wait_wakes_when_another_thread_cancels() -> None:
    sig = Signal()
    threading.Timer(0.05, sig.cancel, args=("shutdown",)).start()
    assert sig.wait(30) is True and sig.reason == "shutdown"


def test_the_deadline_fires_as_timeout() -> None:
    now = [100.0]
    sig = Signal(deadline=105.0, clock=lambda: now[0])
    assert not sig.cancelled
    now[0] = 105.0
    assert sig.cancelled and sig.reason == "timeout"


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
    # tests/test_progress.py measures the rate and the ETA)
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


def test_writes_after_the_last_checkpoint_commit_with_done_without_stalling_the_finish(store: Store) -> None:
    """On SQLite the pending writes hold the write lock the heartbeat waits for: finishing must not
    wait on the heartbeat thread while holding that lock."""
    import time

    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER PRIMARY KEY)")
        s.commit()

    def handler(ctx) -> None:
        conn = ctx.transaction()
        ctx.checkpoint(1, processed=1)
        conn.cursor().execute("INSERT INTO sink (item) VALUES (%s)", (2,))
        ctx.signal.wait(1.0)  # heartbeats (every 0.2 s) queue behind the pending write

    started = time.monotonic()
    outcome = attempt(store, 1, lease=0.6).run(handler)
    assert time.monotonic() - started < 5
    assert outcome.checkpoint.status == "done"
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT item FROM sink")
        assert cur.fetchall() == [(2,)]


def test_a_total_learned_with_no_checkpoint_is_saved_with_the_final_status(store: Store) -> None:
    handler = chunk_loop(lambda ctx, after, limit: [], lambda ctx, batch: None, chunk_size=5, total=0)
    outcome = attempt(store, 1).run(handler)
    assert (outcome.checkpoint.status, outcome.checkpoint.total, outcome.summary()["total"]) == ("done", 0, 0)


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


def test_the_transaction_takes_percent_s_placeholders_on_both_stores(store: Store) -> None:
    def handler(ctx) -> None:
        tx = ctx.transaction()
        tx.execute("CREATE TABLE notes (id INTEGER, note TEXT)")
        tx.execute("INSERT INTO notes (id, note) VALUES (%s, '100%% sure')", (1,))  # %% is a literal %
        tx.executemany("INSERT INTO notes (id, note) VALUES (%s, %s)", [(2, "b"), (3, "c")])
        cur = tx.cursor()
        cur.execute("SELECT count(*) FROM notes WHERE note LIKE %s", ("%sure",))
        assert cur.fetchone()[0] == 1
        ctx.checkpoint(1)

    attempt(store, 1).run(handler)
    with store.open() as s:
        assert s.execute("SELECT id, note FROM notes ORDER BY id").fetchall() == [(1, "100% sure"), (2, "b"), (3, "c")]


def test_a_status_edited_by_hand_is_refused_by_name_and_the_row_left_free(store: Store) -> None:
    from airflow_resumable.core.model.errors import CorruptCheckpoint

    with pytest.raises(RuntimeError):
        attempt(store, 1).run(Items(20, 5, fail=(1, 2)))
    with store.open() as s:
        s.execute("UPDATE resumable_checkpoints SET status = 'stalled' WHERE job = %s", (JOB,))
        s.commit()
    with pytest.raises(CorruptCheckpoint, match=r"stored status 'stalled' is not one of running, done, failed"):
        attempt(store, 2).run(Items(20, 5))
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.status, row.position, row.lease_owner) == ("stalled", 10, None)


def test_a_classified_sigterm_leaves_signal_and_row_saying_the_same(store: Store) -> None:
    from airflow_resumable.core.attempt.signal import Reason

    run = Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o"), hooks=Hooks(resolve_reason=lambda reason: "user"),
    )

    def handler(ctx) -> None:
        ctx.signal.cancel(Reason.TERMINATED, "SIGTERM")
        ctx.checkpoint(1, processed=1)

    with pytest.raises(Cancelled):
        run.run(handler)
    with store.open() as s:
        assert s.checkpoints.load(JOB, SLOT).stop_reason == "user"
    assert run.signal.reason == "user"


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e12])
@pytest.mark.parametrize("option", ["lease", "timeout", "lease_wait", "progress_interval"])
def test_options_that_are_nan_infinite_or_huge_are_refused_naming_the_option(option: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{option} must be .*at most .*got {value!r}"):
        Options(**{option: value})


def test_a_lease_over_one_day_is_refused_and_one_day_is_stored_and_read_back(store: Store) -> None:
    """The bound keeps now + lease inside both databases' time arithmetic and Python's datetime."""
    from airflow_resumable.core.attempt.runner import MAX_LEASE

    with pytest.raises(ConfigurationError, match=r"lease must be .* at most 86400 \(one day\), got 86401"):
        Options(lease=MAX_LEASE + 1)

    def handler(ctx) -> None:
        ctx.checkpoint(1, processed=1)
        with store.open() as s:
            held = s.checkpoints.load(JOB, SLOT)
        assert 0.9 * MAX_LEASE < (held.lease_expires_at - held.heartbeat_at).total_seconds() <= MAX_LEASE + 1

    assert attempt(store, 1, lease=MAX_LEASE).run(handler).checkpoint.status == "done"


@pytest.mark.parametrize("interval", [float("nan"), float("inf")])
def test_a_checkpoint_interval_that_is_not_a_finite_duration_is_refused(interval: float) -> None:
    with pytest.raises(ConfigurationError, match="checkpoint_interval must be a non-negative number of seconds"):
        chunk_loop(lambda ctx, after, limit: [], lambda ctx, batch: None, chunk_size=5, checkpoint_interval=interval)


@pytest.mark.parametrize(
    ("read", "process", "message"),
    [
        (lambda ctx, after: [], lambda ctx, batch: None, r"read .*cannot be called as read\(ctx, after, limit\)"),
        (lambda ctx, after, limit: [], lambda ctx: None, r"process .*cannot be called as process\(ctx, batch\)"),
    ],
)
def test_read_or_process_that_cannot_take_the_loop_s_calls_is_refused_before_anything_runs(
    read: Any, process: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        chunk_loop(read, process, chunk_size=5)


@pytest.mark.parametrize(
    ("reader", "seen"),
    [
        # ORDER BY id DESC: the first batch goes down
        (lambda ctx, after, limit: [{"id": i} for i in range(100, 100 - limit, -1)], "[100, 99, 98, 97, 96, 95, ...]"),
        # no ORDER BY at all: a batch out of order
        (lambda ctx, after, limit: [{"id": i} for i in (3, 1, 2)], "[3, 1, 2]"),
    ],
)
def test_a_read_out_of_position_order_fails_before_its_batch_is_processed(
    store: Store, reader: Any, seen: str
) -> None:
    processed: list[Any] = []
    handler = chunk_loop(reader, lambda ctx, batch: processed.extend(batch), chunk_size=10)
    # When the attempt runs
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(handler)
    # Then it names the positions and the fix, processed nothing and saved nothing
    text = str(err.value)
    assert "read returned positions out of order" in text and seen in text
    assert "must return the items after 'after' in ascending position order" in text
    assert processed == []
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.status, row.position, row.processed) == ("failed", None, 0)


def test_a_read_that_goes_back_across_batches_fails_before_processing_the_batch(store: Store) -> None:
    # Given a read that ignores `after` on its third call: it starts from the beginning again
    calls = []

    def read(ctx, after, limit):
        calls.append(after)
        first = 0 if len(calls) == 3 or after is None else after + 1
        return list(range(first, min(first + limit, 20)))

    processed: list[int] = []
    handler = chunk_loop(read, lambda ctx, batch: processed.extend(batch), chunk_size=5)
    with pytest.raises(ConfigurationError, match=r"0 \(item 0 of the batch\) does not come after 9"):
        attempt(store, 1).run(handler)
    # Then the two good batches were processed and saved, the bad one was not
    assert processed == list(range(10))
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.position, row.processed) == (9, 10)


@pytest.mark.parametrize(
    ("keys", "refused"),
    [
        ([1, 2, 2, 3], None),  # equal positions inside a batch: all of them processed, nothing lost
        ([1, 2, 3, 3], "3 (item 3 of the batch) does not come after 3 (item 2)"),  # cut by the chunk's end
        ([1, 3, 2, 4], "2 (item 2 of the batch) does not come after 3 (item 1)"),
        (["a", "c", "b", "d"], "'b' (item 2 of the batch) does not come after 'c' (item 1)"),
        ([(1, "b"), (1, "a"), (2, "a"), (3, "a")], "(1, 'a') (item 1 of the batch) does not come after (1, 'b') (item 0)"),
    ],
)
def test_every_position_of_a_batch_is_checked_and_equal_ones_only_at_its_end(
    store: Store, keys: list[Any], refused: str | None
) -> None:
    processed: list[Any] = []

    def read(ctx: Any, after: Any, limit: int) -> list[Any]:
        return [] if after is not None else [{"id": k} for k in keys]

    handler = chunk_loop(read, lambda ctx, batch: processed.extend(batch), chunk_size=4)
    if refused is None:
        outcome = attempt(store, 1).run(handler)
        assert len(processed) == 4 and outcome.checkpoint.processed == 4
        return
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(handler)
    assert f"read returned positions out of order: {refused}" in str(err.value)
    assert processed == []


def test_positions_that_do_not_compare_are_only_checked_for_moving(store: Store) -> None:
    # Given the same read going 2, 1, 3: as numbers it is refused...
    def reader(wrap):
        rows = [{"id": wrap(i)} for i in (2, 1, 3)]

        def read(ctx, after, limit):
            start = 0 if after is None else [r["id"] for r in rows].index(after) + 1
            return rows[start:start + limit]

        return read

    with pytest.raises(ConfigurationError, match="out of order"):
        attempt(store, 1).run(chunk_loop(reader(lambda i: i), lambda ctx, batch: None, chunk_size=2))
    # ...as dicts, which have no order, the batches are taken as read
    with store.open() as s:
        s.retention.delete(JOB, SLOT)
    outcome = attempt(store, 1).run(chunk_loop(reader(lambda i: {"k": i}), lambda ctx, batch: None, chunk_size=2))
    assert outcome.checkpoint.position == {"k": 3} and outcome.checkpoint.processed == 3


@given(
    keys=st.lists(st.integers(0, 6), min_size=1, max_size=8) | st.lists(st.tuples(st.integers(0, 2), st.text("ab", max_size=1)), min_size=1, max_size=6),
    after=st.none() | st.integers(-1, 6),
    rows=st.sampled_from(["tuple", "dict"]),
)
def test_the_quick_order_check_never_takes_a_batch_the_full_check_refuses(keys: list[Any], after: Any, rows: str) -> None:
    """The loop's quick pass (no list of positions) may only say "in order" where the full check
    agrees: a batch going down, cut inside a run of equal positions, or not after 'after' goes to
    the full check, which names the misplaced item."""
    from airflow_resumable.core.work.chunk_loop import _FIRST, _ID, _first_misplaced, _in_order

    if after is not None and isinstance(keys[0], tuple):
        after = [after, ""]  # a composite position comes back from JSON as a list
    batch = [(k, "row") for k in keys] if rows == "tuple" else [{"id": k} for k in keys]
    in_order = _in_order(after, batch, _FIRST if rows == "tuple" else _ID)
    last = None if after is None else tuple(after) if isinstance(after, list) else after
    refused = (sorted(keys) != keys or (last is not None and not last < keys[0])
               or (len(keys) > 1 and not keys[-2] < keys[-1]))
    assert not (in_order and refused), (after, keys)
    if refused:
        assert _first_misplaced(last, keys)  # the full check finds the item it names
    else:
        assert in_order, "a batch in order takes the quick pass"


def test_a_composite_position_resumed_from_json_is_still_checked_for_order(store: Store) -> None:
    # Given tuple positions, which come back from the checkpoint as lists
    keys = [(d, i) for d in (1, 2) for i in range(3)]

    def read(ctx, after, limit):
        if ctx.attempt == 2:
            return keys[:limit]  # the bug: attempt 2 ignores `after` and reads from the start
        return [k for k in keys if after is None or k > tuple(after)][:limit]

    def process(ctx, batch):
        if ctx.attempt == 1:
            ctx.signal.cancel("shutdown")

    handler = chunk_loop(read, process, chunk_size=3, position=lambda k: k)
    with pytest.raises(Cancelled):
        attempt(store, 1).run(handler)
    # When attempt 2 resumes after [1, 2] and reads (1, 0) again
    with pytest.raises(ConfigurationError, match=r"\(1, 0\) \(item 0 of the batch\) does not come after \(1, 2\)"):
        attempt(store, 2).run(handler)


def test_a_checkpoint_after_the_handler_returned_is_refused_and_writes_nothing(store: Store) -> None:
    from airflow_resumable.core.model.errors import AttemptEnded

    kept: list[Any] = []

    def handler(ctx) -> None:
        ctx.checkpoint(5, processed=5)
        kept.append(ctx)

    attempt(store, 1).run(handler)
    # When the saved ctx is used after the attempt ended
    with pytest.raises(AttemptEnded, match=r"ctx.checkpoint\(\) was called after attempt 1's handler returned"):
        kept[0].checkpoint(6, processed=6)
    with pytest.raises(AttemptEnded, match=r"ctx.transaction\(\)"):
        kept[0].transaction()
    # Then the row is as the attempt left it
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.position, row.processed, row.status) == (5, 5, "done")


def test_a_thread_that_checkpoints_after_the_attempt_ended_is_refused(store: Store) -> None:
    from airflow_resumable.core.model.errors import AttemptEnded

    ended = threading.Event()
    errors: list[BaseException] = []

    def late(ctx) -> None:
        ended.wait(30)
        try:
            ctx.checkpoint(99, processed=99)
        except BaseException as exc:
            errors.append(exc)

    def handler(ctx) -> None:
        ctx.checkpoint(1, processed=1)
        handler.thread = threading.Thread(target=late, args=(ctx,))
        handler.thread.start()  # and returns without joining it

    attempt(store, 1).run(handler)
    ended.set()
    handler.thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], AttemptEnded) and isinstance(errors[0], RuntimeError)
    with store.open() as s:
        assert s.checkpoints.load(JOB, SLOT).position == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.checkpoint(8, processed="abc"), "processed must be a whole number"),
        (lambda ctx: ctx.checkpoint(8, processed=-1), "processed must be a whole number"),
        (lambda ctx: ctx.checkpoint(8, processed=True), "got True (bool)"),
        (lambda ctx: ctx.checkpoint(8, processed=2.5), "got 2.5 (float)"),
        (lambda ctx: ctx.checkpoint(8, total=-3), "total must be a whole number"),
        (lambda ctx: ctx.checkpoint(8, total=False), "got False (bool)"),
        (lambda ctx: ctx.checkpoint(8, processed=2**63), "processed must be a whole number of items from 0 to 2**63-1"),
        (lambda ctx: setattr(ctx, "total", -1), "ctx.total must be a whole number"),
    ],
)
def test_counts_that_are_not_whole_numbers_are_refused_and_nothing_is_written(
    store: Store, call: Any, message: str
) -> None:
    def handler(ctx) -> None:
        ctx.checkpoint(7, processed=7, total=10)
        call(ctx)

    with pytest.raises(InvalidCheckpoint) as err:
        attempt(store, 1).run(handler)
    assert message in str(err.value) and JOB in str(err.value)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.position, row.processed, row.total, row.status) == (7, 7, 10, "failed")


@pytest.mark.parametrize(
    ("job", "slot", "message"),
    [
        ("loans\x00", SLOT, "job 'loans\\x00' contains a NUL character"),
        (JOB, "2026\x00", "slot '2026\\x00' contains a NUL character"),
        ("j" * 1025, SLOT, "job is 1025 bytes long in UTF-8, over the 1024"),
        (JOB, "s" * 2000, "slot is 2000 bytes long"),
        ("\ud800", SLOT, "cannot be stored as UTF-8"),
    ],
)
def test_a_job_or_slot_the_database_cannot_store_is_refused_before_the_store_is_opened(
    job: str, slot: str, message: str
) -> None:
    class Unopened(Store):  # any use of the store would fail the test
        dialect = None  # type: ignore[assignment]

        def connect(self, *, autocommit: bool = False) -> Any:
            raise AssertionError("the store was opened")

        def set_autocommit(self, conn: Any, on: bool) -> None:
            raise AssertionError

        def describe(self) -> str:
            return "unopened"

    with pytest.raises(ConfigurationError) as err:
        Attempt(Unopened(), Identity(job=job, slot=slot, attempt=1, owner="o")).run(lambda ctx: None)
    assert message in str(err.value)


def test_names_of_up_to_1024_bytes_are_stored_and_longer_ones_refused(store: Store) -> None:
    """1024 bytes each, even in 4-byte characters, fit PostgreSQL's primary key index."""
    job, slot = "\U0001f600" * 256, "\U0001f4a5" * 256
    with pytest.raises(ConfigurationError, match="job is 1028 bytes long"):
        Attempt(store, Identity(job=job + "x" * 4, slot=slot, attempt=1, owner="o"))
    outcome = Attempt(store, Identity(job=job, slot=slot, attempt=1, owner="o")).run(lambda ctx: ctx.checkpoint(1))
    assert (outcome.checkpoint.job, outcome.checkpoint.slot, outcome.checkpoint.position) == (job, slot, 1)


@pytest.mark.parametrize("stored", ["[1, 2]", '"x"', "3", "true"])
def test_a_stored_state_that_is_not_an_object_is_a_corrupt_row_and_the_lease_is_given_back(
    store: Store, stored: str
) -> None:
    from airflow_resumable.core.model.errors import CorruptCheckpoint

    # Given a failed attempt's row whose state someone edited by hand
    with pytest.raises(RuntimeError):
        attempt(store, 1).run(Items(20, 5, fail=(1, 2)))
    with store.open() as s:
        s._execute("UPDATE resumable_checkpoints SET state = %s WHERE job = %s", (stored, JOB))
        s.commit()
    # When the next attempt starts
    work = Items(20, 5)
    with pytest.raises(CorruptCheckpoint) as err:
        attempt(store, 2).run(work)
    # Then it names the column and the fix, ran nothing and left the row as it was, lease included
    text = str(err.value)
    assert "the stored state" in text and "is JSON but not an object" in text
    assert "Set the state column to a JSON object" in text and "DELETE FROM resumable_checkpoints" in text
    assert work.seen == []
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT state, lease_owner, position, status FROM resumable_checkpoints WHERE job = 'loans'")
        assert cur.fetchone() == (stored, None, "10", "failed")


def test_a_stored_position_nested_too_deeply_to_read_is_a_corrupt_row_not_a_recursion_error(store: Store) -> None:
    from airflow_resumable.core.model.errors import CorruptCheckpoint

    # Given a failed attempt's row whose position someone replaced with lists nested deeper than
    # the product's limit (which every supported Python's own parser would still read)
    with pytest.raises(RuntimeError):
        attempt(store, 1).run(Items(20, 5, fail=(1, 2)))
    deep = "[" * TOO_DEEP + "]" * TOO_DEEP
    with store.open() as s:
        s._execute("UPDATE resumable_checkpoints SET position = %s WHERE job = %s", (deep, JOB))
        s.commit()
    # When the next attempt starts, then it names the column and the fix, and runs nothing
    work = Items(20, 5)
    with pytest.raises(CorruptCheckpoint) as err:
        attempt(store, 2).run(work)
    assert "the stored position" in str(err.value) and "DELETE FROM resumable_checkpoints" in str(err.value)
    assert f"nested more than {MAX_DEPTH} levels deep" in str(err.value)
    assert work.seen == []


def test_a_checkpoint_makes_one_call_into_the_attempt_and_the_tally_holds_the_progress() -> None:
    """The context encodes and hands over; the attempt saves, records, reports and checks the
    signal in that one call (no re-entry into the context, no second or third call)."""
    from airflow_resumable.core import Checkpoint
    from airflow_resumable.core.attempt.context import RunContext
    from airflow_resumable.core.attempt.tally import Tally
    from airflow_resumable.core.model.checkpoint import Write
    from airflow_resumable.core.model.identity import Identity

    calls: list[tuple[str, tuple[Any, ...]]] = []

    class Calls:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: calls.append((name, args))

    tally = Tally(Checkpoint(job=JOB, slot=SLOT, position=3, processed=3, state={"sum": 1}))
    ctx = RunContext(Calls(), Identity(job=JOB, slot=SLOT, attempt=2, owner="o"), tally, signal=Signal(),  # type: ignore[arg-type]
                     log=logging.getLogger("test"), resumed=True)
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


def test_an_attempt_has_one_constructor_an_identity_and_its_hooks(store: Store) -> None:
    from airflow_resumable.core.model.identity import Hooks, Identity

    identity = Identity(job=JOB, slot=SLOT, attempt="1", owner="owner-1")  # type: ignore[arg-type]
    built = Attempt(store, identity, hooks=Hooks(rerun=lambda row: "asked"))
    assert built.attempt == built.identity.attempt == 1  # a try number read as a string
    assert built.running is None and built.keeper is None  # nothing held before the lease
    outcome = built.run(lambda ctx: ctx.checkpoint(1))
    assert outcome.checkpoint.status == "done" and built.running is not None and built.running.final == outcome.checkpoint
    with pytest.raises(TypeError):
        Attempt(store, identity, job=JOB)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes an Identity"):
        Attempt(store, JOB)  # type: ignore[arg-type]
    fields: dict[str, Any] = {"job": JOB, "slot": SLOT, "attempt": 1, "owner": "o"}
    with pytest.raises(TypeError):
        Attempt(store, **fields)  # the identity's fields as keywords: not a second way in


def test_the_nesting_limit_is_ours_the_same_on_every_python() -> None:
    """600 levels: within Python 3.11's recursion limit and 3.13's parser, refused on both (a value
    one worker stores, every worker must read back); 500 levels are kept."""
    from airflow_resumable.core.model.checkpoint import decode, encode
    from airflow_resumable.core.model.errors import CorruptCheckpoint

    with pytest.raises(InvalidCheckpoint, match=f"more than {MAX_DEPTH} levels"):
        encode(_nested(TOO_DEEP), what="position", job=JOB, slot=SLOT)
    assert decode(encode(_nested(MAX_DEPTH - 1), what="position", job=JOB, slot=SLOT), what="position", job=JOB,
                  slot=SLOT) == _nested(MAX_DEPTH - 1)
    with pytest.raises(CorruptCheckpoint, match=f"nested more than {MAX_DEPTH} levels"):
        decode("[" * 600 + "]" * 600, what="position", job=JOB, slot=SLOT)
