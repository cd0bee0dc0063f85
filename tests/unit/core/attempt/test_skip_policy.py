"""The skip policy: bad items go to the dead-letter table and the run goes on, up to ``skip_limit``;
a retry never records an item twice; skipped items can be replayed on purpose.

Against both stores, with a transactional sink (writes through ``ctx.transaction()``) and a plain one.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable.core import Attempt, chunk_loop
from airflow_resumable.core.attempt.skip_policy import replay
from airflow_resumable.core.model.errors import Cancelled, ConfigurationError, SkipLimitExceeded
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import SequenceReader
from airflow_resumable.core.stores import Store

JOB = "skips"
SLOT = "2026-01-01T00:00:00+00:00"
ITEMS = list(range(30))


class Crash(Exception):
    """Stands for the worker dying mid-chunk."""


class Sink:
    """Processes numbers: a bad one raises ValueError; writes each good one through the run's
    transaction (``transactional``) or to a Python list (a plain sink, at least once)."""

    def __init__(self, bad: set[int], *, transactional: bool, crash_at: tuple[int, int] | None = None):
        self.bad, self.transactional, self.crash_at = bad, transactional, crash_at
        self.plain: list[int] = []

    def __call__(self, ctx: Any, batch: list[int]) -> None:
        tx = ctx.transaction() if self.transactional else None
        if tx is not None:
            tx.execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER)")
        for i in batch:
            if i in self.bad:
                raise ValueError(f"bad item {i}")
            if self.crash_at == (ctx.attempt, i):
                raise Crash(f"the worker died at item {i}")
            if tx is not None:
                tx.execute("INSERT INTO sink (item) VALUES (%s)", (i,))  # not an upsert: a repeat would show
            else:
                self.plain.append(i)

    def written(self, store: Store) -> list[int]:
        if not self.transactional:
            return sorted(self.plain)
        with store.open() as s:
            return sorted(r[0] for r in s.execute("SELECT item FROM sink").fetchall())


def run(store: Store, sink: Sink, attempt: int = 1, *, limit: int = 3, skip_on: Any = ValueError) -> Any:
    handler = chunk_loop(SequenceReader(ITEMS), sink, chunk_size=5, skip_on=skip_on, skip_limit=limit)
    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=attempt, owner=f"o{attempt}")).run(handler)


def letters(store: Store, **kwargs: Any) -> list[Any]:
    with store.open() as s:
        return s.skips.items(JOB, SLOT, **kwargs)


@pytest.mark.parametrize("transactional", [True, False], ids=["transactional", "plain"])
def test_bad_items_under_the_limit_are_recorded_and_skipped_and_every_good_item_is_processed(
    store: Store, transactional: bool
) -> None:
    # Given two bad items, each in the middle of a chunk (the chunk wrote items before it raised)
    sink = Sink({7, 19}, transactional=transactional)
    # When the run has a skip policy that allows three
    outcome = run(store, sink, limit=3)
    # Then it finishes; the good items were processed (the failed chunks' partial writes undone,
    # so each good item once, with a transactional sink), and the bad ones are dead letters
    assert outcome.checkpoint.status == "done" and outcome.result == {"chunks": 6, "skipped": 2}
    good = [i for i in ITEMS if i not in {7, 19}]
    if transactional:
        assert sink.written(store) == good
    else:  # the failed chunk's items before the bad one were written twice: at least once
        assert set(sink.written(store)) == set(good) and sink.written(store).count(5) == 2
    assert [(d.position, d.item, d.item_format, d.error, d.attempt, d.status) for d in letters(store)] == [
        (7, 7, "json", "ValueError: bad item 7", 1, "skipped"),
        (19, 19, "json", "ValueError: bad item 19", 1, "skipped"),
    ]
    assert all(d.recorded_at is not None for d in letters(store))
    assert outcome.checkpoint.processed == 30  # the position moved past the skipped items


def test_past_the_skip_limit_the_attempt_fails_naming_the_item_the_limit_and_what_to_do(store: Store) -> None:
    sink = Sink({7, 19}, transactional=True)
    with pytest.raises(SkipLimitExceeded) as err:
        run(store, sink, limit=1)
    text = str(err.value)
    assert "the item at position 19 failed with ValueError: bad item 19" in text and "skip_limit is 1" in text
    assert f"job='{JOB}'" in text and f"slot='{SLOT}'" in text and "Clear the task" in text
    # Nothing is lost silently: the first bad item is recorded, the second is not skipped, and the
    # checkpoint stays at the last finished chunk (before item 19's chunk), with none of its writes
    assert [d.position for d in letters(store)] == [7]
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.status, row.position) == ("failed", 14) and "SkipLimitExceeded" in row.last_error
    assert sink.written(store) == [i for i in range(15) if i != 7]


@pytest.mark.parametrize("transactional", [True, False], ids=["transactional", "plain"])
def test_a_retry_that_meets_a_skipped_item_again_does_not_record_or_count_it_twice(
    store: Store, transactional: bool
) -> None:
    # Given attempt 1 skipped item 7, then died at item 9 of the same chunk, before its checkpoint
    sink = Sink({7}, transactional=transactional, crash_at=(1, 9))
    with pytest.raises(Crash):
        run(store, sink, 1, limit=1)
    # When the retry processes that chunk again (and meets item 7 again), with a limit of one
    outcome = run(store, sink, 2, limit=1)
    # Then it finishes: item 7 is recorded once and counted once
    assert outcome.checkpoint.status == "done"
    [letter] = letters(store)
    assert letter.position == 7
    # (a plain sink's record committed at once and was kept from attempt 1, then met again by attempt
    # 2; a transactional one's rolled back with the chunk, and attempt 2 recorded it): either way it
    # names attempt 2, the latest try that failed it
    assert letter.attempt == 2


class TryErrors(Sink):
    """A sink whose bad items fail with an error naming the try (a fix half made between tries)."""

    def __call__(self, ctx: Any, batch: list[int]) -> None:
        for i in batch:
            if i in self.bad:
                raise ValueError(f"bad item {i} in try {ctx.attempt}")
            if self.crash_at == (ctx.attempt, i):
                raise Crash(f"the worker died at item {i}")
            self.plain.append(i)


def test_an_item_a_later_try_fails_again_shows_that_try_and_its_error_counted_once(store: Store) -> None:
    """Given try 1 skipped item 7 ("bad item 7 in try 1") and died before its chunk's checkpoint,
    When try 2 redoes the chunk and item 7 fails again with another error, Then its one row names try
    2 and try 2's error (before: try 1 and the first error, as if try 2 had not met it), counted once."""
    sink = TryErrors({7}, transactional=False, crash_at=(1, 9))
    with pytest.raises(Crash):
        run(store, sink, 1, limit=1)
    [first] = letters(store)
    assert (first.attempt, first.error) == (1, "ValueError: bad item 7 in try 1")
    outcome = run(store, sink, 2, limit=1)
    assert outcome.checkpoint.status == "done" and outcome.result["skipped"] == 1
    [letter] = letters(store)
    assert (letter.position, letter.status, letter.attempt, letter.error) == (
        7, "skipped", 2, "ValueError: bad item 7 in try 2")
    assert letter.recorded_at >= first.recorded_at


def test_a_requested_retry_that_fails_again_shows_the_retrying_try_and_its_error(store: Store) -> None:
    """Given try 1 finished the slot with item 19 skipped, and a retry of it requested, When try 2
    replays it through the task's own code and it fails again, Then it is skipped with try 2 and try
    2's error (before: the new error under "try 1")."""
    from airflow_resumable.core.attempt.skip_policy import request_retry

    run(store, TryErrors({19}, transactional=False), 1, limit=3)
    assert request_retry(store, JOB, SLOT, by="alice") == 1
    sink = TryErrors({19}, transactional=False)
    loop = chunk_loop(SequenceReader(ITEMS), sink, chunk_size=5, skip_on=ValueError, skip_limit=3)

    def again(ctx: Any) -> Any:
        report = ctx.replay_skipped(lambda item: sink(ctx, [item]))
        assert (report.replayed, report.failed) == ([], [19])
        return loop(ctx)

    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="o2")).run(again)
    [letter] = letters(store, status=None)
    assert (letter.status, letter.attempt, letter.error) == ("skipped", 2, "ValueError: bad item 19 in try 2")


def test_skipped_items_are_replayed_on_purpose_and_marked(store: Store) -> None:
    run(store, Sink({7, 19}, transactional=False), limit=3)
    replayed: list[int] = []

    def fix(item: int) -> None:
        if item == 19:
            raise ValueError("still bad")
        replayed.append(item)

    report = replay(store, JOB, SLOT, fix)
    assert (report.replayed, report.failed, report.not_replayable) == ([7], [19], [])
    assert replayed == [7]
    by_position = {d.position: d for d in letters(store)}
    assert by_position[7].status == "replayed" and by_position[7].replayed_at is not None
    assert (by_position[19].status, by_position[19].error) == ("skipped", "ValueError: still bad")
    # A second replay only tries what is still skipped
    assert replay(store, JOB, SLOT, lambda item: None).replayed == [19]
    assert letters(store, status="skipped") == []


def test_an_item_without_a_json_form_is_kept_as_its_repr_and_not_replayed(store: Store) -> None:
    class Odd:
        def __repr__(self) -> str:
            return "Odd(42)"

    def process(ctx: Any, batch: list[Any]) -> None:
        raise ValueError("odd")

    handler = chunk_loop(SequenceReader([Odd()]), process, chunk_size=1, skip_on=ValueError, skip_limit=1)
    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o")).run(handler)
    [letter] = letters(store)
    assert (letter.item, letter.item_format) == ("Odd(42)", "repr")
    assert replay(store, JOB, SLOT, lambda item: None).not_replayable == [0]


def test_a_cancel_is_never_skipped_even_when_every_exception_is(store: Store) -> None:
    def process(ctx: Any, batch: list[int]) -> None:
        if batch[0] >= 10:
            ctx.signal.cancel("user", "user cancelled")
            ctx.signal.raise_if_cancelled()

    handler = chunk_loop(SequenceReader(ITEMS), process, chunk_size=5, skip_on=Exception, skip_limit=100)
    with pytest.raises(Cancelled):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o")).run(handler)
    assert letters(store) == []


def test_a_slot_started_over_forgets_its_skipped_items(store: Store) -> None:
    run(store, Sink({7}, transactional=False), limit=3)
    handler = chunk_loop(SequenceReader(ITEMS), Sink(set(), transactional=False), chunk_size=5, skip_on=ValueError)
    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="o2"), options=_restart()).run(handler)
    assert letters(store) == []


def _restart() -> Any:
    from airflow_resumable.core import Options

    return Options(restart=True)


def test_a_handler_that_owns_its_loop_skips_with_ctx_skip_and_undoes_one_item_with_a_savepoint(store: Store) -> None:
    def handler(ctx: Any) -> int:
        tx = ctx.transaction()
        tx.execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER)")
        for i in range(ctx.position + 1 if ctx.position is not None else 0, 10):
            try:
                with ctx.savepoint():
                    tx.execute("INSERT INTO sink (item) VALUES (%s)", (i,))  # undone for a bad item
                    if i in (3, 6):
                        raise ValueError(f"bad item {i}")
            except ValueError as exc:
                ctx.skip({"n": i}, position=i, error=exc, limit=2)
            ctx.checkpoint(i, processed=i + 1)
        return 0

    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o")).run(handler)
    with store.open() as s:
        assert sorted(r[0] for r in s.execute("SELECT item FROM sink").fetchall()) == [0, 1, 2, 4, 5, 7, 8, 9]
    assert [(d.position, d.item) for d in letters(store)] == [(3, {"n": 3}), (6, {"n": 6})]


def test_bad_skip_arguments_are_reported_together() -> None:
    with pytest.raises(ConfigurationError) as err:
        chunk_loop(SequenceReader(ITEMS), lambda c, b: None, chunk_size=5, skip_on="ValueError", skip_limit=-1)  # type: ignore[arg-type]
    assert "skip_on must be an exception class" in str(err.value) and "skip_limit must be" in str(err.value)


def counting(bad: set[int], *, transactional: bool) -> Any:
    """The loan report's pattern: each good number is added to a running sum and count in
    ``ctx.state`` as it is written; a bad one raises after the chunk's numbers before it were counted."""
    def process(ctx: Any, batch: list[int]) -> None:
        tx = ctx.transaction() if transactional else None
        if tx is not None:
            tx.execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER)")
        for i in batch:
            if i in bad:
                raise ValueError(f"bad item {i}")
            ctx.state["sum"] = ctx.state.get("sum", 0) + i
            ctx.state["count"] = ctx.state.get("count", 0) + 1
            if tx is not None:
                tx.execute("INSERT INTO sink (item) VALUES (%s)", (i,))
    return process


@pytest.mark.parametrize("transactional", [True, False], ids=["transactional", "plain"])
def test_the_state_counts_each_good_item_once_when_a_chunk_is_processed_again_item_by_item(
    store: Store, transactional: bool
) -> None:
    # Given numbers 1..30 in chunks of 5, and 13 bad: its chunk counted 11 and 12 before it raised
    handler = chunk_loop(SequenceReader(range(1, 31)), counting({13}, transactional=transactional), chunk_size=5,
                         skip_on=ValueError, skip_limit=1)
    # When the skip policy processes that chunk again item by item
    outcome = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o")).run(handler)
    # Then the state is undone with the failed chunk's writes: 11 and 12 are counted once
    assert outcome.checkpoint.state == {"sum": sum(range(1, 31)) - 13, "count": 29}  # 452, not 475 / 31
    assert [(d.position, d.item) for d in letters(store)] == [(12, 13)]  # a sequence's positions are indexes
    if transactional:
        assert len(Sink(set(), transactional=True).written(store)) == 29


def test_a_failed_savepoint_block_takes_its_state_changes_back_with_its_writes(store: Store) -> None:
    # Given a handler that owns its loop, counting each item in ctx.state inside a savepoint
    def handler(ctx: Any) -> dict[str, Any]:
        kept = ctx.state  # a reference the handler holds sees the restored values too
        for i in range(10):
            try:
                with ctx.savepoint():
                    ctx.state["seen"] = [*ctx.state.get("seen", []), i]
                    if i in (3, 6):
                        raise ValueError(f"bad item {i}")
            except ValueError as exc:
                ctx.skip(i, position=i, error=exc, limit=2)
        ctx.checkpoint(9, processed=10)
        return kept

    # When two of the blocks raise
    outcome = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o")).run(handler)
    # Then their items are not in the state, saved or held
    assert outcome.checkpoint.state == {"seen": [0, 1, 2, 4, 5, 7, 8, 9]} == outcome.result


def test_a_process_that_rolls_back_the_transaction_is_refused_naming_its_own_error(store: Store) -> None:
    from airflow_resumable.core.model.errors import TransactionRefused
    from airflow_resumable.operators.outcome import to_airflow
    from airflow_resumable.version_compat import AirflowFailException

    # Given a process that rolls the run's transaction back when an item fails, then re-raises
    def process(ctx: Any, batch: list[int]) -> None:
        tx = ctx.transaction()
        tx.execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER)")
        for i in batch:
            try:
                if i == 7:
                    raise ValueError(f"bad item {i}")
                tx.execute("INSERT INTO sink (item) VALUES (%s)", (i,))
            except ValueError:
                tx.rollback()
                raise

    handler = chunk_loop(SequenceReader(ITEMS), process, chunk_size=5, skip_on=ValueError, skip_limit=3)
    # When it meets the bad item
    with pytest.raises(TransactionRefused) as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o")).run(handler)
    # Then the rollback is refused by name, naming the item's own error (also chained as the cause),
    # the job, the slot and what to do instead; no driver error about a savepoint stands in for it
    text = str(err.value)
    assert "rollback() was called, while handling ValueError: bad item 7" in text
    assert f"job='{JOB}'" in text and f"slot='{SLOT}'" in text and "ctx.savepoint()" in text
    assert isinstance(err.value.__cause__, ValueError) and "savepoint" not in str(err.value.__context__)
    # and nothing is lost: the checkpoint is at the last finished chunk, with its writes kept
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.status, row.position) == ("failed", 4) and "TransactionRefused" in row.last_error
    assert Sink(set(), transactional=True).written(store) == [0, 1, 2, 3, 4]
    assert letters(store) == []
    # and it is not retried: the code must change
    assert isinstance(to_airflow(err.value, job=JOB, slot=SLOT), AirflowFailException)


def test_a_checkpoint_inside_a_savepoint_that_then_raises_is_named_with_the_block_s_own_error(store: Store) -> None:
    from airflow_resumable.core.model.errors import TransactionRefused

    # Given a handler that checkpoints inside its own savepoint (which commits the transaction the
    # savepoint belonged to) and then raises in that block
    def handler(ctx: Any) -> None:
        tx = ctx.transaction()
        tx.execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER)")
        with ctx.savepoint():
            tx.execute("INSERT INTO sink (item) VALUES (%s)", (1,))
            ctx.checkpoint(1, processed=1)
            raise ValueError("bad item 1")

    with pytest.raises(TransactionRefused) as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o")).run(handler)
    # Then the error names the block's own error and that the transaction was ended inside the
    # block, and chains the block's error as its cause
    text = str(err.value)
    assert "the block raised ValueError: bad item 1" in text and "transaction was ended inside the block" in text
    assert f"job='{JOB}'" in text and isinstance(err.value.__cause__, ValueError)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.status, row.position) == ("failed", 1)


def test_a_rollback_sent_as_sql_inside_a_savepoint_is_refused_before_it_undoes_anything(store: Store) -> None:
    from airflow_resumable.core.model.errors import TransactionRefused

    # Given a process that tries to end the run's transaction with a ROLLBACK statement before raising
    def process(ctx: Any, batch: list[int]) -> None:
        tx = ctx.transaction()
        tx.execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER)")
        for i in batch:
            if i == 7:
                tx.execute("ROLLBACK")
                raise ValueError(f"bad item {i}")
            tx.execute("INSERT INTO sink (item) VALUES (%s)", (i,))

    handler = chunk_loop(SequenceReader(ITEMS), process, chunk_size=5, skip_on=ValueError, skip_limit=3)
    with pytest.raises(TransactionRefused) as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o")).run(handler)
    # Then the statement is refused before it is sent (it is not a skippable item error), naming
    # the job and the statement; the chunk's writes are undone with it, the first chunk's kept
    text = str(err.value)
    assert "a ROLLBACK statement was sent through ctx.transaction()" in text and f"job='{JOB}'" in text
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
        items = sorted(r[0] for r in s.execute("SELECT item FROM sink").fetchall())
    assert (row.status, row.position) == ("failed", 4)
    assert items == [0, 1, 2, 3, 4]


# -- in Airflow -----------------------------------------------------------------------------------


DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)


def test_the_chunked_operator_s_summary_counts_and_shows_the_skipped_items(checkpoints: Store, run_dag: Any) -> None:
    from support.xcoms import xcom

    run = run_dag("rt_chunked_skips", conf={"bad": [3, 17]}, logical_date=DAY)
    assert str(run.state) == "success"
    summary = xcom(run, "work")
    assert summary["status"] == "done" and summary["skipped"] == 2
    assert summary["skipped_items"] == [
        {"position": 3, "error": "ValueError: bad number 3", "attempt": 1},
        {"position": 17, "error": "ValueError: bad number 17", "attempt": 1},
    ]
    with checkpoints.open() as s:
        assert sorted(r[0] for r in s.execute("SELECT item FROM skip_sink").fetchall()) == [
            i for i in range(30) if i not in (3, 17)]


def test_the_chunked_operator_fails_without_retry_past_the_skip_limit(checkpoints: Store, run_dag: Any) -> None:
    run = run_dag("rt_chunked_skips", conf={"bad": [3, 17, 25]}, logical_date=DAY)
    assert str(run.state) == "failed"
    ti = run.get_task_instance("work")
    assert ti.try_number == 1, "a skip limit is not retried: the same items would fail again"


def test_the_control_api_lists_and_replays_skipped_items_by_connection(store: Store, store_uri: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_resumable import control

    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", store_uri)
    run(store, Sink({7, 19}, transactional=False), limit=3)
    assert [d.position for d in control.dead_letters(JOB, SLOT)] == [7, 19]
    assert control.replay(JOB, SLOT, lambda item: None).replayed == [7, 19]
    assert control.dead_letters(JOB, SLOT) == []
    assert [d.status for d in control.dead_letters(JOB, SLOT, status=None)] == ["replayed", "replayed"]


def test_the_chunked_operator_s_state_counts_the_good_items_of_a_chunk_with_a_bad_one_once(
    checkpoints: Store, run_dag: Any
) -> None:
    from support.xcoms import xcom

    # Given 1..30 in chunks of 5, 13 bad, a process adding each number to ctx.state before writing it
    run = run_dag("rt_chunked_skips_state", conf={"bad": [13]}, logical_date=DAY)
    # Then the task succeeds with 29 rows written and the state counting those 29 once
    assert str(run.state) == "success"
    row = xcom(run, "work", key="checkpoint", required=True)
    assert row["state"] == {"sum": 452, "count": 29}
    with checkpoints.open() as s:
        assert s.execute("SELECT count(*) FROM skip_sink").fetchone()[0] == 29


# -- retry through the task's own code --------------------------------------------------------------


def test_a_retry_request_marks_the_replayable_items_records_who_asked_and_is_refused_twice(store: Store) -> None:
    from airflow_resumable.core.attempt.skip_policy import request_retry
    from airflow_resumable.core.model.errors import RequestRefused

    with pytest.raises(Exception, match="no checkpoint row"):
        request_retry(store, JOB, SLOT, by="alice")
    run(store, Sink(set(), transactional=False))
    with pytest.raises(RequestRefused, match="no skipped item that can be replayed"):
        request_retry(store, "skips", SLOT, by="alice")
    store2_slot = "2026-01-02T00:00:00+00:00"
    handler = chunk_loop(SequenceReader(ITEMS), Sink({7, 19}, transactional=False), chunk_size=5, skip_on=ValueError,
                         skip_limit=3)
    Attempt(store, Identity(job=JOB, slot=store2_slot, attempt=1, owner="o1")).run(handler)
    assert request_retry(store, JOB, store2_slot, by="alice") == 2
    with store.open() as s:
        assert [d.status for d in s.skips.items(JOB, store2_slot)] == ["retry_requested", "retry_requested"]
        asked = [r for r in s.listings.history(JOB, store2_slot) if r.outcome == "retry_skipped_requested"]
    assert [(r.requested_by, r.error) for r in asked] == [("alice", "retry of 2 skipped item(s) requested")]
    with pytest.raises(RequestRefused, match="a retry of its 2 skipped item\\(s\\) is already requested"):
        request_retry(store, JOB, store2_slot, by="bob")


def test_the_next_attempt_of_a_done_slot_replays_the_requested_items_at_its_end_and_commits_them(
    store: Store,
) -> None:
    """Given a done slot with 7 and 19 skipped, a retry requested and 7 fixed: the next attempt
    resumes at the end (it does not start over), replays 7 (written, counted in the state, marked
    replayed) and 19 (fails again: skipped, with its new error), all committed with a checkpoint."""
    from airflow_resumable.core.attempt.skip_policy import request_retry

    def counting(sink: Sink) -> Any:
        def process(ctx: Any, batch: list[int]) -> None:
            sink(ctx, batch)
            ctx.state["n"] = ctx.state.get("n", 0) + len(batch)
        return process

    first = Sink({7, 19}, transactional=True)
    handler = chunk_loop(SequenceReader(ITEMS), counting(first), chunk_size=5, skip_on=ValueError, skip_limit=3)
    assert Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o1"),
    ).run(handler).checkpoint.state == {"n": 28}
    request_retry(store, JOB, SLOT, by="alice")

    fixed = Sink({19}, transactional=True)
    seen: list[Any] = []
    process = counting(fixed)
    loop = chunk_loop(SequenceReader(ITEMS), process, chunk_size=5, skip_on=ValueError, skip_limit=3)

    def again(ctx: Any) -> Any:
        seen.append(ctx.position)
        report = ctx.replay_skipped(lambda item: process(ctx, [item]))
        assert (report.replayed, report.failed) == ([7], [19])
        return loop(ctx)

    outcome = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="o2")).run(again)
    assert seen == [29], "it resumed at the end: the run is not done again"
    assert outcome.checkpoint.status == "done" and outcome.checkpoint.state == {"n": 29}
    assert fixed.written(store) == [i for i in ITEMS if i != 19]
    with store.open() as s:
        letters = {d.position: d for d in s.skips.items(JOB, SLOT)}
    assert (letters[7].status, letters[19].status) == ("replayed", "skipped")
    assert letters[19].error == "ValueError: bad item 19"


def test_the_chunked_operator_replays_requested_items_through_its_process_after_a_clear(
    checkpoints: Store, run_dag: Any
) -> None:
    """A real DAG: 13 and 22 skipped, a retry asked by alice through control (which clears the
    finished task instance), 13 fixed: the next run of the slot replays both through ``process``."""
    from airflow_resumable import control
    from support.xcoms import xcom

    run = run_dag("rt_chunked_skips_state", conf={"bad": [13, 22]}, logical_date=DAY)
    assert str(run.state) == "success"
    job, slot = "rt_chunked_skips_state.work", DAY.isoformat()
    assert control.offers(job, slot)["retry_skipped"] is True
    control.retry_skipped(job, slot, by="alice")
    assert str(run.get_task_instance("work").state) not in ("success", "TaskInstanceState.SUCCESS"), "cleared"
    view = control.skipped_view(job, slot)
    # positions are the items' indexes: 13 is at 12, 22 at 21
    assert [(i["position"], i["state"]) for i in view["skipped_items"]] == [(12, "retry_requested"),
                                                                            (21, "retry_requested")]
    assert control.offers(job, slot)["retry_skipped"] is False

    again = run_dag("rt_chunked_skips_state", conf={"bad": [22]}, logical_date=DAY)
    assert str(again.state) == "success"
    row = xcom(again, "work", key="checkpoint", required=True)
    assert row["state"] == {"sum": 465 - 22, "count": 29}
    view = control.skipped_view(job, slot)
    assert [(i["position"], i["state"]) for i in view["skipped_items"]] == [(12, "replayed"), (21, "skipped")]
    assert view["skipped_total"] == 1
    assert [r.requested_by for r in control.history(job, slot) if r.outcome == "retry_skipped_requested"] == ["alice"]
    with checkpoints.open() as s:
        assert s.execute("SELECT count(*) FROM skip_sink").fetchone()[0] == 29
