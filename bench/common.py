"""What every benchmark row shares: interleaved timing, medians, results, the PostgreSQL database.

Timing rules (the machines are shared and noisy):

* the things compared are measured in the same run, alternating (A B, then B A, ...), so a burst
  of load from a neighbour hits both sides alike;
* a row's ratio is the median over the rounds of the two sides' ratio *in the same round*, and its
  spread is the interquartile range of those per-round ratios (printed in the table): two runs
  of a row agree when their ratios lie within each other's spread;
* each side's CPU time (``time.process_time``: this process only, so neither PostgreSQL's server
  time nor another engineer's load is in it) is kept beside its wall time: the noise-free part
  of a comparison, for the Python side;
* absolute times are printed for context only.
"""

from __future__ import annotations

import dataclasses
import math
import re
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
        spread: how much the per-round ratios behind ``ratio`` vary (``IQR 1.01-1.04, n=15``).
        figures: numbers later rows of the same run build on (:func:`run_figure`), not printed.
    """

    key: str
    what: str
    measured: str
    ratio: float | None
    target: str
    passed: bool | None
    notes: list[str] = dataclasses.field(default_factory=list)
    spread: str = ""
    figures: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if self.passed is None:
            return "INFO"
        if self.ratio is None and self.target == "-":  # a row that could not be measured
            return "ERROR" if self.passed is False else "N/A"
        return "PASS" if self.passed else "MISS"


#: The rows measured so far in this run, by key (``python -m bench`` records each as it ends).
RUN: dict[str, Result] = {}


def run_figure(key: str, figure: str) -> float | None:
    """A figure of row ``key`` measured earlier in this run, or None (the row did not run)."""
    row = RUN.get(key)
    return None if row is None else row.figures.get(figure)


def at_most(ratio: float, limit: float) -> bool:
    return ratio <= limit


def at_least(ratio: float, limit: float) -> bool:
    return ratio >= limit


def table(results: list[Result]) -> str:
    """The results as one Markdown table (readable in a terminal, pasteable into the docs)."""
    head = ["#", "what", "measured (medians)", "ratio", "spread", "target", "verdict"]
    rows = [
        [r.key, r.what, r.measured, "n/a" if r.ratio is None else f"{r.ratio:.2f}x", r.spread or "-", r.target,
         r.verdict]
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
    sides: Mapping[str, Callable[[], Any]], *, rounds: int, warmup: int = 0,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Time each side once per round, alternating the order every round; seconds per call.

    Round ``i`` runs the sides in order when ``i`` is even and reversed when odd (A B, B A, ...),
    so neither side always runs right after the other. With ``cpu``, each call's CPU time
    (this process's) is appended to ``cpu[side]`` too.
    """
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            began_cpu = time.process_time()
            start = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - start)
            if cpu is not None:
                cpu.setdefault(name, []).append(time.process_time() - began_cpu)
    return times


def ratios(times: Mapping[str, list[float]], side: str, base: str) -> list[float]:
    """``side``'s time over ``base``'s, round by round (the two ran one right after the other)."""
    return [a / b for a, b in zip(times[side], times[base], strict=True)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval that holds the true median with at least ``confidence``: the
    j-th smallest and j-th largest figures, j the largest rank whose binomial tail stays under
    the rest (for 15 rounds: the 4th and the 12th of 15, 96 %). How precisely a run measured a
    median, where the IQR says how much the rounds differ: the median of a run agrees with a
    second run's about as closely as this interval is narrow."""
    ordered, n = sorted(values), len(values)
    below = 0.0  # P(fewer than j of n rounds fall under the median)
    j = 0
    while j < n // 2:
        nxt = below + math.comb(n, j) / 2**n
        if nxt > (1 - confidence) / 2:
            break
        below, j = nxt, j + 1
    if j == 0:  # too few rounds for the confidence asked: the whole range
        return ordered[0], ordered[-1]
    return ordered[j - 1], ordered[n - j]


def spread(values: list[float], unit: str = "x", digits: int = 2) -> str:
    """The interquartile range of per-round figures, the median's 95 % interval and how many
    rounds: ``IQR 1.01-1.04x, 95% CI 1.01-1.03x, n=15``."""
    q1, _, q3 = quartiles(values)
    low, high = median_interval(values)
    return f"IQR {q1:.{digits}f}-{q3:.{digits}f}{unit}, 95% CI {low:.{digits}f}-{high:.{digits}f}{unit}, n={len(values)}"


#: How closely a judged ratio's median must be known (half its 95 % interval, relative) for this
#: machine to measure it "within a few percent".
PRECISION = 0.03


def imprecise(results: list[Result]) -> list[str]:
    """The judged ratios whose median this run could not pin down to :data:`PRECISION`, each with
    its interval (read from its spread)."""
    out = []
    for r in results:
        found = re.search(r"95% CI (-?[\d.]+)-(-?[\d.]+)x", r.spread or "")
        if r.ratio is None or r.passed is None or not found:
            continue
        low, high = float(found[1]), float(found[2])
        if (high - low) / 2 / r.ratio > PRECISION:
            out.append(f"{r.key} ({low:.2f}-{high:.2f}x)")
    return out


def paired_ratio(times: Mapping[str, list[float]], side: str, base: str) -> tuple[float, str]:
    """The median of the per-round ratios of ``side`` over ``base``, and their spread."""
    rs = ratios(times, side, base)
    return median(rs), spread(rs)


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
