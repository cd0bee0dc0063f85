"""Row 2: the lesson's loan report over 1,000,000 loans, chunks of 3,000, in PostgreSQL.

Four loops compute the same report (the sum of ``days``) over the same ``loan`` table, each on its
own autocommit connection for the reads:

* **seed** -- the lesson's loop translated literally: ``LIMIT/OFFSET`` pages (each page rescans
  every row before it: quadratic) and a ``job_status`` upsert per chunk;
* **keyset** -- a hand-written keyset loop (``WHERE loan_id > last``) with no checkpoints at all;
* **keyset+upsert** -- the same with a bare checkpoint upsert + commit per chunk (for context);
* **ours** -- :class:`~airflow_resumable.core.runner.Attempt` running
  :func:`~airflow_resumable.core.chunked.chunk_loop`: keyset reads, the running total in the
  checkpoint's state, a fenced checkpoint per chunk, lease keeper running, in PostgreSQL.

The OFFSET loop takes tens of seconds over a million rows, so it runs once, in the middle of the
rounds; the other loops alternate for several rounds.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_resumable.core.chunked import chunk_loop
from airflow_resumable.core.runner import Attempt, Options
from airflow_resumable.core.stores import PostgresStore

from bench.common import Database, Result, at_least, at_most, interleave, median, say, secs

LOANS = 1_000_000
CHUNK = 3_000
ROUNDS = 7
#: sum(i % 30 for i in 1..1,000,000)
EXPECTED_TOTAL = sum(i % 30 for i in range(1, LOANS + 1))

SEED_TARGET = 5.0
KEYSET_TARGET = 1.05


def create_loans(conn: Any, count: int = LOANS) -> None:
    """The lesson's data: loan i has member 100 + i % 500 and days = i % 30."""
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE loan (loan_id INTEGER PRIMARY KEY, member_id INTEGER NOT NULL, days INTEGER NOT NULL)"
        )
        cur.execute(
            "INSERT INTO loan (loan_id, member_id, days) SELECT i, 100 + i %% 500, i %% 30 "
            "FROM generate_series(1, %s) AS i",
            (count,),
        )
    conn.commit()
    old = conn.autocommit
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE loan")
    conn.autocommit = old


# -- the loops --------------------------------------------------------------------------------------


def seed_loop(conn: Any, job: str) -> int:
    """The lesson's generateReport(), line by line: OFFSET pages, a status upsert per chunk."""
    cur = conn.cursor()
    cur.execute("SELECT count(*) FROM loan")
    record_count = cur.fetchone()[0]
    cur.execute("SELECT processed, total FROM job_status WHERE job_id = %s", (job,))
    processed, total = cur.fetchone() or (0, 0)

    def write_status(status: str) -> None:
        cur.execute(
            "INSERT INTO job_status (job_id, status, processed, total) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (job_id) DO UPDATE SET status = excluded.status, processed = excluded.processed, "
            "total = excluded.total",
            (job, status, processed, total),
        )

    while processed < record_count:
        cur.execute("SELECT days FROM loan ORDER BY loan_id LIMIT %s OFFSET %s", (CHUNK, processed))
        for (days,) in cur.fetchall():
            total += days
        processed += CHUNK
        write_status("running")
    write_status("done")
    return total


def keyset_loop(conn: Any) -> int:
    """What a careful user writes without checkpoints: keyset pages, nothing saved."""
    cur = conn.cursor()
    after, total = 0, 0
    while True:
        cur.execute("SELECT loan_id, days FROM loan WHERE loan_id > %s ORDER BY loan_id LIMIT %s", (after, CHUNK))
        batch = cur.fetchall()
        if not batch:
            return total
        total += sum(days for _, days in batch)
        after = batch[-1][0]


def keyset_upsert_loop(conn: Any, ckpt: Any, job: str) -> int:
    """Keyset pages and a hand-written checkpoint (one upsert + commit) per chunk."""
    cur, out = conn.cursor(), ckpt.cursor()
    after, total, processed = 0, 0, 0
    while True:
        cur.execute("SELECT loan_id, days FROM loan WHERE loan_id > %s ORDER BY loan_id LIMIT %s", (after, CHUNK))
        batch = cur.fetchall()
        if not batch:
            return total
        total += sum(days for _, days in batch)
        after = batch[-1][0]
        processed += len(batch)
        out.execute(
            "INSERT INTO bare_checkpoints (job, slot, position, state, processed, total, status, updated_at) "
            "VALUES (%s, 'bench', %s, %s, %s, %s, 'running', clock_timestamp()) ON CONFLICT (job, slot) DO UPDATE "
            "SET position = excluded.position, state = excluded.state, processed = excluded.processed, "
            "total = excluded.total, updated_at = excluded.updated_at",
            (job, json.dumps(after), json.dumps({"total": total}), processed, LOANS),
        )
        ckpt.commit()


def report_handler(conn: Any) -> Any:
    """Our loan report: the handler the user writes, with chunk_loop owning the loop."""

    def read(ctx: Any, after: int | None, limit: int) -> list[tuple[int, int]]:
        cur = conn.cursor()
        cur.execute(
            "SELECT loan_id, days FROM loan WHERE loan_id > %s ORDER BY loan_id LIMIT %s", (after or 0, limit)
        )
        return cur.fetchall()

    def process(ctx: Any, batch: list[tuple[int, int]]) -> None:
        ctx.state["total"] = ctx.state.get("total", 0) + sum(days for _, days in batch)

    return chunk_loop(read, process, chunk_size=CHUNK, position=lambda loan: loan[0], total=LOANS)


# -- the row ----------------------------------------------------------------------------------------


def run(db: Database) -> list[Result]:
    say(f"row 2: loading {LOANS:,} loans into PostgreSQL")
    params = db.schema_params("loans")
    setup = db.connect("loans")
    create_loans(setup)
    with setup.cursor() as cur:
        cur.execute(
            "CREATE TABLE job_status (job_id TEXT PRIMARY KEY, status TEXT NOT NULL, processed INTEGER NOT NULL, "
            "total INTEGER NOT NULL)"
        )
    setup.commit()
    store = PostgresStore(**params)
    with store.open() as s:
        s.ensure_schema()
    with setup.cursor() as cur:
        cur.execute("CREATE TABLE bare_checkpoints (LIKE resumable_checkpoints INCLUDING ALL)")
    setup.commit()
    setup.close()

    readers = {name: db.connect("loans", autocommit=True) for name in ("ours", "keyset", "upsert", "seed")}
    ckpt = db.connect("loans")
    totals: dict[str, int] = {}
    runs = iter(range(10**6))

    def ours() -> None:
        n = next(runs)
        attempt = Attempt(
            store, job="bench.loan_report", slot=f"run-{n}", attempt=1, owner="bench", options=Options(lease=30)
        )
        outcome = attempt.run(report_handler(readers["ours"]))
        totals["ours"] = outcome.checkpoint.state["total"]

    def keyset() -> None:
        totals["keyset"] = keyset_loop(readers["keyset"])

    def upsert() -> None:
        totals["keyset+upsert"] = keyset_upsert_loop(readers["upsert"], ckpt, f"bench-{next(runs)}")

    sides = {"ours": ours, "keyset": keyset, "keyset+upsert": upsert}
    say(f"row 2: keyset loops and ours, {ROUNDS} rounds (2 of them before the OFFSET loop)")
    times = interleave(sides, rounds=2, warmup=1)
    say("row 2: the seed's OFFSET loop, once (quadratic: this takes a while)")
    from bench.common import timer

    with timer() as elapsed:
        totals["seed"] = seed_loop(readers["seed"], "report-2026-01")
    seed = elapsed()
    say(f"row 2: OFFSET loop took {seed:.1f} s; {ROUNDS - 2} more rounds")
    more = interleave(sides, rounds=ROUNDS - 2)
    for name in times:
        times[name] += more[name]
    for conn in (*readers.values(), ckpt):
        conn.close()

    wrong = {k: v for k, v in totals.items() if v != EXPECTED_TOTAL}
    if wrong:
        raise AssertionError(f"loan report totals differ from {EXPECTED_TOTAL}: {wrong}")

    t_ours, t_keyset, t_upsert = median(times["ours"]), median(times["keyset"]), median(times["keyset+upsert"])
    checkpoints = LOANS // CHUNK + (1 if LOANS % CHUNK else 0)
    per_ckpt = (t_ours - t_keyset) / checkpoints
    speedup = seed / t_ours
    vs_keyset = t_ours / t_keyset
    return [
        Result(
            "2a", f"loans 1M/3k: seed OFFSET loop / ours (speed-up)", f"seed {secs(seed)} (1 run) vs ours {secs(t_ours)}",
            speedup, f">= {SEED_TARGET:.0f}x", at_least(speedup, SEED_TARGET),
        ),
        Result(
            "2b", "loans 1M/3k: ours vs bare keyset loop (no checkpoints)",
            f"{secs(t_ours)} vs {secs(t_keyset)}", vs_keyset, f"<= {KEYSET_TARGET:.2f}x",
            at_most(vs_keyset, KEYSET_TARGET),
            notes=[
                f"ours writes {checkpoints} checkpoints; (ours - keyset) / checkpoints = "
                f"{per_ckpt * 1000:.2f} ms per checkpoint, whole-attempt overhead included",
            ],
        ),
        Result(
            "2c", "loans 1M/3k: ours vs keyset + hand-written upsert per chunk",
            f"{secs(t_ours)} vs {secs(t_upsert)}", t_ours / t_upsert, "(context)", None,
        ),
    ]
