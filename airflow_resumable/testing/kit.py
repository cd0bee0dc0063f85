"""Prove a handler resumable: run it interrupted at chunk boundaries, by every kind of
interruption the product knows, and compare each interrupted run with an uninterrupted one.

A handler is resumable when an attempt that stops anywhere, and the attempts after it, give what
one uninterrupted attempt gives: the same returned value, the same final state on the row, and
the same data in the user's sink. Chunks must be idempotent (a crash repeats the unfinished one),
and the position and the state must describe everything done before them.

:func:`check_resumable` runs the handler once without interruption (the reference), then once per
(interruption, checkpoint): on a fresh checkpoint store, with the user's sink reset, interrupted at
that ``ctx.checkpoint()`` and resumed by further attempts until the slot is ``done``. It returns a
:class:`Report`; :meth:`Report.assert_ok` raises :class:`NotResumable` naming the first trial that
differs: the interruption, the chunk, the position and the difference.

The attempts are the product's own (:class:`~airflow_resumable.core.attempt.runner.Attempt`, the loop every
operator runs); an interruption is injected at the one step after a chunk, where a real one is
noticed. Every kind but ``process_death`` runs in the test's process; ``process_death`` kills a
process of its own and resumes in a new one (:mod:`airflow_resumable.testing.fresh`). No Airflow
is needed (see :mod:`airflow_resumable.testing.plugin` for a ``dag.test()`` of a DAG's task with
interruptions).

What it costs: each trial runs the whole job once (plus the chunk or two an interruption
repeats), so a check runs about ``kinds x points x chunks`` chunks. ``points="auto"`` (the
default) interrupts every checkpoint up to :data:`EVERY_UP_TO` of them, and above that a sample of
:data:`SAMPLES` (the first, the last and others chosen by a seed the report names), so the cost
grows with the job's length, not with its square.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import random
import shutil
import signal
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from airflow_resumable.core.model.options import Options
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS, DEAD_LETTERS
from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from airflow_resumable.core.work.chunk_loop import chunk_loop
from airflow_resumable.core.work.partitions import Plan, Range, range_chunks, split
from airflow_resumable.testing import splits
from airflow_resumable.testing.fresh import (
    FreshProcesses,
    NotImportable,
    handler_payload,
    refuse_in_child,
    store_payload,
)
from airflow_resumable.testing.interrupt import (
    ALL_INTERRUPTIONS,
    IN_PROCESS_INTERRUPTIONS,
    JOB,
    SLOT,
    Interruption,
    NotResumable,
    SimulatedCrash,
    _Plan,
    expire_lease,
    interrupted_attempt,
    run_to_the_end,
)
from airflow_resumable.testing.report import Report, Trial, differences

__all__ = [
    "ALL_INTERRUPTIONS", "EVERY_UP_TO", "IN_PROCESS_INTERRUPTIONS", "SAMPLES", "ChunkLoop", "Interruption",
    "NotImportable", "NotResumable", "PartitionedReport", "Report", "SimulatedCrash", "Trial", "check_chunked",
    "check_partitioned", "check_resumable", "expire_lease", "interrupted_attempt", "store_of",
]

#: ``points="auto"`` interrupts every checkpoint of a run that makes at most this many.
EVERY_UP_TO = 12
#: ``points="auto"`` interrupts this many checkpoints of a longer run: the first, the last and
#: others chosen at random by the seed.
SAMPLES = 12
#: The environment variable that gives the seed when ``seed=`` is not given (to replay a sample).
SEED_VARIABLE = "RESUMABLE_KIT_SEED"

#: A sink's snapshot that could not be taken before a run (e.g. its table does not exist yet).
_UNREADABLE = object()

_IN_MEMORY = ("the sink's snapshot after a run in a new process is what it was before the run, while the "
              "uninterrupted run in this process changed it: the sink lives in this test's memory (a list, a dict), "
              "which an attempt in another process cannot write to, as a worker's writes to its own memory are "
              "lost with it. Give the kit a sink outside the process (a table, a file), or leave this kind out: "
              "interruptions=IN_PROCESS_INTERRUPTIONS")
_PROCESS_STATE = ("An uninterrupted run in a new process, the handler imported anew, gives another outcome than the "
                  "same run in this process: the handler depends on something this process holds and a new one "
                  "does not (a module attribute the test set or patched, progress kept in memory by an earlier run, "
                  "a cache). A worker imports your code anew as a new process does: give the handler what it needs "
                  "through its arguments, the environment or files, and keep its progress in ctx.state")


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


def _before_run(reset: Callable[..., Any] | None, snapshot: Callable[..., Any] | None, store: Store) -> Any:
    """Reset the sink, then take its snapshot as the run finds it (:data:`_UNREADABLE` when the
    snapshot cannot be taken yet, e.g. the table the handler creates does not exist)."""
    _call_with_store(reset, store)
    if snapshot is None:
        return None
    try:
        return _call_with_store(snapshot, store)
    except Exception:
        return _UNREADABLE


def _points(n: int, points: str | Iterable[int], seed: int | None, samples: int | None) -> tuple[list[int], int | None]:
    """The checkpoints to interrupt, and the seed that sampled them (None: no sample)."""
    if points in ("every", "auto"):
        chosen = list(range(1, n + 1))
        if points == "auto" and samples is None and n > EVERY_UP_TO:
            samples = SAMPLES
    elif isinstance(points, str):
        raise ValueError(f"points must be 'auto', 'every' or checkpoint numbers (1..{n}), got {points!r}")
    else:
        chosen = sorted({int(p) for p in points})
        bad = [p for p in chosen if not 1 <= p <= n]
        if bad:
            raise ValueError(f"points {bad} are outside the run's checkpoints 1..{n}")
    if samples is None or samples >= len(chosen):
        return chosen, None
    if seed is None:
        given = os.environ.get(SEED_VARIABLE, "").strip()
        seed = int(given) if given else random.SystemRandom().randrange(1, 2**31)
    ends = sorted({chosen[0], chosen[-1]})[:max(samples, 1)]
    rest = [p for p in chosen if p not in ends]
    return sorted(ends + random.Random(seed).sample(rest, max(samples - len(ends), 0))), seed


@dataclasses.dataclass
class _Run:
    """What one check shares: the handler, the sink's functions, the stores, the reference."""

    handler: Callable[..., Any]
    snapshot: Callable[..., Any] | None
    reset: Callable[..., Any] | None
    fresh: Callable[[str], Store]
    options: Options
    max_attempts: int
    compare_result: bool
    label: str
    reference: tuple[Any, Any, Any] = (None, None, None)
    before_reference: Any = None

    def compare(self, trial: Trial, result: Any, state: Any, store: Store, before: Any) -> None:
        """Note in ``trial`` what its run gave and how it differs from the reference."""
        trial.result, trial.state = result, state
        trial.snapshot = _call_with_store(self.snapshot, store)
        expected_result, expected_state, expected_snapshot = self.reference
        if self.compare_result:
            trial.differences += differences("the result", expected_result, result)
        trial.differences += differences("the final state", expected_state, state)
        trial.differences += differences("the sink's snapshot", expected_snapshot, trial.snapshot)

    def prepare(self, trial: Trial, store: Store) -> Any:
        """Reset the sink for ``trial``'s run and take its snapshot; note in ``trial`` whether the
        sink is not as it was before the reference run (an earlier run's rows still in it)."""
        before = _before_run(self.reset, self.snapshot, store)
        if self.snapshot is None or before is _UNREADABLE:
            trial.sink_not_reset = False
        elif self.before_reference is _UNREADABLE:  # none before the first run (no table yet): rows now are a run's
            trial.sink_not_reset = bool(before)
        else:
            trial.sink_not_reset = before != self.before_reference
        return before

    def in_process(self, kind: Interruption, point: int) -> Trial:
        store = self.fresh(f"{kind.value}-{point}")
        plan = _Plan(kind=kind, point=point)
        trial = Trial(interruption=kind, point=point)
        before = self.prepare(trial, store)
        try:
            outcome, trial.attempts = run_to_the_end(self.handler, store, plan, self.options, self.max_attempts)
        except NotResumable as exc:
            trial.differences.append(str(exc))
        except Exception as exc:  # the resumed run failed where the reference did not
            trial.differences.append(f"the resumed run failed: {type(exc).__name__}: {exc}")
        else:
            self.compare(trial, outcome.result, outcome.checkpoint.state, store, before)
        trial.position, trial.struck = plan.struck_at, plan.struck
        return trial

    def new_processes(self, processes: FreshProcesses, points: list[int]) -> list[Trial]:
        """The uninterrupted run in a new process, then, when it agrees, a process killed at each
        point and the run resumed in another new process."""
        store = self.fresh("process_death-0")
        trial = Trial(interruption=Interruption.PROCESS_DEATH, point=0)
        before = self.prepare(trial, store)
        answer = self._answer(processes.run(store_payload(store, label=self.label), mode="run",
                                            max_attempts=self.max_attempts), trial)
        if answer is not None:
            self.compare(trial, answer["result"], answer["state"], store, before)
            trial.attempts = answer["attempts"]
        if trial.differences:
            if not trial.sink_not_reset:
                in_memory = (self.snapshot is not None and trial.snapshot == before
                             and self.reference[2] != self.before_reference)
                trial.differences.append(_IN_MEMORY if in_memory else _PROCESS_STATE)
            return [trial]
        return [self._killed_at(processes, point) for point in points]

    def _killed_at(self, processes: FreshProcesses, point: int) -> Trial:
        store = self.fresh(f"process_death-{point}")
        trial = Trial(interruption=Interruption.PROCESS_DEATH, point=point)
        before = self.prepare(trial, store)
        sent = store_payload(store, label=self.label)
        ended = processes.run(sent, mode="crash", point=point, max_attempts=self.max_attempts)
        if ended.killed and ended.signal == getattr(signal, "SIGKILL", 9) or ended.exit_code == 137:
            trial.struck, trial.attempts = True, 1
            with store.open() as s:
                row = s.checkpoints.load(JOB, SLOT)
            trial.position = row.position if row is not None else None
            expire_lease(store, JOB, SLOT)  # the dead worker's lease lapses
            first = (row.attempt if row is not None else 1) + 1
            ended = processes.run(sent, mode="run", first_attempt=first, max_attempts=self.max_attempts)
        answer = self._answer(ended, trial)
        if answer is not None:
            trial.attempts += answer["attempts"]
            self.compare(trial, answer["result"], answer["state"], store, before)
        return trial

    def _answer(self, ended: Any, trial: Trial) -> dict[str, Any] | None:
        """The child's answer; a failure or a silent end noted in ``trial``; an import error raised."""
        answer = ended.answer
        if answer is None:
            trial.differences.append(f"the attempt in a new process {ended.describe()} and gave no outcome")
            return None
        if answer.get("error") == "import":
            raise NotImportable(
                f"{self.label}: process_death runs the resumed attempt in a new process, which could not import the "
                f"handler: {answer['text']}. The handler's module must be importable by its name from sys.path in a "
                "new process (a module loaded from a file path under a made-up name, or a test module imported by "
                "pytest's importlib mode, is not), and importing it must not fail; or leave this kind out: "
                f"interruptions=IN_PROCESS_INTERRUPTIONS\n{answer['trace']}")
        if "error" in answer:
            trial.differences.append(f"the run in a new process failed: {answer['text']}")
            return None
        return answer


def check_resumable(
    handler: Callable[..., Any],
    *,
    snapshot: Callable[..., Any] | None = None,
    reset: Callable[..., Any] | None = None,
    interruptions: Sequence[Interruption | str] = ALL_INTERRUPTIONS,
    points: str | Iterable[int] = "auto",
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
            ``read``/``process`` use :func:`check_chunked`. For ``process_death`` it must be
            importable by a new process (a top-level function of a module, a ``functools.partial``
            of one, a bound method or callable object of a top-level class).
        snapshot: what the handler wrote, to compare (e.g. the rows of the sink table, sorted);
            called before and after each run, with the run's checkpoint store if it takes an
            argument (a sink written through ``ctx.transaction()`` lives there). Always called in
            the test's process.
        reset: empties the user's sink before each run (same calling convention). Each run gets a
            fresh checkpoint store of its own.
        interruptions: the kinds to try (:class:`Interruption` or their names); default all of
            them, :data:`IN_PROCESS_INTERRUPTIONS` all but ``process_death``.
        points: ``"auto"``: every checkpoint of the reference run up to :data:`EVERY_UP_TO` of
            them, else :data:`SAMPLES` of them; ``"every"`` checkpoint; or the checkpoint numbers
            (1-based).
        seed: the random seed that chooses a sample (the same seed, the same points); default
            the ``RESUMABLE_KIT_SEED`` environment variable, else a new one, named by the report.
        samples: try only this many of the points: the first, the last and others at random.
        store: the checkpoint store of every run: a :class:`Store`, a URL
            (``postgresql://user@host:5432/db``, ``sqlite:////abs/path.db``, see :func:`store_of`)
            or ``store(directory)`` giving the store of one run (default: a new embedded SQLite file
            in ``directory``, written without fsync: the kit's runs need no durability against a
            power loss). A store shared by the runs (a PostgreSQL database the sink lives in) is
            fine: the kit deletes its own slot before each run, and ``reset`` empties the sink.
            Give each test session running at once a database (or schema) of its own: the kit's
            slot has one name.
        options: the attempt's options (e.g. ``Options(pipeline_checkpoints=True)``).
        max_attempts: a run that does not finish in this many attempts is a failure.
        name: how the report names the handler (default: its qualified name).
        compare_result: False compares only the final state and the snapshot (for a return value
            that describes the last attempt, such as the chunk loop's chunk count).

    Returns:
        The :class:`Report`; call :meth:`Report.assert_ok` in a test.

    Raises:
        NotImportable: ``process_death`` is asked for and a new process cannot import the handler
            (or be given the store or the options), or importing it there ran a check again.
        ValueError: ``points`` outside the reference run's checkpoints, or no checkpoint, kind or
            sample to try.
    """
    kinds = [Interruption(k) for k in interruptions]
    options = options or Options()
    label = name or getattr(handler, "__qualname__", None) or repr(handler)
    refuse_in_child(label)
    # Nothing interrupted proves nothing: a check that would try no run is refused, not passed.
    if not kinds:
        raise ValueError(f"{label}: interruptions names no kind, so no run would be interrupted and the check would "
                         "prove nothing; leave it out for every kind, or name some (IN_PROCESS_INTERRUPTIONS...)")
    if not isinstance(points, str):
        points = [int(p) for p in points]
        if not points:
            raise ValueError(f"{label}: points names no checkpoint, so no run would be interrupted and the check "
                             "would prove nothing; give points='auto', 'every' or checkpoint numbers (1-based)")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
        raise ValueError(f"{label}: samples must be how many checkpoints to interrupt (an int >= 1), got {samples!r}")
    payload: tuple[bytes, list[str]] | NotImportable | None = None
    if Interruption.PROCESS_DEATH in kinds:  # named as it is now, before any run changes it
        try:
            payload = handler_payload(handler, options, label=label)
        except NotImportable as exc:
            payload = exc
    with tempfile.TemporaryDirectory(prefix="resumable-kit-") as tmp:
        root = Path(tmp)
        make_store = _store_factory(store, root)

        def fresh(tag: str) -> Store:
            directory = root / tag
            directory.mkdir()
            made = make_store(directory)
            _forget(made)  # a factory may give the same store every time: each run starts with no row
            return made

        run = _Run(handler=handler, snapshot=snapshot, reset=reset, fresh=fresh, options=options,
                   max_attempts=max_attempts, compare_result=compare_result, label=label)
        ref_store = fresh("reference")
        run.before_reference = _before_run(reset, snapshot, ref_store)
        plan = _Plan(kind=None, point=0)
        outcome, _ = run_to_the_end(handler, ref_store, plan, options, max_attempts)
        run.reference = (outcome.result, outcome.checkpoint.state, _call_with_store(snapshot, ref_store))
        report = Report(name=label, checkpoints=plan.calls, positions=list(plan.positions), result=run.reference[0],
                        state=run.reference[1], snapshot=run.reference[2], trials=[], reset_given=reset is not None)
        if plan.calls == 0:
            return report
        report.points, report.seed = _points(plan.calls, points, seed, samples)
        if isinstance(payload, NotImportable):
            raise payload
        for kind in kinds:
            if kind is not Interruption.PROCESS_DEATH:
                report.trials += [run.in_process(kind, point) for point in report.points]
                continue
            assert payload is not None
            processes = FreshProcesses(*payload)
            try:
                report.trials += run.new_processes(processes, report.points)
            finally:
                processes.close()
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


def _store_factory(store: Callable[[Path], Store] | Store | str | None, root: Path) -> Callable[[Path], Store]:
    if store is None:
        return _Embedded(root / "template.db")
    if isinstance(store, str):
        store = store_of(store)
    if isinstance(store, Store):
        shared = store
        return lambda directory: shared
    return store


class _Embedded:
    """The kit's default store: a new SQLite file for each run, copied from one whose schema is made
    once, written without fsync (a test needs no durability against a power loss; a killed
    process's writes are in the operating system's cache all the same)."""

    def __init__(self, template: Path):
        self.template = template

    def __call__(self, directory: Path) -> Store:
        if not self.template.exists():
            made = SQLiteStore(self.template.with_suffix(".new"), synchronous="OFF")
            with made.open(autocommit=True) as session:
                session.ensure_schema()
            with contextlib.closing(sqlite3.connect(made.path)) as conn:  # all of it in the one file
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            os.replace(made.path, self.template)
        shutil.copyfile(self.template, directory / "checkpoints.db")
        return SQLiteStore(directory / "checkpoints.db", synchronous="OFF")


@dataclasses.dataclass(frozen=True)
class ChunkLoop:
    """The handler a ``ChunkedOperator`` runs, built from its ``read``, ``process`` and other
    arguments: a callable a new process can import (its parts by name), unlike a closure."""

    read: Any
    process: Any
    chunk_size: int
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.build()  # bad arguments fail here, at once

    def build(self) -> Callable[..., Any]:
        """The operator's chunk loop over these arguments.

        Raises:
            ConfigurationError: bad arguments, all of them named at once.
        """
        return chunk_loop(self.read, self.process, chunk_size=self.chunk_size, **self.options)

    def __call__(self, ctx: Any) -> Any:
        return self.build()(ctx)


def check_chunked(read: Any, process: Any, *, chunk_size: int, chunked: dict[str, Any] | None = None,
                  **kwargs: Any) -> Report:
    """:func:`check_resumable` for a ``ChunkedOperator``'s ``read``/``process`` (and its other
    arguments in ``chunked``: ``position``, ``total``, ``start``, ``skip_on``, ...), run by the
    operator's own chunk loop. The loop's return value counts the chunks and skips of the *last*
    attempt, so it is not compared: the final state and the snapshot are. For ``process_death``,
    ``read``, ``process`` and the functions in ``chunked`` must be importable (no lambda)."""
    handler = ChunkLoop(read, process, chunk_size, dict(chunked or {}))
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
        """Raise :class:`NotResumable` naming the first partition that is not resumable, or saying
        that no partition was checked (every one asked for is empty): nothing was proven."""
        if not self.reports:
            raise NotResumable(f"{self.name}: no partition was checked ({self.plan.rows} rows in {self.plan.partitions} "
                               f"partitions; empty, so not checked: {self.empty}), so nothing was proven; give the "
                               "check a source with rows in the partitions it checks")
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
                      rebalance: bool = True, **kwargs: Any) -> PartitionedReport:
    """:func:`check_chunked` for a partitioned job (``partitioned(...)``,
    ``@task.resumable.partitioned``): split ``read``'s key into ``partitions`` ranges as the planning
    task does when a run first starts (counted by the source's database now), then check each
    partition, or those in ``only``, as its task runs it: ``process`` over the keys of its range,
    from the key after which it starts, interrupted at each of its checkpoints by each kind.

    Every trial of a partition reads the same range, as every try and Clear of a partition does.
    The sink is the whole of ``snapshot``: ``reset`` empties it before each run, so each
    partition's runs are compared with that partition's uninterrupted run. ``kwargs`` are
    :func:`check_resumable`'s (``snapshot``, ``reset``, ``interruptions``, ``points``, ``store``...).

    With ``rebalance`` (as ``partitioned(rebalance=True)`` runs), each partition is also asked at
    each of those checkpoints for half of what it has left, and each of a split's own steps is
    struck (:class:`~airflow_resumable.testing.splits.SplitStep`: the asker dies before starting
    the taken range, the partition dies right after agreeing, the asker loses the taken range's
    lease at its first checkpoint); the sink must then be what the partition's uninterrupted run
    under the same job names wrote (a sink that records ``ctx.job`` sees the taken rows under
    ``<job>[i].1``). These trials run in the test's process.
    """
    label = kwargs.pop("name", None) or f"read={read.name}, process={getattr(process, '__qualname__', process)!s}"
    plan = split(read, partitions, job=label)
    wanted = None if only is None else {int(i) for i in only}
    if wanted is not None and (not wanted or not wanted <= set(range(plan.partitions))):
        raise ValueError(f"{label}: only= must name partitions of the plan (0..{plan.partitions - 1}), got "
                         f"{sorted(wanted)}: a partition it does not have would be checked by no run")
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
        if rebalance:
            reports[rng.index].trials += _split_trials(read, process, chunk_size, dict(chunked or {}), plan, rng,
                                                       reports[rng.index].points, kwargs)
    return PartitionedReport(name=label, plan=plan, reports=reports, empty=empty)


def _split_trials(read: KeysetReader, process: Any, chunk_size: int, chunked: dict[str, Any], plan: Plan,
                  rng: Range, points: list[int], kwargs: dict[str, Any]) -> list[Trial]:
    """The split trials of partition ``rng.index`` at ``points`` (see :func:`check_partitioned`)."""
    snapshot, reset = kwargs.get("snapshot"), kwargs.get("reset")
    options = kwargs.get("options") or Options()
    max_attempts = int(kwargs.get("max_attempts", 20))
    with tempfile.TemporaryDirectory(prefix="resumable-kit-splits-") as tmp:
        root = Path(tmp)
        make_store = _store_factory(kwargs.get("store"), root)

        def fresh(tag: str) -> Store:
            directory = root / tag
            directory.mkdir()
            made = make_store(directory)
            with made.open(autocommit=True) as s:
                s.ensure_schema()
                for table in (CHECKPOINTS, ATTEMPTS, DEAD_LETTERS):
                    s.execute(f"DELETE FROM {table.name} WHERE job LIKE %(like)s AND slot = %(slot)s",
                              {"like": f"{splits.BASE}%", "slot": SLOT})
            _call_with_store(reset, made)
            return made

        def snap(store: Store) -> Any:
            return None if snapshot is None else _call_with_store(snapshot, store)

        expected = splits.reference(read=read, process=process, chunk_size=chunk_size, chunked=chunked, plan=plan,
                                    rng=rng, store=fresh("reference"), snapshot=snap, options=options)
        return [splits.split_trial(read=read, process=process, chunk_size=chunk_size, chunked=chunked, plan=plan,
                                   rng=rng, point=point, step=step, store=fresh(f"{step.value}-{point}"),
                                   snapshot=snap, expected=expected, options=options, max_attempts=max_attempts)
                for step in splits.SplitStep for point in points]
