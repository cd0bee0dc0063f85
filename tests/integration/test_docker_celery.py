"""The Celery variant of the Docker deployment (``docker/docker-compose.celery.yml``), checked as
tests/integration/test_docker.py checks the LocalExecutor one: Docker Compose's own ``config`` validates and
resolves it, and the assertions read the resolved model. Nothing is built or started here."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from support.compose import (  # noqa: F401 - empty_compose_home is an autouse fixture, used by compose()
    API_SERVER,
    COMPOSE_FILE,
    DAG_PROCESSOR,
    DOCKER,
    INIT,
    POSTGRES,
    SCHEDULER,
    TRIGGERER,
    compose,
    empty_compose_home,
)
from support.paths import ROOT

CELERY_FILE = DOCKER / "docker-compose.celery.yml"
REDIS = "redis"
WORKERS = ("airflow-worker-a", "airflow-worker-b")
AIRFLOW_SERVICES = (INIT, API_SERVER, SCHEDULER, DAG_PROCESSOR, TRIGGERER, *WORKERS)
DRAIN_CONFIG = "airflow_resumable.executors.celery.CELERY_CONFIG"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    result = compose("config", "--format", "json", file=CELERY_FILE)
    assert result.returncode == 0, f"docker-compose config rejected {CELERY_FILE}:\n{result.stderr}"
    return json.loads(result.stdout)["services"]


@pytest.fixture(scope="module")
def local_services() -> dict[str, Any]:
    result = compose("config", "--format", "json", file=COMPOSE_FILE)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


def test_docker_compose_accepts_the_celery_file_without_warnings() -> None:
    result = compose("config", "--quiet", file=CELERY_FILE)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_it_is_the_local_deployment_plus_redis_and_two_workers(
    services: dict[str, Any], local_services: dict[str, Any]
) -> None:
    assert set(services) == set(local_services) | {REDIS, *WORKERS}
    for name in local_services:  # same image, command, mounts and checks; only the executor settings differ
        for key in ("image", "build", "command", "volumes", "healthcheck", "ports"):
            assert services[name].get(key) == local_services[name].get(key), (name, key)
    for name in WORKERS:
        assert services[name]["image"] == services[SCHEDULER]["image"]
        assert services[name]["volumes"] == services[SCHEDULER]["volumes"], "dags and the shared logs volume"


def test_every_airflow_component_runs_the_celery_executor_with_the_drain(services: dict[str, Any]) -> None:
    common = {k: v for k, v in services[SCHEDULER]["environment"].items()}
    for name in AIRFLOW_SERVICES:
        env = dict(services[name]["environment"])
        env.pop("DUMB_INIT_SETSID", None)
        assert env == common, f"{name} must see the same configuration"
    assert common["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert re.fullmatch(rf"redis://{REDIS}:6379/\d+", common["AIRFLOW__CELERY__BROKER_URL"])
    assert common["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+" + common["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert common["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "2"
    # The setting names an object that exists and is Airflow's default Celery configuration.
    module, _, attr = common["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"].rpartition(".")
    assert f"{module}.{attr}" == DRAIN_CONFIG
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    assert getattr(importlib.import_module(module), attr) == DEFAULT_CELERY_CONFIG


def test_two_workers_with_their_own_celery_hostnames_drain_on_a_stop(services: dict[str, Any]) -> None:
    names = set()
    for name in WORKERS:
        worker = services[name]
        command = worker["command"]
        assert command[:2] == ["celery", "worker"], command
        hostname = command[command.index("--celery-hostname") + 1]
        names.add(hostname.split("@")[0])
        assert hostname.split("@")[0] in " ".join(worker["healthcheck"]["test"]), "the health check pings itself"
        # docker stop signals the Celery main process only (a warm shutdown, which the drain hooks).
        assert worker["environment"]["DUMB_INIT_SETSID"] == "0"
        assert worker["stop_grace_period"], "a bounded wait for other tasks"
        assert worker["restart"] == "always"
        depends = worker["depends_on"]
        for dependency, condition in ((POSTGRES, "service_healthy"), (REDIS, "service_healthy"),
                                      (INIT, "service_completed_successfully"), (API_SERVER, "service_healthy")):
            assert depends[dependency]["condition"] == condition, (name, dependency)
        assert not worker.get("ports"), "workers publish nothing"
    assert len(names) == len(WORKERS), names


def test_redis_is_healthy_checked_and_not_published(services: dict[str, Any]) -> None:
    redis = services[REDIS]
    assert redis["image"].startswith("redis:")
    assert "ping" in " ".join(redis["healthcheck"]["test"])
    assert not redis.get("ports")


def test_the_celery_file_is_documented_beside_the_local_one() -> None:
    readme = (DOCKER / "README.md").read_text()
    assert CELERY_FILE.name in readme
    assert Path(ROOT / "README.md").read_text().count(CELERY_FILE.name) >= 1
