"""The run while its handler runs, both sides of it in one module: :class:`RunContext`, what the
handler is given (``ctx``), and :class:`Running`, the attempt behind it, which holds the slot's lease
and has begun its run. The context calls the attempt directly: each ``ctx.checkpoint()`` is one call,
:meth:`Running.after_chunk` (save, fenced by the lease; record in the tally; report; then stop or wait
as asked), and the handler's tools (``ctx.transaction()``, ``ctx.skip()``, ``ctx.savepoint()``) borrow
the attempt's connection (a :class:`~airflow_resumable.core.stores.transaction.handle.TransactionConnection`
for the first)."""

from __future__ import annotations

import copy
import inspect
import json
import math
import operator
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from airflow_resumable.core.attempt.acquire import Begun, Held
from airflow_resumable.core.attempt.async_bridge import current_bridge, drive, serving
from airflow_resumable.core.attempt.async_map import MAP_DONE, map_items
from airflow_resumable.core.attempt.given import Given, utcnow
from airflow_resumable.core.attempt.lease import LeaseKeeper
from airflow_resumable.core.attempt.pipeline import CheckpointWriter, checkpoint_writer
from airflow_resumable.core.attempt.reporter import Log
from airflow_resumable.core.attempt.signal import Reason, Signal, raise_request
from airflow_resumable.core.attempt.skip_policy import replay_requested, skip_item
from airflow_resumable.core.attempt.tally import Tally
from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.checkpoint import ENCODER, Checkpoint, Write, differences, encode, short
from airflow_resumable.core.model.errors import (
    Cancelled,
    ConfigurationError,
    InvalidCheckpoint,
    LeaseLost,
    Paused,
    ReaderChanged,
    SplitWithdrawn,
    StoreUnavailable,
)
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.identity import Identity, Named
from airflow_resumable.core.model.observe import MAX_OUTPUTS, Source, outward_text, without_credentials
from airflow_resumable.core.model.options import wait_seconds
from airflow_resumable.core.model.outward import outward_traceback
from airflow_resumable.core.model.positions import default_key
from airflow_resumable.core.stores.base import Store, StoreSession
from airflow_resumable.core.stores.transaction.handle import TransactionConnection

#: The largest count the checkpoint table's BIGINT columns hold.
_MAX_COUNT = 2**63 - 1


#: ``ctx.previous`` before the handler first asked for it.
_UNREAD = object()


class RunContext(Named):
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

    def __init__(self, run: Running):
        self._run = run
        tally = self._tally = run.tally
        given = run.given
        #: Who this run is (job, slot, attempt, owner are read from it).
        self.identity: Identity = given.identity
        self.scheduled_at: datetime | None = given.identity.scheduled_at
        self.signal: Signal = given.signal
        self.log: Log = given.log
        #: True when this attempt continues a checkpoint an earlier attempt saved.
        self.resumed: bool = run.resumed
        #: The position this attempt started from (None on a fresh start).
        self.resumed_from: Any = tally.position if run.resumed else None
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
            self._previous = self._at_home("ctx.previous", self._run.previous_run)
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

        Raises (the one list for the whole step; the calls beneath link here):
            InvalidCheckpoint: position or state is not plain JSON; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was written.
            AttemptEnded: the handler already returned (a kept ``ctx``, a thread); nothing was written.
            Cancelled: after the save, when the signal has fired: this is a chunk boundary.
            Paused: after the save, when a pause was requested, the throttle asked for a long
                wait, or ``max_runtime`` ran out (a kind of Cancelled: stop the same way).
            ConfigurationError: called while a ``ctx.map()`` runs, from another thread on SQLite,
                or the throttle answered something that is not a wait (after the save).
        """
        write, saved = self._write_of(position, state, processed, total)
        # One way: the attempt saves, records in the tally, reports, then stops or waits.
        self._at_home("ctx.checkpoint()", self._run.after_chunk, write, saved)

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
            InvalidCheckpoint / LeaseLost / Cancelled / Paused: as :meth:`checkpoint` lists them.
        """
        await self._asave(*self._write_of(position, state, processed, total))

    async def _asave(self, write: Write, saved: dict[str, Any]) -> None:
        """:meth:`checkpoint`'s one step for an async handler: the attempt's ``after_chunk`` on its own
        thread, awaited without blocking the loop."""
        bridge = current_bridge()
        if bridge is None:  # not on the attempt's event loop (a loop the caller runs): where a sync call would run
            self._at_home("ctx.acheckpoint()", self._run.after_chunk, write, saved)
            return
        await bridge.home(self._run.after_chunk, write, saved)

    async def _asave_mark(self, position: Any, *, processed: int, done: list[Any]) -> None:
        """``ctx.map``'s save: ``acheckpoint(position, processed=processed)``, the saved state also
        naming the items past ``position`` that finished (``done``), which a resumed attempt's
        ``ctx.map`` does not run again (their effects on :attr:`state` are saved already)."""
        await self._asave(*self._write_of(position, None, processed, None, map_done=done, mapping=True))

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

    def _write_of(self, position: Any, state: dict[str, Any] | None, processed: int | None,
                  total: int | None, *, map_done: list[Any] | None = None,
                  mapping: bool = False) -> tuple[Write, dict[str, Any]]:
        """This checkpoint's :class:`Write`, encoded and checked now (once: every step after this one
        hands it on), and the state dict it was encoded from (``map_done``: written into the saved
        state only, see :meth:`_asave_mark`; ``mapping``: ctx.map's own save).

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
        return Write(position_json, state_json, processed, total, tally.meter.observe(processed)), state

    def transaction(self) -> TransactionConnection:
        """The checkpoint database's connection; writes on it commit with the next checkpoint."""
        self._on_attempt_thread("ctx.transaction()")
        return self._run.transaction()

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
            if bridge is None and self._run.given.store.thread_bound and not self._run.ended:
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
        return int(self._at_home("ctx.skip()", self._run.skip, item, position=position, error=error, limit=limit))

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
        self._run.declare("input", self._source("input", table, file, connection))

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
        self._run.declare("output", self._source("output", table, file, connection))

    def reading(self, source: Source | None) -> None:
        """A reader's first read in this attempt: its source becomes one of the attempt's inputs."""
        if source is not None:
            self._run.declare("input", source)

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
        self._at_home("ctx.use_reader()", self._run.use_reader, reader.identity())

    @property
    def split_asked(self) -> str | None:
        """Who asked, as the last checkpoint read back from the row, for the upper part of this
        slot's remaining range (an idle partition of the same partitioned job: rebalancing), or
        None. The chunk loop answers it with :meth:`answer_split` right after that checkpoint."""
        return self._run.tally.split_asked

    def answer_split(self, reader: Any = None, *, total: int | None = None,
                     agree: Callable[[Any], None] | None = None) -> None:
        """Answer the split asked of this slot (:attr:`split_asked`), fenced by the lease, in one
        store transaction: ``agree(session)`` (the split recorded in the job's plan; it raises to
        refuse), the ask cleared and, when given, ``reader`` (the reader of what the slot kept: the
        row's reader identity from now on) and ``total`` recorded. Without ``reader``: the ask is
        declined (cleared, nothing else changes).

        The chunk loop calls it right after the checkpoint that read the ask back, where nothing of
        the handler's is pending: writes made through :meth:`transaction` since the last checkpoint
        would commit with this answer, without a checkpoint of their own.

        Raises:
            ConfigurationError: ``reader`` without ``agree``: the row would name a narrowed range
                the plan does not hold, and the slot's next attempt would refuse it. Nothing was written.
            LeaseLost / AttemptEnded: nothing was written.
            SplitWithdrawn: the ask is no longer pending (its asker withdrew it); nothing was written.
            Exception: what ``agree`` raised; nothing was written (the ask is still pending).
        """
        if reader is not None and agree is None:
            raise ConfigurationError(
                "ctx.answer_split(reader) records the range the slot keeps, which only the split's agreement with "
                "the job's plan makes true: without agree=, the row would name a range the plan does not hold, and "
                "the slot's next attempt would refuse its own checkpoint", job=self.job, slot=self.slot,
                hint="Give agree= the agreement (the chunk loop's rebalance.answer does), or call ctx.answer_split() "
                "with no reader to decline")
        identity = None if reader is None else reader.identity()
        self._at_home("ctx.answer_split()", self._run.answer_split, identity, total, agree)

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
        run = self._run
        if run.ended:
            raise run.given.ended_error("ctx.replay_skipped()")
        report = replay_requested(run.session, job=self.job, slot=self.slot, fn=fn, savepoint=self.savepoint,
                                  log=self.log, attempt=self.attempt)
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
            with self._run.session.savepoint(job=self.job, slot=self.slot):
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



class Running(Named):
    """An attempt that holds the slot's lease and has begun its run: one object, made at that moment
    (:meth:`~airflow_resumable.core.attempt.runner.Attempt.run`), none of its parts None. The run
    context (:class:`RunContext`) calls it directly.

    Attributes:
        given: what the attempt was given (identity, options, hooks, log, reporter, signal, store);
            its job, slot and try number are read from ``identity``, never copied.
        session: the attempt's connection to the checkpoint database.
        fence: the lease: every write names it.
        tally: the attempt's progress, one owner (see core/attempt/tally.py).
        ctx: the run context the handler gets.
        keeper: renews the lease from its own thread (started by the attempt).
        writer: writes the checkpoints: inline, or pipelined (see core/attempt/pipeline.py).
        resumed / resumed_from: whether the attempt continues a checkpoint, and from where.
        record_id: the attempt's history record.
        inputs / outputs: what the attempt read (its readers, ``ctx.input()``) and wrote
            (``ctx.output()``), for lineage.
        gone: set when the attempt's connection was lost: what it ends with.
        final: the row as the attempt's end left it, once written.
        ended: True once the handler returned or raised: every later call of the context is refused.
    """

    def __init__(self, given: Given, held: Held, begun: Begun):
        self.given = given
        self.identity = given.identity
        self.session = held.session
        self.fence = held.fence
        self.record_id = begun.record_id
        self.resumed, self.resumed_from = begun.resumed, begun.resumed_from
        self.tally = Tally(begun.row)
        self.ctx = RunContext(self)
        self.keeper = LeaseKeeper(given.store, held.fence, lease_seconds=given.options.lease, signal=given.signal,
                                  interval=given.heartbeat)
        self.writer: CheckpointWriter = InlineWriter(given.store, held.session, held.fence, signal=given.signal,
                                                     tally=self.tally, lease=given.options.lease)
        self.inputs: list[Source] = []
        self.outputs: list[Source] = []
        self.gone: StoreUnavailable | None = None
        #: The stop a checkpoint raised to the handler (a cancel, a pause, a lost lease): a handler that
        #: catches it and returns has not done the rest of its work, so the attempt ends with it.
        self.stop_delivered: Cancelled | LeaseLost | None = None
        self.final: Checkpoint | None = None
        #: When the handler began (``max_runtime`` counts from it).
        self.started = time.monotonic()
        #: Set (under the lock) once the handler has returned or raised: the run context then
        #: refuses to write, whichever thread still holds it.
        self.ended = False
        self._lock = threading.Lock()
        #: The identity of the reader this attempt recorded or found on the row (see ``use_reader``).
        self._reader: dict[str, Any] | None = None
        #: The directions ("input", "output") past MAX_OUTPUTS in this attempt (warned of once each).
        self._declared_over: set[str] = set()

    # -- the attempt's own steps ----------------------------------------------------------------

    def pipeline(self) -> None:
        """With ``pipeline_checkpoints``, write the checkpoints on a second connection, which
        connects while the first chunk runs.

        Raises:
            StoreUnavailable: that connection could not be started.
        """
        if self.given.options.pipeline_checkpoints:
            given = self.given
            self.writer = checkpoint_writer(given.store, self.session, self.fence, signal=given.signal, tally=self.tally,
                                            lease=given.options.lease)

    def call(self, handler: Callable[[RunContext], Any]) -> Any:
        """Run the handler; once it returns or raises, its context can no longer write."""
        self.started = time.monotonic()
        try:
            result = handler(self.ctx)
            if inspect.iscoroutine(result):  # an async def handler: the same attempt, on a loop of its own
                result = drive(result, self.given.signal, self.given.log, job=self.job, slot=self.slot)
            return result
        finally:
            with self._lock:  # waits for a save another thread has under way
                self.ended = True
                self.session.end_loan()  # the handles of ctx.transaction() refuse from now on

    def flush(self, *, close: bool = False) -> None:
        """Wait for the pipelined checkpoint in flight, if any (raising its failure unless ``close``,
        which also closes the writer's connection)."""
        if close:
            self.writer.close()
        else:
            self.writer.flush()

    def quiesce(self) -> None:
        """Let a pipelined checkpoint in flight finish (a cancel keeps the last chunk; its lost
        lease shows on the signal), stop heartbeats and roll back the unfinished chunk. The keeper
        is asked to stop before the rollback and joined after it: on SQLite its connection may be
        waiting for the write lock this session holds."""
        self.flush(close=True)
        self.keeper.stop(join=False)
        try:
            self.session.rollback()  # a no-op on a lost connection (the server rolled it back)
        except Exception as exc:  # never in place of the error that stopped the attempt
            self.given.log.warning("could not roll back the unfinished chunk [job=%s slot=%s attempt=%s]\n%s", self.job,
                             self.slot, self.attempt, outward_traceback(exc))
        self.keeper.stop()

    # -- what the run context calls -------------------------------------------------------------

    def after_chunk(self, write: Write, state: dict[str, Any]) -> None:
        """The one step after a chunk (``ctx.checkpoint()``): save the checkpoint ``write`` (encoded
        by the context from the handler's ``state`` dict), record it in the tally, report progress
        when due (write before report), then stop at this boundary if the signal fired, or end the
        slice or wait as asked.

        The checkpoint's statement returns the stop request pending on the row (a pause, a cancel):
        one asked while the chunk ran stops the run here, at the first checkpoint written after it
        (pipelined, the checkpoint in flight is read at the next one).

        Raises:
            InvalidCheckpoint / LeaseLost / Cancelled / Paused: as :meth:`RunContext.checkpoint` lists them (the one list for this step).
        """
        self._save(write)
        self.tally.saved(write, state)
        self._report()
        try:
            self.given.signal.raise_if_cancelled()
            self._between_chunks()
        except (Cancelled, LeaseLost) as stop:  # Paused is a Cancelled
            self.stop_delivered = stop
            raise

    def _save(self, write: Write) -> None:
        """Write a checkpoint, fenced by the lease, and commit it with the handler's pending writes
        (or hand it to the pipelined writer). Serialized with the attempt's end: refused once the
        handler has returned (a kept ``ctx``, a thread). Raises AttemptEnded and LeaseLost as
        :meth:`RunContext.checkpoint` says."""
        with self._lock:
            if self.ended:
                raise self.given.ended_error("ctx.checkpoint()")
            if self.given.signal.reason == Reason.LEASE_LOST:
                self.session.rollback()
                # the cause, as the lease keeper found it (freed by a request, taken by attempt N, not renewed)
                why = f" ({self.given.signal.message})" if self.given.signal.message else ""
                raise LeaseLost(
                    f"this attempt lost its lease{why}; the checkpoint was not written", job=self.job, slot=self.slot
                )
            self.writer.submit(write)  # pipelined: returns at once; raises the previous write's failure

    def _report(self) -> None:
        """Report the last durable checkpoint (pipelined: what is committed, not what is in flight),
        when a report is due.

        The row reported is the row as stored (heartbeat and lease expiry move on the keeper's
        thread), read only then: most checkpoints of a fast loop report nothing.
        """
        tally = self.tally
        durable = tally.durable
        if durable is None:  # pipelined: the first checkpoint is still in flight
            return
        processed, total = durable.processed, durable.total
        if self.given.reporter.due(processed, total):
            stored = self.session.checkpoints.load(self.job, self.slot) or tally.row
            self.given.reporter.on_checkpoint(stored, tally.meter.measure(processed, total, save_seconds=tally.save_seconds))

    def _between_chunks(self) -> None:
        """After a durable checkpoint: end the time slice, or wait as the throttle asks.

        Raises:
            Paused: ``max_runtime`` ran out (``time_slice``), or the throttle asked for a wait of
                ``defer_after`` or more (``throttled``, until then).
            Cancelled: the signal fired during a short throttle wait.
            ConfigurationError: the throttle answered something that is not a wait.
        """
        options = self.given.options
        if options.max_runtime is not None and time.monotonic() - self.started >= options.max_runtime:
            raise Paused(
                Reason.TIME_SLICE.value,
                f"ran {time.monotonic() - self.started:.3g}s in one go (max_runtime={options.max_runtime:g}s): "
                "giving the worker back for a moment",
                until=utcnow(),
            )
        if options.throttle is None:
            return
        answer = options.throttle(self.ctx)
        try:
            wait = wait_seconds(answer)
        except ValueError as exc:
            raise ConfigurationError(
                f"throttle {getattr(options.throttle, '__qualname__', options.throttle)!r} answered {short(answer)}: "
                f"{exc}", job=self.job, slot=self.slot,
                hint="Return the seconds to wait before the next chunk (a number or a timedelta), or None for no "
                "wait; the checkpoint is kept",
            ) from None
        if wait is None:
            return
        if wait >= options.defer_after:
            raise Paused(Reason.THROTTLED.value, f"the throttle asked to wait {wait:g}s",
                         until=utcnow() + timedelta(seconds=wait))
        if self.given.signal.wait(wait):
            self.given.signal.raise_if_cancelled()

    def transaction(self) -> TransactionConnection:
        """The attempt's connection, lent to the handler (see :class:`TransactionConnection`).

        Raises:
            AttemptEnded: the handler already returned.
            ConfigurationError: the attempt pipelines its checkpoints, which commit on another
                connection than the handler's writes.
        """
        if self.ended:
            raise self.given.ended_error("ctx.transaction()")
        if self.given.options.pipeline_checkpoints:
            raise ConfigurationError(
                "ctx.transaction() cannot be used with pipeline_checkpoints=True: its writes commit with the "
                "checkpoint on the attempt's connection, while pipelined checkpoints commit on another one, "
                "during the next chunk",
                job=self.job,
                slot=self.slot,
                hint="Set pipeline_checkpoints=False to keep writes to the checkpoint database exactly once, or "
                "write to the sink on your own connection, idempotently, and commit before ctx.checkpoint()",
            )
        return self.session.lend(self.job, self.slot)

    def skip(self, item: Any, *, position: Any, error: BaseException, limit: int) -> int:
        """Record a skipped item (see :func:`airflow_resumable.core.attempt.skip_policy.skip_item`)."""
        if self.ended:
            raise self.given.ended_error("ctx.skip()")
        count = skip_item(self.session, job=self.job, slot=self.slot, attempt=self.attempt, item=item,
                          position=position, error=error, limit=limit, log=self.given.log)
        self.tally.skipped = count
        return count

    def declare(self, direction: str, source: Source) -> None:
        """Add ``source`` to this attempt's ``inputs`` or ``outputs`` (``direction``), once: what a
        reader reads (its first read in the attempt) and what ``ctx.input()``/``ctx.output()`` name.
        Past :data:`~airflow_resumable.core.model.observe.MAX_OUTPUTS` of a direction, the others are left
        out of the lineage events, with one warning in the attempt: lineage never fails a task."""
        declared = self.inputs if direction == "input" else self.outputs
        if source in declared:
            return
        if len(declared) >= MAX_OUTPUTS:
            if direction not in self._declared_over:
                self._declared_over.add(direction)
                self.given.log.warning(
                    "lineage: more than %s different %ss were declared in this attempt; the others (%s %s, ...) are "
                    "left out of its lineage events. Name the tables or files the handler reads or writes (a prefix "
                    "for many files), not each row or object [job=%s slot=%s]", MAX_OUTPUTS, direction, source.kind,
                    outward_text(source.name, 80), self.job, self.slot)
            return
        declared.append(source)

    def previous_run(self) -> Checkpoint | None:
        """``ctx.previous``, read when the handler first asks: most handlers never do, and then
        the attempt sends no statement for it. Inside the handler's open transaction it is read in
        that transaction (a commit here would commit the handler's pending writes).

        Raises:
            AttemptEnded: the handler already returned.
        """
        with self._lock:  # the session is the checkpoints' too (a handler's other thread)
            if self.ended:
                raise self.given.ended_error("ctx.previous")
            session = self.session
            return session.listings.previous(self.job, self.slot, by_time=self.given.scheduled_at is not None,
                                             commit=session.autocommit)

    def use_reader(self, identity: dict[str, Any]) -> None:
        """Record the reader whose positions the slot's checkpoint holds (once per attempt, one
        fenced write when the row names none or, without progress, another), or refuse another
        reader's checkpoint (see :meth:`RunContext.use_reader`).

        Raises:
            ReaderChanged: the row holds progress of a reader with another identity, or this
                attempt already reads with another one.
            InvalidCheckpoint: the identity is not plain JSON.
            AttemptEnded / LeaseLost: nothing was written.
        """
        text = encode(identity, what="reader identity", job=self.job, slot=self.slot)
        current = json.loads(text)
        with self._lock:
            if self.ended:
                raise self.given.ended_error("ctx.use_reader()")
            if self._reader is not None:
                if self._reader == current:
                    return
                raise ReaderChanged(
                    f"this attempt reads with {short(self._reader, 300)} already; a second reader, {short(current, 300)}, "
                    "would move the same checkpoint through positions of another source", job=self.job, slot=self.slot,
                    stored=self._reader, current=current,
                    hint="Read the second source from a position of your own (reader.chunks(ctx, n, after=...)), or in "
                    "a task of its own", )
            row = self.tally.row
            stored = row.reader
            if stored == current:
                self._reader = current
                return
            progress = row.position is not None or row.processed > 0
            if stored is not None and progress:
                raise reader_changed(self.job, self.slot, row.position, row.processed, stored, current)
            self.session.checkpoints.set_reader(self.fence, text)
            self.tally.reader_recorded(current)
            self._reader = current
        if stored is not None:
            self.given.log.warning("the slot's row named another reader (%s) but holds no progress: it now names this task's "
                             "[job=%s slot=%s]", differences(stored, current), self.job, self.slot)
        elif progress:
            self.given.log.info("the slot's checkpoint names no reader (written before this release): it now names %s "
                          "[job=%s slot=%s]", short(current, 300), self.job, self.slot)


    def answer_split(self, identity: dict[str, Any] | None, total: int | None,
                     agree: Callable[[Any], None] | None) -> None:
        """:meth:`RunContext.answer_split`: after the checkpoint in flight (pipelined) is durable,
        one transaction on the attempt's session; the attempt's reader and total follow.

        On a session lent to the handler (``ctx.transaction()``) that transaction is the chunk's,
        which the run must not roll back (a rollback there ends the attempt, ``Loan.lost``): a
        refusal undoes only the answer's own writes (a savepoint), and the rest commits as a
        checkpoint's does (right after a checkpoint, as the chunk loop answers, nothing else is
        pending)."""
        text = None if identity is None else encode(identity, what="reader identity", job=self.job, slot=self.slot)
        session = self.session

        asker = self.tally.split_asked

        def answer() -> None:
            if agree is not None:
                agree(session)
            if not session.checkpoints.answer_split(self.fence, asker=asker, reader=text, total=total):
                raise SplitWithdrawn(f"the split asked by {short(asker, 120)} was withdrawn before it was agreed; "
                                     "nothing was written", job=self.job, slot=self.slot)

        with self._lock:
            if self.ended:
                raise self.given.ended_error("ctx.answer_split()")
            self.writer.flush()
            if session.autocommit:
                with session.transaction():
                    answer()
            else:
                refused: Exception | None = None
                with session.transaction():
                    try:
                        with session.savepoint(job=self.job, slot=self.slot):
                            answer()
                    except LeaseLost:
                        raise
                    except Exception as exc:
                        refused = exc
                if refused is not None:
                    raise refused
            self.tally.split_asked = None
            if text is not None:
                self._reader = json.loads(text)
                self.tally.reader_recorded(self._reader)
            if total is not None:
                self.tally.total = total


class InlineWriter(CheckpointWriter):
    """Writes each checkpoint at once on the attempt's own connection, committing with it whatever
    the handler wrote there (``ctx.transaction()``): nothing is ever in flight."""

    def __init__(self, store: Store, session: StoreSession, fence: Fence, *, signal: Signal, tally: Tally,
                 lease: float | None):
        super().__init__(store, fence, signal=signal, tally=tally, lease=lease)
        self._session = session

    def submit(self, write: Write) -> None:
        began = time.perf_counter()
        answer = self._session.checkpoints.save(self.fence, write, self.lease)
        tally = self.tally
        tally.save_seconds = time.perf_counter() - began
        tally.durable = write
        tally.split_asked = answer.split
        if answer.stop:
            self._stop_asked(answer.stop)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None

    def _stop_asked(self, request: str) -> None:
        """A stop request came back with the checkpoint: raise the signal as the lease keeper does,
        naming who asked (one read, now only). The attempt's connection reads it unless it is lent
        to the handler (its next chunk's transaction is open there): then a connection of its own."""
        if self.signal.cancelled:
            return
        if self._session.autocommit:
            raise_request(self.signal, self._session, self.fence, request)
            return
        try:
            with self.store.open(autocommit=True) as session:
                raise_request(self.signal, session, self.fence, request)
        except Exception:  # who asked is a courtesy: the stop itself must not wait on it
            raise_request(self.signal, None, self.fence, request)


_PARTITION = re.compile(r"\[\d+\]$")


def reader_changed(job: str, slot: str, position: Any, processed: int, stored: Any, current: Any) -> ReaderChanged:
    """The refusal of a checkpoint written with another reader: both identities, how they differ,
    and the choices (put the reader back, or start the slot, or its partitioned job, over)."""
    hint = (f"Put the reader back as it was, then Clear the task: it resumes from its checkpoint. Or start the slot "
            f"over on purpose with this reader: `airflow resumable restart '{job}' '{slot}'` (or restart=True, or the "
            "run's conf {\"resumable_restart\": true}), then Clear the task")
    if _PARTITION.search(job) and isinstance(current, dict) and "range" in current:
        base = _PARTITION.sub("", job)
        hint += (f". A partition's range is a range of the plan's reader: when the key or the source changed, "
                 f"restart the whole job instead: `airflow resumable restart '{base}#plan' '{slot}'`, then Clear the "
                 "job's tasks in that run (its plan is split anew and every partition starts over)")
    return ReaderChanged(
        f"the slot's checkpoint holds positions of another reader than this task's ({differences(stored, current)}): "
        f"written with {short(stored, 300)}, while this task reads with {short(current, 300)}. Its position "
        f"{short(position, 60)} ({processed} processed) is a position of the first; read with the second it would skip "
        "or repeat items, so nothing was read", job=job, slot=slot, stored=stored, current=current, hint=hint)


Handler = Callable[[RunContext], Any]
