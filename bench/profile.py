"""Where an attempt's time goes, by component: timers wrapped around the functions that do each part.

A profiler that attributes time to a handful of named parts instead of to every function: each
component is a list of functions (``module:Class.method`` or ``module:function``) replaced, while
a :class:`Breakdown` is active, by a wrapper that adds its wall time to the component. Components
do not nest here (none of the wrapped functions calls another one), so their sum plus "the rest"
is the whole. The wrappers cost about half a microsecond a call, a few hundred calls per attempt.

``python -m bench.cprofile_report`` runs the loan report of row 2 under cProfile as well and prints
its top functions, for when a component needs a closer look.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_resumable.core.model.identity import Identity

#: The parts of an attempt, in the order they happen, and the functions each is made of.
COMPONENTS: dict[str, tuple[str, ...]] = {
    "connect": ("airflow_resumable.core.stores.postgres:PostgresStore.connect",
                "airflow_resumable.core.stores.sqlite:SQLiteStore.connect"),
    "schema probe": ("airflow_resumable.core.stores.base:StoreSession.ensure_schema",),
    "lease": ("airflow_resumable.core.attempt.runner:take_lease", "airflow_resumable.core.attempt.runner:overlap"),
    "previous run": ("airflow_resumable.core.stores.listings:Listings.previous",),
    "start+history": ("airflow_resumable.core.stores.checkpoints:Checkpoints.start",),
    "keeper start/stop": ("airflow_resumable.core.attempt.lease:LeaseKeeper.start", "airflow_resumable.core.attempt.lease:LeaseKeeper.stop"),
    "checkpoint save": ("airflow_resumable.core.attempt.context:Running._save",),
    "checkpoint report": ("airflow_resumable.core.attempt.context:Running._report",),
    "encoding": ("airflow_resumable.core.attempt.context:RunContext._encode",),
    "order check": ("airflow_resumable.core.work.chunk_loop:_in_order", "airflow_resumable.core.work.chunk_loop:_keys",
                    "airflow_resumable.core.work.chunk_loop:_check_order"),
    "finish": ("airflow_resumable.core.stores.checkpoints:Checkpoints.finish",),
    "close": ("airflow_resumable.core.stores.connection:Connection.close",),
}
#: Added by the bench around the handler's own calls (not ours: the user's work).
USER = ("reader batches", "process")


def _resolve(target: str) -> tuple[Any, str]:
    module, _, path = target.partition(":")
    owner: Any = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, name


class Breakdown:
    """Seconds per component over everything run while it is active (``with breakdown.active(): ...``)."""

    def __init__(self, components: dict[str, tuple[str, ...]] | None = None):
        self.components = COMPONENTS if components is None else components
        self.seconds: dict[str, float] = {name: 0.0 for name in [*self.components, *USER]}
        self.calls: dict[str, int] = dict.fromkeys(self.seconds, 0)
        self.total = 0.0
        self.runs = 0

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with its time added to component ``name`` (for the bench's own read/process)."""
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] += clock() - began
                calls[name] += 1

        return wrapper

    @contextmanager
    def active(self) -> Iterator[Breakdown]:
        patched: list[tuple[Any, str, Any]] = []
        try:
            for name, targets in self.components.items():
                for target in targets:
                    try:
                        owner, attr = _resolve(target)
                    except (ImportError, AttributeError):
                        continue
                    original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
                    patched.append((owner, attr, original))
                    setattr(owner, attr, self.timed(name, original))
            yield self
        finally:
            for owner, attr, original in reversed(patched):
                setattr(owner, attr, original)

    @contextmanager
    def run(self) -> Iterator[None]:
        """Count the block as one run: its wall time is the whole the components are part of."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.total += time.perf_counter() - began
            self.runs += 1

    def lines(self, *, items: int | None = None) -> list[str]:
        """One line per component with time in it: ms per run, share of the run, calls per run."""
        if not self.runs:
            return []
        per = {k: v / self.runs for k, v in self.seconds.items() if self.calls[k]}
        whole = self.total / self.runs
        rest = whole - sum(per.values())
        out = []
        for name, s in [*per.items(), ("the rest (loop, tally, signal, GC)", rest)]:
            calls = self.calls.get(name, 0) / self.runs
            extra = f", {calls:.0f} calls" if calls else ""
            if items and name in ("order check", "encoding", "the rest (loop, tally, signal, GC)"):
                extra += f", {s / items * 1e9:.1f} ns/item"
            out.append(f"{name} {s * 1000:.2f} ms ({s / whole:.1%}{extra})")
        return [f"per run {whole * 1000:.1f} ms: " + "; ".join(out)]


def round_trips(params: dict[str, Any], checkpoints: int = 10) -> dict[str, int]:
    """What one attempt of ``checkpoints`` checkpoints sends to PostgreSQL, counted at the driver:
    connections, statements, and the BEGIN and COMMIT of its explicit transactions (each one more
    round trip). The same from run to run: the noise-free companion of the attempt's fixed cost."""
    import psycopg2
    import psycopg2.extensions as ext

    from airflow_resumable.core.attempt.runner import Attempt
    from airflow_resumable.core.stores import PostgresStore

    count = dict.fromkeys(("connections", "statements", "begins", "commits"), 0)

    class Cursor(ext.cursor):
        def execute(self, sql: Any, args: Any = None) -> Any:
            count["statements"] += 1
            idle = self.connection.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
            if not self.connection.autocommit and idle:
                count["begins"] += 1
            return super().execute(sql, args)

    class Counted(ext.connection):
        def cursor(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("cursor_factory", Cursor)
            return super().cursor(*args, **kwargs)

        def commit(self) -> None:
            if not self.autocommit and self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
                count["commits"] += 1
            super().commit()

    def connect() -> Any:
        count["connections"] += 1
        return psycopg2.connect(**params, connection_factory=Counted)

    store = PostgresStore.from_connect(connect, host=params.get("host"), dbname=params.get("dbname"))
    with store.open(autocommit=True) as s:
        s.ensure_schema()

    def handler(ctx: Any) -> None:
        for i in range(checkpoints):
            ctx.checkpoint(i + 1, processed=i + 1)

    for key in count:
        count[key] = 0
    Attempt(store, Identity(job="bench.round_trips", slot=f"s{time.time_ns()}", attempt=1, owner="bench")).run(handler)
    count["round trips"] = sum(count.values())
    count["besides the checkpoints"] = count["round trips"] - checkpoints
    return count
