"""The README stays true: its snippets are the example DAGs' code, its commands exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_snippets_are_the_example_dags_code() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_snippets.py")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert README.count("<!-- snippet: ") >= 7


def test_the_quick_start_commands_are_make_targets_and_ci_runs_the_test_one() -> None:
    quick = README[README.index("## Quick start"):README.index("## Concepts")]
    assert "make demo" in quick and "make test" in quick
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_example_dag_is_mentioned() -> None:
    for path in (ROOT / "dags").glob("*.py"):
        assert f"dags/{path.name}" in README, path.name


def test_the_readme_column_tables_are_the_tables_definitions() -> None:
    from airflow_resumable.core.tables import all_tables

    for table in all_tables():
        start = README.index(f"<!-- table: {table.name} -->")
        body = README[start:README.index("<!-- end table -->", start)].split("\n", 1)[1].strip()
        assert body == table.markdown(), f"regenerate the README table of {table.name} from Table.markdown()"


def test_the_api_table_states_the_defaults_the_code_has() -> None:
    from airflow_resumable.core import defaults

    def shown(value: object) -> str:
        if isinstance(value, str):
            return f'`"{value}"`'
        return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"

    rows = {
        "conn_id": shown(defaults.CONN_ID), "timeout_grace": shown(defaults.TIMEOUT_GRACE),
        "lease": shown(defaults.LEASE), "overlap": shown(defaults.OVERLAP),
        "overlap_poke` / `overlap_timeout": f"{shown(defaults.OVERLAP_POKE)} / {shown(defaults.OVERLAP_TIMEOUT)}",
        "progress_interval": shown(defaults.PROGRESS_INTERVAL), "xcom_interval": shown(defaults.XCOM_INTERVAL),
        "skip_limit": shown(defaults.SKIP_LIMIT),
        "defer_after": shown(defaults.DEFER_AFTER), "resume_poll": shown(defaults.RESUME_POLL),
    }
    for name, default in rows.items():
        assert f"| `{name}` | {default} |" in README, f"the README's default for {name} is not {default}"
