"""OpenTelemetry: the spans of a resumable task that pauses (defers) and resumes, recorded by
OpenTelemetry's SDK with its in-memory exporter, in a real ``dag.test()`` run in a process of its own
(``tests/support/dag_run.py``: one tracer provider per process).

Where the task SDK opens a span per try (Airflow 3.2 and 3.3: ``worker.<task_id>``), each attempt's
span is its child; on Airflow 3.1 it has none, and the attempt's span is a root.

Store-insensitive (``one_store``): spans, not the checkpoint store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from support.paths import ROOT

DAY = "2026-02-01T00:00:00+00:00"

# OpenTelemetry's API comes with Airflow (its task SDK imports it from 3.2 on; Airflow 3.1 depends on it
# too) and its SDK with the test extra: a missing one fails here, loudly, rather than skipping.
import opentelemetry.sdk.trace  # noqa: E402,F401
import opentelemetry.trace  # noqa: E402,F401


def traced_run(dag_id: str, tmp_path: Path, conf: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Run ``dag_id`` with every span recorded; the run's state and the spans."""
    spans = tmp_path / "spans.json"
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "dag_run.py"), dag_id,
                             json.dumps(conf or {}), DAY], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "RESUMABLE_TRACE_TO": str(spans)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("DAG_RUN_RESULT "))[15:])
    return run["state"], json.loads(spans.read_text())


def task_span_exists() -> bool:
    from airflow.sdk.execution_time import task_runner

    return hasattr(task_runner, "_make_task_span")


@pytest.mark.one_store("asserts spans, not the store", kind="sqlite")
def test_a_paused_and_resumed_task_has_one_attempt_span_per_execution_nested_under_the_task_s_span(
    checkpoints: Store, airflow_home: Path, tmp_path: Path
) -> None:
    """Given a task whose throttle pauses it (a deferral) after its first chunk,
    When it resumes in the same try and finishes,
    Then there are two ``resumable.attempt`` spans, each the child of its execution's task span
    (a root on Airflow 3.1), each with a ``resumable.acquire`` child; the first ends with a
    ``resumable.pause`` event and a paused stop, the second resumes from position 1 and ends done."""
    state, spans = traced_run("ol_pause", tmp_path)
    assert state == "success"
    by_id = {s["span_id"]: s for s in spans}
    attempts = sorted((s for s in spans if s["name"] == "resumable.attempt"), key=lambda s: s["start"])
    assert len(attempts) == 2
    first, second = attempts
    for span in attempts:
        assert {k: span["attributes"][k] for k in ("resumable.job", "resumable.attempt", "airflow.task_id")} == {
            "resumable.job": "ol_pause.work", "resumable.attempt": 1, "airflow.task_id": "work"}
        assert span["attributes"]["resumable.slot"] == "2026-02-01T00:00:00+00:00"
        parent = by_id.get(span["parent_id"]) if span["parent_id"] else None
        if task_span_exists():
            assert parent is not None and parent["name"] == "worker.work", span
        else:
            assert span["parent_id"] is None, "Airflow 3.1 opens no task span: the attempt's span is a root"
        acquire = [s for s in spans if s["name"] == "resumable.acquire" and s["parent_id"] == span["span_id"]]
        assert len(acquire) == 1 and acquire[0]["trace_id"] == span["trace_id"]
    assert [e["name"] for e in first["events"]][-2:] == ["resumable.stop", "resumable.pause"]
    stop = next(e for e in first["events"] if e["name"] == "resumable.stop")["attributes"]
    assert (stop["resumable.status"], stop["resumable.stop_reason"]) == ("paused", "throttled")
    assert first["attributes"]["resumable.status"] == "paused" and first["status"] == "UNSET"
    assert {k: second["attributes"][k] for k in ("resumable.resumed", "resumable.resumed_from", "resumable.status",
                                                 "resumable.processed", "resumable.checkpoints")} == {
        "resumable.resumed": True, "resumable.resumed_from": "1", "resumable.status": "done",
        "resumable.processed": 3, "resumable.checkpoints": 2}
    assert [e["name"] for e in second["events"]][-1] == "resumable.stop"
    assert sum(e["name"] == "resumable.checkpoint" for s in attempts for e in s["events"]) >= 1
    if os.environ.get("RESUMABLE_DOCS_SPANS"):  # the docs' rendered trace (docs/how-to/tracing.md)
        Path(os.environ["RESUMABLE_DOCS_SPANS"]).write_text(json.dumps(spans, indent=2))


@pytest.mark.one_store("asserts spans, not the store", kind="sqlite")
def test_a_failed_try_s_span_records_the_error_and_the_retry_s_span_resumes(
    checkpoints: Store, airflow_home: Path, tmp_path: Path
) -> None:
    """Given try 1 raising in its third chunk an error whose text holds a DSN with its password, When
    try 2 resumes, Then try 1's span has status ERROR with the exception recorded (its type, and its
    message and traceback without the password) and a failed stop, and try 2's span resumed from 20."""
    import sqlite3

    source = tmp_path / "source.db"
    with sqlite3.connect(source) as db:
        db.execute("CREATE TABLE loans (id INTEGER PRIMARY KEY, amount INTEGER)")
        db.executemany("INSERT INTO loans VALUES (?, ?)", [(i, i) for i in range(1, 51)])
    os.environ["AIRFLOW_CONN_LINEAGE_SOURCE"] = f"sqlite:///{source}"
    try:
        state, spans = traced_run("ol_loans", tmp_path, conf={
            "fail": [1, 2], "error": "could not reach postgresql://alice:hunter2@db.example:5432/loans"})
    finally:
        del os.environ["AIRFLOW_CONN_LINEAGE_SOURCE"]
    assert state == "success"
    tries = sorted((s for s in spans if s["name"] == "resumable.attempt"), key=lambda s: s["start"])
    assert [s["attributes"]["resumable.attempt"] for s in tries] == [1, 2]
    assert tries[0]["status"] == "ERROR"
    assert "hunter2" not in json.dumps(tries)
    error = next(e for e in tries[0]["events"] if e["name"] == "exception")["attributes"]
    assert error["exception.type"] == "RuntimeError"
    assert error["exception.message"] == "could not reach postgresql://db.example:5432/loans"
    assert "RuntimeError: could not reach postgresql://db.example:5432/loans" in error["exception.stacktrace"]
    assert tries[0]["attributes"]["resumable.status"] == "failed"
    assert (tries[1]["status"], tries[1]["attributes"]["resumable.resumed_from"]) == ("UNSET", "20")


def test_without_opentelemetry_an_attempt_runs_untraced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given ``opentelemetry-api`` not importable (the module's ``_trace`` is None then), When an
    attempt's span is asked for, Then there is none, and the block runs as it would."""
    from airflow_resumable.operators import tracing

    monkeypatch.setattr(tracing, "_trace", None)
    ran = []
    with tracing.attempt_span(object(), {}) as traced:
        ran.append(traced)
    assert ran == [None]


def test_an_error_s_password_never_reaches_the_span_however_the_error_says_it() -> None:
    """Given an attempt's span (OpenTelemetry's SDK, in-memory exporter), When the attempt raises an
    error chained to a driver's error, both texts holding passwords (a URL's, a libpq DSN's), Then the
    span's ``exception`` event names the error's type and keeps the texts without the passwords, and its
    status description is the type only."""
    import logging

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from airflow_resumable.operators.tracing import AttemptTrace

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    span = tracer.start_span("resumable.attempt")
    traced = AttemptTrace(span, tracer, logging.getLogger("test_tracing"))
    try:
        try:
            raise ConnectionError("host=db user=alice password=s3cret-pw dbname=x: timeout")
        except ConnectionError as driver:
            raise RuntimeError("could not reach postgresql://alice:hunter2@db:5432/x?sslkey=k") from driver
    except RuntimeError as exc:
        traced.raised(exc)
    traced.end(None)
    recorded = next(s for s in exporter.get_finished_spans() if s.name == "resumable.attempt")
    event = next(e for e in recorded.events if e.name == "exception")
    assert event.attributes is not None
    assert event.attributes["exception.message"] == "could not reach postgresql://db:5432/x"
    assert "password=*** dbname=x: timeout" in str(event.attributes["exception.stacktrace"])
    assert recorded.status.description == "RuntimeError"
    everything = str([(e.name, dict(e.attributes or {})) for e in recorded.events]) + str(recorded.attributes)
    assert "hunter2" not in everything and "s3cret-pw" not in everything and "sslkey" not in everything


def test_a_stop_reason_holding_a_dsn_reaches_the_span_without_its_password() -> None:
    """Given an attempt's span, When the attempt stops with a reason of the handler's own that holds a
    DSN with a user and a password (``Cancelled("postgresql://bob:pw@db/x")``), Then the ``resumable.stop``
    event and the span's ``resumable.stop_reason`` keep the host, not the user or the password."""
    import logging

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from airflow_resumable.core.model.checkpoint import Checkpoint
    from airflow_resumable.core.model.observe import AttemptFacts
    from airflow_resumable.operators.tracing import AttemptTrace

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    traced = AttemptTrace(tracer.start_span("resumable.attempt"), tracer, logging.getLogger("test_tracing"))
    reason = "postgresql://bob:reason-pw-7@db.internal/x"
    traced.finished(Checkpoint(job="j", slot="s", status="cancelled", stop_reason=reason, processed=10))
    traced.end(AttemptFacts(job="j", slot="s", attempt=1, status="cancelled", stop_reason=reason))
    recorded = next(s for s in exporter.get_finished_spans() if s.name == "resumable.attempt")
    stop = next(e for e in recorded.events if e.name == "resumable.stop")
    assert stop.attributes is not None and recorded.attributes is not None
    assert stop.attributes["resumable.stop_reason"] == recorded.attributes["resumable.stop_reason"] == (
        "postgresql://db.internal/x")
