"""The release artifacts: the wheel and the sdist that ``make dist`` builds (``scripts/dist.sh``),
and the wheel installed the way an Airflow team installs it.

Every test here is marked ``dist``: ``make fast`` leaves them out, ``make test`` runs them. The
build takes seconds; the installed-wheel test builds a fresh virtual environment outside the
checkout (the checkout is then not on ``sys.path``), installs the wheel with the pinned Airflow
from a constraints file (a minute or two) and runs there what a team would: two example DAGs
under ``dag.test()``, ``airflow resumable``, the plugin's pages in the api-server's app, and its
own pytest with the test kit's fixtures.

Which Airflow the wheel is installed with is read from one place, :func:`airflow_cells`:
``RESUMABLE_DIST_AIRFLOW`` lists entries separated by spaces or commas, each an Airflow version
(``3.3.2``: the repository's constraints file for this Python that pins it) or the path of a
constraints file (``constraints/airflow-3.2-py3.12.txt``). Unset, it is every constraints file of
the repository for this Python: on 3.11, each supported Airflow minor (3.1, 3.2, 3.3), one test
each, oldest first; ``newest`` is the newest of them only. The fresh venv's Python is the one
running the tests, so a matrix cell's interpreter is the cell's Python:

    RESUMABLE_DIST_AIRFLOW="3.2.2 3.3.2" python -m pytest -m dist tests/integration/test_dist.py

The sdist ships the package and its documents, no tests (MANIFEST.in says why); a test holds it
to that.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import airflow_resumable
from devtools import airflow_env
from support.paths import ROOT

pytestmark = pytest.mark.dist

#: The MD5 of the Apache License 2.0 as the ASF publishes it (www.apache.org/licenses/LICENSE-2.0.txt).
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
#: What the sdist holds at its top level: the package, the build's files and the documents.
SDIST_TOP = {"PKG-INFO", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "NOTICE",
             "CHANGELOG.md", "airflow_resumable", "airflow_resumable.egg-info"}


# -- which Airflow ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One Airflow to install the wheel with: its version and the constraints file that pins it."""

    airflow: str
    constraints: Path | None
    problem: str = ""

    @property
    def id(self) -> str:
        return f"airflow-{self.airflow}"


def pinned_airflow(constraints: Path) -> str | None:
    """The ``apache-airflow==`` pin of a constraints file."""
    match = re.search(r"^apache-airflow==(\S+)\s*$", constraints.read_text(), re.M)
    return match.group(1) if match else None


def constraints_files() -> list[Path]:
    """The repository's constraints files made for the running Python (its X.Y in the file name)."""
    found = sorted({*ROOT.glob("constraints*.txt"), *ROOT.glob("constraints/*.txt")})
    return [path for path in found if re.search(rf"(?<![\d.]){re.escape(PYTHON)}(?![\d])", path.name)
            and pinned_airflow(path)]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def airflow_cells(spec: str | None = None) -> list[Cell]:
    """The Airflows to install the built wheel with (module docstring: ``RESUMABLE_DIST_AIRFLOW``)."""
    spec = os.environ.get("RESUMABLE_DIST_AIRFLOW", "") if spec is None else spec
    files = constraints_files()
    entries = [entry for entry in re.split(r"[\s,]+", spec) if entry]
    if not entries or entries == ["newest"]:
        if not files:
            return [Cell("none", None, f"no constraints file for Python {PYTHON} pins apache-airflow in {ROOT}")]
        ordered = sorted(files, key=lambda path: _version_key(pinned_airflow(path) or "0"))
        return [Cell(pinned_airflow(path) or "", path) for path in (ordered[-1:] if entries else ordered)]
    cells = []
    for entry in entries:
        if re.fullmatch(r"\d+(\.\d+)*", entry):
            match = [path for path in files if pinned_airflow(path) == entry]
            cells.append(Cell(entry, match[0]) if match else Cell(
                entry, None, f"RESUMABLE_DIST_AIRFLOW asks for Airflow {entry}, but no constraints file for Python "
                f"{PYTHON} pins apache-airflow=={entry} (found: {', '.join(p.name for p in files) or 'none'}); "
                "generate one, or name a constraints file instead of the version"))
            continue
        path = Path(entry) if Path(entry).is_absolute() else ROOT / entry
        version = pinned_airflow(path) if path.is_file() else None
        cells.append(Cell(version, path) if version else Cell(
            entry, None, f"RESUMABLE_DIST_AIRFLOW names {entry!r}: not a constraints file that pins apache-airflow"))
    return cells


def test_the_airflow_list_defaults_to_every_pinned_airflow_and_takes_versions_or_files() -> None:
    cells = airflow_cells("")
    assert {cell.constraints for cell in cells} == set(constraints_files()) and not [c for c in cells if c.problem]
    assert [_version_key(c.airflow) for c in cells] == sorted(_version_key(c.airflow) for c in cells)
    if PYTHON == "3.11":  # every supported Airflow minor has a file for 3.11 (tests/unit/test_versions.py)
        assert [".".join(c.airflow.split(".")[:2]) for c in cells] == ["3.1", "3.2", "3.3"]
    (default,) = airflow_cells("newest")
    assert default == cells[-1] and default.airflow == pinned_airflow(default.constraints)  # type: ignore[arg-type]
    assert airflow_cells(default.airflow) == [default]
    relative = str(default.constraints.relative_to(ROOT))  # type: ignore[union-attr]
    assert airflow_cells(f"{relative}, {default.airflow}") == [default, default]
    (missing,) = airflow_cells("2.0.0")
    assert missing.constraints is None and "apache-airflow==2.0.0" in missing.problem


# -- the build --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Artifacts:
    wheel: Path
    sdist: Path
    log: str

    def wheel_names(self) -> list[str]:
        with zipfile.ZipFile(self.wheel) as whl:
            return whl.namelist()

    def wheel_file(self, name: str) -> bytes:
        with zipfile.ZipFile(self.wheel) as whl:
            return whl.read(name)

    def sdist_names(self) -> list[str]:
        with tarfile.open(self.sdist) as tar:
            return [member.name for member in tar.getmembers() if member.isfile()]

    def sdist_file(self, name: str) -> bytes:
        with tarfile.open(self.sdist) as tar:
            member = tar.extractfile(f"{self.sdist.name.removesuffix('.tar.gz')}/{name}")
            assert member is not None, name
            return member.read()

    def metadata(self) -> email.message.Message:
        name = next(n for n in self.wheel_names() if n.endswith(".dist-info/METADATA"))
        return email.parser.BytesParser().parsebytes(self.wheel_file(name))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """``make dist``'s recipe run with this interpreter into a temporary folder."""
    missing = [m for m in ("build", "twine") if subprocess.run([sys.executable, "-c", f"import {m}"]).returncode]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: pip install -c constraints/airflow-3.3-py3.11.txt -e '.[release]' "
                    "(make venv installs the release extra)", pytrace=False)
    out = tmp_path_factory.mktemp("dist")
    egg_info = ROOT / "airflow_resumable.egg-info"
    had_egg_info = egg_info.exists()
    (default,) = airflow_cells("newest")
    env = {**os.environ, "PY": sys.executable, "DIST_DIR": str(out)}
    if default.constraints:  # the build environment's setuptools from the same pins
        env["CONSTRAINTS"] = str(default.constraints)
    result = subprocess.run(["bash", str(ROOT / "scripts" / "dist.sh")], capture_output=True, text=True, env=env,
                            timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    # The build ran in a copy: no egg-info left in the checkout to declare the entry points twice.
    assert had_egg_info or not egg_info.exists(), log[-2000:]
    (wheel,) = out.glob("airflow_resumable-*.whl")
    (sdist,) = out.glob("airflow_resumable-*.tar.gz")
    return Artifacts(wheel, sdist, log)


def test_make_dist_builds_a_wheel_and_an_sdist_that_pass_twine_check_strict(artifacts: Artifacts) -> None:
    version = airflow_resumable.__version__
    assert artifacts.wheel.name == f"airflow_resumable-{version}-py3-none-any.whl"
    assert artifacts.sdist.name == f"airflow_resumable-{version}.tar.gz"
    # twine prints one "Checking <file>: PASSED" per artifact (wrapped to the console's width)
    assert artifacts.log.count("PASSED") == 2 and "FAILED" not in artifacts.log, artifacts.log[-3000:]
    assert "WARNING" not in artifacts.log.split("Checking ", 1)[1], artifacts.log[-3000:]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^dist: venv\n\t.*scripts/dist\.sh", makefile, re.M)


def test_the_metadata_declares_the_license_expression_classifiers_and_project_urls(artifacts: Artifacts) -> None:
    meta = artifacts.metadata()
    assert meta["Metadata-Version"] >= "2.4" and meta["Name"] == "airflow-resumable"
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License"] is None  # the deprecated free-text field is not written beside the expression
    assert sorted(meta.get_all("License-File")) == ["LICENSE", "NOTICE"]
    classifiers = meta.get_all("Classifier")
    for wanted in ("Framework :: Apache Airflow", "Framework :: Apache Airflow :: Provider", "Typing :: Typed",
                   "Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.12",
                   "Programming Language :: Python :: 3.13"):
        assert wanted in classifiers, wanted
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression only
    urls = dict(url.split(", ", 1) for url in meta.get_all("Project-URL"))
    assert {"Documentation", "Source", "Changelog", "Issues"} <= set(urls)
    assert all(url.startswith("https://github.com/airflow-resumable/airflow-resumable") for url in urls.values())
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Description-Content-Type"] == "text/markdown" and "# airflow-resumable" in meta.get_payload()


def test_the_license_is_the_apache_2_text_and_travels_with_the_notice_in_both_artifacts(artifacts: Artifacts) -> None:
    license_text, notice = (ROOT / "LICENSE").read_bytes(), (ROOT / "NOTICE").read_bytes()
    assert hashlib.md5(license_text).hexdigest() == APACHE_2_MD5  # noqa: S324 (a checksum, not security)
    assert b"airflow-resumable" in notice and b"Apache License, Version 2.0" in notice
    version = airflow_resumable.__version__
    for name, text in (("LICENSE", license_text), ("NOTICE", notice)):
        assert artifacts.wheel_file(f"airflow_resumable-{version}.dist-info/licenses/{name}") == text
        assert artifacts.sdist_file(name) == text


def test_the_wheel_carries_every_module_py_typed_and_the_plugin_s_static_files(artifacts: Artifacts) -> None:
    names = set(artifacts.wheel_names())
    package = ROOT / "airflow_resumable"
    ours = {str(p.relative_to(ROOT)) for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert "airflow_resumable/py.typed" in ours
    assert {name for name in ours if name.startswith("airflow_resumable/plugins/static/")}
    missing = sorted(ours - names)
    assert not missing, f"not in the wheel: {missing}"
    for name in ours:
        if name.startswith("airflow_resumable/plugins/static/"):
            assert artifacts.wheel_file(name) == (ROOT / name).read_bytes(), name
    entry_points = artifacts.wheel_file(f"airflow_resumable-{airflow_resumable.__version__}.dist-info/entry_points.txt")
    assert b"[apache_airflow_provider]" in entry_points and b"[airflow.plugins]" in entry_points


def test_the_sdist_ships_the_package_and_its_documents_and_no_tests(artifacts: Artifacts) -> None:
    """No tests in the sdist: they need this repository's tooling and live services (MANIFEST.in)."""
    prefix = artifacts.sdist.name.removesuffix(".tar.gz") + "/"
    names = [name.removeprefix(prefix) for name in artifacts.sdist_names()]
    assert {name.split("/", 1)[0] for name in names} == SDIST_TOP
    package = {str(p.relative_to(ROOT)) for p in (ROOT / "airflow_resumable").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert package <= set(names), sorted(package - set(names))
    assert not [n for n in names if n.startswith(("tests/", "dags/", "constraints")) or "conftest" in n]
    assert "no tests" in (ROOT / "MANIFEST.in").read_text()


def test_the_version_is_declared_once_and_every_place_reads_it(artifacts: Artifacts) -> None:
    """``airflow_resumable.version.__version__`` is the only declaration: setup.cfg reads it (``attr:``), the
    provider info reads it, and the changelog's newest release is it."""
    from airflow_resumable.get_provider_info import get_provider_info

    version = airflow_resumable.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert artifacts.metadata()["Version"] == version
    assert get_provider_info()["versions"] == [version]
    assert re.search(r"^version = attr: airflow_resumable\.version\.__version__$", (ROOT / "setup.cfg").read_text(), re.M)
    declared = [str(p.relative_to(ROOT)) for p in (ROOT / "airflow_resumable").rglob("*.py")
                if f'"{version}"' in p.read_text() or f"'{version}'" in p.read_text()]
    assert declared == ["airflow_resumable/version.py"]
    assert changelog_releases()[0][0] == version


def test_the_docker_image_builds_the_package_with_the_license_files_its_metadata_names() -> None:
    """docker/Dockerfile installs from the package's source: the files setup.cfg's license_files
    names travel beside setup.cfg (tests/integration/test_docker.py checks the build context lets them in)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    names = config["metadata"]["license_files"].split()
    assert names == ["LICENSE", "NOTICE"]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    (copy,) = [line.split()[2:-1] for line in dockerfile.splitlines() if line.startswith("COPY") and "setup.cfg" in line]
    assert set(names) <= set(copy), copy


# -- the changelog ------------------------------------------------------------------------------------


def changelog_releases() -> list[tuple[str, str]]:
    """(version, date) of each release in CHANGELOG.md, newest first."""
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", (ROOT / "CHANGELOG.md").read_text(), re.M)


def test_the_changelog_keeps_a_changelog_with_this_release_on_top() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[0] == "[Unreleased]" and "keepachangelog.com" in text
    releases = changelog_releases()
    assert len(releases) == len(headings) - 1, headings  # every other heading is "[version] - date"
    assert releases[0][0] == airflow_resumable.__version__
    assert [v for v, _ in releases] == sorted((v for v, _ in releases), key=_version_key, reverse=True)
    assert [d for _, d in releases] == sorted((d for _, d in releases), reverse=True)
    sections = set(re.findall(r"^### (.*)$", text, re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, sections
    for name in ["Unreleased", *(v for v, _ in releases)]:  # each heading's link at the bottom
        assert re.search(rf"^\[{re.escape(name)}\]: https://github\.com/airflow-resumable/", text, re.M), name
    # What the earlier releases brought, as the repository's history tells it.
    for feature in ("Resume", "fencing", "Overlap", "migrations", "Celery", "Pause by deferral", "Checkpoint tab",
                    "REST", "airflow resumable", "Metrics", "Readers", "Skip policy", "In-place checkpoints",
                    "Exactly once"):
        assert feature in text, feature


# -- the wheel where a team installs it -------------------------------------------------------------------

#: The example DAGs run in the fresh venv: a ``ChunkedOperator`` and a ``@task.resumable`` task (the
#: provider's task decorator), and the job each one checkpoints.
EXAMPLES = {"chunked_example.py": "chunked_example.total_revenue", "taskflow_example.py": "taskflow_example.sum_of_squares"}

#: Run in the fresh venv (``python -I``: neither the checkout nor PYTHONPATH on sys.path): where the
#: package comes from, then each example DAG under dag.test().
RUN_DAG = """
import importlib.util, json, sys
from pathlib import Path
import airflow_resumable
checkout, dag_files = sys.argv[1], sys.argv[2:]
where = {"file": airflow_resumable.__file__, "version": airflow_resumable.__version__,
         "checkout_on_path": [p for p in sys.path if p and Path(p).resolve().is_relative_to(checkout)]}
states = {}
for dag_file in dag_files:
    spec = importlib.util.spec_from_file_location(Path(dag_file).stem, dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    states[module.dag.dag_id] = str(module.dag.test().state)
print("RESULT " + json.dumps({**where, "states": states}))
"""

#: The api-server's app with the plugin mounted (``RESUMABLE_PLUGIN_API=1`` builds it here), driven
#: by FastAPI's TestClient: the plugin as Airflow lists it, every page it declares (external views'
#: and React apps' URLs) and every script those pages load, and its REST listing the checkpoints.
SERVE_PLUGIN = """
import json, re, sys
from urllib.parse import urljoin, urlsplit
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app, get_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
with TestClient(create_app()) as client:
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    auth = {"Authorization": f"Bearer {token}"}
    ours = [p for p in client.get("/api/v2/plugins", headers=auth).json()["plugins"] if p["name"] == "resumable"]
    urls = [v["href"] for p in ours for v in p.get("external_views") or []]
    urls += [a["bundle_url"] for p in ours for a in p.get("react_apps") or []]
    pages, todo = {}, [urlsplit(url).path for url in urls]
    while todo:
        path = todo.pop()
        if path in pages:
            continue
        r = client.get(path)
        pages[path] = [r.status_code, r.text]
        if "html" in r.headers.get("content-type", ""):
            todo += [urlsplit(urljoin(path, src)).path for src in re.findall(r'<script[^>]+src="([^"]+)"', r.text)]
    slots = client.get("/resumable/api/v1/checkpoints", headers=auth)
print("RESULT " + json.dumps({"plugins": len(ours), "pages": pages, "slots": [slots.status_code, slots.json()]}))
"""


#: A user's own test (their project, their pytest) of a handler, through the test kit's fixture that
#: the installed wheel's ``pytest11`` entry point registers.
USER_TEST = """
def sum_to_20(ctx):
    done, total = ctx.position or 0, ctx.state.get("sum", 0)
    while done < 20:
        total += sum(range(done + 1, done + 6))
        done += 5
        ctx.checkpoint(done, state={"sum": total})
    return total


def test_the_handler_resumes_after_every_interruption(resumable_check):
    report = resumable_check(sum_to_20)
    assert report.trials and all(trial.result == 210 for trial in report.trials)
"""


#: version_compat's name for the provider CLI commands (``airflow resumable ...``), from 3.2.
CLI_FEATURE = "airflow resumable ... (provider CLI commands)"


def cell_supports(cell: Cell, feature: str) -> bool:
    """Whether the cell's Airflow has ``feature``, by version_compat's table (the test process's
    Airflow may be another version than the venv's)."""
    from airflow_resumable.version_compat import FEATURES

    return tuple(_version_key(cell.airflow)[:2]) >= FEATURES[feature][0]


def _result(proc: subprocess.CompletedProcess[str]) -> dict:
    """The JSON a venv script printed on its ``RESULT`` line."""
    assert proc.returncode == 0, (proc.stdout[-4000:] + proc.stderr[-4000:])
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.timeout(1800)  # a fresh venv: pip installs about 200 packages, slower on a busy machine
@pytest.mark.parametrize("cell", airflow_cells(), ids=lambda cell: cell.id)
def test_the_built_wheel_in_a_fresh_venv_runs_example_dags_the_cli_the_plugin_pages_and_the_test_kit(
    cell: Cell, artifacts: Artifacts, tmp_path: Path
) -> None:
    if cell.problem:
        pytest.fail(cell.problem, pytrace=False)
    assert cell.constraints is not None
    # Given a venv outside the checkout with the wheel and the constraints file's Airflow
    venv, home, dags = tmp_path / "venv", tmp_path / "home", tmp_path / "dags"
    dags.mkdir()
    for name in EXAMPLES:
        (dags / name).write_text((ROOT / "dags" / name).read_text())
    timings: dict[str, float] = {}

    def step(name: str, args: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env={**base_env, **env},
                              timeout=timeout)
        timings[name] = round(time.monotonic() - started, 1)
        return proc

    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("AIRFLOW", "RESUMABLE_", "PYTHON", "VIRTUAL_ENV", "PIP_CONSTRAINT"))}
    base_env.update(airflow_env.environment(home, dags, conn=f"sqlite:///{tmp_path / 'checkpoints.db'}",
                                            log_level="WARNING"))
    base_env["PATH"] = f"{venv / 'bin'}{os.pathsep}{base_env.get('PATH', '')}"
    made = step("venv", [sys.executable, "-m", "venv", str(venv)], 300)
    assert made.returncode == 0, made.stderr
    python, airflow = str(venv / "bin" / "python"), str(venv / "bin" / "airflow")
    # --no-compile: no bytecode for the ~200 packages up front, three times over (one venv per
    # Airflow): Python compiles only what the steps below import.
    installed = step("install", [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                 "--no-compile", "-c", str(cell.constraints), str(artifacts.wheel)], 1200)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    checked = step("pip check", [python, "-m", "pip", "check", "--disable-pip-version-check"], 120)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]  # nothing broken or missing
    versions = step("versions", [python, "-I", "-c", "from importlib.metadata import version as v; "
                                 "print(v('apache-airflow'), v('airflow-resumable'))"], 60)
    assert versions.stdout.split() == [cell.airflow, airflow_resumable.__version__], versions.stderr
    migrated = step("db migrate", [airflow, "db", "migrate"], 600)
    assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]

    # When the example DAGs run with dag.test() on the embedded SQLite store
    ran = _result(step("dag.test()", [python, "-I", "-c", RUN_DAG, str(ROOT), *(str(dags / n) for n in EXAMPLES)],
                       600))
    # Then the package came from the venv's site-packages, not from the checkout, and the runs succeeded
    assert Path(ran["file"]).is_relative_to(venv) and not ran["checkout_on_path"], ran
    assert ran["version"] == airflow_resumable.__version__
    assert ran["states"] == {"chunked_example": "success", "taskflow_example": "success"}, ran

    # And `airflow resumable` is a command of the installed Airflow that lists the finished slot
    # (where that Airflow reads providers' CLI commands; on an older one, `python -m airflow_resumable`)
    cli = [airflow, "resumable"] if cell_supports(cell, CLI_FEATURE) else [python, "-m", "airflow_resumable"]
    helped = step(f"{' '.join(Path(a).name for a in cli)} --help", [*cli, "--help"], 120)
    assert helped.returncode == 0, helped.stderr[-3000:]
    for command in ("list", "show", "history", "pause", "resume", "cancel", "restart", "release", "migrate", "clean"):
        assert re.search(rf"^\s+{command}\s", helped.stdout, re.M), (command, helped.stdout)
    listed = step("list", [*cli, "list", "--output", "json"], 120)
    assert listed.returncode == 0, listed.stderr[-3000:]
    slots = {slot["job"]: slot for slot in json.loads(listed.stdout)}
    assert set(slots) == set(EXAMPLES.values()) and {s["status"] for s in slots.values()} == {"done"}, slots
    assert slots["chunked_example.total_revenue"]["processed"] == slots["chunked_example.total_revenue"]["total"] == 5_000

    # And the api-server's app lists the plugin once and serves each of its pages and their scripts
    # from the wheel's static files, and its REST lists both checkpoints
    served = _result(step("plugin pages", [python, "-I", "-c", SERVE_PLUGIN], 300, RESUMABLE_PLUGIN_API="1",
                          AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_urlsafe(32),
                          AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin"))
    assert served["plugins"] == 1
    static = {artifacts.wheel_file(name).decode(errors="replace") for name in artifacts.wheel_names()
              if name.startswith("airflow_resumable/plugins/static/")}
    assert len(served["pages"]) >= 3, served["pages"].keys()  # today: the tab, the jobs page, their script
    for path, (code, body) in served["pages"].items():
        assert code == 200 and body in static, (path, code, body[:300])
    code, body = served["slots"]
    assert code == 200 and {s["job"] for s in body["checkpoints"]} == set(EXAMPLES.values()), body

    # And a team's own pytest finds the test kit's fixtures through the wheel's entry point
    (tmp_path / "user_tests").mkdir()
    (tmp_path / "user_tests" / "test_handler.py").write_text(USER_TEST)
    pytest_installed = step("pip install pytest", [python, "-m", "pip", "install", "--quiet",
                                                   "--disable-pip-version-check", "-c", str(cell.constraints),
                                                   "pytest"], 600)
    assert pytest_installed.returncode == 0, pytest_installed.stderr[-3000:]
    kit = step("test kit", [python, "-I", "-m", "pytest", "-p", "no:cacheprovider", "-q", "user_tests"], 300)
    assert kit.returncode == 0 and "1 passed" in kit.stdout, kit.stdout[-3000:] + kit.stderr[-3000:]
    print(f"installed wheel with Airflow {cell.airflow} ({cell.constraints.name}), seconds per step: {timings}")
