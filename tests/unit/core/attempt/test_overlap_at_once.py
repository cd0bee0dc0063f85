"""Starters of one job at once, each on a new slot: the overlap policy lets one handler run.

On PostgreSQL a new slot's run starts with its lease in one statement, the overlap check inside
it; that statement and every attempt's own overlap check run under the job's lock (see
``Leases.acquire`` and ``Listings.live_others``). Without that lock two such starts each miss the
other and both run. The attempts here are threads with connections of their own, released together
by a barrier, many rounds; each handler keeps its slot live until every attempt of its round decided.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.attempt.runner import Attempt, Identity, Options
from airflow_resumable.core.model.errors import OverlapSkip, OverlapWait
from airflow_resumable.core.stores.base import Store
from airflow_resumable.core.stores.postgres import PostgresStore
from airflow_resumable.core.stores.sqlite import SQLiteStore
from tests.support.stores import psycopg3_store

STARTERS = 4
ROUNDS = 25
DEADLINE = 20.0


@pytest.fixture(params=["sqlite", "psycopg2", "psycopg3", "both drivers"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> list[Store]:
    """One store per starter: a SQLite file, or the PostgreSQL database through psycopg2, psycopg 3,
    or half through each (a deployment whose workers differ)."""
    if request.param == "sqlite":
        store = SQLiteStore(tmp_path / "checkpoints.db")
        return [store] * STARTERS
    params: dict[str, Any] = request.getfixturevalue("pg_params")
    two, three = PostgresStore(**params), psycopg3_store(params)
    return {"psycopg2": [two] * STARTERS, "psycopg3": [three] * STARTERS,
            "both drivers": [two, three] * (STARTERS // 2)}[request.param]


@pytest.mark.parametrize("policy", ["skip", "wait"])
def test_starters_of_one_job_at_once_on_new_slots_run_one_handler(stores: list[Store], policy: str) -> None:
    with stores[0].open(autocommit=True) as s:
        s.ensure_schema()
    for n in range(ROUNDS):
        # Given STARTERS attempts of one job, each on a slot never run, released at once
        ran, yielded, failed = _at_once(stores, f"at-once-{policy}-{n}", policy)
        # Then exactly one of them ran its handler, and every other yielded to it
        assert not failed, failed
        assert len(ran) == 1, f"round {n}: handlers ran on {sorted(ran)} at once; yielded: {sorted(yielded)}"
        assert len(yielded) == STARTERS - 1



@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
def test_starters_at_once_under_repeatable_read_run_one_handler(pg_params: dict[str, Any], driver: str) -> None:
    """On a database whose sessions default to REPEATABLE READ (``default_transaction_isolation``, a
    role's or a database's setting the store does not override) the lock's own statement would take
    the snapshot before the lock is granted: the job's lock runs in a READ COMMITTED transaction."""
    params = {**pg_params, "options": f"{pg_params.get('options', '')} -c default_transaction_isolation=repeatable\\ read"}
    store = PostgresStore(**params) if driver == "psycopg2" else psycopg3_store(params)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    for n in range(15):
        ran, yielded, failed = _at_once([store] * STARTERS, f"rr-{n}", "skip")
        assert not failed, failed
        assert len(ran) == 1, f"round {n}: handlers ran on {sorted(ran)} at once; yielded: {sorted(yielded)}"

def _at_once(stores: list[Store], job: str, policy: str) -> tuple[list[str], list[str], list[BaseException]]:
    """One round: the slots whose handler ran, the slots that yielded, and any other error."""
    barrier = threading.Barrier(STARTERS)
    decided = threading.Condition()
    counts = {"decided": 0}
    ran: list[str] = []
    yielded: list[str] = []
    failed: list[BaseException] = []

    def decide() -> None:
        with decided:
            counts["decided"] += 1
            decided.notify_all()

    def handler(ctx: Any) -> None:
        ran.append(ctx.slot)
        decide()
        with decided:  # keep the slot live until every starter of the round decided
            assert decided.wait_for(lambda: counts["decided"] == STARTERS, timeout=DEADLINE)

    def start(i: int) -> None:
        attempt = Attempt(stores[i], Identity(job=job, slot=f"s{i}", attempt=1, owner=f"owner-{i}"),
                          options=Options(overlap=policy, lease=30))
        barrier.wait(timeout=DEADLINE)
        try:
            attempt.run(handler)
        except (OverlapSkip, OverlapWait):
            yielded.append(f"s{i}")
            decide()
        except BaseException as exc:
            failed.append(exc)
            decide()

    threads = [threading.Thread(target=start, args=(i,)) for i in range(STARTERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=2 * DEADLINE)
    return ran, yielded, failed


def test_an_attempt_on_a_new_slot_through_psycopg3_sends_three_queries(pg_params: dict[str, Any], tmp_path: Path) -> None:
    """Airflow's Postgres provider connects with psycopg 3: there too the job's lock and the start go
    as one query (its ``ClientCursor``), so an empty attempt under ``skip`` sends the schema probe, that
    query and its end (read from libpq's trace: a ``Query`` or a ``Sync`` ends each round trip)."""
    import psycopg

    params = {k: v for k, v in pg_params.items() if k != "application_name"}
    traces: list[Path] = []
    files: list[Any] = []  # kept open: libpq writes to the descriptor

    class Traced(psycopg.Connection):  # type: ignore[type-arg]
        def close(self) -> None:
            if not self.closed:
                self.pgconn.untrace()  # flushes libpq's buffer
            super().close()

    def connect() -> Any:
        conn = Traced.connect(**params)
        traces.append(tmp_path / f"trace-{len(traces)}.txt")
        files.append(open(traces[-1], "w"))  # noqa: SIM115 - libpq writes to it until the connection closes
        conn.pgconn.trace(files[-1].fileno())
        return conn

    store = PostgresStore.from_connect(connect, host=params.get("host"), dbname=params.get("dbname"))
    try:
        with store.open(autocommit=True) as s:
            s.ensure_schema()
        traces.clear()
        outcome = Attempt(store, Identity(job="traced", slot="s1", attempt=1, owner="o"),
                          options=Options(overlap="skip", lease=30)).run(lambda ctx: None)
    finally:
        for f in files:
            f.close()
    assert outcome.checkpoint.status == "done"
    sent = [line.split("\t")[3:] for trace in traces for line in trace.read_text().splitlines()
            if line.split("\t")[1:2] == ["F"] and line.split("\t")[3] in ("Query", "Sync")]
    assert len(sent) == 3, sent
    assert "pg_advisory_xact_lock" in sent[1][1] and "INSERT INTO" in sent[1][1], sent[1]


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg3"])
def test_odd_job_and_slot_names_go_through_the_one_query_start_as_values(pg_params: dict[str, Any], driver: str) -> None:
    # Given names a query of several statements, bound on the client, must quote as values
    store = PostgresStore(**pg_params) if driver == "psycopg2" else psycopg3_store(pg_params)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
    for job in ["a'b", "a\\b'c", "x; DROP TABLE y --", "%(job)s", "%s %%", "é ☃ \u200b", "$1 $$q$$"]:
        for slot in ["s", "s'2"]:
            # When each runs on a new slot under skip (the first is done when the second starts)
            out = Attempt(store, Identity(job=job, slot=slot, attempt=1, owner="o"),
                          options=Options(overlap="skip", lease=30)).run(lambda ctx: ctx.checkpoint(1, processed=1))
            # Then its row and its history record hold the names as given
            assert (out.checkpoint.status, out.checkpoint.job, out.checkpoint.slot) == ("done", job, slot)
            with store.open(autocommit=True) as s:
                [record] = s.listings.history(job, slot)
            assert (record.job, record.slot, record.outcome) == (job, slot, "done")
