"""An auth manager with per-DAG access, for the plugin's API tests.

Airflow's simple auth manager grants by role, globally (a ``viewer`` reads every DAG, a ``user``
edits every DAG); its teams need multi-team mode and team-owned bundles. The FAB provider has
per-DAG permissions but is not part of this project's pinned environment. This subclass keeps the
simple auth manager's users, passwords, JWTs and roles, and adds one rule: a user listed in
``[resumable_test] dag_access`` (``alice=dag_a|dag_b,bob=dag_c``) may touch only those DAGs (with
the rights of their role); everyone else is as the simple auth manager says. Selected with
``AIRFLOW__CORE__AUTH_MANAGER=support.per_dag_auth.PerDagAuthManager``.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.configuration import conf


def _restrictions() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for item in conf.get("resumable_test", "dag_access", fallback="").split(","):
        if "=" in item:
            user, dags = item.split("=", 1)
            out[user.strip()] = {d for d in dags.split("|") if d}
    return out


class PerDagAuthManager(SimpleAuthManager):
    """The simple auth manager, with some users limited to some DAGs."""

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        allowed = _restrictions().get(user.get_name())
        if allowed is not None and (details is None or details.id is None or details.id not in allowed):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
