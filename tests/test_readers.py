"""Readers: keyset pages that neither skip nor repeat rows, files resumed at a byte offset,
sequences by index, and ``ctx.previous`` for runs that continue from the last one.

Keyset tests run against a SQLite and a PostgreSQL source (the same database as the checkpoint
store, like the customer export's warehouse).
"""

from __future__ import annotations

import hashlib
import io
import sqlite3
from collections.abc import Callable
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from airflow_resumable.core import Attempt, chunk_loop
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import Batch, FileReader, KeysetReader, SequenceReader
from airflow_resumable.core.stores import Store
from support.sources import Source

JOB = "readers"
SLOT = "2026-01-01T00:00:00+00:00"


# -- helpers --------------------------------------------------------------------------------------


def events_table(source: Source, rows: list[tuple[int, str]]) -> None:
    """``events(id, updated_at)``: many rows share an ``updated_at`` (ties), ``id`` is unique."""
    source.run("CREATE TABLE events (id INTEGER PRIMARY KEY, updated_at TEXT NOT NULL, note TEXT)")
    source.run("CREATE INDEX events_k ON events (updated_at, id)")
    source.run("INSERT INTO events (id, updated_at, note) VALUES (%s, %s, %s)", [(i, t, f"n{i}") for i, t in rows])


def attempt(store: Store, n: int, slot: str = SLOT, **kwargs: Any) -> Attempt:
    return Attempt(store, Identity(job=JOB, slot=slot, attempt=n, owner=f"owner-{n}"), **kwargs)


class Crash(Exception):
    """Stands for the worker dying mid-run."""


def collect(seen: list[Any], *, crash_before_chunk: int | None = None) -> Callable[[Any, list[Any]], None]:
    """A plain sink: remembers the items of every chunk; raises before chunk ``crash_before_chunk``."""
    chunks = [0]

    def process(ctx: Any, batch: list[Any]) -> None:
        chunks[0] += 1
        if crash_before_chunk is not None and chunks[0] == crash_before_chunk:
            raise Crash(f"crash before chunk {chunks[0]}")
        seen.extend(row[0] for row in batch)

    return process


# -- keyset ---------------------------------------------------------------------------------------

TIES = [(i, f"2026-01-0{1 + i // 15} 00:00:00") for i in range(1, 61)]  # 4 timestamps, 15 rows each


def test_a_composite_key_with_ties_neither_skips_nor_repeats_across_a_resume_at_every_chunk_boundary(
    store: Store, source: Source
) -> None:
    # Given 60 rows whose first key column has long runs of ties, read 7 at a time (so every
    # page boundary but the last falls inside a run of ties)
    events_table(source, TIES)
    reader = KeysetReader(connect=source.connect, table="events", key=("updated_at", "id"))
    chunks = -(-len(TIES) // 7)
    for crash_at in range(2, chunks + 1):
        slot = f"2026-02-{crash_at:02d}T00:00:00+00:00"
        seen: list[int] = []
        # When attempt 1 dies before chunk `crash_at` and attempt 2 resumes from its checkpoint
        with pytest.raises(Crash):
            attempt(store, 1, slot).run(chunk_loop(reader, collect(seen, crash_before_chunk=crash_at), chunk_size=7))
        saved = _load(store, slot).position
        outcome = attempt(store, 2, slot).run(chunk_loop(reader, collect(seen), chunk_size=7))
        # Then every row was processed exactly once, in key order, and the position is the last row's key
        assert seen == [i for i, _ in TIES], f"crash before chunk {crash_at}"
        assert saved == [TIES[(crash_at - 1) * 7 - 1][1], (crash_at - 1) * 7]
        assert outcome.checkpoint.position == [TIES[-1][1], 60] and outcome.checkpoint.processed == 60


def test_a_key_that_is_not_unique_fails_naming_the_job_the_slot_and_the_fix(store: Store, source: Source) -> None:
    # Given a key column with one tie, across the first page's boundary: the next page's
    # "updated_at > last" would skip row 6
    events_table(source, [(i, f"2026-01-01 00:00:{min(i, 5):02d}" if i < 7 else f"2026-01-01 00:00:{i:02d}")
                          for i in range(1, 20)])
    reader = KeysetReader(connect=source.connect, table="events", key="updated_at")
    seen: list[int] = []
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, collect(seen), chunk_size=5))
    text = str(err.value)
    assert "is not unique" in text and "at the page boundary" in text
    assert f"job='{JOB}'" in text and f"slot='{SLOT}'" in text and "key=('updated_at', 'id')" in text
    # Then nothing was processed and the checkpoint did not move
    assert seen == [] and _load(store, SLOT).position is None


def test_equal_keys_the_database_did_not_put_side_by_side_are_refused(tmp_path: Path, store: Store) -> None:
    # Given a key whose collation orders 'a', 'A', 'a' as equals, in any order: Python's equality
    # sees the two 'a' apart, with an 'A' between them
    path = tmp_path / "nocase.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (k TEXT COLLATE NOCASE, v INTEGER)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [("a", 1), ("A", 2), ("a", 3), ("b", 4)])
        db.commit()
    reader = KeysetReader(connect=lambda: sqlite3.connect(path), table="t", key="k")
    seen: list[Any] = []
    with pytest.raises(ConfigurationError, match=r"is not unique: two rows of the page after position None have k='a'"):
        attempt(store, 1).run(chunk_loop(reader, collect(seen), chunk_size=10))
    assert seen == []


def case_insensitive_table(source: Source, values: list[str]) -> None:
    """``names(id, name)``: ``name`` in a collation that calls 'a' and 'A' equal (SQLite's NOCASE; on
    PostgreSQL a nondeterministic ICU collation), indexed, with no unique constraint."""
    if source.kind == "sqlite":
        source.run("CREATE TABLE names (id INTEGER NOT NULL, name TEXT COLLATE NOCASE NOT NULL)")
    else:
        source.run("CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
        source.run("CREATE TABLE names (id INTEGER NOT NULL, name TEXT COLLATE ci NOT NULL)")
    source.run("CREATE INDEX names_k ON names (name)")
    source.run("INSERT INTO names (id, name) VALUES (%s, %s)", list(enumerate(values)))


#: 40 distinct strings, in pairs that a case-insensitive collation calls equal: a/A, b/B, ...
TWINS = [c for letter in "abcdefghijklmnopqrst" for c in (letter, letter.upper())]


def test_keys_the_database_calls_equal_are_refused_instead_of_skipping_one_at_each_page_boundary(
    store: Store, source: Source
) -> None:
    # Given 40 names Python calls distinct and the database's collation calls equal in pairs, read
    # 5 at a time, so the first page ends between two names the database calls equal: the next
    # page's "name > 'c'" would skip 'C' (and one row at every boundary after it)
    case_insensitive_table(source, TWINS)
    reader = KeysetReader(connect=source.connect, table="names", columns=("name", "id"), key="name")
    seen: list[str] = []
    # When the reader pages through them
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, collect(seen), chunk_size=5))
    # Then it refuses on the next page, naming the job, the slot, the two keys and the fix
    text = str(err.value)
    first_page = seen[:]
    assert len(first_page) == 5 and len(set(first_page)) == 5
    boundary = _load(store, SLOT).position
    assert boundary == first_page[-1] and boundary.lower() == "c"
    twin = boundary.swapcase()
    assert "not unique for the database" in text and f"name={boundary!r}" in text and f"name={twin!r}" in text
    assert f"job='{JOB}'" in text and f"slot='{SLOT}'" in text
    assert 'COLLATE "C"' in text and "COLLATE BINARY" in text and "restart=True" in text
    # and the slot is not done: nothing after the boundary was processed, no row was skipped
    assert _load(store, SLOT).status != "done"


def test_a_case_insensitive_key_with_no_two_keys_equal_for_the_database_is_paged_to_the_end(
    store: Store, source: Source
) -> None:
    # Given names that differ under the collation too (one of each letter, in either case)
    names = [c if i % 2 else c.upper() for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")]
    case_insensitive_table(source, names)
    reader = KeysetReader(connect=source.connect, table="names", columns=("name", "id"), key="name")
    seen: list[str] = []
    outcome = attempt(store, 1).run(chunk_loop(reader, collect(seen), chunk_size=4))
    # Then every name is read once, in the collation's order
    assert seen == sorted(names, key=str.lower) and outcome.checkpoint.status == "done"


def test_duplicates_inside_a_page_are_refused_too(store: Store, source: Source) -> None:
    events_table(source, TIES)
    reader = KeysetReader(connect=source.connect, table="events", key="updated_at")
    with pytest.raises(ConfigurationError, match="within the page of 20"):
        attempt(store, 1).run(chunk_loop(reader, collect([]), chunk_size=20))


def test_a_query_with_its_own_where_and_parameters_is_paged_and_rows_come_as_dicts(
    store: Store, source: Source
) -> None:
    events_table(source, TIES)
    reader = KeysetReader(connect=source.connect, query=f"SELECT id, updated_at FROM events WHERE id > {source.marker}",
                          params=(30,), key=("updated_at", "id"), as_dict=True)
    seen: list[dict[str, Any]] = []
    attempt(store, 1).run(chunk_loop(reader, lambda ctx, batch: seen.extend(batch), chunk_size=4))
    assert [r["id"] for r in seen] == list(range(31, 61))
    assert set(seen[0]) == {"id", "updated_at"}


def test_null_keys_and_positions_of_another_key_are_refused_naming_the_job_and_slot(
    store: Store, source: Source
) -> None:
    source.run("CREATE TABLE events (id INTEGER PRIMARY KEY, updated_at TEXT)")
    source.run("INSERT INTO events (id, updated_at) VALUES (%s, %s)", [(1, "a"), (2, None)])
    reader = KeysetReader(connect=source.connect, table="events", key=("updated_at", "id"))
    with pytest.raises(ConfigurationError, match="a row has a NULL key") as err:
        attempt(store, 1).run(chunk_loop(reader, collect([]), chunk_size=5))
    assert f"slot='{SLOT}'" in str(err.value) and "IS NOT NULL" in str(err.value)
    # A slot whose checkpoint holds a single id (written by another read function) is not misread
    with pytest.raises(ConfigurationError, match="the position 7 is not a key of 2 values") as err:
        attempt(store, 2, "other").run(chunk_loop(reader, collect([]), chunk_size=5, start=7))
    assert "slot='other'" in str(err.value)


#: Where NULL keys sit among 53 rows ``(id, a, b)``, read 7 at a time: the key, and the rows. The
#: composite cases put a NULL ``b`` in the group of a page's last row, after it: PostgreSQL sorts it
#: at the end of its group, where "(a, b) > (x, y)" of the next page is not true (nor false) for it.
NULL_PLACES = {
    "single key, NULLs first on SQLite and after the last key on PostgreSQL": (
        "a", [(i, None if i in (7, 30, 52) else i, 0) for i in range(1, 54)]),
    "composite, NULL first column": (("a", "b"), [(i, None if i == 30 else i // 5, i) for i in range(1, 54)]),
    "composite, NULL second column after the first page": (
        ("a", "b"), [(i, i // 5, None if i == 9 else i) for i in range(1, 54)]),
    "composite, NULL second column mid-run": (("a", "b"), [(i, i // 5, None if i == 20 else i) for i in range(1, 54)]),
    "composite, NULL second column on the last page": (
        ("a", "b"), [(i, i // 26, None if i == 51 else i) for i in range(1, 54)]),
    "composite, NULLs in both columns": (
        ("a", "b"), [(i, None if i == 40 else i // 5, None if i in (20, 53) else i) for i in range(1, 54)]),
}


def nulls_table(source: Source, rows: list[tuple[Any, ...]]) -> None:
    source.run("CREATE TABLE n (id INTEGER NOT NULL, a INTEGER, b INTEGER)")
    source.run("CREATE INDEX n_k ON n (a, b)")
    source.run("INSERT INTO n (id, a, b) VALUES (%s, %s, %s)", rows)


@pytest.mark.parametrize("place", list(NULL_PLACES))
def test_null_keys_are_refused_on_both_stores_wherever_the_database_sorts_them(
    store: Store, source: Source, place: str
) -> None:
    # Given rows with NULL keys: SQLite sorts NULLs first, PostgreSQL last, and "(a, b) > (x, y)"
    # is never true for them, so a page that starts after them (or in their group) never sees them
    key, rows = NULL_PLACES[place]
    nulls_table(source, rows)
    keys = (key,) if isinstance(key, str) else key
    reader = KeysetReader(connect=source.connect, table="n", columns=("id", "a", "b"), key=key)
    seen: list[int] = []
    # When the reader pages through them, 7 at a time
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, collect(seen), chunk_size=7))
    # Then it refuses, naming the job, the slot and the fix, before the run is done
    text = str(err.value)
    assert "a row has a NULL key" in text and f"slot='{SLOT}'" in text and "IS NOT NULL" in text
    assert _load(store, SLOT).status != "done"
    # and what was processed before is the start of the non-NULL rows in key order: nothing skipped
    ordered = [i for i, *k in sorted((r for r in rows if None not in r[1:1 + len(keys)]),
                                     key=lambda r: (r[1], r[2])[:len(keys)] + (r[0],))]
    assert seen == ordered[:len(seen)]


def test_a_null_key_that_arrives_between_attempts_is_refused_on_resume(store: Store, source: Source) -> None:
    # Given attempt 1 read two pages of 7 and died
    nulls_table(source, [(i, i, 0) for i in range(1, 30)])
    reader = KeysetReader(connect=source.connect, table="n", columns=("id", "a", "b"), key="a")
    seen: list[int] = []
    with pytest.raises(Crash):
        attempt(store, 1).run(chunk_loop(reader, collect(seen, crash_before_chunk=3), chunk_size=7))
    # and a row with a NULL key arrived meanwhile (no position is before or after it: no page reads it)
    source.run("INSERT INTO n (id, a, b) VALUES (%s, %s, %s)", [(99, None, 0)])
    # When attempt 2 resumes, it refuses instead of finishing without that row
    with pytest.raises(ConfigurationError, match="a row has a NULL key"):
        attempt(store, 2).run(chunk_loop(reader, collect(seen), chunk_size=7))
    assert seen == list(range(1, 15)) and _load(store, SLOT).status != "done"


def test_a_placeholder_without_params_is_a_named_error_on_the_first_page_and_not_retried(
    store: Store, source: Source
) -> None:
    from airflow_resumable.operators.outcome import to_airflow
    from airflow_resumable.version_compat import AirflowFailException

    # Given a where= with a placeholder and no params= (the driver would bind the reader's own values to it)
    events_table(source, TIES)
    reader = KeysetReader(connect=source.connect, table="events", key=("updated_at", "id"),
                          where=f"id > {source.marker}")
    seen: list[int] = []
    # When the first page is read: a configuration error naming the job, the slot and the fix
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, collect(seen), chunk_size=7))
    text = str(err.value)
    assert "where= and query= have 1 placeholder" in text and "params= gives 0 values" in text
    assert f"slot='{SLOT}'" in text and seen == []
    # which Airflow does not retry
    assert isinstance(to_airflow(err.value, job=JOB, slot=SLOT), AirflowFailException)


def test_a_percent_sign_that_is_not_a_placeholder_is_named_with_the_fix_where_the_driver_formats_with_percent(
    store: Store, source: Source
) -> None:
    # Given a where= with a literal '%' (a LIKE pattern)
    events_table(source, TIES)
    reader = KeysetReader(connect=source.connect, table="events", key="id", where="note LIKE 'n1%'")
    seen: list[int] = []
    if source.kind == "sqlite":  # sqlite3 takes ? placeholders: a '%' is just a character
        attempt(store, 1).run(chunk_loop(reader, collect(seen), chunk_size=7))
        assert seen == [1, *range(10, 20)]
        return
    # psycopg2 formats the whole text with %: it must be doubled
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, collect(seen), chunk_size=7))
    assert "a '%' that is not a placeholder" in str(err.value) and "'n1%%'" in str(err.value)
    assert f"slot='{SLOT}'" in str(err.value) and seen == []
    # and with the fix, it reads the rows
    fixed = KeysetReader(connect=source.connect, table="events", key="id", where="note LIKE 'n1%%'")
    attempt(store, 2, "fixed").run(chunk_loop(fixed, collect(seen), chunk_size=7))
    assert seen == [1, *range(10, 20)]


def test_placeholders_are_checked_when_the_reader_is_built_if_the_paramstyle_is_given() -> None:
    with pytest.raises(ConfigurationError) as err:
        KeysetReader(connect=lambda: None, table="t", key="id", where="a = %s AND b LIKE 'x%'", params=(1, 2),
                     paramstyle="format")
    text = str(err.value)
    assert "a '%' that is not a placeholder" in text and "1 placeholder" in text and "params= gives 2 values" in text
    with pytest.raises(ConfigurationError, match="%s is not this driver's placeholder"):
        KeysetReader(connect=lambda: None, table="t", key="id", where="a = %s", params=(1,), paramstyle="qmark")
    # a '?' in quotes is text, not a placeholder
    KeysetReader(connect=lambda: None, table="t", key="id", where="a = ? AND b <> 'why?'", params=(1,),
                 paramstyle="qmark")


def test_bad_reader_arguments_are_all_reported_at_once() -> None:
    with pytest.raises(ConfigurationError) as err:
        KeysetReader(connect="nope", key=("a; DROP TABLE x", "id"), table="t; --", query="SELECT 1")  # type: ignore[arg-type]
    text = str(err.value)
    for problem in ("connect must be a function", "'a; DROP TABLE x' is not a plain column name",
                    "exactly one of table= and query=", "is not a plain"):
        assert problem in text


@pytest.mark.parametrize("driver", ["psycopg2", "airflow"])
def test_timestamps_and_decimals_become_exact_json_positions(
    pg_params: dict[str, Any], store: Store, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL gives datetimes; the position is their ISO text, which the next page compares
    # exactly, through psycopg2 and through the Postgres provider's hook (psycopg 3)
    from airflow_resumable.readers import sql_reader
    from devtools.postgres import dsn

    with closing(psycopg2.connect(**pg_params)) as conn, conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (at TIMESTAMPTZ NOT NULL, id NUMERIC NOT NULL, PRIMARY KEY (at, id))")
        base = datetime(2026, 1, 1, tzinfo=timezone.utc)
        cur.executemany("INSERT INTO t VALUES (%s, %s)",
                        [(base + timedelta(microseconds=i // 3), i) for i in range(30)])
    if driver == "airflow":
        monkeypatch.setenv("AIRFLOW_CONN_TS_SOURCE", dsn(pg_params))
        reader = sql_reader("ts_source", table="t", key=("at", "id"))
    else:
        reader = KeysetReader(connect=lambda: psycopg2.connect(**pg_params), table="t", key=("at", "id"))
    seen: list[Any] = []
    out = attempt(store, 1).run(chunk_loop(reader, lambda ctx, b: seen.extend(int(r[1]) for r in b), chunk_size=4))
    assert seen == list(range(30))
    at, last = out.checkpoint.position
    assert datetime.fromisoformat(at) == base + timedelta(microseconds=9) and last == "29"


def _plan_text(cur: Any, sql: str, args: tuple[Any, ...]) -> tuple[str, int]:
    """PostgreSQL: the plan's node types, and the rows its scan actually read."""
    cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, args)
    plan = cur.fetchone()[0][0]["Plan"]
    nodes, rows = [], 0
    stack = [plan]
    while stack:
        node = stack.pop()
        nodes.append(node["Node Type"])
        if "Scan" in node["Node Type"]:
            rows = max(rows, node["Actual Rows"])
        stack += node.get("Plans", [])
    return " / ".join(nodes), rows


def test_postgresql_resumes_a_million_row_keyset_with_one_index_range_scan_of_one_page(
    pg_params: dict[str, Any]
) -> None:
    # Given a million rows with ties on updated_at and an index on the key
    with closing(psycopg2.connect(**pg_params)) as conn, conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE big AS SELECT g AS id, timestamptz '2026-01-01' + (g / 10) * interval '1 second' "
                    "AS updated_at FROM generate_series(1, 1000000) g")
        cur.execute("CREATE INDEX big_k ON big (updated_at, id)")
        cur.execute("ANALYZE big")
    reader = KeysetReader(connect=lambda: psycopg2.connect(**pg_params), table="big", key=("updated_at", "id"))
    with closing(psycopg2.connect(**pg_params)) as conn, conn.cursor() as cur:
        read: dict[str, int] = {}
        for where, row_id in (("start", 15), ("end", 999_900)):
            cur.execute("SELECT updated_at, id FROM big WHERE id = %s", (row_id,))
            at, i = cur.fetchone()
            sql, args = reader.statement([at.isoformat(), i], 100)
            nodes, read[where] = _plan_text(cur, sql, args)
            # Then the page is an index scan, with no sort and no sequential scan
            assert "Index" in nodes and "Seq Scan" not in nodes and "Sort" not in nodes, nodes
        # and resuming near the end reads as many rows as near the start: one page and the row after
        assert read == {"start": 100, "end": 100}


def test_sqlite_resumes_a_million_row_keyset_by_index_in_the_same_work_wherever_it_resumes(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE big (id INTEGER PRIMARY KEY, updated_at TEXT NOT NULL)")
        db.execute("WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000) "
                   "INSERT INTO big SELECT x, printf('2026-01-01 %06d', x / 10) FROM n")
        db.execute("CREATE INDEX big_k ON big (updated_at, id)")
    reader = KeysetReader(connect=lambda: sqlite3.connect(path), table="big", key=("updated_at", "id"))
    with closing(sqlite3.connect(path)) as db:
        steps: dict[str, int] = {}
        for where, row_id in (("start", 15), ("end", 999_900)):
            at = db.execute("SELECT updated_at FROM big WHERE id = ?", (row_id,)).fetchone()[0]
            sql, args = reader.statement([at, row_id], 100, marker="?")
            plan = " ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, args))
            # Then the page is a search of the key's index, not a scan of the table, and needs no sort
            assert plan.startswith("SEARCH big USING COVERING INDEX big_k") and "TEMP B-TREE" not in plan, plan
            # and the virtual machine does as much work near the end as near the start (SQLite's
            # progress handler counts its instructions: a scan from the start would be 10,000x more)
            rows, steps[where] = _counting_steps(db, sql, args)
            assert [r[0] for r in rows] == list(range(row_id + 1, row_id + 101))
    assert steps["end"] <= 2 * steps["start"] + 5, steps


def _counting_steps(db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> tuple[list[Any], int]:
    """The rows of ``sql`` and how many hundreds of virtual machine instructions SQLite ran for them."""
    counter = [0]

    def tick() -> int:
        counter[0] += 1
        return 0

    db.set_progress_handler(tick, 100)
    try:
        return db.execute(sql, args).fetchall(), counter[0]
    finally:
        db.set_progress_handler(None, 100)


# -- files ----------------------------------------------------------------------------------------


class CountingFile(io.RawIOBase):
    """A binary file that counts the bytes it hands out and remembers where it was asked to seek."""

    def __init__(self, data: bytes):
        self._f = io.BytesIO(data)
        self.bytes_read = 0
        self.seeks: list[int] = []
        self.first_read_at: int | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.first_read_at is None:
            self.first_read_at = self._f.tell()
        data = self._f.read(len(b))
        b[: len(data)] = data
        self.bytes_read += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.seeks.append(offset)
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()


def opener(data: bytes, opened: list[CountingFile]) -> Callable[[], Any]:
    def open_() -> Any:
        f = CountingFile(data)
        opened.append(f)
        return f

    return open_


LINES = b"".join(f"line {i:03d}\n".encode() for i in range(100))  # 9 bytes a line
BIG = b"".join(f"line {i:05d}\n".encode() for i in range(2000))  # 11 bytes a line


def fingerprint(data: bytes) -> str:
    """A file position's fingerprint of the bytes before it, as the docs give it: BLAKE2b, 8 bytes, hex."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def offset_of(position: Any) -> Any:
    """The byte offset of a file reader's position (``{"offset", "window", "digest"}``)."""
    return position["offset"] if isinstance(position, dict) else position


def test_a_file_reader_resumed_at_a_byte_offset_does_not_read_the_start(store: Store) -> None:
    # Given attempt 1 read 10 chunks of 100 lines and then died
    opened: list[CountingFile] = []
    reader = FileReader(open=opener(BIG, opened))
    seen: list[str] = []
    with pytest.raises(Crash):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: _crash_on(seen, b, "line 01000"), chunk_size=100))
    saved = _load(store, SLOT).position
    assert saved == {"offset": 1000 * 11, "window": 4096, "digest": fingerprint(BIG[1000 * 11 - 4096:1000 * 11])}
    # When attempt 2 resumes
    outcome = attempt(store, 2).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=100))
    # Then it read only the 4 KiB before the offset (to check them against the position's
    # fingerprint) and what follows, never the start
    retry = opened[-1]
    assert retry.seeks == [1000 * 11 - 4096] and retry.first_read_at == 1000 * 11 - 4096
    assert retry.bytes_read <= len(BIG) - 1000 * 11 + 4096
    assert seen == [f"line {i:05d}" for i in range(2000)]
    assert offset_of(outcome.checkpoint.position) == len(BIG) and outcome.checkpoint.processed == 2000


def _sinks(seen: list[Any], first: Any) -> tuple[Callable[..., None], Callable[..., None]]:
    """(a sink that dies at the batch starting with ``first``, a sink that takes everything)."""
    return (lambda c, b: _crash_on(seen, b, first)), (lambda c, b: seen.extend(b))


def _crash_on(seen: list[Any], batch: list[Any], first: Any) -> None:
    if batch[0] == first:
        raise Crash(f"crash at {first}")
    seen.extend(batch)


CSV = (
    b'id,name,comment\r\n'
    b'1,Ada,"likes ""quotes"""\r\n'
    b'2,Bob,"two\r\nlines"\r\n'
    b'\r\n'
    b'3,Cem,plain\r\n'
    + b"".join(f"{i},P{i},x\r\n".encode() for i in range(4, 21))
)


def test_a_csv_resume_reads_the_header_once_then_seeks_past_records_spanning_lines(store: Store) -> None:
    opened: list[CountingFile] = []
    reader = FileReader(open=opener(CSV, opened), format="csv")
    seen: list[dict[str, str]] = []
    with pytest.raises(Crash):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: _crash_on(seen, b, {"id": "7", "name": "P7", "comment": "x"}),
                                         chunk_size=3))
    offset = offset_of(_load(store, SLOT).position)
    assert offset == CSV.index(b"7,P7")
    outcome = attempt(store, 2).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=3))
    assert [r["id"] for r in seen] == [str(i) for i in range(1, 21)]
    assert seen[0] == {"id": "1", "name": "Ada", "comment": 'likes "quotes"'}
    assert seen[1]["comment"] == "two\r\nlines"
    # The retry read the header (one line from the start), then the bytes before the saved offset (to
    # check them against the position's fingerprint: here, in a file under 4 KiB, the whole start)
    retry = opened[-1]
    assert retry.seeks == [0, 0] and retry.bytes_read == len(b"id,name,comment\r\n") + len(CSV)
    assert offset_of(outcome.checkpoint.position) == len(CSV)


def test_json_lines_are_parsed_and_a_bad_line_names_its_byte_offset(store: Store) -> None:
    data = b'{"a": 1}\n\n{"a": 2}\n{oops\n'
    reader = FileReader(open=lambda: io.BytesIO(data), format="jsonl")
    seen: list[Any] = []
    with pytest.raises(ConfigurationError, match="the line at byte 19 is not JSON"):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=1))
    assert seen == [{"a": 1}, {"a": 2}]


def test_a_last_line_still_being_written_is_never_split_into_two_records(tmp_path: Path, store: Store) -> None:
    # Given a file whose writer is in the middle of its last line
    path = tmp_path / "feed.txt"
    path.write_bytes(b"alpha\nbeta\ngam")
    reader = FileReader(open=lambda: path.open("rb"))
    seen: list[str] = []
    # When the reader reaches it, not knowing whether the file is complete: the lines before it are
    # records, the line without its line break is not, and the run stops with a clear error
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=2))
    text = str(err.value)
    assert f"{path}: the last line (at byte 11) has no line break" in text and f"slot='{SLOT}'" in text
    assert "complete=True" in text and "complete=False" in text
    assert seen == ["alpha", "beta"] and offset_of(_load(store, SLOT).position) == 11
    # Then once the line is written, a Clear resumes at it and reads it whole
    with path.open("ab") as f:
        f.write(b"ma\ndelta\n")
    attempt(store, 2).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=2))
    assert seen == ["alpha", "beta", "gamma", "delta"]


def test_a_growing_file_holds_its_unfinished_line_back_for_the_next_run(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\n{"n"')
    reader = FileReader(open=lambda: path.open("rb"), format="jsonl", complete=False)
    seen: list[Any] = []
    first = attempt(store, 1, "run-1").run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=5))
    # The run ends before the unfinished line, and the next run continues there once it is whole
    assert seen == [{"n": 1}, {"n": 2}] and offset_of(first.checkpoint.position) == 18
    with path.open("ab") as f:
        f.write(b': 3}\n')
    attempt(store, 1, "run-2").run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=5, start=18))
    assert seen == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_a_complete_file_without_a_final_line_break_reads_its_last_line_when_declared_complete(
    store: Store,
) -> None:
    reader = FileReader(open=lambda: io.BytesIO(b"alpha\nbeta\ngamma"), complete=True)
    seen: list[str] = []
    out = attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=2))
    assert seen == ["alpha", "beta", "gamma"] and offset_of(out.checkpoint.position) == 16


def test_a_csv_record_whose_quoted_field_is_still_being_written_is_not_returned(store: Store) -> None:
    # Given a CSV record spanning lines inside quotes, its closing quote not written yet
    data = b'id,note\n1,plain\n2,"first line\nsecond'
    seen: list[Any] = []
    held = FileReader(open=lambda: io.BytesIO(data), format="csv", complete=False)
    out = attempt(store, 1, "held").run(chunk_loop(held, lambda c, b: seen.extend(b), chunk_size=5))
    # Then it is held back whole (with complete=False), the position before it
    assert seen == [{"id": "1", "note": "plain"}] and offset_of(out.checkpoint.position) == data.index(b"2,")
    # and refused when the file is declared complete: a quote is missing
    broken = FileReader(open=lambda: io.BytesIO(data + b"\n"), format="csv", complete=True)
    with pytest.raises(ConfigurationError, match=r"the record at byte 16 \(line 3\) ends inside a quoted field"):
        attempt(store, 1, "broken").run(chunk_loop(broken, lambda c, b: None, chunk_size=5))


def test_a_csv_row_with_more_fields_than_the_header_is_refused_naming_the_file_and_the_row(
    tmp_path: Path, store: Store
) -> None:
    path = tmp_path / "people.csv"
    path.write_bytes(b"id,name\n1,Ada\n2,Bob,Smith\n3,Cem\n")
    reader = FileReader(open=lambda: path.open("rb"), format="csv")
    seen: list[Any] = []
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=1))
    text = str(err.value)
    assert f"{path}: the record at byte 14 (line 3) has 3 fields" in text and "the header has 2 (id, name)" in text
    assert "'2,Bob,Smith'" in text and "Quote the field" in text and f"slot='{SLOT}'" in text
    assert seen == [{"id": "1", "name": "Ada"}] and offset_of(_load(store, SLOT).position) == 14


def test_a_file_in_another_encoding_fails_before_its_first_record_naming_the_encoding_and_the_fix(
    tmp_path: Path, store: Store
) -> None:
    # Given a Latin-1 file whose first non-ASCII byte is a few hundred lines in, and a UTF-16 file
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"".join(f"line {i:03d}\n".encode() for i in range(300)) + "café\n".encode("latin-1"))
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("alpha\nbeta\n".encode("utf-16"))
    seen: list[str] = []
    for path, expected in ((latin, "is not utf-8: byte 2703 (0xe9)"), (utf16, "starts with a UTF-16 byte order mark")):
        reader = FileReader(open=lambda path=path: path.open("rb"))
        with pytest.raises(ConfigurationError) as err:
            attempt(store, 1, path.name).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=10))
        text = str(err.value)
        # Then nothing was processed, and the error names the file, the encoding and the fix
        assert seen == [] and f"{path}: the file {expected}" in text and "encoding=" in text, text
    # and a file read with its own encoding reads
    attempt(store, 1, "latin-1").run(chunk_loop(FileReader(open=lambda: latin.open("rb"), encoding="latin-1"),
                                                lambda c, b: seen.extend(b), chunk_size=100))
    assert seen[-1] == "café" and len(seen) == 301


def test_a_byte_the_encoding_cannot_decode_deep_in_the_file_is_named_by_its_offset(store: Store) -> None:
    data = b"ok\n" * 30_000 + b"caf\xe9\n"  # past the first block the reader checks when it starts
    reader = FileReader(open=lambda: io.BytesIO(data), name="big.txt")
    with pytest.raises(ConfigurationError, match=r"big.txt: the line at byte 90000 \(line 30001\) is not utf-8 \(byte 90003"):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: None, chunk_size=1000))
    assert offset_of(_load(store, SLOT).position) == 90_000


def test_encodings_a_line_by_line_reader_cannot_read_are_refused_and_a_utf8_bom_is_not_data(store: Store) -> None:
    with pytest.raises(ConfigurationError, match="encoding 'utf-16' writes a line break as 2 bytes"):
        FileReader(open=lambda: io.BytesIO(b""), encoding="utf-16")
    reader = FileReader(open=lambda: io.BytesIO(b"\xef\xbb\xbfid,name\r\n1,Ada\r\n"), format="csv")
    seen: list[Any] = []
    attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=5))
    assert seen == [{"id": "1", "name": "Ada"}]


def test_an_object_storage_path_is_read_through_airflow(airflow_home: Path, tmp_path: Path, store: Store) -> None:
    from airflow_resumable.readers import object_reader

    path = tmp_path / "lines.txt"
    path.write_bytes(LINES)
    reader = object_reader(f"file://{path}")
    seen: list[str] = []
    attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=30))
    assert seen == [f"line {i:03d}" for i in range(100)]


def test_sql_reader_pages_through_an_airflow_connection_of_either_kind(
    airflow_home: Path, store: Store, store_uri: str, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_resumable.readers import sql_reader

    # Given the events table in a database named by an Airflow connection (PostgreSQL: through the
    # Postgres provider's hook, whichever driver it uses; SQLite: sqlite3)
    events_table(source, TIES)
    monkeypatch.setenv("AIRFLOW_CONN_EVENTS_SOURCE", store_uri)
    reader = sql_reader("events_source", table="events", columns=("id", "updated_at"), key=("updated_at", "id"),
                        as_dict=True)
    seen: list[int] = []
    with pytest.raises(Crash):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: _crash_on(seen, b, {"id": 22, "updated_at": TIES[21][1]}),
                                         chunk_size=7))
    attempt(store, 2).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=7))
    assert [r["id"] for r in seen] == [i for i, _ in TIES]


def test_a_missing_reader_connection_is_named_with_the_fix(airflow_home: Path, store: Store) -> None:
    from airflow_resumable.readers import sql_reader

    reader = sql_reader("no_such_source", table="events", key="id")  # nothing is looked up at parse time
    with pytest.raises(ConfigurationError, match="'no_such_source' a reader reads from does not exist") as err:
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: None, chunk_size=7))
    assert "AIRFLOW_CONN_NO_SUCH_SOURCE" in str(err.value)


# -- sequences ------------------------------------------------------------------------------------


def test_a_sequence_resumes_at_its_index_and_an_iterator_factory_is_skipped_forward_once(store: Store) -> None:
    items = [f"item{i}" for i in range(23)]
    for source in (items, lambda: iter(items)):
        slot = f"seq-{type(source).__name__}"
        seen: list[str] = []
        crash, collect_all = _sinks(seen, first="item10")
        with pytest.raises(Crash):
            attempt(store, 1, slot).run(chunk_loop(SequenceReader(source), crash, chunk_size=5))
        assert _load(store, slot).position == 9
        attempt(store, 2, slot).run(chunk_loop(SequenceReader(source), collect_all, chunk_size=5))
        assert seen == items


def test_a_bare_iterator_is_refused_because_a_retry_could_not_read_it_again() -> None:
    with pytest.raises(ConfigurationError, match="a function that makes the iterator"):
        SequenceReader(iter([1, 2]))  # type: ignore[arg-type]


def test_a_handler_that_owns_its_loop_iterates_chunks_and_checkpoints_each(store: Store) -> None:
    reader = SequenceReader(list(range(10)))

    def handler(ctx: Any) -> int:
        total = ctx.state.get("sum", 0)
        for batch in reader.chunks(ctx, 4):
            assert isinstance(batch, Batch)
            total += sum(batch)
            ctx.checkpoint(batch.position, state={"sum": total}, processed=ctx.processed + len(batch))
        return total

    outcome = attempt(store, 1).run(handler)
    assert outcome.result == 45 and outcome.checkpoint.position == 9 and outcome.checkpoint.processed == 10


def test_a_reader_with_a_position_function_is_refused_at_parse_time() -> None:
    with pytest.raises(ConfigurationError, match="drop position="):
        chunk_loop(SequenceReader([1]), lambda c, b: None, chunk_size=1, position=lambda x: x)


# -- ctx.previous ---------------------------------------------------------------------------------

HOUR = [f"2026-01-01T{h:02d}:00:00+00:00" for h in range(6)]


def _hourly(store: Store, slot: str, n: int, handler: Callable[[Any], Any], *, scheduled: bool = True) -> Any:
    when = datetime.fromisoformat(slot) if scheduled else None
    return Attempt(store, Identity(job=JOB, slot=slot, attempt=n, owner=f"{slot}-{n}", scheduled_at=when)).run(handler)


def test_ctx_previous_is_the_last_done_slot_before_this_one_so_a_backfill_continues_from_its_own_past(
    store: Store,
) -> None:
    seen: dict[str, Any] = {}

    def remember(position: Any) -> Callable[[Any], None]:
        def handler(ctx: Any) -> None:
            seen[ctx.slot] = ctx.previous
            ctx.checkpoint(position)
        return handler

    # Given hours 0 and 1 done, and hour 3 failed
    _hourly(store, HOUR[0], 1, remember(10))
    _hourly(store, HOUR[1], 1, remember(20))
    with pytest.raises(Crash):
        _hourly(store, HOUR[3], 1, _crash)
    # When hour 4 runs: its previous is hour 1 (hour 3 did not finish)
    _hourly(store, HOUR[4], 1, remember(40))
    assert (seen[HOUR[4]].slot, seen[HOUR[4]].position, seen[HOUR[4]].status) == (HOUR[1], 20, "done")
    assert seen[HOUR[4]].finished_at is not None
    # and a backfill of hour 2, run after hour 4, continues from hour 1, not from hour 4
    _hourly(store, HOUR[2], 1, remember(30))
    assert seen[HOUR[2]].slot == HOUR[1]
    # and the first hour has none
    assert seen[HOUR[0]] is None
    # A run without a logical date (its slot is its run id) gets the slot that finished last
    _hourly(store, "manual__2026-01-01T09:00:00", 1, remember(99), scheduled=False)
    assert seen["manual__2026-01-01T09:00:00"].slot == HOUR[2]


def _previous_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements that read a job's previous finished run, as the attempts send them."""
    from airflow_resumable.core.stores.connection import Connection

    sent: list[str] = []
    execute = Connection.execute

    def recording(self: Connection, sql: str, params: Any = ()) -> Any:
        if "status = 'done'" in sql and "LIMIT 1" in sql:
            sent.append(sql)
        return execute(self, sql, params)

    monkeypatch.setattr(Connection, "execute", recording)
    return sent


def test_ctx_previous_costs_a_round_trip_only_for_a_handler_that_reads_it_and_only_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given hour 0 done
    _hourly(store, HOUR[0], 1, lambda ctx: ctx.checkpoint(10))
    sent = _previous_reads(monkeypatch)
    # When hour 1 runs a handler that never asks for ctx.previous
    _hourly(store, HOUR[1], 1, lambda ctx: ctx.checkpoint(20))
    # Then the attempt sent no statement for it
    assert sent == []
    # When hour 2's handler reads it three times, it is read once, and it is hour 1
    seen: list[Any] = []

    def reads(ctx: Any) -> None:
        seen.extend(ctx.previous for _ in range(3))
        ctx.checkpoint(30)

    _hourly(store, HOUR[2], 1, reads)
    assert len(sent) == 1
    assert [p.slot for p in seen] == [HOUR[1]] * 3 and seen[0] is seen[2]


def test_ctx_previous_read_inside_the_handlers_transaction_does_not_commit_its_pending_writes(
    store: Store,
) -> None:
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER PRIMARY KEY)")
        s.commit()
    _hourly(store, HOUR[0], 1, lambda ctx: ctx.checkpoint(10))

    # Given a handler that writes through ctx.transaction(), then reads ctx.previous, then fails
    def handler(ctx: Any) -> None:
        ctx.transaction().cursor().execute("INSERT INTO sink (item) VALUES (%s)", (1,))
        assert ctx.previous is not None and ctx.previous.slot == HOUR[0]
        raise Crash("after the write, before its checkpoint")

    with pytest.raises(Crash):
        _hourly(store, HOUR[1], 1, handler)
    # Then the write went with the failed chunk: reading ctx.previous committed nothing
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT item FROM sink")
        assert cur.fetchall() == []


def test_ctx_previous_first_asked_after_the_handler_returned_says_the_attempt_ended(store: Store) -> None:
    from airflow_resumable.core.model.errors import AttemptEnded

    kept: list[Any] = []
    _hourly(store, HOUR[0], 1, lambda ctx: kept.append(ctx))
    with pytest.raises(AttemptEnded, match="ctx.previous was called after attempt 1's handler returned"):
        assert kept[0].previous is None  # not reached: reading it raises


def test_an_incremental_chunked_run_starts_where_the_previous_one_ended_and_a_run_with_nothing_new_keeps_it(
    store: Store,
) -> None:
    data = list(range(10))
    seen: list[list[int]] = []

    def run(slot: str) -> Any:
        batches: list[int] = []
        handler = chunk_loop(SequenceReader(data), lambda c, b: batches.extend(b), chunk_size=4,
                             start=lambda ctx: ctx.previous.position if ctx.previous else None)
        out = _hourly(store, slot, 1, handler)
        seen.append(batches)
        return out

    run(HOUR[0])
    data += [10, 11, 12]  # new items arrive
    run(HOUR[1])
    third = run(HOUR[2])  # nothing new
    assert seen == [list(range(10)), [10, 11, 12], []]
    assert third.checkpoint.position == 12, "a run that read nothing still ends where it started"
    data.append(13)
    run(HOUR[3])
    assert seen[-1] == [13]


def _load(store: Store, slot: str) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, slot)


def _crash(ctx: Any) -> None:
    raise Crash("the worker died")
