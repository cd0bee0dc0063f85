"""The ``resumable`` run facet is valid against the schema the package ships for every row the
decoder reads: an attempt's facts taken from a slot's row (as ``Attempt.facts()`` takes them), and a
partitioned job's summary over its partitions' rows (as the summary task builds it). Rows generated
across the whole of each column's range and its edges (tests/support/stored_rows.py); a row the
decoder refuses never reaches a facet.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.errors import CorruptCheckpoint
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.model.tables import CHECKPOINTS
from airflow_resumable.core.stores import SQLiteStore
from airflow_resumable.core.stores.decoder import read_record
from airflow_resumable.core.work.partition_summary import summarize
from airflow_resumable.core.work.partitions import Plan
from support.paths import ROOT
from support.stored_rows import bad_rows, rows

_STORE = SQLiteStore(Path(tempfile.mkdtemp(prefix="facets-")) / "never-opened.db")


def _facet_validator() -> Any:
    """Our facet's schema (its base OpenLineage's ``RunFacet``, from the vendored spec), checking
    formats; offline: every ``$ref`` resolves from the registry."""
    import jsonschema
    from referencing import Registry, Resource

    from airflow_resumable.lineage import SCHEMA_FILE

    schemas = [json.loads(p.read_text()) for p in sorted((ROOT / "tests" / "openlineage_spec").glob("*.json"))]
    ours = json.loads(SCHEMA_FILE.read_text())
    registry = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in [*schemas, ours]])
    return jsonschema.Draft202012Validator({"$ref": f"{ours['$id']}#/$defs/ResumableRunFacet"}, registry=registry,
                                           format_checker=jsonschema.FormatChecker())


VALID = _facet_validator()


def _as_sent(facet: Any) -> dict[str, Any]:
    from openlineage.client.serde import Serde

    return dict(json.loads(Serde.to_json(facet)))


def _attempt_facet(row: Checkpoint) -> dict[str, Any]:
    """The facet of an attempt that found ``row`` (as ``Attempt.facts()`` reads a row)."""
    from airflow_resumable.lineage.facets import run_facet

    attempt = Attempt(_STORE, Identity(job=row.job, slot=row.slot, attempt=row.attempt, owner="o"))
    attempt._done = row
    return _as_sent(run_facet(attempt.facts()))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows(CHECKPOINTS))
def test_the_facet_of_every_row_the_decoder_reads_is_valid_against_the_shipped_schema(row: tuple[Any, ...]) -> None:
    record = read_record(CHECKPOINTS, row)
    facet = _attempt_facet(record)
    VALID.validate(facet)
    assert (facet["status"], facet["processed"]) == (record.status, record.processed)
    assert facet.get("total") == record.total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows(CHECKPOINTS), min_size=1, max_size=4), st.integers(0, 2**63 - 1),
       st.sampled_from([0, 1, "50%"]))
def test_the_summary_facet_over_every_partition_row_the_decoder_reads_is_valid(
        partition_rows: list[tuple[Any, ...]], planned: int, tolerated: Any) -> None:
    from airflow_resumable.lineage.facets import summary_lineage
    from airflow_resumable.operators.partitioned import _summary_facts

    decoded = [read_record(CHECKPOINTS, r) for r in partition_rows]
    plan = Plan(len(decoded), tuple(range(len(decoded) - 1)), planned)
    summary = summarize("pt.export", "2026-03-01", decoded, tolerated=tolerated, plan=plan,
                        skipped=[0] * len(decoded))
    observed = _summary_facts(summary, decoded, attempt=1, dag_run=None, task_id="export.partition")
    lineage = summary_lineage(observed.facts, observed.parts, counts=observed.counts, dag_id="pt",
                              task_id="export.partition", logical_date=None)
    VALID.validate(_as_sent(lineage.run_facets["resumable"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_rows(CHECKPOINTS))
def test_a_row_out_of_its_ranges_is_refused_before_any_facet_is_made_of_it(bad: tuple[tuple[Any, ...], str]) -> None:
    row, name = bad
    with pytest.raises(CorruptCheckpoint, match=f"^the stored {name} "):
        read_record(CHECKPOINTS, row)


def test_the_rows_that_made_facets_fail_the_schema_are_the_ones_refused() -> None:
    """Before: a total of -10 (or a status no release writes) was read, and the attempt's facet
    failed the schema (``minimum: 0``, the status ``enum``)."""
    good = next(iter(_one_row()))
    for name, value in (("total", -10), ("processed", -1), ("status", "bogus")):
        row = list(good)
        row[CHECKPOINTS.names.index(name)] = value
        with pytest.raises(CorruptCheckpoint, match=f"the stored {name} "):
            read_record(CHECKPOINTS, tuple(row))
        facet = _attempt_facet(Checkpoint(**{**read_record(CHECKPOINTS, good).__dict__, name: value}))
        assert not VALID.is_valid(facet), "the schema refuses what the decoder refuses"


def _one_row() -> list[tuple[Any, ...]]:
    values = {"job": "export", "slot": "2026-03-01", "state": "{}", "processed": 5, "total": 10, "status": "failed",
              "attempt": 1, "attempts": 1, "runs": 1, "lease_token": 1, "updated_at": 1.0}
    return [tuple(values.get(c.name) for c in CHECKPOINTS.columns)]
