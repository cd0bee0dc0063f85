"""Row 10: aggregate checkpoint throughput with 1, 4, 16 and 64 concurrent attempts.

Ours: N real attempts (:class:`~airflow_resumable.core.attempt.runner.Attempt`, each on its own slot and
connection, lease keeper running) whose handlers call ``ctx.checkpoint()`` in a loop. The floor:
N client threads, each on its own autocommit connection, doing the hand-written checkpoint of
row 1 (a bare single-row upsert of its own row). Both sides run for the same window after all
their clients are connected and ready; throughput is checkpoints committed per second, summed
over the clients. The sides alternate, seven rounds per level; the ratio is the median over the
rounds of ours / the bare side's in the same round (a slow spell of the shared machine hits the
neighbouring windows alike): target >= 0.8x at every level. Everything runs in this one Python process (threads), as many tasks on one worker
would; on a 2-core machine the client's CPU and the server's share the same cores.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.attempt.runner import Attempt, Options
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore
from bench.common import Database, Result, at_least, interleave, median, say

LEVELS = (1, 4, 16, 64)
WINDOW = 1.5
ROUNDS = 7
TARGET = 0.8
JOB = "bench.concurrency"

_UPSERT = (
    "INSERT INTO bare_checkpoints (job, slot, position, state, processed, total, status, updated_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, 'running', clock_timestamp()) "
    "ON CONFLICT (job, slot) DO UPDATE SET position = excluded.position, state = excluded.state, "
    "processed = excluded.processed, total = excluded.total, updated_at = excluded.updated_at"
)


def _window(clients: list[Callable[[threading.Barrier, threading.Event], int]]) -> float:
    """Start every client, release them together, stop them after WINDOW: checkpoints per second."""
    ready = threading.Barrier(len(clients) + 1)
    stop = threading.Event()
    counts: list[int] = []
    errors: list[BaseException] = []

    def run(client: Callable[[threading.Barrier, threading.Event], int]) -> None:
        try:
            counts.append(client(ready, stop))
        except BaseException as exc:  # reported below: a broken side must not look fast
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    ready.wait(120)
    started = time.perf_counter()
    time.sleep(WINDOW)
    stop.set()
    elapsed = time.perf_counter() - started
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


def run(db: Database) -> list[Result]:
    params = db.schema_params("concurrency")
    store = PostgresStore(**params)
    with store.open() as s:
        s.ensure_schema()
    setup = db.connect("concurrency")
    with setup.cursor() as cur:
        cur.execute("CREATE TABLE bare_checkpoints (LIKE resumable_checkpoints INCLUDING ALL)")
    setup.commit()
    setup.close()
    runs = iter(range(10**6))

    def ours_client(ready: threading.Barrier, stop: threading.Event) -> int:
        done = [0]

        def handler(ctx: Any) -> None:
            ready.wait(120)
            i = 0
            while not stop.is_set():
                i += 1
                ctx.state["total"] = i * 14
                ctx.checkpoint(i, processed=i, total=10**9)
            done[0] = i

        Attempt(
            store, Identity(job=JOB, slot=f"ours-{next(runs)}", attempt=1, owner="bench"),
            options=Options(overlap="allow", progress_interval=3600),
        ).run(handler)
        return done[0]

    def bare_client(ready: threading.Barrier, stop: threading.Event) -> int:
        conn = db.connect("concurrency", autocommit=True)
        slot = f"bare-{next(runs)}"
        try:
            cur = conn.cursor()
            ready.wait(120)
            i = 0
            while not stop.is_set():
                i += 1
                cur.execute(_UPSERT, (JOB, slot, json.dumps(i), json.dumps({"total": i * 14}), i, 10**9))
            return i
        finally:
            conn.close()

    curve: dict[int, tuple[float, float]] = {}
    ratios: dict[int, float] = {}
    for n in LEVELS:
        say(f"row 10: {n} concurrent attempts vs {n} bare upsert clients, {ROUNDS} rounds of {WINDOW:g} s")
        rates: dict[str, list[float]] = {"ours": [], "bare": []}

        def side(name: str, client: Callable[..., int], n: int = n,
                 rates: dict[str, list[float]] = rates) -> Callable[[], None]:
            return lambda: rates[name].append(_window([client] * n))

        interleave({"ours": side("ours", ours_client), "bare": side("bare", bare_client)}, rounds=ROUNDS)
        curve[n] = (median(rates["ours"]), median(rates["bare"]))
        ratios[n] = median([o / b for o, b in zip(rates["ours"], rates["bare"], strict=True)])
    results = []
    for n, (ours, bare) in curve.items():
        ratio = ratios[n]
        results.append(Result(
            f"10.{n}", f"PG: checkpoints/s with {n} concurrent attempts vs {n} bare upsert clients",
            f"{ours:,.0f}/s vs {bare:,.0f}/s", ratio, f">= {TARGET:.2f}x", at_least(ratio, TARGET),
            figures={"checkpoints_per_s": ours},
        ))
    results[0].notes.append(
        "concurrency curve (checkpoints/s, ours / bare): "
        + "; ".join(f"{n}: {o:,.0f} / {b:,.0f}" for n, (o, b) in curve.items())
        + f"; threads in one process, {WINDOW:g} s windows, medians of {ROUNDS} rounds; the ratio is the median of "
        "the rounds' ratios"
    )
    return results
