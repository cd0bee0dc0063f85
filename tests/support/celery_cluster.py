"""A real CeleryExecutor deployment for tests: api-server, scheduler, dag-processor, triggerer and
two Celery workers, each its own process (and process group), on one machine.

It extends :class:`~support.standalone.Standalone` (the temporary home, the environment written
by ``devtools.airflow_env``, the REST client, the logs) with the processes a Celery deployment
runs instead of ``airflow standalone``:

- broker: Redis at ``redis://127.0.0.1:6379/<db>`` (a dedicated database number, flushed at start
  and stop); result backend and metadata: the PostgreSQL database given;
- workers ``worker-a`` and ``worker-b``: distinct Celery hostnames, pid files and log-server ports,
  concurrency 2, with the drain of :mod:`airflow_resumable.executors.celery` enabled through
  ``[celery] celery_config_options``;
- every process runs this checkout's ``airflow_resumable`` (``PYTHONPATH``), whatever the venv's
  editable install points at.

``python -m support.celery_cluster`` (``make celery``) starts one with the example DAGs to watch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import psutil

from support.standalone import Standalone, free_port, kill, wait_for

ROOT = Path(__file__).resolve().parents[2]
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
#: The Redis database the tests' broker uses (flushed): not 0, which others may use.
REDIS_DB = int(os.environ.get("RESUMABLE_TEST_REDIS_DB", "13"))
DRAIN_CONFIG = "airflow_resumable.executors.celery.CELERY_CONFIG"


def redis_client(db: int = REDIS_DB) -> Any:
    """A client of the broker's database; fails (never skips) when Redis does not answer."""
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise AssertionError(
            f"Redis does not answer at {REDIS_HOST}:{REDIS_PORT} ({exc!r}): the Celery tests need it as their "
            "broker. Start redis-server (apt-get install redis-server) and run them again."
        ) from exc
    return client


@dataclass
class Component:
    """One process of the deployment, started in its own session (its pid is its process group)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    #: Where this run of the component starts in its log (a restarted worker appends to it).
    log_offset: int = 0
    seen: dict[tuple[int, float], psutil.Process] = field(default_factory=dict)
    _log: IO[bytes] | None = None

    def start(self, cwd: Path) -> None:
        self._log = open(self.log_path, "ab")
        self.log_offset = self._log.tell()
        self.process = subprocess.Popen(
            self.argv, env=self.env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self.remember()

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was not started"
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def remember(self) -> None:
        """Note the process and its descendants, so :meth:`stop` can end stragglers by pid."""
        if not self.alive():
            return
        try:
            root = psutil.Process(self.pid)
            for proc in [root, *root.children(recursive=True)]:
                self.seen.setdefault((proc.pid, proc.create_time()), proc)
        except psutil.Error:
            pass

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []

    def log_text(self) -> str:
        """This run's log (after a restart, only the new process's lines)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log for {self.name})"
        return f"--- {self.name} (last lines) ---\n" + "\n".join(text[-lines:])

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to the component (a warm shutdown), then SIGKILL to whatever it left, by pid."""
        self.remember()
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        kill([proc for proc in self.seen.values() if proc.is_running()], timeout=10)
        if self.process is not None and self.process.poll() is None:
            self.process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


class CeleryDeployment(Standalone):
    """api-server, scheduler, dag-processor, triggerer and two Celery workers (concurrency 2).

    :param metadata_uri: SQLAlchemy URI (``postgresql+psycopg2://``) of an empty metadata database;
        the Celery result backend uses the same database.
    :param dag_files: DAG files for the dags folder.
    :param env: extra settings for every component.
    """

    WORKERS = ("worker-a", "worker-b")

    def __init__(
        self,
        *,
        metadata_uri: str,
        dag_files: Iterable[Path],
        env: dict[str, str] | None = None,
        redis_db: int = REDIS_DB,
        concurrency: int = 2,
        triggerer: bool = True,
    ):
        self.redis_db = redis_db
        celery_env = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + metadata_uri,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(concurrency),
            "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": DRAIN_CONFIG,
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
            # The scheduler runs a publisher; two workers x 2 slots; keep the rest small.
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        super().__init__(metadata_uri=metadata_uri, dag_files=dag_files, env={**celery_env, **(env or {})})
        self.env["AIRFLOW_RESUMABLE_DRAIN_DIR"] = str(self.home)
        self.concurrency = concurrency
        self.with_triggerer = triggerer
        self.components: dict[str, Component] = {}

    # -- life cycle ------------------------------------------------------------------------------

    def _component(self, name: str, *args: str, env: dict[str, str] | None = None) -> Component:
        airflow = str(Path(sys.executable).parent / "airflow")
        component = Component(name, [airflow, *args], {**self.env, **(env or {})}, self.home / f"{name}.log")
        self.components[name] = component
        return component

    def start(self, *, timeout: float = 240.0) -> CeleryDeployment:
        redis_client(self.redis_db).flushdb()
        migrate = subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
            env=self.env, cwd=self.home, capture_output=True, text=True,
        )
        if migrate.returncode != 0:
            raise AssertionError(f"airflow db migrate failed:\n{migrate.stdout[-3000:]}\n{migrate.stderr[-3000:]}")
        self._component("api-server", "api-server", "--port", str(self.port), "--host", "127.0.0.1")
        self._component("scheduler", "scheduler")
        self._component("dag-processor", "dag-processor")
        if self.with_triggerer:
            self._component("triggerer", "triggerer")
        for name in self.WORKERS:
            self.add_worker(name)
        for component in self.components.values():
            component.start(self.home)
        wait_for(self._healthy, timeout=timeout, interval=1.0, what="the Celery deployment to become healthy",
                 on_timeout=self.tail)
        for name in self.WORKERS:
            self.wait_worker_ready(name, timeout=timeout)
        from support.standalone import ApiClient

        self.api = ApiClient(self.base_url, "admin", self.admin_password())
        self.api.login()
        return self

    def add_worker(self, name: str) -> Component:
        """Define a Celery worker ``name`` (its own hostname, pid file and log-server port)."""
        return self._component(
            name, "celery", "worker",
            "--celery-hostname", f"{name}@%h",
            "--pid", str(self.home / f"{name}.pid"),
            "--concurrency", str(self.concurrency),
            "--queues", f"default,{name}",  # a queue of its own, for tasks that must run on it
            "--without-mingle", "--without-gossip",
            env={"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())},
        )

    #: What a worker is, in wait_worker_ready's timeout message.
    worker_kind = "Celery worker"

    def worker_ready(self, name: str, log: str) -> bool:
        """Whether worker ``name``'s log says it is ready to take tasks."""
        return f"{name}@" in log and " ready." in log

    def wait_worker_ready(self, name: str, timeout: float = 120.0) -> None:
        component = self.components[name]

        def ready() -> bool:
            if not component.alive():
                raise AssertionError(f"{name} exited with {component.process and component.process.returncode}\n"
                                     f"{component.tail()}")
            return self.worker_ready(name, component.log_text())

        wait_for(ready, timeout=timeout, interval=0.5, what=f"{self.worker_kind} {name} to be ready",
                 on_timeout=component.tail)

    def _healthy(self) -> bool:
        for component in self.components.values():
            component.remember()
            if component.process is not None and component.process.poll() is not None:
                raise AssertionError(f"{component.name} exited with {component.process.returncode}\n{self.tail()}")
        if not (self.home / "simple_auth_manager_passwords.json.generated").exists():
            return False
        health = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
        wanted = ("metadatabase", "scheduler", "dag_processor", *(("triggerer",) if self.with_triggerer else ()))
        return all((health.get(c) or {}).get("status") == "healthy" for c in wanted)

    def stop(self, *, timeout: float = 60.0) -> None:
        """Workers first (warm shutdown), then the rest; leftovers are killed by pid."""
        if self.api is not None:
            self.api.close()
        for component in sorted(self.components.values(), key=lambda c: c.name not in self.WORKERS):
            component.stop(timeout=timeout)
        try:
            redis_client(self.redis_db).flushdb()
        except AssertionError:
            pass

    # -- inspection ------------------------------------------------------------------------------

    def tail(self, lines: int = 30) -> str:
        return "\n".join(c.tail(lines) for c in self.components.values())

    def worker_running(self, ti: dict[str, Any]) -> Component:
        """The worker whose process tree runs the task process of ``ti`` (by its reported pid)."""
        pid = ti.get("pid")
        if not pid:
            raise AssertionError(f"task instance {ti.get('id')} reports no pid: {ti}")
        try:
            ancestors = {p.pid for p in psutil.Process(pid).parents()}
        except psutil.NoSuchProcess as exc:
            raise AssertionError(f"the task process {pid} of {ti.get('id')} is gone") from exc
        for name in self.WORKERS:
            component = self.components.get(name)
            if component is not None and component.alive() and component.pid in ancestors:
                return component
        raise AssertionError(f"no worker runs the task process {pid} (ancestors {sorted(ancestors)})")

    def other_worker(self, component: Component) -> Component:
        (other,) = [self.components[n] for n in self.WORKERS if n != component.name]
        return other

    def crash(self, component: Component) -> float:
        """Kill the worker like a lost machine: SIGKILL its process group and the process groups of
        the task processes it started (the task runner has its own group), all at once.

        Returns the monotonic time of the kill."""
        component.remember()
        groups = {component.pid}
        for proc in component.descendants():
            try:
                groups.add(os.getpgid(proc.pid))
            except OSError:
                pass
        killed = time.monotonic()
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert component.process is not None
        component.process.wait(timeout=30)
        psutil.wait_procs([p for p in component.seen.values() if p.is_running()], timeout=30)
        return killed

    def restart_worker(self, component: Component) -> None:
        """Start a stopped worker again under the same name (a fresh process, a fresh log-server port)."""
        assert not component.alive(), f"{component.name} still runs"
        component.stop()  # closes its log, ends stragglers
        fresh = self.add_worker(component.name)
        with open(fresh.log_path, "ab") as log:
            log.write(f"\n----- {component.name} restarted -----\n".encode())
        fresh.start(self.home)
        self.wait_worker_ready(component.name)


def main() -> None:
    """``make celery``: a deployment with the example DAGs, until Ctrl-C."""
    from devtools.postgres import Server, dsn

    server = Server().start()
    metadata = server.create_database("resumable_celery_meta")
    checkpoints = server.create_database("resumable_celery_ckpt")
    deployment = CeleryDeployment(
        metadata_uri=dsn(metadata).replace("postgresql://", "postgresql+psycopg2://", 1),
        dag_files=sorted((ROOT / "dags").glob("*.py")),
        env={"AIRFLOW_CONN_RESUMABLE_DEFAULT": dsn(checkpoints)},
        redis_db=12,  # not the tests' database: both may run at once
    )
    print(f"starting in {deployment.home} (logs there: api-server.log, scheduler.log, worker-a.log, worker-b.log)")
    try:
        deployment.start()
        print(f"\nUI: {deployment.base_url}  user admin, password in "
              f"{deployment.home / 'simple_auth_manager_passwords.json.generated'}")
        print("workers: " + ", ".join(f"{n} pid {deployment.components[n].pid}" for n in deployment.WORKERS))
        print("kill -TERM <worker pid> drains it (its resumable tasks stop at a chunk boundary and retry on the "
              "other worker). Ctrl-C stops everything.")
        while all(c.alive() for n, c in deployment.components.items() if n not in deployment.WORKERS):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping...")
        deployment.stop()
        server.stop()
        deployment.cleanup()


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    main()
