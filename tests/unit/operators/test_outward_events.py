"""A handler's own stop reason holding credentials in the forms the first scrubber kept (``pass=``,
``passphrase=``, ``pw=``, ``private_key=``, ``auth=``, ``user:password@host`` without a scheme) reaches
neither the ``resumable.attempt`` span nor the ``resumable`` facet with them, in a real ``dag.test()``
run (``tests/support/dag_run.py``, in a process of its own: the tracer provider and the OpenLineage
listener are chosen once per process), spans recorded by OpenTelemetry's SDK and events written by the
OpenLineage provider's file transport.

Store-insensitive (``one_store``): what reaches the span and the events, not the checkpoint store.
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
#: One secret per form, each its own so that a leak names its form.
SECRETS = {"pass": "s3cr3t-pass-1", "passphrase": "s3cr3t-phrase-2", "pw": "s3cr3t-pw-3",
           "private_key": "s3cr3t-key-4", "auth": "s3cr3t-auth-5", "userinfo": "s3cr3t-dsn-6"}
REASON = (f"stopped: pass={SECRETS['pass']} passphrase={SECRETS['passphrase']} pw={SECRETS['pw']} "
          f"private_key={SECRETS['private_key']} auth={SECRETS['auth']} "
          f"bob:{SECRETS['userinfo']}@db.internal:5432/x")


def traced_and_lineage_run(dag_id: str, tmp_path: Path, conf: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                                       list[dict[str, Any]]]:
    """Run ``dag_id`` under ``dag.test()`` with every span recorded and the OpenLineage provider writing its
    events to a file; the spans and the events of its tasks."""
    spans, events = tmp_path / "spans.json", tmp_path / "events.jsonl"
    env = {**os.environ, "RESUMABLE_TRACE_TO": str(spans),
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events), "append": True}),
           "AIRFLOW__OPENLINEAGE__NAMESPACE": "resumable-tests", "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "120"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "dag_run.py"), dag_id, json.dumps(conf),
                             DAY], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    lines = events.read_text().splitlines() if events.exists() else []
    return json.loads(spans.read_text()), [e for e in map(json.loads, lines) if "." in e["job"]["name"]]


@pytest.mark.one_store("asserts the span and the events, not the store", kind="sqlite")
def test_a_stop_reason_s_credentials_in_the_six_forms_reach_neither_the_span_nor_the_facet(
    checkpoints: Store, airflow_home: Path, tmp_path: Path
) -> None:
    spans, events = traced_and_lineage_run("ol_reason", tmp_path, {"reason": REASON})
    attempt = next(s for s in spans if s["name"] == "resumable.attempt")
    stop = next(e for e in attempt["events"] if e["name"] == "resumable.stop")["attributes"]
    shown = attempt["attributes"]["resumable.stop_reason"]
    assert stop["resumable.stop_reason"] == shown == (
        "stopped: pass=*** passphrase=*** pw=*** private_key=*** auth=*** ***@db.internal:5432/x")
    facets = [e["run"]["facets"]["resumable"] for e in events if "resumable" in e["run"]["facets"]]
    assert facets and facets[-1]["stopReason"] == shown
    # Nothing of ours carries them: no span, no resumable facet (the provider's own facets carry the DAG
    # run's conf, which holds the reason as the test wrote it).
    leaked = {form: s for form, s in SECRETS.items() if s in json.dumps(spans) + json.dumps(facets)}
    assert not leaked, leaked
