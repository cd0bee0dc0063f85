"""The Airflow and Python versions the package runs on: setup.cfg's range, one generated constraints
file per supported pair, what a feature of a newer Airflow says on an older one, and the scripts that
make the files (scripts/constraints.py) and run the suite on each pair (scripts/matrix.sh).

The tests that need a given Airflow run in that pair's venv (``make matrix``); elsewhere they are
skipped, saying why.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.version_compat import (
    AIRFLOW_VERSION,
    AIRFLOW_VERSION_STRING,
    MINIMUM_AIRFLOW,
    needs,
    supports,
)
from support.gates import before_airflow
from support.paths import ROOT
from support.pins import pins

CONSTRAINTS = ROOT / "constraints"
#: The supported pairs: every Airflow minor on Python 3.11, and the newest Airflow on every Python.
AIRFLOW_MINORS = ("3.1", "3.2", "3.3")
PYTHONS = ("3.11", "3.12", "3.13")
EXPECTED = {f"airflow-{a}-py3.11.txt" for a in AIRFLOW_MINORS} | {f"airflow-3.3-py{p}.txt" for p in PYTHONS}


def requirement(name: str) -> Requirement:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = [line.strip() for line in parser["options"]["install_requires"].splitlines()]
    return next(Requirement(line) for line in lines if line and Requirement(line).name == name)


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("constraints_script", ROOT / "scripts" / "constraints.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- setup.cfg and the constraints files ------------------------------------------------------------


def test_there_is_one_constraints_file_per_supported_pair() -> None:
    assert {p.name for p in CONSTRAINTS.glob("*.txt")} == EXPECTED
    assert not (ROOT / "constraints-3.11.txt").exists()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_setup_cfg_accepts_each_pairs_airflow_so_installing_the_package_changes_no_airflow(name: str) -> None:
    pinned = pins(CONSTRAINTS / name)
    for package in ("apache-airflow", "apache-airflow-task-sdk"):
        assert pinned[package] in requirement(package).specifier, (name, package, pinned[package])


def test_setup_cfg_starts_at_the_oldest_supported_airflow_and_stops_before_the_next_unknown_one() -> None:
    spec = requirement("apache-airflow").specifier
    oldest = ".".join(map(str, MINIMUM_AIRFLOW))
    assert Version(f"{oldest}.0") in spec and Version(f"{oldest}.0").release[:2] == MINIMUM_AIRFLOW
    assert Version("3.0.6") not in spec and Version("3.4.0") not in spec
    assert AIRFLOW_MINORS[0] == oldest


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_constraints_file_pins_its_pair_and_says_it_is_generated(name: str) -> None:
    airflow, python = re.fullmatch(r"airflow-(\d+\.\d+)-py(\d+\.\d+)\.txt", name).groups()  # type: ignore[union-attr]
    text = (CONSTRAINTS / name).read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    pinned = pins(CONSTRAINTS / name)
    assert pinned["apache-airflow"].startswith(f"{airflow}.")
    assert f"on Python {python}." in header[0] and "scripts/constraints.py" in "\n".join(header)
    assert "Never edit it by hand" in "\n".join(header)
    # A file made by the generator: no path of the venv it was made in, not the package itself.
    assert " @ " not in text and "airflow-resumable" not in pinned


def test_the_newest_pairs_file_keeps_the_pins_of_the_file_it_replaces() -> None:
    """constraints-3.11.txt's pins (celery 5.6, the test tools' ranges) live on under the new name."""
    pinned = pins(CONSTRAINTS / "airflow-3.3-py3.11.txt")
    assert (pinned["apache-airflow"], pinned["celery"], pinned["apache-airflow-providers-celery"]) == (
        "3.3.2", "5.6.3", "3.26.0")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_constraints_file_keeps_the_generator_s_caps_for_its_airflow_and_says_why(name: str) -> None:
    """Airflow 3.2.2's dag.test() answers 500 with svcs 26.2 (its lifespan deletes the registry
    Airflow's in-process Execution API reads): the 3.2 files pin below it, their header says why."""
    script = generator()
    airflow = pins(CONSTRAINTS / name)["apache-airflow"]
    caps = script.caps_for(airflow)
    assert ("svcs" in caps) is airflow.startswith("3.2."), caps
    text = (CONSTRAINTS / name).read_text()
    for package, (spec, why) in caps.items():
        assert Version(pins(CONSTRAINTS / name)[package]) in SpecifierSet(spec), (name, package)
        assert f"# Capped by scripts/constraints.py's CAPS: {package}{spec}: {why}." in text


def test_airflow_3_2_with_svcs_26_2_is_named_with_its_fix_and_this_environment_has_no_such_problem() -> None:
    from airflow_resumable.version_compat import environment_problems

    (said,) = environment_problems((3, 2), {"svcs": "26.2.0"})
    assert said.startswith("Airflow 3.2 with svcs 26.2.0: Airflow's in-process Execution API (dag.test()")
    assert "Install svcs<26.2" in said and "upgrade Airflow to 3.3" in said
    assert environment_problems((3, 2), {"svcs": "26.1.0"}) == environment_problems((3, 2), {}) == []
    assert environment_problems((3, 3), {"svcs": "26.2.0"}) == environment_problems((3, 1), {"svcs": "26.2.0"}) == []
    assert environment_problems() == []  # every constraints file's environment is free of them


def test_ci_runs_the_fast_suite_on_every_supported_pair_but_the_one_make_test_runs_whole() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    run = r'^(?:SHARE=yes )?(?:MATRIX_JOBS=\d+ )?CELLS="([^"]+)" make matrix$'
    (cells,) = re.findall(run, ci, re.M)
    assert sorted(f"{cell}.txt" for cell in cells.split()) == sorted(EXPECTED - {"airflow-3.3-py3.11.txt"})
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS := constraints/airflow-3\.3-py3\.11\.txt$", makefile, re.M)
    # the suites run after make test (their venvs' packages may go in beside it: PREPARE=yes)
    matched = re.search(run, ci, re.M)
    assert matched is not None and ci.index("make test\n") < matched.start()


# -- a feature of a newer Airflow, on an older one ---------------------------------------------------


def test_a_feature_that_needs_a_newer_airflow_names_itself_the_version_and_what_to_do() -> None:
    said = needs("retry_policy=")
    assert said.startswith(f"retry_policy= needs Airflow 3.3 or later (this is Airflow {AIRFLOW_VERSION_STRING})")
    assert "upgrade Airflow, or leave retry_policy out" in said
    assert supports("retry_policy=") is (AIRFLOW_VERSION[:2] >= (3, 3))


@before_airflow("retry_policy=")
def test_retry_policy_on_an_airflow_without_it_is_refused_at_parse_time_saying_which_airflow_it_needs() -> None:
    from airflow_resumable import ResumableOperator

    with pytest.raises(ConfigurationError) as refused:
        ResumableOperator(task_id="work", handler=lambda ctx: None, retry_policy=object())
    assert "task 'work': retry_policy= needs Airflow 3.3 or later" in str(refused.value)


def test_the_plugin_the_cli_group_and_the_task_decorator_register_on_this_airflow(airflow_home: Path) -> None:
    """Nothing disappears silently: Airflow loads the plugin and the decorator, and the provider
    CLI group is in ``airflow``'s parser wherever this Airflow reads provider CLI commands."""
    code = (
        "import json\n"
        "from airflow import plugins_manager\n"
        "from airflow.sdk import task\n"
        "getter = getattr(plugins_manager, '_get_plugins', None)\n"
        "if getter is not None:\n"
        "    plugins, errors = getter()\n"
        "    names = [p.name for p in plugins]\n"
        "else:\n"
        "    plugins_manager.ensure_plugins_loaded()\n"
        "    names, errors = [p.name for p in plugins_manager.plugins], plugins_manager.import_errors\n"
        "from airflow.cli import cli_parser\n"
        "group = 'resumable' in cli_parser.ALL_COMMANDS_DICT\n"
        "print(json.dumps({'plugins': names, 'errors': {str(k): str(v) for k, v in errors.items()},\n"
        "                  'decorator': task.resumable.__name__, 'group': group}))\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(airflow_home)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert "resumable" in seen["plugins"] and not seen["errors"], seen
    assert seen["decorator"] == "resumable_task"
    assert seen["group"] is supports("airflow resumable ... (provider CLI commands)")


def test_installing_the_package_keeps_the_airflow_already_installed(tmp_path: Path) -> None:
    """pip's resolver, asked to install the package where Airflow already is, installs no Airflow
    of another version (a dry run from a copy of the source tree)."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".venvs", "*.egg-info", "build", "dist", "__pycache__", ".test-logs", ".airflow*",
        "docs", "tests", "bench", "docker", "dags"))
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), str(source)],
        capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stderr[-3000:]
    installed = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                 for item in json.loads(report.read_text())["install"]}
    assert installed.pop("airflow-resumable")
    assert not [name for name in installed if name.startswith("apache-airflow")], installed


# -- the scripts ------------------------------------------------------------------------------------


def test_the_generator_takes_the_extras_from_setup_cfg(tmp_path: Path) -> None:
    script = generator()
    (tmp_path / "setup.cfg").write_text(
        (ROOT / "setup.cfg").read_text().replace("[options.extras_require]\n",
                                                 "[options.extras_require]\nnewextra =\n    mkdocs\n"))
    script.ROOT = tmp_path
    assert "newextra" in script.extras()
    assert set(script.extras()) - {"newextra"} == set(generator().extras()) >= {"celery", "lint", "postgres", "test"}


def test_a_missing_python_is_named_with_where_it_was_looked_for(tmp_path: Path) -> None:
    env = {**os.environ, "PYENV_ROOT": str(tmp_path)}
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "constraints.py"), "--interpreter", "3.12"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert f"no Python 3.12 interpreter: looked for {tmp_path}/versions/3.12.*/bin/python" in result.stderr


def test_the_matrix_fails_a_pair_whose_python_is_missing_naming_the_interpreter(tmp_path: Path) -> None:
    # python3 from this venv: pyenv's own shim would look for its interpreters under PYENV_ROOT too.
    env = {**os.environ, "PYENV_ROOT": str(tmp_path), "CELLS": "airflow-3.3-py3.12", "TEST_LOGS": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "matrix.sh")], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 1
    row = next(line for line in result.stdout.splitlines() if line.startswith("airflow-3.3-py3.12"))
    assert "FAILED: no Python 3.12 interpreter" in row and f"{tmp_path}/versions/3.12.*/bin/python" in row
    assert result.stdout.splitlines()[-1] == "matrix: 0 passed, 1 failed"
