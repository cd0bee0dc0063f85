"""The core's plain facts (:mod:`airflow_resumable.core.model.observe`) as OpenLineage objects: the
``resumable`` run facet, datasets, and the ``OperatorLineage`` the provider's listener takes.
Imported only when the OpenLineage provider calls a resumable task (it needs the provider)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from attrs import define
from openlineage.client.event_v2 import Dataset
from openlineage.client.facet_v2 import RunFacet, job_dependencies_run

from airflow_resumable.core.model.observe import MAX_OUTPUTS, AttemptFacts, Source, cut_text, outward_text
from airflow_resumable.core.view import facts_json
from airflow_resumable.lineage import FACET_NAME, PRODUCER, SCHEMA_URL
from airflow_resumable.lineage.naming import dataset_names

_LOG = logging.getLogger(__name__)

__all__ = ["MAX_PARTS", "ResumableRunFacet", "datasets", "look_up", "operator_lineage", "run_facet",
           "summary_lineage"]

#: The most partitions a summary's event names one by one (a job may have 10,000).
MAX_PARTS = 100


@define
class ResumableRunFacet(RunFacet):
    """The ``resumable`` run facet: see ``schema/1-0-0/ResumableRunFacet.json``."""

    job: str
    status: str
    slot: str | None = None
    attempt: int | None = None
    resumed: bool | None = None
    resumedFrom: Any = None  # noqa: N815 - OpenLineage's field style
    position: Any = None
    processed: int | None = None
    total: int | None = None
    skipped: int | None = None
    stopReason: str | None = None  # noqa: N815
    checkpoints: int | None = None
    partition: dict[str, Any] | None = None
    partitions: dict[str, Any] | None = None

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL


def run_facet(facts: AttemptFacts, *, partitions: dict[str, Any] | None = None) -> ResumableRunFacet:
    """The facet of ``facts`` (small: long values cut, see :func:`~airflow_resumable.core.view.facts_json`)."""
    j = facts_json(facts)
    return ResumableRunFacet(
        producer=PRODUCER, job=j["job"], status=j["status"], slot=j.get("slot"), attempt=j.get("attempt"),
        resumed=j.get("resumed"), resumedFrom=j.get("resumed_from"), position=j.get("position"),
        processed=j.get("processed"), total=j.get("total"), skipped=j.get("skipped"),
        stopReason=j.get("stop_reason"),
        checkpoints=j.get("checkpoints"), partition=j.get("partition"), partitions=partitions,
    )


def look_up(sources: Iterable[Source], log: Any) -> dict[Source, list[tuple[str, str]]]:
    """The ``(namespace, name)`` of each dataset of each source, looking connections up (in the
    task's own process). One that cannot be named (no connection, a failed lookup) maps to none,
    with a log line saying why; it never fails the task."""
    out: dict[Source, list[tuple[str, str]]] = {}
    for src in sources:
        what = f"{src.kind} {outward_text(src.name, 80)!r}"  # a query may hold a password literal
        try:
            out[src] = dataset_names(src)
        except Exception as exc:
            out[src] = []
            log.warning("OpenLineage: could not name the %s (connection %r: %s: %s); its events go without it",
                        what, src.connection, type(exc).__name__, outward_text(str(exc), 200))
            continue
        if not out[src] and src.connection is None:
            log.info("OpenLineage: the %s has no Airflow connection to name its datasource by (a reader on a plain "
                     "connect function); its events go without it. Use sql_reader(conn_id, ...), or "
                     "ctx.input(table=..., connection=...)", what)
    return out


def datasets(sources: Iterable[Source], names: dict[Source, list[tuple[str, str]]], log: Any = None,
             *, limit: int = MAX_OUTPUTS) -> list[Dataset]:
    """The datasets of ``sources``, each once, at most ``limit``: as :func:`look_up` named them in the
    task's process, else a file (its name needs no lookup); a table or query not named there, or a
    file that cannot be named (logged), is left out."""
    out: list[Dataset] = []
    seen: set[tuple[str, str]] = set()
    for src in sources:
        found = names.get(src)
        if found is None and src.kind == "file":
            found = look_up([src], log or _LOG)[src]
        for namespace, name in found or ():
            if (namespace, name) not in seen and len(out) < limit:
                seen.add((namespace, name))
                out.append(Dataset(namespace=namespace, name=name))
    return out


def _outlets(outlets: Sequence[Any], log: Any) -> list[Dataset]:
    from airflow_resumable.version_compat import ExtractorManager

    out = []
    for outlet in outlets:
        try:
            dataset = ExtractorManager.convert_to_ol_dataset(outlet)
        except Exception as exc:
            log.warning("OpenLineage: could not turn the outlet %s into a dataset (%s)", outward_text(repr(outlet), 200),
                        outward_text(str(exc), 200))
            continue
        if dataset is not None:
            out.append(dataset)
    return out


def operator_lineage(facts: AttemptFacts, *, inputs: Iterable[Source] = (), outlets: Sequence[Any] = (),
                     names: dict[Source, list[tuple[str, str]]], log: Any) -> Any:
    """The ``OperatorLineage`` of one attempt: its facet, its inputs (``inputs`` the task knows
    before it runs, then the attempt's own) and outputs (``ctx.output()``, then the ``outlets``),
    named as :func:`look_up` named them."""
    from airflow_resumable.version_compat import OperatorLineage

    outputs = datasets(facts.outputs, names, log)
    seen = {(d.namespace, d.name) for d in outputs}
    outputs += [d for d in _outlets(outlets, log) if (d.namespace, d.name) not in seen]
    return OperatorLineage(inputs=datasets([*inputs, *facts.inputs], names, log), outputs=outputs,
                           run_facets={FACET_NAME: run_facet(facts)})


def summary_lineage(facts: AttemptFacts, parts: Sequence[dict[str, Any]], *, counts: dict[str, Any], dag_id: str,
                    task_id: str, logical_date: datetime | None) -> Any:
    """A partitioned job's summary: its facet names every partition as a part of the one job
    (the first :data:`MAX_PARTS`), and OpenLineage's ``jobDependencies`` facet names the run of each
    (partition ``i``'s last try of task ``task_id``, map index ``i``) as upstream of the summary."""
    from airflow_resumable.version_compat import OpenLineageAdapter, OperatorLineage, openlineage_conf

    shown = [{**part, "job": cut_text(outward_text(str(part["job"])))} if "job" in part else part for part in parts[:MAX_PARTS]]
    partitions = {**counts, "parts": shown, "partsOmitted": max(0, len(parts) - MAX_PARTS) or None}
    partitions = {k: v for k, v in partitions.items() if v is not None}
    job = job_dependencies_run.JobIdentifier(namespace=openlineage_conf.namespace(), name=f"{dag_id}.{task_id}")
    upstream = []
    for part in shown:
        run = None
        if logical_date is not None and part.get("attempt"):
            run = job_dependencies_run.RunIdentifier(runId=OpenLineageAdapter.build_task_instance_run_id(
                dag_id=dag_id, task_id=task_id, try_number=part["attempt"], logical_date=logical_date,
                map_index=part["index"]))
        upstream.append(job_dependencies_run.JobDependency(
            job=job, run=run, sequence_trigger_rule="FINISH_TO_START", status_trigger_rule="EXECUTE_EVERY_TIME"))
    dependencies = job_dependencies_run.JobDependenciesRunFacet(producer=PRODUCER, upstream=upstream,
                                                                trigger_rule="ALL_DONE")
    return OperatorLineage(run_facets={FACET_NAME: run_facet(facts, partitions=partitions),
                                       "jobDependencies": dependencies})
