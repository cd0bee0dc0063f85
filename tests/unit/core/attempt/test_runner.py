"""The attempt's run, without Airflow: resume, at most one chunk repeated, timeout, re-runs, the
chunk's writes with its checkpoint, bad options and corrupt rows.

Given / When / Then, against both stores.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Cancelled, ConfigurationError, InvalidCheckpoint, Options, Store, chunk_loop
from airflow_resumable.core.model.checkpoint import MAX_DEPTH
from airflow_resumable.core.model.identity import Hooks, Identity
from support.attempts import JOB, SLOT, TOO_DEEP, Items, attempt


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


def test_a_handler_that_is_not_callable_is_refused(store: Store) -> None:
    with pytest.raises(ConfigurationError, match=r"handler must be callable.*job='loans'"):
        attempt(store, 1).run("not a function")  # type: ignore[arg-type]


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
    with store.open() as s:  # read as stored: the decoder refuses the row too
        row = s.execute("SELECT status, position, lease_owner FROM resumable_checkpoints WHERE job = %s",
                        (JOB,)).fetchone()
    assert tuple(row) == ("stalled", "10", None)


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


def test_the_core_s_own_log_lines_about_errors_carry_no_credential(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    from airflow_resumable.core.attempt.signal import Reason

    # Given an embedding whose classification of a SIGTERM fails with an error naming a DSN's password
    def classify(reason: str) -> str:
        raise RuntimeError("cannot reach postgresql://svc:s3cret-pw@db/airflow password=s3cret-pw")

    run = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o"), hooks=Hooks(resolve_reason=classify))

    def handler(ctx) -> None:
        ctx.signal.cancel(Reason.TERMINATED, "SIGTERM")
        ctx.checkpoint(1, processed=1)

    with caplog.at_level("DEBUG"), pytest.raises(Cancelled):
        run.run(handler)
    # Then the line that says so, its traceback included, went out without the password
    said = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "could not classify cancel reason" in said and "RuntimeError" in said
    assert "s3cret-pw" not in said
    assert not any(r.exc_info for r in caplog.records if "classify" in r.getMessage())


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


@pytest.mark.parametrize("stop", ["cancel", "pause"])
def test_a_handler_that_catches_the_stop_and_returns_ends_stopped_not_done(
        store: Store, stop: str, caplog: pytest.LogCaptureFixture) -> None:
    from airflow_resumable.core import Paused, control

    # Given a handler that swallows what its checkpoint raises and returns, on attempt 1 a person's
    # request arriving after item 2
    seen: list[int] = []

    def handler(ctx: Any) -> str:
        try:
            for i in range(ctx.position or 0, 10):
                seen.append(i)
                if i == 2 and ctx.attempt == 1:
                    getattr(control, stop)(store, JOB, SLOT, by="carol")
                ctx.checkpoint(i + 1, processed=i + 1)
        except Cancelled:
            return "caught"
        return "finished"

    # When attempt 1 runs: it ends with the stop, not done over the items it never processed
    with pytest.raises(Paused if stop == "pause" else Cancelled):
        attempt(store, 1).run(handler)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert row.status == ("paused" if stop == "pause" else "cancelled") and row.position == 3
    assert "caught the stop its checkpoint raised" in caplog.text
    # Then the next attempt resumes from the checkpoint and does the rest
    if stop == "pause":
        control.resume(store, JOB, SLOT, by="carol")
    outcome = attempt(store, 2).run(handler)
    assert outcome.result == "finished" and outcome.checkpoint.status == "done"
    assert seen == list(range(10))
