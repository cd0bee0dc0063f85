"""OpenLineage: the events the real OpenLineage provider emits for resumable tasks run under
``dag.test()``, read back from its file transport, carry our ``resumable`` run facet (valid against
the schema the package ships, and the events against OpenLineage's published schema, vendored in
``tests/openlineage_spec/``), the reader's table as an input and the handler's outputs.

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
from support.paths import ROOT

DAY = "2026-02-01T00:00:00+00:00"

# The provider runs on every supported Airflow (3.1 to 3.3) and comes with the test extra: a
# missing one fails here, loudly, rather than skipping.
import airflow.providers.openlineage  # noqa: E402,F401

# -- OpenLineage's published schemas (tests/openlineage_spec/, vendored: see its README) ---------------

SPEC = ROOT / "tests" / "openlineage_spec"


def validators() -> tuple[Any, Any]:
    """A validator of OpenLineage's own schema (``OpenLineage.json`` 2-0-2, the RunEvent and every facet's
    base), and one of our facet's schema (whose base is OpenLineage's ``RunFacet``), both checking formats;
    offline: every ``$ref`` resolves from the registry, none is fetched."""
    import jsonschema
    from referencing import Registry, Resource

    from airflow_resumable.lineage import SCHEMA_FILE

    schemas = [json.loads(path.read_text()) for path in sorted(SPEC.glob("*.json"))]
    schemas.append(json.loads(SCHEMA_FILE.read_text()))
    registry = Registry().with_resources([(schema["$id"], Resource.from_contents(schema)) for schema in schemas])
    check = jsonschema.FormatChecker()
    event = jsonschema.Draft202012Validator({"$ref": "https://openlineage.io/spec/2-0-2/OpenLineage.json"},
                                            registry=registry, format_checker=check)
    ours = json.loads(SCHEMA_FILE.read_text())["$id"]
    facet = jsonschema.Draft202012Validator({"$ref": f"{ours}#/$defs/ResumableRunFacet"}, registry=registry,
                                            format_checker=check)
    return event, facet


def job_dependencies_validator() -> Any:
    """OpenLineage's ``jobDependencies`` run facet schema (1-0-1), as the summary's event carries it."""
    import jsonschema
    from referencing import Registry, Resource

    schemas = [json.loads(path.read_text()) for path in sorted(SPEC.glob("*.json"))]
    registry = Registry().with_resources([(schema["$id"], Resource.from_contents(schema)) for schema in schemas])
    return jsonschema.Draft202012Validator(
        {"$ref": "https://openlineage.io/spec/facets/1-0-1/JobDependenciesRunFacet.json#/$defs/JobDependenciesRunFacet"},
        registry=registry, format_checker=jsonschema.FormatChecker())


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
               "AIRFLOW__OPENLINEAGE__NAMESPACE": "resumable-tests",
               # The provider emits each event from a forked process it gives 10 s by default: on a loaded
               # machine that fork can take longer, and the event is dropped (the run still succeeds).
               "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "120"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "dag_run.py"), dag_id,
                             json.dumps(conf or {}), DAY], capture_output=True, text=True, env=environ, timeout=300)
    (events.parent / f"{dag_id}.log").write_text(result.stdout + result.stderr)  # the run's log, beside its events
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
    the events against OpenLineage's published schema): try 2 resumed from try 1's last checkpoint, and
    ``loans`` is the input of every event (START included), ``loan_totals`` the output, both in the
    SQLite file's namespace."""
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
    # The reader's table is named in the task's own process before each START (the listener's forked
    # process cannot always look a connection up): every event has it.
    for event in events:
        assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [(namespace, "loans")], event["eventType"]
    assert [(d["namespace"], d["name"]) for d in events[-1]["outputs"]] == [(namespace, "loan_totals")]
    if os.environ.get("RESUMABLE_DOCS_EVENT"):  # the docs' rendered event (docs/how-to/openlineage.md)
        Path(os.environ["RESUMABLE_DOCS_EVENT"]).write_text(json.dumps(events[-1], indent=2))


@pytest.mark.one_store("asserts the OpenLineage events, not the store", kind="sqlite")
def test_credentials_never_reach_an_event_and_a_huge_position_goes_cut(
    checkpoints: Store, airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a @task.resumable handler that reads a file URL with a key, a secret and a signed query,
    writes a table through a PostgreSQL connection whose URI holds a password (a server that
    refuses connections: its current schema cannot be asked), and checkpoints a 100 kB position,
    When it runs, Then it succeeds; no event holds the password, the key, the secret or the
    signature; the input is ``s3://landing`` / ``items.jsonl``, the output the connection's
    ``postgres://host:port`` / ``warehouse.public.items_copy``; the position is a short preview."""
    monkeypatch.setenv("AIRFLOW_CONN_LINEAGE_SOURCE", "postgresql://alice:s3cret-pw@127.0.0.1:1/warehouse")
    run, events = run_with_lineage("ol_taskflow", tmp_path / "events.jsonl", conf={"position_bytes": 100_000})
    assert run["state"] == "success"
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    text = json.dumps(events)
    for secret in ("s3cret-pw", "alice", "inbox-secret", "inbox-key", "X-Amz-Signature", "sig"):
        assert secret not in text, secret
    complete = events[-1]
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == [("s3://landing", "items.jsonl")]
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [
        ("postgres://127.0.0.1:1", "warehouse.public.items_copy")]
    position = facet(complete)["position"]
    assert position["truncated"] is True and position["bytes"] == 100_002 and len(position["preview"]) == 203
    assert len(json.dumps(facet(complete))) < 2_000
    validators()[1].validate(facet(complete))


@pytest.mark.one_store("asserts the OpenLineage events, not the store", kind="sqlite")
def test_a_partitioned_job_s_summary_names_its_partitions_runs_as_one_job_s_parts(
    checkpoints: Store, airflow_home: Path, source_db: Path, tmp_path: Path
) -> None:
    """Given a job over ``loans`` in 3 partitions, When it runs, Then each partition's events carry
    its place (index of 3 in ``ol_partitioned.export``) and ``loans`` as input, and the summary's
    COMPLETE event names the 3 parts, and, in OpenLineage's ``jobDependencies`` facet, the very
    runs the partitions' events were emitted for."""
    run, events = run_with_lineage("ol_partitioned", tmp_path / "events.jsonl")
    assert run["state"] == "success"
    parts = [e for e in events if e["job"]["name"] == "ol_partitioned.export.partition"]
    completes = {facet(e)["partition"]["index"]: e for e in parts if e["eventType"] == "COMPLETE"}
    assert sorted(completes) == [0, 1, 2]
    for index, event in completes.items():
        assert {k: facet(event)["partition"][k] for k in ("job", "index", "count")} == {
            "job": "ol_partitioned.export", "index": index, "count": 3}
        assert facet(event)["job"] == f"ol_partitioned.export[{index}]"
        assert [d["name"] for d in event["inputs"]] == ["loans"]
    summary = next(e for e in events if e["job"]["name"] == "ol_partitioned.export.summary"
                   and e["eventType"] == "COMPLETE")
    validators()[0].validate(summary)
    validators()[1].validate(facet(summary))
    job_dependencies_validator().validate(summary["run"]["facets"]["jobDependencies"])
    partitions = facet(summary)["partitions"]
    assert (partitions["count"], partitions["done"], partitions["failed"]) == (3, 3, [])
    assert [(p["index"], p["job"], p["status"]) for p in partitions["parts"]] == [
        (i, f"ol_partitioned.export[{i}]", "done") for i in range(3)]
    assert sum(p["processed"] for p in partitions["parts"]) == 50
    upstream = summary["run"]["facets"]["jobDependencies"]["upstream"]
    assert {u["run"]["runId"] for u in upstream} == {e["run"]["runId"] for e in completes.values()}
    assert {u["job"]["name"] for u in upstream} == {"ol_partitioned.export.partition"}


@pytest.mark.one_store("asserts the OpenLineage events, not the store", kind="sqlite")
def test_a_connection_that_cannot_be_looked_up_costs_the_events_their_input_not_the_task(
    checkpoints: Store, airflow_home: Path, tmp_path: Path
) -> None:
    """Given the reader's connection ``lineage_source`` not defined (its datasource cannot be named),
    When the task runs (and fails: its reader cannot read either), Then every try's events still come
    at once (no lookup in the listener's process to wait out), with the facet and without the input,
    and the task's log says why."""
    run, events = run_with_lineage("ol_loans", tmp_path / "events.jsonl")
    assert run["state"] == "failed"
    assert [e["eventType"] for e in events] == ["START", "FAIL"]  # a missing connection is not retried
    for event in events:
        assert event["inputs"] == [] and facet(event)["job"] == "ol_loans.sum_loans"
    log = (tmp_path / "ol_loans.log").read_text()
    assert "OpenLineage: could not name the table 'loans' (connection 'lineage_source'" in log
    assert "expired and will be terminated" not in log


def test_a_failing_facet_builder_is_logged_and_the_event_goes_without_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given building the facet raises, When the provider asks for the complete event's lineage,
    Then the answer is None (the provider emits its event without ours) and a warning is logged."""
    import logging

    from airflow_resumable import ResumableOperator
    from airflow_resumable.core.model.observe import AttemptFacts
    from airflow_resumable.lineage import facets

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a broken facet")

    monkeypatch.setattr(facets, "run_facet", broken)
    logger = logging.getLogger("test_lineage.task")  # the task's logger, as caplog can read it
    monkeypatch.setattr(ResumableOperator, "log", property(lambda self: logger))
    op = ResumableOperator(task_id="t", handler=lambda ctx: None)
    op._observed = AttemptFacts(job="j", slot="s", attempt=1, status="done")
    with caplog.at_level(logging.WARNING):
        assert op.get_openlineage_facets_on_complete(object()) is None
        assert op.get_openlineage_facets_on_failure(object()) is None
    assert "OpenLineage: could not build this task's lineage" in caplog.text and "a broken facet" in caplog.text


def test_with_the_provider_not_listening_no_lineage_module_is_imported_and_the_task_runs(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the OpenLineage provider installed without a transport (it then registers no listener:
    as good as absent), When a resumable task runs, Then it succeeds and neither OpenLineage's
    client nor our facets module was imported, nor any dataset looked up."""
    path = tmp_path / "source.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE loans (id INTEGER PRIMARY KEY, amount INTEGER)")
        db.executemany("INSERT INTO loans VALUES (?, ?)", [(i, i) for i in range(1, 51)])
    monkeypatch.setenv("AIRFLOW_CONN_LINEAGE_SOURCE", f"sqlite:///{path}")
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{tmp_path / 'checkpoints.db'}")
    monkeypatch.delenv("AIRFLOW__OPENLINEAGE__TRANSPORT", raising=False)
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "dag_run.py"), "ol_loans", "{}", DAY],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "RESUMABLE_REPORT_IMPORTS": "openlineage,airflow_resumable.lineage"})
    assert result.returncode == 0, result.stderr[-5000:]
    lines = result.stdout.splitlines()
    assert json.loads(next(x for x in lines if x.startswith("DAG_RUN_RESULT "))[15:])["state"] == "success"
    assert json.loads(next(x for x in lines if x.startswith("DAG_RUN_IMPORTED "))[17:]) == []


def test_a_reader_without_a_connection_is_left_out_with_a_log_line_saying_how_to_name_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given a keyset reader on a plain ``connect`` function (no Airflow connection to name its
    datasource by), When its datasets are named, Then there are none and the log says what to use."""
    import logging

    from airflow_resumable.core.readers import KeysetReader
    from airflow_resumable.lineage.facets import datasets, look_up

    source = KeysetReader(connect=lambda: None, key="id", table="loans").source()
    assert source.connection is None
    with caplog.at_level(logging.INFO):
        names = look_up([source], logging.getLogger("test_lineage.task"))
    assert names == {source: []} and datasets([source], names) == []
    assert "has no Airflow connection to name its datasource by" in caplog.text and "ctx.input(" in caplog.text


def test_a_query_s_tables_and_a_table_are_named_in_their_connection_s_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a SQLite connection, When a query with the driver's placeholders and a table are named,
    Then the query's tables (parsed by OpenLineage's SQL parser) and the table are datasets of the
    file's namespace; a PostgreSQL connection's namespace is its host and port, never its password."""
    from airflow_resumable.core.model.observe import Source
    from airflow_resumable.lineage.naming import dataset_names, datasource

    datasource.cache_clear()
    monkeypatch.setenv("AIRFLOW_CONN_NAMING_SQLITE", f"sqlite:///{tmp_path / 'src.db'}")
    monkeypatch.setenv("AIRFLOW_CONN_NAMING_PG", "postgresql://bob:hunter2@127.0.0.1:1/warehouse")
    namespace = f"sqlite://{tmp_path / 'src.db'}"
    query = "SELECT l.id, r.rate FROM loans l JOIN rates r ON r.id = l.rate_id WHERE l.id > ? AND r.day = ?"
    assert sorted(dataset_names(Source("query", query, "naming_sqlite"))) == [(namespace, "loans"), (namespace, "rates")]
    assert dataset_names(Source("table", "loans", "naming_sqlite")) == [(namespace, "loans")]
    named = dataset_names(Source("table", "public.loans", "naming_pg"))
    assert named == [("postgres://127.0.0.1:1", "warehouse.public.loans")] and "hunter2" not in str(named)


# -- naming attacked: odd URLs and connection fields ---------------------------------------------------

ODD_FILES = [
    "s3://AKIA:se/cr@et@bucket/key.csv?X-Amz-Signature=SECRET#SECRET",
    "fs://nas?token=SECRET",
    "https://user:SECRET@[::1]:8080/p?q=SECRET",
    "s3://key%3ASECRET%40bucket/k",
    "user:SECRET@host:/path/f.csv",
    "s3://?token=SECRET",
    "?token=SECRET",
    "#SECRET",
    "s3://",
    "file:///data/x.csv?key=SECRET",
    "http://u:p@h;jsessionid=SECRET/x",
    "HTTP://u:SECRET@H/x#SECRET",
    "s3://:SECRET@bucket/k",
    "s3://b/k?token=a@SECRET",
    "s3://bucket/" + "k" * 10_000_000,
]


@pytest.mark.parametrize("url", ODD_FILES, ids=lambda u: u[:40])
def test_an_odd_file_url_is_named_without_its_secret_or_left_out_with_a_warning_never_raising(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Given a file URL with credentials, a query or a fragment however written (or that names no path
    at all), When its datasets are named, Then no namespace or name holds the secret, none is longer than
    NAME_LIMIT, nothing raises; a URL that names no dataset is left out with a warning."""
    import logging

    from airflow_resumable.core.model.observe import NAME_LIMIT, Source
    from airflow_resumable.lineage.facets import datasets, look_up

    source = Source("file", url)
    with caplog.at_level(logging.WARNING):
        names = look_up([source], logging.getLogger("test_lineage.task"))
        named = datasets([source], names) + datasets([source], {})  # named in the task's process, or not
    shown = json.dumps([(d.namespace, d.name) for d in named])
    assert "SECRET" not in shown + caplog.text and "?" not in shown and "#" not in shown
    assert all(0 < len(d.name) <= NAME_LIMIT and len(d.namespace) <= NAME_LIMIT for d in named)
    if not named:
        assert "names no dataset" in caplog.text


@pytest.mark.parametrize("conn", [
    {"conn_type": "fs", "host": "nas?token=SECRET"},
    {"conn_type": "fs", "host": "alice:SE/CRET@nas#SECRET", "port": 445},
    {"conn_type": "fs", "host": "alice%3ASECRET%40nas"},
    {"conn_type": "sqlite", "host": "/data/x.db?key=SECRET#SECRET"},
    {"conn_type": "sqlite", "host": "file:/data/x.db?cipher=aes&key=SECRET"},
    {"conn_type": "postgres", "host": "127.0.0.1?sslpassword=SECRET", "port": 1, "schema": "w", "login": "alice",
     "password": "SECRET"},
    {"conn_type": "postgres", "host": "[::1]", "port": 1, "schema": "w", "password": "SECRET"},
], ids=lambda c: f"{c['conn_type']}:{c['host'][:20]}")
def test_a_connection_s_host_field_never_puts_a_query_fragment_or_credential_into_a_namespace(
    conn: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a connection whose host field holds a query string, a fragment or credentials (plain or
    percent-encoded), When a table through it is named, Then its namespace holds none of them."""
    import logging

    from airflow_resumable.core.model.observe import Source
    from airflow_resumable.lineage.facets import datasets, look_up
    from airflow_resumable.lineage.naming import datasource

    datasource.cache_clear()
    monkeypatch.setenv("AIRFLOW_CONN_ODD_HOST", json.dumps(conn))
    source = Source("table", "loans", "odd_host")
    named = datasets([source], look_up([source], logging.getLogger("test_lineage.task")))
    datasource.cache_clear()
    assert len(named) == 1 and named[0].name.endswith("loans")
    assert "SECRET" not in named[0].namespace and "?" not in named[0].namespace and "#" not in named[0].namespace
    assert "alice" not in named[0].namespace


def test_a_facet_built_from_huge_values_is_valid_against_its_schema_and_small() -> None:
    """Given an attempt's facts with 10 MB job, slot, stop reason, position and partition bounds, and a
    summary with 10,000 partitions of huge jobs, When their facets are built, Then each validates against
    our schema (OpenLineage's ``RunFacet`` as its base) and stays under 20 kB."""
    from openlineage.client.serde import Serde

    from airflow_resumable.core.model.observe import AttemptFacts, Part
    from airflow_resumable.lineage.facets import run_facet

    huge = "x" * 10_000_000
    facts = AttemptFacts(job=huge, slot=huge, attempt=1, status="cancelled", resumed=True, resumed_from=huge,
                         position=[huge], processed=1, total=2, skipped=0, stop_reason=huge, checkpoints=1,
                         partition=Part(job=huge, index=3, count=4, after=huge, until={"k": huge}))
    built = json.loads(Serde.to_json(run_facet(facts)))
    validators()[1].validate(built)
    assert len(built["stopReason"]) == 200 and len(json.dumps(built)) < 20_000
    parts = [{"index": i, "job": huge, "status": "done", "processed": 1} for i in range(10_000)]
    summary = json.loads(Serde.to_json(run_facet(facts, partitions={
        "count": 10_000, "done": 10_000, "failed": [], "parts": [
            {**p, "job": p["job"][:1000]} for p in parts[:100]], "partsOmitted": 9_900})))
    validators()[1].validate(summary)


def test_a_hundred_and_fifty_outputs_make_an_event_of_a_hundred_and_the_huge_names_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given an attempt that declared 150 outputs (more than an attempt keeps) with 100 kB file names,
    When its lineage is built, Then the event names at most MAX_OUTPUTS outputs, each name cut to
    NAME_LIMIT, and the event's datasets are valid against OpenLineage's schema."""
    import logging

    from openlineage.client.serde import Serde

    from airflow_resumable.core.model.observe import MAX_OUTPUTS, NAME_LIMIT, AttemptFacts, Source
    from airflow_resumable.lineage.facets import operator_lineage

    outputs = tuple(Source("file", f"s3://bucket/{i}-" + "k" * 100_000) for i in range(150))
    facts = AttemptFacts(job="j", slot="s", attempt=1, status="done", outputs=outputs)
    lineage = operator_lineage(facts, names={}, log=logging.getLogger("test_lineage.task"))
    assert len(lineage.outputs) == MAX_OUTPUTS
    assert {len(d.name) for d in lineage.outputs} == {NAME_LIMIT}
    datasets = [json.loads(Serde.to_json(d)) for d in lineage.outputs]
    event = {"eventTime": "2026-02-01T00:00:00+00:00", "producer": "https://example.org/p",
             "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent", "eventType": "COMPLETE",
             "run": {"runId": "019c167f-cc00-7fb3-985e-bee1db05d771"}, "job": {"namespace": "n", "name": "j"},
             "outputs": datasets}
    validators()[0].validate(event)


def test_a_query_too_long_for_the_sql_parser_is_left_out_with_a_warning_not_a_crashed_task(tmp_path: Path) -> None:
    """Given a query reader's query of 15,000 ``OR`` terms (195 kB: OpenLineage's SQL parser overflows an
    8 MB stack on it, a segfault that would end the task's process), When its tables are named in a
    process of its own, Then the process lives on: the query is left out, and the warning says why and
    what to use instead."""
    query = "SELECT id FROM loans WHERE " + " OR ".join(f"id = {i}" for i in range(15_000))
    script = (
        "import json, logging, sys\n"
        "logging.basicConfig(level=logging.WARNING, stream=sys.stdout)\n"
        "from airflow_resumable.core.model.observe import Source\n"
        "from airflow_resumable.lineage.facets import look_up\n"
        "source = Source('query', sys.stdin.read(), 'naming_sqlite')\n"
        "print('NAMES', json.dumps(look_up([source], logging.getLogger('task'))[source]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], input=query, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "AIRFLOW_CONN_NAMING_SQLITE": f"sqlite:///{tmp_path / 'src.db'}"})
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "NAMES []" in result.stdout
    said = result.stdout + result.stderr  # where the warning goes depends on Airflow's logging (3.1: stderr)
    assert "characters long; OpenLineage's SQL parser is given 100,000 at most" in said
    assert "ctx.input(table=" in said


def test_a_database_that_does_not_answer_for_its_schema_delays_the_naming_by_the_timeout_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a PostgreSQL connection whose database never answers the current-schema question, When a
    table through it is named, Then the name comes within the lookup's timeout, without the schema."""
    import threading
    import time

    from airflow.providers.postgres.hooks.postgres import PostgresHook

    from airflow_resumable.core.model.observe import Source
    from airflow_resumable.lineage import naming

    released = threading.Event()
    monkeypatch.setattr(PostgresHook, "get_openlineage_default_schema", lambda self: released.wait(60) and "late")
    monkeypatch.setattr(naming, "LOOKUP_TIMEOUT", 0.5)
    monkeypatch.setenv("AIRFLOW_CONN_NAMING_HANG", "postgresql://bob:hunter2@127.0.0.1:1/warehouse")
    naming.datasource.cache_clear()
    began = time.monotonic()
    try:
        named = naming.dataset_names(Source("table", "loans", "naming_hang"))
    finally:
        released.set()
        naming.datasource.cache_clear()
    assert time.monotonic() - began < 10
    assert named == [("postgres://127.0.0.1:1", "loans")]  # no schema to qualify it with


@pytest.mark.one_store("asserts the OpenLineage events, not the store", kind="sqlite")
def test_no_secret_of_a_query_its_params_a_connection_s_extra_or_a_stop_reason_reaches_an_event(
    checkpoints: Store, airflow_home: Path, source_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a ChunkedOperator whose reader's query holds a password literal and a password in a comment,
    with a secret param, through a connection whose extra holds a token, and a handler that stops the
    attempt with a reason of its own holding a DSN with a password,
    When it runs (and is cancelled), Then no event holds any of those secrets outside the provider's own
    ``errorMessage`` facet (the raised error's text and traceback, as the provider sends them for every
    operator: the docs say so); our facet's stop reason keeps the DSN's host, without its user and
    password; the query's table is the input."""
    monkeypatch.setenv("AIRFLOW_CONN_LINEAGE_SOURCE", json.dumps(
        {"conn_type": "sqlite", "host": str(source_db), "extra": {"token": "extra-tok-4", "api_key": "extra-key-5"}}))
    run, events = run_with_lineage("ol_secrets", tmp_path / "events.jsonl")
    assert [e["eventType"] for e in events] == ["START", "FAIL"]
    assert facet(events[-1])["stopReason"] == "postgresql://db.internal/x"
    for event in events:
        event["run"]["facets"].pop("errorMessage", None)
    text = json.dumps(events)
    for secret in ("extra-tok-4", "extra-key-5", "query-pw-1", "param-pw-2", "where-pw-3", "reason-pw-7", "bob"):
        assert secret not in text, secret
    for event in events:
        assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [(f"sqlite://{source_db}", "loans")]


def test_queries_parsed_from_many_threads_at_once_leave_the_process_s_thread_stack_size_as_it_was() -> None:
    """Given the parser's thread, started with a large stack (the process's setting, set and set back),
    When eight threads start such threads at once, again and again, Then the process's stack size for
    new threads is what it was before (it stayed at the parser's for every later thread of the process)."""
    import threading

    from airflow_resumable.lineage import naming

    before = threading.stack_size()  # reading it sets it to 0: the default
    changed = []
    for _ in range(10):
        barrier = threading.Barrier(8)

        def parse_often(barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            for _ in range(5):
                naming._bounded(lambda: None, "sql-parse", stack=naming.PARSE_STACK)

        threads = [threading.Thread(target=parse_often) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        now = threading.stack_size(before)
        if now != before:
            changed.append(now)
    assert changed == []


@pytest.mark.one_store("asserts the OpenLineage events, not the store", kind="sqlite")
def test_a_process_that_dies_leaves_a_start_without_a_fail_and_the_next_process_s_complete_says_where_it_resumed(
    checkpoints: Store, airflow_home: Path, source_db: Path, tmp_path: Path
) -> None:
    """Given a ChunkedOperator over ``loans`` whose process dies (``os._exit``) in its third chunk,
    When a fresh process runs the same DAG run again,
    Then the dead process left a START and nothing else (no listener runs in a dead process); the next
    process's START says its try, and its COMPLETE says it resumed from the dead one's last checkpoint."""
    events_file = tmp_path / "events.jsonl"
    environ = {**os.environ,
               "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                              "append": True}),
               "AIRFLOW__OPENLINEAGE__NAMESPACE": "resumable-tests", "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "120"}
    died = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "dag_run.py"), "ol_crash",
                           json.dumps({"die_at": 2}), DAY], capture_output=True, text=True, env=environ, timeout=300)
    (tmp_path / "died.log").write_text(died.stdout + died.stderr)
    assert died.returncode == 9, died.stderr[-3000:]
    dead = [e for e in map(json.loads, events_file.read_text().splitlines()) if "." in e["job"]["name"]]
    assert [e["eventType"] for e in dead] == ["START"]
    events_file.unlink()
    run, events = run_with_lineage("ol_crash", events_file)
    assert run["state"] == "success"
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"], [e["eventType"] for e in events]
    start, complete = (facet(e) for e in events)
    assert {k: complete.get(k) for k in ("status", "resumed", "resumedFrom", "processed")} == {
        "status": "done", "resumed": True, "resumedFrom": 20, "processed": 50}, (start, complete)


@pytest.mark.parametrize(("path", "named"), [
    ("/data/in/../out/./x.csv", ("file", "/data/out/x.csv")),
    ("file:///data/in/../x.csv", ("file", "/data/x.csv")),
    ("s3://bucket/a/../k", ("s3://bucket", "a/../k")),  # an object store's key is taken as it is
])
def test_a_local_path_with_dot_segments_names_the_file_it_is_once(path: str, named: tuple[str, str]) -> None:
    """Given a file written ``/data/in/../out/./x.csv`` by one task and ``/data/out/x.csv`` by another,
    When they are named, Then both are the one dataset ``/data/out/x.csv`` (an S3 key keeps its ``..``)."""
    from airflow_resumable.core.model.observe import Source
    from airflow_resumable.lineage.naming import dataset_names

    assert dataset_names(Source("file", path)) == [named]


def test_a_name_holding_a_nul_character_is_left_out_of_the_events_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given ``ctx.output(file="out\\x00.csv")`` (a NUL, which no path or table name holds and which a backend
    storing events in PostgreSQL refuses, with the whole event), When its datasets are named, Then it is
    left out with a warning naming the NUL, and nothing raises."""
    import logging

    from airflow_resumable.core.model.observe import Source
    from airflow_resumable.lineage.facets import datasets, look_up

    source = Source("file", "/data/out\x00.csv")
    with caplog.at_level(logging.WARNING):
        names = look_up([source], logging.getLogger("test_lineage.task"))
        assert datasets([source], names) == []
    assert "NUL character" in caplog.text


def test_a_query_s_password_literal_never_reaches_the_task_log_when_its_datasets_cannot_be_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given a reader's query ``... WHERE password = 'hunter2'`` read through a plain connect function (no
    connection to name it by), and another through a connection that cannot be looked up,
    When their datasets are named, Then the log lines saying why they are left out show the query
    without the password."""
    import logging

    from airflow_resumable.core.model.observe import Source
    from airflow_resumable.lineage.facets import look_up

    sources = [Source("query", "SELECT id FROM users WHERE password = 'hunter2'"),
               Source("query", "SELECT id FROM users WHERE token='tok-9'", "no_such_connection_for_lineage")]
    with caplog.at_level(logging.INFO):
        look_up(sources, logging.getLogger("test_lineage.task"))
    assert "SELECT id FROM users" in caplog.text
    assert "hunter2" not in caplog.text and "tok-9" not in caplog.text
