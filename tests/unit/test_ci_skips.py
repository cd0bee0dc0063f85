"""The suite's own rules, as CI runs it (tests/conftest.py, setup.cfg): under ``CI=true`` a skip
fails unless it is an Airflow-version gate (tests/support/gates.py); everywhere, a mark that is not
registered is an error and an xfail that passes fails. Each case runs a small test module in a
pytest of its own, with this suite's conftest and configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.paths import ROOT

MODULE = '''
import pytest

from support.gates import before_airflow, needs_airflow


def test_a_tool_is_missing():
    pytest.skip("sometool is not installed")


@needs_airflow("retry_policy=")
def test_of_retry_policies():
    pass


@before_airflow("retry_policy=")
def test_of_an_airflow_without_retry_policies():
    pass


@pytest.mark.skipif(True, reason="no database here")
def test_on_a_database():
    pass


@pytest.mark.xfail(reason="a known limit", raises=ZeroDivisionError)
def test_a_known_limit_that_holds():
    1 / 0


@pytest.mark.xfail(reason="a known limit", raises=ZeroDivisionError)
def test_a_known_limit_lifted():
    pass
'''


def _pytest(tmp_path: Path, module: str, *, ci: bool) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "test_rules.py"
    path.write_text(module)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-c", str(ROOT / "setup.cfg"),
         "--rootdir", str(tmp_path), "-rA", "-q", str(path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )


def _outcomes(out: str) -> dict[str, str]:
    """Each test's outcome from pytest's ``-rA`` summary: name -> PASSED, SKIPPED, FAILED..."""
    found = {}
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "SKIPPED", "XFAIL", "XPASS", "ERROR") and "::" in rest:
            found[rest.split("::")[1].split(" ")[0]] = word
        elif word == "SKIPPED" and "test_rules.py" in rest:  # SKIPPED [1] path:line: reason
            found.setdefault("skipped", "")
            found["skipped"] += rest
    return found


def test_under_ci_a_skip_fails_unless_it_is_an_airflow_version_gate_and_a_lifted_xfail_fails(tmp_path: Path) -> None:
    done = _pytest(tmp_path, MODULE, ci=True)
    got = _outcomes(done.stdout)
    # a missing tool or database fails (a skip mark's, at setup: an error), naming the rule and the reason
    assert (got.get("test_a_tool_is_missing"), got.get("test_on_a_database")) == ("FAILED", "ERROR"), done.stdout
    assert "skipped under CI=true" in done.stdout and "sometool is not installed" in done.stdout, done.stdout
    # one of the two gates of retry_policy= runs on any Airflow, the other is skipped, saying which Airflow
    gates = {got.get("test_of_retry_policies"), got.get("test_of_an_airflow_without_retry_policies")}
    assert gates == {"PASSED", None} and "Airflow 3.3" in got.get("skipped", ""), done.stdout
    # an xfail must fail as it says; one that passes fails (strict)
    assert got.get("test_a_known_limit_that_holds") == "XFAIL", done.stdout
    assert got.get("test_a_known_limit_lifted") == "FAILED" and "XPASS(strict)" in done.stdout, done.stdout
    assert done.returncode == 1, done.stdout


def test_outside_ci_a_skip_stays_a_skip(tmp_path: Path) -> None:
    done = _pytest(tmp_path, MODULE, ci=False)
    got = _outcomes(done.stdout)
    assert "test_a_tool_is_missing" not in got and "test_on_a_database" not in got, done.stdout
    assert "sometool is not installed" in got.get("skipped", "") and "no database here" in got["skipped"], done.stdout


def test_a_mark_that_is_not_registered_is_an_error(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "import pytest\n\n\n@pytest.mark.slowish\ndef test_it():\n    pass\n", ci=False)
    assert done.returncode != 0 and "'slowish' not found in `markers` configuration option" in done.stdout, done.stdout
