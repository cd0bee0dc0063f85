"""A Kubernetes pod without a cluster: the KubernetesExecutor's pod command on a host of its own,
and a node drain's eviction (SIGTERM to the main process, SIGKILL to every process of the pod once
``terminationGracePeriodSeconds`` ran out).

The KubernetesExecutor (cncf.kubernetes provider, Airflow 3) starts each task in a pod whose main
process is ``python -m airflow.sdk.execution_time.execute_workload --json-string <workload>``: the
task SDK's supervisor, which runs the task process and heartbeats through the Execution API. Here
the task's queue has no worker: :func:`next_workload` takes the task's message from the broker as a
pod would get it from the executor, and :class:`Pod` runs that command on a host of the network.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from support.celery_cluster import redis_client
from support.chaos.hosts import Host, _pids_in
from support.standalone import wait_for

POD_COMMAND = ["-m", "airflow.sdk.execution_time.execute_workload", "--json-string"]


def next_workload(queue: str, *, redis_db: int, timeout: float = 180.0) -> str:
    """The next task message the scheduler sent to ``queue``, taken off the broker: its workload JSON."""
    client = redis_client(redis_db)

    def popped() -> bytes | None:
        return client.rpop(queue)

    raw = wait_for(popped, timeout=timeout, interval=0.2, what=f"a task message on queue {queue!r}")
    message = json.loads(raw)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, _kwargs, _embed = json.loads(body)
    return args[0]


class Pod:
    """One pod: its main process and everything it started, on ``host``."""

    def __init__(self, host: Host, argv: list[str], env: dict[str, str], log_path: Path):
        self.host, self.log_path = host, log_path
        self._log = open(log_path, "ab")
        self.process = subprocess.Popen(host.argv(*argv), env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)

    @classmethod
    def task(cls, host: Host, workload: str, env: dict[str, str], log_path: Path) -> Pod:
        """The KubernetesExecutor's pod for ``workload``."""
        return cls(host, [sys.executable, *POD_COMMAND, workload], env, log_path)

    def processes(self) -> list[psutil.Process]:
        """Every process of the pod: all processes on its host (a pod's cgroup)."""
        procs = []
        for pid in _pids_in(self.host.ns):
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        return procs

    def evict(self, grace: float, *, signal_to: str = "main") -> dict[str, float]:
        """A node drain: SIGTERM to the main process (``group``: its process group, as dumb-init in
        setsid mode forwards it), SIGKILL to every process of the pod after ``grace`` seconds.

        Returns the monotonic times: ``sigterm``, ``exited`` (the main process, if before the
        SIGKILL), ``sigkill`` (if it was needed)."""
        times = {"sigterm": time.monotonic()}
        if signal_to == "group":
            os_killpg(self.process.pid, signal.SIGTERM)
        else:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
            times["exited"] = time.monotonic()
        except subprocess.TimeoutExpired:
            pass
        leftovers = self.processes()
        if leftovers or "exited" not in times:
            times["sigkill"] = time.monotonic()
            for proc in leftovers:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(leftovers, timeout=30)
            self.process.wait(timeout=30)
        self._log.close()
        return times

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def os_killpg(pgid: int, sig: int) -> None:
    import os

    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
