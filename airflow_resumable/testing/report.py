"""What the test kit found: one :class:`Trial` per interrupted run, gathered in a :class:`Report`
whose :meth:`~Report.assert_ok` says, in one message, what went wrong first and what to do."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from airflow_resumable.testing.interrupt import Interruption, NotResumable

__all__ = ["Report", "Trial", "differences"]

_IDEMPOTENT = ("Make each chunk idempotent, or write it through ctx.transaction() so it commits with its checkpoint, "
               "and keep in the position and ctx.state everything the next chunk needs")


@dataclasses.dataclass
class Trial:
    """One interrupted run: ``interruption`` at the ``point``-th ``ctx.checkpoint()``.

    Point 0 of :attr:`Interruption.PROCESS_DEATH` is the uninterrupted run in a new process that
    the kit compares with the uninterrupted one in the test's process before any crash.
    """

    #: An :class:`Interruption`, or one of a split's steps (:class:`~airflow_resumable.testing.splits.SplitStep`).
    interruption: Interruption | enum.StrEnum
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
    #: True when the sink, before this run began, was not as it was before the uninterrupted run
    #: (it still held what an earlier run wrote: ``reset`` was not given, or left it).
    sink_not_reset: bool = False

    def describe(self) -> str:
        if self.interruption is Interruption.PROCESS_DEATH and self.point == 0:
            where = "process_death, an uninterrupted run in a new process"
        else:
            where = f"{self.interruption.value} at checkpoint {self.point} (position {self.position!r})"
        return f"{where}: " + "; ".join(self.differences) if self.differences else f"{where}: same"


@dataclasses.dataclass
class Report:
    """What :func:`~airflow_resumable.testing.check_resumable` found."""

    name: str
    checkpoints: int
    positions: list[Any]
    result: Any
    state: Any
    snapshot: Any
    trials: list[Trial]
    #: The checkpoints interrupted (1-based), by every kind.
    points: list[int] = dataclasses.field(default_factory=list)
    #: The seed that chose :attr:`points` when they are a sample (None: no sample was drawn).
    seed: int | None = None
    #: Whether ``reset`` was given (the messages about a sink not reset say which fix applies).
    reset_given: bool = False

    @property
    def failures(self) -> list[Trial]:
        return [t for t in self.trials if t.differences]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def sampled(self) -> bool:
        return self.seed is not None

    def replay_hint(self) -> str:
        """How to try the same points again, when they were a sample; else empty."""
        if self.seed is None:
            return ""
        return (f" [{len(self.points)} of the {self.checkpoints} checkpoints, sampled with seed={self.seed}: pass "
                f"seed={self.seed} (or set RESUMABLE_KIT_SEED={self.seed}) to try the same ones again, "
                "points='every' to try them all]")

    def assert_ok(self) -> Report:
        """Raise :class:`NotResumable` naming the first trial that differs (and how many did).

        Raises:
            NotResumable: the handler made no checkpoint, no interrupted run was tried, or one differs.
        """
        if self.checkpoints == 0:
            raise NotResumable(
                f"{self.name} made no checkpoint in an uninterrupted run: an interrupted attempt has nothing to "
                "resume from and starts over. Call ctx.checkpoint(position) after each chunk (or give "
                "ChunkedOperator's read a source with items)")
        if not self.trials:
            raise NotResumable(f"{self.name}: no interrupted run was tried, so nothing was proven; give the check "
                               "points and interruptions to try")
        failures = self.failures
        if not failures:
            return self
        count = (f"({len(failures)} of {len(self.trials)} interrupted runs differ from the uninterrupted one, "
                 f"which made {self.checkpoints} checkpoints)")
        not_reset = [t for t in failures if t.sink_not_reset]
        first = not_reset[0] if not_reset else failures[0]
        if first.sink_not_reset:
            fix = ("reset= left rows of an earlier run in it: make it empty the sink completely" if self.reset_given
                   else "Pass reset=, a function that empties the sink before each run (it is given the run's "
                   "checkpoint store when it takes an argument)")
            raise NotResumable(
                f"{self.name} cannot be judged: {first.describe()} {count}. But the sink was not reset: when this "
                "run began it still held what the run before it wrote (its snapshot then differed from the one "
                "before the uninterrupted run), so the kit cannot tell this run's writes from those. "
                f"{fix}{self.replay_hint()}")
        if first.interruption is Interruption.PROCESS_DEATH:
            raise NotResumable(f"{self.name} is not resumable: {first.describe()} {count}. "
                               f"{self._process_death(first)}{self.replay_hint()}")
        raise NotResumable(f"{self.name} is not resumable: {first.describe()} {count}. {_IDEMPOTENT}"
                           f"{self.replay_hint()}")

    def _process_death(self, first: Trial) -> str:
        """Why a run that went through a new process differs, and what to do."""
        if first.point == 0:
            return first.differences[-1] if first.differences else ""
        in_process = next((t for t in self.trials if t.interruption is Interruption.CRASH_AFTER_CHECKPOINT
                           and t.point == first.point), None)
        also = (", although crash_after_checkpoint at the same checkpoint, resumed in the same process, gave what "
                "the uninterrupted run gave" if in_process is not None and not in_process.differences else "")
        return ("The process was killed right after this checkpoint was saved, and the attempt that resumed ran in a "
                "new process, the handler imported anew: its outcome differs from the uninterrupted run's, so the "
                "handler's progress lived outside ctx.state and the position, in the dead process's memory (a "
                "module-level variable, a class attribute, a cache), which a real crash loses" + also + ". Keep in "
                "ctx.state (or the position) everything the next chunk needs")

    def summary(self) -> str:
        by_kind: dict[Interruption | enum.StrEnum, list[Trial]] = {}
        for t in self.trials:
            by_kind.setdefault(t.interruption, []).append(t)
        sample = f" (at {len(self.points)} of them, sampled with seed={self.seed})" if self.seed is not None else ""
        lines = [f"{self.name}: {self.checkpoints} checkpoints, {len(self.trials)} interrupted runs{sample}"]
        for kind, trials in by_kind.items():
            bad = [t.point for t in trials if t.differences]
            lines.append(f"  {kind.value}: {len(trials)} runs, " + (f"differ at {bad}" if bad else "all the same"))
        return "\n".join(lines)


def differences(label: str, expected: Any, got: Any) -> list[str]:
    """How ``got`` differs from ``expected``, as one sentence (none when they are equal)."""
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
