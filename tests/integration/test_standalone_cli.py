"""``make standalone`` as a person uses it: the real script, started in the background, then the
demo and the CLI from other shells, then stopped from yet another one.

One ``scripts/standalone.sh`` runs for the module in a fresh Airflow home (SQLite metadata database
and the embedded SQLite checkpoint store: the script's defaults), on free ports, started as a
background job of a script is (SIGINT ignored, so Ctrl-C cannot reach it). The tests run in order:
the demo's run lands in the store the standalone's UI reads; ``airflow resumable list`` in another
shell, with nothing but the ``env.sh`` the standalone wrote, lists it; ``make standalone-stop``
ends every process of it and frees its ports.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from devtools import standalone as script
from support.examples import SCHEDULED
from support.paths import ROOT
from support.standalone import PASSWORD_FILE, free_port, kill, wait_for

pytestmark = pytest.mark.scheduler

BIN = Path(sys.executable).parent


@dataclass
class Running:
    home: Path
    process: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int]
    base_url: str

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "--- make standalone (last lines) ---\n" + "\n".join(text[-lines:])

    def pids(self) -> dict[str, Any]:
        return json.loads((self.home / script.PID_FILE).read_text())


def _shell_env(**extra: str) -> dict[str, str]:
    """Another shell of the same person: no Airflow settings, the project's code importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({"PYTHONPATH": str(ROOT), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"})
    env.update(extra)
    return env


def _port_free(port: int) -> bool:
    """Free as the next standalone's servers will find it: they bind with SO_REUSEADDR, so the
    TIME_WAIT left by the requests a test made does not count, a listening socket does."""
    with closing(socket.socket()) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture(scope="module")
def standalone(pg_server: Any) -> Iterator[Running]:
    from devtools.postgres import dsn

    home = Path(tempfile.mkdtemp(prefix="resumable-make-standalone-"))
    # The customer export reads a database of its own (as RESUMABLE_EXPORT_SOURCE names one)
    source = dsn(pg_server.create_database("resumable_standalone_source"))
    ports = {"api": free_port(), "worker_logs": free_port(), "trigger_logs": free_port()}
    base_url = f"http://127.0.0.1:{ports['api']}"
    # Only the port, as `make standalone PORT=...` passes it: the script moves the base URL and the
    # Execution API's URL with it (Airflow's own defaults for both say 8080 whatever the port).
    env = _shell_env(
        AIRFLOW_HOME=str(home), PY=sys.executable, PYTHONUNBUFFERED="1", PORT=str(ports["api"]),
        AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_urlsafe(32),
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(ports["worker_logs"]),
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(ports["trigger_logs"]),
        RESUMABLE_EXPORT_SOURCE=source,
    )
    log = home / "make-standalone.log"

    def as_a_background_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `make standalone &` in a script gets

    with open(log, "ab") as out:
        process = subprocess.Popen(["bash", str(ROOT / "scripts" / "standalone.sh")], env=env, cwd=ROOT,
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=as_a_background_job)
    running = Running(home, process, log, ports, base_url)

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"make standalone exited with {process.returncode}\n{running.tail()}")
        if not (home / PASSWORD_FILE).exists():
            return False
        health = httpx.get(f"{base_url}/api/v2/monitor/health", timeout=5).json()
        return all((health.get(c) or {}).get("status") == "healthy"
                   for c in ("metadatabase", "scheduler", "dag_processor", "triggerer"))

    try:
        wait_for(healthy, timeout=300, interval=1.0, what="make standalone to become healthy", on_timeout=running.tail)
        yield running
    finally:
        if process.poll() is None:  # a failed test left it running: end what is left, by pid
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
            kill([p for p in tree if p.is_running()], timeout=10)
        if not os.environ.get("RESUMABLE_TEST_KEEP_HOME"):
            subprocess.run(["rm", "-rf", str(home)], check=False)


def test_make_standalone_prints_how_to_stop_it_and_how_to_use_the_cli(standalone: Running) -> None:
    out = standalone.log.read_text()
    front = standalone.pids()["pid"]
    assert f"stop it with Ctrl-C, `make standalone-stop` or `kill {front}`" in out
    assert f"CLI in another shell: source {standalone.home}/env.sh; airflow resumable list" in out
    assert f"checkpoints: sqlite:///{standalone.home}/checkpoints.db " in out
    # A local setup (SQLite, LocalExecutor, the api-server on 127.0.0.1) is not taken for production
    assert "looks like production" not in out


def test_the_demo_s_run_is_in_the_store_the_standalone_s_checkpoint_tab_reads(standalone: Running) -> None:
    """``make demo`` beside the standalone, same home: the task instance's Checkpoint tab (the
    plugin's task-instance route on the standalone's api-server) shows the demo's checkpoint."""
    demo = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], capture_output=True, text=True, timeout=600,
                          env=_shell_env(AIRFLOW_HOME=str(standalone.home), PY=sys.executable), cwd=ROOT)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    run_id = demo.stdout.strip().splitlines()[-1].split()[2].rstrip(":")
    password = json.loads((standalone.home / PASSWORD_FILE).read_text())["admin"]
    with httpx.Client(base_url=standalone.base_url, timeout=30) as http:
        token = http.post("/auth/token", json={"username": "admin", "password": password}).json()["access_token"]
        tab = http.get("/resumable/api/v1/task-instance", headers={"Authorization": f"Bearer {token}"},
                       params={"dag_id": "loan_report", "run_id": run_id, "task_id": "loan_report"})
    assert tab.status_code == 200, tab.text
    view = tab.json()
    assert view.get("resumable", True) is not False, view
    assert (view["job"], view["status"], view["processed"]) == ("loan_report.loan_report", "done", 30000)


def test_the_cli_in_another_shell_reads_the_standalone_s_store(standalone: Running) -> None:
    """``source .airflow-home/env.sh; airflow resumable list``, as the standalone printed it: no
    connection in the shell's environment, the one recorded in the home's database is found."""
    listed = subprocess.run(
        ["bash", "-c", f"source {standalone.home}/env.sh && airflow resumable list --output json"],
        capture_output=True, text=True, timeout=300, env=_shell_env(), cwd=tempfile.gettempdir(),
    )
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    rows = json.loads(listed.stdout.strip().splitlines()[-1])
    assert {(r["job"], r["status"]) for r in rows} >= {("loan_report.loan_report", "done")}, rows
    # Only the home named (what any Airflow command of this home needs): the same store.
    listed = subprocess.run(["airflow", "resumable", "list", "--output", "json"], capture_output=True, text=True,
                            timeout=300, env=_shell_env(AIRFLOW_HOME=str(standalone.home)), cwd=tempfile.gettempdir())
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    assert "loan_report.loan_report" in listed.stdout


def test_on_another_port_a_triggered_task_runs_and_its_tab_shows_its_progress(standalone: Running) -> None:
    """``make standalone PORT=<not 8080>``: the UI's address it prints, the REST API and the Execution
    API every task's supervisor calls are all on that port, so a triggered run's task runs to the
    end (with Airflow's defaults it would fail before it starts, calling 8080) and the Checkpoint
    tab's route shows its progress."""
    port = standalone.ports["api"]
    assert port != 8080
    assert f"UI: http://localhost:{port}  (user admin;" in standalone.log.read_text()
    env_sh = (standalone.home / "env.sh").read_text()
    assert f"export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:{port}/execution/" in env_sh
    password = json.loads((standalone.home / PASSWORD_FILE).read_text())["admin"]
    with httpx.Client(base_url=standalone.base_url, timeout=30) as http:
        token = http.post("/auth/token", json={"username": "admin", "password": password}).json()["access_token"]
        auth = {"Authorization": f"Bearer {token}"}

        def parsed() -> bool:
            return http.get("/api/v2/dags/readings_import", headers=auth).status_code == 200

        wait_for(parsed, timeout=180, interval=1.0, what="the dag-processor to parse readings_import",
                 on_timeout=standalone.tail)
        assert http.patch("/api/v2/dags/readings_import", json={"is_paused": False}, headers=auth).status_code == 200
        run_id = f"port_{port}"
        triggered = http.post("/api/v2/dags/readings_import/dagRuns", headers=auth,
                              json={"dag_run_id": run_id, "logical_date": None, "conf": {"seconds_per_reading": 0}})
        assert triggered.status_code == 200, triggered.text

        def ended() -> str | None:
            state = http.get(f"/api/v2/dags/readings_import/dagRuns/{run_id}", headers=auth).json()["state"]
            return state if state in ("success", "failed") else None

        assert wait_for(ended, timeout=240, interval=1.0, what="the run on another port to end",
                        on_timeout=standalone.tail) == "success"
        tab = http.get("/resumable/api/v1/task-instance", headers=auth,
                       params={"dag_id": "readings_import", "run_id": run_id, "task_id": "import_readings"})
    assert tab.status_code == 200, tab.text
    view = tab.json()
    assert (view["status"], view["processed"], view["total"]) == ("done", 600, 600), view




def test_every_scheduled_example_runs_with_its_scheduled_run_beside_a_manual_one(standalone: Running) -> None:
    """ui.md's step 7, for every example with a schedule: a person triggers the paused example with
    the dialog's default (unpause), so its scheduled run starts beside the manual one, and both
    runs' setup steps run at once. Every run ends ``success`` (a run that finds the other's slot
    live ends its task ``skipped`` under the overlap policy, as the docs say: the run still
    succeeds), and no task fails."""
    password = json.loads((standalone.home / PASSWORD_FILE).read_text())["admin"]
    with httpx.Client(base_url=standalone.base_url, timeout=30) as http:
        token = http.post("/auth/token", json={"username": "admin", "password": password}).json()["access_token"]
        auth = {"Authorization": f"Bearer {token}"}

        def parsed() -> bool:
            return all(http.get(f"/api/v2/dags/{dag}", headers=auth).status_code == 200 for dag in SCHEDULED)

        wait_for(parsed, timeout=180, interval=1.0, what="the dag-processor to parse the examples",
                 on_timeout=standalone.tail)
        for dag in SCHEDULED:  # the manual run, then the unpause: the scheduler starts the scheduled one
            for _ in range(3):
                triggered = http.post(f"/api/v2/dags/{dag}/dagRuns", headers=auth,
                                      json={"dag_run_id": f"manual_{dag}", "logical_date": None})
                # Airflow's api-server on its SQLite metadata database answers 500 "Database error" when
                # the write meets the scheduler's (seen once under CI's load): a person presses again
                if triggered.status_code != 500 or "Database error" not in triggered.text:
                    break
                time.sleep(2)
            # (409: the first press had created the run after all)
            assert triggered.status_code in (200, 409), triggered.text + "\n" + standalone.tail()
            assert http.patch(f"/api/v2/dags/{dag}", json={"is_paused": False}, headers=auth).status_code == 200

        def runs(dag: str) -> list[dict[str, Any]]:
            return http.get(f"/api/v2/dags/{dag}/dagRuns", headers=auth).json()["dag_runs"]

        def all_ended() -> dict[str, list[tuple[str, str]]] | None:
            found = {dag: [(r["run_type"], r["state"]) for r in runs(dag)] for dag in SCHEDULED}
            both = all({"manual", "scheduled"} <= {kind for kind, _ in pairs} for pairs in found.values())
            ended = all(state in ("success", "failed") for pairs in found.values() for _, state in pairs)
            return found if both and ended else None

        found = wait_for(all_ended, timeout=600, interval=2.0, what="both runs of every scheduled example to end",
                         on_timeout=standalone.tail)
        failed = {dag: [(kind, state) for kind, state in pairs if state != "success"] for dag, pairs in found.items()}
        for dag in SCHEDULED:
            http.patch(f"/api/v2/dags/{dag}", json={"is_paused": True}, headers=auth)
    assert not any(failed.values()), (failed, standalone.tail())


def test_make_standalone_stop_ends_every_process_of_it_and_frees_its_ports(standalone: Running) -> None:
    """The standalone ignores SIGINT (a background job); ``make standalone-stop`` from another
    shell stops its whole session, task and worker processes included, within the deadline."""
    pids = standalone.pids()
    sid = pids["airflow_pid"]
    before = script.session_members(sid, pids["airflow_created"])
    assert len(before) >= 5, [p.cmdline() for p in before]  # api-server, scheduler, dag-processor, triggerer...
    started = time.monotonic()
    stop = subprocess.run(["make", "-s", "standalone-stop", f"PY={sys.executable}"], capture_output=True, text=True,
                          timeout=180, env=_shell_env(AIRFLOW_HOME=str(standalone.home)), cwd=ROOT)
    took = time.monotonic() - started
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"standalone of {standalone.home} stopped" in stop.stdout
    print(f"\nmake standalone-stop: {len(before)} processes stopped in {took:.1f}s")
    assert standalone.process.wait(timeout=30) == 0, standalone.tail()  # (non-zero: Airflow ended on its own before)
    assert script.session_members(sid, pids["airflow_created"]) == []
    assert [p.pid for p in before if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert all(_port_free(port) for port in standalone.ports.values()), standalone.ports
    assert not (standalone.home / script.PID_FILE).exists()
    assert "standalone: SIGTERM: stopping all of it..." in standalone.log.read_text()


def test_make_standalone_names_the_customer_exports_postgresql_source_when_one_answers(
    pg_server: Any, tmp_path: Path
) -> None:
    """The store is the embedded SQLite file (the default). Given no PostgreSQL where the script
    looks, ``export_source`` stays unset and the script says how to set it; given a server that
    answers, it is recorded (the customer export then runs beside the SQLite store), and kept by
    the next start even when nothing answers then."""
    from devtools.postgres import dsn

    home = tmp_path / "home"

    def connection(probe: str) -> tuple[str, dict[str, tuple[Any, ...]]]:
        script_text = (f'eval "$({sys.executable} -m devtools.airflow_env --home {home} --dags {ROOT / "dags"})"; '
                       f"{sys.executable} -m devtools.standalone connection --with-export-source "
                       f"--export-source-probe '{probe}'")
        done = subprocess.run(["bash", "-c", script_text], capture_output=True, text=True, timeout=300,
                              env=_shell_env(), cwd=ROOT)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        import sqlite3

        with closing(sqlite3.connect(home / "airflow.db")) as db:
            rows = db.execute("SELECT conn_id, conn_type, host, port, schema FROM connection").fetchall()
        return done.stdout, {r[0]: r[1:] for r in rows}

    nowhere = "postgresql://postgres@127.0.0.1:1/postgres"
    out, conns = connection(nowhere)
    assert "export_source" not in conns and conns["resumable_default"][0] == "sqlite"
    assert "customer_export: no PostgreSQL found at" in out and "RESUMABLE_EXPORT_SOURCE=" in out
    params = pg_server.create_database("resumable_export_source")
    out, conns = connection(dsn(params))
    assert conns["export_source"] == ("postgres", params.get("host", "127.0.0.1"), int(params.get("port", 5432)),
                                      params["dbname"])
    assert f"customer_export reads its customers from: {dsn(params)}" in out
    out, conns = connection(nowhere)
    assert conns["export_source"][3] == params["dbname"]


def test_airflow_s_own_port_setting_alone_moves_the_base_url_and_the_execution_api_with_it() -> None:
    """What ``make standalone`` exports (``devtools.airflow_env --api``): Airflow's own
    ``AIRFLOW__API__PORT`` alone, or ``PORT``, moves all three; ``PORT`` wins over a base URL left in
    the shell (a sourced ``env.sh`` of another port); without ``PORT`` a URL set by hand is kept."""
    from devtools.airflow_env import api_settings

    assert api_settings({"AIRFLOW__API__PORT": "28080"}) == {
        "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": "28080",
        "AIRFLOW__API__BASE_URL": "http://localhost:28080",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:28080/execution/",
    }
    assert api_settings({})["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8080/execution/"
    stale = {"AIRFLOW__API__PORT": "8080", "AIRFLOW__API__BASE_URL": "http://localhost:8080",
             "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:8080/execution/"}
    moved = api_settings(stale, "28081")
    assert (moved["AIRFLOW__API__BASE_URL"], moved["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]) == (
        "http://localhost:28081", "http://127.0.0.1:28081/execution/")
    proxied = api_settings({"AIRFLOW__API__PORT": "28080", "AIRFLOW__API__BASE_URL": "https://airflow.example.com"})
    assert proxied["AIRFLOW__API__BASE_URL"] == "https://airflow.example.com"
    assert proxied["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:28080/execution/"
