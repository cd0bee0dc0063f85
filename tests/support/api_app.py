"""Airflow's api-server app with the plugin's REST API mounted at ``/resumable``, in this process, and
callers signed in as test users: admin (admin), viewer (viewer: reads every DAG, may not act), alice
(user, limited to ``dag_a`` by :mod:`support.per_dag_auth`) and op (op, every DAG)."""

from __future__ import annotations

import importlib
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support import plugins

BASE = "/resumable/api/v1"
ROLES = {"admin": "admin", "viewer": "viewer", "alice": "user", "op": "op"}


@contextmanager
def api_app(airflow_home: Path, *, default_uri: str, served: str) -> Iterator[Any]:
    """The app, its ``resumable_default`` connection at ``default_uri`` and ``served`` a second
    connection it serves ([resumable] api_conn_ids): point ``AIRFLOW_CONN_<SERVED>`` at a store."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", default_uri)
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(32))
    mp.setenv("RESUMABLE_PLUGIN_API", "1")  # build the FastAPI app in this process (not an api-server)
    mp.setenv("AIRFLOW__CORE__AUTH_MANAGER", "support.per_dag_auth.PerDagAuthManager")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", ",".join(f"{u}:{r}" for u, r in ROLES.items()))
    mp.setenv("AIRFLOW__RESUMABLE_TEST__DAG_ACCESS", "alice=dag_a")
    mp.setenv("AIRFLOW__RESUMABLE__API_CONN_IDS", served)
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(airflow_home / "api-test-passwords.json"))
    from airflow.api_fastapi import app as api_app_module

    import airflow_resumable.plugins

    importlib.reload(airflow_resumable.plugins)  # its FastAPI app is built at import, now that the env says so
    plugins.forget()
    api_app_module.purge_cached_app()
    try:
        yield api_app_module.create_app()
    finally:
        api_app_module.purge_cached_app()
        plugins.forget()
        mp.undo()
        importlib.reload(airflow_resumable.plugins)


def caller(client: Any) -> Callable[..., Any]:
    """``call(user, method, path, **kwargs)``: the request, with ``user``'s JWT (None: no credentials)."""
    tokens: dict[str, str] = {}

    def call(user: str | None, method: str, path: str, **kwargs: Any) -> Any:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        headers = dict(kwargs.pop("headers", {}))
        if user is not None:
            if user not in tokens:
                tokens[user] = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=user, role=ROLES[user]))
            headers["Authorization"] = f"Bearer {tokens[user]}"
        return client.request(method, path, headers=headers, **kwargs)

    return call
