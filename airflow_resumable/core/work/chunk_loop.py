"""The chunked loop: a handler built from ``read`` and ``process``, for when the operator owns the loop.

Each round reads up to ``chunk_size`` items after the current position, processes them, moves the
position to the last item's key and saves the checkpoint; the signal is checked after the save
(and before the next read), so a cancel stops at a consistent point with the last chunk saved.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from airflow_resumable.core.attempt.async_bridge import SyncCalls
from airflow_resumable.core.attempt.context import RunContext
from airflow_resumable.core.attempt.skip_policy import never_skipped, skip_limit_check, skip_on_check
from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.checkpoint import error_text, short
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.model.options import REQUIRED, Option, call_problem, params_doc, problems, seconds
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.model.positions import default_key
from airflow_resumable.core.readers import Batch, Reader
from airflow_resumable.core.work import rebalance

ReadFn = Callable[[RunContext, Any, int], Sequence[Any]]
ProcessFn = Callable[[RunContext, Sequence[Any]], Any]


def _callable_as(call: str) -> Callable[[str, Any], str | None]:
    """The check of a function the loop calls as ``call`` (whether it takes that call, :func:`calls_problems`)."""
    return lambda name, value: None if callable(value) else f"{name} must be callable as {call}, got {type(value).__name__}"


def _positive_int(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return f"{name} must be a positive integer, got {value!r}"
    return None


def _item_function(name: str, value: Any) -> str | None:
    return None if callable(value) else f"{name} must be a function of the last item of a batch, got {type(value).__name__}"


def _count_or_function(name: str, value: Any) -> str | None:
    if callable(value) or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return f"{name} must be a non-negative int or a function of ctx, got {value!r}"


#: ``ChunkedOperator``'s own arguments (and :func:`chunk_loop`'s), each declared once: the
#: operator's signature and attributes, its docstring, the docs' table and the checks derive
#: from them (tests compare the signatures and the docs with these).
CHUNKED_OPTIONS: tuple[Option, ...] = (
    Option("read", REQUIRED, "`read(ctx, after, limit) -> list`: up to `limit` items after position `after`, in "
           "position order; or a reader", check=_callable_as("read(ctx, after, limit)"),
           more="`after` is `start` on a fresh run; an empty batch ends the run. A reader (`airflow_resumable.readers`: SQL keyset, file, "
                "sequence) knows its items' positions and pages correctly by construction."),
    Option("process", REQUIRED, "`process(ctx, batch)`: the chunk's work", check=_callable_as("process(ctx, batch)"),
           more="Make it idempotent, or write through `ctx.transaction()` to commit it atomically with the checkpoint."),
    Option("chunk_size", REQUIRED, "items per chunk: the worst-case cancel delay; `items / chunk_size` checkpoints",
           check=_positive_int),
    Option("position", None, 'function of an item giving its position (default `item["id"]`, `item[0]` or the item)',
           check=_item_function),
    Option("total", None, "the item count, or `fn(ctx)` computing it once per run (for percent and ETA)",
           check=_count_or_function),
    Option("start", None, "the position before the first item, or `fn(ctx)` giving it",
           more="E.g. `lambda ctx: ctx.previous.position if ctx.previous else None` to continue where the job's "
                "previous finished run ended. A run that reads nothing still ends at `start`."),
    Option("checkpoint_interval", None, "save at most every this many seconds (`None`: after every chunk)",
           check=seconds(), seconds=True,
           more="The signal is still checked after every chunk, and a pending position is saved before stopping and "
                "at the end; but a crash repeats up to this long a stretch of chunks instead of one. For tiny, fast "
                "chunks whose checkpoint would cost a large share of their work."),
    Option("skip_on", None, "an exception class or a tuple of them: an item raising one is recorded in "
           "`resumable_dead_letters` and skipped", check=skip_on_check,
           more="A chunk raising one is undone (its writes through `ctx.transaction()` and its changes to "
                "`ctx.state`) and processed again item by item (see `airflow_resumable.core.attempt.skip_policy`). None: any error "
                "fails the attempt."),
    Option("skip_limit", defaults.SKIP_LIMIT, "how many items of the slot may be skipped; one more fails the attempt "
           "(`SkipLimitExceeded`, no retry)", check=skip_limit_check),
)


def validate_chunked(values: Mapping[str, Any], *, job: str | None = None) -> None:
    """Check :data:`CHUNKED_OPTIONS`' ``values`` (by name) and the calls of ``read``/``process``.

    Raises:
        ConfigurationError: naming every bad argument at once (at DAG parse time).
    """
    found = chunked_problems(values) + calls_problems(values["read"], values["process"], ())
    if found:
        raise ConfigurationError("; ".join(found), job=job, hint="Fix the task's arguments")


def chunked_problems(values: Mapping[str, Any]) -> list[str]:
    """Every problem with :data:`CHUNKED_OPTIONS`' ``values`` (by name) but the calls (see
    :func:`calls_problems`), as sentences."""
    found = problems(CHUNKED_OPTIONS, values)
    read, position = values.get("read"), values.get("position")
    if position is not None and isinstance(read, Reader):  # the one check of two arguments together
        found.append(f"read is a reader ({read!r}), which knows its items' positions: drop position=")
    return found


def calls_problems(read: Any, process: Any, keywords: Collection[str] | None) -> list[str]:
    """Why ``read``/``process`` cannot take the calls the loop makes, with ``keywords`` (the names of
    handler_kwargs) besides; None when those are not known yet: the positional part only."""
    calls = (
        # A reader takes no handler_kwargs (they go to process only), and its call is known.
        call_problem(read, "read", ("ctx", "after", "limit"), keywords)
        if callable(read) and not isinstance(read, Reader) else None,
        call_problem(process, "process", ("ctx", "batch"), keywords) if callable(process) else None,
    )
    return [p for p in calls if p]


def chunk_loop(
    read: ReadFn,
    process: ProcessFn,
    *,
    chunk_size: int,
    position: Callable[[Any], Any] | None = None,
    total: int | Callable[[RunContext], int | None] | None = None,
    start: Any = None,
    checkpoint_interval: float | None = None,
    skip_on: type[Exception] | tuple[type[Exception], ...] | None = None,
    skip_limit: int = defaults.SKIP_LIMIT,
) -> Callable[[RunContext], dict[str, Any]]:
    """Build the handler that runs ``read``/``process`` chunk by chunk from the saved position.

    Its arguments are :data:`CHUNKED_OPTIONS`, listed below from their declarations.

    Raises:
        ConfigurationError: bad arguments, all of them named at once.
    """
    given = locals()  # the parameters are CHUNKED_OPTIONS (a test checks)
    validate_chunked({o.name: given[o.name] for o in CHUNKED_OPTIONS})
    key = position or default_key
    skippable = None if skip_on is None else tuple(skip_on) if isinstance(skip_on, (tuple, list)) else (skip_on,)

    def handler(ctx: RunContext) -> dict[str, Any]:
        try:
            # Async read/process run on the attempt's event loop; the loop itself stays this one.
            with SyncCalls(ctx.signal, ctx.log, job=ctx.job, slot=ctx.slot) as calls:
                return loop(ctx, read if isinstance(read, Reader) else calls.sync(read), calls.sync(process))
        finally:
            if isinstance(read, Reader):
                read.close()

    def loop(ctx: RunContext, read_items: ReadFn, process: ProcessFn) -> dict[str, Any]:
        if isinstance(read, Reader):  # before anything is read: the checkpoint's positions are its
            ctx.use_reader(read)
        if ctx.total is None and total is not None:
            ctx.total = total(ctx) if callable(total) else total
        after = ctx.position
        # A fresh run starting from a given position saves it even if it reads nothing: the run's
        # final position is then where the next run (ctx.previous) continues.
        pending = after is None and start is not None
        if pending:
            after = start(ctx) if callable(start) else start
            pending = after is not None
        processed = ctx.processed
        chunks = skipped = 0
        saved_at = time.monotonic()
        while True:
            if pending and ctx.signal.cancelled:
                ctx.checkpoint(after, processed=processed)  # saves the finished chunks, then raises
            ctx.signal.raise_if_cancelled()
            batch = read_items(ctx, after, chunk_size)
            if not batch:
                break
            if len(batch) > chunk_size:
                raise ConfigurationError(
                    f"read returned {len(batch)} items for a limit of {chunk_size}",
                    job=ctx.job,
                    slot=ctx.slot,
                    hint="read(ctx, after, limit) must return at most limit items",
                )
            # Checked before process: nothing is done out of order, and the checkpoint does not move.
            # A reader's batch converts its positions only when asked (the skip policy's pass); so
            # does a batch of rows found in order at once (_in_order), the common case.
            keys: list[Any] | None = None
            if isinstance(batch, Batch):
                new_after = batch.position
            elif (getter := _getter(batch, key)) is not None and _in_order(after, batch, getter):
                new_after = getter(batch[-1])
            else:
                keys = _keys(batch, key)
                new_after = keys[-1]
            if new_after == after:
                raise ConfigurationError(
                    f"the position did not advance past {after!r}",
                    job=ctx.job,
                    slot=ctx.slot,
                    hint="read must return only items after 'after', ordered by the position key",
                )
            if keys is not None:  # a reader orders by its source's own ORDER BY (collations)
                _check_order(ctx, after, keys)
            if skippable is None:
                process(ctx, batch)
            else:
                positions = (keys if keys is not None else batch.positions if isinstance(batch, Batch)
                             else _keys(batch, key))
                skipped += _process_or_skip(ctx, process, batch, positions, skippable, skip_limit)
            after = new_after
            processed += len(batch)
            chunks += 1
            if checkpoint_interval is None or time.monotonic() - saved_at >= checkpoint_interval:
                ctx.checkpoint(after, processed=processed)
                saved_at, pending = time.monotonic(), False
                if ctx.split_asked is not None:  # an idle partition asks for part of what is left
                    rebalance.answer(ctx, read, after, processed)
            else:
                pending = True
        if pending:
            ctx.checkpoint(after, processed=processed)
        if skipped:
            ctx.log.warning("%s item(s) skipped by this attempt; they are in resumable_dead_letters [job=%s slot=%s]",
                            skipped, ctx.job, ctx.slot)
        return {"chunks": chunks, "skipped": skipped}

    return handler



chunk_loop.__doc__ = f"{(chunk_loop.__doc__ or '').rstrip()}\n\n    Args:\n{params_doc(CHUNKED_OPTIONS, indent='        ', style='google')}\n"

def _process_or_skip(
    ctx: RunContext, process: ProcessFn, batch: Sequence[Any], keys: list[Any], skip_on: tuple[type[Exception], ...],
    limit: int,
) -> int:
    """Process the batch; when it raises a skippable error, undo its writes and state changes and
    process it again item by item (Spring Batch's scan), skipping each item that raises one (its
    own writes and state changes undone). Returns how many it skipped.

    The batch is tried whole first: a good chunk costs one savepoint (and one snapshot of the
    state), not one per item.
    """
    try:
        with ctx.savepoint():
            process(ctx, batch)
        return 0
    except skip_on as exc:
        if never_skipped(exc):
            raise
        ctx.log.warning("a chunk of %s failed with %s: processing it again item by item to find the bad ones "
                        "[job=%s slot=%s]", len(batch), outward_text(error_text(exc, 300)), ctx.job, ctx.slot)
    skipped = 0
    for item, key in zip(batch, keys, strict=True):
        one = Batch([item], [key]) if isinstance(batch, Batch) else [item]
        try:
            with ctx.savepoint():
                process(ctx, one)
        except skip_on as exc:
            if never_skipped(exc):
                raise
            ctx.skip(item, position=key, error=exc, limit=limit)
            skipped += 1
    return skipped


def _keys(batch: Sequence[Any], key: Callable[[Any], Any]) -> list[Any]:
    """The position of every item. :func:`default_key` on a batch of dicts or of row tuples takes
    the C-speed ``itemgetter`` (its ``isinstance(item, Mapping)`` per item would cost more than a
    small chunk's work); anything else, or a mixed batch, goes item by item."""
    getter = _getter(batch, key)
    if getter is not None:
        try:
            return list(map(getter, batch))
        except (KeyError, IndexError, TypeError):
            pass  # default_key explains an item it cannot take
    return list(map(key, batch))


_ID, _FIRST = operator.itemgetter("id"), operator.itemgetter(0)


def _getter(batch: Sequence[Any], key: Callable[[Any], Any]) -> Callable[[Any], Any] | None:
    """The C-speed getter of :func:`default_key` for a batch of dicts or of row tuples (by its
    first item), else None."""
    if key is not default_key:
        return None
    kind = type(batch[0])
    return _ID if kind is dict else (_FIRST if kind is tuple or kind is list else None)


def _in_order(after: Any, batch: Sequence[Any], getter: Callable[[Any], Any]) -> bool:
    """Whether the batch is certainly in order (what :func:`_check_order` asks), without building
    its list of positions: ``sorted()`` with the getter as key is stable, so it gives back the
    very same list exactly when no position goes down (about 60 instructions an item fewer than
    the positions' list and its sort: row 2j). False means "look closer", not "out of order"."""
    if type(batch) is not list:  # sorted() gives a list: another sequence never compares equal
        return False
    try:
        first, last = getter(batch[0]), getter(batch[-1])
        if type(after) is list and type(first) is tuple:  # a composite position, back from JSON
            after = tuple(after)
        return bool((after is None or after < first) and (len(batch) < 2 or getter(batch[-2]) < last)
                    and sorted(batch, key=getter) == batch)
    except (KeyError, IndexError, TypeError):
        return False


def _check_order(ctx: RunContext, after: Any, keys: list[Any]) -> None:
    """Refuse a batch that would make the loop skip items: positions going down (within the batch,
    or from ``after``), or equal positions at its end.

    The loop resumes *after* the last position saved, so out-of-order items (``ORDER BY id DESC``,
    no ORDER BY) would be skipped for good; so would the rest of a run of equal positions cut by
    the chunk's end. Equal positions inside a batch lose nothing and are taken. Positions that do
    not compare with ``<`` (dicts, mixed types) are not checked here; the loop still refuses a
    position that does not move.

    Checked for every item at C speed: ``sorted()`` makes one pass over an ascending list and gives
    back the same objects, which compare by identity (about 7 ns an item, where comparing each pair
    in Python took 30).
    """
    if type(after) is list and type(keys[0]) is tuple:  # a composite position, back from JSON
        after = tuple(after)
    try:
        if (sorted(keys) == keys and (after is None or after < keys[0])
                and (len(keys) < 2 or keys[-2] < keys[-1])):
            return
        i, previous, current, where = _first_misplaced(after, keys)
    except TypeError:
        return
    raise ConfigurationError(
        f"read returned positions out of order: {short(current, 40)} (item {i} of the batch) does not come after "
        f"{short(previous, 40)} ({where}); positions seen: {_preview(keys)} after {short(after, 40)}; nothing of this "
        "batch was processed and the checkpoint did not move",
        job=ctx.job,
        slot=ctx.slot,
        hint="read(ctx, after, limit) must return the items after 'after' in ascending position order, the last "
        "item's position unique (e.g. WHERE id > after ORDER BY id, not ORDER BY id DESC)",
    )


def _first_misplaced(after: Any, keys: list[Any]) -> tuple[int, Any, Any, str]:
    """(index, the position it should follow, its position, what that was) of the first item out of place."""
    last = len(keys) - 1
    if after is not None and not after < keys[0]:
        return 0, after, keys[0], "the position 'after' it was read from"
    for i in range(1, last + 1):
        previous, current = keys[i - 1], keys[i]
        if current < previous or (i == last and not previous < current):
            return i, previous, current, f"item {i - 1}"
    raise AssertionError("no item is out of place")  # pragma: no cover - only called for a batch that has one


def _preview(keys: list[Any], limit: int = 6) -> str:
    shown = ", ".join(short(k, 40) for k in keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)} items)"

