"""OpenLineage: the events the real OpenLineage provider emits for resumable tasks run under
``dag.test()``, read back from its file transport, carry our ``resumable`` run facet (valid against
the schema the package ships, and the events against OpenLineage's rules), the reader's table as an
input and the handler's outputs.

Each DAG runs in a process of its own (``tests/support/dag_run.py``): the provider decides at import
whether it listens (it does only with a transport configured), once per process.

Store-insensitive (``one_store``): what reaches the lineage events, not the checkpoint store.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.stores import Store

ROOT = Path(__file__).resolve().parent.parent
DAY = "2026-02-01T00:00:00+00:00"

openlineage = pytest.importorskip(
    "airflow.providers.openlineage", reason="the OpenLineage provider (the openlineage extra) is not installed")


# -- OpenLineage's rules for a RunEvent (spec 2-0-2), as a consumer relies on them ------------------
#
# OpenLineage publishes its schema at https://openlineage.io/spec/2-0-2/OpenLineage.json; no
# installable package carries it and these machines cannot fetch it, so the rules the events must
# keep are written out here, from the spec's text: a RunEvent's required fields and formats, a
# dataset's namespace and name, and every facet's _producer and _schemaURL (BaseFacet).
_URI = {"type": "string", "format": "uri"}
_FACET = {"type": "object", "properties": {"_producer": _URI, "_schemaURL": _URI},
          "required": ["_producer", "_schemaURL"]}
_FACETS = {"type": "object", "additionalProperties": {"$ref": "#/$defs/BaseFacet"}}
_DATASET = {"type": "object", "properties": {"namespace": {"type": "string"}, "name": {"type": "string"},
                                            "facets": _FACETS}, "required": ["namespace", "name"]}
OPENLINEAGE_RUN_EVENT = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://openlineage.io/spec/2-0-2/OpenLineage.json",
    "$defs": {
        "BaseFacet": _FACET,
        "RunFacet": {"allOf": [{"$ref": "#/$defs/BaseFacet"}]},
        "RunEvent": {
            "type": "object",
            "properties": {
                "eventTime": {"type": "string", "format": "date-time"},
                "producer": _URI,
                "schemaURL": _URI,
                "eventType": {"enum": ["START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"]},
                "run": {"type": "object", "properties": {"runId": {"type": "string", "format": "uuid"},
                                                         "facets": _FACETS}, "required": ["runId"]},
                "job": {"type": "object", "properties": {"namespace": {"type": "string"}, "name": {"type": "string"},
                                                         "facets": _FACETS}, "required": ["namespace", "name"]},
                "inputs": {"type": "array", "items": _DATASET},
                "outputs": {"type": "array", "items": _DATASET},
            },
            "required": ["eventTime", "producer", "schemaURL", "run", "job"],
        },
    },
    "$ref": "#/$defs/RunEvent",
}


def validators() -> tuple[Any, Any]:
    """A validator of OpenLineage's RunEvent rules, and one of our facet's schema (whose base,
    OpenLineage's RunFacet, resolves to the rules above), both checking formats."""
    import jsonschema
    from referencing import Registry, Resource

    from airflow_resumable.lineage import SCHEMA_FILE

    ours = json.loads(SCHEMA_FILE.read_text())
    registry = Registry().with_resources([
        (OPENLINEAGE_RUN_EVENT["$id"], Resource.from_contents(OPENLINEAGE_RUN_EVENT)),
        (ours["$id"], Resource.from_contents(ours)),
    ])
    check = jsonschema.FormatChecker()
    event = jsonschema.Draft202012Validator(OPENLINEAGE_RUN_EVENT, registry=registry, format_checker=check)
    facet = jsonschema.Draft202012Validator({"$ref": f"{ours['$id']}#/$defs/ResumableRunFacet"}, registry=registry,
                                            format_checker=check)
    return event, facet


# -- running a DAG with the provider listening -------------------------------------------------------


@pytest.fixture
def source_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SQLite database ``lineage_source`` with 50 loans (ids 1..50, amount = id)."""
    path = tmp_path / "source.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE loans (id INTEGER PRIMARY KEY, amount INTEGER)")
        db.executemany("INSERT INTO loans VALUES (?, ?)", [(i, i) for i in range(1, 51)])
    monkeypatch.setenv("AIRFLOW_CONN_LINEAGE_SOURCE", f"sqlite:///{path}")
    return path


def run_with_lineage(dag_id: str, events: Path, *, conf: dict[str, Any] | None = None,
                     env: dict[str, str] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``dag_id`` under ``dag.test()`` with the OpenLineage provider's file transport writing to
    ``events``; the run's state and the events of its tasks, in order."""
    environ = {**os.environ, **(env or {}),
               "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events),
                                                              "append": True}),
               "AIRFLOW__OPENLINEAGE__NAMESPACE": "resumable-tests"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "dag_run.py"), dag_id,
                             json.dumps(conf or {}), DAY], capture_output=True, text=True, env=environ, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("DAG_RUN_RESULT "))[15:])
    lines = events.read_text().splitlines() if events.exists() else []
    task_events = [e for e in map(json.loads, lines) if "." in e["job"]["name"]]  # not the DAG's own
    return run, task_events


def facet(event: dict[str, Any]) -> dict[str, Any]:
    return event["run"]["facets"]["resumable"]


# -- the tests -------------------------------------------------------------------------------------------


@pytest.mark.one_store("asserts the OpenLineage events, not the store", kind="sqlite")
def test_a_crash_then_a_resume_carries_the_facet_on_every_event_with_the_table_as_input(
    checkpoints: Store, airflow_home: Path, source_db: Path, tmp_path: Path
) -> None:
    """Given a ChunkedOperator reading table ``loans`` through connection ``lineage_source``,
    When try 1 raises in its third chunk and try 2 resumes,
    Then START, FAIL, START, COMPLETE carry the ``resumable`` facet (valid against our schema and
    the events against OpenLineage's rules): try 2 resumed from try 1's last checkpoint, and
    ``loans`` is the input, ``loan_totals`` the output, both in the SQLite file's namespace."""
    run, events = run_with_lineage("ol_loans", tmp_path / "events.jsonl", conf={"fail": [1, 2]})
    assert run["state"] == "success"
    assert [e["eventType"] for e in events] == ["START", "FAIL", "START", "COMPLETE"]
    event_ok, facet_ok = validators()
    for event in events:
        event_ok.validate(event)
        facet_ok.validate(facet(event))
    start1, fail, start2, complete = (facet(e) for e in events)
    assert {k: start1[k] for k in ("job", "attempt", "status")} == {"job": "ol_loans.sum_loans", "attempt": 1,
                                                                    "status": "running"}
    assert start1["slot"] == complete["slot"] == "2026-02-01T00:00:00+00:00"
    assert {k: fail[k] for k in ("attempt", "status", "resumed", "position", "processed", "checkpoints")} == {
        "attempt": 1, "status": "failed", "resumed": False, "position": 20, "processed": 20, "checkpoints": 2}
    assert {k: complete[k] for k in ("attempt", "status", "resumed", "resumedFrom", "position", "processed",
                                     "total", "checkpoints")} == {
        "attempt": 2, "status": "done", "resumed": True, "resumedFrom": 20, "position": 50, "processed": 50,
        "total": 50, "checkpoints": 3}
    namespace = f"sqlite://{source_db}"
    for event in events:
        assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [(namespace, "loans")]
    assert [(d["namespace"], d["name"]) for d in events[-1]["outputs"]] == [(namespace, "loan_totals")]
