"""What every benchmark row shares: interleaved timing, medians, results, the PostgreSQL database.

Timing rules (the machines are shared and noisy):

* the things compared are measured in the same run, alternating (A B, then B A, ...), so a burst
  of load from a neighbour hits both sides alike;
* each side is summarized by its median, and a row reports the *ratio* of medians;
* absolute times are printed for context only.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg2

ROOT = Path(__file__).resolve().parent.parent


# -- results ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    """One row of the table.

    Attributes:
        key: the row's number in the issue, with a letter for sub-rows (``"1a"``).
        what: what is compared, short.
        measured: the medians behind the ratio, human-readable.
        ratio: the figure judged against the target (None when it cannot be measured).
        target: the target as text, e.g. ``"<= 1.25x"``.
        passed: True / False against the target; None for a figure reported without a target.
        notes: extra lines printed under the table (query plans, caveats).
    """

    key: str
    what: str
    measured: str
    ratio: float | None
    target: str
    passed: bool | None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.passed is None:
            return "INFO"
        if self.ratio is None:
            return "ERROR" if self.passed is False else "N/A"
        return "PASS" if self.passed else "MISS"


def at_most(ratio: float, limit: float) -> bool:
    return ratio <= limit


def at_least(ratio: float, limit: float) -> bool:
    return ratio >= limit


def table(results: list[Result]) -> str:
    """The results as one Markdown table (readable in a terminal, pasteable into the docs)."""
    head = ["#", "what", "measured (medians)", "ratio", "target", "verdict"]
    rows = [
        [r.key, r.what, r.measured, "n/a" if r.ratio is None else f"{r.ratio:.2f}x", r.target, r.verdict]
        for r in results
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


# -- timing -------------------------------------------------------------------------------------


def interleave(
    sides: Mapping[str, Callable[[], Any]], *, rounds: int, warmup: int = 0
) -> dict[str, list[float]]:
    """Time each side once per round, alternating the order every round; seconds per call.

    Round ``i`` runs the sides in order when ``i`` is even and reversed when odd (A B, B A, ...),
    so neither side always runs right after the other.
    """
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            start = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100), nearest-rank."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def ms(seconds: float) -> str:
    """Seconds as a short millisecond string."""
    value = seconds * 1000.0
    if value >= 100:
        return f"{value:.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def secs(seconds: float) -> str:
    return f"{seconds:.2f} s"


def say(text: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- PostgreSQL ---------------------------------------------------------------------------------


class Database:
    """A throwaway PostgreSQL database ``resumable_bench_<random>``, dropped by :meth:`drop`.

    Uses the machine's server (``RESUMABLE_TEST_PG_DSN``, else postgres@127.0.0.1:5432, trust),
    or a throwaway cluster, exactly as the tests do (``devtools/postgres.py``).
    Each benchmark works in its own schema, so their tables never meet.
    """

    def __init__(self) -> None:
        from devtools.postgres import Server

        self.server = Server().start()
        self.params: dict[str, Any] = self.server.create_database(prefix="resumable_bench")
        self.name: str = self.params["dbname"]

    def describe(self) -> str:
        where = "throwaway cluster (fsync=off)" if self.server.throwaway else "server"
        with closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute("SHOW server_version")
            version = cur.fetchone()[0]
            cur.execute("SHOW synchronous_commit")
            sync = cur.fetchone()[0]
        host = self.params.get("host", "127.0.0.1")
        return f"PostgreSQL {version} {where} at {host}:{self.params.get('port', 5432)} (synchronous_commit={sync})"

    def schema_params(self, schema: str) -> dict[str, Any]:
        """libpq parameters whose connections use ``schema`` (created if missing) as search_path."""
        with closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            conn.commit()
        return {**self.params, "options": f"-c search_path={schema}"}

    def connect(self, schema: str | None = None, *, autocommit: bool = False) -> Any:
        params = dict(self.params)
        if schema:
            params["options"] = f"-c search_path={schema}"
        conn = psycopg2.connect(**params)
        conn.autocommit = autocommit
        return conn

    def uri(self) -> str:
        """A postgresql:// URI of the database (public schema), as Airflow connections take it."""
        p = self.params
        password = f":{p['password']}" if p.get("password") else ""
        where = f"{p.get('host', '127.0.0.1')}:{p.get('port', 5432)}/{p['dbname']}"
        return f"postgresql://{p.get('user', 'postgres')}{password}@{where}"

    def drop(self) -> None:
        self.server.stop()


@contextmanager
def timer() -> Iterator[Callable[[], float]]:
    """``with timer() as elapsed: ...; elapsed()`` -> seconds since entering."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())
