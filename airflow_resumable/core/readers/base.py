"""What every reader is: :class:`Reader` (``read(ctx, after, limit)`` plus ``chunks()``) and its :class:`Batch`.

Also the few things the readers share: how they name a bad argument list, a position they cannot
read, and how they close what they hold between chunks.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_resumable.core.model.checkpoint import differences, short
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.model.keys import json_key
from airflow_resumable.core.model.observe import Source, outward_text

if TYPE_CHECKING:
    from airflow_resumable.core.attempt.context import RunContext

__all__ = ["Batch", "Reader", "check_arguments", "close_quietly", "differences", "identity_digest", "plain"]

_UNSET: Any = object()

#: The hint of a position a reader cannot read: it is not one this reader writes.
FOREIGN_POSITION = "The checkpoint was written by another read function; restart the slot on purpose"


class Batch(list[Any]):
    """One chunk of items, and the position of each (``positions``, ascending in the reader's order).

    ``position`` is the last item's: where the next batch starts, what to checkpoint.

    ``positions`` may also be given as ``keys`` and a function turning one into a position: the
    list is then built only when asked for (the skip policy's item-by-item pass), and a chunk
    that goes well converts its last key only.
    """

    def __init__(self, items: Iterable[Any] = (), positions: Iterable[Any] = (), *,
                 keys: Sequence[Any] | None = None, convert: Callable[[Any], Any] | None = None):
        super().__init__(items)
        self._keys, self._convert = keys, convert
        self._positions: list[Any] | None = None if keys is not None and convert is not None else list(positions)

    @property
    def positions(self) -> list[Any]:
        if self._positions is None:
            assert self._keys is not None and self._convert is not None
            self._positions = list(map(self._convert, self._keys))
        return self._positions

    @property
    def position(self) -> Any:
        """The last item's position (None for an empty batch)."""
        if self._positions is None:
            assert self._keys is not None and self._convert is not None
            return self._convert(self._keys[-1]) if self._keys else None
        return self._positions[-1] if self._positions else None


class Reader(abc.ABC):
    """A ``read(ctx, after, limit)`` that knows its items' positions.

    Subclasses implement :meth:`read`; what they hold open between chunks (a connection, a file)
    belongs to one attempt: it is opened on the first read of a run context and closed by
    :meth:`close`, which the chunk loop calls when it ends, whichever way.
    """

    #: Names the source in errors and logs (never a password).
    name: str = ""

    def __init__(self) -> None:
        self._ctx: Any = None

    def __call__(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        """Up to ``limit`` items after position ``after`` (None: from the start), in order.

        Raises:
            ConfigurationError: the source cannot be paged correctly (e.g. a key that is not
                unique); nothing of the batch was returned.
        """
        self._bind(ctx)
        return self.read(ctx, after, limit)

    def identity(self) -> dict[str, Any]:
        """What this reader's positions are positions of, as plain JSON: its kind, what it reads
        from, its key and its bounds. Two readers with the same identity page the same rows in the
        same order, so a position of one is a position of the other.

        A slot's checkpoint records the identity of the reader that drives it (the chunk loop and
        :meth:`chunks` ask :meth:`RunContext.use_reader`), and an attempt whose reader has another
        identity refuses before it reads (:class:`~airflow_resumable.core.model.errors.ReaderChanged`):
        a position of one reader read by another would skip or repeat items silently.

        This one is the reader's class and :attr:`name`; each reader of the package adds what its
        positions depend on. A reader of your own should add the same: what it reads and in what
        order, never a secret (the identity is stored on the row and shown in errors).
        """
        cls = type(self)
        return {"reader": f"{cls.__module__}.{cls.__qualname__}", "name": self.name}

    def _bind(self, ctx: RunContext | None) -> None:
        if ctx is not self._ctx:  # a new attempt: nothing held by an earlier one is reused
            self.close()
            self._ctx = ctx
            reading = getattr(ctx, "reading", None)  # a RunContext; a test's stand-in may have none
            if reading is not None:
                try:  # lineage never fails a task: a source that cannot be named is left out, with a warning
                    source = self.source()
                except Exception as exc:
                    source = None
                    log = getattr(ctx, "log", None)
                    if log is not None:
                        log.warning("lineage: could not name what this reader reads (%s: %s); its lineage events go "
                                    "without it", type(exc).__name__, outward_text(str(exc), 200))
                reading(source)

    @abc.abstractmethod
    def read(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        """See :meth:`__call__`."""

    def close(self) -> None:
        """Release what is held between chunks. Safe to call more than once."""
        self._ctx = None

    def source(self) -> Source | None:
        """What this reader reads, for lineage (a table, a query, a file), or None (items in memory).
        The Airflow connection is the one its opening function names (``conn_id``), if any."""
        return None

    def chunks(self, ctx: RunContext, size: int, *, after: Any = _UNSET) -> Iterator[Batch]:
        """The batches from ``after`` (default: ``ctx.position``, the checkpoint) to the end.

        For a handler that owns its loop: process each batch, then
        ``ctx.checkpoint(batch.position, ...)``. The signal is checked before every read.

        Raises:
            ConfigurationError: ``size`` is not a positive integer; or what :meth:`read` raises.
        """
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ConfigurationError(f"the chunk size must be a positive integer, got {size!r}", job=ctx.job,
                                     slot=ctx.slot)
        if after is _UNSET:  # the checkpoint's positions are this reader's: record it, or refuse another's
            claim = getattr(ctx, "use_reader", None)
            if claim is not None:
                claim(self)
        position = ctx.position if after is _UNSET else after
        try:
            while True:
                ctx.signal.raise_if_cancelled()
                batch = self(ctx, position, size)
                if not batch:
                    return
                yield batch
                position = batch.position
        finally:
            self.close()

    def _error(self, ctx: RunContext | None, message: str, hint: str) -> ConfigurationError:
        """An error about this source, naming the job and the slot when there is a run context."""
        return ConfigurationError(f"{self.name}: {message}", job=ctx.job if ctx is not None else None,
                                  slot=ctx.slot if ctx is not None else None, hint=hint)

    def _not_a_position(self, ctx: RunContext, after: Any, kind: str) -> ConfigurationError:
        """The checkpoint's position is not ``kind`` (e.g. "a byte offset"): another reader wrote it."""
        return self._error(ctx, f"the position {short(after)} is not {kind}", FOREIGN_POSITION)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


def check_arguments(reader: str, problems: list[str]) -> None:
    """Refuse a reader's arguments, naming every problem at once (when the DAG is parsed).

    Raises:
        ConfigurationError: ``problems`` is not empty.
    """
    if problems:
        raise ConfigurationError(f"{reader} reader: " + "; ".join(problems), hint="Fix the reader's arguments")


def plain(value: Any) -> Any:
    """A value as an identity holds it: its exact JSON form where it has one (timestamps, decimals
    and UUIDs as text, as positions are), else its ``repr`` (bytes...). Lists and tuples alike."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    try:
        return json_key(value)
    except TypeError:
        return repr(value)


def identity_digest(identity: Any) -> str:
    """A short, stable digest of an identity (its canonical JSON's SHA-256, 16 hex digits): what a
    partition's range carries instead of the whole identity."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def close_quietly(resource: Any) -> None:
    """Close a connection or a file held between chunks; one already broken has nothing to give back."""
    if resource is not None:
        try:
            resource.close()
        except Exception:  # pragma: no cover - closing a broken connection or file
            pass
