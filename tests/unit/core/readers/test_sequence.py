"""The sequence reader: a sequence resumed at its index, an iterator factory skipped forward once, a
bare iterator refused, and a handler that owns its loop over the reader's chunks.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core import chunk_loop
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.readers import Batch, SequenceReader
from airflow_resumable.core.stores import Store
from support.readers import Crash, _load, _sinks, attempt


def test_a_sequence_resumes_at_its_index_and_an_iterator_factory_is_skipped_forward_once(store: Store) -> None:
    items = [f"item{i}" for i in range(23)]
    for source in (items, lambda: iter(items)):
        slot = f"seq-{type(source).__name__}"
        seen: list[str] = []
        crash, collect_all = _sinks(seen, first="item10")
        with pytest.raises(Crash):
            attempt(store, 1, slot).run(chunk_loop(SequenceReader(source), crash, chunk_size=5))
        assert _load(store, slot).position == 9
        attempt(store, 2, slot).run(chunk_loop(SequenceReader(source), collect_all, chunk_size=5))
        assert seen == items


def test_a_bare_iterator_is_refused_because_a_retry_could_not_read_it_again() -> None:
    with pytest.raises(ConfigurationError, match="a function that makes the iterator"):
        SequenceReader(iter([1, 2]))  # type: ignore[arg-type]


def test_a_handler_that_owns_its_loop_iterates_chunks_and_checkpoints_each(store: Store) -> None:
    reader = SequenceReader(list(range(10)))

    def handler(ctx: Any) -> int:
        total = ctx.state.get("sum", 0)
        for batch in reader.chunks(ctx, 4):
            assert isinstance(batch, Batch)
            total += sum(batch)
            ctx.checkpoint(batch.position, state={"sum": total}, processed=ctx.processed + len(batch))
        return total

    outcome = attempt(store, 1).run(handler)
    assert outcome.result == 45 and outcome.checkpoint.position == 9 and outcome.checkpoint.processed == 10


def test_a_reader_with_a_position_function_is_refused_at_parse_time() -> None:
    with pytest.raises(ConfigurationError, match="drop position="):
        chunk_loop(SequenceReader([1]), lambda c, b: None, chunk_size=1, position=lambda x: x)
