"""Pipelined checkpoints (``pipeline_checkpoints=True``): a checkpoint's durable write overlaps the
next chunk's work, one write in flight at most. A crash then repeats at most two chunks; fencing,
cancels and the final ``done`` behave as without it; ``ctx.transaction()`` is refused.

Against both stores.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from typing import Any

import psycopg2
import pytest

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.attempt.pipeline import THREAD_PREFIX
from airflow_resumable.core.model.errors import Cancelled, ConfigurationError, LeaseLost
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, Store
from support.descriptors import past_fd_setsize
from support.paths import SUPPORT
from support.stores import spec_of
from support.waits import wait_until

WORKER = SUPPORT / "pipeline_worker.py"
JOB, SLOT = "pipelined", "2026-01-01T00:00:00+00:00"


def attempt(store: Store, n: int = 1, owner: str = "a", **options: Any) -> Attempt:
    return Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=n, owner=owner),
        options=Options(pipeline_checkpoints=True, **options),
    )


def stored(store: Store) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, SLOT)


def test_a_crash_with_a_checkpoint_in_flight_repeats_at_most_two_chunks(store: Store, store_kind: str) -> None:
    # Given an attempt in another process, stepped chunk by chunk
    with store.open() as s:
        s.ensure_schema()
    proc = subprocess.Popen([sys.executable, str(WORKER), spec_of(store), JOB, SLOT, "6"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    blocker = store.session()
    try:
        def step(k: int) -> None:
            """Wait (bounded) until the worker is about to work on chunk ``k``."""
            poller = select.poll()
            poller.register(proc.stdout, select.POLLIN)
            assert poller.poll(60_000), f"the worker did not reach chunk {k}"
            line = proc.stdout.readline().strip()
            assert line == f"chunk {k}", line or proc.stderr.read()

        def go() -> None:
            proc.stdin.write("go\n")
            proc.stdin.flush()

        for k in (1, 2):
            step(k)
            go()
        step(3)
        wait_until(lambda: (stored(store).position or 0) == 2, "checkpoint 2")
        # When the database holds back chunk 3's checkpoint (a lock on the row) while chunk 4 runs
        if store_kind == "sqlite":
            blocker.execute("BEGIN IMMEDIATE")
        else:
            blocker.execute("SELECT 1 FROM resumable_checkpoints WHERE job = %s AND slot = %s FOR UPDATE", (JOB, SLOT))
        go()
        step(4)  # ctx.checkpoint(3) returned: its write is in flight
        assert stored(store).position == 2
        # and the process dies there (and with it the write in flight)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if store_kind == "postgres":  # the server side of the dead connection, waiting for the lock
            blocker.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                            "AND datname = current_database() AND wait_event_type = 'Lock'").fetchall()
        blocker.rollback()
    finally:
        blocker.close()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    # Then the next attempt resumes from checkpoint 2: chunks 3 and 4 run again, no more
    seen: list[int] = []

    def handler(ctx: Any) -> None:
        for k in range(ctx.position + 1, 7):
            seen.append(k)
            ctx.checkpoint(k, processed=k)

    outcome = Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=2, owner="b"), options=Options(lease=0.6),
    ).run(handler)
    assert outcome.resumed_from == 2 and seen == [3, 4, 5, 6] and outcome.checkpoint.position == 6
    repeated = [k for k in seen if k <= 4]  # chunks the dead attempt had worked on
    assert repeated == [3, 4]


def test_done_is_written_after_the_last_checkpoint_in_flight(store: Store) -> None:
    def handler(ctx: Any) -> str:
        for k in range(1, 21):
            ctx.state["sum"] = ctx.state.get("sum", 0) + k
            ctx.checkpoint(k, processed=k)
        return "ok"  # the 20th checkpoint may still be in flight here

    outcome = attempt(store).run(handler)
    row = stored(store)
    assert (row.status, row.position, row.processed, row.state, row.result) == ("done", 20, 20, {"sum": 210}, "ok")
    assert outcome.checkpoint.position == 20 and row.lease_owner is None


def test_a_worker_holding_more_than_1024_open_files_pipelines_its_checkpoints(store: Store) -> None:
    # Given a worker process whose next connection's socket is numbered past select()'s 1,024
    def handler(ctx: Any) -> str:
        for k in range(1, 6):
            ctx.checkpoint(k, processed=k)
        return "ok"

    with past_fd_setsize():
        # When an attempt pipelines its checkpoints (PostgreSQL: waiting on that socket)
        outcome = attempt(store).run(handler)
    # Then it ends done with every checkpoint written
    row = stored(store)
    assert (row.status, row.position, outcome.checkpoint.position) == ("done", 5, 5)


def test_a_lease_taken_over_is_detected_at_the_next_checkpoint_and_nothing_more_is_written(store: Store) -> None:
    # Given a pipelined attempt whose slot another attempt takes over after its first checkpoint
    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        ctx._run.flush()  # checkpoint 1 committed: the takeover comes after it
        with store.open() as s:
            s.execute(f"UPDATE resumable_checkpoints SET lease_expires_at = {s.d.now()} WHERE job = %s", (JOB,))
            s.commit()
            assert s.leases.acquire(JOB, SLOT, "b", 30) is not None
        ctx.checkpoint(2, processed=2)  # handed over; rejected by the fence in the background
        ctx.checkpoint(3, processed=3)  # raises the rejection
        raise AssertionError("not reached")

    run = attempt(store)
    # Then the attempt stops with LeaseLost, and the row is as the new holder has it
    with pytest.raises(LeaseLost):
        run.run(handler)
    row = stored(store)
    assert (row.position, row.processed, row.lease_owner, row.status) == (1, 1, "b", "running")
    with store.open() as s:
        assert [h.outcome for h in s.listings.history(JOB, SLOT)] == ["lease_lost"]


def test_a_cancel_keeps_the_checkpoint_that_was_in_flight(store: Store) -> None:
    def handler(ctx: Any) -> None:
        for k in range(1, 10):
            if k == 3:
                ctx.signal.cancel("user")
            ctx.checkpoint(k, processed=k)  # raises Cancelled after checkpoint 3 is handed over

    with pytest.raises(Cancelled):
        attempt(store).run(handler)
    row = stored(store)
    assert (row.status, row.stop_reason, row.position, row.processed) == ("cancelled", "user", 3, 3)


def test_ctx_transaction_is_refused_with_pipelined_checkpoints(store: Store) -> None:
    def handler(ctx: Any) -> None:
        ctx.transaction()

    with pytest.raises(ConfigurationError, match="ctx.transaction\\(\\) cannot be used with pipeline_checkpoints") as err:
        attempt(store).run(handler)
    assert JOB in str(err.value) and "pipeline_checkpoints=False" in str(err.value)
    assert stored(store).status == "failed"


def test_progress_is_reported_from_committed_checkpoints_only(store: Store) -> None:
    reported: list[tuple[int, int]] = []

    def handler(ctx: Any) -> None:
        for k in range(1, 30):
            ctx.checkpoint(k, processed=k)

    run = attempt(store, progress_interval=0)
    original = run.given.reporter.on_checkpoint

    def on_checkpoint(row: Any, figures: Any) -> None:
        reported.append((figures.processed, stored(store).processed))
        original(row, figures)

    run.given.reporter.on_checkpoint = on_checkpoint  # type: ignore[method-assign]
    run.run(handler)
    assert reported and all(shown <= durable for shown, durable in reported)


def test_pipeline_checkpoints_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="pipeline_checkpoints must be True or False, got 'yes'"):
        Options(pipeline_checkpoints="yes")  # type: ignore[arg-type]


# -- the writer on PostgreSQL: sent without waiting, on the handler's own thread ----------------


def _writer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def test_a_checkpoint_returns_while_its_write_waits_for_the_database(store: Store, store_kind: str) -> None:
    # Given another transaction holding the slot's row, so that the next checkpoint's UPDATE waits
    with store.open() as s:
        s.ensure_schema()
    blocker = store.session()
    seen: list[str] = []

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        ctx._run.flush()
        if store_kind == "sqlite":
            blocker.execute("BEGIN IMMEDIATE")  # the database's write lock
        else:
            blocker.execute("SELECT 1 FROM resumable_checkpoints WHERE job = %s FOR UPDATE", (JOB,))
        ctx.checkpoint(2, processed=2)  # its write waits for the blocker...
        seen.append("returned")  # ...and the handler goes on with the next chunk meanwhile
        assert stored_on(blocker).position == 1
        seen.append(f"writer threads: {len(_writer_threads())}")
        blocker.rollback()  # the write goes through; the next checkpoint collects it
        ctx.checkpoint(3, processed=3)

    try:
        outcome = attempt(store).run(handler)
    finally:
        blocker.rollback()
        blocker.close()
    assert outcome.checkpoint.position == 3 and stored(store).status == "done"
    # On PostgreSQL no thread is involved: the write is sent and collected on the handler's thread
    expected_threads = 1 if store_kind == "sqlite" else 0
    assert seen == ["returned", f"writer threads: {expected_threads}"]


def stored_on(session: Any) -> Any:
    return session.checkpoints.load(JOB, SLOT)


def test_a_connection_lost_with_a_write_in_flight_fails_the_attempt_and_a_retry_resumes(pg_params: Any) -> None:
    # Given a pipelined attempt on PostgreSQL whose writer's connection is killed with a write in flight
    store = PostgresStore(**pg_params)
    with store.open() as s:
        s.ensure_schema()

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        ctx._run.flush()
        writer = ctx._run.writer._saves._conn
        with store.open(autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (writer.get_backend_pid(),))
        ctx.checkpoint(2, processed=2)  # sent on a dead connection, or collected from one
        ctx.checkpoint(3, processed=3)
        raise AssertionError("not reached: the lost write is raised by one of the checkpoints above")

    # Then the attempt fails with the driver's error, keeping the last committed checkpoint...
    with pytest.raises(psycopg2.OperationalError):
        attempt(store).run(handler)
    row = stored(store)
    assert (row.status, row.position, row.processed, row.lease_owner) == ("failed", 1, 1, None)
    # ...and the next attempt resumes from it
    seen: list[int] = []

    def rest(ctx: Any) -> None:
        for k in range((ctx.position or 0) + 1, 5):
            seen.append(k)
            ctx.checkpoint(k, processed=k)

    outcome = attempt(store, 2).run(rest)
    assert outcome.resumed_from == 1 and seen == [2, 3, 4] and stored(store).status == "done"


def test_a_store_on_a_connect_function_pipelines_with_that_connection_s_parameters(pg_params: Any) -> None:
    # Given a store built on a connect function, as the Airflow connection's hook builds it
    opened: list[Any] = []

    def connect() -> Any:
        opened.append(psycopg2.connect(**pg_params))
        return opened[-1]

    store = PostgresStore.from_connect(connect, host=pg_params.get("host"), dbname=pg_params["dbname"])

    def handler(ctx: Any) -> None:
        for k in range(1, 4):
            ctx.checkpoint(k, processed=k)
        writer = ctx._run.writer
        # Then the writer connects to the same database with the same parameters, without a thread
        assert writer._saves._conn.info.dbname == pg_params["dbname"] and _writer_threads() == []

    outcome = attempt(store).run(handler)
    assert outcome.checkpoint.position == 3 and stored(store).status == "done"
