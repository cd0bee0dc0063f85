"""The package's boundaries and registration, and the demo's figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.paths import ROOT


def test_the_core_imports_no_airflow() -> None:
    code = (
        "import sys, airflow_resumable, airflow_resumable.core, airflow_resumable.core.attempt.runner\n"
        "from airflow_resumable import RunContext, Signal, Checkpoint\n"
        "leaked = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))\n"
        "assert not leaked, leaked\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_no_core_module_mentions_airflow_imports() -> None:
    for path in (ROOT / "airflow_resumable" / "core").rglob("*.py"):
        text = path.read_text()
        assert "import airflow" not in text and "from airflow " not in text and "from airflow." not in text, path


def test_the_core_imports_neither_openlineage_nor_opentelemetry() -> None:
    """The core gives lineage and tracing plain data (core/model/observe.py); the Airflow layer turns it
    into facets and spans (airflow_resumable/lineage/, operators/tracing.py)."""
    imports = re.compile(r"^\s*(from|import)\s+(openlineage|opentelemetry)\b", re.M)
    leaks = [str(p.relative_to(ROOT)) for p in (ROOT / "airflow_resumable" / "core").rglob("*.py")
             if imports.search(p.read_text())]
    assert not leaks, leaks
    code = ("import sys, airflow_resumable.core.attempt.runner, airflow_resumable.core.model.observe\n"
            "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('openlineage', 'opentelemetry'))\n"
            "assert not leaked, leaked\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_airflow_is_imported_in_version_compat_only() -> None:
    """Every Airflow name the package uses comes through version_compat, which imports it from where
    the installed Airflow (3.1, 3.2 or 3.3) keeps it: an Airflow that moves a name breaks one module."""
    imports = re.compile(r"^\s*(from airflow[. ]|import airflow\b)", re.M)
    leaks = [str(path.relative_to(ROOT)) for path in (ROOT / "airflow_resumable").rglob("*.py")
             if path.name != "version_compat.py" and imports.search(path.read_text())]
    assert not leaks, leaks


def test_private_airflow_names_are_used_in_version_compat_only() -> None:
    """A private Airflow name (``_BaseOperator__from_mapped``, an ``airflow.*._private`` module)
    can change in any release: one module adapts to it, so an upgrade has one place to look."""
    private = ("__from_mapped", "_BaseOperator", "._private", "airflow._")
    for path in (ROOT / "airflow_resumable").rglob("*.py"):
        if path.name != "version_compat.py":
            text = path.read_text()
            assert not [p for p in private if p in text], path


def test_the_operators_are_split_on_their_seams_with_their_import_paths_kept(airflow_home: Path) -> None:
    """Reporting, the task instance's identity and the argument checks have their own modules; the
    names users and tests import from operators.resumable stay there (no line count is a rule)."""
    import airflow_resumable
    from airflow_resumable.operators import checks, reporting, resumable, task_instance

    assert resumable.AirflowReporter is reporting.AirflowReporter
    assert resumable.XCOM_ROW_LIMIT == reporting.XCOM_ROW_LIMIT and resumable.XCOM_KEY == reporting.XCOM_KEY
    assert resumable.slot_of is task_instance.slot_of and resumable.RESTART_CONF_KEY == task_instance.RESTART_CONF_KEY
    assert airflow_resumable.ResumableOperator is resumable.ResumableOperator
    assert airflow_resumable.ChunkedOperator is resumable.ChunkedOperator
    assert all(module.__name__.startswith("airflow_resumable.operators.") for module in (checks, task_instance))


def test_each_reader_name_is_one_object_under_its_module_and_both_public_paths() -> None:
    """core/readers/ is split one module a part; airflow_resumable.core.readers.X and
    airflow_resumable.readers.X stay the import paths users write."""
    from airflow_resumable import readers as public
    from airflow_resumable.core import readers as core
    from airflow_resumable.core.readers import base, file, keys, keyset, sequence, sql

    homes = {"Batch": base, "Reader": base, "KeysetReader": keyset, "FileReader": file, "FORMATS": file,
             "SequenceReader": sequence, "json_key": keys, "placeholders": sql}
    for name, home in homes.items():
        assert getattr(core, name) is getattr(home, name), name
        if name in public.__all__:
            assert getattr(public, name) is getattr(home, name), name
    assert {"Batch", "FileReader", "KeysetReader", "Reader", "SequenceReader", "json_key"} <= set(public.__all__)


def test_the_provider_registers_the_task_decorator() -> None:
    code = (
        "from airflow.sdk import task\n"
        "from airflow_resumable.decorators.resumable import resumable_task\n"
        "assert task.resumable is resumable_task or task.resumable.__name__ == 'resumable_task'\n"
        "from importlib.metadata import entry_points\n"
        "eps = [e for e in entry_points(group='apache_airflow_provider') if e.value.startswith('airflow_resumable')]\n"
        "info = eps[0].load()()\n"
        "assert info['package-name'] == 'airflow-resumable', info\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_public_api_names(airflow_home: Path) -> None:
    from airflow_resumable import ChunkedOperator, ResumableOperator, RunContext

    assert issubclass(ChunkedOperator, ResumableOperator) and RunContext.__name__ == "RunContext"


def test_make_demo_prints_the_lesson_s_figures_and_at_info_the_log_lines_the_tutorial_quotes(tmp_path: Path) -> None:
    """The README's first command, on the embedded default, in a fresh Airflow home; with
    ``DEMO_LOG_LEVEL=INFO``, as the tutorial suggests, the task log's lines it quotes are there."""
    import re

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path / "home")
    env["PY"] = sys.executable
    env["DEMO_LOG_LEVEL"] = "INFO"
    result = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], capture_output=True, text=True, env=env, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    tutorial = (ROOT / "docs" / "guides" / "tutorial.md").read_text()
    quoted = re.search(r"<!-- demo-log -->\n```\n(.*?)```", tutorial, re.S)
    assert quoted, "the tutorial quotes no demo log (<!-- demo-log --> before a ``` block)"
    logged = out + result.stderr
    for line in quoted.group(1).splitlines():
        assert line in logged, f"the tutorial quotes a log line the demo does not print: {line}"
    # The demo's own lines (the task log's start with a time)
    lines = [line.strip() for line in out.splitlines() if not re.match(r"\s*\d{4}-\d\d-\d\dT", line)]
    first = lines.index("--- first run: cancelled at %40 ---")
    progress = [line for line in lines if line.startswith("progress %")]
    assert progress == [f"progress %{p} processed={p * 300}" for p in range(10, 101, 10)]
    assert "cancelled: user cancelled processed=12000/30000 total=174000" in lines
    assert "resumed from position=12000 on attempt 2" in lines
    assert lines[-2:] == ["done: total=435000 average days=14.50", lines[-1]] and lines[-1].endswith(": success")
    assert first < lines.index("--- second run: continues from where it was left ---")


#: Import circles known today: remove an entry once its circle is gone; a new circle fails the test.
KNOWN_CIRCLES: list[set[str]] = []


def test_no_import_circles_in_the_package_counting_type_only_imports() -> None:
    from devtools import layout  # the one reading of imports, the layout test's too

    graph = layout.module_graph()
    assert "airflow_resumable.core.attempt.runner" in graph["airflow_resumable.core"]  # the graph sees imports
    new = [sorted(group) for group in layout.circles(graph) if group not in KNOWN_CIRCLES]
    assert not new, f"modules that import each other (type-only imports count): {new}"


def test_the_attempt_s_public_names_are_one_object_under_both_import_paths() -> None:
    """core/attempt/runner.py is split on its seams; ``airflow_resumable.core.attempt.runner.X`` and
    ``airflow_resumable.core.X`` stay the import paths."""
    from airflow_resumable import core
    from airflow_resumable.core.attempt import finish, runner
    from airflow_resumable.core.model import identity

    assert runner.Attempt is core.Attempt and runner.Outcome is core.Outcome is finish.Outcome
    assert runner.Identity is identity.Identity and runner.Hooks is identity.Hooks
    assert runner.Options is core.Options


def _source_url() -> str:
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    urls = dict(line.split("=", 1) for line in config["metadata"]["project_urls"].strip().splitlines())
    return {name.strip(): url.strip() for name, url in urls.items()}["Source"]


def test_the_readme_s_links_and_images_work_on_pypi_and_on_the_repository() -> None:
    """The README is the package's long description: PyPI shows it without the repository around it,
    so a relative link (``docs/install.md``) or image would break there. Every link into the repository
    is absolute, from setup.cfg's Source URL (a file: ``/blob/main/``, an image: its raw file, which
    PyPI and GitHub both show), and names a file (and heading) the repository has."""
    source = _source_url()
    owner_repo = source.removeprefix("https://github.com/")
    blob, raw = f"{source}/blob/main/", f"https://raw.githubusercontent.com/{owner_repo}/main/"
    text = re.sub(r"^```.*?^```", "", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "``", text)
    links = re.findall(r"(!?)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)", text)
    problems, into_repo = [], 0
    for bang, target in links:
        if not re.match(r"^https?://", target):
            problems.append(f"{target}: not an absolute URL (PyPI has no copy of the repository)")
            continue
        prefix = raw if bang else blob
        if not target.startswith(prefix):
            if target.startswith((blob, raw, source)):
                problems.append(f"{target}: {'an image' if bang else 'a link'} into the repository starts with {prefix}")
            continue
        into_repo += 1
        file, _, anchor = target.removeprefix(prefix).partition("#")
        path = ROOT / file
        if not path.is_file():
            problems.append(f"{target}: the repository has no {file}")
        elif anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M), re.M)
            slugs = {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h.replace("`", "")).strip().lower()) for h in headings}
            if anchor not in slugs:
                problems.append(f"{target}: {file} has no heading #{anchor}")
    assert not problems, "\n".join(problems)
    assert into_repo >= 20 and any(bang for bang, _ in links)
