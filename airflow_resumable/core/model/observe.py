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
import re
from typing import Any, Literal

__all__ = [
    "MAX_OUTPUTS", "NAME_LIMIT", "REASON_LIMIT", "TEXT_LIMIT", "VALUE_LIMIT", "AttemptFacts", "Part", "Source",
    "cut_text", "stop_reason_text", "without_credentials", "without_credentials_in",
]

#: The longest position (and partition bound) an event carries whole, in characters of JSON.
VALUE_LIMIT = 200
#: The longest text (a job, a slot, a name) an event carries, in characters, the cut's ``...`` included.
TEXT_LIMIT = 1000
#: The longest dataset namespace and dataset name an event carries (a longer one is cut to this).
NAME_LIMIT = TEXT_LIMIT
#: The longest stop reason an event carries (the facet schema's ``stopReason`` ``maxLength``).
REASON_LIMIT = 200
#: The most inputs (and the most outputs) one attempt's events name; the others are left out, with one
#: warning per attempt (the task is not affected).
MAX_OUTPUTS = 100
#: What ends a cut text.
ELLIPSIS = "..."

Kind = Literal["table", "query", "file"]
KINDS: tuple[str, ...] = ("table", "query", "file")


def cut_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text``, or, when longer than ``limit`` characters, its start and ``...``: never more than
    ``limit`` characters in all (a schema's ``maxLength: limit`` holds). Every cut of an event's text
    goes through here."""
    if len(text) <= limit:
        return text
    if limit < len(ELLIPSIS):
        return text[:max(limit, 0)]
    return text[:limit - len(ELLIPSIS)] + ELLIPSIS


def without_credentials(url: str) -> str:
    """A URL without its user, password, query, fragment and path parameters (``s3://key:secret@bucket/k?sig=x``
    -> ``s3://bucket/k``): what may leave the task. A plain path is returned as it is.

    Read by hand, not by ``urlsplit``: a secret may hold a ``/`` (AWS secret keys do), which ends
    ``urlsplit``'s authority early and leaves the rest of the secret in the path. What stands before
    the last ``@`` is taken for credentials when it has no ``/``, or a ``:`` before its first ``/``
    (``user:pass@host:/path``, ``s3://key:se/cret@bucket/k``); an ``@`` in a path
    (``s3://bucket/v@2.csv``) stays.
    """
    text = url.split("#", 1)[0].split("?", 1)[0]
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    before, at, after = rest.rpartition("@")
    if at and ("/" not in before or ":" in before.split("/", 1)[0]):
        rest = after
    if sep:
        host, slash, path = rest.partition("/")
        rest = host.lower() + slash + path
    rest = re.sub(r";[^/]*", "", rest)  # path parameters (;jsessionid=...)
    return f"{scheme}{sep}{rest}"


# Each starts only where a run of its characters starts (the look-behinds): linear in the text's length,
# a 10 MB message included (without them, a long run of letters took quadratic time).
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://\S+")
_URL_TAIL = re.compile(r"[\'\")\]}>.,;:!]+$")
_PAIR_IN_TEXT = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]+)([\'\"]?[ \t]*[=:][ \t]*[\'\"]?)")
_PAIR_VALUE = re.compile(r"[^\s\'\",;&]+")
_SECRET_KEY = re.compile(r"password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|credential", re.IGNORECASE)


def without_credentials_in(text: str, limit: int | None = None) -> str:
    """A free text (an error's message, a traceback) without the credentials it may hold: each URL in it
    goes through :func:`without_credentials` (its user, password, query and fragment dropped), and the
    value of each ``password=``/``token:``/``"secret": "..."``-like pair becomes ``***``. What it cannot
    see: a secret written with no URL or key around it, or a password holding a space.

    With a ``limit``, the result is at most ``limit`` characters (:func:`cut_text`), and only the start
    of a longer text is read: the word the limit falls in is dropped whole, so no half of a URL (its
    ``@`` beyond the limit) is left to keep its password.
    """
    if limit is not None and len(text) > limit:
        start = text[:limit + 1]
        text = start[:max(start.rfind(" "), start.rfind("\n"), start.rfind("\t"), 0)] + ELLIPSIS
    def url(match: re.Match[str]) -> str:
        token = match.group(0)
        tail = _URL_TAIL.search(token)
        end = tail.start() if tail else len(token)
        return without_credentials(token[:end]) + token[end:]

    text = _URL_IN_TEXT.sub(url, text)
    out: list[str] = []
    at = 0
    while (match := _PAIR_IN_TEXT.search(text, at)) is not None:
        out.append(text[at:match.end()])
        at = match.end()
        value = _PAIR_VALUE.match(text, at) if _SECRET_KEY.search(match.group(1)) else None
        if value is not None:  # else its value may be the next pair's key (``Authorization: token: ...``)
            out.append("***")
            at = value.end()
    scrubbed = "".join(out) + text[at:]
    return scrubbed if limit is None else cut_text(scrubbed, limit)


def stop_reason_text(reason: str) -> str:
    """A stop reason as an event or a span carries it: without the credentials a handler's own reason may
    hold (:func:`without_credentials_in`, over the whole text: a cut first could split a URL before its
    ``@``), then cut to :data:`REASON_LIMIT` characters (a long one-word reason keeps its start)."""
    return cut_text(without_credentials_in(reason), REASON_LIMIT)


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
