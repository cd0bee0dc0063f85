"""What ``ctx.checkpoint()`` takes and refuses, without Airflow: positions and states that are not
JSON, too big or too deep, a checkpoint after the handler returned or from a thread after the
attempt ended, counts that are not whole numbers; nothing is written for a refused one.

Given / When / Then, against both stores.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from airflow_resumable.core import InvalidCheckpoint, Store
from airflow_resumable.core.model.checkpoint import MAX_DEPTH, short
from support.attempts import JOB, SLOT, TOO_DEEP, attempt


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


def test_the_nesting_limit_is_ours_the_same_on_every_python() -> None:
    """600 levels: within Python 3.11's recursion limit and 3.13's parser, refused on both (a value
    one worker stores, every worker must read back); 500 levels are kept."""
    from airflow_resumable.core.model.checkpoint import encode
    from airflow_resumable.core.model.errors import CorruptCheckpoint
    from airflow_resumable.core.stores.decoder import decode

    with pytest.raises(InvalidCheckpoint, match=f"more than {MAX_DEPTH} levels"):
        encode(_nested(TOO_DEEP), what="position", job=JOB, slot=SLOT)
    assert decode(encode(_nested(MAX_DEPTH - 1), what="position", job=JOB, slot=SLOT), what="position", job=JOB,
                  slot=SLOT) == _nested(MAX_DEPTH - 1)
    with pytest.raises(CorruptCheckpoint, match=f"nested more than {MAX_DEPTH} levels"):
        decode("[" * 600 + "]" * 600, what="position", job=JOB, slot=SLOT)
