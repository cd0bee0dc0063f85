"""Draining on a worker's shutdown, without a deployment: the keeper's stop sources and the Celery
hooks that feed one (tests/integration/test_celery.py drives the same path on real Celery workers)."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_resumable.core import Attempt, Cancelled, Options
from airflow_resumable.core.attempt.lease import STOP_POLL, add_stop_source, remove_stop_source
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import SQLiteStore, Store


def test_a_stop_source_stops_the_run_at_its_next_chunk_boundary_with_its_reason(tmp_path: Path) -> None:
    """Given a long lease (heartbeats every 20 s), a stop source is still heard within about a second."""
    store = SQLiteStore(tmp_path / "checkpoints.db")
    asked = threading.Event()

    def source() -> tuple[str, str] | None:
        return ("shutdown", "the worker is shutting down") if asked.is_set() else None

    def handler(ctx) -> None:
        for i in range(ctx.position or 0, 10_000):
            ctx.checkpoint(i + 1, processed=i + 1)
            if i == 3:
                asked.set()
                asked.at = time.monotonic()  # type: ignore[attr-defined]
            ctx.signal.wait(0.05)

    add_stop_source(source)
    try:
        with pytest.raises(Cancelled) as raised:
            Attempt(
                store, Identity(job="drain", slot="s1", attempt=1, owner="a1"), options=Options(lease=60),
            ).run(handler)
    finally:
        remove_stop_source(source)
    took = time.monotonic() - asked.at  # type: ignore[attr-defined]
    assert raised.value.reason == "shutdown"
    assert took < STOP_POLL + 1.0, f"stopped {took:.2f}s after the source asked"
    with store.open() as session:
        row = session.checkpoints.load("drain", "s1")
    assert row is not None and (row.status, row.stop_reason) == ("cancelled", "shutdown"), row
    assert row.position == row.processed and row.position >= 4, row
    assert row.lease_owner is None, "the slot is free for the retry"


def test_a_failing_stop_source_does_not_stop_the_heartbeats(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "checkpoints.db")

    def broken() -> None:
        raise RuntimeError("boom")

    add_stop_source(broken)  # type: ignore[arg-type]
    try:
        outcome = Attempt(
            store, Identity(job="drain", slot="s2", attempt=1, owner="a1"), options=Options(lease=0.6),
        ).run(lambda ctx: ctx.signal.wait(1.5) or "done")
    finally:
        remove_stop_source(broken)  # type: ignore[arg-type]
    assert outcome.result == "done"


def test_the_celery_hooks_raise_the_drain_flag_of_their_own_worker_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_resumable.executors import celery as drain

    monkeypatch.setenv(drain.DRAIN_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(drain.DRAIN_FILE_ENV, raising=False)
    assert drain.draining() is None, "outside a worker nothing drains"
    stale = drain.drain_file("worker-a@host")
    stale.touch()  # left by a worker that had this pid before

    drain._on_worker_init(sender=SimpleNamespace(hostname="worker-a@host"))
    assert os.environ[drain.DRAIN_FILE_ENV] == str(stale) and not stale.exists()
    assert drain.draining() is None
    other = drain.drain_file("worker-b@host")
    other.touch()  # another worker on the machine shutting down
    assert drain.draining() is None

    drain._on_worker_shutting_down(sig="SIGTERM", how="Warm", exitcode=0)
    assert drain.draining() == ("shutdown", "the Celery worker is shutting down: stopping at the chunk boundary")
    drain._on_worker_shutdown()
    assert not stale.exists() and drain.draining() is None


def test_the_drain_config_is_airflow_s_default_celery_config() -> None:
    """Pointing [celery] celery_config_options at it changes nothing but loading the hooks."""
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    from airflow_resumable.core.attempt.lease import _STOP_SOURCES
    from airflow_resumable.executors.celery import CELERY_CONFIG, draining

    assert CELERY_CONFIG == DEFAULT_CELERY_CONFIG
    assert draining in _STOP_SOURCES


def test_a_drain_raised_while_waiting_for_another_holders_lease_stops_the_wait_as_a_shutdown(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_resumable.executors import celery as drain

    # Given a slot another live attempt holds for ten minutes, and this worker's drain flag named
    flag = tmp_path / "drain-flag"
    monkeypatch.setenv(drain.DRAIN_FILE_ENV, str(flag))
    with store.open() as s:
        s.ensure_schema()
        held = s.leases.acquire("drain", "s3", "other-holder", 600).row  # type: ignore[union-attr]
    lines: list[str] = []
    log = logging.getLogger("test_drain.waiting")
    log.addHandler(_Lines(lines))
    waiter = Attempt(store, Identity(job="drain", slot="s3", attempt=2, owner="a2"), options=Options(lease=60), log=log)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            waiter.run(lambda ctx: pytest.fail("the handler must not run"))
            outcome.append(None)
        except BaseException as exc:  # reported to the test below
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not any("slot is held by other-holder" in line for line in lines):
        assert time.monotonic() < deadline and thread.is_alive(), f"the attempt did not wait for the lease: {outcome}"
        time.sleep(0.01)
    # When the worker begins shutting down while the attempt waits (it would wait about 80 s)
    flag.touch()
    asked = time.monotonic()
    thread.join(timeout=STOP_POLL + 5)
    # Then it stops waiting within about a second, as a (retryable) shutdown, and writes nothing
    took = time.monotonic() - asked
    assert not thread.is_alive(), "the attempt went on waiting for the lease after the drain flag was raised"
    assert took < STOP_POLL + 1.5, f"stopped {took:.2f}s after the flag"
    assert isinstance(outcome[0], Cancelled) and outcome[0].reason == "shutdown", outcome
    assert any("stopped waiting for this slot's lease" in line and "shutdown" in line for line in lines)
    with store.open() as s:
        row = s.checkpoints.load("drain", "s3")
    assert (row.status, row.lease_owner, row.lease_token) == ("running", "other-holder", held.lease_token)


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
