"""What a handler sees: the run context (and, through ``ctx.transaction()``, a
:class:`~airflow_resumable.core.stores.transaction.handle.TransactionConnection`)."""

from __future__ import annotations

import copy
import json
import math
import operator
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Protocol

from airflow_resumable.core.attempt.async_bridge import current_bridge, serving
from airflow_resumable.core.attempt.async_map import MAP_DONE, map_items
from airflow_resumable.core.attempt.reporter import Log
from airflow_resumable.core.attempt.signal import Signal
from airflow_resumable.core.attempt.tally import Tally
from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.checkpoint import ENCODER, Checkpoint, Write, encode
from airflow_resumable.core.model.errors import ConfigurationError, InvalidCheckpoint
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.model.observe import Source, without_credentials
from airflow_resumable.core.model.positions import default_key
from airflow_resumable.core.stores.transaction.handle import TransactionConnection

#: The largest count the checkpoint table's BIGINT columns hold.
_MAX_COUNT = 2**63 - 1


#: ``ctx.previous`` before the handler first asked for it.
_UNREAD = object()


class AttemptCalls(Protocol):
    """What the run context asks of its attempt (:class:`~airflow_resumable.core.attempt.after_chunk.Running`):
    one call per checkpoint, and the handler's tools. Identity and progress are not calls: the
    context holds the attempt's frozen :class:`~airflow_resumable.core.model.identity.Identity` and reads
    its :class:`~airflow_resumable.core.attempt.tally.Tally`."""

    def after_chunk(self, write: Write, state: dict[str, Any]) -> None:
        """Save the encoded checkpoint ``write`` (fenced), record it with the handler's ``state``
        dict it was encoded from, report it, then stop or wait as asked.

        Raises:
            AttemptEnded / LeaseLost: nothing was written.
            Cancelled / Paused: after the save, at this chunk boundary.
            ConfigurationError: the throttle answered something that is not a wait.
        """

    def transaction(self) -> TransactionConnection: ...

    def skip(self, item: Any, *, position: Any, error: BaseException, limit: int) -> int: ...

    def savepoint(self) -> AbstractContextManager[None]: ...

    def replay_requested(self, fn: Callable[[Any], Any] | None,
                         savepoint: Callable[[], AbstractContextManager[None]]) -> Any: ...

    def declare(self, direction: str, source: Source) -> None:
        """Add ``source`` to what this attempt reads (``"input"``) or writes (``"output"``), for lineage.

        Past :data:`~airflow_resumable.core.model.observe.MAX_OUTPUTS` of them, the others are left out of
        the lineage events (one warning per attempt); it never raises.
        """

    def use_reader(self, identity: dict[str, Any]) -> None:
        """Record the reader whose positions the slot's checkpoint holds, or refuse another's.

        Raises:
            ReaderChanged: the checkpoint holds positions of a reader with another identity.
            AttemptEnded / LeaseLost: nothing was written.
        """

    def thread_bound(self) -> bool:
        """Whether the attempt's checkpoint connection may be used on the attempt's thread only (SQLite)."""

    def ended(self) -> bool:
        """Whether the handler returned (every later call is refused with AttemptEnded)."""

    def previous_run(self) -> Checkpoint | None:
        """The job's previous finished run (``ctx.previous``), read from the store.

        Raises:
            AttemptEnded: the handler already returned (and never asked for it).
        """


class RunContext:
    """The run as its handler sees it.

    Attributes:
        job: the job's name (default ``<dag_id>.<task_id>``, plus ``[map_index]`` for a mapped task).
        slot: the run's key, the same on every attempt of that run.
        attempt: Airflow's try number (grows on every retry and every Clear).
        scheduled_at: the run's data interval start or logical date, if it has one.
        signal: the cancellation token (``cancelled``, ``reason``, ``raise_if_cancelled()``, ``wait()``).
        state: a JSON dict carried across attempts with the position; mutate it, then checkpoint.
        log: a logger that reaches the task log.
        previous: the row of the job's previous finished (``done``) slot, or None: its final
            ``position`` and ``state``, ``slot``, ``finished_at``, ``processed``. An incremental
            run starts where it ended. "Previous" is the ``done`` slot sorting last before this
            one when slots are times (a backfill continues from the interval before it), else
            the ``done`` slot that finished last; never this slot itself. Read once, when the
            handler first asks (a handler that never does costs no round trip for it).
    """

    def __init__(self, calls: AttemptCalls, identity: Identity, tally: Tally, *, signal: Signal, log: Log,
                 resumed: bool):
        self._attempt = calls
        self._tally = tally
        self.job: str = identity.job
        self.slot: str = identity.slot
        self.attempt: int = identity.attempt
        self.scheduled_at: datetime | None = identity.scheduled_at
        self.signal: Signal = signal
        self.log: Log = log
        #: True when this attempt continues a checkpoint an earlier attempt saved.
        self.resumed: bool = resumed
        #: The position this attempt started from (None on a fresh start).
        self.resumed_from: Any = tally.position if resumed else None
        self._previous: Checkpoint | None | object = _UNREAD
        #: The attempt's thread: the one that opened the checkpoint database's connection.
        self._home = threading.get_ident()
        #: The items past the position that ctx.map had finished when it saved it (their JSON text):
        #: only when saved with this very position (a row whose position was moved by hand, or saved
        #: since by another checkpoint, names none: its items are run again, never skipped).
        saved = tally.state.pop(MAP_DONE, None)
        self._map_done: set[str] | None = None
        if (isinstance(saved, dict) and isinstance(saved.get("done"), list) and "after" in saved
                and ENCODER.encode(saved["after"]) == ENCODER.encode(tally.position)):
            self._map_done = {ENCODER.encode(k) for k in saved["done"]}
        #: True while a ctx.map() runs: it alone saves the position then.
        self._mapping = False

    @property
    def previous(self) -> Checkpoint | None:
        """The job's previous finished run (see the class docstring), or None; read on first use.

        Raises:
            AttemptEnded: first asked after the handler returned.
        """
        if self._previous is _UNREAD:
            self._previous = self._at_home("ctx.previous", self._attempt.previous_run)
        return self._previous  # type: ignore[return-value]

    @property
    def position(self) -> Any:
        """Where to continue: None on a fresh start, else the last saved position (as JSON gives
        it back: a tuple comes back as a list)."""
        return self._tally.position

    @property
    def state(self) -> dict[str, Any]:
        """A JSON dict carried across attempts with the position; mutate it, then checkpoint."""
        return self._tally.state

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        self._tally.state = value

    @property
    def processed(self) -> int:
        return self._tally.processed

    @property
    def total(self) -> int | None:
        return self._tally.total

    @total.setter
    def total(self, value: int | None) -> None:
        """Set the expected item count; it is saved with the next checkpoint.

        Raises:
            InvalidCheckpoint: not a whole number >= 0 (or None).
        """
        self._tally.total = None if value is None else self._count("ctx.total", value)

    @property
    def row(self) -> Checkpoint:
        """The checkpoint row as last written by this attempt."""
        return self._tally.row

    def checkpoint(
        self,
        position: Any,
        *,
        state: dict[str, Any] | None = None,
        processed: int | None = None,
        total: int | None = None,
    ) -> None:
        """Save progress durably, then report it, then stop if the signal fired.

        ``position`` is where the next attempt continues (any JSON value). ``state`` defaults to
        ``ctx.state`` (so mutate it in place, or pass a new dict). ``processed``/``total`` default to
        their current values. Writes made through :meth:`transaction` commit in the same transaction.

        Raises:
            InvalidCheckpoint: position or state is not plain JSON; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was written.
            Cancelled: after the save, when the signal has fired: this is a chunk boundary.
            Paused: after the save, when a pause was requested, the throttle asked for a long
                wait, or ``max_runtime`` ran out (a kind of Cancelled: stop the same way).
        """
        saving = self._checkpoint_call(position, state, processed, total)
        self._at_home("ctx.checkpoint()", *saving)

    async def acheckpoint(
        self,
        position: Any,
        *,
        state: dict[str, Any] | None = None,
        processed: int | None = None,
        total: int | None = None,
    ) -> None:
        """:meth:`checkpoint` for an ``async def`` handler: ``await ctx.acheckpoint(position, ...)``.

        The same one step (save fenced by the lease, then report, then stop if the signal fired),
        written on the attempt's own thread while the event loop goes on: the loop is never blocked
        by the write. The position and state are encoded before the await (what is saved is what
        they were at the call). A cancellation that arrives during the write waits for it: the
        checkpoint is written whole, then the cancellation goes on.

        Raises:
            InvalidCheckpoint: position or state is not plain JSON; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was written.
            Cancelled: after the save, when the signal has fired (Paused for a pause, as :meth:`checkpoint`).
        """
        await self._asave(self._checkpoint_call(position, state, processed, total))

    async def _asave(self, saving: tuple[Any, ...]) -> None:
        bridge = current_bridge()
        if bridge is None:  # not on the attempt's event loop (a loop the caller runs): where a sync call would run
            self._at_home("ctx.acheckpoint()", *saving)
            return
        await bridge.home(*saving)

    async def _asave_mark(self, position: Any, *, processed: int, done: list[Any]) -> None:
        """``ctx.map``'s save: ``acheckpoint(position, processed=processed)``, the saved state also
        naming the items past ``position`` that finished (``done``), which a resumed attempt's
        ``ctx.map`` does not run again (their effects on :attr:`state` are saved already)."""
        await self._asave(self._checkpoint_call(position, None, processed, None, map_done=done, mapping=True))

    def _take_map_done(self) -> set[str]:
        """The items (their positions' JSON text) the attempt this one resumes had finished past its
        position in ``ctx.map``: for the first ``ctx.map`` call, once."""
        done, self._map_done = self._map_done, None
        return done or set()

    async def arun(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``await ctx.arun(fn, *args, **kwargs)``: call the synchronous ``fn`` on the attempt's own
        thread, where the checkpoint database's connection lives, without blocking the event loop.

        The way to use :meth:`transaction`, :meth:`skip`, :meth:`savepoint` and :attr:`previous`
        from an ``async def`` handler: e.g. ``await ctx.arun(write_rows, ctx.transaction(), rows)``
        (writes that commit with the next checkpoint, exactly once). The calls run one at a time.
        """
        bridge = current_bridge()
        if bridge is None:  # a loop the caller runs: where a sync call would run (handed over from another thread)
            return self._at_home("ctx.arun()", fn, *args, **kwargs)
        return await bridge.home(fn, *args, **kwargs)

    async def map(
        self,
        items: Iterable[Any],
        fn: Callable[[Any], Awaitable[Any]],
        *,
        limit: int = 10,
        position: Callable[[Any], Any] | None = None,
        every: int | None = None,
        skip_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        skip_limit: int = defaults.SKIP_LIMIT,
    ) -> list[Any]:
        """``await ctx.map(items, fn, limit=50)``: run ``await fn(item)`` for every item, at most
        ``limit`` at once, and checkpoint the **contiguous low-water mark**: the position of the
        last item before which every item finished. Items finish in any order; the saved position
        never passes an unfinished item.

        ``items`` are the items after :attr:`position`, in position order (``position`` gives an
        item's position: default ``item["id"]``, ``item[0]`` or the item). No item starts more than
        ``limit`` items ahead of the mark, and the mark is saved whenever it moved ``every`` items
        (default ``limit``) and at the end: a crash repeats at most ``limit + every`` items and
        skips none. A stop source cancels the items in flight, saves the mark, and stops the run.
        With ``skip_on``, an item raising one of those goes to the dead letters (as
        :meth:`skip`) and counts as finished. Returns ``fn``'s results in item order (None for a
        skipped item).

        Raises:
            ConfigurationError: ``limit`` or ``every`` is not a positive whole number; the items'
                positions do not grow along the list; another ctx.map() of the run is under way.
                (While it runs, a checkpoint from elsewhere is refused with it too.)
            Exception: the first error of an item (not skipped); the items in flight are cancelled
                and the checkpoint stays at the last saved mark.
            Cancelled / Paused / LeaseLost: as :meth:`checkpoint`.
        """
        for name, value in (("limit", limit), ("every", every)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigurationError(f"ctx.map() {name} must be a positive whole number, got {value!r}",
                                         job=self.job, slot=self.slot, hint=f"Pass {name}=50, say")
        skippable = None if skip_on is None else tuple(skip_on) if isinstance(skip_on, (tuple, list)) else (skip_on,)
        if self._mapping:
            raise ConfigurationError(
                "ctx.map() was called while another ctx.map() of this run is under way (nested, or at once): both "
                "would save the slot's one position, each past items the other has not finished",
                job=self.job, slot=self.slot,
                hint="Use one ctx.map() at a time: flatten the items into one list, or run an item's own parts "
                "with asyncio.gather inside its function")
        self._mapping = True
        try:
            return await map_items(self, items, fn, limit=limit, key=position or default_key, every=every,
                                   skip_on=skippable, skip_limit=skip_limit)
        finally:
            self._mapping = False

    def _checkpoint_call(self, position: Any, state: dict[str, Any] | None, processed: int | None,
                         total: int | None, *, map_done: list[Any] | None = None,
                         mapping: bool = False) -> tuple[Any, ...]:
        """The attempt's call that saves this checkpoint: its :class:`Write`, encoded and checked
        now (once: every step after this one hands it on), and the state dict it was encoded from
        (``map_done``: written into the saved state only, see :meth:`_asave_mark`; ``mapping``:
        ctx.map's own save).

        Raises:
            ConfigurationError: a checkpoint other than ctx.map's own while a ctx.map() runs.
            InvalidCheckpoint: not JSON, or the state uses ctx.map's key.
        """
        if self._mapping and not mapping:
            raise ConfigurationError(
                "a checkpoint was saved while ctx.map() runs (from one of its items, or another task): ctx.map "
                "saves the position itself, the last one before which every item finished; this one could pass "
                "items still running, which a crash would then skip. Nothing was written",
                job=self.job, slot=self.slot,
                hint="Let ctx.map() save the position (change ctx.state in the item: it is saved with the mark); "
                "checkpoint after ctx.map() returns")
        tally = self._tally
        state = tally.state if state is None else state
        if isinstance(state, dict) and MAP_DONE in state:
            raise InvalidCheckpoint(
                f"the state's key {MAP_DONE!r} is ctx.map()'s own (it names the items past the position that "
                "finished); nothing was written", job=self.job, slot=self.slot,
                hint=f"Rename your key {MAP_DONE!r} in ctx.state")
        processed = tally.processed if processed is None else self._count("processed", processed)
        total = tally.total if total is None else self._count("total", total)
        saved = {**state, MAP_DONE: {"after": position, "done": map_done}} if map_done else state
        position_json, state_json = self._encode(position, saved)
        write = Write(position_json, state_json, processed, total, tally.meter.observe(processed))
        # One way: the attempt saves, records in the tally, reports, then stops or waits.
        return (self._attempt.after_chunk, write, state)

    def transaction(self) -> TransactionConnection:
        """The checkpoint database's connection; writes on it commit with the next checkpoint."""
        self._on_attempt_thread("ctx.transaction()")
        return self._attempt.transaction()

    def _at_home(self, call: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, one of the attempt's store calls, run where the checkpoint
        database's connection may be used: on the attempt's thread when called from an async
        handler's event loop (which waits for it) or from a thread of the handler's while the
        attempt's thread serves an async handler; in the calling thread otherwise.

        Raises:
            ConfigurationError: called from another thread than the attempt's while the attempt's
                thread runs a synchronous handler, on a store whose connection is bound to its
                thread (SQLite). Nothing was written.
        """
        bridge = current_bridge()
        if bridge is None and threading.get_ident() != self._home:
            bridge = serving(self._home)
            if bridge is None and self._attempt.thread_bound() and not self._attempt.ended():
                raise ConfigurationError(
                    f"{call} was called from thread {threading.current_thread().name!r}, not the attempt's own: "
                    "the SQLite checkpoint connection belongs to the thread that runs the handler", job=self.job,
                    slot=self.slot, hint=f"Call {call} from the handler's own thread (have the worker threads hand "
                    "their results back, e.g. with concurrent.futures.as_completed, and checkpoint there), or make "
                    "the handler async def (its threads' calls are then run on the attempt's thread), or keep the "
                    "checkpoints in PostgreSQL")
        if bridge is not None:  # run by the attempt's thread; the caller (the loop, or a thread) waits
            return bridge.blocking(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    def _on_attempt_thread(self, call: str) -> None:
        """Refuse ``call`` on an async handler's event loop: the connection is the attempt's thread's.

        Raises:
            ConfigurationError: called from the event loop of an ``async def`` handler.
        """
        if current_bridge() is not None:
            raise ConfigurationError(
                f"{call} was called on the async handler's event loop: the checkpoint database's connection "
                "belongs to the attempt's own thread", job=self.job, slot=self.slot,
                hint=f"Call it inside a function run there: await ctx.arun(fn, ...), where fn uses {call}")

    def skip(self, item: Any, *, position: Any, error: BaseException, limit: int = defaults.SKIP_LIMIT) -> int:
        """Record ``item`` as skipped because processing it raised ``error``, and go on: the skip
        policy for a handler that owns its loop (``ChunkedOperator(skip_on=...)`` calls it for you).

        The item goes to the dead-letter table once per (job, slot, ``position``): a retry that
        meets it again records nothing new. The record commits at once, or with the next checkpoint
        once the handler writes through :meth:`transaction`. Returns the slot's skipped count.

        Raises:
            SkipLimitExceeded: ``limit`` items of this slot are skipped already (this one is not
                recorded); let it propagate: the attempt fails without a retry.
            InvalidCheckpoint: ``position`` is not plain JSON.
        """
        return int(self._at_home("ctx.skip()", self._attempt.skip, item, position=position, error=error, limit=limit))

    def input(self, *, table: str | None = None, file: str | None = None, connection: str | None = None) -> None:
        """Say what the handler reads, for lineage backends (OpenLineage), when no reader says it
        (a reader says it on its first read): a ``table`` (optionally schema-qualified) through the
        Airflow ``connection``, or a ``file`` (a path or URL; its credentials and query are dropped).
        Without the OpenLineage provider it changes nothing.

        Raises:
            ConfigurationError: neither or both of ``table`` and ``file``, or an empty name. Past
                100 inputs in one attempt, the others are left out of the lineage events (one warning), the
                task goes on.
        """
        self._attempt.declare("input", self._source("input", table, file, connection))

    def output(self, *, table: str | None = None, file: str | None = None, connection: str | None = None) -> None:
        """Say what the handler writes, for lineage backends (OpenLineage): a ``table`` (optionally
        schema-qualified) through the Airflow ``connection``, or a ``file`` (a path or URL; its
        credentials and query are dropped). Each attempt says it again (an output is this attempt's);
        the same output twice counts once. Without the OpenLineage provider it changes nothing.

        Raises:
            ConfigurationError: neither or both of ``table`` and ``file``, or an empty name. Past
                100 outputs in one attempt, the others are left out of the lineage events (one warning), the
                task goes on.
        """
        self._attempt.declare("output", self._source("output", table, file, connection))

    def reading(self, source: Source | None) -> None:
        """A reader's first read in this attempt: its source becomes one of the attempt's inputs."""
        if source is not None:
            self._attempt.declare("input", source)

    def _source(self, direction: str, table: Any, file: Any, connection: Any) -> Source:
        name = table if file is None else file
        if (table is None) == (file is None) or not isinstance(name, str) or not name.strip() or not (
                connection is None or isinstance(connection, str)):
            raise ConfigurationError(
                f"ctx.{direction}() takes exactly one of table= and file= (a non-empty name) and an optional "
                f"connection id, got table={table!r} "
                f"file={without_credentials(file) if isinstance(file, str) else file!r} connection={connection!r}",
                job=self.job, slot=self.slot,
                hint=f'Write ctx.{direction}(table="schema.table", connection="my_db") or '
                f'ctx.{direction}(file="s3://bucket/key")',
            )
        return Source("table" if file is None else "file", name, connection)

    def use_reader(self, reader: Any) -> None:
        """Say that ``reader`` (a :class:`~airflow_resumable.core.readers.Reader`) drives this
        slot: :attr:`position` is a position of its items. The chunk loop and ``reader.chunks(ctx,
        n)`` call it before their first read; call it yourself before reading from
        ``ctx.position`` with ``reader(ctx, after, limit)``.

        The first attempt of a slot (and one that starts it over) records the reader's
        :meth:`~airflow_resumable.core.readers.Reader.identity` on the row; a later attempt whose
        reader has another identity (another key, table or query, ``where``, ``params``, bound or
        range) is refused here, before it reads anything: a position of one reader read by
        another would skip or repeat items without a trace. A row without a reader (written before
        this release, or by a handler that never said) takes this one.

        Raises:
            ReaderChanged: the checkpoint holds positions of another reader; names both, the job,
                the slot and the choices (put the reader back, or restart the slot on purpose).
        """
        self._at_home("ctx.use_reader()", self._attempt.use_reader, reader.identity())

    def replay_skipped(self, fn: Callable[[Any], Any] | None) -> Any:
        """Replay the slot's skipped items whose retry was requested (``airflow resumable skipped
        retry``, the REST API, ``airflow_resumable.control.retry_skipped``), each through ``fn(item)``
        in its own :meth:`savepoint`, then checkpoint where the run stands, so that their changes to
        :attr:`state`, their writes through :meth:`transaction` and their marks commit together.
        Those that succeed become ``replayed``; the others ``skipped`` again with the new error.

        ``ChunkedOperator`` calls it with its ``process`` and ``ResumableOperator(replay=fn)`` with
        ``fn(ctx, item)`` before the work; a handler that owns its loop may call it first itself.
        Returns what it did (a :class:`~airflow_resumable.core.attempt.skip_policy.ReplayReport`), or None when no
        retry was requested.
        """
        self._on_attempt_thread("ctx.replay_skipped()")
        report = self._attempt.replay_requested(fn, self.savepoint)
        if report is not None:
            self.checkpoint(self.position, state=self.state)
        return report

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A block whose writes through :meth:`transaction` and changes to :attr:`state` are undone
        if it raises, and only those: the chunk's earlier writes stay pending for the next checkpoint.

        ``with ctx.savepoint(): write(item)`` lets a handler drop one item's half-done writes and go
        on (e.g. after :meth:`skip`); a running total it added to ``ctx.state`` is taken back with
        them, so the item is not counted. Outside transaction mode there are no writes to undo (each
        statement committed already), but the state still is restored.

        Raises:
            TransactionRefused: the block ended the transaction itself (a :meth:`checkpoint` inside
                it; a ``ROLLBACK`` or ``COMMIT`` sent through :meth:`transaction` is refused before it
                is sent), so its writes could not be undone; names the block's error.
            StoreUnavailable: undoing the writes failed (e.g. the connection broke); names the block's error.
            InvalidCheckpoint: :attr:`state` can be neither written as JSON nor copied.
        """
        self._on_attempt_thread("ctx.savepoint()")
        restore = self._keep_state()
        try:
            with self._attempt.savepoint():
                yield
        except BaseException:
            restore()
            raise

    def _keep_state(self) -> Callable[[], None]:
        """A function that puts :attr:`state` back as it is now (in place, if the block kept the dict).

        The snapshot is the state's JSON text, which is what a checkpoint would store and costs one
        C-speed encode per block (the skip policy opens one per chunk; per item only when it looks
        for a bad item). A state that is not JSON right now is deep-copied instead.
        """
        state = self.state
        try:
            text = ENCODER.encode(state)
        except (TypeError, ValueError, RecursionError):
            try:
                kept = copy.deepcopy(state)
            except Exception:
                encode(state, what="state", job=self.job, slot=self.slot)  # raises InvalidCheckpoint saying why
                raise

            def before() -> Any:
                return kept
        else:
            def before() -> Any:
                return json.loads(text)

        def restore() -> None:
            value = before()
            if self.state is state and type(state) is dict and type(value) is dict:
                state.clear()  # references the handler holds to ctx.state see the restored values too
                state.update(value)
            else:
                self.state = value
        return restore

    def _count(self, name: str, value: Any) -> int:
        """``value`` as a count of items (an int >= 0 that fits the BIGINT column), or
        :class:`InvalidCheckpoint` naming ``name``.

        Integral floats and Decimals (``12.0``, a SQL ``sum``) are taken as ints; strings, bools,
        fractions, NaN and negative numbers are refused.
        """
        if type(value) is int and 0 <= value <= _MAX_COUNT:  # the common case, first
            return value
        count: int | None = None
        if not isinstance(value, (bool, str, bytes)):
            try:
                count = operator.index(value)
            except TypeError:
                try:
                    if math.isfinite(value) and value == int(value):
                        count = int(value)
                except (TypeError, ValueError, OverflowError):
                    pass
        if count is None or not 0 <= count <= _MAX_COUNT:
            raise InvalidCheckpoint(
                f"{name} must be a whole number of items from 0 to 2**63-1, got {value!r} ({type(value).__name__})",
                job=self.job,
                slot=self.slot,
                hint=f"Pass {name.removeprefix('ctx.')} as an int (e.g. len(batch) or a running count); "
                "nothing was written",
            )
        return count

    def _encode(self, position: Any, state: dict[str, Any]) -> tuple[str, str]:
        if not isinstance(state, dict):
            raise InvalidCheckpoint(
                f"state must be a dict, got {type(state).__name__}",
                job=self.job,
                slot=self.slot,
                hint="Pass a dict of JSON values; nothing was written",
            )
        return (
            encode(position, what="position", job=self.job, slot=self.slot),
            encode(state, what="state", job=self.job, slot=self.slot),
        )

    def __repr__(self) -> str:
        return (
            f"RunContext(job={self.job!r}, slot={self.slot!r}, attempt={self.attempt}, "
            f"position={self.position!r}, processed={self.processed}, total={self.total})"
        )


Handler = Callable[[RunContext], Any]
