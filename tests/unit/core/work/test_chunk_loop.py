"""The chunk loop, without Airflow: it reads after the position and checkpoints each chunk, refuses
bad arguments and calls it cannot make before anything runs, and a read that does not advance or
comes out of position order fails before its batch is processed.

Given / When / Then, against both stores.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_resumable.core import Cancelled, ConfigurationError, Store, chunk_loop
from support.attempts import JOB, SLOT, attempt


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
