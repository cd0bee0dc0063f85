"""Metrics through Airflow's ``Stats`` to a real StatsD listener (a UDP socket in this test).

``[metrics] statsd_on`` points Airflow at the listener; ``Stats`` is initialized as the task
runner does in a worker (``dag.test()`` runs tasks in this process, where nobody else does).

The DAG run's test runs on one store (``one_store``: SQLite): it asserts what reaches StatsD, which
no store takes part in (the store contract suite owns the stores' equality).
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable.core import Store
from airflow_resumable.core.model.checkpoint import Checkpoint

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)


class StatsD:
    """A StatsD server that keeps what it receives: ``name:value|type`` lines."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except OSError:
                continue
            self.lines.extend(data.decode().splitlines())

    def metrics(self, prefix: str = "airflow.resumable.") -> list[tuple[str, float, str]]:
        out = []
        for line in list(self.lines):
            name, _, rest = line.partition(":")
            if name.startswith(prefix):
                value, _, kind = rest.partition("|")
                out.append((name[len("airflow."):], float(value), kind.split("|")[0]))
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsD]:
    from airflow_resumable.version_compat import AIRFLOW_V_3_2_PLUS, AIRFLOW_V_3_3_PLUS

    server = StatsD()
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(server.port))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    if not AIRFLOW_V_3_2_PLUS:  # Airflow 3.1: airflow.stats builds its backend from the settings on first use
        from airflow import stats as legacy
        from airflow.metrics import statsd_logger

        factory = legacy._Stats.__dict__.get("factory")
        legacy._Stats.factory = statsd_logger.get_statsd_logger
        legacy.Stats.instance = None
        try:
            yield server
        finally:
            if factory is not None:
                legacy._Stats.factory = factory
            legacy.Stats.instance = None
            server.close()
        return
    if not AIRFLOW_V_3_3_PLUS:  # Airflow 3.2: airflow.sdk's Stats class, its backend made as the task runner does
        from airflow.sdk._shared.observability.metrics.stats import Stats
        from airflow.sdk.observability.metrics import stats_utils as utils_3_2

        factory = Stats.factory
        Stats.initialize(factory=utils_3_2.get_stats_factory(Stats))
        try:
            yield server
        finally:
            Stats.initialize(factory=factory)
            server.close()
        return
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk.observability.metrics import stats_utils

    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)  # as the task runner does
    stats._backend = None  # built on first use, from the settings above
    try:
        yield server
    finally:
        stats._factory, stats._backend = None, None
        server.close()


def wait_for_metric(server: StatsD, name: str) -> list[tuple[str, float, str]]:
    from support.standalone import wait_for

    return wait_for(lambda: [m for m in server.metrics() if m[0] == name], timeout=10, interval=0.02,
                    what=f"metric {name}", on_timeout=lambda: "\n".join(server.lines[-50:]))


@pytest.mark.one_store("what reaches StatsD")
def test_a_run_reports_items_checkpoint_latency_cancels_and_done(checkpoints: Store, run_dag: Any,
                                                                   statsd: StatsD) -> None:
    # Given a task whose cooperative timeout cancels its first attempt; the retry finishes
    run = run_dag("rt_timeout", conf={"items": 24, "chunk": 2, "sleep": 0.15}, logical_date=DAY)
    assert str(run.state) == "success"
    # Then StatsD got: every item counted once, the checkpoints' save time, the cancel by reason, done
    wait_for_metric(statsd, "resumable.done")
    got = statsd.metrics()
    counts: Counter[str] = Counter()
    for name, value, kind in got:
        if kind == "c":
            counts[name] += int(value)
    assert counts["resumable.items_processed"] == 24
    assert counts["resumable.cancelled.timeout"] >= 1 and counts["resumable.done"] == 1
    timers = [value for name, value, kind in got if name == "resumable.checkpoint.duration" and kind == "ms"]
    assert timers and all(0 <= t < 10_000 for t in timers)


def test_pauses_and_lost_leases_are_counted(statsd: StatsD) -> None:
    from airflow_resumable.metrics import Metrics

    metrics = Metrics(dag_id="d", task_id="t")
    metrics.started(Checkpoint(job="j", slot="s", processed=10))
    metrics.finished(Checkpoint(job="j", slot="s", processed=30, status="paused", stop_reason="throttled"))
    metrics.lease_lost()
    wait_for_metric(statsd, "resumable.lease_lost")
    assert ("resumable.paused.throttled", 1.0, "c") in statsd.metrics()
    assert ("resumable.items_processed", 20.0, "c") in statsd.metrics()
