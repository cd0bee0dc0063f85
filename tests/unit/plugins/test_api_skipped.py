"""The REST API's answers about skipped items and partitions past a job's current plan, as the jobs
page and the Checkpoint tab show them: the job's line counts no partition past the plan, such a
partition takes no request (409 naming the plan) but the withdrawal of a retry stuck there, and a
skipped item shows the latest try that failed it. On both stores (the API's second connection)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options, Store, chunk_loop
from airflow_resumable.core.attempt.skip_policy import request_retry
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.checkpoint import DeadLetter, Origin
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import SequenceReader
from airflow_resumable.core.work.partitions import Plan, replace_plan, save_plan
from support.api_app import BASE, api_app, caller
from support.slots import SLOT, run_slot
from support.stores import empty_store

JOB = "dag_a.exp"
#: The store the API serves besides its default ([resumable] api_conn_ids), empty for each test, of each kind.
FRESH = "resumable_fresh"


@pytest.fixture(scope="module")
def as_user(airflow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    default = tmp_path_factory.mktemp("api_skipped") / "checkpoints.db"
    with api_app(airflow_home, default_uri=f"sqlite:///{default}", served=FRESH) as app, TestClient(app) as client:
        yield caller(client)


@pytest.fixture
def fresh(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    """An empty store of each kind behind the connection ``resumable_fresh``."""
    s, uri = empty_store(store_kind, tmp_path, request, "fresh.db")
    monkeypatch.setenv(f"AIRFLOW_CONN_{FRESH.upper()}", uri)
    return s


def _params(job: str) -> dict[str, str]:
    return {"job": job, "slot": SLOT, "conn_id": FRESH}


def test_a_partition_past_the_plan_counts_for_nothing_takes_no_request_and_its_stuck_retry_is_withdrawn(
        as_user: Any, fresh: Store) -> None:
    # Given dag_a.exp split into 4 partitions that finished, a bad row skipped in [0] and in [3], a retry
    # of [3]'s asked, then the job split anew into 2 (the retry's task instance is removed since)
    with fresh.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, JOB, SLOT, Plan(4, (10, 20, 30), 40))
    for i in range(4):
        run_slot(fresh, f"{JOB}[{i}]", "dag_a", task_id="exp.partition", map_index=i, n=10)
    with fresh.open(autocommit=True) as s:
        for i, position in ((0, 3), (3, 33)):
            s.skips.record(DeadLetter(job=f"{JOB}[{i}]", slot=SLOT, position=position, item=position,
                                      error=f"ValueError: bad row {position}", attempt=1))
        s.commit()
    assert request_retry(fresh, f"{JOB}[3]", SLOT, by="alice") == 1
    core_control.restart(fresh, f"{JOB}#plan", SLOT, by="planner")
    with fresh.open(autocommit=True) as s:
        assert replace_plan(s, JOB, SLOT, Plan(2, (25,), 50))

    # Then the jobs page's line counts the one bad row of the plan's partitions (before: 2)
    jobs = as_user("alice", "GET", f"{BASE}/jobs", params={"conn_id": FRESH}).json()["jobs"]
    line = next(j for j in jobs if j["job"] == JOB)
    assert (line["skipped"], line["partitions"]["total"]) == (1, 2), line
    # and [3] takes no request: 409 naming the plan, nothing changed (before: the retry was accepted)
    for action in ("retry_skipped", "pause", "restart"):
        r = as_user("alice", "POST", f"{BASE}/checkpoint/{action}", params=_params(f"{JOB}[3]"))
        assert r.status_code == 409, (action, r.status_code, r.text)
        assert r.json()["message"].startswith(f"partition 3 is not in job {JOB}'s current plan of 2 partition(s) "
                                              "(planned at "), r.json()
    # its tab offers nothing but the withdrawal of the retry stuck there, and says why
    tab = as_user("alice", "GET", f"{BASE}/checkpoint", params=_params(f"{JOB}[3]")).json()
    assert [a for a, ok in tab["offers"].items() if ok] == ["withdraw_retry"], tab["offers"]
    assert tab["offer_notes"]["retry_skipped"].startswith("Not now: partition 3 is not in job")
    assert [i["state"] for i in tab["skipped_items"]] == ["retry_requested"]

    # When alice withdraws it: the row is skipped again, with its error, and the history says who
    r = as_user("alice", "POST", f"{BASE}/checkpoint/withdraw_retry", params=_params(f"{JOB}[3]"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["withdrawn"] == {"items": 1}
    assert [(i["state"], i["error"]) for i in body["skipped_items"]] == [("skipped", "ValueError: bad row 33")]
    assert (body["history"][-1]["outcome"], body["history"][-1]["requested_by"]) == ("retry_skipped_withdrawn",
                                                                                      "alice")
    assert body["offers"]["withdraw_retry"] is False
    # and nothing is left to withdraw; a viewer may not withdraw at all
    again = as_user("alice", "POST", f"{BASE}/checkpoint/withdraw_retry", params=_params(f"{JOB}[3]"))
    assert again.status_code == 409 and "no retry of its skipped items is pending" in again.json()["message"]
    assert as_user("viewer", "POST", f"{BASE}/checkpoint/withdraw_retry",
                   params=_params(f"{JOB}[0]")).status_code == 403


class Crash(Exception):
    """Stands for the worker dying mid-chunk."""


@pytest.mark.parametrize("meets", ["redone_chunk", "requested_retry"])
def test_a_skipped_item_a_later_try_fails_again_shows_that_try_and_its_error_on_the_tab(
        as_user: Any, fresh: Store, meets: str) -> None:
    """Before: "try 1" and the first error, whichever try failed it last."""
    origin = Origin(dag_id="dag_a", task_id="export", run_id="run_1", map_index=-1)

    def process(ctx: Any, batch: list[int]) -> None:
        for i in batch:
            if i == 7:
                raise ValueError(f"bad item 7 in try {ctx.attempt}")
            if meets == "redone_chunk" and (ctx.attempt, i) == (1, 9):
                raise Crash("the worker died")

    def attempt(n: int) -> Any:
        handler = chunk_loop(SequenceReader(list(range(20))), process, chunk_size=5, skip_on=ValueError, skip_limit=3)
        if meets == "requested_retry" and n == 2:
            inner = handler

            def handler(ctx: Any) -> Any:
                ctx.replay_skipped(lambda item: process(ctx, [item]))
                return inner(ctx)
        return Attempt(fresh, Identity(job="dag_a.letters", slot=SLOT, attempt=n, owner=f"o{n}", origin=origin),
                       options=Options(lease=3.0)).run(handler)

    if meets == "redone_chunk":
        with pytest.raises(Crash):
            attempt(1)
    else:
        attempt(1)
        assert request_retry(fresh, "dag_a.letters", SLOT, by="alice") == 1
    attempt(2)
    tab = as_user("alice", "GET", f"{BASE}/checkpoint", params=_params("dag_a.letters")).json()
    assert [(i["position"], i["state"], i["attempt"], i["error"]) for i in tab["skipped_items"]] == [
        (7, "skipped", 2, "ValueError: bad item 7 in try 2")]
