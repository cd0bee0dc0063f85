"""The plugin's REST API (``/resumable/api/v1``) inside Airflow's own api-server app, with
Airflow's auth: every route and status code, per user.

FastAPI's TestClient drives the real app (``airflow.api_fastapi.app.create_app``: the plugin is
found through its entry point and mounted at ``/resumable``), with real JWTs signed by the auth
manager. Users: ``admin`` (admin), ``viewer`` (viewer: reads every DAG, may not act), ``alice``
(user role, limited to ``dag_a`` by :mod:`support.per_dag_auth`, the simple auth manager plus a
per-DAG rule: the simple one's roles are global) and ``op`` (op role, every DAG).
"""

from __future__ import annotations

import importlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_resumable.core import Attempt, Options, PostgresStore, SQLiteStore, Store
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.plugins.api import EXAMPLE
from devtools.postgres import dsn
from support import plugins
from support.slots import SLOT, run_slot
from support.stores import empty_store

BASE = "/resumable/api/v1"
A, B = "dag_a.export", "dag_b.export"
#: A second store the API serves ([resumable] api_conn_ids), empty for each test, of each kind.
FRESH = "resumable_fresh"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    s = SQLiteStore(tmp_path_factory.mktemp("api") / "checkpoints.db")
    run_slot(s, A, "dag_a", fail_at=10)  # failed at 10/30: takes pause and restart, not resume or cancel
    run_slot(s, B, "dag_b")  # done
    for part in (0, 1):  # a mapped task: one slot per partition
        run_slot(s, f"dag_a.parts[{part}]", "dag_a", task_id="parts", map_index=part, fail_at=5 * (part + 1))
    return s


@pytest.fixture(scope="module")
def app(airflow_home: Path, store: Store) -> Iterator[Any]:
    """Airflow's api-server app with the plugin mounted, and the test users."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{store.path}")  # type: ignore[attr-defined]
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(32))
    mp.setenv("RESUMABLE_PLUGIN_API", "1")  # build the FastAPI app in this process (not an api-server)
    mp.setenv("AIRFLOW__CORE__AUTH_MANAGER", "support.per_dag_auth.PerDagAuthManager")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer,alice:user,op:op")
    mp.setenv("AIRFLOW__RESUMABLE_TEST__DAG_ACCESS", "alice=dag_a")
    mp.setenv("AIRFLOW__RESUMABLE__API_CONN_IDS", FRESH)
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(airflow_home / "api-test-passwords.json"))
    from airflow.api_fastapi import app as api_app

    import airflow_resumable.plugins

    importlib.reload(airflow_resumable.plugins)  # its FastAPI app is built at import, now that the env says so
    plugins.forget()
    api_app.purge_cached_app()
    yield api_app.create_app()
    api_app.purge_cached_app()
    plugins.forget()
    mp.undo()
    importlib.reload(airflow_resumable.plugins)


@pytest.fixture(scope="module")
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def token(name: str, role: str) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=name, role=role))


@pytest.fixture(scope="module")
def as_user(client: TestClient) -> Any:
    roles = {"admin": "admin", "viewer": "viewer", "alice": "user", "op": "op"}
    tokens: dict[str, str] = {}

    def call(user: str | None, method: str, path: str, **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", {}))
        if user is not None:
            tokens.setdefault(user, token(user, roles[user]))
            headers["Authorization"] = f"Bearer {tokens[user]}"
        return client.request(method, path, headers=headers, **kwargs)

    return call


def q(job: str) -> dict[str, str]:
    return {"job": job, "slot": SLOT}


@pytest.fixture
def fresh(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    """An empty store of each kind behind the connection ``resumable_fresh``."""
    s, uri = empty_store(store_kind, tmp_path, request, "fresh.db")
    monkeypatch.setenv(f"AIRFLOW_CONN_{FRESH.upper()}", uri)
    return s


def big_slot(store: Store, job: str, *, kib: int) -> dict[str, Any]:
    """A done slot of ``dag_big`` whose state holds ``kib`` KiB; returns that state."""
    state = {"blob": "x" * 1024 * kib, "n": 1}

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, state=state, processed=1)

    Attempt(
        store,
        Identity(job=job, slot=SLOT, attempt=1, owner="owner-1", origin=Origin(dag_id="dag_big", task_id="export", run_id="run_1", map_index=-1)),
        options=Options(lease=3.0), heartbeat=0.05,
    ).run(handler)
    return state


# -- list ------------------------------------------------------------------------------------------


def test_the_list_needs_credentials(as_user: Any) -> None:
    r = as_user(None, "GET", f"{BASE}/checkpoints")
    assert r.status_code == 401 and r.json()["message"]


def test_the_list_shows_every_slot_to_a_viewer_with_progress(as_user: Any) -> None:
    r = as_user("viewer", "GET", f"{BASE}/checkpoints")
    assert r.status_code == 200
    rows = {row["job"]: row for row in r.json()["checkpoints"]}
    assert set(rows) == {A, B, "dag_a.parts[0]", "dag_a.parts[1]"}
    assert (rows[A]["status"], rows[A]["processed"], rows[A]["total"], rows[A]["percent"]) == ("failed", 10, 30, 33.33)
    assert (rows[B]["status"], rows[B]["percent"], rows[B]["ended"]) == ("done", 100.0, True)


def test_the_list_leaves_out_the_dags_a_user_may_not_see(as_user: Any) -> None:
    r = as_user("alice", "GET", f"{BASE}/checkpoints")
    assert r.status_code == 200 and {row["dag_id"] for row in r.json()["checkpoints"]} == {"dag_a"}
    assert B not in [row["job"] for row in r.json()["checkpoints"]]


def test_the_list_filters_by_dag_and_status(as_user: Any) -> None:
    by_dag = as_user("admin", "GET", f"{BASE}/checkpoints", params={"dag_id": "dag_b"}).json()["checkpoints"]
    by_status = as_user("admin", "GET", f"{BASE}/checkpoints", params={"status": "failed"}).json()["checkpoints"]
    assert [r["job"] for r in by_dag] == [B] and [r["job"] for r in by_status] == ["dag_a.parts[1]", "dag_a.parts[0]", A]


def test_the_list_finds_dags_by_part_of_their_id_in_any_case(as_user: Any) -> None:
    def jobs(user: str, pattern: str) -> list[str]:
        r = as_user(user, "GET", f"{BASE}/checkpoints", params={"dag_id_pattern": pattern})
        assert r.status_code == 200
        return sorted(row["job"] for row in r.json()["checkpoints"])

    assert jobs("admin", "G_B") == [B]
    assert jobs("admin", "Dag") == sorted([A, B, "dag_a.parts[0]", "dag_a.parts[1]"])
    assert jobs("alice", "_b") == [] and jobs("admin", "nothing") == []


def test_an_unmapped_task_instances_tab_addresses_map_index_minus_one(client: TestClient) -> None:
    # Airflow leaves the {MAP_INDEX} placeholder as it is outside a mapped task instance's page
    r = client.get("/resumable/ui/checkpoint", params={"dag_id": "d", "run_id": "r", "task_id": "t",
                                                      "map_index": "{MAP_INDEX}"}, follow_redirects=False)
    assert r.status_code == 302
    assert r.headers["location"] == "checkpoint?dag_id=d&run_id=r&task_id=t&map_index=-1"
    assert client.get("/resumable/ui/checkpoint", params={"map_index": "3"}).status_code == 200


def test_the_list_of_a_dag_the_user_may_not_see_is_forbidden(as_user: Any) -> None:
    r = as_user("alice", "GET", f"{BASE}/checkpoints", params={"dag_id": "dag_b"})
    assert r.status_code == 403 and "dag_b" in r.json()["message"]


# -- one slot --------------------------------------------------------------------------------------


def test_a_slot_needs_credentials(as_user: Any) -> None:
    assert as_user(None, "GET", f"{BASE}/checkpoint", params=q(A)).status_code == 401


def test_a_slot_shows_its_row_history_and_what_it_would_take(as_user: Any) -> None:
    r = as_user("alice", "GET", f"{BASE}/checkpoint", params=q(A))
    assert r.status_code == 200
    body = r.json()
    assert (body["job"], body["slot"], body["status"], body["position"], body["dag_id"]) == (A, SLOT, "failed", 10, "dag_a")
    assert [h["outcome"] for h in body["history"]] == ["failed"]
    assert body["offers"] == {"pause": True, "resume": False, "cancel": False, "restart": True, "release": False,
                              "retry_skipped": False, "withdraw_retry": False}
    assert body["lease"] == "none" and body["rate"] is None and body["eta_seconds"] is None
    assert (body["skipped_items"], body["skipped_total"]) == ([], 0)


def test_one_slot_is_read_on_one_connection_with_one_schema_check(as_user: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a slot with history and offers, When its detail is asked for (the slot's route, the
    task instance's tab), Then the answer was read on one connection, the schema checked once."""
    from airflow_resumable.core.stores.base import StoreSession

    connections, checks = [], []
    connect, ensure = SQLiteStore.connect, StoreSession.ensure_schema
    monkeypatch.setattr(SQLiteStore, "connect", lambda self, **kw: connections.append(1) or connect(self, **kw))
    monkeypatch.setattr(StoreSession, "ensure_schema", lambda self, **kw: checks.append(1) or ensure(self, **kw))
    ti = {"dag_id": "dag_a", "run_id": "run_1", "task_id": "export", "map_index": -1}
    for path, params in ((f"{BASE}/checkpoint", q(A)), (f"{BASE}/task-instance", ti)):
        connections.clear()
        checks.clear()
        r = as_user("admin", "GET", path, params=params)
        assert r.status_code == 200 and r.json()["job"] == A and r.json()["history"] and "offer_notes" in r.json()
        assert (len(connections), len(checks)) == (1, 1), path


@pytest.mark.one_store("counts the SQLite store's connections; the request's SQL is the store contract's", kind="sqlite")
def test_a_request_is_checked_applied_and_answered_on_one_connection(
        as_user: Any, fresh: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a failed slot of dag_a, When a user who may act asks to pause it, then to resume it,
    Then each answer (the slot after the request) was read, authorized, written and read again on
    one connection, with one schema check; and a user who may not act on dag_b's slot is refused
    before anything is written."""
    from airflow_resumable.core.stores.base import StoreSession

    run_slot(fresh, A, "dag_a", fail_at=10)
    run_slot(fresh, B, "dag_b", fail_at=10)
    connections, checks = [], []
    connect, ensure = SQLiteStore.connect, StoreSession.ensure_schema
    monkeypatch.setattr(SQLiteStore, "connect", lambda self, **kw: connections.append(1) or connect(self, **kw))
    monkeypatch.setattr(StoreSession, "ensure_schema", lambda self, **kw: checks.append(1) or ensure(self, **kw))
    for action, recorded in (("pause", "pause_requested"), ("resume", "resume_requested")):
        connections.clear()
        checks.clear()
        r = as_user("op", "POST", f"{BASE}/checkpoint/{action}", params={**q(A), "conn_id": FRESH})
        assert r.status_code == 200, r.text
        last = r.json()["history"][-1]
        assert (last["outcome"], last["requested_by"]) == (recorded, "op")
        assert (len(connections), len(checks)) == (1, 1), action
    refused = as_user("alice", "POST", f"{BASE}/checkpoint/pause", params={**q(B), "conn_id": FRESH})
    assert refused.status_code == 403
    with fresh.open() as s:
        assert s.checkpoints.load(B, SLOT).request is None
        assert [h.outcome for h in s.listings.history(B, SLOT)] == ["failed"]


@pytest.mark.parametrize("action", ["pause", "retry_skipped"])
def test_a_slot_another_dag_takes_over_after_the_check_is_checked_again_before_the_write(
        as_user: Any, fresh: Store, action: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given dag_a's slot (one skipped item) and alice, who may change dag_a only, When dag_b's task
    takes the slot over (the same job name) right after alice's check, Then her request is checked
    again on the new row, refused, and nothing is written (before: applied to dag_b's slot)."""
    from airflow_resumable.core.model.checkpoint import DeadLetter
    from airflow_resumable.plugins import api

    run_slot(fresh, "shared.export", "dag_a", fail_at=10)
    with fresh.open(autocommit=True) as s:
        s.skips.record(DeadLetter(job="shared.export", slot=SLOT, position=3, item=3, error="E", attempt=1))
        s.commit()
    authorize, asked = api._authorize, []

    def then_taken_over(user: Any, dag_id: str | None, method: str) -> None:
        asked.append(dag_id)
        authorize(user, dag_id, method)  # type: ignore[arg-type]
        with fresh.open(autocommit=True) as s:
            s.execute("UPDATE resumable_checkpoints SET dag_id = 'dag_b'")
            s.commit()

    monkeypatch.setattr(api, "_authorize", then_taken_over)
    r = as_user("alice", "POST", f"{BASE}/checkpoint/{action}", params={**q("shared.export"), "conn_id": FRESH})
    # (refused as any slot alice may not see: the answer names no DAG she may not read)
    assert r.status_code == 403 and "dag_b" not in r.json()["message"] and asked == ["dag_a", "dag_b"]
    assert "shared.export" in r.json()["message"]
    with fresh.open() as s:
        assert [h.outcome for h in s.listings.history("shared.export", SLOT)] == ["failed"]
        assert [d.status for d in s.skips.items("shared.export", SLOT)] == ["skipped"]


def test_a_hand_edited_slot_is_refused_naming_it_and_an_answer_read_after_the_write_says_it_was_applied(
        as_user: Any, fresh: Store) -> None:
    run_slot(fresh, A, "dag_a", fail_at=10)
    run_slot(fresh, B, "dag_b", fail_at=10)
    with fresh.open(autocommit=True) as s:  # A: a status no release writes; B: a history record that is not JSON
        s.execute(f"UPDATE resumable_checkpoints SET status = 'bogus', lease_owner = 'x', lease_expires_at = NULL "
                  f"WHERE job = '{A}'")
        s.execute(f"UPDATE resumable_attempts SET position_start = '{{bad' WHERE job = '{B}'")
        s.commit()
    params = {"slot": SLOT, "conn_id": FRESH}
    # A user who may not change the slot learns nothing of it
    assert as_user("viewer", "POST", f"{BASE}/checkpoint/release", params={**params, "job": A}).status_code == 403
    # The release is refused before its write (before: the lease was freed, then a 500 said "left as it is")
    r = as_user("admin", "POST", f"{BASE}/checkpoint/release", params={**params, "job": A})
    assert r.status_code == 500 and (r.json()["job"], r.json()["slot"]) == (A, SLOT)
    assert "'bogus' is not one of" in r.json()["message"] and r.json()["hint"].startswith("The row was left as it is")
    with fresh.open() as s:
        lease = s.execute("SELECT lease_owner FROM resumable_checkpoints WHERE job = %(job)s", {"job": A}).fetchone()
        assert lease[0] == "x" and len(s.listings.history(A, SLOT)) == 1  # the row itself reads only by hand
    # The pause is taken, and the answer that cannot be read says so (before: a bare 500)
    r = as_user("admin", "POST", f"{BASE}/checkpoint/pause", params={**params, "job": B})
    assert r.status_code == 500 and r.json()["job"] == B
    assert r.json()["message"].startswith("pause requested by admin: applied and recorded in the slot's history")
    assert "of a record in resumable_attempts is not valid JSON" in r.json()["message"]
    assert "do not ask again" in r.json()["hint"]
    with fresh.open() as s:
        assert s.checkpoints.load(B, SLOT).request == "pause"
    # And a user who may not see dag_b learns nothing of its row edited by hand: 403, before any column
    # but its owner is read (before: a 500 quoting the edited value and the DELETE that removes it)
    with fresh.open(autocommit=True) as s:
        s.execute(f"UPDATE resumable_checkpoints SET status = 'bogus' WHERE job = '{B}'")
    for method, path in (("GET", "/checkpoint"), ("POST", "/checkpoint/cancel"), ("POST", "/checkpoint/retry_skipped")):
        r = as_user("alice", method, f"{BASE}{path}", params={**params, "job": B})
        assert r.status_code == 403 and "bogus" not in r.text, (path, r.status_code, r.text)


def test_a_slot_of_a_dag_the_user_may_not_see_is_forbidden(as_user: Any) -> None:
    assert as_user("alice", "GET", f"{BASE}/checkpoint", params=q(B)).status_code == 403


def test_an_unknown_slot_is_not_found_with_a_message_naming_it(as_user: Any) -> None:
    r = as_user("admin", "GET", f"{BASE}/checkpoint", params={"job": "nope", "slot": SLOT})
    assert r.status_code == 404
    assert r.json()["job"] == "nope" and r.json()["slot"] == SLOT and "no checkpoint row" in r.json()["message"]


def test_the_ui_session_cookie_authenticates_like_a_bearer_token(client: TestClient) -> None:
    client.cookies.set("_token", token("viewer", "viewer"))
    try:
        assert client.get(f"{BASE}/checkpoint", params=q(A)).status_code == 200
    finally:
        client.cookies.clear()


# -- a task instance's slot (the Checkpoint tab) -----------------------------------------------------


def test_a_task_instance_shows_the_slot_it_ran(as_user: Any) -> None:
    ti = {"dag_id": "dag_a", "run_id": "run_1", "task_id": "export", "map_index": -1}
    body = as_user("alice", "GET", f"{BASE}/task-instance", params=ti).json()
    assert body["resumable"] is True and body["job"] == A and body["history"]


def test_a_mapped_task_instance_shows_its_own_partition(as_user: Any) -> None:
    ti = {"dag_id": "dag_a", "run_id": "run_1", "task_id": "parts", "map_index": 1}
    body = as_user("alice", "GET", f"{BASE}/task-instance", params=ti).json()
    assert (body["job"], body["map_index"], body["processed"]) == ("dag_a.parts[1]", 1, 10)


def test_a_task_instance_that_is_not_resumable_gets_a_one_line_explanation(as_user: Any) -> None:
    ti = {"dag_id": "dag_a", "run_id": "run_1", "task_id": "other", "map_index": -1}
    r = as_user("alice", "GET", f"{BASE}/task-instance", params=ti)
    assert r.status_code == 200 and r.json()["resumable"] is False and "not a resumable task" in r.json()["message"]


def test_a_task_instance_of_a_dag_the_user_may_not_see_is_forbidden(as_user: Any) -> None:
    ti = {"dag_id": "dag_b", "run_id": "run_1", "task_id": "export"}
    assert as_user("alice", "GET", f"{BASE}/task-instance", params=ti).status_code == 403
    assert as_user(None, "GET", f"{BASE}/task-instance", params=ti).status_code == 401


# -- requests --------------------------------------------------------------------------------------


def test_a_request_needs_credentials(as_user: Any) -> None:
    assert as_user(None, "POST", f"{BASE}/checkpoint/pause", params=q(A)).status_code == 401


def test_a_viewer_may_read_but_not_act(as_user: Any) -> None:
    r = as_user("viewer", "POST", f"{BASE}/checkpoint/pause", params=q(A))
    assert r.status_code == 403 and "viewer may not change" in r.json()["message"]


def test_a_user_may_not_act_on_a_dag_they_may_not_see(as_user: Any) -> None:
    assert as_user("alice", "POST", f"{BASE}/checkpoint/restart", params=q(B)).status_code == 403


def test_a_request_on_an_unknown_slot_is_not_found(as_user: Any) -> None:
    assert as_user("admin", "POST", f"{BASE}/checkpoint/pause", params={"job": "nope", "slot": SLOT}).status_code == 404


def test_a_request_the_slot_cannot_take_is_a_conflict_saying_why(as_user: Any) -> None:
    r = as_user("op", "POST", f"{BASE}/checkpoint/cancel", params=q(B))
    assert r.status_code == 409
    assert r.json()["message"] == "the slot finished (done): there is nothing to cancel"
    assert r.json()["hint"] == "Use restart to run it again" and r.json()["status"] == "done"


def test_a_connection_that_is_not_a_listed_checkpoint_store_is_refused(as_user: Any) -> None:
    r = as_user("admin", "GET", f"{BASE}/checkpoints", params={"conn_id": "some_other_database"})
    assert r.status_code == 400 and "api_conn_ids" in r.json()["message"]


def test_an_unknown_action_is_refused(as_user: Any) -> None:
    assert as_user("admin", "POST", f"{BASE}/checkpoint/explode", params=q(A)).status_code == 422


#: Every parameter that reaches a query, where it goes, and the others a request to it needs.
_TEXT_PARAMETERS = [
    ("GET", "checkpoint", "job", q(A)),
    ("GET", "checkpoint", "slot", q(A)),
    ("POST", "checkpoint/pause", "job", q(A)),
    ("POST", "checkpoint/release", "slot", q(A)),
    ("GET", "checkpoints", "dag_id", {}),
    ("GET", "checkpoints", "status", {}),
    *(("GET", "task-instance", name, {"dag_id": "dag_a", "run_id": "run_1", "task_id": "export"})
      for name in ("dag_id", "run_id", "task_id")),
]


def test_a_nul_character_in_any_parameter_is_refused_with_a_422_naming_it(as_user: Any, fresh: Store) -> None:
    # Given both stores (PostgreSQL's text cannot hold a NUL: psycopg2 refused it with a 500)
    for method, route, name, others in _TEXT_PARAMETERS:
        # When the parameter holds a NUL, or nothing
        for value, problem in (("a\x00b", "must not contain a NUL character"), ("", "at least 1 character")):
            r = as_user("admin", method, f"{BASE}/{route}", params={**others, "conn_id": FRESH, name: value})
            # Then the API refuses it, naming the parameter and what it must be, and changes nothing
            assert r.status_code == 422, (method, route, name, value, r.status_code, r.text)
            body = r.json()
            if name == "status":
                assert body["message"].startswith("query parameter 'status': Input should be 'running'"), body
            else:
                assert body["message"].startswith(f"query parameter {name!r}: ") and problem in body["message"], body
            assert body["detail"][0]["loc"] == ["query", name] and "openapi.json" in body["hint"]


def test_a_request_whose_body_is_not_json_is_a_400_in_the_apis_own_shape(as_user: Any) -> None:
    # Found by the fuzzer: FastAPI's own 400 came as {"detail": ...}, without the documented message
    r = as_user("admin", "POST", f"{BASE}/checkpoint/cancel", params=q(A), content=b"\xff{",
                headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["message"] == "There was an error parsing the body"


def test_a_map_index_out_of_airflows_range_is_refused_with_a_422(as_user: Any, fresh: Store) -> None:
    ti = {"dag_id": "dag_a", "run_id": "run_1", "task_id": "export", "conn_id": FRESH}
    for value, problem in ((2**63, "less than or equal to 2147483647"), (-2, "greater than or equal to -1")):
        r = as_user("admin", "GET", f"{BASE}/task-instance", params={**ti, "map_index": value})
        assert r.status_code == 422 and r.json()["message"] == f"query parameter 'map_index': Input should be {problem}"
    assert as_user("admin", "GET", f"{BASE}/task-instance", params={**ti, "map_index": 2**31 - 1}).status_code == 200


def test_the_listing_cuts_a_large_state_to_a_preview_and_one_slot_gives_it_whole(as_user: Any, fresh: Store) -> None:
    from airflow_resumable.operators.resumable import XCOM_ROW_LIMIT

    # Given a slot whose state is 200 KiB and one whose state is small, on each store
    big = big_slot(fresh, "dag_big.export", kib=200)
    small = big_slot(fresh, "dag_big.small", kib=1)
    # When the listing is asked for
    r = as_user("admin", "GET", f"{BASE}/checkpoints", params={"conn_id": FRESH})
    assert r.status_code == 200
    rows = {row["job"]: row for row in r.json()["checkpoints"]}
    # Then the large row comes within the cap, its state a preview marked truncated, with its size
    cut = rows["dag_big.export"]
    assert len(r.content) < 2 * XCOM_ROW_LIMIT and cut["truncated"] == ["state"]
    assert cut["state"]["truncated"] is True and cut["state"]["bytes"] > 200 * 1024
    assert cut["state"]["preview"].startswith('{"blob": "xxx') and (cut["position"], cut["processed"]) == (1, 1)
    # And the small one comes whole, unmarked
    assert rows["dag_big.small"]["state"] == small and "truncated" not in rows["dag_big.small"]
    # And the single-slot endpoint gives the whole state
    whole = as_user("admin", "GET", f"{BASE}/checkpoint", params={**q("dag_big.export"), "conn_id": FRESH})
    assert whole.status_code == 200 and whole.json()["state"] == big and "truncated" not in whole.json()


def test_the_listing_leaves_a_partitioned_jobs_plan_row_out_unless_asked_and_marks_it(as_user: Any,
                                                                                       fresh: Store) -> None:
    from airflow_resumable.core.work.partitions import Plan, save_plan

    # Given a slot and a partitioned job's plan row (<job>#plan), on each store
    big_slot(fresh, "dag_big.small", kib=1)
    with fresh.open(autocommit=True) as s:
        save_plan(s, "dag_big.parts", SLOT, Plan(2, (10,), 20))
    # When the listing is asked for: only the slot, marked as one
    body = as_user("admin", "GET", f"{BASE}/checkpoints", params={"conn_id": FRESH}).json()
    assert [(r["job"], r["kind"]) for r in body["checkpoints"]] == [("dag_big.small", "slot")]
    assert body["total_entries"] == 1
    # When it is asked for with include_plans: the plan row too, marked as a plan
    body = as_user("admin", "GET", f"{BASE}/checkpoints", params={"conn_id": FRESH, "include_plans": "true"}).json()
    assert sorted((r["job"], r["kind"]) for r in body["checkpoints"]) == [
        ("dag_big.parts#plan", "plan"), ("dag_big.small", "slot")]
    assert body["total_entries"] == 2


def test_requests_go_through_with_the_airflow_user_in_the_history(as_user: Any) -> None:
    paused = as_user("alice", "POST", f"{BASE}/checkpoint/pause", params=q(A))
    assert paused.status_code == 200 and paused.json()["request"] == "pause"
    assert paused.json()["offers"]["resume"] is True and paused.json()["offers"]["pause"] is False
    resumed = as_user("op", "POST", f"{BASE}/checkpoint/resume", params=q(A), json={})
    assert resumed.status_code == 200
    history = [(h["outcome"], h["requested_by"]) for h in resumed.json()["history"]]
    assert history == [("failed", None), ("pause_requested", "alice"), ("resume_requested", "op")]


def test_a_release_with_nobody_holding_the_lease_is_a_conflict(as_user: Any) -> None:
    r = as_user("admin", "POST", f"{BASE}/checkpoint/release", params=q(A), json={"force": True})
    assert r.status_code == 409 and r.json()["message"] == "nobody holds the slot's lease"


# -- the app itself ----------------------------------------------------------------------------------


def test_the_api_is_described_by_openapi(client: TestClient) -> None:
    paths = client.get("/resumable/openapi.json").json()["paths"]
    assert {"/api/v1/checkpoints", "/api/v1/checkpoint", "/api/v1/checkpoint/{action}",
            "/api/v1/task-instance"} <= set(paths)


def test_the_request_choices_the_schema_publishes_are_the_rules_tables(client: TestClient) -> None:
    from airflow_resumable.core.model.request_rules import ACTIONS

    schema = client.get("/resumable/openapi.json").json()
    action = next(p for p in schema["paths"]["/api/v1/checkpoint/{action}"]["post"]["parameters"]
                  if p["name"] == "action")["schema"]
    if "$ref" in action:
        action = schema["components"]["schemas"][action["$ref"].rsplit("/", 1)[-1]]
    assert tuple(action["enum"]) == ACTIONS


def test_the_plugin_adds_a_checkpoint_tab_and_a_jobs_page_once(as_user: Any) -> None:
    plugins = as_user("admin", "GET", "/api/v2/plugins").json()["plugins"]
    ours = [p for p in plugins if p["name"] == "resumable"]
    assert len(ours) == 1
    views = {v["name"]: v for v in ours[0]["external_views"]}
    assert views["Checkpoint"]["destination"] == "task_instance" and "{TASK_ID}" in views["Checkpoint"]["href"]
    assert views["Resumable jobs"]["destination"] == "nav"


def test_the_pages_and_their_script_are_served_offline(client: TestClient) -> None:
    for path in ("/resumable/ui/checkpoint", "/resumable/ui/jobs", "/resumable/ui/resumable.js", "/resumable/ui/jobs.js"):
        r = client.get(path)
        assert r.status_code == 200 and "http://" not in r.text and "https://" not in r.text, path


# -- registration ------------------------------------------------------------------------------------

def _python(code: str, **env: str) -> str:
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k != "RESUMABLE_PLUGIN_API"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env},
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


_REGISTERED = (
    "from airflow import plugins_manager\n"
    "if hasattr(plugins_manager, '_get_plugins'):  # Airflow 3.2 and later\n"
    "    plugins, errors = plugins_manager._get_plugins()\n"
    "else:  # 3.1\n"
    "    plugins_manager.ensure_plugins_loaded()\n"
    "    plugins, errors = plugins_manager.plugins, plugins_manager.import_errors\n"
    "ours = [p for p in plugins if p.name == 'resumable']\n"
    # Only our plugin's errors: another provider's (OpenLineage's plugin is declared twice, as provider
    # info and as an entry point) is not ours to judge.
    "print(len(ours), len(ours[0].fastapi_apps), sorted(e for e in errors if 'resumable' in str(e).lower()))\n"
)


@pytest.mark.parametrize("lazy", ["True", "False"])
def test_the_plugin_is_registered_once_whether_or_not_providers_are_discovered_eagerly(
    airflow_home: Path, lazy: str
) -> None:
    # Outside the api-server (this is a worker's view): registered once, no FastAPI app built
    assert _python(_REGISTERED, AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS=lazy) == "1 0 []"


def test_the_api_server_gets_the_fastapi_app(airflow_home: Path) -> None:
    code = "import sys; sys.argv = ['airflow', 'api-server']\n" + _REGISTERED
    assert _python(code) == "1 1 []"


# -- the contract, fuzzed against a real api-server ---------------------------------------------------

#: Test cases per operation and phase (about 700 in all, 10 s here), and the seed: the same cases
#: on every run. ``RESUMABLE_FUZZ_SEED`` / ``RESUMABLE_FUZZ_EXAMPLES`` ask for others, or more.
FUZZ_EXAMPLES = int(os.environ.get("RESUMABLE_FUZZ_EXAMPLES", "100"))
FUZZ_SEED = os.environ.get("RESUMABLE_FUZZ_SEED", "19")


@pytest.fixture(scope="module")
def live(pg_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real ``airflow api-server`` (PostgreSQL metadata database), serving two seeded checkpoint
    stores: SQLite (the default) and PostgreSQL (``resumable_pg``, listed in ``api_conn_ids``)."""
    from support.standalone import ApiServer

    sqlite = SQLiteStore(tmp_path_factory.mktemp("live") / "checkpoints.db")
    pg_params = pg_server.create_database()
    for s in (sqlite, PostgresStore(**pg_params)):
        run_slot(s, A, "dag_a", fail_at=10)
        run_slot(s, B, "dag_b")
        big_slot(s, "dag_big.export", kib=200)
        # The schema's example slot, so that the fuzzer's examples phase reaches a real row
        run_slot(s, EXAMPLE["job"], EXAMPLE["dag_id"], fail_at=10, slot=EXAMPLE["slot"], run_id=EXAMPLE["run_id"],
                 task_id=EXAMPLE["task_id"])
    metadata = pg_server.create_database()
    server = ApiServer(
        metadata_uri=dsn(metadata).replace("postgresql://", "postgresql+psycopg2://", 1), dag_files=[],
        env={"AIRFLOW_CONN_RESUMABLE_DEFAULT": f"sqlite:///{sqlite.path}", "AIRFLOW_CONN_RESUMABLE_PG": dsn(pg_params),
             "AIRFLOW__RESUMABLE__API_CONN_IDS": "resumable_pg", "RESUMABLE_PLUGIN_API": "0",
             "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin"},
    )
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.mark.scheduler
def test_a_fuzzer_finds_the_api_keeps_its_openapi_contract_on_a_real_api_server(live: Any, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    import httpx

    # Given the schema the server publishes, naming both stores as the conn_id's choices
    schema = httpx.get(f"{live.base_url}/resumable/openapi.json", timeout=30).json()
    conn = next(p for p in schema["paths"]["/api/v1/checkpoint"]["get"]["parameters"] if p["name"] == "conn_id")
    assert conn["schema"]["enum"] == ["resumable_default", "resumable_pg"]
    # When schemathesis runs every check on every operation, authenticated as the UI's users are
    # (a JWT of the simple auth manager, from POST /auth/token)
    live.api.login()
    report = tmp_path / "fuzz.json"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "run", f"{live.base_url}/resumable/openapi.json",
         "--url", f"{live.base_url}/resumable", "--checks", "all", "--max-examples", str(FUZZ_EXAMPLES),
         "--workers", "1", "--seed", FUZZ_SEED, "--request-timeout", "30", "--continue-on-failure",
         "--header", f"Authorization: Bearer {live.api._token}",
         "--report", "json", "--report-json-path", str(report)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"},
    )
    # Then no case fails: no 5xx, every status documented, what the schema allows is accepted and
    # what it refuses is refused
    assert result.returncode == 0, f"{result.stdout[-12000:]}\n{result.stderr[-3000:]}\n{live.tail(40)}"
    print(result.stdout[-1500:])
    assert report.exists() and json.loads(report.read_text()), "schemathesis wrote no report"


# -- jobs ------------------------------------------------------------------------------------------


def test_jobs_gives_one_line_per_job_with_its_partitions_only_of_readable_dags(as_user: Any) -> None:
    body = as_user("admin", "GET", f"{BASE}/jobs").json()
    parts = next(j for j in body["jobs"] if j["job"] == "dag_a.parts")
    assert (parts["dag_id"], parts["task_id"], parts["run_id"], parts["mapped"]) == ("dag_a", "parts", "run_1", True)
    assert parts["partitions"] == {"done": 0, "running": 0, "stalled": 0, "abandoned": 0, "paused": 0, "failed": 2, "waiting": 0, "other": 0,
                                   "total": 2}
    assert (parts["processed"], parts["total"], parts["percent"]) == (5 + 10, 60, 25.0)
    detail = as_user("alice", "GET", f"{BASE}/jobs/partitions", params={"job": "dag_a.parts"}).json()
    assert [(r["map_index"], r["status"], r["processed"]) for r in detail["partition_rows"]] == [
        (0, "failed", 5), (1, "failed", 10)]
    assert as_user("alice", "GET", f"{BASE}/jobs/partitions", params={"job": B}).status_code == 403
    assert as_user("admin", "GET", f"{BASE}/jobs/partitions", params={"job": "no.such"}).status_code == 404
    assert {j["job"] for j in as_user("alice", "GET", f"{BASE}/jobs").json()["jobs"]} == {A, "dag_a.parts"}
    assert as_user(None, "GET", f"{BASE}/jobs").status_code == 401


def test_rerun_failed_is_refused_without_a_failed_task_instance_and_404_for_an_unknown_job(as_user: Any) -> None:
    """The rows say the partitions failed, but Airflow has no failed task instance of that run:
    nothing to clear (409, saying so); edit access to the DAG is needed first."""
    r = as_user("admin", "POST", f"{BASE}/jobs/rerun_failed", params={"job": "dag_a.parts", "run_id": "run_1"})
    assert r.status_code == 409 and "no task instance of DAG 'dag_a' task 'parts' failed" in r.json()["message"]
    assert as_user("viewer", "POST", f"{BASE}/jobs/rerun_failed",
                   params={"job": "dag_a.parts", "run_id": "run_1"}).status_code == 403
    r = as_user("admin", "POST", f"{BASE}/jobs/rerun_failed", params={"job": "dag_a.parts", "run_id": "run_x"})
    assert r.status_code == 404 and r.json()["hint"].startswith("Name the job as `airflow resumable jobs` lists it")


def test_retry_skipped_of_a_slot_without_skipped_items_is_refused_saying_why(as_user: Any) -> None:
    r = as_user("admin", "POST", f"{BASE}/checkpoint/retry_skipped", params=q(A))
    assert r.status_code == 409 and "no skipped item that can be replayed" in r.json()["message"]
    assert as_user("viewer", "POST", f"{BASE}/checkpoint/retry_skipped", params=q(A)).status_code == 403
    assert as_user("admin", "POST", f"{BASE}/checkpoint/retry_skipped", params=q("no.such")).status_code == 404


def test_retry_skipped_of_a_partition_through_rest_clears_it_and_its_next_run_replays_them(
    as_user: Any, fresh: Store, store_kind: str, run_dag: Any, request: pytest.FixtureRequest
) -> None:
    """What the Checkpoint tab's "Retry skipped items" button sends, for one partition of a
    partitioned job (tests/dags/partition_dags.py: pt_skips_fresh, on the store ``resumable_fresh``)."""
    from datetime import datetime, timezone

    from support.partition_source import table
    from support.sources import source_of

    day = datetime(2026, 3, 1, tzinfo=timezone.utc)
    source = source_of(store_kind, path=getattr(fresh, "path", None),
                       pg_params=request.getfixturevalue("pg_params") if store_kind == "postgres" else None)
    table(source, [("a" if i < 30 else "b", i) for i in range(40)])
    assert str(run_dag("pt_skips_fresh", conf={"bad": [13]}, logical_date=day).state) == "success"
    slot = {"job": "pt_skips_fresh.export[1]", "slot": day.isoformat(), "conn_id": FRESH}

    r = as_user("admin", "POST", f"{BASE}/checkpoint/retry_skipped", params=slot)

    assert r.status_code == 200, r.text
    body = r.json()
    assert body["retry"]["items"] == 1 and body["retry"]["cleared"] is True and "was cleared" in body["retry"]["next_run"]
    assert [i["state"] for i in body["skipped_items"]] == ["retry_requested"]
    assert body["history"][-1]["requested_by"] == "admin"
    assert str(run_dag("pt_skips_fresh", conf={"bad": []}, logical_date=day).state) == "success"
    after = as_user("admin", "GET", f"{BASE}/checkpoint", params=slot).json()
    assert [i["state"] for i in after["skipped_items"]] == ["replayed"]
    assert "it had failed with: ValueError: bad row a/13" in after["skipped_items"][0]["error"]


def test_a_handler_error_s_password_never_leaves_through_the_rest_api(as_user: Any, fresh: Store) -> None:
    """Given a slot whose handler failed with an error holding a DSN with its password and a
    ``password=`` pair (on a row written before errors were sanitized at their source), When the slot is read
    through GET /checkpoint and listed through GET /checkpoints, Then neither answer holds the password,
    and the rest of the error stays."""
    error = "could not connect to postgresql://u:s3cret@h/db (dsn: host=h password=s3cret)"

    def handler(ctx: Any) -> None:
        ctx.checkpoint(5, processed=5)
        raise RuntimeError(error)

    attempt = Attempt(fresh, Identity(job=A, slot=SLOT, attempt=1, owner="owner-1",
                                      origin=Origin(dag_id="dag_a", task_id="export", run_id="run_1", map_index=-1)),
                      options=Options(lease=3.0), heartbeat=0.05)
    with pytest.raises(RuntimeError):
        attempt.run(handler)
    with fresh.open(autocommit=True) as s:
        assert "s3cret" not in (s.checkpoints.load(A, SLOT).last_error or "")  # sanitized at the source
        # As a row written before the error was sanitized at its source holds it: the way out sanitizes it too.
        for table, column in (("resumable_checkpoints", "last_error"), ("resumable_attempts", "error")):
            s.execute(f"UPDATE {table} SET {column} = %(e)s WHERE {column} IS NOT NULL", {"e": f"RuntimeError: {error}"})
        s.commit()
        assert "s3cret" in (s.checkpoints.load(A, SLOT).last_error or "")
    one = as_user("admin", "GET", f"{BASE}/checkpoint", params={**q(A), "conn_id": FRESH})
    listed = as_user("admin", "GET", f"{BASE}/checkpoints", params={"conn_id": FRESH})
    assert one.status_code == listed.status_code == 200, (one.text, listed.text)
    for answer in (one, listed):
        assert "s3cret" not in answer.text, answer.text
    assert one.json()["last_error"] == ("RuntimeError: could not connect to postgresql://h/db "
                                        "(dsn: host=h password=***")  # an unquoted value ends at a space
    assert one.json()["history"][0]["error"] == one.json()["last_error"]
    assert listed.json()["checkpoints"][0]["last_error"] == one.json()["last_error"]


# -- a slot whose attempt is gone ------------------------------------------------------------------


def _abandon(store: Store, job: str, slot: str, *, lapsed: bool) -> None:
    """Put ``job``'s row as a holder killed mid-run leaves it: ``running``, its lease lapsed a
    minute ago (``lapsed``) or still live for an hour (the task instance failed meanwhile)."""
    with store.open(autocommit=True) as s, s.transaction():
        expiry = s.d.now_plus("-60" if lapsed else "3600")
        s.execute(f"UPDATE resumable_checkpoints SET status = 'running', lease_owner = 'ti-9/try1@host-9:42', "
                  f"lease_expires_at = {expiry}, heartbeat_at = {s.d.now_plus('-90')} "
                  "WHERE job = %(job)s AND slot = %(slot)s", {"job": job, "slot": slot})


def test_a_slot_whose_holder_died_is_shown_abandoned_through_rest_and_takes_restart_not_pause(
        as_user: Any, fresh: Store) -> None:
    # Given a slot whose holder was killed: its row says running, its lease lapsed
    run_slot(fresh, "dag_a.dead", "dag_a", fail_at=10)
    _abandon(fresh, "dag_a.dead", SLOT, lapsed=True)
    slot = {**q("dag_a.dead"), "conn_id": FRESH}
    # When it is read, and its job listed
    view = as_user("alice", "GET", f"{BASE}/checkpoint", params=slot).json()
    line = next(j for j in as_user("alice", "GET", f"{BASE}/jobs", params={"conn_id": FRESH}).json()["jobs"]
                if j["job"] == "dag_a.dead")
    # Then both say abandoned (since its lease's expiry, naming the last holder), not running
    assert (view["status"], view["shown_status"], view["last_holder"]) == ("running", "abandoned", "ti-9/try1@host-9:42")
    assert view["shown_since"] and "nobody runs this slot" in view["shown_why"]
    assert {k: v for k, v in line["partitions"].items() if v} == {"abandoned": 1, "total": 1}
    assert (line["rate"], line["eta_seconds"], line["abandoned_since"]) == (None, None, view["shown_since"])
    # And it offers what a slot nobody runs takes: Restart and Release, not Pause, whose note says why
    assert {a: view["offers"][a] for a in ("pause", "restart", "release")} == {
        "pause": False, "restart": True, "release": True}
    assert view["offer_notes"]["pause"].startswith("Not now: nobody runs this slot: its lease expired at ")
    assert "Restart it, or Clear its task instance" in view["offer_notes"]["pause"]
    r = as_user("alice", "POST", f"{BASE}/checkpoint/pause", params=slot)
    assert r.status_code == 409 and r.json()["message"].startswith("nobody runs this slot"), r.text
    r = as_user("alice", "POST", f"{BASE}/checkpoint/restart", params=slot)
    assert r.status_code == 200, r.text
    assert (r.json()["request"], r.json()["lease_owner"]) == ("restart", None), "the old holder is fenced out"


def test_a_failed_task_instance_whose_row_says_running_is_abandoned_and_the_rerun_confirmation_names_both(
        as_user: Any, fresh: Store, store_kind: str, run_dag: Any, request: pytest.FixtureRequest) -> None:
    """What the jobs page and the Checkpoint tab read: Airflow failed partitions 2 and 3 of 4, and
    partition 2's row still says running with a live lease (its end was never written)."""
    from datetime import datetime, timezone

    from support.partition_source import table
    from support.sources import source_of

    day = datetime(2026, 3, 1, tzinfo=timezone.utc)
    source = source_of(store_kind, path=getattr(fresh, "path", None),
                       pg_params=request.getfixturevalue("pg_params") if store_kind == "postgres" else None)
    table(source, [("a", i) for i in range(40)])
    run = run_dag("pt_skips_fresh", conf={"bad": list(range(20, 40))}, logical_date=day)
    _abandon(fresh, "pt_skips_fresh.export[2]", day.isoformat(), lapsed=False)
    job = {"job": "pt_skips_fresh.export", "run_id": run.run_id, "conn_id": FRESH}

    line = next(j for j in as_user("admin", "GET", f"{BASE}/jobs", params={"conn_id": FRESH}).json()["jobs"]
                if j["job"] == "pt_skips_fresh.export")
    parts = as_user("admin", "GET", f"{BASE}/jobs/partitions", params={"job": job["job"], "conn_id": FRESH}).json()
    tab = as_user("admin", "GET", f"{BASE}/task-instance", params={
        "dag_id": "pt_skips_fresh", "task_id": line["task_id"], "run_id": run.run_id, "map_index": 2,
        "conn_id": FRESH}).json()

    # The line counts it abandoned, and says how Airflow has the task instances
    assert {k: v for k, v in line["partitions"].items() if v} == {"done": 2, "failed": 1, "abandoned": 1,
                                                                    "total": 4}, line
    assert line["task_instances"]["failed"] == 2 and line["task_instances"]["success"] == 2
    assert [(r["map_index"], r["shown_status"], r["task_state"]) for r in parts["partition_rows"]][2:] == [
        (2, "abandoned", "failed"), (3, "failed", "failed")]
    assert (tab["status"], tab["shown_status"], tab["offers"]["pause"]) == ("running", "abandoned", False)
    assert "task instance is failed" in tab["shown_why"]
    # The listing of slots (the jobs page's slot list) says so too, though the lease has not lapsed
    listed = as_user("admin", "GET", f"{BASE}/checkpoints", params={"conn_id": FRESH}).json()["checkpoints"]
    assert [(r["status"], r["shown_status"]) for r in listed if r["job"] == "pt_skips_fresh.export[2]"] == [
        ("running", "abandoned")], listed
    # The re-run's confirmation names the partitions the re-run then clears, from Airflow's states
    preview = as_user("viewer", "GET", f"{BASE}/jobs/rerun_preview", params=job)
    assert preview.status_code == 200 and preview.json()["failed"] == [2, 3], preview.text
    r = as_user("admin", "POST", f"{BASE}/jobs/rerun_failed", params=job)
    assert r.status_code == 200 and r.json()["cleared"] == preview.json()["failed"], r.text


def test_the_rerun_preview_is_read_only_and_checked_like_the_rerun(as_user: Any) -> None:
    r = as_user("viewer", "GET", f"{BASE}/jobs/rerun_preview", params={"job": "dag_a.parts", "run_id": "run_1"})
    assert r.status_code == 200 and r.json()["failed"] == [], "no task instance of that run failed in Airflow"
    assert as_user("alice", "GET", f"{BASE}/jobs/rerun_preview",
                   params={"job": B, "run_id": "run_1"}).status_code == 403
    assert as_user("admin", "GET", f"{BASE}/jobs/rerun_preview",
                   params={"job": "dag_a.parts", "run_id": "run_x"}).status_code == 404
    assert as_user(None, "GET", f"{BASE}/jobs/rerun_preview",
                   params={"job": "dag_a.parts", "run_id": "run_1"}).status_code == 401


# -- rebalancing: ranges taken from running partitions ---------------------------------------------


def test_jobs_count_a_partition_with_a_range_taken_from_it_once_and_list_the_split_with_outward_texts(
        as_user: Any, fresh: Store) -> None:
    """Before: the taken range ``<job>[1].1`` counted as a fourth partition of a job of 3 (and [1],
    done with what it kept, as done), and nothing said which range took what from whom."""
    import json

    from support.slots import SPLIT_WHEN, split_job

    # Given a job of 3 partitions whose [2] took the upper half of [1]'s range, the taken range still
    # running, and an asker's name holding an escape sequence and a password (a plan edited by other code)
    split_job(fresh, "dag_a.sp", "dag_a", own="done", taken="running", by="dag_a.sp[2] \x1b[31m password=hunter2")
    # When its line and its partitions are read through REST
    body = as_user("alice", "GET", f"{BASE}/jobs", params={"conn_id": FRESH}).json()
    detail = as_user("alice", "GET", f"{BASE}/jobs/partitions", params={"job": "dag_a.sp", "conn_id": FRESH}).json()
    # Then the job is one line of its plan's 3 partitions: [1]'s line runs while its taken range does
    assert [j["job"] for j in body["jobs"]] == ["dag_a.sp"], body
    line = body["jobs"][0]
    for shown in (line, detail):
        assert {k: v for k, v in shown["partitions"].items() if v} == {"done": 2, "running": 1, "total": 3}, shown
        assert (shown["processed"], shown["total"]) == (10 + 5 + 10 + 2, 30), shown
    assert [r["map_index"] for r in detail["partition_rows"]] == [0, 1, 2]
    # And the split: range 1.1 taken from [1] after key 15, when, by whom (through outward_text), run
    # now by [2]'s task instance, running at 2 of 5
    split = line["splits"][0]
    assert (split["range"], split["from"], split["after"], split["until"], split["when"]) == (
        "1.1", "dag_a.sp[1]", 15, 20, SPLIT_WHEN)
    assert (split["job"], split["map_index"], split["status"], split["processed"], split["total"]) == (
        "dag_a.sp[1].1", 2, "running", 2, 5)
    assert split["by"] == "dag_a.sp[2] \\x1b[31m password=***", split["by"]
    assert "hunter2" not in json.dumps(body) + json.dumps(detail) and detail["splits"] == line["splits"]
    # And the taken range takes a request as a range of the plan, through REST
    r = as_user("alice", "POST", f"{BASE}/checkpoint/pause",
                params={"job": "dag_a.sp[1].1", "slot": SLOT, "conn_id": FRESH})
    assert r.status_code == 200 and r.json()["request"] == "pause", r.text


def test_the_tab_of_a_partition_that_took_a_range_lists_every_slot_it_ran_and_shows_the_one_asked_for(
        as_user: Any, fresh: Store) -> None:
    """Before: the tab showed only the slot its task instance ran last (the taken range), with no way
    to its own partition's row: the jobs page's link for ``<job>[2]`` opened ``<job>[1].1``."""
    from support.slots import split_job

    # Given partition [2], done with its own range, then done with the range it took from [1]
    split_job(fresh, "dag_a.sp", "dag_a", own="done", taken="done")
    ti = {"dag_id": "dag_a", "run_id": "run_1", "task_id": "exp.partition", "map_index": 2, "conn_id": FRESH}
    # When its Checkpoint tab asks for its slot
    body = as_user("alice", "GET", f"{BASE}/task-instance", params=ti).json()
    # Then it shows the one it ran last, the taken range, and lists both slots it ran, newest first
    assert (body["job"], body["range"]["range"]) == ("dag_a.sp[1].1", "1.1"), body
    assert body["ran"] == [{"job": "dag_a.sp[1].1", "slot": SLOT, "status": "done"},
                           {"job": "dag_a.sp[2]", "slot": SLOT, "status": "done"}], body["ran"]
    # And asked for its own partition's job, it shows that slot
    own = as_user("alice", "GET", f"{BASE}/task-instance", params={**ti, "job": "dag_a.sp[2]"}).json()
    assert (own["resumable"], own["job"], own["processed"], own["ran"]) == (True, "dag_a.sp[2]", 10, body["ran"])
    # And a job another task instance ran is not shown through this one
    other = as_user("alice", "GET", f"{BASE}/task-instance", params={**ti, "job": "dag_a.sp[1]"}).json()
    assert other["resumable"] is False and "ran no slot of the job 'dag_a.sp[1]'" in other["message"], other
