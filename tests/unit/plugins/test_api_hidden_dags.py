"""The rerun preview (GET /api/v1/jobs/rerun_preview) and the re-run it previews: a
user limited to some DAGs probes job names and runs. Whether a job ran in a run of a DAG they may not
read, and which DAG owns a job whose name was overridden, must not show in the answer: an unknown job
and a forbidden one answer alike, and the refusal names no DAG the user did not name."""

from __future__ import annotations

import importlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_resumable.core import SQLiteStore, Store
from support import plugins
from support.slots import run_slot

BASE = "/resumable/api/v1"
#: A job whose name says nothing of its DAG (``job=`` overridden): owned by the secret DAG.
SHARED = "nightly_export"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    s = SQLiteStore(tmp_path_factory.mktemp("api_hidden") / "checkpoints.db")
    run_slot(s, "dag_a.parts[0]", "dag_a", task_id="parts", map_index=0, fail_at=5)
    run_slot(s, "payroll_secret.export", "payroll_secret", fail_at=5)
    run_slot(s, SHARED, "payroll_secret", task_id="nightly", fail_at=5)
    return s


@pytest.fixture(scope="module")
def as_user(airflow_home: Path, store: Store) -> Iterator[Any]:
    mp = pytest.MonkeyPatch()
    mp.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{store.path}")  # type: ignore[attr-defined]
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(32))
    mp.setenv("RESUMABLE_PLUGIN_API", "1")
    mp.setenv("AIRFLOW__CORE__AUTH_MANAGER", "support.per_dag_auth.PerDagAuthManager")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,alice:user")
    mp.setenv("AIRFLOW__RESUMABLE_TEST__DAG_ACCESS", "alice=dag_a")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(airflow_home / "api-hidden-passwords.json"))
    from airflow.api_fastapi import app as api_app
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    import airflow_resumable.plugins

    importlib.reload(airflow_resumable.plugins)
    plugins.forget()
    api_app.purge_cached_app()
    roles = {"admin": "admin", "alice": "user"}
    with TestClient(api_app.create_app()) as client:
        def call(user: str, method: str, path: str, **kwargs: Any) -> Any:
            jwt = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=user, role=roles[user]))
            return client.request(method, path, headers={"Authorization": f"Bearer {jwt}"}, **kwargs)

        yield call
    api_app.purge_cached_app()
    plugins.forget()
    mp.undo()
    importlib.reload(airflow_resumable.plugins)


@pytest.mark.parametrize(("method", "route"), [("GET", "rerun_preview"), ("POST", "rerun_failed")])
def test_a_limited_user_cannot_tell_a_forbidden_job_s_run_from_an_unknown_one(as_user: Any, method: str,
                                                                             route: str) -> None:
    ran = as_user("alice", method, f"{BASE}/jobs/{route}", params={"job": "payroll_secret.export", "run_id": "run_1"})
    unknown = as_user("alice", method, f"{BASE}/jobs/{route}", params={"job": "payroll_secret.export",
                                                                        "run_id": "run_never"})
    assert ran.status_code == unknown.status_code, (ran.status_code, ran.text, unknown.status_code, unknown.text)
    assert ran.status_code in (403, 404)
    # the admin still tells them apart
    assert as_user("admin", "GET", f"{BASE}/jobs/rerun_preview",
                   params={"job": "payroll_secret.export", "run_id": "run_never"}).status_code == 404


@pytest.mark.parametrize(("method", "route"), [("GET", "rerun_preview"), ("POST", "rerun_failed")])
def test_the_refusal_of_a_job_named_apart_from_its_dag_does_not_name_the_owning_dag(as_user: Any, method: str,
                                                                                   route: str) -> None:
    r = as_user("alice", method, f"{BASE}/jobs/{route}", params={"job": SHARED, "run_id": "run_1"})
    assert r.status_code in (403, 404), r.text
    assert "payroll_secret" not in r.text, r.text


def test_a_job_s_partitions_answer_a_limited_user_alike_for_a_hidden_and_an_unknown_job(as_user: Any) -> None:
    """GET /jobs/partitions finds the DAG from the job's name too: the same probe, the same answer."""
    hidden = as_user("alice", "GET", f"{BASE}/jobs/partitions", params={"job": SHARED})
    unknown = as_user("alice", "GET", f"{BASE}/jobs/partitions", params={"job": "no_such_job"})
    assert (hidden.status_code, unknown.status_code) == (403, 403), (hidden.text, unknown.text)
    assert "payroll_secret" not in hidden.text, hidden.text
    assert as_user("admin", "GET", f"{BASE}/jobs/partitions", params={"job": "no_such_job"}).status_code == 404
    assert as_user("alice", "GET", f"{BASE}/jobs/partitions", params={"job": "dag_a.parts"}).status_code == 200


@pytest.mark.parametrize(("method", "path"), [("GET", "/checkpoint"), ("POST", "/checkpoint/pause"),
                                              ("POST", "/checkpoint/retry_skipped"),
                                              ("POST", "/checkpoint/withdraw_retry")])
def test_a_slot_of_a_hidden_dag_and_a_slot_that_does_not_exist_answer_alike(as_user: Any, method: str,
                                                                            path: str) -> None:
    from support.slots import SLOT

    # When alice (dag_a only) names a slot of the secret DAG, and one that does not exist
    hidden = as_user("alice", method, f"{BASE}{path}", params={"job": SHARED, "slot": SLOT})
    missing = as_user("alice", method, f"{BASE}{path}", params={"job": "no_such_job", "slot": SLOT})
    # Then both are one 403 naming what she asked and no DAG
    assert (hidden.status_code, missing.status_code) == (403, 403), (hidden.text, missing.text)
    assert "payroll_secret" not in hidden.text
    assert hidden.json()["message"].replace(SHARED, "X") == missing.json()["message"].replace("no_such_job", "X")
    # And an admin (every DAG) still tells an unknown slot by its 404
    assert as_user("admin", method, f"{BASE}{path}", params={"job": "no_such_job", "slot": SLOT}).status_code == 404
