"""Partitioned jobs: one job's key split into ranges of about equal size, once per run, and stored.

A partitioned job reads one source (a :class:`~airflow_resumable.core.readers.KeysetReader`) in
``N`` partitions that run apart, each its own job (``<job>[i]``) with its own checkpoint, on
whichever worker. Three things make it correct:

* **The split is made once per slot and stored.** :func:`split` asks the source for ``N - 1``
  boundaries, each a key of the source: the keys at rows ``n/N, 2n/N, ...`` of the key's order,
  counted by the database (PostgreSQL: ``row_number()`` over the key in one pass; other
  databases: one ``ORDER BY key LIMIT 1 OFFSET k`` per boundary, which an index on the key
  answers). :func:`save_plan` stores the plan as the ``state`` of the ``<job>#plan`` job's
  checkpoint row for the slot, *insert if absent*: the first plan of a slot stays its plan, so
  every retry and every Clear (of a partition, or of the planning task) reads the same ranges,
  whatever the source holds by then.
* **No row in two partitions, none in none.** Partition ``i`` reads ``(b[i-1], b[i]]``: the first
  from the start, the last to the end. Both ends are compared as the pages are (``>`` and ``<=``
  on the key, a row value for a composite key), by the database, so ties on a key's first column,
  collations and rows written after the split all fall in exactly one range. A boundary of
  ``None`` stands before every key (a source with fewer rows than partitions): a range up to it
  is empty. Empty partitions are fine; they finish at once.
* **Within the reader's own bounds.** A partition reads its range *and* the reader's own
  ``until``, ``where`` and ``params`` (:meth:`KeysetReader.within`): the first and the last range,
  open at one end, still stop where the reader does.
* **One reader for the whole job.** The plan records the identity of the reader it split
  (:meth:`~airflow_resumable.core.readers.Reader.identity`), each range carries its digest, and
  each partition's checkpoint records its reader with the range: a planning task, or a partition,
  whose reader differs (another key, source, condition or bound) refuses before reading.
* **Splits keep it so.** A plan may also hold splits (:class:`Split`): a range cut in two at a key
  inside it, the keys after the cut read as a range of their own (``<job>[i].n``, :meth:`Range.job`).
  :meth:`Plan.current` gives the ranges as the splits left them, which hold every key once as the
  planned ones do; a split at or outside its range's ends is refused where the plan can order the
  keys (numbers), and the seal covers the splits as it covers the boundaries.
* **The job as a whole** (:mod:`airflow_resumable.core.work.partition_summary`): which partitions finished,
  whether more of them failed than ``tolerated_failure`` allows, and the plan's rows accounted for.

No Airflow here; the operators (``airflow_resumable.operators.partitioned``) put it in a DAG.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from airflow_resumable.core.model.checkpoint import ENCODER, short
from airflow_resumable.core.model.columns import MAX_NUMBER
from airflow_resumable.core.model.errors import ConfigurationError, CorruptCheckpoint, ReaderChanged, RequestRefused
from airflow_resumable.core.model.identity import PLAN_SUFFIX, partition_job, plan_job
from airflow_resumable.core.model.keys import json_key, json_keys
from airflow_resumable.core.readers.base import differences, identity_digest
from airflow_resumable.core.readers.keyset import MAX_PARTS, KeysetReader
from airflow_resumable.core.stores.base import StoreSession

__all__ = [
    "PLAN_SUFFIX", "CorruptPlan", "Plan", "Range", "Split", "allowed_failures", "allowed_shortfall", "check_plan_reader", "check_range_reader",
    "load_plan", "narrowed_since", "orphan_partitions", "outside_plan", "partition_index", "partition_job", "range_index",
    "partitions_problem", "plan_job", "replace_plan", "save_plan", "shortfall_problem", "split", "tolerated_problem",
]

#: The most partitions a job may have: each is a mapped task instance and a checkpoint row (the
#: most ranges a reader splits rows into).
MAX_PARTITIONS = MAX_PARTS

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


_PARTITION = re.compile(r"^(.+)\[(\d+)\]$")


def partition_index(job: str) -> tuple[str, int] | None:
    """``(<job>, i)`` of a partition's job name ``<job>[i]``; None for any other name."""
    m = _PARTITION.match(job)
    return None if m is None else (m.group(1), int(m.group(2)))


#: ``<job>[i]`` and ``<job>[i].n`` (the range split ``n`` took from partition ``i``'s line).
_RANGE = re.compile(r"^(.+)\[(\d+)\](?:\.(\d+))?$")


def range_index(job: str) -> tuple[str, int, int | None] | None:
    """``(<job>, i, n)`` of the job reading a range of ``<job>``'s plan: ``<job>[i]`` (``n`` None)
    or, for a range rebalancing took, ``<job>[i].n``; None for any other name."""
    m = _RANGE.match(job)
    return None if m is None else (m.group(1), int(m.group(2)), None if m.group(3) is None else int(m.group(3)))


def outside_plan(load: Callable[[str, str], Any], job: str, slot: str) -> RequestRefused | None:
    """Why the partition ``job`` (``<job>[i]``, or ``<job>[i].n``: a range a split took from
    partition ``i``'s line) of ``slot`` is no range of its job's current plan, or None: it is one
    (or ``job`` names no partition, or its job has no plan for the slot, or one this release cannot
    read). A job split anew into fewer partitions keeps the rows, history and dead letters of the
    partitions past the new plan; their task instances are ``removed`` in Airflow, so nothing runs
    them: they count for nothing in the job's line and take no request. So do the rows of ranges
    taken by a split the current plan does not hold (an earlier plan's). ``load(job, slot)`` reads a
    checkpoint row (``session.checkpoints.load``)."""
    found = range_index(job)
    if found is None:
        return None
    base, index, number = found
    try:
        row = load(plan_job(base), slot)
    except CorruptCheckpoint:  # the plan's own row edited by hand: it cannot say, and must not block its partitions
        return None
    if row is None:
        return None
    try:
        plan = Plan.from_state(row.state, job=plan_job(base), slot=slot)
    except CorruptPlan:
        return None
    when = row.started_at.isoformat(timespec="seconds") if row.started_at else "?"
    if number is not None and index < plan.partitions:
        if f"{index}.{number}" in plan.current():
            return None
        return RequestRefused(
            f"range {index}.{number} is not in job {base}'s current plan (planned at {when}, "
            f"{len(plan.splits)} split(s) since): its row, history and skipped items are kept from an earlier "
            "plan, but nothing runs it any more, so it takes no request and counts for nothing in the job's line",
            status=row.status, job=job, slot=slot,
            hint=f"Ask the plan's partitions ({partition_job(base, 0)} to {partition_job(base, plan.partitions - 1)}) "
            f"or the ranges its splits took (`airflow resumable jobs --job '{base}'` lists them); to split the job "
            f"anew, restart '{plan_job(base)}'",
        )
    if index < plan.partitions:
        return None
    return RequestRefused(
        f"partition {index} is not in job {base}'s current plan of {plan.partitions} partition(s) (planned at "
        f"{when}): its row, history and skipped items are kept from an earlier split into more partitions, but "
        "nothing runs it any more (its task instance is removed), so it takes no request and counts for nothing "
        "in the job's line", status=row.status, job=job, slot=slot,
        hint=f"Ask the plan's partitions ({partition_job(base, 0)} to {partition_job(base, plan.partitions - 1)}); "
        f"to split the job anew, restart '{plan_job(base)}'",
    )


# -- arguments -----------------------------------------------------------------------------------


def partitions_problem(name: str, value: Any) -> str | None:
    """What is wrong with a partition count, as a sentence, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        return f"{name} must be a whole number of partitions from 1 to {MAX_PARTITIONS}, got {value!r}"
    return None


def tolerated_problem(name: str, value: Any) -> str | None:
    """What is wrong with a ``tolerated_failure`` (a count >= 0, or a percentage ``"0%"``..``"100%"``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None
    if isinstance(value, str):
        m = _PERCENT.match(value)
        if m and float(m.group(1)) <= 100:
            return None
    return (f"{name} must be how many partitions may fail (an int >= 0) or a percentage of them (a string such "
            f"as \"10%\"), got {value!r}")


def shortfall_problem(name: str, value: Any) -> str | None:
    """What is wrong with a ``tolerated_shortfall`` (rows >= 0, or a percentage of the planned rows)."""
    if tolerated_problem(name, value) is None:
        return None
    return (f"{name} must be how many planned rows may go unexplained (an int >= 0) or a percentage of them (a "
            f"string such as \"1%\"), got {value!r}")


def allowed_shortfall(tolerated: int | str, planned: int) -> int:
    """How many of ``planned`` rows may be short without failing the job (the count, or the
    percentage's share rounded down)."""
    return allowed_failures(tolerated, planned)


def allowed_failures(tolerated: int | str, partitions: int) -> int:
    """How many of ``partitions`` may fail before the job fails: the count, or the percentage's
    share rounded down (``"10%"`` of 16 partitions: 1)."""
    if isinstance(tolerated, str):
        m = _PERCENT.match(tolerated)
        assert m is not None, tolerated_problem("tolerated_failure", tolerated)
        return math.floor(float(m.group(1)) * partitions / 100 + 1e-9)
    return int(tolerated)


# -- the plan ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Range:
    """One partition's rows: the keys after ``after`` (None: from the first) up to ``until``,
    inclusive (None: to the last), within the reader's own bounds. ``empty``: the range holds no
    key at all. ``reader``: the digest of the plan's reader's identity (None: a plan made before
    readers were recorded)."""

    index: int
    after: Any
    until: Any
    empty: bool = False
    #: The job's partitions (None: a range handed over by a release that did not say).
    count: int | None = None
    reader: str | None = None
    #: The number of the split that took this range from a running slot (:class:`Split`), or None:
    #: the range of partition :attr:`index` as planned (or what its splits left it).
    split: int | None = None

    @property
    def name(self) -> str:
        """The range's name in its plan: its partition's index (``"3"``), or for a range a split
        took, the index of the partition whose line it descends from and the split's number
        (``"3.5"``)."""
        return str(self.index) if self.split is None else f"{self.index}.{self.split}"

    def job(self, base: str) -> str:
        """The job that reads this range: ``<base>[3]`` (the mapped task instance's), or for a split's
        range ``<base>[3].5``."""
        return partition_job(base, self.index) + ("" if self.split is None else f".{self.split}")

    def as_json(self) -> dict[str, Any]:
        out = {"partition": self.index, "after": self.after, "until": self.until, "empty": self.empty,
               "partitions": self.count}
        if self.reader is not None:
            out["reader"] = self.reader
        if self.split is not None:
            out["split"] = self.split
        return out

    @classmethod
    def from_json(cls, value: Any) -> Range:
        """A range as :meth:`as_json` wrote it (what the planning task hands each partition).

        Raises:
            ConfigurationError: not such a dict.
        """
        if not isinstance(value, dict) or not {"partition", "after", "until"} <= set(value):
            raise ConfigurationError(f"a partition's range must be a dict of partition, after and until, got "
                                     f"{short(value)}", hint="Pass the planning task's output, as .partitioned() does")
        count = value.get("partitions")
        reader = value.get("reader")
        number = value.get("split")
        return cls(int(value["partition"]), value["after"], value["until"], bool(value.get("empty", False)),
                   count=count if isinstance(count, int) and not isinstance(count, bool) else None,
                   reader=reader if isinstance(reader, str) else None,
                   split=number if isinstance(number, int) and not isinstance(number, bool) else None)


def range_chunks(reader: KeysetReader, rng: Range, *, total: Any = None) -> dict[str, Any]:
    """The chunk loop's ``read``, ``start`` and ``total`` for one partition: ``reader`` over the
    keys of ``rng`` only, within the reader's own bounds (nothing for an empty range), from the key
    after which it starts, and, when ``total`` is None, the range's rows counted when the run
    starts (its progress and its part of the job's total). What a partition task runs, and what
    the test kit checks."""
    read: Any = _nothing if rng.empty else reader.within(rng.until, after=rng.after)
    if total is None:
        total = 0 if rng.empty else RangeCount(read, rng.after)
    return {"read": read, "start": rng.after, "total": total}


def _nothing(ctx: Any, after: Any, limit: int) -> list[Any]:
    """The read of an empty range."""
    return []


@dataclasses.dataclass(frozen=True)
class RangeCount:
    """A partition's ``total``: the rows of its range, counted once per run. A value that pickles
    (not a closure): the test kit's ``process_death`` sends it to a new process by name."""

    reader: KeysetReader
    after: Any

    def __call__(self, ctx: Any) -> int:
        return int(self.reader.count(ctx, self.after))


@dataclasses.dataclass(frozen=True)
class Split:
    """A range taken from a slot of the job while it ran (dynamic rebalancing): the range named
    :attr:`of` (``"3"``, or an earlier split's ``"3.2"``) keeps its keys up to :attr:`at`, inclusive,
    and this split's range, named ``"<i>.<number>"`` (``i``: the partition whose line it descends
    from), holds the keys after :attr:`at` up to where :attr:`of` ended before. Splits are numbered
    1, 2, ... in the order they were agreed; each applies to the ranges as the splits before it left
    them. :attr:`by` names who asked for it and :attr:`when` when it was agreed (ISO 8601), for the
    record."""

    number: int
    of: str
    at: Any
    by: str | None = None
    when: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"number": self.number, "of": self.of, "at": self.at, "by": self.by, "when": self.when}


@dataclasses.dataclass(frozen=True)
class Plan:
    """A job's split for one slot: ``partitions`` ranges cut at ``boundaries`` (``partitions - 1``
    keys in the key's order, as JSON positions; None: before every key), made when the source had
    ``rows`` rows, by the reader whose identity is ``reader`` (None: a plan made before readers were
    recorded)."""

    partitions: int
    boundaries: tuple[Any, ...]
    rows: int
    reader: dict[str, Any] | None = None
    #: The ranges taken from running slots since, in the order they were agreed.
    splits: tuple[Split, ...] = ()

    def ranges(self) -> list[Range]:
        """Every partition's range as planned, in order: together they hold every key once (the
        mapped task instances' ranges; :meth:`current` gives them as the splits left them)."""
        out = []
        digest = None if self.reader is None else identity_digest(self.reader)
        for i in range(self.partitions):
            lower = self.boundaries[i - 1] if i > 0 else None
            if i == self.partitions - 1:
                out.append(Range(i, lower, None, count=self.partitions, reader=digest))
                continue
            upper = self.boundaries[i]
            # A range up to "before every key", or from a key up to itself, holds nothing.
            out.append(Range(i, lower, upper, empty=upper is None or (lower is not None and lower == upper),
                             count=self.partitions, reader=digest))
        return out

    def current(self) -> dict[str, Range]:
        """Every range of the job as its splits left them, by name (:attr:`Range.name`): the
        partitions' (a split partition's up to the key it was cut at) and each split's. Together
        they hold every key once, as the planned ranges do: a split cuts one range in two at a key
        inside it."""
        found = {rng.name: rng for rng in self.ranges()}
        for cut in self.splits:
            source = found[cut.of]
            found[cut.of] = dataclasses.replace(source, until=cut.at)
            taken = Range(source.index, cut.at, source.until, count=source.count, reader=source.reader,
                          split=cut.number)
            found[taken.name] = taken
        return found

    def with_split(self, of: str, at: Any, *, by: str | None = None, when: str | None = None) -> Plan:
        """This plan with one more split: range ``of`` cut after key ``at`` (a JSON position).

        Raises:
            ConfigurationError: no range of that name, an empty one, or a key that is not inside it
                where that can be told here (numbers; see :func:`_out_of_order`).
        """
        problem = _split_problem(self.current(), Split(len(self.splits) + 1, of, at, by, when), self.key_columns())
        if problem is not None:
            raise ConfigurationError(f"range {of!r} cannot be split at {short(at)}: {problem}",
                                     hint="Split a range that holds keys after the cut (the victim's remaining ones)")
        return dataclasses.replace(self, splits=(*self.splits, Split(len(self.splits) + 1, of, at, by, when)))

    def key_columns(self) -> int | None:
        """How many columns the plan's key has, as its reader's identity or its boundaries say
        (None: neither says: a plan of one range made before readers were recorded)."""
        key = None if self.reader is None else self.reader.get("key")
        if isinstance(key, list) and key:
            return len(key)
        for boundary in self.boundaries:
            if boundary is not None:
                return len(boundary) if isinstance(boundary, list) else 1
        return None

    def planned(self) -> list[int]:
        """How many of :attr:`rows` each partition's range held when the plan was made: the split
        cuts at rows ``n/N, 2n/N, ...`` of the key's order; a range the split left empty (a boundary
        that stood in for a row deleted meanwhile) hands its rows to the next."""
        ends = [(j * self.rows) // self.partitions for j in range(1, self.partitions)] + [self.rows]
        counts = [end - start for start, end in zip([0, *ends[:-1]], ends, strict=True)]
        for i, rng in enumerate(self.ranges()):
            if rng.empty and i + 1 < self.partitions:
                counts[i + 1] += counts[i]
                counts[i] = 0
        return counts

    def state(self) -> dict[str, Any]:
        """The plan as the plan row's state (JSON), sealed: ``seal`` is the digest of the rest, so
        a plan changed by hand after it was stored is refused instead of read (its ranges could
        overlap or leave a gap)."""
        out: dict[str, Any] = {"partitions": self.partitions, "boundaries": list(self.boundaries), "rows": self.rows}
        if self.reader is not None:
            out["reader"] = self.reader
        if self.splits:  # absent while there are none: a plan stored before splits keeps its seal
            out["splits"] = [cut.as_json() for cut in self.splits]
        out["seal"] = identity_digest(out)
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any], *, job: str, slot: str) -> Plan:
        """The plan a plan row holds: the one decoder of a plan row's state (``job``: the plan row's
        job, ``<job>#plan``).

        A plan is read only whole: sealed (:meth:`state`), its seal matching what it holds, a whole
        number of partitions from 1 to :data:`MAX_PARTITIONS` cut at one boundary fewer, a row
        count within a count's range, and its boundaries in the key's order (None, before every key,
        only ahead of the keys; a key repeated where a range came out empty). Where only the
        source's database can order two keys (text, whose order is its collation's), they are
        taken as they stand; numbers, and composite keys by their leading columns, are compared here.

        Raises:
            CorruptPlan: (a :class:`CorruptCheckpoint` and a :class:`ConfigurationError`) the row's
                state is not a plan (written by hand, or by other code), holds no seal, its seal does
                not match (changed by hand after it was stored), or its boundaries are out of order,
                naming the plan row and the restart that splits the job anew.
        """
        restart = (f"`airflow resumable restart '{job}' '{slot}'`, then Clear the job's tasks in that run (every "
                   "partition starts over)")
        not_a_plan = (f"Split the job anew on purpose: {restart}. Deleting the row instead would split anew while "
                      "the partitions keep the progress they made in the old ranges")
        if not isinstance(state, dict) or "seal" not in state:
            raise CorruptPlan(
                f"the plan row's state is not a plan: it holds no seal (every plan is stored sealed, so its ranges "
                f"are read only as they were stored), so none is handed out: {short(state)}", job=job, slot=slot,
                hint=not_a_plan)
        sealed = {k: v for k, v in state.items() if k != "seal"}
        if identity_digest(sealed) != state["seal"]:
            raise CorruptPlan(
                f"the plan row's state was changed after the plan was stored (its seal {short(state['seal'])} "
                f"does not match what it holds: {short(sealed, 200)}); ranges read from it could overlap or "
                "leave a gap, so none is handed out", job=job, slot=slot,
                hint=f"Put the plan back as it was stored, or split the job anew on purpose: {restart}",
            )
        try:
            partitions, boundaries, rows, reader = (state["partitions"], state["boundaries"], state["rows"],
                                                    state.get("reader"))
            if reader is not None and not isinstance(reader, dict):
                raise ValueError(f"its reader is not an identity (a JSON object): {short(reader)}")
            if partitions_problem("partitions", partitions):
                raise ValueError(f"{short(partitions)} partitions (a whole number from 1 to {MAX_PARTITIONS})")
            if not isinstance(boundaries, list) or len(boundaries) != partitions - 1:
                raise ValueError(f"boundaries {short(boundaries)} for {partitions} partitions (a list of "
                                 f"{partitions - 1})")
            if type(rows) is not int or not 0 <= rows <= MAX_NUMBER["bigint"]:
                raise ValueError(f"a row count of {short(rows)} (a whole number from 0 to {MAX_NUMBER['bigint']:,})")
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptPlan(f"the plan row's state is not a plan ({exc}): {short(state)}", job=job, slot=slot,
                              hint=not_a_plan) from None
        disorder = _out_of_order(boundaries)
        if disorder is not None:
            raise CorruptPlan(
                f"the plan row's boundaries are out of the key's order ({disorder}): ranges cut at them would "
                f"overlap or leave a gap (a row read twice, or by no partition), so none is handed out; its seal "
                f"matches, so it was sealed anew after an edit, or written by other code: {short(boundaries, 200)}",
                job=job, slot=slot, hint=not_a_plan)
        plan = cls(partitions, tuple(boundaries), rows, reader)
        splits = state.get("splits", [])
        if not isinstance(splits, list):
            raise CorruptPlan(f"the plan row's splits are not a list: {short(splits)}", job=job, slot=slot,
                              hint=not_a_plan)
        current = plan.current()
        for n, value in enumerate(splits, start=1):
            cut = _split_of(value, n)
            problem = cut if isinstance(cut, str) else _split_problem(current, cut, plan.key_columns())
            if problem is not None:
                raise CorruptPlan(
                    f"the plan row's split {n} is not one this release reads ({problem}): ranges cut by it could "
                    f"overlap or leave a gap, so none is handed out: {short(value, 200)}", job=job, slot=slot,
                    hint=not_a_plan)
            assert not isinstance(cut, str)
            plan = dataclasses.replace(plan, splits=(*plan.splits, cut))
            current = plan.current()
        return plan


def _split_of(value: Any, number: int) -> Split | str:
    """A split as :meth:`Split.as_json` wrote it (the ``number``-th), or what is wrong with it."""
    if not isinstance(value, dict) or not {"number", "of", "at"} <= set(value):
        return "not a dict of number, of and at"
    if value["number"] != number or type(value["number"]) is not int:
        return f"numbered {short(value['number'])} where {number} comes"
    of, by, when = value["of"], value.get("by"), value.get("when")
    if not isinstance(of, str) or not all(isinstance(x, str | None) for x in (by, when)):
        return "of, by and when must be texts"
    return Split(number, of, value["at"], by, when)


def _split_problem(current: dict[str, Range], cut: Split, columns: int | None = None) -> str | None:
    """What keeps ``cut`` from applying to the ranges as the splits before it left them, or None
    (``columns``: how many the plan's key has, when known)."""
    source = current.get(cut.of)
    if source is None:
        return f"it splits {cut.of!r}, which is no range of the plan"
    if source.empty:
        return f"range {cut.of!r} holds no key"
    if cut.at is None:
        return "it is cut before every key"
    shape = _position_problem(cut.at, columns)
    if shape is not None:
        return shape
    probe = [k for k in (source.after, cut.at, source.until) if k is not None]
    if _out_of_order(probe) is not None or any(a == b for a, b in zip(probe, probe[1:], strict=False)):
        # only keys the plan can order here (numbers, leading columns) are told apart; a cut at a
        # range's own end, or outside it, would leave a range empty or read a key twice
        return f"key {short(cut.at)} is not inside range {cut.of!r} ({short(source.after)}, {short(source.until)}]"
    return None


def _position_problem(at: Any, columns: int | None) -> str | None:
    """What keeps ``at`` from being a JSON position of a key of ``columns`` columns (None: of any),
    or None: a text or a number for one column, a list of them for several (a reader's tuple, as
    :meth:`~airflow_resumable.core.readers.keyset.KeysetReader.split_point` gives a key, is not:
    stored as JSON it would read back as another shape)."""
    scalar = (str, int, float)
    if isinstance(at, list):
        if columns == 1:
            return f"key {short(at)} is a list, but the plan's key has one column (give the value itself)"
        if columns is not None and len(at) != columns:
            return f"key {short(at)} has {len(at)} values, but the plan's key has {columns} columns"
        if not at or not all(isinstance(v, scalar) for v in at):
            return f"key {short(at)} is not a list of texts and numbers"
        return None
    if not isinstance(at, scalar):
        return f"key {short(at)} is not a JSON position (a text or a number, or a list of them for a composite key)"
    if columns is not None and columns > 1:
        return f"key {short(at)} is one value, but the plan's key has {columns} columns (give a list)"
    return None


class CorruptPlan(CorruptCheckpoint, ConfigurationError):
    """A plan row whose state is not a plan this release reads whole (:meth:`Plan.from_state`): a
    :class:`CorruptCheckpoint` of the plan row, and a :class:`ConfigurationError` as every refused
    plan was before (the planning task's restart takes such a plan over; the jobs listing shows the
    job without it)."""


def _out_of_order(boundaries: Sequence[Any]) -> str | None:
    """Where two neighbouring boundaries stand in the wrong order, as a phrase, or None.

    The split writes None (before every key) only ahead of every key, and repeats the boundary
    before for a row deleted while it split, so neighbours may be equal. A composite key is a list
    of one length throughout, compared column by column; two values are compared here only when
    that cannot differ from the database's order: numbers (and equal values). Text is ordered by
    the source's collation, which only its database knows: a pair that differs in text first is
    taken as it stands, but a value left for another never comes back: in any order, the keys that
    share a leading column (or leading columns) stand together, so ``["a", 5], ["b", 1], ["a", 3]``
    is out of order whatever the collation (the readers refuse keys the collation calls equal).
    """
    previous: Any = None
    numbers: Any = None  # which of the key's columns hold numbers: in every boundary alike
    left: dict[int, set[Any]] = {}  # by prefix length: the leading columns boundaries have moved past
    for i, key in enumerate(boundaries):
        columns = key if isinstance(key, list) else [key]
        if any(_number(v) and v != v for v in columns):  # NaN: after every number in the database, here in no order
            return f"boundary {i}, {short(key)}, holds NaN, which has no place among the keys"
        if key is None:
            if previous is not None:
                return f"boundary {i} is None, before every key, after boundary {i - 1}, {short(previous)}"
            continue
        if previous is not None:
            if isinstance(key, list) != isinstance(previous, list) or (
                    isinstance(key, list) and len(key) != len(previous)):
                return f"boundary {i}, {short(key)}, is not a key of the shape of boundary {i - 1}, {short(previous)}"
            if _order(previous, key) > 0:
                return f"boundary {i - 1}, {short(previous)}, comes after boundary {i}, {short(key)}"
            before = previous if isinstance(previous, list) else [previous]
            for n in range(1, len(columns) + 1):
                was, now = _held(before[:n]), _held(columns[:n])
                if was != now:
                    left.setdefault(n, set()).add(was)
                    if now in left[n]:
                        return (f"boundary {i}, {short(key)}, comes back to {short(columns[:n])} after boundary "
                                f"{i - 1}, {short(previous)}, had moved past it")
        kinds = tuple(_number(v) for v in columns)
        if numbers is not None and kinds != numbers:  # '7' among numbers: the database compares it as 7
            return f"boundary {i}, {short(key)}, is not a key of the shape of the boundaries before it"
        numbers = kinds
        previous = key
    return None


def _held(values: Sequence[Any]) -> Any:
    """Leading columns of a key as a set member (equal as the database compares them: 1 as 1.0)."""
    return tuple(v if isinstance(v, str | int | float | bool) or v is None else repr(v) for v in values)


def _number(value: Any) -> bool:
    """Whether a boundary's value is a number (JSON's: not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _order(a: Any, b: Any) -> int:
    """-1, 0 or 1 as ``a`` comes before, with or after ``b`` in every database's order; 0 also when
    only the database can tell (see :func:`_out_of_order`)."""
    if isinstance(a, list):
        for x, y in zip(a, b, strict=True):
            if x != y:
                return _order(x, y)  # the first column that differs decides, if it can be told here
        return 0
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return (a > b) - (a < b)
    return 0


def split(reader: KeysetReader, partitions: int, *, job: str | None = None, slot: str | None = None) -> Plan:
    """Split ``reader``'s rows into ``partitions`` ranges of about equal size (within one row),
    counted by the source's database now.

    The boundaries are keys of the source, so the ranges hold every row once whatever is written
    after (see the module's docstring). ``reader``'s ``where``/``query``/``until`` apply.

    Raises:
        ConfigurationError: a bad count, a row with a NULL key (it would be in no range), or a
            boundary key with no exact JSON form (bytes...), naming the job and the slot.
    """
    problem = partitions_problem("partitions", partitions)
    if problem:
        raise ConfigurationError(problem, job=job, slot=slot, hint="Give partitions= a whole number, e.g. 16")
    found = reader.split_keys(partitions)
    if found.null_key is not None:
        where = " AND ".join(f"{k} IS NOT NULL" for k in reader.keys)
        raise ConfigurationError(
            f"{reader.name}: a row has a NULL key ({', '.join(f'{k}={short(v, 40)}' for k, v in zip(reader.keys, found.null_key, strict=True))}): "
            "a NULL is neither before nor after a boundary, so no partition would read that row. Nothing was "
            "split or read", job=job, slot=slot,
            hint=f"Filter them out (where='{where}') or partition on columns that are NOT NULL",
        )
    convert = json_key if len(reader.keys) == 1 else json_keys
    boundaries: list[Any] = []
    for r in found.at:
        if r in found.keys:
            try:
                boundaries.append(convert(found.keys[r] if len(reader.keys) > 1 else found.keys[r][0]))
            except TypeError as exc:  # the plan is stored as JSON: a boundary must have an exact JSON form
                raise ConfigurationError(
                    f"{reader.name}: {exc}, so no boundary of the split can be stored in the plan. Nothing was "
                    "split or read", job=job, slot=slot,
                    hint="Partition on columns whose values are numbers, text, timestamps, dates, decimals or UUIDs",
                ) from None
        else:  # row 0, or a row deleted while the split was made: the boundary before stands in
            boundaries.append(boundaries[-1] if boundaries else None)
    return Plan(partitions, tuple(boundaries), found.rows, reader.identity())


def narrowed_since(before: Plan, now: Plan, name: str) -> Range | None:
    """The range ``name`` as ``now`` holds it when only splits agreed since ``before`` was read
    changed it: ``now`` is ``before`` with more splits, and one of them cut that range (a split
    keeps the range's keys up to the cut: the same range up to a lower key). None otherwise: no
    split since cut it, or the plan changed in another way (split anew, a restart of the job)."""
    seen = len(before.splits)
    if dataclasses.replace(now, splits=now.splits[:seen]) != before:
        return None
    if not any(cut.of == name for cut in now.splits[seen:]):
        return None
    return now.current().get(name)


# -- where the plan is kept ------------------------------------------------------------------------


def load_plan(session: StoreSession, job: str, slot: str) -> Plan | None:
    """The plan stored for ``job``'s ``slot``, or None."""
    row = session.plans.load(job, slot)
    return None if row is None else Plan.from_state(row.state, job=plan_job(job), slot=slot)


def orphan_partitions(session: StoreSession, job: str, slot: str, partitions: int, *, limit: int = 10) -> list[str]:
    """Up to ``limit`` of ``job``'s first ``partitions`` partitions that have a row for ``slot``
    (progress made in a plan's ranges): none before the slot's first plan, unless its plan row was
    deleted by hand."""
    return session.plans.partitions_with_rows(job, slot, partitions, limit=limit)


def save_plan(session: StoreSession, job: str, slot: str, plan: Plan) -> Plan:
    """Store ``plan`` for ``job``'s ``slot`` unless one is stored already; return the slot's plan
    (the one stored first: two planners racing agree on the winner's)."""
    session.plans.add(job, slot, plan.state(), plan.rows)
    stored = load_plan(session, job, slot)
    assert stored is not None, "the plan row was inserted or already there"
    return stored


def replace_plan(session: StoreSession, job: str, slot: str, plan: Plan) -> bool:
    """Replace the slot's plan with ``plan`` when a restart of it is pending (``airflow resumable
    restart '<job>#plan' SLOT``), taking the request in the same write; False when none was pending
    (another planner took it first). The row's ``runs`` counts the splits."""
    return session.plans.replace(job, slot, plan.state(), plan.rows)


# -- one reader for the whole job -------------------------------------------------------------------


def _plain_json(identity: Any) -> Any:
    return json.loads(ENCODER.encode(identity))


def check_plan_reader(plan: Plan, reader: KeysetReader, *, job: str, slot: str) -> None:
    """Refuse a planning task whose reader is not the one the stored plan was split with.

    Raises:
        ReaderChanged: naming both identities, how they differ, the job, the slot and the choices.
    """
    current = _plain_json(reader.identity())
    if plan.reader is None or plan.reader == current:
        return
    raise ReaderChanged(
        f"the slot's plan was split with another reader than this task's ({differences(plan.reader, current)}): "
        f"split with {short(plan.reader, 300)}, while this task reads with {short(current, 300)}. Its boundaries "
        "are keys of the first; ranges of them read with the second would skip or repeat rows, so no range was "
        "handed out and nothing was read", job=job, slot=slot, stored=plan.reader, current=current,
        hint=f"Put the reader back as it was, then Clear the task. Or split the job anew on purpose with this "
        f"reader: `airflow resumable restart '{plan_job(job)}' '{slot}'`, then Clear the job's tasks in that run "
        "(every partition starts over)",
    )


def check_range_reader(rng: Range, reader: KeysetReader, *, job: str, slot: str,
                       planned_with: dict[str, Any] | None = None) -> None:
    """Refuse a partition whose reader is not the one its range was planned with (the range
    carries the digest of the plan's reader; ``planned_with``, the plan's whole identity when
    known, is named in the error).

    Raises:
        ReaderChanged: naming both identities (or the digests), the job, the slot and the choices.
    """
    current = _plain_json(reader.identity())
    if rng.reader is None or identity_digest(current) == rng.reader:
        return
    stored: Any = planned_with if planned_with is not None else f"a reader whose identity's digest is {rng.reader}"
    base = job[:job.rindex("[")] if job.endswith("]") and "[" in job else job
    raise ReaderChanged(
        f"this partition's range was planned with another reader than this task's "
        f"({differences(stored, current)}): planned with {short(stored, 300)}, while this task reads with "
        f"{short(current, 300)}. Its bounds are keys of the first, so nothing was read", job=job, slot=slot,
        stored=stored, current=current,
        hint=f"Put the reader back as it was, then Clear the task. Or split the job anew on purpose with this "
        f"reader: `airflow resumable restart '{plan_job(base)}' '{slot}'`, then Clear the job's tasks in that run "
        "(every partition starts over)",
    )

