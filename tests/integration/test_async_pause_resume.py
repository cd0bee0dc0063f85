"""The async example (dags/async_export.py) at its suggested pace (``latency_ms=3000``), paused and
resumed through the Checkpoint tab's REST route as a person presses Pause then Resume: it stops
where it was, continues from there and ends done with every customer sent, none more than twice
and at most the documented window (50 in flight plus 50 since the last save) sent again.

One real ``airflow standalone`` (LocalExecutor) with the embedded store.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.paths import ROOT
from support.standalone import Standalone, wait_for

pytestmark = [pytest.mark.scheduler]

DAG, TASK, RUN = "async_export", "export_customers", "paced"


def test_the_async_example_paused_and_resumed_from_the_tab_s_route_ends_done_with_every_customer(tmp_path: Path) -> None:
    sink = tmp_path / "sink.db"
    airflow = Standalone(metadata_uri=f"sqlite:///{tmp_path / 'airflow.db'}",
                         dag_files=[ROOT / "dags" / "async_export.py"],
                         env={"AIRFLOW_CONN_RESUMABLE_DEFAULT": f"sqlite:///{tmp_path / 'checkpoints.db'}",
                              "ASYNC_EXPORT_SINK": str(sink)})
    params = {"dag_id": DAG, "run_id": RUN, "task_id": TASK}
    try:
        airflow.start()
        airflow.serve([DAG])
        api = airflow.api
        assert api is not None
        api.trigger(DAG, run_id=RUN, conf={"latency_ms": 3000})
        with httpx.Client(base_url=airflow.base_url, timeout=30) as http:
            token = http.post("/auth/token", json={"username": "admin", "password": airflow.admin_password()})
            auth = {"Authorization": f"Bearer {token.json()['access_token']}"}

            def tab() -> dict[str, Any]:
                view: dict[str, Any] = http.get("/resumable/api/v1/task-instance", params=params, headers=auth).json()
                return view

            def act(action: str, view: dict[str, Any]) -> None:
                answer = http.post(f"/resumable/api/v1/checkpoint/{action}", headers=auth,
                                   params={"job": view["job"], "slot": view["slot"]})
                assert answer.status_code == 200, (action, answer.status_code, answer.text[:2000])

            def when(ok: Any) -> Any:
                def check() -> dict[str, Any] | None:
                    view = tab()
                    return view if ok(view) else None
                return check

            started = wait_for(when(lambda v: v.get("resumable") and (v.get("processed") or 0) >= 50),
                               timeout=240, interval=1.0, what="the export to send its first customers",
                               on_timeout=airflow.tail)
            assert started.get("total") == 1000, started  # a percent and an ETA on the tab
            act("pause", started)
            paused = wait_for(when(lambda v: v.get("status") == "paused"), timeout=120,
                              interval=1.0, what="the tab to say paused", on_timeout=airflow.tail)
            at_pause = int(paused["processed"])
            assert at_pause < 1000, "the export ended before Pause took effect: the pace is not one a person can pause"
            act("resume", paused)
            done = wait_for(when(lambda v: v.get("status") == "done"), timeout=300,
                            interval=2.0, what="the export to end done after the resume", on_timeout=airflow.tail)
            def ended() -> dict[str, Any] | None:
                ti: dict[str, Any] = api.task_instance(DAG, RUN, TASK)
                return ti if ti["state"] in ("success", "failed") else None

            ti = wait_for(ended, timeout=120, interval=1.0, what="the task instance to end", on_timeout=airflow.tail)
    finally:
        airflow.close()
    assert ti["state"] == "success", ti
    assert int(done["processed"]) == 1000, done
    with closing(sqlite3.connect(sink)) as db:
        rows = dict(db.execute("SELECT id, sent FROM exported").fetchall())
    assert sorted(rows) == list(range(1, 1001)), f"missing: {sorted(set(range(1, 1001)) - set(rows))[:20]}"
    again = sorted(i for i, sent in rows.items() if sent > 1)
    assert max(rows.values()) <= 2 and len(again) <= 100, (len(again), max(rows.values()), at_pause)
