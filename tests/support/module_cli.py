"""The provider's commands run in the test's own process: ``python -m airflow_resumable <argv>`` (its
exit status, or with ``capsys`` its exit status and output), and ``airflow resumable <argv>`` where
Airflow reads provider commands (3.2 on; the module's CLI, the same definitions, before)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest


def run_module_cli(argv: Sequence[str]) -> int:
    from airflow_resumable.cli import main
    from airflow_resumable.commands import add_to_module_cli

    try:
        return main(list(argv), more=add_to_module_cli)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def module_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``python -m airflow_resumable <argv>`` in this process: (exit status, stdout, stderr)."""
    code = run_module_cli(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def resumable_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``airflow resumable <argv>``, or ``python -m airflow_resumable <argv>`` on an Airflow that reads
    no provider commands (the same definitions)."""
    from airflow_resumable.version_compat import supports

    capsys.readouterr()  # what ran before
    try:
        if supports("airflow resumable ... (provider CLI commands)"):
            from airflow.cli import cli_parser

            args = cli_parser.get_parser().parse_args(["resumable", *argv])
            args.func(args)
            code = 0
        else:
            code = run_module_cli(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err
