"""Provider metadata, read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_resumable.version import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-resumable",
        "name": "Resumable",
        "description": "Chunked, resumable operators with slot-keyed checkpoints, leases and overlap policy.",
        # The release, from its one declaration (airflow_resumable/__init__.py); Airflow reads the
        # installed distribution's version, this list is informative.
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Resumable",
                "python-modules": ["airflow_resumable.operators.resumable"],
                "tags": ["software"],
            }
        ],
        "operators": [
            {"integration-name": "Resumable", "python-modules": ["airflow_resumable.operators.resumable"]}
        ],
        "hooks": [{"integration-name": "Resumable", "python-modules": ["airflow_resumable.hooks.resumable"]}],
        "triggers": [{"integration-name": "Resumable", "python-modules": ["airflow_resumable.triggers.resume"]}],
        # The plugin is also an `airflow.plugins` entry point; it is registered once either way
        # (see airflow_resumable.plugins).
        "plugins": [{"name": "resumable", "plugin-class": "airflow_resumable.plugins.ResumablePlugin"}],
        "cli": ["airflow_resumable.commands.get_cli_commands"],
        "task-decorators": [
            {"name": "resumable", "class-name": "airflow_resumable.decorators.resumable.resumable_task"}
        ],
    }
