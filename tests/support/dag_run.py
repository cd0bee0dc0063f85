"""Run one DAG with ``dag.test()`` in a process of its own, for a test that needs Airflow set up
afresh (its plugins, listeners and tracer provider are chosen once per process, at import):

    python tests/support/dag_run.py DAG_ID '{"conf": ...}' 2026-02-01T00:00:00+00:00

The environment is the caller's (the Airflow home, the connections, ``[openlineage]``); prints
``DAG_RUN_RESULT {"state": ..., "run_id": ...}`` on a line of its own.

With ``RESUMABLE_TRACE_TO=<file>``, OpenTelemetry's SDK records every span in memory and the spans
are written to that file as JSON when the run ends. Where the task SDK has its span of a task's
try (``_make_task_span``, Airflow 3.2 and later), each try that ``dag.test()`` runs in line runs
inside it, as a worker's task process does (``task_runner.main()`` opens it around the try); on
Airflow 3.1 there is none.

With ``RESUMABLE_REPORT_IMPORTS=<package>,...``, prints ``DAG_RUN_IMPORTED [...]``: the modules of
those packages the run imported.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def trace_in_memory() -> object:
    """OpenTelemetry's SDK with an in-memory exporter, and each try in the task SDK's own span."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    from types import SimpleNamespace

    from airflow.sdk.execution_time import task_runner

    make_task_span = getattr(task_runner, "_make_task_span", None)
    if make_task_span is not None:
        real_run = task_runner.run

        def run_in_the_task_span(ti, context, log):  # type: ignore[no-untyped-def]
            with make_task_span(SimpleNamespace(ti=ti)):
                return real_run(ti, context, log)

        task_runner.run = run_in_the_task_span
    return exporter


def spans_as_json(exporter: object) -> list[dict[str, object]]:
    return [{"name": s.name, "span_id": s.context.span_id, "trace_id": s.context.trace_id,
             "parent_id": s.parent.span_id if s.parent else None, "attributes": dict(s.attributes or {}),
             "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in s.events],
             "status": s.status.status_code.name, "start": s.start_time, "end": s.end_time}
            for s in exporter.get_finished_spans()]  # type: ignore[attr-defined]


def main() -> None:
    from devtools.dags import DagFolder

    reported = [n for n in os.environ.get("RESUMABLE_REPORT_IMPORTS", "").split(",") if n]
    trace_to = os.environ.get("RESUMABLE_TRACE_TO")
    exporter = trace_in_memory() if trace_to else None
    dag_id, conf, logical_date = sys.argv[1], json.loads(sys.argv[2]), datetime.fromisoformat(sys.argv[3])
    dag = DagFolder(Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]), "_dag_run_").load(dag_id)
    run = dag.test(run_conf=conf, logical_date=logical_date)
    if trace_to:
        Path(trace_to).write_text(json.dumps(spans_as_json(exporter), default=str))
    imported = sorted(n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in reported))
    print("DAG_RUN_IMPORTED " + json.dumps(imported), flush=True)
    print("DAG_RUN_RESULT " + json.dumps({"state": str(run.state), "run_id": run.run_id}), flush=True)


if __name__ == "__main__":
    main()
