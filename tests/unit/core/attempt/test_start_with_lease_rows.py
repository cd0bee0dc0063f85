"""A new slot's run started with its lease (one statement, PostgreSQL) leaves the same rows, column by
column, as the lease taken first and the run started after (``checkpoints.start(reset=True)``, the
path every other start takes): timestamps aside."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core.attempt.runner import Attempt, Identity, Options
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.errors import CorruptCheckpoint
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
            out[table.name] = [dict(zip(names, r, strict=True)) for r in got.fetchall()]
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


def test_a_start_whose_row_cannot_be_read_back_gives_the_lease_back(store: Any) -> None:
    # Given a new slot's attempt whose task instance has a map index out of the column's range
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    attempt = Attempt(store, Identity(job="odd", slot="s", attempt=1, owner="o", origin=Origin("d", "t", "r", -5)),
                      options=Options(overlap="skip"))
    # When it starts, the row it wrote cannot be read back
    with pytest.raises(CorruptCheckpoint, match=r"map_index -5 .*\[job='odd' slot='s'\]"):
        attempt.run(lambda ctx: None)
    # Then the lease is given back, as when the start came after the lease: a retry need not wait it out
    with store.open(autocommit=True) as s:
        owner = s.execute(f"SELECT lease_owner FROM {CHECKPOINTS.name} WHERE job = 'odd'").fetchone()[0]
    assert owner is None
