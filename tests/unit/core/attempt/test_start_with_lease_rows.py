"""A new slot's run started with its lease (one statement, PostgreSQL) leaves the same rows, column by
column, as the lease taken first and the run started after (``checkpoints.start(reset=True)``, the
path every other start takes): timestamps aside."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core.attempt.runner import Attempt, Identity, Options
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS
from airflow_resumable.core.stores.leases import Leases

#: Columns that hold a time (they differ between two attempts run one after the other).
_TIMES = {c.name for t in (CHECKPOINTS, ATTEMPTS) for c in t.columns if c.kind == "timestamp"} | {"id"}


def _rows(store: Any, job: str) -> dict[str, list[dict[str, Any]]]:
    with store.open(autocommit=True) as s:
        c = s
        out = {}
        for table in (CHECKPOINTS, ATTEMPTS):
            names = [n for n in table.names if n not in _TIMES and n != "job"]
            got = c.execute(f"SELECT {', '.join(names)} FROM {table.name} WHERE job = %(job)s ORDER BY 1", {"job": job})
            out[table.name] = [dict(zip(names, r)) for r in got.fetchall()]
        return out


@pytest.mark.parametrize("policy", ["allow", "skip"])
def test_a_run_started_with_its_lease_leaves_the_rows_of_a_start_after_it(store: Any, policy: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    seen: dict[str, Any] = {}

    def run(job: str) -> None:
        def handler(ctx: Any) -> None:
            seen[f"{job} running"] = _rows(store, job)
        Attempt(store, Identity(job=job, slot="s", attempt=3, owner="ti/try3@h:1",
                                origin=Origin("dag", "task", "run", 2)), options=Options(overlap=policy)).run(handler)
        seen[f"{job} done"] = _rows(store, job)

    run("new")
    plain = Leases.acquire
    monkeypatch.setattr(Leases, "acquire", lambda self, *a, start=None, **k: plain(self, *a, **k))
    run("old")
    assert seen["new running"] == seen["old running"]
    assert seen["new done"] == seen["old done"]
