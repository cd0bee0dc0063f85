"""The test kit's trials of a split (rebalancing, :mod:`airflow_resumable.core.work.rebalance`): a
partition asked at one of its checkpoints for half of what it has left, each of the split's own
steps interrupted, the job's rows compared with the partition's uninterrupted run.

A trial saves the kit's plan on a fresh store, runs the partition (job ``test_kit.partitioned[i]``)
with the ask written before the chunk whose checkpoint reads it back, and finishes the taken range
(``test_kit.partitioned[i].1``) the way the job would, with the :class:`SplitStep` struck on the way.
Its sink must then be what the partition's uninterrupted run wrote.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.attempt.runner import Attempt, Identity
from airflow_resumable.core.model.errors import LeaseLost
from airflow_resumable.core.model.options import Options
from airflow_resumable.core.readers.keyset import KeysetReader
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work import rebalance
from airflow_resumable.core.work.chunk_loop import chunk_loop
from airflow_resumable.core.work.partitions import Plan, Range, load_plan, range_chunks, save_plan
from airflow_resumable.testing.interrupt import (
    SLOT,
    Interruption,
    SimulatedCrash,
    _Plan,
    expire_lease,
    interrupted_attempt,
)
from airflow_resumable.testing.report import Trial, differences

__all__ = ["BASE", "SplitStep", "reference", "split_trial"]

#: The partitioned job of the kit's split trials.
BASE = "test_kit.partitioned"
#: Who asks, in the kit's trials.
ASKER = "test kit (an idle partition)"


class SplitStep(enum.StrEnum):
    """Where a split's own steps are interrupted, as they are in production."""

    #: The idle partition that asked dies between the agreement and its start of the taken range
    #: (no row): the next idle partition, or a Clear, runs it.
    TAKER_DIES = "split_taker_dies"
    #: The partition that gave part of its range away dies right after the agreement, before its
    #: next chunk: its retry resumes on what it kept, as the plan row holds it.
    PARTITION_DIES = "split_partition_dies"
    #: The idle partition running the taken range loses its lease at its first checkpoint (another
    #: attempt takes it over): that chunk is fenced out, and the range is finished by the next one.
    TAKER_TAKEN_OVER = "split_taker_taken_over"


def _job(index: int) -> str:
    return f"{BASE}[{index}]"


def _run(store: Store, job: str, handler: Callable[..., Any], options: Options, plan: _Plan, *,
         max_attempts: int) -> int:
    """Attempts of ``job`` until one ends ``done`` (``plan`` striking in the first); how many ran."""
    cls = interrupted_attempt(plan)
    for attempt in range(1, max_attempts + 1):
        try:
            cls(store, Identity(job=job, slot=SLOT, attempt=attempt, owner=f"test-kit/{job}/try{attempt}"),
                options=options).run(handler)
            return attempt
        except SimulatedCrash:
            pass
        except LeaseLost:
            expire_lease(store, job, SLOT)  # the taker is gone too
    raise AssertionError(f"{job} did not finish in {max_attempts} attempts")


def reference(*, read: KeysetReader, process: Callable[..., Any], chunk_size: int, chunked: dict[str, Any],
              plan: Plan, rng: Range, store: Store, snapshot: Callable[[Store], Any] | None, options: Options) -> Any:
    """The sink's snapshot after partition ``rng.index``'s uninterrupted run under the split trials'
    job name (a sink that records ``ctx.job`` is compared with runs of the same names)."""
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, BASE, SLOT, plan)
    handler = chunk_loop(process=process, chunk_size=chunk_size,
                         **{**chunked, **range_chunks(read, rng, total=chunked.get("total"))})
    Attempt(store, Identity(job=_job(rng.index), slot=SLOT, attempt=1, owner="test-kit/reference"),
            options=options).run(handler)
    return None if snapshot is None else snapshot(store)


def split_trial(
    *, read: KeysetReader, process: Callable[..., Any], chunk_size: int, chunked: dict[str, Any], plan: Plan,
    rng: Range, point: int, step: SplitStep, store: Store, snapshot: Callable[[Store], Any] | None,
    expected: Any, options: Options, max_attempts: int,
) -> Trial:
    """One trial: partition ``rng.index`` asked before its ``point``-th chunk, ``step`` struck, the
    sink compared with ``expected`` (the partition's uninterrupted snapshot)."""
    trial = Trial(interruption=step, point=point)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, BASE, SLOT, plan)
    job = _job(rng.index)
    chunks = [0]
    dies_after = [False]

    def asking(ctx: Any, batch: Any) -> Any:
        chunks[0] += 1
        if chunks[0] == point:
            with store.open(autocommit=True) as s:
                rebalance.ask(s, job, SLOT, ASKER)
        elif dies_after[0] and step is SplitStep.PARTITION_DIES and chunks[0] == point + 1:
            dies_after[0] = False
            raise SimulatedCrash(f"the partition died after agreeing a split at checkpoint {point}")
        return process(ctx, batch)

    def handler_for(name: str, process_fn: Callable[..., Any]) -> Callable[..., Any]:
        def handler(ctx: Any) -> Any:
            with store.open(autocommit=True) as s:
                current = load_plan(s, BASE, SLOT)
            now = rng if current is None else current.current().get(name, rng)
            return chunk_loop(process=process_fn, chunk_size=chunk_size,
                              **{**chunked, **range_chunks(read, now, total=chunked.get("total"))})(ctx)
        return handler

    dies_after[0] = True
    try:
        trial.attempts = _run(store, job, handler_for(rng.name, asking), options, _Plan(kind=None, point=0),
                              max_attempts=max_attempts)
        with store.open(autocommit=True) as s:
            agreed = load_plan(s, BASE, SLOT)
        taken = None if agreed is None else rebalance.taken_by(agreed, ASKER, 0)
        trial.struck = taken is not None
        if taken is not None:
            trial.position = taken.after
            with store.open(autocommit=True) as s:
                # (as found once the agreement is older than the taker's grace: its taker is dead)
                free = rebalance.unclaimed(s, BASE, SLOT, agreed, claim_after=0)  # type: ignore[arg-type]
            if [r.name for r in free] != [taken.name]:
                trial.differences.append(f"the taken range {taken.name} was not found unclaimed before it started "
                                         f"(found {[r.name for r in free]})")
            strike = _Plan(kind=Interruption.LEASE_LOST if step is SplitStep.TAKER_TAKEN_OVER else None, point=1)
            trial.attempts += _run(store, taken.job(BASE), handler_for(taken.name, process), options, strike,
                                   max_attempts=max_attempts)
            if step is SplitStep.TAKER_TAKEN_OVER and not strike.struck:
                trial.struck = False
    except AssertionError as exc:
        trial.differences.append(str(exc))
        return trial
    except Exception as exc:
        trial.differences.append(f"the run with a split failed: {type(exc).__name__}: {exc}")
        return trial
    if snapshot is not None:
        trial.snapshot = snapshot(store)
        trial.differences += differences("the sink's snapshot", expected, trial.snapshot)
    return trial
