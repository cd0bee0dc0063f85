"""The source table the partitioned jobs' tests fill: ``pt_source (grp, id)``, which the DAGs of
tests/dags/partition_dags.py read on its composite key from the checkpoint store's own database
(tests/unit/core/work/, tests/unit/core/attempt/test_retry_requests.py, tests/unit/plugins/test_api.py)."""

from __future__ import annotations

from support.sources import Source


def table(source: Source, rows: list[tuple[str, int]], name: str = "pt_source") -> None:
    """``name (grp, id)``, keyed on both columns: many rows share a ``grp`` (ties on the first column)."""
    source.run(f"CREATE TABLE {name} (grp TEXT NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (grp, id))")
    if rows:
        source.run(f"INSERT INTO {name} (grp, id) VALUES (%s, %s)", rows)
