"""The Airflow plugin: a Checkpoint tab on every task instance, a "Resumable jobs" page, and the
REST API both use (``/resumable/api/v1``).

Registered twice on purpose and loaded once: through the ``airflow.plugins`` entry point (always
read) and through the provider info's ``plugins`` (read only when ``[core]
lazy_discover_providers`` is False). The entry point resolves to :func:`entry_point_plugin`'s
answer, which is None (skipped without a word by Airflow) when the provider info will load it.

The FastAPI app is built only where the api-server runs (plugins are imported by every Airflow
process, workers included); ``RESUMABLE_PLUGIN_API=1`` builds it anywhere (tests).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from airflow_resumable.version_compat import AirflowPlugin

#: Where the plugin's FastAPI app is mounted.
URL_PREFIX = "/resumable"


def on_api_server() -> bool:
    """Whether this process serves the API (``airflow api-server``; ``airflow standalone`` runs one)."""
    if os.environ.get("RESUMABLE_PLUGIN_API") == "1":
        return True
    return len(sys.argv) > 1 and sys.argv[1] == "api-server"


def _fastapi_apps() -> list[dict[str, Any]]:
    if not on_api_server():
        return []
    from airflow_resumable.plugins.api import create_app

    return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Resumable jobs"}]


class ResumablePlugin(AirflowPlugin):
    """The UI and REST faces of airflow-resumable."""

    name = "resumable"
    fastapi_apps = _fastapi_apps()
    external_views = [
        {
            # Airflow fills {MAP_INDEX} only on a mapped task instance's route (.../mapped/N); an
            # unmapped one's frame gets the placeholder as it is, and the page redirects it to -1.
            "name": "Checkpoint",
            "href": URL_PREFIX + "/ui/checkpoint?dag_id={DAG_ID}&run_id={RUN_ID}&task_id={TASK_ID}&map_index={MAP_INDEX}",
            "destination": "task_instance",
            "url_route": "checkpoint",
        },
        {
            "name": "Resumable jobs",
            "href": URL_PREFIX + "/ui/jobs",
            "destination": "nav",
            "category": "browse",
            "url_route": "resumable-jobs",
        },
    ]


def entry_point_plugin() -> type[ResumablePlugin] | None:
    """What the ``airflow.plugins`` entry point gives: the plugin, unless the provider info loads
    it in this process (eager provider discovery), so that it is registered once."""
    try:
        from airflow_resumable.version_compat import settings

        eager = not settings.LAZY_LOAD_PROVIDERS
    except Exception:  # an Airflow without the setting: the entry point is the only way in
        eager = False
    return None if eager else ResumablePlugin


def __getattr__(name: str) -> Any:
    # `airflow.plugins` entry points are loaded with getattr(module, attr): computed on access.
    if name == "entry_point":
        return entry_point_plugin()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
