"""The chaos suite's deployment: :class:`~support.celery_cluster.CeleryDeployment` with each Celery
worker on a host of its own and the checkpoint database on another (see :mod:`.hosts`).

The workers reach the broker, the metadata database and the API server through relays on the
bridge's address; everything else (scheduler, api-server, dag-processor, triggerer) stays in the
root namespace. :func:`chaos_cluster` builds all of it and removes all of it, even on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg2

from airflow_resumable.core.stores import PostgresStore
from support.celery_cluster import REDIS_PORT, CeleryDeployment, Component, redis_client
from support.chaos.hosts import STATE_DIR, HostPostgres, Network
from support.chaos.workloads import REBALANCE_ITEMS
from support.standalone import free_port

ROOT = Path(__file__).resolve().parents[3]
DAG_FILE = ROOT / "tests" / "dags" / "chaos_dags.py"
#: The workers' hosts (namespaces) by worker name.
WORKER_HOSTS = {"worker-a": "w1", "worker-b": "w2"}
#: [scheduler] task_instance_heartbeat_timeout: a partitioned or frozen worker's task is failed and
#: retried after this long.
HEARTBEAT_TIMEOUT = 15
#: [scheduler] task_queued_timeout and its check interval: a task message a SIGKILLed worker had
#: taken off the broker (Celery's prefetch; Redis gives it back only after its visibility timeout)
#: leaves its task instance ``queued``; the scheduler requeues it after this long (600 s + 120 s by
#: default: longer than a trial, which then looked stuck, seed 599763).
TASK_QUEUED_TIMEOUT, TASK_QUEUED_CHECK = 90, 10
#: Seconds unacknowledged data may wait on a connection to the checkpoint database before the
#: connection gives up (libpq's ``tcp_user_timeout``, in every connection of the workers): a link
#: cut longer than this fails the attempt's statements instead of stalling them until TCP gives up
#: (about 15 minutes), so a cut that outlasts the lease costs the attempt.
TCP_USER_TIMEOUT = 6
#: The connection's query string that sets it.
TCP_OPTIONS = f"tcp_user_timeout={TCP_USER_TIMEOUT * 1000}"
TABLES = (
    "CREATE TABLE chaos_tx_log (job TEXT NOT NULL, slot TEXT NOT NULL, item INTEGER NOT NULL, attempt INTEGER NOT "
    "NULL, token BIGINT NOT NULL, runs INTEGER NOT NULL, pid INTEGER NOT NULL, "
    "written_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE chaos_plain_log (LIKE chaos_tx_log INCLUDING DEFAULTS)",
    "CREATE TABLE chaos_upsert (job TEXT NOT NULL, slot TEXT NOT NULL, item INTEGER NOT NULL, attempt INTEGER NOT "
    "NULL, PRIMARY KEY (job, slot, item))",
    # chaos_rebalance's source: the ids its partitions split (support.chaos.workloads.REBALANCE_ITEMS)
    "CREATE TABLE chaos_source (id INTEGER PRIMARY KEY)",
    f"INSERT INTO chaos_source (id) SELECT g FROM generate_series(0, {REBALANCE_ITEMS - 1}) AS g",
)


class ChaosDeployment(CeleryDeployment):
    """Celery workers started on their hosts, talking to the root namespace through the relays."""

    def host_env(self) -> dict[str, str]:
        """The environment of an Airflow process on one of the hosts (a worker, a pod)."""
        return {**self.env, **self.worker_env,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{self.network.gateway}:{self.port}/execution/"}

    def __init__(self, *, network: Network, worker_env: dict[str, str], proxies: dict[str, Proxy] | None = None,
                 **kwargs: Any):
        self.network = network
        self.worker_env = worker_env
        #: by host role: the proxy its workers reach the checkpoint database through
        self.proxies = proxies or {}
        super().__init__(**kwargs)

    def add_worker(self, name: str) -> Component:
        return self._on_host(super().add_worker(name))

    def _on_host(self, component: Component) -> Component:
        """``component`` started on its host (by its name, :data:`WORKER_HOSTS`)."""
        role = WORKER_HOSTS[component.name]
        host = self.network.hosts[role]
        component.argv = host.argv(*component.argv)  # `ip netns exec` execs: the pid stays the worker's
        component.env = {**component.env, **self.host_env()}
        if role in self.proxies:
            component.env["AIRFLOW_CONN_RESUMABLE_DEFAULT"] = self.proxies[role].conn_uri
        return component

    def host_of(self, component: Component) -> str:
        return WORKER_HOSTS[component.name]


class LocalChaosDeployment(ChaosDeployment):
    """The second configuration: LocalExecutor task processes on the hosts. Two schedulers (Airflow's
    high availability: both schedule, locking rows of the metadata database), each on a host of its
    own with its LocalExecutor, so each runs its task processes there; the root namespace keeps the
    api-server, dag-processor and triggerer. The faults' "workers" ``worker-a`` and ``worker-b`` are
    these schedulers: a kill is a lost node, a deploy is a scheduler's SIGTERM (its LocalExecutor waits
    for its running tasks), and the other scheduler adopts a dead one's queued tasks."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.env.update({
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "6",
            # a dead scheduler's tasks are adopted (reset and queued again) by the other soon
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
        })

    def _component(self, name: str, *args: str, env: dict[str, str] | None = None) -> Component:
        if name == "scheduler":  # the root namespace's scheduler: the hosts' replace it (not registered)
            return Component(name, [], {}, self.home / "scheduler-unused.log")
        return super()._component(name, *args, env=env)

    def add_worker(self, name: str) -> Component:
        return self._on_host(self._component(
            name, "scheduler", env={"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}))

    worker_kind = "scheduler (LocalExecutor)"

    def worker_ready(self, name: str, log: str) -> bool:
        return "Starting the scheduler" in log


#: The deployments a trial can run on: ``--executor`` of ``make chaos``.
EXECUTORS: dict[str, type[ChaosDeployment]] = {"celery": ChaosDeployment, "local": LocalChaosDeployment}


PROXY = Path(__file__).with_name("proxy.py")
PROXY_PORT = 6543  # on each worker host's loopback: one per namespace, so no collision


@dataclass
class Proxy:
    """The TCP proxy on a worker's host to the checkpoint database (:mod:`.proxy`): the ``lossy``
    fault's latency and loss."""

    role: str
    conn_uri: str
    control: Path
    process: subprocess.Popen[bytes]

    def degrade(self, **settings: float) -> None:
        """Latency, loss and stalls from now on (see :mod:`.proxy`); :meth:`heal` ends them."""
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps({"on": 1, **settings}))
        tmp.replace(self.control)

    def heal(self) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text("{}")
        tmp.replace(self.control)


def start_proxy(network: Network, role: str, address: str, port: int, state: Path) -> Proxy:
    """The proxy on host ``role`` to ``address:port`` (its control file in ``state``)."""
    control = state / f"proxy-{role}.json"
    control.write_text("{}")
    host = network.hosts[role]
    proc = subprocess.Popen(host.argv(sys.executable, str(PROXY), str(PROXY_PORT), address, str(port), str(control),
                                      str(TCP_USER_TIMEOUT)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    network.remember(proc.pid)
    probe = f"import socket; socket.create_connection(('127.0.0.1', {PROXY_PORT}), timeout=2).close()"
    deadline = time.monotonic() + 30
    while subprocess.run(host.argv(sys.executable, "-c", probe), capture_output=True).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the proxy on {role} did not start")
        time.sleep(0.2)
    return Proxy(role, f"postgresql://postgres@127.0.0.1:{PROXY_PORT}/chaos?{TCP_OPTIONS}", control, proc)


@dataclass
class Chaos:
    network: Network
    db: HostPostgres
    cluster: ChaosDeployment
    store: PostgresStore
    conn_uri: str  # the checkpoint database, as the root namespace's connection names it
    proxies: dict[str, Proxy]  # by worker host role: the workers' way to the checkpoint database
    metadata_dsn: str = ""  # Airflow's metadata database (the root namespace's server)

    def connect(self) -> Any:
        conn = psycopg2.connect(self.conn_uri, connect_timeout=10)
        conn.autocommit = True
        return conn


def _metadata_database(admin_dsn: str) -> tuple[str, int]:
    import uuid

    name = f"resumable_chaos_meta_{uuid.uuid4().hex[:8]}"
    with closing(psycopg2.connect(admin_dsn)) as conn:
        conn.autocommit = True
        conn.cursor().execute(f'CREATE DATABASE "{name}"')
    return name, urlsplit(admin_dsn).port or 5432


def _warm_up_control() -> None:
    """Import and use the control API once now: its first call imports Airflow (seconds on a loaded
    machine), which must not delay the first request fault past its moment."""
    from airflow_resumable import control
    from airflow_resumable.core.model.errors import SlotNotFound

    try:
        control.get("chaos-warm-up", "none")
    except SlotNotFound:
        pass


@contextmanager
def chaos_cluster(admin_dsn: str, *, redis_db: int = 11, extra_hosts: dict[str, int] | None = None,
                  dag_ids: list[str] | None = None, executor: str = "celery") -> Iterator[Chaos]:
    """The network, the database host, the deployment; all removed on exit, even on failure.

    :param admin_dsn: the metadata database's server (PostgreSQL on the root namespace).
    :param redis_db: the broker's database (flushed): one per suite that may run at the same time.
    :param extra_hosts: more hosts (role -> last octet of the address), e.g. a pod's.
    :param dag_ids: the DAGs to unpause (default: the trials' workloads).
    :param executor: ``celery`` (Celery workers on the hosts) or ``local`` (schedulers with their
        LocalExecutor on the hosts: :class:`LocalChaosDeployment`).
    """
    from support.chaos.trials import STOPPING

    STOPPING.clear()
    redis_client(redis_db)
    network = Network()
    db: HostPostgres | None = None
    cluster: ChaosDeployment | None = None
    meta_name = None
    try:
        network.open({"db": 2, "w1": 11, "w2": 12, **(extra_hosts or {})})
        db = HostPostgres(network.hosts["db"]).start()
        with closing(psycopg2.connect(db.admin_dsn)) as conn:
            conn.autocommit = True
            conn.cursor().execute("CREATE DATABASE chaos")
        conn_uri = f"postgresql://postgres@{db.host.address}:{db.port}/chaos?{TCP_OPTIONS}"
        with closing(psycopg2.connect(conn_uri)) as conn:
            conn.autocommit = True
            for statement in TABLES:
                conn.cursor().execute(statement)
        meta_name, meta_port = _metadata_database(admin_dsn)
        meta_host = urlsplit(admin_dsn).hostname
        relay_meta = free_port()
        proxies = {role: start_proxy(network, role, db.host.address, db.port, STATE_DIR / network.tag)
                   for role in WORKER_HOSTS.values()}
        network.relay(REDIS_PORT)
        network.relay(relay_meta, meta_port)
        metadata_uri = f"postgresql+psycopg2://postgres@{meta_host}:{meta_port}/{meta_name}"
        worker_meta = f"postgresql+psycopg2://postgres@{network.gateway}:{relay_meta}/{meta_name}"
        cluster = EXECUTORS[executor](
            network=network,
            proxies=proxies,
            worker_env={
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": worker_meta,
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + worker_meta,
                "AIRFLOW__CELERY__BROKER_URL": f"redis://{network.gateway}:{REDIS_PORT}/{redis_db}",
            },
            metadata_uri=metadata_uri,
            dag_files=[DAG_FILE],
            redis_db=redis_db,
            env={
                "AIRFLOW_CONN_RESUMABLE_DEFAULT": conn_uri,
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(TASK_QUEUED_TIMEOUT),
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": str(TASK_QUEUED_CHECK),
                "AIRFLOW__CORE__PARALLELISM": "8",
            },
        )
        network.relay(cluster.port)  # the Execution API, for the task supervisors on the workers' hosts
        cluster.start()
        for component in cluster.components.values():  # a crashed run's next run ends them (sweep)
            if component.process is not None:
                network.remember(component.pid)
        from support.chaos.workloads import DAG_IDS

        cluster.serve(dag_ids or DAG_IDS)
        store = PostgresStore(host=db.host.address, port=db.port, user="postgres", dbname="chaos")
        with store.open(autocommit=True) as session:
            session.ensure_schema()
        os.environ["AIRFLOW_CONN_RESUMABLE_DEFAULT"] = conn_uri  # airflow_resumable.control, in this process
        _warm_up_control()
        yield Chaos(network=network, db=db, cluster=cluster, store=store, conn_uri=conn_uri, proxies=proxies,
                    metadata_dsn=f"postgresql://postgres@{meta_host}:{meta_port}/{meta_name}")
    finally:
        STOPPING.set()
        if cluster is not None:
            for name in WORKER_HOSTS:  # a frozen or cut-off worker cannot stop: thaw and reconnect first
                if name in cluster.components:
                    from support.chaos.faults import thaw

                    thaw(cluster.components[name])
            for role in WORKER_HOSTS.values():
                try:
                    network.link(role, up=True)
                except RuntimeError:
                    pass
            cluster.close()
        for proxy in (cluster.proxies if cluster is not None else {}).values():
            proxy.process.kill()
            proxy.process.wait(timeout=10)
        if db is not None:
            db.stop()
        network.close()
        if meta_name is not None:
            try:
                with closing(psycopg2.connect(admin_dsn)) as conn:
                    conn.autocommit = True
                    conn.cursor().execute(f'DROP DATABASE IF EXISTS "{meta_name}" WITH (FORCE)')
            except psycopg2.Error:
                pass


if __name__ == "__main__":  # pragma: no cover - a manual check of the topology
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
