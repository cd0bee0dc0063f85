"""``make standalone``'s api-server settings (devtools/airflow_env.py ``api_settings``): whatever the
user's environment holds, the Execution API address every task's supervisor calls is this
api-server's own port and a host it listens on. A task that cannot reach it fails before it starts,
every try, with nothing in the UI but "queued".

No Airflow here: the function is read as the shell script evaluates it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from devtools.airflow_env import api_settings


def _port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def test_an_api_server_bound_to_ipv6_loopback_is_called_there_not_on_127_0_0_1() -> None:
    """``AIRFLOW__API__HOST=::1`` binds the api-server to IPv6's loopback only: nothing answers on
    127.0.0.1, so every task failed with ConnectError."""
    for host in ("::1", "[::1]"):
        execution = api_settings({"AIRFLOW__API__HOST": host}, "28080")["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
        assert urlsplit(execution).hostname == "::1", (host, execution)
        assert _port(execution) == 28080


def test_a_port_moved_with_airflow_s_own_variable_moves_a_local_address_left_from_before() -> None:
    """The shell sourced ``.airflow-home/env.sh`` of an earlier ``make standalone`` (it exports
    ``AIRFLOW__API__BASE_URL`` and ``AIRFLOW__CORE__EXECUTION_API_SERVER_URL`` naming 8080), then
    ``AIRFLOW__API__PORT=28080 make standalone``: the UI link and every task's Execution API stayed
    on 8080 (nothing there, or another Airflow), so every task failed before it started."""
    left = {"AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": "28080",
            "AIRFLOW__API__BASE_URL": "http://localhost:8080",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:8080/execution/"}
    got = api_settings(left)
    assert _port(got["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]) == 28080, got
    assert _port(got["AIRFLOW__API__BASE_URL"]) == 28080, got


def test_a_user_s_own_address_on_another_host_is_kept() -> None:
    """A base URL behind a proxy (https, a path prefix, another host) is the user's: kept as given."""
    own = {"AIRFLOW__API__PORT": "28080", "AIRFLOW__API__BASE_URL": "https://airflow.example.com/team/"}
    got = api_settings(own)
    assert got["AIRFLOW__API__BASE_URL"] == "https://airflow.example.com/team/"
    # called directly, under the path the api-server serves everything under (see the test below)
    assert got["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:28080/team/execution/"


@pytest.mark.parametrize("port", ["0", "abc", "8080x", "70000", "-1", " "])
def test_a_port_that_is_no_port_is_refused_naming_it(port: str) -> None:
    """``PORT=0`` let the api-server take any free port while every task called port 0; a word or an
    out-of-range number started Airflow with an address no task could use."""
    with pytest.raises(ValueError, match="port"):
        api_settings({}, port)
    with pytest.raises(ValueError, match="port"):
        api_settings({"AIRFLOW__API__PORT": port})


@pytest.mark.parametrize("base_url", ["http://localhost:8080/airflow", "http://localhost:8080/airflow/",
                                      "https://localhost:8080/team/airflow/"])
def test_a_base_url_with_a_path_prefix_keeps_it_in_the_execution_api_address(base_url: str) -> None:
    """Airflow's api-server serves under ``[api] base_url``'s path (its FastAPI app's ``root_path``):
    the Execution API mounted at ``/execution`` answers ``<prefix>/execution/...`` and 404s a
    path without the prefix, so every task failed before it started. Airflow's own default keeps the
    prefix (``base_url + /execution/``)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    execution = api_settings({"AIRFLOW__API__BASE_URL": base_url})["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    prefix = urlsplit(base_url).path.rstrip("/")
    assert urlsplit(execution).path == f"{prefix}/execution/", execution
    # As airflow/api_fastapi/app.py builds it: root_path from base_url's path, the Execution API mounted
    app, inner = FastAPI(root_path=prefix), FastAPI()
    inner.get("/health")(lambda: {"ok": True})
    app.mount("/execution", inner)
    with TestClient(app) as client:
        assert client.get(urlsplit(execution).path + "health").status_code == 200


def test_a_port_the_shell_exports_does_not_move_make_standalone_only_one_given_to_make_does() -> None:
    """Many hosts export ``PORT`` for their own servers (3000, 5000): ``make standalone`` read it as
    its own and moved the UI there without a word, where the docs promise 8080."""
    import os
    import subprocess

    from support.paths import ROOT

    def recipe(*args: str, env: dict[str, str]) -> str:
        out = subprocess.run(["make", "-n", "standalone", *args], cwd=ROOT, env={**os.environ, **env},
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return next(line for line in out.splitlines() if "scripts/standalone.sh" in line)

    assert "PORT= " in recipe(env={"PORT": "3000"})
    assert "PORT=28080 " in recipe("PORT=28080", env={"PORT": "3000"})
