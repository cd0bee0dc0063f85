"""The keyset reader: pages that neither skip nor repeat rows across a resume at any chunk boundary,
keys the database calls equal or null refused, placeholders checked, exact JSON positions, and a
resume that costs one index range scan of one page.

The tests run against a SQLite and a PostgreSQL source (the same database as the checkpoint
store, like the customer export's warehouse).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from airflow_resumable.core import chunk_loop
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.readers import KeysetReader
from airflow_resumable.core.stores import Store
from support.readers import JOB, SLOT, TIES, Crash, _load, attempt, collect, events_table
from support.sources import Source


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


@pytest.mark.parametrize("key", ["id", ("updated_at", "id")])
def test_postgresql_reads_a_page_of_a_table_never_analyzed_from_the_index_without_scanning_the_table(
    pg_params: dict[str, Any], key: Any
) -> None:
    """A bulk load read before autovacuum's first look (or with autovacuum off) has no statistics:
    the planner guesses that 0.5 % of the keys are NULL or equal to a value. The page's guard (a
    twin of the position, a NULL key out of sight) must still be index look-ups, or every page
    scans the whole table and a long job slows with its table's size (row 15 of the bench: 40 ms a
    page at 800,000 rows)."""
    # Given 200,000 rows the database has no statistics of: a primary key, and a composite key on
    # an index that is not unique (the user's CREATE INDEX)
    with closing(psycopg2.connect(**pg_params)) as conn, conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE fresh (id BIGINT PRIMARY KEY, updated_at TIMESTAMPTZ NOT NULL) "
                    "WITH (autovacuum_enabled = false)")
        cur.execute("INSERT INTO fresh SELECT g, timestamptz '2026-01-01' + (g / 10) * interval '1 second' "
                    "FROM generate_series(1, 200000) g")
        cur.execute("CREATE INDEX fresh_k ON fresh (updated_at, id)")
    reader = KeysetReader(connect=lambda: psycopg2.connect(**pg_params), table="fresh", key=key)
    with closing(psycopg2.connect(**pg_params)) as conn, conn.cursor() as cur:
        cur.execute("SELECT updated_at, id FROM fresh WHERE id = 100000")
        at, i = cur.fetchone()
        sql, args = reader.statement(i if key == "id" else [at.isoformat(), i], 100)
        nodes, read = _plan_text(cur, sql, args)
    # Then no part of the page's statement scans the table: the page and its guard read the index
    assert "Seq Scan" not in nodes and "Sort" not in nodes, nodes
    assert read == 100, read


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


# -- split_keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("parts", [0, -3, True, 2.5, "3", None, 10_001, 10**12])
def test_split_keys_refuses_a_count_of_parts_that_is_not_a_whole_number_from_one_naming_the_fix(parts: Any) -> None:
    # A count of 0 or less used to come back as one range over everything (no boundary), and a
    # bool as 1: a split other than the one asked for, without a word; a huge count allocated its
    # boundaries' row numbers at once
    def connect() -> Any:
        raise AssertionError("nothing is read for a bad count")

    reader = KeysetReader(connect=connect, table="t", key="id")
    with pytest.raises(ConfigurationError) as err:
        reader.split_keys(parts)
    assert "parts must be a whole number from 1 to 10,000" in str(err.value) and str(parts) in str(err.value)
    assert err.value.hint and "split_keys(4)" in err.value.hint


class _Wrapped:
    """A DB-API connection behind a proxy (a pool's, a hook's): no window function is assumed for it.
    ``before_boundary(n)`` runs before the ``n``-th boundary's query (1-based)."""

    def __init__(self, conn: Any, before_boundary: Any):
        self._conn, self._before, self._n = conn, before_boundary, 0

    def cursor(self) -> Any:
        outer, cur = self, self._conn.cursor()

        class Cursor:
            def execute(self, sql: str, args: Any = ()) -> Any:
                if " OFFSET " in sql:
                    outer._n += 1
                    outer._before(outer._n)
                return cur.execute(sql, args)

            def __getattr__(self, name: str) -> Any:
                return getattr(cur, name)

        return Cursor()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_split_keys_boundaries_stay_in_key_order_when_rows_before_them_are_inserted_while_splitting(
    store: Store, source: Source
) -> None:
    # Given 30 text keys "m00".."m29", split in 3 by one query per boundary, and 20 keys before all
    # of them ("a00".."a19") committed between the first boundary's query and the second's
    source.run("CREATE TABLE split_src (id VARCHAR(10) PRIMARY KEY)")
    source.run("INSERT INTO split_src (id) VALUES (%s)", [(f"m{i:02d}",) for i in range(30)])

    def insert_before(n: int) -> None:
        if n == 2:
            source.run("INSERT INTO split_src (id) VALUES (%s)", [(f"a{i:02d}",) for i in range(20)])

    reader = KeysetReader(connect=lambda: _Wrapped(source.connect(), insert_before), table="split_src", key="id",
                          paramstyle="qmark" if source.kind == "sqlite" else "format")
    found = reader.split_keys(3)

    # Then the second boundary still comes after the first (it used to be "a19", before "m09": the
    # range after it re-read m00..m09, which the first range read too)
    assert found.rows == 30 and found.at == (10, 20)
    first, second = found.keys[10][0], found.keys[20][0]
    assert first == "m09" and second > first, found.keys


# -- split_point ----------------------------------------------------------------------------------


def test_split_point_cuts_the_rows_after_a_position_at_their_middle_key_within_the_range(
    store: Store, source: Source
) -> None:
    # Given keys 1..100 and a reader of the range (20, 80]: a slot that has read up to 40
    source.run("CREATE TABLE cut_src (id INTEGER PRIMARY KEY)")
    source.run("INSERT INTO cut_src (id) VALUES (%s)", [(i,) for i in range(1, 101)])
    reader = KeysetReader(connect=source.connect, table="cut_src", key="id",
                          paramstyle="qmark" if source.kind == "sqlite" else "format").within(80, after=20)
    # When the rest of its range is cut in two
    found = reader.split_point(40)
    # Then it keeps 41..60 and the other half, 61..80, is taken; nothing past the range's end counts
    assert found is not None and (found.key, found.kept, found.taken) == ((60,), 20, 20)
    assert reader.split_point(78) is not None and reader.split_point(78).key == (79,)  # type: ignore[union-attr]
    # And fewer than two rows left: nothing to cut
    assert reader.split_point(79) is None and reader.split_point(80) is None
    # A composite key's position is a key of every column
    pair = KeysetReader(connect=source.connect, table="cut_src", key=("id", "id"),
                        paramstyle="qmark" if source.kind == "sqlite" else "format")
    with pytest.raises(ConfigurationError, match="is not a key of 2 values"):
        pair.split_point(5)
