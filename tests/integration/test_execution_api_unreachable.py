"""A task whose worker cannot reach Airflow's Execution API never starts: Airflow's executor fails
each try while it is still queued (the scheduler's log names ``httpx.ConnectError``), so no
checkpoint is ever written. The Checkpoint tab says so, naming the Execution API's address, instead
of "No checkpoint yet: the task instance is queued" over and over.

One real ``airflow standalone`` (and headless Chromium for the tab itself) whose ``[core] execution_api_server_url`` names a port nothing
listens on (what Airflow's defaults did when the api-server's port was moved alone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from support.paths import ROOT
from support.standalone import Standalone, wait_for

pytestmark = [pytest.mark.scheduler, pytest.mark.browser]

NOWHERE = "http://127.0.0.1:1/execution/"


def test_a_task_that_cannot_reach_the_execution_api_is_named_on_its_tab_not_left_queued(tmp_path: Path) -> None:
    airflow = Standalone(metadata_uri=f"sqlite:///{tmp_path / 'airflow.db'}",
                         dag_files=[ROOT / "dags" / "readings_import.py"],
                         env={"AIRFLOW__CORE__EXECUTION_API_SERVER_URL": NOWHERE,
                              "AIRFLOW_CONN_RESUMABLE_DEFAULT": f"sqlite:///{tmp_path / 'checkpoints.db'}"})
    try:
        airflow.start()
        airflow.serve(["readings_import"])
        api = airflow.api
        assert api is not None
        api.trigger("readings_import", run_id="unreachable", conf={"seconds_per_reading": 0})
        params = {"dag_id": "readings_import", "run_id": "unreachable", "task_id": "import_readings"}
        with httpx.Client(base_url=airflow.base_url, timeout=30) as http:
            token = http.post("/auth/token", json={"username": "admin", "password": airflow.admin_password()})
            auth = {"Authorization": f"Bearer {token.json()['access_token']}"}

            def named() -> dict[str, Any] | None:
                view: dict[str, Any] = http.get("/resumable/api/v1/task-instance", params=params, headers=auth).json()
                return view if view.get("never_started") else None

            view = wait_for(named, timeout=240, interval=2.0, what="the tab to name the try that never started",
                            on_timeout=airflow.tail)
        shown = _the_tab_in_a_browser(airflow, tmp_path)
    finally:
        airflow.close()
    assert view["resumable"] is False
    never = view["never_started"]
    assert never["try_number"] == 1 and never["execution_api"] == NOWHERE
    assert never["message"].startswith("Try 1 failed before it started: Airflow's executor reported it failed "
                                       "while it was still queued"), never
    assert f"here that is {NOWHERE} ([core] execution_api_server_url)" in never["message"]
    # ... and the tab itself says it, where it said "No checkpoint yet: the task instance is queued"
    assert shown.startswith("Try 1 failed before it started") or shown.startswith("Try 2 failed before it started"), shown
    assert NOWHERE in shown


def _the_tab_in_a_browser(airflow: Standalone, tmp_path: Path) -> str:
    """The Checkpoint tab's text for the run's task instance, as a person signed in sees it."""
    from airflow_resumable.core import SQLiteStore
    from support.browser import Env, chromium, login, open_tab, shown, until

    with chromium() as driver:
        env = Env(airflow, SQLiteStore(tmp_path / "checkpoints.db"))
        login(driver, env)
        open_tab(driver, env, "readings_import", "unreachable", "import_readings")
        return until(lambda: shown(driver, "#never-started") or None, timeout=30, what="the tab's never-started line")
