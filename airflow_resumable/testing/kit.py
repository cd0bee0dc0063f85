"""Prove a handler resumable: run it interrupted at every chunk boundary, by every kind of
interruption the product knows, and compare each interrupted run with an uninterrupted one.

A handler is resumable when an attempt that stops anywhere, and the attempts after it, give what
one uninterrupted attempt gives: the same returned value, the same final state on the row, and
the same data in the user's sink. Chunks must be idempotent (a crash repeats the unfinished one),
and the position and the state must describe everything done before them.

:func:`check_resumable` runs the handler once without interruption (the reference), then once per
(interruption, boundary): on a fresh checkpoint store, with the user's sink reset, interrupted at
that ``ctx.checkpoint()`` and resumed by further attempts until the slot is ``done``. It returns a
:class:`Report`; :meth:`Report.assert_ok` raises :class:`NotResumable` naming the first trial that
differs: the interruption, the chunk, the position and the difference.

The attempts are the product's own (:class:`~airflow_resumable.core.runner.Attempt`, the loop every
operator runs); an interruption is injected at the one step after a chunk, where a real one is
noticed. No Airflow is needed (see :mod:`airflow_resumable.testing.plugin` for a ``dag.test()``
of a DAG's task with interruptions).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import random
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from airflow_resumable.core import control
from airflow_resumable.core.chunked import chunk_loop
from airflow_resumable.core.errors import Cancelled, LeaseLost, Paused
from airflow_resumable.core.options import Options
from airflow_resumable.core.partitions import Plan, range_chunks, split
from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.runner import Attempt, Outcome
from airflow_resumable.core.signal import Reason
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from airflow_resumable.core.tables import ATTEMPTS, CHECKPOINTS, DEAD_LETTERS

__all__ = [
    "ALL_INTERRUPTIONS", "Interruption", "NotResumable", "PartitionedReport", "Report", "SimulatedCrash", "Trial",
    "check_chunked", "check_partitioned", "check_resumable", "expire_lease", "interrupted_attempt", "store_of",
]

JOB = "test_kit.handler"
SLOT = "2026-01-01T00:00:00+00:00"


class Interruption(enum.StrEnum):
    """Where and how an attempt stops short, as it does in production."""

    #: The worker dies inside ``ctx.checkpoint()``, before the checkpoint is written: the chunk's
    #: uncommitted writes are lost, the lease lapses, the next attempt repeats the chunk.
    CRASH_BEFORE_CHECKPOINT = "crash_before_checkpoint"
    #: The worker dies right after the checkpoint committed, before the handler goes on.
    CRASH_AFTER_CHECKPOINT = "crash_after_checkpoint"
    #: A person cancels (mark failed, ``control.cancel``): the attempt stops at this boundary.
    CANCEL = "cancel"
    #: The cooperative ``timeout`` runs out at this boundary.
    TIMEOUT = "timeout"
    #: Another attempt takes the slot over (a lease lapsed under a stalled worker): this checkpoint
    #: is fenced out and nothing of its chunk is committed.
    LEASE_LOST = "lease_lost"
    #: Paused at this boundary (the task defers), then resumed in the same try.
    PAUSE_RESUME = "pause_resume"
    #: With ``pipeline_checkpoints=True``: this checkpoint is still in flight when the worker dies
    #: during the next chunk, and is lost; the next attempt resumes from the one before.
    PIPELINED_WRITE_LOST = "pipelined_write_lost"


#: Every kind, in the order trials run.
ALL_INTERRUPTIONS: tuple[Interruption, ...] = tuple(Interruption)


class SimulatedCrash(BaseException):
    """The worker died (raised by the kit, never by the product). A ``BaseException``, as a real
    death cannot be caught by the handler's ``except Exception``."""


class NotResumable(AssertionError):
    """An interrupted run gave something else than the uninterrupted one."""


@dataclasses.dataclass
class Trial:
    """One interrupted run: ``interruption`` at the ``point``-th ``ctx.checkpoint()``."""

    interruption: Interruption
    point: int
    #: The position the handler was checkpointing when the interruption struck.
    position: Any = None
    attempts: int = 0
    result: Any = None
    state: Any = None
    snapshot: Any = None
    #: What differs from the reference, one sentence each; empty when the run agreed.
    differences: list[str] = dataclasses.field(default_factory=list)
    #: False when the interruption's point was never reached (the run had fewer checkpoints).
    struck: bool = False

    def describe(self) -> str:
        where = f"{self.interruption.value} at checkpoint {self.point} (position {self.position!r})"
        return f"{where}: " + "; ".join(self.differences) if self.differences else f"{where}: same"


@dataclasses.dataclass
class Report:
    """What :func:`check_resumable` found."""

    name: str
    checkpoints: int
    positions: list[Any]
    result: Any
    state: Any
    snapshot: Any
    trials: list[Trial]

    @property
    def failures(self) -> list[Trial]:
        return [t for t in self.trials if t.differences]

    @property
    def ok(self) -> bool:
        return not self.failures

    def assert_ok(self) -> Report:
        """Raise :class:`NotResumable` naming the first trial that differs (and how many did)."""
        if self.checkpoints == 0:
            raise NotResumable(
                f"{self.name} made no checkpoint in an uninterrupted run: an interrupted attempt has nothing to "
                "resume from and starts over. Call ctx.checkpoint(position) after each chunk (or give "
                "ChunkedOperator's read a source with items)")
        failures = self.failures
        if failures:
            first = failures[0]
            raise NotResumable(
                f"{self.name} is not resumable: {first.describe()} "
                f"({len(failures)} of {len(self.trials)} interrupted runs differ from the uninterrupted one, "
                f"which made {self.checkpoints} checkpoints). Make each chunk idempotent, or write it through "
                "ctx.transaction() so it commits with its checkpoint, and keep in the position and ctx.state "
                "everything the next chunk needs"
            )
        return self

    def summary(self) -> str:
        by_kind: dict[Interruption, list[Trial]] = {}
        for t in self.trials:
            by_kind.setdefault(t.interruption, []).append(t)
        lines = [f"{self.name}: {self.checkpoints} checkpoints, {len(self.trials)} interrupted runs"]
        for kind, trials in by_kind.items():
            bad = [t.point for t in trials if t.differences]
            lines.append(f"  {kind.value}: {len(trials)} runs, " + (f"differ at {bad}" if bad else "all the same"))
        return "\n".join(lines)


# -- the interrupted attempt ----------------------------------------------------------------------


@dataclasses.dataclass
class _Plan:
    """The interruption of one trial, shared by its attempts (checkpoint calls count across them)."""

    kind: Interruption | None
    point: int
    calls: int = 0
    struck_at: Any = None
    struck: bool = False
    crash_next: bool = False
    positions: list[Any] = dataclasses.field(default_factory=list)


def expire_lease(store: Store, job: str, slot: str) -> None:
    """Let the slot's lease lapse now, as it does after its holder died: the next attempt takes
    the slot at once instead of waiting out the lease."""
    d = store.dialect
    with store.open(autocommit=True) as s:
        s.execute(f"UPDATE {CHECKPOINTS.name} SET lease_expires_at = {d.now_plus('%(back)s')} "
                  "WHERE job = %(job)s AND slot = %(slot)s AND lease_owner IS NOT NULL",
                  {"back": -3600.0, "job": job, "slot": slot})


def _take_over(session: Any) -> None:
    """Another attempt takes the slot's lease (a new token), so that this attempt's checkpoint is
    fenced out. Written on the attempt's own connection: on SQLite a taker would wait for the
    chunk's transaction, which commits only with the checkpoint. Inside that transaction the
    take-over is rolled back with the chunk (the lease is then expired as a dead taker's would be);
    outside one it stays, with a lapsed lease."""
    d = session.d
    session.execute(f"UPDATE {CHECKPOINTS.name} SET lease_token = lease_token + 1, lease_owner = 'test-kit-taker', "
                    f"lease_expires_at = {d.now_plus('%(back)s')} WHERE job = %(job)s AND slot = %(slot)s",
                    {"back": -3600.0, "job": JOB, "slot": SLOT})


def interrupted_attempt(plan: _Plan, base: type[Attempt] = Attempt) -> type[Attempt]:
    """An :class:`Attempt` class that strikes ``plan``'s interruption at its point."""

    class InterruptedAttempt(base):  # type: ignore[misc, valid-type]
        def after_chunk(self, position: str, state_json: str, state: dict[str, Any], processed: int,
                        total: int | None) -> None:
            if plan.crash_next:  # the checkpoint dropped in flight is followed by the worker's death
                plan.crash_next = False
                raise SimulatedCrash(f"the worker died during the chunk after checkpoint {plan.point}")
            plan.calls += 1
            plan.positions.append(json.loads(position))
            if plan.kind is None or plan.calls != plan.point or plan.struck:
                return super().after_chunk(position, state_json, state, processed, total)
            plan.struck, plan.struck_at = True, json.loads(position)
            kind = plan.kind
            if kind is Interruption.CRASH_BEFORE_CHECKPOINT:
                raise SimulatedCrash(f"the worker died before checkpoint {plan.point}")
            if kind is Interruption.PIPELINED_WRITE_LOST:
                if not self.options.pipeline_checkpoints:  # nothing in flight: the same as a crash before it
                    raise SimulatedCrash(f"the worker died before checkpoint {plan.point}")
                plan.crash_next = True  # this write never commits; the handler goes on with the next chunk
                return None
            if kind is Interruption.CANCEL:
                self.signal.cancel(Reason.USER, "cancelled by the test kit")
            elif kind is Interruption.TIMEOUT:
                self.signal.cancel(Reason.TIMEOUT, "the test kit's timeout ran out")
            elif kind is Interruption.LEASE_LOST:
                self._flush()  # a pipelined checkpoint in flight lands first, as it would
                _take_over(self._session)
            elif kind is Interruption.PAUSE_RESUME:  # as the lease keeper does when it finds a pause request
                self.signal.cancel(Reason.PAUSED, "paused by the test kit")
            super().after_chunk(position, state_json, state, processed, total)
            if kind is Interruption.CRASH_AFTER_CHECKPOINT:
                self._flush()  # the checkpoint is durable, then the worker dies
                raise SimulatedCrash(f"the worker died after checkpoint {plan.point}")
            return None

        def _call(self, handler: Callable[..., Any], ctx: Any) -> Any:
            result = super()._call(handler, ctx)
            if plan.crash_next:  # the last checkpoint was the one dropped in flight
                plan.crash_next = False
                raise SimulatedCrash(f"the worker died before the run's end, checkpoint {plan.point} in flight")
            return result

        def _stopped(self, session: Any, exc: BaseException) -> None:
            if isinstance(exc, SimulatedCrash):
                # A dead worker records nothing: the row stays `running` under its lease, which lapses.
                session.rollback()
                expire_lease(self.store, self.job, self.slot)
                return
            super()._stopped(session, exc)

    InterruptedAttempt.__qualname__ = InterruptedAttempt.__name__ = f"Interrupted{base.__name__}"
    return InterruptedAttempt


# -- running the trials ---------------------------------------------------------------------------


def _forget(store: Store) -> None:
    """Delete the kit's slot (its row, history and skipped items) from ``store``."""
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        for table in (CHECKPOINTS, ATTEMPTS, DEAD_LETTERS):
            s.execute(f"DELETE FROM {table.name} WHERE job = %(job)s AND slot = %(slot)s", {"job": JOB, "slot": SLOT})


def _call_with_store(fn: Callable[..., Any] | None, store: Store) -> Any:
    """``fn(store)`` when ``fn`` takes an argument, else ``fn()`` (a builtin such as ``list.clear``)."""
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn()
    takes = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
    return fn(store) if takes else fn()


def _run_to_the_end(handler: Callable[..., Any], store: Store, plan: _Plan, options: Options,
                    max_attempts: int) -> tuple[Outcome, int]:
    cls = interrupted_attempt(plan)
    attempt = 1
    for n in range(1, max_attempts + 1):
        try:
            outcome = cls(store, job=JOB, slot=SLOT, attempt=attempt, owner=f"test-kit/try{attempt}/{n}",
                          options=options).run(handler)
            return outcome, n
        except SimulatedCrash:
            attempt += 1  # Airflow's next try, once the dead one was noticed
        except LeaseLost:
            expire_lease(store, JOB, SLOT)  # the taker is gone too: its lease lapses
            attempt += 1
        except Cancelled:
            attempt += 1  # a retry or a Clear
        except Paused:
            control.resume(store, JOB, SLOT, by="test kit")  # the same try continues
    raise NotResumable(f"the run did not finish in {max_attempts} attempts after {plan.kind} at checkpoint "
                       f"{plan.point}")


def _differences(label: str, expected: Any, got: Any) -> list[str]:
    if expected == got:
        return []
    if isinstance(expected, dict) and isinstance(got, dict):
        keys = sorted(set(expected) | set(got), key=str)
        diff = [f"{k!r}: expected {expected.get(k, '<missing>')!r}, got {got.get(k, '<missing>')!r}"
                for k in keys if expected.get(k, object()) != got.get(k, object())]
        return [f"{label} differs ({'; '.join(diff[:5])}{' ...' if len(diff) > 5 else ''})"]
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(expected) != len(got):
            extra = [x for x in got if x not in expected][:3]
            missing = [x for x in expected if x not in got][:3]
            repeated = sorted({repr(x) for x in got if list(got).count(x) > list(expected).count(x)})[:3]
            parts = [f"{len(got)} items instead of {len(expected)}"]
            if repeated:
                parts.append(f"repeated: {', '.join(repeated)}")
            if missing:
                parts.append(f"missing: {missing!r}")
            if extra:
                parts.append(f"unexpected: {extra!r}")
            return [f"{label} differs ({'; '.join(parts)})"]
        i = next(i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b)
        return [f"{label} differs at index {i}: expected {expected[i]!r}, got {got[i]!r}"]
    return [f"{label} differs: expected {expected!r}, got {got!r}"]


def _points(n: int, points: str | Iterable[int], seed: int | None, samples: int | None) -> list[int]:
    if points == "every":
        chosen = list(range(1, n + 1))
    elif isinstance(points, str):
        raise ValueError(f"points must be 'every' or checkpoint numbers (1..{n}), got {points!r}")
    else:
        chosen = sorted({int(p) for p in points})
        bad = [p for p in chosen if not 1 <= p <= n]
        if bad:
            raise ValueError(f"points {bad} are outside the run's checkpoints 1..{n}")
    if samples is not None:
        rng = random.Random(seed)
        chosen = sorted(rng.sample(chosen, min(samples, len(chosen))))
    return chosen


def check_resumable(
    handler: Callable[..., Any],
    *,
    snapshot: Callable[..., Any] | None = None,
    reset: Callable[..., Any] | None = None,
    interruptions: Sequence[Interruption | str] = ALL_INTERRUPTIONS,
    points: str | Iterable[int] = "every",
    seed: int | None = None,
    samples: int | None = None,
    store: Callable[[Path], Store] | Store | str | None = None,
    options: Options | None = None,
    max_attempts: int = 20,
    name: str | None = None,
    compare_result: bool = True,
) -> Report:
    """Run ``handler(ctx)`` uninterrupted, then interrupted at each chosen checkpoint by each kind
    in ``interruptions``, resuming until done; compare result, final state and ``snapshot``.

    Args:
        handler: a ``ResumableOperator`` handler (``def handler(ctx)``); for a ``ChunkedOperator``'s
            ``read``/``process`` use :func:`check_chunked`.
        snapshot: what the handler wrote, to compare (e.g. the rows of the sink table, sorted);
            called after each run, with the run's checkpoint store if it takes an argument (a sink
            written through ``ctx.transaction()`` lives there).
        reset: empties the user's sink before each run (same calling convention). Each run gets a
            fresh checkpoint store of its own.
        interruptions: the kinds to try (:class:`Interruption` or their names).
        points: ``"every"`` checkpoint of the reference run, or the checkpoint numbers (1-based).
        seed: the random seed that chooses the ``samples`` points (the same seed, the same points).
        samples: try only this many of the points, chosen at random.
        store: the checkpoint store of every run: a :class:`Store`, a URL
            (``postgresql://user@host:5432/db``, ``sqlite:////abs/path.db``, see :func:`store_of`)
            or ``store(directory)`` giving the store of one run (default: a new embedded SQLite file
            in ``directory``). A store shared by the runs (a PostgreSQL database the sink lives in)
            is fine: the kit deletes its own slot before each run, and ``reset`` empties the sink.
            Give each test session running at once a database (or schema) of its own: the kit's
            slot has one name.
        options: the attempt's options (e.g. ``Options(pipeline_checkpoints=True)``).
        max_attempts: a run that does not finish in this many attempts is a failure.
        name: how the report names the handler (default: its qualified name).
        compare_result: False compares only the final state and the snapshot (for a return value
            that describes the last attempt, such as the chunk loop's chunk count).

    Returns:
        The :class:`Report`; call :meth:`Report.assert_ok` in a test.
    """
    kinds = [Interruption(k) for k in interruptions]
    options = options or Options()
    label = name or getattr(handler, "__qualname__", None) or repr(handler)
    make_store = _store_factory(store)
    with tempfile.TemporaryDirectory(prefix="resumable-kit-") as tmp:
        root = Path(tmp)

        def fresh(tag: str) -> Store:
            directory = root / tag
            directory.mkdir()
            made = make_store(directory)
            _forget(made)  # a factory may give the same store every time: each run starts with no row
            return made

        ref_store = fresh("reference")
        _call_with_store(reset, ref_store)
        plan = _Plan(kind=None, point=0)
        outcome, _ = _run_to_the_end(handler, ref_store, plan, options, max_attempts)
        reference = (outcome.result, outcome.checkpoint.state, _call_with_store(snapshot, ref_store))
        report = Report(name=label, checkpoints=plan.calls, positions=list(plan.positions), result=reference[0],
                        state=reference[1], snapshot=reference[2], trials=[])
        if plan.calls == 0:
            return report
        chosen = _points(plan.calls, points, seed, samples)
        for kind in kinds:
            for point in chosen:
                trial_store = fresh(f"{kind.value}-{point}")
                _call_with_store(reset, trial_store)
                trial_plan = _Plan(kind=kind, point=point)
                trial = Trial(interruption=kind, point=point)
                try:
                    outcome, trial.attempts = _run_to_the_end(handler, trial_store, trial_plan, options, max_attempts)
                except NotResumable as exc:
                    trial.differences.append(str(exc))
                except Exception as exc:  # the resumed run failed where the reference did not
                    trial.differences.append(f"the resumed run failed: {type(exc).__name__}: {exc}")
                else:
                    trial.result, trial.state = outcome.result, outcome.checkpoint.state
                    trial.snapshot = _call_with_store(snapshot, trial_store)
                    if compare_result:
                        trial.differences += _differences("the result", reference[0], trial.result)
                    trial.differences += _differences("the final state", reference[1], trial.state)
                    trial.differences += _differences("the sink's snapshot", reference[2], trial.snapshot)
                trial.position, trial.struck = trial_plan.struck_at, trial_plan.struck
                report.trials.append(trial)
        return report


def store_of(url: str) -> Store:
    """The checkpoint store a URL names: ``sqlite:////absolute/path.db`` or a libpq URI
    (``postgresql://user@host:5432/db``, ``?options=-csearch_path%3Dkit`` for a schema of its own).

    Raises:
        ValueError: any other URL.
    """
    if url.startswith("sqlite:///"):
        return SQLiteStore(url[len("sqlite:///"):])
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore.from_dsn(url.replace("postgres://", "postgresql://", 1))
    raise ValueError(f"a checkpoint store's URL is sqlite:////absolute/path.db or postgresql://user@host:5432/db, "
                     f"got {url.split(':', 1)[0]}:...")


def _store_factory(store: Callable[[Path], Store] | Store | str | None) -> Callable[[Path], Store]:
    if store is None:
        return lambda directory: SQLiteStore(directory / "checkpoints.db")
    if isinstance(store, str):
        store = store_of(store)
    if isinstance(store, Store):
        shared = store
        return lambda directory: shared
    return store


def check_chunked(read: Any, process: Any, *, chunk_size: int, chunked: dict[str, Any] | None = None,
                  **kwargs: Any) -> Report:
    """:func:`check_resumable` for a ``ChunkedOperator``'s ``read``/``process`` (and its other
    arguments in ``chunked``: ``position``, ``total``, ``start``, ``skip_on``, ...), run by the
    operator's own chunk loop. The loop's return value counts the chunks and skips of the *last*
    attempt, so it is not compared: the final state and the snapshot are."""
    handler = chunk_loop(read, process, chunk_size=chunk_size, **(chunked or {}))
    kwargs.setdefault("compare_result", False)
    kwargs.setdefault("name", f"read={getattr(read, '__qualname__', type(read).__name__)}, "
                              f"process={getattr(process, '__qualname__', type(process).__name__)}")
    return check_resumable(handler, **kwargs)



# -- a partitioned job ----------------------------------------------------------------------------


@dataclasses.dataclass
class PartitionedReport:
    """What :func:`check_partitioned` found: the job's plan and one :class:`Report` per partition
    checked (by the partition's index)."""

    name: str
    plan: Plan
    reports: dict[int, Report]
    #: The partitions whose range holds no row (nothing to interrupt: not checked).
    empty: list[int]

    @property
    def failures(self) -> list[tuple[int, Trial]]:
        return [(i, t) for i, r in self.reports.items() for t in r.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    def assert_ok(self) -> PartitionedReport:
        """Raise :class:`NotResumable` naming the first partition that is not resumable."""
        for index, report in self.reports.items():
            try:
                report.assert_ok()
            except NotResumable as exc:
                raise NotResumable(f"partition {index} of {self.plan.partitions}: {exc}") from None
        return self

    def summary(self) -> str:
        lines = [f"{self.name}: {self.plan.rows} rows in {self.plan.partitions} partitions, "
                 f"{len(self.reports)} checked" + (f", {self.empty} empty" if self.empty else "")]
        for report in self.reports.values():
            lines += ["  " + line for line in report.summary().splitlines()]
        return "\n".join(lines)


def check_partitioned(read: KeysetReader, process: Any, *, partitions: int, chunk_size: int,
                      only: Iterable[int] | None = None, chunked: dict[str, Any] | None = None,
                      **kwargs: Any) -> PartitionedReport:
    """:func:`check_chunked` for a partitioned job (``partitioned(...)``,
    ``@task.resumable.partitioned``): split ``read``'s key into ``partitions`` ranges as the planning
    task does when a run first starts (counted by the source's database now), then check each
    partition, or those in ``only``, as its task runs it: ``process`` over the keys of its range,
    from the key after which it starts, interrupted at each of its checkpoints by each kind.

    Every trial of a partition reads the same range, as every try and Clear of a partition does.
    The sink is the whole of ``snapshot``: ``reset`` empties it before each run, so each
    partition's runs are compared with that partition's uninterrupted run. ``kwargs`` are
    :func:`check_resumable`'s (``snapshot``, ``reset``, ``interruptions``, ``points``, ``store``...).
    """
    label = kwargs.pop("name", None) or f"read={read.name}, process={getattr(process, '__qualname__', process)!s}"
    plan = split(read, partitions, job=label)
    wanted = None if only is None else {int(i) for i in only}
    reports: dict[int, Report] = {}
    empty: list[int] = []
    for rng in plan.ranges():
        if wanted is not None and rng.index not in wanted:
            continue
        if rng.empty:
            empty.append(rng.index)
            continue
        options = dict(chunked or {})
        args = range_chunks(read, rng, total=options.pop("total", None))
        reports[rng.index] = check_chunked(args.pop("read"), process, chunk_size=chunk_size,
                                           chunked={**options, **args},
                                           name=f"{label} (partition {rng.index} of {plan.partitions})", **kwargs)
    return PartitionedReport(name=label, plan=plan, reports=reports, empty=empty)
