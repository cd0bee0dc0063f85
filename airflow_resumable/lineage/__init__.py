"""OpenLineage for resumable tasks (the ``openlineage`` extra: ``apache-airflow-providers-openlineage``).

The OpenLineage provider asks each task for its lineage when it starts, completes and fails
(``get_openlineage_facets_on_start/complete/failure``, :mod:`airflow_resumable.operators.lineage`).
A resumable task answers with:

* a run facet ``resumable`` (:data:`FACET_NAME`), whose JSON schema ships in this package
  (``schema/<version>/ResumableRunFacet.json``, :data:`SCHEMA_URL`): the job, the slot, the
  attempt, where it resumed from, how far it got, what it skipped and why it stopped; for a
  partition, its place in the partitioned job; for a partitioned job's summary, its partitions;
* inputs named from its readers (:mod:`airflow_resumable.lineage.naming`) and ``ctx.input()``;
* outputs from ``ctx.output()`` and the task's ``outlets``.

The core knows none of this: it gives plain data (:mod:`airflow_resumable.core.model.observe`), which
:mod:`airflow_resumable.lineage.facets` turns into OpenLineage objects. Without the provider nothing
here is imported and nothing changes. Building a facet never fails a task: a failure is logged,
and the event goes without it.
"""

from __future__ import annotations

from pathlib import Path

from airflow_resumable.version import __version__

__all__ = ["FACET_NAME", "PRODUCER", "SCHEMA_FILE", "SCHEMA_URL", "SCHEMA_VERSION"]

#: The facet's key in an event's ``run.facets``.
FACET_NAME = "resumable"
#: The schema's version (OpenLineage's style: ``MAJOR-MINOR-PATCH``). A released version's file never
#: changes: a new field makes a new version, in a folder of its own beside the old one.
SCHEMA_VERSION = "1-0-0"
SCHEMA_FILE = Path(__file__).parent / "schema" / SCHEMA_VERSION / "ResumableRunFacet.json"
#: Where the schema is published (the repository's copy of :data:`SCHEMA_FILE`), as the facet's ``_schemaURL``.
SCHEMA_URL = (
    "https://raw.githubusercontent.com/airflow-resumable/airflow-resumable/main/airflow_resumable/lineage/schema/"
    f"{SCHEMA_VERSION}/ResumableRunFacet.json#/$defs/ResumableRunFacet"
)
#: The facet's ``_producer``: this release of the package.
PRODUCER = f"https://github.com/airflow-resumable/airflow-resumable/tree/v{__version__}"
