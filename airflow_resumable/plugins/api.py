"""The plugin's FastAPI app, mounted at ``/resumable`` by the api-server.

REST (``/resumable/api/v1``, OpenAPI at ``/resumable/openapi.json``) and the two pages of the
UI (``/resumable/ui/checkpoint``, ``/resumable/ui/jobs``), which call the REST API from the
browser with the UI's own session cookie.

Access control is Airflow's: the user comes from the same JWT as ``/api/v2`` (a Bearer token, or
the UI's ``_token`` cookie) through ``GetUserDep``; 401 without one. Reading a slot needs read
access to its owning DAG's task instances, a request (pause, resume, ...) needs edit access, both
asked of the configured auth manager; the list shows only slots of DAGs the user may read. The
owning DAG is the row's ``dag_id`` (the DAG of the task instance that last ran the slot); a row
that names no DAG (written outside Airflow) needs access to all DAGs.

This module imports the api-server's code: the plugin imports it only where that runs.

Every request goes through :mod:`airflow_resumable.control`; nothing here decides what a slot may
take. The checkpoint store is ``[resumable] conn_id`` in Airflow's configuration (else
``resumable_default``); the ``conn_id`` query parameter may name another only if it is listed in
``[resumable] api_conn_ids``.

The OpenAPI schema says what the API accepts and answers: every parameter that reaches a query is
constrained there (no NUL character, which PostgreSQL's text cannot hold; Airflow's id lengths; the
map index's range; the statuses; the served connections), anything else is refused with 422 naming
the parameter, and each route lists every status it returns.

What the API answers is :mod:`airflow_resumable.core.view`'s shapes, whose texts went through
:func:`~airflow_resumable.core.model.outward.outward_text`; so do an error's message and hint. Who asks
(a request's ``by``) is the user's name, cleaned the same way at entry (its control characters
written out, its whitespace one space), so no name the auth manager gives can be refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import Body, FastAPI, HTTPException, Query, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

import airflow_resumable.control as control
from airflow_resumable.core.model.errors import (
    ConfigurationError,
    ReadBackFailed,
    RequestRefused,
    ResumableError,
    SlotNotFound,
    StoreUnavailable,
)
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.model.request_rules import Action
from airflow_resumable.core.model.states import Status
from airflow_resumable.core.view import ROW_LIMIT
from airflow_resumable.version_compat import GetUserDep

STATIC = Path(__file__).parent / "static"

#: What every text parameter must match: no NUL character. PostgreSQL's text cannot hold one
#: (psycopg2 refuses to send it), so without this a NUL would end as a 500 on one store only.
NO_NUL = r"^[^\x00]*$"
#: The longest DAG, task or run id Airflow stores (``ID_LEN`` of its models).
ID_LEN = 250
#: The largest map index Airflow stores (its column is a 32-bit integer; -1: not mapped).
MAX_MAP_INDEX = 2**31 - 1
#: What Airflow leaves in an external view's address for an unmapped task instance: it fills
#: ``{MAP_INDEX}`` only from a mapped task instance's route.
MAP_INDEX_PLACEHOLDER = "{MAP_INDEX}"
#: How a pattern a parameter failed to match reads in the 422's message.
_PATTERN_TEXT = {NO_NUL: "must not contain a NUL character (\\x00)"}

#: The schema's example slot (a test serves it, so that the examples reach a real row).
EXAMPLE = {"job": "customer_export.export", "slot": "2026-03-01T10:00:00+00:00", "dag_id": "customer_export",
           "task_id": "export", "run_id": "scheduled__2026-03-01T10:00:00+00:00"}

Job = Annotated[str, Query(min_length=1, pattern=NO_NUL, examples=[EXAMPLE["job"]],
                           description="the job (default name <dag_id>.<task_id>, plus [map_index] when mapped)")]
Slot = Annotated[str, Query(min_length=1, pattern=NO_NUL, examples=[EXAMPLE["slot"]],
                            description="the slot (the run's data interval start in ISO 8601, else its run id)")]
DagId = Annotated[str, Query(min_length=1, max_length=ID_LEN, pattern=NO_NUL, examples=[EXAMPLE["dag_id"]],
                             description="the DAG id")]
TaskId = Annotated[str, Query(min_length=1, max_length=ID_LEN, pattern=NO_NUL, examples=[EXAMPLE["task_id"]],
                              description="the task id")]
RunId = Annotated[str, Query(min_length=1, max_length=ID_LEN, pattern=NO_NUL, examples=[EXAMPLE["run_id"]],
                             description="the DAG run id")]
MapIndex = Annotated[int, Query(ge=-1, le=MAX_MAP_INDEX, description="the map index (-1: not mapped)")]


def default_conn_id() -> str:
    """``[resumable] conn_id`` in Airflow's configuration, else ``resumable_default``."""
    from airflow_resumable.version_compat import core_conf as conf

    return conf.get("resumable", "conn_id", fallback=control.DEFAULT_CONN_ID) or control.DEFAULT_CONN_ID


def served_conn_ids() -> list[str]:
    """The stores this API serves: the default, then those listed in ``[resumable] api_conn_ids``
    (comma-separated)."""
    from airflow_resumable.version_compat import core_conf as conf

    default = default_conn_id()
    listed = (c.strip() for c in conf.get("resumable", "api_conn_ids", fallback="").split(","))
    return [default, *sorted({c for c in listed if c and c != default})]


def _conn(conn_id: str | None) -> str:
    """The store to use: the default, or one listed in ``[resumable] api_conn_ids``.

    Any other connection id is refused (400): the API opens (and migrates) the store it names, so a
    caller must not be able to point it at an arbitrary Airflow connection.
    """
    served = served_conn_ids()
    if conn_id is None:
        return served[0]
    if conn_id not in served:
        raise HTTPException(status.HTTP_400_BAD_REQUEST,
                            f"the connection {conn_id!r} is not a checkpoint store this API serves; list it in "
                            "[resumable] api_conn_ids to allow it")
    return conn_id


class ActionBody(BaseModel):
    """Options of a request (only ``release`` has one)."""

    force: bool = Field(False, description="release: also free a live holder's lease, fencing it out")


class Problem(BaseModel):
    """An error: what went wrong and, when known, the slot and what to do."""

    message: str
    job: str | None = None
    slot: str | None = None
    status: str | None = None
    hint: str | None = None
    detail: Any = None


class InvalidRequest(BaseModel):
    """A 422: which parameters are wrong and what each must be (``detail``: one entry per problem)."""

    message: str
    hint: str
    detail: list[dict[str, Any]]


_STATUSES = {
    400: "conn_id names a connection this API does not serve (list it in [resumable] api_conn_ids), the "
         "store's connection is not configured, or the request's body is not JSON",
    401: "no credentials (a Bearer JWT or the UI's session cookie)",
    403: "the user may not read (or, for requests, edit) the owning DAG's task instances",
    404: "no such slot",
    409: "the slot cannot take this request now (the message says why)",
    422: "a parameter is missing or not what the schema allows (the message names it)",
    500: "the store holds what this release cannot read (a corrupt row, a newer schema; the message says which); "
         "for a request, the message says whether it was applied all the same (the slot could not be read back)",
    503: "the checkpoint store cannot be reached; try again (a request's message says if it was applied already)",
}


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error statuses a route returns, for its OpenAPI description."""
    return {code: {"model": InvalidRequest if code == 422 else Problem, "description": _STATUSES[code]}
            for code in codes}


def _invalid(errors: Any) -> dict[str, Any]:
    """The 422's body: each problem as "query parameter 'job': must not contain ..."."""
    detail: list[dict[str, Any]] = []
    parts: list[str] = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        where, name = (loc[0], ".".join(loc[1:])) if len(loc) > 1 else ("request", ".".join(loc))
        pattern = str((error.get("ctx") or {}).get("pattern"))
        what = _PATTERN_TEXT.get(pattern) or str(error.get("msg", "is not valid"))
        kind = "parameter" if where in ("query", "path", "header", "cookie") else "field"
        parts.append(f"{where} {kind} {name!r}: {what}")
        # The input is left out: the message names the parameter, and echoing values is not our job.
        detail.append({"loc": loc, "msg": what, "type": error.get("type")})
    return {"message": "; ".join(parts) or "the request is not valid",
            "hint": "Correct the request: /resumable/openapi.json says what each parameter accepts",
            "detail": jsonable_encoder(detail)}


def create_app() -> FastAPI:
    """The sub-application the plugin mounts at ``/resumable``.

    The schema lists the stores served when the app is built (the api-server's start), as the
    ``conn_id`` parameter's choices.
    """
    served = served_conn_ids()

    def conn_query() -> Any:
        return Query(served[0], min_length=1, json_schema_extra={"enum": served},
                     description="the checkpoint store's Airflow connection: [resumable] conn_id (else "
                     "resumable_default), or one listed in [resumable] api_conn_ids")

    app = FastAPI(
        title="airflow-resumable",
        version="1",
        description="Checkpoints of resumable jobs: list, inspect, pause, resume, cancel, restart, release. "
        "Authenticate as for /api/v2 (Bearer JWT from POST /auth/token, or the UI's session cookie).",
    )

    # Starlette's, which FastAPI's subclasses: FastAPI itself raises Starlette's for a body that is
    # not JSON (400), as Starlette does for an unknown path (404) or method (405).
    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"message": str(exc.detail), "detail": exc.detail}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_invalid(exc.errors()), status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(ResumableError)
    async def _resumable_error(request: Request, exc: ResumableError) -> JSONResponse:
        code = _status_of(exc)
        body = {"message": _text(exc.message), "job": _text(exc.job), "slot": _text(exc.slot), "hint": _text(exc.hint),
                "status": getattr(exc, "status", None), "detail": _text(str(exc))}
        return JSONResponse(body, status_code=code)

    @app.get("/api/v1/checkpoints", responses=_responses(400, 401, 403, 422, 500, 503),
             summary="Live and recent slots across the DAGs you may read",
             description=f"A row over {ROW_LIMIT // 1024} KiB of JSON comes with its large position, state and "
             "resumed_from cut to a preview (`{\"truncated\": true, \"bytes\": n, \"preview\": ...}`), the cut "
             "columns listed under `truncated`, as the XCom copy is cut; GET /api/v1/checkpoint gives the "
             "slot's whole row.")
    def list_checkpoints(
        user: GetUserDep,
        dag_id: Annotated[str | None, Query(min_length=1, max_length=ID_LEN, pattern=NO_NUL,
                                            description="only this DAG's slots")] = None,
        dag_id_pattern: Annotated[str | None, Query(min_length=1, max_length=ID_LEN, pattern=NO_NUL,
                                                    description="only slots of DAGs whose id contains this "
                                                    "text, in any case (as the jobs page's DAG filter)")] = None,
        status_: Annotated[Status | None, Query(alias="status", description="only slots in this status")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        include_plans: Annotated[bool, Query(description="also partitioned jobs' plan rows (`<job>#plan`, "
                                             "`kind: \"plan\"`: the split a run's partitions read, not work; "
                                             "GET /jobs folds them into their job)")] = False,
        conn_id: str = conn_query(),
    ) -> dict[str, Any]:
        conn = _conn(conn_id)
        readable = _readable(user, dag_id, conn)
        if dag_id_pattern is not None:
            needle = dag_id_pattern.casefold()
            owning = readable if readable is not None else control.dag_ids(conn_id=conn)
            readable = {d for d in owning if needle in d.casefold()}
            if not readable:
                return {"checkpoints": [], "total_entries": 0}
        rows = control.recent(conn_id=conn, dag_ids=readable, status=status_, limit=limit, plans=include_plans)
        return {"checkpoints": control.listed(rows, control.task_instance_states), "total_entries": len(rows)}

    @app.get("/api/v1/checkpoint", responses=_responses(400, 401, 403, 404, 422, 500, 503),
             summary="One slot: its row (whole), figures, history and what it would take now")
    def get_checkpoint(user: GetUserDep, job: Job, slot: Slot, conn_id: str = conn_query()) -> dict[str, Any]:
        # one connection, one schema check; the caller's permission on the owning DAG before any other column
        with _slot_hidden(user, job, slot, "GET"):
            return control.detail(job, slot, conn_id=_conn(conn_id), check=lambda dag_id: _authorize(user, dag_id, "GET"),
                                  task_states=control.task_instance_states)

    @app.get("/api/v1/task-instance", responses=_responses(400, 401, 403, 422, 500, 503),
             summary="The slot a task instance ran (the Checkpoint tab)")
    def task_instance_checkpoint(
        user: GetUserDep, dag_id: DagId, run_id: RunId, task_id: TaskId, map_index: MapIndex = -1,
        conn_id: str = conn_query(),
        job: Annotated[str | None, Query(min_length=1, pattern=NO_NUL, description="the task instance's slot of "
                                         "this job (one of those `ran` lists), instead of the one it ran last")] = None,
    ) -> dict[str, Any]:
        _authorize(user, dag_id, "GET")
        conn = _conn(conn_id)
        # Airflow's own word on the task instance: a running row whose task instance ended is abandoned
        ti_state = (control.task_instance_states(dag_id, task_id, run_id) or {}).get(map_index)
        view = control.find_detail(dag_id, task_id, run_id, map_index, conn_id=conn, ti_state=ti_state, job=job)
        if view is None and job is not None:
            return {"resumable": False, "message": f"This task instance ran no slot of the job {_text(job)!r}; "
                    "without job=, its tab shows the slot it ran last."}
        if view is None:
            overlap = overlap_of(dag_id, run_id, task_id, map_index)
            if overlap is not None:
                return {"resumable": False, "overlap": overlap, "message": overlap["message"]}
            never = None if ti_state in ("running", "deferred", "success", "skipped") else \
                never_started(dag_id, run_id, task_id, map_index)
            if never is not None:
                return {"resumable": False, "never_started": never, "message": never["message"]}
            return {"resumable": False, "message": "This task instance has no checkpoint: it is not a resumable "
                    "task (ResumableOperator, ChunkedOperator, @task.resumable), it has not started yet, or "
                    f"its checkpoints live in another store than the connection {conn!r}."}
        return {"resumable": True, **view}

    # Before the route of the other requests, which would take "retry_skipped" for an action.
    @app.post("/api/v1/checkpoint/retry_skipped", responses=_responses(400, 401, 403, 404, 409, 422, 500, 503),
              summary="Ask the slot's task to replay its skipped items through its own code, on its next run",
              description="The items become `retry_requested` and the request, with your user name, goes to the "
              "slot's history; a finished task instance is cleared through Airflow so that the next run is now. "
              "The answer's `retry` says how many items wait (`items`), whether the task instance was cleared "
              "(`cleared`) and which run carries the retry out, or why none will until it is cleared (`next_run`). "
              "409 while the slot runs or when it has no skipped item that can be replayed.")
    def retry_skipped(user: GetUserDep, job: Job, slot: Slot, conn_id: str = conn_query()) -> dict[str, Any]:
        with _slot_hidden(user, job, slot, "PUT"):
            return control.act(job, slot, control.RETRY_SKIPPED, conn_id=_conn(conn_id), by=_who(user),
                               check=lambda dag_id: _authorize(user, dag_id, "PUT"))

    @app.post("/api/v1/checkpoint/withdraw_retry", responses=_responses(400, 401, 403, 404, 409, 422, 500, 503),
              summary="Withdraw a retry of the slot's skipped items that no run carried out yet",
              description="The items waiting for the retry (`retry_requested`) are `skipped` again, their errors as "
              "they were, and the withdrawal, with your user name, goes to the slot's history; a retry can be asked "
              "again. The answer's `withdrawn.items` says how many. 409 while the slot runs (it may be replaying "
              "them) or when no retry is pending. A partition past its job's current plan takes it too (nothing "
              "runs it, so a retry asked there would wait for good).")
    def withdraw_retry(user: GetUserDep, job: Job, slot: Slot, conn_id: str = conn_query()) -> dict[str, Any]:
        with _slot_hidden(user, job, slot, "PUT"):
            return control.act(job, slot, control.WITHDRAW_RETRY, conn_id=_conn(conn_id), by=_who(user),
                               check=lambda dag_id: _authorize(user, dag_id, "PUT"))

    @app.post("/api/v1/checkpoint/{action}", responses=_responses(400, 401, 403, 404, 409, 422, 500, 503),
              summary="Ask the slot to pause, resume, cancel, restart or release its lease")
    def act(
        user: GetUserDep, action: Action, job: Job, slot: Slot, conn_id: str = conn_query(),
        body: Annotated[ActionBody | None, Body()] = None,
    ) -> dict[str, Any]:
        with _slot_hidden(user, job, slot, "PUT"):
            return control.act(job, slot, action.value, conn_id=_conn(conn_id), by=_who(user),
                               force=action is Action.RELEASE and bool(body and body.force),
                               check=lambda dag_id: _authorize(user, dag_id, "PUT"))

    @app.get("/api/v1/jobs", responses=_responses(400, 401, 403, 422, 500, 503),
             summary="One line per job: its latest run's partitions (done, running, stalled, abandoned, paused, "
             "failed, waiting, other, total), how Airflow's task instances of the run stand (task_instances), and "
             "its progress as their sum (processed, total, percent, rate, eta_seconds, stalled_since)")
    def list_jobs(
        user: GetUserDep,
        dag_id: Annotated[str | None, Query(min_length=1, max_length=ID_LEN, pattern=NO_NUL,
                                            description="only this DAG's jobs")] = None,
        conn_id: str = conn_query(),
    ) -> dict[str, Any]:
        conn = _conn(conn_id)
        return {"jobs": control.jobs(conn_id=conn, dag_ids=_readable(user, dag_id, conn),
                                     task_states=control.task_instance_states)}

    @app.get("/api/v1/jobs/partitions", responses=_responses(400, 401, 403, 404, 422, 500, 503),
             summary="One job: its line and each partition's row by map index (a way into each partition)",
             description="`partition_rows`: each partition's row with the Checkpoint tab's figures (`percent`, "
             "`rate`, `eta_seconds`, `lease`), or `{\"map_index\": i, \"status\": \"waiting\"}` for a planned "
             "partition that has not started. 404 when no partition of the job ran (in that run).")
    def job_partitions(
        user: GetUserDep,
        job: Annotated[str, Query(min_length=1, pattern=NO_NUL, examples=["partitioned_export.export"],
                                  description="the job, as GET /api/v1/jobs lists it (without [map_index])")],
        run_id: Annotated[str | None, Query(min_length=1, max_length=ID_LEN, pattern=NO_NUL,
                                            description="the DAG run (default: the job's latest)")] = None,
        conn_id: str = conn_query(),
    ) -> dict[str, Any]:
        conn = _conn(conn_id)
        with _job_hidden(user, job, run_id, "GET"):
            return control.job_partitions(job, run_id, conn_id=conn, task_states=control.task_instance_states,
                                          check=lambda dag_id: _authorize(user, dag_id, "GET"))

    @app.post("/api/v1/jobs/rerun_failed", responses=_responses(400, 401, 403, 404, 409, 422, 500, 503),
              summary="Clear exactly the failed task instances (map indexes) of a job in one DAG run",
              description="A partitioned job's summary task (and tasks upstream_failed) is cleared with them; each "
                          "cleared partition's history records the re-run with your user name.")
    def rerun_failed(user: GetUserDep, job: Job, run_id: RunId, conn_id: str = conn_query()) -> dict[str, Any]:
        conn = _conn(conn_id)
        _job_authorized(user, job, run_id, conn, "PUT")
        return {"job": job, "run_id": run_id,
                "cleared": control.rerun_failed(job, run_id, conn_id=conn, by=_who(user))}

    @app.get("/api/v1/jobs/rerun_preview", responses=_responses(400, 401, 403, 404, 422, 500, 503),
             summary="What POST /api/v1/jobs/rerun_failed would clear now, changing nothing",
             description="`failed`: the map indexes (-1: unmapped) of the job's task instances Airflow has as "
             "failed in that run, read as the re-run reads them: what its confirmation names.")
    def rerun_candidates(user: GetUserDep, job: Job, run_id: RunId, conn_id: str = conn_query()) -> dict[str, Any]:
        conn = _conn(conn_id)
        _job_authorized(user, job, run_id, conn, "GET")
        return control.rerun_candidates(job, run_id, conn_id=conn)

    @app.get("/ui/checkpoint", include_in_schema=False, response_model=None)
    def checkpoint_page(request: Request) -> FileResponse | RedirectResponse:
        # Airflow fills {MAP_INDEX} only on a mapped task instance's page: an unmapped one's tab
        # comes with the placeholder itself, which becomes -1 (not mapped) here, so the tab's own
        # address says what it shows.
        if request.query_params.get("map_index") == MAP_INDEX_PLACEHOLDER:
            query = [(k, "-1" if k == "map_index" else v) for k, v in request.query_params.multi_items()]
            return RedirectResponse(f"checkpoint?{urlencode(query)}", status_code=status.HTTP_302_FOUND)
        return FileResponse(STATIC / "checkpoint.html", headers={"Cache-Control": "no-cache"})

    @app.get("/ui/jobs", include_in_schema=False)
    def jobs_page() -> FileResponse:
        return FileResponse(STATIC / "jobs.html", headers={"Cache-Control": "no-cache"})

    @app.get("/ui/resumable.css", include_in_schema=False)
    def stylesheet() -> FileResponse:
        return FileResponse(STATIC / "resumable.css", media_type="text/css", headers={"Cache-Control": "no-cache"})

    @app.get("/ui/resumable.js", include_in_schema=False)
    def script() -> FileResponse:
        return FileResponse(STATIC / "resumable.js", media_type="text/javascript",
                            headers={"Cache-Control": "no-cache"})

    @app.get("/ui/jobs.js", include_in_schema=False)
    def jobs_script() -> FileResponse:
        return FileResponse(STATIC / "jobs.js", media_type="text/javascript", headers={"Cache-Control": "no-cache"})

    return app


def overlap_of(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any] | None:
    """The overlap decision that kept the task instance's current try from starting (its XCom
    ``overlap``: ``{"policy", "yielded_to": {"run_id", "slot", "started_at"}, "message"}``), else None.
    XCom is cleared when a new try starts, so an older try's decision is never shown."""
    from airflow_resumable.operators.overlap import OVERLAP_XCOM_KEY
    from airflow_resumable.version_compat import XComModel, create_session

    with create_session() as session:
        found = session.scalars(XComModel.get_many(run_id=run_id, key=OVERLAP_XCOM_KEY, task_ids=task_id,
                                                   dag_ids=dag_id, map_indexes=map_index, limit=1)).first()
        value = None if found is None else XComModel.deserialize_value(found)
    if not isinstance(value, dict) or value.get("policy") not in ("skip", "wait"):
        return None
    return {"policy": value["policy"], "yielded_to": value.get("yielded_to"), "message": str(value.get("message", ""))}


def never_started(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any] | None:
    """The latest try of the task instance that Airflow's executor reported failed while it was
    still queued (Airflow's log event ``state mismatch``), while that try is still the task
    instance's current one, or the one before a try that waits to start: it never started, so it
    left no checkpoint. The usual cause is a worker that cannot reach the Execution API (``[core]
    execution_api_server_url``, else ``[api] base_url`` + ``/execution/``, else port 8080), which
    the answer names. ``{"try_number", "at", "execution_api", "message"}``, else None."""
    from sqlalchemy import select

    from airflow_resumable.version_compat import Log, TaskInstance, core_conf, create_session

    with create_session() as session:
        # The task instance's current try, or the one before while the current one has not started (a
        # retry or a Clear waiting in the queue): a later try that ran is not the one the executor failed.
        ti = session.execute(select(TaskInstance.try_number, TaskInstance.state).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id,
            TaskInstance.map_index == map_index)).first()
        found = session.scalars(
            select(Log).where(Log.dag_id == dag_id, Log.run_id == run_id, Log.task_id == task_id,
                              Log.map_index == map_index, Log.event == "state mismatch")
            .order_by(Log.dttm.desc()).limit(1)
        ).first()
        if found is None or "is queued" not in (found.extra or "") or ti is None:
            return None
        waiting = str(getattr(ti.state, "value", ti.state) or "none") in ("none", "scheduled", "queued")
        if found.try_number != ti.try_number and not (waiting and found.try_number == ti.try_number - 1):
            return None
        try_number, at = found.try_number, found.dttm
    # As Airflow's executors resolve it (base_executor.get_execution_api_server_url): a base_url that is
    # a path only, or none, is under http://localhost:8080
    base = core_conf.get("api", "base_url", fallback="") or ""
    if not base or base.startswith("/"):
        base = f"http://localhost:8080{base}"
    execution = core_conf.get("core", "execution_api_server_url", fallback="") or f"{base.rstrip('/')}/execution/"
    when = at.isoformat() if at is not None else None
    message = (f"Try {try_number} failed before it started: Airflow's executor reported it failed while it was "
               f"still queued, so it left no checkpoint. A task fails so when its worker cannot reach Airflow's "
               f"Execution API (the scheduler's log says why, e.g. httpx.ConnectError): here that is "
               f"{execution} ([core] execution_api_server_url), which must be this api-server's address and port.")
    return {"try_number": try_number, "at": when, "execution_api": _text(execution), "message": _text(message)}


def _text(text: str | None) -> str | None:
    return None if text is None else outward_text(text)


def _who(user: Any) -> str:
    """Who asks, as a request records it: the user's name through ``outward_text`` (a control
    character written out: the auth manager's name is taken, never refused), its whitespace one space."""
    return " ".join(outward_text(str(user.get_name())).split()) or "?"


def _status_of(exc: ResumableError) -> int:
    if isinstance(exc, ReadBackFailed):  # applied, then the read of the answer failed: that failure's status
        return _status_of(exc.cause) if isinstance(exc.cause, ResumableError) else status.HTTP_500_INTERNAL_SERVER_ERROR
    if isinstance(exc, SlotNotFound):
        return status.HTTP_404_NOT_FOUND
    if isinstance(exc, RequestRefused):
        return status.HTTP_409_CONFLICT
    if isinstance(exc, ConfigurationError):
        return status.HTTP_400_BAD_REQUEST
    if isinstance(exc, StoreUnavailable):
        return status.HTTP_503_SERVICE_UNAVAILABLE
    return status.HTTP_500_INTERNAL_SERVER_ERROR


def _authorize(user: Any, dag_id: str | None, method: Literal["GET", "PUT"]) -> None:
    """403 unless the auth manager lets ``user`` read (GET) or edit (PUT) ``dag_id``'s task instances."""
    from airflow_resumable.version_compat import DagAccessEntity, DagDetails, DagModel, get_auth_manager

    details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id)) if dag_id else None
    if not get_auth_manager().is_authorized_dag(method=method, access_entity=DagAccessEntity.TASK_INSTANCE,
                                                details=details, user=user):
        what = "read" if method == "GET" else "change"
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"Forbidden: {_who(user)} may not {what} the task instances of DAG {dag_id!r}")


def _job_authorized(user: Any, job: str, run_id: str, conn_id: str, method: Literal["GET", "PUT"]) -> None:
    """403 unless ``user`` may read (GET) or edit (PUT) the task instances of the DAG that ran ``job`` in
    ``run_id``. The user named the job, not its DAG: a user who may not act on every DAG gets the same
    403, naming no DAG, whether the job ran in that run under a DAG they may not touch or never ran
    there (a 404 for the one and a 403 for the other told which jobs run in which runs of DAGs hidden
    from them, and the 403 named the owning DAG of a job whose name was overridden). A user who may
    act on every DAG gets the 404 of an unknown job."""
    with _job_hidden(user, job, run_id, method):
        dag_id, _task_id = control.job_task(job, run_id, conn_id=conn_id)
        _authorize(user, dag_id, method)


@contextlib.contextmanager
def _job_hidden(user: Any, job: str, run_id: str | None, method: Literal["GET", "PUT"]) -> Iterator[None]:
    """Around a route that finds a job's DAG from the job's name (see :func:`_hidden`)."""
    run = "its latest run" if run_id is None else f"run {run_id!r}"
    with _hidden(user, method, f"job {job!r} in {run}", "or no such job ran there"):
        yield


@contextlib.contextmanager
def _hidden(user: Any, method: Literal["GET", "PUT"], asked: str, unknown: str) -> Iterator[None]:
    """Around a route that finds the owning DAG from what the user named (a job, a slot): for a user
    who may not act on every DAG, an unknown one (404) and one of a DAG hidden from them (403 naming
    it) both become one 403 naming only what they asked (``asked``, ``unknown``: the sentence's end),
    so the answers tell no job, slot or DAG they may not see. A user who may act on every DAG gets
    the 404 of an unknown one (see :func:`_job_authorized`). The auth manager is asked only when the
    route refused: an answer that goes through costs nothing more."""
    def everything() -> bool:
        from airflow_resumable.version_compat import DagAccessEntity, get_auth_manager

        return bool(get_auth_manager().is_authorized_dag(method=method, access_entity=DagAccessEntity.TASK_INSTANCE,
                                                         user=user))

    what = "read" if method == "GET" else "change"
    forbidden = HTTPException(status.HTTP_403_FORBIDDEN, f"Forbidden: {_who(user)} may not {what} the task "
                              f"instances of {asked}, {unknown}")
    try:
        yield
    except SlotNotFound:
        if everything():
            raise
        raise forbidden from None
    except HTTPException as exc:
        if exc.status_code != status.HTTP_403_FORBIDDEN or everything():
            raise
        raise forbidden from None


def _slot_hidden(user: Any, job: str, slot: str, method: Literal["GET", "PUT"]) -> Any:
    """Around a route on one slot (``job``, ``slot``): see :func:`_hidden`."""
    return _hidden(user, method, f"the slot job={job!r} slot={slot!r}", "or it has no checkpoint row")


def _readable(user: Any, dag_id: str | None, conn_id: str) -> set[str] | None:
    """The DAGs a listing may show: ``dag_id`` alone (403 unless the user may read it), else every
    DAG the user may read (None: all of them)."""
    if dag_id is not None:
        _authorize(user, dag_id, "GET")
        return {dag_id}
    return _readable_dag_ids(user, conn_id)


def _readable_dag_ids(user: Any, conn_id: str) -> set[str] | None:
    """The DAGs owning slots in the store whose task instances the user may read; None: all of
    them (and rows that name no DAG)."""
    from airflow_resumable.version_compat import DagAccessEntity, DagDetails, get_auth_manager

    manager = get_auth_manager()
    if manager.is_authorized_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE, user=user):
        return None
    return {
        dag_id for dag_id in control.dag_ids(conn_id=conn_id)
        if manager.is_authorized_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE, user=user,
                                     details=DagDetails(id=dag_id))
    }
