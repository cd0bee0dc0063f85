"""A real ``airflow standalone`` for tests: start, talk to its REST API, wait on conditions, stop.

The standalone runs api-server, scheduler (LocalExecutor), dag-processor and triggerer in one
process tree, with its own temporary ``AIRFLOW_HOME``, a PostgreSQL metadata database, free ports
(API, log servers) and a dags folder holding only the DAG files the test names.

It is started in a new session (``setsid``) with SIGINT restored to its default, because a process
started in the background inherits an ignored SIGINT, and ``airflow standalone`` stops cleanly
only on SIGINT (KeyboardInterrupt), which it turns into SIGTERM for its components. :meth:`stop`
sends SIGINT to its pid, waits with a deadline, then ends whatever is left of the processes it
started, by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

from devtools import airflow_env

T = TypeVar("T")

PASSWORD_FILE = "simple_auth_manager_passwords.json.generated"


class WaitTimeout(AssertionError):
    """A condition did not hold before its deadline."""


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Call ``condition`` until it returns something truthy; return it. Fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except (httpx.HTTPError, OSError) as exc:  # a component is still starting or restarting
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f"; last error: {last_error!r}" if last_error else ""
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}{detail}{extra}")
        time.sleep(interval)


def kill(processes: Iterable[psutil.Process], *, timeout: float) -> None:
    """SIGKILL each process still there, and wait up to ``timeout`` for them to go."""
    processes = list(processes)
    for proc in processes:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(processes, timeout=timeout)


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiClient:
    """The public REST API (``/api/v2``) with a JWT from ``/auth/token``."""

    def __init__(self, base_url: str, username: str, password: str):
        self.base_url = base_url.rstrip("/")
        self._username, self._password = username, password
        self._http = httpx.Client(base_url=self.base_url, timeout=30.0)
        self._token: str | None = None

    def login(self) -> None:
        response = self._http.post("/auth/token", json={"username": self._username, "password": self._password})
        response.raise_for_status()
        self._token = response.json()["access_token"]

    def request(self, method: str, path: str, *, expect: Iterable[int] = (200,), **kwargs: Any) -> Any:
        if self._token is None:
            self.login()
        url = path if path.startswith("/auth") else f"/api/v2{path}"
        response = self._http.request(method, url, headers={"Authorization": f"Bearer {self._token}"}, **kwargs)
        if response.status_code == 401:  # the token expired
            self.login()
            response = self._http.request(method, url, headers={"Authorization": f"Bearer {self._token}"}, **kwargs)
        if response.status_code not in tuple(expect):
            raise AssertionError(f"{method} {url} -> {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    # -- what the UI does ------------------------------------------------------------------------

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, *, run_id: str, conf: dict[str, Any] | None = None) -> dict[str, Any]:
        """A manual run without a logical date (its slot is the run id)."""
        return self.request(
            "POST", f"/dags/{dag_id}/dagRuns", json={"dag_run_id": run_id, "logical_date": None, "conf": conf or {}}
        )

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    def task_try(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> dict[str, Any] | None:
        """One try of a task instance (the current try included), or None if it does not exist yet."""
        response = self.request(
            "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries/{try_number}", expect=(200, 404)
        )
        return response if response and "try_number" in response else None

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}")

    def run_state(self, dag_id: str, run_id: str, states: tuple[str, ...] = ("success", "failed"), *,
                  timeout: float, interval: float = 0.5, what: str | None = None,
                  on_timeout: Callable[[], str] | None = None) -> str:
        """Wait until the DAG run's state is one of ``states``; return it."""
        return wait_for(lambda: (s := self.dag_run(dag_id, run_id)["state"]) in states and s, timeout=timeout,
                        interval=interval, what=what or f"DAG run {run_id} to reach {states}", on_timeout=on_timeout)

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str, map_index: int | None = None) -> Any:
        """Mark a task instance ``failed`` / ``success``, as the UI's buttons do."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        if map_index is not None:
            path += f"/{map_index}"
        return self.request("PATCH", path, json={"new_state": state})

    def clear(self, dag_id: str, run_id: str, task_ids: list[str]) -> Any:
        """Clear task instances of one run, as the UI's Clear button does."""
        return self.request(
            "POST",
            f"/dags/{dag_id}/clearTaskInstances",
            json={"dry_run": False, "dag_run_id": run_id, "task_ids": task_ids, "only_failed": False,
                  "reset_dag_runs": True},
        )

    def close(self) -> None:
        self._http.close()


class Standalone:
    """One ``airflow standalone`` and its temporary home.

    :param metadata_uri: SQLAlchemy URI of the (empty) metadata database.
    :param dag_files: DAG files to put into the dags folder (symlinked).
    :param env: extra environment (``AIRFLOW__...`` settings, ``AIRFLOW_CONN_...`` connections).
    """

    #: The ``airflow`` command it runs, and the components ``/api/v2/monitor/health`` must call healthy.
    command: tuple[str, ...] = ("standalone",)
    components: tuple[str, ...] = ("metadatabase", "scheduler", "dag_processor", "triggerer")

    def __init__(self, *, metadata_uri: str, dag_files: Iterable[Path], env: dict[str, str] | None = None):
        self.home = Path(tempfile.mkdtemp(prefix="resumable-standalone-"))
        self.dags = self.home / "dags"
        self.dags.mkdir()
        for path in dag_files:
            (self.dags / Path(path).name).symlink_to(Path(path).resolve())
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.home / "standalone.log"
        self.env = self._environment(metadata_uri, env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        #: Every process of the tree seen so far. psutil.Process remembers its creation time, so a
        #: pid reused by an unrelated process later is never taken for one of ours.
        self._tree: dict[tuple[int, float], psutil.Process] = {}
        self.api: ApiClient | None = None

    def _environment(self, metadata_uri: str, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_"))}
        bin_dir = str(Path(sys.executable).parent)  # `airflow standalone` runs `airflow <component>`
        env.update(airflow_env.environment(self.home, self.dags))
        env.update(
            {
                "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_uri,
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.base_url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                # A task whose DAG the worker fails to parse at start (seen on a loaded machine) is
                # rescheduled, not failed: retry after 5 s instead of Airflow's 60 s.
                "AIRFLOW__WORKERS__MISSING_DAG_RETRY_DELAY": "5",
                "NO_COLOR": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra)
        return env

    # -- life cycle ------------------------------------------------------------------------------

    def start(self, *, timeout: float = 240.0) -> Standalone:
        """Start it and wait until the API answers and scheduler, dag-processor and triggerer are healthy."""
        self._log_file = open(self.log_path, "ab")

        def child_setup() -> None:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job inherits SIGINT ignored

        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), *self.command],
            env=self.env,
            cwd=self.home,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # setsid: signals sent to the test's group do not reach it
            preexec_fn=child_setup,
        )
        self._remember(psutil.Process(self.process.pid))
        wait_for(self._healthy, timeout=timeout, interval=1.0, what="airflow standalone to become healthy",
                 on_timeout=self.tail)
        self.api = ApiClient(self.base_url, "admin", self.admin_password())
        self.api.login()
        return self

    def _healthy(self) -> bool:
        self._remember_children()
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"airflow standalone exited with {self.process.returncode}\n{self.tail()}")
        if not (self.home / PASSWORD_FILE).exists():
            return False
        health = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
        return all((health.get(component) or {}).get("status") == "healthy" for component in self.components)

    def admin_password(self) -> str:
        passwords = json.loads((self.home / PASSWORD_FILE).read_text())
        return passwords["admin"]

    def _remember(self, proc: psutil.Process) -> None:
        try:
            self._tree.setdefault((proc.pid, proc.create_time()), proc)
        except psutil.Error:
            pass

    def _remember_children(self) -> None:
        """Note every process of the tree, so :meth:`stop` can end stragglers by pid."""
        if self.process is None:
            return
        try:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self._remember(child)
        except psutil.Error:
            pass

    def stop(self, *, timeout: float = 90.0) -> None:
        """SIGINT to the standalone (it stops its components), then end leftovers by pid."""
        if self.api is not None:
            self.api.close()
        self._remember_children()
        survivors = [proc for proc in self._tree.values() if proc.is_running()]
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        gone, alive = psutil.wait_procs(survivors, timeout=15)
        kill(alive, timeout=5)
        if self._log_file is not None:
            self._log_file.close()

    def cleanup(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def close(self) -> None:
        """Stop it and remove its home, unless ``RESUMABLE_TEST_KEEP_HOME`` asks to keep it."""
        self.stop()
        if os.environ.get("RESUMABLE_TEST_KEEP_HOME"):
            print(f"\n{type(self).__name__} home kept: {self.home}")
        else:
            self.cleanup()

    def serve(self, dag_ids: Iterable[str], *, timeout: float = 120.0) -> None:
        """Wait until the dag-processor has parsed each DAG, then unpause it (new DAGs start paused)."""
        api = self.api
        assert api is not None
        for dag_id in dag_ids:
            wait_for(
                lambda dag_id=dag_id: api.request("GET", f"/dags/{dag_id}", expect=(200, 404)).get("dag_id"),
                timeout=timeout, interval=1.0, what=f"the dag-processor to parse {dag_id}", on_timeout=self.tail,
            )
            api.unpause(dag_id)

    # -- inspection ------------------------------------------------------------------------------

    def tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no standalone log)"
        return "--- airflow standalone (last lines) ---\n" + "\n".join(text[-lines:])

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> str:
        """The task's log file for one try, as written by the worker (empty if none yet)."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        if map_index >= 0:
            folder = folder / f"map_index={map_index}"
        path = folder / f"attempt={try_number}.log"
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    def processes_of(self, ti_id: str) -> tuple[psutil.Process, psutil.Process]:
        """The running task process of a task instance try and its supervisor (the executor's worker).

        The task process sets its title to ``airflow worker -- <ti id>``; its parent, the LocalExecutor
        worker that supervises it, has ``airflow worker -- LocalExecutor: <ti id>``.
        """
        self._remember_children()
        for proc in self._tree.values():
            try:
                if not proc.is_running():
                    continue
                title = " ".join(proc.cmdline())
                parent = proc.parent()
            except psutil.Error:
                continue
            if title.strip() == f"airflow worker -- {ti_id}":
                if parent is None:
                    raise AssertionError(f"the task process {proc.pid} of {ti_id} has no parent")
                return proc, parent
        raise LookupError(f"no task process for task instance {ti_id}")


class ApiServer(Standalone):
    """Only ``airflow api-server``, one worker, on a migrated metadata database: for tests of the
    REST API that need a real server but no scheduler (a fraction of a standalone's processes)."""

    command = ("api-server", "--workers", "1")
    components = ("metadatabase",)

    def start(self, *, timeout: float = 240.0) -> ApiServer:
        """Migrate the metadata database (a standalone does it itself), then start and wait as
        :meth:`Standalone.start` does."""
        migrate = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=self.env,
                                 cwd=self.home, capture_output=True, text=True, timeout=600)
        if migrate.returncode != 0:
            raise AssertionError(f"airflow db migrate failed:\n{migrate.stdout[-3000:]}\n{migrate.stderr[-3000:]}")
        super().start(timeout=timeout)
        return self
