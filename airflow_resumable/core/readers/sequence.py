"""The sequence reader: items of a sequence, or of an iterable a function makes, by index."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.readers.base import Batch, Reader

if TYPE_CHECKING:
    from airflow_resumable.core.attempt.context import RunContext

__all__ = ["SequenceReader"]


class SequenceReader(Reader):
    """Items of a sequence, or of the iterable a function makes, by index.

    The position of an item is its index (from 0). A sequence (a list, a range...) is sliced, so a
    resume costs nothing; an iterable made by ``items()`` is consumed from its start up to the
    position on resume (an iterator cannot seek), then kept for the attempt.

    Args:
        items: a sequence, or a function of no arguments returning an iterable (called once per
            attempt). A bare iterator is refused: a retry could not read it again.
        name: names the source in errors.

    Raises:
        ConfigurationError: ``items`` is neither.
    """

    def __init__(self, items: Sequence[Any] | Callable[[], Iterable[Any]], *, name: str | None = None):
        super().__init__()
        if isinstance(items, Iterator) or not (isinstance(items, Sequence) or callable(items)):
            raise ConfigurationError(
                f"sequence reader: items must be a sequence or a function returning an iterable, "
                f"got {type(items).__name__}",
                hint="Pass the list itself, or a function that makes the iterator (a retry reads it again)",
            )
        self.items = items
        self.name = name or type(items).__name__
        self._iter: Iterator[Any] | None = None
        self._next = 0  # the index of the item self._iter gives next

    def identity(self) -> dict[str, Any]:
        """The sequence's name (see :meth:`Reader.identity`): positions are indexes, so a sequence
        that grows at its end keeps them; one named otherwise is another source."""
        return {"reader": "sequence", "name": self.name}

    def read(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        first = 0 if after is None else after + 1 if isinstance(after, int) and not isinstance(after, bool) else None
        if first is None or first < 0:
            raise self._not_a_position(ctx, after, "an index")
        if isinstance(self.items, Sequence):
            items = self.items[first:first + limit]
        else:
            if self._iter is None or self._next != first:
                self._iter = iter(self.items())
                self._next = 0
                for _ in itertools.islice(self._iter, first):  # an iterator cannot seek: skip, once per attempt
                    self._next += 1
            items = list(itertools.islice(self._iter, limit))
            self._next = first + len(items)
        return Batch(items, range(first, first + len(items)))

    def count(self, ctx: RunContext | None = None) -> int | None:
        """The number of items, for a sequence (None for an iterable)."""
        return len(self.items) if isinstance(self.items, Sequence) else None

    def close(self) -> None:
        self._iter, self._next = None, 0
        super().close()
