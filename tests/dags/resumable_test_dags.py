"""DAGs the test-suite drives through dag.test(). Behaviour comes from the DAG run's conf.

conf keys: ``items``, ``chunk``, ``fail`` ([attempt, chunk] to raise in), ``seen`` (a SQLite file
where every processed item is logged, outside the checkpoint transaction), ``sleep`` (seconds per
chunk, spent in ``ctx.signal.wait``).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, get_current_context, task

from airflow_resumable import ChunkedOperator, ResumableOperator, RunContext
from airflow_resumable.readers import SequenceReader

START = datetime(2026, 1, 1)


def _conf() -> dict[str, Any]:
    return dict(get_current_context()["dag_run"].conf or {})


def _log_seen(path: str | None, items: list[int], attempt: int, part: int = 0) -> None:
    if not path:
        return
    with sqlite3.connect(path, timeout=30) as db:
        db.execute("CREATE TABLE IF NOT EXISTS seen (part INTEGER, item INTEGER, attempt INTEGER)")
        db.executemany("INSERT INTO seen VALUES (?, ?, ?)", [(part, i, attempt) for i in items])


def process_items(ctx: RunContext, part: int = 0) -> dict[str, Any]:
    conf = _conf()
    n, size = int(conf.get("items", 20)), int(conf.get("chunk", 5))
    fail = conf.get("fail")
    ctx.total = n
    i = ctx.position or 0
    while i < n:
        ctx.signal.raise_if_cancelled()
        batch = list(range(i, min(i + size, n)))
        _log_seen(conf.get("seen"), batch, ctx.attempt, part)
        if fail and [ctx.attempt, i // size] == list(fail):
            raise RuntimeError(f"injected failure in chunk {i // size}")
        ctx.state["sum"] = ctx.state.get("sum", 0) + sum(batch)
        if conf.get("sleep"):
            ctx.signal.wait(float(conf["sleep"]))
        i = batch[-1] + 1
        ctx.checkpoint(i, processed=i)
    return {"sum": ctx.state.get("sum", 0), "part": part}


with DAG("rt_items", schedule="@daily", start_date=START, catchup=False) as rt_items:
    ResumableOperator(task_id="work", handler=process_items, retries=2, retry_delay=timedelta(0), progress_interval=0,
                      xcom_interval=0)

with DAG("rt_pipelined", schedule="@daily", start_date=START, catchup=False) as rt_pipelined:
    ResumableOperator(task_id="work", handler=process_items, retries=2, retry_delay=timedelta(0),
                      pipeline_checkpoints=True)

with DAG("rt_no_retry", schedule="@daily", start_date=START, catchup=False) as rt_no_retry:
    ResumableOperator(task_id="work", handler=process_items, retries=0)

with DAG("rt_timeout", schedule="@daily", start_date=START, catchup=False) as rt_timeout:
    ResumableOperator(task_id="work", handler=process_items, timeout=0.6, retries=8, retry_delay=timedelta(0))

with DAG("rt_manual", schedule=None, start_date=START, catchup=False) as rt_manual:
    ResumableOperator(task_id="work", handler=process_items, retries=1, retry_delay=timedelta(0))

with DAG("rt_mapped", schedule="@daily", start_date=START, catchup=False) as rt_mapped:
    ResumableOperator.partial(task_id="part", handler=process_items, retries=1, retry_delay=timedelta(0)).expand(
        handler_kwargs=[{"part": 0}, {"part": 1}, {"part": 2}]
    )

with DAG("rt_conn", schedule="@daily", start_date=START, catchup=False) as rt_conn:
    ResumableOperator(task_id="work", handler=process_items, conn_id="resumable_missing", retries=3)


def read_numbers(ctx: RunContext, after: int | None, limit: int) -> list[int]:
    n = int(_conf().get("items", 20))
    first = 0 if after is None else after + 1
    return list(range(first, min(first + limit, n)))


def add_numbers(ctx: RunContext, batch: list[int]) -> None:
    conf = _conf()
    _log_seen(conf.get("seen"), batch, ctx.attempt)
    ctx.state["sum"] = ctx.state.get("sum", 0) + sum(batch)
    if conf.get("fail") and [ctx.attempt, batch[0] // len(batch)] == list(conf["fail"]):
        raise RuntimeError("injected failure")


with DAG("rt_chunked", schedule="@daily", start_date=START, catchup=False) as rt_chunked:
    ChunkedOperator(
        task_id="work", read=read_numbers, process=add_numbers, chunk_size=4,
        total=lambda ctx: int(_conf().get("items", 20)), retries=1, retry_delay=timedelta(0),
    )


with DAG("rt_taskflow", schedule="@daily", start_date=START, catchup=False) as rt_taskflow:

    @task
    def how_many() -> int:
        return int(_conf().get("items", 12))

    @task.resumable(retries=1, retry_delay=timedelta(0))
    def count_up(ctx: RunContext, n: int, step: int = 1) -> dict[str, int]:
        i = ctx.position or 0
        while i < n:
            _log_seen(_conf().get("seen"), [i], ctx.attempt)
            if _conf().get("fail") and ctx.attempt == 1 and i == n // 2:
                raise RuntimeError("injected failure")
            ctx.state["sum"] = ctx.state.get("sum", 0) + i
            i += step
            ctx.checkpoint(i, processed=i, total=n)
        return {"sum": ctx.state.get("sum", 0), "n": n}

    count_up(how_many())


# Overlap: each DAG's task shares the job "shared-job" with an older run started by the test.
for _policy in ("skip", "allow", "wait", "replace"):
    with DAG(f"rt_overlap_{_policy}", schedule="@daily", start_date=START, catchup=False) as _dag:
        ResumableOperator(
            task_id="work", handler=process_items, job="shared-job", overlap=_policy, overlap_poke=0.5,
            lease=1.5, retries=0,
        )
    globals()[f"rt_overlap_{_policy}"] = _dag


def read_region(ctx: RunContext, after: int | None, limit: int, *, region: str, size: int) -> list[dict[str, Any]]:
    first = 0 if after is None else after + 1
    return [{"id": i, "region": region} for i in range(first, min(first + limit, size))]


def count_region(ctx: RunContext, batch: list[dict[str, Any]], *, region: str, size: int) -> None:
    ctx.state[region] = ctx.state.get(region, 0) + len(batch)


with DAG("rt_chunked_mapped", schedule="@daily", start_date=START, catchup=False) as rt_chunked_mapped:
    ChunkedOperator.partial(task_id="region", read=read_region, process=count_region, chunk_size=3).expand(
        handler_kwargs=[{"region": "north", "size": 7}, {"region": "south", "size": 4}]
    )


# -- The end of a run: a failure after the slot is done, and a return value Airflow cannot store ----------


def write_items(ctx: RunContext) -> Any:
    """Items 0..n-1 written to ``rt_sink`` through ctx.transaction(): each write commits with its chunk."""
    conf = _conf()
    n, size = int(conf.get("items", 30)), int(conf.get("chunk", 10))
    tx = ctx.transaction()
    tx.execute("CREATE TABLE IF NOT EXISTS rt_sink (slot TEXT, item INTEGER, attempt INTEGER)")
    i = ctx.position or 0
    while i < n:
        for item in range(i, min(i + size, n)):
            tx.execute("INSERT INTO rt_sink (slot, item, attempt) VALUES (%s, %s, %s)",
                       (ctx.slot, item, ctx.attempt))
        i = min(i + size, n)
        ctx.checkpoint(i, processed=i, total=n)
    if conf.get("result") == "object":
        return object()  # neither JSON nor anything Airflow's XCom serializer knows
    return {"items": n, "attempt": ctx.attempt}


def fail_after_done(context: Any, result: Any) -> None:
    """Runs after execute() returned (the slot is done), before Airflow stores the result: an API
    error or a kill in that window."""
    if _conf().get("fail_after_done") and context["ti"].try_number == 1:
        raise RuntimeError("injected failure after the slot was done")


with DAG("rt_end_window", schedule="@daily", start_date=START, catchup=False) as rt_end_window:
    ResumableOperator(task_id="work", handler=write_items, retries=2, retry_delay=timedelta(0),
                      post_execute=fail_after_done)


def own_items(ctx: RunContext, part: int) -> dict[str, Any]:
    """Partition ``part`` owns items part*100 .. part*100+9; the position is the next one."""
    first, last = part * 100, part * 100 + 10
    i = ctx.position if ctx.position is not None else first
    while i < last:
        _log_seen(_conf().get("seen"), [i], ctx.attempt, part)
        i += 1
        ctx.checkpoint(i, processed=i - first, total=10)
    return {"part": part, "first": first}


with DAG("rt_mapped_shared_job", schedule="@daily", start_date=START, catchup=False) as rt_mapped_shared_job:
    # A fixed job for every map index: each partition must still get its own checkpoint.
    ResumableOperator.partial(task_id="part", handler=own_items, job="regions", retries=0).expand(
        handler_kwargs=[{"part": 0}, {"part": 1}]
    )


# -- Two DAGs sharing one job on the same schedule, run at once by two processes (tests/integration/test_race.py) ------


def gated_items(ctx: RunContext) -> dict[str, Any]:
    """Waits for the file ``gate`` (conf) before working, so that a test can hold two attempts at once;
    each item is written to ``race_sink`` through ctx.transaction()."""
    import os

    conf = _conf()
    gate = conf.get("gate")
    while gate and not os.path.exists(gate):
        ctx.signal.wait(0.05)
        ctx.signal.raise_if_cancelled()
    tx = ctx.transaction()
    tx.execute("CREATE TABLE IF NOT EXISTS race_sink (item INTEGER, dag_id TEXT)")
    dag_id = get_current_context()["ti"].dag_id
    i = ctx.position or 0
    while i < 20:
        tx.execute("INSERT INTO race_sink (item, dag_id) VALUES (%s, %s)", (i, dag_id))
        i += 1
        if i % 5 == 0:
            ctx.checkpoint(i, processed=i, total=20)
    return {"items": 20, "by": dag_id}


def wait_for_turn(context: Any) -> None:
    """Before the task reaches its slot, waits for the file ``turn`` (conf), if one is named: the test
    starts both processes at once (each a cold start of Airflow) and lets the second one at the slot
    only once the first holds it."""
    import os
    import time

    turn = _conf().get("turn")
    deadline = time.monotonic() + 300
    while turn and not os.path.exists(turn):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the file {turn} did not appear within 300 s")
        time.sleep(0.05)


for _name in ("rt_race_a", "rt_race_b"):
    with DAG(_name, schedule="@daily", start_date=START, catchup=False) as _dag:
        ResumableOperator(task_id="work", handler=gated_items, job="race", lease=2, lease_wait=120, retries=0,
                          pre_execute=wait_for_turn)
    globals()[_name] = _dag


with DAG("rt_chunked_end_window", schedule="@daily", start_date=START, catchup=False) as rt_chunked_end_window:
    ChunkedOperator(task_id="work", read=read_numbers, process=add_numbers, chunk_size=4, retries=1,
                    retry_delay=timedelta(0), post_execute=fail_after_done)


# -- bad input that only shows when the task runs: each must fail without a retry, writing nothing --

with DAG("rt_bad_mapped_kwargs", schedule="@daily", start_date=START, catchup=False) as rt_bad_mapped_kwargs:
    # A typo in a mapped keyword: process_items takes `part`.
    ResumableOperator.partial(task_id="part", handler=process_items, retries=2, retry_delay=timedelta(0)).expand(
        handler_kwargs=[{"prat": 0}]
    )

with DAG("rt_bad_mapped_lease", schedule="@daily", start_date=START, catchup=False) as rt_bad_mapped_lease:
    # .partial() arguments are checked only when the mapped instance is built, on the worker.
    ResumableOperator.partial(
        task_id="part", handler=process_items, lease=float("nan"), retries=2, retry_delay=timedelta(0)
    ).expand(handler_kwargs=[{"part": 0}])

with DAG("rt_xcom_kwargs", schedule="@daily", start_date=START, catchup=False) as rt_xcom_kwargs:

    @task
    def kwargs_for_work() -> dict[str, int]:
        """conf ``key`` names the keyword (default ``part``, the one process_items takes)."""
        return {str(_conf().get("key", "part")): 1}

    ResumableOperator(
        task_id="work", handler=process_items, handler_kwargs=kwargs_for_work(), retries=2, retry_delay=timedelta(0)
    )

with DAG("rt_taskflow_bad_kwargs", schedule="@daily", start_date=START, catchup=False) as rt_taskflow_bad_kwargs:

    @task.resumable(retries=2, retry_delay=timedelta(0))
    def count_to(ctx: RunContext, n: int, step: int = 1) -> int:
        ctx.checkpoint(n, processed=n)
        return n

    # Mapped arguments are known only when the task runs: one it does not take, one without `n`.
    count_to.override(task_id="unexpected").expand_kwargs([{"m": 3}])
    count_to.override(task_id="missing").expand_kwargs([{"step": 2}])


def read_descending(ctx: RunContext, after: int | None, limit: int) -> list[int]:
    """The bug: ORDER BY id DESC. Items 0..n-1, largest first, below `after`."""
    n = int(_conf().get("items", 100))
    top = n - 1 if after is None else after - 1
    return list(range(top, max(top - limit, -1), -1))


with DAG("rt_chunked_desc", schedule="@daily", start_date=START, catchup=False) as rt_chunked_desc:
    ChunkedOperator(
        task_id="work", read=read_descending, process=add_numbers, chunk_size=10, retries=2, retry_delay=timedelta(0)
    )


def big_state(ctx: RunContext) -> None:
    """Checkpoints a state of conf ``kib`` KiB (default 200), three times."""
    blob = "x" * (int(_conf().get("kib", 200)) * 1024)
    for i in range(1, 4):
        ctx.state["blob"] = blob
        ctx.state["n"] = i
        ctx.checkpoint(i, processed=i, total=3)


with DAG("rt_big_state", schedule="@daily", start_date=START, catchup=False) as rt_big_state:
    ResumableOperator(task_id="work", handler=big_state, xcom_interval=0, progress_interval=0)


def asks_to_stop(ctx: RunContext) -> None:
    """Items one a chunk, each checkpointed; right after checkpoint conf ``ask_at`` it asks for its own
    ``action`` (default ``cancel``) through the control API, by the ``resumable_default`` connection."""
    from airflow_resumable import control

    conf = _conf()
    n, at = int(conf.get("items", 1000)), int(conf["ask_at"])
    i = ctx.position or 0
    while i < n:
        _log_seen(conf.get("seen"), [i], ctx.attempt)
        i += 1
        ctx.checkpoint(i, processed=i)
        if i == at:
            getattr(control, conf.get("action", "cancel"))(ctx.job, ctx.slot, by="erin")


with DAG("rt_stop_at_checkpoint", schedule="@daily", start_date=START, catchup=False) as rt_stop_at_checkpoint:
    # A lease of ten minutes: its first heartbeat would come after 200 s.
    ResumableOperator(task_id="work", handler=asks_to_stop, lease=600, retries=0, progress_interval=0,
                      xcom_interval=0)


# Pause, throttle and time slices: the task defers (dag.test() runs the trigger in line).
def throttle_twice(ctx: RunContext) -> float | None:
    """A long wait (it defers) after the chunks that end at 10 and 20 items."""
    return float(_conf().get("throttle_wait", 1.0)) if ctx.processed in (10, 20) else None


with DAG("rt_pause", schedule="@daily", start_date=START, catchup=False) as rt_pause:
    ResumableOperator(task_id="work", handler=process_items, retries=0, resume_poll=0.2, lease=1.5,
                      progress_interval=0, xcom_interval=0)

with DAG("rt_throttle", schedule="@daily", start_date=START, catchup=False) as rt_throttle:
    ResumableOperator(task_id="work", handler=process_items, retries=0, throttle=throttle_twice, defer_after=0.5,
                      resume_poll=0.2)

with DAG("rt_slices", schedule="@daily", start_date=START, catchup=False) as rt_slices:
    ResumableOperator(task_id="work", handler=process_items, retries=0, max_runtime=0.3, resume_poll=0.2,
                      timeout=30)

with DAG("rt_taskflow_slices", schedule="@daily", start_date=START, catchup=False) as rt_taskflow_slices:

    @task.resumable(retries=0, max_runtime=0.3, resume_poll=0.2)
    def sliced(ctx: RunContext, n: int) -> dict[str, int]:
        i = ctx.position or 0
        while i < n:
            _log_seen(_conf().get("seen"), [i], ctx.attempt)
            ctx.signal.wait(0.05)
            i += 1
            ctx.checkpoint(i, processed=i, total=n)
        return {"n": n}

    sliced(20)

with DAG("rt_slices_timeout", schedule="@daily", start_date=START, catchup=False) as rt_slices_timeout:
    # Slices of 0.3 s, a cooperative timeout of 2 s: only running time summed over the slices reaches it
    # (about six slices; a loaded machine's slower starts still leave several).
    ResumableOperator(task_id="work", handler=process_items, retries=0, max_runtime=0.3, resume_poll=0.2,
                      timeout=2.0)


def upsert_unless_bad(ctx: RunContext, batch: list[int]) -> None:
    """Writes each number through the run's transaction; conf ``bad`` numbers raise ValueError."""
    bad = set(_conf().get("bad", []))
    tx = ctx.transaction()
    tx.execute("CREATE TABLE IF NOT EXISTS skip_sink (item INTEGER PRIMARY KEY)")
    for i in batch:
        if i in bad:
            raise ValueError(f"bad number {i}")
        tx.execute("INSERT INTO skip_sink (item) VALUES (%s)", (i,))


with DAG("rt_chunked_skips", schedule="@daily", start_date=START, catchup=False) as rt_chunked_skips:
    ChunkedOperator(
        task_id="work", read=SequenceReader(range(30)), process=upsert_unless_bad, chunk_size=5,
        skip_on=ValueError, skip_limit=2, retries=1, retry_delay=timedelta(0),
    )


def total_then_check(ctx: RunContext, batch: list[int]) -> None:
    """Adds each number to the running sum and count, then writes it: a bad number raises after the
    chunk's good numbers before it were counted."""
    bad = set(_conf().get("bad", []))
    tx = ctx.transaction()
    tx.execute("CREATE TABLE IF NOT EXISTS skip_sink (item INTEGER PRIMARY KEY)")
    for i in batch:
        if i in bad:
            raise ValueError(f"bad number {i}")
        ctx.state["sum"] = ctx.state.get("sum", 0) + i
        ctx.state["count"] = ctx.state.get("count", 0) + 1
        tx.execute("INSERT INTO skip_sink (item) VALUES (%s)", (i,))


with DAG("rt_chunked_skips_state", schedule="@daily", start_date=START, catchup=False) as rt_chunked_skips_state:
    ChunkedOperator(
        task_id="work", read=SequenceReader(range(1, 31)), process=total_then_check, chunk_size=5,
        skip_on=ValueError, skip_limit=2, retries=0,
    )
