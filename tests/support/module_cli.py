"""``python -m airflow_resumable <argv>`` run in the test's own process (its exit status)."""

from __future__ import annotations

from collections.abc import Sequence


def run_module_cli(argv: Sequence[str]) -> int:
    from airflow_resumable.cli import main
    from airflow_resumable.commands import add_to_module_cli

    try:
        return main(list(argv), more=add_to_module_cli)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
