"""OpenTelemetry spans of resumable attempts, when ``opentelemetry-api`` is importable.

Each execution of a resumable task (``execute()``, and ``execute_resumed()`` after a pause) is one
span, ``resumable.attempt``, opened as a child of the span current in the task process: the task
SDK's own span of the try (``worker.<task_id>``) on Airflow 3.2 and 3.3. Airflow 3.1's task
runner opens none: there the attempt's span is the root of a trace of its own, with the same
``airflow.*`` attributes as the SDK's span so it can be found. Inside it:

* ``resumable.acquire``, a child span: from the start of the attempt until it holds the slot's
  lease and knows whether it resumes (opening the store, waiting for another holder, the overlap
  decision);
* ``resumable.checkpoint`` events at the pace of the progress report (the first checkpoint, then at
  most one per ``progress_interval``/``xcom_interval``), at most :data:`MAX_CHECKPOINT_EVENTS` per
  span: a million-chunk job gets a hundred events, and its counts (``resumable.checkpoints``) as
  attributes when the attempt ends;
* ``resumable.pause`` when the task defers (paused, throttled, a time slice), ``resumable.wait`` /
  ``resumable.skip`` for an overlap decision, ``resumable.stop`` with the slot's status and the
  stop's reason when the attempt ends.

Names and attributes are listed in the docs (``docs/how-to/metrics.md``), beside the metrics.
Every text an attribute or an event carries (names, the stop reason, an error's message and
traceback) goes through :func:`~airflow_resumable.core.model.outward.outward_text` first: no
credential, no raw control character reaches a tracing backend.
With no tracer provider configured, OpenTelemetry's API hands out spans that record nothing. A
tracing failure never fails the task: it is logged once, and the attempt goes on untraced.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_resumable.core.attempt.reporter import Progress
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.observe import (
    TEXT_LIMIT,
    AttemptFacts,
    cut_text,
    outward_text,
    stop_reason_text,
)
from airflow_resumable.core.model.outward import outward_traceback
from airflow_resumable.core.view import CUT_MARKER, cut_value
from airflow_resumable.version import __version__

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # pragma: no cover - Airflow's task SDK imports it from 3.2 on; an odd install may lack it
    _trace = None  # type: ignore[assignment]

__all__ = ["MAX_CHECKPOINT_EVENTS", "SPAN_ACQUIRE", "SPAN_ATTEMPT", "AttemptTrace", "attempt_span"]

TRACER_NAME = "airflow_resumable"
SPAN_ATTEMPT, SPAN_ACQUIRE = "resumable.attempt", "resumable.acquire"
#: The most ``resumable.checkpoint`` events one attempt's span gets (OpenTelemetry's SDK keeps 128 by default).
MAX_CHECKPOINT_EVENTS = 100
#: A position longer than this, as JSON, goes as a preview in a span attribute.
VALUE_LIMIT = 200
#: The longest traceback an ``exception`` event carries, in characters (its end is cut).
STACK_LIMIT = 20_000


def _json(value: Any) -> str:
    """A JSON value as a span attribute: its JSON text, cut to a preview when long."""
    shown, _ = cut_value(value, marker=CUT_MARKER, limit=VALUE_LIMIT)
    return json.dumps(shown, default=str)


def _message(exc: BaseException) -> str:
    """``str(exc)``, or what stands for it when its ``__str__`` raises."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: its message could not be read>"


def _name(text: Any) -> str:
    """A name (a job, a slot, a DAG's or a run's id) as an attribute carries it: through
    :func:`~airflow_resumable.core.model.observe.outward_text`, cut to ``TEXT_LIMIT`` characters."""
    return cut_text(outward_text(str(text)), TEXT_LIMIT)


def facts_attributes(facts: AttemptFacts) -> dict[str, Any]:
    """The attempt's facts as ``resumable.*`` span attributes (None values left out)."""
    attributes: dict[str, Any] = {
        "resumable.status": facts.status, "resumable.resumed": facts.resumed,
        "resumable.processed": facts.processed, "resumable.total": facts.total,
        "resumable.skipped": facts.skipped,
        "resumable.stop_reason": None if facts.stop_reason is None else stop_reason_text(facts.stop_reason),
        "resumable.checkpoints": facts.checkpoints,
        "resumable.resumed_from": None if facts.resumed_from is None else _json(facts.resumed_from),
        "resumable.position": None if facts.position is None else _json(facts.position),
    }
    if facts.partition is not None:
        attributes.update({"resumable.partition.job": _name(facts.partition.job),
                           "resumable.partition.index": facts.partition.index,
                           "resumable.partition.count": facts.partition.count})
    return {k: v for k, v in attributes.items() if v is not None}


class AttemptTrace:
    """One attempt's span, fed by the reporter (after each durable row) and by :func:`attempt_span`."""

    def __init__(self, span: Any, tracer: Any, log: Any):
        self.span = span
        self.log = log
        self.events = 0
        self.unrecorded = 0
        self._failed = False
        self._acquire: Any = self._guard(
            lambda: tracer.start_span(SPAN_ACQUIRE, context=_trace.set_span_in_context(span)))

    def _guard(self, fn: Any) -> Any:
        if self._failed:
            return None
        try:
            return fn()
        except Exception as failed:
            self._failed = True
            self.log.warning("OpenTelemetry: could not record this attempt's span; the attempt goes on untraced: %s",
                             outward_traceback(failed))
            return None

    def _end_acquire(self, **attributes: Any) -> None:
        acquire, self._acquire = self._acquire, None
        if acquire is not None:
            acquire.set_attributes({k: v for k, v in attributes.items() if v is not None})
            acquire.end()

    def acquired(self, cp: Checkpoint, *, resumed: bool) -> None:
        """The attempt holds the lease; the row says ``running``."""
        def record() -> None:
            if not self.span.is_recording():  # no tracer provider: encode nothing
                self._end_acquire()
                return
            resumed_from = _json(cp.position) if resumed and cp.position is not None else None
            self._end_acquire(**{"resumable.resumed": resumed, "resumable.resumed_from": resumed_from})
            self.span.set_attributes({"resumable.resumed": resumed, "resumable.processed_start": cp.processed})
        self._guard(record)

    def checkpoint(self, cp: Checkpoint, progress: Progress) -> None:
        """A progress report (at its pace, not per checkpoint): an event, up to the cap."""
        if self.events >= MAX_CHECKPOINT_EVENTS:
            self.unrecorded += 1
            return
        self.events += 1
        attributes = {"resumable.processed": progress.processed, "resumable.total": progress.total,
                      "resumable.rate": progress.rate,
                      "resumable.save_ms": None if progress.save_seconds is None else progress.save_seconds * 1000}
        self._guard(lambda: self.span.add_event("resumable.checkpoint",
                                                {k: v for k, v in attributes.items() if v is not None}))

    def finished(self, cp: Checkpoint) -> None:
        """The attempt ended (any status) and gave the lease back."""
        def record() -> None:
            self._end_acquire()
            attributes = {"resumable.status": cp.status,
                          "resumable.stop_reason": None if cp.stop_reason is None else stop_reason_text(cp.stop_reason),
                          "resumable.processed": cp.processed, "resumable.total": cp.total}
            self.span.add_event("resumable.stop", {k: v for k, v in attributes.items() if v is not None})
        self._guard(record)

    def raised(self, exc: BaseException) -> None:
        """How ``execute()`` left: a deferral (a pause), an overlap decision, or an error."""
        from airflow_resumable.version_compat import AirflowRescheduleException, AirflowSkipException, TaskDeferred

        def record() -> None:
            if isinstance(exc, TaskDeferred):
                resume_at = getattr(getattr(exc, "trigger", None), "until", None)
                self.span.add_event("resumable.pause", {k: v for k, v in {
                    "resumable.resume_at": resume_at, "resumable.deferred_to": type(exc.trigger).__name__}.items()
                    if v is not None})
            elif isinstance(exc, AirflowRescheduleException):
                self.span.add_event("resumable.wait", {"resumable.overlap": "wait"})
            elif isinstance(exc, AirflowSkipException):
                self.span.add_event("resumable.skip", {"resumable.overlap": "skip"})
            else:
                self._record_exception(exc)
                self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        self._guard(record)

    def _record_exception(self, exc: BaseException) -> None:
        """OpenTelemetry's ``exception`` event (its semantic conventions' attributes), with the message and
        the traceback passed through :func:`~airflow_resumable.core.model.observe.outward_text` and cut:
        an error's text may hold a DSN with its password (``span.record_exception`` would send it as it is)."""
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        kind = type(exc).__qualname__
        self.span.add_event("exception", {
            "exception.type": kind if type(exc).__module__ == "builtins" else f"{type(exc).__module__}.{kind}",
            "exception.message": outward_text(_message(exc), TEXT_LIMIT),
            "exception.stacktrace": outward_text(trace, STACK_LIMIT),
            "exception.escaped": True,
        })

    def end(self, facts: AttemptFacts | None) -> None:
        def record() -> None:
            self._end_acquire()
            if facts is not None and self.span.is_recording():
                self.span.set_attributes(facts_attributes(facts))
            if self.unrecorded:
                self.span.set_attribute("resumable.checkpoint_events_unrecorded", self.unrecorded)
        self._guard(record)
        try:
            self.span.end()
        except Exception:  # pragma: no cover - a broken SDK
            pass


@contextmanager
def attempt_span(operator: Any, context: Any) -> Iterator[AttemptTrace | None]:
    """The span of one execution of ``operator`` (see the module's docstring), current while it
    runs; None without ``opentelemetry-api`` (or when the span cannot be opened: logged)."""
    if _trace is None:
        yield None
        return
    try:
        from airflow_resumable.operators.task_instance import slot_of

        ti = context["ti"]
        tracer = _trace.get_tracer(TRACER_NAME, __version__)
        span = tracer.start_span(SPAN_ATTEMPT, attributes={
            "resumable.job": _name(operator.job_name(context)), "resumable.slot": _name(slot_of(context)[0]),
            "resumable.attempt": ti.try_number, "airflow.dag_id": _name(ti.dag_id), "airflow.task_id": _name(ti.task_id),
            "airflow.dag_run.run_id": _name(ti.run_id), "airflow.task_instance.try_number": ti.try_number,
            "airflow.task_instance.map_index": getattr(ti, "map_index", -1) if getattr(ti, "map_index", None) is not None
            else -1,
        })
        traced = AttemptTrace(span, tracer, operator.log)
    except Exception as failed:
        operator.log.warning("OpenTelemetry: could not open this attempt's span; the attempt goes on untraced: %s",
                             outward_traceback(failed))
        yield None
        return
    with _trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        try:
            yield traced
        except BaseException as exc:
            traced.raised(exc)
            raise
        finally:
            traced.end(getattr(operator, "_observed", None))
