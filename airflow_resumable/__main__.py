"""``python -m airflow_resumable``: administer a checkpoint database.

    python -m airflow_resumable migrate --conn-id resumable_default   # apply pending migrations
    python -m airflow_resumable migrate --conn-id resumable_default --sql   # print them instead
    python -m airflow_resumable migrate --url sqlite:////var/lib/airflow/checkpoints.db --check
    python -m airflow_resumable clean --conn-id resumable_default --older-than 30d --dry-run   # retention
    python -m airflow_resumable list --status running   # as `airflow resumable list` (Airflow 3.2+)
"""

from airflow_resumable.cli import main

try:  # with Airflow: the `airflow resumable` group's other commands too
    from airflow_resumable.commands import add_to_module_cli as more
except ImportError:  # without: migrate and clean, on a database URL
    more = None  # type: ignore[assignment]

raise SystemExit(main(more=more))
