"""The docs stay true: the README and the pages under docs/ quote the example DAGs' code, show the
tables and arguments as the code declares them, name commands that exist, link to files that
exist, and build into a site with no warning."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from html import escape as html_escape
from pathlib import Path
from typing import Any

import pytest

from support.paths import ROOT

DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
PAGES = {path: path.read_text() for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]}


def page(name: str) -> str:
    return (DOCS / name).read_text()


def between(text: str, start: str, end: str | None = None) -> str:
    """The text from ``start`` to ``end`` (else to the next heading of ``start``'s level, else the end)."""
    i = text.index(start)
    if end is not None:
        return text[i:text.index(end, i)]
    level = re.match(r"#+ ", start)
    found = re.search(rf"^{level.group(0)}" if level else r"^#+ ", text[i + len(start):], re.M)
    return text[i:i + len(start) + found.start()] if found else text[i:]


def test_the_snippets_are_the_example_dags_code() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_snippets.py")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sum(text.count("<!-- snippet: ") for text in PAGES.values()) >= 7
    assert "<!-- snippet: dags/" in README, "the README's first DAG is an example DAG's code"


def test_the_quick_start_commands_are_make_targets_and_ci_runs_the_test_one() -> None:
    quick = between(README, "## Quick start")
    assert "make demo" in quick and "make test" in quick
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    # make test sets up what it needs itself, so CI passes where a newcomer's first make test does:
    # CI installs nothing the README's commands do not
    assert re.search(r"^test: venv browser-deps chaos-deps$", makefile, re.M)
    assert not re.search(r"^\s*make (browser-deps|chaos-deps)", ci, re.M)
    # and CI calls only what the README says it runs
    called = re.findall(r"^(?:[A-Z_]+=\S+ |[A-Z_]+=\"[^\"]*\" )*make (\w[\w-]*)", ci, re.M)
    assert called and all(f"`make {target}`" in README for target in called), called


def test_the_docs_commands_are_make_targets_and_ci_builds_the_site() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs:", makefile, re.M) and re.search(r"^docs-serve:", makefile, re.M)
    assert "make docs" in README and "make docs-serve" in README
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci.index("make docs") == ci.index("make lint") + 1, "CI builds the site right after the lint"


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) < 200


def test_every_example_dag_is_mentioned() -> None:
    docs = "\n".join(PAGES.values())
    for path in (ROOT / "dags").glob("*.py"):
        assert f"dags/{path.name}" in docs, path.name


def test_the_column_tables_are_the_tables_definitions() -> None:
    from airflow_resumable.core.model.tables import all_tables

    tables = page("reference/tables.md")
    for table in all_tables():
        start = tables.index(f"<!-- table: {table.name} -->")
        body = tables[start:tables.index("<!-- end table -->", start)].split("\n", 1)[1].strip()
        assert body == table.markdown(), f"regenerate the table of {table.name} in docs/reference/tables.md from Table.markdown()"


def test_the_argument_table_is_the_operators_declarations(airflow_home: Path) -> None:
    """Every argument's row (name, default, meaning) comes from its declaration, which reads its
    default from ``core/model/defaults.py``; the operator's signature is checked against the same
    declarations in tests/unit/operators/test_resumable.py."""
    from airflow_resumable.core.model.options import markdown
    from airflow_resumable.operators.resumable import OPERATOR_ARGUMENTS

    operators = page("reference/operators.md")
    start = operators.index("<!-- arguments: ResumableOperator -->")
    body = operators[start:operators.index("<!-- end arguments -->", start)].split("\n", 1)[1].strip()
    assert body == markdown(OPERATOR_ARGUMENTS), "regenerate docs/reference/operators.md's argument table from options.markdown()"


def test_the_chunked_operator_table_states_the_defaults_of_its_signature(airflow_home: Path) -> None:
    """The table and the heading's signature come from ChunkedOperator's declarations
    (core/work/chunk_loop.py's CHUNKED_OPTIONS); its signature is checked against the same declarations in
    tests/unit/operators/test_resumable.py."""
    import inspect

    from airflow_resumable import ChunkedOperator
    from airflow_resumable.core.model import defaults
    from airflow_resumable.core.model.options import markdown, signature_text
    from airflow_resumable.core.work.chunk_loop import CHUNKED_OPTIONS

    def shown(value: object) -> str:
        if value is inspect.Parameter.empty:
            return "required"
        if isinstance(value, str):
            return f'`"{value}"`'
        return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"

    params = inspect.signature(ChunkedOperator.__init__).parameters
    operators = page("reference/operators.md")
    section = between(operators, "## `ChunkedOperator(*", "## `@task.resumable(")
    assert section.startswith(f"## `ChunkedOperator({signature_text(CHUNKED_OPTIONS)}, ...)`\n"), "regenerate the heading"
    start = section.index("<!-- arguments: ChunkedOperator -->")
    body = section[start:section.index("<!-- end arguments -->", start)].split("\n", 1)[1].strip()
    assert body == markdown(CHUNKED_OPTIONS), "regenerate docs/reference/operators.md's ChunkedOperator table from options.markdown()"
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, re.M))
    assert set(rows) == {o.name for o in CHUNKED_OPTIONS} >= {"skip_on", "skip_limit"}
    for name, default in rows.items():
        assert default.strip() == shown(params[name].default), f"the docs' default for {name} is not the signature's"
    assert rows["skip_limit"] == shown(defaults.SKIP_LIMIT)


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The Markdown outside fenced code blocks and inline code spans (their brackets are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "``", text)


def anchors(text: str) -> set[str]:
    """The headings' anchors, as MkDocs' table of contents (and GitHub, for these headings) make them."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M):
        slug = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        found.add(re.sub(r"[-\s]+", "-", slug))
    return found


def test_every_relative_link_resolves_to_a_file() -> None:
    """Every link and image of the README and the pages that is not a URL names a file of the
    repository (from the page's own folder, as GitHub and MkDocs both read it), and an anchor into
    a page names one of its headings."""
    broken = []
    checked = 0
    for path, text in PAGES.items():
        for target in LINK.findall(prose(text)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            checked += 1
            where = f"{path.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
                broken.append(f"{where} (no such heading)")
            elif path.is_relative_to(DOCS) and not resolved.is_relative_to(DOCS):
                broken.append(f"{where} (outside docs/: the site has no copy of it)")
    assert not broken, "\n".join(broken)
    assert checked > 50


def test_every_page_of_the_docs_is_linked_from_the_docs_index() -> None:
    """docs/index.md's "Where to go from here" reaches every guide, how-to, explanation and
    reference page (the site's navigation alone hides a page from whoever starts at the index)."""
    index = page("index.md")
    linked = {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+\.md(?:#[^)\s]*)?)\)", index)}
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")} - {"index.md"}
    assert sorted(pages - linked) == []


def test_figures_a_command_prints_are_left_to_the_command() -> None:
    """A test count or a suite's time written by hand goes stale with the next test: the pages
    name the line that prints them (scripts/test.sh's closing line, in the form it prints), and
    quote the Checkpoint tab's words as the tab's code writes them."""
    counts = [(path.name, m.group(0)) for path, text in PAGES.items()
              for m in re.finditer(r"\b\d[\d,]* tests\b(?! ran)", text)]
    assert counts == []
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "`suite: N passed, N failed in M:SS`" in page("guides/tutorial.md")
    assert 'print(f"suite: {total[\'passed\']} passed, {total[\'failed\'] + total[\'error\']} failed{extra} in ' \
           '{seconds // 60}:{seconds % 60:02d}")' in script
    tab = (ROOT / "airflow_resumable" / "plugins" / "static" / "resumable.js").read_text()
    assert "(STALE: the holder missed two heartbeats)" in page("how-to/ui.md")
    assert '" (STALE: the holder missed two heartbeats)"' in tab


def test_every_image_of_the_readme_is_in_the_docs_too() -> None:
    """The README's images are files the docs site publishes (docs/), so the same file shows on
    GitHub and on the site (the README names them by absolute URL, for PyPI: tests/unit/test_package.py)."""
    raw = "https://raw.githubusercontent.com/airflow-resumable/airflow-resumable/main/"
    images = [image.removeprefix(raw) for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)]
    assert images
    for image in images:
        assert image.startswith("docs/") and (ROOT / image).is_file(), image


def test_the_benchmark_table_and_plots_are_drawn_from_one_run_s_results() -> None:
    """The table is the kept run's, row for row; each plot (matplotlib's SVG, its text kept as text)
    shows exactly the judged rows of that run, each labelled whole, its value as the table prints
    it, with an axis and a legend."""
    spec = importlib.util.spec_from_file_location("bench_plots", ROOT / "scripts" / "bench_plots.py")
    assert spec and spec.loader
    bench_plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_plots)
    run, results = bench_plots.load(DOCS / "bench" / "results.json")
    for name, (title, subtitle, rows, _log, axis) in bench_plots.plotted(results).items():
        svg = (DOCS / "bench" / name).read_text()
        assert f"(bench/{name})" in page("benchmarks.md"), name
        assert "matplotlib" in svg and title in svg and axis in svg, f"redraw docs/bench/{name}: python scripts/bench_plots.py"
        for line in bench_plots.subtitle_lines(subtitle):
            assert html_escape(line, quote=False) in svg, (name, line)
        assert sorted(re.findall(r'id="bar-([^"]+)"', svg)) == sorted(r["key"] for r in rows), name
        shown = re.findall(r">(\d[\d.]*x)<", svg.replace("\n", ""))
        for row in rows:
            assert bench_plots.ratio_text(row["ratio"]) in shown, (name, row["key"], row["ratio"])
            for line in bench_plots.label(row).splitlines():  # the whole label, not cut
                assert html_escape(line, quote=False) in svg, (name, line)
        for entry in ("target met", "target missed", "the row&#x27;s target"):
            assert entry in svg or entry.replace("&#x27;", "'") in svg, (name, entry)
    # and the table is the same run's, row for row, never typed by hand, with the verdict in view
    text = page("benchmarks.md")
    assert bench_plots.page_with_table(text, bench_plots.markdown(run, results)) == text, (
        "redraw the table of docs/benchmarks.md: python scripts/bench_plots.py")
    assert run and all(f"| {r['key']} |" in text for r in results)
    assert "| # | verdict | ratio | target |" in text
    for r in results:
        if r["ratio"] is not None:
            assert f"| {r['key']} | {('pass' if r['verdict'] == 'PASS' else '')}" in text or r["verdict"] != "PASS"
            assert f"| {bench_plots.ratio_text(r['ratio'])} |" in text, r["key"]


def _chaos_docs() -> Any:
    """scripts/chaos_docs.py, loaded as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("chaos_docs", ROOT / "scripts" / "chaos_docs.py")
    assert spec and spec.loader
    chaos_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos_docs)
    return chaos_docs


def test_the_chaos_tables_and_curves_are_drawn_from_the_runs_the_docs_keep() -> None:
    chaos_docs = _chaos_docs()
    text = page("explanation/chaos.md")
    names = [m["name"] for m in chaos_docs.MARKER.finditer(text)]
    # every configuration's trials and the soak, each from its kept results, never typed by hand
    assert {"celery", "local", "soak-celery"} <= set(names), names
    assert chaos_docs.page_with_tables(text) == text, "redraw the tables of docs/explanation/chaos.md: " \
        "python scripts/chaos_docs.py"
    for name in names:
        assert (DOCS / "chaos" / f"{name}.json").is_file(), name
    assert "(../chaos/soak-celery.png)" in text and (DOCS / "chaos" / "soak-celery.png").is_file()


def test_runs_of_one_executor_made_side_by_side_are_kept_as_one_run_with_every_trial() -> None:
    chaos_docs = _chaos_docs()
    kept = json.loads((DOCS / "chaos" / "celery.json").read_text())
    early, late = kept["trials"][: len(kept["trials"]) // 2], kept["trials"][len(kept["trials"]) // 2:]
    # Given a run split in two, whichever order they come in, Then every trial is kept once, by seed
    run = chaos_docs.merged([{**kept, "trials": late, "minutes": 5.0}, {**kept, "trials": early, "minutes": 7.5}])
    assert run["trials"] == kept["trials"] and run["minutes"] == 7.5
    # a seed in two runs, or runs of another executor, are refused rather than counted twice or mixed
    with pytest.raises(SystemExit, match=str(early[0]["seed"])):
        chaos_docs.merged([{**kept, "trials": early}, {**kept, "trials": early[:1]}])
    with pytest.raises(SystemExit, match="differ"):
        chaos_docs.merged([{**kept, "trials": early}, {**kept, "trials": late, "executor": "local"}])
    soak = json.loads((DOCS / "chaos" / "soak-celery.json").read_text())
    with pytest.raises(SystemExit, match="one soak"):
        chaos_docs.merged([soak, soak])


@pytest.mark.site
@pytest.mark.timeout(300)
def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    """``make docs``: MkDocs in strict mode (a warning fails the build: a broken link or anchor, a
    page left out of the navigation, a reference to code that does not exist)."""
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    # The reference is generated from the docstrings: the RunContext's own words are on its page.
    context = (site / "reference" / "context" / "index.html").read_text()
    assert "def checkpoint" in context or "checkpoint(" in context
    # GitHub's escaped pipe in a table's code span shows as a plain pipe on the site too.
    assert "seconds | timedelta | None" in (site / "reference" / "operators" / "index.html").read_text()
    assert (site / "screenshots" / "checkpoint-tab.png").is_file()
    assert (site / "bench" / "ratios.svg").is_file()


def test_the_request_table_names_the_statuses_the_rules_take_each_request_in() -> None:
    """The prose of "the slot takes it when" is written for people, but the statuses it names are
    the rules table's (core/model/request_rules.py): a rule changed there fails here until the docs follow."""
    from airflow_resumable.core.model.request_rules import ANY_STATUS, Action, rules_of
    from airflow_resumable.core.model.states import Status

    text = page("explanation/pause.md")
    rows = dict(re.findall(r"^\| `control\.(\w+)\([^`]*\)` \| ([^|]+) \|", text, re.M))
    assert set(rows) == {a.value for a in Action}, "one row per request"
    for action in Action:
        named = set(re.findall(r"`(\w+)`", rows[action.value])) & {s.value for s in Status}
        # the statuses of the rules that name some (a rule on any status says so by its request or lease)
        taken = {s.value for r in rules_of(action, force=True) if r.when.status != ANY_STATUS for s in r.when.status}
        assert named == taken, f"{action.value}: the docs name {sorted(named)}, the rules take {sorted(taken)}"


def _versions_table() -> object:
    spec = importlib.util.spec_from_file_location("versions_table", ROOT / "scripts" / "versions_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["versions_table"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_the_supported_versions_table_is_the_constraints_files_and_the_readme_claims_no_other() -> None:
    """One table, generated from constraints/ (what make matrix and make test run): every pair it
    claims has a constraints file, and the README links to it instead of naming a range of its own;
    each constraints file the README or the install page names exists and pins the Airflow named
    beside it."""
    versions = _versions_table()
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "versions_table.py")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    pairs = versions.pairs()  # type: ignore[attr-defined]
    table = between(page("install.md"), versions.START, versions.END)  # type: ignore[attr-defined]
    claimed = re.findall(r"`(airflow-\d+\.\d+-py\d+\.\d+\.txt)`", table)
    assert sorted(claimed) == sorted(p.file for p in pairs) and all((ROOT / "constraints" / f).is_file() for f in claimed)
    install = between(README, "## Install into an existing deployment")
    assert "docs/install.md#supported-versions" in install
    assert not re.search(r"Python 3\.\d+\s*(to|–|-)\s*3\.\d+|Airflow 3\.\d+(,| to|–| and) 3\.\d+", README), \
        "the README names a version range: link to the supported-versions table instead"
    pins = {p.file: p.airflow for p in pairs}
    for text in (README, page("install.md")):
        for file, version in re.findall(r"constraints/(airflow-[\d.]+-py[\d.]+\.txt)\S*\s*\\?\s*\"apache-airflow==([\d.]+)\"",
                                        text):
            assert pins.get(file) == version, (file, version)


def test_the_install_commands_work_before_and_after_the_package_is_on_an_index() -> None:
    """Today: the repository's git URL with the extra (the repository setup.cfg names), or the wheel
    make dist builds; once published: the name alone, said to be for then."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    source = re.search(r"Source = (\S+)", config["metadata"]["project_urls"]).group(1)
    extras = set(config["options.extras_require"])
    git = f'"airflow-resumable[postgres] @ git+{source}.git@main"'
    install = between(page("install.md"), "## With pip")
    for text in (between(README, "## Install into an existing deployment"), install):
        assert git in text
        assert "not on a package index yet" in text and "Once it is" in text and "PyPI" in text
    assert "postgres" in extras
    assert 'make dist\npip install -c constraints/airflow-3.3-py3.11.txt "apache-airflow==3.3.2" ' \
           '"$(ls dist/airflow_resumable-*.whl)[postgres]"' in install
    assert re.search(r"^dist:", (ROOT / "Makefile").read_text(), re.M)
