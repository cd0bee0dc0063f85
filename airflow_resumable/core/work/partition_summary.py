"""A partitioned job as a whole: which partitions finished, and every planned row accounted for.

:func:`summarize` reads the partitions' rows of one slot and their dead letters, and reconciles
them with the plan (``planned``: the rows the plan counted when it split the source). For each
partition ``i``, ``planned[i]`` rows were in its range then, and it *read* ``processed`` items (a
skipped item is read too). Every planned row is then one of:

* ``processed``: read and processed (the read items that are not dead letters);
* ``skipped``: read and recorded as a dead letter (still ``skipped``, or waiting for its retry);
* ``unfinished``: in the range of a partition that did not finish, not read (yet);
* ``gone``: in the range of a finished partition that read fewer rows than were planned for it,
  and no longer in the source: the range is counted again, and the rows it lacks now were
  deleted after the plan (at least that many);
* ``shortfall``: the rest. A finished partition read fewer rows than its range held and still
  holds: nothing explains them (a reader that changed, rows moved behind a partition's position,
  a hand-edited row). The job fails on a shortfall unless ``tolerated_shortfall`` allows it.

And ``more``: rows read beyond the plan (written into a range after the plan; not a problem). So
``planned = processed + skipped + unfinished + gone + shortfall - more``. A partition that did not
finish (failed, or cancelled by a person) counts against ``tolerated_failure`` (a count, or a
percentage of the partitions as ``"10%"``: Step Functions' *ToleratedFailureCount* and
*ToleratedFailurePercentage*).

No Airflow here; the summary task (``airflow_resumable.operators.partitioned``) runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from airflow_resumable.core.model.checkpoint import Checkpoint, Status
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.work.partitions import Plan, allowed_failures, allowed_shortfall, partition_job

__all__ = ["Summary", "summarize"]

#: How many partitions an error or a headline names before "and N more".
_NAMED = 10


def _names(indexes: Sequence[int], describe: Callable[[int], str]) -> str:
    shown = ", ".join(describe(i) for i in indexes[:_NAMED])
    return shown + (f" and {len(indexes) - _NAMED} more" if len(indexes) > _NAMED else "")


@dataclasses.dataclass(frozen=True)
class Summary:
    """The partitions of one slot: which finished (``done``), which did not (``failed``: every one
    not ``done``; ``cancelled`` of them, a person's cancel, with who asked in ``cancelled_by``), and
    the plan's rows accounted for (see the module's docstring). ``planned`` is None for a summary
    made without the plan; ``short`` names the finished partitions with a shortfall.

    A cancelled partition counts as failed against ``tolerated_failure``: its rows were not
    processed, so the job as a whole did not finish them, however it was stopped. Within the
    tolerance the job succeeds without them (the summary names them); beyond it, it fails. The
    same for a shortfall and ``tolerated_shortfall`` (``allowed_short`` rows).
    """

    job: str
    slot: str
    partitions: int
    done: tuple[int, ...]
    failed: tuple[int, ...]
    #: Items the partitions read (their rows' ``processed``): processed, or skipped.
    read: int
    total: int | None
    allowed: int
    cancelled: tuple[int, ...] = ()
    cancelled_by: tuple[str | None, ...] = ()
    planned: int | None = None
    skipped: int = 0
    unfinished: int = 0
    gone: int = 0
    shortfall: int = 0
    more: int = 0
    short: tuple[int, ...] = ()
    allowed_short: int = 0

    @property
    def processed(self) -> int:
        """Items read and processed: those read but the dead letters."""
        return max(0, self.read - self.skipped)

    @property
    def ok(self) -> bool:
        """Whether no more partitions failed (cancelled ones included) than tolerated, and no more
        planned rows are unexplained than tolerated."""
        return len(self.failed) <= self.allowed and self.shortfall <= self.allowed_short

    def headline(self) -> str:
        """The summary in one line: partitions, then the planned rows accounted for."""
        parts = [f"{self.processed:,} processed", f"{self.skipped:,} skipped (dead letters)"]
        if self.unfinished:
            parts.append(f"{self.unfinished:,} not read by the unfinished partition(s) "
                         f"{_names(self.failed, str)}")
        if self.gone:
            parts.append(f"{self.gone:,} gone from the source since the plan")
        if self.shortfall:
            parts.append(f"{self.shortfall:,} unexplained (partition(s) {_names(self.short, str)})")
        rows = f"of {self.planned:,} planned rows: " if self.planned is not None else "rows: "
        line = f"{len(self.done)} of {self.partitions} partitions done; {rows}{', '.join(parts)}"
        if self.more:
            line += f"; {self.more:,} more than planned (written into a range after the plan)"
        if self.shortfall and self.shortfall <= self.allowed_short:
            line = (f"SHORTFALL TOLERATED ({self.shortfall:,} of {self.planned or 0:,} planned rows neither processed, "
                    f"skipped nor gone; tolerated_shortfall allows {self.allowed_short:,}): {line}")
        return line

    def as_json(self) -> dict[str, Any]:
        """The summary task's return value: the headline first, then the figures."""
        return {"summary": self.headline(), "job": self.job, "slot": self.slot, "partitions": self.partitions,
                "done": len(self.done), "failed": list(self.failed), "cancelled": list(self.cancelled),
                "tolerated": self.allowed, "planned": self.planned, "processed": self.processed,
                "skipped": self.skipped, "unfinished": self.unfinished, "gone": self.gone,
                "shortfall": self.shortfall, "short": list(self.short), "tolerated_shortfall": self.allowed_short,
                "more": self.more, "total": self.total}

    def describe(self, index: int) -> str:
        """``<job>[i]``, with ``(cancelled by who)`` for a cancelled partition."""
        name = partition_job(self.job, index)
        if index in self.cancelled:
            by = self.cancelled_by[self.cancelled.index(index)] if len(self.cancelled_by) == len(self.cancelled) else None
            return f"{name} (cancelled{f' by {by}' if by else ''})"
        return name

    def error(self) -> ConfigurationError | None:
        """Why the job failed, naming the failed partitions (or those short of their plan) and
        what to do; None when it did not."""
        if len(self.failed) > self.allowed:
            counted = " (a cancelled partition counts as failed)" if self.cancelled else ""
            return ConfigurationError(
                f"{len(self.failed)} of {self.partitions} partitions did not finish "
                f"({_names(self.failed, self.describe)}); tolerated_failure allows {self.allowed}{counted}. "
                f"{self.headline()}", job=self.job, slot=self.slot,
                hint="Clear the failed partitions' task instances (`airflow resumable rerun-failed`, or Re-run failed "
                "partitions on the jobs page): each resumes from its own checkpoint, the other partitions keep "
                "theirs, and the summary runs again",
            )
        if self.shortfall > self.allowed_short:
            return ConfigurationError(
                f"{self.shortfall:,} of {self.planned or 0:,} planned rows were neither processed, skipped nor gone "
                f"from the source: partition(s) {_names(self.short, self.describe)} finished having read fewer rows "
                f"than their ranges held when the plan was made and still hold; tolerated_shortfall allows "
                f"{self.allowed_short:,}. {self.headline()}", job=self.job, slot=self.slot,
                hint="Nothing records why (a reader changed between attempts, rows moved behind a partition's "
                "position, a hand-edited row): see each partition's history (`airflow resumable history JOB SLOT`). "
                "To read a range again, restart that partition (`airflow resumable restart '<job>[i]' SLOT`, then "
                "Clear it and the summary); to accept the gap, set tolerated_shortfall= on partitioned()",
            )
        return None


def summarize(
    job: str, slot: str, rows: Sequence[Checkpoint | None], *, tolerated: int | str, plan: Plan | None = None,
    skipped: Sequence[int] | None = None, count: Callable[[int], int | None] | None = None,
    tolerated_shortfall: int | str = 0,
) -> Summary:
    """The job's summary from its partitions' rows (``rows[i]``: partition ``i``'s, None if it never
    started). A partition that is not ``done`` counts as failed, a cancelled one too.

    With the ``plan``, every planned row is accounted for (see the module's docstring):
    ``skipped[i]`` is partition ``i``'s dead letters not replayed, and ``count(i)`` the rows its
    range holds now (asked only of a finished partition that read fewer rows than were planned for
    it; None: it cannot tell, and the rows count as unexplained).
    """
    done = tuple(i for i, row in enumerate(rows) if row is not None and row.status == Status.DONE.value)
    failed = tuple(i for i in range(len(rows)) if i not in set(done))
    cancelled = tuple(i for i, row in enumerate(rows) if row is not None and row.status == Status.CANCELLED.value)
    totals = [row.total for row in rows if row is not None]
    read = [0 if row is None else int(row.processed) for row in rows]
    unfinished = gone = shortfall = more = 0
    short: list[int] = []
    if plan is not None:
        planned = plan.planned() + [0] * max(0, len(rows) - plan.partitions)
        for i, got in enumerate(read):
            want = planned[i]
            more += max(0, got - want)
            if i not in done:
                unfinished += max(0, want - got)
            elif got < want:
                now = None if count is None else count(i)
                lost = 0 if now is None else min(want - got, max(0, want - now))
                gone += lost
                if want - got - lost:
                    shortfall += want - got - lost
                    short.append(i)
    return Summary(
        job=job, slot=slot, partitions=len(rows), done=done, failed=failed, read=sum(read),
        total=None if not totals or any(t is None for t in totals) else sum(int(t) for t in totals if t is not None),
        allowed=allowed_failures(tolerated, len(rows)), cancelled=cancelled,
        cancelled_by=tuple(getattr(rows[i], "requested_by", None) for i in cancelled),
        planned=None if plan is None else plan.rows, skipped=sum(skipped or ()), unfinished=unfinished, gone=gone,
        shortfall=shortfall, more=more, short=tuple(short),
        allowed_short=allowed_shortfall(tolerated_shortfall, plan.rows if plan is not None else 0),
    )
