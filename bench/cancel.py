"""Row 4: cancellation latency, SIGTERM to stopped, against the chunk duration.

Airflow stops a task by sending SIGTERM to its process; its handler calls the operator's
``on_kill``, which raises the run's signal (reason ``terminated``). This row does the same in
this process: a SIGTERM handler raising the attempt's signal, and a timer thread sending
``SIGTERM`` at a random moment of the run. *Stopped* is when ``Attempt.run`` has raised
``Cancelled``: the chunk in progress finished, its checkpoint was saved, the row says
``cancelled`` and the lease was released.

The handler is the loan report (chunks of 3,000 loans read from PostgreSQL, checkpoints in
PostgreSQL; it wraps around the table, so it only ends when cancelled), and, to show the bound
with longer chunks, a handler whose chunks are 50 ms of pure-Python work.
Target: p99 latency <= one chunk (the median chunk duration) + 20 ms.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.attempt.runner import Attempt, Options
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model.errors import Cancelled
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore
from bench.common import Database, Result, median, percentile, say
from bench.loans import CHUNK, create_loans

TRIALS = 60
SLACK = 0.020
LOANS = 300_000


def _burn(seconds: float) -> int:
    """Pure-Python work for about ``seconds``."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        for i in range(200):
            n += i * i % 7
    return n


def _one_trial(attempt: Attempt, handler: Callable[[Any], Any], delay: float) -> float:
    """Run ``attempt``; ``delay`` seconds after its handler starts, SIGTERM the main thread.

    Returns the seconds from sending the signal to ``Attempt.run`` raising ``Cancelled``.
    """
    started = threading.Event()
    sent: list[float] = []

    def wrapped(ctx: Any) -> Any:
        started.set()
        return handler(ctx)

    def kill() -> None:
        started.wait(30)
        time.sleep(delay)
        sent.append(time.perf_counter())
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # type: ignore[arg-type]

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        attempt.run(wrapped)
    except Cancelled:
        stopped = time.perf_counter()
    else:
        raise AssertionError(f"{attempt.job} {attempt.slot}: the run finished before it was cancelled")
    killer.join()
    with attempt.given.store.open(autocommit=True) as session:  # the row as stored, after the attempt ended
        row = session.checkpoints.load(attempt.job, attempt.slot)
    if row is None or row.status != "cancelled" or row.lease_owner is not None:
        raise AssertionError(f"{attempt.job} {attempt.slot}: did not end cancelled with its lease released: {row}")
    return stopped - sent[0]


def _trials(
    store: PostgresStore,
    make_handler: Callable[[list[float]], Callable[[Any], Any]],
    *,
    label: str,
    window: tuple[float, float],
) -> tuple[list[float], list[float]]:
    """``TRIALS`` attempts, each sent SIGTERM at a random moment in ``window`` after its handler starts.

    Returns the latencies and the durations of every chunk run.
    """
    current: dict[str, Attempt] = {}

    def on_sigterm(signum: int, frame: Any) -> None:
        # What Airflow's SIGTERM handler does through the operator's on_kill.
        current["attempt"].signal.cancel(Reason.TERMINATED, "SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    latencies: list[float] = []
    chunks: list[float] = []
    rng = random.Random(4)
    try:
        for n in range(TRIALS):
            attempt = Attempt(
                store, Identity(job=f"bench.cancel.{label}", slot=f"trial-{n}", attempt=1, owner="bench"),
                options=Options(lease=30),
            )
            current["attempt"] = attempt
            latencies.append(_one_trial(attempt, make_handler(chunks), rng.uniform(*window)))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return latencies, chunks


def _loan_handler(db: Database) -> Callable[[list[float]], Callable[[Any], Any]]:
    conn = db.connect("cancel", autocommit=True)

    def make(durations: list[float]) -> Callable[[Any], Any]:
        def handler(ctx: Any) -> None:
            after = ctx.position or 0
            while True:
                t = time.perf_counter()
                cur = conn.cursor()
                cur.execute(
                    "SELECT loan_id, days FROM loan WHERE loan_id > %s ORDER BY loan_id LIMIT %s", (after, CHUNK)
                )
                batch = cur.fetchall()
                if not batch:  # start over: the run lasts until it is cancelled
                    after = 0
                    continue
                ctx.state["total"] = ctx.state.get("total", 0) + sum(d for _, d in batch)
                after = batch[-1][0]
                durations.append(time.perf_counter() - t)
                ctx.checkpoint(after, processed=ctx.processed + len(batch))

        return handler

    return make


def _cpu_handler(chunk: float) -> Callable[[list[float]], Callable[[Any], Any]]:
    def make(durations: list[float]) -> Callable[[Any], Any]:
        def handler(ctx: Any) -> None:
            i = ctx.position or 0
            while True:
                t = time.perf_counter()
                _burn(chunk)
                durations.append(time.perf_counter() - t)
                i += 1
                ctx.checkpoint(i, processed=i)

        return handler

    return make


def _result(key: str, what: str, lat: list[float], chunks: list[float]) -> Result:
    chunk = median(chunks)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    bound = chunk + SLACK
    ratio = p99 / bound
    return Result(
        key, what,
        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; chunk {chunk * 1000:.1f} ms",
        ratio, "p99 <= 1 chunk + 20 ms", ratio <= 1.0,
        notes=[f"{what}: {len(lat)} SIGTERMs; latency max {max(lat) * 1000:.1f} ms, "
               f"chunk p99 {percentile(chunks, 99) * 1000:.1f} ms; ratio = p99 / (median chunk + 20 ms)"],
    )


def run(db: Database) -> list[Result]:
    say(f"row 4: cancellation latency, {TRIALS} SIGTERMs per handler")
    params = db.schema_params("cancel")
    setup = db.connect("cancel")
    create_loans(setup, LOANS)
    setup.close()
    store = PostgresStore(**params)
    loan_lat, loan_chunks = _trials(store, _loan_handler(db), label="loans", window=(0.0, 0.3))
    cpu_lat, cpu_chunks = _trials(store, _cpu_handler(0.05), label="cpu50ms", window=(0.0, 0.3))
    return [
        _result("4a", "cancel latency: loan chunks of 3,000 (PG)", loan_lat, loan_chunks),
        _result("4b", "cancel latency: 50 ms pure-Python chunks", cpu_lat, cpu_chunks),
    ]
