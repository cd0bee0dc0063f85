"""What an attempt tells lineage and tracing backends, as plain data: no Airflow, no OpenLineage,
no OpenTelemetry here (the Airflow layer turns it into facets and spans: ``airflow_resumable/lineage/``,
``airflow_resumable/operators/tracing.py``).

* :class:`Source` names a dataset: what a reader reads (a table, a query, a file) and what a handler
  says it writes (``ctx.output(...)``), with the Airflow connection it goes through, if known.
* :class:`Part` is a partition's place in its partitioned job.
* :class:`AttemptFacts` is one attempt as a lineage event carries it: the job, the slot, the try,
  where it resumed from, how far it got and why it stopped. Its JSON, small whatever the checkpoint
  holds, is ``airflow_resumable.core.view.facts_json`` (a position over :data:`VALUE_LIMIT` characters
  of JSON goes as a preview, by the view's one cut rule).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from airflow_resumable.core.model.outward import ELLIPSIS, TEXT_LIMIT, cut_text, outward_text, without_credentials

__all__ = [
    "MAX_OUTPUTS", "NAME_LIMIT", "REASON_LIMIT", "TEXT_LIMIT", "VALUE_LIMIT", "AttemptFacts", "Part", "Source",
    "ELLIPSIS", "cut_text", "outward_text", "stop_reason_text", "without_credentials", "without_credentials_in",
]

#: The longest position (and partition bound) an event carries whole, in characters of JSON.
VALUE_LIMIT = 200
#: The longest dataset namespace and dataset name an event carries (a longer one is cut to this).
NAME_LIMIT = TEXT_LIMIT
#: The longest stop reason an event carries (the facet schema's ``stopReason`` ``maxLength``).
REASON_LIMIT = 200
#: The most inputs (and the most outputs) one attempt's events name; the others are left out, with one
#: warning per attempt (the task is not affected).
MAX_OUTPUTS = 100

Kind = Literal["table", "query", "file"]
KINDS: tuple[str, ...] = ("table", "query", "file")


def stop_reason_text(reason: str) -> str:
    """A stop reason as an event or a span carries it: through :func:`~.outward.outward_text` (over the
    whole text: a cut first could split a URL before its ``@``), then cut to :data:`REASON_LIMIT`
    characters (a long one-word reason keeps its start)."""
    return cut_text(outward_text(reason), REASON_LIMIT)


#: The name :func:`~.outward.outward_text` had before it covered every outgoing text: the same function.
without_credentials_in = outward_text


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset an attempt reads or writes.

    Attributes:
        kind: ``table`` (a table or view name, optionally schema-qualified), ``query`` (the text of
            a SELECT) or ``file`` (a path or URL).
        name: the table, the query or the file.
        connection: the Airflow connection id it goes through (None: not known, e.g. a reader
            built on a plain ``connect`` function; or a local file).
    """

    kind: Kind
    name: str
    connection: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a source's kind is one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a {self.kind} needs a name, got {self.name!r}")
        if self.kind == "file":  # what may leave the task: never a URL's credentials
            object.__setattr__(self, "name", without_credentials(self.name))


@dataclasses.dataclass(frozen=True)
class Part:
    """A partition's place in its partitioned job: partition ``index`` of ``count`` (None: not
    known), reading the keys after ``after`` up to ``until`` (None: from the first / to the last)."""

    job: str
    index: int
    count: int | None = None
    after: Any = None
    until: Any = None


@dataclasses.dataclass(frozen=True)
class AttemptFacts:
    """One attempt, as a lineage event or a span carries it.

    Attributes:
        job / slot / attempt: the checkpoint's key and Airflow's try number.
        status: the slot's status when the facts were taken (``running`` at the start; ``done``,
            ``failed``, ``cancelled``, ``paused`` after; ``lease_lost`` when another attempt took over).
        resumed: whether the attempt continued a checkpoint (False: it started from the beginning).
        resumed_from: the position it continued from (None on a fresh start).
        position / processed / total: where the slot stood when the facts were taken.
        skipped: the slot's skipped items as this attempt knows them (after its last skip, or from
            its summary), None when it does not know.
        stop_reason: why it stopped (``timeout``, ``user``, ``shutdown``, ``paused``...), None when
            it did not stop early.
        checkpoints: how many checkpoints this attempt saved.
        inputs: what the attempt read: its readers' sources and ``ctx.input(...)``.
        outputs: what the handler said it writes (``ctx.output(...)``).
        partition: the partition's place in its job, for a partition of a partitioned job.
    """

    job: str
    slot: str | None
    attempt: int
    status: str = "running"
    resumed: bool | None = None
    resumed_from: Any = None
    position: Any = None
    processed: int | None = None
    total: int | None = None
    skipped: int | None = None
    stop_reason: str | None = None
    checkpoints: int | None = None
    inputs: tuple[Source, ...] = ()
    outputs: tuple[Source, ...] = ()
    partition: Part | None = None
