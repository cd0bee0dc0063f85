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


def test_the_readme_argument_table_is_the_operators_declarations(airflow_home: Path) -> None:
    """Every argument's row (name, default, meaning) comes from its declaration, which reads its
    default from ``core/defaults.py``; the operator's signature is checked against the same
    declarations in tests/test_operators.py."""
    from airflow_resumable.core.options import markdown
    from airflow_resumable.operators.resumable import OPERATOR_ARGUMENTS

    start = README.index("<!-- arguments: ResumableOperator -->")
    body = README[start:README.index("<!-- end arguments -->", start)].split("\n", 1)[1].strip()
    assert body == markdown(OPERATOR_ARGUMENTS), "regenerate the README's argument table from options.markdown()"


def test_the_chunked_operator_table_states_the_defaults_of_its_signature(airflow_home: Path) -> None:
    """The table and the heading's signature come from ChunkedOperator's declarations
    (core/chunked.py's CHUNKED_OPTIONS); its signature is checked against the same declarations in
    tests/test_operators.py."""
    import inspect

    from airflow_resumable import ChunkedOperator
    from airflow_resumable.core import defaults
    from airflow_resumable.core.chunked import CHUNKED_OPTIONS
    from airflow_resumable.core.options import markdown, signature_text

    def shown(value: object) -> str:
        if value is inspect.Parameter.empty:
            return "required"
        if isinstance(value, str):
            return f'`"{value}"`'
        return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"

    params = inspect.signature(ChunkedOperator.__init__).parameters
    section = README[README.index("### `ChunkedOperator(*"):README.index("### `@task.resumable(")]
    assert section.startswith(f"### `ChunkedOperator({signature_text(CHUNKED_OPTIONS)}, ...)`\n"), "regenerate the heading"
    start = section.index("<!-- arguments: ChunkedOperator -->")
    body = section[start:section.index("<!-- end arguments -->", start)].split("\n", 1)[1].strip()
    assert body == markdown(CHUNKED_OPTIONS), "regenerate the README's ChunkedOperator table from options.markdown()"
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, re.M))
    assert set(rows) == {o.name for o in CHUNKED_OPTIONS} >= {"skip_on", "skip_limit"}
    for name, default in rows.items():
        assert default.strip() == shown(params[name].default), f"the README's default for {name} is not the signature's"
    assert rows["skip_limit"] == shown(defaults.SKIP_LIMIT)
