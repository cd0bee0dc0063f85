"""Row 18: a person's stop request to stopped, in chunks and in milliseconds.

A running attempt of fast chunks (20 ms each, a checkpoint after every chunk; a lease of 30 s, so
its keeper heartbeats every 10 s and never within a trial) is asked to stop while a chunk runs:

* **pause** and **cancel** through the REST API: the call its route makes once the user is
  authorized (``airflow_resumable.control.pause``/``cancel`` by connection id, which opens the
  store of the Airflow connection and writes the request on the slot's row), in this process, on
  another thread; the API server itself (HTTP, auth) is not stood up. On PostgreSQL and on SQLite.
  The request reaches the holder with its next checkpoint: the checkpoint's own UPDATE returns it.
* **restart** through the same call: refused while an attempt holds the slot (the rules table:
  pause or cancel it first); the row says how long the refusal took and that the run went on.
* **mark failed** in Airflow's UI: Airflow's supervisor learns it at its next heartbeat and sends
  the task process SIGTERM, whose handler raises the run's signal (the operator's ``on_kill``).
  This row times SIGTERM to stopped in this process, as row 4 does; the supervisor's part is
  Airflow's (up to ``[workers] min_heartbeat_interval``, 5 s by default) and is not measured here.

*Chunks* is the stop's position minus the checkpoints the handler had begun when the request was
on the row (for SIGTERM: when it was sent): the chunk under way finishes, its checkpoint carries
the request, and the run stops there, so at most 1. *Milliseconds* run from the request's return
(the row has it) to the attempt's end written: the row says ``paused`` or ``cancelled`` and the
lease is released (``Attempt.run`` raises ``Paused``/``Cancelled`` once it closed its connection).
Target: at most one chunk after the request, and p99 <= one chunk (the median) + 20 ms.
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from airflow_resumable.core.attempt.context import Running
from airflow_resumable.core.attempt.runner import Attempt, Options
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model.errors import Cancelled, RequestRefused
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from bench.common import Database, Result, median, percentile, say

TRIALS = 30
CHUNK = 0.020
SLACK = 0.020
LEASE = 30.0
#: The checkpoint a request comes after, drawn per trial.
AFTER = (5, 25)


class _Timed(Attempt):
    """An attempt that notes when its end was written (the row says ``paused`` or ``cancelled``, the
    lease released): what a person sees, before the attempt closes its connection (on SQLite the
    last connection to a WAL file checkpoints the WAL as it closes: 8-20 ms here, not the stop's)."""

    ended: float | None = None

    def _stopped(self, run: Running, exc: BaseException) -> None:
        super()._stopped(run, exc)  # writes the end: paused or cancelled
        self.ended = time.perf_counter()


class _Run:
    """One trial's attempt: items one a chunk, each ``CHUNK`` long, checkpointed; counts the
    checkpoints begun (``begun``) and times each chunk."""

    def __init__(self, store: Store, job: str, slot: str, chunks: list[float]):
        self.attempt = _Timed(
            store, Identity(job=job, slot=slot, attempt=1, owner="bench"), options=Options(lease=LEASE),
        )
        self.begun = 0
        self.chunks = chunks
        self.started = threading.Event()

    def __call__(self, ctx: Any) -> None:
        self.started.set()
        i = ctx.position or 0
        while True:
            t = time.perf_counter()
            time.sleep(CHUNK)  # the chunk's work: I/O-bound, as most are
            self.chunks.append(time.perf_counter() - t)
            i += 1
            self.begun = i
            ctx.checkpoint(i, processed=i)


def _ask_trial(store: Store, conn_id: str, action: str, n: int, rng: random.Random, chunks: list[float],
               job: str) -> tuple[int, float, float]:
    """Run one attempt; from another thread, after a random checkpoint, ask ``action`` the way the
    REST route does. Returns (chunks after the request, seconds from its return to stopped,
    seconds the request itself took)."""
    from airflow_resumable import control

    job, slot = f"{job}.{n}", "trial"  # a job a trial: a paused slot counts as live for the overlap policy
    run = _Run(store, job, slot, chunks)
    after = rng.randint(*AFTER)
    out: dict[str, Any] = {}

    def person() -> None:
        run.started.wait(30)
        while run.begun < after:
            time.sleep(0.001)
        time.sleep(rng.uniform(0, CHUNK))  # anywhere in the chunk under way
        sent = time.perf_counter()
        getattr(control, action)(job, slot, conn_id=conn_id, by="bench")
        out["returned"], out["begun"] = time.perf_counter(), run.begun
        out["took"] = out["returned"] - sent

    asker = threading.Thread(target=person, daemon=True)
    asker.start()
    try:
        run.attempt.run(run)
    except Cancelled:  # Paused is a Cancelled
        pass
    else:
        raise AssertionError(f"{job} {slot}: the run finished before it was asked to {action}")
    stopped = run.attempt.ended
    assert stopped is not None
    asker.join(30)
    with store.open(autocommit=True) as session:
        row = session.checkpoints.load(job, slot)
    expected = "paused" if action == "pause" else "cancelled"
    if row is None or row.status != expected or row.lease_owner is not None:
        raise AssertionError(f"{job} {slot}: did not end {expected} with its lease released: {row}")
    return int(row.position) - out["begun"], stopped - out["returned"], out["took"]


def _restart_trial(store: Store, conn_id: str, n: int, chunks: list[float], job: str) -> tuple[float, int]:
    """Ask a restart of a running slot: refused. Returns how long the refusal took and how many
    chunks the run went on with afterwards (it is then cancelled to end the trial)."""
    from airflow_resumable import control

    slot = f"restart-{n}"
    run = _Run(store, job, slot, chunks)
    out: dict[str, Any] = {}

    def person() -> None:
        run.started.wait(30)
        while run.begun < 5:
            time.sleep(0.001)
        sent = time.perf_counter()
        try:
            control.restart(job, slot, conn_id=conn_id, by="bench")
        except RequestRefused as exc:
            out["refused"], out["took"], out["begun"] = str(exc), time.perf_counter() - sent, run.begun
        while run.begun < out.get("begun", 0) + 5:  # the run goes on
            time.sleep(0.001)
        out["went_on"] = run.begun - out.get("begun", 0)
        control.cancel(job, slot, conn_id=conn_id, by="bench")

    asker = threading.Thread(target=person, daemon=True)
    asker.start()
    try:
        run.attempt.run(run)
    except Cancelled:
        pass
    asker.join(30)
    if "refused" not in out:
        raise AssertionError(f"{job} {slot}: a restart of a running slot was taken")
    return out["took"], out["went_on"]


def _sigterm_trial(store: Store, n: int, rng: random.Random, chunks: list[float], job: str) -> tuple[int, float]:
    """Run one attempt; after a random checkpoint, SIGTERM this process's main thread, whose handler
    raises the run's signal as the operator's on_kill does. Returns (chunks after, seconds)."""
    slot = f"sigterm-{n}"
    run = _Run(store, job, slot, chunks)
    after = rng.randint(*AFTER)
    out: dict[str, Any] = {}

    def on_sigterm(signum: int, frame: Any) -> None:
        run.attempt.signal.cancel(Reason.TERMINATED, "the task process received SIGTERM")

    def supervisor() -> None:
        run.started.wait(30)
        while run.begun < after:
            time.sleep(0.001)
        time.sleep(rng.uniform(0, CHUNK))
        out["begun"], out["sent"] = run.begun, time.perf_counter()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # type: ignore[arg-type]

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    killer = threading.Thread(target=supervisor, daemon=True)
    killer.start()
    try:
        run.attempt.run(run)
    except Cancelled:
        pass
    else:
        raise AssertionError(f"{job} {slot}: the run finished before SIGTERM")
    finally:
        signal.signal(signal.SIGTERM, previous)
    stopped = run.attempt.ended
    assert stopped is not None
    killer.join(30)
    with store.open(autocommit=True) as session:
        row = session.checkpoints.load(job, slot)
    assert row is not None and row.status == "cancelled", row
    return int(row.position) - out["begun"], stopped - out["sent"]


def _judged(key: str, what: str, after: list[int], lat: list[float], chunks: list[float], note: str) -> Result:
    chunk = median(chunks)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    ratio = p99 / (chunk + SLACK)
    most = max(after)
    return Result(
        key, what,
        f"{most} chunk{'s' if most != 1 else ''} at most (of {len(after)}); p50 {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms; chunk {chunk * 1000:.1f} ms",
        ratio, "<= 1 chunk, p99 <= 1 chunk + 20 ms", ratio <= 1.0 and most <= 1,
        notes=[f"{what}: chunks after the request {sorted(after)}; latency max {max(lat) * 1000:.1f} ms; "
               f"ratio = p99 / (median chunk + 20 ms); {note}"],
    )


def run(db: Database) -> list[Result]:
    say(f"row 18: stop requests to stopped, {TRIALS} trials each, {CHUNK * 1000:.0f} ms chunks, heartbeat every "
        f"{LEASE / 3:g} s")
    rng = random.Random(18)
    folder = Path(tempfile.mkdtemp(prefix="bench-requests-"))
    stores: dict[str, tuple[Store, str]] = {
        "PG": (PostgresStore(**db.params), "bench_requests_pg"),
        "SQLite": (SQLiteStore(folder / "checkpoints.db"), "bench_requests_sqlite"),
    }
    os.environ["AIRFLOW_CONN_BENCH_REQUESTS_PG"] = db.uri()
    os.environ["AIRFLOW_CONN_BENCH_REQUESTS_SQLITE"] = f"sqlite:///{folder / 'checkpoints.db'}"
    results: list[Result] = []
    keys = iter("abcdef")
    for kind, (store, conn_id) in stores.items():
        with store.open(autocommit=True) as session:
            session.ensure_schema()
        for action in ("pause", "cancel"):
            chunks: list[float] = []
            after, lat, took = [], [], []
            for n in range(TRIALS):
                a, seconds, asked = _ask_trial(store, conn_id, action, n, rng, chunks, f"bench.{action}.{kind}")
                after.append(a)
                lat.append(seconds)
                took.append(asked)
            results.append(_judged(
                f"18{next(keys)}", f"{action} through REST -> stopped ({kind})", after, lat, chunks,
                f"the request itself (connection lookup, store, write) took p50 {median(took) * 1000:.0f} ms"))
    store, conn_id = stores["PG"]
    chunks = []
    refused = [_restart_trial(store, conn_id, n, chunks, "bench.restart.PG") for n in range(5)]
    results.append(Result(
        f"18{next(keys)}", "restart through REST of a running slot (PG)",
        f"refused in p50 {median([t for t, _ in refused]) * 1000:.0f} ms (of {len(refused)}); the run went on",
        None, "-", None,
        notes=["a restart is taken only by a slot nobody runs (rules table): pause or cancel first, then restart; "
               "pause and cancel reach the holder as rows 18a-18d show"],
    ))
    chunks = []
    after, lat = [], []
    for n in range(TRIALS):
        a, seconds = _sigterm_trial(store, n, rng, chunks, "bench.markfailed.PG")
        after.append(a)
        lat.append(seconds)
    results.append(_judged(
        f"18{next(keys)}", "mark failed (UI): SIGTERM -> stopped (PG)", after, lat, chunks,
        "Airflow's part before the SIGTERM is not measured: the task's supervisor learns of the new state at its "
        "next heartbeat, at most [workers] min_heartbeat_interval (5 s) apart, and sends SIGTERM (SIGKILL 5 s "
        "later if the process has not exited)"))
    return results
